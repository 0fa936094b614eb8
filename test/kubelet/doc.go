// Package kubelet is a separate module that builds the real kubelet, and
// programs made of its parts, for pleg's tests and benchmarks. It exists so
// that pleg's own module never imports k8s.io/kubernetes, which is not a
// library: only this module requires it, pinned to v1.37.2 with every staging
// module at v0.37.2.
//
// Build the kubelet with
//
//	go build -o kubelet k8s.io/kubernetes/cmd/kubelet
//
// from this directory.
package kubelet
