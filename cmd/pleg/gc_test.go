package main

import (
	"os"
	"runtime/debug"
	"testing"
)

// The binary's GC target is set before any init function (bench's children
// start from one), unless GOGC is set.
func TestGCPercent(t *testing.T) {
	if _, ok := os.LookupEnv("GOGC"); ok {
		t.Skip("GOGC is set in this environment: the binary leaves it")
	}
	got := debug.SetGCPercent(100)
	debug.SetGCPercent(got)
	if !gcSet || got != defaultGCPercent {
		t.Errorf("GC percent %d (set %v), want %d", got, gcSet, defaultGCPercent)
	}
}
