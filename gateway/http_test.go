package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// post sends a JSON body and returns the status, headers and decoded body.
func post(t *testing.T, env *testEnv, path, body string, hdr map[string]string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, env.ts.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := env.client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp.StatusCode, resp.Header, b
}

func get(t *testing.T, env *testEnv, path string, hdr map[string]string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, env.ts.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := env.client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func decodeError(t *testing.T, b []byte) errorDetail {
	t.Helper()
	var body struct {
		Error *errorDetail `json:"error"`
	}
	if err := json.Unmarshal(b, &body); err != nil || body.Error == nil {
		t.Fatalf("body %s is not an OpenAI error: %v", b, err)
	}
	return *body.Error
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func TestBadRequests(t *testing.T) {
	cfg := testConfig()
	cfg.MaxBodyBytes = 2048
	env := newEnv(t, cfg, nil)
	tests := []struct {
		name, path, body string
		status           int
		param, code      string
		inMessage        []string
	}{
		{"syntax error", "/v1/completions", "{\"model\": \"echo-1\",\n \"prompt\": [}", 400, "", "invalid_json", []string{"line 2, column 13"}},
		{"empty body", "/v1/completions", "", 400, "", "invalid_json", []string{"empty"}},
		{"not an object", "/v1/completions", "[1,2]", 400, "", "invalid_json", []string{"want an object"}},
		{"wrong type", "/v1/completions", `{"model":"echo-1","prompt":"x","max_tokens":"5"}`, 400, "max_tokens", "invalid_value", []string{"got JSON string", "integer"}},
		{"prompt of objects", "/v1/completions", `{"model":"echo-1","prompt":[{}]}`, 400, "prompt", "invalid_value", []string{"array of token ids"}},
		{"prompt mixed", "/v1/completions", `{"model":"echo-1","prompt":["a", 1]}`, 400, "prompt", "invalid_value", []string{"mixes"}},
		{"token id out of vocab", "/v1/completions", `{"model":"echo-1","prompt":[1, 300]}`, 400, "prompt", "invalid_value", []string{"300", "[0, 256)"}},
		{"token id negative", "/v1/completions", `{"model":"echo-1","prompt":[[-1]]}`, 400, "prompt", "invalid_value", []string{"-1"}},
		{"empty prompt", "/v1/completions", `{"model":"echo-1","prompt":""}`, 400, "prompt", "invalid_value", []string{"empty"}},
		{"missing prompt", "/v1/completions", `{"model":"echo-1"}`, 400, "prompt", "invalid_value", []string{"required"}},
		{"missing model", "/v1/completions", `{"prompt":"x"}`, 400, "model", "missing_model", []string{"required"}},
		{"prompt alone too long", "/v1/completions", `{"model":"echo-1","prompt":"` + strings.Repeat("a", 256) + `"}`, 400, "prompt", "context_length_exceeded", []string{"256"}},
		{"n zero", "/v1/completions", `{"model":"echo-1","prompt":"x","n":0}`, 400, "n", "invalid_value", nil},
		{"top_p zero", "/v1/completions", `{"model":"echo-1","prompt":"x","top_p":0}`, 400, "top_p", "invalid_value", nil},
		{"negative temperature", "/v1/completions", `{"model":"echo-1","prompt":"x","temperature":-0.1}`, 400, "temperature", "invalid_value", nil},
		{"empty stop", "/v1/completions", `{"model":"echo-1","prompt":"x","stop":["a",""]}`, 400, "stop", "invalid_value", []string{"empty"}},
		{"stop wrong type", "/v1/completions", `{"model":"echo-1","prompt":"x","stop":5}`, 400, "stop", "invalid_value", nil},
		{"logprobs too many", "/v1/completions", `{"model":"echo-1","prompt":"x","logprobs":6}`, 400, "logprobs", "invalid_value", []string{"0 to 5"}},
		{"stream_options without stream", "/v1/completions", `{"model":"echo-1","prompt":"x","stream_options":{"include_usage":true}}`, 400, "stream_options", "invalid_value", nil},
		{"frequency penalty", "/v1/completions", `{"model":"echo-1","prompt":"x","frequency_penalty":2.5}`, 400, "frequency_penalty", "invalid_value", []string{"-2 to 2"}},
		{"logit bias key", "/v1/completions", `{"model":"echo-1","prompt":"x","logit_bias":{"a5":1}}`, 400, "logit_bias", "invalid_value", []string{"not a token id"}},
		{"logit bias beyond the vocabulary", "/v1/completions", `{"model":"echo-1","prompt":"x","logit_bias":{"256":1}}`, 400, "logit_bias", "invalid_value", []string{"0 to 255"}},
		{"logit bias value", "/v1/completions", `{"model":"echo-1","prompt":"x","logit_bias":{"5":101}}`, 400, "logit_bias", "invalid_value", []string{"-100 to 100"}},
		{"logit bias of a string", "/v1/completions", `{"model":"echo-1","prompt":"x","logit_bias":{"5":"1"}}`, 400, "logit_bias", "invalid_value", []string{"-100 to 100"}},
		{"max_completion_tokens over context", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":1000}`, 400, "max_completion_tokens", "context_length_exceeded", []string{"256", "1000"}},
		{"no messages", "/v1/chat/completions", `{"model":"echo-1","messages":[]}`, 400, "messages", "invalid_value", nil},
		{"bad role", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"wizard","content":"x"}]}`, 400, "messages", "invalid_value", []string{"wizard"}},
		{"tool role without its call's id", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"tool","content":"x"}]}`, 400, "messages", "invalid_value", []string{"tool_call_id"}},
		{"function role", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"function","name":"f","content":"x"}]}`, 400, "messages", "unsupported_parameter", []string{"role \"tool\""}},
		{"a user's tool calls", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"x","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`, 400, "messages", "invalid_value", []string{"only an assistant"}},
		{"a tool call without an id", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"}}]}]}`, 400, "messages", "invalid_value", []string{"needs an id"}},
		{"image part", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "messages", "invalid_value", []string{"image_url"}},
		{"a tool without its function", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]}`, 400, "tools", "invalid_value", []string{"no function"}},
		{"a tool of another type", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"x"}],"tools":[{"type":"file_search"}]}`, 400, "tools", "unsupported_parameter", []string{"file_search"}},
		{"a function's bad name", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"get weather"}}]}`, 400, "tools", "invalid_value", []string{"get weather"}},
		{"a function named twice", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]}`, 400, "tools", "invalid_value", []string{"twice"}},
		{"parameters not an object", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":[1]}}]}`, 400, "tools", "invalid_value", []string{"JSON schema object"}},
		{"tools not a list", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"x"}],"tools":{"type":"function"}}`, 400, "tools", "invalid_value", nil},
		{"tool_choice unknown", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"always"}`, 400, "tool_choice", "invalid_value", []string{"always"}},
		{"tool_choice names another function", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}}`, 400, "tool_choice", "invalid_value", []string{"\"g\""}},
		{"tool_choice without tools", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"x"}],"tool_choice":"required"}`, 400, "tool_choice", "invalid_value", []string{"needs tools"}},
		{"parallel_tool_calls without tools", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"x"}],"parallel_tool_calls":false}`, 400, "parallel_tool_calls", "invalid_value", nil},
		{"response_format beside a forced call", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required","response_format":{"type":"json_object"}}`, 400, "response_format", "invalid_value", nil},
		{"a template variable the server sets", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"messages":[]}}`, 400, "chat_template_kwargs", "invalid_value", []string{"messages"}},
		{"a template variable's bad name", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"a-b":1}}`, 400, "chat_template_kwargs", "invalid_value", []string{"a-b"}},
		{"functions", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"x"}],"functions":[{"name":"f"}]}`, 400, "functions", "unsupported_parameter", []string{"use tools"}},
		{"top_logprobs without logprobs", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"x"}],"top_logprobs":3}`, 400, "top_logprobs", "invalid_value", nil},
		{"top_logprobs too many", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21}`, 400, "top_logprobs", "invalid_value", nil},
		{"json_schema without a schema", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema"}}`, 400, "response_format", "invalid_value", []string{"json_schema.schema"}},
		{"json_schema of a string", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":"s"}}}`, 400, "response_format", "invalid_value", nil},
		{"xml format", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"x"}],"response_format":{"type":"xml"}}`, 400, "response_format", "unsupported_parameter", []string{"json_schema"}},
		{"template error", "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"fail-template"}]}`, 400, "messages", "invalid_value", []string{"template refused"}},
		{"too large", "/v1/completions", `{"model":"echo-1","prompt":"` + strings.Repeat("a", 4096) + `"}`, 413, "", "request_too_large", []string{"2048"}},
		{"unknown route", "/v1/embeddings", `{}`, 404, "", "unknown_url", []string{"/v1/embeddings"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, _, body := post(t, env, tc.path, tc.body, nil)
			if status != tc.status {
				t.Fatalf("status = %d, want %d; body %s", status, tc.status, body)
			}
			e := decodeError(t, body)
			if deref(e.Param) != tc.param || deref(e.Code) != tc.code {
				t.Errorf("param %q code %q, want %q %q (message %q)", deref(e.Param), deref(e.Code), tc.param, tc.code, e.Message)
			}
			for _, s := range tc.inMessage {
				if !strings.Contains(e.Message, s) {
					t.Errorf("message %q does not mention %q", e.Message, s)
				}
			}
		})
	}
	if n := len(env.backend.requests()); n != 0 {
		t.Errorf("backend saw %d requests, want none", n)
	}
}

