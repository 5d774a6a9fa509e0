package scheduler

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/troupe/troupe/bus"
)

// testBus starts an in-process bus node and connects to it; both are closed
// when the test ends.
func testBus(t testing.TB) (*bus.Node, *nats.Conn) {
	t.Helper()
	ctx := context.Background()
	node, err := bus.Start(ctx, bus.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Shutdown(context.Background()) })
	nc, err := node.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return node, nc
}
