// Package e2e is the end-to-end suite that runs against real containerds
// — 1.6.20, 1.7.35, 2.2.9, 2.3.7 and 2.4.2 (CRI plugin, runc) — started privately by the
// suite itself. The harness is this package's non-test files, each named
// for what it holds (env.go, supervisor.go, containerd.go, cri.go,
// kubelet.go, pleg_views.go, ...: README.md has the map), so `go build`
// and `go vet` compile it; the tests, each with what only it uses, are
// the _test.go files, and TestMain (main_test.go) runs the suite.
//
// `go test ./test/e2e/` provisions what is missing (test/e2e/provision.sh:
// runc and containerd 1.6 from Debian, containerd 1.7, 2.2 and 2.4 built from
// source, each version into .cache/e2e/containerd-<version>/bin, the test
// images), starts every containerd on its own private root/state/socket
// under a fresh temp dir, imports the images, runs the tests (those about
// pleg's behaviour once per version, as subtests named containerd-<version>)
// and tears everything down again. PLEG_E2E_RUNTIMES=2.2 narrows the
// versions (the run says which ran). Set PLEG_E2E_SKIP=1 to skip the suite;
// otherwise it fails (it never skips) when it cannot provision or start
// containerd.
//
// See README.md in this directory for the helper API and the containerd
// configuration facts the harness depends on.
package e2e
