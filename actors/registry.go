package actors

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/troupe/troupe/bus"
)

// Entry says what runs where: one actor, as its node reports it.
type Entry struct {
	Kind    string
	ID      string
	Node    string
	Subject string // prefix of the actor's endpoint subjects
	Started time.Time
	Status  Status
	// State is what the holder of a key taken through Lead says of what it
	// leads, for the node that takes the key over; empty for an actor.
	State string `msgpack:",omitempty"`
}

// Schema implements bus.Message.
func (Entry) Schema() bus.Schema { return bus.Schema{ID: "troupe.registry.entry", Version: 2} }

// Record is an Entry as read back from the registry.
type Record struct {
	Entry
	// Updated is when the entry was last written (its last heartbeat).
	Updated time.Time
	// Alive is false once the entry is older than the TTL; the server
	// removes such entries shortly after.
	Alive bool
}

// Change is one event of Watch.
type Change struct {
	Kind, ID string
	// Gone is true when the entry was removed: deleted by its node after a
	// stop, or expired because heartbeats stopped (Expired).
	Gone    bool
	Expired bool
	// Record is the new value; zero when Gone.
	Record Record
}

// RegistryConfig describes the registry bucket.
type RegistryConfig struct {
	Bucket string
	// TTL is how long an entry lives without a heartbeat. Heartbeats must
	// come several times per TTL. The server's minimum is one second.
	TTL      time.Duration
	Storage  bus.Storage
	Replicas int
}

// DefaultRegistryConfig is the bucket of cluster "troupe" with a 5s TTL in
// memory, one replica.
func DefaultRegistryConfig() RegistryConfig {
	s, _ := bus.NewSubjects("troupe")
	return RegistryConfig{Bucket: s.RegistryBucket(), TTL: 5 * time.Second, Storage: bus.StorageMemory, Replicas: 1}
}

// Validate reports the first problem with c.
func (c RegistryConfig) Validate() error {
	switch {
	case !kindRE.MatchString(c.Bucket):
		return fmt.Errorf("registry config: bucket %q: want letters, digits, '-' or '_'", c.Bucket)
	case c.TTL < time.Second:
		return fmt.Errorf("registry config: ttl %v: want >= 1s", c.TTL)
	case c.Replicas < 1 || c.Replicas > 5:
		return fmt.Errorf("registry config: replicas %d: want 1..5", c.Replicas)
	case c.Storage != bus.StorageMemory && c.Storage != bus.StorageFile:
		return fmt.Errorf("registry config: unknown %v", c.Storage)
	}
	return nil
}

// Registry is the cluster-wide record of running actors, kept in a
// JetStream KV bucket whose entries expire unless refreshed. It is safe for
// concurrent use.
type Registry struct {
	kv  jetstream.KeyValue
	ttl time.Duration
}

// OpenRegistry creates the bucket if needed (or updates its settings) and
// returns the registry.
func OpenRegistry(ctx context.Context, js jetstream.JetStream, cfg RegistryConfig) (*Registry, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	storage := jetstream.MemoryStorage
	if cfg.Storage == bus.StorageFile {
		storage = jetstream.FileStorage
	}
	// History keeps a key's last three writes: a holder's last renewal and
	// its deletion on giving the key up stay readable by the next holder
	// (Lease.Last) after that one's own write.
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:         cfg.Bucket,
		Description:    "troupe actor registry",
		History:        3,
		TTL:            cfg.TTL,
		LimitMarkerTTL: cfg.TTL,
		Storage:        storage,
		Replicas:       cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("registry: open bucket %s: %w", cfg.Bucket, err)
	}
	return &Registry{kv: kv, ttl: cfg.TTL}, nil
}

func registryKey(kind, id string) string { return bus.Token(kind) + "." + bus.Token(id) }

func parseKey(key string) (kind, id string, err error) {
	k, i, ok := strings.Cut(key, ".")
	if !ok {
		return "", "", fmt.Errorf("registry: key %q: want kind.id", key)
	}
	if kind, err = bus.ParseToken(k); err == nil {
		id, err = bus.ParseToken(i)
	}
	if err != nil {
		return "", "", fmt.Errorf("registry: key %q: %w", key, err)
	}
	return kind, id, nil
}

