package trace

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	oteltrace "go.opentelemetry.io/otel/trace"
)

// runRequest traces a request of n tokens through two shards with the
// Tracer helpers and returns the trace id.
func runRequest(tr Tracer, requestID string, n int) oteltrace.TraceID {
	ctx, req := tr.StartRequest(context.Background(), requestID)
	_, q := tr.StartQueue(ctx, requestID)
	q.End()

	pctx, pre := tr.StartPrefill(ctx, 0, 7, 1)
	for shard := range 2 {
		_, f := tr.StartShardForward(pctx, shard, shard*16, shard*16+16)
		f.End()
	}
	_, smp := tr.StartSample(pctx)
	smp.End()
	_, em := tr.StartEmit(pctx, 0, 100)
	em.End()
	tr.SetToken(pre, 0, 100)
	pre.End()

	for seq := 1; seq < n; seq++ {
		sctx, step := tr.StartDecodeStep(ctx, seq, 1, 7+seq, 1)
		for shard := range 2 {
			_, f := tr.StartShardForward(sctx, shard, shard*16, shard*16+16)
			f.End()
		}
		_, smp := tr.StartSample(sctx)
		smp.End()
		_, em := tr.StartEmit(sctx, seq, 100+seq)
		em.End()
		step.End()
	}
	req.End()
	return req.SpanContext().TraceID()
}

