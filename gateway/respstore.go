package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"
)

// ResponseStore keeps the responses a gateway answered (those not asked
// store: false), for a request to continue one (previous_response_id) and a
// client to fetch or delete it (GET and DELETE /v1/responses/{id}). The
// values are opaque to it. A store may drop any value (a bound, an age):
// the gateway then answers 404, as for a response never kept.
//
// Config.Responses sets the store; without one the gateway keeps the last
// Config.MaxStoredResponses in its own memory, where only the node that
// answered a response finds it. Gateways behind one load balancer share
// one store (troupe serve: a JetStream key-value bucket of the cluster).
type ResponseStore interface {
	// Put keeps value under id.
	Put(ctx context.Context, id string, value []byte) error
	// Get returns the value kept under id, or ok false where there is none.
	Get(ctx context.Context, id string) (value []byte, ok bool, err error)
	// Delete drops id's value, if any.
	Delete(ctx context.Context, id string) error
}

// storeTimeout bounds a store's answer to one request.
const storeTimeout = 5 * time.Second

// storedResponse is a kept response: its tenant, the conversation it ends
// (every message up to its output; instructions not carried) and the
// response as answered.
type storedResponse struct {
	Tenant string          `json:"tenant"`
	Conv   []chatMessage   `json:"conv"`
	Object json.RawMessage `json:"object"`
	// Cancel marks the value kept under cancelKey(id): a request that the
	// background response id stop, left by a gateway not running it.
	Cancel bool `json:"cancel,omitempty"`
	// Events is the value kept under eventsKey(id): a streamed background
	// response's events.
	Events *eventRecord `json:"events,omitempty"`
	// Beat is when the gateway running a background response last kept it
	// (Unix milliseconds), which it does every Server.bgBeat while it runs.
	Beat int64 `json:"beat,omitempty"`
}

// cancelKey is where a cancel marker for response id is kept.
func cancelKey(id string) string { return id + ".cancel" }

// eventsKey is where a streamed background response id's events are kept:
// the sizes of its chunks and the events after them (eventKeeper).
func eventsKey(id string) string { return id + ".events" }

// chunkKey is where chunk i of response id's events is kept.
func chunkKey(id string, i int) string { return fmt.Sprintf("%s.events.%d", id, i) }

// partKey is where part j (from 1) of chunk i of response id's events is
// kept, where the chunk's one event is split (eventRecord.Parts).
func partKey(id string, i, j int) string { return fmt.Sprintf("%s.events.%d.%d", id, i, j) }

// putEvents keeps tenant's response id's events record.
func (r keptResponses) putEvents(ctx context.Context, id, tenant string, rec eventRecord) error {
	return r.put(ctx, eventsKey(id), &storedResponse{Tenant: tenant, Events: &rec})
}

// events returns tenant's response id's kept events record, or nil.
func (r keptResponses) events(ctx context.Context, id, tenant string) (*eventRecord, error) {
	return r.eventsAt(ctx, eventsKey(id), tenant)
}

// chunk returns chunk i of tenant's response id's events, which rec
// says holds n events.
func (r keptResponses) chunk(ctx context.Context, id, tenant string, i, n int) ([][]byte, error) {
	rec, err := r.eventsAt(ctx, chunkKey(id, i), tenant)
	switch {
	case err != nil:
		return nil, err
	case rec == nil || len(rec.Events) != n || (rec.Parts > 1 && n != 1):
		return nil, fmt.Errorf("kept response %s: chunk %d of its events is missing or not whole", truncate(id, 80), i)
	case rec.Parts <= 1:
		return rec.Events, nil
	}
	e := slices.Clip(rec.Events[0])
	for j := 1; j < rec.Parts; j++ {
		p, err := r.eventsAt(ctx, partKey(id, i, j), tenant)
		switch {
		case err != nil:
			return nil, err
		case p == nil || len(p.Events) != 1:
			return nil, fmt.Errorf("kept response %s: part %d of chunk %d of its events is missing", truncate(id, 80), j, i)
		}
		e = append(e, p.Events[0]...)
	}
	return [][]byte{e}, nil
}

func (r keptResponses) eventsAt(ctx context.Context, key, tenant string) (*eventRecord, error) {
	v, err := r.load(ctx, key, tenant)
	if v == nil || err != nil {
		return nil, err
	}
	return v.Events, nil
}

