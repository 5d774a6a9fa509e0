package models

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
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
	// Eager issues every operation one by one even on a device that can
	// record and replay steps (gpu.Grapher), for comparison and debugging.
	Eager bool
	// Shard makes the model one rank of a tensor-parallel group: it holds
	// its slice of the heads and of the MLP and all-reduces the attention
	// output and MLP down projections. LoadTP sets it; nil for a whole model.
	Shard *Shard
	// CodeWeights also holds weights of the one-token products in a
	// lossless 12-bit code on a device that can (gpu.WeightCoder): those
	// products stream a quarter fewer bytes, for three quarters of those
	// weights' memory more. Matrices the code does not fit stay bf16 only
	// (Model.Coded counts the others). The zero value codes none.
	CodeWeights Coding
	// Progress, where set, is told as the load goes how many bytes of the
	// checkpoint it has taken so far, a tensor at a time (each placed on
	// the device before the next is taken).
	Progress func(taken int64)
}

type layer struct {
	attnNorm, postAttnNorm, postFFNorm gpu.Buffer // pre-norm: attnNorm + postAttnNorm; OLMo 2: postAttnNorm + postFFNorm
	q, k, v, o                         gpu.Buffer
	qNorm, kNorm                       gpu.Buffer
	gate, up, down                     gpu.Buffer
	moe                                *gpu.MoEArgs
	// On a gpu.Packer device q, k and v (gate and up) are views of one
	// packed weight, so that a single-token step computes them with one
	// product; nil when loaded separately.
	qkv, gateUp gpu.Buffer
}

// Model is a loaded checkpoint on a device.
type Model struct {
	Config Config
	dev    gpu.Device
	opts   Options

	embed, lmHead, norm gpu.Buffer
	layers              []layer
	coded               int    // matrices with a twin in the 12-bit code
	coding              Coding // the coding that chose them
	invFreq             gpu.Buffer
	owned               []gpu.Buffer
	rn                  gpu.ResidualNormer   // nil when the device has no fused norms
	qp                  gpu.QKVPreparer      // nil when the device does not fuse QK-norm, RoPE and the KV store
	gm                  gpu.GatedMLPer       // nil when the device does not run a gated MLP's products as one operation
	gmv                 gpu.GatedMatVecer    // nil when the device does not form one token's activation in gate|up
	pn                  gpu.PostNormMatVecer // nil when the device does not fold a post-norm into the next product
	hm                  gpu.HeadMatVecer     // nil when the device does not fold the last norms into the LM head

	// Tensor parallelism: full is the whole model's configuration (Config
	// is this rank's slice of it); group, on rank 0 only, lists every rank,
	// which rank 0's Forward drives together.
	full      Config
	sn        gpu.ShardNormer
	nr        NormReducer // nil when the communicator does not fuse norms with its all-reduces
	headSplit bool        // the LM head holds this rank's rows of the vocabulary
	group     []*Model
	driven    bool     // a rank other than 0 of a LoadTP group: rank 0 drives it
	hostSlice [][]byte // column slices cut from the checkpoint, kept while loaded
	taken     int64    // bytes of the checkpoint the load has taken (Options.Progress)

	s        scratch
	graphs   map[graphKey]gpu.Graph
	graphErr error // why recording was given up; nil while it works
}

// scratch holds the activations of one Forward call.
type scratch struct {
	idx                             index
	x, h, q, k, v, att, o, gate, up gpu.Buffer
	// Products of packed weights for steps of up to packedRows tokens:
	// qkv1 holds rows of q|k|v and gu1 rows of gate|up; q1, k1, v1, g1
	// and u1 are views from each part's first row. nil when no layer is
	// packed.
	qkv1, q1, k1, v1, gu1, g1, u1 gpu.Buffer
	packedRows                    int
	logits, last, next            gpu.Buffer // next: the argmax of each logits row
	summary                       gpu.Buffer // the rows' log-probability summaries (Batch.Summaries)
	chosen                        int        // rows of next the last step chose (0: it chose none)
	drew                          bool       // and whether it drew them (gpu.Sampler): draws may follow them
	// A vocabulary-parallel LM head writes this rank's columns of each row
	// into logitsPart ([rows, Vocab/ranks]), and an all-gather per row
	// assembles the row (views rowPart[i] -> rowFull[i]).
	logitsPart       gpu.Buffer
	rowPart, rowFull []gpu.Buffer
	ss               gpu.Buffer // tensor-parallel QK-norm: the rows' sums of squares
	qr               gpu.Buffer // q after a fused QK-norm and RoPE (gpu.QKVPreparer)
	peerIDs          []int32    // tensor parallelism: the other ranks' choices
	logitRows        int
	hostLogits       []float32
	draw             gpu.SampleScratch // the host's draws (SampleRows)
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
	m := &Model{Config: *cfg, full: *cfg, dev: dev, opts: o}
	if o.Shard != nil {
		local, err := o.Shard.local(cfg)
		if err != nil {
			return nil, err
		}
		m.Config = local
		_, slicer := dev.(gpu.Slicer)
		S := o.Shard.Size
		m.headSplit = S > 1 && slicer && cfg.Vocab%S == 0 && (cfg.Vocab/S)%4 == 0
		if S > 1 {
			m.nr, _ = o.Shard.Comm.(NormReducer)
		}
		if cfg.Arch == OLMo2 {
			if m.sn, _ = dev.(gpu.ShardNormer); m.sn == nil {
				return nil, fmt.Errorf("load: tensor parallelism of %s needs a device that normalises sharded projections (gpu.ShardNormer)", cfg.Arch)
			}
		}
	}
	m.rn, _ = dev.(gpu.ResidualNormer)
	m.gm, _ = dev.(gpu.GatedMLPer)
	m.gmv, _ = dev.(gpu.GatedMatVecer)
	m.pn, _ = dev.(gpu.PostNormMatVecer)
	m.hm, _ = dev.(gpu.HeadMatVecer)
	m.qp, _ = dev.(gpu.QKVPreparer)
	if err := m.load(ckpt); err != nil {
		m.Close()
		return nil, err
	}
	if err := m.codeWeights(ckpt); err != nil {
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
	dt, data, err := m.tensor(ckpt, name)
	if err != nil {
		return nil, err
	}
	b, err := m.dev.Weights(dt, data)
	if err != nil {
		return nil, fmt.Errorf("load: tensor %s: %w", name, err)
	}
	m.owned = append(m.owned, b)
	return b, nil
}

// packed loads the named tensors back to back into one buffer on a
// gpu.Packer device and returns it with a view of each tensor. It returns a
// nil buffer, loading nothing, where the device does not pack or the
// tensors do not share a dtype or do not keep views 16-byte aligned.
func (m *Model) packed(ckpt *safetensors.Checkpoint, names ...string) (gpu.Buffer, []gpu.Buffer, error) {
	pk, ok := m.dev.(gpu.Packer)
	if !ok {
		return nil, nil, nil
	}
	var dt gpu.DType
	data := make([][]byte, len(names))
	for i, name := range names {
		tdt, tdata, err := m.tensor(ckpt, name)
		if err != nil {
			return nil, nil, err
		}
		if i > 0 && tdt != dt || len(tdata)%16 != 0 {
			return nil, nil, nil
		}
		dt, data[i] = tdt, tdata
	}
	whole, err := pk.Pack(dt, data...)
	if err != nil {
		return nil, nil, fmt.Errorf("load: packing %s: %w", strings.Join(names, ", "), err)
	}
	m.owned = append(m.owned, whole)
	parts := make([]gpu.Buffer, len(data))
	off := 0
	for i, d := range data {
		n := len(d) / dt.Size()
		if parts[i], err = pk.Slice(whole, off, n); err != nil {
			return nil, nil, fmt.Errorf("load: tensor %s: %w", names[i], err)
		}
		off += n
	}
	return whole, parts, nil
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
	if m.last() && m.headSplit {
		m.norm = get("model.norm.weight")
		name := "lm_head.weight"
		if c.TieEmbeddings {
			name = "model.embed_tokens.weight"
		}
		if err == nil {
			m.lmHead, err = m.vocabRows(ckpt, name)
		}
	} else if m.last() {
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
		if err == nil {
			var parts []gpu.Buffer
			ly.qkv, parts, err = m.packed(ckpt, p+"self_attn.q_proj.weight", p+"self_attn.k_proj.weight", p+"self_attn.v_proj.weight")
			if ly.qkv != nil {
				ly.q, ly.k, ly.v = parts[0], parts[1], parts[2]
			}
		}
		if ly.qkv == nil {
			ly.q = get(p + "self_attn.q_proj.weight")
			ly.k = get(p + "self_attn.k_proj.weight")
			ly.v = get(p + "self_attn.v_proj.weight")
		}
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
			if err == nil {
				var parts []gpu.Buffer
				ly.gateUp, parts, err = m.packed(ckpt, p+"mlp.gate_proj.weight", p+"mlp.up_proj.weight")
				if ly.gateUp != nil {
					ly.gate, ly.up = parts[0], parts[1]
				}
			}
			if ly.gateUp == nil {
				ly.gate = get(p + "mlp.gate_proj.weight")
				ly.up = get(p + "mlp.up_proj.weight")
			}
			ly.down = get(p + "mlp.down_proj.weight")
		}
		m.layers = append(m.layers, ly)
	}
	if err != nil {
		return err
	}
	return nil
}

