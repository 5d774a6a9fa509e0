package cuda

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/troupe/troupe/gpu"
)

// Group is a set of GPUs that address each other's memory and run
// collectives with the kernels of kernels/cuda/collective.cu: every rank
// owns a window and a signal pad in its own memory, and the kernels push
// data into the peers' windows and raise flags in their pads. No host
// synchronisation is involved: a collective is a kernel queued on the
// rank's stream, so it can be recorded in a graph (Capture) and replayed.
// xgmi's CUDA fabric is built on it; the algorithm policy (which kernel for
// which size) lives there.
//
// The ranks of a group made by NewGroup are GPUs of this process, joined
// by peer access. Those of a group made by NewIPCGroup live in separate
// processes of one host, one rank each, and map each other's windows and
// pads through CUDA IPC handles; this process can then issue only its own
// rank's collectives. The same kernels serve both (the two-shot all-reduce
// has a variant that gathers through the windows, since across processes
// a peer's output has no address here).
//
// Every rank must issue the same collectives in the same order with the
// same sizes. A rank that never arrives makes the others' kernels give up
// after Timeout and report a FaultError from their next Sync.
type Group struct {
	ranks     int
	slotBytes int
	blocks    int // most blocks of one collective: the smallest SM count, at most coMaxBlocks
	timeout   time.Duration
	ipc       bool         // the ranks live in separate processes
	local     []*groupRank // by rank; nil for a rank of another process
	owned     []*Buffer    // the windows and pads this process allocated
	mapped    []*Buffer    // the peers' windows and pads mapped by IPC
	closed    bool
}

// groupRank is a rank of this process.
type groupRank struct {
	dev  *Device
	args []byte // CommArgs: every window and pad as this rank's device addresses them
}

// GroupConfig sizes a Group.
type GroupConfig struct {
	// SlotBytes is the largest step of a collective, in bytes per rank; a
	// larger message runs in several steps. Each rank's window is
	// 2 × (ranks+1) × SlotBytes. 0 means 32 MiB.
	SlotBytes int
	// Timeout bounds a kernel's wait for its peers. 0 means 10 s.
	Timeout time.Duration
}

