package main

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/troupe/troupe/actors"
	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/gpu/cpu"
	"github.com/troupe/troupe/gpu/cuda"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/scheduler"
	"github.com/troupe/troupe/xgmi"
)

// Tensor-parallel serving (--tp N, --shards S, --replicas R): the node
// opens R·S·N devices (CPU devices sharing the threads, or GPUs 0 to
// R·S·N-1), each owned by a device actor, and more as replicas are added;
// every stage takes N free devices. A stage's ranks are layer-shard
// actors, rank i holding its slice of every layer of the stage on its
// device i, summing over a fabric of the stage's own: host memory on the
// CPU lane, CUDA peer memory on the CUDA lane. A replica of one stage has
// its scheduler drive the ranks in lock-step (scheduler.Lockstep); a
// replica of several stages, or a stage placed here by another node's
// group, runs each stage as an actor that drives its ranks so
// (scheduler.TPStage), and a pipeline of those.

// checkTP reports a --tp that cannot be served.
func checkTP(cfg serveConfig) error {
	switch {
	case cfg.TP < 1:
		return fmt.Errorf("serve: --tp %d: want 1 or more", cfg.TP)
	case cfg.TP == 1:
		return nil
	case cfg.TP > 8:
		return fmt.Errorf("serve: --tp %d: at most 8 ranks", cfg.TP)
	case cfg.Device != "cpu" && cfg.Device != "cuda":
		return fmt.Errorf("serve: --tp %d needs --device cpu or cuda, not %q", cfg.TP, cfg.Device)
	case cfg.Device == "cuda" && cfg.TP*max(1, cfg.Shards)*cfg.Replicas > maxGPUs:
		return fmt.Errorf("serve: --tp %d × --shards %d × --replicas %d: at most %d GPUs", cfg.TP, max(1, cfg.Shards), cfg.Replicas, maxGPUs)
	case cfg.TP*max(1, cfg.Shards)*cfg.Replicas > maxCPUDevices:
		return fmt.Errorf("serve: --tp %d × --shards %d × --replicas %d: at most %d CPU devices", cfg.TP, max(1, cfg.Shards), cfg.Replicas, maxCPUDevices)
	}
	return nil
}

// tpState is a tensor-parallel node's devices and the ranks of its
// one-stage replicas. Devices are opened as stages need them and kept
// open when a stage stops, for the next one.
type tpState struct {
	tp   int // ranks per stage
	most int // devices the node may open
	// open opens the node's device i (the first ones at the start), with
	// its GPU on the CUDA lane.
	open func(ctx context.Context, i int) (gpu.Device, *cuda.Device, error)

	mu     sync.Mutex
	devs   []gpu.Device                  // by index on the node; guarded by mu
	cudas  []*cuda.Device                // the same devices on the CUDA lane; guarded by mu
	owner  []string                      // the one-stage replica or the stage on each device, "" for none; guarded by mu
	shards map[string][]*scheduler.Shard // each one-stage replica's ranks; guarded by mu
}

// ranks returns the rank shards of one-stage replica id.
func (t *tpState) ranks(id string) []*scheduler.Shard {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.shards[id]
}

// take reserves k devices for id (a one-stage replica, or a stage), the
// free ones of lowest index first, opening more where too few are free:
// their indexes on the node, and the devices (and GPUs on the CUDA lane).
// On an error it reserves nothing (the devices it opened stay, free).
func (t *tpState) take(ctx context.Context, id string, k int) ([]int, []gpu.Device, []*cuda.Device, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var idx []int
	for i, o := range t.owner {
		if o == "" && len(idx) < k {
			idx = append(idx, i)
		}
	}
	for len(idx) < k {
		i := len(t.devs)
		if i >= t.most {
			return nil, nil, nil, fmt.Errorf("%d devices for %s: %d of the node's %d are free", k, id, len(idx), t.most)
		}
		d, c, err := t.open(ctx, i)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("device %d: %w", i, err)
		}
		t.devs, t.owner = append(t.devs, d), append(t.owner, "")
		if c != nil {
			t.cudas = append(t.cudas, c)
		}
		idx = append(idx, i)
	}
	devs := make([]gpu.Device, k)
	var cudas []*cuda.Device
	for j, i := range idx {
		t.owner[i], devs[j] = id, t.devs[i]
		if t.cudas != nil {
			cudas = append(cudas, t.cudas[i])
		}
	}
	return idx, devs, cudas, nil
}

// release gives id's devices back, and forgets its ranks.
func (t *tpState) release(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, o := range t.owner {
		if o == id {
			t.owner[i] = ""
		}
	}
	delete(t.shards, id)
}

