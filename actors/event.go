package actors

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/troupe/troupe/bus"
)

// EventType says what happened to an actor.
type EventType uint8

// Lifecycle events.
const (
	EventStarted   EventType = iota + 1 // Init succeeded; messages flow
	EventStopped                        // the goroutine has finished after a stop
	EventPanicked                       // Receive or Init panicked
	EventRestarted                      // a fresh instance replaced a panicked one
	EventEscalated                      // restarts exceeded the intensity limit; the actor is stopped and failed
)

func (t EventType) String() string {
	switch t {
	case EventStarted:
		return "started"
	case EventStopped:
		return "stopped"
	case EventPanicked:
		return "panicked"
	case EventRestarted:
		return "restarted"
	case EventEscalated:
		return "escalated"
	}
	return "event(" + strconv.Itoa(int(t)) + ")"
}

// Event is a lifecycle event. It is a bus message so a node can publish its
// events on the bus.
type Event struct {
	Type     EventType
	Actor    Address
	Time     time.Time
	Reason   string // panic value or error, for panicked and escalated
	Restarts int    // restarts within the current intensity window
}

// Schema implements bus.Message.
func (Event) Schema() bus.Schema { return bus.Schema{ID: "troupe.actor.event", Version: 1} }

// Events is a subscription to a System's lifecycle events. The runtime never
// waits for a subscriber: when C's buffer is full the event is dropped for
// this subscriber and counted in Dropped. A subscriber that must see every
// event sizes its buffer for the bursts it expects and reads promptly.
type Events struct {
	C       <-chan Event
	ch      chan Event
	dropped atomic.Uint64
	hub     *eventHub
}

// Dropped counts events this subscriber missed because its buffer was full.
func (e *Events) Dropped() uint64 { return e.dropped.Load() }

// Close ends the subscription and closes C.
func (e *Events) Close() { e.hub.remove(e) }

// eventHub fans events out to subscribers without blocking.
type eventHub struct {
	// mu guards subs; publish holds it for reading while it sends without
	// blocking, remove holds it for writing to close a channel safely.
	mu   sync.RWMutex
	subs map[*Events]struct{}
}

func newEventHub() *eventHub { return &eventHub{subs: make(map[*Events]struct{})} }

func (h *eventHub) subscribe(buffer int) *Events {
	ch := make(chan Event, max(buffer, 1))
	e := &Events{C: ch, ch: ch, hub: h}
	h.mu.Lock()
	h.subs[e] = struct{}{}
	h.mu.Unlock()
	return e
}

func (h *eventHub) remove(e *Events) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[e]; ok {
		delete(h.subs, e)
		close(e.ch)
	}
}

func (h *eventHub) publish(ev Event) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	for e := range h.subs {
		select {
		case e.ch <- ev:
		default:
			e.dropped.Add(1)
		}
	}
}

// closeAll ends every subscription.
func (h *eventHub) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for e := range h.subs {
		delete(h.subs, e)
		close(e.ch)
	}
}
