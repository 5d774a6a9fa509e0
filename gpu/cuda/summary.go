package cuda

import (
	"encoding/binary"
	"fmt"

	"github.com/troupe/troupe/gpu"
)

var _ gpu.Summarizer = (*Device)(nil)

// summaryPieces is SUMMARY_PIECES in kernels/cuda/sample.cu (gpu's
// logProbChunks), and summaryPartWords the 32-bit words of its
// SummaryPart: a float64 sum, a float32 maximum and padding, and
// gpu.MaxSummaryTop candidates of 64 bits.
const (
	summaryPieces    = 8
	summaryPartWords = 4 + 2*gpu.MaxSummaryTop
)

// Summarize implements gpu.Summarizer: summary_rows (kernels/cuda/sample.cu),
// a block of 1024 threads for each of a row's summaryPieces pieces (the
// host's, gpu.LogProbs), up to sampleRows rows a launch, the launch's row
// indexes passed by value. Each block leaves its piece's part in the
// summary.parts scratch and takes a ticket on the row's counter (of
// d.counters, which the block that merges sets back to 0), so it only
// queues work and records into graphs too.
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
	parts, err := d.scratchBuf("summary.parts", gpu.I32, sampleRows*summaryPieces*summaryPartWords)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	kern := d.k("summary_rows")
	for lo := 0; lo < len(rows); lo += sampleRows {
		cnt := min(sampleRows, len(rows)-lo)
		raw := make([]byte, sampleRows*4)
		for i, r := range rows[lo : lo+cnt] {
			binary.LittleEndian.PutUint32(raw[4*i:], uint32(r))
		}
		err := d.launch(kern, dim3{summaryPieces, uint32(cnt), 1}, grid1(1024), 0,
			arg{kind: argBuf, name: "out", buf: b[0], dt: gpu.F32, off: lo * w, n: cnt * w},
			bufArg("logits", b[1], gpu.F32, n*width),
			bufArg("ids", b[2], gpu.I32, n),
			i32Arg(width), i32Arg(top), rawArg(raw),
			bufArg("parts", parts, gpu.I32, cnt*summaryPieces*summaryPartWords),
			bufArg("cnt", d.counters, gpu.I32, cnt))
		if err != nil {
			return err
		}
	}
	return nil
}
