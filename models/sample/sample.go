package sample

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
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
	// tokens already seen; 0 or 1 disables it.
	RepetitionPenalty float32
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
	}
	return nil
}

// Sampler draws tokens for one sequence.
type Sampler struct {
	p    Params
	rng  *rand.Rand
	idx  []int
	prob []float64
}

// New returns a sampler for p.
func New(p Params) *Sampler {
	var seed uint64
	if p.Seed != nil {
		seed = uint64(*p.Seed)
	} else {
		seed = rand.Uint64()
	}
	return &Sampler{p: p, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Greedy reports whether the sampler always picks the most likely token.
func (s *Sampler) Greedy() bool { return s.p.Temperature == 0 }

// Sample picks a token from logits, penalising tokens in seen. It modifies
// logits when a repetition penalty is set; LogProb gives the chosen token's
// log-probability under them.
func (s *Sampler) Sample(logits []float32, seen []int32) int32 {
	if rp := s.p.RepetitionPenalty; rp > 0 && rp != 1 {
		for _, id := range seen {
			if id >= 0 && int(id) < len(logits) {
				if l := logits[id]; l > 0 {
					logits[id] = l / rp
				} else {
					logits[id] = l * rp
				}
			}
		}
	}
	if s.Greedy() {
		return int32(Argmax(logits))
	}
	n := len(logits)
	if s.p.TopK == 0 && (s.p.TopP == 0 || s.p.TopP >= 1) && s.p.MinP == 0 {
		return s.plain(logits)
	}
	// Candidates sorted by logit, descending.
	if cap(s.idx) < n {
		s.idx = make([]int, n)
		s.prob = make([]float64, n)
	}
	idx := s.idx[:n]
	for i := range idx {
		idx[i] = i
	}
	k := n
	if s.p.TopK > 0 && s.p.TopK < n {
		k = s.p.TopK
	}
	sort.Slice(idx, func(a, b int) bool {
		if logits[idx[a]] != logits[idx[b]] {
			return logits[idx[a]] > logits[idx[b]]
		}
		return idx[a] < idx[b]
	})
	idx = idx[:k]
	prob := s.prob[:k]
	t := float64(s.p.Temperature)
	top := float64(logits[idx[0]]) / t
	var sum float64
	for i, j := range idx {
		prob[i] = math.Exp(float64(logits[j])/t - top)
		sum += prob[i]
	}
	for i := range prob {
		prob[i] /= sum
	}
	if mp := float64(s.p.MinP); mp > 0 {
		cut := mp * prob[0]
		for k > 1 && prob[k-1] < cut {
			k--
		}
	}
	if tp := float64(s.p.TopP); tp > 0 && tp < 1 {
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
	r := s.rng.Float64() * total
	pick := k - 1
	for i, p := range prob[:k] {
		r -= p
		if r < 0 {
			pick = i
			break
		}
	}
	return int32(idx[pick])
}

// plain draws from softmax(logits / temperature) without filtering, in
// one pass and no sort.
func (s *Sampler) plain(logits []float32) int32 {
	if cap(s.prob) < len(logits) {
		s.prob = make([]float64, len(logits))
	}
	prob := s.prob[:len(logits)]
	t := float64(s.p.Temperature)
	top := float64(logits[Argmax(logits)]) / t
	var total float64
	for i, l := range logits {
		prob[i] = math.Exp(float64(l)/t - top)
		total += prob[i]
	}
	r := s.rng.Float64() * total
	for i, p := range prob {
		r -= p
		if r < 0 {
			return int32(i)
		}
	}
	return int32(Argmax(logits))
}

// Argmax returns the index of the largest value, the lowest on ties.
func Argmax(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}

// LogProb is log softmax(logits)[i].
func LogProb(logits []float32, i int) float32 {
	mx := logits[Argmax(logits)]
	var sum float64
	for _, l := range logits {
		sum += math.Exp(float64(l - mx))
	}
	return float32(float64(logits[i]-mx) - math.Log(sum))
}

// TopLogProbs returns the k most likely tokens and their log-probabilities.
func TopLogProbs(logits []float32, k int) ([]int32, []float32) {
	if k <= 0 {
		return nil, nil
	}
	k = min(k, len(logits))
	mx := logits[Argmax(logits)]
	var sum float64
	for _, l := range logits {
		sum += math.Exp(float64(l - mx))
	}
	lse := float64(mx) + math.Log(sum)
	ids := make([]int32, 0, k)
	for range k {
		best := -1
		for i, l := range logits {
			if (best < 0 || l > logits[best]) && !contains(ids, int32(i)) {
				best = i
			}
		}
		ids = append(ids, int32(best))
	}
	lps := make([]float32, k)
	for i, id := range ids {
		lps[i] = float32(float64(logits[id]) - lse)
	}
	return ids, lps
}

func contains(v []int32, x int32) bool {
	for _, y := range v {
		if y == x {
			return true
		}
	}
	return false
}
