package models

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models/safetensors"
)

// Options tune how a model is loaded.
type Options struct {
	// MaxTokens is the most tokens one Forward call may carry (the sum of
	// all sequences' new tokens). 0 means 512.
	MaxTokens int
	// MaxSeqs is the most sequences one Forward call may carry. 0 means 64.
	MaxSeqs int
	// CacheDType is the element type of the KV cache; 0 means F32.
	CacheDType gpu.DType
	// Layers restricts the model to a range of layers [First, Last) for a
	// pipeline stage; both zero means all layers. The first stage embeds
	// tokens and the last produces logits.
	FirstLayer, LastLayer int
}

type layer struct {
	attnNorm, postAttnNorm, postFFNorm gpu.Buffer // pre-norm: attnNorm + postAttnNorm; OLMo 2: postAttnNorm + postFFNorm
	q, k, v, o                         gpu.Buffer
	qNorm, kNorm                       gpu.Buffer
	gate, up, down                     gpu.Buffer
	moe                                *gpu.MoEArgs
}

// Model is a loaded checkpoint on a device.
type Model struct {
	Config Config
	dev    gpu.Device
	opts   Options

	embed, lmHead, norm gpu.Buffer
	layers              []layer
	invFreq             gpu.Buffer
	owned               []gpu.Buffer

	s scratch
}

// scratch holds the activations of one Forward call.
type scratch struct {
	ids, pos, seq, slots, table, rows gpu.Buffer
	x, h, q, k, v, att, o, gate, up   gpu.Buffer
	logits, last                      gpu.Buffer
	logitRows                         int
	hostTable                         []int32
	maxBlocks                         int
}

// Device returns the device the model runs on.
func (m *Model) Device() gpu.Device { return m.dev }

// Load loads a checkpoint's weights onto dev. ckpt must stay open while the
// model lives (host devices keep views of its memory).
func Load(cfg *Config, ckpt *safetensors.Checkpoint, dev gpu.Device, o Options) (*Model, error) {
	if o.MaxTokens <= 0 {
		o.MaxTokens = 512
	}
	if o.MaxSeqs <= 0 {
		o.MaxSeqs = 64
	}
	if o.CacheDType == 0 {
		o.CacheDType = gpu.F32
	}
	if o.FirstLayer == 0 && o.LastLayer == 0 {
		o.LastLayer = cfg.Layers
	}
	if o.FirstLayer < 0 || o.LastLayer > cfg.Layers || o.FirstLayer >= o.LastLayer {
		return nil, fmt.Errorf("load: layer range [%d, %d) outside the model's %d layers", o.FirstLayer, o.LastLayer, cfg.Layers)
	}
	if err := Check(cfg, ckpt); err != nil {
		return nil, err
	}
	m := &Model{Config: *cfg, dev: dev, opts: o}
	if err := m.load(ckpt); err != nil {
		m.Close()
		return nil, err
	}
	if err := m.allocScratch(); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

func (m *Model) weight(ckpt *safetensors.Checkpoint, name string) (gpu.Buffer, error) {
	t, ok := ckpt.Tensor(name)
	if !ok {
		return nil, fmt.Errorf("load: missing tensor %s", name)
	}
	dt, err := dtypeOf(t.DType)
	if err != nil {
		return nil, fmt.Errorf("load: tensor %s: %w", name, err)
	}
	b, err := m.dev.Weights(dt, t.Data)
	if err != nil {
		return nil, fmt.Errorf("load: tensor %s: %w", name, err)
	}
	m.owned = append(m.owned, b)
	return b, nil
}

func dtypeOf(s string) (gpu.DType, error) {
	switch s {
	case "F32":
		return gpu.F32, nil
	case "BF16":
		return gpu.BF16, nil
	case "F16":
		return gpu.F16, nil
	}
	return 0, fmt.Errorf("dtype %s is not supported (bf16, f16, f32)", s)
}

func (m *Model) load(ckpt *safetensors.Checkpoint) error {
	c := &m.Config
	var err error
	get := func(name string) gpu.Buffer {
		if err != nil {
			return nil
		}
		var b gpu.Buffer
		b, err = m.weight(ckpt, name)
		return b
	}
	if m.first() {
		m.embed = get("model.embed_tokens.weight")
	}
	if m.last() {
		m.norm = get("model.norm.weight")
		if c.TieEmbeddings {
			if m.embed == nil {
				m.embed = get("model.embed_tokens.weight")
			}
			m.lmHead = m.embed
		} else {
			m.lmHead = get("lm_head.weight")
		}
	}
	for l := m.opts.FirstLayer; l < m.opts.LastLayer; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		var ly layer
		ly.q = get(p + "self_attn.q_proj.weight")
		ly.k = get(p + "self_attn.k_proj.weight")
		ly.v = get(p + "self_attn.v_proj.weight")
		ly.o = get(p + "self_attn.o_proj.weight")
		switch c.Arch {
		case OLMo2:
			ly.postAttnNorm = get(p + "post_attention_layernorm.weight")
			ly.postFFNorm = get(p + "post_feedforward_layernorm.weight")
		default:
			ly.attnNorm = get(p + "input_layernorm.weight")
			ly.postAttnNorm = get(p + "post_attention_layernorm.weight")
		}
		if c.Arch != Llama {
			ly.qNorm = get(p + "self_attn.q_norm.weight")
			ly.kNorm = get(p + "self_attn.k_norm.weight")
		}
		if c.SparseLayers != nil && c.SparseLayers[l] {
			a := &gpu.MoEArgs{Dim: c.Hidden, Inter: c.MoEIntermediate, Experts: c.Experts, TopK: c.ExpertsPerToken, NormTopK: c.NormTopK}
			a.Router = get(p + "mlp.gate.weight")
			for e := 0; e < c.Experts; e++ {
				q := fmt.Sprintf("%smlp.experts.%d.", p, e)
				a.Gate = append(a.Gate, get(q+"gate_proj.weight"))
				a.Up = append(a.Up, get(q+"up_proj.weight"))
				a.Down = append(a.Down, get(q+"down_proj.weight"))
			}
			ly.moe = a
		} else {
			ly.gate = get(p + "mlp.gate_proj.weight")
			ly.up = get(p + "mlp.up_proj.weight")
			ly.down = get(p + "mlp.down_proj.weight")
		}
		m.layers = append(m.layers, ly)
	}
	if err != nil {
		return err
	}
	return nil
}

