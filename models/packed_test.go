package models_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/cpu"
	"github.com/troupe/troupe/gpu/host"
	"github.com/troupe/troupe/models"
)

// packedCPU is the CPU lane with the capabilities the CUDA lane's decode
// steps take from a device: weights packed into one buffer and viewed in
// part (gpu.Packer), one token's gated activation formed by its gate|up
// product (gpu.GatedMatVecer) and OLMo 2's post-norms formed by the product
// after them (gpu.PostNormMatVecer), each composed of the CPU lane's own
// operations. Its lane runs the models' wiring of those paths in every
// test run, with no GPU.
type packedCPU struct {
	*cpu.Device
	postNorms *atomic.Int64 // PostNormMatVec calls
}

func openPackedCPU(t testing.TB) gpu.Device {
	d, err := cpu.New(cpu.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	return packedCPU{Device: d, postNorms: new(atomic.Int64)}
}

func init() {
	extraLanes = append(extraLanes, lane{name: "cpu-packed", open: openPackedCPU})
}

// Slice implements gpu.Slicer: a view sharing b's memory, starting at a
// 16-byte boundary as the CUDA lane's do.
func (d packedCPU) Slice(b gpu.Buffer, off, n int) (gpu.Buffer, error) {
	hb, err := host.Of("slice", b)
	if err != nil {
		return nil, err
	}
	if off < 0 || n < 0 || off+n > hb.Len() {
		return nil, fmt.Errorf("slice: [%d, %d) outside %d elements", off, off+n, hb.Len())
	}
	sz := hb.DType().Size()
	if off*sz%16 != 0 {
		return nil, fmt.Errorf("slice: element %d starts %d bytes in, not a multiple of 16 (as on CUDA)", off, off*sz)
	}
	return host.Memory{}.Weights(hb.DType(), hb.Bytes()[off*sz:(off+n)*sz])
}

// Pack implements gpu.Packer.
func (d packedCPU) Pack(dt gpu.DType, parts ...[]byte) (gpu.Buffer, error) {
	var all []byte
	for _, p := range parts {
		all = append(all, p...)
	}
	b, err := d.Alloc(dt, len(all)/dt.Size())
	if err != nil {
		return nil, err
	}
	return b, d.Write(b, 0, all)
}

// GatedMatVec implements gpu.GatedMatVecer: MatMul, then SiLUMul.
func (d packedCPU) GatedMatVec(out, x, w gpu.Buffer, k, f int) error {
	gu, err := d.Alloc(gpu.F32, 2*f)
	if err != nil {
		return err
	}
	defer d.Free(gu)
	if err := d.MatMul(gu, x, w, 1, k, 2*f); err != nil {
		return err
	}
	g, err := d.Slice(gu, 0, f)
	if err != nil {
		return err
	}
	u, err := d.Slice(gu, f, f)
	if err != nil {
		return err
	}
	return d.SiLUMul(out, g, u, f)
}

// PostNormMatVec implements gpu.PostNormMatVecer: RMSNorm and Add, as the
// CPU lane's post-norm runs, then the product.
func (d packedCPU) PostNormMatVec(out, rOut, r, y, wn, w gpu.Buffer, k, m int, glu bool, eps float32) error {
	d.postNorms.Add(1)
	t, err := d.Alloc(gpu.F32, k)
	if err != nil {
		return err
	}
	defer d.Free(t)
	if err := d.RMSNorm(t, y, wn, 1, k, eps); err != nil {
		return err
	}
	if err := d.Add(rOut, r, t, k); err != nil {
		return err
	}
	if glu {
		return d.GatedMatVec(out, rOut, w, k, m)
	}
	return d.MatMul(out, rOut, w, 1, k, m)
}

// TestPostNormsFused decodes the demo model (OLMo 2) on the packed CPU
// lane, whose one-token steps form every post-norm but the last layer's in
// the next product, and on the plain CPU lane: the same logits at every
// step, bit for bit, and the fused path taken 2·(layers−1) times a step.
func TestPostNormsFused(t *testing.T) {
	b := openDemo(t)
	ctx := context.Background()
	logits := func(dev gpu.Device) [][]float32 {
		m, err := models.Load(b.Config, b.Checkpoint, dev, models.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		seq, err := m.NewSequence(16)
		if err != nil {
			t.Fatal(err)
		}
		defer seq.Close()
		out, err := seq.Feed(ctx, []int32{1, 2, 3, 4}, false)
		if err != nil {
			t.Fatal(err)
		}
		all := [][]float32{slices.Clone(out)}
		for i := range 4 {
			if out, err = seq.Feed(ctx, []int32{int32(argmax(out))}, false); err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			all = append(all, slices.Clone(out))
		}
		return all
	}
	plain, fused := openCPU(t), openPackedCPU(t).(packedCPU)
	defer plain.Close()
	defer fused.Close()
	want, got := logits(plain), logits(fused)
	if n, per := fused.postNorms.Load(), int64(2*(b.Config.Layers-1)); n != 4*per {
		t.Errorf("%d fused post-norms over 4 one-token steps, want %d", n, 4*per)
	}
	for i := range want {
		for j := range want[i] {
			if got[i][j] != want[i][j] {
				t.Fatalf("step %d: logit %d is %g fused, %g plain", i, j, got[i][j], want[i][j])
			}
		}
	}
}