// keptResponses reads and writes kept responses through a ResponseStore, each
// visible to its tenant alone.
type keptResponses struct{ store ResponseStore }

func (r keptResponses) enabled() bool { return r.store != nil }

func (r keptResponses) put(ctx context.Context, id string, v *storedResponse) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	return r.store.Put(ctx, id, b)
}

// get is tenant's response id, or nil where the store has none of its.
func (r keptResponses) get(ctx context.Context, id, tenant string) (*storedResponse, error) {
	v, err := r.load(ctx, id, tenant)
	if v == nil || err != nil || v.Cancel || len(v.Object) == 0 {
		return nil, err
	}
	return v, nil
}

// load is the value kept under key for tenant, or nil where the store has
// none of its.
func (r keptResponses) load(ctx context.Context, key, tenant string) (*storedResponse, error) {
	if r.store == nil {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	b, ok, err := r.store.Get(ctx, key)
	if err != nil || !ok {
		return nil, err
	}
	var v storedResponse
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("kept response %s: %w", truncate(key, 80), err)
	}
	if v.Tenant != tenant {
		return nil, nil
	}
	return &v, nil
}

// requestCancel leaves a marker asking the gateway running tenant's
// background response id to stop it.
func (r keptResponses) requestCancel(ctx context.Context, id, tenant string) error {
	return r.put(ctx, cancelKey(id), &storedResponse{Tenant: tenant, Cancel: true})
}

// cancelRequested reports whether a marker asks that response id stop.
func (r keptResponses) cancelRequested(ctx context.Context, id string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	_, ok, err := r.store.Get(ctx, cancelKey(id))
	return ok, err
}

// clearCancel drops response id's cancel marker, if any.
func (r keptResponses) clearCancel(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	return r.store.Delete(ctx, cancelKey(id))
}

// drop deletes tenant's response id and reports whether there was one.
func (r keptResponses) drop(ctx context.Context, id, tenant string) (bool, error) {
	v, err := r.get(ctx, id, tenant)
	if v == nil || err != nil {
		return false, err
	}
	// The record first, so that no reader follows it to a chunk gone, and
	// the response last, so that a delete that fails can be asked again.
	keys := []string{eventsKey(id)}
	if rec, _ := r.events(ctx, id, tenant); rec != nil {
		for i, n := range rec.Chunks {
			keys = append(keys, chunkKey(id, i))
			if n != 1 {
				continue
			}
			if c, _ := r.eventsAt(ctx, chunkKey(id, i), tenant); c != nil {
				for j := 1; j < c.Parts; j++ {
					keys = append(keys, partKey(id, i, j))
				}
			}
		}
	}
	keys = append(keys, id)
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	for _, k := range keys {
		if err := r.store.Delete(ctx, k); err != nil {
			return false, err
		}
	}
	return true, nil
}

// memoryResponses is the gateway's own ResponseStore: the last max values
// in memory, the oldest dropped first.
type memoryResponses struct {
	mu    sync.Mutex
	max   int
	byID  map[string][]byte
	order []string // ids, oldest first (deleted ones skipped when dropped)
}

// MemoryResponses returns a ResponseStore that keeps the last max values in
// this process's memory, the oldest dropped first.
func MemoryResponses(max int) ResponseStore {
	return &memoryResponses{max: max, byID: map[string][]byte{}}
}

func (s *memoryResponses) Put(_ context.Context, id string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.byID[id]; !ok {
		s.order = append(s.order, id)
	}
	s.byID[id] = value
	for len(s.byID) > s.max && len(s.order) > 0 {
		delete(s.byID, s.order[0])
		s.order = s.order[1:]
	}
	if len(s.order) > 2*s.max+16 {
		// Ids of deleted responses: compact.
		live := s.order[:0]
		for _, k := range s.order {
			if _, ok := s.byID[k]; ok {
				live = append(live, k)
			}
		}
		s.order = live
	}
	return nil
}

func (s *memoryResponses) Get(_ context.Context, id string) ([]byte, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.byID[id]
	return v, ok, nil
}

func (s *memoryResponses) Delete(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byID, id)
	return nil
}
