package gpu

import "fmt"

// Optional capabilities, found by type assertion on a Device.

// Grapher is a device that can record the operations issued by a function
// once and replay them (a CUDA graph). Buffers used while recording must
// stay allocated while the Graph lives; their contents, rewritten with Write
// before Launch, are what changes between replays.
type Grapher interface {
	Capture(record func() error) (Graph, error)
}

// Graph is a recorded sequence of operations.
type Graph interface {
	Launch() error
	Close() error
}

// Argmaxer computes, on the device, out[r] = argmax_j logits[r*width+j]
// for n rows (ties to the lowest index); out is I32 [n].
type Argmaxer interface {
	Argmax(out, logits Buffer, n, width int) error
}

// LateReader is a device that can read a buffer back without waiting for
// the work issued after the read: ReadLater queues the copy behind the
// work issued so far and returns wait, which blocks until that copy is
// done, fills dst and returns the first error the work before it met.
// ReadRowsLater does the same for rows of b, each width elements, row r
// starting at element r·width, into consecutive pieces of dst: a step's
// logits rows, read with its chosen tokens. At most MaxLateReads reads may
// be pending; dst must not be used before wait returns. A host-side loop
// uses it to issue step t+1 before it reads step t's tokens, so the device
// never idles between steps.
type LateReader interface {
	ReadLater(dst []byte, b Buffer, off int) (wait func() error, err error)
	ReadRowsLater(dst []byte, b Buffer, rows []int32, width int) (wait func() error, err error)
}

// MaxLateReads is the most reads a LateReader holds pending: two steps'
// tokens and their logits rows.
const MaxLateReads = 4

// Sampler is a device that draws tokens from logits itself: out[r] (I32)
// is the token drawn from row r of logits (n rows of width) as rows[r]
// says (SampleRow, SampleHost: its penalties and list applied first, the
// logits left as they were), for rows a device takes
// (SampleRow.OnDevice): every such row, whole-row filters included.
type Sampler interface {
	Sample(out, logits Buffer, n, width int, rows []SampleRow) error
}

// MemoryReporter is a device that says how much memory it has free now and
// in all, in bytes: a GPU its own memory, a host lane the memory the
// operating system (and the process's memory limit, where one is set)
// leaves it. Servers size their KV caches by it.
type MemoryReporter interface {
	FreeMemory() (free, total int64, err error)
}

// RowBytes checks a ReadRowsLater of rows of width elements of type dt
// into n bytes and returns the bytes of one row.
func RowBytes(n int, rows []int32, width int, dt DType) (int, error) {
	if width <= 0 || len(rows) == 0 {
		return 0, fmt.Errorf("read rows: %d rows of width %d", len(rows), width)
	}
	row := width * dt.Size()
	if n != len(rows)*row {
		return 0, fmt.Errorf("read rows: %d bytes for %d rows of %d %s", n, len(rows), width, dt)
	}
	for _, r := range rows {
		if r < 0 {
			return 0, fmt.Errorf("read rows: row %d", r)
		}
	}
	return row, nil
}

// Summarizer is a device that takes log-probabilities from logits rows
// itself: out (F32, [len(rows), SummaryWidth(top)]) holds, for each row
// rows[j] of logits (width wide), what Summarize writes for the token
// ids[rows[j]] (I32, a token per row of logits) and the top most likely
// tokens, top at most MaxSummaryTop. Only a step's few values then come
// back, where its whole rows would.
type Summarizer interface {
	Summarize(out, logits, ids Buffer, rows []int32, width, top int) error
}
