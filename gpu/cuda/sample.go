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
	logitsArg := arg{kind: argBuf, name: "logits", buf: b[1], dt: gpu.F32, n: n * width}
	adj, err := d.adjustLogits(logitsArg, width, rows)
	if err != nil {
		return err
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
	if adj != nil {
		return d.launch(d.k("adjust_restore"), grid1(ceilDiv(adj.n/5, 256)), grid1(256), 0, logitsArg, i32Arg(width), *adj, i32Arg(adj.n/5))
	}
	return nil
}

// adjustLogits applies the rows' logit adjustments (gpu.LogitAdjust) in
// place with adjust_apply, which keeps each logit it changes; the
// returned entries, when not nil, are for adjust_restore to put them back
// after the draw. Rows name each token at most once.
func (d *Device) adjustLogits(logits arg, width int, rows []gpu.SampleRow) (*arg, error) {
	var raw []byte
	for r, sr := range rows {
		for _, a := range sr.Adjust {
			raw = binary.LittleEndian.AppendUint32(raw, uint32(r))
			raw = binary.LittleEndian.AppendUint32(raw, uint32(a.ID))
			raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(a.Scale))
			raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(a.Add))
			raw = binary.LittleEndian.AppendUint32(raw, 0)
		}
	}
	if raw == nil {
		return nil, nil
	}
	words := len(raw) / 4
	e, err := d.scratchBuf("adjust", gpu.I32, words)
	if err != nil {
		return nil, fmt.Errorf("sample: %w", err)
	}
	if err := d.write(e, 0, raw); err != nil {
		return nil, fmt.Errorf("sample: logit adjustments: %w", err)
	}
	ea := arg{kind: argBuf, name: "adjust", buf: e, dt: gpu.I32, n: words}
	if err := d.launch(d.k("adjust_apply"), grid1(ceilDiv(words/5, 256)), grid1(256), 0, logits, i32Arg(width), ea, i32Arg(words/5)); err != nil {
		return nil, err
	}
	return &ea, nil
}