func (c GroupConfig) withDefaults() (GroupConfig, error) {
	if c.SlotBytes == 0 {
		c.SlotBytes = 32 << 20
	}
	if c.SlotBytes < 16 || c.SlotBytes%16 != 0 {
		return c, fmt.Errorf("slot of %d bytes, want a positive multiple of 16", c.SlotBytes)
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
	if c.Timeout < 0 {
		return c, fmt.Errorf("negative timeout %v", c.Timeout)
	}
	return c, nil
}

// Limits of collective.cu.
const (
	coMaxRanks  = 8
	coMaxBlocks = 256
	coThreads   = 512
	coFlagBytes = 32 << 10  // a pad's flags
	coLLBytes   = 256 << 10 // a pad's low-latency lines per epoch parity and sender
	coPadBytes  = coFlagBytes + 2*coMaxRanks*coLLBytes
	coArgsBytes = 8*coMaxRanks*2 + 8 + 4 + 4 + 8
)

// Collective algorithms of AllReduce.
const (
	// OneShot pushes each rank's whole input to every peer and reduces all
	// of them on every rank: one synchronisation.
	OneShot = 1
	// TwoShot reduce-scatters and all-gathers with remote writes: two
	// synchronisations, each rank moves about twice the message.
	TwoShot = 2
	// LowLatency pushes each rank's whole input to every peer as values
	// beside their epoch, which the peers read without a barrier: the
	// latency of small messages, at twice their bytes. A step carries
	// LowLatencyValues()·4 bytes.
	LowLatency = 3
)

// NewGroup enables peer access between every pair of devs (rank i is
// devs[i]) and allocates the windows and pads. The devices must be
// distinct, 2 to 8 of them.
func NewGroup(devs []*Device, cfg GroupConfig) (*Group, error) {
	if len(devs) < 2 || len(devs) > coMaxRanks {
		return nil, fmt.Errorf("cuda: group: %d devices, want 2 to %d", len(devs), coMaxRanks)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("cuda: group: %w", err)
	}
	g := &Group{ranks: len(devs), slotBytes: cfg.SlotBytes, blocks: coMaxBlocks, timeout: cfg.Timeout}
	for i, d := range devs {
		if d == nil {
			return nil, fmt.Errorf("cuda: group: device %d is nil", i)
		}
		for j := range i {
			if devs[j] == d {
				return nil, fmt.Errorf("cuda: group: device %d appears twice (ranks %d and %d)", d.info.Ordinal, j, i)
			}
		}
		g.blocks = min(g.blocks, max(d.info.SMs, 1))
	}
	for _, a := range devs {
		for _, b := range devs {
			if err := a.EnablePeerAccess(b); err != nil {
				return nil, fmt.Errorf("cuda: group: %w", err)
			}
		}
	}
	wins := make([]*Buffer, len(devs))
	pads := make([]*Buffer, len(devs))
	for i, d := range devs {
		if wins[i], pads[i], err = g.allocRank(d); err != nil {
			g.Close()
			return nil, fmt.Errorf("cuda: group: rank %d: %w", i, err)
		}
	}
	// With peer access every device addresses every window at the
	// address its owner does.
	for i, d := range devs {
		g.local = append(g.local, &groupRank{dev: d, args: g.commArgs(i, wins, pads)})
	}
	return g, nil
}

// allocRank allocates a rank's window and pad on d, zeroed: the pad must
// be zero before any peer's kernel writes into it.
func (g *Group) allocRank(d *Device) (win, pad *Buffer, err error) {
	winBytes := g.WindowBytes()
	if win, err = g.alloc(d, winBytes); err != nil {
		return nil, nil, fmt.Errorf("window of %d bytes: %w", winBytes, err)
	}
	g.owned = append(g.owned, win)
	if pad, err = g.alloc(d, coPadBytes); err != nil {
		return nil, nil, fmt.Errorf("signal pad: %w", err)
	}
	g.owned = append(g.owned, pad)
	if err := d.Sync(context.Background()); err != nil {
		return nil, nil, err
	}
	return win, pad, nil
}

func (g *Group) alloc(d *Device, bytes int) (*Buffer, error) {
	if err := d.enter("group alloc"); err != nil {
		return nil, err
	}
	defer d.leave()
	return d.alloc("group alloc", gpu.I32, bytes/4, true)
}

// Ranks is the number of ranks.
func (g *Group) Ranks() int { return g.ranks }

// Device is rank r's device, or nil when rank r lives in another process.
func (g *Group) Device(r int) *Device {
	if r < 0 || r >= len(g.local) || g.local[r] == nil {
		return nil
	}
	return g.local[r].dev
}

// IPC reports whether the ranks live in separate processes.
func (g *Group) IPC() bool { return g.ipc }

// SlotBytes is the largest step of a collective in bytes per rank.
func (g *Group) SlotBytes() int { return g.slotBytes }

// WindowBytes is the size of each rank's window.
func (g *Group) WindowBytes() int { return 2 * (g.ranks + 1) * g.slotBytes }

// Close unmaps the peers' memory and frees this process's windows and
// pads (after the work issued before it). Collectives still queued must
// have finished (Sync every device first); across processes the peers
// must be done with this process's memory too.
func (g *Group) Close() error {
	if g.closed {
		return nil
	}
	g.closed = true
	for _, b := range g.mapped {
		b.dev.Free(b)
	}
	for _, b := range g.owned {
		b.dev.Free(b)
	}
	g.mapped, g.owned, g.local = nil, nil, nil
	return nil
}

// commArgs is the CommArgs struct of collective.cu for rank r, given every
// rank's window and pad as rank r's device addresses them.
func (g *Group) commArgs(r int, wins, pads []*Buffer) []byte {
	b := make([]byte, coArgsBytes)
	for q := range g.ranks {
		binary.LittleEndian.PutUint64(b[8*q:], wins[q].ptr)
		binary.LittleEndian.PutUint64(b[8*coMaxRanks+8*q:], pads[q].ptr)
	}
	o := 16 * coMaxRanks
	binary.LittleEndian.PutUint64(b[o:], uint64(g.slotBytes))
	binary.LittleEndian.PutUint32(b[o+8:], uint32(r))
	binary.LittleEndian.PutUint32(b[o+12:], uint32(g.ranks))
	binary.LittleEndian.PutUint64(b[o+16:], uint64(g.timeout.Nanoseconds()))
	return b
}

func i64Arg(v int) arg {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(int64(v)))
	return rawArg(b[:])
}

