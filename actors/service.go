package actors

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/troupe/troupe/bus"
)

// StatsEndpoint is the endpoint every actor service has: it answers with the
// actor's Stats (msgpack) without going through the mailbox.
const StatsEndpoint = "stats"

// Endpoint is a request endpoint of an actor kind, made by Handle.
type Endpoint[M any] struct {
	Name    string
	subject string // absolute subject; "" means <actor subject>.<Name>
	handle  func(p *process[M], r micro.Request)
}

// At returns e answering on subject instead of the actor's group.
func (e Endpoint[M]) At(subject string) Endpoint[M] {
	e.subject = subject
	return e
}

// Handle makes an endpoint that decodes each request as Req, wraps it with
// wrap into the actor's message type and queues it in the mailbox without
// blocking. The actor answers through the Call. A request that does not
// decode is answered with bus.CodeBadRequest; a full mailbox with
// bus.CodeOverloaded; a stopping actor with bus.CodeUnavailable.
func Handle[M any, Req, Resp bus.Message](name string, wrap func(*Call[Req, Resp]) M) Endpoint[M] {
	return Endpoint[M]{Name: name, handle: func(p *process[M], r micro.Request) {
		// Failures here are answered synchronously through r, so micro
		// counts them; the actor answers later by publishing to the reply
		// subject, as r must not be used after the handler returns.
		c := &Call[Req, Resp]{nc: p.sys.nc, reply: r.Reply()}
		if err := bus.Decode(r.Data(), &c.Req); err != nil {
			failNow(r, bus.Errorf(bus.CodeBadRequest, "%w", err))
			return
		}
		ctx, cancel, err := bus.MsgContext(p.ctx, &nats.Msg{Header: nats.Header(r.Headers())})
		if err != nil {
			cancel()
			failNow(r, err)
			return
		}
		c.ctx, c.cancel = ctx, cancel
		switch err := p.mb.TrySend(wrap(c)); {
		case errors.Is(err, ErrMailboxFull):
			cancel()
			failNow(r, bus.Errorf(bus.CodeOverloaded, "actor %s: mailbox full (%d)", p.addr, p.mb.Cap()))
		case err != nil:
			cancel()
			failNow(r, bus.Errorf(bus.CodeUnavailable, "actor %s: %w", p.addr, err))
		}
	}}
}

func failNow(r micro.Request, err error) {
	_ = r.Error(string(bus.CodeOf(err)), description(err), nil)
}

func description(err error) string {
	if e, ok := err.(*bus.Error); ok {
		return e.Description
	}
	return err.Error()
}

// Call is a request from the bus, or from Ask in this process, waiting in a
// mailbox. The actor must answer every Call exactly once, with Reply or
// Fail; later answers are ignored.
type Call[Req, Resp bus.Message] struct {
	Req      Req
	nc       *nats.Conn
	reply    string
	ctx      context.Context
	cancel   context.CancelFunc
	answered atomic.Bool
	// local, set by Ask, takes the answer instead of the reply subject.
	local chan answer[Resp]
}

// Context carries the caller's deadline and trace context. For a request
// from the bus it is also cancelled when the actor is aborted; for one
// from Ask it is the asker's context.
func (c *Call[Req, Resp]) Context() context.Context {
	if c.ctx == nil {
		return context.Background()
	}
	return c.ctx
}

// Reply answers with resp.
func (c *Call[Req, Resp]) Reply(resp Resp) error {
	if !c.answer() {
		return nil
	}
	if c.local != nil {
		c.local <- answer[Resp]{resp: resp}
		return nil
	}
	data, err := bus.Encode(resp)
	if err != nil {
		return c.publish(errorMsg(c.reply, err))
	}
	return c.publish(&nats.Msg{Subject: c.reply, Data: data})
}

// Fail answers with err's bus.Code and description.
func (c *Call[Req, Resp]) Fail(err error) error {
	if !c.answer() {
		return nil
	}
	if c.local != nil {
		c.local <- answer[Resp]{err: localError(err)}
		return nil
	}
	return c.publish(errorMsg(c.reply, err))
}

func errorMsg(subject string, err error) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Header.Set(bus.HeaderErrorCode, string(bus.CodeOf(err)))
	m.Header.Set(bus.HeaderError, description(err))
	return m
}

func (c *Call[Req, Resp]) publish(m *nats.Msg) error {
	if c.reply == "" || c.nc == nil {
		return nil // nobody waits for an answer
	}
	if err := c.nc.PublishMsg(m); err != nil {
		return fmt.Errorf("reply to %s: %w", c.reply, err)
	}
	return nil
}

func (c *Call[Req, Resp]) answer() bool {
	if !c.answered.CompareAndSwap(false, true) {
		return false
	}
	if c.cancel != nil {
		c.cancel()
	}
	return true
}

// serve registers p as a micro service named for its kind: PING, INFO and
// STATS (with p's Stats as each endpoint's data), the stats endpoint, and
// p's endpoints in the group p.subject.
func serve[M any](nc *nats.Conn, p *process[M]) (micro.Service, error) {
	svc, err := micro.AddService(nc, micro.Config{
		Name:        p.addr.Kind,
		Version:     p.props.Version,
		Description: p.props.Description,
		Metadata:    map[string]string{"id": p.addr.ID, "node": p.addr.Node, "subject": p.subject},
		StatsHandler: func(*micro.Endpoint) any {
			return p.stats()
		},
	})
	if err != nil {
		return nil, fmt.Errorf("micro service %s: %w", p.addr.Kind, err)
	}
	g := svc.AddGroup(p.subject)
	err = g.AddEndpoint(StatsEndpoint, micro.HandlerFunc(func(r micro.Request) {
		data, err := bus.Encode(p.stats())
		if err != nil {
			_ = r.Error(string(bus.CodeInternal), err.Error(), nil)
			return
		}
		_ = r.Respond(data)
	}))
	for _, e := range p.props.Endpoints {
		if err != nil {
			break
		}
		h := micro.HandlerFunc(func(r micro.Request) { e.handle(p, r) })
		if e.subject != "" {
			err = svc.AddEndpoint(e.Name, h, micro.WithEndpointSubject(e.subject))
		} else {
			err = g.AddEndpoint(e.Name, h)
		}
	}
	if err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("micro service %s: endpoint: %w", p.addr.Kind, err)
	}
	return svc, nil
}
