package trace

import (
	"context"
	"sync"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// newSDKProvider returns a bare SDK provider sending spans to sp, if not
// nil, shut down at the end of the test.
func newSDKProvider(t testing.TB, sp sdktrace.SpanProcessor) *sdktrace.TracerProvider {
	t.Helper()
	var opts []sdktrace.TracerProviderOption
	if sp != nil {
		opts = append(opts, sdktrace.WithSpanProcessor(sp))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	t.Cleanup(func() {
		if err := tp.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return tp
}

// lastSpan is a span processor that keeps the last ended span.
type lastSpan struct {
	mu   sync.Mutex
	span sdktrace.ReadOnlySpan
}

func (l *lastSpan) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (l *lastSpan) OnEnd(s sdktrace.ReadOnlySpan) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.span = s
}
func (l *lastSpan) Shutdown(context.Context) error   { return nil }
func (l *lastSpan) ForceFlush(context.Context) error { return nil }
