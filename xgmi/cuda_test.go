//go:build cuda

package xgmi

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/cuda"
)

var kernelDir = flag.String("xgmi.kernels", "", "load kernel artifacts from this kernels/ directory instead of the embedded ones")

// openGPUs opens GPUs 0 and 1, or skips the test when there are fewer.
func openGPUs(t testing.TB) []*cuda.Device {
	t.Helper()
	var devs []*cuda.Device
	for i := range 2 {
		cfg := cuda.DefaultConfig()
		cfg.Ordinal = i
		if *kernelDir != "" {
			cfg.Kernels = os.DirFS(*kernelDir)
		}
		d, err := cuda.Open(context.Background(), cfg)
		if err != nil {
			for _, d := range devs {
				d.Close()
			}
			t.Skipf("the CUDA fabric needs 2 GPUs: GPU %d: %v", i, err)
		}
		devs = append(devs, d)
	}
	t.Cleanup(func() {
		for _, d := range devs {
			if err := d.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		}
	})
	return devs
}

func newDeviceComm(t testing.TB, devs []*cuda.Device, step int, cfg Config) *DeviceComm {
	t.Helper()
	fab, err := NewCUDAFabric(devs, CUDAFabricConfig{StepBytes: step})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, d := range devs {
			_ = d.Sync(context.Background())
		}
		fab.Close()
	})
	c, err := NewDeviceComm(fab, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// gpuInput fills n elements of dt with values of varied magnitude and
// sign, some zeros, negative zeros, infinities and subnormals.
func gpuInput(rng *rand.Rand, dt gpu.DType, n int) []byte {
	b := make([]byte, n*dt.Size())
	for i := range n {
		var v float32
		switch k := rng.IntN(64); {
		case k == 0:
			v = 0
		case k == 1:
			v = float32(math.Copysign(0, -1))
		case k == 2:
			v = float32(math.Inf(1 - 2*rng.IntN(2)))
		case k == 3:
			v = float32(rng.Float64()-0.5) * 0x1p-130 // f32 subnormal
		case k == 4:
			v = float32(rng.Float64()-0.5) * 0x1p-18 // f16 subnormal
		default:
			v = float32((rng.Float64()*2 - 1) * math.Ldexp(1, rng.IntN(20)-10))
		}
		switch dt {
		case gpu.F32:
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		case gpu.BF16:
			binary.LittleEndian.PutUint16(b[2*i:], gpu.F32ToBF16(v))
		case gpu.F16:
			binary.LittleEndian.PutUint16(b[2*i:], gpu.F32ToF16(v))
		}
	}
	return b
}

func isNaN(dt gpu.DType, b []byte) bool {
	if dt == gpu.F32 {
		return math.IsNaN(float64(math.Float32frombits(binary.LittleEndian.Uint32(b))))
	}
	h := binary.LittleEndian.Uint16(b)
	if dt == gpu.BF16 {
		return h&0x7fff > 0x7f80
	}
	return h&0x7fff > 0x7c00
}

// diff returns the first element where got and want differ (NaNs match
// any NaN: the GPU's NaN payloads are canonical), or -1.
func diff(dt gpu.DType, got, want []byte) int {
	es := dt.Size()
	for i := 0; i < len(want); i += es {
		if string(got[i:i+es]) != string(want[i:i+es]) && !(isNaN(dt, got[i:i+es]) && isNaN(dt, want[i:i+es])) {
			return i / es
		}
	}
	return -1
}

// sweepSizes: 8 elements up to maxBytes per rank, powers of two and their
// neighbours.
func sweepSizes(es, maxBytes int) []int {
	var out []int
	for p := 8; p*es <= maxBytes; p *= 2 {
		for _, n := range []int{p - 1, p, p + 1} {
			if n >= 8 && n*es <= maxBytes {
				out = append(out, n)
			}
		}
	}
	return out
}

type rankBufs struct{ src, dst gpu.Buffer }

func allocRanks(t testing.TB, devs []*cuda.Device, dt gpu.DType, n int, inPlace bool) []rankBufs {
	t.Helper()
	bufs := make([]rankBufs, len(devs))
	for r, d := range devs {
		src, err := d.Alloc(dt, n)
		if err != nil {
			t.Fatal(err)
		}
		dst := src
		if !inPlace {
			if dst, err = d.Alloc(dt, n); err != nil {
				t.Fatal(err)
			}
		}
		bufs[r] = rankBufs{src, dst}
	}
	return bufs
}

func freeRanks(devs []*cuda.Device, bufs []rankBufs) {
	for r, d := range devs {
		d.Free(bufs[r].src)
		if bufs[r].dst != bufs[r].src {
			d.Free(bufs[r].dst)
		}
	}
}

// checkDeviceAllReduce runs one all-reduce of n elements on every rank and
// compares every rank's result with SumReference, bit for bit.
func checkDeviceAllReduce(t *testing.T, c *DeviceComm, devs []*cuda.Device, dt gpu.DType, n int, inPlace bool, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, uint64(n)))
	bufs := allocRanks(t, devs, dt, n, inPlace)
	defer freeRanks(devs, bufs)
	ins := make([][]byte, len(devs))
	for r, d := range devs {
		ins[r] = gpuInput(rng, dt, n)
		if err := d.Write(bufs[r].src, 0, ins[r]); err != nil {
			t.Fatal(err)
		}
	}
	for r := range devs {
		if err := c.Rank(r).AllReduce(bufs[r].dst, bufs[r].src); err != nil {
			t.Fatal(err)
		}
	}
	want := make([]byte, n*dt.Size())
	if err := SumReference(dt, want, ins); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	for r, d := range devs {
		if err := d.Read(got, bufs[r].dst, 0); err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		if i := diff(dt, got, want); i >= 0 {
			es := dt.Size()
			t.Fatalf("%s n=%d algo=%s in-place=%v rank %d: element %d is %x, want %x (inputs %x %x)", dt, n, c.Algorithm(n*es), inPlace, r, i,
				got[i*es:(i+1)*es], want[i*es:(i+1)*es], ins[0][i*es:(i+1)*es], ins[1][i*es:(i+1)*es])
		}
	}
}

