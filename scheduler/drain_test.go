package scheduler

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/troupe/troupe/bus"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/generate"
)

// serveDemo serves h's scheduler as model "demo" on nc until the test ends.
func serveDemo(t *testing.T, nc *nats.Conn, subj bus.Subjects, h *harness) *Service {
	t.Helper()
	svc, err := Serve(context.Background(), nc, subj, "demo", h.s, Text{Detok: func() generate.Detokenizer { return nop{} }}, "1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	return svc
}

// TestServiceDrainHandsOver drains one of two schedulers of a model while
// requests arrive: the requests it took finish with the reference tokens,
// those that come after go to the other, none is lost; with no scheduler
// left a submit fails as unavailable. The client is on the bus, or calls
// the schedulers in its process, which it is told of as a node does: B
// when it starts.
func TestServiceDrainHandsOver(t *testing.T) { bothSubmitPaths(t, testServiceDrainHandsOver) }

func testServiceDrainHandsOver(t *testing.T, local bool) {
	samples := demoSamples(t)
	cfg := Config{MaxQueue: 64, MaxBatchTokens: 128, MaxSeqs: 8}
	a, b := start(t, 256, cfg), start(t, 256, cfg)
	ctx := context.Background()
	_, nc := testBus(t)
	subj, _ := bus.NewSubjects("test")
	svcA := serveDemo(t, nc, subj, a)
	client := NewClient(nc, subj, "demo")
	client.submitWait = time.Second // the last submit finds no scheduler
	if local {
		client.Local(svcA)
	}

	var wg sync.WaitGroup
	errs := make(chan error, 64)
	started := make(chan struct{}, 64)
	send := func(id string, s refSample) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var got []int32
			_, err := client.Generate(ctx, SubmitMsg{ID: id, Prompt: s.PromptIDs, MaxTokens: len(s.GreedyIDs), IgnoreEOS: true}, func(f FrameMsg) error {
				if len(got) == 0 {
					started <- struct{}{}
				}
				got = append(got, f.ID)
				return nil
			})
			if err != nil {
				errs <- fmt.Errorf("request %s: %w", id, err)
				return
			}
			if fmt.Sprint(got) != fmt.Sprint(s.GreedyIDs) {
				errs <- fmt.Errorf("request %s: got %v, want %v", id, got, s.GreedyIDs)
			}
		}()
	}
	// A alone takes the first requests; B joins; A drains while more come.
	for i := range 6 {
		send(fmt.Sprint("a", i), samples[i%len(samples)])
	}
	for range 6 {
		<-started
	}
	svcB := serveDemo(t, nc, subj, b)
	if local {
		client.Local(svcA, svcB)
	}
	for i := range 12 {
		send(fmt.Sprint("m", i), samples[i%len(samples)])
	}
	if err := svcA.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if n := svcA.Active(); n != 0 {
		t.Errorf("after the drain A runs %d requests", n)
	}
	waitFor(t, func() bool { st := a.s.Stats(); return st.Running == 0 && st.Waiting == 0 })
	tokensA := a.s.Stats().Tokens
	for i := range 6 {
		send(fmt.Sprint("b", i), samples[i%len(samples)])
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := a.s.Stats().Tokens; got != tokensA {
		t.Errorf("A made %d tokens after its drain", got-tokensA)
	}
	if b.s.Stats().Tokens == 0 {
		t.Error("B served nothing")
	}

	if err := svcB.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	_, err := client.Generate(ctx, SubmitMsg{ID: "late", Prompt: samples[0].PromptIDs, MaxTokens: 4}, func(FrameMsg) error { return nil })
	if bus.CodeOf(err) != bus.CodeUnavailable {
		t.Errorf("with every scheduler drained: got %v, want an unavailable error", err)
	}
}

