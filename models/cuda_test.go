//go:build cuda

package models_test

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/cuda"
	"github.com/troupe/troupe/gpu/gputest"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/modeltest"
	"github.com/troupe/troupe/models/safetensors"
	"github.com/troupe/troupe/models/synth"
)

// The CUDA lane runs with a bf16 KV cache, as the command line does: its
// logits agree with the references to 1e-2, and a greedy step may differ
// only where the model's own top-2 gap is below 2e-2.
func init() {
	extraLanes = append(extraLanes, lane{name: "cuda", open: openCUDA, tol: 1e-2, margin: 2e-2, cache: gpu.BF16})
}

func openCUDA(t testing.TB) gpu.Device {
	t.Helper()
	d, err := cuda.Open(context.Background(), cudaConfig())
	if err != nil {
		t.Fatalf("cuda: %v", err)
	}
	return d
}

// TestCUDAGraphsMatchEager checks that recorded and replayed steps give the
// logits of the same operations issued one by one, bit for bit, and that the
// device-side greedy choice (FeedArgmax) follows the same path as the host's
// argmax of the logits.
// The demo model and each shared fixture present (OLMo 2's QK-norm, Qwen 3's
// per-head norm, grouped-query llama) are checked.
func TestCUDAGraphsMatchEager(t *testing.T) {
	t.Run("demo", func(t *testing.T) {
		b := openDemo(t)
		graphsMatchEager(t, b.Config, b.Checkpoint)
	})
	for _, name := range []string{"llama-gqa", "olmo2", "qwen3", "qwen3-moe"} {
		t.Run(name, func(t *testing.T) {
			dir := modeltest.Shared(t, "fixtures", name)
			if dir == "" {
				t.Skip("shared fixture not present")
			}
			cfg, err := models.ReadConfig(dir)
			if err != nil {
				t.Fatal(err)
			}
			graphsMatchEager(t, cfg, openCheckpoint(t, dir))
		})
	}
}

