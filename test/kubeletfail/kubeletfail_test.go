package kubeletfail

import (
	"flag"
	"os"
	"strconv"
	"testing"

	"github.com/podlifecycle/pleg/test/e2e"
)

// scenarios is how many scenarios TestKubeletPLEGUnhealthy runs at once.
var scenarios = len(e2e.UnhealthyCases)

func TestMain(m *testing.M) {
	flag.Parse()
	// The scenarios mostly wait: all at once, whatever GOMAXPROCS
	// (-parallel's default) is, unless -parallel says otherwise.
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		flag.Set("test.parallel", strconv.Itoa(scenarios))
	}
	os.Exit(e2e.Main(m, e2e.UnhealthyRuntimes...))
}

// TestKubeletPLEGUnhealthy: see e2e.KubeletPLEGUnhealthy (runtime-stopped
// and hung-pods, all four at once).
func TestKubeletPLEGUnhealthy(t *testing.T) { e2e.KubeletPLEGUnhealthy(t) }
