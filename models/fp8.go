package models

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models/safetensors"
)

// Block-wise FP8 checkpoints (quantization_config {"quant_method": "fp8",
// "fmt": "e4m3", "weight_block_size": [128, 128]}, as Qwen3's and
// DeepSeek's FP8 releases are) keep each linear weight in float8 e4m3 with
// a float32 (or bfloat16) weight_scale_inv a block of rows and columns.
// Loading dequantizes them into bfloat16, each value the float32 product
// of its code and its block's scale rounded to the nearest bfloat16: the
// weights Hugging Face's dequantize option gives. The products then run
// in bf16 as for any bf16 checkpoint; activations are not quantized.

// FP8 is a checkpoint's block-wise FP8 quantization.
type FP8 struct {
	// Block is the rows and columns one scale covers.
	Block [2]int
}

// rawQuant is config.json's quantization_config.
type rawQuant struct {
	Method          string `json:"quant_method"`
	Fmt             string `json:"fmt"`
	Activation      string `json:"activation_scheme"`
	WeightBlockSize []int  `json:"weight_block_size"`
}

// parseQuant reads a quantization_config: block-wise e4m3 FP8 with
// dynamic activations is served, anything else refused by name.
func parseQuant(r *rawQuant) (*FP8, error) {
	if r == nil {
		return nil, nil
	}
	switch {
	case r.Method != "fp8":
		return nil, unsupported("quantization %q (served: bf16, f16 and f32 weights, and block-wise fp8)", r.Method)
	case r.Fmt != "" && r.Fmt != "e4m3":
		return nil, unsupported("fp8 format %q (only e4m3)", r.Fmt)
	case r.Activation != "" && r.Activation != "dynamic":
		return nil, unsupported("fp8 activation_scheme %q (only dynamic, whose weights alone carry scales)", r.Activation)
	case len(r.WeightBlockSize) != 2:
		return nil, unsupported("fp8 without weight_block_size (only block-wise scales)")
	case r.WeightBlockSize[0] < 1 || r.WeightBlockSize[1] < 1 || r.WeightBlockSize[0] > 1<<16 || r.WeightBlockSize[1] > 1<<16:
		return nil, unsupported("fp8 weight_block_size %v", r.WeightBlockSize)
	}
	return &FP8{Block: [2]int{r.WeightBlockSize[0], r.WeightBlockSize[1]}}, nil
}

// scaleName is the name of weight name's scales.
func scaleName(name string) string { return name + "_scale_inv" }

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

// checkFP8 reports whether t, weight name of ckpt, is a block-wise FP8
// weight that q serves: its scales present, one a block.
func checkFP8(q *FP8, ckpt *safetensors.Checkpoint, name string, t *safetensors.Tensor) (*safetensors.Tensor, error) {
	if q == nil {
		return nil, fmt.Errorf("dtype %s without a quantization_config (fp8 weights need their block scales)", t.DType)
	}
	if t.DType != "F8_E4M3" {
		return nil, fmt.Errorf("dtype %s is not supported (bf16, f16, f32, and F8_E4M3 with block scales)", t.DType)
	}
	if len(t.Shape) != 2 {
		return nil, fmt.Errorf("fp8 tensor of shape %v: want a matrix", t.Shape)
	}
	s, ok := ckpt.Tensor(scaleName(name))
	if !ok {
		return nil, fmt.Errorf("fp8 weight without its scales %s", scaleName(name))
	}
	rows, cols := t.Shape[0], t.Shape[1]
	want := []int{(rows + q.Block[0] - 1) / q.Block[0], (cols + q.Block[1] - 1) / q.Block[1]}
	if !sameShape(s.Shape, want) {
		return nil, fmt.Errorf("scales %s have shape %v, want %v for %d×%d blocks", scaleName(name), s.Shape, want, q.Block[0], q.Block[1])
	}
	if s.DType != "F32" && s.DType != "BF16" {
		return nil, fmt.Errorf("scales %s are %s, want F32 or BF16", scaleName(name), s.DType)
	}
	return s, nil
}

// dequantFP8 returns t's values as bfloat16 bytes: each code's value
// times its block's scale in float32, rounded to the nearest bfloat16.
func dequantFP8(q *FP8, t, s *safetensors.Tensor) []byte {
	rows, cols := t.Shape[0], t.Shape[1]
	sc := s.Shape[1]
	scale := func(i int) float32 {
		if s.DType == "BF16" {
			return gpu.BF16ToF32(binary.LittleEndian.Uint16(s.Data[2*i:]))
		}
		return math.Float32frombits(binary.LittleEndian.Uint32(s.Data[4*i:]))
	}
	out := make([]byte, 2*rows*cols)
	for r := range rows {
		srow := r / q.Block[0] * sc
		for b := 0; b < cols; b += q.Block[1] {
			f := scale(srow + b/q.Block[1])
			for c := b; c < min(b+q.Block[1], cols); c++ {
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
