package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/troupe/troupe/actors"
	"github.com/troupe/troupe/bus"
	"github.com/troupe/troupe/gateway"
	"github.com/troupe/troupe/gpu"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/generate"
	"github.com/troupe/troupe/models/tokenizer"
	"github.com/troupe/troupe/scheduler"
	"github.com/troupe/troupe/trace"
	"github.com/troupe/troupe/xgmi"
)

// node is one troupe process: its bus server and the actors it runs.
type node struct {
	cfg      serveConfig
	version  versionInfo // the binary's build, read once
	bus      *bus.Node
	nc       *nats.Conn
	subj     bus.Subjects
	actors   *actors.System
	registry *actors.Registry
	// responses keeps the gateways' Responses answers, cluster-wide; nil
	// keeps none.
	responses *bus.Cache
	bundle    *models.Bundle
	tok       *tokenizer.Tokenizer
	dev       gpu.Device
	tpd       *tpState // the --tp devices and ranks; nil without tensor parallelism
	device    *actors.Ref[scheduler.DeviceJob]
	backend   *backend
	plane     *xgmi.Host
	stream    *xgmi.StreamClient // nil on a node without a data listener
	dataAddr  string             // advertised data-plane address; "" if none
	view      *clusterView
	tp        *trace.Provider
	log       io.Writer
	blocks    int      // KV blocks a replica of the node's start
	kvAuto    *kvNeeds // what sized blocks by memory; nil for --kv-blocks
	started   bool     // the start's replicas are up; guarded by resizeMu
	cacheDT   gpu.DType

	cancel  context.CancelFunc
	runCtx  context.Context // ends when the node closes
	wg      sync.WaitGroup
	closers []func()

	spawnedMu sync.Mutex
	spawned   map[string]func() // resources of shards, by actor id, released after they stop
	owners    map[string]string // the replica of each shard, by actor id; guarded by spawnedMu

	weightsMu sync.Mutex
	weights   map[[2]int]*sharedWeights // by layer range; guarded by weightsMu

	// resizeMu is held across a whole resize, so that resizes run one at
	// a time; it guards nextRep, leading and lease.
	resizeMu sync.Mutex
	nextRep  int // number of the next replica started
	// leading, on a node of a named group, is the context of its holding
	// the group's key: its replicas live within it. nil while it stands by.
	leading context.Context
	lease   *actors.Lease // the key's, while leading

	replicasMu sync.Mutex
	replicas   []*replica // the replicas serving, oldest first; guarded by replicasMu
	shape      shape      // what the replicas look like; guarded by replicasMu
	// target is what a resize heads for, from before its first change to
	// its end: what the group's key says meanwhile. nil otherwise; guarded
	// by replicasMu.
	target *replicasDoc
}

func busConfig(cfg serveConfig) bus.Config {
	bc := bus.DefaultConfig()
	bc.Name = cfg.Node
	bc.Listen = cfg.Cluster.ClientListen
	c := cfg.Cluster
	bc.ClientAuth = bus.Auth{User: c.User, Password: c.Password}
	bc.ClientTLS = bus.TLSFiles{Cert: c.TLSCert, Key: c.TLSKey, CA: c.TLSCA, Verify: c.TLSCA != ""}
	if c.RouteListen != "" {
		bc.Cluster = bus.Cluster{Name: c.Name, Listen: c.RouteListen, Routes: c.Join, Auth: bus.Auth{User: c.User, Password: c.Password},
			TLS: bus.TLSFiles{Cert: c.TLSCert, Key: c.TLSKey, CA: c.TLSCA, Verify: c.TLSCA != ""}}
		if bc.Listen == "" {
			// Routing needs a client listener; keep it on loopback.
			bc.Listen = "127.0.0.1:0"
		}
		bc.JetStream.Replicas = registryReplicas(cfg)
	}
	bc.JetStream.StoreDir = c.StoreDir
	return bc
}

// registryReplicas is the registry's replication: R3 once the cluster has
// three nodes (this one and the routes it joins), else one per node.
func registryReplicas(cfg serveConfig) int {
	if cfg.Cluster.RouteListen == "" {
		return 1
	}
	return min(3, len(cfg.Cluster.Join)+1)
}

