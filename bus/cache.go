package bus

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Cache is a JetStream key-value bucket that keeps at most a bound of
// values, the oldest dropped first once it is full: state that every node
// of a cluster reads and whose loss costs little, such as the gateway's
// kept responses. A key-value bucket refuses writes once full; a Cache
// makes room instead. It is safe for concurrent use.
type Cache struct{ kv jetstream.KeyValue }

// CacheConfig describes a cache's bucket.
type CacheConfig struct {
	Bucket string
	// MaxValues and MaxBytes bound the values kept (MaxBytes counts keys
	// and headers too); beyond either the oldest go.
	MaxValues int64
	MaxBytes  int64
	Storage   Storage
	Replicas  int
}

func (c CacheConfig) validate() error {
	switch {
	case !nameRE.MatchString(c.Bucket):
		return fmt.Errorf("cache config: bucket %q: want letters, digits, '-' or '_'", c.Bucket)
	case c.MaxValues < 1:
		return fmt.Errorf("cache config: max values %d: want >= 1", c.MaxValues)
	case c.MaxBytes < 1:
		return fmt.Errorf("cache config: max bytes %d: want >= 1", c.MaxBytes)
	case c.Replicas < 1 || c.Replicas > 5:
		return fmt.Errorf("cache config: replicas %d: want 1..5", c.Replicas)
	}
	return nil
}

// OpenCache opens the cache's bucket, creating it if needed, and sets its
// bounds to cfg's.
func OpenCache(ctx context.Context, js jetstream.JetStream, cfg CacheConfig) (*Cache, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	storage := jetstream.MemoryStorage
	if cfg.Storage == StorageFile {
		storage = jetstream.FileStorage
	}
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: cfg.Bucket, History: 1, MaxBytes: cfg.MaxBytes, Storage: storage, Replicas: cfg.Replicas,
		})
		if errors.Is(err, jetstream.ErrBucketExists) { // another node made it first
			kv, err = js.KeyValue(ctx, cfg.Bucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("cache %s: open: %w", cfg.Bucket, err)
	}
	// The bucket's stream drops its oldest values, by count and by bytes.
	st, err := js.Stream(ctx, "KV_"+cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("cache %s: stream: %w", cfg.Bucket, err)
	}
	sc := st.CachedInfo().Config
	if sc.Discard != jetstream.DiscardOld || sc.MaxMsgs != cfg.MaxValues || sc.MaxBytes != cfg.MaxBytes {
		sc.Discard, sc.MaxMsgs, sc.MaxBytes = jetstream.DiscardOld, cfg.MaxValues, cfg.MaxBytes
		if _, err := js.UpdateStream(ctx, sc); err != nil {
			return nil, fmt.Errorf("cache %s: set bounds: %w", cfg.Bucket, err)
		}
	}
	return &Cache{kv: kv}, nil
}

// Put keeps value under key.
func (c *Cache) Put(ctx context.Context, key string, value []byte) error {
	if _, err := c.kv.Put(ctx, key, value); err != nil {
		return fmt.Errorf("cache %s: put: %w", c.kv.Bucket(), err)
	}
	return nil
}

// Get returns key's value, or ok false where there is none (never put,
// deleted, dropped, or a key the bucket cannot hold).
func (c *Cache) Get(ctx context.Context, key string) ([]byte, bool, error) {
	e, err := c.kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrInvalidKey):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("cache %s: get: %w", c.kv.Bucket(), err)
	}
	return e.Value(), true, nil
}

// Delete drops key's value, if any.
func (c *Cache) Delete(ctx context.Context, key string) error {
	if err := c.kv.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrInvalidKey) {
		return fmt.Errorf("cache %s: delete: %w", c.kv.Bucket(), err)
	}
	return nil
}