func (m *Model) first() bool { return m.opts.FirstLayer == 0 }
func (m *Model) last() bool  { return m.opts.LastLayer == m.Config.Layers }

// Layers returns the range of layers [first, last) the model holds.
func (m *Model) Layers() (first, last int) { return m.opts.FirstLayer, m.opts.LastLayer }

// IsFirst reports whether the model embeds tokens (it holds layer 0).
func (m *Model) IsFirst() bool { return m.first() }

// IsLast reports whether the model produces logits (it holds the last layer).
func (m *Model) IsLast() bool { return m.last() }

func (m *Model) alloc(dt gpu.DType, n int) gpu.Buffer {
	b, err := m.dev.Alloc(dt, max(n, 1))
	if err != nil {
		panic(allocError{err})
	}
	m.owned = append(m.owned, b)
	return b
}

type allocError struct{ err error }

func (m *Model) allocScratch() (err error) {
	defer func() {
		if r := recover(); r != nil {
			ae, ok := r.(allocError)
			if !ok {
				panic(r)
			}
			err = fmt.Errorf("load: allocating activations: %w", ae.err)
		}
	}()
	c, T := &m.Config, m.opts.MaxTokens
	s := &m.s
	qw, kw := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	ffn := c.Intermediate
	if c.Experts > 0 {
		ffn = max(ffn, c.MoEIntermediate)
	}
	s.ids = m.alloc(gpu.I32, T)
	s.pos = m.alloc(gpu.I32, T)
	s.seq = m.alloc(gpu.I32, T)
	s.slots = m.alloc(gpu.I32, T)
	s.rows = m.alloc(gpu.I32, T)
	s.x = m.alloc(gpu.F32, T*c.Hidden)
	s.h = m.alloc(gpu.F32, T*c.Hidden)
	s.o = m.alloc(gpu.F32, T*c.Hidden)
	s.q = m.alloc(gpu.F32, T*qw)
	s.att = m.alloc(gpu.F32, T*qw)
	s.k = m.alloc(gpu.F32, T*kw)
	s.v = m.alloc(gpu.F32, T*kw)
	s.gate = m.alloc(gpu.F32, T*ffn)
	s.up = m.alloc(gpu.F32, T*ffn)
	inv := c.InvFreq()
	m.invFreq = m.alloc(gpu.F32, len(inv))
	return m.dev.Write(m.invFreq, 0, gpu.F32Bytes(inv))
}

