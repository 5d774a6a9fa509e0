package trace

import (
	"context"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
)

// HeaderCarrier lets W3C trace context ride in NATS message headers.
// NATS headers are case-sensitive; Get falls back to a case-insensitive
// match so that a header rewritten with another case is still found.
type HeaderCarrier nats.Header

var _ propagation.TextMapCarrier = HeaderCarrier(nil)

// Get returns the first value of key.
func (c HeaderCarrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	for k, v := range c {
		if len(v) > 0 && strings.EqualFold(k, key) {
			return v[0]
		}
	}
	return ""
}

// Set replaces the values of key with value.
func (c HeaderCarrier) Set(key, value string) { nats.Header(c).Set(key, value) }

// Keys returns the header names.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Inject writes the trace context of ctx (traceparent and tracestate) into
// h, which must not be nil.
func Inject(ctx context.Context, h nats.Header) {
	propagation.TraceContext{}.Inject(ctx, HeaderCarrier(h))
}

// InjectMsg writes the trace context of ctx into msg's headers, creating
// them if needed.
func InjectMsg(ctx context.Context, msg *nats.Msg) {
	if msg.Header == nil {
		msg.Header = nats.Header{}
	}
	Inject(ctx, msg.Header)
}

// Extract returns ctx with the remote span context found in h, if any, so
// that spans started from it join the sender's trace.
func Extract(ctx context.Context, h nats.Header) context.Context {
	if len(h) == 0 {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, HeaderCarrier(h))
}