// Put writes e, which also counts as its heartbeat.
func (r *Registry) Put(ctx context.Context, e Entry) error {
	data, err := bus.Encode(e)
	if err != nil {
		return fmt.Errorf("registry: put %s/%s: %w", e.Kind, e.ID, err)
	}
	if _, err := r.kv.Put(ctx, registryKey(e.Kind, e.ID), data); err != nil {
		return fmt.Errorf("registry: put %s/%s: %w", e.Kind, e.ID, err)
	}
	return nil
}

// ErrClaimed is what Claim returns for a key with a live entry.
var ErrClaimed = errors.New("claimed")

// Claim writes e if kind/id has no live entry, atomically: of nodes that
// claim a key at once, one writes it. Otherwise it returns the live entry
// and ErrClaimed. An entry lives as long as it is written again (Put)
// within each TTL; one that lapses is taken by the next Claim.
func (r *Registry) Claim(ctx context.Context, e Entry) (Record, error) {
	for {
		_, _, err := r.acquire(ctx, e)
		if err == nil {
			return Record{}, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return Record{}, fmt.Errorf("registry: claim %s/%s: %w", e.Kind, e.ID, err)
		}
		rec, err := r.Get(ctx, e.Kind, e.ID)
		switch {
		case err == nil && rec.Alive:
			return rec, fmt.Errorf("registry: %s/%s: %w by %s", e.Kind, e.ID, ErrClaimed, rec.Node)
		case err != nil && !errors.Is(err, ErrNotRegistered):
			return Record{}, err
		}
		// Lapsed, and not yet removed (or removed since): again, soon.
		select {
		case <-ctx.Done():
			return Record{}, fmt.Errorf("registry: claim %s/%s: %w", e.Kind, e.ID, ctx.Err())
		case <-time.After(r.ttl / 20):
		}
	}
}

// Delete removes kind/id.
func (r *Registry) Delete(ctx context.Context, kind, id string) error {
	if err := r.kv.Delete(ctx, registryKey(kind, id)); err != nil {
		return fmt.Errorf("registry: delete %s/%s: %w", kind, id, err)
	}
	return nil
}

// ErrNotRegistered is returned by Get for an actor with no entry.
var ErrNotRegistered = errors.New("not registered")

// Get returns the entry of kind/id. An entry past its TTL that the server
// has not removed yet comes back with Alive false.
func (r *Registry) Get(ctx context.Context, kind, id string) (Record, error) {
	kve, err := r.kv.Get(ctx, registryKey(kind, id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Record{}, fmt.Errorf("registry: %s/%s: %w", kind, id, ErrNotRegistered)
	}
	if err != nil {
		return Record{}, fmt.Errorf("registry: get %s/%s: %w", kind, id, err)
	}
	return r.record(kve)
}

func (r *Registry) record(kve jetstream.KeyValueEntry) (Record, error) {
	var e Entry
	if err := bus.Decode(kve.Value(), &e); err != nil {
		return Record{}, fmt.Errorf("registry: entry %s: %w", kve.Key(), err)
	}
	return Record{Entry: e, Updated: kve.Created(), Alive: time.Since(kve.Created()) < r.ttl}, nil
}

// List returns every entry, alive or not yet removed.
func (r *Registry) List(ctx context.Context) ([]Record, error) {
	lister, err := r.kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("registry: list: %w", err)
	}
	defer func() { _ = lister.Stop() }()
	var out []Record
	for key := range lister.Keys() {
		kve, err := r.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // expired or deleted meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("registry: list: %w", err)
		}
		rec, err := r.record(kve)
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	return out, nil
}

// Watch calls fn with the current entries and then with every change, in
// order, until ctx ends (it then returns ctx's error) or fn returns an
// error (which Watch returns). Entries that fail to decode are skipped.
func (r *Registry) Watch(ctx context.Context, fn func(Change) error) error {
	w, err := r.kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("registry: watch: %w", err)
	}
	defer func() { _ = w.Stop() }()
	for {
		var kve jetstream.KeyValueEntry
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("registry: watch ended: %w", ctx.Err())
			}
			kve = e
		}
		if kve == nil { // end of the current entries
			continue
		}
		kind, id, err := parseKey(kve.Key())
		if err != nil {
			continue
		}
		c := Change{Kind: kind, ID: id}
		switch kve.Operation() {
		case jetstream.KeyValuePut:
			if c.Record, err = r.record(kve); err != nil {
				continue
			}
		case jetstream.KeyValuePurge:
			c.Gone, c.Expired = true, true // the server's marker for MaxAge
		default:
			c.Gone = true
		}
		if err := fn(c); err != nil {
			return err
		}
	}
}
