package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/troupe/troupe/xgmi"
)

// writeTestPKI writes a self-signed certificate for 127.0.0.1, good for
// servers and clients as a node's must be, its key, and itself as the CA; it
// returns the cluster config naming them.
func writeTestPKI(t *testing.T) clusterConfig {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "troupe node"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c := clusterConfig{Name: "c", TLSCert: filepath.Join(dir, "cert.pem"), TLSKey: filepath.Join(dir, "key.pem"), TLSCA: filepath.Join(dir, "ca.pem")}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	for file, b := range map[string][]byte{
		c.TLSCert: certPEM,
		c.TLSCA:   certPEM,
		c.TLSKey:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}),
	} {
		if err := os.WriteFile(file, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// TestDataTLS: the bus's TLS files encrypt the data plane with mutual
// verification; no certificate leaves it plaintext; bad files are named.
func TestDataTLS(t *testing.T) {
	if cfg, err := dataTLS(clusterConfig{}); cfg != nil || err != nil {
		t.Errorf("no tls files: %v, %v; want nil, nil", cfg, err)
	}
	c := writeTestPKI(t)
	cfg, err := dataTLS(c)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ClientAuth != tls.RequireAndVerifyClientCert || cfg.RootCAs == nil {
		t.Errorf("with a CA: client auth %v, roots %v", cfg.ClientAuth, cfg.RootCAs)
	}

	// Both ends of a real stream with this configuration.
	h := xgmi.NewHost("a")
	h.Publish("x", []float32{7, 8})
	scfg := xgmi.DefaultStreamConfig()
	scfg.Key, scfg.TLS = dataKey(c), cfg
	srv, err := xgmi.NewStreamServer(h, scfg)
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
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	cl, err := xgmi.NewStreamClient(scfg, func(context.Context, string) (string, error) { return ln.Addr().String(), nil })
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if got, err := cl.Fetch(ctx, "a", "x", 1, 1); err != nil || got[0] != 8 {
		t.Errorf("fetch over the data plane's tls: %v, %v", got, err)
	}

	bad := c
	bad.TLSCA = c.TLSKey
	if _, err := dataTLS(bad); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("a key as the CA: got %v", err)
	}
	bad = c
	bad.TLSKey = filepath.Join(t.TempDir(), "missing.pem")
	if _, err := dataTLS(bad); err == nil || !strings.Contains(err.Error(), "missing.pem") {
		t.Errorf("missing key file: got %v", err)
	}
}
