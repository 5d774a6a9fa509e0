package scheduler

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/troupe/troupe/bus"
	"github.com/troupe/troupe/gpu/cpu"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/demo"
)

func TestPlan(t *testing.T) {
	for _, tc := range []struct {
		layers int
		nodes  []string
		want   string
	}{
		{8, []string{"a"}, "[{a 0 8}]"},
		{8, []string{"a", "b", "c"}, "[{a 0 3} {b 3 6} {c 6 8}]"},
		{8, []string{"a", "a"}, "[{a 0 4} {a 4 8}]"},
	} {
		got, err := Plan(tc.layers, tc.nodes)
		if err != nil || fmt.Sprint(got) != tc.want {
			t.Errorf("Plan(%d, %v) = %v, %v; want %s", tc.layers, tc.nodes, got, err, tc.want)
		}
	}
	for _, nodes := range [][]string{nil, {"a", ""}, {"a", "b", "c"}} {
		if _, err := Plan(2, nodes); err == nil {
			t.Errorf("Plan(2, %q): no error", nodes)
		}
	}
	for _, tc := range []struct {
		stages         int
		current, other []string
		want           string
	}{
		{3, []string{"h0"}, []string{"h0", "h1", "h2"}, "h0,h1,h2"},
		{2, []string{"h2", "h0", "h1"}, nil, "h2,h0"},
		{1, []string{"h1"}, []string{"h0"}, "h1"},
		{5, []string{"a"}, []string{"b"}, "a,a,a,b,b"},
		{4, nil, []string{"b", "a", "b"}, "b,b,a,a"},
	} {
		got, err := Spread(tc.stages, tc.current, tc.other)
		if err != nil || strings.Join(got, ",") != tc.want {
			t.Errorf("Spread(%d, %q, %q) = %q, %v; want %s", tc.stages, tc.current, tc.other, got, err, tc.want)
		}
	}
	for _, stages := range []int{0, -1, 65} {
		if _, err := Spread(stages, []string{"a"}, nil); err == nil {
			t.Errorf("Spread(%d stages): no error", stages)
		}
	}
	if _, err := Spread(2, nil, []string{""}); err == nil {
		t.Error("Spread over no nodes: no error")
	}
	a := ShardArgs{Replica: "r0", First: 0, Last: 4, Blocks: 8, BlockSize: 16}
	if err := a.Validate(8); err != nil {
		t.Errorf("valid args: %v", err)
	}
	a.Last = 9
	if err := a.Validate(8); err == nil {
		t.Error("layers past the model: no error")
	}
}

// flaky is an engine that fails as a dead stage would while down is set.
type flaky struct {
	Engine
	down  atomic.Bool
	steps atomic.Int64
	after int64 // go down after this many steps (0: never)
}

func (f *flaky) Forward(ctx context.Context, b *models.Batch, logits []float32) error {
	if n := f.steps.Add(1); f.after > 0 && n == f.after {
		f.down.Store(true)
	}
	if f.down.Load() {
		return fmt.Errorf("pipeline stage 1: %w", bus.Errorf(bus.CodeUnavailable, "no responders"))
	}
	return f.Engine.Forward(ctx, b, logits)
}

// failoverHarness runs a scheduler over a Failover of two CPU placements
// of the demo model that share one KV pool.
func failoverHarness(t *testing.T, after int64) (*Scheduler, *Failover, []*flaky) {
	t.Helper()
	b, err := models.OpenFS(demo.Name, demo.FS(), demo.Weights())
	if err != nil {
		t.Fatal(err)
	}
	dev, err := cpu.New(cpu.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{MaxQueue: 64, MaxBatchTokens: 128, MaxSeqs: 8}
	const blocks = 128
	var engines []Engine
	var fl []*flaky
	var closers []func()
	for i := 0; i < 2; i++ {
		m, err := models.Load(b.Config, b.Checkpoint, dev, models.Options{MaxTokens: cfg.MaxBatchTokens, MaxSeqs: cfg.MaxSeqs})
		if err != nil {
			t.Fatal(err)
		}
		cache, err := m.NewCache(blocks, 16)
		if err != nil {
			t.Fatal(err)
		}
		closers = append(closers, func() { cache.Close(); m.Close() })
		f := &flaky{Engine: &ModelEngine{Model: m, Cache: cache}}
		if i == 0 {
			f.after = after
		}
		fl = append(fl, f)
		engines = append(engines, f)
	}
	fo, err := NewFailover(engines, []string{"p0", "p1"}, 16, cfg.MaxBatchTokens, b.Config.Vocab)
	if err != nil {
		t.Fatal(err)
	}
	kv, _ := NewKV(blocks, 16)
	cfg.Vocab, cfg.Context, cfg.EOS = b.Config.Vocab, b.Config.MaxPositions, b.Config.EOS
	s, err := New(cfg, fo, kv, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		for _, c := range closers {
			c()
		}
		dev.Close()
		b.Close()
	})
	return s, fo, fl
}

