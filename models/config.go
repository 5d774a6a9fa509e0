package models

import (
	"encoding/json"
	"fmt"
	"github.com/troupe/troupe/gpu"
	"math"
	"os"
	"path/filepath"
	"slices"
)

// Arch names a supported architecture family.
type Arch string

// Supported architectures, by Hugging Face model_type.
const (
	OLMo2    Arch = "olmo2"
	Llama    Arch = "llama"
	Qwen3    Arch = "qwen3"
	Qwen3MoE Arch = "qwen3_moe"
)

// Rope describes rotary position embeddings.
type Rope struct {
	Theta float64
	// Type is "default" or "llama3".
	Type string
	// llama3 scaling parameters.
	Factor, LowFreqFactor, HighFreqFactor float64
	OriginalMaxPositions                  int
	// RoundBF16 rounds the inverse frequencies to bfloat16, as the
	// reference implementation does for checkpoints stored in bfloat16.
	RoundBF16 bool
}

// Config is the architecture of a checkpoint, read from config.json.
type Config struct {
	Arch            Arch
	Architecture    string // e.g. "Olmo2ForCausalLM"
	Hidden          int
	Intermediate    int
	Layers          int
	Heads           int
	KVHeads         int
	HeadDim         int
	Vocab           int
	MaxPositions    int
	NormEps         float64
	Rope            Rope
	TieEmbeddings   bool
	EOS             []int32
	BOS             int32 // -1 when absent
	Experts         int   // MoE: experts per layer (0 for dense models)
	ExpertsPerToken int
	MoEIntermediate int
	NormTopK        bool
	// SparseLayer reports which layers use the MoE block.
	SparseLayers []bool
	// Quant is the quantization of the checkpoint's weights, nil for none
	// (quant.go).
	Quant *Quant
}

// rawConfig mirrors the fields of config.json that matter, in both the 4.x
// and 5.x spellings.
type rawConfig struct {
	ModelType         string          `json:"model_type"`
	Architectures     []string        `json:"architectures"`
	HiddenSize        int             `json:"hidden_size"`
	IntermediateSize  int             `json:"intermediate_size"`
	NumLayers         int             `json:"num_hidden_layers"`
	NumHeads          int             `json:"num_attention_heads"`
	NumKVHeads        *int            `json:"num_key_value_heads"`
	HeadDim           *int            `json:"head_dim"`
	VocabSize         int             `json:"vocab_size"`
	MaxPositions      int             `json:"max_position_embeddings"`
	RMSNormEps        *float64        `json:"rms_norm_eps"`
	RopeTheta         *float64        `json:"rope_theta"`
	RopeParameters    *rawRope        `json:"rope_parameters"`
	RopeScaling       *rawRope        `json:"rope_scaling"`
	TieEmbeddings     *bool           `json:"tie_word_embeddings"`
	EOS               json.RawMessage `json:"eos_token_id"`
	BOS               json.RawMessage `json:"bos_token_id"`
	HiddenAct         string          `json:"hidden_act"`
	AttentionBias     bool            `json:"attention_bias"`
	MLPBias           bool            `json:"mlp_bias"`
	UseSlidingWindow  bool            `json:"use_sliding_window"`
	NumExperts        int             `json:"num_experts"`
	NumLocalExperts   int             `json:"num_local_experts"`
	ExpertsPerTok     int             `json:"num_experts_per_tok"`
	MoEIntermediate   int             `json:"moe_intermediate_size"`
	NormTopKProb      bool            `json:"norm_topk_prob"`
	DecoderSparseStep int             `json:"decoder_sparse_step"`
	MLPOnlyLayers     []int           `json:"mlp_only_layers"`
	SharedExpertSize  int             `json:"shared_expert_intermediate_size"`
	DType             string          `json:"dtype"`
	TorchDType        string          `json:"torch_dtype"`
	Quantization      *rawQuant       `json:"quantization_config"`
}

type rawRope struct {
	RopeTheta            *float64 `json:"rope_theta"`
	RopeType             string   `json:"rope_type"`
	Type                 string   `json:"type"`
	Factor               float64  `json:"factor"`
	LowFreqFactor        float64  `json:"low_freq_factor"`
	HighFreqFactor       float64  `json:"high_freq_factor"`
	OriginalMaxPositions int      `json:"original_max_position_embeddings"`
}

// UnsupportedError names why a checkpoint cannot be served.
type UnsupportedError struct{ Reason string }

func (e *UnsupportedError) Error() string { return "unsupported checkpoint: " + e.Reason }

func unsupported(format string, args ...any) error {
	return &UnsupportedError{Reason: fmt.Sprintf(format, args...)}
}

// ReadConfig reads dir/config.json.
func ReadConfig(dir string) (*Config, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	c, err := ParseConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return c, nil
}

