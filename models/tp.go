package models

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models/safetensors"
)

// Tensor parallelism: the ranks of a group each hold a slice of every
// layer, cut from the checkpoint at load time. q, k, v, gate and up are
// column-parallel (each rank computes its heads and its share of the MLP's
// intermediate width: rows of the weight); o and down are row-parallel
// (each rank multiplies its slice of the input: columns of the weight) and
// their partial outputs are summed by an all-reduce. The embedding, the
// norms and the LM head are replicated, and every rank keeps the whole
// residual stream, which the all-reduces leave bit-identical on every rank.
// On a gpu.Slicer device the LM head is split by vocabulary instead: each
// rank computes its rows' logits and an all-gather assembles each row.
// OLMo 2's QK-norm spans the whole projection: the ranks all-reduce the
// rows' sums of squares of their slices (gpu.ShardNormer).

// Reducer is a rank's collectives in a group: an xgmi device
// communicator's rank. AllReduceN sums the first n elements of src over the
// ranks into dst (in place or not), with the same bits on every rank;
// AllGather concatenates every rank's src into dst in rank order.
type Reducer interface {
	AllReduceN(dst, src gpu.Buffer, n int) error
	AllGather(dst, src gpu.Buffer) error
}

// NormReducer is a Reducer that fuses an all-reduce with the work after
// it (xgmi's device communicator): one kernel where there were two. The
// sums are the Reducer's; o is summed in place.
type NormReducer interface {
	Reducer
	// AllReduceRMSNormAdd sums n rows of dim values of o over the ranks
	// and adds their norm to the residual: r += rmsnorm(o) · w.
	AllReduceRMSNormAdd(r, o, w gpu.Buffer, n, dim int, eps float32) error
	// AllReduceAddRMSNorm sums o over the ranks into the residual and
	// normalises it: r += o; out = rmsnorm(r) · w.
	AllReduceAddRMSNorm(out, r, o, w gpu.Buffer, n, dim int, eps float32) error
	// SumSquares2 is gpu.ShardNormer's SumSquares2 summed over the ranks.
	SumSquares2(out, a, b gpu.Buffer, n, wa, wb int) error
}

// Shard is a model's place in a tensor-parallel group.
type Shard struct {
	Rank, Size int
	Comm       Reducer
}

// local is the configuration of the shard's slice of cfg.
func (s *Shard) local(cfg *Config) (Config, error) {
	c := *cfg
	switch {
	case s.Size < 1 || s.Rank < 0 || s.Rank >= s.Size:
		return c, fmt.Errorf("load: shard %d of %d", s.Rank, s.Size)
	case s.Comm == nil && s.Size > 1:
		return c, fmt.Errorf("load: shard %d of %d has no communicator", s.Rank, s.Size)
	case cfg.Experts > 0:
		return c, fmt.Errorf("load: tensor parallelism of mixture-of-experts models is not supported")
	case cfg.Heads%s.Size != 0 || cfg.KVHeads%s.Size != 0 || cfg.Intermediate%s.Size != 0:
		return c, fmt.Errorf("load: %d heads, %d kv heads and an MLP of %d do not split over %d ranks", cfg.Heads, cfg.KVHeads, cfg.Intermediate, s.Size)
	}
	c.Heads /= s.Size
	c.KVHeads /= s.Size
	c.Intermediate /= s.Size
	return c, nil
}

// How a tensor is cut for a shard.
const (
	cutNone = iota
	cutRows // column-parallel: the shard's rows of the output
	cutCols // row-parallel: the shard's columns of the input
)

func (m *Model) cut(name string) int {
	if m.opts.Shard == nil || m.opts.Shard.Size == 1 {
		return cutNone
	}
	for _, suf := range []string{"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight"} {
		if strings.HasSuffix(name, suf) {
			return cutRows
		}
	}
	if strings.HasSuffix(name, "self_attn.o_proj.weight") || strings.HasSuffix(name, "mlp.down_proj.weight") {
		return cutCols
	}
	// OLMo 2 normalises the whole projection: its weights are per output.
	if m.Config.Arch == OLMo2 && (strings.HasSuffix(name, "self_attn.q_norm.weight") || strings.HasSuffix(name, "self_attn.k_norm.weight")) {
		return cutRows
	}
	return cutNone
}

