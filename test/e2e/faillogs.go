package e2e

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// failedLogsDir is where keepFailedLogs copies a failed test's logs: under
// $TMPDIR, which a CI run on a clean clone leaves in place.
func failedLogsDir() string { return filepath.Join(os.TempDir(), "pleg-e2e-failed") }

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// keepFailedLogs copies the logs of a failed test's processes (name to
// path) into a directory of their own under failedLogsDir, which the
// processes' cleanups do not remove, and logs one line per log: where it
// is and its size. The logs' tails are not printed: a few hundred lines of
// them after the failure message pushed it out of what CI's report shows
// (a failure of TestClusterUpgrade whose message was lost so). Copies are
// bounded to the last 8 MiB of each log.
func keepFailedLogs(t testing.TB, what string, logs map[string]string) {
	t.Helper()
	// A dir of its own per call: two kubelets of one test (a cluster's
	// nodes) each keep a kubelet.log.
	if err := os.MkdirAll(failedLogsDir(), 0o755); err != nil {
		t.Logf("%s logs not kept: %v", what, err)
		return
	}
	dir, err := os.MkdirTemp(failedLogsDir(), unsafeName.ReplaceAllString(t.Name(), "_")+"-"+time.Now().Format("20060102-150405")+"-*")
	if err != nil {
		t.Logf("%s logs not kept: %v", what, err)
		return
	}
	var kept []string
	for name, path := range logs {
		dst := filepath.Join(dir, unsafeName.ReplaceAllString(name, "_")+".log")
		n, err := copyTail(dst, path, 8<<20)
		if err != nil {
			kept = append(kept, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		kept = append(kept, fmt.Sprintf("%s (%d bytes)", name, n))
	}
	t.Logf("%s logs kept in %s: %s", what, dir, strings.Join(kept, ", "))
}

// copyTail copies the last max bytes of src to dst.
func copyTail(dst, src string, max int64) (int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	if st, err := in.Stat(); err == nil && st.Size() > max {
		if _, err := in.Seek(st.Size()-max, io.SeekStart); err != nil {
			return 0, err
		}
	}
	out, err := os.Create(dst)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return n, err
}
