// Package leakcheck fails a test binary whose goroutines outlive its
// tests: every test must stop what it started (servers, clients,
// generators) before it returns.
package leakcheck

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Main runs the tests of m and, when they pass, waits up to limit for the
// goroutines whose stacks mention one of marks to end (a gRPC server's or
// client's end shortly after Stop and Close return). If some are left, it
// prints their stacks and the binary exits 1. Call it from TestMain.
func Main(m *testing.M, limit time.Duration, marks ...string) {
	code := m.Run()
	if code == 0 {
		if leaked := Wait(limit, marks...); leaked != "" {
			fmt.Fprintf(os.Stderr, "leaked goroutines:\n%s\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

// Wait waits up to limit for the goroutines whose stacks mention one of
// marks to end and returns the stacks of those left ("" when none are).
// The goroutine calling it does not count.
func Wait(limit time.Duration, marks ...string) string {
	deadline := time.Now().Add(limit)
	for {
		leaked := Running(marks...)
		if len(leaked) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			return strings.Join(leaked, "\n\n")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Running returns the stacks of the goroutines, other than the caller's,
// whose stacks mention one of marks.
func Running(marks ...string) []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	goroutines := strings.Split(string(buf), "\n\n")
	var leaked []string
	for i, g := range goroutines {
		if i == 0 {
			continue // runtime.Stack lists the caller first
		}
		for _, m := range marks {
			if strings.Contains(g, m) {
				leaked = append(leaked, g)
				break
			}
		}
	}
	return leaked
}