// startNode starts the bus, loads the model and starts every replica's
// layer-shard actors, KV-managers and schedulers.
func startNode(ctx context.Context, cfg serveConfig, tp *trace.Provider, log io.Writer) (_ *node, err error) {
	n := &node{spawned: map[string]func(){}, owners: map[string]string{}, weights: map[[2]int]*sharedWeights{}, cfg: cfg, version: buildVersion(), tp: tp, log: log}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	bc := busConfig(cfg)
	if bc.Cluster.Listen != "" && bc.JetStream.StoreDir == "" {
		dir, err := os.MkdirTemp("", "troupe-"+cfg.Node+"-")
		if err != nil {
			return nil, fmt.Errorf("serve: store dir: %w", err)
		}
		n.closers = append(n.closers, func() { os.RemoveAll(dir) })
		bc.JetStream.StoreDir = dir
	}
	if n.bus, err = bus.Start(ctx, bc); err != nil {
		return nil, fmt.Errorf("serve: bus: %w", err)
	}
	n.closers = append(n.closers, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		n.bus.Shutdown(sctx)
	})
	if n.nc, err = n.bus.Conn(ctx); err != nil {
		return nil, fmt.Errorf("serve: bus: %w", err)
	}
	n.closers = append(n.closers, n.nc.Close)
	if n.subj, err = bus.NewSubjects(cfg.Cluster.Name); err != nil {
		return nil, err
	}
	// The model and device outlive every actor that uses them.
	if n.bundle, err = openBundle(ctx, cfg.Model, log); err != nil {
		return nil, err
	}
	n.closers = append(n.closers, func() { n.bundle.Close() })
	if n.bundle.Tokenizer == nil {
		return nil, fmt.Errorf("serve: %s has no tokenizer.json", n.bundle.Name)
	}
	if n.tok, err = tokenizer.Parse(n.bundle.Tokenizer); err != nil {
		return nil, fmt.Errorf("serve: tokenizer.json: %w", err)
	}
	if n.dev, err = n.openDevices(ctx); err != nil {
		return nil, err
	}
	n.closers = append(n.closers, func() { n.dev.Close() })
	// Resources of spawned actors are released after the actors stop.
	n.closers = append(n.closers, n.closeSpawned)
	if n.actors, err = actors.NewSystem(actors.Config{Cluster: cfg.Cluster.Name, Node: cfg.Node, Version: n.version.semver()}, n.nc); err != nil {
		return nil, err
	}
	n.closers = append(n.closers, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n.actors.Shutdown(sctx)
	})
	js, err := jetstream.New(n.nc)
	if err != nil {
		return nil, fmt.Errorf("serve: jetstream: %w", err)
	}
	if n.registry, err = openRegistry(ctx, js, n.subj, bc.JetStream.Replicas); err != nil {
		return nil, err
	}
	if cfg.KeptResponses > 0 {
		// With a store directory of the operator's, kept responses outlive
		// a restart of the whole cluster.
		storage := bus.StorageMemory
		if cfg.Cluster.StoreDir != "" {
			storage = bus.StorageFile
		}
		if n.responses, err = openResponses(ctx, js, n.subj, storage, bc.JetStream.Replicas, cfg.KeptResponses); err != nil {
			return nil, err
		}
	}
	names, err := claimNames(ctx, n.registry, cfg.Node, cfg.Group, log)
	if err != nil {
		return nil, err
	}
	mc := n.bundle.Config
	if n.cacheDT, err = kvCacheType(cfg.KVCache, cfg.Device); err != nil {
		return nil, err
	}
	what := fmt.Sprintf("%d replica(s) of %d stage(s)", cfg.Replicas, cfg.Shards)
	if cfg.Placement != "" {
		what = "placements " + cfg.Placement
		if cfg.Group != "" {
			what += " of group " + cfg.Group
		}
	}
	fmt.Fprintf(log, "loading %s (%s) on %s: %s\n", n.bundle.Name, mc.Describe(), n.dev.Name(), what)
	var kvNote string
	if n.blocks, n.kvAuto, kvNote, err = kvBlocks(cfg, mc, models.LoadedBytes(mc, n.bundle.Checkpoint), n.cacheDT, n.dev); err != nil {
		return nil, err
	}
	if kvNote != "" {
		fmt.Fprintln(log, kvNote)
	}
	// The device actor owns the device: every shard on it runs its forward
	// passes there, one at a time.
	if n.device, err = actors.Spawn(ctx, n.actors, scheduler.DeviceProps(cfg.Node+"-0", n.dev)); err != nil {
		return nil, fmt.Errorf("serve: device actor: %w", err)
	}
	n.plane = xgmi.NewHost(cfg.Node)
	runCtx, cancel := context.WithCancel(context.Background())
	n.cancel, n.runCtx = cancel, runCtx
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		names.keep(runCtx)
	}()
	// A shard stopped by anyone (a resize here, another node's scheduler
	// through the spawner) gives its weights and cache back.
	evs := n.actors.Subscribe(1024)
	n.closers = append(n.closers, evs.Close)
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		n.releaseStopped(runCtx, evs)
	}()
	if err := n.startDataPlane(ctx, runCtx); err != nil {
		return nil, err
	}
	if cfg.OrphanGrace > 0 {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			n.reapOrphans(runCtx, cfg.OrphanGrace)
		}()
	}
	scfg := actors.DefaultSpawnerConfig()
	scfg.Kinds[scheduler.ShardKind] = n.spawnShard
	sp, err := actors.StartSpawner(ctx, n.actors, n.registry, scfg)
	if err != nil {
		return nil, fmt.Errorf("serve: spawner: %w", err)
	}
	n.closers = append(n.closers, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		sp.Close(sctx)
	})
	if n.view, err = startClusterView(runCtx, n.nc, n.subj, n.registry, &n.wg); err != nil {
		return nil, err
	}
	n.backend = &backend{client: scheduler.NewClient(n.nc, n.subj, n.bundle.Name), maxQueue: cfg.MaxQueue, overBus: cfg.submitOverBus}
	replicas := cfg.Replicas
	if cfg.Placement != "" {
		n.shape = shape{placement: cfg.Placement}
		replicas = max(1, cfg.Replicas)
		if cfg.Group != "" {
			n.publish(nil)
			n.wg.Add(1)
			go func() {
				defer n.wg.Done()
				started := time.Now()
				// The shape of the groups as they last ran here: giving the
				// key up, they are gone a moment before it is.
				var kept replicasDoc
				entry := func() actors.Entry {
					if st := n.declared(); st.Replicas > 0 {
						kept = st
					}
					st, _ := json.Marshal(kept)
					return actors.Entry{Kind: groupKind, ID: cfg.Group, Node: cfg.Node, Started: started, Status: actors.StatusRunning, State: string(st)}
				}
				n.registry.Lead(runCtx, entry, func(ctx context.Context, l *actors.Lease) { n.leadGroups(ctx, replicas, l) })
			}()
			return n, nil
		}
	} else {
		if cfg.Shards > mc.Layers {
			return nil, fmt.Errorf("serve: %d stages for %d layers", cfg.Shards, mc.Layers)
		}
		n.shape = shape{stages: cfg.Shards}
	}
	n.resizeMu.Lock()
	defer n.resizeMu.Unlock()
	var reps []*replica
	for r := 0; r < replicas; r++ {
		rep, err := n.startReplica(ctx, n.shape)
		if err != nil {
			return nil, err
		}
		reps = append(reps, rep)
		n.publish(reps)
	}
	n.started = true
	n.publish(reps)
	return n, nil
}

