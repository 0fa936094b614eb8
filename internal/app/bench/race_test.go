//go:build race

package bench

// raceEnabled says the race detector is on: everything runs several times
// slower, the simulated runtime (this binary, re-executed) too.
const raceEnabled = true
