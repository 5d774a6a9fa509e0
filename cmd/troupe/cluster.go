package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/troupe/troupe/actors"
	"github.com/troupe/troupe/bus"
	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/scheduler"
	"github.com/troupe/troupe/xgmi"
)

// The cluster side of a node: the data-plane listener and its address
// actor, the layer-shard factory of the spawner, replica groups placed
// across nodes, and the cluster view served at /v1/cluster.

// planeKind is the actor kind that answers a node's data-plane address.
const planeKind = "plane"

// PlaneAddr is the request and reply of a plane actor's "addr" endpoint.
type PlaneAddr struct {
	Addr string `msgpack:"addr"`
}

// Schema implements bus.Message.
func (PlaneAddr) Schema() bus.Schema { return bus.Schema{ID: "troupe.plane.addr", Version: 1} }

type planeCall = *actors.Call[PlaneAddr, PlaneAddr]

type planeActor struct{ addr string }

func (a planeActor) Receive(_ context.Context, c planeCall) error {
	return c.Reply(PlaneAddr{Addr: a.addr})
}

// dataKey derives the data plane's shared key from the cluster's
// credentials, so that only holders of the bus credentials can fetch.
func dataKey(c clusterConfig) []byte {
	h := sha256.New()
	fmt.Fprintf(h, "troupe data plane\x00%s\x00%s\x00%s", c.Name, c.User, c.Password)
	return h.Sum(nil)
}

// startDataPlane serves this node's host buffers to peers and connects the
// stream client that reads theirs, when the node is clustered.
func (n *node) startDataPlane(ctx, runCtx context.Context) error {
	listen := n.cfg.DataListen
	if listen == "" && n.cfg.Cluster.RouteListen != "" {
		host, _, err := net.SplitHostPort(n.cfg.Cluster.RouteListen)
		if err != nil {
			return fmt.Errorf("serve: --route-listen: %w", err)
		}
		listen = net.JoinHostPort(host, "0")
	}
	if listen == "" {
		return nil
	}
	scfg := xgmi.DefaultStreamConfig()
	scfg.Key = dataKey(n.cfg.Cluster)
	tlsCfg, err := dataTLS(n.cfg.Cluster)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	scfg.TLS = tlsCfg
	srv, err := xgmi.NewStreamServer(n.plane, scfg)
	if err != nil {
		return fmt.Errorf("serve: data plane: %w", err)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("serve: data plane: %w", err)
	}
	addr := ln.Addr().(*net.TCPAddr)
	if addr.IP.IsUnspecified() {
		ln.Close()
		return fmt.Errorf("serve: data plane listens on %s: give a reachable host in --data-listen", addr)
	}
	n.dataAddr = addr.String()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if err := srv.Serve(runCtx, ln); err != nil {
			fmt.Fprintf(n.log, "data plane: %v\n", err)
		}
	}()
	if _, err := actors.Spawn(ctx, n.actors, actors.Props[planeCall]{
		Kind: planeKind, ID: n.cfg.Node,
		New:         func() actors.Actor[planeCall] { return planeActor{n.dataAddr} },
		Description: "data-plane address of node " + n.cfg.Node,
		Endpoints: []actors.Endpoint[planeCall]{
			actors.Handle("addr", func(c *actors.Call[PlaneAddr, PlaneAddr]) planeCall { return c }),
		},
	}); err != nil {
		return fmt.Errorf("serve: plane actor: %w", err)
	}
	n.stream, err = xgmi.NewStreamClient(scfg, n.resolvePlane)
	if err != nil {
		return fmt.Errorf("serve: data plane: %w", err)
	}
	n.closers = append(n.closers, n.stream.Close)
	return nil
}

