package gateway

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// TestEcho: a completion with echo begins with its prompt, and with
// logprobs with the prompt's tokens, the first's log-probability null,
// whole and streamed; the backend is asked for the prompt's
// log-probabilities only where they are reported.
func TestEcho(t *testing.T) {
	b := &echoBackend{}
	env := newEnv(t, testConfig(), b)
	status, _, raw := post(t, env, "/v1/completions", `{"model":"echo-1","prompt":"ab","echo":true,"max_tokens":2}`, nil)
	if status != 200 {
		t.Fatalf("%d %s", status, raw)
	}
	var out struct {
		Choices []struct {
			Text     string `json:"text"`
			Logprobs *struct {
				Tokens        []string             `json:"tokens"`
				TokenLogprobs []*float32           `json:"token_logprobs"`
				TopLogprobs   []map[string]float32 `json:"top_logprobs"`
				TextOffset    []int                `json:"text_offset"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || out.Choices[0].Text != "abab" || out.Choices[0].Logprobs != nil {
		t.Fatalf("echo without logprobs: %s (%v)", raw, err)
	}
	if reqs := b.requests(); reqs[0].PromptLogprobs {
		t.Error("prompt log-probabilities asked without logprobs")
	}
	// Prompts of token ids, several at once, as evaluation harnesses send
	// them: each choice begins with its own.
	status, _, raw = post(t, env, "/v1/completions", `{"model":"echo-1","prompt":[[97,98],[99]],"echo":true,"max_tokens":1,"logprobs":1}`, nil)
	out.Choices = nil
	if err := json.Unmarshal(raw, &out); status != 200 || err != nil || len(out.Choices) != 2 || out.Choices[0].Text != "aba" || out.Choices[1].Text != "cc" ||
		len(out.Choices[1].Logprobs.Tokens) != 2 || out.Choices[1].Logprobs.TokenLogprobs[0] != nil {
		t.Fatalf("two prompts: %d %s", status, raw)
	}

	status, _, raw = post(t, env, "/v1/completions", `{"model":"echo-1","prompt":"abc","echo":true,"max_tokens":1,"logprobs":2}`, nil)
	if status != 200 {
		t.Fatalf("%d %s", status, raw)
	}
	out.Choices = nil
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	c := out.Choices[0]
	lp := c.Logprobs
	if c.Text != "abca" || lp == nil || !slices.Equal(lp.Tokens, []string{"a", "b", "c", "a"}) || !slices.Equal(lp.TextOffset, []int{0, 1, 2, 3}) {
		t.Fatalf("echo with logprobs: %s", raw)
	}
	var got []float32
	for k, v := range lp.TokenLogprobs {
		if k == 0 {
			if v != nil || lp.TopLogprobs[0] != nil {
				t.Errorf("the first prompt token's log-probability %v, top %v; want null", v, lp.TopLogprobs[0])
			}
			continue
		}
		got = append(got, *v)
	}
	if !slices.Equal(got, []float32{-1, -2, -0.5}) || lp.TopLogprobs[2]["c"] != -2 || lp.TopLogprobs[2]["z"] != -9 || len(lp.TopLogprobs[2]) != 2 {
		t.Errorf("log-probabilities %v, top %v", got, lp.TopLogprobs)
	}
	if reqs := b.requests(); !reqs[len(reqs)-1].PromptLogprobs {
		t.Error("prompt log-probabilities not asked")
	}

	// max_tokens 0: the prompt alone, no completion token counted.
	for _, stream := range []string{"false", "true"} {
		status, _, raw = post(t, env, "/v1/completions", `{"model":"echo-1","prompt":"abc","echo":true,"max_tokens":0,"logprobs":1,"stream":`+stream+`}`, nil)
		if status != 200 {
			t.Fatalf("%d %s", status, raw)
		}
		var text strings.Builder
		var tokens int
		// take reads a completion, whole or a chunk.
		take := func(data []byte) {
			var ch struct {
				Choices []struct {
					Text     string `json:"text"`
					Logprobs *struct {
						Tokens []string `json:"tokens"`
					} `json:"logprobs"`
				} `json:"choices"`
				Usage *usage `json:"usage"`
			}
			if err := json.Unmarshal(data, &ch); err != nil {
				t.Fatal(err)
			}
			for _, c := range ch.Choices {
				text.WriteString(c.Text)
				if c.Logprobs != nil {
					tokens += len(c.Logprobs.Tokens)
				}
			}
			if ch.Usage != nil && ch.Usage.CompletionTokens != 0 {
				t.Errorf("max_tokens 0: usage %+v", *ch.Usage)
			}
		}
		if stream == "true" {
			sseData(raw, take)
		} else {
			take(raw)
		}
		if text.String() != "abc" || tokens != 3 {
			t.Errorf("max_tokens 0, stream %s: %q, %d tokens", stream, text.String(), tokens)
		}
	}
	if status, _, raw := post(t, env, "/v1/completions", `{"model":"echo-1","prompt":"abc","max_tokens":0}`, nil); status != 400 {
		t.Errorf("max_tokens 0 without echo: %d %s", status, raw)
	}

	status, _, raw = post(t, env, "/v1/completions", `{"model":"echo-1","prompt":"abc","echo":true,"max_tokens":2,"logprobs":1,"stream":true}`, nil)
	if status != 200 {
		t.Fatalf("%d %s", status, raw)
	}
	var text strings.Builder
	var tokens []string
	var nulls int
	sseData(raw, func(data []byte) {
		var ch struct {
			Choices []struct {
				Text     string `json:"text"`
				Logprobs *struct {
					Tokens        []string   `json:"tokens"`
					TokenLogprobs []*float32 `json:"token_logprobs"`
				} `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(data, &ch); err != nil {
			t.Fatal(err)
		}
		for _, c := range ch.Choices {
			text.WriteString(c.Text)
			if c.Logprobs != nil {
				tokens = append(tokens, c.Logprobs.Tokens...)
				for _, v := range c.Logprobs.TokenLogprobs {
					if v == nil {
						nulls++
					}
				}
			}
		}
	})
	if text.String() != "abcab" || !slices.Equal(tokens, []string{"a", "b", "c", "a", "b"}) || nulls != 1 {
		t.Errorf("streamed %q, tokens %v, %d nulls", text.String(), tokens, nulls)
	}
}