// Close frees the model's device memory.
func (m *Model) Close() error {
	for _, b := range m.owned {
		m.dev.Free(b)
	}
	m.owned = nil
	return nil
}

// Check verifies that ckpt holds every tensor cfg needs, with the right
// shapes and supported dtypes, without loading anything.
func Check(cfg *Config, ckpt *safetensors.Checkpoint) error {
	for _, w := range Expected(cfg) {
		t, ok := ckpt.Tensor(w.Name)
		if !ok {
			return unsupported("missing tensor %s", w.Name)
		}
		if _, err := dtypeOf(t.DType); err != nil {
			return unsupported("tensor %s: %v", w.Name, err)
		}
		if !sameShape(t.Shape, w.Shape) {
			return unsupported("tensor %s has shape %v, want %v", w.Name, t.Shape, w.Shape)
		}
	}
	return nil
}

func sameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// WeightSpec names a tensor and its expected shape.
type WeightSpec struct {
	Name  string
	Shape []int
}

// Expected lists the tensors a checkpoint of cfg must hold.
func Expected(c *Config) []WeightSpec {
	d, qw, kw := c.Hidden, c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	out := []WeightSpec{{"model.embed_tokens.weight", []int{c.Vocab, d}}, {"model.norm.weight", []int{d}}}
	if !c.TieEmbeddings {
		out = append(out, WeightSpec{"lm_head.weight", []int{c.Vocab, d}})
	}
	for l := 0; l < c.Layers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		add := func(name string, shape ...int) { out = append(out, WeightSpec{p + name, shape}) }
		add("self_attn.q_proj.weight", qw, d)
		add("self_attn.k_proj.weight", kw, d)
		add("self_attn.v_proj.weight", kw, d)
		add("self_attn.o_proj.weight", d, qw)
		switch c.Arch {
		case OLMo2:
			add("post_attention_layernorm.weight", d)
			add("post_feedforward_layernorm.weight", d)
			add("self_attn.q_norm.weight", qw)
			add("self_attn.k_norm.weight", kw)
		case Llama:
			add("input_layernorm.weight", d)
			add("post_attention_layernorm.weight", d)
		default:
			add("input_layernorm.weight", d)
			add("post_attention_layernorm.weight", d)
			add("self_attn.q_norm.weight", c.HeadDim)
			add("self_attn.k_norm.weight", c.HeadDim)
		}
		if c.SparseLayers != nil && c.SparseLayers[l] {
			add("mlp.gate.weight", c.Experts, d)
			for e := 0; e < c.Experts; e++ {
				q := fmt.Sprintf("mlp.experts.%d.", e)
				add(q+"gate_proj.weight", c.MoEIntermediate, d)
				add(q+"up_proj.weight", c.MoEIntermediate, d)
				add(q+"down_proj.weight", d, c.MoEIntermediate)
			}
		} else {
			add("mlp.gate_proj.weight", c.Intermediate, d)
			add("mlp.up_proj.weight", c.Intermediate, d)
			add("mlp.down_proj.weight", d, c.Intermediate)
		}
	}
	return out
}

// Params counts the parameters of cfg.
func Params(c *Config) int64 {
	var n int64
	for _, w := range Expected(c) {
		p := int64(1)
		for _, d := range w.Shape {
			p *= int64(d)
		}
		n += p
	}
	return n
}

// Cache is a paged KV cache for a model: NumBlocks blocks of BlockSize
// token slots per layer.
type Cache struct {
	NumBlocks, BlockSize int
	k, v                 []gpu.Buffer
	dev                  gpu.Device
}

// NewCache allocates a KV cache of numBlocks blocks of blockSize tokens.
func (m *Model) NewCache(numBlocks, blockSize int) (*Cache, error) {
	if numBlocks <= 0 || blockSize <= 0 {
		return nil, fmt.Errorf("kv cache: %d blocks of %d tokens", numBlocks, blockSize)
	}
	c := &Cache{NumBlocks: numBlocks, BlockSize: blockSize, dev: m.dev}
	n := numBlocks * blockSize * m.Config.KVHeads * m.Config.HeadDim
	for range m.layers {
		k, err := m.dev.Alloc(m.opts.CacheDType, n)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("kv cache: %w", err)
		}
		c.k = append(c.k, k)
		v, err := m.dev.Alloc(m.opts.CacheDType, n)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("kv cache: %w", err)
		}
		c.v = append(c.v, v)
	}
	return c, nil
}

