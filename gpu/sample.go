package gpu

import (
	"fmt"
	"math"
	"sort"
)

// SampleRow says how a token is drawn from one row of logits, and with
// which uniform draw U in [0, 1). Temperature 0 takes the most likely
// token (the lowest index among equals). Otherwise the probabilities are
// softmax(logits / Temperature); with TopK > 0 only the TopK most likely
// tokens (ties to the lower index) stay, MinP drops those less likely than
// MinP times the most likely, and TopP keeps the most likely ones up to
// the first whose cumulative probability (among the TopK) reaches TopP.
// The draw walks the kept tokens from the most likely down, or, with no
// filter at all, every token in index order. NaN logits count as -Inf.
type SampleRow struct {
	Temperature, TopP, MinP float32
	TopK                    int32
	U                       float64
}

// MaxSampleTopK is the most tokens a device-side draw keeps as
// candidates: top-k filters up to it, and top-p or min-p over the whole
// row settle within the row's MaxSampleTopK most likely tokens or are
// left to the host (Sampler). The candidates are sorted in a block's
// shared memory.
const MaxSampleTopK = 1024

// Plain reports whether r draws from every token, unfiltered.
func (r SampleRow) Plain() bool {
	return r.TopK == 0 && (r.TopP == 0 || r.TopP >= 1) && r.MinP == 0
}

// OnDevice reports whether a gpu.Sampler takes r for rows of width
// logits: every draw but a top-k that keeps more than MaxSampleTopK
// tokens and fewer than the whole row.
func (r SampleRow) OnDevice(width int) bool {
	return r.Temperature == 0 || r.Plain() || !(int(r.TopK) > MaxSampleTopK && int(r.TopK) < width)
}

// Whole reports whether r filters over the whole row (top-p or min-p
// without a top-k below width), which a device may leave to the host.
func (r SampleRow) Whole(width int) bool {
	return r.Temperature != 0 && !r.Plain() && (r.TopK == 0 || int(r.TopK) >= width)
}

// Validate checks r's ranges.
func (r SampleRow) Validate() error {
	switch {
	case !(r.Temperature >= 0) || math.IsInf(float64(r.Temperature), 1):
		return fmt.Errorf("sample: temperature %v", r.Temperature)
	case !(r.TopP >= 0 && r.TopP <= 1), !(r.MinP >= 0 && r.MinP <= 1), r.TopK < 0:
		return fmt.Errorf("sample: top_p %v, min_p %v, top_k %d", r.TopP, r.MinP, r.TopK)
	case !(r.U >= 0 && r.U < 1):
		return fmt.Errorf("sample: draw %v outside [0, 1)", r.U)
	}
	return nil
}

// SampleScratch is SampleHost's working memory, reused between draws.
// Parallel, when set, runs f(0) … f(n-1) at once and returns when all are
// done: SampleHost then takes the exponentials of an unfiltered or
// whole-row draw a piece each (samplePiece), with the same result.
type SampleScratch struct {
	Parallel func(n int, f func(i int))
	idx      []int
	prob     []float64
	sums     []float64
}

// samplePiece is the logits an unfiltered or whole-row draw sums at a
// time: the row's sum is its pieces' sums added in order, each taken in
// order, however the pieces are spread over threads.
const samplePiece = 8192

// expSums sets prob[i] = exp(logits[i]/t - top) for the row and returns
// prob and each piece's sum.
func (s *SampleScratch) expSums(logits []float32, t, top float64) (prob, sums []float64) {
	n := len(logits)
	pieces := (n + samplePiece - 1) / samplePiece
	prob = s.prob[:n]
	if cap(s.sums) < pieces {
		s.sums = make([]float64, pieces)
	}
	sums = s.sums[:pieces]
	piece := func(c int) {
		var a float64
		for i := c * samplePiece; i < min(n, (c+1)*samplePiece); i++ {
			prob[i] = math.Exp(float64(logits[i])/t - top)
			a += prob[i]
		}
		sums[c] = a
	}
	if s.Parallel != nil && pieces > 1 {
		s.Parallel(pieces, piece)
	} else {
		for c := range pieces {
			piece(c)
		}
	}
	return prob, sums
}

