package bus

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"
)

type echoReq struct {
	Text string
	Fail Code
}

func (echoReq) Schema() Schema { return Schema{ID: "test.echo.req", Version: 1} }

type echoResp struct {
	Text        string
	HasDeadline bool
	Remaining   time.Duration
}

func (echoResp) Schema() Schema { return Schema{ID: "test.echo.resp", Version: 1} }

func echo(ctx context.Context, req echoReq) (echoResp, error) {
	if req.Fail != "" {
		return echoResp{}, Errorf(req.Fail, "asked to fail with %s", req.Fail)
	}
	d, ok := ctx.Deadline()
	return echoResp{Text: req.Text, HasDeadline: ok, Remaining: time.Until(d)}, nil
}

func TestRequestReply(t *testing.T) {
	nc := connect(t, startNode(t, DefaultConfig()))
	sub, err := Serve(context.Background(), nc, "echo", "q", echo)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := Request[echoReq, echoResp](ctx, nc, "echo", echoReq{Text: "hi"})
	if err != nil {
		t.Fatalf("Request: %v", err)
	}
	if resp.Text != "hi" {
		t.Errorf("Text = %q, want %q", resp.Text, "hi")
	}
	if !resp.HasDeadline || resp.Remaining <= 0 || resp.Remaining > 5*time.Second {
		t.Errorf("handler deadline: has=%v remaining=%v, want the caller's 5s deadline", resp.HasDeadline, resp.Remaining)
	}

	t.Run("error code crosses the wire", func(t *testing.T) {
		_, err := Request[echoReq, echoResp](ctx, nc, "echo", echoReq{Fail: CodeConflict})
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("Request = %v, want *Error", err)
		}
		if e.Code != CodeConflict || e.Description != "asked to fail with conflict" {
			t.Errorf("got %q %q, want conflict with its description", e.Code, e.Description)
		}
	})
	t.Run("bad request", func(t *testing.T) {
		_, err := Request[echoResp, echoResp](ctx, nc, "echo", echoResp{Text: "wrong type"})
		if got := CodeOf(err); got != CodeBadRequest {
			t.Errorf("CodeOf(%v) = %q, want bad_request", err, got)
		}
		if sub.Malformed() != 1 {
			t.Errorf("Malformed() = %d, want 1", sub.Malformed())
		}
	})
	t.Run("no responders", func(t *testing.T) {
		_, err := Request[echoReq, echoResp](ctx, nc, "nobody", echoReq{})
		if got := CodeOf(err); got != CodeUnavailable {
			t.Errorf("CodeOf(%v) = %q, want unavailable", err, got)
		}
		if !errors.Is(err, nats.ErrNoResponders) {
			t.Errorf("Request = %v, want errors.Is nats.ErrNoResponders", err)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		block := make(chan struct{})
		slow, err := Serve(context.Background(), nc, "slow", "", func(ctx context.Context, req echoReq) (echoResp, error) {
			<-block
			return echoResp{}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = slow.Unsubscribe() }()
		defer close(block)
		short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		_, err = Request[echoReq, echoResp](short, nc, "slow", echoReq{})
		if got := CodeOf(err); got != CodeDeadline {
			t.Errorf("CodeOf(%v) = %q, want deadline", err, got)
		}
	})
}

func TestPublishSubscribe(t *testing.T) {
	nc := connect(t, startNode(t, DefaultConfig()))
	got := make(chan echoReq, 4)
	sub, err := Subscribe(context.Background(), nc, "events", func(_ context.Context, m echoReq) { got <- m })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Publish("events", []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	for i, text := range []string{"one", "two"} {
		if err := Publish(context.Background(), nc, "events", echoReq{Text: text}); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-got:
			if m.Text != text {
				t.Errorf("message %d = %q, want %q (in order)", i, m.Text, text)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("message %d not delivered", i)
		}
	}
	if sub.Malformed() != 1 {
		t.Errorf("Malformed() = %d, want 1", sub.Malformed())
	}
}

func TestPublishRejectsOversizedPayload(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxPayload = 1024
	nc := connect(t, startNode(t, cfg))
	err := Publish(context.Background(), nc, "big", testBlob{Data: make([]byte, 2048)})
	if !errors.Is(err, ErrPayloadTooLarge) {
		t.Errorf("Publish = %v, want ErrPayloadTooLarge", err)
	}
}

func TestTraceContextCrossesTheBus(t *testing.T) {

	nc := connect(t, startNode(t, DefaultConfig()))
	seen := make(chan trace.SpanContext, 1)
	sub, err := Serve(context.Background(), nc, "traced", "", func(ctx context.Context, req echoReq) (echoResp, error) {
		seen <- trace.SpanContextFromContext(ctx)
		return echoResp{}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	tid, _ := trace.TraceIDFromHex("0102030405060708090a0b0c0d0e0f10")
	sid, _ := trace.SpanIDFromHex("0102030405060708")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	ctx, cancel := context.WithTimeout(trace.ContextWithSpanContext(context.Background(), sc), 5*time.Second)
	defer cancel()
	if _, err := Request[echoReq, echoResp](ctx, nc, "traced", echoReq{}); err != nil {
		t.Fatal(err)
	}
	got := <-seen
	if got.TraceID() != tid || got.SpanID() != sid || !got.IsRemote() {
		t.Errorf("handler span context = %v/%v remote=%v, want %v/%v remote", got.TraceID(), got.SpanID(), got.IsRemote(), tid, sid)
	}
}

func TestHeaderCarrier(t *testing.T) {
	h := nats.Header{}
	c := HeaderCarrier(h)
	c.Set("traceparent", "v")
	if got := c.Get("traceparent"); got != "v" {
		t.Errorf("Get = %q, want %q", got, "v")
	}
	if keys := c.Keys(); len(keys) != 1 || keys[0] != "traceparent" {
		t.Errorf("Keys = %v, want [traceparent]", keys)
	}
	HeaderCarrier(nil).Set("k", "v") // must not panic
	if got := HeaderCarrier(nil).Get("k"); got != "" {
		t.Errorf("nil Get = %q, want empty", got)
	}
}

func TestMsgContextRejectsBadDeadline(t *testing.T) {
	m := nats.NewMsg("x")
	m.Header.Set(HeaderDeadline, "soon")
	_, cancel, err := MsgContext(context.Background(), m)
	defer cancel()
	if CodeOf(err) != CodeBadRequest {
		t.Errorf("MsgContext = %v, want a bad_request error", err)
	}
}
