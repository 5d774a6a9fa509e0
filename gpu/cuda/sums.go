package cuda

import "github.com/troupe/troupe/gpu"

// A product whose k is split writes one part per split; the parts' sum,
// in split order, is the product. Rather than a kernel of its own that
// sums them (splitk_sum), a gated MLP's activation (silu_rows, reading the
// gate|up product) and the preparation of a packed q|k|v product
// (qkv_prep_rows) sum them where they read them. Whatever else comes
// first, an operation of any other kind, a copy, a launch or the end of a
// recording, has splitk_sum sum them first, so the deferral is never
// observable. (A norm reading the parts was slower: its one block a row
// leaves too few blocks to read 16 parts of 64 rows.)

// pendingSum is a split product whose parts (splits of count f32 values
// each, in part) are not yet summed into out.
type pendingSum struct {
	out, part     *Buffer
	count, splits int
}

// readsSums says whether operation op may read a pending product's parts
// (through takeSum); entering any other operation sums them first.
func readsSums(op string) bool {
	return op == "silu matmul" || op == "prepare qkv"
}

// takeSum returns what a kernel reading count values of x should read: the
// pending parts of the product x and their number, or x itself and 1
// after summing any other pending product.
func (d *Device) takeSum(x *Buffer, count int) (*Buffer, int, error) {
	if p := d.sum; p.part != nil && p.out.ptr == x.ptr && p.count == count {
		d.sum = pendingSum{}
		return p.part, p.splits, nil
	}
	return x, 1, d.flushSum()
}

// flushSum sums the pending product's parts into it with splitk_sum.
func (d *Device) flushSum() error {
	p := d.sum
	if p.part == nil {
		return nil
	}
	d.sum = pendingSum{}
	return d.launch(d.k("splitk_sum"), grid1(ceilDiv(ceilDiv(p.count, 4), 256)), grid1(256), 0,
		bufArg("out", p.out, gpu.F32, p.count), bufArg("part", p.part, gpu.F32, p.splits*p.count),
		i64Arg(p.count), i32Arg(p.splits))
}

// roundsX says whether a product of n rows over k with 16-bit weights
// rounds x to their type first (gemm): more rows than a GEMV takes and
// than the exact decode-batch product takes in f32.
func roundsX(n, k int) bool { return n > 8 && k%8 == 0 && !exactSkinny(n, k) }
