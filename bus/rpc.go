package bus

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/nats-io/nats.go"
)

// Request sends req on subject and decodes the reply as Resp. It returns when
// the reply arrives or ctx ends; ctx's deadline and trace context travel in
// the request headers. An error reply comes back as an *Error with the
// responder's code; no responder gives CodeUnavailable.
func Request[Req, Resp Message](ctx context.Context, nc *nats.Conn, subject string, req Req) (Resp, error) {
	var resp Resp
	m, err := newMsg(ctx, nc, subject, req)
	if err != nil {
		return resp, err
	}
	reply, err := nc.RequestMsgWithContext(ctx, m)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return resp, &Error{Code: CodeUnavailable, Description: "no responders on " + subject, cause: err}
	case err != nil:
		return resp, fmt.Errorf("bus: request %s: %w", subject, err)
	}
	if err := errorFromHeader(reply); err != nil {
		return resp, err
	}
	if err := Decode(reply.Data, &resp); err != nil {
		return resp, fmt.Errorf("bus: reply on %s: %w", subject, err)
	}
	return resp, nil
}

// Publish sends msg on subject without waiting for anyone. ctx supplies the
// trace context written into the headers.
func Publish[T Message](ctx context.Context, nc *nats.Conn, subject string, msg T) error {
	m, err := newMsg(ctx, nc, subject, msg)
	if err != nil {
		return err
	}
	if err := nc.PublishMsg(m); err != nil {
		return fmt.Errorf("bus: publish %s: %w", subject, err)
	}
	return nil
}

func newMsg[T Message](ctx context.Context, nc *nats.Conn, subject string, msg T) (*nats.Msg, error) {
	data, err := Encode(msg)
	if err != nil {
		return nil, err
	}
	if err := CheckPayload(nc, data); err != nil {
		return nil, err
	}
	m := nats.NewMsg(subject)
	m.Data = data
	inject(ctx, m.Header)
	return m, nil
}

// Flush waits until the server has processed everything nc sent (its
// subscriptions included), within ctx's deadline or, without one, nats.go's
// default flush timeout.
func Flush(ctx context.Context, nc *nats.Conn) error {
	if _, ok := ctx.Deadline(); ok {
		return nc.FlushWithContext(ctx)
	}
	return nc.Flush()
}

// Respond replies to m with resp.
func Respond[T Message](m *nats.Msg, resp T) error {
	data, err := Encode(resp)
	if err != nil {
		return RespondError(m, err)
	}
	if err := m.Respond(data); err != nil {
		return fmt.Errorf("bus: respond on %s: %w", m.Subject, err)
	}
	return nil
}

// RespondError replies to m with err's code and description and no body.
func RespondError(m *nats.Msg, err error) error {
	r := nats.NewMsg(m.Reply)
	setError(r.Header, err)
	if err := m.RespondMsg(r); err != nil {
		return fmt.Errorf("bus: respond on %s: %w", m.Subject, err)
	}
	return nil
}

// Subscription is a typed subscription. Messages that fail to decode are
// counted, not delivered.
type Subscription struct {
	sub       *nats.Subscription
	malformed atomic.Uint64
}

// Unsubscribe stops delivery at once.
func (s *Subscription) Unsubscribe() error { return s.sub.Unsubscribe() }

// Valid reports whether the subscription is still registered: false after
// Unsubscribe, or once a Drain has handed out its last pending message.
func (s *Subscription) Valid() bool { return s.sub.IsValid() }

// Drain stops delivery after the messages already received are handled.
func (s *Subscription) Drain() error { return s.sub.Drain() }

// Malformed counts messages dropped (or, for Serve, answered with
// CodeBadRequest) because they did not decode.
func (s *Subscription) Malformed() uint64 { return s.malformed.Load() }

// Subscribe calls fn for each message on subject that decodes as T, in
// arrival order, one at a time. fn's context derives from ctx and carries
// the message's trace context and deadline; ending ctx does not unsubscribe.
func Subscribe[T Message](ctx context.Context, nc *nats.Conn, subject string, fn func(context.Context, T)) (*Subscription, error) {
	s := &Subscription{}
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		var msg T
		if err := Decode(m.Data, &msg); err != nil {
			s.malformed.Add(1)
			return
		}
		mctx, cancel, err := MsgContext(ctx, m)
		defer cancel()
		if err != nil {
			s.malformed.Add(1)
			return
		}
		fn(mctx, msg)
	})
	if err != nil {
		return nil, fmt.Errorf("bus: subscribe %s: %w", subject, err)
	}
	s.sub = sub
	return s, nil
}

// Serve answers requests on subject with h, one at a time, in a queue group
// when queue is not empty. h's context derives from ctx and carries the
// request's deadline and trace context; ending ctx does not unsubscribe. An
// error from h is sent as its Code and description.
func Serve[Req, Resp Message](ctx context.Context, nc *nats.Conn, subject, queue string, h func(context.Context, Req) (Resp, error)) (*Subscription, error) {
	s := &Subscription{}
	handle := func(m *nats.Msg) {
		if m.Reply == "" {
			s.malformed.Add(1)
			return
		}
		var req Req
		if err := Decode(m.Data, &req); err != nil {
			s.malformed.Add(1)
			_ = RespondError(m, Errorf(CodeBadRequest, "%w", err))
			return
		}
		mctx, cancel, err := MsgContext(ctx, m)
		defer cancel()
		if err != nil {
			s.malformed.Add(1)
			_ = RespondError(m, err)
			return
		}
		resp, err := h(mctx, req)
		if err != nil {
			_ = RespondError(m, err)
			return
		}
		_ = Respond(m, resp)
	}
	sub, err := nc.QueueSubscribe(subject, queue, handle)
	if err != nil {
		return nil, fmt.Errorf("bus: serve %s: %w", subject, err)
	}
	s.sub = sub
	return s, nil
}
