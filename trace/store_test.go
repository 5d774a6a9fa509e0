package trace

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

func TestStoreByRequest(t *testing.T) {
	t.Parallel()
	p := newTestProvider(t, DefaultStoreConfig())
	tr := p.Tracer()
	id := runRequest(tr, "req-a", 4)
	other := runRequest(tr, "req-b", 2)
	if id == other {
		t.Fatal("two requests share a trace id")
	}
	w, ok := p.Store().ByRequest("req-a")
	if !ok {
		t.Fatal("ByRequest(req-a): not found")
	}
	if w.TraceID != id.String() {
		t.Errorf("ByRequest(req-a) trace %s, want %s", w.TraceID, id)
	}
	if _, ok := p.Store().ByRequest("req-none"); ok {
		t.Error("ByRequest(req-none) found a trace")
	}
	if w.Spans[0].StartUS != 0 || w.Spans[0].Name != SpanRequest {
		t.Errorf("first span %s starts at %v, want the request at 0", w.Spans[0].Name, w.Spans[0].StartUS)
	}
	for i := 1; i < len(w.Spans); i++ {
		if w.Spans[i].StartUS < w.Spans[i-1].StartUS {
			t.Fatalf("spans not ordered by start at %d", i)
		}
	}
}

// TestStoreRequestInProgress checks that a request is found by id while its
// request span is still open.
func TestStoreRequestInProgress(t *testing.T) {
	t.Parallel()
	p := newTestProvider(t, DefaultStoreConfig())
	tr := p.Tracer()
	ctx, req := tr.StartRequest(context.Background(), "live")
	if _, ok := p.Store().ByRequest("live"); !ok {
		t.Fatal("ByRequest(live) before any span ended: not found")
	}
	_, step := tr.StartDecodeStep(ctx, 1, 1, 1, 1)
	step.End()
	w, ok := p.Store().ByRequest("live")
	if !ok || len(w.Spans) != 1 || w.Spans[0].Name != SpanDecodeStep {
		t.Fatalf("ByRequest(live) = %+v, %v; want the one decode.step", w, ok)
	}
	req.End()
	w, _ = p.Store().ByRequest("live")
	if len(w.Spans) != 2 {
		t.Errorf("got %d spans after the request ended, want 2", len(w.Spans))
	}
}

func TestStoreBounds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		cfg        StoreConfig
		requests   int
		tokens     int // decode steps per request: 5 spans each, plus 7 spans of prefill
		wantTraces int
		wantKept   []string // request ids expected to remain
		wantGone   []string
	}{
		{
			name:       "traces",
			cfg:        StoreConfig{Traces: 3, Spans: 10_000, SpansPerTrace: 1000},
			requests:   5,
			tokens:     2,
			wantTraces: 3,
			wantKept:   []string{"r2", "r3", "r4"},
			wantGone:   []string{"r0", "r1"},
		},
		{
			name:       "spans",
			cfg:        StoreConfig{Traces: 100, Spans: 40, SpansPerTrace: 40},
			requests:   4,
			tokens:     3, // 7 + 2*5 = 17 spans per request
			wantTraces: 2,
			wantKept:   []string{"r2", "r3"},
			wantGone:   []string{"r0", "r1"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := newTestProvider(t, tc.cfg)
			for i := range tc.requests {
				runRequest(p.Tracer(), fmt.Sprintf("r%d", i), tc.tokens)
			}
			traces, spans := p.Store().Len()
			if traces != tc.wantTraces {
				t.Errorf("got %d traces, want %d", traces, tc.wantTraces)
			}
			if spans > tc.cfg.Spans {
				t.Errorf("got %d spans, over the bound %d", spans, tc.cfg.Spans)
			}
			for _, id := range tc.wantKept {
				if _, ok := p.Store().ByRequest(id); !ok {
					t.Errorf("request %s evicted, want kept", id)
				}
			}
			for _, id := range tc.wantGone {
				if _, ok := p.Store().ByRequest(id); ok {
					t.Errorf("request %s kept, want evicted", id)
				}
			}
		})
	}
}

func TestStoreSpansPerTrace(t *testing.T) {
	t.Parallel()
	p := newTestProvider(t, StoreConfig{Traces: 4, Spans: 100, SpansPerTrace: 10})
	id := runRequest(p.Tracer(), "long", 5) // 7 + 4*5 = 27 spans
	w, ok := p.Store().Trace(id)
	if !ok {
		t.Fatal("trace not found")
	}
	if len(w.Spans) != 10 || w.Dropped != 17 {
		t.Errorf("kept %d spans and dropped %d, want 10 and 17", len(w.Spans), w.Dropped)
	}
}

// TestStoreRecentFirst checks that a trace updated recently survives an
// older trace that was created after it.
func TestStoreRecentFirst(t *testing.T) {
	t.Parallel()
	p := newTestProvider(t, StoreConfig{Traces: 2, Spans: 100, SpansPerTrace: 100})
	tr := p.Tracer()
	ctx, long := tr.StartRequest(context.Background(), "long")
	runRequest(tr, "short", 1)
	_, step := tr.StartDecodeStep(ctx, 1, 1, 1, 1) // touches "long"
	step.End()
	runRequest(tr, "third", 1)
	long.End()
	if _, ok := p.Store().ByRequest("long"); !ok {
		t.Error("the recently updated request was evicted")
	}
	if _, ok := p.Store().ByRequest("short"); ok {
		t.Error("the least recently updated request was kept")
	}
}

func TestStoreConcurrent(t *testing.T) {
	t.Parallel()
	p := newTestProvider(t, StoreConfig{Traces: 8, Spans: 500, SpansPerTrace: 100})
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() { runRequest(p.Tracer(), fmt.Sprintf("c%d", i), 3) })
	}
	for range 4 {
		wg.Go(func() {
			for i := range 16 {
				if w, ok := p.Store().ByRequest(fmt.Sprintf("c%d", i)); ok && w.TraceID == "" {
					t.Errorf("request c%d: empty trace id", i)
				}
			}
		})
	}
	wg.Wait()
	traces, spans := p.Store().Len()
	if traces > 8 || spans > 500 {
		t.Errorf("store holds %d traces and %d spans, over its bounds", traces, spans)
	}
	if traces == 0 {
		t.Error("store is empty")
	}
}

func TestStoreConfigValidate(t *testing.T) {
	t.Parallel()
	for _, c := range []StoreConfig{
		{Traces: 0, Spans: 1, SpansPerTrace: 1},
		{Traces: 1, Spans: 0, SpansPerTrace: 1},
		{Traces: 1, Spans: 1, SpansPerTrace: 2},
	} {
		if _, err := NewStore(c); err == nil {
			t.Errorf("NewStore(%+v) succeeded, want an error", c)
		}
	}
	if err := DefaultStoreConfig().Validate(); err != nil {
		t.Errorf("default config: %v", err)
	}
}
