package cuda

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/kernels"
)

// TestOpenMissingDriver needs no GPU: a library that does not exist must
// give an error that says what to install.
func TestOpenMissingDriver(t *testing.T) {
	_, err := Open(context.Background(), Config{Library: "/nonexistent/libcuda.so.1"})
	if err == nil {
		t.Fatal("got no error")
	}
	want := "not found: is the NVIDIA driver installed?"
	if !supported {
		want = "unsupported"
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("got %q, want it to contain %q", err, want)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		cfg Config
		ok  bool
	}{
		{DefaultConfig(), true},
		{Config{Ordinal: 1}, true},
		{Config{Ordinal: -1}, false},
		{Config{StagingBytes: 100}, false},
		{Config{QueueDepth: -1}, false},
		{Config{Spin: -1}, false},
	} {
		if err := c.cfg.Validate(); (err == nil) != c.ok {
			t.Errorf("Validate(%+v) = %v, want ok=%v", c.cfg, err, c.ok)
		}
	}
}

// TestSpanCheck needs no GPU: a launch whose buffer span exceeds its
// allocation is refused before anything is queued, naming kernel and
// argument.
func TestSpanCheck(t *testing.T) {
	d := &Device{} // no thread: a launch that passed the checks would block
	other := &Device{}
	small := &Buffer{dev: d, dt: gpu.F32, n: 4, size: 16, ptr: 0x1000}
	ids := &Buffer{dev: d, dt: gpu.I32, n: 4, size: 16, ptr: 0x2000}
	foreign := &Buffer{dev: other, dt: gpu.F32, n: 64, size: 256, ptr: 0x3000}
	freed := &Buffer{dev: d, dt: gpu.F32, n: 64, size: 256, ptr: 0x4000, freed: true}
	k := &kernel{name: "add_f32"}
	for _, c := range []struct {
		name string
		args []arg
		want string
	}{
		{"too long", []arg{bufArg("out", small, gpu.F32, 4), bufArg("a", small, gpu.F32, 5)}, "add_f32: argument a: elements [0, 5)"},
		{"offset", []arg{{kind: argBuf, name: "b", buf: small, dt: gpu.F32, off: 2, n: 3}}, "argument b: elements [2, 5)"},
		{"dtype", []arg{bufArg("out", ids, gpu.F32, 4)}, "argument out holds i32, the kernel reads f32"},
		{"nil", []arg{bufArg("out", nil, gpu.F32, 4)}, "argument out is nil"},
		{"foreign", []arg{bufArg("x", foreign, gpu.F32, 4)}, "argument x belongs to another device"},
		{"freed", []arg{bufArg("x", freed, gpu.F32, 4)}, "argument x was freed"},
		{"table", []arg{tableArg("gate", []*Buffer{small, small}, gpu.F32, 8, 4)}, "argument gate[0]: elements [0, 8)"},
	} {
		err := d.launch(k, grid1(1), grid1(32), 0, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.want)
		}
	}
	if err := d.launch(k, grid1(0), grid1(32), 0); err == nil {
		t.Error("empty grid: got no error")
	}
	// More shared memory than the GPU allows a block is refused by name
	// (the 99 KiB of an L40, say).
	small99 := &Device{info: Info{Name: "L40", SharedOptin: 99 << 10}}
	if err := small99.launch(k, grid1(1), grid1(128), 160<<10); err == nil || !strings.Contains(err.Error(), "add_f32: 163840 bytes of shared memory a block; L40 allows 101376") {
		t.Errorf("160 KiB of shared memory where 99 are allowed: got %v", err)
	}
	// A block larger than the kernel's registers allow is refused by name.
	narrow := &kernel{name: "rmsnorm_bf16", threads: 640}
	if err := d.launch(narrow, grid1(1), grid1(1024), 0); err == nil || !strings.Contains(err.Error(), "rmsnorm_bf16: block") {
		t.Errorf("1,024 threads for a kernel of 640: got %v", err)
	}
}

func TestAttnParamsLayout(t *testing.T) {
	raw := attnParams(gpu.AttnArgs{N: 1, Heads: 2, KVHeads: 3, HeadDim: 4, BlockSize: 5, MaxBlocks: 6, Scale: 1}, 7, 8, 9)
	if len(raw) != 40 || raw[0] != 1 || raw[24] != 7 || raw[28] != 8 || raw[32] != 9 || raw[39] != 0x3f {
		t.Fatalf("layout % x", raw)
	}
}

