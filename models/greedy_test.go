package models_test

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/cpu"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/demo"
	"github.com/troupe/troupe/models/modeltest"
)

// TestGreedyMatchesFeedArgmax checks Sequence.Greedy against a loop of
// FeedArgmax calls on every lane: the same tokens, and the sequence left at
// the same length. On devices with a device-side argmax and late reads (the
// CPU and CUDA lanes) Greedy chains the steps on the device and reads each
// token back one step late; elsewhere (the reference lane) it is that loop.
// Greedy is called twice on the sequence: the second call replays the
// steps the first recorded.
func TestGreedyMatchesFeedArgmax(t *testing.T) {
	var checkpoints []string
	if demo.Embedded() {
		checkpoints = append(checkpoints, "demo")
	}
	if root := modeltest.Shared(t, "fixtures"); root != "" {
		for _, name := range []string{"olmo2", "llama-gqa", "qwen3", "qwen3-moe"} {
			if _, err := os.Stat(filepath.Join(root, name)); err == nil {
				checkpoints = append(checkpoints, filepath.Join(root, name))
			}
		}
	}
	if len(checkpoints) == 0 {
		t.Skip("no demo model (nodemo) and no shared fixtures")
	}
	ctx := context.Background()
	const gen = 40
	prompt := []int32{5, 9, 200, 31, 7}
	for _, ln := range lanes() {
		for _, ck := range checkpoints {
			if ln.slow && ck == "demo" {
				continue // the f64 reference lane takes the small fixtures only
			}
			t.Run(ln.name+"/"+filepath.Base(ck), func(t *testing.T) {
				dev := ln.open(t)
				defer dev.Close()
				_, argmaxer := dev.(gpu.Argmaxer)
				_, late := dev.(gpu.LateReader)
				if chained := argmaxer && late; chained != (ln.name != "ref") {
					t.Fatalf("lane %s: chained steps %v", ln.name, chained)
				}
				var m *models.Model
				if ck == "demo" {
					b := openDemo(t)
					var err error
					if m, err = models.Load(b.Config, b.Checkpoint, dev, models.Options{CacheDType: ln.cache}); err != nil {
						t.Fatal(err)
					}
				} else {
					m = loadModel(t, ck, dev, models.Options{MaxTokens: 64, CacheDType: ln.cache})
				}
				defer m.Close()
				run := func(greedy bool) ([]int32, int) {
					seq, err := m.NewSequence(len(prompt) + gen + 1)
					if err != nil {
						t.Fatal(err)
					}
					defer seq.Close()
					next, err := seq.FeedArgmax(ctx, prompt)
					if err != nil {
						t.Fatal(err)
					}
					out := []int32{next}
					if greedy {
						keep := func(id int32) { out = append(out, id) }
						if err = seq.Greedy(ctx, next, gen/2-1, keep); err == nil {
							err = seq.Greedy(ctx, out[len(out)-1], gen-gen/2+1, keep)
						}
					} else {
						for range gen {
							if next, err = seq.FeedArgmax(ctx, []int32{next}); err != nil {
								break
							}
							out = append(out, next)
						}
					}
					if err != nil {
						t.Fatal(err)
					}
					return out, seq.Len()
				}
				want, wantLen := run(false)
				got, gotLen := run(true)
				if !slices.Equal(got, want) || gotLen != wantLen {
					t.Fatalf("Greedy: %v (length %d), FeedArgmax loop: %v (length %d)", got, gotLen, want, wantLen)
				}
				t.Logf("%d tokens equal: %v", len(got), got)
			})
		}
	}
}

