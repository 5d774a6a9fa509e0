package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/generate"
	"go.opentelemetry.io/otel/trace"
)

// Engine runs forward steps over a batch of sequences.
type Engine interface {
	// Forward computes the logits of the rows b.Logits into logits.
	Forward(ctx context.Context, b *models.Batch, logits []float32) error
}

// ArgmaxEngine is an Engine that can also return the most likely token of
// each row of b.Logits (the lowest id among equals) instead of the logits.
// A step whose sampled sequences are all greedy uses it: on a GPU the
// logits then never leave the device.
type ArgmaxEngine interface {
	Engine
	ForwardArgmax(ctx context.Context, b *models.Batch, ids []int32) error
}

// SampleEngine is an Engine that can also draw each row's token itself, as
// rows says (one gpu.SampleRow a row of b.Logits), instead of returning the
// logits. A step whose sampled sequences all allow it
// (generate.State.Drawable) uses it: the logits then stay where they are
// computed, and on a device that draws tokens itself they never leave it.
type SampleEngine interface {
	Engine
	ForwardSample(ctx context.Context, b *models.Batch, rows []gpu.SampleRow, ids []int32) error
}

// ChooseEngine is an engine that chooses each row's token itself, greedy
// (rows nil) as an ArgmaxEngine or drawn as a SampleEngine, and returns
// besides the logits rows b.Read names ([len(b.Read), vocab] into logits).
// A step in which some sequences report log-probabilities uses it: their
// tokens are still chosen where the logits are, and a device may queue
// the step after it before these rows are read.
type ChooseEngine interface {
	Engine
	ForwardChoose(ctx context.Context, b *models.Batch, rows []gpu.SampleRow, ids []int32, logits []float32) error
}

// Blocks allocates the KV cache's blocks; *KV implements it.
type Blocks interface {
	Start(id, tenant string, prompt []int32) (int, error)
	Grow(id string, n int) error
	Commit(id string, tokens []int32)
	Free(id string)
	Table(id string) []int32
	Stats() KVStats
}

// ErrOverloaded means the queue is full; retry after RetryAfter.
var ErrOverloaded = errors.New("scheduler: queue full")

// RetryAfter is the wait suggested to overloaded clients.
const RetryAfter = time.Second

// Config sizes a scheduler.
type Config struct {
	// MaxQueue is the most requests waiting for admission.
	MaxQueue int
	// MaxBatchTokens is the most tokens in one step (the engine's limit).
	MaxBatchTokens int
	// MaxSeqs is the most sequences in one step.
	MaxSeqs int
	// Context is the model's context length.
	Context int
	// Vocab is the model's vocabulary size (the width of a logits row).
	Vocab int
	// EOS are the end-of-sequence token ids.
	EOS []int32
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.MaxQueue <= 0 || c.MaxBatchTokens <= 0 || c.MaxSeqs <= 0 || c.Context <= 0 || c.Vocab <= 0 {
		return fmt.Errorf("scheduler: config %+v: every limit must be positive", c)
	}
	return nil
}

// Request is one generation.
type Request struct {
	ID     string
	Tenant string
	Prompt []int32
	Params generate.Params
	// Detok turns the generated ids into text.
	Detok generate.Detokenizer
	// Sink receives the request's frames on the scheduler goroutine; it
	// must not block.
	Sink func(Frame)
	// Trace, when set, is the context the request's spans descend from.
	Trace context.Context
}

// Frame is one generated token, or the end of a request.
type Frame struct {
	Seq     int // 1-based position in the request's output
	ID      int32
	Text    string
	Logprob float32
	TopIDs  []int32
	TopLPs  []float32
	// Prompt, on a request's first frame where its Params ask
	// (PromptLogprobs), holds the log-probabilities of its prompt's
	// tokens after the first, in order.
	Prompt []TokenLogprob
	// Final frames end the request: Reason is "stop", "length",
	// "cancelled" or "error" (with Err).
	Final                          bool
	Reason, Err                    string
	PromptTokens, CompletionTokens int
	// CachedTokens, on final frames, counts the prompt tokens the prefix
	// cache held when the request was admitted: computed for an earlier
	// request of its tenant, not for it.
	CachedTokens                  int
	Queued, SinceStart, SinceLast time.Duration
	TraceID                       string
}

