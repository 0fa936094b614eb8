// Package nodeclient provides the Node client of this directory
// (lifecycle.js) to the Go tests that run it (test/stream, test/e2e): the
// node binary and the node_modules of its locked dependencies, installed
// when missing, and its command line.
//
// Node comes with the machine; when it is missing Debian's nodejs and npm
// are installed through test/apt-install.sh. The npm packages are
// installed by `npm ci` from package-lock.json into
// <repo>/.cache/node/<hash of package.json and the lock file>/ under a
// file lock (several test binaries may run at once), once per lock file.
package nodeclient

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

var setup struct {
	sync.Once
	node, modules string
	err           error
}

// Ensure returns the node binary and the node_modules directory of the
// client's locked dependencies in the repository at root, installing
// them when needed (once per process).
func Ensure(root string) (node, modules string, err error) {
	setup.Do(func() { setup.node, setup.modules, setup.err = install(root) })
	if setup.err != nil {
		return "", "", fmt.Errorf("the Node client needs node, npm and its npm packages: %w", setup.err)
	}
	return setup.node, setup.modules, nil
}

// Command is `node lifecycle.js --proto <the repository's .proto>
// --address address args...` with its modules, from Ensure's results.
func Command(ctx context.Context, root, node, modules, address string, args ...string) *exec.Cmd {
	all := append([]string{filepath.Join(root, "test", "clients", "node", "lifecycle.js"),
		"--proto", filepath.Join(root, "api", "lifecycle", "v1", "lifecycle.proto"),
		"--address", address}, args...)
	cmd := exec.CommandContext(ctx, node, all...)
	cmd.Env = append(os.Environ(), "NODE_PATH="+modules)
	return cmd
}

func install(root string) (node, modules string, err error) {
	if _, err := exec.LookPath("node"); err != nil {
		fmt.Fprintln(os.Stderr, "nodeclient: node is missing; installing Debian's nodejs and npm")
		if err := AptInstall(root, "nodejs", "npm"); err != nil {
			return "", "", err
		}
	}
	node, err = exec.LookPath("node")
	if err != nil {
		return "", "", err
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		if err := AptInstall(root, "npm"); err != nil {
			return "", "", err
		}
		if npm, err = exec.LookPath("npm"); err != nil {
			return "", "", err
		}
	}
	src := filepath.Join(root, "test", "clients", "node")
	h := sha256.New()
	for _, f := range []string{"package.json", "package-lock.json"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			return "", "", err
		}
		h.Write(b)
	}
	cache := filepath.Join(root, ".cache", "node")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", "", err
	}
	lock, err := os.OpenFile(filepath.Join(cache, "install.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", "", err
	}
	dir := filepath.Join(cache, hex.EncodeToString(h.Sum(nil))[:16])
	modules = filepath.Join(dir, "node_modules")
	if _, err := os.Stat(filepath.Join(dir, "installed")); err == nil {
		return node, modules, nil
	}
	tmp := dir + ".tmp"
	_ = os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", "", err
	}
	for _, f := range []string{"package.json", "package-lock.json"} {
		b, _ := os.ReadFile(filepath.Join(src, f))
		if err := os.WriteFile(filepath.Join(tmp, f), b, 0o644); err != nil {
			return "", "", err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--no-update-notifier")
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "npm_config_cache="+filepath.Join(cache, "npm-cache"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	fmt.Fprintln(os.Stderr, "nodeclient: npm ci of test/clients/node into", dir)
	if err := cmd.Run(); err != nil {
		return "", "", fmt.Errorf("npm ci: %v\n%s", err, out.String())
	}
	if err := os.WriteFile(filepath.Join(tmp, "installed"), nil, 0o644); err != nil {
		return "", "", err
	}
	_ = os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return "", "", err
	}
	return node, modules, nil
}

// AptInstall installs Debian packages through test/apt-install.sh, the
// one entry point of the suites.
func AptInstall(root string, pkgs ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(root, "test", "apt-install.sh")}, pkgs...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("test/apt-install.sh %v: %v\n%s", pkgs, err, out.String())
	}
	return nil
}