// close closes every device the node opened but the first, which the
// node's device actor owns.
func (t *tpState) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, d := range t.devs[1:] {
		d.Close()
	}
}

// openDevices opens the node's device: one, or the devices of every
// replica's --tp ranks and --shards stages, of which it returns the first
// (the node's device actor owns it) and closes the others with the node.
// A tensor-parallel node opens more as replicas are added while it
// serves: the next GPUs, or CPU devices of as many threads as each of the
// first ones.
func (n *node) openDevices(ctx context.Context) (gpu.Device, error) {
	cfg := n.cfg
	if cfg.TP <= 1 {
		return openDevice(ctx, cfg.Device, cfg.Threads)
	}
	total := cfg.TP * max(1, cfg.Shards) * max(1, cfg.Replicas)
	t := &tpState{tp: cfg.TP, shards: map[string][]*scheduler.Shard{}}
	if cfg.Device == "cuda" {
		t.most = maxGPUs
		t.open = func(ctx context.Context, i int) (gpu.Device, *cuda.Device, error) {
			d, err := cuda.Open(ctx, cudaConfig(i))
			return d, d, err
		}
	} else {
		threads := cfg.Threads
		if threads <= 0 {
			threads = runtime.GOMAXPROCS(0)
		}
		t.most = maxCPUDevices
		t.open = func(_ context.Context, i int) (gpu.Device, *cuda.Device, error) {
			// The start's devices split the threads, the first ones
			// taking the remainder; later ones get as many as the last.
			per := threads / total
			if i < threads%total {
				per++
			}
			d, err := cpu.New(cpu.Config{Threads: max(1, per), Spin: cpu.DefaultConfig().Spin})
			return d, nil, err
		}
	}
	// The start's devices, opened at once so that a missing one fails the
	// start rather than a replica.
	if _, _, _, err := t.take(ctx, "", total); err != nil {
		for _, d := range t.devs {
			d.Close()
		}
		return nil, fmt.Errorf("serve: --tp %d: %w", cfg.TP, err)
	}
	n.closers = append(n.closers, t.close)
	n.tpd = t
	return t.devs[0], nil
}

// The most devices a tensor-parallel node opens: GPUs of one host, and
// CPU devices.
const maxGPUs, maxCPUDevices = 8, 64

// startTPReplica runs replica id, one stage, over --tp free devices of
// the node: a rank actor per device, the fabric, its KV-manager, and its
// scheduler over a Lockstep of the ranks. (A replica of several stages
// runs each as a scheduler.TPStage: startTPShard.)
func (n *node) startTPReplica(ctx, runCtx context.Context, id string) (_ *replica, err error) {
	rep := &replica{id: id, shape: shape{stages: 1}}
	args := scheduler.ShardArgs{Replica: id, First: 0, Last: n.bundle.Config.Layers, Blocks: n.blocks, BlockSize: 16}
	ranks, fab, shards, err := n.startTPRanks(ctx, rep, scheduler.ShardID(id, 0), args)
	if err != nil {
		return nil, fmt.Errorf("serve: replica %s: %w", id, err)
	}
	defer func() {
		if err != nil {
			n.stopActors(rep)
			n.tpd.release(id)
		}
	}()
	kv, kvRef, err := n.startKV(ctx, rep.id, n.blocks)
	if kvRef != nil {
		rep.actors = append(rep.actors, kvRef)
	}
	if err != nil {
		return nil, err
	}
	ls, err := scheduler.NewLockstep(ranks, fab, n.plane, n.bundle.Config.Vocab)
	if err != nil {
		return nil, err
	}
	ls.StepTimeout = n.cfg.StepTimeout
	if err := n.startScheduler(runCtx, ls, kv, rep); err != nil {
		return nil, err
	}
	n.tpd.mu.Lock()
	n.tpd.shards[id] = shards
	n.tpd.mu.Unlock()
	return rep, nil
}

// startTPShard starts stage id of a replica (of several stages here, or
// placed on this node) as --tp ranks on free devices, and an actor under
// id that runs each of the stage's calls on them in lock-step
// (scheduler.TPStage), as a layer-shard answers them. Stopping that actor
// stops the ranks and gives the devices back.
func (n *node) startTPShard(ctx context.Context, id string, args scheduler.ShardArgs) (actors.Process, error) {
	rep := &replica{id: id} // the stage's ranks and device actors
	ranks, fab, _, err := n.startTPRanks(ctx, rep, id, args)
	if err != nil {
		return nil, err
	}
	stop := func() { n.stopActors(rep); n.tpd.release(id) }
	ts, err := scheduler.NewTPStage(id, ranks, fab, n.plane, n.cfg.StepTimeout, fmt.Sprintf("layers %d-%d, %d tensor-parallel ranks", args.First, args.Last, len(ranks)))
	if err != nil {
		stop()
		return nil, err
	}
	ref, err := actors.Spawn(ctx, n.actors, ts.Props())
	if err != nil {
		stop()
		return nil, fmt.Errorf("serve: spawn %s: %w", id, err)
	}
	n.spawnedMu.Lock()
	n.spawned[id] = stop
	n.owners[id] = args.Replica
	n.spawnedMu.Unlock()
	fmt.Fprintf(n.log, "node %s: shard %s runs layers [%d, %d) over %d ranks\n", n.cfg.Node, id, args.First, args.Last, len(ranks))
	return ref, nil
}

