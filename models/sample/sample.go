package sample

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/troupe/troupe/gpu"
)

// Params choose how tokens are drawn. The zero value is greedy.
type Params struct {
	// Temperature divides the logits; 0 means greedy.
	Temperature float32
	// TopK keeps the k most likely tokens; 0 keeps all.
	TopK int
	// TopP keeps the smallest set of tokens whose probability reaches p; 0 or
	// 1 keeps all.
	TopP float32
	// MinP drops tokens less likely than MinP times the most likely; 0 keeps all.
	MinP float32
	// RepetitionPenalty divides positive (multiplies negative) logits of
	// tokens already seen, in the prompt or the output, each distinct token
	// once however often it repeats (as Hugging Face's
	// RepetitionPenaltyLogitsProcessor); 0 or 1 disables it.
	RepetitionPenalty float32
	// PresencePenalty is subtracted from the logit of each token the output
	// holds, FrequencyPenalty once for each time it holds it (OpenAI's
	// penalties, in [-2, 2]; negative values favour repeats).
	PresencePenalty, FrequencyPenalty float32
	// LogitBias is added to the logits of its tokens after the penalties
	// (in [-100, 100]: -100 all but bans a token, 100 all but forces it).
	LogitBias map[int32]float32
	// Seed makes draws reproducible; nil seeds from the runtime.
	Seed *int64
}

// Validate checks the ranges.
func (p Params) Validate() error {
	switch {
	case p.Temperature < 0 || math.IsNaN(float64(p.Temperature)) || p.Temperature > 100:
		return fmt.Errorf("temperature %v outside [0, 100]", p.Temperature)
	case p.TopK < 0:
		return fmt.Errorf("top_k %d is negative", p.TopK)
	case p.TopP < 0 || p.TopP > 1 || math.IsNaN(float64(p.TopP)):
		return fmt.Errorf("top_p %v outside [0, 1]", p.TopP)
	case p.MinP < 0 || p.MinP > 1 || math.IsNaN(float64(p.MinP)):
		return fmt.Errorf("min_p %v outside [0, 1]", p.MinP)
	case p.RepetitionPenalty < 0 || p.RepetitionPenalty > 10 || math.IsNaN(float64(p.RepetitionPenalty)):
		return fmt.Errorf("repetition_penalty %v outside [0, 10]", p.RepetitionPenalty)
	case !(p.PresencePenalty >= -2 && p.PresencePenalty <= 2):
		return fmt.Errorf("presence_penalty %v outside [-2, 2]", p.PresencePenalty)
	case !(p.FrequencyPenalty >= -2 && p.FrequencyPenalty <= 2):
		return fmt.Errorf("frequency_penalty %v outside [-2, 2]", p.FrequencyPenalty)
	case len(p.LogitBias) > MaxLogitBias:
		return fmt.Errorf("logit_bias has %d tokens, at most %d", len(p.LogitBias), MaxLogitBias)
	}
	for id, b := range p.LogitBias {
		if id < 0 || !(b >= -100 && b <= 100) {
			return fmt.Errorf("logit_bias: token %d, bias %v: want a token id and a bias in [-100, 100]", id, b)
		}
	}
	return nil
}

// MaxLogitBias is the most tokens a logit bias names.
const MaxLogitBias = 1024

// Adjusts reports whether p changes logits before a draw (penalties, a
// bias): then the draw needs the sequence's tokens, not the logits alone.
func (p Params) Adjusts() bool {
	return p.Penalties().Active() || len(p.LogitBias) > 0
}

// Penalties are p's penalties as a draw takes them.
func (p Params) Penalties() gpu.Penalties {
	return gpu.Penalties{Repetition: p.RepetitionPenalty, Presence: p.PresencePenalty, Frequency: p.FrequencyPenalty}
}

// Sampler draws tokens for one sequence.
type Sampler struct {
	p       Params
	rng     *rand.Rand
	scratch gpu.SampleScratch
	// next is the uniform number of the next draw when NextRow took it
	// from rng ahead of that draw.
	next    float64
	hasNext bool
}

// New returns a sampler for p.
func New(p Params) *Sampler {
	var seed uint64
	if p.Seed != nil {
		seed = uint64(*p.Seed)
	} else {
		seed = rand.Uint64()
	}
	s := &Sampler{p: p, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	s.scratch.Parallel = gpu.InParallel
	return s
}

// Greedy reports whether the sampler always picks the most likely token.
func (s *Sampler) Greedy() bool { return s.p.Temperature == 0 }

// Sample picks a token from logits after the penalties and bias adj
// says of the sequence's tokens (which generate.State keeps). It modifies
// logits where adj does; LogProb gives the chosen token's log-probability
// under them. The draw is gpu.SampleHost's.
func (s *Sampler) Sample(logits []float32, adj []gpu.LogitAdjust) int32 {
	r := s.Row()
	r.Adjust = adj
	return gpu.SampleHost(logits, r, &s.scratch)
}

// Row returns the draw of the next token as a device makes it, taking its
// uniform number from the sampler's generator (none for greedy): the same
// number Sample would take, so that either way the same token comes.
func (s *Sampler) Row() gpu.SampleRow {
	r := s.row()
	if !s.Greedy() {
		r.U = s.u()
	}
	return r
}

// NextRow returns the draw Row (or Sample) makes next, without making it:
// its uniform number is taken from the generator now and kept for that
// draw, so the sequence of numbers, and so of tokens, does not change.
// Called after a step's Row, it lets a device queue the step after it
// before the step is read.
func (s *Sampler) NextRow() gpu.SampleRow {
	r := s.row()
	if !s.Greedy() {
		if !s.hasNext {
			s.next, s.hasNext = s.rng.Float64(), true
		}
		r.U = s.next
	}
	return r
}

// u takes the next draw's uniform number.
func (s *Sampler) u() float64 {
	if s.hasNext {
		s.hasNext = false
		return s.next
	}
	return s.rng.Float64()
}

func (s *Sampler) row() gpu.SampleRow {
	return gpu.SampleRow{Temperature: s.p.Temperature, TopP: s.p.TopP, MinP: s.p.MinP, TopK: int32(min(s.p.TopK, math.MaxInt32)), Penalties: s.p.Penalties()}
}

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
// 0 when no logit is above -Inf: gpu.SampleHost's choice at temperature
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
		gpu.InParallel(logProbChunks, scan)
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
				sum += p.sum * gpu.ExpNonPos(float64(p.max)-float64(mx))
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
				sum += gpu.ExpNonPos(float64(l - mx))
			}
		}
	}
	p.max, p.at, p.top, p.sum = mx, at, ids, sum
}
