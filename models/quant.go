package models

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models/safetensors"
)

// Quantized checkpoints keep each linear weight in 8-bit codes with scales
// beside it, one a block of rows and columns:
//   - float8 e4m3 codes: Qwen3's and DeepSeek's FP8 releases (quant_method
//     "fp8", a weight_scale_inv a 128×128 block), Meta's (fbgemm_fp8, a
//     weight_scale a row), and compressed-tensors' float-quantized ones (a
//     weight_scale a row, a block or the whole matrix);
//   - int8 codes: compressed-tensors' int-quantized ones (symmetric, as
//     the W8A8 checkpoints of the llm-compressor tools).
//
// Loading dequantizes them into bfloat16, each value the float32 product
// of its code and its block's scale rounded to the nearest bfloat16: the
// weights Hugging Face's dequantize option gives. The products then run in
// bf16 as for any bf16 checkpoint; activations are not quantized.

// Quant is a checkpoint's quantization.
type Quant struct {
	// Method is the quantization_config's quant_method.
	Method string
	// DType is the codes' safetensors dtype: F8_E4M3 or I8.
	DType string
	// Scale is the suffix of a weight's scales: weight name + Scale.
	Scale string
	// Block is the rows and columns one scale covers; 0 for all of them
	// (a scale a row is {1, 0}, one for the matrix {0, 0}).
	Block [2]int
}

// String names the scheme as inspect shows it.
func (q *Quant) String() string {
	var cover string
	switch q.Block {
	case [2]int{1, 0}:
		cover = "a scale a row"
	case [2]int{0, 0}:
		cover = "a scale a matrix"
	default:
		cover = fmt.Sprintf("a scale a block of %d×%d", q.Block[0], q.Block[1])
	}
	return fmt.Sprintf("%s: %s weights, %s, dequantized to bf16 as they load", q.Method, q.codes(), cover)
}