// resolvePlane asks node's plane actor for its data-plane address. A node
// that has just joined may not be known yet to this node's server (the
// routes of a cluster form one by one), so nobody answering is retried
// for a while before the node counts as unreachable.
func (n *node) resolvePlane(ctx context.Context, node string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	subject := n.subj.ActorEndpoint(planeKind, node, "addr")
	for {
		r, err := bus.Request[PlaneAddr, PlaneAddr](ctx, n.nc, subject, PlaneAddr{})
		if bus.CodeOf(err) != bus.CodeUnavailable {
			return r.Addr, err
		}
		select {
		case <-ctx.Done():
			return "", err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// spawnShard is the spawner's factory of layer-shards: args are
// scheduler.ShardArgs. Spawning a shard that already runs returns it.
func (n *node) spawnShard(ctx context.Context, sys *actors.System, id string, raw []byte) (actors.Process, error) {
	if p, ok := sys.Lookup(scheduler.ShardKind, id); ok {
		return p, nil
	}
	var args scheduler.ShardArgs
	if err := bus.Decode(raw, &args); err != nil {
		return nil, bus.Errorf(bus.CodeBadRequest, "shard %s: %w", id, err)
	}
	if args.Model != n.bundle.Name {
		return nil, bus.Errorf(bus.CodeBadRequest, "shard %s: node %s serves %s, not %s", id, n.cfg.Node, n.bundle.Name, args.Model)
	}
	if err := args.Validate(n.bundle.Config.Layers); err != nil {
		return nil, bus.Errorf(bus.CodeBadRequest, "shard %s: %w", id, err)
	}
	return n.startStage(ctx, id, args)
}

// startStage starts stage id of a replica as args say: as --tp ranks on
// a tensor-parallel node, else as one layer-shard.
func (n *node) startStage(ctx context.Context, id string, args scheduler.ShardArgs) (actors.Process, error) {
	if n.tpd != nil {
		return n.startTPShard(ctx, id, args)
	}
	return n.startShard(ctx, id, args)
}

// startShard loads layers [args.First, args.Last) and starts their actor.
func (n *node) startShard(ctx context.Context, id string, args scheduler.ShardArgs) (actors.Process, error) {
	span := [2]int{args.First, args.Last}
	m, err := n.acquireWeights(span)
	if err != nil {
		return nil, fmt.Errorf("shard %s: %w", id, err)
	}
	cache, err := m.NewCache(args.Blocks, args.BlockSize)
	if err != nil {
		n.releaseWeights(span)
		return nil, fmt.Errorf("shard %s: %w", id, err)
	}
	sh := scheduler.NewShard(id, args.Index, m, cache, n.plane, n.tp.TracerProvider())
	sh.Device = n.device
	sh.QueueAhead = n.cfg.Device == "cuda"
	if n.stream != nil {
		sh.Remote = n.stream
	}
	ref, err := actors.Spawn(ctx, n.actors, sh.Props())
	if err != nil {
		cache.Close()
		n.releaseWeights(span)
		return nil, fmt.Errorf("serve: spawn %s: %w", id, err)
	}
	n.spawnedMu.Lock()
	n.spawned[id] = func() { cache.Close(); n.releaseWeights(span) }
	n.owners[id] = args.Replica
	n.spawnedMu.Unlock()
	fmt.Fprintf(n.log, "node %s: shard %s runs layers [%d, %d)\n", n.cfg.Node, id, args.First, args.Last)
	return ref, nil
}

// sharedWeights are the loaded weights of one layer range, shared by the
// shards of that range on this node (of replicas with the same
// placement); each shard has its own KV cache.
type sharedWeights struct {
	m    *models.Model
	refs int
}

// acquireWeights returns the weights of layers [span[0], span[1]), loading
// them if no shard here holds them. The shards sharing them run their
// forward passes one at a time on the node's device actor, which is what
// makes sharing the model's scratch buffers safe.
func (n *node) acquireWeights(span [2]int) (*models.Model, error) {
	n.weightsMu.Lock()
	defer n.weightsMu.Unlock()
	if w := n.weights[span]; w != nil {
		w.refs++
		return w.m, nil
	}
	m, err := models.Load(n.bundle.Config, n.bundle.Checkpoint, n.dev, models.Options{FirstLayer: span[0], LastLayer: span[1], MaxTokens: n.cfg.MaxBatchTokens, MaxSeqs: n.cfg.MaxSeqs, CacheDType: n.cacheDT, CodeWeights: n.cfg.CodeWeights,
		Progress: loadProgress(n.log, 0)})
	if err != nil {
		return nil, err
	}
	n.weights[span] = &sharedWeights{m: m, refs: 1}
	return m, nil
}

// releaseWeights drops a shard's hold on the weights of span, freeing them
// with the last.
func (n *node) releaseWeights(span [2]int) {
	n.weightsMu.Lock()
	defer n.weightsMu.Unlock()
	w := n.weights[span]
	if w == nil {
		return
	}
	if w.refs--; w.refs == 0 {
		delete(n.weights, span)
		w.m.Close()
	}
}

// parsePlacements reads a placement spec: placements separated by ';', in
// order of preference, each a ','-separated list of the nodes of its
// stages, first layers first ("a,b,c;a": three stages on a, b and c, and a
// whole copy on a).
func parsePlacements(spec string) ([][]string, error) {
	var out [][]string
	for i, p := range strings.Split(spec, ";") {
		var nodes []string
		for _, f := range strings.Split(p, ",") {
			f = strings.TrimSpace(f)
			if f == "" || f != bus.Token(f) {
				return nil, fmt.Errorf("placement %d: node %q: want a non-empty name of letters, digits, '-' or '_'", i, f)
			}
			nodes = append(nodes, f)
		}
		out = append(out, nodes)
	}
	if len(out) == 0 || len(out) > 16 {
		return nil, fmt.Errorf("placement %q: want 1..16 placements", spec)
	}
	return out, nil
}

// group is a replica group: one scheduler and KV-manager over a Failover
// of placements whose stages run on the nodes the placements name.
type group struct {
	replica string
	plans   [][]scheduler.Stage
	fo      *scheduler.Failover
	stop    context.CancelFunc // ends the watcher
	done    chan struct{}      // closed when the watcher has returned
}

func (g *group) stageID(p, s int) string {
	return scheduler.ShardID(fmt.Sprintf("%s-p%d", g.replica, p), s)
}

// startGroup spawns every placement's stages on their nodes, then the
// group's KV-manager and scheduler, and a watcher that marks placements
// with a dead node down and restores them once the node is back. On an
// error it stops what it started.
func (n *node) startGroup(ctx, runCtx context.Context, id, spec string) (_ *replica, err error) {
	specs, err := parsePlacements(spec)
	if err != nil {
		return nil, fmt.Errorf("serve: --placement: %w", err)
	}
	mc := n.bundle.Config
	g := &group{replica: id}
	rep := &replica{id: id, shape: shape{placement: spec}, group: g}
	defer func() {
		if err != nil {
			// A named group's stages are the group's, whichever node
			// schedules it: the next one uses them.
			if n.cfg.Group == "" {
				n.stopStages(g)
			}
			n.stopActors(rep)
		}
	}()
	var engines []scheduler.Engine
	var names []string
	var down []int
	for p, nodes := range specs {
		plan, err := scheduler.Plan(mc.Layers, nodes)
		if err != nil {
			return nil, fmt.Errorf("serve: --placement: %w", err)
		}
		g.plans = append(g.plans, plan)
		// A placement with a node known dead, or found dead while its
		// stages start (a node taking a group over after its scheduling
		// node died), starts down; the watcher brings it up when the node
		// is back.
		if !n.mayReach(plan) {
			down = append(down, p)
		} else if err := n.spawnPlacement(ctx, g, p, 2*time.Minute); errors.Is(err, errNodeDead) {
			fmt.Fprintf(n.log, "replica %s: %v\n", g.replica, err)
			down = append(down, p)
		} else if err != nil {
			return nil, err
		}
		var subjects []string
		for s := range plan {
			subjects = append(subjects, n.subj.ActorEndpoint(scheduler.ShardKind, g.stageID(p, s), "forward"))
		}
		pipe := scheduler.NewPipeline(n.nc, subjects, n.plane, mc.Vocab)
		pipe.StepTimeout = n.cfg.StepTimeout
		pipe.MicroBatches = n.cfg.MicroBatches
		if n.stream != nil {
			pipe.Remote = n.stream
		}
		// Stages on this node are reached through their mailboxes.
		for s := range plan {
			proc, ok := n.actors.Lookup(scheduler.ShardKind, g.stageID(p, s))
			if ref, isShard := proc.(*actors.Ref[scheduler.ShardCall]); ok && isShard {
				if err := pipe.Local(s, ref); err != nil {
					return nil, err
				}
			}
		}
		engines = append(engines, pipe)
		names = append(names, strings.Join(nodes, ","))
	}
	if g.fo, err = scheduler.NewFailover(engines, names, 16, n.cfg.MaxBatchTokens, mc.Vocab); err != nil {
		return nil, err
	}
	g.fo.Switched = func(from, to string, err error) {
		fmt.Fprintf(n.log, "replica %s: moved from placement %s to %s: %v\n", g.replica, from, to, err)
	}
	for _, p := range down {
		g.fo.Down(p)
		fmt.Fprintf(n.log, "replica %s: placement %s starts down: a node of it is not alive\n", g.replica, names[p])
	}
	kv, kvRef, err := n.startKV(ctx, g.replica, n.blocks)
	if kvRef != nil {
		rep.actors = append(rep.actors, kvRef)
	}
	if err != nil {
		return nil, err
	}
	if err := n.startScheduler(runCtx, g.fo, kv, rep); err != nil {
		return nil, err
	}
	wctx, stop := context.WithCancel(runCtx)
	g.stop, g.done = stop, make(chan struct{})
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		defer close(g.done)
		n.watchGroup(wctx, g)
	}()
	return rep, nil
}

// stopStages stops every stage of g's placements on their nodes, through
// their spawners; a node that is gone has nothing left to stop.
func (n *node) stopStages(g *group) {
	for p, plan := range g.plans {
		for s, st := range plan {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := actors.StopOn(ctx, n.nc, n.subj, st.Node, scheduler.ShardKind, g.stageID(p, s))
			cancel()
			if c := bus.CodeOf(err); err != nil && c != bus.CodeNotFound && c != bus.CodeUnavailable {
				fmt.Fprintf(n.log, "replica %s: stopping stage %d of placement %d on %s: %v\n", g.replica, s, p, st.Node, err)
			}
		}
	}
}

// spawnPlacement starts (or finds running) every stage of placement p,
// waiting up to wait for the nodes' spawners to answer.
func (n *node) spawnPlacement(ctx context.Context, g *group, p int, wait time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for s, st := range g.plans[p] {
		args, err := bus.Encode(scheduler.ShardArgs{Model: n.bundle.Name, Replica: g.replica, Index: s, First: st.First, Last: st.Last, Blocks: n.blocks, BlockSize: 16})
		if err != nil {
			return err
		}
		req := actors.SpawnRequest{Kind: scheduler.ShardKind, ID: g.stageID(p, s), Args: args}
		for {
			rctx, rcancel := context.WithTimeout(wctx, time.Minute)
			_, err = actors.SpawnOn(rctx, n.nc, n.subj, st.Node, req)
			rcancel()
			if err == nil {
				n.view.touch(st.Node)
				break
			}
			if c := bus.CodeOf(err); (c != bus.CodeUnavailable && c != bus.CodeDeadline) || wctx.Err() != nil {
				return fmt.Errorf("serve: stage %d of placement %d on node %s: %w", s, p, st.Node, err)
			}
			if st.Node != n.cfg.Node && !n.view.mayBeAlive(st.Node) {
				return fmt.Errorf("serve: stage %d of placement %d on node %s: %w", s, p, st.Node, errNodeDead)
			}
			select {
			case <-wctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	return nil
}

// mayReach reports whether every node of plan is this one or alive, or
// not heard of yet by a view too young to know (a cluster forming).
func (n *node) mayReach(plan []scheduler.Stage) bool {
	for _, st := range plan {
		if st.Node != n.cfg.Node && !n.view.mayBeAlive(st.Node) {
			return false
		}
	}
	return true
}

// watchGroup marks a placement down as soon as one of its nodes stops
// beating, and restores it when every node is back and its stages run
// again.
func (n *node) watchGroup(ctx context.Context, g *group) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		states := g.fo.State()
		for p, plan := range g.plans {
			alive := true
			for _, st := range plan {
				alive = alive && (st.Node == n.cfg.Node || n.view.alive(st.Node))
			}
			switch {
			case states[p].Up && !alive:
				g.fo.Down(p)
				fmt.Fprintf(n.log, "replica %s: placement %s lost a node\n", g.replica, states[p].Name)
			case !states[p].Up && alive:
				if err := n.spawnPlacement(ctx, g, p, 5*time.Second); err != nil {
					continue
				}
				g.fo.Restore(p)
				fmt.Fprintf(n.log, "replica %s: placement %s is back\n", g.replica, states[p].Name)
			}
		}
	}
}

// clusterView follows node heartbeats and reads the registry.
type clusterView struct {
	reg     *actors.Registry
	started time.Time
	mu      sync.Mutex
	seen    map[string]actors.Heartbeat // by node; guarded by mu
	at      map[string]time.Time        // local receipt time; guarded by mu
}

// deadAfter is how long a node may miss heartbeats before it counts dead.
const deadAfter = 3 * time.Second

func startClusterView(ctx context.Context, nc *nats.Conn, subj bus.Subjects, reg *actors.Registry, wg *sync.WaitGroup) (*clusterView, error) {
	v := &clusterView{reg: reg, started: time.Now(), seen: map[string]actors.Heartbeat{}, at: map[string]time.Time{}}
	sub, err := bus.Subscribe(ctx, nc, subj.HeartbeatAll(), func(_ context.Context, hb actors.Heartbeat) {
		v.mu.Lock()
		v.seen[hb.Node], v.at[hb.Node] = hb, time.Now()
		v.mu.Unlock()
	})
	if err != nil {
		return nil, fmt.Errorf("serve: heartbeats: %w", err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		sub.Unsubscribe()
	}()
	return v, nil
}

// touch records a sign of life from node other than a heartbeat.
func (v *clusterView) touch(node string) {
	v.mu.Lock()
	v.at[node] = time.Now()
	v.mu.Unlock()
}

// aliveNodes lists the nodes that beat lately, by name.
func (v *clusterView) aliveNodes() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []string
	for node, at := range v.at {
		if time.Since(at) < deadAfter {
			out = append(out, node)
		}
	}
	sort.Strings(out)
	return out
}

// forming reports whether the view is too young to know every live node.
func (v *clusterView) forming() bool { return time.Since(v.started) < deadAfter }

// errNodeDead says a node stopped beating while this one waited for it.
var errNodeDead = errors.New("the node is dead")

// mayBeAlive is alive, or true for a node not heard of while the view is
// younger than deadAfter.
func (v *clusterView) mayBeAlive(node string) bool {
	at, ok := v.heard(node)
	if !ok {
		return v.forming()
	}
	return time.Since(at) < deadAfter
}

func (v *clusterView) alive(node string) bool {
	at, ok := v.heard(node)
	return ok && time.Since(at) < deadAfter
}

// heard returns when node's last heartbeat came, if one did.
func (v *clusterView) heard(node string) (time.Time, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	at, ok := v.at[node]
	return at, ok
}

// ClusterNode is one node in the cluster view.
type ClusterNode struct {
	Name     string    `json:"name"`
	Alive    bool      `json:"alive"`
	LastSeen time.Time `json:"last_seen"`
	Actors   int       `json:"actors"`
}

// ClusterActor is one registry entry in the cluster view.
type ClusterActor struct {
	Kind    string    `json:"kind"`
	ID      string    `json:"id"`
	Node    string    `json:"node"`
	Status  string    `json:"status"`
	Alive   bool      `json:"alive"`
	Updated time.Time `json:"updated"`
	// State is what a group's scheduling node says of the group (kind
	// group): its replicas and placements, as `troupe scale` prints them.
	State string `json:"state,omitempty"`
}

// ClusterPlacement is one placement of a replica group.
type ClusterPlacement struct {
	Replica string `json:"replica"`
	Nodes   string `json:"nodes"`
	Up      bool   `json:"up"`
	Active  bool   `json:"active"`
}

// ClusterStatus is the body of GET /v1/cluster.
type ClusterStatus struct {
	Node       string             `json:"node"`
	Nodes      []ClusterNode      `json:"nodes"`
	Actors     []ClusterActor     `json:"actors"`
	Placements []ClusterPlacement `json:"placements,omitempty"`
	// RegistryError says why Actors is missing: the registry could not be
	// read (a cluster that lost its quorum, or still electing a leader).
	RegistryError string `json:"registry_error,omitempty"`
}

func (n *node) clusterStatus(ctx context.Context) ClusterStatus {
	st := ClusterStatus{Node: n.cfg.Node}
	// The registry is read first: while the cluster re-elects its leader
	// the read can take seconds, and the nodes' liveness must be as of the
	// answer.
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	recs, err := n.registry.List(lctx)
	cancel()
	if err != nil {
		st.RegistryError = err.Error()
	}
	n.view.mu.Lock()
	for name, hb := range n.view.seen {
		at := n.view.at[name]
		st.Nodes = append(st.Nodes, ClusterNode{Name: name, Alive: time.Since(at) < deadAfter, LastSeen: at.UTC(), Actors: hb.Actors})
	}
	n.view.mu.Unlock()
	sort.Slice(st.Nodes, func(i, j int) bool { return st.Nodes[i].Name < st.Nodes[j].Name })
	for _, r := range recs {
		a := ClusterActor{Kind: r.Kind, ID: r.ID, Node: r.Node, Status: string(r.Status), Alive: r.Alive, Updated: r.Updated.UTC()}
		var doc replicasDoc
		if r.Kind == groupKind && json.Unmarshal([]byte(r.State), &doc) == nil {
			a.State = doc.String()
		}
		st.Actors = append(st.Actors, a)
	}
	sort.Slice(st.Actors, func(i, j int) bool {
		a, b := st.Actors[i], st.Actors[j]
		return a.Node+"/"+a.Kind+"/"+a.ID < b.Node+"/"+b.Kind+"/"+b.ID
	})
	n.replicasMu.Lock()
	reps := append([]*replica(nil), n.replicas...)
	n.replicasMu.Unlock()
	for _, rep := range reps {
		g := rep.group
		if g == nil {
			continue
		}
		for _, p := range g.fo.State() {
			st.Placements = append(st.Placements, ClusterPlacement{Replica: g.replica, Nodes: p.Name, Up: p.Up, Active: p.Active})
		}
	}
	return st
}

// clusterHandler serves GET /v1/cluster.
func (n *node) clusterHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		st := n.clusterStatus(ctx)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(st)
	})
}