func TestGEMVShape(t *testing.T) {
	d := &Device{info: Info{SMs: 132}}
	for _, c := range []struct{ k, m, nv, ks int }{
		{2048, 2048, 2, 4}, {2048, 8192, 2, 4}, {8192, 2048, 4, 8}, {2048, 100352, 2, 4}, {1024, 64, 2, 2}, {256, 8, 1, 1}, {512, 8, 2, 1}, {4096, 8, 2, 8},
		// OLMo-2-7B's down projection, whole and split over two ranks (43
		// and 21.5 units), and short k.
		{11008, 4096, 6, 8}, {5504, 4096, 3, 8}, {16384, 8, 8, 8}, {8, 8, 1, 1}, {264, 8, 2, 1},
	} {
		nv, ks, ok := d.gemvShape(c.k, c.m)
		if !ok || nv != c.nv || ks != c.ks {
			t.Errorf("gemvShape(%d, %d) = %d, %d, %v; want %d, %d", c.k, c.m, nv, ks, ok, c.nv, c.ks)
		}
	}
	// Grids: up to four blocks per SM, never more than fit on an SM.
	for _, c := range []struct{ ks, m, occ, want int }{
		{4, 2048, 0, 512}, {8, 22016, 4, 528}, {8, 22016, 3, 396}, {8, 4096, 1, 132}, {8, 8, 0, 4},
	} {
		if g := d.gemvGrid(c.ks, c.m, c.occ); g != c.want {
			t.Errorf("gemvGrid(%d, %d, %d) = %d, want %d", c.ks, c.m, c.occ, g, c.want)
		}
	}
	// Every k the fast path takes has a kernel.
	for k := 8; k <= 16384; k += 8 {
		nv, ks, ok := d.gemvShape(k, 64)
		if !ok || !slices.Contains(gemvSplits, struct{ nv, ks int }{nv, ks}) {
			t.Fatalf("gemvShape(%d) = %d, %d, %v: no such kernel", k, nv, ks, ok)
		}
	}
	for _, k := range []int{100, 16392, 0} {
		if _, _, ok := d.gemvShape(k, 10); ok {
			t.Errorf("k=%d took the fast path", k)
		}
	}
	// The kernel for n rows of x: one, two or up to four rows where the
	// registers hold their units of x, else none (the skinny product).
	d.kern = map[string]*kernel{}
	for _, name := range kernelNames() {
		d.kern[name] = &kernel{name: name}
	}
	for _, name := range fusedKernelNames() {
		d.kern[name] = &kernel{name: name}
	}
	for _, c := range []struct {
		glu  bool
		n, k int
		want string
	}{
		{false, 1, 2048, "gemv_bf16_nv2_ks4"}, {true, 1, 2048, "gemv_glu_bf16_nv2_ks4"}, {false, 2, 8192, "gemv_bf16_b2_nv4_ks8"},
		{false, 3, 2048, "gemv_bf16_b4_nv2_ks4"}, {false, 4, 8192, "gemv_bf16_b4_nv4_ks8"}, {false, 2, 11008, "gemv_bf16_b2_nv6_ks8"},
		{false, 3, 11008, ""}, {false, 2, 16384, ""}, {false, 5, 2048, ""}, {false, 1, 100, ""},
	} {
		kern, _ := d.fastGEMV(c.glu, c.n, c.k, 4096)
		got := ""
		if kern != nil {
			got = kern.name
		}
		if got != c.want {
			t.Errorf("fastGEMV(glu %v, %d rows, k %d) = %q, want %q", c.glu, c.n, c.k, got, c.want)
		}
	}
}

