//go:build cuda

package xgmi

import (
	"bytes"
	"context"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/troupe/troupe/bus"
	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/cuda"
)

// The environment of a child process of TestIPC.
const (
	ipcEnvRank  = "TROUPE_XGMI_IPC_RANK"  // the child's rank, which is also its GPU
	ipcEnvURL   = "TROUPE_XGMI_IPC_URL"   // the parent's bus node
	ipcEnvToken = "TROUPE_XGMI_IPC_TOKEN" // its client token
	ipcRanks    = 2
	ipcCluster  = "xgmi-ipc-test"
)

// TestIPC runs the CUDA fabric across processes. It starts a bus node
// with a loopback client listener, then runs this test binary again as
// two child processes (TestIPCChild), child r on GPU r, which join one
// IPC fabric through a bus.Exchange on the node and check all-reduces
// (f32, bf16, f16; one-shot, two-shot and auto; odd sizes and sizes of
// several steps; in place and not), back-to-back all-reduces, all-gather,
// broadcast and a replayed CUDA graph against SumReference, bit for bit.
// A child reports through its exit status; its output is shown when it
// fails. Skipped without 2 GPUs.
func TestIPC(t *testing.T) {
	if os.Getenv(ipcEnvRank) != "" {
		t.Skip("a child of TestIPC runs only TestIPCChild")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	// GPU 1 must exist; the parent then lets the children have the GPUs.
	cfg := cuda.DefaultConfig()
	cfg.Ordinal = ipcRanks - 1
	if *kernelDir != "" {
		cfg.Kernels = os.DirFS(*kernelDir)
	}
	d, err := cuda.Open(ctx, cfg)
	if err != nil {
		t.Skipf("the IPC fabric test needs %d GPUs: GPU %d: %v", ipcRanks, ipcRanks-1, err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}

	bcfg, err := bus.LoopbackConfig("xgmi-ipc-parent")
	if err != nil {
		t.Fatal(err)
	}
	node, err := bus.Start(ctx, bcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		if err := node.Shutdown(sctx); err != nil {
			t.Errorf("bus shutdown: %v", err)
		}
	}()

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"-test.run=^TestIPCChild$", "-test.v", "-test.count=1"}
	if *kernelDir != "" {
		args = append(args, "-xgmi.kernels="+*kernelDir)
	}
	if testing.Short() {
		args = append(args, "-test.short")
	}
	type child struct {
		cmd         *exec.Cmd
		out, stderr bytes.Buffer
		err         error
	}
	children := make([]*child, ipcRanks)
	var wg sync.WaitGroup
	for r := range ipcRanks {
		c := &child{cmd: exec.CommandContext(ctx, exe, args...)}
		c.cmd.Env = append(os.Environ(),
			ipcEnvRank+"="+strconv.Itoa(r), ipcEnvURL+"="+node.ClientURL(), ipcEnvToken+"="+bcfg.ClientAuth.Token)
		c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.stderr
		c.cmd.WaitDelay = 10 * time.Second
		if err := c.cmd.Start(); err != nil {
			t.Fatalf("start child %d: %v", r, err)
		}
		children[r] = c
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.err = c.cmd.Wait()
		}()
	}
	wg.Wait()
	for r, c := range children {
		if c.err != nil {
			t.Errorf("child %d (GPU %d): %v\n--- stderr:\n%s\n--- stdout:\n%s", r, r, c.err, c.stderr.String(), c.out.String())
			continue
		}
		if !strings.Contains(c.out.String(), "--- PASS: TestIPCChild") {
			t.Errorf("child %d (GPU %d) exited 0 but did not pass TestIPCChild:\n%s", r, r, c.out.String())
			continue
		}
		for _, line := range strings.Split(c.out.String(), "\n") {
			if strings.Contains(line, "ipc:") {
				t.Logf("child %d: %s", r, strings.TrimSpace(line))
			}
		}
	}
}

// ipcChild is one process's rank of TestIPC.
type ipcChild struct {
	t    *testing.T
	ctx  context.Context
	rank int
	dev  *cuda.Device
	nc   *nats.Conn // the parent's bus node
}

