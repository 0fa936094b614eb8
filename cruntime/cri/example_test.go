package cri_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/cruntime/cri"
	"github.com/podlifecycle/pleg/metrics"
)

// Connect to containerd, check that it answers, list its pods and fetch the
// status of each; then follow its container events.
func Example() {
	ctx := context.Background()
	m := metrics.New(prometheus.NewRegistry())

	c, err := cri.Dial("unix:///run/containerd/containerd.sock",
		cri.WithTimeout(2*time.Minute), cri.WithMetrics(m))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	name, version, err := c.Version(ctx)
	if err != nil {
		log.Fatal(err) // connect to runtime at unix:///run/containerd/containerd.sock: ...
	}
	fmt.Println("runtime:", name, version)

	pods, err := c.ListPods(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, p := range pods {
		st, err := c.PodStatus(ctx, p)
		if err != nil {
			log.Printf("pod %s: %v", p.UID, err)
			continue
		}
		fmt.Println(p.Namespace, p.Name, st.IPs, len(st.ContainerStatuses))
	}

	err = c.WatchEvents(ctx, nil, func(ev cruntime.Event) {
		fmt.Println(ev.Type, ev.ContainerID, ev.PodUID)
	})
	if errors.Is(err, cruntime.ErrEventsUnsupported) {
		fmt.Println("no event stream; relist only")
	}
}