// Coded is how many of the model's weight matrices have a twin in the
// 12-bit code, and the coding that chose them (Options.CodeWeights,
// CodeAuto resolved).
func (m *Model) Coded() (int, Coding) { return m.coded, m.coding }

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
	s.x = m.alloc(gpu.F32, T*c.Hidden)
	s.h = m.alloc(gpu.F32, T*c.Hidden)
	s.o = m.alloc(gpu.F32, T*c.Hidden)
	s.q = m.alloc(gpu.F32, T*qw)
	if m.qp != nil {
		s.qr = m.alloc(gpu.F32, min(T, qkvFuseTokens)*qw)
	}
	s.att = m.alloc(gpu.F32, T*qw)
	s.k = m.alloc(gpu.F32, T*kw)
	s.v = m.alloc(gpu.F32, T*kw)
	s.gate = m.alloc(gpu.F32, T*ffn)
	s.up = m.alloc(gpu.F32, T*ffn)
	if m.sn != nil {
		s.ss = m.alloc(gpu.F32, 2*T)
	}
	if err := m.allocPacked(); err != nil {
		return err
	}
	inv := c.InvFreq()
	m.invFreq = m.alloc(gpu.F32, len(inv))
	return m.dev.Write(m.invFreq, 0, gpu.F32Bytes(inv))
}

// Close frees the model's device memory (every rank's, on rank 0 of a
// tensor-parallel group).
func (m *Model) Close() error {
	for _, r := range m.group[min(1, len(m.group)):] {
		r.Close()
	}
	m.group = nil
	m.dropGraphs(nil)
	m.s.idx.free(m.dev)
	m.freeLogits()
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
			if _, err := checkQuant(cfg.Quant, ckpt, w.Name, t); err != nil {
				return unsupported("tensor %s: %v", w.Name, err)
			}
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
	m                    *Model   // whose recorded steps use this cache
	shards               []*Cache // tensor parallelism: the other ranks' caches, on rank 0's
}

// NewCache allocates a KV cache of numBlocks blocks of blockSize tokens.
func (m *Model) NewCache(numBlocks, blockSize int) (*Cache, error) {
	if numBlocks <= 0 || blockSize <= 0 {
		return nil, fmt.Errorf("kv cache: %d blocks of %d tokens", numBlocks, blockSize)
	}
	c := &Cache{NumBlocks: numBlocks, BlockSize: blockSize, dev: m.dev, m: m}
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
	for _, r := range m.group[min(1, len(m.group)):] {
		rc, err := r.NewCache(numBlocks, blockSize)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("rank %d: %w", r.opts.Shard.Rank, err)
		}
		c.shards = append(c.shards, rc)
	}
	return c, nil
}

// BlockBytes is the device memory one block of this model's cache takes.
func (m *Model) BlockBytes(blockSize int) int64 {
	return int64(2*len(m.layers)*blockSize*m.Config.KVHeads*m.Config.HeadDim) * int64(m.opts.CacheDType.Size())
}

// Close frees the cache, and the model's recorded steps that use it. Call
// it from the goroutine that runs the model.
func (c *Cache) Close() {
	if c.m != nil {
		c.m.dropGraphs(c)
	}
	for _, b := range append(c.k, c.v...) {
		c.dev.Free(b)
	}
	c.k, c.v = nil, nil
	for _, s := range c.shards {
		s.Close()
	}
	c.shards = nil
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
	// Continues says the caller means to run next the step that follows
	// this one for every sequence, one token on (none reaches its end,
	// none joins): an engine may prepare it. A hint only.
	Continues bool
	// NextDraws, for a drawn step that Continues, are the draws of the
	// step that follows (one a logits row, gpu.SampleRow with its uniform
	// number), so that an engine may queue it. A hint only.
	NextDraws []gpu.SampleRow
	// Read lists, for a step whose tokens the engine chooses
	// (ForwardChoose, IssueStep), the logits rows (indexes into Logits,
	// increasing) it returns as well: the rows of the sequences that
	// report log-probabilities.
	Read []int32
	// Summaries asks for the rows Read names not raw but summarized on the
	// engine (gpu.Summarize): the chosen token's log-probability and the
	// Top most likely tokens' (at most gpu.MaxSummaryTop), ReadWidth values
	// a row where a raw row takes Vocab. For sequences whose
	// log-probabilities are the raw rows' (no grammar, penalties or bias).
	Summaries bool
	Top       int
}