// startTPRanks starts stage sid (its index, layers and cache as args say)
// on --tp free devices of the node, which rep.id then holds: the stage's
// fabric, a device actor for each device but the node's own, and a rank
// actor sid-tI for each device, appended to rep's actors (the ranks, then
// the device actors, which stop after them). The fabric goes with the last
// rank. On an error it stops what it started and gives the devices back.
func (n *node) startTPRanks(ctx context.Context, rep *replica, sid string, args scheduler.ShardArgs) (_ []*actors.Ref[scheduler.ShardCall], _ tpFabric, _ []*scheduler.Shard, err error) {
	t := n.tpd
	idx, devs, cudas, err := t.take(ctx, rep.id, t.tp)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("stage %s: %w", sid, err)
	}
	var fab tpFabric
	if cudas != nil {
		fab, err = newCUDATP(cudas)
	} else {
		fab, err = newHostTP(devs)
	}
	if err != nil {
		t.release(rep.id)
		return nil, nil, nil, fmt.Errorf("serve: tensor parallelism: stage %s: %w", sid, err)
	}
	var devProcs []actors.Process
	fabOwned := false
	defer func() {
		rep.actors = append(rep.actors, devProcs...)
		if err != nil {
			n.stopActors(rep)
			if !fabOwned {
				fab.Close()
			}
			t.release(rep.id)
		}
	}()
	reds := fab.reducers()
	var ranks []*actors.Ref[scheduler.ShardCall]
	var shards []*scheduler.Shard
	for i, dev := range devs {
		devRef := n.device
		if idx[i] > 0 {
			// The node's device actor owns the first device; the others
			// get actors of their own.
			ref, err := actors.Spawn(ctx, n.actors, scheduler.DeviceProps(fmt.Sprintf("%s-%d", n.cfg.Node, idx[i]), dev))
			if err != nil {
				return nil, nil, nil, fmt.Errorf("serve: device actor %d: %w", idx[i], err)
			}
			devProcs = append(devProcs, ref)
			devRef = ref
		}
		rid := fmt.Sprintf("%s-t%d", sid, i)
		m, err := models.Load(n.bundle.Config, n.bundle.Checkpoint, dev, models.Options{
			FirstLayer: args.First, LastLayer: args.Last, MaxTokens: n.cfg.MaxBatchTokens, MaxSeqs: n.cfg.MaxSeqs, CacheDType: n.cacheDT,
			Shard: &models.Shard{Rank: i, Size: len(devs), Comm: reds[i]},
		})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("serve: %s: %w", rid, err)
		}
		cache, err := m.NewCache(args.Blocks, args.BlockSize)
		if err != nil {
			m.Close()
			return nil, nil, nil, fmt.Errorf("serve: %s: %w", rid, err)
		}
		sh := scheduler.NewShard(rid, args.Index, m, cache, n.plane, n.tp.TracerProvider())
		sh.Rank, sh.Ranks, sh.Device = i, len(devs), devRef
		if n.stream != nil {
			// A stage placed here may read its input from another node.
			sh.Remote = n.stream
		}
		// Every rank of a whole model queues the next step before it
		// reads a step's choices, as a whole model's shard does: they all
		// get the same plans (scheduler.Lockstep), so they queue and drop
		// alike. A stage of a pipeline does not (models.Model.Chains).
		sh.QueueAhead = n.cfg.Device == "cuda"
		ref, err := actors.Spawn(ctx, n.actors, sh.Props())
		if err != nil {
			cache.Close()
			m.Close()
			return nil, nil, nil, fmt.Errorf("serve: spawn %s: %w", rid, err)
		}
		release := func() { cache.Close(); m.Close() }
		if i == len(devs)-1 {
			// The ranks stop in order: the last one takes the fabric.
			release = func() { cache.Close(); m.Close(); fab.Close() }
			fabOwned = true
		}
		n.spawnedMu.Lock()
		n.spawned[rid] = release
		n.spawnedMu.Unlock()
		rep.actors = append(rep.actors, ref)
		ranks = append(ranks, ref)
		shards = append(shards, sh)
		fmt.Fprintf(n.log, "node %s: shard %s runs layers [%d, %d) as rank %d of %d on %s\n", n.cfg.Node, rid, args.First, args.Last, i, len(devs), dev.Name())
	}
	return ranks, fab, shards, nil
}

