package cuda

import (
	"encoding/binary"

	"github.com/troupe/troupe/gpu"
)

var _ gpu.Summarizer = (*Device)(nil)

// Summarize implements gpu.Summarizer: summary_rows (kernels/cuda/sample.cu),
// one block of 1024 threads (and sampleShmem bytes of shared memory) a
// row, up to sampleRows rows a launch, the launch's row indexes passed by
// value. It only queues work, so it records into graphs too.
func (d *Device) Summarize(out, logits, ids gpu.Buffer, rows []int32, width, top int) error {
	const op = "summarize"
	n, err := gpu.SummaryRows(op, rows, width, top)
	if err != nil {
		return err
	}
	if err := d.enter(op); err != nil {
		return err
	}
	defer d.leave()
	names := []string{"out", "logits", "ids"}
	b, err := d.bufs2(op, names, out, logits, ids)
	if err != nil {
		return err
	}
	for i, dt := range []gpu.DType{gpu.F32, gpu.F32, gpu.I32} {
		if err := wantDT(op, names[i], b[i], dt); err != nil {
			return err
		}
	}
	w := gpu.SummaryWidth(top)
	if err := checkLens(op, names, b, []int{len(rows) * w, n * width, n}); err != nil {
		return err
	}
	kern := d.k("summary_rows")
	for lo := 0; lo < len(rows); lo += sampleRows {
		cnt := min(sampleRows, len(rows)-lo)
		raw := make([]byte, sampleRows*4)
		for i, r := range rows[lo : lo+cnt] {
			binary.LittleEndian.PutUint32(raw[4*i:], uint32(r))
		}
		err := d.launch(kern, grid1(cnt), grid1(1024), sampleShmem,
			arg{kind: argBuf, name: "out", buf: b[0], dt: gpu.F32, off: lo * w, n: cnt * w},
			bufArg("logits", b[1], gpu.F32, n*width),
			bufArg("ids", b[2], gpu.I32, n),
			i32Arg(width), i32Arg(top), rawArg(raw))
		if err != nil {
			return err
		}
	}
	return nil
}