// TestPenaltiesReachTheBackend: presence and frequency penalties and a
// logit bias arrive in the backend's request as given.
func TestPenaltiesReachTheBackend(t *testing.T) {
	env := newEnv(t, testConfig(), nil)
	status, _, body := post(t, env, "/v1/completions", `{"model":"echo-1","prompt":"ab","presence_penalty":0.5,"frequency_penalty":-1,"logit_bias":{"5":-100,"7":2.5}}`, nil)
	if status != 200 {
		t.Fatalf("status = %d, want 200; body %s", status, body)
	}
	reqs := env.backend.requests()
	if len(reqs) != 1 {
		t.Fatalf("backend saw %d requests, want 1", len(reqs))
	}
	r := reqs[0]
	if r.PresencePenalty != 0.5 || r.FrequencyPenalty != -1 || len(r.LogitBias) != 2 || r.LogitBias[5] != -100 || r.LogitBias[7] != 2.5 {
		t.Errorf("backend got presence %v, frequency %v, bias %v", r.PresencePenalty, r.FrequencyPenalty, r.LogitBias)
	}
}

// TestResponseFormatReachesTheBackend: JSON mode is asked of the backend
// for {"type": "json_object"}, with the schema compacted for
// {"type": "json_schema"}, and not for text or no format.
func TestResponseFormatReachesTheBackend(t *testing.T) {
	env := newEnv(t, testConfig(), nil)
	for _, c := range []struct {
		format string
		json   bool
		schema string
	}{
		{`{"type":"json_object"}`, true, ""},
		{`{"type":"text"}`, false, ""},
		{`null`, false, ""},
		{`{"type":"json_schema","json_schema":{"name":"p","strict":true,"schema":{ "type": "object",
			"properties": {"a": {"type": "string"}}, "required": ["a"]}}}`, true, `{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}`},
	} {
		status, _, body := post(t, env, "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"x"}],"response_format":`+c.format+`}`, nil)
		if status != 200 {
			t.Fatalf("%s: status = %d, want 200; body %s", c.format, status, body)
		}
		reqs := env.backend.requests()
		if r := reqs[len(reqs)-1]; r.JSON != c.json || r.Schema != c.schema {
			t.Errorf("%s: backend got JSON %v and schema %s, want %v and %s", c.format, r.JSON, r.Schema, c.json, c.schema)
		}
	}
}

func TestUnknownFieldsTolerated(t *testing.T) {
	env := newEnv(t, testConfig(), nil)
	status, _, body := post(t, env, "/v1/completions", `{"model":"echo-1","prompt":"ab","frobnicate":{"x":1},"presence_penalty":0,"tool_choice":"none","best_of":1}`, nil)
	if status != 200 {
		t.Fatalf("status = %d, want 200; body %s", status, body)
	}
	var resp completionResponse
	if err := json.Unmarshal(body, &resp); err != nil || resp.Choices[0].Text != "ab" {
		t.Errorf("response %s: %v", body, err)
	}
}

func TestChatWithoutTemplate(t *testing.T) {
	srv, err := New(testConfig(), &echoBackend{}, byteTokenizer{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	rec := newRecorder()
	req, _ := http.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"echo-1","messages":[{"role":"user","content":"x"}]}`))
	srv.Handler().ServeHTTP(rec, req)
	if rec.status != 400 || !strings.Contains(rec.body.String(), "chat_unsupported") {
		t.Errorf("got %d %s, want 400 chat_unsupported", rec.status, rec.body.String())
	}
}

// recorder is a minimal ResponseWriter for handler-only tests.
type recorder struct {
	hdr    http.Header
	status int
	body   strings.Builder
}

func newRecorder() *recorder                    { return &recorder{hdr: http.Header{}} }
func (r *recorder) Header() http.Header         { return r.hdr }
func (r *recorder) WriteHeader(c int)           { r.status = c }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }

func TestAuth(t *testing.T) {
	cfg := testConfig()
	cfg.APIKeys = []string{"sk-one", "sk-two"}
	env := newEnv(t, cfg, nil)
	body := `{"model":"echo-1","prompt":"ab"}`
	for _, tc := range []struct {
		name   string
		path   string
		hdr    map[string]string
		status int
	}{
		{"no key", "/v1/completions", nil, 401},
		{"wrong key", "/v1/completions", map[string]string{"Authorization": "Bearer sk-three"}, 401},
		{"basic scheme", "/v1/completions", map[string]string{"Authorization": "Basic c2stb25l"}, 401},
		{"good key", "/v1/completions", map[string]string{"Authorization": "Bearer sk-two"}, 200},
		{"query key", "/v1/completions?api_key=sk-one", nil, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, hdr, b := post(t, env, tc.path, body, tc.hdr)
			if status != tc.status {
				t.Fatalf("status %d, want %d; %s", status, tc.status, b)
			}
			if status == 401 && (hdr.Get("WWW-Authenticate") == "" || deref(decodeError(t, b).Code) != "invalid_api_key") {
				t.Errorf("401 without WWW-Authenticate or code: %v %s", hdr, b)
			}
		})
	}
	for path, want := range map[string]int{"/health": 200, "/ready": 200, "/metrics": 401, "/v1/models": 401, "/": 401} {
		if status, _ := get(t, env, path, nil); status != want {
			t.Errorf("GET %s without key = %d, want %d", path, status, want)
		}
	}
	if status, _ := get(t, env, "/v1/models", map[string]string{"Authorization": "Bearer sk-one"}); status != 200 {
		t.Errorf("GET /v1/models with key = %d, want 200", status)
	}
	// Websocket upgrade: refused without a key, accepted with ?api_key=.
	wsURL := "ws" + strings.TrimPrefix(env.ts.URL, "http") + "/v1/stream"
	_, resp, err := websocket.Dial(t.Context(), wsURL, &websocket.DialOptions{HTTPClient: env.client})
	if err == nil || resp == nil || resp.StatusCode != 401 {
		t.Errorf("dial without key: %v, %v; want 401", err, resp)
	}
	conn, _, err := websocket.Dial(t.Context(), wsURL+"?api_key=sk-one", &websocket.DialOptions{HTTPClient: env.client})
	if err != nil {
		t.Fatalf("dial with key: %v", err)
	}
	conn.CloseNow()
	reqs := env.backend.requests()
	if len(reqs) != 2 || reqs[0].Tenant == "" || reqs[0].Tenant == reqs[1].Tenant || strings.Contains(reqs[0].Tenant, "sk-") {
		t.Errorf("tenants = %q, %q; want distinct, non-secret ids per key", reqs[0].Tenant, reqs[1].Tenant)
	}
}

func TestReadyAndHealth(t *testing.T) {
	b := &echoBackend{}
	b.notReady.Store(true)
	env := newEnv(t, testConfig(), b)
	status, body := get(t, env, "/ready", nil)
	if status != 503 || !strings.Contains(string(body), "loading weights") {
		t.Errorf("ready while loading = %d %s, want 503 with the reason", status, body)
	}
	if status, _ := get(t, env, "/health", nil); status != 200 {
		t.Errorf("health = %d, want 200", status)
	}
	b.notReady.Store(false)
	if status, _ := get(t, env, "/ready", nil); status != 200 {
		t.Errorf("ready = %d, want 200", status)
	}
}

// streamReq starts a streaming completion and returns the response once headers arrive.
func streamReq(ctx context.Context, env *testEnv, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, env.ts.URL+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	return env.client.Do(req)
}

func TestQueueFullAnswers429(t *testing.T) {
	cfg := testConfig()
	cfg.MaxInFlight = 2
	cfg.RetryAfter = 2 * time.Second
	b := &echoBackend{gate: make(chan struct{}), started: make(chan string, 8)}
	env := newEnv(t, cfg, b)
	var wg sync.WaitGroup
	texts := make([]string, 2)
	for i := range 2 {
		wg.Go(func() {
			status, _, body := post(t, env, "/v1/completions", `{"model":"echo-1","prompt":"abc"}`, nil)
			if status == 200 {
				var r completionResponse
				_ = json.Unmarshal(body, &r)
				texts[i] = r.Choices[0].Text
			}
		})
	}
	<-b.started
	<-b.started
	status, hdr, body := post(t, env, "/v1/completions", `{"model":"echo-1","prompt":"abc"}`, nil)
	if status != 429 || hdr.Get("Retry-After") != "2" || deref(decodeError(t, body).Code) != "queue_full" {
		t.Errorf("third request = %d Retry-After %q %s, want 429 with Retry-After 2", status, hdr.Get("Retry-After"), body)
	}
	if status, body := get(t, env, "/ready", nil); status != 503 || !strings.Contains(string(body), "in-flight limit") {
		t.Errorf("ready while full = %d %s, want 503", status, body)
	}
	// n=2 needs two slots at once: also refused while full.
	if status, _, _ := post(t, env, "/v1/completions", `{"model":"echo-1","prompt":"abc","n":2}`, nil); status != 429 {
		t.Errorf("n=2 while full = %d, want 429", status)
	}
	close(b.gate)
	wg.Wait()
	for i, s := range texts {
		if s != "abc" {
			t.Errorf("admitted request %d got %q, want abc", i, s)
		}
	}
	if status, _, _ := post(t, env, "/v1/completions", `{"model":"echo-1","prompt":"abc"}`, nil); status != 200 {
		t.Errorf("after the queue drained: %d, want 200", status)
	}
	if status, _, body := post(t, env, "/v1/completions", `{"model":"echo-1","prompt":"abc","n":3}`, nil); status != 400 {
		t.Errorf("n=3 over the in-flight limit 2 = %d %s, want 400 (it could never run)", status, body)
	}
}

// TestKeyLimit: with MaxInFlightPerKey, a key at its bound gets 429
// (key_limit, with Retry-After) while another key's requests are admitted
// beside its own; a key within its bound still meets the gateway's
// (queue_full); a key gets its slots back as its requests end.
func TestKeyLimit(t *testing.T) {
	cfg := testConfig()
	cfg.APIKeys = []string{"alpha", "beta"}
	cfg.MaxInFlight, cfg.MaxInFlightPerKey = 3, 2
	cfg.RetryAfter = 2 * time.Second
	b := &echoBackend{gate: make(chan struct{}), started: make(chan string, 8)}
	env := newEnv(t, cfg, b)
	as := func(key string) map[string]string { return map[string]string{"Authorization": "Bearer " + key} }
	var wg sync.WaitGroup
	var statuses [3]int
	for i, key := range []string{"alpha", "alpha", "beta"} {
		wg.Go(func() {
			statuses[i], _, _ = post(t, env, "/v1/completions", `{"model":"echo-1","prompt":"abc"}`, as(key))
		})
	}
	for range 3 {
		<-b.started
	}
	status, hdr, body := post(t, env, "/v1/completions", `{"model":"echo-1","prompt":"abc"}`, as("alpha"))
	if status != 429 || hdr.Get("Retry-After") != "2" || deref(decodeError(t, body).Code) != "key_limit" || !strings.Contains(string(body), "at most 2") {
		t.Errorf("alpha's third request = %d Retry-After %q %s, want 429 key_limit", status, hdr.Get("Retry-After"), body)
	}
	if status, _, body := post(t, env, "/v1/completions", `{"model":"echo-1","prompt":"abc"}`, as("beta")); status != 429 || deref(decodeError(t, body).Code) != "queue_full" {
		t.Errorf("beta's second request with the gateway full = %d %s, want 429 queue_full", status, body)
	}
	// A websocket stream counts against its key as a request does.
	conn, _, err := websocket.Dial(t.Context(), "ws"+strings.TrimPrefix(env.ts.URL, "http")+"/v1/stream?api_key=alpha", &websocket.DialOptions{HTTPClient: env.client})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	sendWS(t, conn, `{"type":"generate","id":"w","model":"echo-1","prompt":"ab"}`)
	if f := readWS(t, conn); f.Code != "key_limit" || f.RetryAfterMs != 2000 {
		t.Errorf("alpha's websocket stream at its bound: %+v, want key_limit with retry_after_ms 2000", f)
	}
	close(b.gate)
	wg.Wait()
	if statuses != [3]int{200, 200, 200} {
		t.Errorf("admitted requests ended %v, want 200", statuses)
	}
	if status, _, _ := post(t, env, "/v1/completions", `{"model":"echo-1","prompt":"abc","n":2}`, as("alpha")); status != 200 {
		t.Errorf("alpha's n=2 after its requests ended = %d, want 200", status)
	}
	if env.srv.lim.inUse() != 0 || len(env.srv.lim.byTenant) != 0 {
		t.Errorf("slots left held: %d, %v", env.srv.lim.inUse(), env.srv.lim.byTenant)
	}
	if _, body := get(t, env, "/metrics", as("beta")); !strings.Contains(string(body), "troupe_gateway_key_limited_total 2\n") ||
		!strings.Contains(string(body), "troupe_gateway_in_flight_per_key_limit 2\n") {
		t.Errorf("metrics lack the refusals at the key's bound:\n%s", body)
	}
	cfg.MaxInFlightPerKey = -1
	if cfg.Validate() == nil {
		t.Error("a negative per-key bound was taken")
	}
}

func TestClientDisconnectCancelsGeneration(t *testing.T) {
	for _, stream := range []bool{true, false} {
		name := map[bool]string{true: "stream", false: "plain"}[stream]
		t.Run(name, func(t *testing.T) {
			b := &echoBackend{delay: 20 * time.Millisecond, started: make(chan string, 1)}
			env := newEnv(t, testConfig(), b)
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() {
				resp, err := streamReq(ctx, env, `{"model":"echo-1","prompt":"abcdefgh","max_tokens":200,"ignore_eos":true,"stream":`+map[bool]string{true: "true", false: "false"}[stream]+`}`)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				done <- err
			}()
			id := <-b.started
			time.Sleep(50 * time.Millisecond) // let a few tokens flow
			cancel()
			if err := <-done; err == nil {
				t.Error("client finished without error after cancelling")
			}
			waitFor(t, "the backend to see its context cancelled", func() bool {
				return b.sawCancel(id)
			})
		})
	}
}

func TestStreamingMidwayErrorAndDone(t *testing.T) {
	b := &echoBackend{}
	b.failAfter.Store(3)
	env := newEnv(t, testConfig(), b)
	resp, err := streamReq(t.Context(), env, `{"model":"echo-1","prompt":"abcdef","stream":true}`)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			events = append(events, line)
		} else if sc.Text() != "" {
			t.Errorf("unexpected SSE line %q", sc.Text())
		}
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Errorf("status %d content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if len(events) != 5 || !strings.Contains(events[3], `"generation_failed"`) || events[4] != "[DONE]" {
		t.Errorf("events = %q, want 3 tokens, an error event, [DONE]", events)
	}
}

// TestStreamDoneFreesSlot: a streamed answer frees its in-flight slot
// before its [DONE], so at the limit a client that has read [DONE] may
// start another request at once, while the first response is still open.
func TestStreamDoneFreesSlot(t *testing.T) {
	cfg := testConfig()
	cfg.MaxInFlight = 1
	env := newEnv(t, cfg, &echoBackend{})
	for i := range 20 {
		resp, err := streamReq(t.Context(), env, `{"model":"echo-1","prompt":"abc","stream":true}`)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(resp.Body)
		done := false
		for !done && sc.Scan() {
			done = sc.Text() == "data: [DONE]"
		}
		if !done {
			t.Fatalf("request %d: the stream ended without [DONE]", i)
		}
		status, _, body := post(t, env, "/v1/completions", `{"model":"echo-1","prompt":"abc"}`, nil)
		resp.Body.Close()
		if status != 200 {
			t.Fatalf("request %d after [DONE]: %d %s, want 200", i, status, body)
		}
	}
}

func TestServeAndGracefulShutdown(t *testing.T) {
	b := &echoBackend{delay: 5 * time.Millisecond, started: make(chan string, 1)}
	srv, err := New(testConfig(), b, byteTokenizer{}, lineTemplate{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	result := make(chan string, 1)
	go func() {
		resp, err := client.Post("http://"+ln.Addr().String()+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"echo-1","prompt":"abcdefghij"}`))
		if err != nil {
			result <- err.Error()
			return
		}
		defer resp.Body.Close()
		var r completionResponse
		_ = json.NewDecoder(resp.Body).Decode(&r)
		if len(r.Choices) == 0 {
			result <- "no choices"
			return
		}
		result <- r.Choices[0].Text
	}()
	<-b.started
	cancel() // shutdown starts while the request runs; it must complete
	if got := <-result; got != "abcdefghij" {
		t.Errorf("in-flight request during shutdown got %q, want abcdefghij", got)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve returned %v, want nil after a graceful shutdown", err)
	}
	if _, err := client.Get("http://" + ln.Addr().String() + "/health"); err == nil {
		t.Error("server still answers after shutdown")
	}
	if err := srv.Serve(context.Background(), ln); err == nil {
		t.Error("Serve after Shutdown succeeded")
	}
}

