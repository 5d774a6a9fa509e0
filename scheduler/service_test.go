package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/troupe/troupe/actors"
	"github.com/troupe/troupe/bus"
	"github.com/troupe/troupe/gpu/cpu"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/demo"
	"github.com/troupe/troupe/models/generate"
	"github.com/troupe/troupe/models/grammar"
	"github.com/troupe/troupe/xgmi"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// replica is the demo model served over an embedded bus by a scheduler
// service and a pipeline of layer-shard stages.
type replica struct {
	client *Client
	svc    *Service
	sched  *Scheduler
	sys    *actors.System
	shards []*Shard
	refs   []*actors.Ref[ShardCall]
}

// The two ways a scheduler reaches the layer-shard actors of its process.
const (
	viaBus   = false // requests on their forward subjects
	viaLocal = true  // Pipeline.Local: through their mailboxes
)

func startReplica(t testing.TB, stages int, cfg Config, local bool) *replica {
	t.Helper()
	return startReplicaTraced(t, stages, cfg, nil, local)
}

func startReplicaTraced(t testing.TB, stages int, cfg Config, tp trace.TracerProvider, local bool) *replica {
	t.Helper()
	b, err := models.OpenFS(demo.Name, demo.FS(), demo.Weights())
	if err != nil {
		t.Fatal(err)
	}
	return startReplicaWith(t, b, stages, cfg, tp, local)
}

// replicaOpt sets up a replica's pipeline (p) or each of its shards (s)
// before they run; the other is nil.
type replicaOpt func(p *Pipeline, s *Shard)

