package gateway

import (
	"sync"
)

// responseStore keeps the last responses a gateway answered (those not
// asked store: false), for a request to continue (previous_response_id)
// and a client to fetch or delete: at most max, the oldest dropped first,
// each visible to its tenant alone. It lives in the gateway's memory: a
// response is found through the node that answered it.
type responseStore struct {
	mu    sync.Mutex
	max   int
	byID  map[string]*storedResponse
	order []string // ids, oldest first (deleted ones skipped when dropped)
}

// storedResponse is a kept response: the conversation it ends (every
// message up to its output; instructions not carried) and the response as
// answered.
type storedResponse struct {
	tenant string
	conv   []chatMessage
	object []byte
}

func newResponseStore(max int) *responseStore {
	return &responseStore{max: max, byID: map[string]*storedResponse{}}
}

// put keeps r under id, dropping the oldest beyond the bound.
func (s *responseStore) put(id string, r *storedResponse) {
	if s.max == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.byID[id] = r
	s.order = append(s.order, id)
	for len(s.byID) > s.max && len(s.order) > 0 {
		delete(s.byID, s.order[0])
		s.order = s.order[1:]
	}
	if len(s.order) > 2*s.max+16 {
		// Ids of deleted responses: compact.
		live := s.order[:0]
		for _, k := range s.order {
			if s.byID[k] != nil {
				live = append(live, k)
			}
		}
		s.order = live
	}
}

// get is tenant's response id.
func (s *responseStore) get(id, tenant string) (*storedResponse, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.byID[id]
	if !ok || r.tenant != tenant {
		return nil, false
	}
	return r, true
}

// drop deletes tenant's response id and reports whether there was one.
func (s *responseStore) drop(id, tenant string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.byID[id]
	if !ok || r.tenant != tenant {
		return false
	}
	delete(s.byID, id)
	return true
}
