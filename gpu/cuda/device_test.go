//go:build cuda

package cuda

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/gputest"
	"github.com/troupe/troupe/gpu/ref"
)

var kernelDir = flag.String("cuda.kernels", "", "load kernel artifacts from this kernels/ directory instead of the embedded ones")

var serial = flag.Bool("cuda.serial", false, "launch kernels without programmatic dependent launch")

var ptxFlag = flag.Bool("cuda.ptx", false, "load the compute_80 PTX even on Hopper, as other GPUs do")

// open opens GPU 0 as the package's tests run it (-cuda.serial,
// -cuda.kernels), closed when the test ends.
func open(t testing.TB) *Device {
	t.Helper()
	return openWith(t, Config{Ordinal: 0, Serial: *serial})
}

// withKernels is cfg loading the kernel artifacts -cuda.kernels names,
// if any, and the PTX with -cuda.ptx.
func withKernels(cfg Config) Config {
	if *kernelDir != "" {
		cfg.Kernels = os.DirFS(*kernelDir)
	}
	cfg.PTX = cfg.PTX || *ptxFlag
	return cfg
}

// openWith opens the device cfg describes (withKernels), closed when the
// test ends.
func openWith(t testing.TB, cfg Config) *Device {
	t.Helper()
	d, err := Open(context.Background(), withKernels(cfg))
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return d
}

// attentionKernels are the decode attention kernels Attention does not
// pick for a shape: the tensor-core kernel, and the CUDA-core one with 1 or
// 2 query heads a block.
func attentionKernels(d *Device) map[string]gputest.AttentionFunc {
	m := map[string]gputest.AttentionFunc{}
	for _, g := range []int{0, 1, 2} {
		m[fmt.Sprintf("heads=%d", g)] = func(out, q, kc, vc gpu.Buffer, a gpu.AttnArgs) error {
			cache := kc.DType()
			if g == attnHeads(a) || g > 0 && (a.Heads/a.KVHeads)%g != 0 || cache == gpu.F32 || a.HeadDim > 128 || usePrefillAttention(a, cache) {
				return gputest.ErrNotApplicable
			}
			return d.attention(out, q, kc, vc, a, g)
		}
	}
	return m
}

func TestConformance(t *testing.T) {
	d := open(t)
	t.Log(d.Name())
	// The suite as a whole: bf16/f16 weights round x for the tensor cores
	// (n > 8) and bf16 caches round k, v: 1e-2 bounds those paths.
	t.Run("all", func(t *testing.T) {
		gputest.Run(t, d, gputest.Options{Tol: 1e-2, CacheDTypes: []gpu.DType{gpu.F32, gpu.BF16}, Large: true, Attention: attentionKernels(d)})
	})
	// f32 weights and caches: f32 arithmetic throughout.
	t.Run("f32", func(t *testing.T) {
		gputest.Run(t, d, gputest.Options{Tol: 1e-5, CacheDTypes: []gpu.DType{gpu.F32}, WeightDTypes: []gpu.DType{gpu.F32}, Large: true})
	})
	// 16-bit weights with f32 caches, at the tolerance the GEMM's rounding of
	// x allows (f16 caches included).
	t.Run("16bit", func(t *testing.T) {
		gputest.Run(t, d, gputest.Options{Tol: 5e-3, CacheDTypes: []gpu.DType{gpu.F16}, WeightDTypes: []gpu.DType{gpu.BF16, gpu.F16}, Large: true, Attention: attentionKernels(d)})
	})
}

// TestPTXFallback runs kernels as GPUs other than Hopper load them, from
// the compute_80 PTX that the driver compiles at load: the conformance
// suite and the products over coded weights. (-cuda.ptx runs the whole
// package that way.)
func TestPTXFallback(t *testing.T) {
	d := openWith(t, Config{Ordinal: 0, Serial: *serial, PTX: true})
	if code := d.Info().Code; !strings.HasPrefix(code, "ptx") {
		t.Fatalf("code %q, want the PTX", code)
	}
	t.Run("conformance", func(t *testing.T) {
		gputest.Run(t, d, gputest.Options{Tol: 1e-2, CacheDTypes: []gpu.DType{gpu.F32, gpu.BF16}, Large: true, Attention: attentionKernels(d)})
	})
	t.Run("coded", func(t *testing.T) { codedProducts(t, d) })
}

func randF32(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
	}
	return v
}