// BlockBytes is the device memory one block of this model's cache takes.
func (m *Model) BlockBytes(blockSize int) int64 {
	return int64(2*len(m.layers)*blockSize*m.Config.KVHeads*m.Config.HeadDim) * int64(m.opts.CacheDType.Size())
}

// Close frees the cache.
func (c *Cache) Close() {
	for _, b := range append(c.k, c.v...) {
		c.dev.Free(b)
	}
	c.k, c.v = nil, nil
}

// Batch is one forward step: new tokens from one or more sequences.
type Batch struct {
	// Tokens are the new tokens of every sequence, concatenated.
	Tokens []int32
	// Pos is each token's position in its sequence.
	Pos []int32
	// Seq is each token's sequence: an index into Tables.
	Seq []int32
	// Tables are the sequences' block tables: Tables[s][i] is the cache
	// block holding positions [i*BlockSize, (i+1)*BlockSize) of sequence s.
	Tables [][]int32
	// Logits lists the token indexes (into Tokens) whose logits are wanted,
	// usually the last token of each sequence.
	Logits []int32
	// Hidden, for a stage after the first, replaces Tokens with the
	// previous stage's output activations [len(Pos), Hidden].
	Hidden []float32
}

// Forward runs one step. For the last stage it writes the logits of the
// rows named by b.Logits into out ([len(b.Logits), Vocab]); an earlier
// stage writes its output activations ([len(b.Pos), Hidden]) instead.
func (m *Model) Forward(ctx context.Context, cache *Cache, b *Batch, out []float32) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := m.upload(cache, b); err != nil {
		return err
	}
	if err := m.layersForward(cache, len(b.Pos)); err != nil {
		return err
	}
	if !m.last() {
		want := len(b.Pos) * m.Config.Hidden
		if len(out) < want {
			return fmt.Errorf("forward: out holds %d floats, needs %d", len(out), want)
		}
		return m.dev.Read(gpu.F32Bytes(out[:want]), m.s.x, 0)
	}
	return m.logits(len(b.Logits), out)
}

