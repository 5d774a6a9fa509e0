package actors

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// counter adds to total; it panics on "panic", fails on "fail" and blocks
// on "block" until its context ends or release is closed.
type counter struct {
	total   *atomic.Int64
	inits   *atomic.Int64
	stops   *atomic.Int64
	release chan struct{}
	seen    chan string
}

type cmsg struct {
	op string
	n  int64
}

func (c *counter) Init(context.Context) error { c.inits.Add(1); return nil }

func (c *counter) Receive(ctx context.Context, m cmsg) error {
	if c.seen != nil {
		c.seen <- m.op
	}
	switch m.op {
	case "panic":
		panic("boom")
	case "fail":
		return errors.New("bad message")
	case "block":
		select {
		case <-ctx.Done():
		case <-c.release:
		}
	}
	c.total.Add(m.n)
	return nil
}

func (c *counter) Stop(context.Context) { c.stops.Add(1) }

type counterState struct {
	total, inits, stops atomic.Int64
	release             chan struct{}
	seen                chan string
}

func (s *counterState) props(id string) Props[cmsg] {
	return Props[cmsg]{Kind: "counter", ID: id, New: func() Actor[cmsg] {
		return &counter{total: &s.total, inits: &s.inits, stops: &s.stops, release: s.release, seen: s.seen}
	}}
}

