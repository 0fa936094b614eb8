// Package sim is a simulated container runtime that speaks the real CRI v1
// gRPC API (k8s.io/cri-api RuntimeService) on a unix socket, so the pod
// lifecycle event generator runs anywhere and tests and benchmarks get a
// realistic runtime they control.
//
// A Runtime holds a node model: pods, each with a sandbox (and possibly
// older sandboxes) and containers, carrying the metadata, labels
// (io.kubernetes.pod.uid, .name, .namespace, io.kubernetes.container.name),
// annotations, images, nanosecond timestamps, exit codes and sandbox IPs
// (10.88.x.y) of a kubelet-managed runtime. It answers Version, Status,
// ListPodSandbox and ListContainers (with filters), PodSandboxStatus,
// ContainerStatus and the GetContainerEvents stream, and runs, stops and
// removes sandboxes and containers through the CRI lifecycle calls; its
// ImageService answers ListImages, ImageStatus and ImageFsInfo with the
// images its containers use. Every other method answers
// codes.Unimplemented.
//
// The model changes three ways:
//   - Step advances a workload one tick, deterministically from
//     Config.Seed: steady services, crash loops (exit, new attempt with a new
//     ID, garbage collection of old attempts), batch jobs that complete, and
//     rolling updates that replace whole pods. Run calls Step on the clock.
//   - The direct API (AddPod, StartContainer, ExitContainer,
//     RestartContainer, RemoveContainer, StopPod, RemovePod,
//     RecreateSandbox) lets tests script exact situations.
//   - CRI clients call RunPodSandbox, CreateContainer and friends.
//
// Every change emits the CRI container events a runtime such as containerd
// sends (sandboxes use their own ID as the container ID) to every
// subscriber; a slow subscriber loses events rather than blocking the model.
//
// Faults are knobs of Config and of setters usable while serving: latency
// (base, jitter, per listed item), hung status calls for chosen pods
// (SetHung) and hung list calls filtered to chosen pods (SetHungLists), an
// error rate, events off or dropped, a not-ready runtime, and the runtime
// going away (GoAway) and coming back (ComeBack) on the same socket. The
// event stream has faults of its own: a pod whose container flaps streams
// events continuously (EmitEvents), thousands of events a second spread
// over every pod (SetEventStorm), and a new subscriber first receives old
// events, those kept while nobody subscribed (SetKeepEvents, as containerd
// 2.x) or replayed minutes old (SetReplay). Calls counts calls per method,
// PodCalls the calls for one pod.
//
// A typical test:
//
//	r := sim.New(sim.Config{Seed: 1, Pods: 10, ContainersPerPod: 2, ChurnPerStep: 3})
//	if err := r.Serve(filepath.Join(t.TempDir(), "cri.sock")); err != nil {
//		t.Fatal(err)
//	}
//	t.Cleanup(r.Stop)
//	// dial r.Endpoint() with a CRI client; call r.Step() to change things.
package sim
