package e2e

// Provisioning: provision.sh (runc, every containerd version, the test
// images) and test/kubelet/build.sh (the real kubelet), run by setup before
// any containerd starts.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

func lookRunc() (string, error) {
	if p, err := exec.LookPath("runc"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/runc"); err == nil {
		return "/usr/sbin/runc", nil
	}
	return "", errors.New("runc not found after provisioning")
}

// provision runs provision.sh, which is idempotent and takes well under a
// second when everything is already in place. Its output is shown only
// when it did real work or failed.
func (e *env) provision(versions []string) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(e.repoRoot, "test", "e2e", "provision.sh"))
	cmd.Env = append(os.Environ(), envCache+"="+e.cacheDir, envRuntimes+"="+strings.Join(versions, " "))
	if os.Getenv("GO") == "" {
		if goBin := filepath.Join(goRoot(), "bin", "go"); fileExists(goBin) {
			cmd.Env = append(cmd.Env, "GO="+goBin)
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		os.Stderr.Write(out)
		return fmt.Errorf("provision.sh failed (%v); see its output above", err)
	}
	if d := time.Since(start); d > 5*time.Second || testingVerbose() {
		os.Stderr.Write(out)
		logf("provisioning took %v", d.Round(time.Millisecond))
	}
	if !fileExists(e.imageArchive) {
		return fmt.Errorf("provisioning did not produce %s", e.imageArchive)
	}
	return nil
}

// goRoot returns the GOROOT of the go command that built this test, found
// through GOROOT or the go on PATH; provision.sh falls back on its own.
func goRoot() string {
	if r := os.Getenv("GOROOT"); r != "" {
		return r
	}
	if p, err := exec.LookPath("go"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Dir(filepath.Dir(r))
		}
	}
	return "/usr/local/go"
}

// provisionKubelet builds the kubelet (and test/kubelet's programs) into
// <cache>/kubelet with test/kubelet/build.sh, the one entry point every
// suite uses; it takes well under a second when the build is cached.
func (e *env) provisionKubelet() error {
	out, err := e.kubeletBuild("kubelet")
	if err != nil {
		return err
	}
	e.kubeletBin = filepath.Join(out, "kubelet")
	if !fileExists(e.kubeletBin) {
		return fmt.Errorf("provisioning did not produce %s", e.kubeletBin)
	}
	return nil
}

// kubeletBuild runs test/kubelet/build.sh <cache>/kubelet with args (none,
// or "cluster") under a 40-minute bound, printing its output when it
// failed or took long (a build), and returns the directory it built into.
// what names the step in the log.
func (e *env) kubeletBuild(what string, args ...string) (string, error) {
	start := time.Now()
	out := filepath.Join(e.cacheDir, "kubelet")
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(e.repoRoot, "test", "kubelet", "build.sh"), out}, args...)...)
	cmd.Env = os.Environ()
	if os.Getenv("GO") == "" {
		if goBin := filepath.Join(goRoot(), "bin", "go"); fileExists(goBin) {
			cmd.Env = append(cmd.Env, "GO="+goBin)
		}
	}
	b, err := cmd.CombinedOutput()
	if err != nil {
		os.Stderr.Write(b)
		return "", fmt.Errorf("test/kubelet/build.sh %s failed (%v); see its output above", strings.Join(args, " "), err)
	}
	if d := time.Since(start); d > 5*time.Second || testingVerbose() {
		os.Stderr.Write(b)
		logf("%s provisioning took %v", what, d.Round(time.Millisecond))
	}
	return out, nil
}