// TestGEMMSplits checks the k splits of the prompt and batch products: the
// counts measured best on an H200 for the OLMo-2-1B shapes, and that the
// parts cover k exactly with none empty.
func TestGEMMSplits(t *testing.T) {
	const sms = 132
	for _, c := range []struct{ n, k, m, want int }{
		{64, 2048, 2048, 16}, {64, 2048, 8192, 4}, {64, 8192, 2048, 16}, {64, 2048, 100352, 1},
		{2048, 2048, 2048, 1}, {2048, 8192, 2048, 1}, {9, 40, 72, 1}, {100, 4104, 64, 15},
	} {
		tl := gemmTileFor(c.n)
		tiles := ceilDiv(c.n, tl.rows) * ceilDiv(c.m, tl.cols)
		splits, chunk := tl.splits(tiles, c.k, sms)
		if splits != c.want {
			t.Errorf("%dx%dx%d: %d splits, want %d", c.n, c.k, c.m, splits, c.want)
		}
		if chunk%32 != 0 || splits*chunk < c.k || (splits-1)*chunk >= c.k {
			t.Errorf("%dx%dx%d: %d splits of %d do not cover k exactly", c.n, c.k, c.m, splits, chunk)
		}
	}
}

// TestSkinnySplits: decode-batch products split k into parts of whole
// 64-steps that cover it exactly, more parts where the weights have few
// rows or more blocks fit on an SM; and the token tiles of each size of
// batch.
func TestSkinnySplits(t *testing.T) {
	for _, c := range []struct{ m, k, perSM, rt, want int }{
		{2048, 2048, 3, 1, 16}, {8192, 2048, 3, 1, 6}, {2048, 8192, 3, 1, 16}, {100352, 2048, 3, 1, 1}, {200, 128, 3, 1, 1},
		{300, 320, 3, 1, 2}, {16384, 2048, 3, 1, 3}, {16384, 2048, 4, 1, 4}, {6144, 2048, 4, 1, 11},
		// gemm_stream8: two tiles a block, one block an SM.
		{100352, 2048, 1, 2, 1}, {40000, 2048, 1, 2, 1},
		// gemm_stream8n: one tile a block, one block an SM.
		{2048, 2048, 1, 1, 8}, {6144, 2048, 1, 1, 2}, {16384, 2048, 1, 1, 1}, {2048, 8192, 1, 1, 8},
	} {
		splits, chunk := skinnySplits(c.m, c.k, 132, c.perSM, c.rt)
		if splits != c.want {
			t.Errorf("m=%d k=%d: %d splits, want %d", c.m, c.k, splits, c.want)
		}
		if chunk%64 != 0 || splits*chunk < c.k || (splits-1)*chunk >= c.k {
			t.Errorf("m=%d k=%d: %d splits of %d do not cover k exactly", c.m, c.k, splits, chunk)
		}
	}
	for _, exact := range []bool{false, true} {
		if got := skinnyName("bf16", exact); !slices.Contains(kernelNames(), got) {
			t.Errorf("exact %v: %s is not among the kernels", exact, got)
		}
	}
}

// TestStreamsGated: gemm_stream8g takes the gated MLPs of OLMo-2-1B and
// 7B (and Llama-3.2-1B's) at 33 to 64 rows on an H200's 132 SMs, not
// fewer rows, more, widths that are not whole tiles, or gate|up products
// too narrow to leave k unsplit (Qwen3-0.6B's).
func TestStreamsGated(t *testing.T) {
	for _, c := range []struct {
		n, k, f, sms int
		want         bool
	}{
		{64, 2048, 8192, 132, true}, {33, 2048, 8192, 132, true}, {48, 4096, 11008, 132, true},
		{32, 2048, 8192, 132, false}, {65, 2048, 8192, 132, false}, {64, 2048, 8200, 132, false},
		{64, 2040, 8192, 132, false}, {64, 1024, 3072, 132, false}, {64, 2048, 8192, 300, false},
	} {
		if got := streamsGated(c.n, c.k, c.f, c.sms); got != c.want {
			t.Errorf("%d rows over %d, f %d, %d SMs: %v, want %v", c.n, c.k, c.f, c.sms, got, c.want)
		}
	}
}

