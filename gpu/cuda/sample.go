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
// every GPU from sm_80 on lends a block), which a whole-row draw takes for
// its 4,096 buckets' running sums and 4,096 tokens of a bucket.
const (
	sampleRows     = 64
	sampleRowBytes = 24
	sampleShmem    = 8192 + 4096*4 + 8192*8
)

// Sample implements gpu.Sampler: sample_rows, one block of 1024 threads
// (and sampleShmem bytes of shared memory) a row, up to 64 rows a launch.
// Every row is settled on the device, whole-row filters (top-p and min-p
// over the whole row, gpu.SampleRow.Whole) too: out never holds -1.
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
	adj, err := d.adjustLogits(b[0], logitsArg, width, rows)
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
		return d.launch(d.k("adjust_restore"), grid1(ceilDiv(adj.bound, 256)), grid1(256), 0, logitsArg, i32Arg(width), adj.entries(), adj.metaArg())
	}
	return nil
}

// adjEntryWords is the 32-bit words of AdjEntry in kernels/cuda/sample.cu
// (an AdjRow is four: follows and the three penalties). compactSlack is
// how many more dropped entries than live ones a buffer's lists hold
// before adjust_compact packs them.
const adjEntryWords, compactSlack = 6, 1024

// drawnLists are the logit adjustments of the last Sample into a buffer
// of tokens, kept on the device for draws that follow it
// (gpu.SampleRow.Follows).
type drawnLists struct {
	rows  int     // the rows of that draw
	e     *Buffer // its entries (AdjEntry)
	meta  *Buffer // the entries in use, then a flag a row (AdjEntry's meta)
	bound int     // at least the entries in use
	live  []int   // a row, at least its live entries
}

func (l *drawnLists) entries() arg {
	return arg{kind: argBuf, name: "adjust", buf: l.e, dt: gpu.I32, n: l.e.n}
}

func (l *drawnLists) metaArg() arg {
	return arg{kind: argBuf, name: "meta", buf: l.meta, dt: gpu.I32, n: l.meta.n}
}

// adjustLogits applies the rows' logit adjustments in place with
// adjust_apply, which keeps each logit it changes, and returns the lists,
// when there are any, for adjust_restore to put them back after the draw.
// The lists stay with out: rows that follow take theirs from the last
// Sample into out, updated on the device for the tokens out holds
// (adjust_follow, adjust_append); the others' come from the host.
func (d *Device) adjustLogits(out *Buffer, logits arg, width int, rows []gpu.SampleRow) (*drawnLists, error) {
	const op = "sample"
	l := d.drawn[out]
	pl, err := planLists(l, rows)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if !pl.adjusts {
		if l != nil {
			l.rows, l.bound, l.live = len(rows), 0, pl.live
		}
		return nil, nil
	}
	var host, rowp []byte
	for r, sr := range rows {
		for _, a := range sr.Adjust {
			host = binary.LittleEndian.AppendUint32(host, uint32(r))
			host = binary.LittleEndian.AppendUint32(host, uint32(a.ID))
			host = binary.LittleEndian.AppendUint32(host, uint32(b2i(a.Seen)))
			host = binary.LittleEndian.AppendUint32(host, uint32(a.Count))
			host = binary.LittleEndian.AppendUint32(host, math.Float32bits(a.Bias))
			host = binary.LittleEndian.AppendUint32(host, 0)
		}
		p := sr.Penalties
		rowp = binary.LittleEndian.AppendUint32(rowp, uint32(b2i(sr.Follows)))
		rowp = binary.LittleEndian.AppendUint32(rowp, math.Float32bits(p.Repetition))
		rowp = binary.LittleEndian.AppendUint32(rowp, math.Float32bits(p.Presence))
		rowp = binary.LittleEndian.AppendUint32(rowp, math.Float32bits(p.Frequency))
	}
	old, base, bound, h := pl.old, pl.base, pl.bound, len(host)/4/adjEntryWords
	l, err = d.keepLists(out, len(rows), old, max(old, bound))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	l.bound, l.live = bound, pl.live
	if bound == 0 {
		return nil, nil // nothing to change yet; the lists start empty
	}
	rb, err := d.scratchBuf("adjust rows", gpu.I32, len(rowp)/4)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if err := d.write(rb, 0, rowp); err != nil {
		return nil, fmt.Errorf("%s: logit adjustments: %w", op, err)
	}
	rowArg := arg{kind: argBuf, name: "rows", buf: rb, dt: gpu.I32, n: len(rowp) / 4}
	hostArg := rowArg // a placeholder the kernel does not read when h is 0
	if h > 0 {
		hb, err := d.scratchBuf("adjust host", gpu.I32, len(host)/4)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		if err := d.write(hb, 0, host); err != nil {
			return nil, fmt.Errorf("%s: logit adjustments: %w", op, err)
		}
		hostArg = arg{kind: argBuf, name: "host", buf: hb, dt: gpu.I32, n: len(host) / 4}
	}
	outArg := arg{kind: argBuf, name: "out", buf: out, dt: gpu.I32, n: len(rows)}
	if old > 0 {
		if err := d.launch(d.k("adjust_follow"), grid1(min(ceilDiv(old, 256), 1024)), grid1(256), 0,
			l.entries(), l.metaArg(), outArg, rowArg, i32Arg(old)); err != nil {
			return nil, err
		}
		if pl.compact {
			if err := d.launch(d.k("adjust_compact"), grid1(1), grid1(1024), 0,
				l.entries(), l.metaArg(), i32Arg(old)); err != nil {
				return nil, err
			}
		}
	}
	if err := d.launch(d.k("adjust_append"), grid1(1), grid1(256), 0,
		l.entries(), l.metaArg(), outArg, rowArg, i32Arg(len(rows)), hostArg, i32Arg(h), i32Arg(base)); err != nil {
		return nil, err
	}
	if err := d.launch(d.k("adjust_apply"), grid1(ceilDiv(bound, 256)), grid1(256), 0,
		logits, i32Arg(width), l.entries(), l.metaArg(), rowArg); err != nil {
		return nil, err
	}
	return l, nil
}

