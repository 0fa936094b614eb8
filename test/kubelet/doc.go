// Package kubelet is a separate module that builds the real kubelet, and
// programs made of its parts, for pleg's tests and benchmarks, and also the
// control plane a test cluster needs: kube-apiserver,
// kube-controller-manager, kube-scheduler and kubectl. It exists so that
// pleg's own module never imports k8s.io/kubernetes, which is not a
// library: only this module requires it, pinned to v1.37.2 with every
// staging module at v0.37.2. etcd's server is built from the module in
// ./etcd, which has versions of its own (etcd v3.7.3 needs newer grpc,
// otel and etcd client modules than Kubernetes v1.37.2 pins), and
// Prometheus, with Kubernetes service discovery, from the module in
// ./prometheus.
//
// build.sh OUTDIR builds the kubelet and ./cmd/*; build.sh OUTDIR cluster
// also builds the control plane, etcd and Prometheus. By hand, from this
// directory:
//
//	go build -o kubelet k8s.io/kubernetes/cmd/kubelet
//	go build -o . k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
//		k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
//	(cd etcd && go build -o etcd go.etcd.io/etcd/server/v3)
//	(cd prometheus && go build -tags remove_all_sd,enable_kubernetes_sd -o prometheus \
//		github.com/prometheus/prometheus/cmd/prometheus)
package kubelet
