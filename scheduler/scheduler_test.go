package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/cpu"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/demo"
	"github.com/troupe/troupe/models/generate"
	"github.com/troupe/troupe/models/sample"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type refSample struct {
	PromptIDs []int32 `json:"prompt_ids"`
	GreedyIDs []int32 `json:"greedy_ids"`
}

func demoSamples(t testing.TB) []refSample {
	raw, err := os.ReadFile(filepath.Join("..", "models", "demo", demo.Name, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref struct{ Samples []refSample }
	if err := json.Unmarshal(raw, &ref); err != nil {
		t.Fatal(err)
	}
	return ref.Samples
}

// harness runs a scheduler over the demo model on the CPU lane.
type harness struct {
	s      *Scheduler
	kv     *KV
	cancel context.CancelFunc
	done   chan error
}

// demoOnCPU opens the demo checkpoint and a CPU device, both closed when
// the test ends.
func demoOnCPU(t testing.TB) (*models.Bundle, *cpu.Device) {
	t.Helper()
	b, err := models.OpenFS(demo.Name, demo.FS(), demo.Weights())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	dev, err := cpu.New(cpu.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return b, dev
}

func start(t testing.TB, blocks int, cfg Config) *harness {
	t.Helper()
	return startWith(t, blocks, cfg, nil)
}

// startWith is start with the model's engine passed through wrap (when
// set) before the scheduler gets it.
func startWith(t testing.TB, blocks int, cfg Config, wrap func(*ModelEngine) Engine) *harness {
	t.Helper()
	b, dev := demoOnCPU(t)
	m, err := models.Load(b.Config, b.Checkpoint, dev, models.Options{MaxTokens: cfg.MaxBatchTokens, MaxSeqs: cfg.MaxSeqs})
	if err != nil {
		t.Fatal(err)
	}
	kv, _ := NewKV(blocks, 16)
	cache, err := m.NewCache(blocks, 16)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Vocab, cfg.Context, cfg.EOS = b.Config.Vocab, b.Config.MaxPositions, b.Config.EOS
	var e Engine = &ModelEngine{Model: m, Cache: cache}
	if wrap != nil {
		e = wrap(e.(*ModelEngine))
	}
	s, err := New(cfg, e, kv, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{s: s, kv: kv, cancel: cancel, done: make(chan error, 1)}
	go func() { h.done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-h.done
		cache.Close()
		m.Close()
	})
	return h
}

// collect gathers a request's frames.
type collect struct {
	mu     sync.Mutex
	frames []Frame
	done   chan struct{}
}

func newCollect() *collect { return &collect{done: make(chan struct{})} }

func (c *collect) sink(f Frame) {
	c.mu.Lock()
	c.frames = append(c.frames, f)
	c.mu.Unlock()
	if f.Final {
		close(c.done)
	}
}

func (c *collect) wait(t testing.TB) []Frame {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(60 * time.Second):
		t.Fatal("request did not finish")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frames
}

func ids(t testing.TB, frames []Frame) []int32 {
	t.Helper()
	var out []int32
	for i, f := range frames {
		if f.Seq != i+1 {
			t.Fatalf("frame %d has seq %d", i, f.Seq)
		}
		if f.Final && f.Reason != "length" && f.Reason != "stop" {
			t.Fatalf("final frame %+v", f)
		}
		out = append(out, f.ID)
	}
	return out
}

func greedy(n int) generate.Params { return generate.Params{MaxTokens: n, IgnoreEOS: true} }

// submitGreedy submits each sample's prompt for its reference's length of
// greedy tokens, as requests "0", "1", ...
func submitGreedy(t testing.TB, h *harness, samples []refSample) []*collect {
	t.Helper()
	var cs []*collect
	for i, s := range samples {
		col := newCollect()
		cs = append(cs, col)
		if err := h.s.Submit(&Request{ID: fmt.Sprint(i), Prompt: s.PromptIDs, Params: greedy(len(s.GreedyIDs)), Detok: nop{}, Sink: col.sink}); err != nil {
			t.Fatal(err)
		}
	}
	return cs
}

// TestBatchedMatchesReference runs every demo prompt several times at once
// and expects each to produce the reference's greedy tokens.
func TestBatchedMatchesReference(t *testing.T) {
	samples := demoSamples(t)
	h := start(t, 256, Config{MaxQueue: 64, MaxBatchTokens: 64, MaxSeqs: 16})
	const copies = 3
	var cs []*collect
	for c := 0; c < copies; c++ {
		for i, s := range samples {
			col := newCollect()
			cs = append(cs, col)
			err := h.s.Submit(&Request{ID: fmt.Sprintf("r%d-%d", c, i), Prompt: s.PromptIDs, Params: greedy(len(s.GreedyIDs)), Detok: nop{}, Sink: col.sink})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	for k, col := range cs {
		got := ids(t, col.wait(t))
		want := samples[k%len(samples)].GreedyIDs
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("request %d: got %v, want %v", k, got, want)
		}
	}
	waitFor(t, func() bool { return h.s.Stats().KV.Used == 0 })
}

// logitsOnly hides an engine's ArgmaxEngine side: the scheduler then
// samples every step from the logits.
type logitsOnly struct{ Engine }

// argmaxCounter counts the steps in which an engine chose the tokens, and
// those of them that returned logits rows too.
type argmaxCounter struct {
	*ModelEngine
	steps, reads, summaries atomic.Int64
}

func (a *argmaxCounter) ForwardArgmax(ctx context.Context, b *models.Batch, ids []int32) error {
	a.steps.Add(1)
	return a.ModelEngine.ForwardArgmax(ctx, b, ids)
}

func (a *argmaxCounter) ForwardChoose(ctx context.Context, b *models.Batch, rows []gpu.SampleRow, ids []int32, logits []float32) error {
	a.steps.Add(1)
	a.reads.Add(1)
	if b.Summaries {
		a.summaries.Add(1)
	}
	return a.ModelEngine.ForwardChoose(ctx, b, rows, ids, logits)
}

// TestGreedyStepsChooseOnTheEngine runs the same batched requests with the
// engine choosing greedy tokens (ArgmaxEngine) and with the scheduler
// sampling from logits: the same tokens, the reference's. A request asking
// for log-probabilities has its tokens chosen on the engine too, which
// returns its logits rows summarized (ChooseEngine), and gets the
// log-probabilities the scheduler takes from the logits.
func TestGreedyStepsChooseOnTheEngine(t *testing.T) {
	samples := demoSamples(t)
	cfg := Config{MaxQueue: 64, MaxBatchTokens: 64, MaxSeqs: 16}
	run := func(wrap func(*ModelEngine) Engine) ([][]int32, []Frame) {
		h := startWith(t, 256, cfg, wrap)
		cs := submitGreedy(t, h, samples)
		lp := newCollect()
		p := greedy(8)
		p.Logprobs, p.TopLogprobs = true, 3
		if err := h.s.Submit(&Request{ID: "logprobs", Prompt: samples[0].PromptIDs, Params: p, Detok: nop{}, Sink: lp.sink}); err != nil {
			t.Fatal(err)
		}
		var out [][]int32
		for _, col := range cs {
			out = append(out, ids(t, col.wait(t)))
		}
		return out, lp.wait(t)
	}
	counter := &argmaxCounter{}
	onEngine, lpFrames := run(func(e *ModelEngine) Engine { counter.ModelEngine = e; return counter })
	onHost, hostFrames := run(func(e *ModelEngine) Engine { return logitsOnly{e} })
	sameFrames(t, "logprobs request", lpFrames, hostFrames)
	if counter.reads.Load() == 0 || counter.summaries.Load() != counter.reads.Load() {
		t.Errorf("%d steps returned the logprobs request's logits rows with the tokens, %d summarized: want all", counter.reads.Load(), counter.summaries.Load())
	}
	for i := range samples {
		if fmt.Sprint(onEngine[i]) != fmt.Sprint(samples[i].GreedyIDs) || fmt.Sprint(onHost[i]) != fmt.Sprint(onEngine[i]) {
			t.Errorf("request %d: engine's choice %v, host's %v, reference %v", i, onEngine[i], onHost[i], samples[i].GreedyIDs)
		}
	}
	if counter.steps.Load() == 0 {
		t.Error("no step chose its tokens on the engine")
	}
	if got, want := ids(t, lpFrames), samples[0].GreedyIDs[:8]; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("logprobs request: %v, want %v", got, want)
	}
	negative := 0
	for _, f := range lpFrames {
		if !(f.Logprob <= 0) {
			t.Fatalf("logprobs request: token %d has log-probability %v", f.ID, f.Logprob)
		}
		if f.Logprob < 0 {
			negative++
		}
	}
	if negative == 0 {
		t.Error("logprobs request: every log-probability is 0: not computed from the logits")
	}
}

// sameFrames checks that two runs of a request sent the same tokens with
// the same log-probabilities.
func sameFrames(t *testing.T, name string, got, want []Frame) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d frames, want %d", name, len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if !sameToken(g.ID, g.Logprob, g.TopIDs, g.TopLPs, w.ID, w.Logprob, w.TopIDs, w.TopLPs) {
			t.Fatalf("%s: frame %d: %d (%v, top %v %v), want %d (%v, top %v %v)", name, i, g.ID, g.Logprob, g.TopIDs, g.TopLPs, w.ID, w.Logprob, w.TopIDs, w.TopLPs)
		}
	}
}

