package xgmi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testKey = []byte("0123456789abcdef-cluster-key")

// startStream serves h on a loopback port until the test ends.
func startStream(t testing.TB, h *Host, key []byte) string {
	t.Helper()
	cfg := DefaultStreamConfig()
	cfg.Key = key
	return startStreamConfig(t, h, cfg)
}

func startStreamConfig(t testing.TB, h *Host, cfg StreamConfig) string {
	t.Helper()
	srv, err := NewStreamServer(h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String()
}

func newClient(t testing.TB, key []byte, addrs map[string]string) *StreamClient {
	t.Helper()
	cfg := DefaultStreamConfig()
	cfg.Key = key
	return newClientConfig(t, cfg, addrs)
}

func newClientConfig(t testing.TB, cfg StreamConfig, addrs map[string]string) *StreamClient {
	t.Helper()
	c, err := NewStreamClient(cfg, func(_ context.Context, node string) (string, error) {
		a, ok := addrs[node]
		if !ok {
			return "", errors.New("unknown node")
		}
		return a, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestStreamFetch(t *testing.T) {
	h := NewHost("a")
	data := make([]float32, 10000)
	for i := range data {
		data[i] = float32(i) * 0.5
	}
	h.Publish("shard/x", data)
	c := newClient(t, testKey, map[string]string{"a": startStream(t, h, testKey)})
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				got, err := c.Fetch(ctx, "a", "shard/x", 100+i, 384)
				if err != nil {
					t.Error(err)
					return
				}
				if len(got) != 384 || got[0] != data[100+i] || got[383] != data[100+i+383] {
					t.Errorf("fetch at %d: got [%v ... %v] of %d", 100+i, got[0], got[len(got)-1], len(got))
					return
				}
			}
		}()
	}
	wg.Wait()
	if _, err := c.Fetch(ctx, "a", "missing", 0, 1); err == nil || errors.Is(err, ErrUnreachable) {
		t.Errorf("fetch of a missing buffer: got %v, want a refusal", err)
	}
	if _, err := c.Fetch(ctx, "a", "shard/x", 9990, 20); err == nil {
		t.Error("fetch past the end: no error")
	}
	// The connection survives refusals.
	if got, err := c.Fetch(ctx, "a", "shard/x", 0, 2); err != nil || got[1] != 0.5 {
		t.Errorf("fetch after refusals: got %v, %v", got, err)
	}
}

func TestStreamWrongKey(t *testing.T) {
	h := NewHost("a")
	h.Publish("b", []float32{1})
	addr := startStream(t, h, testKey)
	c := newClient(t, []byte("another-key-of-enough-bytes"), map[string]string{"a": addr})
	_, err := c.Fetch(context.Background(), "a", "b", 0, 1)
	if !errors.Is(err, ErrAuth) {
		t.Fatalf("fetch with the wrong key: got %v, want ErrAuth", err)
	}
	// A raw client that skips the handshake gets nothing.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var buf bytes.Buffer
	writeFrame(&buf, frameFetch, fetchReq{name: "b", n: 1}.encode())
	conn.Write(buf.Bytes())
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	typ, _, err := readFrame(conn, nil, MaxFrame)
	if err != nil || typ != frameChallenge {
		t.Fatalf("first frame: type %d, %v; want the challenge", typ, err)
	}
	typ, _, err = readFrame(conn, nil, MaxFrame)
	if err == nil && typ == frameData {
		t.Fatal("unauthenticated fetch got data")
	}
}

func TestStreamPeerGone(t *testing.T) {
	h := NewHost("a")
	h.Publish("b", []float32{1, 2})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := newClient(t, testKey, map[string]string{"a": addr})
	_, err = c.Fetch(context.Background(), "a", "b", 0, 1)
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("fetch from a closed port: got %v, want ErrUnreachable", err)
	}
	if _, err := c.Fetch(context.Background(), "z", "b", 0, 1); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("fetch from an unknown node: got %v, want ErrUnreachable", err)
	}
}

func TestStreamConfigValidate(t *testing.T) {
	cfg := DefaultStreamConfig()
	if err := cfg.Validate(); err == nil {
		t.Error("no key: no error")
	}
	cfg.Key = testKey
	if err := cfg.Validate(); err != nil {
		t.Errorf("valid config: %v", err)
	}
	if _, err := NewStreamClient(cfg, nil); err == nil {
		t.Error("nil resolver: no error")
	}
}

func TestFrameRoundTrip(t *testing.T) {
	for _, body := range [][]byte{nil, {1}, bytes.Repeat([]byte{7}, 70000)} {
		var buf bytes.Buffer
		if err := writeFrame(&buf, frameData, body); err != nil {
			t.Fatal(err)
		}
		typ, got, err := readFrame(&buf, nil, MaxFrame)
		if err != nil || typ != frameData || !bytes.Equal(got, body) {
			t.Errorf("round trip of %d bytes: type %d, %d bytes, %v", len(body), typ, len(got), err)
		}
	}
	var buf bytes.Buffer
	writeFrame(&buf, frameData, []byte("hello"))
	raw := buf.Bytes()
	raw[6] ^= 1
	if _, _, err := readFrame(bytes.NewReader(raw), nil, MaxFrame); !errors.Is(err, ErrFrame) {
		t.Errorf("flipped bit: got %v, want ErrFrame", err)
	}
	if _, _, err := readFrame(bytes.NewReader([]byte{0xff, 0xff, 0xff, 0xff, 5}), nil, 1024); !errors.Is(err, ErrFrame) {
		t.Errorf("huge length: got %v, want ErrFrame", err)
	}
}

// FuzzReadFrame feeds arbitrary bytes to the frame and fetch decoders: they
// must fail cleanly, never panic or allocate past their limit, and a frame
// they accept must re-encode to the same bytes.
func FuzzReadFrame(f *testing.F) {
	var buf bytes.Buffer
	writeFrame(&buf, frameFetch, fetchReq{name: "shard/r0-s1", off: 3, n: 384}.encode())
	f.Add(buf.Bytes())
	buf.Reset()
	writeFrame(&buf, frameData, []byte{0, 0, 128, 63})
	f.Add(buf.Bytes())
	f.Add([]byte{0, 0, 0, 1, 3, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		typ, body, err := readFrame(bytes.NewReader(in), nil, 1<<16)
		if err != nil {
			return
		}
		var out bytes.Buffer
		if err := writeFrame(&out, typ, body); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Bytes(), in[:out.Len()]) {
			t.Fatalf("re-encoded frame differs")
		}
		if typ == frameFetch {
			if fr, err := decodeFetch(body); err == nil && !bytes.Equal(fr.encode(), body) {
				t.Fatalf("re-encoded fetch differs")
			}
		}
	})
}

// BenchmarkStreamFetch is one hop of the data plane over loopback TCP: the
// activations of a decode step of the demo model (hidden 384) at batch 1
// and 8.
func BenchmarkStreamFetch(b *testing.B) {
	for _, rows := range []int{1, 8} {
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) {
			h := NewHost("a")
			h.Publish("x", make([]float32, rows*384))
			c := newClient(b, testKey, map[string]string{"a": startStream(b, h, testKey)})
			ctx := context.Background()
			b.SetBytes(int64(rows * 384 * 4))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Fetch(ctx, "a", "x", 0, rows*384); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
