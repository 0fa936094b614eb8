// Command report turns `go test -json` output into a log a person reads:
// go test's own `ok`/`FAIL` line for each package, the output of every
// failing test, every skipped test with its reason (go test hides both for
// a passing package), the MEASURE lines of passing tests (the e2e suite's
// figures), how long each package's tests took, and a closing count.
//
//	go test -race -json ./... | go run ./test/report
//
// It exits 1 when a test or a build failed, or when the input has no
// package result at all.
package main

import (
	"fmt"
	"os"
)

func main() {
	r := newReporter(os.Stdout)
	if err := r.read(os.Stdin); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
	if !r.summary() {
		os.Exit(1)
	}
}
