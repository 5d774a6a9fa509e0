package sample

import (
	"fmt"
	"math"
	"math/rand/v2"

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