// gridFor is the grid of a collective over chunks 16-byte chunks: one
// thread a chunk, as many blocks as that takes, at most one per SM (all
// blocks must be resident at once: they wait for each other). Every rank
// computes the same grid.
func (g *Group) gridFor(chunks int) dim3 {
	return grid1(max(1, min(g.blocks, ceilDiv(chunks, coThreads))))
}

func (g *Group) rank(op string, r int) (*groupRank, error) {
	if g.closed {
		return nil, fmt.Errorf("cuda: %s: group is closed", op)
	}
	if r < 0 || r >= g.ranks {
		return nil, fmt.Errorf("cuda: %s: rank %d outside %d ranks", op, r, g.ranks)
	}
	if g.local[r] == nil {
		return nil, fmt.Errorf("cuda: %s: rank %d lives in another process: it issues its own collectives", op, r)
	}
	return g.local[r], nil
}

// aligned checks that elements [off, off+n) of b lie in b and start on a
// 16-byte boundary.
func aligned(op, name string, b *Buffer, off, n int) error {
	if off < 0 || n < 0 || off+n > b.n {
		return fmt.Errorf("%s: %s: elements [%d, %d) outside its %d", op, name, off, off+n, b.n)
	}
	if (b.ptr+uint64(off*b.dt.Size()))%16 != 0 {
		return fmt.Errorf("%s: %s: element %d is not 16-byte aligned", op, name, off)
	}
	return nil
}

// operands resolves a collective's dst and src on d: they hold one type,
// and elements [dstOff, dstOff+dstN) of dst and [srcOff, srcOff+srcN) of
// src lie in them on 16-byte boundaries.
func operands(op string, d *Device, dst gpu.Buffer, dstOff, dstN int, src gpu.Buffer, srcOff, srcN int) (db, sb *Buffer, err error) {
	if db, err = d.buf(op, "dst", dst); err != nil {
		return nil, nil, err
	}
	if sb, err = d.buf(op, "src", src); err != nil {
		return nil, nil, err
	}
	if db.dt != sb.dt {
		return nil, nil, fmt.Errorf("%s: dst holds %s and src %s", op, db.dt, sb.dt)
	}
	if err := aligned(op, "dst", db, dstOff, dstN); err != nil {
		return nil, nil, err
	}
	if err := aligned(op, "src", sb, srcOff, srcN); err != nil {
		return nil, nil, err
	}
	return db, sb, nil
}

// AllReduce queues, on rank r's stream, the sum over the ranks of n
// elements of src (from element srcOff) into dst (from dstOff), with the
// algorithm algo (OneShot, TwoShot or LowLatency). dst and src hold the same float
// type (f32, bf16 or f16), start on 16-byte boundaries, and may be the
// same region. The summation order is xgmi's: every rank gets the same
// bits.
func (g *Group) AllReduce(r int, dst gpu.Buffer, dstOff int, src gpu.Buffer, srcOff, n int, algo int) error {
	const op = "cuda: all-reduce"
	gr, err := g.rank(op, r)
	if err != nil {
		return err
	}
	d := gr.dev
	if err := d.enter("all-reduce"); err != nil {
		return err
	}
	defer d.leave()
	db, sb, err := operands(op, d, dst, dstOff, n, src, srcOff, n)
	if err != nil {
		return err
	}
	if !db.dt.IsFloat() {
		return fmt.Errorf("%s: dst and src hold %s, want a float type", op, db.dt)
	}
	var name string
	switch algo {
	case OneShot:
		name = "allreduce_oneshot_" + suffix(db.dt)
	case TwoShot:
		name = "allreduce_twoshot_" + suffix(db.dt)
		if g.ipc {
			name = "allreduce_twoshot_ipc_" + suffix(db.dt)
		}
	case LowLatency:
		name = "allreduce_ll_" + suffix(db.dt)
	default:
		return fmt.Errorf("%s: unknown algorithm %d", op, algo)
	}
	k := d.k(name)
	es := db.dt.Size()
	step, unit := g.slotBytes/es, 16 // elements a step; bytes a thread
	if algo == LowLatency {
		step, unit = coLLBytes/2/es, 8
	}
	args := gr.args
	for off := 0; off < n; off += step {
		c := min(step, n-off)
		err := d.launch(k, g.gridFor(ceilDiv(c*es, unit)), dim3{coThreads, 1, 1}, 0,
			rawArg(args),
			arg{kind: argBuf, name: "dst", buf: db, off: dstOff + off, n: c},
			arg{kind: argBuf, name: "src", buf: sb, off: srcOff + off, n: c},
			i64Arg(c), devPtrArg(d.faultDev))
		if err != nil {
			return err
		}
	}
	return nil
}

