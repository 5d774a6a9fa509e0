package scheduler

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/generate"
)

// promptReference is the log-probability of each of prompt's tokens after
// the first, with the top most likely tokens, from one forward pass of the
// demo model over the whole prompt on a cache of its own.
func promptReference(t *testing.T, prompt []int32, top int) []TokenLogprob {
	t.Helper()
	b, dev := demoOnCPU(t)
	n := len(prompt)
	m, err := models.Load(b.Config, b.Checkpoint, dev, models.Options{MaxTokens: n, MaxSeqs: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	blocks := (n + 15) / 16
	cache, err := m.NewCache(blocks, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close()
	batch := &models.Batch{Tokens: prompt, Tables: [][]int32{make([]int32, blocks)}}
	for i := range blocks {
		batch.Tables[0][i] = int32(i)
	}
	for p := range n {
		batch.Pos, batch.Seq, batch.Logits = append(batch.Pos, int32(p)), append(batch.Seq, 0), append(batch.Logits, int32(p))
	}
	V := b.Config.Vocab
	logits := make([]float32, n*V)
	if err := m.Forward(context.Background(), cache, batch, logits); err != nil {
		t.Fatal(err)
	}
	var out []TokenLogprob
	for p := 0; p < n-1; p++ {
		lp, ids, lps := gpu.LogProbs(logits[p*V:(p+1)*V], int(prompt[p+1]), top)
		out = append(out, TokenLogprob{ID: prompt[p+1], Logprob: lp, TopIDs: ids, TopLPs: lps})
	}
	return out
}

// TestPromptLogprobs: a request that asks gets its prompt's
// log-probabilities on its first frame, equal to one pass over the whole
// prompt, whether the prompt runs in one step or in chunks of 16 beside
// other requests, past the rows a step reads (a 300-token prompt), and
// when an earlier request left its prefix in the cache.
func TestPromptLogprobs(t *testing.T) {
	samples := demoSamples(t)
	long := []int32{}
	for len(long) < 300 {
		for _, s := range samples {
			long = append(long, s.PromptIDs...)
		}
	}
	long = long[:300]
	prompts := [][]int32{samples[0].PromptIDs, samples[1].PromptIDs, long}
	for _, budget := range []int{16, 512} {
		t.Run(fmt.Sprintf("budget%d", budget), func(t *testing.T) {
			h := start(t, 256, Config{MaxQueue: 16, MaxBatchTokens: budget, MaxSeqs: 8})
			for round := range 2 { // the second round's prompts are in the cache
				var cs []*collect
				for i, p := range prompts {
					col := newCollect()
					cs = append(cs, col)
					params := generate.Params{MaxTokens: 2, IgnoreEOS: true, Logprobs: true, TopLogprobs: 3, PromptLogprobs: i != 1 || round == 1}
					if err := h.s.Submit(&Request{ID: fmt.Sprint(round, "-", i), Prompt: p, Params: params, Detok: nop{}, Sink: col.sink}); err != nil {
						t.Fatal(err)
					}
					// A request without prompt log-probabilities beside them.
					plain := newCollect()
					if err := h.s.Submit(&Request{ID: fmt.Sprint(round, "-plain-", i), Prompt: p, Params: greedy(2), Detok: nop{}, Sink: plain.sink}); err != nil {
						t.Fatal(err)
					}
					defer plain.wait(t)
				}
				for i, col := range cs {
					frames := col.wait(t)
					got := frames[0].Prompt
					if i == 1 && round == 0 {
						if got != nil {
							t.Errorf("prompt log-probabilities not asked for, %d given", len(got))
						}
						continue
					}
					want := promptReference(t, prompts[i], 3)
					if len(got) != len(want) {
						t.Fatalf("round %d, prompt %d: %d log-probabilities, want %d", round, i, len(got), len(want))
					}
					for k := range want {
						g, w := got[k], want[k]
						if g.ID != w.ID || math.Abs(float64(g.Logprob-w.Logprob)) > 1e-4 || len(g.TopIDs) != 3 || g.TopIDs[0] != w.TopIDs[0] ||
							math.Abs(float64(g.TopLPs[0]-w.TopLPs[0])) > 1e-4 {
							t.Fatalf("round %d, prompt %d, token %d: %+v, want %+v", round, i, k+1, g, w)
						}
					}
					for _, f := range frames[1:] {
						if f.Prompt != nil {
							t.Errorf("prompt log-probabilities on frame %d", f.Seq)
						}
					}
				}
			}
		})
	}
}
