package gpu

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkSampleHost: one draw from a row of OLMo 2's 100,352 logits
// (normal, standard deviation 3): unfiltered, with top-k 50 and top-p 0.9,
// and with top-p 0.9 alone; then whole-row draws, with top-p 0.9 and with
// min-p 0.05, from the row with 40 tokens 12 higher (peaked: the filters
// keep few tokens) and from a flat row (uniform in [-3, 3]) whose filters
// keep most of it.
func BenchmarkSampleHost(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	normal := make([]float32, 100352)
	for i := range normal {
		normal[i] = float32(rng.NormFloat64() * 3)
	}
	peaked := append([]float32(nil), normal...)
	for j := range 40 {
		peaked[(j*7919+17)%len(peaked)] += 12
	}
	flat := make([]float32, len(normal))
	for i := range flat {
		flat[i] = float32(rng.Float64()*6 - 3)
	}
	for _, c := range []struct {
		name   string
		logits []float32
		row    SampleRow
	}{
		{"plain", normal, SampleRow{Temperature: 0.8, U: 0.4}},
		{"topk50", normal, SampleRow{Temperature: 0.8, TopK: 50, TopP: 0.9, U: 0.4}},
		{"topp0.9", normal, SampleRow{Temperature: 0.8, TopP: 0.9, U: 0.4}},
		{"peaked/topp0.9", peaked, SampleRow{Temperature: 0.8, TopP: 0.9, U: 0.4}},
		{"peaked/minp0.05", peaked, SampleRow{Temperature: 0.8, MinP: 0.05, U: 0.4}},
		{"flat/topp0.9", flat, SampleRow{Temperature: 0.8, TopP: 0.9, U: 0.4}},
		{"flat/minp0.05", flat, SampleRow{Temperature: 0.8, MinP: 0.05, U: 0.4}},
	} {
		b.Run(c.name, func(b *testing.B) {
			var s SampleScratch
			row := make([]float32, len(c.logits))
			for b.Loop() {
				copy(row, c.logits)
				SampleHost(row, c.row, &s)
			}
		})
	}
}
