// Package trace records an OpenTelemetry trace of every request, down to
// every token, and shows it without a collector.
//
// # Setup
//
// Setup builds a Provider from a Config: an SDK TracerProvider whose spans
// go to an in-memory Store of recent traces and, when Config.Export asks,
// through a batching processor to an OTLP exporter over gRPC or HTTP.
// ExportFromEnv derives Export from the standard OTEL_* variables; only a
// program's main passes it os.LookupEnv. With nothing configured, spans stay
// in the Store. The package never touches OpenTelemetry's global provider:
// callers pass the Provider, or its Tracer, explicitly.
//
// # Vocabulary
//
// One trace covers one request. The spans nest like this:
//
//	request              request.id
//	├── queue            request.id
//	├── prefill          position, prefill.tokens, kv.blocks   (one per chunk)
//	│   ├── shard.forward  shard.index, shard.layer.start, shard.layer.end
//	│   ├── sample
//	│   └── emit         token.seq, token.id                    (the first token)
//	└── decode.step      token.seq, batch.size, position, kv.blocks (one per token)
//	    ├── shard.forward  (one per pipeline stage)
//	    ├── sample
//	    └── emit         token.seq, token.id
//
// Tracer starts each of these spans with its attributes and adds no
// allocation to what the SDK needs for a span. Breakdown turns a trace of
// this shape into one latency row per token.
//
// # Across the bus
//
// Inject and Extract carry W3C trace context (traceparent, tracestate) in
// NATS message headers, so that an actor's spans join the trace of the
// message that caused them.
//
// # Inspection
//
// Store keeps the ended spans of the most recently updated traces within
// fixed bounds and finds a trace by id or by request id. Handler serves them
// as Waterfall JSON under /debug/traces/ and /debug/requests/; FetchRequest
// reads them back; JaegerClient reads the same shape from a Jaeger query
// service. WriteBreakdown prints a breakdown as a table or as JSON.
//
// # Concurrency
//
// Provider, Store, Tracer and JaegerClient are safe for concurrent use. The
// Provider owns the batching processor's goroutine; Shutdown flushes
// pending spans and stops it.
package trace
