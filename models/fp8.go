package models

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models/safetensors"
)

// FP8 checkpoints keep each linear weight in float8 e4m3 with scales
// beside it, one a block of rows and columns: Qwen3's and DeepSeek's
// releases (quant_method "fp8", a weight_scale_inv a 128×128 block), Meta's
// (fbgemm_fp8, a weight_scale a row), and compressed-tensors'
// float-quantized ones (a weight_scale a row, a block or the whole
// matrix). Loading dequantizes them into bfloat16, each value the float32
// product of its code and its block's scale rounded to the nearest
// bfloat16: the weights Hugging Face's dequantize option gives. The
// products then run in bf16 as for any bf16 checkpoint; activations are
// not quantized.

// FP8 is a checkpoint's FP8 quantization.
type FP8 struct {
	// Method is the quantization_config's quant_method.
	Method string
	// Scale is the suffix of a weight's scales: weight name + Scale.
	Scale string
	// Block is the rows and columns one scale covers; 0 for all of them
	// (a scale a row is {1, 0}, one for the matrix {0, 0}).
	Block [2]int
}

// String names the scheme as inspect shows it.
func (q *FP8) String() string {
	var cover string
	switch q.Block {
	case [2]int{1, 0}:
		cover = "a scale a row"
	case [2]int{0, 0}:
		cover = "a scale a matrix"
	default:
		cover = fmt.Sprintf("a scale a block of %d×%d", q.Block[0], q.Block[1])
	}
	return fmt.Sprintf("%s: e4m3 weights, %s, dequantized to bf16 as they load", q.Method, cover)
}

// rawQuant is config.json's quantization_config.
type rawQuant struct {
	Method          string `json:"quant_method"`
	Fmt             string `json:"fmt"`
	Activation      string `json:"activation_scheme"`
	WeightBlockSize []int  `json:"weight_block_size"`
	// compressed-tensors
	Format string              `json:"format"`
	Groups map[string]ctsGroup `json:"config_groups"`
}

// ctsGroup is a compressed-tensors quantization group: what its target
// modules' weights and inputs are quantized to.
type ctsGroup struct {
	Weights *ctsArgs `json:"weights"`
	Input   *ctsArgs `json:"input_activations"`
	Output  *ctsArgs `json:"output_activations"`
}

type ctsArgs struct {
	Type      string `json:"type"`
	Bits      int    `json:"num_bits"`
	Strategy  string `json:"strategy"`
	Dynamic   bool   `json:"dynamic"`
	Symmetric *bool  `json:"symmetric"`
	Block     []int  `json:"block_structure"`
}

// served names the quantizations served, for the refusals.
const served = "served: bf16, f16 and f32 weights, and fp8 e4m3 weights with their scales (fp8, fbgemm_fp8, compressed-tensors float-quantized)"

// parseQuant reads a quantization_config: FP8 e4m3 weights with scales
// and inputs left unquantized or quantized dynamically; anything else
// refused by name.
func parseQuant(r *rawQuant) (*FP8, error) {
	if r == nil {
		return nil, nil
	}
	switch r.Method {
	case "fp8":
		switch {
		case r.Fmt != "" && r.Fmt != "e4m3":
			return nil, unsupported("fp8 format %q (only e4m3)", r.Fmt)
		case r.Activation != "" && r.Activation != "dynamic":
			return nil, unsupported("fp8 activation_scheme %q (only dynamic, whose weights alone carry scales)", r.Activation)
		case len(r.WeightBlockSize) != 2:
			return nil, unsupported("fp8 without weight_block_size (only block-wise scales)")
		}
		return fp8Blocks(r.Method, "_scale_inv", r.WeightBlockSize)
	case "fbgemm_fp8":
		return &FP8{Method: r.Method, Scale: "_scale", Block: [2]int{1, 0}}, nil
	case "compressed-tensors":
		return parseCTS(r)
	}
	return nil, unsupported("quantization %q (%s)", r.Method, served)
}

// fp8Blocks is method's FP8 of scales (suffix scale) a block of rows and
// columns.
func fp8Blocks(method, scale string, block []int) (*FP8, error) {
	if len(block) != 2 || block[0] < 1 || block[1] < 1 || block[0] > 1<<16 || block[1] > 1<<16 {
		return nil, unsupported("%s weight block %v", method, block)
	}
	return &FP8{Method: method, Scale: scale, Block: [2]int{block[0], block[1]}}, nil
}

// parseCTS reads a compressed-tensors config: every group's weights FP8
// (8-bit floats, symmetric) of one strategy, its inputs unquantized or
// quantized dynamically, its outputs unquantized.
func parseCTS(r *rawQuant) (*FP8, error) {
	if r.Format != "float-quantized" {
		return nil, unsupported("compressed-tensors format %q (only float-quantized)", r.Format)
	}
	if len(r.Groups) == 0 {
		return nil, unsupported("compressed-tensors without config_groups")
	}
	var q *FP8
	for name, g := range r.Groups {
		w := g.Weights
		switch {
		case w == nil || w.Type != "float" || w.Bits != 8:
			return nil, unsupported("compressed-tensors group %s: weights other than 8-bit floats", name)
		case w.Symmetric != nil && !*w.Symmetric:
			return nil, unsupported("compressed-tensors group %s: asymmetric weights", name)
		case w.Dynamic:
			return nil, unsupported("compressed-tensors group %s: dynamic weight scales", name)
		case g.Input != nil && !g.Input.Dynamic:
			return nil, unsupported("compressed-tensors group %s: static input scales (only dynamic or none)", name)
		case g.Output != nil:
			return nil, unsupported("compressed-tensors group %s: quantized outputs", name)
		}
		var gq *FP8
		switch w.Strategy {
		case "channel":
			gq = &FP8{Method: r.Method, Scale: "_scale", Block: [2]int{1, 0}}
		case "tensor":
			gq = &FP8{Method: r.Method, Scale: "_scale"}
		case "block":
			var err error
			if gq, err = fp8Blocks(r.Method, "_scale", w.Block); err != nil {
				return nil, err
			}
		default:
			return nil, unsupported("compressed-tensors group %s: weight strategy %q (channel, tensor or block)", name, w.Strategy)
		}
		if q != nil && *q != *gq {
			return nil, unsupported("compressed-tensors groups of different weight strategies")
		}
		q = gq
	}
	return q, nil
}

