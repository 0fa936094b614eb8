package testport

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// The ports are below the ephemeral range, distinct, and bindable.
func TestReserveOutsideEphemeralRange(t *testing.T) {
	ports := ReserveT(t, 50)
	seen := map[int]bool{}
	for _, p := range ports {
		if p < low || p >= ephemeralLow() {
			t.Errorf("port %d is outside [%d, %d)", p, low, ephemeralLow())
		}
		if seen[p] {
			t.Errorf("port %d handed out twice", p)
		}
		seen[p] = true
		if !bindable(p) {
			t.Errorf("port %d cannot be bound", p)
		}
	}
}

// A port held by one process is not handed to another until released.
func TestReservedPortLockedAcrossProcesses(t *testing.T) {
	if p := os.Getenv("TESTPORT_CHILD_PORT"); p != "" {
		port, _ := strconv.Atoi(p)
		if _, ok := lock(filepath.Join(os.TempDir(), "pleg-test-ports"), port); ok {
			os.Exit(3) // took a lock another process holds
		}
		os.Exit(0)
	}
	ports, release, err := Reserve(1)
	if err != nil {
		t.Fatal(err)
	}
	child := func() int {
		cmd := exec.Command(os.Args[0], "-test.run=^TestReservedPortLockedAcrossProcesses$")
		cmd.Env = append(os.Environ(), "TESTPORT_CHILD_PORT="+strconv.Itoa(ports[0]))
		if err := cmd.Run(); err != nil {
			if ee, ok := err.(*exec.ExitError); ok {
				return ee.ExitCode()
			}
			t.Fatal(err)
		}
		return 0
	}
	if code := child(); code != 0 {
		t.Fatalf("another process took the lock of held port %d (exit %d)", ports[0], code)
	}
	release()
	if code := child(); code != 3 {
		t.Fatalf("after release, another process could not lock port %d (exit %d)", ports[0], code)
	}
}
