package gputest

import (
	"math"
	"testing"

	"github.com/troupe/troupe/gpu"
)

// sample checks gpu.Sampler against gpu.SampleHost (float64): greedy,
// unfiltered and filtered draws (top-k up to gpu.MaxSampleTopK, with top-p
// and min-p among the kept tokens) over rows with ties, a NaN and -Inf
// among the logits. The device sums in another order than the host, so
// where moving u by 1e-9 changes the host's choice either neighbour is
// accepted.
func (h *harness) sample(t *testing.T) {
	s, ok := h.dev.(gpu.Sampler)
	if !ok {
		t.Skip("the device does not draw tokens itself")
	}
	widths := []int{1000}
	if h.o.Large {
		widths = append(widths, 100352)
	}
	kinds := []gpu.SampleRow{
		{}, {Temperature: 1}, {Temperature: 0.7}, {Temperature: 1.3, TopK: 50}, {Temperature: 1, TopK: 1024, TopP: 0.9},
		{Temperature: 0.8, TopK: 200, MinP: 0.05, TopP: 0.95}, {Temperature: 1, TopK: 1}, {Temperature: 2, TopK: 7},
		{Temperature: 1, TopK: 3000}, // all of a narrow row, sorted
	}
	for _, width := range widths {
		var rows []gpu.SampleRow
		for i := range 48 {
			r := kinds[i%len(kinds)]
			if !r.OnDevice(width) {
				continue
			}
			if r.Temperature != 0 {
				r.U = h.rng.Float64()
				if i%13 == 5 {
					r.U = 0.999999999
				}
			}
			rows = append(rows, r)
		}
		n := len(rows)
		v := h.randF32(n*width, 3)
		for r := range n {
			row := v[r*width : (r+1)*width]
			row[7], row[width/2] = row[3], row[3] // ties
			row[11] = float32(math.NaN())
			row[13] = float32(math.Inf(-1))
		}
		logits, out := h.f32(v), h.alloc(gpu.I32, n)
		if err := s.Sample(out.d, logits.d, n, width, rows); err != nil {
			t.Fatalf("width %d: %v", width, err)
		}
		got := make([]int32, n)
		if err := h.dev.Read(gpu.I32Bytes(got), out.d, 0); err != nil {
			t.Fatal(err)
		}
		var sc gpu.SampleScratch
		host := func(r int, row gpu.SampleRow) int32 {
			l := append([]float32(nil), v[r*width:(r+1)*width]...)
			return gpu.SampleHost(l, row, &sc)
		}
		for r, row := range rows {
			want := host(r, row)
			if got[r] == want {
				continue
			}
			lo, hi := row, row
			lo.U, hi.U = max(0, row.U-1e-9), min(math.Nextafter(1, 0), row.U+1e-9)
			if got[r] != host(r, lo) && got[r] != host(r, hi) {
				t.Errorf("width %d row %d %+v: drew %d, the host %d", width, r, row, got[r], want)
			}
		}
		// Refused: a draw outside [0, 1), and rows that do not match n.
		bad := append([]gpu.SampleRow(nil), rows...)
		bad[0].U = 1
		if err := s.Sample(out.d, logits.d, n, width, bad); err == nil {
			t.Errorf("width %d: a draw of 1 was taken", width)
		}
		if err := s.Sample(out.d, logits.d, n, width, rows[1:]); err == nil {
			t.Errorf("width %d: %d draws for %d rows were taken", width, n-1, n)
		}
		h.free(logits, out)
	}
}
