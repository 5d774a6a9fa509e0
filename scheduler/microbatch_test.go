package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/troupe/troupe/actors"
	"github.com/troupe/troupe/bus"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/demo"
	ttrace "github.com/troupe/troupe/trace"
	"github.com/troupe/troupe/xgmi"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// row is one batch row as a model sees it: its token, position, and the
// first block of its sequence's table (which names the sequence).
type row struct{ tok, pos, block int32 }

func rowsOf(b *models.Batch) []row {
	var rs []row
	for i := range b.Pos {
		r := row{pos: b.Pos[i], block: b.Tables[b.Seq[i]][0]}
		if len(b.Tokens) > 0 {
			r.tok = b.Tokens[i]
		}
		rs = append(rs, r)
	}
	return rs
}

func TestSplitMicroBatches(t *testing.T) {
	tables := func(n int) [][]int32 {
		var ts [][]int32
		for s := range n {
			ts = append(ts, []int32{int32(100 + s), int32(200 + s)})
		}
		return ts
	}
	decode := &models.Batch{Tokens: []int32{10, 11, 12, 13, 14, 15, 16, 17}, Pos: []int32{5, 6, 7, 8, 9, 10, 11, 12},
		Seq: []int32{0, 1, 2, 3, 4, 5, 6, 7}, Tables: tables(8), Logits: []int32{0, 1, 2, 3, 4, 5, 6, 7}}
	// A prefill chunk of 6 tokens of sequence 1 among decode rows, rows of
	// a sequence not together, logits wanted out of row order.
	mixed := &models.Batch{Tokens: []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}, Pos: []int32{40, 0, 1, 2, 3, 4, 5, 9, 41},
		Seq: []int32{0, 1, 1, 1, 1, 1, 1, 2, 3}, Tables: tables(4), Logits: []int32{8, 6, 0, 7}}
	for _, c := range []struct {
		name  string
		b     *models.Batch
		n     int
		sizes []int // rows per micro-batch; nil: not cut
	}{
		{"decode 8 in 3", decode, 3, []int{3, 2, 3}},
		{"decode 8 in 2", decode, 2, []int{4, 4}},
		{"decode 8 in 8", decode, 8, []int{1, 1, 1, 1, 1, 1, 1, 1}},
		{"decode 8 in 12", decode, 12, []int{1, 1, 1, 1, 1, 1, 1, 1}},
		{"prefill chunk among decodes in 3", mixed, 3, []int{1, 6, 2}},
		{"prefill chunk among decodes in 2", mixed, 2, []int{7, 2}},
		{"off", decode, 1, nil},
		{"one sequence", &models.Batch{Tokens: []int32{1, 2}, Pos: []int32{0, 1}, Seq: []int32{0, 0}, Tables: tables(1), Logits: []int32{1}}, 3, nil},
		{"a sequence without rows", &models.Batch{Tokens: []int32{1, 2}, Pos: []int32{0, 1}, Seq: []int32{0, 2}, Tables: tables(3), Logits: []int32{1}}, 3, nil},
		{"sequence out of range", &models.Batch{Tokens: []int32{1, 2}, Pos: []int32{0, 1}, Seq: []int32{0, 2}, Tables: tables(2), Logits: []int32{1}}, 2, nil},
		{"logits row out of range", &models.Batch{Tokens: []int32{1, 2}, Pos: []int32{0, 1}, Seq: []int32{0, 1}, Tables: tables(2), Logits: []int32{2}}, 2, nil},
		{"tokens and positions disagree", &models.Batch{Tokens: []int32{1}, Pos: []int32{0, 1}, Seq: []int32{0, 1}, Tables: tables(2), Logits: []int32{1}}, 2, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			var mp microPlan
			for range 2 { // the second time in the memory of the first
				parts := mp.split(c.b, c.n)
				if c.sizes == nil {
					if parts != nil {
						t.Fatalf("cut into %d micro-batches, want the batch whole", len(parts))
					}
					return
				}
				var sizes []int
				var rows []row
				logits := make([]row, len(c.b.Logits))
				seen := make([]bool, len(c.b.Logits))
				for m, p := range parts {
					sizes = append(sizes, len(p.b.Pos))
					if err := checkIndexes(&p.b); err != nil {
						t.Fatalf("micro-batch %d: %v", m, err)
					}
					mine := rowsOf(&p.b)
					rows = append(rows, mine...)
					if len(p.rows) != len(p.b.Logits) {
						t.Fatalf("micro-batch %d: %d logits rows, %d batch rows for them", m, len(p.b.Logits), len(p.rows))
					}
					for k, j := range p.rows {
						if seen[j] {
							t.Fatalf("batch logits row %d filled twice", j)
						}
						seen[j] = true
						logits[j] = mine[p.b.Logits[k]]
					}
				}
				if !slices.Equal(sizes, c.sizes) {
					t.Errorf("rows per micro-batch %v, want %v", sizes, c.sizes)
				}
				// Every row once, a sequence's rows in their order.
				all := rowsOf(c.b)
				for _, block := range []int32{100, 101, 102, 103, 104, 105, 106, 107} {
					of := func(rs []row) []row {
						return slices.DeleteFunc(slices.Clone(rs), func(r row) bool { return r.block != block })
					}
					if got, want := of(rows), of(all); !slices.Equal(got, want) {
						t.Errorf("rows of the sequence at block %d: got %v, want %v", block, got, want)
					}
				}
				for j, r := range c.b.Logits {
					if logits[j] != all[r] {
						t.Errorf("logits row %d stands for %v, want %v", j, logits[j], all[r])
					}
				}
			}
		})
	}
}

