// Package cluster installs pleg on a real Kubernetes cluster as a user
// does: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
// kubectl v1.37.2, built from their modules by test/kubelet/build.sh, and
// two nodes (a real kubelet on containerd 2.4.2, one on CRI-O 1.36.3, each
// in network and mount namespaces of its own) that register to it. Then
// `kubectl apply` of deploy/'s files, node-problem-detector's conditions on
// the Node objects, and the forecast of the kubelet's "PLEG is not
// healthy" on a Node before the kubelet says it (e2e.ClusterInstall); and
// pleg's DaemonSets rolled (a restart, an image change) under node agents
// watching its lifecycle stream while pods churn, every transition
// reaching every agent (e2e.ClusterUpgrade).
//
// It is a package of its own so that `go test ./...` runs it beside
// test/e2e's suite (e2e.Main provisions the runtimes and starts none).
// PLEG_E2E_SKIP=1 skips it, as it does test/e2e.
package cluster
