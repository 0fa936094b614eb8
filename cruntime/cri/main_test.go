package cri

import (
	"fmt"
	"os"
	goruntime "runtime"
	"strings"
	"testing"
	"time"
)

// TestMain fails the run when gRPC or client goroutines outlive the tests:
// every test must stop its server and close its client.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		var leaked []string
		for deadline := time.Now().Add(30 * time.Second); ; {
			buf := make([]byte, 1<<20)
			leaked = leakedGoroutines(string(buf[:goruntime.Stack(buf, true)]))
			if len(leaked) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if len(leaked) > 0 {
			fmt.Fprintf(os.Stderr, "leaked goroutines:\n%s\n", strings.Join(leaked, "\n\n"))
			code = 1
		}
	}
	os.Exit(code)
}
