package actors

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/troupe/troupe/bus"
)

// Actor handles the messages of one mailbox, one at a time. An error from
// Receive is counted and the actor carries on; a panic is recovered and the
// actor is replaced by a fresh instance (see Props).
type Actor[M any] interface {
	Receive(ctx context.Context, msg M) error
}

// Initializer is an optional hook: Init runs on the actor's goroutine before
// its first message, and again on each fresh instance after a restart
// (which an inline sender may run; see Ref.SendInline).
type Initializer interface {
	Init(ctx context.Context) error
}

// Stopper is an optional hook: Stop runs once after a graceful stop has
// drained the mailbox (or was cut short: then ctx is already done).
type Stopper interface {
	Stop(ctx context.Context)
}

// Address names an actor in the cluster.
type Address struct {
	Kind string
	ID   string
	Node string
}

func (a Address) String() string { return a.Kind + "/" + a.ID + "@" + a.Node }

// Status is where an actor is in its life.
type Status string

// Statuses.
const (
	StatusStarting   Status = "starting"
	StatusRunning    Status = "running"
	StatusRestarting Status = "restarting"
	StatusStopping   Status = "stopping"
	StatusStopped    Status = "stopped"
	StatusFailed     Status = "failed"
)

// Stats is a snapshot of an actor's counters, as reported by its STATS
// and stats endpoints.
type Stats struct {
	Kind      string `json:"kind"`
	ID        string `json:"id"`
	Node      string `json:"node"`
	Status    Status `json:"status"`
	Depth     int    `json:"mailbox_depth"`
	Capacity  int    `json:"mailbox_capacity"`
	Processed uint64 `json:"processed"`
	Errors    uint64 `json:"errors"`
	Panics    uint64 `json:"panics"`
	Restarts  uint64 `json:"restarts"`
}

// Schema implements bus.Message.
func (Stats) Schema() bus.Schema { return bus.Schema{ID: "troupe.actor.stats", Version: 1} }

// Props describes an actor to Spawn. Zero Mailbox, MaxRestarts, Within and
// Version take defaults.
type Props[M any] struct {
	Kind string // letters, digits, '-' or '_'; names the micro service
	ID   string // unique per kind on a System; any bytes
	// New returns a fresh instance; it is called at start and at each
	// restart.
	New func() Actor[M]

	Mailbox int // capacity; default 64

	// Supervision: at most MaxRestarts restarts within Within (default 3
	// in 5s); the next panic escalates: the actor stops as failed and
	// Supervisor, if set, is called with the escalated event. Supervisor
	// runs on the actor's goroutine (or an inline sender's) and must not
	// block.
	MaxRestarts int
	Within      time.Duration
	Supervisor  func(Event)

	// Endpoints become request endpoints of the actor's micro service.
	Endpoints []Endpoint[M]
	// Version (semver; by default the System's) and Description of the
	// service.
	Version     string
	Description string
}

// Props defaults.
const (
	DefaultMailbox     = 64
	DefaultMaxRestarts = 3
	DefaultWithin      = 5 * time.Second
)

func (p Props[M]) withDefaults() Props[M] {
	if p.Mailbox == 0 {
		p.Mailbox = DefaultMailbox
	}
	if p.MaxRestarts == 0 {
		p.MaxRestarts = DefaultMaxRestarts
	}
	if p.Within == 0 {
		p.Within = DefaultWithin
	}
	if p.Version == "" {
		p.Version = "0.0.0"
	}
	return p
}

// Validate reports the first problem with p.
func (p Props[M]) Validate() error {
	switch {
	case !kindRE.MatchString(p.Kind):
		return fmt.Errorf("actor kind %q: want letters, digits, '-' or '_'", p.Kind)
	case p.ID == "":
		return fmt.Errorf("actor %s: empty id", p.Kind)
	case p.New == nil:
		return fmt.Errorf("actor %s/%s: nil New", p.Kind, p.ID)
	case p.Mailbox < 0 || p.MaxRestarts < 0 || p.Within < 0:
		return fmt.Errorf("actor %s/%s: negative mailbox, restarts or window", p.Kind, p.ID)
	}
	for _, e := range p.Endpoints {
		if e.Name == StatsEndpoint {
			return fmt.Errorf("actor %s/%s: endpoint name %q is reserved", p.Kind, p.ID, StatsEndpoint)
		}
		if e.Name == "" || e.handle == nil {
			return fmt.Errorf("actor %s/%s: endpoint %q not made by Handle", p.Kind, p.ID, e.Name)
		}
	}
	return nil
}

