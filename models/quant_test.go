package models_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/modeltest"
	"github.com/troupe/troupe/models/safetensors"
)

// e4m3 is the value of a float8 e4m3fn code, read from its fields: the
// test's own decoding.
func e4m3(c byte) float64 {
	exp, man := int(c>>3&15), float64(c&7)
	if exp == 15 && man == 7 {
		return math.NaN()
	}
	v := man / 8 * math.Pow(2, -6)
	if exp > 0 {
		v = (1 + man/8) * math.Pow(2, float64(exp-7))
	}
	if c&0x80 != 0 {
		v = -v
	}
	return v
}

// toE4M3 is the code nearest v (|v| at most 448), ties to the even code:
// the positive codes 0 to 0x7e rise with their values.
func toE4M3(v float64) byte {
	a := math.Abs(v)
	c := sort.Search(0x7e, func(c int) bool { return e4m3(byte(c+1)) >= a }) // e4m3(c) < a <= e4m3(c+1)
	if c < 0x7e {
		if lo, hi := a-e4m3(byte(c)), e4m3(byte(c+1))-a; hi < lo || hi == lo && c&1 == 1 {
			c++
		}
	}
	if v < 0 {
		return byte(c) | 0x80
	}
	return byte(c)
}

// quantScheme is how a test checkpoint is quantized: its quantization_config,
// the suffix of its scales' names, the rows and columns a scale covers (0:
// all of them) and the shape its scales are stored in.
type quantScheme struct {
	name   string
	config map[string]any
	suffix string
	block  [2]int
	shape  func(r, c int) []int // scales down the rows and across the columns
	int8   bool                 // int8 codes, not e4m3
}

// ctsConfig is a compressed-tensors config of one group whose weights are
// 8-bit typ ("float" or "int") and take strategy (with block, where it is
// "block").
func ctsConfig(typ, strategy string, block []int) map[string]any {
	w := map[string]any{"type": typ, "num_bits": 8, "strategy": strategy, "symmetric": true, "dynamic": false}
	if block != nil {
		w["block_structure"] = block
	}
	return map[string]any{"quant_method": "compressed-tensors", "format": typ + "-quantized", "ignore": []any{"lm_head"},
		"config_groups": map[string]any{"group_0": map[string]any{"targets": []any{"Linear"}, "weights": w,
			"input_activations": map[string]any{"type": typ, "num_bits": 8, "strategy": "token", "dynamic": true}}}}
}

