package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"

	"github.com/troupe/troupe/bus"
	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models"
)

// Failover is an Engine over several placements of one model (pipelines
// whose stages may sit on other nodes), in order of preference, sharing
// one KV-manager's block tables. It runs each step on one placement; when
// a step fails because a stage is gone (error code unavailable or
// deadline), it marks that placement down and moves to the next one that
// is up, re-prefilling there, from the tokens it has seen, whatever the
// sequences of the step have in their cache. The scheduler sees the step
// succeed: no token is repeated or lost. When no placement is left the
// step fails and the scheduler ends its sequences with an error frame.
//
// Forward is called by one goroutine (the scheduler's); Restore and State
// may be called from any goroutine.
type Failover struct {
	blockSize int
	maxTokens int
	// Switched, when set, is called on the Forward goroutine when the
	// active placement changes; err is the failure that caused it, or nil
	// when a preferred placement came back.
	Switched func(from, to string, err error)

	mu       sync.Mutex // guards up, restored and active
	up       []bool
	restored []bool
	active   int

	// Owned by Forward.
	engines []Engine
	names   []string
	cur     int
	valid   []map[int32]uint64 // per placement: block -> offsets whose KV it holds
	hist    map[int32][]int32  // block -> token at each offset (-1: none)
	scratch []float32
	vocab   int
	logits  []float32 // a greedy step's logits, from an engine without ArgmaxEngine
	draw    gpu.SampleScratch
}

// NewFailover returns a Failover over engines (named by names, in order
// of preference) whose caches are indexed by the block tables of a
// KV pool of blocks of blockSize tokens; replays use at most maxTokens
// tokens per step and need a vocab-wide scratch row.
func NewFailover(engines []Engine, names []string, blockSize, maxTokens, vocab int) (*Failover, error) {
	if len(engines) == 0 || len(engines) != len(names) {
		return nil, fmt.Errorf("failover: %d engines with %d names", len(engines), len(names))
	}
	if blockSize < 1 || blockSize > 64 || maxTokens < 1 || vocab < 1 {
		return nil, fmt.Errorf("failover: block size %d (want 1..64), max tokens %d, vocab %d", blockSize, maxTokens, vocab)
	}
	f := &Failover{blockSize: blockSize, maxTokens: maxTokens, engines: engines, names: names,
		up: make([]bool, len(engines)), restored: make([]bool, len(engines)),
		valid: make([]map[int32]uint64, len(engines)), hist: map[int32][]int32{}, scratch: make([]float32, vocab), vocab: vocab}
	for i := range engines {
		f.up[i] = true
		f.valid[i] = map[int32]uint64{}
	}
	return f, nil
}

// PlacementState says whether a placement is up and whether it is active.
type PlacementState struct {
	Name       string
	Up, Active bool
}

// State reports every placement.
func (f *Failover) State() []PlacementState {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]PlacementState, len(f.names))
	for i, n := range f.names {
		out[i] = PlacementState{Name: n, Up: f.up[i], Active: i == f.active}
	}
	return out
}

// Restore marks placement i up again with an empty cache (its stages were
// started afresh); the next step moves back to it if it is preferred.
func (f *Failover) Restore(i int) error {
	if i < 0 || i >= len(f.names) {
		return fmt.Errorf("failover: no placement %d", i)
	}
	f.mu.Lock()
	f.up[i], f.restored[i] = true, true
	f.mu.Unlock()
	return nil
}

// Down marks placement i down, as a failed step would.
func (f *Failover) Down(i int) {
	if i >= 0 && i < len(f.names) {
		f.mu.Lock()
		f.up[i] = false
		f.mu.Unlock()
	}
}

// IsDead reports whether err means a stage of the placement is gone
// rather than a problem with the step itself.
func IsDead(err error) bool {
	switch bus.CodeOf(err) {
	case bus.CodeUnavailable, bus.CodeDeadline:
		return true
	}
	return false
}

// pick returns the most preferred placement that is up, applying restores.
func (f *Failover) pick() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.up {
		if f.restored[i] {
			f.restored[i] = false
			f.valid[i] = map[int32]uint64{}
		}
	}
	for i, up := range f.up {
		if up {
			return i
		}
	}
	return -1
}

// Forward implements Engine.
func (f *Failover) Forward(ctx context.Context, b *models.Batch, logits []float32) error {
	return f.forward(ctx, b, func(e Engine) error { return e.Forward(ctx, b, logits) })
}

// ForwardArgmax implements ArgmaxEngine; a placement whose engine cannot
// choose tokens returns logits and the choice is made here.
func (f *Failover) ForwardArgmax(ctx context.Context, b *models.Batch, ids []int32) error {
	return f.forward(ctx, b, func(e Engine) error {
		if ae, ok := e.(ArgmaxEngine); ok {
			return ae.ForwardArgmax(ctx, b, ids)
		}
		return f.chooseOnHost(ctx, e, b, nil, ids, nil)
	})
}

// ForwardChoose implements ChooseEngine; a placement whose engine cannot
// choose tokens returns logits, and the choice is made here.
func (f *Failover) ForwardChoose(ctx context.Context, b *models.Batch, rows []gpu.SampleRow, ids []int32, logits []float32) error {
	if err := b.CheckReadInto(logits, f.vocab); err != nil {
		return fmt.Errorf("failover: %w", err)
	}
	if rows != nil && len(rows) != len(b.Logits) {
		return fmt.Errorf("failover: %d draws for %d logits rows", len(rows), len(b.Logits))
	}
	return f.forward(ctx, b, func(e Engine) error {
		if ce, ok := e.(ChooseEngine); ok {
			return ce.ForwardChoose(ctx, b, rows, ids, logits)
		}
		return f.chooseOnHost(ctx, e, b, rows, ids, logits)
	})
}

