module github.com/podlifecycle/pleg/test/kubelet/prometheus

go 1.26.8
