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
//   - hints from the runtime's event stream trigger single-pod relists within
//     milliseconds, within a budget (Options.PodRelistRate and friends) and
//     never making a global relist wait, while the periodic relist stays
//     the source of truth;
//   - every change goes to a journal (Journal) that any number of watchers
//     read at their own pace and resume by cursor, never losing an event
//     silently; Subscribe reads it too.
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
//     generator started, closes the Watch channel and ends every
//     subscription (Next returns ErrStopped; its journal watcher is closed).
//   - Read the Watch channel promptly if you use it: like the kubelet's, it
//     drops events when full (counted in kubelet_pleg_discard_events).
//     Prefer Subscribe, which never drops silently.
//   - Call Next on every subscription until it returns an error, or Close
//     it; an idle subscription costs its position in the journal (and,
//     before its first Next, a snapshot of every pod) until then, or until
//     Stop.
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
// Every per-pod rule lives in one deterministic state machine, the core
// (core.go; core_relist.go the global relist, core_pod.go one pod's
// inspection and outcome, core_calls.go calls out and their timeouts,
// core_hints.go hints and their budget, core_identity.go containers'
// identities): inputs (a listing, a status, a hint, a request, time) go in,
// effects (calls to make, cache operations, events, notes) come out. It reads
// no clock and does no I/O; testdata/core/*.txt are scripts that drive it.
// One goroutine, the loop (loop.go), owns it: it feeds it the clock, the
// results of the calls a pool makes (calls.go) and what other goroutines
// put in the inbox (inbox.go: the event stream of stream.go, RequestRelist,
// RequestReinspect), and carries out the effects: the pod status cache
// (package podcache), the journal (package journal, whose one writer the
// loop is: the event stream's connections and losses reach it through the
// inbox too, and every entry is stamped with the loop's clock), the
// kubelet-compatible channel (deliver.go), metrics and logs (report.go).
// The diff of two listings is the pure function Diff. The runtime
// interface and its contract are in package cruntime, the CRI client in
// cruntime/cri, a simulated CRI runtime in cruntime/sim, the Prometheus
// collectors in metrics.
package pleg
