package gateway

import (
	"encoding/json"
	"fmt"
	"github.com/troupe/troupe/gateway/gatewaytest"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestNodeOpenAISDK(t *testing.T) {
	dir := gatewaytest.NodeProject(t, filepath.Join("testdata", "npm"), "openai")
	cfg := testConfig()
	cfg.APIKeys = []string{"sk-node"}
	env := newEnv(t, cfg, nil)
	out := gatewaytest.RunNode(t, dir, "sdk.mjs", 60*time.Second, "TROUPE_BASE_URL="+env.ts.URL, "TROUPE_API_KEY=sk-node")
	var res struct {
		OK     bool `json:"ok"`
		Checks int  `json:"checks"`
	}
	if err := json.Unmarshal(out, &res); err != nil || !res.OK || res.Checks != 11 {
		t.Errorf("sdk.mjs printed %s, want ok with 11 checks", out)
	}
}

func TestDemoPageInChromium(t *testing.T) {
	chromium := os.Getenv("TROUPE_CHROMIUM")
	if chromium == "" {
		chromium = "/usr/bin/chromium"
	}
	if _, err := os.Stat(chromium); err != nil {
		t.Skipf("no Chromium at %s; `apt-get install -y chromium` or set TROUPE_CHROMIUM", chromium)
	}
	dir := gatewaytest.NodeProject(t, filepath.Join("testdata", "npm"), "playwright-core")
	cfg := testConfig()
	cfg.APIKeys = []string{"sk-browser"}
	env := newEnv(t, cfg, &echoBackend{delay: 15 * time.Millisecond})
	var (
		mu     sync.Mutex
		traced []string
	)
	err := env.srv.Mount("GET /debug/traces/{id}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		mu.Lock()
		traced = append(traced, id)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"trace_id":%q,"spans":[
			{"name":"gateway.request","span_id":"a","parent_id":"","start_us":0,"duration_us":900,"attrs":{"model":"echo-1"}},
			{"name":"scheduler.step","span_id":"b","parent_id":"a","start_us":100,"duration_us":600,"attrs":{"batch":4}},
			{"name":"shard.forward","span_id":"c","parent_id":"b","start_us":150,"duration_us":400,"attrs":{}}]}`, id)
	}))
	if err != nil {
		t.Fatal(err)
	}
	vars := []string{"TROUPE_BASE_URL=" + env.ts.URL, "TROUPE_API_KEY=sk-browser", "TROUPE_CHROMIUM=" + chromium}
	if shot := os.Getenv("TROUPE_SCREENSHOT"); shot != "" {
		vars = append(vars, "TROUPE_SCREENSHOT="+shot)
	}
	out := gatewaytest.RunNode(t, dir, "browser.mjs", 120*time.Second, vars...)
	var res struct {
		PartialTokens int      `json:"partialTokens"`
		Tokens        int      `json:"tokens"`
		Text          string   `json:"text"`
		TTFT          string   `json:"ttft"`
		ITL           string   `json:"itl"`
		TPS           string   `json:"tps"`
		TokenTitle    string   `json:"tokenTitle"`
		TraceHref     string   `json:"traceHref"`
		Spans         int      `json:"spans"`
		SpanNames     []string `json:"spanNames"`
		Errors        []string `json:"errors"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("browser.mjs printed %s: %v", out, err)
	}
	want := "user: Hello from the browser\nassistant: "
	if res.Tokens != len(want) || res.Text != want {
		t.Errorf("page shows %d tokens %q, want %d tokens %q", res.Tokens, res.Text, len(want), want)
	}
	if res.PartialTokens >= res.Tokens {
		t.Errorf("saw %d tokens before completion of %d: not streamed", res.PartialTokens, res.Tokens)
	}
	for name, v := range map[string]string{"ttft": res.TTFT, "itl": res.ITL, "token title": res.TokenTitle} {
		if !strings.Contains(v, " ms") {
			t.Errorf("%s = %q, want a latency in ms", name, v)
		}
	}
	if res.TraceHref == "" || !strings.HasPrefix(res.TraceHref, "/debug/traces/trace-ws-") {
		t.Errorf("token link = %q, want /debug/traces/trace-ws-…", res.TraceHref)
	}
	if res.Spans != 3 || len(res.SpanNames) != 3 || res.SpanNames[2] != "shard.forward" {
		t.Errorf("waterfall shows %d spans %q, want the 3 served", res.Spans, res.SpanNames)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(traced) != 1 {
		t.Errorf("trace endpoint fetched %d times, want 1", len(traced))
	}
	if len(res.Errors) > 0 {
		t.Errorf("page errors: %q", res.Errors)
	}
}