// TestSplitRandomBatches: any batch of n or more sequences, each with rows,
// is cut into n micro-batches that a model accepts.
func TestSplitRandomBatches(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var mp microPlan
	for range 2000 {
		nseq, n := 1+rng.IntN(12), 1+rng.IntN(6)
		b := &models.Batch{}
		for s := range nseq {
			b.Tables = append(b.Tables, []int32{int32(s)})
			for range 1 + rng.IntN(5) {
				b.Seq = append(b.Seq, int32(s))
			}
		}
		rng.Shuffle(len(b.Seq), func(i, j int) { b.Seq[i], b.Seq[j] = b.Seq[j], b.Seq[i] })
		for i := range b.Seq {
			b.Pos = append(b.Pos, int32(i))
			b.Tokens = append(b.Tokens, int32(i))
			if rng.IntN(3) == 0 {
				b.Logits = append(b.Logits, int32(i))
			}
		}
		parts := mp.split(b, n)
		if want := min(n, nseq); want < 2 {
			if parts != nil {
				t.Fatalf("%d sequences in %d: cut into %d", nseq, n, len(parts))
			}
			continue
		} else if len(parts) != want {
			t.Fatalf("%d sequences (%v) in %d: %d micro-batches, want %d", nseq, b.Seq, n, len(parts), want)
		}
		rows, logits := 0, 0
		for m, p := range parts {
			if err := checkIndexes(&p.b); err != nil {
				t.Fatalf("%d sequences (%v) in %d, micro-batch %d: %v", nseq, b.Seq, n, m, err)
			}
			rows += len(p.b.Pos)
			logits += len(p.rows)
		}
		if rows != len(b.Pos) || logits != len(b.Logits) {
			t.Fatalf("%d rows and %d logits rows in the micro-batches, want %d and %d", rows, logits, len(b.Pos), len(b.Logits))
		}
	}
}

