// Package crictl builds the real crictl (cri-tools) for the tests that
// prove pleg's CRI endpoint with it (this package's, and test/e2e's).
package crictl

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"time"
)

// crictlSources are where crictl is built from: cri-tools v1.37.0, the
// newest the module proxy serves (it replaced v1.36.0 on 2026-11-29).
var crictlSources = []string{
	"sigs.k8s.io/cri-tools/cmd/crictl@v1.37.0",
}

// repoRoot is the module's root (this file is in test/crictl).
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Build returns the path of crictl, built by `go install` of the first
// source that builds into <repo>/.cache/crictl/<source>/ once, under a
// file lock (test binaries run at once must not build twice or see half a
// binary), and the source it came from.
func Build() (path, source string, err error) {
	cache := filepath.Join(repoRoot(), ".cache", "crictl")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", "", err
	}
	lock, err := os.OpenFile(filepath.Join(cache, "build.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", "", err
	}
	gocmd, err := exec.LookPath("go")
	if err != nil {
		gocmd = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	var failures bytes.Buffer
	for _, src := range crictlSources {
		dir := filepath.Join(cache, sanitize(src))
		bin := filepath.Join(dir, "crictl")
		if fi, err := os.Stat(bin); err == nil && fi.Mode()&0o111 != 0 {
			return bin, src, nil
		}
		tmp := dir + ".tmp"
		_ = os.RemoveAll(tmp)
		if err := os.MkdirAll(tmp, 0o755); err != nil {
			return "", "", err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		cmd := exec.CommandContext(ctx, gocmd, "install", "-trimpath", src)
		cmd.Env = append(os.Environ(), "GOBIN="+tmp, "CGO_ENABLED=0", "GOFLAGS=-mod=mod")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		fmt.Fprintln(os.Stderr, "crictl test: go install", src, "into", dir, "(about 2 minutes on a cold Go cache)")
		start := time.Now()
		err := cmd.Run()
		cancel()
		if err != nil {
			fmt.Fprintf(&failures, "go install %s: %v\n%s\n", src, err, out.String())
			_ = os.RemoveAll(tmp)
			continue
		}
		_ = os.RemoveAll(dir)
		if err := os.Rename(tmp, dir); err != nil {
			return "", "", err
		}
		fmt.Fprintf(os.Stderr, "crictl test: built %s in %v\n", src, time.Since(start).Round(time.Second))
		return bin, src, nil
	}
	return "", "", fmt.Errorf("crictl could not be built from any source:\n%s", failures.String())
}

// sanitize makes a module@version a directory name.
func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == '/' || c == '@' {
			b[i] = '_'
		}
	}
	return string(b)
}