func openRegistry(ctx context.Context, js jetstream.JetStream, subj bus.Subjects, replicas int) (*actors.Registry, error) {
	rc := actors.DefaultRegistryConfig()
	rc.Bucket = subj.RegistryBucket()
	rc.Replicas = replicas
	reg, err := untilOpen(ctx, func(ctx context.Context) (*actors.Registry, error) { return actors.OpenRegistry(ctx, js, rc) })
	if err != nil {
		return nil, fmt.Errorf("serve: registry (%d replicas): %w", replicas, err)
	}
	return reg, nil
}

// untilOpen calls open, 5 s at a time, until it succeeds or 2 minutes
// pass: a replicated bucket needs its peers, and its stream a leader, so
// it waits for the cluster to form.
func untilOpen[T any](ctx context.Context, open func(context.Context) (T, error)) (T, error) {
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		octx, ocancel := context.WithTimeout(wctx, 5*time.Second)
		v, err := open(octx)
		ocancel()
		if err == nil {
			return v, nil
		}
		select {
		case <-wctx.Done():
			return v, err
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// keptResponseBytes bounds the bytes of the cluster's kept responses.
const keptResponseBytes = 256 << 20

// openResponses opens the cluster's bucket of kept responses, at most max
// of them; the node that makes it chooses its storage.
func openResponses(ctx context.Context, js jetstream.JetStream, subj bus.Subjects, storage bus.Storage, replicas, max int) (*bus.Cache, error) {
	cfg := bus.CacheConfig{Bucket: subj.ResponsesBucket(), MaxValues: int64(max), MaxBytes: keptResponseBytes, Storage: storage, Replicas: replicas}
	c, err := untilOpen(ctx, func(ctx context.Context) (*bus.Cache, error) { return bus.OpenCache(ctx, js, cfg) })
	if err != nil {
		return nil, fmt.Errorf("serve: kept responses: %w", err)
	}
	return c, nil
}

// replicaID names replica r scheduled by this node; node names keep it
// unique in the cluster. The replicas of a named group (--group) are
// named for the group, whichever node schedules them, so that a node
// taking the group over finds its stages running.
func (n *node) replicaID(r int) string {
	if n.cfg.Group != "" {
		return fmt.Sprintf("%s-r%d", n.cfg.Group, r)
	}
	return fmt.Sprintf("%s-r%d", n.cfg.Node, r)
}

// groupKind is the registry kind of a named group's key: the node that
// holds it schedules the group.
const groupKind = "group"

// leadGroups schedules replicas replica groups of the node's placements
// while this node holds its group's key (ctx, l), then stops them here; or,
// taking the group over, as many and as placed as the last holder said in
// l.Last. It leaves their stages running on their nodes for the next node
// that takes the group over. A group that does not start gives the key up.
func (n *node) leadGroups(ctx context.Context, replicas int, l *actors.Lease) {
	last := l.Last
	n.resizeMu.Lock()
	var was replicasDoc
	switch err := json.Unmarshal([]byte(last.State), &was); {
	case last.Node == "":
	case err != nil || was.Replicas < 1 || was.Placement == "":
		fmt.Fprintf(n.log, "node %s: group %s: %s left no shape (%q): starting as configured\n", n.cfg.Node, n.cfg.Group, last.Node, last.State)
	default:
		if _, err := parsePlacements(was.Placement); err != nil {
			fmt.Fprintf(n.log, "node %s: group %s: the placement %s left: %v: starting as configured\n", n.cfg.Node, n.cfg.Group, last.Node, err)
			break
		}
		replicas = was.Replicas
		n.replicasMu.Lock()
		n.shape = shape{placement: was.Placement}
		n.replicasMu.Unlock()
		fmt.Fprintf(n.log, "node %s: takes group %s over from %s: %s\n", n.cfg.Node, n.cfg.Group, last.Node, was)
	}
	n.leading, n.lease, n.nextRep = ctx, l, 0
	var reps []*replica
	var err error
	for r := 0; r < replicas && err == nil; r++ {
		var rep *replica
		if rep, err = n.startReplica(ctx, n.shape); err == nil {
			reps = append(reps, rep)
			n.publish(reps)
		}
	}
	n.resizeMu.Unlock()
	if err != nil {
		fmt.Fprintf(n.log, "node %s: group %s: %v\n", n.cfg.Node, n.cfg.Group, err)
	} else {
		fmt.Fprintf(n.log, "node %s: schedules group %s\n", n.cfg.Node, n.cfg.Group)
		<-ctx.Done()
	}
	n.resizeMu.Lock()
	defer n.resizeMu.Unlock()
	n.leading, n.lease = nil, nil
	n.replicasMu.Lock()
	reps = slices.Clone(n.replicas)
	n.replicasMu.Unlock()
	n.publish(nil)
	// At once: another node may start the group a moment after this
	// one's key lapses, on the same stages.
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for _, rep := range reps {
		n.retire(done, rep, false)
	}
	if err == nil {
		why := ""
		if lost := l.Lost(); lost != nil {
			why = ": its key was lost: " + lost.Error()
		}
		fmt.Fprintf(n.log, "node %s: no longer schedules group %s%s\n", n.cfg.Node, n.cfg.Group, why)
	}
}

// replica is a replica this node schedules: its scheduler and the actors
// it started here.
type replica struct {
	id     string
	shape  shape
	group  *group // the placements of a replica group; nil for a local replica
	sched  *scheduler.Scheduler
	svc    *scheduler.Service
	cancel context.CancelFunc
	done   chan struct{}
	actors []actors.Process // local shards, then the KV-manager
}

// startReplica starts the next replica, shaped by sh: local stages, or a
// replica group over placements. The caller holds resizeMu.
func (n *node) startReplica(ctx context.Context, sh shape) (*replica, error) {
	id := n.replicaID(n.nextRep)
	n.nextRep++
	if sh.placement != "" {
		runCtx := n.runCtx
		if n.cfg.Group != "" {
			if n.leading == nil {
				return nil, fmt.Errorf("node %s stands by for group %s: its scheduling node changes it", n.cfg.Node, n.cfg.Group)
			}
			runCtx = n.leading
		}
		return n.startGroup(ctx, runCtx, id, sh.placement)
	}
	if n.tpd != nil && sh.stages == 1 {
		return n.startTPReplica(ctx, n.runCtx, id)
	}
	return n.startLocalReplica(ctx, n.runCtx, id, sh.stages)
}

// startLocalReplica runs replica id entirely in this process: its
// stageCount pipeline stages, its KV-manager and its scheduler.
func (n *node) startLocalReplica(ctx, runCtx context.Context, id string, stageCount int) (*replica, error) {
	mc := n.bundle.Config
	blocks, err := n.addedBlocks(stageCount)
	if err != nil {
		return nil, err
	}
	rep := &replica{id: id, shape: shape{stages: stageCount}}
	var stages []string
	for s := 0; s < stageCount; s++ {
		span := stageSpan(s, stageCount, mc.Layers)
		args := scheduler.ShardArgs{Model: n.bundle.Name, Replica: rep.id, Index: s,
			First: span[0], Last: span[1], Blocks: blocks, BlockSize: 16}
		p, err := n.startStage(ctx, scheduler.ShardID(rep.id, s), args)
		if err != nil {
			n.stopActors(rep)
			return nil, err
		}
		rep.actors = append(rep.actors, p)
		stages = append(stages, p.Subject()+".forward")
	}
	kv, kvRef, err := n.startKV(ctx, rep.id, blocks)
	if err != nil {
		n.stopActors(rep)
		return nil, err
	}
	rep.actors = append(rep.actors, kvRef)
	pipe := scheduler.NewPipeline(n.nc, stages, n.plane, mc.Vocab)
	pipe.MicroBatches = n.cfg.MicroBatches
	// The stages run in this process: the scheduler reaches them through
	// their mailboxes, not the bus.
	for s, p := range rep.actors[:len(stages)] {
		if ref, ok := p.(*actors.Ref[scheduler.ShardCall]); ok {
			if err := pipe.Local(s, ref); err != nil {
				n.stopActors(rep)
				return nil, err
			}
		}
	}
	if err := n.startScheduler(runCtx, pipe, kv, rep); err != nil {
		n.stopActors(rep)
		return nil, err
	}
	return rep, nil
}

// stageSpan is the layers [first, last) of stage s of a local replica of
// stages stages over layers layers.
func stageSpan(s, stages, layers int) [2]int {
	return [2]int{s * layers / stages, (s + 1) * layers / stages}
}

// stopActors stops a replica's actors and frees their memory.
func (n *node) stopActors(rep *replica) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, p := range rep.actors {
		p.Stop(ctx)
		n.release(p.Address().ID)
	}
	rep.actors = nil
}

// startKV spawns replica's KV-manager, over a pool of blocks blocks, and
// returns a client of it.
func (n *node) startKV(ctx context.Context, replica string, blocks int) (*scheduler.KVClient, actors.Process, error) {
	pool, err := scheduler.NewKV(blocks, 16)
	if err != nil {
		return nil, nil, err
	}
	ref, err := actors.Spawn(ctx, n.actors, scheduler.KVManagerProps(replica, pool))
	if err != nil {
		return nil, nil, fmt.Errorf("serve: kv-manager %s: %w", replica, err)
	}
	kv, err := scheduler.NewKVClient(context.WithoutCancel(ctx), n.nc, n.subj, replica)
	if err != nil {
		return nil, ref, fmt.Errorf("serve: %w", err)
	}
	// The KV-manager runs in this process: the scheduler reaches it
	// through its mailbox.
	kv.Local(ref)
	return kv, ref, nil
}

// startScheduler starts rep's scheduler over engine e and kv; it runs until
// rep.cancel or the node's end.
func (n *node) startScheduler(runCtx context.Context, e scheduler.Engine, kv scheduler.Blocks, rep *replica) error {
	mc := n.bundle.Config
	sc := scheduler.Config{MaxQueue: n.cfg.MaxQueue, MaxBatchTokens: n.cfg.MaxBatchTokens, MaxSeqs: n.cfg.MaxSeqs, Context: mc.MaxPositions, Vocab: mc.Vocab, EOS: mc.EOS}
	s, err := scheduler.New(sc, e, kv, n.tp.TracerProvider())
	if err != nil {
		return err
	}
	svc, err := scheduler.Serve(runCtx, n.nc, n.subj, n.bundle.Name, s, scheduler.Text{
		Detok: func() generate.Detokenizer { return n.tok.NewDecoder(true) },
		Bytes: n.tok.TokenBytes,
	}, n.version.semver())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(runCtx)
	rep.sched, rep.svc, rep.cancel, rep.done = s, svc, cancel, make(chan struct{})
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		defer close(rep.done)
		s.Run(ctx)
	}()
	return nil
}

