package actors

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// campaigner is one node campaigning through Lead on its own connection.
type campaigner struct {
	name   string
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan struct{}
}

// TestLead: three nodes campaign for one key. One leads at a time; a
// leader that stops gives the key up at once; a leader cut off from the
// server stops leading before its entry expires, and another takes over
// after it does.
func TestLead(t *testing.T) {
	node, _ := testBus(t, "server")
	const ttl = time.Second
	var mu sync.Mutex
	leading := map[string]bool{}
	took := map[string]string{} // leader -> the state it took over
	lost := map[string]error{}  // leader -> why its lease ended (Lost)
	var overlaps []string
	lead := func(name string) func(context.Context, *Lease) {
		return func(ctx context.Context, l *Lease) {
			mu.Lock()
			for other := range leading {
				overlaps = append(overlaps, other+" and "+name)
			}
			leading[name] = true
			took[name] = l.Last.State
			mu.Unlock()
			<-ctx.Done()
			mu.Lock()
			delete(leading, name)
			lost[name] = l.Lost()
			mu.Unlock()
		}
	}
	leader := func() string {
		mu.Lock()
		defer mu.Unlock()
		for name := range leading {
			return name
		}
		return ""
	}
	var cs []*campaigner
	for _, name := range []string{"a", "b", "c"} {
		reg, nc := testRegistryConn(t, node, ttl)
		ctx, cancel := context.WithCancel(context.Background())
		c := &campaigner{name: name, nc: nc, cancel: cancel, done: make(chan struct{})}
		go func() {
			defer close(c.done)
			entry := func() Entry {
				return Entry{Kind: "lease", ID: "group-g", Node: name, Status: StatusRunning, State: "led by " + name}
			}
			reg.Lead(ctx, entry, lead(name))
		}()
		t.Cleanup(func() { cancel(); <-c.done })
		cs = append(cs, c)
	}
	reader := testRegistry(t, node, ttl)
	byName := func(name string) *campaigner {
		for _, c := range cs {
			if c.name == name {
				return c
			}
		}
		t.Fatalf("no campaigner %q", name)
		return nil
	}
	holderIs := func(want string) bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		got, err := reader.Holder(ctx, "lease", "group-g")
		return err == nil && got == want
	}

	var first string
	waitFor(t, "a leader", func() bool { first = leader(); return first != "" })
	waitFor(t, "the registry naming the first leader", func() bool { return holderIs(first) })

	// A leader that stops gives the key up: another leads well before
	// the entry would have expired.
	stopped := time.Now()
	byName(first).cancel()
	<-byName(first).done
	var second string
	waitFor(t, "a second leader", func() bool { second = leader(); return second != "" && second != first })
	if took := time.Since(stopped); took >= ttl {
		t.Errorf("the key passed on after %v: want well within the TTL of %v", took, ttl)
	}
	waitFor(t, "the registry naming the second leader", func() bool { return holderIs(second) })

	// A leader cut off stops leading; the last campaigner takes over once
	// the entry expires.
	byName(second).nc.Close()
	var third string
	waitFor(t, "the third leader", func() bool { third = leader(); return third != "" && third != second })
	waitFor(t, "the registry naming the third leader", func() bool { return holderIs(third) })
	waitFor(t, "the second leader's end", func() bool {
		mu.Lock()
		defer mu.Unlock()
		_, ok := lost[second]
		return ok
	})

	mu.Lock()
	defer mu.Unlock()
	// The first gave its key up; the second lost it, and says why.
	if lost[first] != nil {
		t.Errorf("the first leader, which stopped, lost its key: %v", lost[first])
	}
	if err := lost[second]; err == nil || !strings.Contains(err.Error(), "not renewed for") {
		t.Errorf("why the second leader, cut off, lost its key: %v", err)
	}
	if len(overlaps) > 0 {
		t.Errorf("two leaders at once: %v", overlaps)
	}
	// Each leader took over the state its predecessor wrote.
	if took[first] != "" || took[second] != "led by "+first || took[third] != "led by "+second {
		t.Errorf("states taken over: %q by %s, %q by %s, %q by %s; want none, then each predecessor's", took[first], first, took[second], second, took[third], third)
	}
}

// TestLeadTakesOverAfterStop: a node that starts campaigning only after
// the holder stopped and gave the key up still takes over the state the
// holder wrote last.
func TestLeadTakesOverAfterStop(t *testing.T) {
	node, _ := testBus(t, "server")
	reg := testRegistry(t, node, 5*time.Second)
	campaign := func(name string, state string, lead func(context.Context, *Lease)) (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			reg.Lead(ctx, func() Entry {
				return Entry{Kind: "lease", ID: "group-h", Node: name, Status: StatusRunning, State: state}
			}, lead)
		}()
		return func() { cancel(); <-done }
	}
	led := make(chan *Lease, 2)
	keep := func(ctx context.Context, l *Lease) { led <- l; <-ctx.Done() }
	stopA := campaign("a", "shape 3", keep)
	if l := <-led; l.Last.Node != "" {
		t.Errorf("the first holder took over %+v, want nothing", l.Last)
	}
	stopA() // gives the key up: deletes its entry
	if _, err := reg.Holder(context.Background(), "lease", "group-h"); !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("after the holder stopped: %v, want not registered", err)
	}
	stopB := campaign("b", "shape 4", keep)
	defer stopB()
	select {
	case l := <-led:
		if l.Last.Node != "a" || l.Last.State != "shape 3" {
			t.Errorf("the next holder took over %+v, want a's shape 3", l.Last)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("b did not take the key")
	}
}

