package models

import (
	"fmt"
	"strings"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models/safetensors"
)

// Coding names the weights Options.CodeWeights codes.
type Coding int

const (
	CodeNone Coding = iota // no weights
	CodeHead               // the LM head's
	CodeAll                // the LM head's and the layers' large products' (codeMinWeights)
	// CodeAuto codes as CodeAll where the twins take at most an eighth of
	// the device's memory free beside the model's weights, else as
	// CodeHead (Coding.Resolve).
	CodeAuto
)

var codingNames = [...]string{"none", "head", "all", "auto"}

func (c Coding) String() string {
	if c < 0 || int(c) >= len(codingNames) {
		return fmt.Sprintf("Coding(%d)", int(c))
	}
	return codingNames[c]
}

// MarshalText writes c's name.
func (c Coding) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText reads a Coding by its name: none (or empty), head, all or
// auto.
func (c *Coding) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*c = CodeNone
		return nil
	}
	for i, name := range codingNames {
		if string(b) == name {
			*c = Coding(i)
			return nil
		}
	}
	return fmt.Errorf("weight coding %q: want none, head, all or auto", b)
}

// codeMinWeights is the fewest weights of a layer's product that CodeAll
// codes. Smaller products ran slower coded on an H200 (OLMo-2-1B's q|k|v,
// 6,144 × 2,048, and o, 2,048²): every weight of such a product is in
// flight before the kernel waits for the one ahead, so the code's longer
// arithmetic after the wait is its path, and the bytes saved are not
// (docs/cuda.md, "Weights in a 12-bit code").
const codeMinWeights = 1 << 24

// Resolve is the coding c stands for in a model of cfg on dev with free
// bytes of device memory beside its weights: CodeAuto becomes CodeAll
// where its twins (TwinBytes) take at most an eighth of free, else
// CodeHead; the others are themselves.
func (c Coding) Resolve(cfg *Config, dev gpu.Device, free int64) Coding {
	if c != CodeAuto {
		return c
	}
	if TwinBytes(cfg, CodeAll, dev) <= free/8 {
		return CodeAll
	}
	return CodeHead
}

// TwinBytes is the device memory the twins of coding c (resolved) take in
// a whole model of cfg on dev, at most: a matrix whose values the code
// does not fit stays bf16 only.
func TwinBytes(cfg *Config, c Coding, dev gpu.Device) int64 {
	wc, ok := dev.(gpu.WeightCoder)
	if !ok {
		return 0
	}
	var n int64
	for _, cm := range codedMatrices(cfg, c, 0, cfg.Layers, true) {
		if wc.Codable(cm.rows, cm.k) {
			n += int64(cm.rows) * int64(cm.k) * 2 / 4 * 3
		}
	}
	return n
}

// codedMatrix is a matrix a coding codes: its weight in a loaded model
// (packed, as a gpu.Packer device holds it), its shape and the
// checkpoint's tensors of its rows.
type codedMatrix struct {
	w       func(*Model) gpu.Buffer
	rows, k int
	names   []string
}

// codedMatrices lists what coding c codes in layers [first, last) of a
// model of cfg, and its LM head with head: for CodeAll the dense layers'
// q|k|v, o, gate|up and down products of at least codeMinWeights
// weights, and for CodeHead and CodeAll the head (the tied embedding).
func codedMatrices(cfg *Config, c Coding, first, last int, head bool) []codedMatrix {
	var out []codedMatrix
	if c == CodeAll {
		qw, kvw := cfg.Heads*cfg.HeadDim, cfg.KVHeads*cfg.HeadDim
		for l := first; l < last; l++ {
			if cfg.SparseLayers != nil && cfg.SparseLayers[l] {
				continue
			}
			p, i := fmt.Sprintf("model.layers.%d.", l), l-first
			for _, cm := range []codedMatrix{
				{func(m *Model) gpu.Buffer { return m.layers[i].qkv }, qw + 2*kvw, cfg.Hidden,
					[]string{p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight"}},
				{func(m *Model) gpu.Buffer { return m.layers[i].o }, cfg.Hidden, qw, []string{p + "self_attn.o_proj.weight"}},
				{func(m *Model) gpu.Buffer { return m.layers[i].gateUp }, 2 * cfg.Intermediate, cfg.Hidden,
					[]string{p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}},
				{func(m *Model) gpu.Buffer { return m.layers[i].down }, cfg.Hidden, cfg.Intermediate, []string{p + "mlp.down_proj.weight"}},
			} {
				if cm.rows*cm.k >= codeMinWeights {
					out = append(out, cm)
				}
			}
		}
	}
	if head && (c == CodeHead || c == CodeAll) {
		name := "lm_head.weight"
		if cfg.TieEmbeddings {
			name = "model.embed_tokens.weight"
		}
		out = append(out, codedMatrix{func(m *Model) gpu.Buffer { return m.lmHead }, cfg.Vocab, cfg.Hidden, []string{name}})
	}
	return out
}

// codeWeights gives the one-token products' weights their twins in the
// 12-bit code (Options.CodeWeights, resolved against the memory free now
// that the weights are loaded).
func (m *Model) codeWeights(ckpt *safetensors.Checkpoint) error {
	wc, ok := m.dev.(gpu.WeightCoder)
	if !ok || m.opts.Shard != nil {
		return nil
	}
	c := m.opts.CodeWeights
	if c == CodeAuto {
		c = CodeHead
		if mr, ok := m.dev.(gpu.MemoryReporter); ok {
			if free, _, err := mr.FreeMemory(); err == nil {
				c = CodeAuto.Resolve(&m.Config, m.dev, free)
			}
		}
	}
	m.coding = c
	for _, cm := range codedMatrices(&m.Config, c, m.opts.FirstLayer, m.opts.LastLayer, m.last() && !m.headSplit) {
		w := cm.w(m)
		if w == nil {
			continue
		}
		parts, n := make([][]byte, len(cm.names)), 0
		for i, name := range cm.names {
			dt, data, err := m.tensor(ckpt, name)
			if err != nil {
				return err
			}
			if dt != gpu.BF16 {
				return nil
			}
			parts[i], n = data, n+len(data)
		}
		ok, err := wc.Code(w, n/2/cm.k, cm.k, parts...)
		if err != nil {
			return fmt.Errorf("load: coding %s: %w", strings.Join(cm.names, ", "), err)
		}
		if ok {
			m.coded++
		}
	}
	return nil
}
