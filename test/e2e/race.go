//go:build race

package e2e

// raceEnabled says whether the suite was built with the race detector
// (-race): the MEASURE lines carry it as race=true|false. norace.go holds
// the other build's value.
const raceEnabled = true
