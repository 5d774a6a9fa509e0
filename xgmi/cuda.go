package xgmi

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/cuda"
)

// CUDAFabric joins GPUs through peer memory: every rank's window and
// signal pad live in its GPU's memory, the peers map them, and the
// collectives are kernels (kernels/cuda/collective.cu) that push data into
// the peers' windows and wait on device-side flags. Nothing waits on the
// host, so the collectives can be recorded in CUDA graphs.
//
// NewCUDAFabric joins the GPUs of one process by peer access.
// NewIPCFabric joins GPUs of separate processes of one host, one rank per
// process, through CUDA IPC handles of the windows and pads that the
// processes give each other through an Exchange (the bus, between the
// actors that own the devices); a process then issues only its own
// rank's collectives. Both run the same kernels. AMD's XGMI fits the same
// shape through HIP.
type CUDAFabric struct {
	g  *cuda.Group
	ex Exchange // the ranks of other processes; nil in one process
}

// CUDAFabricConfig sizes a CUDA fabric.
type CUDAFabricConfig struct {
	// StepBytes is the largest step of a collective in bytes per rank
	// (larger messages run in several kernels); each window is
	// 2 × (ranks+1) × StepBytes. 0 means 32 MiB. Every rank of an IPC
	// fabric must use the same.
	StepBytes int
	// Timeout bounds a kernel's wait for a missing peer; the wait then
	// gives up and the device's next Sync fails. 0 means 10 s.
	Timeout time.Duration
}

func (c CUDAFabricConfig) group() cuda.GroupConfig {
	return cuda.GroupConfig{SlotBytes: c.StepBytes, Timeout: c.Timeout}
}

// NewCUDAFabric enables peer access between every pair of devs (rank i is
// devs[i]) and allocates the windows.
func NewCUDAFabric(devs []*cuda.Device, cfg CUDAFabricConfig) (*CUDAFabric, error) {
	g, err := cuda.NewGroup(devs, cfg.group())
	if err != nil {
		return nil, fmt.Errorf("xgmi: cuda fabric: %w", err)
	}
	return &CUDAFabric{g: g}, nil
}

// NewIPCFabric makes dev, this process's GPU, rank ex.Rank() of a fabric
// of ex.Ranks() ranks whose other ranks are GPUs of other processes of
// this host, each calling NewIPCFabric with its own GPU, its own end of
// the exchange and the same cfg. The ranks allocate their windows, give
// each other their IPC handles through ex and map the peers' (two
// AllGathers); when a rank fails, or the ranks disagree, every rank that
// takes part returns the same error, and a rank that never comes makes
// the others fail when ctx ends.
//
// The fabric's DeviceComm issues only rank ex.Rank()'s collectives, from
// the goroutine that owns dev; every rank must choose the same algorithm
// for each call, so give every rank the same Config. Shutdown is the way
// out: it waits until no peer uses this rank's memory before freeing it.
func NewIPCFabric(ctx context.Context, dev *cuda.Device, ex Exchange, cfg CUDAFabricConfig) (*CUDAFabric, error) {
	if ex == nil {
		return nil, fmt.Errorf("xgmi: ipc fabric: no exchange")
	}
	g, err := cuda.NewIPCGroup(ctx, dev, ex.Rank(), ex.Ranks(), cfg.group(), ex.AllGather)
	if err != nil {
		return nil, fmt.Errorf("xgmi: ipc fabric: %w", err)
	}
	return &CUDAFabric{g: g, ex: ex}, nil
}

// Ranks implements Fabric.
func (f *CUDAFabric) Ranks() int { return f.g.Ranks() }

// WindowBytes implements Fabric.
func (f *CUDAFabric) WindowBytes() int { return f.g.WindowBytes() }

// Link implements Fabric: every pair reaches each other's memory directly
// (peer access in one process, IPC-mapped peer memory across processes;
// both constructors refuse GPUs without it).
func (f *CUDAFabric) Link(a, b int) Link {
	if a == b {
		return Link{A: a, B: b, Kind: LinkSelf}
	}
	return Link{A: a, B: b, Kind: LinkPeer}
}

// Device is rank r's GPU, or nil when rank r lives in another process.
func (f *CUDAFabric) Device(r int) *cuda.Device { return f.g.Device(r) }

// IPC reports whether the ranks live in separate processes.
func (f *CUDAFabric) IPC() bool { return f.ex != nil }

// Close implements Fabric. Collectives still queued must have finished
// (Sync every device first), and, across processes, the peers must be
// done with this rank's memory: Shutdown sees to both.
func (f *CUDAFabric) Close() error { return f.g.Close() }

