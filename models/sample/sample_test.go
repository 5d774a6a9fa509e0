package sample

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/troupe/troupe/gpu"
)

func seed(v int64) *int64 { return &v }

func draws(p Params, logits []float32, n int) map[int32]int {
	s := New(p)
	got := map[int32]int{}
	for range n {
		l := append([]float32(nil), logits...)
		id := s.Sample(l, nil)
		got[id]++
	}
	return got
}

func TestGreedyAndTies(t *testing.T) {
	s := New(Params{})
	if id := s.Sample([]float32{1, 3, 3, 2}, nil); id != 1 {
		t.Errorf("got %d, want 1: the first of equal maxima", id)
	}
}

func TestSeedReproducible(t *testing.T) {
	logits := []float32{0.1, 0.5, 0.2, 0.9, 0.3}
	p := Params{Temperature: 1, Seed: seed(7)}
	a, b := New(p), New(p)
	for i := range 50 {
		x := a.Sample(append([]float32(nil), logits...), nil)
		y := b.Sample(append([]float32(nil), logits...), nil)
		if x != y {
			t.Fatalf("draw %d: %d != %d with the same seed", i, x, y)
		}
	}
}

func TestFilters(t *testing.T) {
	logits := []float32{2, 1.9, 1.8, -5, -6}
	// Temperature 1 draws every token eventually; top-k 2 only the first two.
	if got := draws(Params{Temperature: 1, TopK: 2, Seed: seed(1)}, logits, 400); len(got) != 2 || got[0] == 0 || got[1] == 0 {
		t.Errorf("top-k 2 drew %v", got)
	}
	// Top-p 0.5 keeps the smallest set reaching half the mass: tokens 0 and 1.
	if got := draws(Params{Temperature: 1, TopP: 0.5, Seed: seed(2)}, logits, 400); len(got) != 2 || got[2] != 0 {
		t.Errorf("top-p 0.5 drew %v", got)
	}
	// Min-p 0.5 drops tokens under half of the best's probability.
	if got := draws(Params{Temperature: 1, MinP: 0.5, Seed: seed(3)}, logits, 400); got[3] != 0 || got[4] != 0 || len(got) != 3 {
		t.Errorf("min-p 0.5 drew %v", got)
	}
	// A tiny temperature is greedy in effect.
	if got := draws(Params{Temperature: 0.01, Seed: seed(4)}, logits, 100); got[0] != 100 {
		t.Errorf("temperature 0.01 drew %v", got)
	}
}

// TestSampleAdjusted: the draw applies its changes first: greedy under a
// bias takes the biased token, under a penalty the next best.
func TestSampleAdjusted(t *testing.T) {
	if id := New(Params{}).Sample([]float32{2, 1, 0}, []gpu.LogitAdjust{{ID: 1, Bias: 2}}); id != 1 {
		t.Errorf("greedy with bias: %d, want 1", id)
	}
	l := []float32{2, 1.5, 0}
	if id := New(Params{RepetitionPenalty: 2}).Sample(l, []gpu.LogitAdjust{{ID: 0, Seen: true, Bias: -0.5}}); id != 1 || l[0] != 0.5 {
		t.Errorf("greedy with a penalty: %d, logit %v; want 1 and 2/2-0.5", id, l[0])
	}
	l = []float32{2, 1.5, 0}
	if id := New(Params{PresencePenalty: 0.25, FrequencyPenalty: 0.5}).Sample(l, []gpu.LogitAdjust{{ID: 0, Seen: true, Count: 2}}); id != 1 || l[0] != 0.75 {
		t.Errorf("greedy with presence and frequency penalties: %d, logit %v; want 1 and 2-0.25-2·0.5", id, l[0])
	}
	p := Params{RepetitionPenalty: 1.2, LogitBias: map[int32]float32{3: 1}}
	if !p.Adjusts() || p.Penalties().Counting() || (Params{}).Adjusts() || (Params{RepetitionPenalty: 1}).Adjusts() || !(Params{FrequencyPenalty: -1}).Penalties().Counting() {
		t.Error("Adjusts or Counting wrong")
	}
}

