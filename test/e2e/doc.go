// Package e2e is the end-to-end suite that runs against a real containerd
// 2.x (CRI plugin, runc) started privately by the suite itself. All of it
// lives in _test.go files; this file only documents the package.
//
// `go test ./test/e2e/` provisions what is missing (test/e2e/provision.sh:
// runc from Debian, containerd built from source into .cache/e2e/bin, the
// test images), starts containerd on a private root/state/socket under a
// fresh temp dir, imports the images, runs the tests and tears everything
// down again. Set PLEG_E2E_SKIP=1 to skip the suite; otherwise it fails (it
// never skips) when it cannot provision or start containerd.
//
// See README.md in this directory for the helper API and the containerd
// configuration facts the harness depends on.
package e2e
