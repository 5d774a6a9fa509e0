// Package bus provides the message bus every troupe node embeds: a
// nats-server started in-process, a closed and versioned msgpack codec for
// control-plane messages, typed request/reply and publish/subscribe functions,
// a header carrier for trace context and deadlines, and the catalog of
// subjects (subjects.go).
//
// # Ownership and concurrency
//
// A [Node] owns its server and every goroutine the server starts; Shutdown
// stops them and waits. Connections returned by [Node.Conn] belong to the
// caller, who closes them before shutting the node down.
//
// Encode, Decode, the subject builders and [HeaderCarrier] are pure functions
// and safe for concurrent use. [Request], [Publish] and [Subscribe] are as safe
// as the *nats.Conn they use. A [Subscription]'s callback runs on the one
// goroutine nats.go gives each subscription, so messages on one subscription
// are handled in arrival order, one at a time; a slow callback makes the
// subscription a slow consumer in NATS terms (messages are dropped by the
// client library and counted there), it never grows memory without bound.
//
// # Wire format
//
// A message is one msgpack array [schema id, version, body]; the body is the
// message struct as a msgpack map keyed by field name. Decode accepts exactly
// one schema id and version per Go type, rejects fields the type does not
// declare, trailing bytes, declared lengths the input cannot hold, and inputs
// larger than [MaxMessageSize]. Errors that cross the wire travel as a stable
// [Code] and a description in the Nats-Service-Error-Code and
// Nats-Service-Error headers, the same headers nats.go/micro services use, so a
// micro endpoint and a [Serve] handler look alike to a caller.
//
// # Data plane
//
// Bus messages carry control data only. Large buffers (activations, logits,
// weights) stay where they are and are named by a [TensorRef]; [CheckPayload]
// rejects a payload that exceeds the connection's max_payload before it is
// sent.
package bus
