package gpu

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// LogProbs returns the log-probability of token i under logits, and the
// k most likely tokens (ties to the lower id) with theirs; NaN logits are
// left out of both. The row is read in logProbChunks fixed pieces, each
// by its own goroutine where the row is long: one pass finds a piece's
// maximum and its k most likely, a second, while the piece is in the
// core's cache, sums its exponentials under that maximum, and the pieces'
// sums are scaled to the row's maximum and added in order, so the result
// does not depend on the goroutines.
func LogProbs(logits []float32, i, k int) (float32, []int32, []float32) {
	_, lp, ids, lps := logProbs(logits, i, k)
	return lp, ids, lps
}

// ArgmaxLogProbs is the greedy choice with LogProbs in one read of the
// row: the most likely token (the lowest id among equals, NaNs left out,
// 0 when no logit is above -Inf: SampleHost's choice at temperature
// 0), its log-probability, and the k most likely tokens with theirs.
func ArgmaxLogProbs(logits []float32, k int) (int32, float32, []int32, []float32) {
	return logProbs(logits, -1, k)
}

// logProbs is LogProbs of token i, or of the most likely token when i is
// negative, which it returns.
func logProbs(logits []float32, i, k int) (int32, float32, []int32, []float32) {
	k = max(0, min(k, len(logits)))
	var parts [logProbChunks]logProbPart
	size := (len(logits) + logProbChunks - 1) / logProbChunks
	scan := func(c int) { parts[c].scan(logits, min(c*size, len(logits)), min((c+1)*size, len(logits)), k) }
	if len(logits) < logProbParallel {
		for c := range logProbChunks {
			scan(c)
		}
	} else {
		InParallel(logProbChunks, scan)
	}
	mx := float32(math.Inf(-1))
	at := 0
	for c := range parts {
		if parts[c].max > mx {
			mx, at = parts[c].max, parts[c].at
		}
	}
	if i < 0 {
		i = at
	}
	sum := 0.0
	if !math.IsInf(float64(mx), -1) {
		for c := range parts {
			if p := &parts[c]; !math.IsInf(float64(p.max), -1) {
				sum += p.sum * ExpNonPos(float64(p.max)-float64(mx))
			}
		}
	}
	lse := float64(mx) + math.Log(sum)
	lp := float32(float64(logits[i]) - lse)
	if k == 0 {
		return int32(i), lp, nil, nil
	}
	// The pieces' candidates, most likely first, ties to the lower id.
	var ids []int32
	for c := range parts {
		ids = append(ids, parts[c].top...)
	}
	slices.SortFunc(ids, func(a, b int32) int {
		if c := cmp.Compare(logits[b], logits[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	ids = ids[:min(k, len(ids))]
	lps := make([]float32, len(ids))
	for j, id := range ids {
		lps[j] = float32(float64(logits[id]) - lse)
	}
	return int32(i), lp, ids, lps
}

// logProbChunks is how many pieces LogProbs reads a row in, and
// logProbParallel the row length from which it reads them at once.
const (
	logProbChunks   = 8
	logProbParallel = 1 << 14
)

// logProbPart is a piece of a row: its largest logit and where it first
// is, its k most likely tokens and its exponentials' sum under its
// largest logit.
type logProbPart struct {
	max float32
	at  int
	top []int32
	sum float64
}

// scan finds the largest of logits[lo:hi] (NaNs left out), where it first
// is, the piece's k most likely, ties to the lower id, and the sum of its
// exponentials under that largest (0 where none is above -Inf).
func (p *logProbPart) scan(logits []float32, lo, hi, k int) {
	mx, at := float32(math.Inf(-1)), 0
	ids := make([]int32, 0, k)
	// least is the least kept logit once k are kept.
	least := float32(math.Inf(-1))
	for id := lo; id < hi; id++ {
		l := logits[id]
		if l > mx { // never a NaN
			mx, at = l, id
		}
		if l != l || k == 0 || len(ids) == k && l <= least {
			continue
		}
		// Insert after the kept ones at least as likely.
		pos := len(ids)
		for pos > 0 && logits[ids[pos-1]] < l {
			pos--
		}
		if len(ids) < k {
			ids = append(ids, 0)
		}
		copy(ids[pos+1:], ids[pos:len(ids)-1])
		ids[pos] = int32(id)
		if len(ids) == k {
			least = logits[ids[k-1]]
		}
	}
	sum := 0.0
	if !math.IsInf(float64(mx), -1) {
		for _, l := range logits[lo:hi] {
			if l == l {
				sum += ExpNonPos(float64(l - mx))
			}
		}
	}
	p.max, p.at, p.top, p.sum = mx, at, ids, sum
}

// MaxSummaryTop is the most likely tokens a log-probability summary
// holds besides the chosen one: OpenAI's largest top_logprobs.
const MaxSummaryTop = 20

// SummaryWidth is how many float32s a log-probability summary of top
// most likely tokens takes (Summarize).
func SummaryWidth(top int) int { return 2 + 2*top }

// Summarize writes into dst (SummaryWidth(top) values) what LogProbs(logits,
// id, top) returns: the chosen token's log-probability, how many likely
// tokens follow, then each one's id (its bits, math.Float32frombits) and
// log-probability, most likely first; unused places are zero. A negative
// id (a token not chosen yet) gets a NaN log-probability. It is the
// reference for Summarizer devices.
func Summarize(dst, logits []float32, id int32, top int) {
	chosen := id >= 0 && int(id) < len(logits)
	lp, ids, lps := LogProbs(logits, max(0, min(int(id), len(logits)-1)), top)
	if !chosen {
		lp = float32(math.NaN())
	}
	clear(dst[:SummaryWidth(top)])
	dst[0], dst[1] = lp, float32(len(ids))
	for j, t := range ids {
		dst[2+2*j], dst[3+2*j] = math.Float32frombits(uint32(t)), lps[j]
	}
}

// ReadSummary returns a summary's chosen log-probability and at most top
// of its most likely tokens with theirs (Summarize).
func ReadSummary(row []float32, top int) (float32, []int32, []float32, error) {
	if len(row) < 2 {
		return 0, nil, nil, fmt.Errorf("log-probability summary of %d values", len(row))
	}
	n := int(row[1])
	if float32(n) != row[1] || n < 0 || len(row) < SummaryWidth(n) {
		return 0, nil, nil, fmt.Errorf("log-probability summary of %d values holds %v tokens", len(row), row[1])
	}
	n = min(n, top)
	if n == 0 {
		return row[0], nil, nil, nil
	}
	ids, lps := make([]int32, n), make([]float32, n)
	for j := range n {
		ids[j], lps[j] = int32(math.Float32bits(row[2+2*j])), row[3+2*j]
	}
	return row[0], ids, lps, nil
}

// SummaryRows checks a Summarizer's rows, width and top, and returns how
// many rows of logits (and ids) they need.
func SummaryRows(op string, rows []int32, width, top int) (int, error) {
	if width <= 0 || top < 0 || top > MaxSummaryTop || top > width {
		return 0, fmt.Errorf("%s: width %d, top %d (at most %d)", op, width, top, MaxSummaryTop)
	}
	n := 0
	for _, r := range rows {
		if r < 0 {
			return 0, fmt.Errorf("%s: row %d", op, r)
		}
		n = max(n, int(r)+1)
	}
	return n, nil
}
