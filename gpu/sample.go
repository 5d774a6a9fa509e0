package gpu

import (
	"cmp"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
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
//
// Adjust changes logits of the row first, as Penalties say
// (AdjustLogits): a token at most once, the tokens the sequence has seen
// and those with a bias. A row that Follows carries no list: its list is
// the one its row of the previous draw into the same buffer used, after
// that draw's token (Saw). Only a device that keeps the lists takes such
// rows, in a step fed by the one before (FollowRows).
type SampleRow struct {
	Temperature, TopP, MinP float32
	TopK                    int32
	U                       float64
	Penalties               Penalties     `msgpack:",omitempty"`
	Adjust                  []LogitAdjust `msgpack:",omitempty"`
	Follows                 bool          `msgpack:",omitempty"`
}

// Equal reports whether r and o draw alike.
func (r SampleRow) Equal(o SampleRow) bool {
	return r.Temperature == o.Temperature && r.TopP == o.TopP && r.MinP == o.MinP && r.TopK == o.TopK && r.U == o.U &&
		r.Penalties == o.Penalties && r.Follows == o.Follows && slices.Equal(r.Adjust, o.Adjust)
}

// Penalties are a sequence's penalties on the tokens it has seen: the
// repetition penalty (Hugging Face's: a seen token's logit l becomes
// l/Repetition where l > 0 and l·Repetition otherwise; 0 and 1 leave it)
// and OpenAI's presence and frequency penalties (Presence +
// Count·Frequency taken from the logit of a token the output holds Count
// times).
type Penalties struct {
	_msgpack                        struct{} `msgpack:",as_array"`
	Repetition, Presence, Frequency float32
}

// Repeats reports whether the repetition penalty changes logits.
func (p Penalties) Repeats() bool { return p.Repetition != 0 && p.Repetition != 1 }

// Counting reports whether the presence and frequency penalties do.
func (p Penalties) Counting() bool { return p.Presence != 0 || p.Frequency != 0 }

// Active reports whether the adjustments change as the output grows
// (Saw).
func (p Penalties) Active() bool { return p.Repeats() || p.Counting() }

// LogitAdjust is what a draw's adjustments know of one token: whether the
// sequence has seen it (in the prompt, where a repetition penalty reads
// it, or in the output), how many times the output holds it, and its
// bias: finite, or -Inf for a token the draw may not take (a grammar's).
type LogitAdjust struct {
	_msgpack struct{} `msgpack:",as_array"`
	ID       int32
	Seen     bool
	Count    int32
	Bias     float32
}

// Saw counts one more of a's token in the output.
func (a *LogitAdjust) Saw() { a.Seen, a.Count = true, a.Count+1 }

// Adjust is logit l of a's token as p change it: divided by the
// repetition penalty where l > 0, multiplied otherwise, if seen; then
// minus Presence + Count·Frequency if the output holds it; then plus
// the bias. Each operation is rounded to float32, as the devices do.
func (p Penalties) Adjust(l float32, a LogitAdjust) float32 {
	if a.Seen && p.Repeats() {
		if l > 0 {
			l /= p.Repetition
		} else {
			l *= p.Repetition
		}
	}
	add := a.Bias
	if a.Count > 0 && p.Counting() {
		f := float32(float32(a.Count) * p.Frequency)
		add = float32(-float32(p.Presence+f)) + a.Bias
	}
	return l + add
}

// AdjustLogits applies adj to logits in place as p say; ids outside
// logits are skipped.
func AdjustLogits(logits []float32, p Penalties, adj []LogitAdjust) {
	for _, a := range adj {
		if a.ID >= 0 && int(a.ID) < len(logits) {
			logits[a.ID] = p.Adjust(logits[a.ID], a)
		}
	}
}

// Saw updates r's adjustments for a token its output gained, when its
// penalties read the output (Penalties.Active): the token's entry counts
// one more, or is added at the end.
func (r *SampleRow) Saw(id int32) {
	if !r.Penalties.Active() {
		return
	}
	for i := range r.Adjust {
		if r.Adjust[i].ID == id {
			r.Adjust[i].Saw()
			return
		}
	}
	r.Adjust = append(r.Adjust, LogitAdjust{ID: id, Seen: true, Count: 1})
}

// FollowRows resolves rows, the draws of a step fed by the one before,
// whose draws were prev and whose tokens were ids: a row that Follows
// takes its row of prev's list, after ids (Saw). The others are kept.
func FollowRows(prev []SampleRow, ids []int32, rows []SampleRow) ([]SampleRow, error) {
	out := slices.Clone(rows)
	for i, r := range rows {
		if !r.Follows {
			continue
		}
		if i >= len(prev) || i >= len(ids) || prev[i].Follows {
			return nil, fmt.Errorf("sample: row %d follows a draw of %d rows that is not known", i, len(prev))
		}
		if ids[i] < 0 {
			return nil, fmt.Errorf("sample: row %d follows a draw of token %d", i, ids[i])
		}
		r.Follows, r.Adjust = false, slices.Clone(prev[i].Adjust)
		r.Saw(ids[i])
		out[i] = r
	}
	return out, nil
}

// MaxSampleTopK is the largest top-k a device-side draw takes below the
// row's width: its candidates are sorted in a block's shared memory.
// Top-p and min-p over the whole row (Whole) are drawn on the device
// whatever they keep (Sampler).
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
// without a top-k below width, or a top-k of the whole row), which
// SampleHost and the devices draw a bucket of logits at a time.
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
	if p := r.Penalties; !(p.Repetition >= 0) || !finite(p.Repetition) || !finite(p.Presence) || !finite(p.Frequency) {
		return fmt.Errorf("sample: penalties %v, %v, %v", p.Repetition, p.Presence, p.Frequency)
	}
	if r.Follows && len(r.Adjust) > 0 {
		return fmt.Errorf("sample: a row that follows the draw before carries %d adjustments", len(r.Adjust))
	}
	for _, a := range r.Adjust {
		if a.Count < 0 || math.IsNaN(float64(a.Bias)) || math.IsInf(float64(a.Bias), 1) {
			return fmt.Errorf("sample: token %d: count %d, bias %v", a.ID, a.Count, a.Bias)
		}
	}
	return nil
}