// codes names the codes' type.
func (q *Quant) codes() string {
	if q.DType == codeInt8 {
		return "int8"
	}
	return "e4m3"
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
const served = "served: bf16, f16 and f32 weights, and 8-bit weights with their scales: fp8, fbgemm_fp8, compressed-tensors float-quantized and int-quantized"

// parseQuant reads a quantization_config: 8-bit weights (e4m3, or
// symmetric int8) with scales; anything else refused by name. The inputs'
// quantization, dynamic or static, is not followed: their scales, where a
// checkpoint has them, go unused.
func parseQuant(r *rawQuant) (*Quant, error) {
	if r == nil {
		return nil, nil
	}
	switch r.Method {
	case "fp8":
		switch {
		case r.Fmt != "" && r.Fmt != "e4m3":
			return nil, unsupported("fp8 format %q (only e4m3)", r.Fmt)
		case r.Activation != "" && r.Activation != "dynamic" && r.Activation != "static":
			return nil, unsupported("fp8 activation_scheme %q (dynamic or static)", r.Activation)
		case r.WeightBlockSize == nil:
			// vLLM's first FP8 checkpoints: a weight_scale a matrix.
			return &Quant{Method: r.Method, DType: codeFP8, Scale: "_scale"}, nil
		}
		return blockScales(r.Method, codeFP8, "_scale_inv", r.WeightBlockSize)
	case "fbgemm_fp8":
		return &Quant{Method: r.Method, DType: codeFP8, Scale: "_scale", Block: [2]int{1, 0}}, nil
	case "compressed-tensors":
		return parseCTS(r)
	}
	return nil, unsupported("quantization %q (%s)", r.Method, served)
}

// The codes' dtypes.
const (
	codeFP8  = "F8_E4M3"
	codeInt8 = "I8"
)

// blockScales is method's quantization to codes of dtype with scales
// (suffix scale) a block of rows and columns.
func blockScales(method, dtype, scale string, block []int) (*Quant, error) {
	if len(block) != 2 || block[0] < 1 || block[1] < 1 || block[0] > 1<<16 || block[1] > 1<<16 {
		return nil, unsupported("%s weight block %v", method, block)
	}
	return &Quant{Method: method, DType: dtype, Scale: scale, Block: [2]int{block[0], block[1]}}, nil
}

// parseCTS reads a compressed-tensors config: every group's weights 8-bit
// floats (float-quantized) or symmetric 8-bit integers (int-quantized) of
// one strategy, its outputs unquantized.
func parseCTS(r *rawQuant) (*Quant, error) {
	var typ, dtype string
	switch r.Format {
	case "float-quantized":
		typ, dtype = "float", codeFP8
	case "int-quantized":
		typ, dtype = "int", codeInt8
	default:
		return nil, unsupported("compressed-tensors format %q (float-quantized or int-quantized)", r.Format)
	}
	if len(r.Groups) == 0 {
		return nil, unsupported("compressed-tensors without config_groups")
	}
	var q *Quant
	for name, g := range r.Groups {
		w := g.Weights
		switch {
		case w == nil || w.Type != typ || w.Bits != 8:
			return nil, unsupported("compressed-tensors group %s: weights other than 8-bit %ss in %s", name, typ, r.Format)
		case w.Symmetric != nil && !*w.Symmetric:
			return nil, unsupported("compressed-tensors group %s: asymmetric weights", name)
		case w.Dynamic:
			return nil, unsupported("compressed-tensors group %s: dynamic weight scales", name)
		case g.Output != nil:
			return nil, unsupported("compressed-tensors group %s: quantized outputs", name)
		}
		var gq *Quant
		switch w.Strategy {
		case "channel":
			gq = &Quant{Method: r.Method, DType: dtype, Scale: "_scale", Block: [2]int{1, 0}}
		case "tensor":
			gq = &Quant{Method: r.Method, DType: dtype, Scale: "_scale"}
		case "block":
			var err error
			if gq, err = blockScales(r.Method, dtype, "_scale", w.Block); err != nil {
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
// S.1111.111 NaN. int8Values are the int8 codes'.
var int8Values = func() (t [256]float32) {
	for c := range t {
		t[c] = float32(int8(c))
	}
	return t
}()

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
func (q *Quant) block(rows, cols int) (int, int) {
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
func (q *Quant) blocks(rows, cols int) (int, int) {
	br, bc := q.block(rows, cols)
	return (rows + br - 1) / br, (cols + bc - 1) / bc
}

// checkQuant returns the scales of t, weight name of ckpt, where it is a
// quantized weight that q serves: its codes of q's dtype, its scales
// present, one a block (a scale a row may be a vector, one for the matrix
// a scalar).
func checkQuant(q *Quant, ckpt *safetensors.Checkpoint, name string, t *safetensors.Tensor) (*safetensors.Tensor, error) {
	switch {
	case q == nil && (t.DType == codeFP8 || t.DType == codeInt8):
		return nil, fmt.Errorf("dtype %s without a quantization_config (quantized weights need their scales)", t.DType)
	case q == nil || t.DType != q.DType:
		served := "bf16, f16, f32"
		if q != nil {
			served += ", " + q.DType + " with scales (" + q.Method + ")"
		}
		return nil, fmt.Errorf("dtype %s is not supported (%s)", t.DType, served)
	case len(t.Shape) != 2:
		return nil, fmt.Errorf("quantized tensor of shape %v: want a matrix", t.Shape)
	}
	sn := name + q.Scale
	s, ok := ckpt.Tensor(sn)
	if !ok {
		return nil, fmt.Errorf("quantized weight without its scales %s", sn)
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

// dequant returns t's values as bfloat16 bytes: each code's value
// times its block's scale in float32, rounded to the nearest bfloat16.
// A block's 256 products are formed once, into a table its codes index;
// the rows are shared out to a goroutine a processor.
func dequant(q *Quant, t, s *safetensors.Tensor) []byte {
	rows, cols := t.Shape[0], t.Shape[1]
	_, nc := q.blocks(rows, cols)
	br, bc := q.block(rows, cols)
	values := &fp8Values
	if q.DType == codeInt8 {
		values = &int8Values
	}
	scale := func(i int) float32 {
		switch s.DType {
		case "BF16":
			return gpu.BF16ToF32(binary.LittleEndian.Uint16(s.Data[2*i:]))
		case "F16":
			return gpu.F16ToF32(binary.LittleEndian.Uint16(s.Data[2*i:]))
		}
		return math.Float32frombits(binary.LittleEndian.Uint32(s.Data[4*i:]))
	}
	out := make([]uint16, rows*cols)
	// rowsOf dequantizes rows [r0, r1).
	rowsOf := func(r0, r1 int) {
		tables := make([][256]uint16, nc) // the block row's, by column block
		block := -1
		for r := r0; r < r1; r++ {
			if r/br != block {
				block = r / br
				for cb := range tables {
					f := scale(block*nc + cb)
					for c := range 256 {
						tables[cb][c] = gpu.F32ToBF16(values[c] * f)
					}
				}
			}
			codes, o := t.Data[r*cols:(r+1)*cols], out[r*cols:(r+1)*cols]
			for cb := range tables {
				tb, lo, hi := &tables[cb], cb*bc, min((cb+1)*bc, cols)
				for c, code := range codes[lo:hi] {
					o[lo+c] = tb[code]
				}
			}
		}
	}
	workers := min(runtime.GOMAXPROCS(0), max(1, rows*cols>>20))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() { rowsOf(rows*w/workers, rows*(w+1)/workers) })
	}
	wg.Wait()
	return gpu.U16Bytes(out)
}

// LoadedBytes is how many bytes the weights of ckpt that cfg uses take once
// loaded: their own, but two a value for quantized weights, dequantized.
func LoadedBytes(cfg *Config, ckpt *safetensors.Checkpoint) int64 {
	var n int64
	for _, w := range Expected(cfg) {
		t, ok := ckpt.Tensor(w.Name)
		if !ok {
			continue
		}
		if cfg.Quant != nil && t.DType == cfg.Quant.DType {
			n += 2 * int64(t.Elements())
		} else {
			n += t.Bytes()
		}
	}
	return n
}