// listPlan is a draw's use of the lists kept with its buffer of tokens.
type listPlan struct {
	adjusts bool  // a row adjusts its logits or follows the last draw
	old     int   // the entries the last draw left (adjust_follow's bound)
	compact bool  // adjust_compact packs the live ones first
	base    int   // where adjust_append adds entries
	bound   int   // at least the entries after this draw
	live    []int // a row, at least its live entries after this draw
}

// planLists plans a draw of rows into a buffer whose kept lists are l (nil
// when there are none). A row's live entries are its list from the host,
// or, for a row that follows, the last draw's and one more where its
// penalties add the token drawn (adjust_append). Entries of rows that no
// longer follow are dropped where they lie: once they outnumber the live
// ones by compactSlack, adjust_compact packs the live ones, at most the
// following rows', at the front.
func planLists(l *drawnLists, rows []gpu.SampleRow) (listPlan, error) {
	p := listPlan{live: make([]int, len(rows))}
	follows, grows, carried, h := false, 0, 0, 0
	for r, sr := range rows {
		p.adjusts = p.adjusts || sr.Follows || len(sr.Adjust) > 0 || sr.Penalties.Active()
		h += len(sr.Adjust)
		p.live[r] = len(sr.Adjust)
		if !sr.Follows {
			continue
		}
		if l == nil || l.rows != len(rows) || len(l.live) != len(rows) {
			return p, fmt.Errorf("row %d follows a draw into out that is not known", r)
		}
		follows = true
		carried += l.live[r]
		p.live[r] = l.live[r]
		if sr.Penalties.Active() {
			grows++
			p.live[r]++
		}
	}
	if follows {
		p.old = l.bound
	}
	p.base, p.compact = p.old, follows && p.old > 2*carried+compactSlack
	if p.compact {
		p.base = carried
	}
	p.bound = p.base + grows + h
	return p, nil
}

// keepLists sizes out's kept lists for rows rows and size entries, the
// first keep of them carried over from the last draw, and returns them.
func (d *Device) keepLists(out *Buffer, rows, keep, size int) (*drawnLists, error) {
	l := d.drawn[out]
	if l == nil {
		l = &drawnLists{}
	}
	if l.meta == nil || l.meta.n < 1+rows {
		meta, err := d.alloc("adjust meta", gpu.I32, 1+max(rows, 64), true)
		if err != nil {
			return nil, err
		}
		if l.meta != nil {
			// Carried-over entries need the count, and the flags are clear.
			if err := d.copyD(meta, l.meta, 4); err != nil {
				return nil, err
			}
			d.freeNow(l.meta)
		}
		l.meta = meta
	}
	if l.e == nil || l.e.n < size*adjEntryWords {
		e, err := d.alloc("adjust entries", gpu.I32, max(2*size, 1024)*adjEntryWords, false)
		if err != nil {
			return nil, err
		}
		if l.e != nil {
			if keep > 0 {
				if err := d.copyD(e, l.e, keep*adjEntryWords*4); err != nil {
					return nil, err
				}
			}
			d.freeNow(l.e)
		}
		l.e = e
	}
	l.rows = rows
	d.drawn[out] = l
	return l, nil
}

// copyD copies the first n bytes of src to dst, in stream order.
func (d *Device) copyD(dst, src *Buffer, n int) error {
	return d.do(func() error {
		return d.drv.cuMemcpyDtoDAsync_v2.call(uintptr(dst.ptr), uintptr(src.ptr), uintptr(n), d.stream)
	})
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
