package main

import (
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"

	"github.com/troupe/troupe/models/hub/hubtest"
)

// TestPull: `troupe pull` fetches a repository from a Hub (HF_ENDPOINT)
// into the Hub's cache (HF_HUB_CACHE) with its progress, and every
// command's --model takes the repository's id: the model it loads is the
// one in the folder, named for the repository, offline too.
func TestPull(t *testing.T) {
	const repo = "troupe/docs-olmo2-17m"
	src := filepath.Join("..", "..", "models", "demo", "docs-olmo2-17m")
	h := &hubtest.Hub{Repo: repo, Commit: strings.Repeat("c", 40), Files: map[string][]byte{}, LFS: map[string]bool{"model.safetensors": true}}
	for _, name := range []string{"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "reference.json"} {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		h.Files[name] = b
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	cache := t.TempDir()
	t.Setenv("HF_ENDPOINT", srv.URL)
	t.Setenv("HF_HUB_CACHE", cache)
	t.Setenv("HF_TOKEN", "")
	t.Setenv("HF_HOME", t.TempDir())
	t.Setenv("HF_HUB_OFFLINE", "")

	// Before any pull, inspect reads the configs and the safetensors
	// headers alone, and reports what the folder's inspect does.
	inspectJSON := func(model string) report {
		t.Helper()
		out, stderr, err := runCLI(t, "", "inspect", "--json", "--model", model)
		var r report
		if err != nil || json.Unmarshal([]byte(out), &r) != nil {
			t.Fatalf("inspect --model %s: %v, %s%s", model, err, out, stderr)
		}
		return r
	}
	peek, local := inspectJSON(repo), inspectJSON(src)
	if !peek.Peeked || local.Peeked || peek.Model != repo || peek.Parameters != local.Parameters || peek.WeightBytes != local.WeightBytes || peek.WeightBytes == 0 || !peek.Tokenizer {
		t.Errorf("inspect of the repository %+v, of the folder %+v", peek, local)
	}
	// tokenize reads the tokenizer the same way.
	byDir, _, _ := runCLI(t, `["The kernel"]`, "tokenize", "--model", src)
	if out, _, err := runCLI(t, `["The kernel"]`, "tokenize", "--model", repo); err != nil || !strings.HasPrefix(out, "[[") || out != byDir {
		t.Errorf("tokenize --model %s: %v, %q; by folder %q", repo, err, out, byDir)
	}
	for _, g := range h.Gets() {
		if strings.Contains(g, "model.safetensors") && !strings.Contains(g, "bytes=0-") {
			t.Errorf("inspect or tokenize fetched the weights: %q", g)
		}
	}
	if entries, _ := os.ReadDir(cache); len(entries) != 0 {
		t.Errorf("inspect wrote to the cache: %v", entries)
	}

	out, stderr, err := runCLI(t, "", "pull", repo)
	if err != nil {
		t.Fatalf("pull: %v\n%s", err, stderr)
	}
	dir := strings.TrimSpace(out)
	if want := filepath.Join(cache, "models--troupe--docs-olmo2-17m", "snapshots", h.Commit); dir != want || !strings.Contains(stderr, "model.safetensors") || !strings.Contains(stderr, "fetched") || !strings.Contains(stderr, "5 file(s) to fetch") {
		t.Errorf("pull printed %q (want %q), progress:\n%s", dir, want, stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "reference.json")); !os.IsNotExist(err) {
		t.Errorf("reference.json fetched: %v", err)
	}
	out, stderr, err = runCLI(t, "", "pull", "--json", repo+"@main")
	var r pullResult
	if err != nil || json.Unmarshal([]byte(out), &r) != nil || r.Dir != dir || r.Model != repo || r.Revision != "main" || stderr != "" {
		t.Errorf("pull --json: %v, %q, stderr %q", err, out, stderr)
	}

	gen := func(model string) string {
		t.Helper()
		out, stderr, err := runCLI(t, "", "generate", "--model", model, "--prompt-ids", "473,623", "--max-tokens", "6", "--json")
		if err != nil {
			t.Fatalf("generate --model %s: %v\n%s", model, err, stderr)
		}
		return out
	}
	if byRepo, byDir := gen(repo), gen(src); byRepo != byDir {
		t.Errorf("generate by repository: %s\nby folder: %s", byRepo, byDir)
	}
	if r := inspectJSON(repo); r.Peeked || r.Model != repo || r.Parameters != local.Parameters {
		t.Errorf("inspect after the pull: %+v", r)
	}
	t.Setenv("HF_HUB_OFFLINE", "1")
	srv.Close()
	if byRepo := gen(repo); byRepo != gen(src) {
		t.Errorf("offline: %s", byRepo)
	}
	for _, bad := range []struct{ arg, want string }{
		{"troupe/absent", "not in the cache"},
		{"no-slash", "not a repository id"},
	} {
		if _, _, err := runCLI(t, "", "pull", bad.arg); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("pull %s: %v, want %q", bad.arg, err, bad.want)
		}
	}
	// A path that is not a folder stays a path.
	if _, _, err := runCLI(t, "", "inspect", "--model", "./absent/dir"); err == nil || strings.Contains(err.Error(), "Hugging Face") {
		t.Errorf("inspect of an absent path: %v", err)
	}
}

// TestServeGenerationConfig: serve gives requests that leave a sampler's
// parameter out the model's generation_config.json's value (here
// temperature 0, so they decode greedily), unless --generation-config
// none; its end tokens stop generation as config.json's do.
func TestServeGenerationConfig(t *testing.T) {
	src := filepath.Join("..", "..", "models", "demo", "docs-olmo2-17m")
	dir := t.TempDir()
	for _, name := range []string{"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} {
		if err := os.Symlink(filepath.Join(must(filepath.Abs(src)), name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(`{"eos_token_id": 0, "temperature": 0}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ask := func(s *server, temp *float64) string {
		t.Helper()
		params := openai.CompletionNewParams{Model: openai.CompletionNewParamsModel(filepath.Base(dir)), MaxTokens: openai.Int(16), Seed: openai.Int(3),
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("The kernel")}}
		if temp != nil {
			params.Temperature = openai.Float(*temp)
		}
		c := s.client()
		resp, err := c.Completions.New(t.Context(), params)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Choices[0].Text
	}
	zero := 0.0
	auto := startServe(t, func(c *serveConfig) { c.Model = dir })
	greedy := ask(auto, &zero)
	if got := ask(auto, nil); got != greedy {
		t.Errorf("no temperature, the model's default 0: %q, greedy %q", got, greedy)
	}
	none := startServe(t, func(c *serveConfig) { c.Model = dir; c.GenerationConfig = "none" })
	if got := ask(none, nil); got == greedy {
		t.Errorf("--generation-config none, the API's temperature 1: %q, the same as greedy", got)
	}
	bad := testServeConfig()
	bad.GenerationConfig = "sometimes"
	if err := bad.validate(); err == nil || !strings.Contains(err.Error(), "generation-config") {
		t.Errorf("--generation-config sometimes: %v", err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
