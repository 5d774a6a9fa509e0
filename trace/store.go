package trace

import (
	"container/list"
	"context"
	"errors"
	"slices"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	oteltrace "go.opentelemetry.io/otel/trace"
)

// StoreConfig bounds the recent-span store.
type StoreConfig struct {
	// Traces is how many traces the store keeps; the least recently
	// updated trace goes first.
	Traces int
	// Spans is the most spans kept over all traces. A span costs about half
	// a kilobyte, so the default of 50,000 is about 25 MB.
	Spans int
	// SpansPerTrace is the most spans kept of one trace; later spans of a
	// trace beyond it are counted as dropped.
	SpansPerTrace int
}

// DefaultStoreConfig returns the store limits Setup uses by default.
func DefaultStoreConfig() StoreConfig {
	return StoreConfig{Traces: 128, Spans: 50_000, SpansPerTrace: 20_000}
}

// Validate reports whether c is usable.
func (c StoreConfig) Validate() error {
	switch {
	case c.Traces < 1:
		return errors.New("trace store: traces must be at least 1")
	case c.Spans < 1:
		return errors.New("trace store: spans must be at least 1")
	case c.SpansPerTrace < 1 || c.SpansPerTrace > c.Spans:
		return errors.New("trace store: spans per trace must be between 1 and spans")
	}
	return nil
}

// Store is a span processor that keeps the ended spans of the most recent
// traces in memory, within the bounds of its StoreConfig, so that a server
// can show traces without a collector. It is safe for concurrent use.
//
// A request is found by its id once a span carrying AttrRequestID (the
// request or queue span) has started.
type Store struct {
	cfg StoreConfig

	// mu guards the fields below it.
	mu       sync.Mutex
	traces   map[oteltrace.TraceID]*storedTrace
	lru      list.List // of *storedTrace, least recently updated at the front
	requests map[string]oteltrace.TraceID
	spans    int // spans held over all traces
}

type storedTrace struct {
	id       oteltrace.TraceID
	spans    []sdktrace.ReadOnlySpan
	dropped  int
	requests []string
	elem     *list.Element
}

var _ sdktrace.SpanProcessor = (*Store)(nil)

// NewStore returns an empty store bounded by cfg.
func NewStore(cfg StoreConfig) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Store{
		cfg:      cfg,
		traces:   make(map[oteltrace.TraceID]*storedTrace),
		requests: make(map[string]oteltrace.TraceID),
	}, nil
}

// OnStart registers the request id of a request or queue span, so that a
// request in progress can be looked up.
func (s *Store) OnStart(_ context.Context, span sdktrace.ReadWriteSpan) {
	if name := span.Name(); name != SpanRequest && name != SpanQueue {
		return
	}
	id, ok := requestID(span.Attributes())
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.touch(span.SpanContext().TraceID())
	s.addRequest(t, id)
	s.evict(t)
}

// OnEnd keeps span.
func (s *Store) OnEnd(span sdktrace.ReadOnlySpan) {
	var reqID string
	var hasReq bool
	if name := span.Name(); name == SpanRequest || name == SpanQueue {
		reqID, hasReq = requestID(span.Attributes())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.touch(span.SpanContext().TraceID())
	if len(t.spans) >= s.cfg.SpansPerTrace {
		t.dropped++
	} else {
		t.spans = append(t.spans, span)
		s.spans++
	}
	if hasReq {
		s.addRequest(t, reqID)
	}
	s.evict(t)
}

// Shutdown does nothing: the store holds no resources beyond memory.
func (s *Store) Shutdown(context.Context) error { return nil }

// ForceFlush does nothing: spans are stored as they end.
func (s *Store) ForceFlush(context.Context) error { return nil }

// Trace returns the stored spans of the trace id.
func (s *Store) Trace(id oteltrace.TraceID) (Waterfall, bool) {
	s.mu.Lock()
	t, ok := s.traces[id]
	var spans []sdktrace.ReadOnlySpan
	var dropped int
	if ok {
		spans = slices.Clone(t.spans)
		dropped = t.dropped
	}
	s.mu.Unlock()
	if !ok {
		return Waterfall{}, false
	}
	return waterfallOf(id.String(), spans, dropped), true
}

// ByRequest returns the stored spans of the trace of request id.
func (s *Store) ByRequest(id string) (Waterfall, bool) {
	s.mu.Lock()
	tid, ok := s.requests[id]
	s.mu.Unlock()
	if !ok {
		return Waterfall{}, false
	}
	return s.Trace(tid)
}

// Len returns how many traces and spans the store holds.
func (s *Store) Len() (traces, spans int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.traces), s.spans
}

// touch returns the entry of id, created if needed, marked most recent.
// s.mu must be held.
func (s *Store) touch(id oteltrace.TraceID) *storedTrace {
	t, ok := s.traces[id]
	if !ok {
		t = &storedTrace{id: id}
		t.elem = s.lru.PushBack(t)
		s.traces[id] = t
		return t
	}
	s.lru.MoveToBack(t.elem)
	return t
}

// addRequest maps request id to t. s.mu must be held.
func (s *Store) addRequest(t *storedTrace, id string) {
	if cur, ok := s.requests[id]; ok && cur == t.id {
		return
	}
	s.requests[id] = t.id
	t.requests = append(t.requests, id)
}

// evict drops the least recently updated traces, other than keep, while
// the store is over its bounds. s.mu must be held.
func (s *Store) evict(keep *storedTrace) {
	for len(s.traces) > s.cfg.Traces || s.spans > s.cfg.Spans {
		front := s.lru.Front()
		old := front.Value.(*storedTrace)
		if old == keep {
			return
		}
		s.lru.Remove(front)
		delete(s.traces, old.id)
		s.spans -= len(old.spans)
		for _, r := range old.requests {
			if s.requests[r] == old.id {
				delete(s.requests, r)
			}
		}
	}
}

// requestID finds AttrRequestID among kvs.
func requestID(kvs []attribute.KeyValue) (string, bool) {
	for _, kv := range kvs {
		if kv.Key == AttrRequestID {
			return kv.Value.AsString(), true
		}
	}
	return "", false
}