// chooseOnHost runs b on e for its logits and chooses (rows nil) or draws
// the tokens here, with the rows b.Read names into logits (none without
// logits).
func (f *Failover) chooseOnHost(ctx context.Context, e Engine, b *models.Batch, rows []gpu.SampleRow, ids []int32, logits []float32) error {
	f.logits = slices.Grow(f.logits[:0], len(b.Logits)*f.vocab)[:len(b.Logits)*f.vocab]
	if err := e.Forward(ctx, b, f.logits); err != nil {
		return err
	}
	chooseOnHost(ids, f.logits, f.vocab, rows, &f.draw, b, logits)
	return nil
}

// forward runs a step with run on the first placement that is up, moving
// to the next when one is found dead.
func (f *Failover) forward(ctx context.Context, b *models.Batch, run func(Engine) error) error {
	f.record(b)
	var last error
	for {
		i := f.pick()
		if i < 0 {
			if last == nil {
				last = errors.New("every placement is down")
			}
			return bus.Errorf(bus.CodeUnavailable, "no replica left: %w", last)
		}
		if i != f.cur {
			if f.Switched != nil {
				f.Switched(f.names[f.cur], f.names[i], last)
			}
			f.cur = i
			f.mu.Lock()
			f.active = i
			f.mu.Unlock()
		}
		err := f.replay(ctx, i, b)
		if err == nil {
			err = run(f.engines[i])
		}
		if err == nil {
			f.markValid(i, b.Tables, b.Seq, b.Pos)
			return nil
		}
		if ctx.Err() != nil || !IsDead(err) {
			return err
		}
		f.mu.Lock()
		f.up[i] = false
		f.mu.Unlock()
		f.valid[i] = map[int32]uint64{}
		last = fmt.Errorf("placement %s: %w", f.names[i], err)
	}
}

// slot returns the block and offset of position p of a sequence.
func (f *Failover) slot(table []int32, p int32) (int32, int, bool) {
	bi := int(p) / f.blockSize
	if p < 0 || bi >= len(table) {
		return 0, 0, false
	}
	return table[bi], int(p) % f.blockSize, true
}

// record notes the tokens the step writes into the cache, and that no
// placement holds their slots' new content yet.
func (f *Failover) record(b *models.Batch) {
	for k, p := range b.Pos {
		s := b.Seq[k]
		if s < 0 || int(s) >= len(b.Tables) || k >= len(b.Tokens) {
			continue
		}
		blk, off, ok := f.slot(b.Tables[s], p)
		if !ok {
			continue
		}
		h := f.hist[blk]
		if h == nil {
			h = make([]int32, f.blockSize)
			for j := range h {
				h[j] = -1
			}
			f.hist[blk] = h
		}
		// The slot's content depends on the whole prefix, not just the
		// token: whatever a placement held there is stale now.
		h[off] = b.Tokens[k]
		for _, v := range f.valid {
			v[blk] &^= 1 << off
		}
	}
}

func (f *Failover) markValid(i int, tables [][]int32, seqs, pos []int32) {
	for k, p := range pos {
		s := seqs[k]
		if s < 0 || int(s) >= len(tables) {
			continue
		}
		if blk, off, ok := f.slot(tables[s], p); ok {
			f.valid[i][blk] |= 1 << off
		}
	}
}

// replay re-prefills on placement i the positions that the step's
// sequences need in cache and i does not hold.
func (f *Failover) replay(ctx context.Context, i int, b *models.Batch) error {
	start := map[int32]int32{} // sequence -> first position of the step
	for k, p := range b.Pos {
		s := b.Seq[k]
		if q, ok := start[s]; !ok || p < q {
			start[s] = p
		}
	}
	for s, p0 := range start {
		if s < 0 || int(s) >= len(b.Tables) {
			continue
		}
		table := b.Tables[s]
		from := int32(-1)
		for p := int32(0); p < p0; p++ {
			blk, off, ok := f.slot(table, p)
			if !ok {
				return fmt.Errorf("failover: position %d outside the block table", p)
			}
			if f.valid[i][blk]&(1<<off) == 0 {
				from = p
				break
			}
		}
		if from < 0 {
			continue
		}
		for lo := from; lo < p0; lo += int32(f.maxTokens) {
			hi := min(p0, lo+int32(f.maxTokens))
			rb := &models.Batch{Tables: [][]int32{table}}
			for p := lo; p < hi; p++ {
				blk, off, _ := f.slot(table, p)
				tok := int32(-1)
				if h := f.hist[blk]; h != nil {
					tok = h[off]
				}
				if tok < 0 {
					return fmt.Errorf("failover: token at position %d was never seen", p)
				}
				rb.Tokens = append(rb.Tokens, tok)
				rb.Pos = append(rb.Pos, p)
				rb.Seq = append(rb.Seq, 0)
			}
			rb.Logits = []int32{int32(len(rb.Pos) - 1)}
			if err := f.engines[i].Forward(ctx, rb, f.scratch); err != nil {
				return fmt.Errorf("failover: re-prefill on %s: %w", f.names[i], err)
			}
			f.markValid(i, rb.Tables, rb.Seq, rb.Pos)
		}
	}
	return nil
}

// validCount is the number of cache slots placement i holds (for tests).
func (f *Failover) validCount(i int) int {
	n := 0
	for _, m := range f.valid[i] {
		n += bits.OnesCount64(m)
	}
	return n
}