func finite(f float32) bool { return !math.IsNaN(float64(f)) && !math.IsInf(float64(f), 0) }

// SampleScratch is SampleHost's working memory, reused between draws.
// Parallel, when set, runs f(0) … f(n-1) at once and returns when all are
// done: SampleHost then takes the exponentials of an unfiltered or
// whole-row draw a piece each (samplePiece), with the same result.
type SampleScratch struct {
	Parallel func(n int, f func(i int))
	idx      []int
	prob     []float64
	sums     []float64
	mass     []float64 // a whole-row draw's sums by bucket (sampleBuckets)
	head     []int32   // and each bucket's first token (or -1)
	next     []int32   // and each token's next in its bucket (or -1)
}

// CopyRows copies src into dst as copy does, a large copy (logits rows
// read back beside a step's tokens: megabytes a step) in pieces on
// several goroutines, since one core copies at a fraction of the
// memory's rate.
func CopyRows[T any](dst, src []T) {
	const piece = 1 << 16 // elements
	n := min(len(dst), len(src))
	if n <= 4*piece {
		copy(dst, src)
		return
	}
	InParallel((n+piece-1)/piece, func(i int) {
		copy(dst[i*piece:min(n, (i+1)*piece)], src[i*piece:min(n, (i+1)*piece)])
	})
}

// InParallel runs f(0) … f(n-1) on up to GOMAXPROCS goroutines and
// returns when all are done: a SampleScratch.Parallel for draws on the
// host.
func InParallel(n int, f func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(n, runtime.GOMAXPROCS(0)) {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				f(i)
			}
		})
	}
	wg.Wait()
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
			prob[i] = ExpNonPos(float64(logits[i])/t - top)
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