// sameToken reports whether two tokens with their log-probabilities are
// the same, the log-probabilities within 1e-5: a batch's logits depend in
// their last bits on the batch's shape, which depends on when its
// requests came.
func sameToken(id int32, lp float32, ids []int32, lps []float32, wid int32, wlp float32, wids []int32, wlps []float32) bool {
	near := func(a, b float32) bool { return math.Abs(float64(a-b)) <= 1e-5 }
	same := id == wid && near(lp, wlp) && slices.Equal(ids, wids) && len(lps) == len(wlps)
	for j := range lps {
		same = same && near(lps[j], wlps[j])
	}
	return same
}

// sampleCounter counts the steps in which an engine drew the tokens, and
// those of them that returned logits rows too.
type sampleCounter struct {
	*ModelEngine
	steps, reads, summaries atomic.Int64
}

func (c *sampleCounter) ForwardSample(ctx context.Context, b *models.Batch, rows []gpu.SampleRow, ids []int32) error {
	c.steps.Add(1)
	return c.ModelEngine.ForwardSample(ctx, b, rows, ids)
}

func (c *sampleCounter) ForwardChoose(ctx context.Context, b *models.Batch, rows []gpu.SampleRow, ids []int32, logits []float32) error {
	if rows != nil {
		c.steps.Add(1)
	}
	c.reads.Add(1)
	if b.Summaries {
		c.summaries.Add(1)
	}
	return c.ModelEngine.ForwardChoose(ctx, b, rows, ids, logits)
}

