package models

import (
	"context"
	"fmt"

	"github.com/troupe/troupe/gpu"
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

// Greedy feeds first and then n-1 tokens of its own choosing, each the
// greedy choice after the one before, calling emit with each of the n
// choices in order: the same as n calls of FeedArgmax, each with the
// previous choice. On a device with gpu.Argmaxer and gpu.LateReader a
// step's token goes from its argmax to the next step's embedding on the
// device, and step t+1 is issued before step t's choice is read back, so
// the device does not wait for the host between steps. The ranks of a
// tensor-parallel model each feed their own choice, and their choices are
// checked to agree as they are read. It does not stop at end-of-sequence
// tokens.
func (s *Sequence) Greedy(ctx context.Context, first int32, n int, emit func(int32)) error {
	if n <= 0 {
		return nil
	}
	if s.pos+n > s.Cap() {
		return fmt.Errorf("greedy: %d tokens after %d exceed the context of %d", n, s.pos, s.Cap())
	}
	if !s.m.first() || !s.m.last() {
		return s.greedyEach(ctx, first, n, emit)
	}
	ranks := []*Model{s.m}
	if s.m.group != nil {
		ranks = s.m.group
	}
	readers := make([]gpu.LateReader, len(ranks))
	for i, rk := range ranks {
		_, argmaxer := rk.dev.(gpu.Argmaxer)
		lr, late := rk.dev.(gpu.LateReader)
		if !argmaxer || !late {
			return s.greedyEach(ctx, first, n, emit)
		}
		readers[i] = lr
	}
	b := &Batch{Tokens: []int32{first}, Pos: []int32{0}, Seq: []int32{0}, Tables: [][]int32{s.table}, Logits: []int32{0}}
	issue := func(from tokenSource) error {
		if s.m.group == nil {
			return s.m.issue(s.cache, b, true, from)
		}
		return s.m.each(s.cache, func(rk *Model, c *Cache) error { return rk.issue(c, b, true, from) })
	}
	// Two steps' reads are pending at most: got[i][r] is rank r's choice.
	var (
		got  [2][]int32
		wait [2][]func() error
	)
	for i := range got {
		got[i], wait[i] = make([]int32, len(ranks)), make([]func() error, len(ranks))
	}
	// drain waits for step i%2's reads, if any, so none outlives the call,
	// and checks that the ranks agree.
	drain := func(i int) error {
		var werr error
		for r, w := range wait[i] {
			if w == nil {
				continue
			}
			if err := w(); err != nil && werr == nil {
				werr = err
			}
			wait[i][r] = nil
		}
		if werr != nil {
			return werr
		}
		for r := 1; r < len(ranks); r++ {
			if got[i][r] != got[i][0] {
				return fmt.Errorf("rank %d chose token %d and rank 0 %d: the ranks diverged", r, got[i][r], got[i][0])
			}
		}
		return nil
	}
	defer func() { _, _ = drain(0), drain(1) }()
	for t := range n {
		if err := ctx.Err(); err != nil {
			return err
		}
		from := fromIndex
		if t > 0 {
			// The uploaded id is a placeholder: the step embeds the
			// previous step's argmax.
			b.Tokens[0], from = 0, fromPrevious
		}
		b.Pos[0] = int32(s.pos)
		if err := issue(from); err != nil {
			return fmt.Errorf("greedy: %w", err)
		}
		s.pos++
		for r, rk := range ranks {
			var err error
			if wait[t%2][r], err = readers[r].ReadLater(gpu.I32Bytes(got[t%2][r:r+1]), rk.s.next, 0); err != nil {
				return fmt.Errorf("greedy: %w", err)
			}
		}
		if t > 0 {
			if err := drain((t - 1) % 2); err != nil {
				return fmt.Errorf("greedy: %w", err)
			}
			emit(got[(t-1)%2][0])
		}
	}
	if err := drain((n - 1) % 2); err != nil {
		return fmt.Errorf("greedy: %w", err)
	}
	emit(got[(n-1)%2][0])
	return nil
}

// greedyEach is Greedy through FeedArgmax, a host round trip a token.
func (s *Sequence) greedyEach(ctx context.Context, first int32, n int, emit func(int32)) error {
	next := first
	for range n {
		var err error
		if next, err = s.FeedArgmax(ctx, []int32{next}); err != nil {
			return err
		}
		emit(next)
	}
	return nil
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