// groupDrain bounds the drain of a group's scheduling node: the requests
// sent meanwhile wait for the standby that takes the group over once the
// drain ends (for up to scheduler.SubmitWait, 30 s), so the drain, the
// registry's TTL and the takeover's start must fit in that wait.
const groupDrain = 10 * time.Second

// drain finishes the requests this node's replicas took, for up to
// timeout (groupDrain for a group), before the node stops. Each scheduler
// takes no new request, which goes to another scheduler of the model, or
// waits for a standby to take the group over, and ends those it has. A
// group's key is held meanwhile: its standby takes the group over when
// nothing is left to lose.
func (n *node) drain(timeout time.Duration) {
	if n.cfg.Group != "" {
		timeout = min(timeout, groupDrain)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	n.replicasMu.Lock()
	reps := slices.Clone(n.replicas)
	n.replicasMu.Unlock()
	var wg sync.WaitGroup
	for _, rep := range reps {
		wg.Go(func() {
			if err := rep.svc.Drain(ctx); err != nil && rep.svc.Active() > 0 {
				fmt.Fprintf(n.log, "replica %s: %v: ending %d requests\n", rep.id, err, rep.svc.Active())
			}
		})
	}
	wg.Wait()
}

// Close stops the actors and releases everything, in reverse order.
func (n *node) Close() {
	if n.cancel != nil {
		n.cancel()
	}
	n.wg.Wait()
	n.replicasMu.Lock()
	for _, rep := range n.replicas {
		rep.svc.Close()
	}
	n.replicasMu.Unlock()
	for i := len(n.closers) - 1; i >= 0; i-- {
		n.closers[i]()
	}
	n.closers = nil
}

func (n *node) closeSpawned() {
	n.spawnedMu.Lock()
	fs := n.spawned
	n.spawned = map[string]func(){}
	n.spawnedMu.Unlock()
	for _, f := range fs {
		f()
	}
}

// releaseStopped frees the resources of each shard that stops, until ctx
// ends (Close frees those of the shards still running).
func (n *node) releaseStopped(ctx context.Context, evs *actors.Events) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-evs.C:
			if !ok {
				return
			}
			if ev.Actor.Kind == scheduler.ShardKind && ev.Type == actors.EventStopped && n.release(ev.Actor.ID) {
				fmt.Fprintf(n.log, "node %s: shard %s stopped, memory freed\n", n.cfg.Node, ev.Actor.ID)
			}
		}
	}
}