// TestSampledStepsDrawOnTheEngine runs the same seeded, sampled requests
// (temperature alone; top-k with top-p and min-p; mixed in one batch with
// a greedy one; penalties; log-probabilities, with penalties and bias, and
// without, whose rows the engine summarizes)
// with the engine drawing the tokens (SampleEngine, ChooseEngine) and with
// the scheduler drawing from the logits: the same tokens and
// log-probabilities, since both take the same numbers from each request's
// generator.
func TestSampledStepsDrawOnTheEngine(t *testing.T) {
	samples := demoSamples(t)
	cfg := Config{MaxQueue: 64, MaxBatchTokens: 64, MaxSeqs: 16}
	seed := func(v int64) *int64 { return &v }
	params := []generate.Params{
		{MaxTokens: 12, IgnoreEOS: true, Params: sample.Params{Temperature: 0.9, Seed: seed(1)}},
		{MaxTokens: 12, IgnoreEOS: true, Params: sample.Params{Temperature: 1.2, TopK: 40, TopP: 0.9, MinP: 0.02, Seed: seed(2)}},
		{MaxTokens: 12, IgnoreEOS: true, Params: sample.Params{Temperature: 0.7, TopK: 5, Seed: seed(3)}},
		greedy(12),
		{MaxTokens: 3, IgnoreEOS: true, Params: sample.Params{Temperature: 0.8, RepetitionPenalty: 1.3, Seed: seed(4)}},
		{MaxTokens: 12, IgnoreEOS: true, Logprobs: true, TopLogprobs: 4, Params: sample.Params{Temperature: 0.8, TopK: 50,
			PresencePenalty: 0.7, FrequencyPenalty: 0.3, LogitBias: map[int32]float32{11: 3}, Seed: seed(5)}},
		{MaxTokens: 24, IgnoreEOS: true, Logprobs: true, TopLogprobs: 20, Params: sample.Params{Temperature: 0.8, TopP: 0.95, Seed: seed(6)}},
	}
	run := func(wrap func(*ModelEngine) Engine) [][]Frame {
		h := startWith(t, 256, cfg, wrap)
		var cs []*collect
		for i, p := range params {
			col := newCollect()
			cs = append(cs, col)
			if err := h.s.Submit(&Request{ID: fmt.Sprint(i), Prompt: samples[i%len(samples)].PromptIDs, Params: p, Detok: nop{}, Sink: col.sink}); err != nil {
				t.Fatal(err)
			}
		}
		var out [][]Frame
		for _, col := range cs {
			out = append(out, col.wait(t))
		}
		return out
	}
	counter := &sampleCounter{}
	onEngine := run(func(e *ModelEngine) Engine { counter.ModelEngine = e; return counter })
	onHost := run(func(e *ModelEngine) Engine { return logitsOnly{e} })
	for i, p := range params {
		if got := ids(t, onEngine[i]); len(got) != p.MaxTokens {
			t.Errorf("request %d: %d tokens, want %d", i, len(got), p.MaxTokens)
		}
		sameFrames(t, fmt.Sprintf("request %d", i), onEngine[i], onHost[i])
	}
	// The first token of each request comes from its prompt's step; the
	// others are drawn on the engine, with the logprobs request's rows.
	if counter.steps.Load() < 5 || counter.reads.Load() < 5 {
		t.Errorf("%d steps drew their tokens on the engine, %d returned rows", counter.steps.Load(), counter.reads.Load())
	}
	// Once the request with penalties and bias is done, the other's rows
	// come back summarized.
	if counter.summaries.Load() == 0 {
		t.Error("no step returned summaries of its rows")
	}
	t.Logf("%d steps drawn on the engine, %d with rows, %d of them summarized; request 1: %v", counter.steps.Load(), counter.reads.Load(), counter.summaries.Load(), ids(t, onEngine[1]))
}

