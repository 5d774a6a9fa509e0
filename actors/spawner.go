package actors

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/troupe/troupe/bus"
)

// SpawnRequest asks a node's spawner to start an actor of a registered
// kind. Args is kind-specific, typically another bus message encoded with
// bus.Encode.
type SpawnRequest struct {
	Kind string
	ID   string
	Args []byte
}

// Schema implements bus.Message.
func (SpawnRequest) Schema() bus.Schema { return bus.Schema{ID: "troupe.spawn.request", Version: 1} }

// SpawnReply says where the new actor answers.
type SpawnReply struct {
	Actor   Address
	Subject string
}

// Schema implements bus.Message.
func (SpawnReply) Schema() bus.Schema { return bus.Schema{ID: "troupe.spawn.reply", Version: 1} }

// StopRequest asks a node's spawner to stop an actor gracefully, within the
// request's deadline.
type StopRequest struct {
	Kind string
	ID   string
}

// Schema implements bus.Message.
func (StopRequest) Schema() bus.Schema { return bus.Schema{ID: "troupe.stop.request", Version: 1} }

// StopReply confirms a stop.
type StopReply struct{ Actor Address }

// Schema implements bus.Message.
func (StopReply) Schema() bus.Schema { return bus.Schema{ID: "troupe.stop.reply", Version: 1} }

// Heartbeat is what a node publishes on its heartbeat subject.
type Heartbeat struct {
	Node   string
	Time   time.Time
	Actors int
}

// Schema implements bus.Message.
func (Heartbeat) Schema() bus.Schema { return bus.Schema{ID: "troupe.node.heartbeat", Version: 1} }

// Factory starts one actor of a kind on sys. It decodes args itself and
// must reject bad args with an error (a bus.CodeBadRequest one, ideally).
type Factory func(ctx context.Context, sys *System, id string, args []byte) (Process, error)

// SpawnerKind is the actor kind of spawners; a spawner's id is its node.
const SpawnerKind = "spawner"

// SpawnerConfig describes a Spawner.
type SpawnerConfig struct {
	// Kinds are the actor kinds this node can start on request.
	Kinds map[string]Factory
	// Heartbeat is the period of registry refreshes and node heartbeats;
	// keep it well under the registry TTL.
	Heartbeat time.Duration
}

// DefaultSpawnerConfig has no kinds and a one-second heartbeat.
func DefaultSpawnerConfig() SpawnerConfig {
	return SpawnerConfig{Kinds: map[string]Factory{}, Heartbeat: time.Second}
}

// Validate reports the first problem with c.
func (c SpawnerConfig) Validate() error {
	if c.Heartbeat <= 0 {
		return fmt.Errorf("spawner config: heartbeat %v: want > 0", c.Heartbeat)
	}
	for k, f := range c.Kinds {
		if !kindRE.MatchString(k) || k == SpawnerKind || f == nil {
			return fmt.Errorf("spawner config: kind %q: want a name other than %q and a factory", k, SpawnerKind)
		}
	}
	return nil
}

// Spawner is a node's spawner: an actor answering spawn and stop requests
// on the node's spawn and stop subjects, plus a heartbeat loop that keeps
// every actor of the System in the registry, deletes entries of stopped
// actors, marks failed ones, publishes lifecycle events and the node
// heartbeat. It supervises what runs on its node: escalations end up as
// failed registry entries that expire.
type Spawner struct {
	sys   *System
	reg   *Registry // nil: no registry
	cfg   SpawnerConfig
	ref   *Ref[spawnerMsg]
	evs   *Events
	halt  context.CancelFunc // ends the heartbeat loop
	wg    sync.WaitGroup     // the heartbeat loop
	fails atomic.Uint64      // registry or bus errors in the heartbeat loop
}

type spawnerMsg struct {
	spawn *Call[SpawnRequest, SpawnReply]
	stop  *Call[StopRequest, StopReply]
}

// StartSpawner starts the spawner of sys's node. sys must have a bus
// connection; reg may be nil. Close stops it.
func StartSpawner(ctx context.Context, sys *System, reg *Registry, cfg SpawnerConfig) (*Spawner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if sys.Conn() == nil {
		return nil, errors.New("spawner: the system has no bus connection")
	}
	s := &Spawner{sys: sys, reg: reg, cfg: cfg}
	subj := sys.Subjects()
	s.evs = sys.Subscribe(1024)
	ref, err := Spawn(ctx, sys, Props[spawnerMsg]{
		Kind: SpawnerKind, ID: sys.Node(),
		New: func() Actor[spawnerMsg] { return (*spawnerActor)(s) },
		Endpoints: []Endpoint[spawnerMsg]{
			Handle("spawn", func(c *Call[SpawnRequest, SpawnReply]) spawnerMsg { return spawnerMsg{spawn: c} }).At(subj.Spawn(sys.Node())),
			Handle("stop", func(c *Call[StopRequest, StopReply]) spawnerMsg { return spawnerMsg{stop: c} }).At(subj.Stop(sys.Node())),
		},
		Description: "starts and stops actors on node " + sys.Node(),
	})
	if err != nil {
		s.evs.Close()
		return nil, fmt.Errorf("spawner: %w", err)
	}
	s.ref = ref
	lctx, halt := context.WithCancel(context.Background())
	s.halt = halt
	s.wg.Add(1)
	go s.loop(lctx)
	return s, nil
}