// Residual norms fused with AllReduceNorm.
const (
	// PreNorm: r += sum; out = rmsnorm(r) · w.
	PreNorm = 1
	// PostNorm: r += rmsnorm(sum) · w.
	PostNorm = 2
)

// LowLatencyValues is the most f32 values a low-latency collective
// (AllReduceNorm, SumSquares2AllReduce: twice the sums) carries per rank.
// Its values travel beside their epoch, so a peer reads them without a
// barrier: the latency of small messages, at twice their bytes.
func (g *Group) LowLatencyValues() int { return coLLBytes / 8 }

// AllReduceNorm queues on rank r's stream the low-latency all-reduce of n
// rows of dim f32 values of src into dst (they may be the same buffer)
// fused with the residual norm after it (mode PreNorm or PostNorm; out is
// unused by PostNorm). w holds dim weights of any float type. The sum is
// AllReduce's, bit for bit. dim is even and n·dim at most
// LowLatencyValues.
func (g *Group) AllReduceNorm(r, mode int, dst, src, res, out, w gpu.Buffer, n, dim int, eps float32) error {
	const op = "cuda: all-reduce norm"
	gr, err := g.rank(op, r)
	if err != nil {
		return err
	}
	d := gr.dev
	if err := d.enter("all-reduce norm"); err != nil {
		return err
	}
	defer d.leave()
	if err := positive(op, n, dim); err != nil {
		return err
	}
	if dim%2 != 0 {
		return fmt.Errorf("%s: rows of %d values, want an even number", op, dim)
	}
	if n*dim > g.LowLatencyValues() {
		return fmt.Errorf("%s: %d × %d values exceed the %d of a low-latency collective", op, n, dim, g.LowLatencyValues())
	}
	if mode != PreNorm && mode != PostNorm {
		return fmt.Errorf("%s: unknown mode %d", op, mode)
	}
	names, bufs := []string{"dst", "src", "r", "w"}, []gpu.Buffer{dst, src, res, w}
	if mode == PreNorm {
		names, bufs = append(names, "out"), append(bufs, out)
	}
	b, err := d.normBufs(op, names, bufs, n, dim)
	if err != nil {
		return err
	}
	prefix := map[int]string{PreNorm: "allreduce_add_rmsnorm", PostNorm: "allreduce_rmsnorm_add"}[mode]
	k, err := d.typed(op, "w", prefix, b[3].dt)
	if err != nil {
		return err
	}
	rows := bufArg("r", b[2], gpu.F32, n*dim)
	args := []arg{rawArg(gr.args), bufArg("dst", b[0], gpu.F32, n*dim), bufArg("src", b[1], gpu.F32, n*dim), rows}
	if mode == PreNorm {
		args = append(args, bufArg("out", b[4], gpu.F32, n*dim))
	}
	args = append(args, bufArg("w", b[3], b[3].dt, dim), i32Arg(n), i32Arg(dim), f32Arg(eps), devPtrArg(d.faultDev))
	return d.launch(k, grid1(min(n, g.blocks)), dim3{coThreads, 1, 1}, 0, args...)
}

