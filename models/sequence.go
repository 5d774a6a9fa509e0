package models

import (
	"context"
	"fmt"
)

// Sequence runs one sequence through a model with a private KV cache: the
// simplest way to generate, used by the command line and tests. Servers
// batch many sequences through Model.Forward instead.
type Sequence struct {
	m      *Model
	cache  *Cache
	table  []int32
	pos    int
	logits []float32
}

// NewSequence allocates a cache for up to maxLen tokens (0: the model's
// context length).
func (m *Model) NewSequence(maxLen int) (*Sequence, error) {
	if maxLen <= 0 || maxLen > m.Config.MaxPositions {
		maxLen = m.Config.MaxPositions
	}
	const blockSize = 16
	blocks := (maxLen + blockSize - 1) / blockSize
	cache, err := m.NewCache(blocks, blockSize)
	if err != nil {
		return nil, err
	}
	s := &Sequence{m: m, cache: cache, table: make([]int32, blocks)}
	for i := range s.table {
		s.table[i] = int32(i)
	}
	return s, nil
}

// Len is the number of tokens processed so far.
func (s *Sequence) Len() int { return s.pos }

// Cap is the number of tokens the sequence can hold.
func (s *Sequence) Cap() int { return len(s.table) * s.cache.BlockSize }

// Close frees the cache.
func (s *Sequence) Close() { s.cache.Close() }

// Feed appends tokens, processing them in chunks of the model's step size,
// and returns the logits after the last one ([Vocab], valid until the next
// call). With all set it returns the logits of every fed token instead
// ([len(ids), Vocab]).
func (s *Sequence) Feed(ctx context.Context, ids []int32, all bool) ([]float32, error) {
	V := s.m.Config.Vocab
	rows := 1
	if all {
		rows = len(ids)
	}
	if cap(s.logits) < rows*V {
		s.logits = make([]float32, rows*V)
	}
	out := s.logits[:rows*V]
	err := s.feed(ids, func(b *Batch, start int, last bool) error {
		n := len(b.Tokens)
		dst := out
		switch {
		case all:
			b.Logits = resize(b.Logits, n)
			for i := range n {
				b.Logits[i] = int32(i)
			}
			dst = out[start*V:]
		case last:
			b.Logits = append(b.Logits[:0], int32(n-1))
		default:
			b.Logits = b.Logits[:0]
		}
		return s.m.Forward(ctx, s.cache, b, dst)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// FeedArgmax appends tokens like Feed and returns the greedy choice after
// the last one: the index of the largest logit, the lowest among equal
// maxima. Where the device computes the argmax (gpu.Argmaxer) only the id
// is read back, not the logits.
func (s *Sequence) FeedArgmax(ctx context.Context, ids []int32) (int32, error) {
	var next [1]int32
	err := s.feed(ids, func(b *Batch, _ int, last bool) error {
		if !last {
			b.Logits = b.Logits[:0]
			return s.m.Forward(ctx, s.cache, b, nil)
		}
		b.Logits = append(b.Logits[:0], int32(len(b.Tokens)-1))
		return s.m.ForwardArgmax(ctx, s.cache, b, next[:])
	})
	return next[0], err
}

// feed runs ids through the model in chunks of its step size: step gets each
// chunk's batch with tokens, positions and sequence filled in, the chunk's
// offset in ids, and whether it is the last.
func (s *Sequence) feed(ids []int32, step func(b *Batch, start int, last bool) error) error {
	if len(ids) == 0 {
		return fmt.Errorf("feed: no tokens")
	}
	if s.pos+len(ids) > s.Cap() {
		return fmt.Errorf("feed: %d tokens after %d exceed the context of %d", len(ids), s.pos, s.Cap())
	}
	chunk := s.m.opts.MaxTokens
	b := &Batch{Tables: [][]int32{s.table}}
	for start := 0; start < len(ids); start += chunk {
		n := min(chunk, len(ids)-start)
		b.Tokens = ids[start : start+n]
		b.Pos = resize(b.Pos, n)
		b.Seq = resize(b.Seq, n)
		for i := range n {
			b.Pos[i] = int32(s.pos + i)
			b.Seq[i] = 0
		}
		if err := step(b, start, start+n == len(ids)); err != nil {
			return err
		}
		s.pos += n
	}
	return nil
}

func resize(v []int32, n int) []int32 {
	if cap(v) < n {
		return make([]int32, n)
	}
	return v[:n]
}
