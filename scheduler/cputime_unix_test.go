//go:build unix

package scheduler

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time this process has used, every thread counted.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
