// Package pleg is a Pod Lifecycle Event Generator: it relists the pods and
// containers of a CRI container runtime, turns what changed into pod
// lifecycle events (ContainerStarted, ContainerDied, ContainerRemoved,
// PodSync), keeps a pod status cache fresh, and reports itself unhealthy
// when no relist has succeeded for a while, exactly as the kubelet's PLEG
// does (Kubernetes v1.36).
//
// Where the kubelet's users suffer, it does better, without changing any
// event or cache rule:
//   - changed pods are inspected in parallel (Options.MaxParallelInspections),
//     so relist time no longer grows with churn;
//   - every runtime call made for one pod is bounded by
//     Options.PodInspectionTimeout: a pod whose calls hang is left behind
//     and reinspected later, so it cannot stall the relist and turn the
//     node NotReady; it is named in the logs and counted in
//     pleg_pod_inspection_timeouts_total;
//   - subscriptions (Subscribe) never lose an event silently: a subscriber
//     that falls behind gets a resync with the state of every pod;
//   - the runtime's container event stream, when it has one, triggers
//     single-pod relists within milliseconds, while the periodic relist
//     stays the source of truth.
//
// # Usage
//
//	rt, err := cri.Dial("unix:///run/containerd/containerd.sock")
//	if err != nil { ... }
//	defer rt.Close()
//	g, err := pleg.New(pleg.Options{Runtime: rt, Metrics: metrics.New(registry)})
//	if err != nil { ... }
//	sub := g.Subscribe()
//	g.Start()
//	defer g.Stop()
//	for {
//		u, err := sub.Next(ctx)
//		if err != nil { break }
//		if u.Resync { /* replace everything you knew with u.Pods */ continue }
//		fmt.Println(u.Event.Type, u.Event.Pod(), u.Event.ContainerID)
//	}
//
// # The caller's duties
//
//   - Call Start once and Stop when done: Stop ends every goroutine the
//     generator started and closes the Watch channel and subscriptions.
//   - Read the Watch channel promptly if you use it: like the kubelet's, it
//     drops events when full (counted in kubelet_pleg_discard_events).
//     Prefer Subscribe, which never drops silently.
//   - Call Next on every subscription until it returns an error, or Close
//     it; an idle subscription costs at most Options.SubscriberBuffer events.
//   - Check Healthy (or a Readiness built on it) periodically.
//   - Give it a clock.WithTicker in tests (k8s.io/utils/clock/testing) to
//     drive every timing rule without sleeping.
//
// # Specification
//
// docs/semantics.md in the repository states the behaviour reproduced (the
// kubelet v1.36 PLEG) and the per-pod bounds; docs/differences.md lists
// every deliberate difference from the kubelet, with its reason.
//
// # Layout
//
// The kubelet's rules are one pure state machine (core.go): listings,
// inspection outcomes and times go in; the pods to inspect, cache writes
// and events come out. The relist loop is its thin shell: relist.go (the
// global relist), podrelist.go (single-pod relists), inspect.go (bounded
// status fetches), stream.go (the runtime event stream as hints),
// deliver.go (the Watch channel and subscriptions). The diff of two
// listings is the pure function Diff. The runtime interface and its types
// are in package cruntime, the CRI client in cruntime/cri, a simulated CRI
// runtime in cruntime/sim, the pod status cache in podcache and the
// Prometheus collectors in metrics.
package pleg
