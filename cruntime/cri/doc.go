// Package cri is the production implementation of runtime.Runtime: a client
// of the Container Runtime Interface (CRI v1, k8s.io/cri-api runtime/v1)
// over gRPC on a unix socket, as served by containerd, CRI-O and k3s.
//
// A Client lists sandboxes and containers and groups them by pod UID
// (runtime.Runtime), fetches full pod statuses, streams container events
// (runtime.EventSource) and reports the runtime's own conditions
// (runtime.StatusChecker). Every unary call runs under its own timeout, is
// counted and timed in the kubelet_runtime_operations_* metrics when a
// *metrics.Metrics is given, and is reported to the runtime.CallTracer of
// its context, if any.
//
// The relist's two unfiltered listings are read from an HTTP/2 connection
// of their own and decoded as their bytes arrive, instead of being held
// whole by gRPC first (package directlist; WithDirectLists). Every other
// call goes through the gRPC connection.
//
// Dial does no I/O; the connection is made on the first call. Call Version
// first to check that the runtime is reachable:
//
//	c, err := cri.Dial("unix:///run/containerd/containerd.sock",
//		cri.WithTimeout(2*time.Minute),
//		cri.WithMetrics(m))
//	if err != nil {
//		return err
//	}
//	defer c.Close()
//	name, version, err := c.Version(ctx)
//	if err != nil {
//		return err // e.g. "connect to runtime at unix:///...: ...: no such file or directory"
//	}
//	pods, err := c.ListPods(ctx)
package cri
