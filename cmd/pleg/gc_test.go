package main

import (
	"os"
	"runtime/debug"
	"testing"
)

// The daemon sets its GC target, unless GOGC is set; no other command
// does (the binary's main sets none).
func TestDaemonGC(t *testing.T) {
	if _, ok := os.LookupEnv("GOGC"); ok {
		t.Skip("GOGC is set in this environment: the daemon leaves it")
	}
	before := debug.SetGCPercent(100)
	defer debug.SetGCPercent(before)
	setDaemonGC()
	if got := debug.SetGCPercent(100); got != daemonGCPercent {
		t.Errorf("GC percent %d after setDaemonGC, want %d", got, daemonGCPercent)
	}
	t.Setenv("GOGC", "77")
	setDaemonGC()
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GC percent %d with GOGC set, want it left at 100", got)
	}
}