// quantSchemes are the schemes served, with blocks that leave partial ones
// at the fixtures' edges.
var quantSchemes = []quantScheme{
	{"fp8 blocks", map[string]any{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": []int{48, 80}},
		"_scale_inv", [2]int{48, 80}, func(r, c int) []int { return []int{r, c} }, false},
	{"fbgemm rows", map[string]any{"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200},
		"_scale", [2]int{1, 0}, func(r, c int) []int { return []int{r, 1} }, false},
	{"compressed-tensors channels", ctsConfig("float", "channel", nil), "_scale", [2]int{1, 0}, func(r, c int) []int { return []int{r} }, false},
	{"compressed-tensors tensor", ctsConfig("float", "tensor", nil), "_scale", [2]int{0, 0}, func(r, c int) []int { return nil }, false},
	{"compressed-tensors blocks", ctsConfig("float", "block", []int{64, 96}), "_scale", [2]int{64, 96}, func(r, c int) []int { return []int{r, c} }, false},
	{"compressed-tensors int8 channels", ctsConfig("int", "channel", nil), "_scale", [2]int{1, 0}, func(r, c int) []int { return []int{r, 1} }, true},
	{"fp8 matrices, static inputs", map[string]any{"quant_method": "fp8", "activation_scheme": "static"}, "_scale", [2]int{0, 0}, func(r, c int) []int { return []int{} }, false},
}

// quantize writes a copy of the checkpoint in src quantized by sc to dir
// (every projection in e4m3 with its scales, F32 for the attention's,
// bf16 for the gate's and up's, f16 for the down's) and a bf16 copy of
// the same weights dequantized by hand to plain: each value the float32
// product of its code and its scale, rounded to bfloat16.
func quantize(t testing.TB, sc quantScheme, src, dir, plain string) {
	t.Helper()
	ckpt, err := safetensors.OpenDir(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ckpt.Close()
	var fp8, bf16 []*safetensors.Tensor
	for _, name := range ckpt.Names() {
		w, _ := ckpt.Tensor(name)
		if !strings.HasSuffix(name, "_proj.weight") {
			fp8, bf16 = append(fp8, w), append(bf16, w)
			continue
		}
		if w.DType != "BF16" || len(w.Shape) != 2 {
			t.Fatalf("%s: %s %v", name, w.DType, w.Shape)
		}
		rows, cols := w.Shape[0], w.Shape[1]
		br, bc := cmp.Or(sc.block[0], rows), cmp.Or(sc.block[1], cols)
		nr, nc := (rows+br-1)/br, (cols+bc-1)/bc
		at := func(i, j int) int { return i/br*nc + j/bc }
		// code is the code of v and value a code's value: e4m3, or int8
		// rounded to even.
		top, code, value := 448.0, toE4M3, e4m3
		if sc.int8 {
			top = 127
			code = func(v float64) byte { return byte(int8(math.RoundToEven(v))) }
			value = func(c byte) float64 { return float64(int8(c)) }
		}
		scales := make([]float32, nr*nc)
		for i := range rows {
			for j := range cols {
				v := math.Abs(float64(gpu.BF16ToF32(binary.LittleEndian.Uint16(w.Data[2*(i*cols+j):]))))
				scales[at(i, j)] = max(scales[at(i, j)], float32(v/top))
			}
		}
		sdt, sdata := "F32", make([]byte, 4*len(scales))
		if strings.Contains(name, "mlp.") {
			sdt, sdata = "BF16", make([]byte, 2*len(scales))
			if strings.Contains(name, "down_proj") {
				sdt = "F16"
			}
		}
		for i, s := range scales {
			if s == 0 {
				s = 1
			}
			switch sdt {
			case "BF16":
				h := gpu.F32ToBF16(s)
				binary.LittleEndian.PutUint16(sdata[2*i:], h)
				s = gpu.BF16ToF32(h)
			case "F16":
				h := gpu.F32ToF16(s)
				binary.LittleEndian.PutUint16(sdata[2*i:], h)
				s = gpu.F16ToF32(h)
			default:
				binary.LittleEndian.PutUint32(sdata[4*i:], math.Float32bits(s))
			}
			scales[i] = s
		}
		codes, deq := make([]byte, rows*cols), make([]byte, 2*rows*cols)
		for i := range rows {
			for j := range cols {
				k := i*cols + j
				s := float64(scales[at(i, j)])
				codes[k] = code(float64(gpu.BF16ToF32(binary.LittleEndian.Uint16(w.Data[2*k:]))) / s)
				// Exact in float64 (3 + 24 significant bits), then
				// rounded as a float32 product is, then to bfloat16.
				binary.LittleEndian.PutUint16(deq[2*k:], gpu.F32ToBF16(float32(value(codes[k])*s)))
			}
		}
		dtype := "F8_E4M3"
		if sc.int8 {
			dtype = "I8"
		}
		fp8 = append(fp8, &safetensors.Tensor{Name: name, DType: dtype, Shape: w.Shape, Data: codes},
			&safetensors.Tensor{Name: name + sc.suffix, DType: sdt, Shape: sc.shape(nr, nc), Data: sdata})
		bf16 = append(bf16, &safetensors.Tensor{Name: name, DType: "BF16", Shape: w.Shape, Data: deq})
		if sc.config["activation_scheme"] == "static" {
			// The inputs' scale, unused.
			fp8 = append(fp8, &safetensors.Tensor{Name: strings.TrimSuffix(name, "weight") + "input_scale", DType: "F32", Shape: []int{}, Data: make([]byte, 4)})
		}
	}
	raw, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	write := func(dir string, ts []*safetensors.Tensor, cfg map[string]any) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := safetensors.Write(&b, ts, nil); err != nil {
			t.Fatal(err)
		}
		c, _ := json.Marshal(cfg)
		if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "config.json"), c, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(plain, bf16, cfg)
	cfg["quantization_config"] = sc.config
	write(dir, fp8, cfg)
}

func TestE4M3Codes(t *testing.T) {
	for c, want := range map[byte]float64{0x00: 0, 0x01: 1.0 / 512, 0x08: 1.0 / 64, 0x38: 1, 0x3c: 1.5, 0x7e: 448, 0xb8: -1, 0xfe: -448} {
		if got := e4m3(c); got != want {
			t.Errorf("e4m3(%#x) = %v, want %v", c, got, want)
		}
	}
	for _, v := range []float64{0, 1, -1, 448, -448, 1.0 / 512, 3.3, -0.07, 1.0625, 1.1875} {
		if got := e4m3(toE4M3(v)); math.Abs(got-v) > math.Abs(v)/16 {
			t.Errorf("%v coded as %v", v, got)
		}
	}
	// Ties between two codes go to the even one.
	if toE4M3(1.0625) != 0x38 || toE4M3(1.1875) != 0x3a {
		t.Errorf("ties coded as %#x and %#x, want 0x38 and 0x3a", toE4M3(1.0625), toE4M3(1.1875))
	}
}

// TestQuantizedCheckpoints: quantized checkpoints of every scheme served
// (e4m3 codes of fp8's blocks, fbgemm's rows and compressed-tensors' rows,
// matrices and blocks; int8 codes of compressed-tensors' rows), dense and
// MoE, scales in float32, bfloat16 and float16, blocks cut at the edges,
// load dequantized to exactly the weights of a bf16 checkpoint
// dequantized by hand: the same logits bit for bit, whole and split over
// two ranks; and their logits stay near the unquantized model's.
func TestQuantizedCheckpoints(t *testing.T) {
	for _, c := range []struct {
		fixture string
		scheme  int
	}{{"qwen3", 0}, {"qwen3-moe", 0}, {"llama-gqa", 1}, {"llama-gqa", 2}, {"olmo2", 3}, {"qwen3", 4}, {"qwen3-moe", 5}, {"llama-gqa", 6}} {
		f, sc := c.fixture, quantSchemes[c.scheme]
		t.Run(f+"/"+sc.name, func(t *testing.T) {
			src := modeltest.MustShared(t, filepath.Join("fixtures", f))
			dir, plain := t.TempDir(), t.TempDir()
			quantize(t, sc, src, dir, plain)
			q, err := models.OpenDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer q.Close()
			if q.Config.Quant == nil || q.Config.Quant.Block != sc.block || q.Config.Quant.Scale != sc.suffix {
				t.Fatalf("quantization read as %+v", q.Config.Quant)
			}
			if err := models.Check(q.Config, q.Checkpoint); err != nil {
				t.Fatal(err)
			}
			if d := q.Config.Describe(); !strings.Contains(d, "weights ("+q.Config.Quant.Method+") dequantized to bf16") {
				t.Errorf("described as %q", d)
			}
			if got, want := models.LoadedBytes(q.Config, q.Checkpoint), 2*models.Params(q.Config); got != want {
				t.Errorf("loaded bytes %d, want %d", got, want)
			}
			want := readReference(t, filepath.Join(src, "reference.safetensors"))
			var logits [3][]float32
			for i, d := range []string{dir, plain, src} {
				dev := openCPU(t)
				defer dev.Close()
				m := loadModel(t, d, dev, models.Options{MaxTokens: 64})
				s, err := m.NewSequence(len(want.prompt))
				if err != nil {
					t.Fatal(err)
				}
				l, err := s.Feed(context.Background(), want.prompt, true)
				if err != nil {
					t.Fatal(err)
				}
				logits[i] = append([]float32(nil), l...)
				s.Close()
			}
			for i := range logits[0] {
				if math.Float32bits(logits[0][i]) != math.Float32bits(logits[1][i]) {
					t.Fatalf("logit %d: fp8 %v, bf16 dequantized by hand %v", i, logits[0][i], logits[1][i])
				}
			}
			var num, den float64
			for i, v := range logits[2] {
				d := float64(logits[0][i] - v)
				num, den = num+d*d, den+float64(v)*float64(v)
			}
			rel := math.Sqrt(num / den)
			t.Logf("logits against the unquantized model's: relative L2 %.3e", rel)
			// e4m3 keeps 3 bits of mantissa: the fixtures' random weights
			// move their logits by 6–9%.
			if rel > 0.2 || math.IsNaN(rel) {
				t.Errorf("logits relative L2 %.3e from the unquantized model's", rel)
			}
			if f != "qwen3" || c.scheme != 0 {
				return
			}
			// Split over two ranks: the dequantized weights' rows and
			// columns of each.
			devs := oneThreadCPUs(t, 2)
			dev := openCPU(t)
			defer dev.Close()
			whole := loadModel(t, dir, dev, models.Options{MaxTokens: 16})
			red := newHostReducer(devs)
			split, err := models.LoadTP(q.Config, q.Checkpoint, devs, []models.Reducer{hostRank{red, 0}, hostRank{red, 1}}, models.Options{MaxTokens: 16})
			if err != nil {
				t.Fatal(err)
			}
			defer split.Close()
			if rel, greedy := compareSplit(t, whole, split, want.prompt[:min(12, len(want.prompt))], 4); rel > 1e-5 || math.IsNaN(rel) {
				t.Errorf("fp8 split over two ranks: logits relative L2 %.3e, greedy %v", rel, greedy)
			}
		})
	}
}

// TestQuantRefused: quantized checkpoints that are not served, and fp8
// weights whose scales are missing or wrong, are refused by name.
func TestQuantRefused(t *testing.T) {
	src := modeltest.MustShared(t, filepath.Join("fixtures", "qwen3"))
	raw, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	for q, want := range map[string]string{
		`{"quant_method":"awq","bits":4}`:                                                                                                                                     `quantization "awq"`,
		`{"quant_method":"fp8","activation_scheme":"fixed"}`:                                                                                                                  `activation_scheme "fixed"`,
		`{"quant_method":"fp8","fmt":"e5m2","weight_block_size":[128,128]}`:                                                                                                   `fp8 format "e5m2"`,
		`{"quant_method":"fp8","weight_block_size":[0,128]}`:                                                                                                                  "fp8 weight block [0 128]",
		`{"quant_method":"compressed-tensors","format":"pack-quantized","config_groups":{}}`:                                                                                  `compressed-tensors format "pack-quantized"`,
		`{"quant_method":"compressed-tensors","format":"float-quantized"}`:                                                                                                    "without config_groups",
		`{"quant_method":"compressed-tensors","format":"float-quantized","config_groups":{"g":{"weights":{"type":"int","num_bits":8}}}}`:                                      "weights other than 8-bit floats",
		`{"quant_method":"compressed-tensors","format":"float-quantized","config_groups":{"g":{"weights":{"type":"float","num_bits":8,"strategy":"group"}}}}`:                 `weight strategy "group"`,
		`{"quant_method":"compressed-tensors","format":"int-quantized","config_groups":{"g":{"weights":{"type":"int","num_bits":8,"strategy":"channel","symmetric":false}}}}`: "asymmetric weights",
		`{"quant_method":"compressed-tensors","format":"int-quantized","config_groups":{"g":{"weights":{"type":"int","num_bits":4,"strategy":"group"}}}}`:                     "weights other than 8-bit ints",
		`{"quant_method":"compressed-tensors","format":"float-quantized","config_groups":{"g":{"weights":{"type":"float","num_bits":8,"strategy":"tensor"}},` +
			`"h":{"weights":{"type":"float","num_bits":8,"strategy":"channel"}}}}`: "different weight strategies",
	} {
		c := strings.Replace(string(raw), "{", `{"quantization_config":`+q+",", 1)
		_, err := models.ParseConfig([]byte(c))
		var ue *models.UnsupportedError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an unsupported checkpoint naming %s", q, err, want)
		}
	}

	dir, plain := t.TempDir(), t.TempDir()
	quantize(t, quantSchemes[0], src, dir, plain)
	b, err := models.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	weight := "model.layers.0.self_attn.q_proj.weight"
	good, _ := b.Checkpoint.Tensor(weight)
	scales, _ := b.Checkpoint.Tensor(weight + "_scale_inv")
	for _, c := range []struct {
		name    string
		tensors []*safetensors.Tensor // in place of the weight and its scales
		fp8     *models.Quant
		want    string
	}{
		{"no scales", []*safetensors.Tensor{good}, b.Config.Quant, "without its scales"},
		{"scales of the wrong shape", []*safetensors.Tensor{good, {Name: scales.Name, DType: "F32", Shape: []int{1, 1}, Data: make([]byte, 4)}}, b.Config.Quant, "have shape [1 1]"},
		{"scales in f64", []*safetensors.Tensor{good, {Name: scales.Name, DType: "F64", Shape: scales.Shape, Data: make([]byte, 8*scales.Elements())}}, b.Config.Quant, "want F32, BF16 or F16"},
		{"no quantization_config", []*safetensors.Tensor{good, scales}, nil, "without a quantization_config"},
		{"e5m2", []*safetensors.Tensor{{Name: weight, DType: "F8_E5M2", Shape: good.Shape, Data: good.Data}, scales}, b.Config.Quant, "dtype F8_E5M2"},
		{"int8 codes in an fp8 checkpoint", []*safetensors.Tensor{{Name: weight, DType: "I8", Shape: good.Shape, Data: good.Data}, scales}, b.Config.Quant, "dtype I8 is not supported"},
	} {
		ckpt := replaced(t, b.Checkpoint, []string{weight, scales.Name}, c.tensors...)
		cfg := *b.Config
		cfg.Quant = c.fp8
		err = models.Check(&cfg, ckpt)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Check says %v, want %q", c.name, err, c.want)
		}
		dev := openCPU(t)
		if m, err := models.Load(&cfg, ckpt, dev, models.Options{MaxTokens: 16}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Load says %v, want %q", c.name, err, c.want)
			if m != nil {
				m.Close()
			}
		}
		dev.Close()
	}
}

