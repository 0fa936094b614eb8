package client_test

import (
	"context"
	"fmt"
	"os/signal"
	"syscall"

	"github.com/podlifecycle/pleg/api/lifecycle/client"
	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
)

// An agent's whole lifecycle pipeline: a view of the node's pods, kept by
// the handler, with nothing about reconnection, resumption or resyncs.
func ExampleClient_Run() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, err := client.New(client.Options{
		Address: "/run/pleg/pleg.sock",
		Filter:  &lifecyclev1.Filter{Namespaces: []string{"default"}, LabelSelector: "app=web"},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	pods := map[string]*lifecyclev1.Pod{} // by UID
	err = c.Run(ctx, client.HandlerFuncs{
		Resync: func(all []*lifecyclev1.Pod, _ client.Position) {
			clear(pods)
			for _, p := range all {
				pods[p.GetUid()] = p
			}
		},
		Event: func(ev *lifecyclev1.PodEvent, at client.Position) {
			if p := ev.GetPod(); p.GetGone() {
				delete(pods, p.GetUid())
			} else {
				pods[p.GetUid()] = p
			}
			for _, t := range ev.GetTransitions() {
				fmt.Println(at.Time, t.GetType(), ev.GetPod().GetNamespace()+"/"+ev.GetPod().GetName(), t.GetContainerName(), t.GetExitCode())
			}
		},
		RuntimeStatus: func(st *lifecyclev1.RuntimeStatus, _ client.Position) {
			fmt.Println("runtime:", st.GetState(), st.GetMessage())
		},
	})
	if err != nil {
		fmt.Println(err)
	}
	// c.Cursor() can be saved: Options.Cursor resumes from it next time.
}