// ReadWidth is how many values each row read takes: vocab, or a summary's.
func (b *Batch) ReadWidth(vocab int) int {
	if b.Summaries {
		return gpu.SummaryWidth(b.Top)
	}
	return vocab
}

// Forward runs one step. For the last stage it writes the logits of the
// rows named by b.Logits into out ([len(b.Logits), Vocab]); an earlier
// stage writes its output activations ([len(b.Pos), Hidden]) instead.
//
// On a device that records steps (gpu.Grapher) the operations after the
// index upload are recorded once per shape (tokens, logits rows, cache) and
// replayed; the indexes live in fixed buffers rewritten before each replay.
func (m *Model) Forward(ctx context.Context, cache *Cache, b *Batch, out []float32) error {
	if m.group != nil {
		return m.each(cache, func(r *Model, c *Cache) error { return r.forward(ctx, c, b, out, r == m) })
	}
	return m.forward(ctx, cache, b, out, true)
}

// forward is Forward on one rank; a rank other than the first of a
// tensor-parallel group waits for its work instead of reading the output.
func (m *Model) forward(ctx context.Context, cache *Cache, b *Batch, out []float32, read bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c := &m.Config
	n, r := len(b.Pos), len(b.Logits)
	want := r * c.Vocab
	if !m.last() {
		want = n * c.Hidden
	}
	if len(out) < want {
		return fmt.Errorf("forward: out holds %d floats, needs %d", len(out), want)
	}
	if m.last() {
		if err := m.ensureLogits(r); err != nil {
			return err
		}
	}
	if err := m.upload(cache, b); err != nil {
		return err
	}
	if err := m.step(cache, n, r, false, fromIndex); err != nil {
		return err
	}
	if !read {
		return m.dev.Sync(ctx)
	}
	if !m.last() {
		return m.dev.Read(gpu.F32Bytes(out[:want]), m.s.x, 0)
	}
	if r == 0 {
		return nil
	}
	return m.dev.Read(gpu.F32Bytes(out[:want]), m.s.logits, 0)
}

// ForwardArgmax runs one step of the last stage like Forward and writes
// into ids the greedy choice of each row named by b.Logits: the index of
// the largest logit, the lowest index among equal maxima. On a device with
// gpu.Argmaxer the choice is made on the device and only the ids are read
// back; elsewhere the logits are read and compared on the host.
func (m *Model) ForwardArgmax(ctx context.Context, cache *Cache, b *Batch, ids []int32) error {
	if m.group != nil {
		return m.forwardArgmaxGroup(ctx, cache, b, ids)
	}
	return m.forwardArgmax(ctx, cache, b, ids)
}

