package pleg_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/cruntime/cri"
	"github.com/podlifecycle/pleg/cruntime/sim"
)

// Example runs a generator against a simulated CRI runtime and prints the
// lifecycle events of a pod that starts and whose container then exits.
func Example() {
	dir, _ := os.MkdirTemp("", "pleg-example")
	defer os.RemoveAll(dir)
	node := sim.New(sim.Config{Seed: 1})
	if err := node.Serve(filepath.Join(dir, "cri.sock")); err != nil {
		fmt.Println(err)
		return
	}
	defer node.Stop()

	rt, err := cri.Dial(node.Endpoint())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer rt.Close()
	g, err := pleg.New(pleg.Options{Runtime: rt, RelistPeriod: 10 * time.Millisecond})
	if err != nil {
		fmt.Println(err)
		return
	}
	sub := g.Subscribe()
	g.Start()
	defer g.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	next := func() {
		u, err := sub.Next(ctx)
		switch {
		case err != nil:
			fmt.Println(err)
		case u.Resync:
			fmt.Printf("resync: %d pods\n", len(u.Pods))
		case u.Event.Sandbox:
			fmt.Println(u.Event.Type, u.Event.Pod(), "sandbox")
		default:
			fmt.Println(u.Event.Type, u.Event.Pod(), u.Event.ContainerName+exit(u.Event.ExitCode))
		}
	}

	next() // the first update is always a resync
	p, _ := node.AddPod(sim.PodSpec{Name: "web", Namespace: "default", Containers: []string{"nginx"}})
	next()
	next()
	c, _ := p.Container("nginx")
	node.ExitContainer(c.ID, 3)
	next()
	// Output:
	// resync: 0 pods
	// ContainerStarted default/web nginx
	// ContainerStarted default/web sandbox
	// ContainerDied default/web nginx exit 3
}

func exit(code *int32) string {
	if code == nil {
		return ""
	}
	return fmt.Sprintf(" exit %d", *code)
}