// TestLeadGivesUpWhenLeadReturns: a lead that returns by itself (it could
// not start what it leads) gives the key up for others.
func TestLeadGivesUpWhenLeadReturns(t *testing.T) {
	node, _ := testBus(t, "server")
	reg := testRegistry(t, node, 5*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	tries := make(chan struct{}, 16)
	go func() {
		defer close(done)
		reg.Lead(ctx, func() Entry { return Entry{Kind: "lease", ID: "g", Node: "a"} }, func(context.Context, *Lease) {
			select {
			case tries <- struct{}{}:
			default:
			}
		})
	}()
	defer func() { cancel(); <-done }()
	// It campaigns again after each give-up: twice within a few TTL/4s,
	// which an entry left behind (5 s to expire) would not allow.
	for i := 0; i < 2; i++ {
		select {
		case <-tries:
		case <-time.After(4 * time.Second):
			t.Fatalf("lead ran %d times, want 2", i)
		}
	}
}

// holdLease leads key lease/g in reg, its entry's state what state holds
// ("v1" at first), and returns the lease; release makes lead return (the
// key is given up). The test's end stops campaigning.
func holdLease(t *testing.T, reg *Registry, state *atomic.Value) (l *Lease, release func()) {
	ctx, cancel := context.WithCancel(context.Background())
	state.Store("v1")
	leases := make(chan *Lease, 1)
	released := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		reg.Lead(ctx, func() Entry { return Entry{Kind: "lease", ID: "g", Node: "a", State: state.Load().(string)} }, func(ctx context.Context, l *Lease) {
			select {
			case leases <- l:
			default:
			}
			select {
			case <-released:
			case <-ctx.Done():
			}
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return <-leases, sync.OnceFunc(func() { close(released) })
}

// TestLeaseWrite: Write returns once the entry says what the holder says
// now (read back at once, no renewal waited for), and after the holder
// gave the key up it says so.
func TestLeaseWrite(t *testing.T) {
	node, _ := testBus(t, "server")
	reg := testRegistry(t, node, 20*time.Second)
	ctx := context.Background()
	var state atomic.Value
	l, release := holdLease(t, reg, &state)
	for _, v := range []string{"v2", "v3"} {
		state.Store(v)
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		err := l.Write(wctx)
		wcancel()
		if err != nil {
			t.Fatalf("Write %s: %v", v, err)
		}
		if rec, err := reg.Get(ctx, "lease", "g"); err != nil || rec.State != v {
			t.Fatalf("the entry once Write %s returned: %+v, %v", v, rec, err)
		}
	}
	release() // lead returns: the key is given up
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if err := l.Write(wctx); !errors.Is(err, ErrLeaseEnded) {
		t.Errorf("Write after the key was given up: %v, want ErrLeaseEnded", err)
	}
}

// lostAnswers is a bucket whose next Updates (lose) and Creates
// (loseTake) land but answer as if the server never replied.
type lostAnswers struct {
	jetstream.KeyValue
	lose, loseTake atomic.Int32
}

func (k *lostAnswers) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	rev, err := k.KeyValue.Create(ctx, key, value, opts...)
	if err == nil && k.loseTake.Add(-1) >= 0 {
		return 0, context.DeadlineExceeded
	}
	return rev, err
}

func (k *lostAnswers) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	next, err := k.KeyValue.Update(ctx, key, value, rev)
	if err == nil && k.lose.Add(-1) >= 0 {
		return 0, context.DeadlineExceeded
	}
	return next, err
}

// TestLeaseKeepsLandedWrite: a renewal whose answer was lost, though it
// landed, is the holder's own write: the next one goes on from its
// revision, and the key is not taken for another node's.
func TestLeaseKeepsLandedWrite(t *testing.T) {
	node, _ := testBus(t, "server")
	reg := testRegistry(t, node, 20*time.Second)
	kv := &lostAnswers{KeyValue: reg.kv}
	reg.kv = kv
	ctx := context.Background()
	var state atomic.Value
	l, _ := holdLease(t, reg, &state)
	write := func(v string) error {
		state.Store(v)
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return l.Write(wctx)
	}
	kv.lose.Store(2)
	for _, v := range []string{"v2", "v3"} {
		if err := write(v); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Write %s, its answer lost: %v", v, err)
		}
	}
	for _, v := range []string{"v4", "v5"} {
		if err := write(v); err != nil {
			t.Fatalf("Write %s after two lost answers: %v", v, err)
		}
		if rec, err := reg.Get(ctx, "lease", "g"); err != nil || rec.State != v || rec.Node != "a" {
			t.Fatalf("the entry once Write %s returned: %+v, %v", v, rec, err)
		}
	}
}

// TestLeadKeepsLandedTake: a take of the key whose answer was lost, though
// it landed, is this node's: it leads from it, as from its own key, not
// once its own entry expires as a predecessor's.
func TestLeadKeepsLandedTake(t *testing.T) {
	node, _ := testBus(t, "server")
	reg := testRegistry(t, node, 4*time.Second)
	kv := &lostAnswers{KeyValue: reg.kv}
	kv.loseTake.Store(1)
	reg.kv = kv
	var state atomic.Value
	l, _ := holdLease(t, reg, &state)
	if l.Last.Node != "" {
		t.Errorf("the lease took over %+v, its own take: it waited for that entry to expire", l.Last)
	}
	wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	state.Store("v2")
	if err := l.Write(wctx); err != nil {
		t.Fatalf("Write from the landed take: %v", err)
	}
}
