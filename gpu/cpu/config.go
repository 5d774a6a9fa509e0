package cpu

import (
	"fmt"
	"runtime"
	"time"
)

// Config configures a Device.
type Config struct {
	// Threads is the number of threads that share each operation, the
	// calling goroutine included; 0 means runtime.GOMAXPROCS(0).
	Threads int
	// Spin is how long an idle worker polls for the next operation before
	// it parks; 0 parks at once (lower CPU use, slower dispatch).
	Spin time.Duration
}

// DefaultConfig returns a Config using every available thread.
func DefaultConfig() Config {
	return Config{Threads: 0, Spin: 200 * time.Microsecond}
}

// maxThreads bounds Config.Threads.
const maxThreads = 1024

// Validate reports the first invalid field of c.
func (c Config) Validate() error {
	if c.Threads < 0 || c.Threads > maxThreads {
		return fmt.Errorf("cpu config: threads %d outside [0,%d]", c.Threads, maxThreads)
	}
	if c.Spin < 0 {
		return fmt.Errorf("cpu config: negative spin %v", c.Spin)
	}
	return nil
}

func (c Config) threads() int {
	if c.Threads == 0 {
		return runtime.GOMAXPROCS(0)
	}
	return c.Threads
}
