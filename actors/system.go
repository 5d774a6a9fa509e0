package actors

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/troupe/troupe/bus"
)

var kindRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// Config describes a System.
type Config struct {
	Cluster string // names subjects: troupe.<cluster>....
	Node    string // this node's name
	// Version is what every actor's micro service reports as its version
	// where its Props name none: the build's, in semver (0.0.0 if empty).
	Version string
}

// DefaultConfig is cluster "troupe", node "local".
func DefaultConfig() Config { return Config{Cluster: "troupe", Node: "local"} }

// Validate reports the first problem with c.
func (c Config) Validate() error {
	if _, err := bus.NewSubjects(c.Cluster); err != nil {
		return fmt.Errorf("actors config: %w", err)
	}
	if c.Node == "" {
		return errors.New("actors config: empty node name")
	}
	return nil
}

// System runs the actors of one node and owns their goroutines.
type System struct {
	cfg      Config
	subjects bus.Subjects
	nc       *nats.Conn // nil: actors get no micro services
	events   *eventHub

	wg sync.WaitGroup // one per actor goroutine

	// mu guards closed and procs.
	mu     sync.Mutex
	closed bool
	procs  map[procKey]Process
}

type procKey struct{ kind, id string }

// NewSystem returns a System for cfg. With a non-nil nc every actor is also
// a micro service on nc; the caller keeps ownership of nc and closes it
// after Shutdown.
func NewSystem(cfg Config, nc *nats.Conn) (*System, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	subj, _ := bus.NewSubjects(cfg.Cluster)
	return &System{cfg: cfg, subjects: subj, nc: nc, events: newEventHub(), procs: make(map[procKey]Process)}, nil
}

// Node returns the node name.
func (s *System) Node() string { return s.cfg.Node }

// Subjects returns the subject catalog of the system's cluster.
func (s *System) Subjects() bus.Subjects { return s.subjects }

// Conn returns the bus connection, or nil.
func (s *System) Conn() *nats.Conn { return s.nc }

// Subscribe returns a subscription to lifecycle events with room for buffer
// events; see Events for the slow-subscriber policy.
func (s *System) Subscribe(buffer int) *Events { return s.events.subscribe(buffer) }

// Lookup returns the running actor kind/id.
func (s *System) Lookup(kind, id string) (Process, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.procs[procKey{kind, id}]
	return p, ok
}

// Processes lists the running actors.
func (s *System) Processes() []Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Process, 0, len(s.procs))
	for _, p := range s.procs {
		out = append(out, p)
	}
	return out
}

func (s *System) remove(a Address) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.procs, procKey{a.Kind, a.ID})
}

// Spawn starts an actor on s and returns once its first Init has
// succeeded and its endpoints are registered with the server. It fails with a bus.CodeConflict error if kind/id already
// runs, and with Init's error if Init fails. If ctx ends first, the actor
// is stopped and Spawn returns ctx's error.
func Spawn[M any](ctx context.Context, s *System, props Props[M]) (*Ref[M], error) {
	if err := props.Validate(); err != nil {
		return nil, bus.Errorf(bus.CodeBadRequest, "spawn: %w", err)
	}
	if props.Version == "" {
		props.Version = s.cfg.Version
	}
	props = props.withDefaults()
	addr := Address{Kind: props.Kind, ID: props.ID, Node: s.cfg.Node}
	actx, cancel := context.WithCancel(context.Background())
	p := &process[M]{
		sys: s, props: props, addr: addr,
		subject: s.subjects.Actor(props.Kind, props.ID),
		mb:      NewMailbox[M](props.Mailbox),
		started: time.Now(),
		ctx:     actx, cancel: cancel,
		done:   make(chan struct{}),
		status: StatusStarting,
	}
	ref := &Ref[M]{p: p}

	s.mu.Lock()
	key := procKey{props.Kind, props.ID}
	switch _, dup := s.procs[key]; {
	case s.closed:
		s.mu.Unlock()
		cancel()
		return nil, bus.Errorf(bus.CodeUnavailable, "spawn %s: system is shut down", addr)
	case dup:
		s.mu.Unlock()
		cancel()
		return nil, bus.Errorf(bus.CodeConflict, "spawn %s: already running", addr)
	}
	s.procs[key] = ref
	s.wg.Add(1)
	s.mu.Unlock()

	if s.nc != nil {
		svc, err := serve(s.nc, p)
		if err != nil {
			s.remove(addr)
			s.wg.Done()
			cancel()
			return nil, fmt.Errorf("spawn %s: %w", addr, err)
		}
		p.svc = svc
	}
	initDone := make(chan error, 1)
	go p.run(initDone)
	select {
	case err := <-initDone:
		if err != nil {
			<-p.done
			return nil, fmt.Errorf("spawn %s: %w", addr, err)
		}
		if s.nc != nil {
			// Once Spawn returns, the endpoints answer from anywhere.
			if err := bus.Flush(ctx, s.nc); err != nil {
				_ = ref.Stop(ctx)
				return nil, fmt.Errorf("spawn %s: flush subscriptions: %w", addr, err)
			}
		}
		return ref, nil
	case <-ctx.Done():
		_ = ref.Stop(ctx) // ctx is done: aborts at once, waits for the goroutine
		return nil, fmt.Errorf("spawn %s: %w", addr, ctx.Err())
	}
}

// Shutdown stops every actor (see Ref.Stop; all stop concurrently under
// ctx), refuses new ones, waits for every actor goroutine, and closes all
// event subscriptions.
func (s *System) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	procs := s.Processes()
	errs := make([]error, len(procs))
	var wg sync.WaitGroup
	for i, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.Stop(ctx)
		}()
	}
	wg.Wait()
	s.wg.Wait()
	s.events.closeAll()
	return errors.Join(errs...)
}