// TestServiceDrainsAndClosesAtOnce: a service drained twice and closed at
// the same moment (a node stopping while a resize retires the replica)
// finishes its request and ends closed, without a race.
func TestServiceDrainsAndClosesAtOnce(t *testing.T) {
	samples := demoSamples(t)
	h := start(t, 256, Config{MaxQueue: 64, MaxBatchTokens: 128, MaxSeqs: 8})
	_, nc := testBus(t)
	subj, _ := bus.NewSubjects("test")
	svc := serveDemo(t, nc, subj, h)
	client := NewClient(nc, subj, "demo")
	client.submitWait = 200 * time.Millisecond
	ctx := context.Background()
	started, done := make(chan struct{}), make(chan error, 1)
	go func() {
		var once sync.Once
		_, err := client.Generate(ctx, SubmitMsg{ID: "r", Prompt: samples[0].PromptIDs, MaxTokens: len(samples[0].GreedyIDs), IgnoreEOS: true}, func(FrameMsg) error {
			once.Do(func() { close(started) })
			return nil
		})
		done <- err
	}()
	<-started
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { _ = svc.Drain(ctx) })
	}
	wg.Go(svc.Close)
	wg.Wait()
	if err := <-done; err != nil {
		t.Errorf("the request across the drains: %v", err)
	}
	_, err := client.Generate(ctx, SubmitMsg{ID: "late", Prompt: samples[0].PromptIDs, MaxTokens: 4}, func(FrameMsg) error { return nil })
	if bus.CodeOf(err) != bus.CodeUnavailable {
		t.Errorf("after the drains: got %v, want an unavailable error", err)
	}
}

// TestClientLocalLeastLoaded: among the schedulers of its process the
// client submits to the least loaded one that takes requests.
func TestClientLocalLeastLoaded(t *testing.T) {
	s := demoSamples(t)[0]
	cfg := Config{MaxQueue: 8, MaxBatchTokens: 64, MaxSeqs: 4}
	// A's steps after its first wait for release, so its long request
	// cannot end, however fast the host, before the short ones are placed.
	release := make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free)
	a := startWith(t, 256, cfg, func(e *ModelEngine) Engine { return &heldEngine{Engine: e, release: release} })
	b := start(t, 256, cfg)
	ctx := context.Background()
	_, nc := testBus(t)
	subj, _ := bus.NewSubjects("test")
	svcA, svcB := serveDemo(t, nc, subj, a), serveDemo(t, nc, subj, b)
	client := NewClient(nc, subj, "demo")
	client.Local(svcA)
	// A long request keeps A loaded.
	lctx, cancel := context.WithCancel(ctx)
	long := make(chan error, 1)
	go func() {
		_, err := client.Generate(lctx, SubmitMsg{ID: "long", Prompt: s.PromptIDs, MaxTokens: 900, IgnoreEOS: true}, func(FrameMsg) error { return nil })
		long <- err
	}()
	waitFor(t, func() bool { return a.s.Stats().Running == 1 })
	client.Local(svcA, svcB)
	// A short request placed on the held A would wait for ever.
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	for i := range 3 {
		var got []int32
		if _, err := client.Generate(sctx, SubmitMsg{ID: fmt.Sprint("short-", i), Prompt: s.PromptIDs, MaxTokens: len(s.GreedyIDs), IgnoreEOS: true}, func(f FrameMsg) error {
			got = append(got, f.ID)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(s.GreedyIDs) {
			t.Errorf("request %d: got %v, want %v", i, got, s.GreedyIDs)
		}
	}
	if st := b.s.Stats(); st.Tokens != uint64(3*len(s.GreedyIDs)) {
		t.Errorf("B made %d tokens, want the %d of the three short requests", st.Tokens, 3*len(s.GreedyIDs))
	}
	cancel()
	free()
	if err := <-long; err != context.Canceled {
		t.Errorf("long request: got %v, want %v", err, context.Canceled)
	}
	waitFor(t, func() bool { st := a.s.Stats(); return st.Running == 0 && st.KV.Used == 0 })
}

// heldEngine runs its first step and holds every later one until release
// is closed.
type heldEngine struct {
	Engine
	release <-chan struct{}
	steps   atomic.Int64
}

func (h *heldEngine) Forward(ctx context.Context, b *models.Batch, logits []float32) error {
	if h.steps.Add(1) > 1 {
		select {
		case <-h.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return h.Engine.Forward(ctx, b, logits)
}