// cmdCluster prints a running cluster's nodes, placements and actors.
func cmdCluster(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flags("cluster", stderr)
	server := fs.String("server", "http://127.0.0.1:8080", "gateway URL of any node")
	key := fs.String("api-key", "", "API key of the gateway, if it requires one")
	asJSON := fs.Bool("json", false, "print the raw JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("cluster: unexpected arguments %q", fs.Args())
	}
	st, raw, err := fetchCluster(ctx, *server, *key)
	if err != nil {
		return err
	}
	if *asJSON {
		_, err := stdout.Write(raw)
		return err
	}
	fmt.Fprintf(stdout, "NODE\tSTATE\tLAST SEEN\tACTORS\n")
	for _, nd := range st.Nodes {
		state := "alive"
		if !nd.Alive {
			state = "dead"
		}
		fmt.Fprintf(stdout, "%s\t%s\t%s ago\t%d\n", nd.Name, state, time.Since(nd.LastSeen).Round(100*time.Millisecond), nd.Actors)
	}
	if len(st.Placements) > 0 {
		fmt.Fprintf(stdout, "\nREPLICA\tPLACEMENT\tSTATE\n")
		for _, p := range st.Placements {
			state := "down"
			if p.Up {
				state = "up"
			}
			if p.Active {
				state += ", active"
			}
			fmt.Fprintf(stdout, "%s\t%s\t%s\n", p.Replica, p.Nodes, state)
		}
	}
	if st.RegistryError != "" {
		fmt.Fprintf(stdout, "\nactors unknown: %s\n", st.RegistryError)
		return nil
	}
	fmt.Fprintf(stdout, "\nNODE\tKIND\tID\tSTATUS\n")
	for _, a := range st.Actors {
		status := a.Status
		if !a.Alive {
			status += " (expired)"
		}
		if a.State != "" {
			status += ": " + a.State
		}
		fmt.Fprintf(stdout, "%s\t%s\t%s\t%s\n", a.Node, a.Kind, a.ID, status)
	}
	return nil
}