// checkIndexes checks a micro-batch's indexes as a model would.
func checkIndexes(b *models.Batch) error {
	if len(b.Pos) == 0 || len(b.Seq) != len(b.Pos) || (len(b.Tokens) != 0 && len(b.Tokens) != len(b.Pos)) {
		return fmt.Errorf("%d tokens, %d positions, %d sequence indexes", len(b.Tokens), len(b.Pos), len(b.Seq))
	}
	used := make([]bool, len(b.Tables))
	for _, s := range b.Seq {
		if s < 0 || int(s) >= len(b.Tables) {
			return fmt.Errorf("sequence %d of %d", s, len(b.Tables))
		}
		used[s] = true
	}
	if slices.Contains(used, false) {
		return fmt.Errorf("a table without rows: %v", used)
	}
	for _, r := range b.Logits {
		if r < 0 || int(r) >= len(b.Pos) {
			return fmt.Errorf("logits row %d of %d", r, len(b.Pos))
		}
	}
	return nil
}

func TestOutputName(t *testing.T) {
	for _, c := range []struct {
		id    string
		micro int
		want  string
	}{{"r0-1", 0, "shard/r0-1"}, {"r0-1", 1, "shard/r0-1/micro/0"}, {"r0-1", 3, "shard/r0-1/micro/2"}} {
		if got := outputName(c.id, c.micro); got != c.want {
			t.Errorf("outputName(%q, %d) = %q, want %q", c.id, c.micro, got, c.want)
		}
	}
}

// fakeStage is a stage that passes on one float per row standing for the
// row (its position and its sequence's first block), checking that its
// input stands for the same rows; the last stage writes logits rows of
// [position, block]. Stage 0 holds micro-batch 1 back until stage 1 has
// started micro-batch 0: it gets there only if the stages overlap.
type fakeStage struct {
	index, stages int
	plane         *xgmi.Host
	overlap       chan struct{} // closed by stage 1 at micro-batch 0; nil: no holding back
	failAt        int           // a ForwardMsg.Micro this stage fails, with code unavailable
	mu            *sync.Mutex
	seen          *[]string // "stage/micro", in the order they ran
}

func (f fakeStage) Receive(_ context.Context, c ShardCall) error {
	m := c.Req
	f.mu.Lock()
	*f.seen = append(*f.seen, fmt.Sprintf("%d/%d", f.index, m.Micro))
	f.mu.Unlock()
	if f.failAt != 0 && m.Micro == f.failAt {
		return c.Fail(bus.Errorf(bus.CodeUnavailable, "stage %d: injected failure", f.index))
	}
	if f.overlap == nil {
		// No holding back.
	} else if f.index == 1 && m.Micro == 1 {
		close(f.overlap)
	} else if f.index == 0 && m.Micro == 2 {
		select {
		case <-f.overlap:
		case <-c.Context().Done():
			return c.Fail(fmt.Errorf("stage 1 did not start micro-batch 0 while stage 0 waited: %w", c.Context().Err()))
		}
	}
	id := func(i int) float32 { return float32(m.Pos[i]*1000 + m.Tables[m.Seq[i]][0]) }
	if f.index > 0 {
		if want := outputName(fmt.Sprint(f.index-1), m.Micro); m.Input.Buffer != want {
			return c.Fail(fmt.Errorf("stage %d reads %s, want %s", f.index, m.Input.Buffer, want))
		}
		in, err := f.plane.Read(m.Input.Buffer, 0, int(m.Input.Bytes/4))
		if err != nil {
			return c.Fail(err)
		}
		for i := range m.Pos {
			if in[i] != id(i) {
				return c.Fail(fmt.Errorf("stage %d, micro-batch %d, row %d: input %v, want %v", f.index, m.Micro, i, in[i], id(i)))
			}
		}
	}
	var out []float32
	if f.index < f.stages-1 {
		for i := range m.Pos {
			out = append(out, id(i))
		}
	} else {
		for _, r := range m.Logits {
			out = append(out, float32(m.Pos[r]), float32(m.Tables[m.Seq[r]][0]))
		}
	}
	name := outputName(fmt.Sprint(f.index), m.Micro)
	f.plane.Publish(name, out)
	return c.Reply(ForwardReply{Output: bus.TensorRef{Location: bus.LocationHost, Node: f.plane.Node(), Buffer: name, Bytes: uint64(4 * len(out)), DType: bus.F32, Shape: []int64{int64(len(out))}}})
}