// TestIPCChild is one rank of TestIPC; it runs only in a child process.
// Both ranks issue the same collectives in the same order, so a check
// that fails is reported with Errorf and the rank goes on.
func TestIPCChild(t *testing.T) {
	rs := os.Getenv(ipcEnvRank)
	if rs == "" {
		t.Skip("runs only as a child process of TestIPC")
	}
	rank, err := strconv.Atoi(rs)
	if err != nil || rank < 0 || rank >= ipcRanks {
		t.Fatalf("%s=%q", ipcEnvRank, rs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	cfg := cuda.DefaultConfig()
	cfg.Ordinal = rank
	if *kernelDir != "" {
		cfg.Kernels = os.DirFS(*kernelDir)
	}
	dev, err := cuda.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("rank %d: open GPU %d: %v", rank, rank, err)
	}
	t.Cleanup(func() {
		if err := dev.Close(); err != nil {
			t.Errorf("close GPU %d: %v", rank, err)
		}
	})
	nc, err := nats.Connect(os.Getenv(ipcEnvURL), nats.Token(os.Getenv(ipcEnvToken)), nats.Name(fmt.Sprintf("xgmi-ipc-rank-%d", rank)))
	if err != nil {
		t.Fatalf("rank %d: connect to the bus: %v", rank, err)
	}
	t.Cleanup(nc.Close)
	t.Logf("ipc: rank %d on %s (%s)", rank, dev.Name(), dev.Info().UUID)

	c := &ipcChild{t: t, ctx: ctx, rank: rank, dev: dev, nc: nc}
	c.peerBuffers()
	// A 256 KiB step: most sizes below take several kernels.
	fab := c.fabric("steps", 256<<10)
	if fab.Device(rank) != dev || fab.Device(1-rank) != nil || !fab.IPC() {
		t.Errorf("rank %d: the fabric's devices: %v, %v", rank, fab.Device(0), fab.Device(1))
	}
	c.allReduceSweep(fab)
	c.backToBack(fab)
	c.allGatherBroadcast(fab)
	c.graph(fab)
	// A second fabric on the same bus, with the default step.
	c.allReduceSweepSizes(c.fabric("default", 0), []int{8, 1 << 20, 3<<20 + 1})
}

// exchange is this rank's end of the exchange called name.
func (c *ipcChild) exchange(name string) *bus.Exchange {
	c.t.Helper()
	subs, _ := bus.NewSubjects(ipcCluster)
	ex, err := bus.NewExchange(c.ctx, c.nc, bus.ExchangeConfig{Subject: subs.Exchange(name), Rank: c.rank, Ranks: ipcRanks})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = ex.Close() })
	return ex
}

// peerBuffers: each rank exports a view that starts inside its
// allocation, the ranks swap the handles over the bus, and each reads the
// other's bytes through its mapping.
func (c *ipcChild) peerBuffers() {
	ex := c.exchange("buffers")
	pattern := func(q int) []byte {
		b := make([]byte, 4*1000)
		for i := range b {
			b[i] = byte(i*7 + q*13)
		}
		return b
	}
	whole := c.alloc(gpu.F32, 1000)
	if err := c.dev.Write(whole, 0, pattern(c.rank)); err != nil {
		c.t.Fatal(err)
	}
	view, err := c.dev.Slice(whole, 16, 500)
	if err != nil {
		c.t.Fatal(err)
	}
	h, err := c.dev.ExportIPC(view)
	if err != nil {
		c.t.Fatalf("rank %d: %v", c.rank, err)
	}
	if h.Offset < 64 || h.Bytes != 2000 {
		c.t.Errorf("rank %d: the view's handle: offset %d, %d bytes; want at least 64 and 2000", c.rank, h.Offset, h.Bytes)
	}
	mine, _ := h.MarshalBinary()
	all, err := ex.AllGather(c.ctx, mine)
	if err != nil {
		c.t.Fatalf("rank %d: %v", c.rank, err)
	}
	peer := 1 - c.rank
	var ph cuda.IPCHandle
	if err := ph.UnmarshalBinary(all[peer]); err != nil {
		c.t.Fatal(err)
	}
	mapped, err := c.dev.ImportIPC(ph, gpu.F32)
	if err != nil {
		c.t.Fatalf("rank %d: %v", c.rank, err)
	}
	got := make([]byte, 2000)
	if err := c.dev.Read(got, mapped, 0); err != nil {
		c.t.Fatalf("rank %d: read the peer's memory: %v", c.rank, err)
	}
	if want := pattern(peer)[64 : 64+2000]; !bytes.Equal(got, want) {
		c.t.Errorf("rank %d: the peer's view reads %x..., want %x...", c.rank, got[:16], want[:16])
	} else {
		c.t.Logf("ipc: rank %d read rank %d's view (offset %d) through its IPC handle", c.rank, peer, ph.Offset)
	}
	c.dev.Free(mapped)
	if err := c.dev.Sync(c.ctx); err != nil {
		c.t.Fatal(err)
	}
	// The owner frees its memory once the peer has unmapped it.
	if _, err := ex.AllGather(c.ctx, nil); err != nil {
		c.t.Fatal(err)
	}
	c.dev.Free(whole)
}