// SumSquares2AllReduce queues on rank r's stream gpu.ShardNormer's
// SumSquares2 and the low-latency all-reduce of its 2n sums in one kernel:
// out[i] is the sum over the ranks of the squares of their row i of a
// (width wa), out[n+i] of b's (width wb). 4n is at most LowLatencyValues.
func (g *Group) SumSquares2AllReduce(r int, out, a, b gpu.Buffer, n, wa, wb int) error {
	const op = "cuda: sum squares all-reduce"
	gr, err := g.rank(op, r)
	if err != nil {
		return err
	}
	d := gr.dev
	if err := d.enter("sum squares all-reduce"); err != nil {
		return err
	}
	defer d.leave()
	if err := positive(op, n, wa, wb); err != nil {
		return err
	}
	if 4*n > g.LowLatencyValues() {
		return fmt.Errorf("%s: %d sums exceed the %d values of a low-latency collective", op, 2*n, g.LowLatencyValues()/2)
	}
	bs, err := d.bufs2(op, []string{"out", "a", "b"}, out, a, b)
	if err != nil {
		return err
	}
	for i, nm := range []string{"out", "a", "b"} {
		if err := wantDT(op, nm, bs[i], gpu.F32); err != nil {
			return err
		}
	}
	return d.launch(d.k("sumsq2_allreduce_f32"), grid1(min(2*n, g.blocks)), dim3{coThreads, 1, 1}, 0,
		rawArg(gr.args), bufArg("out", bs[0], gpu.F32, 2*n), bufArg("a", bs[1], gpu.F32, n*wa), bufArg("b", bs[2], gpu.F32, n*wb),
		i32Arg(n), i32Arg(wa), i32Arg(wb), devPtrArg(d.faultDev))
}

// AllGather queues on rank r's stream the concatenation, in rank order, of
// every rank's src (bytes elements of any type from element srcOff) into
// dst (from element dstOff): dst receives Ranks() × n elements.
func (g *Group) AllGather(r int, dst gpu.Buffer, dstOff int, src gpu.Buffer, srcOff, n int) error {
	const op = "cuda: all-gather"
	gr, err := g.rank(op, r)
	if err != nil {
		return err
	}
	d := gr.dev
	if err := d.enter("all-gather"); err != nil {
		return err
	}
	defer d.leave()
	nr := g.ranks
	db, sb, err := operands(op, d, dst, dstOff, nr*n, src, srcOff, n)
	if err != nil {
		return err
	}
	es := db.dt.Size()
	step := g.slotBytes / es
	args := gr.args
	// A message larger than a slot runs in steps; rank q's part of dst
	// starts n elements after rank q-1's.
	for off := 0; off < n; off += step {
		c := min(step, n-off)
		err := d.launch(d.k("allgather_u8"), g.gridFor(ceilDiv(c*es, 16)), dim3{coThreads, 1, 1}, 0,
			rawArg(args),
			arg{kind: argBuf, name: "dst", buf: db, off: dstOff + off, n: (nr-1)*n + c},
			arg{kind: argBuf, name: "src", buf: sb, off: srcOff + off, n: c},
			i64Arg(c*es), i64Arg(n*es), devPtrArg(d.faultDev))
		if err != nil {
			return err
		}
	}
	return nil
}

// Broadcast queues on rank r's stream the copy of root's n elements of buf
// (from element off) into every other rank's buf.
func (g *Group) Broadcast(r int, buf gpu.Buffer, off, n, root int) error {
	const op = "cuda: broadcast"
	gr, err := g.rank(op, r)
	if err != nil {
		return err
	}
	d := gr.dev
	if root < 0 || root >= g.ranks {
		return fmt.Errorf("%s: root %d outside %d ranks", op, root, g.ranks)
	}
	if err := d.enter("broadcast"); err != nil {
		return err
	}
	defer d.leave()
	b, err := d.buf(op, "buf", buf)
	if err != nil {
		return err
	}
	if err := aligned(op, "buf", b, off, n); err != nil {
		return err
	}
	es := b.dt.Size()
	step := g.slotBytes / es
	args := gr.args
	for o := 0; o < n; o += step {
		c := min(step, n-o)
		err := d.launch(d.k("broadcast_u8"), g.gridFor(ceilDiv(c*es, 16)), dim3{coThreads, 1, 1}, 0,
			rawArg(args), arg{kind: argBuf, name: "buf", buf: b, off: off + o, n: c},
			i64Arg(c*es), i32Arg(root), devPtrArg(d.faultDev))
		if err != nil {
			return err
		}
	}
	return nil
}