func TestMetricsExposition(t *testing.T) {
	cfg := testConfig()
	cfg.Build = map[string]string{"version": `v1.2.3 "rc"`, "revision": "abc\\def"}
	env := newEnv(t, cfg, nil)
	for range 3 {
		if status, _, _ := post(t, env, "/v1/completions", `{"model":"echo-1","prompt":"abcd"}`, nil); status != 200 {
			t.Fatalf("completion failed: %d", status)
		}
	}
	post(t, env, "/v1/completions", `{"model":"nope","prompt":"abcd"}`, nil)
	status, body := get(t, env, "/metrics", nil)
	if status != 200 {
		t.Fatalf("metrics = %d", status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("exposition does not parse: %v\n%s", err, body)
	}
	counter := func(name string, labels map[string]string) float64 {
		f, ok := fams[name]
		if !ok {
			t.Fatalf("metric %s missing", name)
		}
	next:
		for _, m := range f.Metric {
			for _, lp := range m.Label {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
		t.Fatalf("metric %s%v missing", name, labels)
		return 0
	}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"troupe_gateway_requests_total", map[string]string{"route": "completions", "code": "200"}, 3},
		{"troupe_gateway_requests_total", map[string]string{"route": "completions", "code": "400"}, 1},
		{"troupe_gateway_completion_tokens_total", nil, 12},
		{"troupe_gateway_prompt_tokens_total", nil, 12},
		{"troupe_gateway_time_to_first_token_seconds", nil, 3},
		{"troupe_gateway_inter_token_latency_seconds", nil, 9},
		{"troupe_gateway_in_flight", nil, 0},
		{"troupe_backend_queue_depth", nil, 3},
		{"troupe_backend_running", nil, 2},
		{"troupe_backend_kv_usage_ratio", nil, 0.25},
		{"troupe_backend_mailbox_depth", map[string]string{"actor": `shard "0"`}, 4},
		{"troupe_backend_ready", nil, 1},
		{"troupe_build_info", map[string]string{"version": `v1.2.3 "rc"`, "revision": `abc\def`}, 1},
	}
	for _, c := range checks {
		if got := counter(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %g, want %g", c.name, c.labels, got, c.want)
		}
	}
	if fams["troupe_gateway_time_to_first_token_seconds"].GetType().String() != "HISTOGRAM" {
		t.Error("time to first token is not a histogram")
	}
	if n := len(fams["troupe_build_info"].GetMetric()[0].GetLabel()); n != 2 {
		t.Errorf("troupe_build_info has %d labels, want 2", n)
	}
	// Without a build, no build metric.
	_, body = get(t, newEnv(t, testConfig(), nil), "/metrics", nil)
	if strings.Contains(string(body), "troupe_build_info") {
		t.Error("troupe_build_info without a build")
	}
	bad := testConfig()
	bad.Build = map[string]string{"git-sha": "x"}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), `"git-sha"`) {
		t.Errorf("a build label that is no label name: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err == nil || !strings.Contains(err.Error(), "no models") {
		t.Errorf("default config without models: %v, want a 'no models' error", err)
	}
	cfg := testConfig()
	cfg.Models = append(cfg.Models, ModelInfo{ID: testModel, ContextLength: 0})
	cfg.MaxInFlight = 0
	cfg.TraceURLTemplate = "/traces"
	cfg.APIKeys = []string{""}
	err := cfg.Validate()
	for _, want := range []string{"listed twice", "context length 0", "max in-flight", "{trace_id}", "api key 0 is empty"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to mention %q", err, want)
		}
	}
	if _, err := New(cfg, &echoBackend{}, byteTokenizer{}, nil); err == nil {
		t.Error("New accepted an invalid config")
	}
	if _, err := New(testConfig(), nil, byteTokenizer{}, nil); err == nil {
		t.Error("New accepted a nil backend")
	}
	if err := testConfig().Validate(); err != nil {
		t.Errorf("valid config: %v", err)
	}
}