// TestWavefront: micro-batches go through the stages in order, stage 0
// working on micro-batch 1 while stage 1 works on 0; each stage reads the
// previous one's output of the same micro-batch; the logits come back in
// the batch's order.
func TestWavefront(t *testing.T) {
	ctx := context.Background()
	const stages = 3
	var mu sync.Mutex
	var seen []string
	overlap := make(chan struct{})
	pipe := fakePipeline(t, stages, func(i int) fakeStage {
		return fakeStage{index: i, stages: stages, overlap: overlap, mu: &mu, seen: &seen}
	})
	pipe.MicroBatches = 0 // one per stage
	b := wavefrontBatch()
	logits := make([]float32, 2*len(b.Logits))
	sctx, cancel := context.WithTimeout(ctx, time.Minute) // a bound on a failure, not a measure
	defer cancel()
	if err := pipe.Forward(sctx, b, logits); err != nil {
		t.Fatal(err)
	}
	checkLogits(t, b, logits)
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != stages*stages {
		t.Fatalf("stage passes %v, want %d", seen, stages*stages)
	}
	for s := range stages {
		var order []string
		for _, e := range seen {
			if e[0] == byte('0'+s) {
				order = append(order, e)
			}
		}
		if want := []string{fmt.Sprintf("%d/1", s), fmt.Sprintf("%d/2", s), fmt.Sprintf("%d/3", s)}; !slices.Equal(order, want) {
			t.Errorf("stage %d ran %v, want %v", s, order, want)
		}
	}
}

// wavefrontBatch is a step of six sequences, one a prefill chunk of three
// rows, wanting logits out of row order.
func wavefrontBatch() *models.Batch {
	b := &models.Batch{Tokens: []int32{1, 2, 3, 4, 5, 6, 7, 8}, Pos: []int32{7, 0, 1, 2, 9, 4, 5, 6},
		Seq: []int32{0, 1, 1, 1, 2, 3, 4, 5}, Logits: []int32{7, 0, 3, 4, 5, 6}}
	for s := range 6 {
		b.Tables = append(b.Tables, []int32{int32(10 + s)})
	}
	return b
}

// checkLogits checks the fake stages' logits: row j stands for the batch
// row b.Logits[j].
func checkLogits(t *testing.T, b *models.Batch, logits []float32) {
	t.Helper()
	for j, r := range b.Logits {
		got := logits[2*j : 2*j+2]
		if want := []float32{float32(b.Pos[r]), float32(b.Tables[b.Seq[r]][0])}; !slices.Equal(got, want) {
			t.Errorf("logits row %d: got %v, want %v", j, got, want)
		}
	}
}

// fakePipeline is a pipeline of fake stages reached through their
// mailboxes, over an embedded bus; the vocabulary has 2 entries.
func fakePipeline(t *testing.T, stages int, stage func(i int) fakeStage) *Pipeline {
	t.Helper()
	ctx := context.Background()
	node, nc := testBus(t)
	sys, err := actors.NewSystem(actors.Config{Cluster: "test", Node: node.Name()}, nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sys.Shutdown(ctx) })
	plane := xgmi.NewHost(node.Name())
	var subjects []string
	for i := range stages {
		subjects = append(subjects, fmt.Sprintf("unused.%d", i))
	}
	pipe := NewPipeline(nc, subjects, plane, 2)
	for i := range stages {
		f := stage(i)
		f.plane = plane
		ref, err := actors.Spawn(ctx, sys, actors.Props[ShardCall]{Kind: ShardKind, ID: fmt.Sprint(i), New: func() actors.Actor[ShardCall] { return f }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ref.Stop(ctx) })
		if err := pipe.Local(i, ref); err != nil {
			t.Fatal(err)
		}
	}
	return pipe
}

