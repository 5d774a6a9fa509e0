package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// dataTLS builds the data plane's TLS configuration from the bus's TLS files:
// nil (plaintext, still authenticated by the cluster key) without a
// certificate; with one, every data-plane connection is encrypted and the
// node presents it both as server and as client; with a CA, each side also
// verifies the other's certificate against it (the certificate must then name
// the data-plane address's host).
func dataTLS(c clusterConfig) (*tls.Config, error) {
	if c.TLSCert == "" && c.TLSKey == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("data plane tls: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}
	if c.TLSCA != "" {
		pem, err := os.ReadFile(c.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("data plane tls: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("data plane tls: %s holds no PEM certificate", c.TLSCA)
		}
		cfg.RootCAs, cfg.ClientCAs, cfg.ClientAuth = pool, pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
