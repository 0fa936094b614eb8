package podcache

import (
	"context"
	"fmt"
	goruntime "runtime"
	"testing"
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"k8s.io/apimachinery/pkg/types"
)

func BenchmarkGetHit(b *testing.B) {
	c := New()
	st := &cruntime.PodStatus{UID: "a"}
	c.Set("a", st, nil, t0)
	b.ReportAllocs()
	for b.Loop() {
		if s, _ := c.Get("a"); s != st {
			b.Fatal("wrong status")
		}
	}
}

// BenchmarkUpdateTime1000 is the end of a relist of a 1,000-pod node with
// no reader waiting: UpdateTime with 1,000 entries.
func BenchmarkUpdateTime1000(b *testing.B) {
	c := New()
	for i := range 1000 {
		uid := types.UID(fmt.Sprintf("pod-%d", i))
		c.Set(uid, &cruntime.PodStatus{UID: uid}, nil, t0)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		c.UpdateTime(t0.Add(time.Duration(i)))
	}
}

// BenchmarkGetNewerThanFresh is a reader whose data is already fresh
// enough: it must return at once, without blocking.
func BenchmarkGetNewerThanFresh(b *testing.B) {
	c := New()
	c.Set("a", &cruntime.PodStatus{UID: "a"}, nil, t0.Add(time.Second))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.GetNewerThan(ctx, "a", t0); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGetNewerThanWoken is a reader that blocks until the next relist
// ends (UpdateTime), as a pod worker does after acting on its pod.
func BenchmarkGetNewerThanWoken(b *testing.B) {
	c := New()
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		min := t0.Add(time.Duration(2 * i))
		done := make(chan struct{})
		go func() {
			defer close(done)
			if _, err := c.GetNewerThan(ctx, "a", min); err != nil {
				panic(err)
			}
		}()
		for c.Waiters() == 0 {
			select {
			case <-done:
				b.Fatal("GetNewerThan returned before UpdateTime")
			default:
			}
			goruntime.Gosched()
		}
		c.UpdateTime(min.Add(1))
		<-done
	}
}