func (m *Model) forwardArgmax(ctx context.Context, cache *Cache, b *Batch, ids []int32) error {
	if !m.last() {
		return fmt.Errorf("forward: argmax needs the last stage (layers [%d, %d) of %d)", m.opts.FirstLayer, m.opts.LastLayer, m.Config.Layers)
	}
	r, V := len(b.Logits), m.Config.Vocab
	if len(ids) < r {
		return fmt.Errorf("forward: ids holds %d values, needs %d", len(ids), r)
	}
	if _, ok := m.dev.(gpu.Argmaxer); !ok {
		if cap(m.s.hostLogits) < r*V {
			m.s.hostLogits = make([]float32, r*V)
		}
		logits := m.s.hostLogits[:r*V]
		if err := m.forward(ctx, cache, b, logits, true); err != nil {
			return err
		}
		ArgmaxRows(ids, logits, V)
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := m.issue(cache, b, true, fromIndex); err != nil || r == 0 {
		return err
	}
	return m.dev.Read(gpu.I32Bytes(ids[:r]), m.s.next, 0)
}

// ForwardSample runs one step of the last stage like Forward and writes
// into ids the token drawn from each row named by b.Logits as rows says
// (gpu.SampleRow, one per row). On a device that draws tokens itself
// (gpu.Sampler) the draws run there and only the ids are read back, when
// the device takes every row (gpu.SampleRow.OnDevice); otherwise the
// logits are read and drawn from on the host (gpu.SampleHost): the same
// tokens either way, up to the order of float64 sums.
func (m *Model) ForwardSample(ctx context.Context, cache *Cache, b *Batch, rows []gpu.SampleRow, ids []int32) error {
	return m.forwardSample(ctx, cache, b, rows, ids, nil)
}

// forwardSample is ForwardSample; seen, when set, is given each row i of
// logits that the host reads, before it draws from it (which rewrites it).
func (m *Model) forwardSample(ctx context.Context, cache *Cache, b *Batch, rows []gpu.SampleRow, ids []int32, seen func(i int, row []float32)) error {
	if !m.last() {
		return fmt.Errorf("forward: sampling needs the last stage (layers [%d, %d) of %d)", m.opts.FirstLayer, m.opts.LastLayer, m.Config.Layers)
	}
	r, V := len(b.Logits), m.Config.Vocab
	if len(rows) != r || len(ids) < r {
		return fmt.Errorf("forward: %d draws and %d ids for %d logits rows", len(rows), len(ids), r)
	}
	for i, row := range rows {
		if err := row.Validate(); err != nil {
			return fmt.Errorf("forward: row %d: %w", i, err)
		}
		if row.Follows {
			return fmt.Errorf("forward: row %d follows the draw before, which only a step fed by it takes (IssueStep)", i)
		}
	}
	onDevice := m.samples() && (m.group == nil || m.Chains()) // a group reads its ranks' choices late
	for _, row := range rows {
		onDevice = onDevice && row.OnDevice(V)
	}
	if !onDevice || r == 0 {
		if cap(m.s.hostLogits) < r*V {
			m.s.hostLogits = make([]float32, r*V)
		}
		logits := m.s.hostLogits[:r*V]
		if err := m.Forward(ctx, cache, b, logits); err != nil {
			return err
		}
		for i := range r {
			if seen != nil {
				seen(i, logits[i*V:(i+1)*V])
			}
		}
		SampleRows(ids, logits, V, rows, &m.s.draw)
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if m.group == nil {
		if err := m.issueChoice(cache, b, rows, fromIndex); err != nil {
			return err
		}
		return m.dev.Read(gpu.I32Bytes(ids[:r]), m.s.next, 0)
	}
	// Every rank draws alike (the same logits, the same numbers).
	wait, err := m.issueChoices(cache, b, rows, fromIndex, false, ids)
	if err != nil {
		return err
	}
	return wait()
}

// ForwardChoose runs a step whose tokens the device chooses, greedy as
// ForwardArgmax (rows nil) or drawn as ForwardSample (rows), and reads
// besides into logits ([len(b.Read), Vocab]) the logits rows b.Read
// names, as Forward would have written them.
func (m *Model) ForwardChoose(ctx context.Context, cache *Cache, b *Batch, rows []gpu.SampleRow, ids []int32, logits []float32) error {
	if err := m.checkRead(b, logits); err != nil {
		return err
	}
	V := m.Config.Vocab
	// The rows the host reads to draw from are taken as they come, unless
	// they are to be summarized.
	var (
		read []bool
		seen func(i int, row []float32)
	)
	if !b.Summaries {
		read = make([]bool, len(b.Read))
		seen = func(i int, row []float32) {
			if k, ok := slices.BinarySearch(b.Read, int32(i)); ok {
				copy(logits[k*V:(k+1)*V], row)
				read[k] = true
			}
		}
	}
	var err error
	if rows == nil {
		err = m.ForwardArgmax(ctx, cache, b, ids)
	} else {
		err = m.forwardSample(ctx, cache, b, rows, ids, seen)
	}
	if err != nil {
		return err
	}
	if b.Summaries {
		return m.summarize(b, ids, logits)
	}
	for k, r := range b.Read {
		if read[k] {
			continue
		}
		if err := m.dev.Read(gpu.F32Bytes(logits[k*V:(k+1)*V]), m.s.logits, int(r)*V); err != nil {
			return err
		}
	}
	return nil
}

// summarize writes into out the summaries of the rows b.Read names
// (Batch.Summaries) for the tokens ids, from the logits of the step just
// run: on the device where it summarizes (the ids written to it first,
// since the host may have drawn some), else on the host from each row.
func (m *Model) summarize(b *Batch, ids []int32, out []float32) error {
	V, W := m.Config.Vocab, gpu.SummaryWidth(b.Top)
	if len(b.Read) == 0 {
		return nil
	}
	if s, ok := m.dev.(gpu.Summarizer); ok {
		if err := m.dev.Write(m.s.next, 0, gpu.I32Bytes(ids[:len(b.Logits)])); err != nil {
			return err
		}
		if err := s.Summarize(m.s.summary, m.s.logits, m.s.next, b.Read, V, b.Top); err != nil {
			return err
		}
		return m.dev.Read(gpu.F32Bytes(out[:len(b.Read)*W]), m.s.summary, 0)
	}
	if cap(m.s.hostLogits) < V {
		m.s.hostLogits = make([]float32, V)
	}
	row := m.s.hostLogits[:V]
	for k, r := range b.Read {
		if err := m.dev.Read(gpu.F32Bytes(row), m.s.logits, int(r)*V); err != nil {
			return err
		}
		gpu.Summarize(out[k*W:(k+1)*W], row, ids[r], b.Top)
	}
	return nil
}

// summarizeLater queues the summaries of the rows b.Read names, for the
// choices the step just issued left on the device, and their read into
// out (IssueStep).
func (m *Model) summarizeLater(b *Batch, out []float32) (func() error, error) {
	s, ok := m.dev.(gpu.Summarizer)
	if !ok {
		return nil, fmt.Errorf("forward: this device does not summarize log-probabilities")
	}
	n := len(b.Read) * gpu.SummaryWidth(b.Top)
	if err := s.Summarize(m.s.summary, m.s.logits, m.s.next, b.Read, m.Config.Vocab, b.Top); err != nil {
		return nil, err
	}
	return m.dev.(gpu.LateReader).ReadLater(gpu.F32Bytes(out[:n]), m.s.summary, 0)
}

// CheckRead checks that Read names increasing logits rows of b, and the
// summaries' Top.
func (b *Batch) CheckRead() error {
	if b.Summaries && (b.Top < 0 || b.Top > gpu.MaxSummaryTop) {
		return fmt.Errorf("summaries of the %d most likely tokens (at most %d)", b.Top, gpu.MaxSummaryTop)
	}
	for i, r := range b.Read {
		if r < 0 || int(r) >= len(b.Logits) || i > 0 && r <= b.Read[i-1] {
			return fmt.Errorf("rows to read %v are not increasing rows of %d", b.Read, len(b.Logits))
		}
	}
	return nil
}

// CheckReadInto is CheckRead, and checks that logits holds the rows read,
// vocab values each.
func (b *Batch) CheckReadInto(logits []float32, vocab int) error {
	if err := b.CheckRead(); err != nil {
		return err
	}
	if b.Summaries && b.Top > vocab {
		return fmt.Errorf("summaries of the %d most likely of %d tokens", b.Top, vocab)
	}
	if w := b.ReadWidth(vocab); len(logits) < len(b.Read)*w {
		return fmt.Errorf("%d floats for %d rows to read of %d", len(logits), len(b.Read), w)
	}
	return nil
}

// checkRead is b.CheckReadInto(logits) for m's rows.
func (m *Model) checkRead(b *Batch, logits []float32) error {
	if err := b.CheckReadInto(logits, m.Config.Vocab); err != nil {
		return fmt.Errorf("forward: %w", err)
	}
	return nil
}

// Chains reports whether IssueStep can queue greedy steps back to back:
// a whole model (not a pipeline stage), a tensor-parallel group, or a
// rank that runs its own steps in lock-step with its peers (not one that
// LoadTP's rank 0 drives), on devices that choose tokens themselves
// (gpu.Argmaxer) and read them back without waiting for later work
// (gpu.LateReader).
func (m *Model) Chains() bool {
	for _, rk := range m.ranks() {
		_, argmaxer := rk.dev.(gpu.Argmaxer)
		_, late := rk.dev.(gpu.LateReader)
		if !argmaxer || !late {
			return false
		}
	}
	// A rank that LoadTP's rank 0 drives chains only through it; a rank
	// of its own (each rank's steps issued by its own owner, in
	// lock-step: scheduler.Lockstep) chains by itself.
	return m.first() && m.last() && !m.driven
}

// ChainsDraws reports whether IssueStep can queue steps drawn as rows say:
// Chains, on a device that draws tokens itself (gpu.Sampler) and takes
// every row (gpu.SampleRow.OnDevice).
func (m *Model) ChainsDraws(rows []gpu.SampleRow) bool {
	if !m.Chains() || !m.samples() {
		return false
	}
	V := m.Config.Vocab
	for _, r := range rows {
		if r.Validate() != nil || !r.OnDevice(V) {
			return false
		}
	}
	return true
}

// IssueStep queues a step of b that chooses its tokens on the device
// without waiting for it: greedy (rows nil) as ForwardArgmax chooses, or
// drawn as rows say (one a logits row) as ForwardSample draws. wait
// blocks until the step's choices are in ids and returns the first error
// of the work before them. With previous, the step embeds for each token
// the choice of the same row of the step queued before it, on the device
// (b.Tokens are placeholders); b must then have one token per logits row,
// in order, and that step as many rows. The logits rows b.Read names are
// read late with the choices, into logits ([len(b.Read), Vocab]). Two
// steps' reads may be pending at most; ids and logits must not be used
// before wait returns. It needs Chains (and
// ChainsDraws for drawn steps). A tensor-parallel group queues the step on
// every rank, and wait checks that the ranks chose alike.
func (m *Model) IssueStep(ctx context.Context, cache *Cache, b *Batch, rows []gpu.SampleRow, previous bool, ids []int32, logits []float32) (wait func() error, err error) {
	if !m.Chains() || (rows != nil && !m.ChainsDraws(rows)) {
		return nil, fmt.Errorf("forward: this model and device cannot queue these steps")
	}
	r := len(b.Logits)
	if r == 0 || len(ids) < r || (rows != nil && len(rows) != r) {
		return nil, fmt.Errorf("forward: %d ids and %d draws for %d logits rows", len(ids), len(rows), r)
	}
	from := fromIndex
	if previous {
		if len(b.Pos) != r || m.s.chosen != r {
			return nil, fmt.Errorf("forward: a step fed by the one before needs one token per logits row and the same rows (%d tokens, %d rows, %d chosen before)", len(b.Pos), r, m.s.chosen)
		}
		for i, row := range b.Logits {
			if int(row) != i {
				return nil, fmt.Errorf("forward: a step fed by the one before needs logits row %d to be token %d, not %d", i, i, row)
			}
		}
		from = fromPrevious
	}
	if slices.ContainsFunc(rows, func(r gpu.SampleRow) bool { return r.Follows }) && (!previous || !m.s.drew) {
		return nil, fmt.Errorf("forward: draws that follow the step before need a step fed by a drawn one")
	}
	if err := m.checkRead(b, logits); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	chosen, err := m.issueChoices(cache, b, rows, from, true, ids)
	if err != nil || len(b.Read) == 0 {
		return chosen, err
	}
	var read func() error
	if b.Summaries {
		read, err = m.summarizeLater(b, logits)
	} else {
		read, err = m.dev.(gpu.LateReader).ReadRowsLater(gpu.F32Bytes(logits[:len(b.Read)*m.Config.Vocab]), m.s.logits, b.Read, m.Config.Vocab)
	}
	if err != nil {
		_ = chosen()
		return nil, err
	}
	return func() error { return errors.Join(chosen(), read()) }, nil
}

// issueChoices issues a step of b on every rank of a group (m alone
// otherwise) whose tokens each device chooses as issueChoice says, and
// queues the read of rank 0's choices into ids: wait blocks until they are
// there and, in a group, checks that every rank chose alike. With chain the
// choices may feed the next step (IssueStep: every drawn row settles). The
// ranks' devices are gpu.LateReaders.
func (m *Model) issueChoices(cache *Cache, b *Batch, rows []gpu.SampleRow, from tokenSource, chain bool, ids []int32) (wait func() error, err error) {
	r := len(b.Logits)
	issue := func(rk *Model, c *Cache) error {
		if err := rk.issueChoice(c, b, rows, from); err != nil {
			return err
		}
		if rows != nil && chain {
			rk.s.chosen, rk.s.drew = r, true
		}
		return nil
	}
	if m.group == nil {
		if err := issue(m, cache); err != nil {
			return nil, err
		}
		return m.dev.(gpu.LateReader).ReadLater(gpu.I32Bytes(ids[:r]), m.s.next, 0)
	}
	if err := m.each(cache, issue); err != nil {
		return nil, err
	}
	// Every rank's choices, rank 0's into ids: their own memory, since
	// two steps' reads may be pending.
	peer := make([]int32, r*len(m.group))
	waits := make([]func() error, len(m.group))
	for k, rk := range m.group {
		dst := ids[:r]
		if k > 0 {
			dst = peer[k*r : (k+1)*r]
		}
		if waits[k], err = rk.dev.(gpu.LateReader).ReadLater(gpu.I32Bytes(dst), rk.s.next, 0); err != nil {
			for _, w := range waits[:k] {
				_ = w()
			}
			return nil, err
		}
	}
	return func() error {
		var errs []error
		for _, w := range waits {
			errs = append(errs, w())
		}
		if err := errors.Join(errs...); err != nil {
			return err
		}
		return agree(ids[:r], peer, len(m.group))
	}, nil
}

// samples reports whether every rank's device draws tokens itself
// (gpu.Sampler).
func (m *Model) samples() bool {
	for _, rk := range m.ranks() {
		if _, ok := rk.dev.(gpu.Sampler); !ok {
			return false
		}
	}
	return true
}

// ranks is the models a step runs on: the group's ranks, or m alone.
func (m *Model) ranks() []*Model {
	if m.group != nil {
		return m.group
	}
	return []*Model{m}
}

// issueChoice issues a step of b whose tokens the device chooses into
// s.next without waiting for it: its argmax (rows nil), or drawn as rows
// says (the device must be a gpu.Sampler).
func (m *Model) issueChoice(cache *Cache, b *Batch, rows []gpu.SampleRow, from tokenSource) error {
	if err := m.issue(cache, b, rows == nil, from); err != nil {
		return err
	}
	if rows == nil {
		return nil
	}
	if err := m.dev.(gpu.Sampler).Sample(m.s.next, m.s.logits, len(b.Logits), m.Config.Vocab, rows); err != nil {
		return fmt.Errorf("forward: %w", err)
	}
	return nil
}

// issue issues a step of the last stage into its logits (with argmax,
// their device-side argmax into s.next) without waiting for it. With
// fromPrevious the step's embedding reads its token ids from s.next, the
// previous step's choice, instead of the uploaded ones.
func (m *Model) issue(cache *Cache, b *Batch, argmax bool, from tokenSource) error {
	if err := m.ensureLogits(len(b.Logits)); err != nil {
		return err
	}
	if err := m.upload(cache, b); err != nil {
		return err
	}
	return m.step(cache, len(b.Pos), len(b.Logits), argmax, from)
}

// SampleRows sets ids[i] to the token drawn from row i of logits (rows of
// vocab values, which it may rewrite) as rows[i] says, as ForwardSample
// draws: gpu.SampleHost, each row's exponentials spread over goroutines
// (sc.Parallel, set here), in sc's memory, which a caller keeps from draw
// to draw: a whole-row draw's scratch is megabytes.
func SampleRows(ids []int32, logits []float32, vocab int, rows []gpu.SampleRow, sc *gpu.SampleScratch) {
	sc.Parallel = gpu.InParallel
	for i, row := range rows {
		ids[i] = gpu.SampleHost(logits[i*vocab:(i+1)*vocab], row, sc)
	}
}

// ArgmaxRows sets ids[i] to the greedy choice of row i of logits (rows of
// vocab values), as ForwardArgmax chooses: the devices' argmax.
func ArgmaxRows(ids []int32, logits []float32, vocab int) {
	for i := range len(logits) / vocab {
		ids[i] = argmax(logits[i*vocab : (i+1)*vocab])
	}
}

// argmax is the index of the largest value, the lowest among equals; NaNs
// are skipped as the devices' argmax does.
func argmax(v []float32) int32 {
	best := -1
	for i, x := range v {
		if x != x {
			continue
		}
		if best < 0 || x > v[best] {
			best = i
		}
	}
	return int32(max(best, 0))
}

// freeLogits frees the buffers of the logits rows and what is formed from
// them.
func (m *Model) freeLogits() {
	s := &m.s
	for _, b := range []gpu.Buffer{s.logits, s.last, s.next, s.summary, s.logitsPart} {
		if b != nil {
			m.dev.Free(b)
		}
	}
	s.logits, s.last, s.next, s.summary, s.logitsPart, s.logitRows = nil, nil, nil, nil, nil, 0
	s.rowPart, s.rowFull = nil, nil
}

// ensureLogits sizes the logits buffers for r rows.
func (m *Model) ensureLogits(r int) error {
	s, d, c := &m.s, m.dev, &m.Config
	if s.logitRows >= r || r == 0 {
		return nil
	}
	m.dropGraphs(nil)
	m.freeLogits()
	var err error
	if s.logits, err = d.Alloc(gpu.F32, r*c.Vocab); err != nil {
		return fmt.Errorf("forward: logits: %w", err)
	}
	if s.last, err = d.Alloc(gpu.F32, r*c.Hidden); err != nil {
		return fmt.Errorf("forward: logits: %w", err)
	}
	if s.next, err = d.Alloc(gpu.I32, r); err != nil {
		return fmt.Errorf("forward: logits: %w", err)
	}
	if s.summary, err = d.Alloc(gpu.F32, r*gpu.SummaryWidth(gpu.MaxSummaryTop)); err != nil {
		return fmt.Errorf("forward: logits: %w", err)
	}
	if m.headSplit {
		part := c.Vocab / m.opts.Shard.Size
		if s.logitsPart, err = d.Alloc(gpu.F32, r*part); err != nil {
			return fmt.Errorf("forward: logits: %w", err)
		}
		sl := d.(gpu.Slicer)
		for i := range r {
			pv, err := sl.Slice(s.logitsPart, i*part, part)
			if err != nil {
				return fmt.Errorf("forward: logits: %w", err)
			}
			fv, err := sl.Slice(s.logits, i*c.Vocab, c.Vocab)
			if err != nil {
				return fmt.Errorf("forward: logits: %w", err)
			}
			s.rowPart, s.rowFull = append(s.rowPart, pv), append(s.rowFull, fv)
		}
	}
	s.logitRows = r
	return nil
}

// upload validates the batch and writes its indexes (and, for a stage
// after the first, its activations) to the device.
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
	if cache == nil || len(cache.k) != len(m.layers) {
		return fmt.Errorf("forward: cache does not match the model's %d layers", len(m.layers))
	}
	if len(b.Logits) > n {
		return fmt.Errorf("forward: %d logits rows for a batch of %d", len(b.Logits), n)
	}
	// Block tables are uploaded as fixed-width rows covering the whole
	// context, so the attention's shape does not change from step to step.
	maxBlocks := (c.MaxPositions + cache.BlockSize - 1) / cache.BlockSize
	if err := m.ensureIndex(maxBlocks); err != nil {
		return err
	}
	ix := &s.idx
	slots := ix.section(secSlots, n)
	ix.runs = 0
	for i := range n {
		sq, p := b.Seq[i], b.Pos[i]
		if i == 0 || sq != b.Seq[i-1] || p != b.Pos[i-1]+1 {
			ix.runs++
		}
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
	ht := ix.section(secTable, need)
	for i, t := range b.Tables {
		if len(t) > maxBlocks {
			return fmt.Errorf("forward: block table of sequence %d has %d blocks, more than the context needs (%d)", i, len(t), maxBlocks)
		}
		copy(ht[i*maxBlocks:], t)
		clear(ht[i*maxBlocks+len(t) : (i+1)*maxBlocks])
	}
	if m.first() {
		copy(ix.section(secIDs, n), b.Tokens)
	}
	copy(ix.section(secPos, n), b.Pos)
	copy(ix.section(secSeq, n), b.Seq)
	copy(ix.section(secRows, len(b.Logits)), b.Logits)
	if err := ix.write(m.dev, n, len(b.Logits), need); err != nil {
		return fmt.Errorf("forward: %w", err)
	}
	if !m.first() {
		return m.dev.Write(s.x, 0, gpu.F32Bytes(b.Hidden))
	}
	return nil
}

// ops issues the operations of one step over the indexes already written:
// the embedding (first stage), the layers, and for the last stage the final
// norm and LM head over r rows, with their argmax when argmax is set.
func (m *Model) ops(cache *Cache, n, r int, argmax bool, from tokenSource) error {
	c, s, d := &m.Config, &m.s, m.dev
	if m.first() {
		ids := s.idx.ids
		if from == fromPrevious {
			ids = s.next
		}
		if err := d.Embed(s.x, m.embed, ids, n, c.Hidden); err != nil {
			return fmt.Errorf("forward: %w", err)
		}
	}
	head := m.headFused(n, r)
	t, err := m.layersForward(cache, n, head)
	if err != nil {
		return err
	}
	if !m.last() || r == 0 {
		return nil
	}
	if t.y != nil {
		// One token: its last residual update, the final norm and the
		// argmax inside the LM head.
		var next gpu.Buffer
		if argmax {
			next = s.next
		}
		if err := m.hm.HeadMatVec(s.logits, next, t.r, t.y, t.wn, m.norm, m.lmHead, c.Hidden, c.Vocab, float32(c.NormEps)); err != nil {
			return fmt.Errorf("forward: logits: %w", err)
		}
		return nil
	}
	var e errs
	e.do(d.Embed(s.last, s.x, s.idx.rows, r, c.Hidden))
	e.do(d.RMSNorm(s.last, s.last, m.norm, r, c.Hidden, float32(c.NormEps)))
	if m.headSplit {
		S := m.opts.Shard.Size
		e.do(d.MatMul(s.logitsPart, s.last, m.lmHead, r, c.Hidden, c.Vocab/S))
		for i := range r {
			e.do(m.opts.Shard.Comm.AllGather(s.rowFull[i], s.rowPart[i]))
		}
	} else {
		e.do(d.MatMul(s.logits, s.last, m.lmHead, r, c.Hidden, c.Vocab))
	}
	if argmax {
		if am, ok := d.(gpu.Argmaxer); ok {
			e.do(am.Argmax(s.next, s.logits, r, c.Vocab))
		}
	}
	if e.err != nil {
		return fmt.Errorf("forward: logits: %w", e.err)
	}
	return nil
}

// qkvFuseTokens is the most tokens a step runs through gpu.QKVPreparer.
// Its blocks each read a token's whole q (k) row for OLMo 2's norm, which
// costs more than the launches it saves on a long prefill (512 tokens:
// 0.4 ms slower on an H200); decode steps, up to 64 tokens, gain.
const qkvFuseTokens = 64

// headFused says whether a step of n tokens and r logits rows leaves its
// last residual update to the LM head (gpu.HeadMatVecer): one token on the
// whole model's last stage.
func (m *Model) headFused(n, r int) bool {
	return n == 1 && r == 1 && m.hm != nil && m.last() && !m.headSplit && m.group == nil &&
		(m.opts.Shard == nil || m.opts.Shard.Size == 1)
}

// residual is an update of the residual r that layersForward leaves to
// the LM head: r + rmsnorm(y)·wn, or r + y when wn is nil. y is nil when
// the residual is whole in s.x.
type residual struct{ r, y, wn gpu.Buffer }

// layersForward runs every layer over the n tokens in s.x. With toHead it
// may leave the last layer's residual update to the LM head.
func (m *Model) layersForward(cache *Cache, n int, toHead bool) (residual, error) {
	c, s, d := &m.Config, &m.s, m.dev
	qw, kw := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	eps := float32(c.NormEps)
	attn := gpu.AttnArgs{
		N: n, Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim,
		BlockSize: cache.BlockSize, MaxBlocks: s.idx.maxBlocks,
		Scale: float32(1 / math.Sqrt(float64(c.HeadDim))),
		Pos:   s.idx.pos, Seq: s.idx.seq, BlockTable: s.idx.table, Runs: s.idx.runs,
	}
	// pending: the last layer's MLP output in s.o is still to be added to
	// the residual, fused with the next layer's input norm.
	pending := false
	// With fused post-norms, res is the residual and alt the buffer its
	// next update goes to (they swap at each), and post the weights of the
	// post-norm that the next q|k|v product forms.
	fused, res, alt := m.postFused(n), s.x, s.h
	var post gpu.Buffer
	for i := range m.layers {
		ly := &m.layers[i]
		var e errs
		// Attention input: pre-norm architectures normalise first.
		in := res
		if c.Arch != OLMo2 {
			if pending {
				e.do(m.reduceNorm(s.h, s.x, s.o, ly.attnNorm, n, eps))
				pending = false
			} else {
				e.do(d.RMSNorm(s.h, s.x, ly.attnNorm, n, c.Hidden, eps))
			}
			in = s.h
		}
		q, k, v := s.q, s.k, s.v
		stride := 0 // of q, k and v when they are rows of one packed product
		switch {
		case n == 1 && ly.qkv != nil && s.qkv1 != nil:
			if post != nil {
				e.do(m.pn.PostNormMatVec(s.qkv1, alt, res, s.o, post, ly.qkv, c.Hidden, qw+2*kw, false, eps))
				res, alt, post = alt, res, nil
			} else {
				e.do(d.MatMul(s.qkv1, in, ly.qkv, 1, c.Hidden, qw+2*kw))
			}
			q, k, v, stride = s.q1, s.k1, s.v1, qw+2*kw
		case n <= s.packedRows && ly.qkv != nil && s.qkv1 != nil && m.qp != nil && m.sn == nil:
			// Only the fused preparation reads strided rows (and the
			// sums of squares of a sharded QK-norm need dense ones).
			e.do(d.MatMul(s.qkv1, in, ly.qkv, n, c.Hidden, qw+2*kw))
			q, k, v, stride = s.q1, s.k1, s.v1, qw+2*kw
		default:
			e.do(d.MatMul(q, in, ly.q, n, c.Hidden, qw))
			e.do(d.MatMul(k, in, ly.k, n, c.Hidden, kw))
			e.do(d.MatMul(v, in, ly.v, n, c.Hidden, kw))
		}
		if c.Arch == OLMo2 && m.sn != nil {
			// Each rank holds a slice of the rows OLMo 2's QK-norm spans:
			// the sums of their squares over every rank.
			if m.nr != nil {
				e.do(m.nr.SumSquares2(s.ss, q, k, n, qw, kw))
			} else {
				e.do(m.sn.SumSquares2(s.ss, q, k, n, qw, kw))
				e.do(m.reduce(s.ss, 2*n))
			}
		}
		if m.qp != nil && n <= qkvFuseTokens {
			pa := gpu.QKVArgs{N: n, Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, Eps: eps, Stride: stride}
			switch {
			case c.Arch == OLMo2 && m.sn != nil:
				pa.Norm, pa.Sums, pa.QWidth, pa.KWidth = gpu.QKNormSums, s.ss, m.full.Heads*c.HeadDim, m.full.KVHeads*c.HeadDim
			case c.Arch == OLMo2:
				pa.Norm = gpu.QKNormRow
			case c.Arch == Qwen3 || c.Arch == Qwen3MoE:
				pa.Norm = gpu.QKNormHead
			}
			e.do(m.qp.PrepareQKV(s.qr, q, k, v, ly.qNorm, ly.kNorm, s.idx.pos, m.invFreq, cache.k[i], cache.v[i], s.idx.slots, pa))
			q = s.qr
		} else {
			switch {
			case c.Arch == OLMo2 && m.sn != nil:
				e.do(m.sn.RMSNormShard(q, s.ss, 0, ly.qNorm, n, qw, m.full.Heads*c.HeadDim, eps))
				e.do(m.sn.RMSNormShard(k, s.ss, n, ly.kNorm, n, kw, m.full.KVHeads*c.HeadDim, eps))
			case c.Arch == OLMo2: // QK-norm across the whole projection
				e.do(d.RMSNorm(q, q, ly.qNorm, n, qw, eps))
				e.do(d.RMSNorm(k, k, ly.kNorm, n, kw, eps))
			case c.Arch == Qwen3 || c.Arch == Qwen3MoE: // QK-norm per head
				e.do(d.RMSNorm(q, q, ly.qNorm, n*c.Heads, c.HeadDim, eps))
				e.do(d.RMSNorm(k, k, ly.kNorm, n*c.KVHeads, c.HeadDim, eps))
			}
			e.do(d.RoPE(q, s.idx.pos, m.invFreq, n, c.Heads, c.HeadDim))
			e.do(d.RoPE(k, s.idx.pos, m.invFreq, n, c.KVHeads, c.HeadDim))
			e.do(d.StoreKV(cache.k[i], cache.v[i], k, v, s.idx.slots, n, kw))
		}
		e.do(d.Attention(s.att, q, cache.k[i], cache.v[i], attn))
		e.do(d.MatMul(s.o, s.att, ly.o, n, qw, c.Hidden))
		switch {
		case fused && (i < len(m.layers)-1 || toHead):
			// The gate|up product forms the post-attention norm's
			// residual, and the next q|k|v product (or the LM head) the
			// post-MLP one's.
			e.do(m.pn.PostNormMatVec(s.g1, alt, res, s.o, ly.postAttnNorm, ly.gateUp, c.Hidden, c.Intermediate, true, eps))
			res, alt, post = alt, res, ly.postFFNorm
			e.do(d.MatMul(s.o, s.g1, ly.down, 1, c.Intermediate, c.Hidden))
		case c.Arch == OLMo2 && m.rn != nil:
			e.do(m.reduceNorm(nil, res, s.o, ly.postAttnNorm, n, eps))
			e.do(m.mlp(ly, res, s.o, n))
			e.do(m.reduceNorm(nil, res, s.o, ly.postFFNorm, n, eps))
		case c.Arch == OLMo2:
			e.do(m.reduce(s.o, n*c.Hidden))
			e.do(d.RMSNorm(s.o, s.o, ly.postAttnNorm, n, c.Hidden, eps))
			e.do(d.Add(s.x, s.x, s.o, n*c.Hidden))
			e.do(m.mlp(ly, s.x, s.o, n))
			e.do(m.reduce(s.o, n*c.Hidden))
			e.do(d.RMSNorm(s.o, s.o, ly.postFFNorm, n, c.Hidden, eps))
			e.do(d.Add(s.x, s.x, s.o, n*c.Hidden))
		case m.rn != nil:
			// The MLP's output is summed over the ranks and added with
			// the next layer's input norm.
			e.do(m.reduceNorm(s.h, s.x, s.o, ly.postAttnNorm, n, eps))
			e.do(m.mlp(ly, s.h, s.o, n))
			pending = true
		default:
			e.do(m.reduce(s.o, n*c.Hidden))
			e.do(d.Add(s.x, s.x, s.o, n*c.Hidden))
			e.do(d.RMSNorm(s.h, s.x, ly.postAttnNorm, n, c.Hidden, eps))
			e.do(m.mlp(ly, s.h, s.o, n))
			e.do(m.reduce(s.o, n*c.Hidden))
			e.do(d.Add(s.x, s.x, s.o, n*c.Hidden))
		}
		if e.err != nil {
			return residual{}, fmt.Errorf("forward: layer %d: %w", m.opts.FirstLayer+i, e.err)
		}
	}
	switch {
	case toHead && post != nil:
		return residual{r: res, y: s.o, wn: post}, nil
	case toHead && pending:
		return residual{r: s.x, y: s.o}, nil
	case res != s.x || post != nil:
		return residual{}, fmt.Errorf("forward: the residual ended outside its buffer")
	}
	if pending {
		if err := m.reduce(s.o, n*c.Hidden); err != nil {
			return residual{}, fmt.Errorf("forward: residual: %w", err)
		}
		if err := d.Add(s.x, s.x, s.o, n*c.Hidden); err != nil {
			return residual{}, fmt.Errorf("forward: residual: %w", err)
		}
	}
	return residual{r: s.x}, nil
}

// postFused says whether a step of n tokens has OLMo 2's post-norms
// formed by the one-token products that read the residual they update
// (gpu.PostNormMatVecer): the gate|up product the post-attention norm's,
// the next layer's q|k|v product the post-MLP norm's; the last layer's
// run as norms, or are formed by the LM head (headFused). The updates
// alternate between s.x and s.h (which OLMo 2 leaves unused), 2·(layers−1)
// of them, so the residual ends in s.x unless the LM head takes the last.
func (m *Model) postFused(n int) bool {
	c, s := &m.Config, &m.s
	if n != 1 || m.pn == nil || c.Arch != OLMo2 || s.qkv1 == nil || s.g1 == nil || (m.opts.Shard != nil && m.opts.Shard.Size > 1) {
		return false
	}
	for i := range m.layers {
		if ly := &m.layers[i]; ly.qkv == nil || ly.gateUp == nil || ly.moe != nil {
			return false
		}
	}
	return true
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
	F := c.Intermediate
	if n == 1 && ly.gateUp != nil && s.gu1 != nil && m.gmv != nil {
		// One token: silu(gate)*up leaves the gate|up product, F values.
		e.do(m.gmv.GatedMatVec(s.g1, in, ly.gateUp, c.Hidden, F))
		e.do(d.MatMul(out, s.g1, ly.down, 1, F, c.Hidden))
		return e.err
	}
	if ly.gateUp != nil && s.gu1 != nil && n <= s.packedRows && m.gm != nil {
		return m.gm.GatedMLP(out, s.gu1, in, ly.gateUp, ly.down, n, c.Hidden, F, c.Hidden)
	}
	if ly.gateUp != nil && s.gu1 != nil && n == 1 {
		e.do(d.MatMul(s.gu1, in, ly.gateUp, n, c.Hidden, 2*F))
		e.do(d.SiLUMul(s.g1, s.g1, s.u1, F))
		e.do(d.MatMul(out, s.g1, ly.down, 1, F, c.Hidden))
		return e.err
	}
	e.do(d.MatMul(s.gate, in, ly.gate, n, c.Hidden, F))
	e.do(d.MatMul(s.up, in, ly.up, n, c.Hidden, F))
	e.do(d.SiLUMul(s.gate, s.gate, s.up, n*F))
	e.do(d.MatMul(out, s.gate, ly.down, n, F, c.Hidden))
	return e.err
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
	if q := c.Quant; q != nil {
		fmt.Fprintf(&b, ", %s weights (%s) dequantized to bf16", q.codes(), q.Method)
	}
	return b.String()
}
