// Package kubeletfail makes the real kubelet v1.37.2 report "PLEG is not
// healthy" for real, on containerd 2.4.2 and CRI-O 1.36.3, and checks that
// `pleg run` beside it forecast it minutes earlier (docs/forecast.md).
//
// The scenarios are test/e2e's (KubeletPLEGUnhealthy, in package e2e's
// harness); they live in a package of their own because each waits 3 to 5
// minutes for the kubelet's fixed 3m threshold: `go test ./...` runs this
// package at the same time as test/e2e's suite (whose tests run one after
// another and share runtimes), and the four scenarios run at once, each on
// a kubelet and a runtime of its own (e2e.Main provisions the runtimes and
// starts none). PLEG_E2E_RUNTIMES narrows the runtimes and PLEG_E2E_SKIP=1
// skips the package, as for test/e2e.
package kubeletfail
