// Package actors is troupe's actor runtime: typed actors with bounded
// mailboxes, supervision with restart limits, lifecycle events, a per-node
// Spawner that starts registered kinds on request over the bus, a registry
// of what runs where in JetStream KV, and the glue that makes every actor a
// nats.go/micro service.
//
// # Ownership
//
// A System owns the goroutine of every actor spawned on it; System.Shutdown
// stops them all and waits. Each actor has exactly one goroutine, which owns
// the actor value: Init, Receive and Stop are never called concurrently, so
// actor state needs no locks. A sender that waits for the answer
// (Ref.SendInline, Ask) may run Receive, and a restart's Init, on its own
// goroutine when the actor is idle, under the same exclusion: the actor
// sees no difference, but it must not rely on goroutine identity (hold a
// thread, say). Ref.Stop waits for that goroutine. A Spawner
// owns its heartbeat goroutine; Spawner.Close stops it and waits. The
// caller owns the *nats.Conn and the bus node, and closes them last.
//
// # Ordering
//
// Messages from one sender are received in the order its Send calls
// returned; messages from different senders interleave in the order they
// entered the mailbox. Requests that reach an actor through its micro
// endpoints are queued in the same mailbox, behind earlier messages.
//
// # Backpressure
//
// Mailboxes are bounded. Ref.Send blocks while the mailbox is full until
// there is room or its ctx ends; Ref.TrySend fails at once with
// ErrMailboxFull. Bus endpoints never block the NATS delivery goroutine:
// they TrySend and answer bus.CodeOverloaded when full. Mailbox depth is in
// Stats (and so in micro STATS and the stats endpoint).
//
// # Local requests
//
// Ask is a request to an actor of this process without the bus: the same
// Call a Handle endpoint makes, handed over as a Go value and answered
// through a channel, with the bus path's error codes. Callers that may
// reach an actor either way use Ask when they hold its Ref. An idle actor
// runs an Ask (or a Ref.SendInline) on the sender's goroutine, so that a
// request and its answer cost no goroutine wake-up; a busy one queues it.
//
// # Supervision
//
// An error from Receive is counted and the actor continues. A panic in
// Receive (or in New/Init during a restart) is recovered, reported as an
// EventPanicked, and the actor is replaced by a fresh instance from
// Props.New, whose Init runs again; the message that panicked is not
// retried. After Props.MaxRestarts restarts within Props.Within, the next
// panic escalates: EventEscalated goes to subscribers and to
// Props.Supervisor, and the actor stops with status failed; messages still
// queued are dropped and later sends fail with ErrStopped.
//
// # Events
//
// Lifecycle events (started, stopped, panicked, restarted, escalated) go to
// every System.Subscribe subscription. Delivery never blocks the runtime:
// a subscriber whose buffer is full loses the event and its Dropped count
// grows. Events of one actor arrive in the order they happened.
//
// # Registry
//
// The Spawner writes an Entry for every running actor each heartbeat; the
// bucket's TTL removes entries not refreshed in time, and Watch reports
// the removal as Expired: the actor, or its node, is dead. A graceful stop
// deletes the entry at once.
package actors
