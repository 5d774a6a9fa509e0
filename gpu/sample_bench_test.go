package gpu

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkSampleHost: one draw from a row of OLMo 2's 100,352 logits,
// unfiltered, with top-k 50 and top-p 0.9, and with top-p 0.9 alone.
func BenchmarkSampleHost(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	logits := make([]float32, 100352)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 3)
	}
	for _, c := range []struct {
		name string
		row  SampleRow
	}{
		{"plain", SampleRow{Temperature: 0.8, U: 0.4}},
		{"topk50", SampleRow{Temperature: 0.8, TopK: 50, TopP: 0.9, U: 0.4}},
		{"topp0.9", SampleRow{Temperature: 0.8, TopP: 0.9, U: 0.4}},
	} {
		b.Run(c.name, func(b *testing.B) {
			var s SampleScratch
			row := make([]float32, len(logits))
			for b.Loop() {
				copy(row, logits)
				SampleHost(row, c.row, &s)
			}
		})
	}
}