// SampleHost draws a token from logits as r says, in float64: the
// definition the devices' Sample follows. It may rewrite NaN logits as
// -Inf.
func SampleHost(logits []float32, r SampleRow, s *SampleScratch) int32 {
	n := len(logits)
	for i, l := range logits {
		if l != l {
			logits[i] = float32(math.Inf(-1))
		}
	}
	best := 0
	for i, l := range logits {
		if l > logits[best] {
			best = i
		}
	}
	if r.Temperature == 0 || n == 0 {
		return int32(best)
	}
	t := float64(r.Temperature)
	if cap(s.prob) < n {
		s.idx, s.prob = make([]int, n), make([]float64, n)
	}
	if r.Plain() {
		prob, sums := s.expSums(logits, t, float64(logits[best])/t)
		var total float64
		for _, a := range sums {
			total += a
		}
		// Whole pieces first, then the tokens of the piece u ends in.
		u := r.U * total
		for c, a := range sums {
			if u >= a {
				u -= a
				continue
			}
			for i := c * samplePiece; i < min(n, (c+1)*samplePiece); i++ {
				u -= prob[i]
				if u < 0 {
					return int32(i)
				}
			}
		}
		return int32(best)
	}
	k := n
	if r.TopK > 0 && int(r.TopK) < n {
		k = int(r.TopK)
	}
	if k < n {
		// The k most likely, normalised among themselves.
		idx := s.first(logits, k)
		prob := s.prob[:k]
		top := float64(logits[idx[0]]) / t
		var sum float64
		for i, j := range idx {
			prob[i] = math.Exp(float64(logits[j])/t - top)
			sum += prob[i]
		}
		for i := range prob {
			prob[i] /= sum
		}
		k, _ = r.cut(prob, true)
		return int32(idx[r.draw(prob[:k])])
	}
	// Every token a candidate (top-p or min-p alone): normalised over the
	// row in index order. The filters settle within the head of the
	// sorted order unless they keep most of the row, so the head is sorted
	// first, twice as long each time it does not settle them.
	top := float64(logits[best]) / t
	_, sums := s.expSums(logits, t, top)
	var sum float64
	for _, a := range sums {
		sum += a
	}
	for m := min(n, 1024); ; m = min(n, 2*m) {
		idx := s.first(logits, m)
		prob := s.prob[:m]
		for i, j := range idx {
			prob[i] = math.Exp(float64(logits[j])/t-top) / sum
		}
		if k, ok := r.cut(prob, m == n); ok {
			return int32(idx[r.draw(prob[:k])])
		}
	}
}

// cut applies min-p and then top-p to prob, the candidates' probabilities
// in sorted order (the head of that order unless complete), and returns
// how many of them stay; ok is false when the head does not tell.
func (r SampleRow) cut(prob []float64, complete bool) (k int, ok bool) {
	k = len(prob)
	known := complete
	if mp := float64(r.MinP); mp > 0 {
		c := mp * prob[0]
		for k > 1 && prob[k-1] < c {
			k--
		}
		known = known || k < len(prob)
	}
	if tp := float64(r.TopP); tp > 0 && tp < 1 {
		var acc float64
		for i := 0; i < k; i++ {
			acc += prob[i]
			if acc >= tp {
				return i + 1, true
			}
		}
	}
	return k, known
}

// draw walks prob, the kept candidates' probabilities, with r.U and
// returns the index it stops at.
func (r SampleRow) draw(prob []float64) int {
	var total float64
	for _, p := range prob {
		total += p
	}
	u := r.U * total
	for i, p := range prob {
		u -= p
		if u < 0 {
			return i
		}
	}
	return len(prob) - 1
}

// first returns the indexes of the k largest logits in sorted order
// (descending, ties to the lower index), selected through a heap whose
// root is the last of them.
func (s *SampleScratch) first(logits []float32, k int) []int {
	before := func(a, b int) bool { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b) }
	idx := s.idx[:k]
	down := func(i int) {
		for {
			c := 2*i + 1
			if c >= k {
				return
			}
			if c+1 < k && before(idx[c], idx[c+1]) {
				c++
			}
			if !before(idx[i], idx[c]) {
				return
			}
			idx[i], idx[c] = idx[c], idx[i]
			i = c
		}
	}
	for i := range idx {
		idx[i] = i
	}
	for i := k/2 - 1; i >= 0; i-- {
		down(i)
	}
	for j := k; j < len(logits); j++ {
		if before(j, idx[0]) {
			idx[0] = j
			down(0)
		}
	}
	sort.Slice(idx, func(a, b int) bool { return before(idx[a], idx[b]) })
	return idx
}