// TestCUDAAllReduceSweep: every size from 8 elements to 64 MiB per rank
// (powers of two and their odd neighbours), f32, bf16 and f16, one-shot,
// two-shot and auto, bit for bit against SumReference on every rank. The
// 4 MiB step makes the large messages take many kernels.
func TestCUDAAllReduceSweep(t *testing.T) {
	devs := openGPUs(t)
	maxBytes := 64 << 20
	if testing.Short() {
		maxBytes = 1 << 20
	}
	for _, algo := range []Algorithm{OneShot, TwoShot, LowLatency, Auto} {
		cfg := DefaultCUDAConfig()
		cfg.Algorithm = algo
		c := newDeviceComm(t, devs, 4<<20, cfg)
		for _, dt := range []gpu.DType{gpu.F32, gpu.BF16, gpu.F16} {
			t.Run(fmt.Sprintf("%s/%s", algo, dt), func(t *testing.T) {
				for i, n := range sweepSizes(dt.Size(), maxBytes) {
					if algo == Auto && n*dt.Size() > 4<<20 {
						continue // the forced runs cover these
					}
					checkDeviceAllReduce(t, c, devs, dt, n, i%3 == 1, uint64(i))
				}
			})
		}
	}
}

// TestCUDAAllReduceBackToBack issues many all-reduces of changing sizes
// and algorithms without waiting in between, so that the two window
// halves are reused while peers may still be one call behind.
func TestCUDAAllReduceBackToBack(t *testing.T) {
	devs := openGPUs(t)
	c := newDeviceComm(t, devs, 1<<20, Config{Algorithm: Auto, OneShotMaxBytes: 32 << 10, LowLatencyMaxBytes: 4 << 10})
	rng := rand.New(rand.NewPCG(7, 7))
	const calls = 64
	dt := gpu.BF16
	type call struct {
		n    int
		ins  [][]byte
		bufs []rankBufs
	}
	var cs []call
	for k := range calls {
		n := 8 + rng.IntN(1<<uint(4+k%16))
		cl := call{n: n, bufs: allocRanks(t, devs, dt, n, k%2 == 0)}
		for r, d := range devs {
			cl.ins = append(cl.ins, gpuInput(rng, dt, n))
			if err := d.Write(cl.bufs[r].src, 0, cl.ins[r]); err != nil {
				t.Fatal(err)
			}
		}
		cs = append(cs, cl)
	}
	for _, cl := range cs {
		for r := range devs {
			if err := c.Rank(r).AllReduce(cl.bufs[r].dst, cl.bufs[r].src); err != nil {
				t.Fatal(err)
			}
		}
	}
	for k, cl := range cs {
		want := make([]byte, cl.n*2)
		if err := SumReference(dt, want, cl.ins); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(want))
		for r, d := range devs {
			if err := d.Read(got, cl.bufs[r].dst, 0); err != nil {
				t.Fatal(err)
			}
			if i := diff(dt, got, want); i >= 0 {
				t.Fatalf("call %d (n=%d, %s) rank %d: element %d differs", k, cl.n, c.Algorithm(cl.n*2), r, i)
			}
		}
		freeRanks(devs, cl.bufs)
	}
}

