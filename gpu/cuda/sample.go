package cuda

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/troupe/troupe/gpu"
)

var _ gpu.Sampler = (*Device)(nil)

// sampleRows and sampleRowBytes are SAMPLE_ROWS and sizeof(SampleRow) in
// kernels/cuda/sample.cu: the draws of a launch travel by value.
// sampleShmem is its SAMPLE_SMEM, the dynamic shared memory of a block: an
// exponential table, a histogram and 8,192 candidates (88 KiB, within what
// every GPU from sm_80 on lends a block).
const (
	sampleRows     = 64
	sampleRowBytes = 24
	sampleShmem    = 8192 + 4096*4 + 8192*8
)

// Sample implements gpu.Sampler: sample_rows, one block of 1024 threads
// (and sampleShmem bytes of shared memory) a row, up to 64 rows a launch.
// A whole-row filter that keeps more than gpu.MaxSampleTopK tokens is left
// to the caller (-1).
func (d *Device) Sample(out, logits gpu.Buffer, n, width int, rows []gpu.SampleRow) error {
	const op = "sample"
	if err := d.enter(op); err != nil {
		return err
	}
	defer d.leave()
	b, err := d.bufs2(op, []string{"out", "logits"}, out, logits)
	if err != nil {
		return err
	}
	if n < 0 || width <= 0 || len(rows) != n {
		return fmt.Errorf("%s: %d rows of %d logits, %d draws", op, n, width, len(rows))
	}
	if err := checkLens(op, []string{"out", "logits"}, b, []int{n, n * width}); err != nil {
		return err
	}
	for r, sr := range rows {
		if err := sr.Validate(); err != nil {
			return fmt.Errorf("%s: row %d: %w", op, r, err)
		}
		if !sr.OnDevice(width) {
			return fmt.Errorf("%s: row %d: top_k %d of %d tokens: the device keeps at most %d", op, r, sr.TopK, width, gpu.MaxSampleTopK)
		}
	}
	kern := d.k("sample_rows")
	for lo := 0; lo < n; lo += sampleRows {
		cnt := min(sampleRows, n-lo)
		raw := make([]byte, sampleRows*sampleRowBytes)
		for i, sr := range rows[lo : lo+cnt] {
			p := raw[i*sampleRowBytes:]
			binary.LittleEndian.PutUint32(p[0:], math.Float32bits(sr.Temperature))
			binary.LittleEndian.PutUint32(p[4:], math.Float32bits(sr.TopP))
			binary.LittleEndian.PutUint32(p[8:], math.Float32bits(sr.MinP))
			binary.LittleEndian.PutUint32(p[12:], uint32(sr.TopK))
			binary.LittleEndian.PutUint64(p[16:], math.Float64bits(sr.U))
		}
		err := d.launch(kern, grid1(cnt), grid1(1024), sampleShmem,
			arg{kind: argBuf, name: "out", buf: b[0], dt: gpu.I32, off: lo, n: cnt},
			arg{kind: argBuf, name: "logits", buf: b[1], dt: gpu.F32, off: lo * width, n: cnt * width},
			i32Arg(width), rawArg(raw))
		if err != nil {
			return err
		}
	}
	return nil
}
