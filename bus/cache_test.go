package bus

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

func openCache(t *testing.T, js jetstream.JetStream, cfg CacheConfig) *Cache {
	t.Helper()
	c, err := OpenCache(t.Context(), js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func kept(t *testing.T, c *Cache, key string) ([]byte, bool) {
	t.Helper()
	v, ok, err := c.Get(t.Context(), key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	return v, ok
}

// TestCache: values put on one connection are read on another; beyond its
// bound of values, and of bytes, the oldest go; deleted and unknown keys,
// and keys the bucket cannot hold, are not found; nodes opening it at once
// share one bucket, and a reopen with other bounds takes them.
func TestCache(t *testing.T) {
	n := startNode(t, DefaultConfig())
	js1, _ := jetstream.New(connect(t, n))
	js2, _ := jetstream.New(connect(t, n))
	cfg := CacheConfig{Bucket: "test_cache", MaxValues: 3, MaxBytes: 1 << 20, Storage: StorageMemory, Replicas: 1}
	caches := make([]*Cache, 4)
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i := range caches {
		js := js1
		if i%2 == 1 {
			js = js2
		}
		wg.Go(func() { caches[i], errs[i] = OpenCache(t.Context(), js, cfg) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal("opened at once:", err)
		}
	}
	a, b := caches[0], caches[1]
	ctx := t.Context()
	for i := range 5 {
		if err := a.Put(ctx, fmt.Sprintf("resp_%d", i), []byte(fmt.Sprint("value ", i))); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		v, ok := kept(t, b, fmt.Sprintf("resp_%d", i))
		if ok != (i >= 2) || ok && string(v) != fmt.Sprint("value ", i) {
			t.Errorf("value %d: %q, %v", i, v, ok)
		}
	}
	// A key of two tokens, as a cancel marker's.
	if err := a.Put(ctx, "resp_4.cancel", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if v, ok := kept(t, b, "resp_4.cancel"); !ok || string(v) != "x" {
		t.Errorf("dotted key: %q, %v", v, ok)
	}
	if err := b.Delete(ctx, "resp_4.cancel"); err != nil {
		t.Fatal(err)
	}
	if _, ok := kept(t, b, "resp_4.cancel"); ok {
		t.Error("dotted key kept after its delete")
	}
	if err := b.Delete(ctx, "resp_3"); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"resp_3", "never", "not a key", "a.*", ""} {
		if v, ok := kept(t, a, key); ok {
			t.Errorf("key %q: %q", key, v)
		}
		if err := a.Delete(ctx, key); err != nil && key != "" {
			t.Errorf("delete %q: %v", key, err)
		}
	}

	// Bounded by bytes: 4 KiB values in 10 KiB, the last two kept.
	cfg.MaxValues, cfg.MaxBytes = 100, 10<<10
	c := openCache(t, js2, cfg)
	big := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i)}, 4<<10) }
	for i := range 6 {
		if err := c.Put(ctx, fmt.Sprint("big", i), big(i)); err != nil {
			t.Fatalf("put %d beyond the bytes: %v", i, err)
		}
	}
	for i := range 6 {
		v, ok := kept(t, a, fmt.Sprint("big", i))
		if ok != (i >= 4) || ok && !bytes.Equal(v, big(i)) {
			t.Errorf("big value %d kept %v", i, ok)
		}
	}
}

// TestCacheConfig: bad bounds and names are refused before the server is
// asked.
func TestCacheConfig(t *testing.T) {
	ok := CacheConfig{Bucket: "b", MaxValues: 1, MaxBytes: 1, Replicas: 1}
	for _, bad := range []func(*CacheConfig){
		func(c *CacheConfig) { c.Bucket = "a.b" },
		func(c *CacheConfig) { c.Bucket = "" },
		func(c *CacheConfig) { c.MaxValues = 0 },
		func(c *CacheConfig) { c.MaxBytes = -1 },
		func(c *CacheConfig) { c.Replicas = 0 },
	} {
		c := ok
		bad(&c)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if _, err := OpenCache(ctx, nil, c); err == nil {
			t.Errorf("%+v accepted", c)
		}
		cancel()
	}
}