// ParseConfig parses and validates a Hugging Face config.json.
func ParseConfig(data []byte) (*Config, error) {
	var r rawConfig
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	c := &Config{
		Arch:         Arch(r.ModelType),
		Hidden:       r.HiddenSize,
		Intermediate: r.IntermediateSize,
		Layers:       r.NumLayers,
		Heads:        r.NumHeads,
		Vocab:        r.VocabSize,
		MaxPositions: r.MaxPositions,
		NormEps:      1e-6,
		BOS:          -1,
	}
	if len(r.Architectures) > 0 {
		c.Architecture = r.Architectures[0]
	}
	switch c.Arch {
	case OLMo2, Llama, Qwen3, Qwen3MoE:
	case "":
		return nil, unsupported("config.json has no model_type")
	default:
		return nil, unsupported("model_type %q (supported: olmo2, llama, qwen3, qwen3_moe)", r.ModelType)
	}
	if r.HiddenAct != "" && r.HiddenAct != "silu" {
		return nil, unsupported("hidden_act %q (only silu)", r.HiddenAct)
	}
	if r.AttentionBias {
		return nil, unsupported("attention_bias=true")
	}
	if r.MLPBias {
		return nil, unsupported("mlp_bias=true")
	}
	if r.UseSlidingWindow {
		return nil, unsupported("use_sliding_window=true")
	}
	if r.SharedExpertSize > 0 {
		return nil, unsupported("shared experts")
	}
	var err error
	if c.Quant, err = parseQuant(r.Quantization); err != nil {
		return nil, err
	}
	c.KVHeads = c.Heads
	if r.NumKVHeads != nil {
		c.KVHeads = *r.NumKVHeads
	}
	if c.Heads > 0 {
		c.HeadDim = c.Hidden / c.Heads
	}
	if r.HeadDim != nil {
		c.HeadDim = *r.HeadDim
	}
	if r.RMSNormEps != nil {
		c.NormEps = *r.RMSNormEps
	}
	c.TieEmbeddings = r.TieEmbeddings != nil && *r.TieEmbeddings
	if err := parseRope(c, &r); err != nil {
		return nil, err
	}
	if c.EOS, err = tokenIDs(r.EOS); err != nil {
		return nil, fmt.Errorf("config.json: eos_token_id: %w", err)
	}
	if bos, err := tokenIDs(r.BOS); err != nil {
		return nil, fmt.Errorf("config.json: bos_token_id: %w", err)
	} else if len(bos) > 0 {
		c.BOS = bos[0]
	}
	if c.Arch == Qwen3MoE {
		c.Experts = r.NumExperts
		if c.Experts == 0 {
			c.Experts = r.NumLocalExperts
		}
		c.ExpertsPerToken = r.ExpertsPerTok
		c.MoEIntermediate = r.MoEIntermediate
		c.NormTopK = r.NormTopKProb
		step := r.DecoderSparseStep
		if step <= 0 {
			step = 1
		}
		c.SparseLayers = make([]bool, max(c.Layers, 0))
		dense := map[int]bool{}
		for _, l := range r.MLPOnlyLayers {
			dense[l] = true
		}
		for l := range c.SparseLayers {
			c.SparseLayers[l] = !dense[l] && c.Experts > 0 && (l+1)%step == 0
		}
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

func parseRope(c *Config, r *rawConfig) error {
	c.Rope = Rope{Theta: 10000, Type: "default"}
	if r.RopeTheta != nil {
		c.Rope.Theta = *r.RopeTheta
	}
	for _, p := range []*rawRope{r.RopeScaling, r.RopeParameters} {
		if p == nil {
			continue
		}
		if p.RopeTheta != nil {
			c.Rope.Theta = *p.RopeTheta
		}
		typ := p.RopeType
		if typ == "" {
			typ = p.Type
		}
		switch typ {
		case "", "default":
		case "llama3":
			c.Rope.Type = "llama3"
			c.Rope.Factor, c.Rope.LowFreqFactor, c.Rope.HighFreqFactor = p.Factor, p.LowFreqFactor, p.HighFreqFactor
			c.Rope.OriginalMaxPositions = p.OriginalMaxPositions
			if p.Factor <= 0 || p.LowFreqFactor <= 0 || p.HighFreqFactor <= p.LowFreqFactor || p.OriginalMaxPositions <= 0 {
				return unsupported("llama3 rope scaling with factor %v, low %v, high %v, original positions %d", p.Factor, p.LowFreqFactor, p.HighFreqFactor, p.OriginalMaxPositions)
			}
		default:
			return unsupported("rope scaling type %q (supported: default, llama3)", typ)
		}
	}
	c.Rope.RoundBF16 = r.DType == "bfloat16" || (r.DType == "" && r.TorchDType == "bfloat16")
	if !(c.Rope.Theta > 0) || math.IsInf(c.Rope.Theta, 0) {
		return unsupported("rope_theta %v", c.Rope.Theta)
	}
	return nil
}

// tokenIDs decodes a token id that may be null, a number or a list.
// MergeGeneration adds the eos_token_id of a generation_config.json (raw,
// nil where there is none) to c.EOS: Hugging Face's generate stops at
// those, and some instruct models name their end-of-turn token there
// alone (Llama 3's <|eot_id|>).
func (c *Config) MergeGeneration(raw []byte) error {
	if raw == nil {
		return nil
	}
	var g struct {
		EOS json.RawMessage `json:"eos_token_id"`
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		return fmt.Errorf("generation_config.json: %w", err)
	}
	ids, err := tokenIDs(g.EOS)
	if err != nil {
		return fmt.Errorf("generation_config.json: eos_token_id: %w", err)
	}
	for _, id := range ids {
		if !slices.Contains(c.EOS, id) {
			c.EOS = append(c.EOS, id)
		}
	}
	return nil
}

// Sampling is a model's default sampling, as its generation_config.json
// names it: each field nil where the file does not.
type Sampling struct {
	Temperature, TopP, MinP, RepetitionPenalty *float64
	TopK                                       *int
}

// Any reports whether s names any default.
func (s Sampling) Any() bool {
	return s.Temperature != nil || s.TopP != nil || s.MinP != nil || s.RepetitionPenalty != nil || s.TopK != nil
}

// ParseSampling reads the sampling defaults of a generation_config.json
// (raw, nil where there is none).
func ParseSampling(raw []byte) (Sampling, error) {
	var s struct {
		Temperature       *float64 `json:"temperature"`
		TopP              *float64 `json:"top_p"`
		TopK              *int     `json:"top_k"`
		MinP              *float64 `json:"min_p"`
		RepetitionPenalty *float64 `json:"repetition_penalty"`
	}
	if raw == nil {
		return Sampling{}, nil
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return Sampling{}, fmt.Errorf("generation_config.json: %w", err)
	}
	return Sampling{Temperature: s.Temperature, TopP: s.TopP, TopK: s.TopK, MinP: s.MinP, RepetitionPenalty: s.RepetitionPenalty}, nil
}

func tokenIDs(raw json.RawMessage) ([]int32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one int64
	if err := json.Unmarshal(raw, &one); err == nil {
		return []int32{int32(one)}, nil
	}
	var many []int64
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, fmt.Errorf("want a number or a list of numbers, got %s", raw)
	}
	out := make([]int32, len(many))
	for i, v := range many {
		out[i] = int32(v)
	}
	return out, nil
}

// Validate checks that the dimensions are usable.
func (c *Config) Validate() error {
	for _, f := range []struct {
		name  string
		v, hi int
	}{
		{"hidden_size", c.Hidden, 1 << 17}, {"num_hidden_layers", c.Layers, 1024}, {"num_attention_heads", c.Heads, 1024},
		{"num_key_value_heads", c.KVHeads, 1024}, {"head_dim", c.HeadDim, 1024}, {"vocab_size", c.Vocab, 1 << 22},
		{"intermediate_size", c.Intermediate, 1 << 20}, {"num_experts", c.Experts, 1024},
	} {
		if f.v < 0 || f.v > f.hi || (f.v == 0 && f.name != "intermediate_size" && f.name != "num_experts") {
			return unsupported("%s=%d (want 1..%d)", f.name, f.v, f.hi)
		}
	}
	if c.Intermediate <= 0 && c.Experts == 0 {
		return unsupported("intermediate_size=%d", c.Intermediate)
	}
	if c.Heads%c.KVHeads != 0 {
		return unsupported("%d attention heads are not a multiple of %d key/value heads", c.Heads, c.KVHeads)
	}
	if c.HeadDim%2 != 0 {
		return unsupported("odd head_dim %d", c.HeadDim)
	}
	if c.MaxPositions <= 0 {
		c.MaxPositions = 4096
	}
	if !(c.NormEps > 0) {
		return unsupported("rms_norm_eps %v", c.NormEps)
	}
	if c.Arch == Qwen3MoE {
		if c.Experts <= 0 || c.ExpertsPerToken <= 0 || c.ExpertsPerToken > c.Experts || c.MoEIntermediate <= 0 {
			return unsupported("mixture of experts with %d experts, %d per token, intermediate %d", c.Experts, c.ExpertsPerToken, c.MoEIntermediate)
		}
	}
	return nil
}

// InvFreq returns the RoPE inverse frequencies, with llama3 scaling applied.
func (c *Config) InvFreq() []float32 {
	half := c.HeadDim / 2
	out := make([]float32, half)
	for i := range out {
		f := 1 / math.Pow(c.Rope.Theta, float64(2*i)/float64(c.HeadDim))
		if c.Rope.Type == "llama3" {
			r := c.Rope
			lowWave := float64(r.OriginalMaxPositions) / r.LowFreqFactor
			highWave := float64(r.OriginalMaxPositions) / r.HighFreqFactor
			wave := 2 * math.Pi / f
			switch {
			case wave > lowWave:
				f /= r.Factor
			case wave >= highWave:
				smooth := (float64(r.OriginalMaxPositions)/wave - r.LowFreqFactor) / (r.HighFreqFactor - r.LowFreqFactor)
				f = (1-smooth)*f/r.Factor + smooth*f
			}
		}
		if c.Rope.RoundBF16 {
			// Hugging Face keeps inv_freq as a buffer in the checkpoint's
			// dtype, so a bfloat16 checkpoint rotates by rounded frequencies.
			f = float64(gpu.BF16ToF32(gpu.F32ToBF16(float32(f))))
		}
		out[i] = float32(f)
	}
	return out
}
