package scheduler

import (
	"context"
	"errors"
	"fmt"
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
	"github.com/troupe/troupe/xgmi"
	"go.opentelemetry.io/otel/trace"
)

// replica is the demo model served over an embedded bus by a scheduler
// service and a pipeline of layer-shard stages.
type replica struct {
	client *Client
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

// startReplicaWith serves bundle b, which it closes at the end of the test.
// With local, the pipeline reaches its stages through Pipeline.Local; opts
// set up the pipeline before it runs.
func startReplicaWith(t testing.TB, b *models.Bundle, stages int, cfg Config, tp trace.TracerProvider, local bool, opts ...func(*Pipeline)) *replica {
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
		o(pipe)
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
	svc, err := Serve(ctx, nc, subj, "demo", s, func() generate.Detokenizer { return nop{} })
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	r.client, r.sched, r.sys = NewClient(nc, subj, "demo"), s, sys
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

// TestPipelineOverBus serves the demo model as a two-stage pipeline behind
// the bus and checks concurrent requests against the reference.
func TestPipelineOverBus(t *testing.T) { testPipeline(t, viaBus) }

// TestPipelineLocal is TestPipelineOverBus with the stages reached through
// their mailboxes.
func TestPipelineLocal(t *testing.T) { testPipeline(t, viaLocal) }

func testPipeline(t *testing.T, local bool) {
	samples := demoSamples(t)
	r := startReplica(t, 2, Config{MaxQueue: 64, MaxBatchTokens: 128, MaxSeqs: 16}, local)
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
	// One step for the prompt, one per further token.
	if st := next.Stats(); st.Processed != uint64(len(s.GreedyIDs)) {
		t.Errorf("successor stats %+v, want %d steps processed", st, len(s.GreedyIDs))
	}
}

func TestClientErrors(t *testing.T) {
	r := startReplica(t, 1, Config{MaxQueue: 4, MaxBatchTokens: 64, MaxSeqs: 4}, viaLocal)
	ctx := context.Background()
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
		if !strings.Contains(string(msg.Data), `"name":"scheduler"`) {
			t.Errorf("%s answered %s", verb, msg.Data)
		}
		if verb == "STATS" && !strings.Contains(string(msg.Data), `"Tokens":3`) {
			t.Errorf("STATS lacks the scheduler's counters: %s", msg.Data)
		}
	}
}