func TestLogProbs(t *testing.T) {
	logits := []float32{1, 2, 3}
	var sum float64
	for i := range logits {
		lp, _, _ := LogProbs(logits, i, 0)
		sum += math.Exp(float64(lp))
	}
	if math.Abs(sum-1) > 1e-6 {
		t.Errorf("probabilities sum to %v", sum)
	}
	_, ids, lps := LogProbs(logits, 0, 2)
	if len(ids) != 2 || ids[0] != 2 || ids[1] != 1 || lps[0] < lps[1] {
		t.Errorf("top logprobs %v %v", ids, lps)
	}
	// Against a float64 oracle over rows with ties, NaNs and -Inf, the
	// largest logit first or last.
	r := rand.New(rand.NewPCG(1, 1))
	for _, n := range []int{5000, 100352} {
		row := make([]float32, n)
		for i := range row {
			row[i] = float32(r.IntN(400)) / 16
		}
		row[7], row[9], row[11] = float32(math.NaN()), float32(math.Inf(-1)), 30
		if n > 5000 {
			row[0], row[n-1] = float32(math.NaN()), 31
		}
		logProbsMatch(t, row, 11)
	}
}

// TestArgmaxLogProbs: the greedy choice with log-probabilities is
// gpu.SampleHost's greedy choice with LogProbs of it, bit for bit, over
// short and long rows (one piece and eight at once) with ties across
// pieces, NaNs, infinities, and rows with nothing above -Inf.
func TestArgmaxLogProbs(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	for _, n := range []int{1, 2, 9, 100, 20000, 100352} {
		for trial := range 40 {
			row := make([]float32, n)
			for i := range row {
				row[i] = float32(r.IntN(64)) / 4
				switch r.IntN(16) {
				case 0:
					row[i] = float32(math.NaN())
				case 1:
					row[i] = float32(math.Inf(-1))
				}
			}
			switch trial % 5 {
			case 1: // the largest tied in several pieces
				for range 4 {
					row[r.IntN(n)] = 40
				}
			case 2:
				for i := range row {
					row[i] = []float32{float32(math.Inf(-1)), float32(math.NaN())}[r.IntN(2)]
				}
			case 3:
				row[r.IntN(n)] = float32(math.Inf(1))
			}
			for _, k := range []int{0, 1, 5} {
				want := gpu.SampleHost(slices.Clone(row), gpu.SampleRow{}, &gpu.SampleScratch{})
				wlp, wids, wlps := LogProbs(row, int(want), k)
				id, lp, ids, lps := ArgmaxLogProbs(row, k)
				same := func(a, b float32) bool { return a == b || a != a && b != b }
				if id != want || !same(lp, wlp) || !slices.Equal(ids, wids) || !slices.EqualFunc(lps, wlps, same) {
					t.Fatalf("%d logits, trial %d, k %d: %d %v %v %v, want %d %v %v %v", n, trial, k, id, lp, ids, lps, want, wlp, wids, wlps)
				}
			}
		}
	}
}

// logProbsMatch checks LogProbs of token i against a float64 oracle.
func logProbsMatch(t *testing.T, row []float32, i int) {
	t.Helper()
	var z float64
	for _, l := range row {
		if l == l {
			z += math.Exp(float64(l))
		}
	}
	for _, k := range []int{1, 5, 20} {
		lp, ids, lps := LogProbs(row, i, k)
		if want := float64(row[i]) - math.Log(z); !(math.Abs(float64(lp)-want) <= 1e-5) {
			t.Errorf("%d logits, k %d: logprob %v, want %v", len(row), k, lp, want)
		}
		order := make([]int32, 0, len(row))
		for id, l := range row {
			if l == l {
				order = append(order, int32(id))
			}
		}
		slices.SortStableFunc(order, func(a, b int32) int { return cmp.Compare(row[b], row[a]) })
		if !slices.Equal(ids, order[:k]) {
			t.Errorf("%d logits, k %d: top %v, want %v", len(row), k, ids, order[:k])
		}
		for j, id := range ids {
			if want := float64(row[id]) - math.Log(z); !(math.Abs(float64(lps[j])-want) <= 1e-5) {
				t.Errorf("%d logits, k %d: token %d's logprob %v, want %v", len(row), k, id, lps[j], want)
			}
		}
	}
}

