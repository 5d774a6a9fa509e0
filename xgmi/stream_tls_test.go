package xgmi

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http/httptest"
	"testing"
)

// testTLS returns a server and a client tls.Config that trust each other: the
// server's certificate (for 127.0.0.1) is the one httptest makes.
func testTLS(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	ts := httptest.NewUnstartedServer(nil)
	ts.StartTLS()
	ts.Close() // only its certificate is wanted
	pool := x509.NewCertPool()
	pool.AddCert(ts.Certificate())
	return &tls.Config{Certificates: ts.TLS.Certificates, MinVersion: tls.VersionTLS13},
		&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}
}

// TestStreamTLS: with TLS on both ends fetches work; a plaintext client, or a
// client that does not trust the server's certificate, is refused.
func TestStreamTLS(t *testing.T) {
	srvTLS, cliTLS := testTLS(t)
	h := NewHost("a")
	data := []float32{1, 2.5, -3, 4}
	h.Publish("x", data)
	cfg := DefaultStreamConfig()
	cfg.Key = testKey
	cfg.TLS = srvTLS
	addrs := map[string]string{"a": startStreamConfig(t, h, cfg)}
	ctx := context.Background()

	cfg.TLS = cliTLS
	got, err := newClientConfig(t, cfg, addrs).Fetch(ctx, "a", "x", 1, 3)
	if err != nil || len(got) != 3 || got[0] != 2.5 || got[2] != 4 {
		t.Fatalf("fetch over tls: %v, %v", got, err)
	}

	cfg.TLS = nil
	if _, err := newClientConfig(t, cfg, addrs).Fetch(ctx, "a", "x", 0, 1); err == nil {
		t.Error("plaintext client: fetch succeeded against a TLS server")
	}
	cfg.TLS = &tls.Config{MinVersion: tls.VersionTLS13} // system roots: untrusted
	if _, err := newClientConfig(t, cfg, addrs).Fetch(ctx, "a", "x", 0, 1); !errors.Is(err, ErrAuth) {
		t.Errorf("client not trusting the server: got %v, want ErrAuth", err)
	}
}