// upload validates the batch and writes its indexes to the device.
func (m *Model) upload(cache *Cache, b *Batch) error {
	c, s := &m.Config, &m.s
	n := len(b.Pos)
	if n == 0 {
		return fmt.Errorf("forward: empty batch")
	}
	if n > m.opts.MaxTokens {
		return fmt.Errorf("forward: %d tokens exceed the limit of %d per step", n, m.opts.MaxTokens)
	}
	if len(b.Seq) != n || (m.first() && len(b.Tokens) != n) || (!m.first() && len(b.Hidden) != n*c.Hidden) {
		return fmt.Errorf("forward: batch of %d positions has %d tokens, %d sequence ids and %d hidden values", n, len(b.Tokens), len(b.Seq), len(b.Hidden))
	}
	if len(b.Tables) == 0 || len(b.Tables) > m.opts.MaxSeqs {
		return fmt.Errorf("forward: %d sequences (limit %d)", len(b.Tables), m.opts.MaxSeqs)
	}
	if len(cache.k) != len(m.layers) {
		return fmt.Errorf("forward: cache has %d layers, model %d", len(cache.k), len(m.layers))
	}
	// Block tables are uploaded as fixed-width rows covering the whole
	// context, so the attention's shape does not change from step to step.
	maxBlocks := (c.MaxPositions + cache.BlockSize - 1) / cache.BlockSize
	slots := make([]int32, n)
	for i := range n {
		sq, p := b.Seq[i], b.Pos[i]
		if sq < 0 || int(sq) >= len(b.Tables) {
			return fmt.Errorf("forward: token %d names sequence %d of %d", i, sq, len(b.Tables))
		}
		if p < 0 || int(p) >= c.MaxPositions {
			return fmt.Errorf("forward: position %d outside the model's context of %d", p, c.MaxPositions)
		}
		t := b.Tables[sq]
		blk := int(p) / cache.BlockSize
		if blk >= len(t) {
			return fmt.Errorf("forward: position %d of sequence %d has no block (table of %d)", p, sq, len(t))
		}
		if t[blk] < 0 || int(t[blk]) >= cache.NumBlocks {
			return fmt.Errorf("forward: block %d outside the cache of %d", t[blk], cache.NumBlocks)
		}
		slots[i] = t[blk]*int32(cache.BlockSize) + p%int32(cache.BlockSize)
		if m.first() && (b.Tokens[i] < 0 || int(b.Tokens[i]) >= c.Vocab) {
			return fmt.Errorf("forward: token id %d outside the vocabulary of %d", b.Tokens[i], c.Vocab)
		}
	}
	for _, r := range b.Logits {
		if r < 0 || int(r) >= n {
			return fmt.Errorf("forward: logits row %d outside the batch of %d", r, n)
		}
	}
	need := len(b.Tables) * maxBlocks
	if s.table == nil || s.maxBlocks != maxBlocks {
		if s.table != nil {
			m.dev.Free(s.table)
		}
		tb, err := m.dev.Alloc(gpu.I32, m.opts.MaxSeqs*maxBlocks)
		if err != nil {
			s.table = nil
			return fmt.Errorf("forward: block tables: %w", err)
		}
		s.table, s.maxBlocks = tb, maxBlocks
	}
	if cap(s.hostTable) < need {
		s.hostTable = make([]int32, need)
	}
	ht := s.hostTable[:need]
	for i, t := range b.Tables {
		if len(t) > maxBlocks {
			return fmt.Errorf("forward: block table of sequence %d has %d blocks, more than the context needs (%d)", i, len(t), maxBlocks)
		}
		copy(ht[i*maxBlocks:], t)
		clear(ht[i*maxBlocks+len(t) : (i+1)*maxBlocks])
	}
	for _, w := range []struct {
		dst gpu.Buffer
		src []int32
	}{{s.pos, b.Pos}, {s.seq, b.Seq}, {s.slots, slots}, {s.table, ht}, {s.rows, b.Logits}} {
		if err := m.dev.Write(w.dst, 0, gpu.I32Bytes(w.src)); err != nil {
			return fmt.Errorf("forward: %w", err)
		}
	}
	if m.first() {
		if err := m.dev.Write(s.ids, 0, gpu.I32Bytes(b.Tokens)); err != nil {
			return fmt.Errorf("forward: %w", err)
		}
		return m.dev.Embed(s.x, m.embed, s.ids, n, c.Hidden)
	}
	return m.dev.Write(s.x, 0, gpu.F32Bytes(b.Hidden))
}

// layersForward runs every layer over the n tokens in s.x.
func (m *Model) layersForward(cache *Cache, n int) error {
	c, s, d := &m.Config, &m.s, m.dev
	qw, kw := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	eps := float32(c.NormEps)
	attn := gpu.AttnArgs{
		N: n, Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim,
		BlockSize: cache.BlockSize, MaxBlocks: s.maxBlocks,
		Scale: float32(1 / math.Sqrt(float64(c.HeadDim))),
		Pos:   s.pos, Seq: s.seq, BlockTable: s.table,
	}
	for i := range m.layers {
		ly := &m.layers[i]
		var e errs
		// Attention input: pre-norm architectures normalise first.
		in := s.x
		if c.Arch != OLMo2 {
			e.do(d.RMSNorm(s.h, s.x, ly.attnNorm, n, c.Hidden, eps))
			in = s.h
		}
		e.do(d.MatMul(s.q, in, ly.q, n, c.Hidden, qw))
		e.do(d.MatMul(s.k, in, ly.k, n, c.Hidden, kw))
		e.do(d.MatMul(s.v, in, ly.v, n, c.Hidden, kw))
		switch c.Arch {
		case OLMo2: // QK-norm across the whole projection
			e.do(d.RMSNorm(s.q, s.q, ly.qNorm, n, qw, eps))
			e.do(d.RMSNorm(s.k, s.k, ly.kNorm, n, kw, eps))
		case Qwen3, Qwen3MoE: // QK-norm per head
			e.do(d.RMSNorm(s.q, s.q, ly.qNorm, n*c.Heads, c.HeadDim, eps))
			e.do(d.RMSNorm(s.k, s.k, ly.kNorm, n*c.KVHeads, c.HeadDim, eps))
		}
		e.do(d.RoPE(s.q, s.pos, m.invFreq, n, c.Heads, c.HeadDim))
		e.do(d.RoPE(s.k, s.pos, m.invFreq, n, c.KVHeads, c.HeadDim))
		e.do(d.StoreKV(cache.k[i], cache.v[i], s.k, s.v, s.slots, n, kw))
		e.do(d.Attention(s.att, s.q, cache.k[i], cache.v[i], attn))
		e.do(d.MatMul(s.o, s.att, ly.o, n, qw, c.Hidden))
		if c.Arch == OLMo2 {
			e.do(d.RMSNorm(s.o, s.o, ly.postAttnNorm, n, c.Hidden, eps))
			e.do(d.Add(s.x, s.x, s.o, n*c.Hidden))
			e.do(m.mlp(ly, s.x, s.o, n))
			e.do(d.RMSNorm(s.o, s.o, ly.postFFNorm, n, c.Hidden, eps))
		} else {
			e.do(d.Add(s.x, s.x, s.o, n*c.Hidden))
			e.do(d.RMSNorm(s.h, s.x, ly.postAttnNorm, n, c.Hidden, eps))
			e.do(m.mlp(ly, s.h, s.o, n))
		}
		e.do(d.Add(s.x, s.x, s.o, n*c.Hidden))
		if e.err != nil {
			return fmt.Errorf("forward: layer %d: %w", m.opts.FirstLayer+i, e.err)
		}
	}
	return nil
}

