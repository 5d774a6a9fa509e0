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

// MaxSampleTopK is the most tokens a device-side draw filters to
// (SampleRow.TopK): a filtered draw sorts its candidates in a block's
// shared memory.
const MaxSampleTopK = 1024

// Plain reports whether r draws from every token, unfiltered.
func (r SampleRow) Plain() bool {
	return r.TopK == 0 && (r.TopP == 0 || r.TopP >= 1) && r.MinP == 0
}

// OnDevice reports whether a gpu.Sampler draws r from rows of width
// logits: greedy and unfiltered draws always; filtered ones when TopK
// keeps at most MaxSampleTopK tokens.
func (r SampleRow) OnDevice(width int) bool {
	if r.Temperature == 0 || r.Plain() {
		return true
	}
	return r.TopK > 0 && min(int(r.TopK), width) <= MaxSampleTopK
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
type SampleScratch struct {
	idx  []int
	prob []float64
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
		prob := s.prob[:n]
		top := float64(logits[best]) / t
		var total float64
		for i, l := range logits {
			prob[i] = math.Exp(float64(l)/t - top)
			total += prob[i]
		}
		u := r.U * total
		for i, p := range prob {
			u -= p
			if u < 0 {
				return int32(i)
			}
		}
		return int32(best)
	}
	// Candidates sorted by logit, descending, ties to the lower index:
	// the k first of that order, kept in a heap whose root is the last.
	k := n
	if r.TopK > 0 && int(r.TopK) < n {
		k = int(r.TopK)
	}
	first := func(a, b int) bool { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b) }
	idx := s.idx[:k]
	down := func(i int) {
		for {
			c := 2*i + 1
			if c >= k {
				return
			}
			if c+1 < k && first(idx[c], idx[c+1]) {
				c++
			}
			if !first(idx[i], idx[c]) {
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
	for j := k; j < n; j++ {
		if first(j, idx[0]) {
			idx[0] = j
			down(0)
		}
	}
	sort.Slice(idx, func(a, b int) bool { return first(idx[a], idx[b]) })
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
	if mp := float64(r.MinP); mp > 0 {
		cut := mp * prob[0]
		for k > 1 && prob[k-1] < cut {
			k--
		}
	}
	if tp := float64(r.TopP); tp > 0 && tp < 1 {
		var acc float64
		for i := 0; i < k; i++ {
			acc += prob[i]
			if acc >= tp {
				k = i + 1
				break
			}
		}
	}
	var total float64
	for _, p := range prob[:k] {
		total += p
	}
	u := r.U * total
	pick := k - 1
	for i, p := range prob[:k] {
		u -= p
		if u < 0 {
			pick = i
			break
		}
	}
	return int32(idx[pick])
}