// Process is the untyped view of a running actor.
type Process interface {
	Address() Address
	Stats() Stats
	// Subject is the prefix of the actor's endpoint subjects.
	Subject() string
	Started() time.Time
	// Stop stops the actor gracefully; see Ref.Stop.
	Stop(ctx context.Context) error
	// Done is closed when the actor's goroutine has returned.
	Done() <-chan struct{}
}

// Ref is a handle to a running actor with message type M.
type Ref[M any] struct{ p *process[M] }

var _ Process = (*Ref[int])(nil)

// Send queues msg, blocking while the mailbox is full until there is room
// or ctx ends. It fails with ErrStopped once the actor is stopping.
func (r *Ref[M]) Send(ctx context.Context, msg M) error { return r.p.mb.Send(ctx, msg) }

// SendInline delivers msg like Send, except that when the actor is idle
// (its mailbox empty and no message in hand) the calling goroutine runs
// Receive itself, under the same exclusion, supervision and counters,
// before SendInline returns: the actor's goroutine is not woken. It is for
// a sender that would otherwise wait for the actor's answer; messages from
// one sender keep their order either way.
func (r *Ref[M]) SendInline(ctx context.Context, msg M) error {
	if r.p.inline(msg) {
		return nil
	}
	return r.p.mb.Send(ctx, msg)
}

// TrySend queues msg or fails at once with ErrMailboxFull.
func (r *Ref[M]) TrySend(msg M) error { return r.p.mb.TrySend(msg) }

// Address returns the actor's address.
func (r *Ref[M]) Address() Address { return r.p.addr }

// Subject returns the prefix of the actor's endpoint subjects.
func (r *Ref[M]) Subject() string { return r.p.subject }

// Started returns when the actor started.
func (r *Ref[M]) Started() time.Time { return r.p.started }

// Stats returns the actor's counters.
func (r *Ref[M]) Stats() Stats { return r.p.stats() }

// Done is closed when the actor's goroutine has returned.
func (r *Ref[M]) Done() <-chan struct{} { return r.p.done }

// Stop refuses new messages, lets the actor handle those already queued,
// runs its Stopper hook and waits for its goroutine. If ctx ends first, the
// actor's context is cancelled, queued messages are dropped, and Stop still
// waits for the goroutine (which returns as soon as Receive honours its
// context) before returning ctx's error.
func (r *Ref[M]) Stop(ctx context.Context) error {
	p := r.p
	p.setStatus(StatusStopping)
	p.mb.Close()
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
	}
	p.cancel()
	<-p.done
	return fmt.Errorf("actor %s: stop cut short: %w", p.addr, ctx.Err())
}

// process is one actor's state; the goroutine running loop owns actor and
// window, everything else is safe to read from any goroutine.
type process[M any] struct {
	sys     *System
	props   Props[M]
	addr    Address
	subject string
	mb      *Mailbox[M]
	svc     micro.Service // nil without a bus connection
	started time.Time

	ctx    context.Context // the actor's context; cancel aborts it
	cancel context.CancelFunc
	done   chan struct{}

	processed, errors, panics, restarts atomic.Uint64

	// statusMu guards status.
	statusMu sync.Mutex
	status   Status

	// exec is held by whoever runs the actor: its goroutine while it
	// handles a message from the mailbox, or a sender running one inline
	// (see inline). It guards what follows.
	exec    sync.Mutex
	cur     Actor[M]    // the instance; nil until the first Init succeeds
	handled uint64      // messages from the mailbox handled
	failed  bool        // an inline run escalated: the goroutine stops as failed
	window  []time.Time // restart times within props.Within
}

func (p *process[M]) stats() Stats {
	return Stats{
		Kind: p.addr.Kind, ID: p.addr.ID, Node: p.addr.Node,
		Status: p.getStatus(), Depth: p.mb.Len(), Capacity: p.mb.Cap(),
		Processed: p.processed.Load(), Errors: p.errors.Load(),
		Panics: p.panics.Load(), Restarts: p.restarts.Load(),
	}
}

func (p *process[M]) getStatus() Status {
	p.statusMu.Lock()
	defer p.statusMu.Unlock()
	return p.status
}

// setStatus moves to s unless the actor already reached a final status or
// is stopping (a restart during a drain leaves it stopping).
func (p *process[M]) setStatus(s Status) {
	p.statusMu.Lock()
	defer p.statusMu.Unlock()
	switch p.status {
	case StatusStopped, StatusFailed:
		return
	case StatusStopping:
		if s != StatusStopped && s != StatusFailed {
			return
		}
	}
	p.status = s
}

func (p *process[M]) emit(t EventType, reason string) {
	ev := Event{Type: t, Actor: p.addr, Time: time.Now(), Reason: reason, Restarts: len(p.window)}
	p.sys.events.publish(ev)
	if t == EventEscalated && p.props.Supervisor != nil {
		p.props.Supervisor(ev)
	}
}

