package leakcheck

import (
	"strings"
	"testing"
	"time"
)

func parked(started chan<- struct{}, stop <-chan struct{}) {
	close(started)
	<-stop
}

func TestRunningFindsALiveGoroutine(t *testing.T) {
	started, stop := make(chan struct{}), make(chan struct{})
	go parked(started, stop)
	<-started
	if got := Wait(50*time.Millisecond, "leakcheck.parked"); !strings.Contains(got, "leakcheck.parked") {
		t.Fatalf("a parked goroutine was not reported: %q", got)
	}
	close(stop)
	if got := Wait(10*time.Second, "leakcheck.parked"); got != "" {
		t.Fatalf("a goroutine that ended is still reported:\n%s", got)
	}
}

func TestRunningSkipsTheCaller(t *testing.T) {
	if got := Running("leakcheck.TestRunningSkipsTheCaller"); len(got) != 0 {
		t.Fatalf("the caller counted as a leak:\n%s", got)
	}
}