// fabric joins the ranks' IPC fabric named name; it shuts it down when
// the test ends.
func (c *ipcChild) fabric(name string, step int) *CUDAFabric {
	c.t.Helper()
	ex := c.exchange(name)
	fab, err := NewIPCFabric(c.ctx, c.dev, ex, CUDAFabricConfig{StepBytes: step})
	if err != nil {
		c.t.Fatalf("rank %d: %v", c.rank, err)
	}
	c.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := fab.Shutdown(ctx); err != nil {
			c.t.Errorf("rank %d: fabric %s: %v", c.rank, name, err)
		}
	})
	c.t.Logf("ipc: rank %d joined fabric %q (%s windows)", c.rank, name, fmtMiB(fab.WindowBytes()))
	return fab
}

func fmtMiB(b int) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// inputs are every rank's input of one case: each rank computes all of
// them, so that it can compute the oracle without receiving the others'.
func ipcInputs(dt gpu.DType, n int, seed uint64) [][]byte {
	ins := make([][]byte, ipcRanks)
	for q := range ipcRanks {
		ins[q] = gpuInput(mrand.New(mrand.NewPCG(seed, uint64(n)<<8|uint64(q))), dt, n)
	}
	return ins
}

// check compares dst with the oracle over ins.
func (c *ipcChild) check(what string, dt gpu.DType, dst gpu.Buffer, ins [][]byte) bool {
	c.t.Helper()
	want := make([]byte, len(ins[0]))
	if err := SumReference(dt, want, ins); err != nil {
		c.t.Fatal(err)
	}
	got := make([]byte, len(want))
	if err := c.dev.Read(got, dst, 0); err != nil {
		c.t.Fatalf("rank %d: %s: %v", c.rank, what, err)
	}
	if i := diff(dt, got, want); i >= 0 {
		es := dt.Size()
		c.t.Errorf("rank %d: %s: element %d is %x, want %x (inputs %x %x)", c.rank, what, i,
			got[i*es:(i+1)*es], want[i*es:(i+1)*es], ins[0][i*es:(i+1)*es], ins[1][i*es:(i+1)*es])
		return false
	}
	return true
}

func (c *ipcChild) alloc(dt gpu.DType, n int) gpu.Buffer {
	c.t.Helper()
	b, err := c.dev.Alloc(dt, n)
	if err != nil {
		c.t.Fatal(err)
	}
	return b
}

// allReduce runs one all-reduce of n elements with comm and checks it.
func (c *ipcChild) allReduce(comm *DeviceComm, dt gpu.DType, n int, inPlace bool, seed uint64) bool {
	c.t.Helper()
	ins := ipcInputs(dt, n, seed)
	src := c.alloc(dt, n)
	defer c.dev.Free(src)
	dst := src
	if !inPlace {
		dst = c.alloc(dt, n)
		defer c.dev.Free(dst)
	}
	if err := c.dev.Write(src, 0, ins[c.rank]); err != nil {
		c.t.Fatal(err)
	}
	if err := comm.Rank(c.rank).AllReduce(dst, src); err != nil {
		c.t.Fatalf("rank %d: %v", c.rank, err)
	}
	return c.check(fmt.Sprintf("all-reduce %s n=%d %s in-place=%v", dt, n, comm.Algorithm(n*dt.Size()), inPlace), dt, dst, ins)
}

