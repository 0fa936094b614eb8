//go:build !unix

package bench

import "time"

// processCPU is not measured on this platform.
func processCPU() time.Duration { return 0 }

// cpuMeasured says whether processCPU measures anything.
const cpuMeasured = false