func graphsMatchEager(t *testing.T, cfg *models.Config, ckpt *safetensors.Checkpoint) {
	ctx := context.Background()
	dev := openCUDA(t)
	defer dev.Close()
	load := func(eager bool) *models.Model {
		m, err := models.Load(cfg, ckpt, dev, models.Options{MaxTokens: 64, CacheDType: gpu.BF16, Eager: eager})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	graphed, eager, fast := load(false), load(true), load(false)
	prompt := []int32{1, 450, 846, 338, 263, 2987, 17, 2988}
	for i := range prompt {
		prompt[i] %= int32(cfg.Vocab)
	}
	const steps = 24
	seqs := make([]*models.Sequence, 3)
	for i, m := range []*models.Model{graphed, eager, fast} {
		s, err := m.NewSequence(len(prompt) + steps + 1)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		seqs[i] = s
	}
	feed := func(s *models.Sequence, ids []int32) []float32 {
		out, err := s.Feed(ctx, ids, false)
		if err != nil {
			t.Fatal(err)
		}
		return append([]float32(nil), out...)
	}
	g, e := feed(seqs[0], prompt), feed(seqs[1], prompt)
	next, err := seqs[2].FeedArgmax(ctx, prompt)
	if err != nil {
		t.Fatal(err)
	}
	for step := range steps {
		for j := range g {
			if g[j] != e[j] {
				t.Fatalf("step %d: logit %d replayed %v, eager %v", step, j, g[j], e[j])
			}
		}
		want := int32(argmax(g))
		if next != want {
			t.Fatalf("step %d: device argmax %d, host argmax of the logits %d", step, next, want)
		}
		g, e = feed(seqs[0], []int32{want}), feed(seqs[1], []int32{want})
		if next, err = seqs[2].FeedArgmax(ctx, []int32{want}); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range []*models.Model{graphed, fast} {
		if err := m.GraphError(); err != nil {
			t.Fatalf("steps were not recorded: %v", err)
		}
		if m.Graphs() == 0 {
			t.Fatal("no step was recorded")
		}
	}
	if eager.Graphs() != 0 {
		t.Fatalf("the eager model recorded %d steps", eager.Graphs())
	}
}

// TestCUDABatchedArgmax decodes three sequences in one step and checks each
// row's device argmax against the same sequence decoded alone.
func TestCUDABatchedArgmax(t *testing.T) {
	b := openDemo(t)
	batchedMatchesAlone(t, b.Config, b.Checkpoint)
}

// TestCUDAWideShapes runs the replay and batch checks on two layers of
// OLMo-2-7B's widths (hidden 4,096, 32 heads, ffn 11,008; random weights,
// a vocabulary of 1,024): rows of 4,096 take the norms' 1,024 threads, and
// the products take the 7B splits of the GEMVs and the skinny kernels,
// widths neither the demo nor the fixtures reach.
func TestCUDAWideShapes(t *testing.T) {
	cfg, ckpt := synthOLMo2(t, synth.OLMo2(4096, 2, 32, 11008), 1024, 7)
	graphsMatchEager(t, cfg, ckpt)
	batchedMatchesAlone(t, cfg, ckpt)
}

// synthOLMo2 writes p's random weights (seed) with a vocabulary of vocab
// tokens and opens them for the rest of the test.
func synthOLMo2(t *testing.T, p synth.Preset, vocab int, seed uint64) (*models.Config, *safetensors.Checkpoint) {
	t.Helper()
	p["vocab_size"] = vocab
	dir := t.TempDir()
	cfg, err := p.Write(dir, seed, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, openCheckpoint(t, dir)
}

// openCheckpoint opens the checkpoint in dir for the rest of the test.
func openCheckpoint(t *testing.T, dir string) *safetensors.Checkpoint {
	t.Helper()
	ckpt, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ckpt.Close() })
	return ckpt
}

// batchedMatchesAlone decodes three sequences in one step and checks each
// row's device argmax against the same sequence decoded alone, where the
// model's own top-2 gap is not a tie.
func batchedMatchesAlone(t *testing.T, cfg *models.Config, ckpt *safetensors.Checkpoint) {
	ctx := context.Background()
	dev := openCUDA(t)
	defer dev.Close()
	m, err := models.Load(cfg, ckpt, dev, models.Options{MaxTokens: 64, CacheDType: gpu.BF16})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	prompts := [][]int32{{1, 450, 846}, {1, 2987, 17, 2988, 338}, {1, 263}}
	for _, p := range prompts {
		for i := range p {
			p[i] %= int32(cfg.Vocab)
		}
	}
	const steps, bs, per = 8, 16, 1
	cache, err := m.NewCache(len(prompts)*per, bs)
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close()
	var tables [][]int32
	next := make([]int32, len(prompts))
	alone := make([][]int32, len(prompts))
	margins := make([][]float64, len(prompts))
	for s, p := range prompts {
		tables = append(tables, []int32{int32(s)})
		batch := &models.Batch{Tables: tables[s : s+1], Tokens: p, Logits: []int32{int32(len(p) - 1)}}
		for i := range p {
			batch.Pos = append(batch.Pos, int32(i))
			batch.Seq = append(batch.Seq, 0)
		}
		if err := m.ForwardArgmax(ctx, cache, batch, next[s:s+1]); err != nil {
			t.Fatal(err)
		}
		seq, err := m.NewSequence(bs)
		if err != nil {
			t.Fatal(err)
		}
		logits, err := seq.Feed(ctx, p, false)
		for i := 0; i < steps && err == nil; i++ {
			tok := int32(argmax(logits))
			alone[s] = append(alone[s], tok)
			margins[s] = append(margins[s], margin(logits, int(tok)))
			logits, err = seq.Feed(ctx, []int32{tok}, false)
		}
		seq.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	step := &models.Batch{Tables: tables, Seq: []int32{0, 1, 2}, Logits: []int32{0, 1, 2}, Pos: make([]int32, 3)}
	diverged := make([]bool, len(prompts))
	for i := range steps {
		for s := range prompts {
			if !diverged[s] && next[s] != alone[s][i] {
				if margins[s][i] >= greedyTolerance {
					t.Fatalf("step %d sequence %d: batched %d, alone %d (margin %.3g)", i, s, next[s], alone[s][i], margins[s][i])
				}
				t.Logf("step %d sequence %d: tie (margin %.2g)", i, s, margins[s][i])
				diverged[s] = true
			}
			step.Pos[s] = int32(len(prompts[s]) + i)
		}
		step.Tokens = next
		if err := m.ForwardArgmax(ctx, cache, step, next); err != nil {
			t.Fatal(err)
		}
	}
}

// margin is the gap between logit best and the largest other logit.
func margin(logits []float32, best int) float64 {
	second := math.Inf(-1)
	for j, v := range logits {
		if j != best {
			second = math.Max(second, float64(v))
		}
	}
	return float64(logits[best]) - second
}

// TestCUDALongPrompt feeds prompts longer than a recorded step (the prompt
// GEMM and the tensor-core prompt attention) to the demo model on the GPU
// and on the CPU lane: one prompt alone, then two prompts and a decode
// token in one step, and compares every row's logits.
func TestCUDALongPrompt(t *testing.T) {
	ctx := context.Background()
	bundle := openDemo(t)
	i := slices.IndexFunc(extraLanes, func(ln lane) bool { return ln.name == "cpu" })
	if i < 0 {
		t.Fatal("no CPU lane to compare with")
	}
	cpuDev := extraLanes[i].open(t)
	defer cpuDev.Close()
	gpuDev := openCUDA(t)
	defer gpuDev.Close()
	opts := models.Options{MaxTokens: 512, CacheDType: gpu.BF16}
	load := func(dev gpu.Device) *models.Model {
		m, err := models.Load(bundle.Config, bundle.Checkpoint, dev, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	mc, mg := load(cpuDev), load(gpuDev)
	vocab := mg.Config.Vocab
	prompt := func(n, seed int) []int32 {
		p := make([]int32, n)
		for i := range p {
			p[i] = int32((i*7919 + seed*104729 + 13) % vocab)
		}
		return p
	}
	// step builds a batch over sequences s with prompts ps starting at
	// positions starts, asking logits for every token.
	step := func(ps [][]int32, starts []int) *models.Batch {
		b := &models.Batch{}
		for s, p := range ps {
			table := make([]int32, 8) // 512 positions
			for j := range table {
				table[j] = int32(s*32 + j)
			}
			b.Tables = append(b.Tables, table)
			for i, id := range p {
				b.Tokens = append(b.Tokens, id)
				b.Pos = append(b.Pos, int32(starts[s]+i))
				b.Seq = append(b.Seq, int32(s))
				b.Logits = append(b.Logits, int32(len(b.Tokens)-1))
			}
		}
		return b
	}
	run := func(m *models.Model, steps []*models.Batch) [][]float32 {
		cache, err := m.NewCache(3*32, 64)
		if err != nil {
			t.Fatal(err)
		}
		defer cache.Close()
		var out [][]float32
		for _, b := range steps {
			logits := make([]float32, len(b.Logits)*vocab)
			if err := m.Forward(ctx, cache, b, logits); err != nil {
				t.Fatal(err)
			}
			for r := range b.Logits {
				out = append(out, append([]float32(nil), logits[r*vocab:(r+1)*vocab]...))
			}
		}
		return out
	}
	a, b, c := prompt(200, 1), prompt(150, 2), prompt(40, 3)
	steps := []*models.Batch{
		step([][]int32{a}, []int{0}),                                   // one prompt of 200
		step([][]int32{{a[0]}, b, c}, []int{200, 0, 0}),                // a decode token and two prompts
		step([][]int32{prompt(90, 4), {b[0]}, c}, []int{201, 150, 40}), // a continued prompt among others
	}
	got, want := run(mg, steps), run(mc, steps)
	if len(got) != len(want) {
		t.Fatalf("%d rows of logits, want %d", len(got), len(want))
	}
	// The GPU rounds activations, queries and attention weights to bf16
	// for the tensor cores: single rows may reach 2e-2 on these random
	// prompts, the mean stays well below the fixtures' 1e-2.
	worst, sum := 0.0, 0.0
	for r := range got {
		e := gputest.RelL2(got[r], want[r])
		worst, sum = max(worst, e), sum+e
		if !(e <= 2e-2) {
			t.Errorf("row %d: logits relative L2 %.3g from the CPU lane", r, e)
		}
	}
	mean := sum / float64(len(got))
	t.Logf("%d rows: mean relative L2 %.3g, worst %.3g", len(got), mean, worst)
	if !(mean <= 5e-3) {
		t.Errorf("mean relative L2 %.3g, want <= 5e-3", mean)
	}
}

// TestCUDASampleMatchesHost: tokens drawn on the GPU (ForwardSample, the
// logits never read back) equal those drawn on the host from the same
// step's logits (gpu.SampleHost), for a batch of five sequences with
// greedy, unfiltered, top-k/top-p/min-p and whole-row top-p and min-p
// draws, over several steps of the
// olmo2 fixture; where moving u by 1e-9 changes the host's choice either
// neighbour is accepted. The rows read with the draws (ForwardChoose), the
// whole-row draws' among them, are the rows Forward writes.
func TestCUDASampleMatchesHost(t *testing.T) {
	dir := modeltest.Shared(t, "fixtures", "olmo2")
	if dir == "" {
		t.Skip("shared fixture not present")
	}
	dev := openCUDA(t)
	defer dev.Close()
	m := loadModel(t, dir, dev, models.Options{MaxTokens: 64, CacheDType: gpu.BF16})
	defer m.Close()
	ctx := context.Background()
	V := m.Config.Vocab
	kinds := []gpu.SampleRow{{}, {Temperature: 1}, {Temperature: 0.8, TopK: 50, TopP: 0.9, MinP: 0.02},
		{Temperature: 1, TopP: 0.9}, {Temperature: 0.7, MinP: 0.1}}
	tables := [][]int32{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}}
	run := func(onDevice bool) []int32 {
		cache, err := m.NewCache(10, 16)
		if err != nil {
			t.Fatal(err)
		}
		defer cache.Close()
		n := len(kinds)
		b := &models.Batch{Tokens: []int32{5, 9, 7, 3, 11}, Pos: make([]int32, n), Seq: []int32{0, 1, 2, 3, 4}, Tables: tables, Logits: []int32{0, 1, 2, 3, 4}}
		var out []int32
		ids := make([]int32, n)
		logits := make([]float32, n*V)
		for step := range 8 {
			rows := slices.Clone(kinds)
			for i := range rows {
				if rows[i].Temperature != 0 {
					rows[i].U = float64(step*n+i) / float64(8*n)
				}
			}
			if onDevice {
				b.Read = b.Logits
				read := make([]float32, n*V)
				if err := m.ForwardChoose(ctx, cache, b, rows, ids, read); err != nil {
					t.Fatal(err)
				}
				if err := m.Forward(ctx, cache, b, logits); err != nil { // the same step again
					t.Fatal(err)
				}
				if !slices.Equal(read, logits) {
					t.Fatalf("step %d: the rows read with the draws differ from Forward's", step)
				}
			} else {
				if err := m.Forward(ctx, cache, b, logits); err != nil {
					t.Fatal(err)
				}
				var sc gpu.SampleScratch
				for i, row := range rows {
					id := gpu.SampleHost(slices.Clone(logits[i*V:(i+1)*V]), row, &sc)
					lo, hi := row, row
					lo.U, hi.U = max(0, row.U-1e-9), row.U+1e-9
					a, c := gpu.SampleHost(slices.Clone(logits[i*V:(i+1)*V]), lo, &sc), gpu.SampleHost(slices.Clone(logits[i*V:(i+1)*V]), hi, &sc)
					if a != id || c != id {
						id = -1 // ambiguous: either neighbour
					}
					ids[i] = id
				}
			}
			out = append(out, ids...)
			for i := range b.Tokens {
				b.Tokens[i] = ids[i]
				if ids[i] < 0 {
					b.Tokens[i] = 1
				}
				b.Pos[i]++
			}
		}
		return out
	}
	dev1, host := run(true), run(false)
	for i := range host {
		if host[i] >= 0 && dev1[i] != host[i] {
			t.Fatalf("draw %d (step %d, row %d): the GPU drew %d, the host %d", i, i/len(kinds), i%len(kinds), dev1[i], host[i])
		}
		if host[i] < 0 {
			t.Logf("draw %d: ambiguous on the host", i)
			break // the sequences part ways from here
		}
	}
	t.Logf("GPU draws %v", dev1)
}

// TestCUDACodedWeights decodes an OLMo 2 shape whose products the 12-bit
// code takes (k of 2048 and 8192) with no weights coded, the LM head's and
// all: the same prompt and greedy path, the logits of each coding within
// 1e-4 of the bf16 run's at every step (the sums round in another order,
// step after step), and the matrices each coding names coded.
func TestCUDACodedWeights(t *testing.T) {
	cfg, ckpt := synthOLMo2(t, synth.OLMo2(2048, 2, 16, 8192), 4096, 11)
	ctx := context.Background()
	dev := openCUDA(t)
	defer dev.Close()
	var base [][]float32 // the bf16 run's logits, step by step
	// At these shapes all codes gate|up and down (at least 2^24 weights)
	// and the head, and auto does as all: the twins are far smaller than
	// the GPU's memory.
	for _, c := range []struct {
		coding, as models.Coding
		coded      int
	}{{models.CodeNone, models.CodeNone, 0}, {models.CodeHead, models.CodeHead, 1},
		{models.CodeAll, models.CodeAll, 2*cfg.Layers + 1}, {models.CodeAuto, models.CodeAll, 2*cfg.Layers + 1}} {
		m, err := models.Load(cfg, ckpt, dev, models.Options{MaxTokens: 64, CacheDType: gpu.BF16, CodeWeights: c.coding})
		if err != nil {
			t.Fatal(err)
		}
		if n, as := m.Coded(); n != c.coded || (n > 0 && as != c.as) {
			t.Errorf("%s: %d matrices coded as %s, want %d as %s", c.coding, n, as, c.coded, c.as)
		}
		seq, err := m.NewSequence(64)
		if err != nil {
			t.Fatal(err)
		}
		l, err := seq.Feed(ctx, []int32{1, 450, 846, 2987, 17}, false)
		for step := 0; step < 12 && err == nil; step++ {
			tok := int32(argmax(l))
			if c.coding == models.CodeNone {
				base = append(base, slices.Clone(l))
			} else {
				if e := gputest.RelL2(l, base[step]); !(e <= 1e-4) {
					t.Errorf("%s: step %d: logits differ from bf16 by %.3g, want at most 1e-4", c.coding, step, e)
				}
				if want := int32(argmax(base[step])); tok != want {
					if g := margin(base[step], int(want)); g >= greedyTolerance {
						t.Errorf("%s: step %d: token %d, bf16 %d (margin %.3g)", c.coding, step, tok, want, g)
					}
					tok = want // follow the bf16 path
				}
			}
			l, err = seq.Feed(ctx, []int32{tok}, false)
		}
		seq.Close()
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
}