// BenchmarkLogProbs takes the log-probabilities of a row of OLMo 2's
// width with the top 5.
func BenchmarkLogProbs(b *testing.B) {
	r := rand.New(rand.NewPCG(2, 2))
	row := make([]float32, 100352)
	for i := range row {
		row[i] = float32(r.NormFloat64() * 3)
	}
	for b.Loop() {
		LogProbs(row, 7, 5)
	}
}

func TestValidate(t *testing.T) {
	for _, p := range []Params{{Temperature: -1}, {TopP: 1.5}, {MinP: -0.1}, {TopK: -1}, {RepetitionPenalty: float32(math.NaN())},
		{PresencePenalty: 2.5}, {FrequencyPenalty: float32(math.NaN())}, {LogitBias: map[int32]float32{-1: 0}}, {LogitBias: map[int32]float32{5: 101}}} {
		if p.Validate() == nil {
			t.Errorf("%+v: got no error", p)
		}
	}
}

// TestPlainMatchesDistribution: unfiltered sampling draws tokens in
// proportion to softmax(logits / temperature).
func TestPlainMatchesDistribution(t *testing.T) {
	logits := []float32{1, 2, 0, 1.5}
	const n = 20000
	got := draws(Params{Temperature: 0.8, Seed: seed(9)}, logits, n)
	var z float64
	for _, l := range logits {
		z += math.Exp(float64(l) / 0.8)
	}
	for i, l := range logits {
		want := math.Exp(float64(l)/0.8) / z
		if frac := float64(got[int32(i)]) / n; math.Abs(frac-want) > 0.015 {
			t.Errorf("token %d drawn %.3f of the time, want %.3f", i, frac, want)
		}
	}
}

// TestNextRowKeepsTheSequence: looking at the next draw (NextRow), once or
// twice, between draws taken by Row and by Sample leaves the uniform
// numbers, and so the tokens, those of a sampler that never looks ahead.
func TestNextRowKeepsTheSequence(t *testing.T) {
	p := Params{Temperature: 0.8, TopK: 3, Seed: seed(11)}
	plain, ahead := New(p), New(p)
	logits := []float32{0.1, 0.5, 0.2, 0.9, 0.3}
	for i := range 40 {
		var next float64
		if i%3 != 2 {
			next = ahead.NextRow().U
			if i%2 == 0 && ahead.NextRow().U != next {
				t.Fatalf("draw %d: NextRow changed when asked twice", i)
			}
		}
		if i%4 == 1 {
			x, y := plain.Sample(append([]float32(nil), logits...), nil), ahead.Sample(append([]float32(nil), logits...), nil)
			if x != y {
				t.Fatalf("draw %d: Sample drew %d after NextRow, %d without", i, y, x)
			}
			continue
		}
		want, got := plain.Row(), ahead.Row()
		if !got.Equal(want) {
			t.Fatalf("draw %d: Row %+v after NextRow, %+v without", i, got, want)
		}
		if i%3 != 2 && got.U != next {
			t.Fatalf("draw %d: Row took %v, NextRow said %v", i, got.U, next)
		}
	}
	if g := New(Params{}).NextRow(); g.U != 0 || g.Temperature != 0 {
		t.Errorf("a greedy sampler's next row %+v", g)
	}
}
