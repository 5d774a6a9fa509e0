package trace

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	oteltrace "go.opentelemetry.io/otel/trace"
)

// runNATS starts an in-process nats-server on a random loopback port and
// returns a connection to it; both stop at the end of the test.
func runNATS(t *testing.T) *nats.Conn {
	t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	go srv.Start() // owned by srv; Shutdown below stops it
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatalf("nats connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func TestPropagationOverNATS(t *testing.T) {
	t.Parallel()
	nc := runNATS(t)
	rec := tracetest.NewSpanRecorder()
	tr := NewTracer(newSDKProvider(t, rec))

	// The receiving side: a shard that starts its forward span from the
	// context it extracts from the step plan's headers.
	sub, err := nc.SubscribeSync("troupe.test.step")
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}

	ctx, step := tr.StartDecodeStep(context.Background(), 1, 1, 10, 2)
	msg := nats.NewMsg("troupe.test.step")
	msg.Data = []byte("plan")
	InjectMsg(ctx, msg)
	if err := nc.PublishMsg(msg); err != nil {
		t.Fatalf("publish: %v", err)
	}

	got, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("next msg: %v", err)
	}
	if got.Header.Get("traceparent") == "" {
		t.Fatalf("received headers %v lack traceparent", got.Header)
	}
	rctx := Extract(context.Background(), got.Header)
	remote := oteltrace.SpanContextFromContext(rctx)
	if !remote.IsRemote() {
		t.Error("extracted span context is not marked remote")
	}
	_, fwd := tr.StartShardForward(rctx, 0, 0, 16)
	fwd.End()
	step.End()

	ended := rec.Ended()
	if len(ended) != 2 {
		t.Fatalf("got %d spans, want 2", len(ended))
	}
	child, parent := ended[0], ended[1]
	if child.Name() != SpanShardForward || parent.Name() != SpanDecodeStep {
		t.Fatalf("got spans %s, %s; want shard.forward, decode.step", child.Name(), parent.Name())
	}
	if got, want := child.SpanContext().TraceID(), parent.SpanContext().TraceID(); got != want {
		t.Errorf("child trace id %s, want %s", got, want)
	}
	if got, want := child.Parent().SpanID(), parent.SpanContext().SpanID(); got != want {
		t.Errorf("child's parent %s, want %s", got, want)
	}
	if !child.Parent().IsRemote() {
		t.Error("child's parent is not remote")
	}
}

func TestExtractWithoutContext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, h := range []nats.Header{nil, {}, {"traceparent": {"garbage"}}} {
		if sc := oteltrace.SpanContextFromContext(Extract(ctx, h)); sc.IsValid() {
			t.Errorf("Extract(%v) gave a valid span context %v", h, sc)
		}
	}
}

func TestHeaderCarrierCaseInsensitiveGet(t *testing.T) {
	t.Parallel()
	tr := NewTracer(newSDKProvider(t, nil))
	ctx, span := tr.StartSample(context.Background())
	defer span.End()
	h := nats.Header{}
	Inject(ctx, h)
	tp := h.Get("traceparent")
	h2 := nats.Header{"Traceparent": {tp}}
	got := oteltrace.SpanContextFromContext(Extract(context.Background(), h2))
	if got.TraceID() != span.SpanContext().TraceID() {
		t.Errorf("extracted trace id %s, want %s", got.TraceID(), span.SpanContext().TraceID())
	}
	if keys := HeaderCarrier(h).Keys(); len(keys) != 1 || keys[0] != "traceparent" {
		t.Errorf("Keys() = %v, want [traceparent]", keys)
	}
}

func FuzzExtract(f *testing.F) {
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "k=v")
	f.Add("", "")
	f.Add("ff-00000000000000000000000000000000-0000000000000000-00", ",,,")
	f.Fuzz(func(t *testing.T, parent, state string) {
		h := nats.Header{"traceparent": {parent}, "tracestate": {state}}
		sc := oteltrace.SpanContextFromContext(Extract(context.Background(), h))
		if !sc.IsValid() {
			return
		}
		// A context that was accepted survives a round trip.
		out := nats.Header{}
		Inject(oteltrace.ContextWithRemoteSpanContext(context.Background(), sc), out)
		back := oteltrace.SpanContextFromContext(Extract(context.Background(), out))
		if back.TraceID() != sc.TraceID() || back.SpanID() != sc.SpanID() {
			t.Errorf("round trip changed %v into %v", sc, back)
		}
	})
}