// tensor returns the element type and the bytes of the named tensor, or
// of this shard's slice of it.
func (m *Model) tensor(ckpt *safetensors.Checkpoint, name string) (gpu.DType, []byte, error) {
	t, ok := ckpt.Tensor(name)
	if !ok {
		return 0, nil, fmt.Errorf("load: missing tensor %s", name)
	}
	dt, err := dtypeOf(t.DType)
	data, quantized := t.Data, err != nil
	if quantized {
		// Quantized weights, dequantized here; any other dtype refused.
		s, err := checkQuant(m.Config.Quant, ckpt, name, t)
		if err != nil {
			return 0, nil, fmt.Errorf("load: tensor %s: %w", name, err)
		}
		dt, data = gpu.BF16, dequant(m.Config.Quant, t, s)
	}
	part, fresh := m.part(name, t.Shape, dt, data)
	if quantized && !fresh && len(part) < len(data) {
		part, fresh = slices.Clone(part), true // the rank's rows alone
	}
	if quantized || fresh {
		// Host memory of the load's own, kept while the model is loaded.
		m.hostSlice = append(m.hostSlice, part)
	}
	taken := len(t.Data)
	if len(part) != len(data) {
		taken /= m.opts.Shard.Size
	}
	m.took(taken)
	return dt, part, nil
}

// part is this shard's part of the named tensor of shape whose elements of
// dt are data: all of it, or its rows or columns of the shard's rank; fresh
// where it was copied out of data.
func (m *Model) part(name string, shape []int, dt gpu.DType, data []byte) (part []byte, fresh bool) {
	how := m.cut(name)
	if how == cutNone {
		return data, false
	}
	sh := m.opts.Shard
	rows, cols := shape[0], 1
	if len(shape) == 2 {
		cols = shape[1]
	}
	es := dt.Size()
	if how == cutRows {
		per := rows / sh.Size
		return data[sh.Rank*per*cols*es : (sh.Rank+1)*per*cols*es], false
	}
	per := cols / sh.Size
	out := make([]byte, rows*per*es)
	for r := range rows {
		copy(out[r*per*es:(r+1)*per*es], data[(r*cols+sh.Rank*per)*es:(r*cols+(sh.Rank+1)*per)*es])
	}
	return out, true
}

// took counts n more bytes of the checkpoint taken by the load and tells
// Options.Progress.
func (m *Model) took(n int) {
	m.taken += int64(n)
	if p := m.opts.Progress; p != nil {
		p(m.taken)
	}
}

// vocabRows loads this shard's rows of a [Vocab, Hidden] tensor.
func (m *Model) vocabRows(ckpt *safetensors.Checkpoint, name string) (gpu.Buffer, error) {
	t, ok := ckpt.Tensor(name)
	if !ok {
		return nil, fmt.Errorf("load: missing tensor %s", name)
	}
	dt, err := dtypeOf(t.DType)
	if err != nil {
		return nil, fmt.Errorf("load: tensor %s: %w", name, err)
	}
	sh := m.opts.Shard
	per := len(t.Data) / sh.Size
	m.took(per)
	b, err := m.dev.Weights(dt, t.Data[sh.Rank*per:(sh.Rank+1)*per])
	if err != nil {
		return nil, fmt.Errorf("load: tensor %s: %w", name, err)
	}
	m.owned = append(m.owned, b)
	return b, nil
}

// reduce sums the first n elements of b over the group, in place.
func (m *Model) reduce(b gpu.Buffer, n int) error {
	if m.opts.Shard == nil || m.opts.Shard.Size == 1 {
		return nil
	}
	return m.opts.Shard.Comm.AllReduceN(b, b, n)
}