// startReplicaWith serves bundle b, which it closes at the end of the test.
// With local, the pipeline reaches its stages through Pipeline.Local.
func startReplicaWith(t testing.TB, b *models.Bundle, stages int, cfg Config, tp trace.TracerProvider, local bool, opts ...replicaOpt) *replica {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	node, err := bus.Start(ctx, bus.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	nc, err := node.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	subj, _ := bus.NewSubjects("test")
	dev, err := cpu.New(benchCPU())
	if err != nil {
		t.Fatal(err)
	}
	plane := xgmi.NewHost(node.Name())
	sys, err := actors.NewSystem(actors.Config{Cluster: "test", Node: node.Name()}, nc)
	if err != nil {
		t.Fatal(err)
	}
	devRef, err := actors.Spawn(ctx, sys, DeviceProps("d0", dev))
	if err != nil {
		t.Fatal(err)
	}
	const blocks = 256
	var cleanups []func()
	var subjects []string
	r := &replica{}
	per := b.Config.Layers / stages
	for i := 0; i < stages; i++ {
		first, last := i*per, (i+1)*per
		if i == stages-1 {
			last = b.Config.Layers
		}
		m, err := models.Load(b.Config, b.Checkpoint, dev, models.Options{FirstLayer: first, LastLayer: last, MaxTokens: cfg.MaxBatchTokens, MaxSeqs: cfg.MaxSeqs})
		if err != nil {
			t.Fatal(err)
		}
		cache, err := m.NewCache(blocks, 16)
		if err != nil {
			t.Fatal(err)
		}
		sh := NewShard(fmt.Sprint(i), i, m, cache, plane, tp)
		sh.Device = devRef
		for _, o := range opts {
			o(nil, sh)
		}
		r.shards = append(r.shards, sh)
		ref, err := actors.Spawn(ctx, sys, sh.Props())
		if err != nil {
			t.Fatal(err)
		}
		r.refs = append(r.refs, ref)
		subjects = append(subjects, subj.ActorEndpoint(ShardKind, sh.ID, "forward"))
		cleanups = append(cleanups, func() { ref.Stop(context.Background()); cache.Close(); m.Close() })
	}
	pool, _ := NewKV(blocks, 16)
	kvRef, err := actors.Spawn(ctx, sys, KVManagerProps("r0", pool))
	if err != nil {
		t.Fatal(err)
	}
	cleanups = append(cleanups, func() { kvRef.Stop(context.Background()) })
	kv, err := NewKVClient(ctx, nc, subj, "r0")
	if err != nil {
		t.Fatal(err)
	}
	if local {
		kv.Local(kvRef)
	}
	cfg.Vocab, cfg.Context, cfg.EOS = b.Config.Vocab, b.Config.MaxPositions, b.Config.EOS
	pipe := NewPipeline(nc, subjects, plane, b.Config.Vocab)
	for _, o := range opts {
		o(pipe, nil)
	}
	for i, ref := range r.refs {
		if !local {
			break
		}
		if err := pipe.Local(i, ref); err != nil {
			t.Fatal(err)
		}
	}
	s, err := New(cfg, pipe, kv, tp)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := Serve(ctx, nc, subj, "demo", s, Text{Detok: func() generate.Detokenizer { return nop{} }}, "1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	r.client, r.svc, r.sched, r.sys = NewClient(nc, subj, "demo"), svc, s, sys
	t.Cleanup(func() {
		svc.Close()
		cancel()
		<-done
		for _, c := range cleanups {
			c()
		}
		sys.Shutdown(context.Background())
		nc.Close()
		node.Shutdown(context.Background())
		dev.Close()
		b.Close()
	})
	return r
}

// The two ways a client reaches a scheduler of its process.
const (
	submitBus   = false // submits and frames on the bus
	submitLocal = true  // Client.Local: Go calls and a queue in memory
)

// submitVia sets the client's path to r's scheduler.
func (r *replica) submitVia(local bool) {
	if local {
		r.client.Local(r.svc)
	} else {
		r.client.Local()
	}
}

// bothSubmitPaths runs f once with the client on the bus and once with it
// calling the scheduler in the process: the expectations are the same.
func bothSubmitPaths(t *testing.T, f func(t *testing.T, local bool)) {
	t.Run("bus", func(t *testing.T) { f(t, submitBus) })
	t.Run("local", func(t *testing.T) { f(t, submitLocal) })
}

// TestPipelineOverBus serves the demo model as a two-stage pipeline behind
// the bus and checks concurrent requests against the reference.
func TestPipelineOverBus(t *testing.T) { testPipeline(t, viaBus, submitBus) }

// TestPipelineLocal is TestPipelineOverBus with the stages reached through
// their mailboxes.
func TestPipelineLocal(t *testing.T) { testPipeline(t, viaLocal, submitBus) }

// TestPipelineLocalSubmit is TestPipelineLocal with the client calling
// the scheduler in the process.
func TestPipelineLocalSubmit(t *testing.T) { testPipeline(t, viaLocal, submitLocal) }

// TestSingleStageQueuesAhead serves the demo model as one stage, whose
// shard queues each greedy decode step's successor before it reads the
// step's choices (ahead.go): concurrent requests, which join and leave the
// batch at different steps, still get the reference's tokens, most decode
// steps were answered by a step queued ahead, and none is left queued
// after the last request's last step (the scheduler said it ends).
func TestSingleStageQueuesAhead(t *testing.T) {
	ahead := func(_ *Pipeline, s *Shard) {
		if s != nil {
			s.QueueAhead = true
		}
	}
	for _, local := range []bool{viaBus, viaLocal} {
		r := testPipelineStages(t, 1, local, submitBus, ahead)
		sh := r.shards[0]
		sh.mu.Lock()
		used, dropped, pending := sh.aheadUsed, sh.aheadDropped, sh.ahead != nil
		sh.mu.Unlock()
		t.Logf("local %v: %d steps answered ahead, %d queued for nothing, one pending: %v", local, used, dropped, pending)
		if used == 0 || used < dropped || pending {
			t.Errorf("local %v: %d steps answered by a step queued ahead, %d dropped, one pending after the last step: %v", local, used, dropped, pending)
		}
	}
}

// TestPipelineDraws: seeded, sampled requests, one reporting
// log-probabilities, one with a penalty reporting them (whose rows come
// back raw, where the others' come back summarized), and a greedy one
// reporting them that outlives the others, served by one stage (whose shard draws the tokens,
// ForwardMsg.Sample, and returns the logits rows asked for,
// ForwardMsg.Read), by one stage whose shard queues each step's successor
// with the next draws the plan carries (ForwardMsg.NextSample) and the
// same rows to read, by two stages (the last draws) and by two stages cut
// into micro-batches (the pipeline draws from the logits) get the same
// tokens and log-probabilities (sameToken).
func TestPipelineDraws(t *testing.T) {
	s := demoSamples(t)[1]
	msgs := []SubmitMsg{
		{ID: "a", Prompt: s.PromptIDs, MaxTokens: 10, IgnoreEOS: true, Temperature: 0.9, HasSeed: true, Seed: 7},
		{ID: "b", Prompt: s.PromptIDs, MaxTokens: 10, IgnoreEOS: true, Temperature: 1.1, TopK: 30, TopP: 0.9, MinP: 0.01, HasSeed: true, Seed: 8,
			Logprobs: true, TopLogprobs: 2},
		{ID: "c", Prompt: s.PromptIDs[:3], MaxTokens: 16, IgnoreEOS: true, TopLogprobs: 3},
		// Its penalty changes its rows: while it runs, the rows come back
		// raw, after it summarized (models.Batch.Summaries).
		{ID: "d", Prompt: s.PromptIDs[:5], MaxTokens: 5, IgnoreEOS: true, Temperature: 0.8, HasSeed: true, Seed: 9, PresencePenalty: 0.5,
			Logprobs: true, TopLogprobs: 1},
	}
	var used, dropped int
	run := func(stages int, micro, queue bool) [][]FrameMsg {
		var opts []replicaOpt
		if queue {
			opts = append(opts, func(_ *Pipeline, s *Shard) {
				if s != nil {
					s.QueueAhead = true
				}
			})
		}
		if !micro {
			opts = append(opts, func(p *Pipeline, _ *Shard) {
				if p != nil {
					p.MicroBatches = 1
				}
			})
		}
		b, err := models.OpenFS(demo.Name, demo.FS(), demo.Weights())
		if err != nil {
			t.Fatal(err)
		}
		r := startReplicaWith(t, b, stages, Config{MaxQueue: 8, MaxBatchTokens: 64, MaxSeqs: 4}, nil, viaLocal, opts...)
		out := make([][]FrameMsg, len(msgs))
		var wg sync.WaitGroup
		for i, m := range msgs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := r.client.Generate(context.Background(), m, func(f FrameMsg) error {
					if (f.Logprob < 0) != (m.Logprobs || m.TopLogprobs > 0) || len(f.TopIDs) != m.TopLogprobs {
						t.Errorf("request %s: frame %+v", m.ID, f)
					}
					out[i] = append(out[i], f)
					return nil
				})
				if err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if queue {
			sh := r.shards[0]
			sh.mu.Lock()
			used, dropped = sh.aheadUsed, sh.aheadDropped
			sh.mu.Unlock()
		}
		return out
	}
	one, ahead, two, micro := run(1, false, false), run(1, false, true), run(2, false, false), run(2, true, false)
	for i, m := range msgs {
		for name, got := range map[string][][]FrameMsg{"one stage queueing ahead": ahead, "two stages": two, "two in micro-batches": micro} {
			if len(one[i]) != m.MaxTokens || len(got[i]) != len(one[i]) {
				t.Fatalf("request %s: %d frames on one stage, %d on %s, want %d", m.ID, len(one[i]), len(got[i]), name, m.MaxTokens)
			}
			for k, f := range got[i] {
				if w := one[i][k]; !sameToken(f.ID, f.Logprob, f.TopIDs, f.TopLPs, w.ID, w.Logprob, w.TopIDs, w.TopLPs) {
					t.Errorf("request %s, token %d: %s %d (%v, top %v %v), one stage %d (%v, top %v %v)", m.ID, k, name, f.ID, f.Logprob, f.TopIDs, f.TopLPs, w.ID, w.Logprob, w.TopIDs, w.TopLPs)
				}
			}
		}
	}
	t.Logf("queued ahead: %d drawn steps answered, %d dropped", used, dropped)
	if used == 0 || used < dropped {
		t.Errorf("%d drawn steps answered by a step queued ahead, %d dropped", used, dropped)
	}
}

func testPipeline(t *testing.T, local, submit bool) { testPipelineStages(t, 2, local, submit) }

func testPipelineStages(t *testing.T, stages int, local, submit bool, opts ...replicaOpt) *replica {
	samples := demoSamples(t)
	b, err := models.OpenFS(demo.Name, demo.FS(), demo.Weights())
	if err != nil {
		t.Fatal(err)
	}
	r := startReplicaWith(t, b, stages, Config{MaxQueue: 64, MaxBatchTokens: 128, MaxSeqs: 16}, nil, local, opts...)
	r.submitVia(submit)
	var wg sync.WaitGroup
	errs := make(chan error, 2*len(samples))
	for c := 0; c < 2; c++ {
		for i, s := range samples {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var got []int32
				final, err := r.client.Generate(context.Background(), SubmitMsg{ID: fmt.Sprintf("%d-%d", c, i), Prompt: s.PromptIDs, MaxTokens: len(s.GreedyIDs), IgnoreEOS: true}, func(f FrameMsg) error {
					got = append(got, f.ID)
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
				if fmt.Sprint(got) != fmt.Sprint(s.GreedyIDs) || final.CompletionTokens != len(s.GreedyIDs) {
					errs <- fmt.Errorf("sample %d: got %v (%d tokens reported), want %v", i, got, final.CompletionTokens, s.GreedyIDs)
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// The scheduler publishes its stats after the step that sent the last frames.
	waitFor(t, func() bool {
		st, err := r.client.Stats(context.Background())
		return err == nil && st.KV.Used == 0 && st.Running == 0 && st.Tokens > 0
	})
	return r
}

// TestPipelineLocalFallsBackToBus: once a local stage's actor has stopped,
// the pipeline reaches the stage's successor over the bus.
func TestPipelineLocalFallsBackToBus(t *testing.T) {
	s := demoSamples(t)[0]
	r := startReplica(t, 2, Config{MaxQueue: 8, MaxBatchTokens: 64, MaxSeqs: 4}, viaLocal)
	ctx := context.Background()
	if err := r.refs[1].Stop(ctx); err != nil {
		t.Fatal(err)
	}
	next, err := actors.Spawn(ctx, r.sys, r.shards[1].Props())
	if err != nil {
		t.Fatal(err)
	}
	var got []int32
	final, err := r.client.Generate(ctx, SubmitMsg{ID: "f", Prompt: s.PromptIDs, MaxTokens: len(s.GreedyIDs), IgnoreEOS: true}, func(f FrameMsg) error {
		got = append(got, f.ID)
		return nil
	})
	if err != nil || final.Reason != "length" {
		t.Fatalf("generate: %v, reason %q", err, final.Reason)
	}
	if fmt.Sprint(got) != fmt.Sprint(s.GreedyIDs) {
		t.Errorf("got %v, want %v", got, s.GreedyIDs)
	}
	// One step for the prompt, one per further token. The actor counts a
	// step after it has replied, so the last count may trail the reply.
	want := uint64(len(s.GreedyIDs))
	waitFor(t, func() bool { return next.Stats().Processed >= want })
	if st := next.Stats(); st.Processed != want {
		t.Errorf("successor stats %+v, want %d steps processed", st, want)
	}
}

// TestClientErrors: a request that cannot fit is a bad request, and an
// emit error cancels the request, on either path.
func TestClientErrors(t *testing.T) { bothSubmitPaths(t, testClientErrors) }

func testClientErrors(t *testing.T, submit bool) {
	r := startReplica(t, 1, Config{MaxQueue: 4, MaxBatchTokens: 64, MaxSeqs: 4}, viaLocal)
	r.submitVia(submit)
	ctx := context.Background()
	if _, err := r.client.Generate(ctx, SubmitMsg{Prompt: []int32{1}, MaxTokens: 4}, func(FrameMsg) error { return nil }); bus.CodeOf(err) != bus.CodeBadRequest {
		t.Errorf("request without an id: got %v, want a bad_request error", err)
	}
	_, err := r.client.Generate(ctx, SubmitMsg{ID: "x", Prompt: []int32{1}, MaxTokens: 100000}, func(FrameMsg) error { return nil })
	var be *bus.Error
	if !errors.As(err, &be) || be.Code != bus.CodeBadRequest {
		t.Errorf("over-long request: got %v, want a bad_request error", err)
	}
	// An emit error cancels the request and frees its blocks.
	stop := errors.New("enough")
	_, err = r.client.Generate(ctx, SubmitMsg{ID: "y", Prompt: []int32{473, 623}, MaxTokens: 500, IgnoreEOS: true}, func(f FrameMsg) error {
		if f.Seq == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) {
		t.Errorf("emit error: got %v", err)
	}
	waitFor(t, func() bool { st := r.sched.Stats(); return st.Running == 0 && st.KV.Used == 0 })
}

// TestShardPanicRestarts: a layer-shard that panics fails the step in
// flight, is restarted by its supervisor, and the next request succeeds,
// whichever way the pipeline reaches it.
func TestShardPanicRestarts(t *testing.T) {
	t.Run("bus", func(t *testing.T) { testShardPanicRestarts(t, viaBus) })
	t.Run("local", func(t *testing.T) { testShardPanicRestarts(t, viaLocal) })
}

func testShardPanicRestarts(t *testing.T, local bool) {
	samples := demoSamples(t)
	r := startReplica(t, 2, Config{MaxQueue: 8, MaxBatchTokens: 64, MaxSeqs: 4}, local)
	var once sync.Once
	r.shards[1].Fault = func() { once.Do(func() { panic("injected fault") }) }
	ctx := context.Background()
	s := samples[0]
	final, err := r.client.Generate(ctx, SubmitMsg{ID: "a", Prompt: s.PromptIDs, MaxTokens: 8}, func(FrameMsg) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if final.Reason != "error" {
		t.Fatalf("request during the panic ended %q, want error", final.Reason)
	}
	var got []int32
	final, err = r.client.Generate(ctx, SubmitMsg{ID: "b", Prompt: s.PromptIDs, MaxTokens: len(s.GreedyIDs), IgnoreEOS: true}, func(f FrameMsg) error {
		got = append(got, f.ID)
		return nil
	})
	if err != nil || final.Reason != "length" {
		t.Fatalf("request after the restart: %v, reason %q", err, final.Reason)
	}
	if fmt.Sprint(got) != fmt.Sprint(s.GreedyIDs) {
		t.Errorf("after the restart: got %v, want %v", got, s.GreedyIDs)
	}
	if st := r.refs[1].Stats(); st.Restarts != 1 {
		t.Errorf("shard stats %+v, want one restart", st)
	}
}

// TestSchedulerMicroService: the scheduler answers the micro service
// PING, INFO and STATS requests, its stats carrying its counters.
func TestSchedulerMicroService(t *testing.T) {
	r := startReplica(t, 1, Config{MaxQueue: 4, MaxBatchTokens: 64, MaxSeqs: 4}, viaLocal)
	if _, err := r.client.Generate(context.Background(), SubmitMsg{ID: "m", Prompt: []int32{473}, MaxTokens: 3, IgnoreEOS: true}, func(FrameMsg) error { return nil }); err != nil {
		t.Fatal(err)
	}
	for _, verb := range []string{"PING", "INFO", "STATS"} {
		msg, err := r.client.nc.Request("$SRV."+verb+".scheduler", nil, 5*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", verb, err)
		}
		if !strings.Contains(string(msg.Data), `"name":"scheduler"`) || !strings.Contains(string(msg.Data), `"version":"1.2.3"`) {
			t.Errorf("%s answered %s", verb, msg.Data)
		}
		if verb == "STATS" && !strings.Contains(string(msg.Data), `"Tokens":3`) {
			t.Errorf("STATS lacks the scheduler's counters: %s", msg.Data)
		}
	}
}

// TestPipelineTrace: whichever way the pipeline reaches its stages, every
// decode.step span has one shard.forward child per stage, in the
// request's trace.
func TestPipelineTrace(t *testing.T) {
	for _, tc := range []struct {
		name  string
		local bool
	}{{"bus", viaBus}, {"local", viaLocal}} {
		t.Run(tc.name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			defer tp.Shutdown(context.Background())
			r := startReplicaTraced(t, 2, Config{MaxQueue: 4, MaxBatchTokens: 64, MaxSeqs: 4}, tp, tc.local)
			const tokens = 4
			if _, err := r.client.Generate(context.Background(), SubmitMsg{ID: "t", Prompt: []int32{473, 623}, MaxTokens: tokens, IgnoreEOS: true}, func(FrameMsg) error { return nil }); err != nil {
				t.Fatal(err)
			}
			var steps []sdktrace.ReadOnlySpan
			shards := map[trace.SpanID]int{}
			// The last step's span ends after its frame went out.
			waitFor(t, func() bool {
				steps, shards = steps[:0], map[trace.SpanID]int{}
				for _, sp := range rec.Ended() {
					switch sp.Name() {
					case SpanStep:
						steps = append(steps, sp)
					case SpanShard:
						shards[sp.Parent().SpanID()]++
					}
				}
				return len(steps) == tokens
			})
			for _, st := range steps {
				if n := shards[st.SpanContext().SpanID()]; n != 2 {
					t.Errorf("step span %v has %d %s children, want 2", st.SpanContext().SpanID(), n, SpanShard)
				}
				if st.SpanContext().TraceID() != steps[0].SpanContext().TraceID() {
					t.Errorf("step spans in different traces")
				}
			}
		})
	}
}

// TestClientOverloaded: with one sequence running and one waiting in a
// queue of one, a third request is refused as overloaded; cancelling the
// two frees their blocks. On either path.
func TestClientOverloaded(t *testing.T) { bothSubmitPaths(t, testClientOverloaded) }

func testClientOverloaded(t *testing.T, submit bool) {
	r := startReplica(t, 1, Config{MaxQueue: 1, MaxBatchTokens: 64, MaxSeqs: 1}, viaLocal)
	r.submitVia(submit)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = r.client.Generate(ctx, SubmitMsg{ID: fmt.Sprint("long-", i), Prompt: []int32{473, 623}, MaxTokens: 900, IgnoreEOS: true}, func(FrameMsg) error { return nil })
		}()
		if i == 0 {
			waitFor(t, func() bool { return r.sched.Stats().Running == 1 })
		}
	}
	waitFor(t, func() bool { return r.sched.Stats().Waiting == 1 })
	_, err := r.client.Generate(context.Background(), SubmitMsg{ID: "third", Prompt: []int32{473}, MaxTokens: 4}, func(FrameMsg) error { return nil })
	if bus.CodeOf(err) != bus.CodeOverloaded {
		t.Errorf("third request: got %v, want an overloaded error", err)
	}
	cancel()
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("request %d after its context ended: got %v, want %v", i, err, context.Canceled)
		}
	}
	waitFor(t, func() bool { st := r.sched.Stats(); return st.Running == 0 && st.Waiting == 0 && st.KV.Used == 0 })
}

// TestClientFrames: the frames of a request with log-probabilities carry
// them, the step timings and the trace id of the caller's trace, whose
// spans the scheduler's continue. On either path.
func TestClientFrames(t *testing.T) { bothSubmitPaths(t, testClientFrames) }

func testClientFrames(t *testing.T, submit bool) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	r := startReplicaTraced(t, 1, Config{MaxQueue: 4, MaxBatchTokens: 64, MaxSeqs: 4}, tp, viaLocal)
	r.submitVia(submit)
	// A watcher of the request's tokens subject sees its frames on the bus
	// path, none on the local one.
	watch, err := r.client.nc.SubscribeSync(r.client.subj.Tokens("f"))
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Unsubscribe()
	ctx, root := tp.Tracer("test").Start(context.Background(), "client")
	const tokens = 5
	var frames []FrameMsg
	final, err := r.client.Generate(ctx, SubmitMsg{ID: "f", Prompt: []int32{473, 623}, MaxTokens: tokens, IgnoreEOS: true, Logprobs: true, TopLogprobs: 3}, func(f FrameMsg) error {
		frames = append(frames, f)
		return nil
	})
	root.End()
	if err != nil {
		t.Fatal(err)
	}
	if final.Reason != "length" || final.PromptTokens != 2 || final.CompletionTokens != tokens || len(frames) != tokens {
		t.Fatalf("final frame %+v after %d frames, want length with 2+%d tokens", final, len(frames), tokens)
	}
	if err := r.client.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	onBus, _, _ := watch.Pending()
	if want := map[bool]int{submitBus: tokens, submitLocal: 0}[submit]; onBus != want {
		t.Errorf("%d frames on the bus, want %d", onBus, want)
	}
	want := root.SpanContext().TraceID().String()
	for i, f := range frames {
		if f.Seq != i+1 || f.TraceID != want {
			t.Errorf("frame %d: seq %d, trace %q; want seq %d, trace %q", i, f.Seq, f.TraceID, i+1, want)
		}
		if len(f.TopIDs) != 3 || len(f.TopLPs) != 3 || f.TopIDs[0] != f.ID || f.Logprob > 0 || math.Abs(float64(f.TopLPs[0]-f.Logprob)) > 1e-4 {
			t.Errorf("frame %d: id %d logprob %v, top %v %v; want 3 top log-probabilities, the first the token's", i, f.ID, f.Logprob, f.TopIDs, f.TopLPs)
		}
		if f.SinceStartUS < 0 || f.QueuedUS < 0 || f.SinceLastUS < 0 || (i > 0 && f.SinceStartUS < frames[i-1].SinceStartUS) {
			t.Errorf("frame %d: timings queued %d, since start %d, since last %d µs", i, f.QueuedUS, f.SinceStartUS, f.SinceLastUS)
		}
	}
	// The last step's span ends after its frame went out.
	var steps []sdktrace.ReadOnlySpan
	waitFor(t, func() bool {
		steps = steps[:0]
		for _, sp := range rec.Ended() {
			if sp.Name() == SpanStep {
				steps = append(steps, sp)
			}
		}
		return len(steps) == tokens
	})
	for _, sp := range steps {
		if got := sp.SpanContext().TraceID().String(); got != want {
			t.Errorf("step span in trace %s, want the caller's %s", got, want)
		}
	}
	// The final frame counts the prompt tokens found in the prefix cache.
	long := make([]int32, 40)
	for i := range long {
		long[i] = int32(200 + i)
	}
	var cached []int
	for i := range 2 {
		final, err := r.client.Generate(context.Background(), SubmitMsg{ID: fmt.Sprint("c", i), Prompt: long, MaxTokens: 1, IgnoreEOS: true}, func(FrameMsg) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		cached = append(cached, final.CachedTokens)
	}
	if cached[0] != 0 || cached[1] <= 0 || cached[1] >= len(long) {
		t.Errorf("cached tokens %v of the same %d-token prompt twice, want 0, then whole blocks of it", cached, len(long))
	}
}

// A grammar's vocabulary covers every row of the logits: the rows past the
// tokenizer's ids are banned from a draw like any other refused token.
func TestGrammarCoversTheLogits(t *testing.T) {
	bytes := make([][]byte, 256)
	for c := range bytes {
		bytes[c] = []byte{byte(c)}
	}
	sv := &Service{s: &Scheduler{cfg: Config{Vocab: 300}}, text: Text{Bytes: func() [][]byte { return bytes }}}
	for _, schema := range []string{"", `{"type":"object","properties":{"a":{"type":"string"}}}`} {
		g, err := sv.grammar(schema, false)
		if err != nil {
			t.Fatal(err)
		}
		ban, ok := g.Start().Banned(300)
		if !ok || len(ban) != 299 || ban[len(ban)-1] != 299 || slices.Contains(ban, '{') {
			t.Errorf("schema %q: %d bans (%v), the last %v", schema, len(ban), ok, ban[len(ban)-1:])
		}
	}
	// The same schema compact is another grammar: after '{' a line break
	// is refused, and a space allowed once.
	schema := `{"type":"object","properties":{"a":{"type":"string"}}}`
	loose, _ := sv.grammar(schema, false)
	compact, err := sv.grammar(schema, true)
	if err != nil || compact == loose {
		t.Fatalf("compact grammar %p, loose %p: %v", compact, loose, err)
	}
	for _, c := range []struct {
		g    *grammar.Grammar
		text string
		ok   []bool
	}{{loose, "{\n  ", []bool{true, true, true, true}}, {compact, "{  ", []bool{true, true, false}}, {compact, "{\n", []bool{true, false}}} {
		q := c.g.Start()
		for i := range len(c.text) {
			if got := q.Allowed(int32(c.text[i])); got != c.ok[i] {
				t.Errorf("%q byte %d allowed %v, want %v", c.text, i, got, c.ok[i])
			}
			if !c.ok[i] {
				break
			}
			if err := q.Accept(int32(c.text[i])); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := sv.grammar(`{"type":"object","properties":{"a":{"format":"date"}}}`, false); err == nil || !strings.Contains(err.Error(), `"format"`) {
		t.Errorf("a schema with a format: %v", err)
	}
	if _, err := (&Service{s: sv.s}).grammar("", false); err == nil {
		t.Error("JSON mode without the vocabulary: no error")
	}
}