// Shutdown waits for the collectives queued on this process's GPUs and,
// across processes, for every rank to reach Shutdown too (one AllGather
// on the exchange), then closes the fabric. It closes it even when the
// wait fails (a rank that is gone no longer uses the memory) and returns
// the wait's error.
func (f *CUDAFabric) Shutdown(ctx context.Context) error {
	var errs []error
	for r := range f.g.Ranks() {
		if d := f.g.Device(r); d != nil {
			if err := d.Sync(ctx); err != nil {
				errs = append(errs, fmt.Errorf("xgmi: shutdown: rank %d: %w", r, err))
			}
		}
	}
	if f.ex != nil {
		if _, err := f.ex.AllGather(ctx, nil); err != nil {
			errs = append(errs, fmt.Errorf("xgmi: shutdown: wait for the peers: %w", err))
		}
	}
	errs = append(errs, f.Close())
	return errors.Join(errs...)
}

// DefaultCUDAConfig chooses by size with the crossover measured on two
// H200s over NVLink (docs/xgmi.md).
func DefaultCUDAConfig() Config {
	return Config{Algorithm: Auto, OneShotMaxBytes: 4 << 20, LowLatencyMaxBytes: 128 << 10}
}

// DeviceComm is a communicator whose collectives run on the GPUs, on
// device buffers: each call queues kernels on the rank's stream and
// returns without waiting. Every rank must issue the same collectives in
// the same order with the same sizes; a rank's calls come from one
// goroutine at a time (its device's owner). Over an IPC fabric only this
// process's rank issues calls; the others' fail.
type DeviceComm struct {
	cfg   Config
	fab   *CUDAFabric
	ranks []*DeviceRank
}

// NewDeviceComm returns the communicator of fab's ranks.
func NewDeviceComm(fab *CUDAFabric, cfg Config) (*DeviceComm, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &DeviceComm{cfg: cfg, fab: fab}
	for r := range fab.Ranks() {
		c.ranks = append(c.ranks, &DeviceRank{comm: c, id: r})
	}
	return c, nil
}

// Size is the number of ranks.
func (c *DeviceComm) Size() int { return len(c.ranks) }

// Rank returns rank r's handle.
func (c *DeviceComm) Rank(r int) *DeviceRank { return c.ranks[r] }

// Algorithm is the algorithm AllReduce uses for bytes per rank.
func (c *DeviceComm) Algorithm(bytes int) Algorithm { return c.cfg.choose(bytes) }

// DeviceRank is one rank's handle on a DeviceComm.
type DeviceRank struct {
	comm *DeviceComm
	id   int
}

// ID is the rank's index.
func (r *DeviceRank) ID() int { return r.id }

// Device is the rank's GPU, or nil when the rank lives in another process.
func (r *DeviceRank) Device() *cuda.Device { return r.comm.fab.Device(r.id) }

// AllReduce queues the sum over the ranks of src into dst (the same
// length and float type; they may be the same buffer), in the order
// SumReference defines: every rank gets the same bits whichever algorithm
// runs. Both start on 16-byte boundaries.
func (r *DeviceRank) AllReduce(dst, src gpu.Buffer) error {
	if dst == nil || src == nil {
		return fmt.Errorf("xgmi: rank %d: all-reduce: nil buffer", r.id)
	}
	if dst.Len() != src.Len() {
		return fmt.Errorf("xgmi: rank %d: all-reduce: dst has %d elements and src %d", r.id, dst.Len(), src.Len())
	}
	return r.AllReduceN(dst, src, src.Len())
}

// AllReduceN is AllReduce over the first n elements.
func (r *DeviceRank) AllReduceN(dst, src gpu.Buffer, n int) error {
	if src == nil {
		return fmt.Errorf("xgmi: rank %d: all-reduce: nil buffer", r.id)
	}
	if err := checkReducible(src.DType()); err != nil {
		return fmt.Errorf("xgmi: rank %d: all-reduce: %w", r.id, err)
	}
	algo := map[Algorithm]int{OneShot: cuda.OneShot, TwoShot: cuda.TwoShot, LowLatency: cuda.LowLatency}[r.comm.cfg.choose(n*src.DType().Size())]
	if err := r.comm.fab.g.AllReduce(r.id, dst, 0, src, 0, n, algo); err != nil {
		return fmt.Errorf("xgmi: rank %d: %w", r.id, err)
	}
	return nil
}