// reduceNorm sums n rows of o over the group and adds them to the
// residual r: with out nil, r += rmsnorm(o) · w (post-norm); otherwise
// r += o and out = rmsnorm(r) · w (pre-norm).
func (m *Model) reduceNorm(out, r, o, w gpu.Buffer, n int, eps float32) error {
	dim := m.Config.Hidden
	switch {
	case m.nr != nil && out == nil:
		return m.nr.AllReduceRMSNormAdd(r, o, w, n, dim, eps)
	case m.nr != nil:
		return m.nr.AllReduceAddRMSNorm(out, r, o, w, n, dim, eps)
	}
	if err := m.reduce(o, n*dim); err != nil {
		return err
	}
	if out == nil {
		return m.rn.RMSNormAdd(r, o, w, n, dim, eps)
	}
	return m.rn.AddRMSNorm(out, r, o, w, n, dim, eps)
}

// LoadTP loads cfg split over the devices of a tensor-parallel group: rank
// i on devs[i], summing through comms[i]. It returns rank 0, which drives
// the group: its Forward, ForwardArgmax and NewCache run every rank, each
// from a goroutine of its own, in lock-step (the all-reduces inside each
// step wait for every rank). Closing it closes every rank.
func LoadTP(cfg *Config, ckpt *safetensors.Checkpoint, devs []gpu.Device, comms []Reducer, o Options) (*Model, error) {
	if len(devs) == 0 || len(devs) != len(comms) {
		return nil, fmt.Errorf("load: %d devices and %d communicators for tensor parallelism", len(devs), len(comms))
	}
	var ranks []*Model
	for i, d := range devs {
		ro := o
		ro.Shard = &Shard{Rank: i, Size: len(devs), Comm: comms[i]}
		m, err := Load(cfg, ckpt, d, ro)
		if err != nil {
			for _, r := range ranks {
				r.Close()
			}
			return nil, fmt.Errorf("rank %d: %w", i, err)
		}
		ranks = append(ranks, m)
	}
	ranks[0].group = ranks
	for _, r := range ranks[1:] {
		r.driven = true
	}
	return ranks[0], nil
}

// Ranks is the number of ranks a step runs on: 1 for a whole model.
func (m *Model) Ranks() int { return max(len(m.group), 1) }

// each runs f for every rank of the group with its cache, rank 0 on the
// calling goroutine and the others on goroutines of their own, and waits
// for all.
func (m *Model) each(cache *Cache, f func(r *Model, c *Cache) error) error {
	if cache == nil || len(cache.shards) != len(m.group)-1 {
		return fmt.Errorf("forward: the cache was not made by this tensor-parallel model")
	}
	errs := make([]error, len(m.group))
	var wg sync.WaitGroup
	for i := 1; i < len(m.group); i++ {
		wg.Go(func() {
			if err := f(m.group[i], cache.shards[i-1]); err != nil {
				errs[i] = fmt.Errorf("rank %d: %w", i, err)
			}
		})
	}
	errs[0] = f(m, cache)
	wg.Wait()
	return errors.Join(errs...)
}

// forwardArgmaxGroup runs ForwardArgmax on every rank and checks that they
// agree: every rank computes the same logits.
func (m *Model) forwardArgmaxGroup(ctx context.Context, cache *Cache, b *Batch, ids []int32) error {
	r := len(b.Logits)
	if len(ids) < r {
		return fmt.Errorf("forward: ids holds %d values, needs %d", len(ids), r)
	}
	if cap(m.s.peerIDs) < r*len(m.group) {
		m.s.peerIDs = make([]int32, r*len(m.group))
	}
	peer := m.s.peerIDs[:r*len(m.group)]
	err := m.each(cache, func(rk *Model, c *Cache) error {
		if rk == m {
			return rk.forwardArgmax(ctx, c, b, ids)
		}
		return rk.forwardArgmax(ctx, c, b, peer[rk.opts.Shard.Rank*r:(rk.opts.Shard.Rank+1)*r])
	})
	if err != nil {
		return err
	}
	return agree(ids[:r], peer, len(m.group))
}

// agree checks that every rank k > 0 chose, in peer[k*r:(k+1)*r], the
// tokens rank 0 chose in ids (r of them).
func agree(ids, peer []int32, ranks int) error {
	r := len(ids)
	for k := 1; k < ranks; k++ {
		for i := range r {
			if peer[k*r+i] != ids[i] {
				return fmt.Errorf("forward: rank %d chose token %d and rank 0 %d for row %d: the ranks diverged", k, peer[k*r+i], ids[i], i)
			}
		}
	}
	return nil
}
