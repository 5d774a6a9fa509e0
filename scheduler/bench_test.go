package scheduler

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/troupe/troupe/bus"
	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/cpu"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/demo"
	"github.com/troupe/troupe/models/generate"
	"github.com/troupe/troupe/models/modeltest"
	"github.com/troupe/troupe/models/sample"
	ttrace "github.com/troupe/troupe/trace"
	"go.opentelemetry.io/otel/trace"
)

// The per-token cost of the actor path: the same greedy decode of the demo
// model called directly on the engine, and through the scheduler, the
// KV-manager and a layer-shard actor on the bus, untraced and traced.
//
//	go test -run XXX -bench 'Decode' -benchtime 256x ./scheduler
//
// Each op is one generated token at batch 1; compare the µs/token metrics.

const benchTokens = 256

func BenchmarkDecodeDirect(b *testing.B) {
	bundle, err := models.OpenFS(demo.Name, demo.FS(), demo.Weights())
	if err != nil {
		b.Fatal(err)
	}
	benchDirect(b, bundle, []int32{473, 623}, benchTokens)
}

// benchDirect decodes greedily on the engine itself, one token per op,
// restarting the sequence every limit tokens. It closes bundle.
func benchDirect(b *testing.B, bundle *models.Bundle, prompt []int32, limit int) {
	defer bundle.Close()
	dev, err := cpu.New(benchCPU())
	if err != nil {
		b.Fatal(err)
	}
	defer dev.Close()
	m, err := models.Load(bundle.Config, bundle.Checkpoint, dev, models.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	b.ReportAllocs()
	cpu0 := cpuTime()
	var seq *models.Sequence
	var logits []float32
	for b.Loop() {
		if seq == nil || seq.Len() >= limit {
			if seq != nil {
				seq.Close()
			}
			if seq, err = m.NewSequence(limit + 8); err != nil {
				b.Fatal(err)
			}
			if logits, err = seq.Feed(ctx, prompt, false); err != nil {
				b.Fatal(err)
			}
		}
		if logits, err = seq.Feed(ctx, []int32{int32(argmaxF(logits))}, false); err != nil {
			b.Fatal(err)
		}
	}
	seq.Close()
	perToken(b, cpu0)
}

// perToken reports the wall and CPU time per token of a benchmark that
// generated b.N tokens since cpu0 (a cpuTime reading at its start). CPU
// time counts every thread of the process, so it holds what the bus, the
// actors and the scheduler spend around the forward passes, and it is less
// disturbed than wall time by other work on a shared machine.
func perToken(b *testing.B, cpu0 time.Duration) {
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/token")
	if cpu := cpuTime() - cpu0; cpu > 0 {
		b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/token")
	}
}

func argmaxF(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}

func benchActorPath(b *testing.B, tp trace.TracerProvider) {
	r := startReplicaTraced(b, 1, Config{MaxQueue: 8, MaxBatchTokens: 64, MaxSeqs: 4}, tp, viaLocal)
	ctx := context.Background()
	b.ReportAllocs()
	cpu0 := cpuTime()
	tokens := 0
	for i := 0; tokens < b.N; i++ {
		n := min(benchTokens, b.N-tokens)
		_, err := r.client.Generate(ctx, SubmitMsg{ID: fmt.Sprint("bench-", i), Prompt: []int32{473, 623}, MaxTokens: n, IgnoreEOS: true}, func(FrameMsg) error { return nil })
		if err != nil {
			b.Fatal(err)
		}
		tokens += n
	}
	perToken(b, cpu0)
}

func BenchmarkDecodeActorPath(b *testing.B) { benchActorPath(b, nil) }

func BenchmarkDecodeActorPathTraced(b *testing.B) {
	cfg := ttrace.DefaultConfig()
	p, err := ttrace.Setup(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		p.Shutdown(ctx)
	}()
	benchActorPath(b, p.TracerProvider())
}

// The actor path's own cost, measured on a model small enough that its
// forward pass takes a couple of hundred microseconds (the llama-gqa
// fixture: 2 layers, hidden 256): the difference between the direct and an
// actor-path benchmark's µs/token is what the scheduler, the KV-manager,
// the layer-shard and device actors and the client's frames on the bus add
// per token. ActorPath reaches the shard through its mailbox, as a node
// does with the shards of its own replicas; ActorPathBus over the bus, as
// with a shard on another node (here in the same process). Both have the
// client on the bus, as a gateway without replicas of its own;
// ActorPathLocalClient has it call the scheduler of its process
// (Client.Local), as the gateway of a node with replicas does.
//
//	go test -run XXX -bench 'Overhead' -benchtime 2048x -count 5 ./scheduler
func BenchmarkOverheadDirect(b *testing.B) {
	benchDirect(b, fixture(b, "llama-gqa"), []int32{1, 2}, 400)
}

func BenchmarkOverheadActorPath(b *testing.B)            { benchOverhead(b, viaLocal, submitBus) }
func BenchmarkOverheadActorPathBus(b *testing.B)         { benchOverhead(b, viaBus, submitBus) }
func BenchmarkOverheadActorPathLocalClient(b *testing.B) { benchOverhead(b, viaLocal, submitLocal) }

func benchOverhead(b *testing.B, local, submit bool) {
	r := startReplicaWith(b, fixture(b, "llama-gqa"), 1, Config{MaxQueue: 8, MaxBatchTokens: 64, MaxSeqs: 4}, nil, local)
	r.submitVia(submit)
	ctx := context.Background()
	b.ReportAllocs()
	cpu0 := cpuTime()
	tokens := 0
	for i := 0; tokens < b.N; i++ {
		n := min(400, b.N-tokens)
		_, err := r.client.Generate(ctx, SubmitMsg{ID: fmt.Sprint("o-", i), Prompt: []int32{1, 2}, MaxTokens: n, IgnoreEOS: true}, func(FrameMsg) error { return nil })
		if err != nil {
			b.Fatal(err)
		}
		tokens += n
	}
	perToken(b, cpu0)
}

// fixture opens one of the shared test checkpoints, skipping when absent.
func fixture(b *testing.B, name string) *models.Bundle {
	bundle, err := models.OpenDir(modeltest.MustShared(b, "fixtures", name))
	if err != nil {
		b.Fatal(err)
	}
	return bundle
}

// benchCPU is the CPU lane's configuration for benchmarks; TROUPE_THREADS
// overrides the thread count.
func benchCPU() cpu.Config {
	c := cpu.DefaultConfig()
	if n, err := strconv.Atoi(os.Getenv("TROUPE_THREADS")); err == nil {
		c.Threads = n
	}
	return c
}

// BenchmarkOverheadActors is the actor path without the client: requests
// go to the scheduler, and frames come back to a sink, in this process;
// the steps go to the layer-shard and KV-manager actors through their
// mailboxes.
func BenchmarkOverheadActors(b *testing.B) {
	r := startReplicaWith(b, fixture(b, "llama-gqa"), 1, Config{MaxQueue: 8, MaxBatchTokens: 64, MaxSeqs: 4}, nil, viaLocal)
	benchSubmit(b, r.sched)
}

// benchSubmit generates b.N tokens on s, in requests of up to 400.
func benchSubmit(b *testing.B, s *Scheduler) {
	b.ReportAllocs()
	cpu0 := cpuTime()
	tokens := 0
	for i := 0; tokens < b.N; i++ {
		n := min(400, b.N-tokens)
		final := make(chan Frame, 1)
		err := s.Submit(&Request{ID: fmt.Sprint("s-", i), Prompt: []int32{1, 2}, Params: greedy(n), Detok: nop{}, Sink: func(f Frame) {
			if f.Final {
				final <- f
			}
		}})
		if err != nil {
			b.Fatal(err)
		}
		if f := <-final; f.CompletionTokens != n {
			b.Fatalf("final frame %+v, want %d tokens", f, n)
		}
		tokens += n
	}
	perToken(b, cpu0)
}

// BenchmarkOverheadScheduler is the scheduler alone over the engine, with
// no actor and no bus: a local KV pool, the model called on the
// scheduler's goroutine, frames counted by the sink.
func BenchmarkOverheadScheduler(b *testing.B) {
	bundle := fixture(b, "llama-gqa")
	defer bundle.Close()
	dev, err := cpu.New(benchCPU())
	if err != nil {
		b.Fatal(err)
	}
	defer dev.Close()
	cfg := Config{MaxQueue: 8, MaxBatchTokens: 64, MaxSeqs: 4}
	m, err := models.Load(bundle.Config, bundle.Checkpoint, dev, models.Options{MaxTokens: cfg.MaxBatchTokens, MaxSeqs: cfg.MaxSeqs})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	const blocks = 256
	cache, err := m.NewCache(blocks, 16)
	if err != nil {
		b.Fatal(err)
	}
	defer cache.Close()
	kv, _ := NewKV(blocks, 16)
	cfg.Vocab, cfg.Context, cfg.EOS = bundle.Config.Vocab, bundle.Config.MaxPositions, bundle.Config.EOS
	s, err := New(cfg, &ModelEngine{Model: m, Cache: cache}, kv, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	benchSubmit(b, s)
}

// BenchmarkFrameTrip is one token frame's trip from a scheduler's sink to
// the client's emit, and nothing else: on the bus (the frame published on
// its tokens subject, read and decoded by the client, as Client.Generate
// without Local) and in memory (the queue of Client.Local). The sender
// waits for each frame's emit before it sends the next, as tokens a
// forward pass apart do, so each trip includes its wake-ups.
//
//	go test -run XXX -bench FrameTrip -count 5 ./scheduler
func BenchmarkFrameTrip(b *testing.B) {
	frame := FrameMsg{ID: 17, Text: " kernel", Logprob: -0.25, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", QueuedUS: 12, SinceStartUS: 3456, SinceLastUS: 250}
	b.Run("bus", func(b *testing.B) {
		_, nc := testBus(b)
		subj, _ := bus.NewSubjects("bench")
		subject := subj.Tokens("trip")
		sub, err := nc.SubscribeSync(subject)
		if err != nil {
			b.Fatal(err)
		}
		defer sub.Unsubscribe()
		benchTrip(b, frame, func(f FrameMsg) { _ = bus.Publish(b.Context(), nc, subject, f) }, nextFrame(sub))
	})
	b.Run("local", func(b *testing.B) {
		q := &frameQueue{ready: make(chan struct{}, 1)}
		benchTrip(b, frame, q.put, q.next)
	})
}

// benchTrip sends b.N frames through put and relays them from next.
func benchTrip(b *testing.B, frame FrameMsg, put func(FrameMsg), next func(context.Context) (FrameMsg, error)) {
	b.ReportAllocs()
	ack := make(chan struct{})
	done := make(chan struct{})
	n := b.N
	cpu0 := cpuTime()
	b.ResetTimer()
	go func() {
		defer close(done)
		for i := 1; i <= n; i++ {
			f := frame
			f.Seq = i
			if i == n {
				f.Final, f.Reason = true, "length"
			}
			put(f)
			<-ack
		}
	}()
	_, err := relay(context.Background(), next, func() {}, func(FrameMsg) error {
		ack <- struct{}{}
		return nil
	})
	<-done
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	perToken(b, cpu0)
}

// The scheduler's host work a token on the logits path (a step the
// engine cannot choose for: a grammar's host draws), at OLMo 2's vocabulary of 100,352: an engine
// that computes nothing copies a fixed row of logits into each step's
// output, and the scheduler samples, takes the log-probabilities and
// emits. What a served token on that path costs beyond the device's step
// and the row's read. LogprobsChosen is a step the engine chooses for
// (ChooseEngine) that reads the row beside its token: the host's share of
// a served greedy token that reports log-probabilities.
//
//	go test -run XXX -bench 'HostStep' -benchtime 2000x ./scheduler
func BenchmarkHostStepGreedy(b *testing.B) { benchHostStep(b, generate.Params{}, false) }

func BenchmarkHostStepLogprobs(b *testing.B) {
	benchHostStep(b, generate.Params{Logprobs: true, TopLogprobs: 5}, false)
}

func BenchmarkHostStepLogprobsChosen(b *testing.B) {
	benchHostStep(b, generate.Params{Logprobs: true, TopLogprobs: 5}, true)
}

func BenchmarkHostStepDrawn(b *testing.B) {
	benchHostStep(b, generate.Params{Params: sample.Params{Temperature: 0.8, TopP: 0.9, Seed: new(int64)}}, false)
}

// rowEngine is an Engine whose every logits row is row.
type rowEngine struct{ row []float32 }

func (e rowEngine) Forward(ctx context.Context, b *models.Batch, logits []float32) error {
	for i := range b.Logits {
		copy(logits[i*len(e.row):], e.row)
	}
	return nil
}

// chosenRowEngine is a rowEngine that chooses each row's token, the
// row's argmax, and returns the rows a step reads (ChooseEngine).
type chosenRowEngine struct {
	rowEngine
	id int32
}

func (e chosenRowEngine) ForwardArgmax(ctx context.Context, b *models.Batch, ids []int32) error {
	return e.ForwardChoose(ctx, b, nil, ids, nil)
}

func (e chosenRowEngine) ForwardChoose(_ context.Context, b *models.Batch, _ []gpu.SampleRow, ids []int32, logits []float32) error {
	for i := range b.Logits {
		ids[i] = e.id
	}
	for k := range b.Read {
		copy(logits[k*len(e.row):], e.row)
	}
	return nil
}

func benchHostStep(b *testing.B, p generate.Params, chosen bool) {
	const vocab = 100352
	row := make([]float32, vocab)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range row {
		row[i] = float32(r.NormFloat64() * 3)
	}
	kv, err := NewKV(4096, 16)
	if err != nil {
		b.Fatal(err)
	}
	var e Engine = rowEngine{row}
	if chosen {
		id := make([]int32, 1)
		models.ArgmaxRows(id, row, vocab)
		e = chosenRowEngine{rowEngine{row}, id[0]}
	}
	s, err := New(Config{MaxQueue: 8, MaxBatchTokens: 64, MaxSeqs: 4, Vocab: vocab, Context: 1 << 16}, e, kv, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	p.IgnoreEOS = true
	cpu0 := cpuTime()
	for i, tokens := 0, 0; tokens < b.N; i++ {
		p.MaxTokens = min(1000, b.N-tokens)
		c := newCollect()
		if err := s.Submit(&Request{ID: fmt.Sprint("h-", i), Prompt: []int32{1, 2}, Params: p, Detok: nop{}, Sink: c.sink}); err != nil {
			b.Fatal(err)
		}
		if f := c.wait(b); len(f) != p.MaxTokens || f[len(f)-1].Err != "" {
			b.Fatalf("%d frames, the last %+v", len(f), f[len(f)-1])
		}
		tokens += p.MaxTokens
	}
	perToken(b, cpu0)
}