// TokenLogprob is a token's log-probability and the most likely tokens'
// where it stood.
type TokenLogprob struct {
	ID      int32
	Logprob float32
	TopIDs  []int32
	TopLPs  []float32
}

// Stats is a snapshot of the scheduler.
type Stats struct {
	Waiting, Running int
	Steps, Tokens    uint64
	Preemptions      uint64
	KV               KVStats
}

// Scheduler batches requests onto an engine.
type Scheduler struct {
	cfg    Config
	engine Engine
	kv     Blocks
	tracer stepTracer

	mu      sync.Mutex
	pending []op // submits and cancels not yet seen by Run
	queued  int  // submits pending or waiting
	stats   Stats
	wake    chan struct{}

	// Owned by Run.
	waiting    []*seq
	running    []*seq
	byID       map[string]*seq
	admitted   uint64
	batch      models.Batch
	logits     []float32
	ids        []int32         // the chosen tokens of a greedy or drawn step (ArgmaxEngine, SampleEngine)
	rows       []gpu.SampleRow // the draws of a step drawn on the engine (SampleEngine)
	read       []float32       // the logits rows of such a step's sequences that report log-probabilities (ChooseEngine)
	rowSteps   []generate.Step // and their steps, with the log-probabilities (generate.State.RowStep)
	next       []gpu.SampleRow // the draws of the step after it, when it Continues
	in         []*seq          // the step's sequences, in table order
	chunks     []int           // tokens of each
	sampled    []*seq          // the step's sequences that get a token
	promptRows []promptRow     // the prompt rows a step reads (Params.PromptLogprobs)
	span       stepSpan
}

type op struct {
	submit *Request
	cancel string
}

type seq struct {
	req      *Request
	tokens   []int32 // prompt, then generated tokens
	prompt   int
	cached   int // prompt tokens found in the prefix cache at admission
	done     int // tokens in the KV cache
	gen      *generate.State
	emitted  int
	admitted bool
	order    uint64 // admission order, for choosing whom to preempt
	arrived  time.Time
	started  time.Time
	last     time.Time
	span     requestSpan
	// prompt log-probabilities (Params.PromptLogprobs): those of prompt
	// tokens 1 .. len(plp), taken from the rows of positions 0 ..
	// len(plp)-1 as the prompt is computed.
	plp []TokenLogprob
}

// maxPromptRows bounds the prompt rows a step reads: a row is the
// vocabulary's logits, 400 KB at OLMo 2's.
const maxPromptRows = 256

// promptRow is a logits row a step reads for a prompt's log-probabilities:
// that of position pos of q, token at of the step.
type promptRow struct {
	q   *seq
	pos int
	at  int32
}

// New returns a scheduler; call Run to start it.
func New(cfg Config, engine Engine, kv Blocks, tp trace.TracerProvider) (*Scheduler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Scheduler{cfg: cfg, engine: engine, kv: kv, wake: make(chan struct{}, 1), byID: map[string]*seq{}}
	s.tracer = newStepTracer(tp)
	return s, nil
}

// Submit queues a request. It fails with ErrOverloaded when the queue is
// full and with a descriptive error when the request cannot fit.
func (s *Scheduler) Submit(r *Request) error {
	if len(r.Prompt) == 0 {
		return fmt.Errorf("empty prompt")
	}
	if err := r.Params.Validate(); err != nil {
		return err
	}
	if n := len(r.Prompt) + r.Params.MaxTokens; n > s.cfg.Context {
		return fmt.Errorf("prompt of %d tokens plus max_tokens %d is %d, over the context length of %d", len(r.Prompt), r.Params.MaxTokens, n, s.cfg.Context)
	}
	for _, id := range r.Prompt {
		if id < 0 || int(id) >= s.cfg.Vocab {
			return fmt.Errorf("token id %d outside the vocabulary of %d", id, s.cfg.Vocab)
		}
	}
	s.mu.Lock()
	if s.queued >= s.cfg.MaxQueue {
		s.mu.Unlock()
		return ErrOverloaded
	}
	s.queued++
	s.pending = append(s.pending, op{submit: r})
	s.mu.Unlock()
	s.poke()
	return nil
}

