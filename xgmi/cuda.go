package xgmi

import (
	"fmt"
	"time"

	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/cuda"
)

// CUDAFabric joins the GPUs of one process: every rank's window and signal
// pad live in its GPU's memory, the peers map them by peer access, and the
// collectives are kernels (kernels/cuda/collective.cu) that push data into
// the peers' windows and wait on device-side flags. Nothing waits on the
// host, so the collectives can be recorded in CUDA graphs.
//
// Ranks in separate processes would exchange IPC handles of their windows
// (cuIpcGetMemHandle) through the actors that own the devices; that path is
// not built yet. AMD's XGMI fits the same shape through HIP.
type CUDAFabric struct {
	g *cuda.Group
}

// CUDAFabricConfig sizes a CUDA fabric.
type CUDAFabricConfig struct {
	// StepBytes is the largest step of a collective in bytes per rank
	// (larger messages run in several kernels); each window is
	// 2 × (ranks+1) × StepBytes. 0 means 32 MiB.
	StepBytes int
	// Timeout bounds a kernel's wait for a missing peer; the wait then
	// gives up and the device's next Sync fails. 0 means 10 s.
	Timeout time.Duration
}

// NewCUDAFabric enables peer access between every pair of devs (rank i is
// devs[i]) and allocates the windows.
func NewCUDAFabric(devs []*cuda.Device, cfg CUDAFabricConfig) (*CUDAFabric, error) {
	g, err := cuda.NewGroup(devs, cuda.GroupConfig{SlotBytes: cfg.StepBytes, Timeout: cfg.Timeout})
	if err != nil {
		return nil, fmt.Errorf("xgmi: cuda fabric: %w", err)
	}
	return &CUDAFabric{g: g}, nil
}

// Ranks implements Fabric.
func (f *CUDAFabric) Ranks() int { return f.g.Ranks() }

// WindowBytes implements Fabric.
func (f *CUDAFabric) WindowBytes() int { return f.g.WindowBytes() }

// Link implements Fabric: every pair has peer access (NewCUDAFabric
// refuses GPUs without it).
func (f *CUDAFabric) Link(a, b int) Link {
	if a == b {
		return Link{A: a, B: b, Kind: LinkSelf}
	}
	return Link{A: a, B: b, Kind: LinkPeer}
}

// Device is rank r's GPU.
func (f *CUDAFabric) Device(r int) *cuda.Device { return f.g.Device(r) }

// Close implements Fabric. Collectives still queued must have finished
// (Sync every device first).
func (f *CUDAFabric) Close() error { return f.g.Close() }

// DefaultCUDAConfig chooses by size with the crossover measured on two
// H200s over NVLink (docs/xgmi.md).
func DefaultCUDAConfig() Config {
	return Config{Algorithm: Auto, OneShotMaxBytes: 4 << 20}
}

// DeviceComm is a communicator whose collectives run on the GPUs, on
// device buffers: each call queues kernels on the rank's stream and
// returns without waiting. Every rank must issue the same collectives in
// the same order with the same sizes; a rank's calls come from one
// goroutine at a time (its device's owner).
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

// Device is the rank's GPU.
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
	algo := cuda.TwoShot
	if r.comm.cfg.choose(n*src.DType().Size()) == OneShot {
		algo = cuda.OneShot
	}
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