// TestPreemption runs more than the cache holds: sequences are preempted,
// recomputed, and still produce the reference tokens.
func TestPreemption(t *testing.T) {
	samples := demoSamples(t)
	h := start(t, 8, Config{MaxQueue: 64, MaxBatchTokens: 64, MaxSeqs: 8}) // 128 token slots for 6 x 50 tokens
	cs := submitGreedy(t, h, samples)
	for i, col := range cs {
		if got, want := ids(t, col.wait(t)), samples[i].GreedyIDs; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("request %d: got %v, want %v", i, got, want)
		}
	}
	if st := h.s.Stats(); st.Preemptions == 0 {
		t.Errorf("no sequence was preempted (%+v): the test does not exercise preemption", st)
	}
}

func TestCancelAndOverload(t *testing.T) {
	h := start(t, 64, Config{MaxQueue: 2, MaxBatchTokens: 64, MaxSeqs: 1})
	first := newCollect()
	gotToken := make(chan struct{}, 1)
	if err := h.s.Submit(&Request{ID: "long", Prompt: []int32{473, 623}, Params: greedy(500), Detok: nop{}, Sink: func(f Frame) {
		first.sink(f)
		select {
		case gotToken <- struct{}{}:
		default:
		}
	}}); err != nil {
		t.Fatal(err)
	}
	<-gotToken // admitted and running: the queue has room for two more
	var waiting []*collect
	for i := 0; i < 2; i++ {
		c := newCollect()
		waiting = append(waiting, c)
		if err := h.s.Submit(&Request{ID: fmt.Sprint("w", i), Prompt: []int32{473}, Params: greedy(2), Detok: nop{}, Sink: c.sink}); err != nil {
			t.Fatalf("submit %d: %v", i, err)
		}
	}
	if err := h.s.Submit(&Request{ID: "over", Prompt: []int32{473}, Params: greedy(2), Detok: nop{}, Sink: func(Frame) {}}); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("third waiting request: got %v, want ErrOverloaded", err)
	}
	h.s.Cancel("long")
	frames := first.wait(t)
	if last := frames[len(frames)-1]; !last.Final || last.Reason != "cancelled" {
		t.Errorf("last frame %+v, want cancelled", last)
	}
	for _, c := range waiting {
		c.wait(t)
	}
	waitFor(t, func() bool { return h.s.Stats().KV.Used == 0 })
	// Requests that cannot fit are refused up front.
	if err := h.s.Submit(&Request{ID: "big", Prompt: []int32{1}, Params: greedy(5000), Detok: nop{}, Sink: func(Frame) {}}); err == nil {
		t.Error("over-long request accepted")
	}
}

