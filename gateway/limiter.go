package gateway

import (
	"fmt"
	"sync"
	"time"
)

// limiter bounds the generations in flight, and with per those of each
// tenant (API key), so that one key cannot take every slot. Acquiring
// never waits: a full limiter answers at once, so the client can be told
// to retry.
type limiter struct {
	mu       sync.Mutex
	used     int
	cap      int
	per      int            // a tenant's bound; 0 for none
	byTenant map[string]int // the slots each tenant holds, with per
	refused  uint64         // requests refused at a tenant's bound
}

// tryAcquire takes n slots for tenant, or answers why not: nil, or a 429
// that names the bound.
func (l *limiter) tryAcquire(tenant string, n int, retry time.Duration) *apiError {
	l.mu.Lock()
	defer l.mu.Unlock()
	held := 0
	if l.per > 0 && tenant != "" {
		held = l.byTenant[tenant]
		if held+n > l.per {
			l.refused++
			return tooManyRequests("key_limit", fmt.Sprintf("this API key has %d generations in flight, at most %d; retry later", held, l.per), retry)
		}
	}
	if l.used+n > l.cap {
		return tooManyRequests("queue_full", "too many requests in flight; retry later", retry)
	}
	l.used += n
	if l.per > 0 && tenant != "" {
		if l.byTenant == nil {
			l.byTenant = map[string]int{}
		}
		l.byTenant[tenant] = held + n
	}
	return nil
}

// release frees n slots tenant took.
func (l *limiter) release(tenant string, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.used -= n
	if l.per > 0 && tenant != "" {
		if l.byTenant[tenant] -= n; l.byTenant[tenant] <= 0 {
			delete(l.byTenant, tenant)
		}
	}
}

func (l *limiter) inUse() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.used
}

// keyLimited is how many requests were refused at a tenant's bound.
func (l *limiter) keyLimited() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.refused
}
