package gateway

import (
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
)

// TestModelDefaults: a request that leaves a sampler's parameter out takes
// the model's default (its generation_config.json's, as serve sets it);
// one that names it keeps its own; defaults a request could not name are
// refused when the gateway is made.
func TestModelDefaults(t *testing.T) {
	cfg := testConfig()
	temp, topP, topK := 0.6, 0.95, 20
	cfg.Models[0].Defaults = Sampling{Temperature: &temp, TopP: &topP, TopK: &topK}
	env := newEnv(t, cfg, nil)
	c := sdkClient(env, "k")
	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}
	if _, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: testModel, Messages: msgs}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: testModel, Messages: msgs, Temperature: openai.Float(0), TopP: openai.Float(0.5)}); err != nil {
		t.Fatal(err)
	}
	reqs := env.backend.requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests", len(reqs))
	}
	if r := reqs[0]; r.Temperature != 0.6 || r.TopP != 0.95 || r.TopK != 20 || r.MinP != 0 || r.RepetitionPenalty != 1 {
		t.Errorf("defaults taken as %+v", r)
	}
	if r := reqs[1]; r.Temperature != 0 || r.TopP != 0.5 || r.TopK != 20 {
		t.Errorf("a request's own values: %+v", r)
	}
	bad := -0.5
	cfg.Models[0].Defaults = Sampling{Temperature: &bad}
	if _, err := New(cfg, &echoBackend{}, byteTokenizer{}, lineTemplate{}); err == nil || !strings.Contains(err.Error(), "default temperature") {
		t.Errorf("a default out of range: %v", err)
	}
}