type nop struct{}

func (nop) Next(int32) string { return "" }
func (nop) Flush() string     { return "" }

// waitFor polls cond until it holds or a generous deadline passes.
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// traceEngine records the span context each forward pass runs under.
type traceEngine struct {
	mu  sync.Mutex
	got []trace.SpanContext
}

func (e *traceEngine) Forward(ctx context.Context, b *models.Batch, logits []float32) error {
	e.mu.Lock()
	e.got = append(e.got, trace.SpanContextFromContext(ctx))
	e.mu.Unlock()
	clear(logits)
	return nil
}

// TestUntracedKeepsTraceContext: without a tracer provider the scheduler
// makes no spans, but the forward passes still run in the submitter's
// trace and the frames carry its id.
func TestUntracedKeepsTraceContext(t *testing.T) {
	eng := &traceEngine{}
	kv, _ := NewKV(16, 16)
	s, err := New(Config{MaxQueue: 4, MaxBatchTokens: 16, MaxSeqs: 2, Context: 64, Vocab: 8}, eng, kv, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5}, TraceFlags: trace.FlagsSampled, Remote: true})
	col := newCollect()
	if err := s.Submit(&Request{ID: "t", Prompt: []int32{1, 2}, Params: greedy(3), Detok: nop{}, Sink: col.sink, Trace: trace.ContextWithRemoteSpanContext(context.Background(), sc)}); err != nil {
		t.Fatal(err)
	}
	frames := col.wait(t)
	if len(frames) != 3 {
		t.Fatalf("got %d frames, want 3", len(frames))
	}
	for _, f := range frames {
		if f.TraceID != sc.TraceID().String() {
			t.Errorf("frame %d trace id %q, want %q", f.Seq, f.TraceID, sc.TraceID())
		}
	}
	eng.mu.Lock()
	defer eng.mu.Unlock()
	if len(eng.got) != 3 {
		t.Fatalf("%d forward passes, want 3", len(eng.got))
	}
	for i, got := range eng.got {
		if got.TraceID() != sc.TraceID() {
			t.Errorf("forward %d ran in trace %v, want %v", i, got.TraceID(), sc.TraceID())
		}
	}
}

// TestCachedTokens: a request whose prompt begins as an earlier one's of
// the same tenant reports, on its final frame, the prompt tokens it found
// in the prefix cache (whole blocks of the shared beginning); another
// tenant's finds none; a request with nothing cached reports 0.
func TestCachedTokens(t *testing.T) {
	h := start(t, 64, Config{MaxQueue: 8, MaxBatchTokens: 64, MaxSeqs: 4})
	bs := h.kv.Stats().BlockSize
	prompt := make([]int32, 3*bs+5)
	for i := range prompt {
		prompt[i] = int32(100 + i)
	}
	run := func(id, tenant string, p []int32) Frame {
		t.Helper()
		c := newCollect()
		if err := h.s.Submit(&Request{ID: id, Tenant: tenant, Prompt: p, Params: greedy(2), Detok: nop{}, Sink: c.sink}); err != nil {
			t.Fatal(err)
		}
		frames := c.wait(t)
		return frames[len(frames)-1]
	}
	if f := run("first", "a", prompt); f.CachedTokens != 0 || f.PromptTokens != len(prompt) {
		t.Errorf("first request: cached %d of %d, want 0", f.CachedTokens, f.PromptTokens)
	}
	longer := append(slices.Clone(prompt), 7, 8, 9)
	if f := run("again", "a", longer); f.CachedTokens != 3*bs {
		t.Errorf("the same beginning again: cached %d, want %d (three whole blocks)", f.CachedTokens, 3*bs)
	}
	if f := run("other", "b", longer); f.CachedTokens != 0 {
		t.Errorf("another tenant: cached %d, want 0", f.CachedTokens)
	}
}