// TestWavefrontStageFails: a stage failing a micro-batch fails the step
// with its error and code; the other stages stop, and the next step runs.
func TestWavefrontStageFails(t *testing.T) {
	const stages = 3
	var mu sync.Mutex
	var seen []string
	pipe := fakePipeline(t, stages, func(i int) fakeStage {
		f := fakeStage{index: i, stages: stages, mu: &mu, seen: &seen}
		if i == 1 {
			f.failAt = 2
		}
		return f
	})
	pipe.MicroBatches = 0
	b := wavefrontBatch()
	logits := make([]float32, 2*len(b.Logits))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a bound on a failure, not a measure
	defer cancel()
	err := pipe.Forward(ctx, b, logits)
	var be *bus.Error
	if !errors.As(err, &be) || be.Code != bus.CodeUnavailable || !strings.Contains(err.Error(), "pipeline stage 1, micro-batch 1") {
		t.Fatalf("got %v, want stage 1's unavailable error at micro-batch 1", err)
	}
	mu.Lock()
	ran := slices.Clone(seen)
	mu.Unlock()
	if slices.Contains(ran, "2/2") || slices.Contains(ran, "2/3") || slices.Contains(ran, "1/3") {
		t.Errorf("stages ran %v after stage 1 failed micro-batch 1", ran)
	}
	// The next step, not cut: stage 1 fails only micro-batch 1.
	pipe.MicroBatches = 1
	clear(logits)
	if err := pipe.Forward(ctx, b, logits); err != nil {
		t.Fatal(err)
	}
	checkLogits(t, b, logits)
}

// TestPipelineMicroBatches serves the demo model as a three-stage pipeline
// at batch 8 with micro-batching on, and expects the reference's tokens
// from every request, whichever way the pipeline reaches its stages; the
// shards' spans show the micro-batches.
func TestPipelineMicroBatches(t *testing.T) {
	t.Run("local", func(t *testing.T) { testPipelineMicroBatches(t, viaLocal) })
	t.Run("bus", func(t *testing.T) { testPipelineMicroBatches(t, viaBus) })
}

func testPipelineMicroBatches(t *testing.T, local bool) {
	samples := demoSamples(t)
	b, err := models.OpenFS(demo.Name, demo.FS(), demo.Weights())
	if err != nil {
		t.Fatal(err)
	}
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	r := startReplicaWith(t, b, 3, Config{MaxQueue: 64, MaxBatchTokens: 64, MaxSeqs: 8}, tp, local, func(p *Pipeline, _ *Shard) {
		if p != nil {
			p.MicroBatches = 0
		}
	})
	const streams = 8
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for i := range streams {
		s := samples[i%len(samples)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			var got []int32
			_, err := r.client.Generate(context.Background(), SubmitMsg{ID: fmt.Sprint(i), Prompt: s.PromptIDs, MaxTokens: len(s.GreedyIDs), IgnoreEOS: true}, func(f FrameMsg) error {
				got = append(got, f.ID)
				return nil
			})
			if err != nil {
				errs <- err
				return
			}
			if !slices.Equal(got, s.GreedyIDs) {
				errs <- fmt.Errorf("request %d: got %v, want %v", i, got, s.GreedyIDs)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Every stage ran micro-batches 0, 1 and 2, each pass in a span.
	passes := map[string]int{}
	for _, sp := range sr.Ended() {
		if sp.Name() != SpanShard {
			continue
		}
		stage, micro := -1, -1
		for _, kv := range sp.Attributes() {
			switch kv.Key {
			case AttrMicroBatch:
				micro = int(kv.Value.AsInt64())
			case ttrace.AttrShardIndex:
				stage = int(kv.Value.AsInt64())
			}
		}
		if micro >= 0 {
			passes[fmt.Sprintf("%d/%d", stage, micro)]++
		}
	}
	for s := range 3 {
		for m := range 3 {
			if passes[fmt.Sprintf("%d/%d", s, m)] == 0 {
				t.Errorf("no shard.forward span of stage %d, micro-batch %d: %v", s, m, passes)
			}
		}
	}
}
