// Command pleg runs a Pod Lifecycle Event Generator against a CRI runtime.
package main

import (
	"fmt"
	"os"
)

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
