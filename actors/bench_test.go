package actors

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/troupe/troupe/bus"
)

// BenchmarkRequestThroughActor is the round trip of one request through an
// actor's endpoint over the in-process NATS connection: encode, publish,
// micro handler, mailbox, Receive, reply, decode.
func BenchmarkRequestThroughActor(b *testing.B) {
	_, nc := testBus(b, "bench")
	sys := testSystem(b, "n1", nc)
	if _, err := Spawn(context.Background(), sys, echoProps("b1")); err != nil {
		b.Fatal(err)
	}
	subj := sys.Subjects().ActorEndpoint("echo", "b1", "echo")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := bus.Request[echoReq, echoResp](ctx, nc, subj, echoReq{Text: "t"}); err != nil {
			b.Fatal(err)
		}
	}
}

type sink struct{ n *atomic.Int64 }

func (s sink) Receive(_ context.Context, m int64) error { s.n.Add(m); return nil }

// BenchmarkMailboxSendReceive is a local Send and its Receive on the actor's
// goroutine.
func BenchmarkMailboxSendReceive(b *testing.B) {
	sys := testSystem(b, "n1", nil)
	var n atomic.Int64
	ref, err := Spawn(context.Background(), sys, Props[int64]{
		Kind: "sink", ID: "s", Mailbox: 1024,
		New: func() Actor[int64] { return sink{&n} },
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var sent int64
	b.ReportAllocs()
	for b.Loop() {
		if err := ref.Send(ctx, 1); err != nil {
			b.Fatal(err)
		}
		sent++
	}
	if err := ref.Stop(ctx); err != nil { // drains: every message received
		b.Fatal(err)
	}
	if n.Load() != sent {
		b.Fatalf("received %d, want %d", n.Load(), sent)
	}
}
