package e2e

// Provisioning of the control plane: test/kubelet/build.sh's cluster mode
// builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
// kubectl into <cache>/kubelet, beside the kubelet.

import (
	"fmt"
	"os"
	"path/filepath"
)

// clusterBins are the paths of a cluster's programs, all built by
// test/kubelet/build.sh into <cache>/kubelet.
type clusterBins struct{ APIServer, ControllerManager, Scheduler, Kubectl, Etcd, Kubelet, Prometheus string }

// provisionCluster builds the control plane (and the kubelet, which it
// builds first, as provisionKubelet does) with `test/kubelet/build.sh
// <cache>/kubelet cluster`; it takes well under a second when the build is
// cached, and many minutes the first time (the control plane compiles on
// top of the kubelet's packages). A suite that needs only the kubelet calls
// provisionKubelet, which never waits for a control-plane build.
func (e *env) provisionCluster() (clusterBins, error) {
	out, err := e.kubeletBuild("control plane", "cluster")
	if err != nil {
		return clusterBins{}, err
	}
	bins := clusterBins{
		APIServer:         filepath.Join(out, "kube-apiserver"),
		ControllerManager: filepath.Join(out, "kube-controller-manager"),
		Scheduler:         filepath.Join(out, "kube-scheduler"),
		Kubectl:           filepath.Join(out, "kubectl"),
		Etcd:              filepath.Join(out, "etcd"),
		Kubelet:           filepath.Join(out, "kubelet"),
		Prometheus:        filepath.Join(out, "prometheus"),
	}
	for _, p := range []string{bins.APIServer, bins.ControllerManager, bins.Scheduler, bins.Kubectl, bins.Etcd, bins.Kubelet, bins.Prometheus} {
		fi, err := os.Stat(p)
		if err != nil {
			return clusterBins{}, fmt.Errorf("provisioning did not produce %s: %v", p, err)
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return clusterBins{}, fmt.Errorf("provisioning produced %s, but it is not an executable file (mode %v)", p, fi.Mode())
		}
	}
	return bins, nil
}