// tpFabric is a replica's collectives: a models.Reducer per rank, and
// the abort and reset that supervision needs (scheduler.Group).
type tpFabric interface {
	scheduler.Group
	reducers() []models.Reducer
	Close()
}

// hostTP is a tensor-parallel group of host devices summing through a
// host fabric. A reset replaces the fabric, whose abort is final.
type hostTP struct {
	devs  []gpu.Device
	ranks []*hostReducer

	mu  sync.Mutex
	fab *xgmi.HostFabric // guarded by mu
}

func newHostTP(devs []gpu.Device) (*hostTP, error) {
	h := &hostTP{devs: devs}
	for _, d := range devs {
		h.ranks = append(h.ranks, &hostReducer{dev: d})
	}
	if err := h.Reset(); err != nil {
		return nil, err
	}
	return h, nil
}

// Reset implements scheduler.Group: a fresh fabric for every rank.
func (h *hostTP) Reset() error {
	cfg := xgmi.DefaultHostFabricConfig()
	cfg.Ranks = len(h.devs)
	fab, err := xgmi.NewHostFabric(cfg)
	if err != nil {
		return err
	}
	comm, err := xgmi.NewComm(fab, xgmi.DefaultConfig())
	if err != nil {
		fab.Close()
		return err
	}
	for i, r := range h.ranks {
		r.rank.Store(comm.Rank(i))
	}
	h.mu.Lock()
	old := h.fab
	h.fab = fab
	h.mu.Unlock()
	if old != nil {
		old.Close()
	}
	return nil
}

// Abort implements scheduler.Group: every wait on the fabric fails.
func (h *hostTP) Abort(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.fab.Abort(err)
}

func (h *hostTP) reducers() []models.Reducer {
	out := make([]models.Reducer, len(h.ranks))
	for i, r := range h.ranks {
		out[i] = r
	}
	return out
}

func (h *hostTP) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.fab.Close()
}

// hostReducer is a rank's models.Reducer over a host fabric: the
// collective runs on a host copy of the device buffer. Its calls come from
// the rank's device actor, one at a time. The waits have no deadline: the
// group's abort ends them.
type hostReducer struct {
	dev     gpu.Device
	rank    atomic.Pointer[xgmi.Rank]
	in, out []byte
}

func (r *hostReducer) AllReduceN(dst, src gpu.Buffer, n int) error {
	dt := src.DType()
	if dst.DType() != dt || n < 0 || n > src.Len() || n > dst.Len() {
		return fmt.Errorf("all-reduce: %d elements of %s into %s of %d", n, dt, dst.DType(), dst.Len())
	}
	r.in = grow(r.in, n*dt.Size())
	if err := r.dev.Read(r.in, src, 0); err != nil {
		return fmt.Errorf("all-reduce: %w", err)
	}
	if err := r.rank.Load().AllReduce(context.Background(), r.in, r.in, dt); err != nil {
		return err
	}
	return r.dev.Write(dst, 0, r.in)
}

func (r *hostReducer) AllGather(dst, src gpu.Buffer) error {
	es := src.DType().Size()
	r.in = grow(r.in, src.Len()*es)
	r.out = grow(r.out, dst.Len()*es)
	if err := r.dev.Read(r.in, src, 0); err != nil {
		return fmt.Errorf("all-gather: %w", err)
	}
	if err := r.rank.Load().AllGather(context.Background(), r.out, r.in); err != nil {
		return err
	}
	return r.dev.Write(dst, 0, r.out)
}

func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}

// cudaTP is a tensor-parallel group of GPUs summing through a CUDA fabric.
// Its collectives are kernels that give up after the fabric's timeout when
// a rank does not arrive, so Abort has nothing to do; Reset waits for the
// GPUs (clearing the fault the timeout reports).
type cudaTP struct{ *tpGroup }

func newCUDATP(devs []*cuda.Device) (*cudaTP, error) {
	g, err := newTPGroup(devs)
	if err != nil {
		return nil, err
	}
	return &cudaTP{g}, nil
}

func (c *cudaTP) Abort(error) {}

func (c *cudaTP) Reset() error {
	// A device reports a fault once, from this Sync: it is the failed
	// step's, which the step's error already tells.
	for _, d := range c.devs {
		_ = d.Sync(context.Background())
	}
	return nil
}

// Close waits for the GPUs and frees the fabric; the devices belong to
// their device actors.
func (c *cudaTP) Close() { c.release() }
