package stats

import (
	"slices"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(101-i)*time.Millisecond)
	}
	orig := slices.Clone(ds)
	for _, c := range []struct {
		ds   []time.Duration
		p    float64
		want time.Duration
	}{
		{ds, 0.5, 50 * time.Millisecond},
		{ds, 0.99, 99 * time.Millisecond},
		{ds, 1, 100 * time.Millisecond},
		{ds, 0, time.Millisecond},
		{ds[:3], 0.99, 100 * time.Millisecond},
		{ds[:3], 0.5, 99 * time.Millisecond},
		{nil, 0.5, 0},
	} {
		if got := Percentile(c.ds, c.p); got != c.want {
			t.Errorf("Percentile(%d values, %v) = %v, want %v", len(c.ds), c.p, got, c.want)
		}
	}
	if !slices.Equal(ds, orig) {
		t.Error("Percentile reordered its argument")
	}
}
