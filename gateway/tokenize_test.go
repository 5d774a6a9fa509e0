package gateway

import (
	"encoding/json"
	"slices"
	"testing"
)

// TestTokenize: a prompt's tokens are those a completion counts, a
// conversation's (with tools and without the generation prompt) those a
// chat completion counts; detokenize gives the text back; bad requests
// get 400s that name the parameter.
func TestTokenize(t *testing.T) {
	cfg := testConfig()
	cfg.Models[0].ContextLength = 1024
	env := newEnv(t, cfg, nil)
	tokenize := func(body string) tokenizeResponse {
		t.Helper()
		code, _, out := post(t, env, "/tokenize", body, nil)
		var r tokenizeResponse
		if err := json.Unmarshal(out, &r); code != 200 || err != nil {
			t.Fatalf("tokenize %s: %d %s", body, code, out)
		}
		if r.Count != len(r.Tokens) || r.MaxModelLen != 1024 || r.TokenStrs != nil {
			t.Fatalf("tokenize %s: %+v", body, r)
		}
		return r
	}
	usage := func(path, body string) int {
		t.Helper()
		code, _, out := post(t, env, path, body, nil)
		var r struct{ Usage usage }
		if err := json.Unmarshal(out, &r); code != 200 || err != nil {
			t.Fatalf("%s %s: %d %s", path, body, code, out)
		}
		return r.Usage.PromptTokens
	}

	p := tokenize(`{"model":"` + testModel + `","prompt":"héllo, world"}`)
	if want := []int32{'h', 0xc3, 0xa9, 'l', 'l', 'o', ',', ' ', 'w', 'o', 'r', 'l', 'd'}; !slices.Equal(p.Tokens, want) {
		t.Errorf("prompt tokens %v, want %v", p.Tokens, want)
	}
	if n := usage("/v1/completions", `{"model":"`+testModel+`","prompt":"héllo, world","max_tokens":1}`); n != p.Count {
		t.Errorf("prompt: %d tokens, a completion counts %d", p.Count, n)
	}

	conv := `"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}],` +
		`"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]`
	c := tokenize(`{"model":"` + testModel + `",` + conv + `}`)
	if n := usage("/v1/chat/completions", `{"model":"`+testModel+`",`+conv+`,"max_tokens":1}`); n != c.Count {
		t.Errorf("conversation: %d tokens, a chat completion counts %d", c.Count, n)
	}
	noGen := tokenize(`{"model":"` + testModel + `",` + conv + `,"add_generation_prompt":false}`)
	if want := "tools: get_weather\nsystem: Be brief.\nuser: hi\n"; string(toBytes(noGen.Tokens)) != want {
		t.Errorf("without the generation prompt: %q, want %q", toBytes(noGen.Tokens), want)
	}

	code, _, out := post(t, env, "/detokenize", `{"model":"`+testModel+`","tokens":[104,195,169,108,108,111]}`, nil)
	var d struct{ Prompt string }
	if err := json.Unmarshal(out, &d); code != 200 || err != nil || d.Prompt != "héllo" {
		t.Errorf("detokenize: %d %s", code, out)
	}

	for _, bad := range []struct{ path, body, param string }{
		{"/tokenize", `{"prompt":"x"}`, "model"},
		{"/tokenize", `{"model":"nope","prompt":"x"}`, "model"},
		{"/tokenize", `{"model":"` + testModel + `"}`, "prompt"},
		{"/tokenize", `{"model":"` + testModel + `","prompt":"x","messages":[]}`, "prompt"},
		{"/tokenize", `{"model":"` + testModel + `","messages":[{"role":"wizard","content":"x"}]}`, "messages"},
		{"/tokenize", `{"model":"` + testModel + `","messages":[],"tools":[{"type":"function"}]}`, "tools"},
		{"/tokenize", `{"model":"` + testModel + `","messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"tools":1}}`, "chat_template_kwargs"},
		{"/tokenize", `{"model":"` + testModel + `","prompt":3}`, "prompt"},
		{"/detokenize", `{"model":"` + testModel + `","tokens":[1,256]}`, "tokens"},
		{"/detokenize", `{"model":"` + testModel + `","tokens":[-1]}`, "tokens"},
		{"/detokenize", `{"tokens":[1]}`, "model"},
	} {
		code, _, out := post(t, env, bad.path, bad.body, nil)
		var e struct{ Error apiError }
		if err := json.Unmarshal(out, &e); code != 400 || err != nil || e.Error.Param != bad.param || e.Error.Message == "" {
			t.Errorf("%s %s: %d %s, want a 400 naming %s", bad.path, bad.body, code, out, bad.param)
		}
	}
}

func toBytes(ids []int32) []byte {
	b := make([]byte, len(ids))
	for i, id := range ids {
		b[i] = byte(id)
	}
	return b
}

// FuzzTokenizeRequest: any body gets tokens within the vocabulary or a
// 400 with a message, never a panic.
func FuzzTokenizeRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"echo-1","prompt":"hello"}`,
		`{"model":"echo-1","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false}`,
		`{"model":"echo-1","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"chat_template_kwargs":{"a":[1]}}`,
		`{"model":"echo-1","prompt":"","messages":null}`, `[`, `null`,
	} {
		f.Add([]byte(s))
	}
	v := fuzzValidator()
	f.Fuzz(func(t *testing.T, data []byte) {
		var r tokenizeRequest
		if aerr := decodeJSON(data, &r); aerr != nil {
			if aerr.Status != 400 || aerr.Message == "" {
				t.Fatalf("decode error %+v", aerr)
			}
			return
		}
		ids, _, aerr := v.tokenize(&r)
		if aerr != nil {
			if aerr.Status != 400 || aerr.Message == "" {
				t.Fatalf("validation error %+v", aerr)
			}
			return
		}
		for _, id := range ids {
			if id < 0 || id > 255 {
				t.Fatalf("token %d from %q", id, data)
			}
		}
	})
}
