package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/troupe/troupe/bus"
	"github.com/troupe/troupe/models/generate"
	"github.com/troupe/troupe/models/grammar"
	"github.com/troupe/troupe/models/sample"
)

// Service puts a Scheduler on the bus: it answers submits for one model,
// publishes each request's frames on its tokens subject and takes cancels.
type Service struct {
	nc   *nats.Conn
	subj bus.Subjects
	s    *Scheduler
	subs []*bus.Subscription // the submit subscription first
	svc  micro.Service
	id   string // svc's instance id
	text Text

	vocabOnce sync.Once
	vocab     *grammar.Vocab // the vocabulary for constrained decoding, made at its first request
	vocabErr  error
	schemaMu  sync.Mutex
	schemas   map[schemaKey]*grammar.Grammar // the last schemas' grammars; guarded by schemaMu

	// closingMu is held for reading by each submit handler and for
	// writing by Drain when it stops taking requests, and by Close, which
	// takes subs and svc: Drain and Close may run at once.
	closingMu sync.RWMutex
	closing   bool
	active    atomic.Int64 // requests taken and not yet ended with a final frame
}

// Text is how a service turns a model's tokens into text.
type Text struct {
	// Detok makes a detokenizer for each request.
	Detok func() generate.Detokenizer
	// Bytes gives the bytes each token id decodes to (nil for special
	// tokens), for JSON mode; without it, JSON mode is refused.
	Bytes func() [][]byte
}

