package gateway

import "sync"

// limiter bounds the generations in flight. Acquiring never waits: a full limiter
// answers at once, so the client can be told to retry.
type limiter struct {
	mu   sync.Mutex
	used int
	cap  int
}

func (l *limiter) tryAcquire(n int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.used+n > l.cap {
		return false
	}
	l.used += n
	return true
}

func (l *limiter) release(n int) {
	l.mu.Lock()
	l.used -= n
	l.mu.Unlock()
}

func (l *limiter) inUse() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.used
}