// generateAll runs every sample twice, concurrently, and returns the ids
// and final frames.
func generateAll(t *testing.T, s *Scheduler, samples []refSample, onToken func()) ([][]int32, []Frame) {
	t.Helper()
	n := 2 * len(samples)
	got := make([][]int32, n)
	finals := make([]Frame, n)
	var wg sync.WaitGroup
	for k := 0; k < n; k++ {
		smp := samples[k%len(samples)]
		wg.Add(1)
		done := make(chan struct{})
		r := &Request{ID: fmt.Sprint("req", k), Prompt: smp.PromptIDs, Detok: nop{}}
		r.Params.MaxTokens, r.Params.IgnoreEOS = len(smp.GreedyIDs), true
		r.Sink = func(f Frame) {
			if !f.Final || f.Reason == "length" || f.Reason == "stop" {
				got[k] = append(got[k], f.ID) // a normal final frame carries the last token
			}
			if f.Final {
				finals[k] = f
				close(done)
				return
			}
			if onToken != nil {
				onToken()
			}
		}
		if err := s.Submit(r); err != nil {
			t.Fatal(err)
		}
		go func() { defer wg.Done(); <-done }()
	}
	wg.Wait()
	return got, finals
}

// TestFailoverReprefills: the preferred placement dies mid-stream; every
// request finishes on the other with the reference tokens, none repeated
// or missing. Then the first comes back, is used again, and the tokens
// are still the reference.
func TestFailoverReprefills(t *testing.T) {
	samples := demoSamples(t)
	s, fo, fl := failoverHarness(t, 10)
	var switches []string
	fo.Switched = func(from, to string, err error) { switches = append(switches, from+"->"+to) }
	got, finals := generateAll(t, s, samples, nil)
	for k, ids := range got {
		want := samples[k%len(samples)].GreedyIDs
		if fmt.Sprint(ids) != fmt.Sprint(want) || finals[k].Reason != "length" {
			t.Errorf("request %d: got %v (%s %s), want %v", k, ids, finals[k].Reason, finals[k].Err, want)
		}
	}
	if fmt.Sprint(switches) != "[p0->p1]" {
		t.Errorf("switches %v, want [p0->p1]", switches)
	}
	if st := fo.State(); st[0].Up || !st[1].Active {
		t.Errorf("state after the failure: %+v", st)
	}
	// Bring p0 back mid-stream: the scheduler moves to it, re-prefilling.
	fl[0].down.Store(false)
	var once sync.Once
	var tokens atomic.Int64
	got, finals = generateAll(t, s, samples, func() {
		if tokens.Add(1) == 20 {
			once.Do(func() { fo.Restore(0) })
		}
	})
	for k, ids := range got {
		want := samples[k%len(samples)].GreedyIDs
		if fmt.Sprint(ids) != fmt.Sprint(want) {
			t.Errorf("after restore, request %d: got %v (%s), want %v", k, ids, finals[k].Err, want)
		}
	}
	if fmt.Sprint(switches) != "[p0->p1 p1->p0]" {
		t.Errorf("switches %v, want [p0->p1 p1->p0]", switches)
	}
	if fl[0].steps.Load() <= 10 || fo.validCount(0) == 0 {
		t.Errorf("restored placement ran %d steps, holds %d slots", fl[0].steps.Load(), fo.validCount(0))
	}
}

// TestFailoverNoneLeft: with every placement down, requests end with an
// error frame naming the cause.
func TestFailoverNoneLeft(t *testing.T) {
	samples := demoSamples(t)
	s, fo, fl := failoverHarness(t, 6)
	fl[1].down.Store(true)
	_, finals := generateAll(t, s, samples[:1], nil)
	for k, f := range finals {
		if f.Reason != "error" || !strings.Contains(f.Err, "no replica left") {
			t.Errorf("request %d ended %q (%s), want an error naming the lost replicas", k, f.Reason, f.Err)
		}
	}
	if st := fo.State(); st[0].Up || st[1].Up {
		t.Errorf("state: %+v", st)
	}
}