// TestStreamKernel: which decode-batch products the TMA-fed kernels take,
// by the rows of rounded x (pairs count twice) and of w on 132 SMs, and the
// rows of their boxes: two tiles of w a block from 64 rows where their
// tiles fill the SMs.
func TestStreamKernel(t *testing.T) {
	for _, c := range []struct {
		rows, m int
		name    string
		box     int
	}{
		{1, 2048, "gemm_stream_bf16", 32}, {18, 100352, "gemm_stream_bf16", 32}, {32, 2048, "gemm_stream_bf16", 32},
		{33, 2048, "gemm_stream8n_bf16", 64}, {48, 16384, "gemm_stream8n_bf16", 64}, {64, 33536, "gemm_stream8n_bf16", 64},
		{64, 33537, "gemm_stream8_bf16", 64}, {33, 100352, "gemm_stream8_bf16", 64}, {65, 2048, "", 0},
	} {
		if name, box, _ := streamKernel("bf16", c.rows, c.m, 132); name != c.name || box != c.box {
			t.Errorf("%d rows of x, %d of w: %q over boxes of %d rows, want %q over %d", c.rows, c.m, name, box, c.name, c.box)
		}
	}
}

// TestStreamShape: the host's view of the gemm_stream kernels' blocks
// (tiles of w, ring slots, stage of x and shared memory) is the kernel's
// (kernels/cuda/gemm_wg.cu).
func TestStreamShape(t *testing.T) {
	src, err := fs.ReadFile(kernels.FS(), "cuda/gemm_wg.cu")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`#define GS_XK (\d+)`).FindSubmatch(src)
	if m == nil {
		t.Fatal("no #define GS_XK in gemm_wg.cu")
	}
	if got, _ := strconv.Atoi(string(m[1])); got != streamXK {
		t.Errorf("GS_XK is %d in the kernel, %d on the host", got, streamXK)
	}
	if !bytes.Contains(src, []byte("#define GS_SMEM_FOR(RT, ST, XM) (4 * (RT) * (ST) * 4096 + 2 * (XM) * (GS_XK / 64) * 4096 + 1024 + 8 * (4 * (RT) * (ST) + 2))")) {
		t.Error("GS_SMEM_FOR is not the host's streamShape.shmem")
	}
	entries := regexp.MustCompile(`STREAM(?:_GLU)?\((gemm_stream\w*_)(?:bf16|f16), \w+, \d+, (\d+), (\d+), (\d+)\)`).FindAllSubmatch(src, -1)
	if len(entries) != 2*len(streamShapes) {
		t.Errorf("%d gemm_stream entry points in the kernel, %d on the host", len(entries), 2*len(streamShapes))
	}
	for _, e := range entries {
		rt, _ := strconv.Atoi(string(e[2]))
		st, _ := strconv.Atoi(string(e[3]))
		xm, _ := strconv.Atoi(string(e[4]))
		if got, want := streamShapes[string(e[1])], (streamShape{rt, st, xm}); got != want {
			t.Errorf("%s: the host's block is %+v, the kernel's %+v", e[1], got, want)
		}
	}
	// The driver is asked how many blocks fit at the shape they launch
	// with: gemm_stream8's two tiles, three slots, stages of 32 KiB, 256
	// threads and 161 KiB.
	if threads, shmem, ok := occupancyShape("gemm_stream8_bf16"); !ok || threads != 256 || shmem != 165072 {
		t.Errorf("gemm_stream8_bf16 asks about %d threads and %d bytes (%v), want 256 and 165072", threads, shmem, ok)
	}
	// gemm_stream8n's one tile, four slots: 128 threads and 129 KiB.
	if threads, shmem, ok := occupancyShape("gemm_stream8n_f16"); !ok || threads != 128 || shmem != 132240 {
		t.Errorf("gemm_stream8n_f16 asks about %d threads and %d bytes (%v), want 128 and 132240", threads, shmem, ok)
	}
	if _, _, ok := occupancyShape("gemm_stream9_bf16"); ok {
		t.Error("an unknown gemm_stream kernel has a shape")
	}
}

// TestProductX: how a decode batch's 16-bit product takes x, which the
// kernel ahead stores for it (nextX): up to 8 rows in f32 (the GEMVs and
// the exact kernel), 9 to 32 as pairs of 16-bit rows, more rounded; k not
// a multiple of 64 never as pairs.
func TestProductX(t *testing.T) {
	for _, c := range []struct {
		n, k          int
		pairs, rounds bool
	}{
		{1, 2048, false, false}, {8, 2048, false, false}, {9, 2048, true, false}, {32, 8192, true, false},
		{33, 2048, false, true}, {64, 2048, false, true}, {512, 2048, false, true},
		{16, 96, false, true}, {16, 100, false, false},
	} {
		if got := paired(c.n, c.k); got != c.pairs {
			t.Errorf("%d rows of %d: pairs %v, want %v", c.n, c.k, got, c.pairs)
		}
		if got := roundsX(c.n, c.k); got != c.rounds {
			t.Errorf("%d rows of %d: rounded %v, want %v", c.n, c.k, got, c.rounds)
		}
	}
}

