package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/troupe/troupe/models/demo"
	"github.com/troupe/troupe/trace"
	"github.com/troupe/troupe/trace/tracetest"
)

// TestServeTracesToJaeger serves a request with OTLP export configured by
// the standard variables and reads its per-token spans back from Jaeger's
// query API: a decode.step per token, each with its shard forward passes,
// sampling and emission.
func TestServeTracesToJaeger(t *testing.T) {
	bin := os.Getenv("TROUPE_JAEGER")
	if bin == "" {
		t.Skip("TROUPE_JAEGER is not set: run `make test` (or .ci/setup) to build Jaeger")
	}
	j := tracetest.StartJaeger(t, bin)
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+j.OTLPGRPC)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	s := startServe(t, func(c *serveConfig) { c.Shards = 2 })
	const tokens = 6
	body := fmt.Sprintf(`{"model":%q,"prompt":"The kernel","max_tokens":%d,"temperature":0}`, demo.Name, tokens)
	resp, err := http.Post(s.url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	id := strings.Split(strings.Split(string(raw), `"id":"`)[1], `"`)[0] + "-0"
	client := trace.JaegerClient{BaseURL: j.Query, HTTP: &http.Client{Timeout: 5 * time.Second}}
	deadline := time.Now().Add(60 * time.Second)
	for {
		w, err := client.Fetch(context.Background(), id)
		if err == nil {
			rows := trace.Breakdown(w)
			if complete(rows, tokens) {
				return
			}
			err = fmt.Errorf("%d token rows so far: %+v", len(rows), rows)
		}
		if time.Now().After(deadline) {
			t.Fatalf("request %s never arrived complete in Jaeger: %v", id, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// complete reports whether every token has a row with both shards' forward
// passes in it.
func complete(rows []trace.TokenRow, tokens int) bool {
	n := 0
	for _, r := range rows {
		if r.Seq >= 1 && len(r.Shards) == 2 {
			n++
		}
	}
	return n >= tokens
}