func TestTracerSpansAndAttributes(t *testing.T) {
	t.Parallel()
	p := newTestProvider(t, DefaultStoreConfig())
	id := runRequest(p.Tracer(), "req-1", 3)

	w, ok := p.Store().Trace(id)
	if !ok {
		t.Fatalf("Trace(%s): not found", id)
	}
	// request, queue, prefill + 4 children, 2 x (decode.step + 4 children).
	if got, want := len(w.Spans), 3+4+2*5; got != want {
		t.Fatalf("got %d spans, want %d", got, want)
	}
	byID := map[string]Span{}
	for _, s := range w.Spans {
		byID[s.SpanID] = s
	}
	var root Span
	counts := map[string]int{}
	for _, s := range w.Spans {
		counts[s.Name]++
		if s.ParentID == "" {
			if root.SpanID != "" {
				t.Fatalf("two roots: %s and %s", root.Name, s.Name)
			}
			root = s
			continue
		}
		parent, ok := byID[s.ParentID]
		if !ok {
			t.Fatalf("span %s: parent %s not in trace", s.Name, s.ParentID)
		}
		want := map[string][]string{
			SpanQueue:        {SpanRequest},
			SpanPrefill:      {SpanRequest},
			SpanDecodeStep:   {SpanRequest},
			SpanShardForward: {SpanPrefill, SpanDecodeStep},
			SpanSample:       {SpanPrefill, SpanDecodeStep},
			SpanEmit:         {SpanPrefill, SpanDecodeStep},
		}[s.Name]
		if !contains(want, parent.Name) {
			t.Errorf("span %s has parent %s, want one of %v", s.Name, parent.Name, want)
		}
		if s.StartUS < 0 || s.End() > root.End()+1e-3 && root.SpanID != "" {
			t.Errorf("span %s [%v, %v] outside its trace", s.Name, s.StartUS, s.End())
		}
	}
	if root.Name != SpanRequest {
		t.Fatalf("root is %q, want %q", root.Name, SpanRequest)
	}
	if got, _ := root.String(string(AttrRequestID)); got != "req-1" {
		t.Errorf("request.id = %q, want req-1", got)
	}
	if counts[SpanDecodeStep] != 2 || counts[SpanShardForward] != 6 || counts[SpanEmit] != 3 {
		t.Errorf("span counts %v", counts)
	}
	for _, s := range w.Spans {
		switch s.Name {
		case SpanDecodeStep:
			for _, k := range []string{"token.seq", "batch.size", "position", "kv.blocks"} {
				if _, ok := s.Int(k); !ok {
					t.Errorf("decode.step lacks %s: %v", k, s.Attrs)
				}
			}
		case SpanShardForward:
			idx, _ := s.Int("shard.index")
			a, _ := s.Int("shard.layer.start")
			b, _ := s.Int("shard.layer.end")
			if a != idx*16 || b != a+16 {
				t.Errorf("shard %d has layers [%d,%d), want [%d,%d)", idx, a, b, idx*16, idx*16+16)
			}
		case SpanEmit:
			seq, _ := s.Int("token.seq")
			tok, _ := s.Int("token.id")
			if tok != 100+seq {
				t.Errorf("emit seq %d has token %d, want %d", seq, tok, 100+seq)
			}
		}
	}
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

func TestZeroTracerRecordsNothing(t *testing.T) {
	t.Parallel()
	var tr Tracer
	ctx := context.Background()
	got, span := tr.StartDecodeStep(ctx, 1, 1, 1, 1)
	if got != ctx {
		t.Error("zero Tracer changed the context")
	}
	if span.IsRecording() || span.SpanContext().IsValid() {
		t.Error("zero Tracer returned a recording span")
	}
	span.End()
	tr.SetToken(span, 1, 2)
}

func TestNilProviderTracer(t *testing.T) {
	t.Parallel()
	tr := NewTracer(nil)
	_, span := tr.StartRequest(context.Background(), "r")
	if span.IsRecording() {
		t.Error("Tracer of a nil provider returned a recording span")
	}
	span.End()
}

// TestSetTokenOnEndedSpan checks that late attributes on an ended span are
// ignored rather than racing with exporters.
func TestSetTokenOnEndedSpan(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := newSDKProvider(t, rec)
	tr := NewTracer(tp)
	_, span := tr.StartSample(context.Background())
	span.End()
	tr.SetToken(span, 3, 4)
	ended := rec.Ended()
	if len(ended) != 1 {
		t.Fatalf("got %d ended spans, want 1", len(ended))
	}
	if n := len(ended[0].Attributes()); n != 0 {
		t.Errorf("ended span got %d attributes, want 0", n)
	}
}

// benchTokens is the request length in the benchmarks: a new request
// starts every benchTokens tokens, so the store appends and evicts as it
// would in a server.
const benchTokens = 512

// BenchmarkDecodeStep measures the tracing cost of one token: a decode.step
// span with shard.forward, sample and emit children and their attributes,
// recorded into the store.
func BenchmarkDecodeStep(b *testing.B) {
	p := newTestProvider(b, StoreConfig{Traces: 16, Spans: 16 * 4 * benchTokens, SpansPerTrace: 4 * benchTokens})
	benchDecodeStep(b, p.Tracer())
}

// BenchmarkDecodeStepNoStore is BenchmarkDecodeStep with spans recorded
// but kept nowhere: the SDK's own cost.
func BenchmarkDecodeStepNoStore(b *testing.B) {
	benchDecodeStep(b, NewTracer(newSDKProvider(b, nil)))
}

func benchDecodeStep(b *testing.B, tr Tracer) {
	b.ReportAllocs()
	seq := 0
	var ctx context.Context
	var req oteltrace.Span
	for b.Loop() {
		if seq%benchTokens == 0 {
			if req != nil {
				req.End()
			}
			ctx, req = tr.StartRequest(context.Background(), "bench")
		}
		seq++
		sctx, step := tr.StartDecodeStep(ctx, seq, 1, seq, 4)
		_, f := tr.StartShardForward(sctx, 0, 0, 16)
		f.End()
		_, s := tr.StartSample(sctx)
		s.End()
		_, e := tr.StartEmit(sctx, seq, 42)
		e.End()
		step.End()
	}
	req.End()
}

// BenchmarkDecodeStepSDKOptions builds the same spans through the SDK with
// trace.WithAttributes, without the helpers, for comparison.
func BenchmarkDecodeStepSDKOptions(b *testing.B) {
	t := newSDKProvider(b, nil).Tracer(ScopeName)
	ctx, req := t.Start(context.Background(), SpanRequest)
	defer req.End()
	b.ReportAllocs()
	seq := 0
	for b.Loop() {
		seq++
		sctx, step := t.Start(ctx, SpanDecodeStep, oteltrace.WithAttributes(
			AttrTokenSeq.Int(seq), AttrBatchSize.Int(1), AttrPosition.Int(seq), AttrKVBlocks.Int(4)))
		_, f := t.Start(sctx, SpanShardForward, oteltrace.WithAttributes(
			AttrShardIndex.Int(0), AttrLayerStart.Int(0), AttrLayerEnd.Int(16)))
		f.End()
		_, s := t.Start(sctx, SpanSample)
		s.End()
		_, e := t.Start(sctx, SpanEmit, oteltrace.WithAttributes(AttrTokenSeq.Int(seq), AttrTokenID.Int(42)))
		e.End()
		step.End()
	}
}
