// Package testport hands tests TCP ports on 127.0.0.1 for processes that
// must be told their port before they start (the kubelet, Prometheus,
// node-problem-detector), and keeps two test binaries running at once
// from handing out the same one.
//
// Asking the kernel for port 0, closing it and passing the number on
// races: until the child binds it, the kernel may give that same port to
// any other socket of the machine (every outgoing connection takes its
// source port from the ephemeral range, and so does every bind to port
// 0). The ports handed out here come from below the ephemeral range,
// which the kernel never assigns by itself, and each is held by an
// exclusive lock on a file in the temporary directory until released, so
// another test binary skips it.
package testport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// The range ports are drawn from when the ephemeral range cannot be read:
// Linux's default ephemeral range starts at 32768.
const (
	low          = 20000
	defaultUpper = 32768
)

// Reserve returns n distinct ports on 127.0.0.1 that nothing listens on,
// outside the kernel's ephemeral range, each locked against other callers
// (in this process or another) until release is called.
func Reserve(n int) (ports []int, release func(), err error) {
	upper := ephemeralLow()
	if upper <= low+n {
		return nil, nil, fmt.Errorf("testport: the ephemeral range starts at %d, leaving no ports above %d", upper, low)
	}
	dir := filepath.Join(os.TempDir(), "pleg-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, nil, fmt.Errorf("testport: %w", err)
	}
	var held []*os.File
	release = func() {
		for _, f := range held {
			f.Close() // closing the descriptor drops its lock
		}
		held = nil
	}
	for attempts := 0; len(ports) < n; attempts++ {
		if attempts == 1000 {
			release()
			return nil, nil, fmt.Errorf("testport: no free port among 1,000 tried in [%d, %d)", low, upper)
		}
		p := low + rand.IntN(upper-low)
		f, ok := lock(dir, p)
		if !ok {
			continue
		}
		if !bindable(p) {
			f.Close()
			continue
		}
		held = append(held, f)
		ports = append(ports, p)
	}
	return ports, release, nil
}

// ReserveT is Reserve for a test: it fails t on error and releases the
// ports when t ends.
func ReserveT(t testing.TB, n int) []int {
	t.Helper()
	ports, release, err := Reserve(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return ports
}

// Addr is ReserveT for one port, as "127.0.0.1:port".
func Addr(t testing.TB) string {
	t.Helper()
	return "127.0.0.1:" + strconv.Itoa(ReserveT(t, 1)[0])
}

// lock takes port's lock file without waiting; ok is false when another
// holder has it (a descriptor of this process included).
func lock(dir string, port int) (*os.File, bool) {
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, false
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, false
	}
	return f, true
}

// bindable reports whether port can be listened on at 127.0.0.1 now.
func bindable(port int) bool {
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// ephemeralLow is the first port of the kernel's ephemeral range.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return defaultUpper
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return defaultUpper
	}
	v, err := strconv.Atoi(f[0])
	if err != nil || v <= 0 {
		return defaultUpper
	}
	return v
}