func fetchCluster(ctx context.Context, server, key string) (ClusterStatus, []byte, error) {
	var st ClusterStatus
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(server, "/")+"/v1/cluster", nil)
	if err != nil {
		return st, nil, fmt.Errorf("cluster: %w", err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, nil, fmt.Errorf("cluster: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return st, nil, fmt.Errorf("cluster: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return st, raw, fmt.Errorf("cluster: %s: %s", resp.Status, strings.TrimSpace(string(raw)))
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return st, raw, fmt.Errorf("cluster: %w", err)
	}
	return st, raw, nil
}

// checkExposure refuses network listeners without credentials unless the
// operator asked for it.
func checkExposure(cfg serveConfig) error {
	c := cfg.Cluster
	if c.User != "" && c.Password != "" || cfg.Insecure {
		return nil
	}
	for _, l := range []struct{ flag, addr string }{
		{"--bus-listen", c.ClientListen}, {"--route-listen", c.RouteListen}, {"--data-listen", cfg.DataListen},
	} {
		if l.addr == "" {
			continue
		}
		host, _, err := net.SplitHostPort(l.addr)
		if err != nil {
			return fmt.Errorf("serve: %s %q: %w", l.flag, l.addr, err)
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return fmt.Errorf("serve: %s %s is reachable from the network: give --bus-user and --bus-password, or --insecure to run without them", l.flag, l.addr)
		}
	}
	return nil
}