// slice is a view of n elements of b from element off.
func slice(t testing.TB, d *Device, b gpu.Buffer, off, n int) gpu.Buffer {
	t.Helper()
	v, err := d.Slice(b, off, n)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func alloc(t testing.TB, d gpu.Device, dt gpu.DType, n int) gpu.Buffer {
	t.Helper()
	b, err := d.Alloc(dt, n)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func weights(t testing.TB, d gpu.Device, dt gpu.DType, raw []byte) gpu.Buffer {
	t.Helper()
	b, err := d.Weights(dt, raw)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func f32buf(t testing.TB, d gpu.Device, v []float32) gpu.Buffer {
	t.Helper()
	b := alloc(t, d, gpu.F32, len(v))
	if err := d.Write(b, 0, gpu.F32Bytes(v)); err != nil {
		t.Fatal(err)
	}
	return b
}

func i32buf(t testing.TB, d *Device, v []int32) gpu.Buffer {
	t.Helper()
	b := alloc(t, d, gpu.I32, len(v))
	if err := d.Write(b, 0, gpu.I32Bytes(v)); err != nil {
		t.Fatal(err)
	}
	return b
}

func readF32(t testing.TB, d gpu.Device, b gpu.Buffer) []float32 {
	t.Helper()
	v := make([]float32, b.Len())
	if err := d.Read(gpu.F32Bytes(v), b, 0); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestGEMVShapes checks the bf16 GEMV, one to four rows of x (the rows
// its registers cannot hold go to the skinny product), on the OLMo-2-1B shapes, the
// 7B down projection (whole and over two ranks: k not a power-of-two
// multiple of 256, or of 256 at all) and short rows against a float64
// product of the same bf16 weights.
func TestGEMVShapes(t *testing.T) {
	d := open(t)
	r := rand.New(rand.NewPCG(3, 4))
	for _, s := range [][2]int{{2048, 2048}, {8192, 2048}, {2048, 8192}, {100352, 2048}, {1536, 4096}, {768, 1024},
		{4096, 11008}, {4096, 5504}, {300, 264}, {40, 8}} {
		m, k := s[0], s[1]
		wv := randF32(r, m*k, 0.05)
		raw := gputest.Encode(gpu.BF16, wv)
		w := weights(t, d, gpu.BF16, raw)
		rows := 4 // one to four rows of x: the one- and multi-row GEMVs
		if m*k > 1<<26 {
			rows = 2
		}
		xv := randF32(r, rows*k, 1)
		x := f32buf(t, d, xv)
		out := alloc(t, d, gpu.F32, rows*m)
		for n := 1; n <= rows; n++ {
			if err := d.MatMul(out, x, w, n, k, m); err != nil {
				t.Fatal(err)
			}
			got := readF32(t, d, out)[:n*m]
			want := make([]float32, n*m)
			for b := range n {
				for j := range m {
					var acc float64
					for i := range k {
						h := uint16(raw[2*(j*k+i)]) | uint16(raw[2*(j*k+i)+1])<<8
						acc += float64(gpu.BF16ToF32(h)) * float64(xv[b*k+i])
					}
					want[b*m+j] = float32(acc)
				}
			}
			if e := gputest.RelL2(got, want); !(e < 1e-5) {
				t.Errorf("gemv %d rows of %dx%d: relative L2 error %.3g", n, m, k, e)
			}
		}
		d.Free(w)
		d.Free(x)
		d.Free(out)
	}
}

// TestFreeMemory: the device's free memory is at most its size, and a
// 1 GiB allocation takes at least that much of it until freed.
func TestFreeMemory(t *testing.T) {
	d := open(t)
	var _ gpu.MemoryReporter = d
	free, total, err := d.FreeMemory()
	if err != nil {
		t.Fatal(err)
	}
	if total != d.Info().MemBytes || free <= 0 || free > total {
		t.Fatalf("free %d of %d bytes; the device has %d", free, total, d.Info().MemBytes)
	}
	b, err := d.Alloc(gpu.F32, 1<<28)
	if err != nil {
		t.Fatal(err)
	}
	during, _, err := d.FreeMemory()
	if err != nil {
		t.Fatal(err)
	}
	d.Free(b)
	after, _, err := d.FreeMemory()
	if err != nil {
		t.Fatal(err)
	}
	if free-during < 1<<30 || after-during < 1<<30 {
		t.Errorf("free %d bytes before a 1 GiB allocation, %d with it, %d after it", free, during, after)
	}
}

// TestDecodeRoom: the driver's occupancy of attn_decode, which the
// decode attention's one-split rule reads (planAttention), is known for
// every entry point; on an H200 it is what TestDecodeAttentionPlan takes.
func TestDecodeRoom(t *testing.T) {
	d := open(t)
	for _, dt := range []string{"bf16", "f16"} {
		for _, hd := range []int{64, 128} {
			name := fmt.Sprintf("attn_decode_%s_hd%d", dt, hd)
			got := d.room(name)
			if got < 1 {
				t.Errorf("%s: room for %d blocks an SM", name, got)
			}
			if strings.Contains(d.Name(), "H200") && got != h200Room(name) {
				t.Errorf("%s on %s: room for %d blocks an SM, want %d", name, d.Name(), got, h200Room(name))
			}
			t.Logf("%s: %d blocks an SM", name, got)
		}
	}
}

// TestSkinnyExact checks decode-batch products against a float64 product
// of the same 16-bit weights and the f32 x: up to 32 rows within f32
// rounding (x's rounding remainder goes through a second mma), more rows
// within bf16 (f16) rounding of x.
func TestSkinnyExact(t *testing.T) {
	d := open(t)
	r := rand.New(rand.NewPCG(7, 8))
	for _, c := range []struct {
		dt      gpu.DType
		n, k, m int
		tol     float64
	}{
		{gpu.F16, 1, 512, 300, 1e-5}, {gpu.BF16, 3, 576, 260, 1e-5}, {gpu.BF16, 8, 2048, 640, 1e-5},
		{gpu.BF16, 9, 512, 300, 1e-5}, {gpu.BF16, 12, 704, 300, 1e-5}, {gpu.F16, 17, 576, 300, 1e-5}, {gpu.BF16, 24, 2048, 640, 1e-5},
		{gpu.F16, 32, 1024, 200, 1e-5}, {gpu.BF16, 33, 512, 300, 1e-2}, {gpu.BF16, 64, 2048, 256, 1e-2},
		{gpu.BF16, 40, 832, 200, 1e-2}, {gpu.F16, 48, 1024, 300, 1e-2}, {gpu.F16, 57, 640, 130, 1e-2},
		// Several stages of x and more steps a split than gemm_stream's
		// ring of weights (up to 16 rows, as pairs), or gemm_skinny's.
		{gpu.F16, 14, 2048, 8192, 1e-5}, {gpu.BF16, 16, 8192, 96, 1e-5}, {gpu.BF16, 40, 2048, 8192, 1e-2},
		// Weights of enough rows for two tiles a block (gemm_stream8).
		{gpu.BF16, 48, 128, 40000, 1e-2}, {gpu.F16, 35, 192, 40000, 1e-2},
	} {
		wv, xv := randF32(r, c.m*c.k, 0.05), randF32(r, c.n*c.k, 1)
		raw := gputest.Encode(gpu.BF16, wv)
		dec := gpu.BF16ToF32
		if c.dt == gpu.F16 {
			raw, dec = gputest.Encode(gpu.F16, wv), gpu.F16ToF32
		}
		out := alloc(t, d, gpu.F32, c.n*c.m)
		if err := d.MatMul(out, f32buf(t, d, xv), weights(t, d, c.dt, raw), c.n, c.k, c.m); err != nil {
			t.Fatal(err)
		}
		want := make([]float32, c.n*c.m)
		for i := range c.n {
			for j := range c.m {
				var acc float64
				for l := range c.k {
					h := uint16(raw[2*(j*c.k+l)]) | uint16(raw[2*(j*c.k+l)+1])<<8
					acc += float64(dec(h)) * float64(xv[i*c.k+l])
				}
				want[i*c.m+j] = float32(acc)
			}
		}
		if e := gputest.RelL2(readF32(t, d, out), want); !(e <= c.tol) {
			t.Errorf("%s %dx%dx%d: relative L2 error %.3g, want <= %.0e", c.dt, c.n, c.m, c.k, e, c.tol)
		}
	}
}

// TestStreamLoads: on a Hopper GPU the decode-batch products of up to 64
// rows of 16-bit x take gemm_stream (TestSkinnyExact checks its sums),
// and the driver holds at least one block of it an SM with its shared
// memory.
func TestStreamLoads(t *testing.T) {
	d := open(t)
	if d.info.Code != codeCubin {
		t.Skipf("%s runs the portable PTX, which has no TMA", d.Name())
	}
	for _, name := range streamKernelNames() {
		k := d.k(name)
		if k == nil {
			t.Fatalf("%s is not loaded", name)
		}
		if k.occ < 1 {
			t.Errorf("%s: room for %d blocks an SM", name, k.occ)
		}
		t.Logf("%s: %d blocks an SM", name, k.occ)
	}
}

func TestArgmax(t *testing.T) {
	d := open(t)
	r := rand.New(rand.NewPCG(5, 6))
	// Rows are shared by blocks of 2048 values: the ties and the maxima
	// below lie in different blocks.
	n, width := 4, 100352
	v := randF32(r, n*width, 1)
	v[0*width+777] = 9
	v[0*width+5000] = 9 // tie: the lower index wins
	v[1*width+width-1] = 7
	v[2*width+12] = float32(math.NaN())
	v[2*width+13] = 8
	for i := range width {
		v[3*width+i] = float32(math.NaN()) // a row of NaNs gives 0
	}
	logits := f32buf(t, d, v)
	out := alloc(t, d, gpu.I32, n)
	want := []int32{777, int32(width - 1), 13, 0}
	for range 3 { // the blocks' counters are left zero for the next call
		if err := d.Argmax(out, logits, n, width); err != nil {
			t.Fatal(err)
		}
		got := make([]int32, n)
		if err := d.Read(gpu.I32Bytes(got), out, 0); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	// A row narrower than one block.
	small := f32buf(t, d, []float32{1, 3, 2, 3, -1})
	if err := d.Argmax(out, small, 1, 5); err != nil {
		t.Fatal(err)
	}
	got := make([]int32, 1)
	if err := d.Read(gpu.I32Bytes(got), out, 0); err != nil {
		t.Fatal(err)
	}
	if got[0] != 1 {
		t.Fatalf("argmax of [1 3 2 3 -1] = %d, want 1", got[0])
	}
}

// TestSpanCheckRefuses checks on the GPU that a launch with a span beyond
// its allocation is refused and leaves the device usable.
func TestSpanCheckRefuses(t *testing.T) {
	d := open(t)
	small := alloc(t, d, gpu.F32, 16)
	big := alloc(t, d, gpu.F32, 1024)
	sb := small.(*Buffer)
	bb := big.(*Buffer)
	err := d.launch(d.k("add_f32"), grid1(1), grid1(256), 0,
		bufArg("out", bb, gpu.F32, 1024), bufArg("a", sb, gpu.F32, 1024), bufArg("b", bb, gpu.F32, 1024), i32Arg(1024))
	if err == nil || !strings.Contains(err.Error(), "launch add_f32: argument a") {
		t.Fatalf("got %v, want the span error of add_f32's argument a", err)
	}
	// More shared memory than the GPU gives a block is refused as well.
	if d.info.SharedOptin < 99<<10 {
		t.Errorf("%s: %d bytes of shared memory a block, want at least 99 KiB", d.Name(), d.info.SharedOptin)
	}
	err = d.launch(d.k("add_f32"), grid1(1), grid1(256), d.info.SharedOptin+1024,
		bufArg("out", bb, gpu.F32, 1024), bufArg("a", bb, gpu.F32, 1024), bufArg("b", bb, gpu.F32, 1024), i32Arg(1024))
	if err == nil || !strings.Contains(err.Error(), "bytes of shared memory a block") {
		t.Fatalf("got %v, want the shared memory error", err)
	}
	if err := d.Sync(context.Background()); err != nil {
		t.Fatalf("sync after a refused launch: %v", err)
	}
}

func TestFaults(t *testing.T) {
	d := open(t)
	kc := alloc(t, d, gpu.BF16, 4*8)
	vc := alloc(t, d, gpu.BF16, 4*8)
	k := f32buf(t, d, make([]float32, 8))
	v := f32buf(t, d, make([]float32, 8))
	slots := i32buf(t, d, []int32{4})
	if err := d.StoreKV(kc, vc, k, v, slots, 1, 8); err != nil {
		t.Fatal(err)
	}
	err := d.Sync(context.Background())
	var fe *FaultError
	if !errors.As(err, &fe) || fe.Code != faultStoreKVSlot || fe.Value != 4 {
		t.Fatalf("got %v, want the storekv slot fault", err)
	}
	if err := d.Sync(context.Background()); err != nil {
		t.Fatalf("fault not cleared: %v", err)
	}
	// Router logits of NaN leave a token's choices without an expert: one
	// or a few tokens' (chosen in the gate|up blocks) and more tokens'
	// (moe_route).
	for _, n := range []int{1, 3, 6} {
		const dim, inter, experts = 16, 8, 4
		a := gpu.MoEArgs{N: n, Dim: dim, Inter: inter, Experts: experts, TopK: 2,
			Router: f32buf(t, d, make([]float32, experts*dim))}
		for e := 0; e < experts; e++ {
			a.Gate = append(a.Gate, f32buf(t, d, make([]float32, inter*dim)))
			a.Up = append(a.Up, f32buf(t, d, make([]float32, inter*dim)))
			a.Down = append(a.Down, f32buf(t, d, make([]float32, dim*inter)))
		}
		xs := make([]float32, n*dim)
		for i := range xs {
			xs[i] = float32(math.NaN())
		}
		if err := d.MoE(alloc(t, d, gpu.F32, n*dim), f32buf(t, d, xs), a); err != nil {
			t.Fatal(err)
		}
		err := d.Sync(context.Background())
		if !errors.As(err, &fe) || fe.Code != faultMoEExpert || fe.Value != -1 || fe.Index < 0 || fe.Index >= n*a.TopK {
			t.Fatalf("%d tokens: got %v, want the moe expert fault", n, err)
		}
		if err := d.Sync(context.Background()); err != nil {
			t.Fatalf("%d tokens: fault not cleared: %v", n, err)
		}
	}
}

// TestFusedNorms checks AddRMSNorm and RMSNormAdd against their unfused
// compositions on the reference, at rows of 2,048 (512 threads a row),
// 4,096 and 8,192 (1,024 threads), and with enough rows that the norms
// also store the next product's rounded x.
func TestFusedNorms(t *testing.T) {
	d := open(t)
	rf := ref.New()
	r := rand.New(rand.NewPCG(7, 8))
	hostBuf := func(v []float32) gpu.Buffer {
		b := alloc(t, rf, gpu.F32, len(v))
		_ = rf.Write(b, 0, gpu.F32Bytes(v))
		return b
	}
	for _, c := range []struct{ n, dim int }{{3, 2048}, {40, 4096}, {2, 8192}} {
		n, dim := c.n, c.dim
		xv, rv, wv := randF32(r, n*dim, 1), randF32(r, n*dim, 1), randF32(r, dim, 1)
		w := weights(t, d, gpu.BF16, gputest.Encode(gpu.BF16, wv))
		wr := weights(t, rf, gpu.BF16, gputest.Encode(gpu.BF16, wv))
		// Pre-norm: r += x; out = norm(r).
		x, res, out := f32buf(t, d, xv), f32buf(t, d, rv), alloc(t, d, gpu.F32, n*dim)
		if err := d.AddRMSNorm(out, res, x, w, n, dim, 1e-6); err != nil {
			t.Fatalf("%dx%d: %v", n, dim, err)
		}
		xr, rr, or := hostBuf(xv), hostBuf(rv), alloc(t, rf, gpu.F32, n*dim)
		_ = rf.Add(rr, rr, xr, n*dim)
		_ = rf.RMSNorm(or, rr, wr, n, dim, 1e-6)
		if e := gputest.RelL2(readF32(t, d, res), readF32(t, rf, rr)); e > 1e-6 {
			t.Errorf("%dx%d addrmsnorm residual: error %.3g", n, dim, e)
		}
		if e := gputest.RelL2(readF32(t, d, out), readF32(t, rf, or)); e > 1e-5 {
			t.Errorf("%dx%d addrmsnorm out: error %.3g", n, dim, e)
		}
		// Post-norm: r += norm(x).
		res2 := f32buf(t, d, rv)
		if err := d.RMSNormAdd(res2, x, w, n, dim, 1e-6); err != nil {
			t.Fatalf("%dx%d: %v", n, dim, err)
		}
		rr2, tmp := hostBuf(rv), alloc(t, rf, gpu.F32, n*dim)
		_ = rf.RMSNorm(tmp, xr, wr, n, dim, 1e-6)
		_ = rf.Add(rr2, rr2, tmp, n*dim)
		if e := gputest.RelL2(readF32(t, d, res2), readF32(t, rf, rr2)); e > 1e-5 {
			t.Errorf("%dx%d rmsnormadd: error %.3g", n, dim, e)
		}
		// Plain: out = norm(x).
		out2 := alloc(t, d, gpu.F32, n*dim)
		if err := d.RMSNorm(out2, x, w, n, dim, 1e-6); err != nil {
			t.Fatalf("%dx%d: %v", n, dim, err)
		}
		if e := gputest.RelL2(readF32(t, d, out2), readF32(t, rf, tmp)); e > 1e-5 {
			t.Errorf("%dx%d rmsnorm: error %.3g", n, dim, e)
		}
		for _, b := range []gpu.Buffer{w, x, res, out, res2, out2} {
			d.Free(b)
		}
	}
}

// TestNormsRoundNext: a norm whose output a 16-bit product reads next
// stores that product's x itself, rounded (33 to 64 rows) or as pairs of
// 16-bit rows (9 to 32); the product through it equals, bit for bit, the
// product of the same f32 rows rounded or split by the product itself.
func TestNormsRoundNext(t *testing.T) {
	d := open(t)
	r := rand.New(rand.NewPCG(9, 9))
	const dim, m = 2048, 320
	for _, dt := range []gpu.DType{gpu.BF16, gpu.F16} {
		for _, n := range []int{12, 40} {
			for _, post := range []bool{false, true} {
				name := fmt.Sprintf("%s n=%d post=%v", dt, n, post)
				nw := weights(t, d, dt, gputest.Encode(dt, randF32(r, dim, 1)))
				pw := weights(t, d, dt, gputest.Encode(dt, randF32(r, m*dim, 0.05)))
				x, next := f32buf(t, d, randF32(r, n*dim, 1)), f32buf(t, d, randF32(r, n*dim, 1))
				var err error
				if post {
					err = d.RMSNormAdd(next, x, nw, n, dim, 1e-6)
				} else {
					res := next
					next = alloc(t, d, gpu.F32, n*dim)
					err = d.AddRMSNorm(next, res, x, nw, n, dim, 1e-6)
				}
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				sameProduct(t, d, name, next, pw, n, dim, m)
			}
		}
	}
}

// sameProduct checks that the product of x (n rows of k, just written by a
// kernel that also stored the product's x) by w equals, bit for bit, the
// product of a fresh copy of x, whose x the product forms itself.
func sameProduct(t *testing.T, d *Device, name string, x, w gpu.Buffer, n, k, m int) {
	t.Helper()
	got, want := alloc(t, d, gpu.F32, n*m), alloc(t, d, gpu.F32, n*m)
	if err := d.MatMul(got, x, w, n, k, m); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := d.MatMul(want, f32buf(t, d, readF32(t, d, x)), w, n, k, m); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	g, e := readF32(t, d, got), readF32(t, d, want)
	for i := range g {
		if math.Float32bits(g[i]) != math.Float32bits(e[i]) {
			t.Errorf("%s: [%d] %g through the kernel's copy of x, %g from the product's own", name, i, g[i], e[i])
			return
		}
	}
}

// TestAttentionRoundsNext: decode attention over 9 to 64 tokens also
// stores the o product's x, rounded to the cache's type or as pairs of
// 16-bit rows; the product through it equals, bit for bit, the product
// of the same f32 rows rounded or split by the product itself. MHA (the
// CUDA-core kernel) and GQA (the tensor-core kernel), over keys split in
// several parts and in one.
func TestAttentionRoundsNext(t *testing.T) {
	d := open(t)
	r := rand.New(rand.NewPCG(10, 10))
	const bs, m = 16, 192
	for _, dt := range []gpu.DType{gpu.BF16, gpu.F16} {
		for _, h := range [][3]int{{16, 16, 128}, {16, 8, 128}, {32, 8, 64}} {
			for _, c := range []struct{ n, ctx int }{{12, 700}, {40, 100}, {24, 40}} {
				heads, kvHeads, hd := h[0], h[1], h[2]
				name := fmt.Sprintf("%s h%d-kv%d-hd%d n%d ctx%d", dt, heads, kvHeads, hd, c.n, c.ctx)
				blocks, kw, qw := (c.ctx+bs-1)/bs, kvHeads*hd, heads*hd
				kc := weights(t, d, dt, gputest.Encode(dt, randF32(r, c.n*blocks*bs*kw, 1)))
				vc := weights(t, d, dt, gputest.Encode(dt, randF32(r, c.n*blocks*bs*kw, 1)))
				table := make([]int32, c.n*blocks)
				for i := range table {
					table[i] = int32(i)
				}
				pos, seq := make([]int32, c.n), make([]int32, c.n)
				for i := range pos {
					pos[i], seq[i] = int32(c.ctx-1-i%3), int32(i)
				}
				a := gpu.AttnArgs{N: c.n, Heads: heads, KVHeads: kvHeads, HeadDim: hd, BlockSize: bs, MaxBlocks: blocks, Runs: c.n,
					Scale: float32(1 / math.Sqrt(float64(hd))), Pos: i32buf(t, d, pos), Seq: i32buf(t, d, seq), BlockTable: i32buf(t, d, table)}
				out := alloc(t, d, gpu.F32, c.n*qw)
				if err := d.Attention(out, f32buf(t, d, randF32(r, c.n*qw, 1)), kc, vc, a); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				ow := weights(t, d, dt, gputest.Encode(dt, randF32(r, m*qw, 0.05)))
				sameProduct(t, d, name, out, ow, c.n, qw, m)
			}
		}
	}
}

// TestKernelThreads: the driver's limit on every kernel's block is known
// (launches are checked against it), and the norms, whose rows of 4,096
// and more take 1,024 threads, allow them.
func TestKernelThreads(t *testing.T) {
	d := open(t)
	for name, k := range d.kern {
		want := 32
		for _, p := range []string{"rmsnorm_", "add_rmsnorm_", "rmsnorm_add_", "rmsnorm_shard_", "sumsq2_f32"} {
			if strings.HasPrefix(name, p) {
				want = 1024
			}
		}
		if k.threads < want {
			t.Errorf("%s: up to %d threads a block, want %d", name, k.threads, want)
		}
	}
}

// step is a miniature decode step: every op a model's step uses, with the
// per-token indices in device buffers.
type step struct {
	dim, heads, hd, vocab, blocks, bs int
	emb, wq, wo, normW, invFreq       gpu.Buffer
	kc, vc                            gpu.Buffer
	ids, pos, seq, bt, slots          gpu.Buffer
	x, h, q, kv, att, o, logits, next gpu.Buffer
	// The fused operations, on a second cache: q|k norm + RoPE + KV
	// store, and an MLP down projection with SiLU folded in.
	wgu, wd, kc2, vc2 gpu.Buffer
	qr, att2, gu, o2  gpu.Buffer
}

func newStep(t *testing.T, d *Device, r *rand.Rand) *step {
	s := &step{dim: 256, heads: 2, hd: 128, vocab: 1000, blocks: 8, bs: 16}
	s.emb = weights(t, d, gpu.BF16, gputest.Encode(gpu.BF16, randF32(r, s.vocab*s.dim, 1)))
	s.wq = weights(t, d, gpu.BF16, gputest.Encode(gpu.BF16, randF32(r, s.dim*s.dim, 0.05)))
	s.wo = weights(t, d, gpu.BF16, gputest.Encode(gpu.BF16, randF32(r, s.vocab*s.dim, 0.05)))
	s.normW = weights(t, d, gpu.F32, gpu.F32Bytes(randF32(r, s.dim, 1)))
	s.invFreq = f32buf(t, d, gputest.InvFreq(s.hd, 10000))
	s.kc = alloc(t, d, gpu.BF16, s.blocks*s.bs*s.dim)
	s.vc = alloc(t, d, gpu.BF16, s.blocks*s.bs*s.dim)
	for _, p := range []*gpu.Buffer{&s.ids, &s.pos, &s.seq, &s.slots} {
		*p = alloc(t, d, gpu.I32, 1)
	}
	s.bt = i32buf(t, d, []int32{3, 1, 4, 0, 5, 2, 7, 6})
	for _, p := range []*gpu.Buffer{&s.x, &s.h, &s.q, &s.kv, &s.att, &s.o} {
		*p = alloc(t, d, gpu.F32, s.dim)
	}
	s.logits = alloc(t, d, gpu.F32, s.vocab)
	s.next = alloc(t, d, gpu.I32, 1)
	s.wgu = weights(t, d, gpu.BF16, gputest.Encode(gpu.BF16, randF32(r, 2*s.dim*s.dim, 0.05)))
	s.wd = weights(t, d, gpu.BF16, gputest.Encode(gpu.BF16, randF32(r, s.dim*s.dim, 0.05)))
	s.kc2 = alloc(t, d, gpu.BF16, s.blocks*s.bs*s.dim)
	s.vc2 = alloc(t, d, gpu.BF16, s.blocks*s.bs*s.dim)
	for _, p := range []*gpu.Buffer{&s.qr, &s.att2, &s.o2} {
		*p = alloc(t, d, gpu.F32, s.dim)
	}
	s.gu = alloc(t, d, gpu.F32, 2*s.dim)
	return s
}

func (s *step) run(d *Device) error {
	a := gpu.AttnArgs{N: 1, Heads: s.heads, KVHeads: s.heads, HeadDim: s.hd, BlockSize: s.bs, MaxBlocks: s.blocks,
		Scale: float32(1 / math.Sqrt(float64(s.hd))), Pos: s.pos, Seq: s.seq, BlockTable: s.bt}
	for _, f := range []func() error{
		func() error { return d.Embed(s.x, s.emb, s.ids, 1, s.dim) },
		func() error { return d.RMSNorm(s.h, s.x, s.normW, 1, s.dim, 1e-6) },
		func() error { return d.MatMul(s.q, s.h, s.wq, 1, s.dim, s.dim) },
		func() error { return d.MatMul(s.kv, s.h, s.wq, 1, s.dim, s.dim) },
		func() error {
			return d.PrepareQKV(s.qr, s.q, s.kv, s.h, s.normW, s.normW, s.pos, s.invFreq, s.kc2, s.vc2, s.slots,
				gpu.QKVArgs{N: 1, Heads: s.heads, KVHeads: s.heads, HeadDim: s.hd, Norm: gpu.QKNormRow, Eps: 1e-6})
		},
		func() error { return d.RoPE(s.q, s.pos, s.invFreq, 1, s.heads, s.hd) },
		func() error { return d.RoPE(s.kv, s.pos, s.invFreq, 1, s.heads, s.hd) },
		func() error { return d.StoreKV(s.kc, s.vc, s.kv, s.h, s.slots, 1, s.dim) },
		func() error { return d.Attention(s.att, s.q, s.kc, s.vc, a) },
		func() error { return d.Attention(s.att2, s.qr, s.kc2, s.vc2, a) },
		func() error { return d.Add(s.att, s.att, s.att2, s.dim) },
		func() error { return d.AddRMSNorm(s.o, s.x, s.att, s.normW, 1, s.dim, 1e-6) },
		func() error { return d.MatMul(s.gu, s.o, s.wgu, 1, s.dim, 2*s.dim) },
		func() error { return d.SiLUMatMul(s.o2, s.gu, s.wd, 1, s.dim, s.dim) },
		func() error { return d.Add(s.o, s.o, s.o2, s.dim) },
		func() error { return d.MatMul(s.logits, s.o, s.wo, 1, s.dim, s.vocab) },
		func() error { return d.Argmax(s.next, s.logits, 1, s.vocab) },
	} {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

func (s *step) set(t *testing.T, d *Device, id, pos int) {
	blk := []int32{3, 1, 4, 0, 5, 2, 7, 6}[pos/s.bs]
	for _, w := range []struct {
		b gpu.Buffer
		v int32
	}{{s.ids, int32(id)}, {s.pos, int32(pos)}, {s.seq, 0}, {s.slots, blk*int32(s.bs) + int32(pos%s.bs)}} {
		if err := d.Write(w.b, 0, gpu.I32Bytes([]int32{w.v})); err != nil {
			t.Fatal(err)
		}
	}
}

// TestGraphReplay records a decode step once and replays it token after
// token; each replay must give exactly what direct execution gives.
func TestGraphReplay(t *testing.T) {
	d := open(t)
	r := rand.New(rand.NewPCG(9, 10))
	direct, graphed := newStep(t, d, r), newStep(t, d, rand.New(rand.NewPCG(9, 10)))
	graphed.set(t, d, 0, 0)
	g, err := d.Capture(func() error { return graphed.run(d) })
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	t.Logf("graph of %d nodes", g.(*Graph).Nodes())
	id := 17
	for pos := 0; pos < 40; pos++ {
		direct.set(t, d, id, pos)
		if err := direct.run(d); err != nil {
			t.Fatal(err)
		}
		graphed.set(t, d, id, pos)
		if err := g.Launch(); err != nil {
			t.Fatal(err)
		}
		a, b := readF32(t, d, direct.logits), readF32(t, d, graphed.logits)
		for i := range a {
			if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
				t.Fatalf("pos %d: logit %d: direct %v, graph %v", pos, i, a[i], b[i])
			}
		}
		next := make([]int32, 1)
		if err := d.Read(gpu.I32Bytes(next), graphed.next, 0); err != nil {
			t.Fatal(err)
		}
		id = int(next[0])
	}
}

func TestPeer(t *testing.T) {
	d := open(t)
	if ok, err := d.CanAccessPeer(d); !ok || err != nil {
		t.Fatalf("self access: %v, %v", ok, err)
	}
	p, err := Open(context.Background(), withKernels(Config{Ordinal: 1}))
	if err != nil {
		t.Skipf("no second GPU: %v", err)
	}
	defer p.Close()
	ok, err := d.CanAccessPeer(p)
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		if err := d.EnablePeerAccess(p); err != nil {
			t.Fatal(err)
		}
		if err := d.EnablePeerAccess(p); err != nil {
			t.Fatalf("second enable: %v", err)
		}
	}
	src := f32buf(t, p, []float32{1, 2, 3})
	if err := p.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	dst := alloc(t, d, gpu.F32, 3)
	if err := d.CopyPeer(dst.(*Buffer), src.(*Buffer), 3); err != nil {
		t.Fatal(err)
	}
	if got := readF32(t, d, dst); got[2] != 3 {
		t.Fatalf("got %v", got)
	}
}

// TestGEMMWarpgroup runs the Hopper wgmma product directly (MatMul would
// quietly take another kernel if it did not qualify) on prompt shapes with
// edges in every direction, against a float64 product of the same bf16
// values.
func TestGEMMWarpgroup(t *testing.T) {
	d := open(t)
	if d.info.Code != codeCubin {
		t.Skipf("%s: the wgmma product needs the sm_90a cubin", d.Name())
	}
	r := rand.New(rand.NewPCG(9, 9))
	for _, s := range [][3]int{{65, 128, 300}, {300, 640, 520}, {2048, 2048, 256}, {130, 64, 1}} {
		n, k, m := s[0], s[1], s[2]
		xv, wv := randF32(r, n*k, 1), randF32(r, m*k, 0.05)
		x := weights(t, d, gpu.BF16, gputest.Encode(gpu.BF16, xv)).(*Buffer)
		w := weights(t, d, gpu.BF16, gputest.Encode(gpu.BF16, wv)).(*Buffer)
		out := alloc(t, d, gpu.F32, n*m).(*Buffer)
		if err := d.enter("test"); err != nil {
			t.Fatal(err)
		}
		ok, err := d.gemmWG(out, x, w, n, k, m)
		d.leave()
		if !ok || err != nil {
			t.Fatalf("%dx%dx%d: wgmma product not run (ok %v): %v", n, k, m, ok, err)
		}
		got := readF32(t, d, out)
		want := make([]float32, n*m)
		for i := range n {
			for j := range m {
				var acc float64
				for e := range k {
					acc += float64(gpu.BF16ToF32(gpu.F32ToBF16(xv[i*k+e]))) * float64(gpu.BF16ToF32(gpu.F32ToBF16(wv[j*k+e])))
				}
				want[i*m+j] = float32(acc)
			}
		}
		if e := gputest.RelL2(got, want); !(e <= 1e-5) {
			t.Errorf("%dx%dx%d: relative L2 %.3g from the float64 product", n, k, m, e)
		}
		d.Free(x)
		d.Free(w)
		d.Free(out)
	}
}

// TestReadLater checks that a late read returns the buffer as the work
// issued before it left it, not as later work changes it, that at most
// gpu.MaxLateReads reads are pending, that a wait is used once, and that
// rows read late (ReadRowsLater), small by a kernel and large by copies
// into a slot grown for them, come in the order asked for.
func TestReadLater(t *testing.T) {
	d := open(t)
	x := f32buf(t, d, []float32{1, 2, 3, 4})
	y := f32buf(t, d, []float32{10, 20, 30, 40})
	var first, second [4]float32
	wait1, err := d.ReadLater(gpu.F32Bytes(first[:]), x, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Add(x, x, y, 4); err != nil { // issued after the read
		t.Fatal(err)
	}
	wait2, err := d.ReadLater(gpu.F32Bytes(second[:]), x, 0)
	if err != nil {
		t.Fatal(err)
	}
	var more []func() error
	for range gpu.MaxLateReads - 2 {
		w, err := d.ReadLater(make([]byte, 4), x, 0)
		if err != nil {
			t.Fatal(err)
		}
		more = append(more, w)
	}
	if _, err := d.ReadLater(make([]byte, 4), x, 0); err == nil {
		t.Errorf("read %d pending at once: no error", gpu.MaxLateReads+1)
	}
	for _, w := range append([]func() error{wait1, wait2}, more...) {
		if err := w(); err != nil {
			t.Fatal(err)
		}
	}
	if first != [4]float32{1, 2, 3, 4} || second != [4]float32{11, 22, 33, 44} {
		t.Fatalf("late reads %v and %v, want [1 2 3 4] and [11 22 33 44]", first, second)
	}
	if err := wait1(); err == nil {
		t.Error("a second wait: no error")
	}

	for _, width := range []int{5, 3000} { // 20 bytes a row, by a kernel; 12,000, copied
		const n = 6
		vals := make([]float32, n*width)
		for i := range vals {
			vals[i] = float32(i)
		}
		b := f32buf(t, d, vals)
		rows := []int32{4, 1, 2, 5} // 1 and 2 in one copy
		got := make([]float32, len(rows)*width)
		wait, err := d.ReadRowsLater(gpu.F32Bytes(got), b, rows, width)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Add(b, b, b, n*width); err != nil { // issued after the read
			t.Fatal(err)
		}
		if err := wait(); err != nil {
			t.Fatal(err)
		}
		for i, r := range rows {
			for j := range width {
				if want := float32(int(r)*width + j); got[i*width+j] != want {
					t.Fatalf("width %d: row %d (%d) element %d = %v, want %v", width, i, r, j, got[i*width+j], want)
				}
			}
		}
		if _, err := d.ReadRowsLater(gpu.F32Bytes(got), b, []int32{4, 1, 2, 6}, width); err == nil {
			t.Errorf("width %d: a row past the buffer: no error", width)
		}
		if _, err := d.ReadRowsLater(gpu.F32Bytes(got[1:]), b, rows, width); err == nil {
			t.Errorf("width %d: dst not whole rows: no error", width)
		}
	}
}

// TestKeptListsStayBounded draws into one buffer of tokens for a long run
// in which two rows always follow the draw before and two start new lists
// of 60 biases every other step: the entries the device keeps (its bound)
// stay within twice the live ones and adjust_compact's slack, where the
// dropped lists alone would reach 400 × 60, and every greedy draw is the
// host's.
func TestKeptListsStayBounded(t *testing.T) {
	d := open(t)
	const n, width, steps = 4, 256, 400
	out, err := d.Alloc(gpu.I32, n)
	if err != nil {
		t.Fatal(err)
	}
	logits, err := d.Alloc(gpu.F32, n*width)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	var sc gpu.SampleScratch
	var resolved []gpu.SampleRow
	var got []int32
	most := 0
	for k := range steps {
		v := make([]float32, n*width)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		if err := d.Write(logits, 0, gpu.F32Bytes(v)); err != nil {
			t.Fatal(err)
		}
		rows := make([]gpu.SampleRow, n)
		for r := range rows {
			rows[r].Penalties = gpu.Penalties{Presence: 0.5, Repetition: 1.3}
			if k > 0 && (r < 2 || k%2 == 1) {
				rows[r].Follows = true
				continue
			}
			for j := range 60 {
				rows[r].Adjust = append(rows[r].Adjust, gpu.LogitAdjust{ID: int32((j*37 + k + r) % width), Bias: float32(j%7) - 3})
			}
		}
		next, err := gpu.FollowRows(resolved, got, rows)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Sample(out, logits, n, width, rows); err != nil {
			t.Fatalf("step %d: %v", k, err)
		}
		got = make([]int32, n)
		if err := d.Read(gpu.I32Bytes(got), out, 0); err != nil {
			t.Fatal(err)
		}
		for r, row := range next {
			if want := gpu.SampleHost(slices.Clone(v[r*width:(r+1)*width]), row, &sc); got[r] != want {
				t.Fatalf("step %d, row %d: drew %d, the host %d", k, r, got[r], want)
			}
		}
		resolved = next
		l := d.drawn[out.(*Buffer)]
		live := 0
		for _, x := range l.live {
			live += x
		}
		if limit := 2*live + compactSlack + 2*60 + n; l.bound > limit {
			t.Fatalf("step %d: %d entries kept for %d live, more than %d", k, l.bound, live, limit)
		}
		most = max(most, l.bound)
	}
	t.Logf("%d draws: at most %d entries kept", steps, most)
}

// TestSmallCopies checks the copies between host and device in either
// form: copy_words over mapped pinned memory (whole 32-bit words up to
// smallCopyBytes) and the copy engine (the rest), through staging halves
// small enough that every few writes switch halves. Each write is followed
// by work that reads it, so a half reused before its copies ran would show
// in the sums.
func TestSmallCopies(t *testing.T) {
	d := openWith(t, Config{Ordinal: 0, Serial: *serial, StagingBytes: 64 << 10})
	rng := rand.New(rand.NewPCG(7, 7))

	// Writes of words at many sizes and offsets, two beyond a half (copied
	// a half at a time), mirrored on the host.
	const n = 100_000
	ib := alloc(t, d, gpu.I32, n)
	host := make([]int32, n)
	for _, c := range []struct{ off, k int }{{0, 1}, {5, 7}, {100, 1000}, {3000, 8191}, {20000, 8192}, {30000, 20000}, {1, 70000}, {n - 3, 3}} {
		v := make([]int32, c.k)
		for i := range v {
			v[i] = rng.Int32()
		}
		copy(host[c.off:], v)
		if err := d.Write(ib, c.off, gpu.I32Bytes(v)); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]int32, n)
	if err := d.Read(gpu.I32Bytes(got), ib, 0); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i] != host[i] {
			t.Fatalf("word %d read back %d, want %d", i, got[i], host[i])
		}
	}

	// 16-bit elements at odd offsets and lengths go by the copy engine.
	hb := alloc(t, d, gpu.BF16, 64)
	h16 := make([]uint16, 64)
	for _, c := range []struct{ off, k int }{{1, 3}, {4, 8}, {13, 50}} {
		v := make([]uint16, c.k)
		for i := range v {
			v[i] = uint16(rng.Uint32())
		}
		copy(h16[c.off:], v)
		if err := d.Write(hb, c.off, gpu.U16Bytes(v)); err != nil {
			t.Fatal(err)
		}
	}
	g16 := make([]uint16, 64)
	if err := d.Read(gpu.U16Bytes(g16), hb, 0); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(g16[1:], h16[1:]) {
		t.Fatalf("16-bit elements read back %v, want %v", g16[1:], h16[1:])
	}

	// 300 writes of 1 KiB into one buffer, each summed into acc before the
	// next: 256-byte slots of 32 KiB halves switch every 32 writes.
	const w = 256
	x := alloc(t, d, gpu.F32, w)
	acc := f32buf(t, d, make([]float32, w))
	want := make([]float64, w)
	for range 300 {
		v := make([]float32, w)
		for i := range v {
			v[i] = float32(rng.IntN(1000))
			want[i] += float64(v[i])
		}
		if err := d.Write(x, 0, gpu.F32Bytes(v)); err != nil {
			t.Fatal(err)
		}
		if err := d.Add(acc, acc, x, w); err != nil {
			t.Fatal(err)
		}
	}
	sum := make([]float32, w)
	if err := d.Read(gpu.F32Bytes(sum), acc, 0); err != nil {
		t.Fatal(err)
	}
	for i := range sum {
		if float64(sum[i]) != want[i] {
			t.Fatalf("sum[%d] = %v, want %v: a write was lost or overwritten", i, sum[i], want[i])
		}
	}

	// Late reads of words (copy_words) and of an odd 16-bit span (the copy
	// engine).
	var words [3]int32
	var halves [2]uint16
	wait1, err := d.ReadLater(gpu.I32Bytes(words[:]), ib, 30000)
	if err != nil {
		t.Fatal(err)
	}
	wait2, err := d.ReadLater(gpu.U16Bytes(halves[:]), hb, 13)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(wait1(), wait2()); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(words[:], host[30000:30003]) || !slices.Equal(halves[:], h16[13:15]) {
		t.Fatalf("late reads %v and %v, want %v and %v", words, halves, host[30000:30003], h16[13:15])
	}
}