// TestCUDAAllReduceGraph records a few all-reduces in a CUDA graph on each
// GPU and replays the graphs: every replay gives the oracle's bits.
func TestCUDAAllReduceGraph(t *testing.T) {
	devs := openGPUs(t)
	c := newDeviceComm(t, devs, 0, DefaultCUDAConfig())
	dt := gpu.BF16
	sizes := []int{8, 4097, 32 << 10, 1 << 20, 4 << 20} // low-latency, one-shot and two-shot
	rng := rand.New(rand.NewPCG(3, 3))
	var ins [][][]byte
	var bufs [][]rankBufs
	for _, n := range sizes {
		b := allocRanks(t, devs, dt, n, false)
		defer freeRanks(devs, b)
		var in [][]byte
		for r, d := range devs {
			in = append(in, gpuInput(rng, dt, n))
			if err := d.Write(b[r].src, 0, in[r]); err != nil {
				t.Fatal(err)
			}
		}
		ins, bufs = append(ins, in), append(bufs, b)
	}
	for _, d := range devs {
		if err := d.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	graphs := make([]gpu.Graph, len(devs))
	for r, d := range devs {
		g, err := d.Capture(func() error {
			for k := range sizes {
				if err := c.Rank(r).AllReduce(bufs[k][r].dst, bufs[k][r].src); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		graphs[r] = g
	}
	for rep := range 5 {
		for r, d := range devs {
			// Poison the outputs so that each replay must write them.
			for k, n := range sizes {
				if err := d.Write(bufs[k][r].dst, 0, make([]byte, n*2)); err != nil {
					t.Fatal(err)
				}
			}
			if err := graphs[r].Launch(); err != nil {
				t.Fatal(err)
			}
		}
		for k, n := range sizes {
			want := make([]byte, n*2)
			if err := SumReference(dt, want, ins[k]); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(want))
			for r, d := range devs {
				if err := d.Read(got, bufs[k][r].dst, 0); err != nil {
					t.Fatal(err)
				}
				if i := diff(dt, got, want); i >= 0 {
					t.Fatalf("replay %d, n=%d, rank %d: element %d differs", rep, n, r, i)
				}
			}
		}
	}
}

// TestCUDAAllGatherBroadcast checks all-gather and broadcast at sizes that
// are and are not multiples of 16 bytes.
func TestCUDAAllGatherBroadcast(t *testing.T) {
	devs := openGPUs(t)
	c := newDeviceComm(t, devs, 64<<10, DefaultCUDAConfig())
	rng := rand.New(rand.NewPCG(5, 5))
	for _, n := range []int{1, 7, 8, 1000, 4096, 40000, 100001} { // i32 elements; the largest takes steps
		var ins [][]byte
		var srcs, dsts []gpu.Buffer
		for _, d := range devs {
			in := make([]byte, 4*n)
			for i := range in {
				in[i] = byte(rng.IntN(256))
			}
			ins = append(ins, in)
			src, err := d.Alloc(gpu.I32, n)
			if err != nil {
				t.Fatal(err)
			}
			dst, err := d.Alloc(gpu.I32, 2*n)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Write(src, 0, in); err != nil {
				t.Fatal(err)
			}
			srcs, dsts = append(srcs, src), append(dsts, dst)
		}
		for r := range devs {
			if err := c.Rank(r).AllGather(dsts[r], srcs[r]); err != nil {
				t.Fatal(err)
			}
		}
		want := append(append([]byte(nil), ins[0]...), ins[1]...)
		for r, d := range devs {
			got := make([]byte, 8*n)
			if err := d.Read(got, dsts[r], 0); err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Fatalf("all-gather n=%d rank %d: wrong bytes", n, r)
			}
		}
		for root := range devs {
			for r := range devs {
				if err := c.Rank(r).Broadcast(srcs[r], root); err != nil {
					t.Fatal(err)
				}
			}
			for r, d := range devs {
				got := make([]byte, 4*n)
				if err := d.Read(got, srcs[r], 0); err != nil {
					t.Fatal(err)
				}
				if string(got) != string(ins[0]) {
					t.Fatalf("broadcast n=%d root %d rank %d: wrong bytes", n, root, r)
				}
			}
		}
		for r, d := range devs {
			d.Free(srcs[r])
			d.Free(dsts[r])
		}
	}
}

// TestCUDAMissingRank: when one rank never calls, the other's kernel gives
// up after the timeout and its Sync reports the collective fault.
func TestCUDAMissingRank(t *testing.T) {
	devs := openGPUs(t)
	fab, err := NewCUDAFabric(devs, CUDAFabricConfig{StepBytes: 1 << 20, Timeout: 200e6})
	if err != nil {
		t.Fatal(err)
	}
	defer fab.Close()
	c, err := NewDeviceComm(fab, DefaultCUDAConfig())
	if err != nil {
		t.Fatal(err)
	}
	b, err := devs[0].Alloc(gpu.F32, 1024)
	if err != nil {
		t.Fatal(err)
	}
	defer devs[0].Free(b)
	if err := c.Rank(0).AllReduce(b, b); err != nil {
		t.Fatal(err)
	}
	err = devs[0].Sync(context.Background())
	if err == nil {
		t.Fatal("sync: no error for a collective whose peer never came")
	}
	t.Logf("sync: %v", err)
}