// Failures counts registry writes and bus publishes that failed in the
// heartbeat loop.
func (s *Spawner) Failures() uint64 { return s.fails.Load() }

// Close stops the heartbeat loop and the spawner actor, and waits for both.
// It does not stop the actors the spawner started: System.Shutdown does.
func (s *Spawner) Close(ctx context.Context) error {
	s.halt()
	s.wg.Wait()
	s.evs.Close()
	return s.ref.Stop(ctx)
}

// spawnerActor is the Spawner seen as an actor.
type spawnerActor Spawner

func (a *spawnerActor) Receive(ctx context.Context, m spawnerMsg) error {
	s := (*Spawner)(a)
	switch {
	case m.spawn != nil:
		return s.spawn(m.spawn)
	case m.stop != nil:
		return s.stopActor(m.stop)
	}
	return nil
}

func (s *Spawner) spawn(c *Call[SpawnRequest, SpawnReply]) error {
	f, ok := s.cfg.Kinds[c.Req.Kind]
	if !ok {
		return c.Fail(bus.Errorf(bus.CodeNotFound, "node %s cannot spawn kind %q", s.sys.Node(), c.Req.Kind))
	}
	p, err := f(c.Context(), s.sys, c.Req.ID, c.Req.Args)
	if err != nil {
		_ = c.Fail(err)
		return err
	}
	s.refresh(c.Context(), p)
	return c.Reply(SpawnReply{Actor: p.Address(), Subject: p.Subject()})
}

func (s *Spawner) stopActor(c *Call[StopRequest, StopReply]) error {
	if c.Req.Kind == SpawnerKind {
		return c.Fail(bus.Errorf(bus.CodeBadRequest, "a spawner cannot be stopped over the bus"))
	}
	p, ok := s.sys.Lookup(c.Req.Kind, c.Req.ID)
	if !ok {
		return c.Fail(bus.Errorf(bus.CodeNotFound, "%s/%s is not running on %s", c.Req.Kind, c.Req.ID, s.sys.Node()))
	}
	if err := p.Stop(c.Context()); err != nil {
		_ = c.Fail(err)
		return err
	}
	return c.Reply(StopReply{Actor: p.Address()})
}

// loop is the heartbeat goroutine.
// It runs until Close cancels ctx, which also interrupts a blocked write.
func (s *Spawner) loop(ctx context.Context) {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.Heartbeat)
	defer t.Stop()
	s.beat(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.beat(ctx)
		case ev, ok := <-s.evs.C:
			if !ok {
				return
			}
			s.onEvent(ctx, ev)
		}
	}
}

// beat publishes the node heartbeat and refreshes every running actor's
// registry entry. The heartbeat goes first and the refreshes get a period
// (a second at least) between them: a registry that answers slowly (a
// cluster electing its leader) must not make a live node look dead.
func (s *Spawner) beat(ctx context.Context) {
	procs := s.sys.Processes()
	hb := Heartbeat{Node: s.sys.Node(), Time: time.Now(), Actors: len(procs)}
	if err := bus.Publish(ctx, s.sys.Conn(), s.sys.Subjects().Heartbeat(s.sys.Node()), hb); err != nil {
		s.fails.Add(1)
	}
	rctx, cancel := context.WithTimeout(ctx, max(s.cfg.Heartbeat, time.Second))
	defer cancel()
	for _, p := range procs {
		s.refresh(rctx, p)
	}
}

func (s *Spawner) refresh(ctx context.Context, p Process) {
	if s.reg == nil {
		return
	}
	st := p.Stats()
	e := Entry{Kind: st.Kind, ID: st.ID, Node: st.Node, Subject: p.Subject(), Started: p.Started(), Status: st.Status}
	if err := s.reg.Put(ctx, e); err != nil {
		s.fails.Add(1)
	}
}

func (s *Spawner) onEvent(ctx context.Context, ev Event) {
	if err := bus.Publish(ctx, s.sys.Conn(), s.sys.Subjects().Events(s.sys.Node()), ev); err != nil {
		s.fails.Add(1)
	}
	if s.reg == nil || ev.Type != EventStopped {
		return
	}
	var err error
	if ev.Reason == string(StatusFailed) {
		// Left to expire: readers see it failed, then dead.
		err = s.reg.Put(ctx, Entry{Kind: ev.Actor.Kind, ID: ev.Actor.ID, Node: ev.Actor.Node, Status: StatusFailed})
	} else {
		err = s.reg.Delete(ctx, ev.Actor.Kind, ev.Actor.ID)
	}
	if err != nil {
		s.fails.Add(1)
	}
}

// SpawnOn asks node's spawner to start an actor and returns where it
// answers.
func SpawnOn(ctx context.Context, nc *nats.Conn, subj bus.Subjects, node string, req SpawnRequest) (SpawnReply, error) {
	return bus.Request[SpawnRequest, SpawnReply](ctx, nc, subj.Spawn(node), req)
}

// StopOn asks node's spawner to stop kind/id.
func StopOn(ctx context.Context, nc *nats.Conn, subj bus.Subjects, node, kind, id string) error {
	_, err := bus.Request[StopRequest, StopReply](ctx, nc, subj.Stop(node), StopRequest{Kind: kind, ID: id})
	return err
}
