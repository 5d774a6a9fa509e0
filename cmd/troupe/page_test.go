package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/troupe/troupe/gateway/gatewaytest"
)

// TestDemoPageRealEngine opens the served demo page in headless Chromium:
// tokens of the embedded model stream in, and a token's trace shows its
// shard forward passes.
func TestDemoPageRealEngine(t *testing.T) {
	chromium := os.Getenv("TROUPE_CHROMIUM")
	if chromium == "" {
		chromium = "/usr/bin/chromium"
	}
	if _, err := os.Stat(chromium); err != nil {
		t.Skipf("no Chromium at %s; `apt-get install -y chromium` or set TROUPE_CHROMIUM", chromium)
	}
	dir := gatewaytest.NodeProject(t, filepath.Join("..", "..", "gateway", "testdata", "npm"), "playwright-core")
	s := startServe(t, func(c *serveConfig) { c.APIKeys = []string{"sk-page"} })
	out := gatewaytest.RunNode(t, dir, "browser.mjs", 2*time.Minute,
		"TROUPE_BASE_URL="+s.url, "TROUPE_API_KEY=sk-page", "TROUPE_CHROMIUM="+chromium)
	var res struct {
		PartialTokens int      `json:"partialTokens"`
		Tokens        int      `json:"tokens"`
		Text          string   `json:"text"`
		SpanNames     []string `json:"spanNames"`
		Errors        []string `json:"errors"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("browser.mjs printed %s: %v", out, err)
	}
	if res.PartialTokens < 3 || res.Tokens < res.PartialTokens || res.Text == "" || len(res.Errors) > 0 {
		t.Errorf("page: %d tokens seen mid-stream, %d at the end, text %q, errors %v", res.PartialTokens, res.Tokens, res.Text, res.Errors)
	}
	shards := 0
	for _, n := range res.SpanNames {
		if n == "shard.forward" {
			shards++
		}
	}
	if shards == 0 {
		t.Errorf("the token's trace shows no shard.forward spans: %v", res.SpanNames)
	}
}
