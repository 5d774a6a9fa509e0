package sample

import (
	"math"
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