func TestSpawnSendStop(t *testing.T) {
	sys := testSystem(t, "n1", nil)
	var st counterState
	ctx := context.Background()
	ref, err := Spawn(ctx, sys, st.props("c1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Spawn(ctx, sys, st.props("c1")); err == nil {
		t.Error("second Spawn of counter/c1 succeeded, want a conflict")
	}
	for i := 1; i <= 100; i++ {
		if err := ref.Send(ctx, cmsg{n: int64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := ref.Send(ctx, cmsg{op: "fail"}); err != nil {
		t.Fatal(err)
	}
	if err := ref.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	// Stop drained the mailbox before returning.
	if got := st.total.Load(); got != 5050 {
		t.Errorf("total = %d, want 5050", got)
	}
	stats := ref.Stats()
	if stats.Processed != 101 || stats.Errors != 1 || stats.Status != StatusStopped {
		t.Errorf("stats = %+v, want 101 processed, 1 error, stopped", stats)
	}
	if st.inits.Load() != 1 || st.stops.Load() != 1 {
		t.Errorf("inits, stops = %d, %d, want 1, 1", st.inits.Load(), st.stops.Load())
	}
	if err := ref.Send(ctx, cmsg{n: 1}); !errors.Is(err, ErrStopped) {
		t.Errorf("Send after Stop = %v, want ErrStopped", err)
	}
	if _, ok := sys.Lookup("counter", "c1"); ok {
		t.Error("stopped actor is still listed")
	}
}

func TestMailboxBound(t *testing.T) {
	sys := testSystem(t, "n1", nil)
	st := counterState{release: make(chan struct{}), seen: make(chan string, 16)}
	p := st.props("bounded")
	p.Mailbox = 2
	ctx := context.Background()
	ref, err := Spawn(ctx, sys, p)
	if err != nil {
		t.Fatal(err)
	}
	// The actor takes "block" out of the mailbox and waits in Receive.
	if err := ref.Send(ctx, cmsg{op: "block"}); err != nil {
		t.Fatal(err)
	}
	<-st.seen
	for i := 0; i < 2; i++ {
		if err := ref.TrySend(cmsg{n: 1}); err != nil {
			t.Fatalf("TrySend %d: %v", i, err)
		}
	}
	if got := ref.Stats().Depth; got != 2 {
		t.Errorf("depth = %d, want 2", got)
	}
	if err := ref.TrySend(cmsg{n: 1}); !errors.Is(err, ErrMailboxFull) {
		t.Errorf("TrySend on a full mailbox = %v, want ErrMailboxFull", err)
	}
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if err := ref.Send(short, cmsg{n: 1}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Send on a full mailbox = %v, want DeadlineExceeded", err)
	}
	// A blocked Send completes once there is room.
	sent := make(chan error, 1)
	go func() { sent <- ref.Send(ctx, cmsg{n: 10}) }()
	close(st.release)
	if err := <-sent; err != nil {
		t.Errorf("blocked Send = %v, want nil", err)
	}
	if err := ref.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if got := st.total.Load(); got != 12 {
		t.Errorf("total = %d, want 12", got)
	}
}

func TestStopCutShortByContext(t *testing.T) {
	sys := testSystem(t, "n1", nil)
	st := counterState{release: make(chan struct{}), seen: make(chan string, 16)}
	ref, err := Spawn(context.Background(), sys, st.props("stuck"))
	if err != nil {
		t.Fatal(err)
	}
	if err := ref.Send(context.Background(), cmsg{op: "block"}); err != nil {
		t.Fatal(err)
	}
	<-st.seen
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := ref.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Stop = %v, want DeadlineExceeded", err)
	}
	select {
	case <-ref.Done():
	default:
		t.Error("Stop returned before the actor goroutine ended")
	}
}

func TestPanicRestartsAndNextMessageIsProcessed(t *testing.T) {
	sys := testSystem(t, "n1", nil)
	evs := sys.Subscribe(64)
	var st counterState
	ref, err := Spawn(context.Background(), sys, st.props("p1"))
	if err != nil {
		t.Fatal(err)
	}
	nextEvent(t, evs, EventStarted, "p1")
	ctx := context.Background()
	if err := ref.Send(ctx, cmsg{op: "panic"}); err != nil {
		t.Fatal(err)
	}
	if err := ref.Send(ctx, cmsg{n: 7}); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, evs, EventPanicked, "p1"); ev.Reason == "" {
		t.Error("panicked event has no reason")
	}
	if ev := nextEvent(t, evs, EventRestarted, "p1"); ev.Restarts != 1 {
		t.Errorf("restarted event: Restarts = %d, want 1", ev.Restarts)
	}
	waitFor(t, "message after the panic", func() bool { return st.total.Load() == 7 })
	s := ref.Stats()
	if s.Panics != 1 || s.Restarts != 1 || s.Status != StatusRunning {
		t.Errorf("stats = %+v, want 1 panic, 1 restart, running", s)
	}
	if got := st.inits.Load(); got != 2 {
		t.Errorf("Init ran %d times, want 2 (start and restart)", got)
	}
}

func TestIntensityExceededEscalates(t *testing.T) {
	sys := testSystem(t, "n1", nil)
	evs := sys.Subscribe(64)
	escalated := make(chan Event, 1)
	var st counterState
	p := st.props("fragile")
	p.MaxRestarts, p.Within = 2, time.Minute
	p.Supervisor = func(ev Event) { escalated <- ev }
	ref, err := Spawn(context.Background(), sys, p)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := ref.Send(context.Background(), cmsg{op: "panic"}); err != nil {
			t.Fatal(err)
		}
	}
	ev := nextEvent(t, evs, EventEscalated, "fragile")
	if ev.Restarts != 2 {
		t.Errorf("escalated after %d restarts, want 2", ev.Restarts)
	}
	select {
	case sev := <-escalated:
		if sev.Actor != ref.Address() {
			t.Errorf("supervisor got %v, want %v", sev.Actor, ref.Address())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("supervisor not told")
	}
	if ev := nextEvent(t, evs, EventStopped, "fragile"); ev.Reason != string(StatusFailed) {
		t.Errorf("stopped reason = %q, want failed", ev.Reason)
	}
	<-ref.Done()
	if s := ref.Stats(); s.Status != StatusFailed || s.Restarts != 2 || s.Panics != 3 {
		t.Errorf("stats = %+v, want failed, 2 restarts, 3 panics", s)
	}
	if err := ref.Send(context.Background(), cmsg{}); !errors.Is(err, ErrStopped) {
		t.Errorf("Send to a failed actor = %v, want ErrStopped", err)
	}
}

func TestSlowEventSubscriberDoesNotBlock(t *testing.T) {
	sys := testSystem(t, "n1", nil)
	slow := sys.Subscribe(1) // never read
	var st counterState
	for _, id := range []string{"a", "b", "c"} {
		ref, err := Spawn(context.Background(), sys, st.props(id))
		if err != nil {
			t.Fatal(err)
		}
		if err := ref.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// Six events happened (started and stopped, three times); one fits.
	if got := slow.Dropped(); got != 5 {
		t.Errorf("Dropped() = %d, want 5", got)
	}
	slow.Close()
	if ev := <-slow.C; ev.Type != EventStarted || ev.Actor.ID != "a" {
		t.Errorf("buffered event = %v %s, want the first: started a", ev.Type, ev.Actor.ID)
	}
	if _, ok := <-slow.C; ok {
		t.Error("C still open after Close")
	}
}

func TestSpawnRejects(t *testing.T) {
	sys := testSystem(t, "n1", nil)
	var st counterState
	bad := []Props[cmsg]{
		{Kind: "", ID: "x", New: st.props("x").New},
		{Kind: "a.b", ID: "x", New: st.props("x").New},
		{Kind: "k", ID: "", New: st.props("x").New},
		{Kind: "k", ID: "x"},
		{Kind: "k", ID: "x", New: st.props("x").New, Mailbox: -1},
	}
	for _, p := range bad {
		if _, err := Spawn(context.Background(), sys, p); err == nil {
			t.Errorf("Spawn(%+v) succeeded, want an error", p)
		}
	}
	failing := Props[cmsg]{Kind: "k", ID: "initfail", New: func() Actor[cmsg] { return initFails{} }}
	if _, err := Spawn(context.Background(), sys, failing); err == nil || !errors.Is(err, errInit) {
		t.Errorf("Spawn with a failing Init = %v, want errInit", err)
	}
	if _, ok := sys.Lookup("k", "initfail"); ok {
		t.Error("actor whose Init failed is listed")
	}
}

var errInit = errors.New("no device")

type initFails struct{}

func (initFails) Init(context.Context) error          { return errInit }
func (initFails) Receive(context.Context, cmsg) error { return nil }