// allReduceSweep: f32, bf16 and f16 × one-shot, two-shot and auto × odd
// and even sizes, up to several steps.
func (c *ipcChild) allReduceSweep(fab *CUDAFabric) {
	sizes := []int{1, 7, 8, 9, 15, 16, 17, 255, 1023, 1024, 1025, 4095, 65537, 131071, 300001}
	if !testing.Short() {
		sizes = append(sizes, 1<<20+3)
	}
	c.allReduceSweepSizes(fab, sizes)
}

func (c *ipcChild) allReduceSweepSizes(fab *CUDAFabric, sizes []int) {
	runs, ok := 0, 0
	for _, algo := range []Algorithm{OneShot, TwoShot, Auto} {
		cfg := DefaultCUDAConfig()
		cfg.Algorithm = algo
		if algo == Auto {
			cfg.OneShotMaxBytes = 16 << 10 // both algorithms within the sweep
		}
		comm, err := NewDeviceComm(fab, cfg)
		if err != nil {
			c.t.Fatal(err)
		}
		for di, dt := range []gpu.DType{gpu.F32, gpu.BF16, gpu.F16} {
			for i, n := range sizes {
				runs++
				if c.allReduce(comm, dt, n, i%3 == 1, uint64(int(algo)*100+di*10+i)) {
					ok++
				}
			}
		}
	}
	c.t.Logf("ipc: rank %d: %d of %d all-reduces match SumReference (%s steps, sizes %d to %d elements)", c.rank, ok, runs, fmtMiB(fab.g.SlotBytes()), sizes[0], sizes[len(sizes)-1])
}

// backToBack issues all-reduces of changing sizes and algorithms without
// waiting in between, so that the window halves are reused while the
// peer may still be a call behind, then checks them all.
func (c *ipcChild) backToBack(fab *CUDAFabric) {
	comm, err := NewDeviceComm(fab, Config{Algorithm: Auto, OneShotMaxBytes: 32 << 10})
	if err != nil {
		c.t.Fatal(err)
	}
	dt := gpu.BF16
	rng := mrand.New(mrand.NewPCG(11, 11)) // the same sizes on both ranks
	type call struct {
		ins      [][]byte
		src, dst gpu.Buffer
	}
	var calls []call
	for k := range 48 {
		n := 8 + rng.IntN(1<<uint(4+k%14))
		cl := call{ins: ipcInputs(dt, n, uint64(1000+k)), src: c.alloc(dt, n)}
		cl.dst = cl.src
		if k%2 == 1 {
			cl.dst = c.alloc(dt, n)
		}
		if err := c.dev.Write(cl.src, 0, cl.ins[c.rank]); err != nil {
			c.t.Fatal(err)
		}
		calls = append(calls, cl)
	}
	for _, cl := range calls {
		if err := comm.Rank(c.rank).AllReduce(cl.dst, cl.src); err != nil {
			c.t.Fatal(err)
		}
	}
	ok := 0
	for k, cl := range calls {
		if c.check(fmt.Sprintf("back-to-back call %d (n=%d)", k, cl.src.Len()), dt, cl.dst, cl.ins) {
			ok++
		}
		if cl.dst != cl.src {
			c.dev.Free(cl.dst)
		}
		c.dev.Free(cl.src)
	}
	c.t.Logf("ipc: rank %d: %d of %d back-to-back all-reduces match", c.rank, ok, len(calls))
}