// FuzzQuantLoad loads the qwen3 fixture quantized with one weight's codes
// and scales of any dtype and shape the fuzzer picks: Check and Load
// answer with an error or a model, never a panic, and agree.
func FuzzQuantLoad(f *testing.F) {
	src := modeltest.MustShared(f, filepath.Join("fixtures", "qwen3"))
	dir, plain := f.TempDir(), f.TempDir()
	quantize(f, quantSchemes[0], src, dir, plain)
	b, err := models.OpenDir(dir)
	if err != nil {
		f.Fatal(err)
	}
	defer b.Close()
	const weight = "model.layers.1.mlp.down_proj.weight"
	good, _ := b.Checkpoint.Tensor(weight)
	scales, _ := b.Checkpoint.Tensor(weight + "_scale_inv")
	f.Add(uint8(0), uint8(good.Shape[0]>>4), uint8(good.Shape[1]>>4), uint8(0), uint8(scales.Shape[0]), uint8(scales.Shape[1]), uint8(2))
	f.Add(uint8(1), uint8(3), uint8(200), uint8(2), uint8(1), uint8(0), uint8(1))
	dtypes := []string{"F8_E4M3", "I8", "F8_E5M2", "BF16", "F32", "F16", "U8"}
	f.Fuzz(func(t *testing.T, wdt, rows, cols, sdt, srows, scols, sdims uint8) {
		w := &safetensors.Tensor{Name: weight, DType: dtypes[int(wdt)%len(dtypes)], Shape: []int{int(rows) << 4, int(cols) << 4}}
		w.Data = make([]byte, w.Elements()*safetensors.DTypeSize(w.DType))
		s := &safetensors.Tensor{Name: scales.Name, DType: dtypes[int(sdt)%len(dtypes)], Shape: []int{int(srows), int(scols)}[:int(sdims)%3]}
		s.Data = make([]byte, s.Elements()*safetensors.DTypeSize(s.DType))
		ckpt := replaced(t, b.Checkpoint, []string{weight, scales.Name}, w, s)
		checked := models.Check(b.Config, ckpt)
		dev := openCPU(t)
		defer dev.Close()
		m, err := models.Load(b.Config, ckpt, dev, models.Options{MaxTokens: 8})
		if err == nil {
			m.Close()
		}
		if (checked == nil) != (err == nil) {
			t.Fatalf("Check says %v, Load %v", checked, err)
		}
	})
}

// replaced is ckpt without the tensors named in drop and with add, as one
// checkpoint in memory.
func replaced(t testing.TB, ckpt *safetensors.Checkpoint, drop []string, add ...*safetensors.Tensor) *safetensors.Checkpoint {
	t.Helper()
	out := slices.Clone(add)
	for _, n := range ckpt.Names() {
		if !slices.Contains(drop, n) {
			x, _ := ckpt.Tensor(n)
			out = append(out, x)
		}
	}
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, out, nil); err != nil {
		t.Fatal(err)
	}
	c, err := safetensors.FromBytes(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return c
}