// reapOrphans stops the shards of this node whose replica has had no
// KV-manager in the registry for grace: the node that scheduled it is
// gone, and no other took its group over. A registry that cannot be read
// stops nothing.
func (n *node) reapOrphans(ctx context.Context, grace time.Duration) {
	t := time.NewTicker(max(grace/4, 100*time.Millisecond))
	defer t.Stop()
	orphaned := map[string]time.Time{} // replica -> when it was first found without a KV-manager
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n.spawnedMu.Lock()
		byReplica := map[string][]string{}
		for id, replica := range n.owners {
			byReplica[replica] = append(byReplica[replica], id)
		}
		n.spawnedMu.Unlock()
		for replica := range orphaned {
			if byReplica[replica] == nil {
				delete(orphaned, replica)
			}
		}
		for replica, ids := range byReplica {
			gctx, cancel := context.WithTimeout(ctx, time.Second)
			rec, err := n.registry.Get(gctx, bus.KVManagerKind, replica)
			cancel()
			switch {
			case err == nil && rec.Alive:
				delete(orphaned, replica)
				continue
			case err != nil && !errors.Is(err, actors.ErrNotRegistered):
				continue // the registry cannot tell
			}
			first, ok := orphaned[replica]
			if !ok {
				orphaned[replica] = time.Now()
				continue
			}
			if time.Since(first) < grace {
				continue
			}
			delete(orphaned, replica)
			for _, id := range ids {
				p, ok := n.actors.Lookup(scheduler.ShardKind, id)
				if !ok {
					continue
				}
				fmt.Fprintf(n.log, "node %s: shard %s: replica %s has had no scheduler for %v: stopping it\n", n.cfg.Node, id, replica, grace)
				sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				p.Stop(sctx)
				cancel()
			}
		}
	}
}

