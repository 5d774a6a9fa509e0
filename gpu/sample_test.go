package gpu

import (
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
)

// TestSampleHostFilters checks SampleHost's filtered draws against a plain
// implementation of the definition (a full sort of the row, then top-k,
// min-p and top-p over the sorted probabilities) on rows with many ties,
// a NaN and -Inf, for k from 1 to 40 and for top-p and min-p over the
// whole row (where SampleHost sorts only as much of the row as settles
// them, up to all of it for a top-p of 0.999), several draws each; and
// that greedy and unfiltered draws keep to their definitions.
func TestSampleHostFilters(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const n = 3000
	logits := make([]float32, n)
	var s SampleScratch
	for trial := range 40 {
		for i := range logits {
			logits[i] = float32(rng.IntN(25)) / 4 // ties
		}
		logits[5], logits[9] = float32(math.NaN()), float32(math.Inf(-1))
		k := trial + 1
		if trial%4 == 3 {
			k = 0 // top-p and min-p over the whole row
		}
		for d := range 7 {
			r := SampleRow{Temperature: 0.5 + float32(d)/4, TopK: int32(k), TopP: []float32{0, 0.5, 0.9, 1, 0.3, 0.999, 0}[d], MinP: []float32{0, 0.1, 0, 0.3, 0, 0, 0.001}[d], U: rng.Float64()}
			if r.Plain() {
				continue
			}
			got := SampleHost(append([]float32(nil), logits...), r, &s)
			if want := sampleByDefinition(logits, r); got != want {
				t.Fatalf("k %d, %+v: drew %d, by the definition %d", k, r, got, want)
			}
		}
	}
	logits[17] = 100
	if got := SampleHost(append([]float32(nil), logits...), SampleRow{}, &s); got != 17 {
		t.Errorf("greedy draw %d, want 17", got)
	}
	if got := SampleHost(append([]float32(nil), logits...), SampleRow{Temperature: 1, U: 0.5}, &s); got != 17 {
		t.Errorf("unfiltered draw %d where token 17 holds all but e^-90 of the mass", got)
	}
}

func sampleByDefinition(in []float32, r SampleRow) int32 {
	l := make([]float64, len(in))
	idx := make([]int, len(in))
	for i, v := range in {
		l[i], idx[i] = float64(v), i
		if v != v {
			l[i] = math.Inf(-1)
		}
	}
	sort.SliceStable(idx, func(a, b int) bool { return l[idx[a]] > l[idx[b]] })
	k := len(l)
	if r.TopK > 0 {
		k = min(int(r.TopK), k)
	}
	t := float64(r.Temperature)
	p := make([]float64, k)
	var sum float64
	for i := range k {
		p[i] = math.Exp(l[idx[i]]/t - l[idx[0]]/t)
		sum += p[i]
	}
	for i := range p {
		p[i] /= sum
	}
	for r.MinP > 0 && k > 1 && p[k-1] < float64(r.MinP)*p[0] {
		k--
	}
	if r.TopP > 0 && r.TopP < 1 {
		acc := 0.0
		for i := range k {
			if acc += p[i]; acc >= float64(r.TopP) {
				k = i + 1
				break
			}
		}
	}
	total := 0.0
	for _, v := range p[:k] {
		total += v
	}
	u := r.U * total
	for i, v := range p[:k] {
		if u -= v; u < 0 {
			return int32(idx[i])
		}
	}
	return int32(idx[k-1])
}

// TestSampleHostParallel: unfiltered and whole-row top-p draws take the
// same tokens with their pieces spread over goroutines as one by one.
func TestSampleHostParallel(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	logits := make([]float32, 100352)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 3)
	}
	var one, many SampleScratch
	many.Parallel = func(n int, f func(i int)) {
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				f(i)
			}()
		}
		wg.Wait()
	}
	for d := range 40 {
		r := SampleRow{Temperature: 0.6 + float32(d%4)/5, U: rng.Float64()}
		if d%2 == 1 {
			r.TopP = 0.9
		}
		a := SampleHost(append([]float32(nil), logits...), r, &one)
		b := SampleHost(append([]float32(nil), logits...), r, &many)
		if a != b {
			t.Fatalf("%+v: %d one piece after another, %d in parallel", r, a, b)
		}
	}
}