// allGatherBroadcast checks all-gather and broadcast at sizes that are and
// are not multiples of 16 bytes, some of several steps.
func (c *ipcChild) allGatherBroadcast(fab *CUDAFabric) {
	comm, err := NewDeviceComm(fab, DefaultCUDAConfig())
	if err != nil {
		c.t.Fatal(err)
	}
	r := comm.Rank(c.rank)
	runs, ok := 0, 0
	for _, n := range []int{1, 7, 8, 1000, 4096, 40000, 100001} { // i32 elements
		ins := make([][]byte, ipcRanks)
		for q := range ipcRanks {
			rng := mrand.New(mrand.NewPCG(uint64(n), uint64(q)))
			ins[q] = make([]byte, 4*n)
			for i := range ins[q] {
				ins[q][i] = byte(rng.IntN(256))
			}
		}
		src, dst := c.alloc(gpu.I32, n), c.alloc(gpu.I32, ipcRanks*n)
		if err := c.dev.Write(src, 0, ins[c.rank]); err != nil {
			c.t.Fatal(err)
		}
		if err := r.AllGather(dst, src); err != nil {
			c.t.Fatal(err)
		}
		got := make([]byte, ipcRanks*4*n)
		if err := c.dev.Read(got, dst, 0); err != nil {
			c.t.Fatal(err)
		}
		runs++
		if want := bytes.Join(ins, nil); !bytes.Equal(got, want) {
			c.t.Errorf("rank %d: all-gather n=%d: wrong bytes", c.rank, n)
		} else {
			ok++
		}
		for root := range ipcRanks {
			if err := c.dev.Write(src, 0, ins[c.rank]); err != nil {
				c.t.Fatal(err)
			}
			if err := r.Broadcast(src, root); err != nil {
				c.t.Fatal(err)
			}
			got := make([]byte, 4*n)
			if err := c.dev.Read(got, src, 0); err != nil {
				c.t.Fatal(err)
			}
			runs++
			if !bytes.Equal(got, ins[root]) {
				c.t.Errorf("rank %d: broadcast n=%d from rank %d: wrong bytes", c.rank, n, root)
			} else {
				ok++
			}
		}
		c.dev.Free(src)
		c.dev.Free(dst)
	}
	c.t.Logf("ipc: rank %d: %d of %d all-gathers and broadcasts match", c.rank, ok, runs)
}

// graph records one-shot and two-shot all-reduces in a CUDA graph and
// replays it with new inputs each time: every replay gives the oracle's
// bits.
func (c *ipcChild) graph(fab *CUDAFabric) {
	type rec struct {
		comm     *DeviceComm
		dt       gpu.DType
		n        int
		src, dst gpu.Buffer
	}
	var recs []rec
	for _, algo := range []Algorithm{OneShot, TwoShot} {
		cfg := DefaultCUDAConfig()
		cfg.Algorithm = algo
		comm, err := NewDeviceComm(fab, cfg)
		if err != nil {
			c.t.Fatal(err)
		}
		for _, k := range []struct {
			dt gpu.DType
			n  int
		}{{gpu.BF16, 8}, {gpu.F32, 4097}, {gpu.BF16, 32 << 10}, {gpu.BF16, 300001}} {
			src, dst := c.alloc(k.dt, k.n), c.alloc(k.dt, k.n)
			recs = append(recs, rec{comm, k.dt, k.n, src, dst})
		}
	}
	defer func() {
		for _, r := range recs {
			c.dev.Free(r.src)
			c.dev.Free(r.dst)
		}
	}()
	if err := c.dev.Sync(c.ctx); err != nil {
		c.t.Fatal(err)
	}
	g, err := c.dev.Capture(func() error {
		for _, r := range recs {
			if err := r.comm.Rank(c.rank).AllReduce(r.dst, r.src); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		c.t.Fatalf("rank %d: capture: %v", c.rank, err)
	}
	defer g.Close()
	runs, ok := 0, 0
	for rep := range 5 {
		ins := make([][][]byte, len(recs))
		for i, r := range recs {
			ins[i] = ipcInputs(r.dt, r.n, uint64(5000+100*rep+i))
			if err := c.dev.Write(r.src, 0, ins[i][c.rank]); err != nil {
				c.t.Fatal(err)
			}
			// Poison the output so that the replay must write it.
			if err := c.dev.Write(r.dst, 0, make([]byte, r.n*r.dt.Size())); err != nil {
				c.t.Fatal(err)
			}
		}
		if err := g.Launch(); err != nil {
			c.t.Fatal(err)
		}
		for i, r := range recs {
			runs++
			if c.check(fmt.Sprintf("graph replay %d: %s n=%d %s", rep, r.dt, r.n, r.comm.Algorithm(r.n*r.dt.Size())), r.dt, r.dst, ins[i]) {
				ok++
			}
		}
	}
	c.t.Logf("ipc: rank %d: %d of %d all-reduces replayed from a graph match", c.rank, ok, runs)
}
