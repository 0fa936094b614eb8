// Package stats holds the one percentile the repository's measurements
// use (the bench, the demo, the benchmarks and the end-to-end suite).
package stats

import (
	"math"
	"slices"
	"time"
)

// Percentile returns the nearest-rank percentile p (0 <= p <= 1) of ds: the
// smallest value at least a fraction p of them are at or below. p 0 is the
// least, 1 the greatest; no value gives 0. ds is left as it is.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}