// argmaxHost rewrites NaN logits as -Inf and returns the index of the
// largest, the lowest among equals (0 when every one is -Inf or the row
// is empty), in one pass: eight lanes each keep the first index of their
// largest, so that no comparison waits for the one before it.
func argmaxHost(logits []float32) int {
	const lanes = 8
	neg := float32(math.Inf(-1))
	var mx [lanes]float32
	var at [lanes]int
	for j := range mx {
		mx[j], at[j] = neg, -1
	}
	i := 0
	for ; i+lanes <= len(logits); i += lanes {
		v := logits[i : i+lanes : i+lanes]
		for j := range lanes {
			l := v[j]
			if l != l {
				v[j] = neg
				continue
			}
			if l > mx[j] {
				mx[j], at[j] = l, i+j
			}
		}
	}
	for ; i < len(logits); i++ {
		l := logits[i]
		if l != l {
			logits[i] = neg
			continue
		}
		if l > mx[0] {
			mx[0], at[0] = l, i
		}
	}
	best, bestV := 0, neg
	for j := range lanes {
		if at[j] >= 0 && (mx[j] > bestV || mx[j] == bestV && at[j] < best) {
			best, bestV = at[j], mx[j]
		}
	}
	return best
}

// SampleHost draws a token from logits as r says, in float64: the
// definition the devices' Sample follows. Top-p and min-p over the whole
// row add up probabilities a bucket of logits at a time where they can
// (whole), so they draw the tokens that summing them one by one in sorted
// order would, up to the order of float64 sums. It applies r's adjustments to
// logits first and may rewrite NaN logits as -Inf.
func SampleHost(logits []float32, r SampleRow, s *SampleScratch) int32 {
	AdjustLogits(logits, r.Penalties, r.Adjust)
	n := len(logits)
	best := argmaxHost(logits)
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
		k = r.cut(prob)
		return int32(idx[r.draw(prob[:k])])
	}
	// Every token a candidate (top-p or min-p alone).
	top := float64(logits[best]) / t
	if math.IsInf(top, 0) {
		// No finite largest logit/t (every logit -Inf, or +Inf among
		// them): every probability is NaN, so no filter cuts and the walk
		// ends on the last token of the sorted row.
		last := 0
		for i, l := range logits {
			if l <= logits[last] {
				last = i
			}
		}
		return int32(last)
	}
	prob, sums := s.expSums(logits, t, top)
	var sum float64
	for _, a := range sums {
		sum += a
	}
	return s.whole(logits, r, float64(logits[best]), t, prob, sum)
}

// sampleBuckets is how many ranges of logits a whole-row draw counts the
// row's probability in, each 1/sampleBuckets of sampleDepth wide in
// logit/temperature (log-probability) from the largest logit down; the
// last also takes every token below. A flat row at a usual temperature
// spreads over hundreds of them, tens to hundreds of tokens each, while
// their sums stay in the cache.
const sampleBuckets = 4096

// sampleDepth is the logit/temperature below the largest that the
// buckets span: past it a token is less than e^-32 as likely as the most
// likely, so even a row of a million tokens holds less than 2e-8 of its
// probability there, and top-p (a float32 below 1) and the draw all but
// never walk into it, though they may.
const sampleDepth = 32

