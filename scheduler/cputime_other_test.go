//go:build !unix

package scheduler

import "time"

// cpuTime is unknown here: the cpu-µs/token metric reads 0.
func cpuTime() time.Duration { return 0 }