// release frees the resources of the stopped shard id, if it holds any.
func (n *node) release(id string) bool {
	n.spawnedMu.Lock()
	f := n.spawned[id]
	delete(n.spawned, id)
	delete(n.owners, id)
	n.spawnedMu.Unlock()
	if f != nil {
		f()
	}
	return f != nil
}

// backend adapts the scheduler client to the gateway. Requests go to the
// schedulers of this process's replicas directly (scheduler.Client.Local),
// and over the bus to the model's queue group on a node without replicas.
type backend struct {
	client   *scheduler.Client
	maxQueue int
	overBus  bool // the replicas here too are reached over the bus

	mu     sync.Mutex
	scheds []*scheduler.Scheduler
}

// setScheds records the schedulers whose state Ready and Stats report,
// and that take the gateway's requests: a replica left out (one that
// drains) gets no new request from here.
func (b *backend) setScheds(reps []*replica) {
	scheds := make([]*scheduler.Scheduler, len(reps))
	svcs := make([]*scheduler.Service, len(reps))
	for i, r := range reps {
		scheds[i], svcs[i] = r.sched, r.svc
	}
	b.mu.Lock()
	b.scheds = scheds
	b.mu.Unlock()
	if !b.overBus {
		b.client.Local(svcs...)
	}
}

