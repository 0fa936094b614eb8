// Command pleg runs a Pod Lifecycle Event Generator against a CRI runtime.
package main

import (
	"fmt"
	"os"
	"runtime/debug"
)

// defaultGCPercent is the garbage collector's target unless GOGC says
// otherwise: a node agent's memory is what it keeps (pod statuses, the
// listing), and at steady state it allocates almost nothing, so a heap
// goal of 1.25x the live heap instead of Go's 2x costs no CPU that
// `pleg bench` can tell apart, and 2 MiB of the peak at 1,000 x 10 against
// 1.5x (README, "Performance").
const defaultGCPercent = 25

// gcSet is set before any init function runs, so that the children `pleg
// bench` runs from an init function (bench.go) have the daemon's setting.
var gcSet = setGCPercent()

func setGCPercent() bool {
	if _, ok := os.LookupEnv("GOGC"); ok {
		return false
	}
	debug.SetGCPercent(defaultGCPercent)
	return true
}

func main() {
	os.Exit(execute(os.Args[1:]))
}

// usageError marks errors caused by bad flags or arguments (exit code 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}