// fp8Values are the float8 e4m3fn codes' values: a sign, four bits of
// exponent biased by 7 and three of mantissa; no infinities, and
// S.1111.111 NaN.
var fp8Values = func() (t [256]float32) {
	for c := range t {
		e, m := c>>3&15, c&7
		v := math.Ldexp(float64(m)/8, -6) // subnormal
		if e > 0 {
			v = math.Ldexp(1+float64(m)/8, e-7)
		}
		if e == 15 && m == 7 {
			v = math.NaN()
		}
		if c&0x80 != 0 {
			v = -v
		}
		t[c] = float32(v)
	}
	return t
}()

// block is the rows and columns a scale of a weight of rows and cols
// covers.
func (q *FP8) block(rows, cols int) (int, int) {
	br, bc := q.Block[0], q.Block[1]
	if br == 0 {
		br = rows
	}
	if bc == 0 {
		bc = cols
	}
	return max(br, 1), max(bc, 1)
}

// blocks is how many scales a weight of rows and cols takes: down its
// rows and across its columns.
func (q *FP8) blocks(rows, cols int) (int, int) {
	br, bc := q.block(rows, cols)
	return (rows + br - 1) / br, (cols + bc - 1) / bc
}

// checkFP8 returns the scales of t, weight name of ckpt, where it is an
// FP8 weight that q serves: its scales present, one a block (a scale a row
// may be a vector, one for the matrix a scalar).
func checkFP8(q *FP8, ckpt *safetensors.Checkpoint, name string, t *safetensors.Tensor) (*safetensors.Tensor, error) {
	if q == nil {
		return nil, fmt.Errorf("dtype %s without a quantization_config (fp8 weights need their scales)", t.DType)
	}
	if t.DType != "F8_E4M3" {
		return nil, fmt.Errorf("dtype %s is not supported (bf16, f16, f32, and F8_E4M3 with scales)", t.DType)
	}
	if len(t.Shape) != 2 {
		return nil, fmt.Errorf("fp8 tensor of shape %v: want a matrix", t.Shape)
	}
	sn := name + q.Scale
	s, ok := ckpt.Tensor(sn)
	if !ok {
		return nil, fmt.Errorf("fp8 weight without its scales %s", sn)
	}
	r, c := q.blocks(t.Shape[0], t.Shape[1])
	want := []int{r, c}
	if !sameShape(s.Shape, want) && !(c == 1 && sameShape(s.Shape, []int{r})) && !(r == 1 && c == 1 && len(s.Shape) == 0) {
		return nil, fmt.Errorf("scales %s have shape %v, want %v", sn, s.Shape, want)
	}
	if s.DType != "F32" && s.DType != "BF16" && s.DType != "F16" {
		return nil, fmt.Errorf("scales %s are %s, want F32, BF16 or F16", sn, s.DType)
	}
	return s, nil
}

// dequantFP8 returns t's values as bfloat16 bytes: each code's value
// times its block's scale in float32, rounded to the nearest bfloat16.
func dequantFP8(q *FP8, t, s *safetensors.Tensor) []byte {
	rows, cols := t.Shape[0], t.Shape[1]
	_, nc := q.blocks(rows, cols)
	br, bc := q.block(rows, cols)
	scale := func(i int) float32 {
		switch s.DType {
		case "BF16":
			return gpu.BF16ToF32(binary.LittleEndian.Uint16(s.Data[2*i:]))
		case "F16":
			return gpu.F16ToF32(binary.LittleEndian.Uint16(s.Data[2*i:]))
		}
		return math.Float32frombits(binary.LittleEndian.Uint32(s.Data[4*i:]))
	}
	out := make([]byte, 2*rows*cols)
	for r := range rows {
		srow := r / br * nc
		for b := 0; b < cols; b += bc {
			f := scale(srow + b/bc)
			for c := b; c < min(b+bc, cols); c++ {
				i := r*cols + c
				binary.LittleEndian.PutUint16(out[2*i:], gpu.F32ToBF16(fp8Values[t.Data[i]]*f))
			}
		}
	}
	return out
}

// LoadedBytes is how many bytes the weights of ckpt that cfg uses take once
// loaded: their own, but two a value for FP8 weights, dequantized.
func LoadedBytes(cfg *Config, ckpt *safetensors.Checkpoint) int64 {
	var n int64
	for _, w := range Expected(cfg) {
		t, ok := ckpt.Tensor(w.Name)
		if !ok {
			continue
		}
		if strings.HasPrefix(t.DType, "F8_") {
			n += 2 * int64(t.Elements())
		} else {
			n += t.Bytes()
		}
	}
	return n
}
