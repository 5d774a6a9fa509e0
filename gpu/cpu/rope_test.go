package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/gputest"
	"github.com/troupe/troupe/gpu/ref"
)

// TestRoPESteps covers runs of consecutive positions, where RoPE steps its
// angles from one position to the next, against the float64 reference:
// long runs (several restarts), runs broken by a jump or a repeat, and
// large positions, over several threads.
func TestRoPESteps(t *testing.T) {
	var pos []int32
	for p := range 300 {
		pos = append(pos, int32(p))
	}
	pos = append(pos, 7, 7, 8)
	for p := 30000; p < 30200; p++ {
		pos = append(pos, int32(p))
	}
	const heads, hd = 3, 64
	rng := rand.New(rand.NewPCG(17, 18))
	x := randF32(rng, len(pos)*heads*hd)
	for _, kern := range lanes() {
		for _, threads := range []int{1, 3} {
			for _, theta := range []float64{10000, 500000} {
				t.Run(fmt.Sprintf("%s/threads=%d/theta=%g", kern.name, threads, theta), func(t *testing.T) {
					var outs [2][]float32
					for i, dev := range []gpu.Device{open(t, kern, threads), ref.New()} {
						buf := func(dt gpu.DType, raw []byte, n int) gpu.Buffer { return devBuf(t, dev, dt, raw, n) }
						xb := buf(gpu.F32, gpu.F32Bytes(x), len(x))
						f := gputest.InvFreq(hd, theta)
						if err := dev.RoPE(xb, buf(gpu.I32, gpu.I32Bytes(pos), len(pos)), buf(gpu.F32, gpu.F32Bytes(f), len(f)), len(pos), heads, hd); err != nil {
							t.Fatal(err)
						}
						outs[i] = make([]float32, len(x))
						if err := dev.Read(gpu.F32Bytes(outs[i]), xb, 0); err != nil {
							t.Fatal(err)
						}
					}
					if e := gputest.RelL2(outs[0], outs[1]); e > 1e-6 {
						t.Errorf("relative L2 error %.3g, want <= 1e-6", e)
					}
				})
			}
		}
	}
}