// AllGather queues the concatenation of every rank's src, in rank order,
// into dst (Size() times src's length, the same type).
func (r *DeviceRank) AllGather(dst, src gpu.Buffer) error {
	if dst == nil || src == nil {
		return fmt.Errorf("xgmi: rank %d: all-gather: nil buffer", r.id)
	}
	if dst.Len() != r.comm.Size()*src.Len() {
		return fmt.Errorf("xgmi: rank %d: all-gather: %d elements out for %d in over %d ranks", r.id, dst.Len(), src.Len(), r.comm.Size())
	}
	if err := r.comm.fab.g.AllGather(r.id, dst, 0, src, 0, src.Len()); err != nil {
		return fmt.Errorf("xgmi: rank %d: %w", r.id, err)
	}
	return nil
}

// Broadcast queues the copy of root's buf into every other rank's buf.
func (r *DeviceRank) Broadcast(buf gpu.Buffer, root int) error {
	if buf == nil {
		return fmt.Errorf("xgmi: rank %d: broadcast: nil buffer", r.id)
	}
	if err := r.comm.fab.g.Broadcast(r.id, buf, 0, buf.Len(), root); err != nil {
		return fmt.Errorf("xgmi: rank %d: %w", r.id, err)
	}
	return nil
}

// AllReduceRMSNormAdd queues the all-reduce of n rows of dim f32 values of
// o, in place, and adds their norm to the residual res: res += rmsnorm(o)
// · w (a post-norm block's residual after a row-parallel product). Where
// AllReduce would not run in two shots, one kernel does both; otherwise it
// queues AllReduceN and the device's RMSNormAdd. The fused kernel's values
// travel beside their epoch (low-latency lines, twice the bytes), so the
// ranks read each other's without a barrier.
func (r *DeviceRank) AllReduceRMSNormAdd(res, o, w gpu.Buffer, n, dim int, eps float32) error {
	return r.reduceNorm(cuda.PostNorm, nil, res, o, w, n, dim, eps)
}

// AllReduceAddRMSNorm queues the all-reduce of n rows of dim f32 values of
// o, in place, adds them to the residual res and normalises it into out:
// res += o; out = rmsnorm(res) · w (a pre-norm block's). It fuses as
// AllReduceRMSNormAdd does.
func (r *DeviceRank) AllReduceAddRMSNorm(out, res, o, w gpu.Buffer, n, dim int, eps float32) error {
	return r.reduceNorm(cuda.PreNorm, out, res, o, w, n, dim, eps)
}

func (r *DeviceRank) reduceNorm(mode int, out, res, o, w gpu.Buffer, n, dim int, eps float32) error {
	if r.fused(n, dim) {
		if err := r.comm.fab.g.AllReduceNorm(r.id, mode, o, o, res, out, w, n, dim, eps); err != nil {
			return fmt.Errorf("xgmi: rank %d: %w", r.id, err)
		}
		return nil
	}
	d, err := r.device()
	if err != nil {
		return err
	}
	if err := r.AllReduceN(o, o, n*dim); err != nil {
		return err
	}
	if mode == cuda.PreNorm {
		return d.AddRMSNorm(out, res, o, w, n, dim, eps)
	}
	return d.RMSNormAdd(res, o, w, n, dim, eps)
}

// SumSquares2 queues gpu.ShardNormer's SumSquares2 of the rank's slices a
// and b summed over the ranks: out[i] is the sum of the squares of row i of
// every rank's a (width wa), out[n+i] of b (width wb). One kernel does
// both where AllReduce would not run in two shots.
func (r *DeviceRank) SumSquares2(out, a, b gpu.Buffer, n, wa, wb int) error {
	if r.comm.cfg.choose(2*n*4) != TwoShot && 4*n <= r.comm.fab.g.LowLatencyValues() {
		if err := r.comm.fab.g.SumSquares2AllReduce(r.id, out, a, b, n, wa, wb); err != nil {
			return fmt.Errorf("xgmi: rank %d: %w", r.id, err)
		}
		return nil
	}
	d, err := r.device()
	if err != nil {
		return err
	}
	if err := d.SumSquares2(out, a, b, n, wa, wb); err != nil {
		return err
	}
	return r.AllReduceN(out, out, 2*n)
}

// fused reports whether n rows of dim f32 values take the fused kernels:
// where AllReduce would not run in two shots and the rows fit a low-latency
// collective.
func (r *DeviceRank) fused(n, dim int) bool {
	return dim%2 == 0 && r.comm.cfg.choose(n*dim*4) != TwoShot && n*dim <= r.comm.fab.g.LowLatencyValues()
}

// device is the rank's GPU, where the fused operations' fallbacks run.
func (r *DeviceRank) device() (*cuda.Device, error) {
	if d := r.comm.fab.Device(r.id); d != nil {
		return d, nil
	}
	return nil, fmt.Errorf("xgmi: rank %d lives in another process: it issues its own collectives", r.id)
}