// TestPrefillAttentionChoice: the tensor-core prompt kernel takes steps of
// more than 64 tokens in runs of 16 or more, with a 16-bit cache and head
// dim 64 or 128; recorded decode steps (64 tokens at most) never do.
func TestPrefillAttentionChoice(t *testing.T) {
	for _, c := range []struct {
		n, runs, hd int
		cache       gpu.DType
		want        bool
	}{
		{64, 1, 128, gpu.BF16, false}, {65, 1, 128, gpu.BF16, true}, {142, 3, 64, gpu.F16, true},
		{100, 10, 128, gpu.BF16, false}, {2048, 0, 128, gpu.BF16, false}, {512, 1, 128, gpu.F32, false},
		{512, 1, 256, gpu.BF16, false},
	} {
		a := gpu.AttnArgs{N: c.n, Runs: c.runs, HeadDim: c.hd}
		if got := usePrefillAttention(a, c.cache); got != c.want {
			t.Errorf("%d tokens in %d runs, head dim %d, %s cache: %v, want %v", c.n, c.runs, c.hd, c.cache, got, c.want)
		}
	}
}

// TestLaunchConfigLayout pins CUlaunchConfig and CUlaunchAttribute as the
// driver's headers lay them out on 64-bit hosts.
func TestLaunchConfigLayout(t *testing.T) {
	var c launchConfig
	var a launchAttr
	for _, f := range []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof(CUlaunchConfig)", unsafe.Sizeof(c), 56},
		{"offsetof(sharedMemBytes)", unsafe.Offsetof(c.shmem), 24},
		{"offsetof(hStream)", unsafe.Offsetof(c.stream), 32},
		{"offsetof(attrs)", unsafe.Offsetof(c.attrs), 40},
		{"offsetof(numAttrs)", unsafe.Offsetof(c.numAttrs), 48},
		{"sizeof(CUlaunchAttribute)", unsafe.Sizeof(a), 72},
		{"offsetof(value)", unsafe.Offsetof(a.val), 8},
	} {
		if f.got != f.want {
			t.Errorf("%s = %d, want %d", f.name, f.got, f.want)
		}
	}
	l := launchCmd{grid: dim3{3, 2, 1}, block: dim3{128, 1, 1}, shmem: 4096}
	l.overlapped(7)
	if l.cfg.gridX != 3 || l.cfg.gridY != 2 || l.cfg.blockX != 128 || l.cfg.shmem != 4096 || l.cfg.stream != 7 ||
		l.cfg.attrs != &l.attr || l.cfg.numAttrs != 1 || l.attr.id != launchAttrProgrammatic || l.attr.val[0] != 1 {
		t.Fatalf("overlapped launch config %+v, attribute %+v", l.cfg, l.attr)
	}
}