// TestGreedyStops checks Greedy's limits on the CPU lane (chained steps):
// more tokens than the sequence holds are refused before any step, and a
// context cancelled between tokens ends it with the context's error.
func TestGreedyStops(t *testing.T) {
	b := openDemo(t)
	var cpuLane *lane
	for _, ln := range lanes() {
		if ln.name == "cpu" {
			cpuLane = &ln
		}
	}
	if cpuLane == nil {
		t.Fatal("no cpu lane")
	}
	dev := cpuLane.open(t)
	defer dev.Close()
	m, err := models.Load(b.Config, b.Checkpoint, dev, models.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	seq, err := m.NewSequence(32)
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close()
	if err := seq.Greedy(context.Background(), 5, 33, func(int32) {}); err == nil || seq.Len() != 0 {
		t.Fatalf("33 tokens into a sequence of 32: error %v, length %d", err, seq.Len())
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got []int32
	err = seq.Greedy(ctx, 5, 20, func(id int32) {
		if got = append(got, id); len(got) == 3 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) || len(got) != 3 || seq.Len() < 3 || seq.Len() > 4 {
		t.Fatalf("cancelled after 3 tokens: error %v, %d tokens, length %d", err, len(got), seq.Len())
	}
}

// TestIssueStepChains: steps of a batch of two sequences queued back to
// back with IssueStep, each fed the previous step's choices on the device
// and read one step late, choose what a loop of ForwardArgmax chooses
// (greedy) or draw what a loop of ForwardSample draws with the same rows,
// on every lane that chains; a step fed by the one before must have one
// token per logits row, in order, and as many rows; whole-row filters
// (top-p, min-p) are queued too.
func TestIssueStepChains(t *testing.T) {
	check := func(t *testing.T, ln lane, m *models.Model) {
		if !m.Chains() || !m.ChainsDraws(chainDraws(0)) {
			t.Fatalf("lane %s: the whole model does not chain", ln.name)
		}
		if !m.ChainsDraws([]gpu.SampleRow{{Temperature: 1, TopP: 0.9}}) {
			t.Errorf("lane %s: a whole-row top-p draw would not be queued", ln.name)
		}
		checkChains(t, m)
	}
	ran := false
	if demo.Embedded() {
		onFastLanes(t, openDemo(t), check)
		ran = true
	}
	// A fixture too, for builds without the demo model (a GPU host's).
	if root := modeltest.Shared(t, "fixtures"); root != "" {
		for _, ln := range lanes() {
			if ln.slow {
				continue
			}
			t.Run(ln.name+"/olmo2", func(t *testing.T) {
				dev := ln.open(t)
				defer dev.Close()
				check(t, ln, loadModel(t, filepath.Join(root, "olmo2"), dev, models.Options{MaxTokens: 64, CacheDType: ln.cache}))
			})
			ran = true
		}
	}
	if !ran {
		t.Skip("no demo model (nodemo) and no shared fixtures")
	}
}

// chainDraws gives step s's draws in checkChains's drawn chains: top-k
// with top-p, and unfiltered, whole-row top-p or min-p in turn.
func chainDraws(s int) []gpu.SampleRow {
	u := math.Mod(0.61*float64(s)+0.29, 1)
	second := []gpu.SampleRow{{Temperature: 1.2, U: u}, {Temperature: 1.1, TopP: 0.9, U: u}, {Temperature: 0.8, MinP: 0.05, U: u}}[s%3]
	return []gpu.SampleRow{{Temperature: 0.9, TopK: 40, TopP: 0.95, U: math.Mod(0.37*float64(s)+0.11, 1)}, second}
}

// chainReads gives step s's rows to read in checkChains: both, the
// second, or none.
func chainReads(s int) []int32 {
	return [][]int32{{0, 1}, {1}, nil}[s%3]
}

// chainTop is whether step s of checkChains reads summaries of its rows
// (Batch.Summaries), and of how many likely tokens.
func chainTop(s int) (bool, int) {
	return s%2 == 1, [3]int{5, 0, gpu.MaxSummaryTop}[s%3]
}

// sameSummary reports whether two log-probability summaries name the same
// tokens with log-probabilities within 2 ulp (a device's sums may differ
// from the host's in their last bits).
func sameSummary(a, b []float32) bool {
	if len(a) != len(b) || a[1] != b[1] {
		return false
	}
	near := func(x, y float32) bool {
		if x == y || x != x && y != y {
			return true
		}
		lo, hi := math.Nextafter32(math.Nextafter32(y, -math.MaxFloat32), -math.MaxFloat32), math.Nextafter32(math.Nextafter32(y, math.MaxFloat32), math.MaxFloat32)
		return x >= lo && x <= hi
	}
	for j := range a {
		if j >= 2 && j%2 == 0 {
			if math.Float32bits(a[j]) != math.Float32bits(b[j]) {
				return false
			}
		} else if !near(a[j], b[j]) {
			return false
		}
	}
	return true
}

// checkChains decodes two sequences greedy and then drawn, once through a
// loop of ForwardChoose and once through IssueStep's queued steps, each
// fed the choice of the step before on the device, reading some steps'
// logits rows (chainReads): the tokens and the rows must be equal, and
// the loop's rows those Forward writes. IssueStep must refuse steps it
// cannot chain.
func checkChains(t *testing.T, m *models.Model) {
	t.Helper()
	ctx := context.Background()
	V := m.Config.Vocab
	prompts := [][]int32{{5, 9, 200, 31, 7}, {11, 4, 90}}
	const bs, gen = 16, 12
	for _, draws := range []func(int) []gpu.SampleRow{func(int) []gpu.SampleRow { return nil }, chainDraws} {
		run := func(chained bool) ([][]int32, [][]float32) {
			cache, err := m.NewCache(4, bs)
			if err != nil {
				t.Fatal(err)
			}
			defer cache.Close()
			tables := [][]int32{{0, 1}, {2, 3}}
			pb := &models.Batch{Tables: tables}
			for s, p := range prompts {
				for i, tok := range p {
					pb.Tokens, pb.Pos, pb.Seq = append(pb.Tokens, tok), append(pb.Pos, int32(i)), append(pb.Seq, int32(s))
				}
				pb.Logits = append(pb.Logits, int32(len(pb.Tokens)-1))
			}
			ids := make([]int32, 2)
			if err := m.ForwardArgmax(ctx, cache, pb, ids); err != nil {
				t.Fatal(err)
			}
			out := [][]int32{{ids[0]}, {ids[1]}}
			var read [][]float32 // each step's rows read
			db := &models.Batch{Tokens: slices.Clone(ids), Pos: []int32{int32(len(prompts[0])), int32(len(prompts[1]))},
				Seq: []int32{0, 1}, Tables: tables, Logits: []int32{0, 1}}
			if !chained {
				full := make([]float32, 2*V)
				for s := range gen {
					db.Read = chainReads(s)
					db.Summaries, db.Top = chainTop(s)
					if err := m.Forward(ctx, cache, db, full); err != nil {
						t.Fatal(err)
					}
					W := db.ReadWidth(V)
					rows := make([]float32, len(db.Read)*W)
					if err := m.ForwardChoose(ctx, cache, db, draws(s), ids, rows); err != nil {
						t.Fatal(err)
					}
					for i, r := range db.Read {
						row := full[int(r)*V : (int(r)+1)*V]
						if db.Summaries {
							want := make([]float32, W)
							gpu.Summarize(want, row, ids[r], db.Top)
							if !sameSummary(rows[i*W:(i+1)*W], want) {
								t.Fatalf("step %d: row %d's summary %v, want %v", s, r, rows[i*W:(i+1)*W], want)
							}
						} else if !slices.Equal(rows[i*V:(i+1)*V], row) {
							t.Fatalf("step %d: row %d read with the choices differs from Forward's", s, r)
						}
					}
					out[0], out[1] = append(out[0], ids[0]), append(out[1], ids[1])
					read = append(read, rows)
					copy(db.Tokens, ids)
					db.Pos[0]++
					db.Pos[1]++
				}
				db.Read, db.Summaries, db.Top = []int32{0}, true, gpu.MaxSummaryTop+1
				if err := m.ForwardChoose(ctx, cache, db, nil, ids, make([]float32, 2*V)); err == nil {
					t.Error("a summary of too many tokens was taken")
				}
				db.Summaries = false
				db.Read = []int32{1, 0}
				if err := m.ForwardChoose(ctx, cache, db, nil, ids, make([]float32, 2*V)); err == nil {
					t.Error("rows to read out of order were taken")
				}
				db.Read = []int32{0}
				if err := m.ForwardChoose(ctx, cache, db, nil, ids, make([]float32, V-1)); err == nil {
					t.Error("a row read into too few floats was taken")
				}
				return out, read
			}
			var (
				got  = [2][]int32{make([]int32, 2), make([]int32, 2)}
				rows [2][]float32
				wait [2]func() error
			)
			take := func(i int) {
				if err := wait[i](); err != nil {
					t.Fatal(err)
				}
				out[0], out[1] = append(out[0], got[i][0]), append(out[1], got[i][1])
				read = append(read, rows[i])
			}
			for s := range gen {
				db.Read = chainReads(s)
				db.Summaries, db.Top = chainTop(s)
				rows[s%2] = make([]float32, len(db.Read)*db.ReadWidth(V))
				if wait[s%2], err = m.IssueStep(ctx, cache, db, draws(s), s > 0, got[s%2], rows[s%2]); err != nil {
					t.Fatal(err)
				}
				db.Pos[0]++
				db.Pos[1]++
				if s > 0 {
					take((s - 1) % 2)
				}
			}
			take((gen - 1) % 2)
			// Refused: rows out of order, more rows than the step before
			// chose, a top-k no device takes and rows to read out of order.
			db.Read, db.Summaries = nil, false
			if _, err := m.IssueStep(ctx, cache, &models.Batch{Tokens: []int32{0, 0}, Pos: db.Pos, Seq: db.Seq, Tables: tables, Logits: []int32{1, 0}}, nil, true, ids, nil); err == nil {
				t.Error("a step fed by the one before with its logits rows swapped was queued")
			}
			three := make([]int32, 3)
			if _, err := m.IssueStep(ctx, cache, &models.Batch{Tokens: []int32{0, 0, 0}, Pos: []int32{20, 20, 21}, Seq: []int32{0, 1, 1}, Tables: tables, Logits: []int32{0, 1, 2}}, nil, true, three, nil); err == nil {
				t.Error("a step fed by one of two rows with three rows was queued")
			}
			wide := []gpu.SampleRow{{Temperature: 1, TopK: gpu.MaxSampleTopK + 1}, {}}
			if _, err := m.IssueStep(ctx, cache, db, wide, true, ids, nil); err == nil {
				t.Error("a top-k draw no device takes was queued")
			}
			db.Read = []int32{1, 1}
			if _, err := m.IssueStep(ctx, cache, db, nil, true, ids, make([]float32, 2*V)); err == nil {
				t.Error("a row to read twice was queued")
			}
			return out, read
		}
		want, wantRows := run(false)
		got, gotRows := run(true)
		for s := range want {
			if !slices.Equal(got[s], want[s]) {
				t.Fatalf("sequence %d (drawn %v): queued steps chose %v, the loop %v", s, draws(0) != nil, got[s], want[s])
			}
		}
		for s := range wantRows {
			if !slices.Equal(gotRows[s], wantRows[s]) {
				t.Fatalf("step %d (drawn %v): the queued step's rows %v differ from the loop's", s, draws(0) != nil, chainReads(s))
			}
		}
		t.Logf("drawn %v: %d tokens of two sequences and %d rows equal", draws(0) != nil, len(got[0])+len(got[1]), len(gotRows))
	}
}

// TestForwardSampleOnHost: on a device that does not draw tokens itself,
// ForwardSample reads the logits and draws on the host, its pieces on
// several goroutines: the tokens of Forward and gpu.SampleHost; and
// ForwardChoose returns the rows it read, as Forward writes them.
func TestForwardSampleOnHost(t *testing.T) {
	b := openDemo(t)
	dev, err := cpu.New(cpu.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	plain := struct{ gpu.Device }{dev} // no gpu.Sampler, nor anything else optional
	m, err := models.Load(b.Config, b.Checkpoint, plain, models.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cache, err := m.NewCache(4, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close()
	ctx := context.Background()
	batch := &models.Batch{Tokens: []int32{5, 9, 200, 11, 4}, Pos: []int32{0, 1, 2, 0, 1}, Seq: []int32{0, 0, 0, 1, 1},
		Tables: [][]int32{{0, 1}, {2, 3}}, Logits: []int32{2, 4}}
	rows := []gpu.SampleRow{{Temperature: 0.9, U: 0.37}, {Temperature: 1.1, TopP: 0.8, U: 0.71}}
	ids := make([]int32, 2)
	if err := m.ForwardSample(ctx, cache, batch, rows, ids); err != nil {
		t.Fatal(err)
	}
	V := b.Config.Vocab
	logits := make([]float32, 2*V)
	if err := m.Forward(ctx, cache, batch, logits); err != nil {
		t.Fatal(err)
	}
	var sc gpu.SampleScratch
	for i, row := range rows {
		if want := gpu.SampleHost(logits[i*V:(i+1)*V], row, &sc); ids[i] != want {
			t.Errorf("row %d: ForwardSample drew %d, Forward and SampleHost %d", i, ids[i], want)
		}
	}
	if err := m.ForwardSample(ctx, cache, batch, rows[:1], ids); err == nil {
		t.Error("one draw for two rows was taken")
	}
	batch.Read = []int32{1}
	read := make([]float32, V)
	if err := m.ForwardChoose(ctx, cache, batch, rows, ids, read); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(read, logits[V:]) {
		t.Error("ForwardChoose's row 1 differs from Forward's")
	}
	// Summarized, the rows the host drew from are not what comes back.
	batch.Summaries, batch.Top = true, 3
	got, want := make([]float32, gpu.SummaryWidth(3)), make([]float32, gpu.SummaryWidth(3))
	if err := m.ForwardChoose(ctx, cache, batch, rows, ids, got); err != nil {
		t.Fatal(err)
	}
	gpu.Summarize(want, logits[V:], ids[1], 3)
	if !sameSummary(got, want) {
		t.Errorf("ForwardChoose's summary of row 1 %v, want %v", got, want)
	}
}