// whole draws from logits with min-p and then top-p over the whole row:
// prob holds each token's exp(logit/t - top), sum their sum, hi the
// largest logit. Sorting the candidates would cost most of a draw where
// the filters keep most of the row (a flat one), so whole sums their
// probabilities by bucket of logits (each bucket a range of the sorted
// order, ties within one) and walks the buckets from the largest logits
// down as cut and draw walk the sorted candidates: a bucket that the
// running sum passes whole is added as its sum, and only one in which it
// reaches top-p or the draw is sorted and walked token by token. The sums
// so differ from the sorted order's in rounding alone, and a draw costs a
// pass over the row and the sort of a bucket or two, however much of it
// the filters keep; only a row flatter than a bucket (every logit within
// 1/128 of the temperature of the largest) comes to a sort of the row.
func (s *SampleScratch) whole(logits []float32, r SampleRow, hi, t float64, prob []float64, sum float64) int32 {
	// Min-p keeps the tokens at least c likely (c is 0 without it):
	// probability rises with the logit, so they are the sorted order's
	// first, as cut drops the last ones below c.
	var c float64
	if r.MinP > 0 {
		c = float64(r.MinP) * (1 / sum)
	}
	mass, head, next := s.bucket(logits, prob, sum, c, hi, sampleBuckets/(sampleDepth*t))
	last := sampleBuckets - 1 // the candidates' last bucket
	for head[last] < 0 {
		last--
	}
	got := -1 // the bucket items holds
	var items []int
	sorted := func(b int) []int {
		if b != got {
			items = s.idx[:0]
			for i := head[b]; i >= 0; i = next[i] {
				items = append(items, int(i))
			}
			slices.Reverse(items) // into index order: a run of ties is sorted
			slices.SortFunc(items, func(i, j int) int {
				if d := cmp.Compare(logits[j], logits[i]); d != 0 {
					return d
				}
				return i - j
			})
			got = b
		}
		return items
	}
	// Top-p keeps the buckets before end whole and the first keep
	// tokens of bucket end.
	end, keep := last+1, 0
	if tp := float64(r.TopP); tp > 0 && tp < 1 {
		var acc float64
	cut:
		for b := range end {
			if acc+mass[b] < tp {
				acc += mass[b]
				continue
			}
			for j, i := range sorted(b) {
				if acc += prob[i]; acc >= tp {
					end, keep = b, j+1
					break cut
				}
			}
		}
	}
	// The draw, over the buckets kept whole and then the tokens of the
	// cut one.
	var total float64
	for _, m := range mass[:end] {
		total += m
	}
	if keep > 0 {
		for _, i := range sorted(end)[:keep] {
			total += prob[i]
		}
	}
	u := r.U * total
	for b, m := range mass[:end] {
		if u >= m {
			u -= m
			continue
		}
		for _, i := range sorted(b) {
			if u -= prob[i]; u < 0 {
				return int32(i)
			}
		}
	}
	if keep > 0 {
		kept := sorted(end)[:keep]
		for _, i := range kept {
			if u -= prob[i]; u < 0 {
				return int32(i)
			}
		}
		return int32(kept[keep-1])
	}
	kept := sorted(last)
	return int32(kept[len(kept)-1])
}

// bucket normalises prob by sum and sums the candidates' probabilities
// (those at least c) by bucket into mass, listing each bucket's tokens
// from head through next (-1 ends a list); the other tokens go to bucket
// sampleBuckets, out of the walk. A token's bucket, (hi - logit)·scale
// up to the last, falls as its logit rises (each step is monotone), so a
// bucket's tokens all come before a later one's in the sorted order, and
// ties share one.
func (s *SampleScratch) bucket(logits []float32, prob []float64, sum, c, hi, scale float64) (mass []float64, head, next []int32) {
	n := len(logits)
	if cap(s.next) < n {
		s.next = make([]int32, n)
	}
	if s.mass == nil {
		s.mass, s.head = make([]float64, sampleBuckets+1), make([]int32, sampleBuckets+1)
	}
	mass, head, next = s.mass, s.head, s.next[:n]
	clear(mass)
	for b := range head {
		head[b] = -1
	}
	prob = prob[:n]
	for i, l := range logits {
		p := prob[i] / sum
		prob[i] = p
		f := (hi - float64(l)) * scale
		b := int(f)
		if !(f < sampleBuckets-1) {
			b = sampleBuckets - 1
		}
		// Out of min-p (p < c: p-c negative, its sign bit set), the
		// token goes to bucket sampleBuckets, without a branch that
		// half of a flat row's tokens would mispredict.
		out := int(math.Float64bits(p-c) >> 63)
		b += out * (sampleBuckets - b)
		mass[b] += p
		next[i], head[b] = head[b], int32(i)
	}
	return mass, head, next
}

// cut applies min-p and then top-p to prob, the candidates'
// probabilities in sorted order, and returns how many of them stay.
func (r SampleRow) cut(prob []float64) int {
	k := len(prob)
	if mp := float64(r.MinP); mp > 0 {
		c := mp * prob[0]
		for k > 1 && prob[k-1] < c {
			k--
		}
	}
	if tp := float64(r.TopP); tp > 0 && tp < 1 {
		var acc float64
		for i := 0; i < k; i++ {
			acc += prob[i]
			if acc >= tp {
				return i + 1
			}
		}
	}
	return k
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