// errPanic wraps a recovered panic value.
var errPanic = errors.New("panic")

// fresh makes and initialises a new instance, recovering panics.
func (p *process[M]) fresh() (a Actor[M], err error) {
	defer func() {
		if v := recover(); v != nil {
			a, err = nil, fmt.Errorf("%w in New or Init: %v", errPanic, v)
		}
	}()
	a = p.props.New()
	if a == nil {
		return nil, errors.New("New returned nil")
	}
	if in, ok := a.(Initializer); ok {
		if err := in.Init(p.ctx); err != nil {
			return nil, fmt.Errorf("init: %w", err)
		}
	}
	return a, nil
}

// receive hands msg to a, turning a panic into an errPanic error.
func (p *process[M]) receive(a Actor[M], msg M) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%w in Receive: %v", errPanic, v)
		}
	}()
	return a.Receive(p.ctx, msg)
}

// run is the actor's goroutine. It reports the first Init's outcome on
// initDone.
func (p *process[M]) run(initDone chan<- error) {
	defer p.sys.wg.Done()
	final, started := StatusStopped, false
	defer func() { p.finish(final, started) }()

	a, err := p.fresh()
	if err != nil {
		final = StatusFailed
		initDone <- err
		return
	}
	failed := false
	started = true
	p.setStatus(StatusRunning)
	initDone <- nil
	p.emit(EventStarted, "")
	// From here senders may run the actor inline (see inline).
	p.exec.Lock()
	p.cur = a
	p.exec.Unlock()

	for {
		msg, ok := p.mb.next(p.ctx.Done())
		if !ok {
			break
		}
		p.exec.Lock()
		ok = !p.failed && p.handle(msg)
		p.handled++
		p.exec.Unlock()
		if !ok {
			final = StatusFailed
			return
		}
	}
	// Waits for an inline run in progress; none can start any more.
	p.exec.Lock()
	a, failed = p.cur, p.failed
	p.exec.Unlock()
	if failed {
		final = StatusFailed
		return
	}
	if s, ok := a.(Stopper); ok {
		s.Stop(p.ctx)
	}
}

// handle has the current instance receive msg, counting the outcome and
// restarting it after a panic. It reports false when the panic escalated:
// the actor must stop as failed. The caller holds exec.
func (p *process[M]) handle(msg M) bool {
	err := p.receive(p.cur, msg)
	p.processed.Add(1)
	if err == nil {
		return true
	}
	p.errors.Add(1)
	if !errors.Is(err, errPanic) {
		return true
	}
	if p.cur = p.restart(err); p.cur == nil {
		p.failed = true
		return false
	}
	return true
}

// inline runs msg on the calling goroutine, as the actor's goroutine would,
// when the actor is idle: running, with no message queued, in hand or on
// its way in, so that no message is overtaken. It reports whether it ran
// msg; if not, the caller queues it. An escalation closes the mailbox, and
// the actor's goroutine then stops as failed.
func (p *process[M]) inline(msg M) bool {
	if p.mb.Len() != 0 || !p.exec.TryLock() {
		return false
	}
	defer p.exec.Unlock()
	if p.cur == nil || p.failed || p.mb.puts.Load() != p.handled || p.mb.isClosed() || p.ctx.Err() != nil {
		return false
	}
	if !p.handle(msg) {
		p.mb.Close()
	}
	return true
}

// restart replaces a panicked instance, or escalates and returns nil when
// the intensity limit is reached.
func (p *process[M]) restart(cause error) Actor[M] {
	for {
		p.panics.Add(1)
		p.emit(EventPanicked, cause.Error())
		now := time.Now()
		kept := p.window[:0]
		for _, t := range p.window {
			if now.Sub(t) < p.props.Within {
				kept = append(kept, t)
			}
		}
		p.window = kept
		if len(p.window) >= p.props.MaxRestarts {
			p.emit(EventEscalated, cause.Error())
			return nil
		}
		p.window = append(p.window, now)
		p.restarts.Add(1)
		p.setStatus(StatusRestarting)
		a, err := p.fresh()
		if err != nil {
			cause = err
			continue
		}
		p.setStatus(StatusRunning)
		p.emit(EventRestarted, cause.Error())
		return a
	}
}

// finish releases everything the actor holds; it runs last on its goroutine.
func (p *process[M]) finish(final Status, started bool) {
	p.mb.Close()
	if p.svc != nil {
		_ = p.svc.Stop()
	}
	p.sys.remove(p.addr)
	p.setStatus(final)
	reason := ""
	if final == StatusFailed {
		reason = string(StatusFailed)
	}
	if started {
		p.emit(EventStopped, reason)
	}
	p.cancel()
	close(p.done)
}