// mlp computes out = MLP(in) for n tokens.
func (m *Model) mlp(ly *layer, in, out gpu.Buffer, n int) error {
	c, s, d := &m.Config, &m.s, m.dev
	if ly.moe != nil {
		a := *ly.moe
		a.N = n
		return d.MoE(out, in, a)
	}
	var e errs
	e.do(d.MatMul(s.gate, in, ly.gate, n, c.Hidden, c.Intermediate))
	e.do(d.MatMul(s.up, in, ly.up, n, c.Hidden, c.Intermediate))
	e.do(d.SiLUMul(s.gate, s.gate, s.up, n*c.Intermediate))
	e.do(d.MatMul(out, s.gate, ly.down, n, c.Intermediate, c.Hidden))
	return e.err
}

// logits computes the final norm and LM head for the r rows in s.rows.
func (m *Model) logits(r int, out []float32) error {
	c, s, d := &m.Config, &m.s, m.dev
	if r == 0 {
		return nil
	}
	if len(out) < r*c.Vocab {
		return fmt.Errorf("forward: out holds %d floats, needs %d", len(out), r*c.Vocab)
	}
	if s.logitRows < r {
		if s.logits != nil {
			d.Free(s.logits)
			d.Free(s.last)
		}
		var err error
		if s.logits, err = d.Alloc(gpu.F32, r*c.Vocab); err != nil {
			return fmt.Errorf("forward: logits: %w", err)
		}
		if s.last, err = d.Alloc(gpu.F32, r*c.Hidden); err != nil {
			return fmt.Errorf("forward: logits: %w", err)
		}
		s.logitRows = r
	}
	var e errs
	e.do(d.Embed(s.last, s.x, s.rows, r, c.Hidden))
	e.do(d.RMSNorm(s.last, s.last, m.norm, r, c.Hidden, float32(c.NormEps)))
	e.do(d.MatMul(s.logits, s.last, m.lmHead, r, c.Hidden, c.Vocab))
	if e.err != nil {
		return fmt.Errorf("forward: logits: %w", e.err)
	}
	return d.Read(gpu.F32Bytes(out[:r*c.Vocab]), s.logits, 0)
}

// errs keeps the first error of a sequence of calls.
type errs struct{ err error }

func (e *errs) do(err error) {
	if e.err == nil {
		e.err = err
	}
}

// Describe summarises the model in one line.
func (c *Config) Describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d layers, hidden %d, %d heads", c.Arch, c.Layers, c.Hidden, c.Heads)
	if c.KVHeads != c.Heads {
		fmt.Fprintf(&b, " (%d kv)", c.KVHeads)
	}
	fmt.Fprintf(&b, " of %d, vocab %d", c.HeadDim, c.Vocab)
	if c.Experts > 0 {
		fmt.Fprintf(&b, ", %d experts top-%d", c.Experts, c.ExpertsPerToken)
	}
	return b.String()
}
