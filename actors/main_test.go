package actors

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/troupe/troupe/bus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testBus starts an in-process node and returns a connection to it; both
// are closed when the test ends.
func testBus(t testing.TB, name string) (*bus.Node, *nats.Conn) {
	t.Helper()
	cfg := bus.DefaultConfig()
	cfg.Name = name
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := bus.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("bus.Start: %v", err)
	}
	nc, err := n.Conn(ctx)
	if err != nil {
		t.Fatalf("Conn: %v", err)
	}
	t.Cleanup(func() {
		nc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := n.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return n, nc
}

// testSystem returns a System on node shut down when the test ends (before
// the bus, as cleanups run last-in first-out).
func testSystem(t testing.TB, node string, nc *nats.Conn) *System {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Node = node
	sys, err := NewSystem(cfg, nc)
	if err != nil {
		t.Fatalf("NewSystem: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := sys.Shutdown(ctx); err != nil {
			t.Errorf("System.Shutdown: %v", err)
		}
	})
	return sys
}

// waitFor polls cond until it holds or five seconds pass.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// nextEvent returns the next event of type want for actor id, skipping
// others.
func nextEvent(t testing.TB, evs *Events, want EventType, id string) Event {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case ev := <-evs.C:
			if ev.Type == want && ev.Actor.ID == id {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %v event for %s", want, id)
		}
	}
}
