package gpu

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

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
// SampleHost's greedy choice with LogProbs of it, bit for bit, over
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
				want := SampleHost(slices.Clone(row), SampleRow{}, &SampleScratch{})
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
