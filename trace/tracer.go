package trace

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of the spans this package starts.
const ScopeName = "github.com/troupe/troupe/trace"

// maxAttrs is the most attributes one helper sets on a span.
const maxAttrs = 4

// attrs is a fixed-size attribute list passed by value, so that building it
// does not allocate.
type attrs struct {
	kv [maxAttrs]attribute.KeyValue
	n  int
}

func (a *attrs) add(kv attribute.KeyValue) { a.kv[a.n] = kv; a.n++ }

// Tracer starts the spans of the troupe vocabulary with their attributes.
// It is cheap to copy and safe for concurrent use. The zero Tracer starts no
// spans: every helper returns ctx unchanged and a span that records nothing.
//
// The helpers add no allocation of their own to what the OpenTelemetry SDK
// needs for a span: attributes travel in a fixed-size array and reach the
// span through a pooled buffer.
type Tracer struct {
	t    oteltrace.Tracer
	bufs *sync.Pool // of *[maxAttrs]attribute.KeyValue
}

// NewTracer returns a Tracer whose spans come from tp. A nil tp gives a
// Tracer that records nothing.
func NewTracer(tp oteltrace.TracerProvider) Tracer {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return Tracer{
		t:    tp.Tracer(ScopeName),
		bufs: &sync.Pool{New: func() any { return new([maxAttrs]attribute.KeyValue) }},
	}
}

func (t Tracer) start(ctx context.Context, name string, a attrs) (context.Context, oteltrace.Span) {
	if t.t == nil {
		return ctx, noop.Span{}
	}
	ctx, span := t.t.Start(ctx, name)
	t.set(span, a)
	return ctx, span
}

// set copies a into a pooled buffer before handing it to the span: a slice
// passed through the Span interface escapes, and a pooled one is reused.
func (t Tracer) set(span oteltrace.Span, a attrs) {
	if a.n == 0 || t.bufs == nil || !span.IsRecording() {
		return
	}
	buf := t.bufs.Get().(*[maxAttrs]attribute.KeyValue)
	*buf = a.kv
	span.SetAttributes(buf[:a.n]...)
	*buf = [maxAttrs]attribute.KeyValue{} // drop string references
	t.bufs.Put(buf)
}

// startWithID starts a per-request span whose request id is given at the
// start, where the Store and samplers see it. It allocates for the option;
// it runs once per request, not per token.
func (t Tracer) startWithID(ctx context.Context, name, requestID string) (context.Context, oteltrace.Span) {
	if t.t == nil {
		return ctx, noop.Span{}
	}
	return t.t.Start(ctx, name, oteltrace.WithAttributes(AttrRequestID.String(requestID)))
}

// StartRequest starts the root span of a request.
func (t Tracer) StartRequest(ctx context.Context, requestID string) (context.Context, oteltrace.Span) {
	return t.startWithID(ctx, SpanRequest, requestID)
}

// StartQueue starts the span of a request's wait for admission. It carries
// the request id too, so that a request can be found before it ends.
func (t Tracer) StartQueue(ctx context.Context, requestID string) (context.Context, oteltrace.Span) {
	return t.startWithID(ctx, SpanQueue, requestID)
}

// StartPrefill starts the span of one prefill chunk of tokens prompt tokens
// starting at position. The chunk that yields the first token should also
// get SetToken.
func (t Tracer) StartPrefill(ctx context.Context, position, tokens, kvBlocks int) (context.Context, oteltrace.Span) {
	var a attrs
	a.add(AttrPosition.Int(position))
	a.add(AttrPromptTokens.Int(tokens))
	a.add(AttrKVBlocks.Int(kvBlocks))
	return t.start(ctx, SpanPrefill, a)
}

// StartDecodeStep starts the span that produces token number seq of a
// request, in a batch of batchSize sequences, at position, holding kvBlocks
// KV blocks.
func (t Tracer) StartDecodeStep(ctx context.Context, seq, batchSize, position, kvBlocks int) (context.Context, oteltrace.Span) {
	var a attrs
	a.add(AttrTokenSeq.Int(seq))
	a.add(AttrBatchSize.Int(batchSize))
	a.add(AttrPosition.Int(position))
	a.add(AttrKVBlocks.Int(kvBlocks))
	return t.start(ctx, SpanDecodeStep, a)
}

// StartShardForward starts the span of shard's forward pass over layers
// [layerStart, layerEnd).
func (t Tracer) StartShardForward(ctx context.Context, shard, layerStart, layerEnd int) (context.Context, oteltrace.Span) {
	var a attrs
	a.add(AttrShardIndex.Int(shard))
	a.add(AttrLayerStart.Int(layerStart))
	a.add(AttrLayerEnd.Int(layerEnd))
	return t.start(ctx, SpanShardForward, a)
}

// StartSample starts the span of sampling a token.
func (t Tracer) StartSample(ctx context.Context) (context.Context, oteltrace.Span) {
	return t.start(ctx, SpanSample, attrs{})
}

// StartEmit starts the span of emitting token tokenID, number seq of its
// request.
func (t Tracer) StartEmit(ctx context.Context, seq, tokenID int) (context.Context, oteltrace.Span) {
	var a attrs
	a.add(AttrTokenSeq.Int(seq))
	a.add(AttrTokenID.Int(tokenID))
	return t.start(ctx, SpanEmit, a)
}

// SetToken records on span which token it produced, for a span started
// before the token was known (the prefill chunk that yields the first token,
// or a sample span).
func (t Tracer) SetToken(span oteltrace.Span, seq, tokenID int) {
	var a attrs
	a.add(AttrTokenSeq.Int(seq))
	a.add(AttrTokenID.Int(tokenID))
	t.set(span, a)
}
