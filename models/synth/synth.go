package synth

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"unsafe"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/safetensors"
)

// Preset is the config.json of a published model shape.
type Preset map[string]any

// Presets are the shapes troupe can synthesise, by architecture and name.
var presets = map[string]map[string]Preset{
	"olmo2": {
		// OLMo-2-0425-1B.
		"1b": OLMo2(2048, 16, 16, 8192),
		// OLMo-2-1124-7B.
		"7b": OLMo2(4096, 32, 32, 11008),
		// OLMo-2-1124-13B.
		"13b": OLMo2(5120, 40, 40, 13824),
		// A 70B-class shape (Llama-3-70B dimensions with OLMo 2 layers).
		"70b": func() Preset {
			p := OLMo2(8192, 80, 64, 28672)
			p["num_key_value_heads"] = 8
			return p
		}(),
	},
	"llama": {
		// Llama-3.2-1B.
		"1b": Llama(2048, 16, 32, 8, 64, 8192, true, 32),
		// Llama-3.2-3B.
		"3b": Llama(3072, 28, 24, 8, 128, 8192, true, 32),
		// Llama-3.1-8B.
		"8b": Llama(4096, 32, 32, 8, 128, 14336, false, 8),
	},
	"qwen3": {
		// Qwen3-0.6B.
		"0.6b": Qwen3(1024, 28, 16, 8, 3072, true),
		// Qwen3-1.7B.
		"1.7b": Qwen3(2048, 28, 16, 8, 6144, true),
		// Qwen3-8B.
		"8b": Qwen3(4096, 36, 32, 8, 12288, false),
	},
	"qwen3moe": {
		// Qwen3-30B-A3B.
		"30b-a3b": Qwen3MoE(2048, 48, 32, 4, 768, 128, 8),
	},
}

// Archs lists the architectures with presets.
func Archs() []string {
	var out []string
	for a := range presets {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

// OLMo2 is an OLMo 2 shape of the given widths, with OLMo 2's vocabulary
// and settings: the presets' maker, and custom shapes' for tests and
// benchmarks (set other keys of the fresh map as needed).
func OLMo2(hidden, layers, heads, ffn int) Preset {
	return Preset{
		"architectures": []string{"Olmo2ForCausalLM"}, "model_type": "olmo2",
		"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
		"num_key_value_heads": heads, "intermediate_size": ffn, "vocab_size": 100352,
		"max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 500000.0,
		"tie_word_embeddings": false, "hidden_act": "silu", "eos_token_id": 100257,
		"pad_token_id": 100277, "attention_bias": false, "torch_dtype": "bfloat16",
	}
}

// Llama is a Llama 3 shape (grouped-query attention, Llama 3's vocabulary
// and its RoPE scaling by factor, as the 3.1 and 3.2 models set it).
func Llama(hidden, layers, heads, kvHeads, headDim, ffn int, tied bool, factor float64) Preset {
	return Preset{
		"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama",
		"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
		"num_key_value_heads": kvHeads, "head_dim": headDim, "intermediate_size": ffn, "vocab_size": 128256,
		"max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
		"rope_scaling": map[string]any{"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
			"high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
		"tie_word_embeddings": tied, "hidden_act": "silu", "bos_token_id": 128000, "eos_token_id": 128001,
		"attention_bias": false, "mlp_bias": false, "torch_dtype": "bfloat16",
	}
}

// Qwen3 is a Qwen3 shape (per-head QK-norm, heads of 128, Qwen's
// vocabulary).
func Qwen3(hidden, layers, heads, kvHeads, ffn int, tied bool) Preset {
	return Preset{
		"architectures": []string{"Qwen3ForCausalLM"}, "model_type": "qwen3",
		"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
		"num_key_value_heads": kvHeads, "head_dim": 128, "intermediate_size": ffn, "vocab_size": 151936,
		"max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
		"tie_word_embeddings": tied, "hidden_act": "silu", "bos_token_id": 151643, "eos_token_id": 151645,
		"attention_bias": false, "torch_dtype": "bfloat16",
	}
}

// Qwen3MoE is a Qwen3-MoE shape: every layer's MLP is experts experts of
// width expertFFN, topK of them a token, their weights renormalised.
func Qwen3MoE(hidden, layers, heads, kvHeads, expertFFN, experts, topK int) Preset {
	p := Qwen3(hidden, layers, heads, kvHeads, 6144, false)
	p["architectures"], p["model_type"] = []string{"Qwen3MoeForCausalLM"}, "qwen3_moe"
	p["moe_intermediate_size"], p["num_experts"], p["num_experts_per_tok"] = expertFFN, experts, topK
	p["norm_topk_prob"], p["decoder_sparse_step"], p["mlp_only_layers"] = true, 1, []int{}
	return p
}

// Names lists the presets of an architecture.
func Names(arch string) []string {
	var out []string
	for n := range presets[arch] {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Progress is called after each shard is written.
type Progress func(written, total int64)

// Write writes config.json and a sharded bf16 checkpoint of the named
// preset to dir, as Preset.Write does; layers > 0 keeps only that many of
// its layers (a quicker benchmark of a large shape: a token's time is
// about proportional to them).
func Write(dir, arch, preset string, layers int, seed uint64, progress Progress) (*models.Config, error) {
	if presets[arch] == nil {
		return nil, fmt.Errorf("synth: no architecture %q (have %v)", arch, Archs())
	}
	p, ok := presets[arch][preset]
	if !ok {
		return nil, fmt.Errorf("synth: no preset %q for %q (have %v)", preset, arch, Names(arch))
	}
	if n := p["num_hidden_layers"].(int); layers < 0 || layers > n {
		return nil, fmt.Errorf("synth: %d layers of %s %s's %d", layers, arch, preset, n)
	}
	if layers > 0 {
		p = maps.Clone(p)
		p["num_hidden_layers"] = layers
	}
	return p.Write(dir, seed, progress)
}

// Write writes config.json and a sharded bf16 checkpoint of the shape to
// dir, with weights drawn from N(0, 0.02²) and norms of one, from seed.
func (p Preset) Write(dir string, seed uint64, progress Progress) (*models.Config, error) {
	raw, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return nil, err
	}
	cfg, err := models.ParseConfig(raw)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("synth: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		return nil, fmt.Errorf("synth: %w", err)
	}
	specs := models.Expected(cfg)
	var total int64
	for _, s := range specs {
		total += 2 * elements(s.Shape)
	}
	// Shards of about 2 GiB.
	const shardBytes = 2 << 30
	var shards [][]models.WeightSpec
	var cur []models.WeightSpec
	var curBytes int64
	for _, s := range specs {
		b := 2 * elements(s.Shape)
		if len(cur) > 0 && curBytes+b > shardBytes {
			shards = append(shards, cur)
			cur, curBytes = nil, 0
		}
		cur = append(cur, s)
		curBytes += b
	}
	shards = append(shards, cur)
	weightMap := map[string]string{}
	var written int64
	for i, shard := range shards {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(shards))
		ts := make([]*safetensors.Tensor, len(shard))
		for j, s := range shard {
			ts[j] = &safetensors.Tensor{Name: s.Name, DType: "BF16", Shape: s.Shape, Data: make([]byte, 2*elements(s.Shape))}
			weightMap[s.Name] = name
			written += 2 * elements(s.Shape)
		}
		fillAll(shard, ts, seed+uint64(i)<<20)
		if err := writeFile(filepath.Join(dir, name), ts); err != nil {
			return nil, err
		}
		if progress != nil {
			progress(written, total)
		}
	}
	idx, _ := json.MarshalIndent(map[string]any{"metadata": map[string]any{"total_size": total}, "weight_map": weightMap}, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), idx, 0o644); err != nil {
		return nil, fmt.Errorf("synth: %w", err)
	}
	return cfg, nil
}

func writeFile(path string, ts []*safetensors.Tensor) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("synth: %w", err)
	}
	if err := safetensors.Write(f, ts, map[string]string{"format": "pt"}); err != nil {
		f.Close()
		return fmt.Errorf("synth: %s: %w", path, err)
	}
	return f.Close()
}

