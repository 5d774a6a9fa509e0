// Package tracetest runs a real trace collector for tests: Jaeger
// all-in-one, built once by the test set-up (see docs/testing.md) and named
// by the TROUPE_JAEGER variable.
package tracetest

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Jaeger is a Jaeger all-in-one process on loopback ports of its own.
type Jaeger struct {
	OTLPGRPC, OTLPHTTP string // host:port
	Query              string // base URL of the query API
}

// jaegerConfig is the all-in-one pipeline with memory storage, every
// listener on a port chosen by the test, no metrics endpoint and no traces
// of Jaeger's own (which it would send to localhost:4317), so that several
// runs can share a machine.
const jaegerConfig = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
    traces:
      level: none
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
  jaeger_query:
    enable_tracing: false
    storage:
      traces: memstore
    http:
      endpoint: %[3]s
    grpc:
      endpoint: %[4]s
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %[1]s
      http:
        endpoint: %[2]s
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`

// StartJaeger runs the Jaeger binary bin until the end of the test. A
// port taken between choosing and binding it makes Jaeger exit; it is then
// started again on new ports.
func StartJaeger(t testing.TB, bin string) Jaeger {
	t.Helper()
	var lastErr error
	for range 3 {
		j, err := tryStartJaeger(t, bin)
		if err == nil {
			return j
		}
		lastErr = err
		t.Logf("jaeger did not start, trying new ports: %v", err)
	}
	t.Fatalf("jaeger: %v", lastErr)
	return Jaeger{}
}

func tryStartJaeger(t testing.TB, bin string) (Jaeger, error) {
	ports, err := freePorts(4)
	if err != nil {
		return Jaeger{}, err
	}
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "jaeger.yaml")
	if err := os.WriteFile(cfgPath, fmt.Appendf(nil, jaegerConfig, ports[0], ports[1], ports[2], ports[3]), 0o644); err != nil {
		return Jaeger{}, err
	}
	var out lockedBuffer
	cmd := exec.Command(bin, "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Dir = dir
	for _, kv := range os.Environ() { // the host's exporter settings are not Jaeger's
		if !strings.HasPrefix(kv, "OTEL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if err := cmd.Start(); err != nil {
		return Jaeger{}, fmt.Errorf("start %s: %w", bin, err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { // owned by this test; the cleanup below waits for it
		waitErr = cmd.Wait()
		close(exited)
	}()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	j := Jaeger{OTLPGRPC: ports[0], OTLPHTTP: ports[1], Query: "http://" + ports[2]}

	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			return Jaeger{}, fmt.Errorf("exited early (%v):\n%s", waitErr, out.String())
		default:
		}
		// The receivers start apart from the query API: a span exported
		// before its receiver listens is refused and lost.
		if ready(j.Query+"/api/services") && listening(j.OTLPGRPC) && listening(j.OTLPHTTP) {
			break
		}
		if time.Now().After(deadline) {
			stop()
			return Jaeger{}, fmt.Errorf("query API or OTLP receivers not ready after 60s:\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("jaeger output:\n%s", out.String())
		}
	})
	return j, nil
}

func ready(u string) bool {
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(u)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// listening says whether something accepts connections at addr.
func listening(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// freePorts returns n loopback addresses whose ports were free a moment ago.
func freePorts(n int) ([]string, error) {
	addrs := make([]string, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, nil
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