// TestDecodeAttentionPlan: which kernel a decode step's attention takes,
// its grid and splits. MHA with a 16-bit cache, and GQA over one token,
// stream keys on the CUDA cores; larger GQA steps run on the tensor cores;
// both combine their own splits;
// f32 caches and head dim 256 take the split kernel and attn_combine.
func TestDecodeAttentionPlan(t *testing.T) {
	const sms = 132
	olmo1B := gpu.AttnArgs{N: 1, Heads: 16, KVHeads: 16, HeadDim: 128, BlockSize: 16, MaxBlocks: 256}
	b64 := olmo1B
	b64.N = 64
	gqa := gpu.AttnArgs{N: 1, Heads: 32, KVHeads: 8, HeadDim: 64, BlockSize: 16, MaxBlocks: 8}
	gqa3 := gqa
	gqa3.N = 3
	qwen3 := gpu.AttnArgs{N: 1, Heads: 16, KVHeads: 8, HeadDim: 128, BlockSize: 16, MaxBlocks: 256}
	qwen3x64 := qwen3
	qwen3x64.N = 64
	moe := gpu.AttnArgs{N: 64, Heads: 32, KVHeads: 4, HeadDim: 128, BlockSize: 16, MaxBlocks: 256}
	moe16 := moe
	moe16.N = 16
	llama32 := gpu.AttnArgs{N: 32, Heads: 32, KVHeads: 8, HeadDim: 64, BlockSize: 16, MaxBlocks: 256}
	for _, c := range []struct {
		name  string
		a     gpu.AttnArgs
		cache gpu.DType
		want  decodeAttention
	}{
		// 4 blocks per SM over 16 heads is 33 splits (of at most 64 tiles of
		// 64 keys); over 64 tokens' 16 heads, one.
		{"1B", olmo1B, gpu.BF16, decodeAttention{kernel: "attn_mha_bf16_hd128", grid: dim3{33, 16, 1}, splits: 33, blocks: 16, selfCombine: true}},
		{"1B x64", b64, gpu.BF16, decodeAttention{kernel: "attn_mha_bf16_hd128", grid: dim3{1, 16, 64}, splits: 1, blocks: 1024, selfCombine: true}},
		// A GQA token takes the CUDA-core kernel: two query heads a block at
		// head dim 64 (128 keys at most: 2 tiles), one at 128.
		{"gqa", gqa, gpu.F16, decodeAttention{kernel: "attn_mha2_f16_hd64", grid: dim3{2, 16, 1}, splits: 2, blocks: 16, selfCombine: true}},
		{"qwen3", qwen3, gpu.BF16, decodeAttention{kernel: "attn_mha_bf16_hd128", grid: dim3{33, 16, 1}, splits: 33, blocks: 16, selfCombine: true}},
		// More tokens take the tensor cores, the query heads of a KV head
		// sharing a block.
		{"gqa x3", gqa3, gpu.F16, decodeAttention{kernel: "attn_decode_f16_hd64", grid: dim3{2, 8, 3}, shmem: 4 * 64 * 64 * 2, splits: 2, blocks: 24, selfCombine: true}},
		// Split for two blocks an SM: 64 tokens' 8 KV heads, one split.
		{"qwen3 x64", qwen3x64, gpu.BF16, decodeAttention{kernel: "attn_decode_bf16_hd128", grid: dim3{1, 8, 64}, shmem: 4 * 64 * 128 * 2, splits: 1, blocks: 512, selfCombine: true}},
		// Blocks that fill half the SMs' room take one split: 256 at head
		// dim 128 (64 tokens' 4 KV heads), where two blocks an SM would
		// split in two; 64 take five, and 256 at head dim 64 two.
		{"moe x64", moe, gpu.BF16, decodeAttention{kernel: "attn_decode_bf16_hd128", grid: dim3{1, 4, 64}, shmem: 4 * 64 * 128 * 2, splits: 1, blocks: 256, selfCombine: true}},
		{"llama x32", llama32, gpu.BF16, decodeAttention{kernel: "attn_decode_bf16_hd64", grid: dim3{2, 8, 32}, shmem: 4 * 64 * 64 * 2, splits: 2, blocks: 256, selfCombine: true}},
		{"moe x16", moe16, gpu.BF16, decodeAttention{kernel: "attn_decode_bf16_hd128", grid: dim3{5, 4, 16}, shmem: 4 * 64 * 128 * 2, splits: 5, blocks: 64, selfCombine: true}},
		{"f32", olmo1B, gpu.F32, decodeAttention{kernel: "attn_split_f32_hd128", grid: dim3{17, 16, 1}, splits: 17, blocks: 16}},
	} {
		got, err := planAttention(c.a, c.cache, sms, attnHeads(c.a), h200Room)
		if err != nil || got != c.want {
			t.Errorf("%s: %+v, %v; want %+v", c.name, got, err, c.want)
		}
	}
	if _, err := planAttention(gpu.AttnArgs{N: 70000, Heads: 2, KVHeads: 2, HeadDim: 64, BlockSize: 16, MaxBlocks: 1}, gpu.BF16, sms, 1, h200Room); err == nil {
		t.Error("70,000 tokens: no error")
	}
	if _, err := planAttention(qwen3, gpu.BF16, sms, 4, h200Room); err == nil {
		t.Error("four query heads a block: no error (no such kernel)")
	}
}

