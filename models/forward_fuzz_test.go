package models_test

import (
	"context"
	"math"
	"testing"

	"github.com/troupe/troupe/gpu/cpu"
	"github.com/troupe/troupe/models"
)

// batchFrom reads a batch from fuzz bytes: a count of sequences and of
// tokens, each sequence's block table, then each token's sequence,
// position, id and whether its logits are wanted. Every number is taken
// as it comes, in or out of range, so that Forward sees bad batches of
// every kind as well as good ones.
func batchFrom(raw []byte) *models.Batch {
	next := func() int {
		if len(raw) == 0 {
			return 0
		}
		v := int(int8(raw[0]))
		raw = raw[1:]
		return v
	}
	b := &models.Batch{}
	seqs, n := next()&7, next()&31
	for range seqs {
		t := make([]int32, next()&7)
		for j := range t {
			t[j] = int32(next())
		}
		b.Tables = append(b.Tables, t)
	}
	for i := range n {
		b.Seq = append(b.Seq, int32(next()))
		b.Pos = append(b.Pos, int32(next()*3))
		b.Tokens = append(b.Tokens, int32(next()*67))
		if next()&1 == 1 {
			b.Logits = append(b.Logits, int32(i))
		}
	}
	if n > 0 && next()&3 == 3 {
		b.Logits = append(b.Logits, int32(next()))
	}
	return b
}

// FuzzForward feeds arbitrary batches to the demo model on the CPU lane,
// one model and cache for every input: each batch is refused with an
// error or gives finite logits, and none panics.
func FuzzForward(f *testing.F) {
	b := openDemo(f)
	dev, err := cpu.New(cpu.Config{Threads: 1})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { dev.Close() })
	m, err := models.Load(b.Config, b.Checkpoint, dev, models.Options{MaxTokens: 24, MaxSeqs: 4})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { m.Close() })
	cache, err := m.NewCache(16, 16)
	if err != nil {
		f.Fatal(err)
	}
	// Two sequences, blocks 0-1 and 2: prompts of 3 and 2 tokens.
	f.Add([]byte{2, 5, 2, 0, 1, 1, 2, 0, 0, 7, 0, 0, 1, 9, 0, 0, 2, 11, 1, 1, 0, 13, 0, 1, 1, 15, 1})
	f.Add([]byte{1, 1, 1, 0, 0, 40, 3, 1})      // position 120: past the one block
	f.Add([]byte{1, 1, 1, 100, 0, 0, 3, 1})     // block 100 outside the cache
	f.Add([]byte{1, 2, 1, 0, 3, 0, 3, 1})       // a sequence id past the tables
	f.Add([]byte{1, 1, 1, 0, 0, 0, 127, 1})     // a token id past the vocabulary
	f.Add([]byte{0, 3, 0, 0, 0, 0, 0, 0})       // tokens and no sequences
	f.Add([]byte{1, 1, 1, 0, 0, 0, 3, 0, 3, 9}) // a logits row past the batch
	f.Fuzz(func(t *testing.T, raw []byte) {
		batch := batchFrom(raw)
		out := make([]float32, len(batch.Logits)*b.Config.Vocab)
		if err := m.Forward(context.Background(), cache, batch, out); err != nil {
			return
		}
		for i, v := range out {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("logit %d of an accepted batch is %v: %+v", i, v, batch)
			}
		}
	})
}