func (b *backend) schedulers() []*scheduler.Scheduler {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.scheds
}

// tokenLogprobs pairs a frame's most likely tokens with their
// log-probabilities.
func tokenLogprobs(ids []int32, lps []float32) []gateway.TokenLogprob {
	var out []gateway.TokenLogprob
	for i, id := range ids {
		if i < len(lps) {
			out = append(out, gateway.TokenLogprob{ID: id, Logprob: lps[i]})
		}
	}
	return out
}

func (b *backend) Generate(ctx context.Context, req gateway.GenerateRequest, emit func(gateway.Token) error) (gateway.Finish, error) {
	m := scheduler.SubmitMsg{
		ID: req.RequestID, Tenant: req.Tenant, Prompt: req.Prompt, MaxTokens: req.MaxTokens,
		Temperature: req.Temperature, TopP: req.TopP, TopK: req.TopK, MinP: req.MinP, RepetitionPenalty: req.RepetitionPenalty,
		PresencePenalty: req.PresencePenalty, FrequencyPenalty: req.FrequencyPenalty, LogitBias: req.LogitBias,
		Stop: req.Stop, IgnoreEOS: req.IgnoreEOS, Logprobs: req.Logprobs, TopLogprobs: req.TopLogprobs,
		PromptLogprobs: req.PromptLogprobs, JSON: req.JSON, JSONSchema: req.Schema, JSONCompact: req.CompactJSON,
	}
	if req.Seed != nil {
		m.HasSeed, m.Seed = true, *req.Seed
	}
	var started time.Time
	final, err := b.client.Generate(ctx, m, func(f scheduler.FrameMsg) error {
		now := time.Now()
		queued, sinceStart, _ := f.Timings()
		if started.IsZero() {
			started = now.Add(-sinceStart)
		}
		t := gateway.Token{ID: f.ID, Text: f.Text, Logprob: f.Logprob, TraceID: f.TraceID, QueuedAt: started.Add(-queued), StartedAt: started, EmittedAt: now}
		t.TopLogprobs = tokenLogprobs(f.TopIDs, f.TopLPs)
		for _, p := range f.Prompt {
			t.Prompt = append(t.Prompt, gateway.PromptLogprob{ID: p.ID, Logprob: p.Logprob, Top: tokenLogprobs(p.TopIDs, p.TopLPs)})
		}
		return emit(t)
	})
	fin := gateway.Finish{Reason: final.Reason, PromptTokens: final.PromptTokens, CompletionTokens: final.CompletionTokens, CachedTokens: final.CachedTokens}
	var be *bus.Error
	switch {
	case errors.As(err, &be) && be.Code == bus.CodeOverloaded:
		return fin, &gateway.OverloadedError{RetryAfter: scheduler.RetryAfter, Reason: be.Description}
	case errors.As(err, &be) && be.Code == bus.CodeBadRequest:
		return fin, fmt.Errorf("%w: %s", gateway.ErrInvalidRequest, be.Description)
	case err != nil:
		if ctx.Err() != nil {
			fin.Reason = gateway.FinishCancelled
		}
		return fin, err
	}
	switch {
	case final.Reason == "error":
		return fin, errors.New(final.Err)
	case final.Reason == "cancelled" && final.Err != "":
		// The scheduler ended it (stopping past its drain), not the client:
		// a cut request fails rather than passing for a whole one.
		return fin, fmt.Errorf("the request was ended unfinished: %s", final.Err)
	}
	return fin, nil
}

func (b *backend) Ready() (bool, string) {
	scheds := b.schedulers()
	if len(scheds) == 0 {
		// Requests go to the cluster's schedulers over the bus.
		return true, ""
	}
	for _, s := range scheds {
		if s.Stats().Waiting < b.maxQueue {
			return true, ""
		}
	}
	return false, "every scheduler's queue is full"
}

// Stats implements gateway.StatsSource.
func (b *backend) Stats() gateway.Stats {
	var st gateway.Stats
	var used, total int
	for _, s := range b.schedulers() {
		x := s.Stats()
		st.QueueDepth += x.Waiting
		st.Running += x.Running
		used += x.KV.Used
		total += x.KV.Blocks
	}
	if total > 0 {
		st.KVUsage = float64(used) / float64(total)
	}
	return st
}
