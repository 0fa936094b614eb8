package pleg

import (
	"context"
	"testing"

	"github.com/podlifecycle/pleg/cruntime"
)

func TestSamePods(t *testing.T) {
	a, b := pod("a", "c=running"), pod("b", "c=running")
	for _, c := range []struct {
		x, y []*cruntime.Pod
		want bool
	}{
		{[]*cruntime.Pod{a, b}, []*cruntime.Pod{a, b}, true},
		{[]*cruntime.Pod{a, b}, []*cruntime.Pod{b, a}, false},
		{[]*cruntime.Pod{a}, []*cruntime.Pod{a, b}, false},
		{[]*cruntime.Pod{a, b}, []*cruntime.Pod{a, pod("b", "c=running")}, false}, // equal, not the same
		{nil, nil, false}, // nothing checked yet: check
	} {
		if got := samePods(c.x, c.y); got != c.want {
			t.Errorf("samePods(%d pods, %d pods) = %v, want %v", len(c.x), len(c.y), got, c.want)
		}
	}
}

// A runtime that answers the same pods again: the listing is not checked
// or counted again, and a malformed one after it still fails.
func TestSameListingSkipsChecks(t *testing.T) {
	rt := &sameRuntime{fakeRuntime: newFakeRuntime()}
	rt.pods = []*cruntime.Pod{pod("a", "s:sa=running", "c=running")}
	g, _ := newTestGenerator(t, rt, nil)
	for range 3 {
		if err := g.Relist(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if l := g.core.lastListing; len(l) != 1 || l[0] != rt.pods[0] {
		t.Fatalf("listing %v", l)
	}
	rt.pods = append(rt.pods, nil)
	if err := g.Relist(t.Context()); err == nil {
		t.Fatal("a listing with a nil pod after a steady one was accepted")
	}
}

// sameRuntime lists the very same pods every time, as cruntime/cri does for
// an unchanged node.
type sameRuntime struct {
	*fakeRuntime
	pods []*cruntime.Pod
}

func (r *sameRuntime) ListPods(context.Context) ([]*cruntime.Pod, error) {
	return append([]*cruntime.Pod(nil), r.pods...), nil
}
