package scheduler

import (
	"context"
	"time"

	ttrace "github.com/troupe/troupe/trace"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// The span names and attributes of a request's trace are the trace
// package's vocabulary; layer-shard actors add shard.forward spans under
// each decode.step.
const (
	SpanRequest = ttrace.SpanRequest
	SpanQueue   = ttrace.SpanQueue
	SpanPrefill = ttrace.SpanPrefill
	SpanStep    = ttrace.SpanDecodeStep
	SpanShard   = ttrace.SpanShardForward
	SpanSample  = ttrace.SpanSample
	SpanEmit    = ttrace.SpanEmit

	AttrRequestID = ttrace.AttrRequestID
	AttrBatchSize = ttrace.AttrBatchSize
	AttrPosition  = ttrace.AttrPosition
	AttrKVBlocks  = ttrace.AttrKVBlocks
	AttrTokenSeq  = ttrace.AttrTokenSeq
	AttrTokenID   = ttrace.AttrTokenID
	AttrTokens    = attribute.Key("batch.tokens")
	AttrReason    = attribute.Key("finish.reason")
)

// stepTracer makes the scheduler's spans. Without a tracer provider (nil
// or noop) it is off: requests still carry their submitter's trace context
// to the layer-shards and their trace id to the frames, but the per-step
// spans, which would record nothing, are not made.
type stepTracer struct {
	t    trace.Tracer
	off  bool
	none trace.Span // a span that records nothing, for the off tracer
}

func newStepTracer(tp trace.TracerProvider) stepTracer {
	_, isNoop := tp.(noop.TracerProvider)
	off := tp == nil || isNoop
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return stepTracer{t: tp.Tracer("github.com/troupe/troupe/scheduler"), off: off, none: trace.SpanFromContext(context.Background())}
}

// requestSpan is the trace of one request.
type requestSpan struct {
	t       trace.Tracer
	ctx     context.Context
	req     trace.Span
	queue   trace.Span
	prefill trace.Span
	tid     string
}

func (st stepTracer) start(r *Request) requestSpan {
	parent := r.Trace
	if parent == nil {
		parent = context.Background()
	}
	ctx, req := st.t.Start(parent, SpanRequest, trace.WithAttributes(AttrRequestID.String(r.ID), attribute.Int("prompt.tokens", len(r.Prompt))))
	_, queue := st.t.Start(ctx, SpanQueue)
	rs := requestSpan{t: st.t, ctx: ctx, req: req, queue: queue}
	if sc := req.SpanContext(); sc.HasTraceID() {
		rs.tid = sc.TraceID().String()
	}
	return rs
}

func (r *requestSpan) admitted() {
	r.queue.End()
	_, r.prefill = r.t.Start(r.ctx, SpanPrefill)
}

func (r *requestSpan) preempted() { r.req.AddEvent("preempted") }

// firstToken ends the prefill span: the prompt is in the cache.
func (r *requestSpan) firstToken() {
	if r.prefill != nil {
		r.prefill.End()
		r.prefill = nil
	}
}

func (r *requestSpan) end(reason string) {
	r.queue.End()
	if r.prefill != nil {
		r.prefill.End()
	}
	if reason == "error" {
		r.req.SetStatus(codes.Error, reason)
	}
	r.req.SetAttributes(AttrReason.String(reason))
	r.req.End()
}

func (r *requestSpan) traceID() string { return r.tid }

// stepSpan covers one step: a decode.step span under every request in the
// batch; the forward pass runs under the first, the others link to it.
// spans and ctxs are beside the step's sequences (in), by index; the
// scheduler keeps one stepSpan and reuses its slices every step.
type stepSpan struct {
	st    stepTracer
	ctx   context.Context
	in    []*seq
	spans []trace.Span
	ctxs  []context.Context
	opts  []trace.SpanStartOption
}

// step starts the spans of a step into ss.
func (st stepTracer) step(ss *stepSpan, ctx context.Context, in []*seq, tokens int) {
	ss.st, ss.ctx, ss.in = st, ctx, in
	ss.spans, ss.ctxs = ss.spans[:0], ss.ctxs[:0]
	if st.off {
		// The forward pass still runs in the first request's trace.
		if len(in) > 0 {
			if sc := trace.SpanContextFromContext(in[0].span.ctx); sc.IsValid() {
				ss.ctx = trace.ContextWithSpanContext(ctx, sc)
			}
		}
		return
	}
	var lead trace.SpanContext
	for i, q := range in {
		ss.opts = append(ss.opts[:0], trace.WithAttributes(
			AttrBatchSize.Int(len(in)), AttrTokens.Int(tokens), AttrPosition.Int(q.done), AttrKVBlocks.Int(len(q.tokens)/16+1)))
		if i > 0 && lead.IsValid() {
			ss.opts = append(ss.opts, trace.WithLinks(trace.Link{SpanContext: lead}))
		}
		c, sp := st.t.Start(q.span.ctx, SpanStep, ss.opts...)
		if i == 0 {
			lead = sp.SpanContext()
			ss.ctx = trace.ContextWithSpan(ctx, sp)
		}
		ss.spans, ss.ctxs = append(ss.spans, sp), append(ss.ctxs, c)
	}
}

func (ss *stepSpan) forwardDone(err error) {
	if err == nil {
		return
	}
	for _, sp := range ss.spans {
		sp.SetStatus(codes.Error, err.Error())
	}
}

// sampled records the sampling of one token and starts its emission span.
func (ss *stepSpan) sampled(q *seq, f Frame, start, end time.Time) trace.Span {
	if ss.st.off {
		return ss.st.none
	}
	c := q.span.ctx
	var st trace.Span
	for i, x := range ss.in {
		if x == q {
			c, st = ss.ctxs[i], ss.spans[i]
			break
		}
	}
	if st != nil {
		st.SetAttributes(AttrTokenSeq.Int(f.Seq), AttrTokenID.Int(int(f.ID)))
	}
	_, sp := ss.st.t.Start(c, SpanSample, trace.WithTimestamp(start), trace.WithAttributes(AttrTokenID.Int(int(f.ID))))
	sp.End(trace.WithTimestamp(end))
	_, em := ss.st.t.Start(c, SpanEmit, trace.WithAttributes(AttrTokenSeq.Int(f.Seq)))
	return em
}

// end ends the step's spans and lets go of what they referenced.
func (ss *stepSpan) end() {
	for _, sp := range ss.spans {
		sp.End()
	}
	clear(ss.spans)
	clear(ss.ctxs)
	ss.ctx, ss.in = nil, nil
}