// Serve subscribes the scheduler s to model's subjects.
// version is the service's, in semver (the build's).
func Serve(ctx context.Context, nc *nats.Conn, subj bus.Subjects, model string, s *Scheduler, text Text, version string) (*Service, error) {
	sv := &Service{nc: nc, subj: subj, s: s, text: text}
	// The scheduler is a micro service like every actor kind: PING, INFO
	// and STATS (with the scheduler's counters) come with it. It starts
	// first: each submit's reply names it.
	stats := func() StatsMsg {
		st := s.Stats()
		return StatsMsg{Waiting: st.Waiting, Running: st.Running, Steps: st.Steps, Tokens: st.Tokens, Preemptions: st.Preemptions, KV: st.KV}
	}
	var err error
	sv.svc, err = micro.AddService(nc, micro.Config{
		Name:         "scheduler",
		Version:      version,
		Description:  "continuous batching for " + model,
		Metadata:     map[string]string{"model": model},
		StatsHandler: func(*micro.Endpoint) any { return stats() },
	})
	if err != nil {
		return nil, fmt.Errorf("scheduler: micro service: %w", err)
	}
	sv.id = sv.svc.Info().ID
	sub, err := bus.Serve(ctx, nc, subj.Submit(model), "sched", sv.submit)
	if err != nil {
		sv.Close()
		return nil, err
	}
	sv.subs = append(sv.subs, sub)
	sub, err = bus.Subscribe(ctx, nc, subj.CancelAll(), func(_ context.Context, m CancelMsg) { s.Cancel(m.ID) })
	if err != nil {
		sv.Close()
		return nil, err
	}
	sv.subs = append(sv.subs, sub)
	err = sv.svc.AddEndpoint("stats", micro.HandlerFunc(func(r micro.Request) {
		data, err := bus.Encode(stats())
		if err != nil {
			_ = r.Error(string(bus.CodeInternal), err.Error(), nil)
			return
		}
		_ = r.Respond(data)
	}), micro.WithEndpointSubject(subj.ActorEndpoint("scheduler", model, "stats")))
	if err != nil {
		sv.Close()
		return nil, fmt.Errorf("scheduler: stats endpoint: %w", err)
	}
	// Serve returns once the server has the subscriptions: from then on the
	// service answers, on every connection.
	if err := bus.Flush(ctx, nc); err != nil {
		sv.Close()
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	return sv, nil
}

// Drain hands the service's place over to the model's other schedulers
// without losing a request: it handles the submits already delivered to
// it, refuses later ones with CodeUnavailable (Client.Generate submits
// those again, to another scheduler), and waits until every request it
// took has ended with its final frame. Then it closes the service. When
// ctx ends first, Drain closes the service and returns ctx's error; the
// requests still running are the caller's to end (by stopping the
// scheduler's Run).
func (sv *Service) Drain(ctx context.Context) error {
	var err error
	sv.closingMu.RLock()
	var sub *bus.Subscription
	if len(sv.subs) > 0 {
		sub = sv.subs[0]
	}
	sv.closingMu.RUnlock()
	if sub != nil {
		err = sub.Drain()
		for err == nil && sub.Valid() {
			err = pause(ctx)
		}
	}
	sv.closingMu.Lock()
	sv.closing = true
	sv.closingMu.Unlock()
	for err == nil && sv.active.Load() > 0 {
		err = pause(ctx)
	}
	sv.Close()
	if err != nil {
		return fmt.Errorf("scheduler: drain: %w", err)
	}
	return nil
}

// Active is the number of requests the service took that have not ended.
func (sv *Service) Active() int { return int(sv.active.Load()) }

func pause(ctx context.Context) error {
	t := time.NewTimer(5 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Close unsubscribes and stops the micro service; later submits from
// this process (Client.Local) are refused with CodeUnavailable.
func (sv *Service) Close() {
	sv.closingMu.Lock()
	sv.closing = true
	subs, svc := sv.subs, sv.svc
	sv.subs, sv.svc = nil, nil
	sv.closingMu.Unlock()
	for _, s := range subs {
		s.Unsubscribe()
	}
	if svc != nil {
		svc.Stop()
	}
}

func (sv *Service) submit(ctx context.Context, m SubmitMsg) (SubmitReply, error) {
	subject := sv.subj.Tokens(m.ID)
	// The request's spans continue the submitter's trace, not this handler's deadline.
	trace := context.WithoutCancel(ctx)
	return sv.take(trace, m, func(f FrameMsg) {
		// Publishing only buffers; a lost connection ends the client's wait.
		_ = bus.Publish(trace, sv.nc, subject, f)
	})
}

// take hands m to the scheduler, whose frames go to sink on the
// scheduler's goroutine; trace is the context the request's spans descend
// from. It is the one place where both the bus and the same-process paths
// accept a request: the errors are those the bus client gets.
// maxSchemas is how many schemas' grammars (and their masks, up to 4 MiB
// each) a service keeps for the requests that name them again.
const maxSchemas = 16

// schemaKey names a schema's grammar: its document, and whether compact.
type schemaKey struct {
	schema  string
	compact bool
}

// grammar returns the grammar of JSON mode over the model's vocabulary,
// or of schema where it is not empty (compact: Schema.Compact).
func (sv *Service) grammar(schema string, compact bool) (*grammar.Grammar, error) {
	sv.vocabOnce.Do(func() {
		if sv.text.Bytes == nil {
			sv.vocabErr = errors.New("the model's vocabulary is not known here")
			return
		}
		// The model's rows past the tokenizer's ids (padding) are tokens
		// no grammar allows.
		toks := sv.text.Bytes()
		if w := sv.s.cfg.Vocab; w > len(toks) {
			toks = append(toks[:len(toks):len(toks)], make([][]byte, w-len(toks))...)
		}
		sv.vocab, sv.vocabErr = grammar.NewVocab(toks)
	})
	if sv.vocabErr != nil {
		return nil, sv.vocabErr
	}
	if schema == "" {
		return sv.vocab.JSON(), nil
	}
	key := schemaKey{schema, compact}
	sv.schemaMu.Lock()
	g, ok := sv.schemas[key]
	sv.schemaMu.Unlock()
	if ok {
		return g, nil
	}
	s, err := grammar.CompileSchema([]byte(schema))
	if err != nil {
		return nil, err
	}
	if compact {
		s = s.Compact()
	}
	g = sv.vocab.Schema(s)
	sv.schemaMu.Lock()
	defer sv.schemaMu.Unlock()
	if sv.schemas == nil || len(sv.schemas) >= maxSchemas {
		sv.schemas = map[schemaKey]*grammar.Grammar{}
	}
	sv.schemas[key] = g
	return g, nil
}

func (sv *Service) take(trace context.Context, m SubmitMsg, sink func(FrameMsg)) (SubmitReply, error) {
	p := generate.Params{
		Params: sample.Params{Temperature: m.Temperature, TopP: m.TopP, TopK: m.TopK, MinP: m.MinP, RepetitionPenalty: m.RepetitionPenalty,
			PresencePenalty: m.PresencePenalty, FrequencyPenalty: m.FrequencyPenalty, LogitBias: m.LogitBias},
		MaxTokens: m.MaxTokens, Stop: m.Stop, IgnoreEOS: m.IgnoreEOS, Logprobs: m.Logprobs, TopLogprobs: m.TopLogprobs,
		PromptLogprobs: m.PromptLogprobs,
	}
	if m.HasSeed {
		seed := m.Seed
		p.Seed = &seed
	}
	if m.ID == "" {
		return SubmitReply{}, bus.Errorf(bus.CodeBadRequest, "empty request id")
	}
	if m.JSON || m.JSONSchema != "" {
		g, err := sv.grammar(m.JSONSchema, m.JSONCompact)
		if err != nil {
			return SubmitReply{}, bus.Errorf(bus.CodeBadRequest, "response_format: %v", err)
		}
		p.Grammar = g
	}
	r := &Request{ID: m.ID, Tenant: m.Tenant, Prompt: m.Prompt, Params: p, Detok: sv.text.Detok(), Trace: trace}
	r.Sink = func(f Frame) {
		if f.Final {
			sv.active.Add(-1)
		}
		sink(frameMsg(f))
	}
	sv.closingMu.RLock()
	defer sv.closingMu.RUnlock()
	if sv.closing {
		return SubmitReply{}, bus.Errorf(bus.CodeUnavailable, "scheduler is draining")
	}
	sv.active.Add(1)
	if err := sv.s.Submit(r); err != nil {
		sv.active.Add(-1)
		if errors.Is(err, ErrOverloaded) {
			return SubmitReply{}, bus.Errorf(bus.CodeOverloaded, "%v", err)
		}
		return SubmitReply{}, bus.Errorf(bus.CodeBadRequest, "%v", err)
	}
	return SubmitReply{Queued: sv.s.Stats().Waiting, Service: sv.id}, nil
}

// frameMsg is the message form of f.
func frameMsg(f Frame) FrameMsg {
	m := FrameMsg{
		Seq: f.Seq, ID: f.ID, Text: f.Text, Logprob: f.Logprob, TopIDs: f.TopIDs, TopLPs: f.TopLPs,
		Final: f.Final, Reason: f.Reason, Err: f.Err, PromptTokens: f.PromptTokens, CompletionTokens: f.CompletionTokens, CachedTokens: f.CachedTokens,
		QueuedUS: f.Queued.Microseconds(), SinceStartUS: f.SinceStart.Microseconds(), SinceLastUS: f.SinceLast.Microseconds(), TraceID: f.TraceID,
	}
	for _, p := range f.Prompt {
		m.Prompt = append(m.Prompt, PromptLogprobMsg(p))
	}
	return m
}

// Client submits requests to a model's schedulers: over the bus, or
// directly to those of this process given to Local.
type Client struct {
	nc    *nats.Conn
	subj  bus.Subjects
	model string
	local atomic.Pointer[[]*Service] // nil or empty: the bus
	turn  atomic.Uint64              // where the next choice among equals starts
	probe time.Duration              // Probe, unless a test sets it
	// submitWait is SubmitWait, unless a test sets it.
	submitWait time.Duration
}

// NewClient returns a client for model.
func NewClient(nc *nats.Conn, subj bus.Subjects, model string) *Client {
	return &Client{nc: nc, subj: subj, model: model}
}

// Stats asks one of the model's schedulers for its state.
func (c *Client) Stats(ctx context.Context) (StatsMsg, error) {
	return bus.Request[StatsMsg, StatsMsg](ctx, c.nc, c.subj.ActorEndpoint("scheduler", c.model, "stats"), StatsMsg{})
}

// Generate submits m and calls emit for every token frame in order. It
// returns the final frame. When ctx ends or emit fails, the request is
// cancelled. A full queue gives a *bus.Error with CodeOverloaded, an
// unacceptable request one with CodeBadRequest. With schedulers of this
// process given to Local, the request goes to one of them without the bus
// (see Local); otherwise to the model's queue group on the bus.
func (c *Client) Generate(ctx context.Context, m SubmitMsg, emit func(FrameMsg) error) (FrameMsg, error) {
	if svcs := c.local.Load(); svcs != nil && len(*svcs) > 0 {
		return c.generateLocal(ctx, m, emit)
	}
	sub, err := c.nc.SubscribeSync(c.subj.Tokens(m.ID))
	if err != nil {
		return FrameMsg{}, fmt.Errorf("generate: %w", err)
	}
	defer sub.Unsubscribe()
	rep, err := c.submit(ctx, m)
	if err != nil {
		return FrameMsg{}, err
	}
	next := nextFrame(sub)
	if rep.Service != "" {
		next = c.watched(next, rep.Service)
	}
	cancel := func() { _ = bus.Publish(context.Background(), c.nc, c.subj.Cancel(m.ID), CancelMsg{ID: m.ID}) }
	return relay(ctx, next, cancel, emit)
}

// Probe is how long a request on the bus waits for its next frame before
// it asks whether its scheduler still lives; three such waits that the
// scheduler does not answer in, or one that nobody answers, end the
// request with CodeUnavailable. Its frames would never come: the node
// that ran it is gone.
const Probe = 2 * time.Second

// watched is next, with the scheduler of micro service id asked after
// every c.probe without a frame.
func (c *Client) watched(next func(context.Context) (FrameMsg, error), id string) func(context.Context) (FrameMsg, error) {
	every := c.probe
	if every <= 0 {
		every = Probe
	}
	ping := "$SRV.PING.scheduler." + id
	return func(ctx context.Context) (FrameMsg, error) {
		for silent := 0; ; {
			wctx, cancel := context.WithTimeout(ctx, every)
			f, err := next(wctx)
			cancel()
			if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
				return f, err
			}
			pctx, cancel := context.WithTimeout(ctx, every)
			_, err = c.nc.RequestWithContext(pctx, ping, nil)
			cancel()
			switch {
			case err == nil:
				silent = 0
			case errors.Is(err, nats.ErrNoResponders):
				return FrameMsg{}, bus.Errorf(bus.CodeUnavailable, "the scheduler running the request is gone")
			case ctx.Err() != nil:
				return FrameMsg{}, ctx.Err()
			default:
				if silent++; silent == 3 {
					return FrameMsg{}, bus.Errorf(bus.CodeUnavailable, "the scheduler running the request does not answer: %v", err)
				}
			}
		}
	}
}

// relay passes a request's frames from next to emit in order until the
// final one, which it returns; it cancels the request when ctx ends, next
// fails, a frame is out of order or emit fails. Both paths share it, so
// that they end a request the same way.
func relay(ctx context.Context, next func(context.Context) (FrameMsg, error), cancel func(), emit func(FrameMsg) error) (FrameMsg, error) {
	due := 1
	for {
		f, err := next(ctx)
		if err != nil {
			cancel()
			if ctx.Err() != nil {
				return FrameMsg{}, ctx.Err()
			}
			return FrameMsg{}, fmt.Errorf("generate: %w", err)
		}
		if f.Seq != due {
			cancel()
			return FrameMsg{}, fmt.Errorf("generate: frame %d arrived when %d was due", f.Seq, due)
		}
		due++
		if f.Final && f.Reason != "length" && f.Reason != "stop" {
			return f, nil
		}
		if err := emit(f); err != nil {
			cancel()
			return f, err
		}
		if f.Final {
			return f, nil
		}
	}
}

// submit hands m to one of the model's schedulers. A scheduler that is
// draining refuses it, and nobody answers while the last one is replaced
// or a standby takes a group over: then it submits again, for up to
// SubmitWait, before giving up.
func (c *Client) submit(ctx context.Context, m SubmitMsg) (SubmitReply, error) {
	var rep SubmitReply
	err := c.resubmit(ctx, func() error {
		var err error
		rep, err = bus.Request[SubmitMsg, SubmitReply](ctx, c.nc, c.subj.Submit(c.model), m)
		return err
	})
	return rep, err
}

// SubmitWait is how long a request waits for a scheduler of its model to
// take it: long enough to ride over a standby taking a group over (its
// leader's drain, up to 10 s, the registry's TTL, 5 s, and the standby's
// start: 21.5 s in all once on a loaded 2-core host; docs/deploy.md).
const SubmitWait = 30 * time.Second

// resubmit calls submit until it does not fail with CodeUnavailable, or
// for c's submit wait, waiting longer each time, up to half a second.
func (c *Client) resubmit(ctx context.Context, submit func() error) error {
	wait := c.submitWait
	if wait <= 0 {
		wait = SubmitWait
	}
	deadline := time.Now().Add(wait)
	for i := 1; ; i++ {
		err := submit()
		if err == nil || bus.CodeOf(err) != bus.CodeUnavailable || !time.Now().Before(deadline) {
			return err
		}
		t := time.NewTimer(min(time.Duration(i*i)*10*time.Millisecond, 500*time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// Timings converts a frame's microsecond fields.
func (f FrameMsg) Timings() (queued, sinceStart, sinceLast time.Duration) {
	return time.Duration(f.QueuedUS) * time.Microsecond, time.Duration(f.SinceStartUS) * time.Microsecond, time.Duration(f.SinceLastUS) * time.Microsecond
}

// nextFrame returns a function that waits for the next frame on sub.
func nextFrame(sub *nats.Subscription) func(context.Context) (FrameMsg, error) {
	return func(ctx context.Context) (FrameMsg, error) {
		var f FrameMsg
		msg, err := sub.NextMsgWithContext(ctx)
		if err == nil {
			err = bus.Decode(msg.Data, &f)
		}
		return f, err
	}
}
