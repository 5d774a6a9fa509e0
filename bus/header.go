package bus

import (
	"context"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
)

// Headers troupe sets on bus messages, besides trace context and the
// nats.go/micro error headers.
const (
	// HeaderDeadline carries the caller's deadline as Unix nanoseconds.
	HeaderDeadline = "Troupe-Deadline"
	// HeaderErrorCode and HeaderError carry an error reply's Code and
	// description; they are the nats.go/micro headers.
	HeaderErrorCode = "Nats-Service-Error-Code"
	HeaderError     = "Nats-Service-Error"
)

// HeaderCarrier adapts nats.Header to propagation.TextMapCarrier so a
// propagator can inject trace context into a message and extract it again.
// Set on a nil header does nothing.
type HeaderCarrier nats.Header

var _ propagation.TextMapCarrier = HeaderCarrier(nil)

// Get returns the first value of key, or "".
func (h HeaderCarrier) Get(key string) string { return nats.Header(h).Get(key) }

// Set replaces the values of key with value.
func (h HeaderCarrier) Set(key, value string) {
	if h != nil {
		nats.Header(h).Set(key, value)
	}
}

// Keys lists the header keys.
func (h HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// traceContext is the propagation format on the bus: W3C traceparent and
// tracestate headers.
var traceContext = propagation.TraceContext{}

// inject writes ctx's deadline and trace context into h.
func inject(ctx context.Context, h nats.Header) {
	if d, ok := ctx.Deadline(); ok {
		h.Set(HeaderDeadline, strconv.FormatInt(d.UnixNano(), 10))
	}
	traceContext.Inject(ctx, HeaderCarrier(h))
}

// MsgContext derives a context for handling m from parent: it carries m's
// W3C trace context and m's deadline,
// if it has one. A malformed deadline is an error with CodeBadRequest. The
// caller must call cancel.
func MsgContext(parent context.Context, m *nats.Msg) (ctx context.Context, cancel context.CancelFunc, err error) {
	ctx = traceContext.Extract(parent, HeaderCarrier(m.Header))
	v := m.Header.Get(HeaderDeadline)
	if v == "" {
		ctx, cancel = context.WithCancel(ctx)
		return ctx, cancel, nil
	}
	ns, perr := strconv.ParseInt(v, 10, 64)
	if perr != nil {
		return parent, func() {}, Errorf(CodeBadRequest, "header %s %q: %w", HeaderDeadline, v, perr)
	}
	ctx, cancel = context.WithDeadline(ctx, time.Unix(0, ns))
	return ctx, cancel, nil
}

// errorFromHeader returns the *Error an error reply carries, or nil.
func errorFromHeader(m *nats.Msg) error {
	code := m.Header.Get(HeaderErrorCode)
	if code == "" {
		return nil
	}
	return &Error{Code: Code(code), Description: m.Header.Get(HeaderError)}
}

// setError writes err into h as code and description.
func setError(h nats.Header, err error) {
	desc := err.Error()
	if e, ok := err.(*Error); ok {
		desc = e.Description
	}
	h.Set(HeaderErrorCode, string(CodeOf(err)))
	h.Set(HeaderError, desc)
}