// h200Room is the driver's occupancy of attn_decode on an H200: 3 blocks
// an SM at head dim 128 (168 registers, 64 KiB of shared memory), 5 at 64
// (96 registers).
func h200Room(kernel string) int {
	if strings.HasSuffix(kernel, "_hd64") {
		return 5
	}
	return 3
}

// TestMoEPath: which way a MoE call's experts take. Qwen3-30B-A3B's
// experts (8 of 128 a token) go token by token up to 8 tokens, by tiles on
// the CUDA cores up to 32, on the tensor cores beyond; f32 weights and
// widths of part pieces never take the tensor cores. Of 4 experts, 2 a
// token, only a lone token goes alone, and five tokens fill the tensor
// cores' tiles.
func TestMoEPath(t *testing.T) {
	qwen := gpu.MoEArgs{Dim: 2048, Inter: 768, Experts: 128, TopK: 8}
	small := gpu.MoEArgs{Dim: 64, Inter: 32, Experts: 4, TopK: 2}
	for _, c := range []struct {
		a    gpu.MoEArgs
		n    int
		dt   gpu.DType
		want moePath
	}{
		{qwen, 1, gpu.BF16, moeFew}, {qwen, 8, gpu.BF16, moeFew}, {qwen, 9, gpu.BF16, moeTiles},
		{qwen, 32, gpu.BF16, moeTiles}, {qwen, 33, gpu.BF16, moeTensorCores}, {qwen, 64, gpu.F16, moeTensorCores},
		{qwen, 512, gpu.BF16, moeTensorCores}, {qwen, 512, gpu.F32, moeTiles},
		{small, 1, gpu.BF16, moeFew}, {small, 2, gpu.BF16, moeTiles}, {small, 5, gpu.BF16, moeTensorCores},
		{small, 5, gpu.F32, moeTiles},
	} {
		a := c.a
		a.N = c.n
		if got := moeWay(a, c.dt); got != c.want {
			t.Errorf("%d tokens of %d experts, %s weights: way %d, want %d", c.n, a.Experts, c.dt, got, c.want)
		}
	}
	odd := qwen
	odd.N, odd.Dim = 512, 2044
	if got := moeWay(odd, gpu.BF16); got != moeTiles {
		t.Errorf("width 2044: way %d, want the tiles", got)
	}
}

// TestMHARegisters: the decode attention's splits are planned for four
// blocks of attn_mha an SM (planAttention), which its registers allow
// only at 128 or fewer: the committed cubin's counts (EIATTR_REGCOUNT in
// .nv.info) among the artifacts the binary embeds. The compiler's choice
// follows the launch bounds; declared for one block an SM, it took 149
// and the 64 × 512 step ran 2% slower.
func TestMHARegisters(t *testing.T) {
	cubin, err := fs.ReadFile(kernels.FS(), "cuda/attention.sm_90a.cubin")
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.NewFile(bytes.NewReader(cubin))
	if err != nil {
		t.Fatal(err)
	}
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	info := f.Section(".nv.info")
	if info == nil {
		t.Fatal("no .nv.info section")
	}
	raw, err := info.Data()
	if err != nil {
		t.Fatal(err)
	}
	regs := map[string]uint32{}
	for off := 0; off+4 <= len(raw); {
		format, attr, size := raw[off], raw[off+1], int(binary.LittleEndian.Uint16(raw[off+2:]))
		if format != 4 { // only EIFMT_SVAL entries carry a payload
			off += 4
			continue
		}
		if attr == 0x2f && size >= 8 && off+12 <= len(raw) { // EIATTR_REGCOUNT: symbol, registers
			if sym := int(binary.LittleEndian.Uint32(raw[off+4:])); sym >= 1 && sym <= len(syms) {
				regs[syms[sym-1].Name] = binary.LittleEndian.Uint32(raw[off+8:])
			}
		}
		off += 4 + size
	}
	for _, dt := range []string{"bf16", "f16"} {
		for _, hd := range []int{64, 128} {
			name := mhaName(dt, hd, 1)
			n, ok := regs[name]
			if !ok {
				t.Errorf("%s: no register count in the cubin", name)
				continue
			}
			if n > 128 {
				t.Errorf("%s: %d registers, at most 128 leave four blocks an SM", name, n)
			}
		}
	}
}