func elements(shape []int) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= int64(d)
	}
	return n
}

// fillChunk is the number of elements drawn from one random stream.
const fillChunk = 1 << 22

// fillAll draws the bf16 values of a shard's tensors into ts[i].Data, in
// chunks of fillChunk elements spread over the processors: norms are one,
// everything else approximately normal. Chunk k of tensor j draws from its
// own stream (seed+j, k), so the output does not depend on the schedule.
func fillAll(specs []models.WeightSpec, ts []*safetensors.Tensor, seed uint64) {
	type job struct{ j, k int }
	jobs := make(chan job)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for jb := range jobs {
				out := unsafe.Slice((*uint16)(unsafe.Pointer(&ts[jb.j].Data[0])), len(ts[jb.j].Data)/2)
				lo := jb.k * fillChunk
				fill(out[lo:min(lo+fillChunk, len(out))], len(specs[jb.j].Shape) == 1, seed+uint64(jb.j), uint64(jb.k))
			}
		})
	}
	for j, s := range specs {
		for k := 0; int64(k)*fillChunk < elements(s.Shape); k++ {
			jobs <- job{j, k}
		}
	}
	close(jobs)
	wg.Wait()
}

// fill draws out's values: ones for a norm, else the sum of four uniforms
// scaled to a standard deviation of 0.02.
func fill(out []uint16, norm bool, seed, stream uint64) {
	if norm {
		for i := range out {
			out[i] = gpu.F32ToBF16(1)
		}
		return
	}
	rng := rand.New(rand.NewPCG(seed, 0x5eed+stream))
	for i := range out {
		u := rng.Float32() + rng.Float32() + rng.Float32() + rng.Float32() - 2
		out[i] = gpu.F32ToBF16(u * float32(0.02*math.Sqrt(3)))
	}
}