// Cancel ends a request; its Sink gets a final "cancelled" frame.
func (s *Scheduler) Cancel(id string) {
	s.mu.Lock()
	s.pending = append(s.pending, op{cancel: id})
	s.mu.Unlock()
	s.poke()
}

// Stats returns a snapshot.
// Waiting counts a request from the moment Submit accepts it, and Running
// counts it from its admission, so that a scheduler with work is never
// seen idle; the other figures are as of the latest step.
func (s *Scheduler) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Waiting = s.queued
	return st
}

func (s *Scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run schedules until ctx ends; then it ends every request with a final
// frame and returns.
func (s *Scheduler) Run(ctx context.Context) error {
	defer s.shutdown()
	for {
		s.intake()
		s.admit()
		s.publishStats()
		if len(s.running) == 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-s.wake:
				continue
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.step(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// A failed step fails the sequences in it, not the scheduler.
			for _, q := range append([]*seq(nil), s.running...) {
				s.finish(q, "error", err.Error())
			}
		}
	}
}

// intake moves pending operations into the scheduler's own state.
func (s *Scheduler) intake() {
	s.mu.Lock()
	ops := s.pending
	s.pending = nil
	s.mu.Unlock()
	for _, o := range ops {
		if r := o.submit; r != nil {
			if _, dup := s.byID[r.ID]; dup {
				s.release()
				r.Sink(Frame{Final: true, Reason: "error", Err: fmt.Sprintf("request id %q is already running", r.ID)})
				continue
			}
			now := time.Now()
			q := &seq{req: r, tokens: append([]int32(nil), r.Prompt...), prompt: len(r.Prompt), arrived: now, last: now}
			q.gen = generate.New(r.Params, r.Prompt, s.cfg.EOS, r.Detok)
			q.span = s.tracer.start(r)
			s.byID[r.ID] = q
			s.waiting = append(s.waiting, q)
			continue
		}
		if q := s.byID[o.cancel]; q != nil {
			s.finish(q, "cancelled", "")
		}
	}
}

// release frees a queue slot.
func (s *Scheduler) release() {
	s.mu.Lock()
	s.queued--
	s.mu.Unlock()
}

// admit starts waiting sequences while blocks and batch slots allow.
func (s *Scheduler) admit() {
	bs := s.kv.Stats().BlockSize
	for len(s.waiting) > 0 && len(s.running) < s.cfg.MaxSeqs {
		q := s.waiting[0]
		// Keep a block of headroom per running sequence, so that admitting
		// one does not force another out at its next block boundary.
		if len(s.running) > 0 {
			st := s.kv.Stats()
			if (len(q.tokens)+bs-1)/bs+len(s.running)+1 > st.Free+st.Cached {
				return
			}
		}
		tenant := q.req.Tenant
		if q.req.Params.PromptLogprobs {
			// The prompt's rows are computed, not taken from another's
			// cache: a tenant of its own shares no blocks.
			tenant += "\x00" + q.req.ID
		}
		cached, err := s.kv.Start(q.req.ID, tenant, q.tokens)
		if errors.Is(err, ErrNoBlocks) && len(s.running) > 0 {
			return // wait for running sequences to free blocks
		}
		s.waiting = s.waiting[1:]
		if err != nil {
			s.finishWaiting(q, err)
			continue
		}
		if !q.admitted {
			s.mu.Lock()
			s.queued--
			s.stats.Running++ // until publishStats counts it
			s.mu.Unlock()
			q.started = time.Now()
			q.span.admitted()
			q.cached = min(cached, q.prompt)
		}
		q.admitted = true
		q.done = cached
		s.admitted++
		q.order = s.admitted
		s.running = append(s.running, q)
	}
}

func (s *Scheduler) finishWaiting(q *seq, err error) {
	if !q.admitted {
		s.release()
	}
	delete(s.byID, q.req.ID)
	q.span.end("error")
	q.req.Sink(Frame{Final: true, Reason: "error", Err: err.Error(), PromptTokens: q.prompt, CompletionTokens: q.gen.Generated()})
}

// step runs one forward pass over the running sequences.
func (s *Scheduler) step(ctx context.Context) error {
	b := &s.batch
	in, chunks, sampled, prompt := s.in, s.chunks, s.sampled, s.promptRows
	// The slices grow in place; keep them for the next step.
	defer func() {
		clear(in)
		clear(sampled)
		clear(prompt)
		s.in, s.chunks, s.sampled, s.promptRows = in[:0], chunks[:0], sampled[:0], prompt[:0]
	}()
plan:
	for {
		b.Tokens, b.Pos, b.Seq, b.Tables, b.Logits = b.Tokens[:0], b.Pos[:0], b.Seq[:0], b.Tables[:0], b.Logits[:0]
		in, chunks, sampled, prompt = in[:0], chunks[:0], sampled[:0], prompt[:0]
		budget := s.cfg.MaxBatchTokens
		// Decoding sequences first (one token each), then prefill chunks.
		for _, decoding := range []bool{true, false} {
			for _, q := range s.running {
				pendingTok := len(q.tokens) - q.done
				if decoding != (pendingTok == 1) || budget == 0 {
					continue
				}
				n := min(pendingTok, budget)
				if q.req.Params.PromptLogprobs && q.done < q.prompt-1 {
					// Each position is a row back: a step reads at most
					// maxPromptRows of them.
					if n = min(n, maxPromptRows-len(prompt)); n <= 0 {
						continue
					}
				}
				if err := s.grow(q, q.done+n); errors.Is(err, errPreempted) {
					continue plan // the running set changed
				} else if err != nil {
					return err
				}
				if decoding && q.done+2 <= s.cfg.Context {
					// Room for the next position too, where a free block
					// allows: an engine may queue that step ahead (ahead.go).
					if err := s.kv.Grow(q.req.ID, q.done+2); err != nil && !errors.Is(err, ErrNoBlocks) {
						return err
					}
				}
				si := int32(len(b.Tables))
				b.Tables = append(b.Tables, s.kv.Table(q.req.ID))
				for j := 0; j < n; j++ {
					if p := q.done + j; q.req.Params.PromptLogprobs && p >= len(q.plp) && p < q.prompt-1 {
						prompt = append(prompt, promptRow{q, p, int32(len(b.Tokens))})
					}
					b.Tokens = append(b.Tokens, q.tokens[q.done+j])
					b.Pos = append(b.Pos, int32(q.done+j))
					b.Seq = append(b.Seq, si)
				}
				if q.done+n == len(q.tokens) {
					b.Logits = append(b.Logits, int32(len(b.Tokens)-1))
					sampled = append(sampled, q)
				}
				in, chunks = append(in, q), append(chunks, n)
				budget -= n
			}
		}
		break
	}
	if len(in) == 0 {
		return nil
	}
	// The prompts' rows follow the sampled sequences' (row i is sampled[i]'s).
	for _, pr := range prompt {
		b.Logits = append(b.Logits, pr.at)
	}
	// The engine chooses (greedy) or draws the tokens when every sampled
	// sequence allows it, returning the rows of those that report
	// log-probabilities. The same sequences decode next unless one
	// reaches its token limit or a waiting request may join them.
	ae, greedy := s.engine.(ArgmaxEngine)
	se, drawn := s.engine.(SampleEngine)
	ce, reads := s.engine.(ChooseEngine)
	b.Continues, b.NextDraws, b.Read = len(s.waiting) == 0, nil, b.Read[:0]
	b.Summaries, b.Top = true, 0
	for i, q := range sampled {
		greedy = greedy && q.gen.Greedy()
		drawn = drawn && q.gen.Drawable()
		if q.gen.Logprobs() {
			b.Read = append(b.Read, int32(i))
			// The rows come back summarized where no sequence reading them
			// changes them first.
			b.Summaries = b.Summaries && q.gen.Summarizable()
			b.Top = max(b.Top, q.req.Params.TopLogprobs)
		}
		if q.gen.Generated()+1 >= q.req.Params.MaxTokens || len(q.tokens)+1 >= s.cfg.Context || q.gen.Constrained() {
			b.Continues = false
		}
	}
	// A step that reads prompts' rows takes every row back, the sampled
	// sequences drawing from theirs on the host.
	greedy = greedy && len(sampled) > 0 && (reads || len(b.Read) == 0) && len(prompt) == 0
	drawn = drawn && !greedy && len(sampled) > 0 && (reads || len(b.Read) == 0) && len(prompt) == 0
	b.Continues = b.Continues && len(prompt) == 0
	if !greedy && !drawn {
		b.Read = b.Read[:0]
	}
	b.Summaries = b.Summaries && len(b.Read) > 0
	if !b.Summaries {
		b.Top = 0
	}
	V, W := s.cfg.Vocab, b.ReadWidth(s.cfg.Vocab)
	s.read = slices.Grow(s.read[:0], len(b.Read)*W)[:len(b.Read)*W]
	span := &s.span
	s.tracer.step(span, ctx, in, len(b.Tokens))
	var err error
	s.ids = slices.Grow(s.ids[:0], len(b.Logits))[:len(b.Logits)]
	switch {
	case greedy && len(b.Read) > 0:
		err = ce.ForwardChoose(span.ctx, b, nil, s.ids, s.read)
	case greedy:
		err = ae.ForwardArgmax(span.ctx, b, s.ids)
	case drawn:
		s.rows, s.next = s.rows[:0], s.next[:0]
		for _, q := range sampled {
			s.rows = append(s.rows, q.gen.Row())
		}
		if b.Continues {
			// The next step's draws, taken now so that an engine may queue it.
			for _, q := range sampled {
				s.next = append(s.next, q.gen.NextRow())
			}
			b.NextDraws = s.next
		}
		if len(b.Read) > 0 {
			err = ce.ForwardChoose(span.ctx, b, s.rows, s.ids, s.read)
		} else {
			err = se.ForwardSample(span.ctx, b, s.rows, s.ids)
		}
	default:
		if need := len(b.Logits) * s.cfg.Vocab; cap(s.logits) < need {
			s.logits = make([]float32, need)
		}
		err = s.engine.Forward(span.ctx, b, s.logits[:len(b.Logits)*s.cfg.Vocab])
	}
	span.forwardDone(err)
	if err != nil {
		span.end()
		return err
	}
	s.mu.Lock()
	s.stats.Steps++
	s.stats.Tokens += uint64(len(sampled))
	s.mu.Unlock()
	for k, pr := range prompt {
		q := pr.q
		row := s.logits[(len(sampled)+k)*V : (len(sampled)+k+1)*V]
		lp, ids, lps := gpu.LogProbs(row, int(q.tokens[pr.pos+1]), q.req.Params.TopLogprobs)
		q.plp = append(q.plp, TokenLogprob{ID: q.tokens[pr.pos+1], Logprob: lp, TopIDs: ids, TopLPs: lps})
	}
	// Every sequence in the step advanced by its chunk.
	for i, q := range in {
		q.done += chunks[i]
		s.kv.Commit(q.req.ID, q.tokens[:q.done])
	}
	// The log-probabilities of the rows read, a pass over each, at once:
	// their sequences' sample spans start before it.
	rowsStart := time.Now()
	s.rowSteps = slices.Grow(s.rowSteps[:0], len(b.Read))[:len(b.Read)]
	if b.Summaries {
		for j, i := range b.Read {
			if s.rowSteps[j], err = sampled[i].gen.SummaryStep(s.ids[i], s.read[j*W:(j+1)*W]); err != nil {
				span.end()
				return fmt.Errorf("step: %w", err)
			}
		}
	} else {
		gpu.InParallel(len(b.Read), func(j int) {
			i := b.Read[j]
			s.rowSteps[j] = sampled[i].gen.RowStep(s.ids[i], s.read[j*V:(j+1)*V])
		})
	}
	read := b.Read
	for i, q := range sampled {
		t0 := time.Now()
		var st generate.Step
		switch {
		case len(read) > 0 && int(read[0]) == i:
			t0 = rowsStart
			st = q.gen.AcceptStep(s.rowSteps[len(b.Read)-len(read)])
			read = read[1:]
		case greedy || drawn:
			st = q.gen.Accept(s.ids[i])
		default:
			st = q.gen.Next(s.logits[i*V : (i+1)*V])
		}
		q.tokens = append(q.tokens, st.ID)
		s.emit(q, st, span, t0)
	}
	span.end()
	return nil
}

var errPreempted = errors.New("preempted")

// grow reserves blocks for q to hold n tokens, preempting the most recently
// admitted other sequence when the cache is full.
func (s *Scheduler) grow(q *seq, n int) error {
	for {
		err := s.kv.Grow(q.req.ID, n)
		if !errors.Is(err, ErrNoBlocks) {
			return err
		}
		victim := q
		for _, r := range s.running {
			if r.order > victim.order {
				victim = r
			}
		}
		if len(s.running) == 1 {
			return fmt.Errorf("request %s needs more KV cache than the pool holds", q.req.ID)
		}
		s.preempt(victim)
		return errPreempted
	}
}

// preempt returns a running sequence to the front of the queue; it will be
// recomputed from its prompt and the tokens already sent.
func (s *Scheduler) preempt(q *seq) {
	s.kv.Free(q.req.ID)
	s.running = remove(s.running, q)
	q.done = 0
	s.waiting = append([]*seq{q}, s.waiting...)
	s.mu.Lock()
	s.stats.Preemptions++
	s.mu.Unlock()
	q.span.preempted()
}

func (s *Scheduler) emit(q *seq, st generate.Step, span *stepSpan, sampleStart time.Time) {
	now := time.Now()
	q.emitted++
	if q.emitted == 1 {
		q.span.firstToken()
	}
	f := Frame{
		Seq: q.emitted, ID: st.ID, Text: st.Text, Logprob: st.Logprob, TopIDs: st.TopIDs, TopLPs: st.TopLPs,
		Queued: q.started.Sub(q.arrived), SinceStart: now.Sub(q.started), SinceLast: now.Sub(q.last),
		TraceID: q.span.traceID(),
	}
	if q.emitted == 1 && q.req.Params.PromptLogprobs {
		f.Prompt = q.plp
	}
	q.last = now
	if st.Reason != "" {
		f.Final, f.Reason = true, st.Reason
		f.PromptTokens, f.CompletionTokens, f.CachedTokens = q.prompt, q.gen.Generated(), q.cached
		s.remove(q)
		q.span.end(st.Reason)
	}
	emit := span.sampled(q, f, sampleStart, now)
	q.req.Sink(f)
	emit.End()
}

// finish ends a sequence early with a final frame.
func (s *Scheduler) finish(q *seq, reason, msg string) {
	if !q.admitted {
		s.release()
	}
	s.remove(q)
	q.span.end(reason)
	q.req.Sink(Frame{Seq: q.emitted + 1, Final: true, Reason: reason, Err: msg, PromptTokens: q.prompt, CompletionTokens: q.gen.Generated(), CachedTokens: q.cached, TraceID: q.span.traceID()})
}

// remove forgets q and publishes the stats before q's final frame goes
// out, so a client that submits on that frame sees the load without it.
func (s *Scheduler) remove(q *seq) {
	s.kv.Free(q.req.ID)
	s.running = remove(s.running, q)
	s.waiting = remove(s.waiting, q)
	delete(s.byID, q.req.ID)
	s.publishStats()
}

func remove(list []*seq, q *seq) []*seq {
	for i, x := range list {
		if x == q {
			return append(list[:i], list[i+1:]...)
		}
	}
	return list
}

func (s *Scheduler) publishStats() {
	kv := s.kv.Stats()
	s.mu.Lock()
	s.stats.Waiting, s.stats.Running, s.stats.KV = s.queued, len(s.running), kv
	s.mu.Unlock()
}

// shutdown ends every request.
func (s *Scheduler) shutdown() {
	s.intake()
	for _, q := range append(append([]*seq(nil), s.running...), s.waiting...) {
		s.finish(q, "cancelled", "server shutting down")
	}
	s.publishStats()
}
