package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"
	"github.com/troupe/troupe/gateway"
	"github.com/troupe/troupe/models/demo"
	"github.com/troupe/troupe/models/grammar"
	"github.com/troupe/troupe/models/sample"
	"github.com/troupe/troupe/models/tokenizer"
)

// server is a troupe serve running in the test process.
type server struct {
	url    string
	cancel context.CancelFunc
	done   chan error
}

// testServeConfig is the default configuration of node "test", with 8 of
// the demo model's full contexts of KV cache a replica rather than
// max-seqs' 64 (1.6 GB of f32): the tests need no more, and under -race
// each allocation that size stalled the whole process for seconds, long
// enough for a group's node to lose its key mid-scale.
func testServeConfig() serveConfig {
	cfg := defaultServeConfig()
	cfg.Node, cfg.KVBlocks = "test", 512
	return cfg
}

func startServe(t testing.TB, mutate func(*serveConfig)) *server {
	t.Helper()
	cfg := testServeConfig()
	cfg.MaxBatchTokens = 256
	if mutate != nil {
		mutate(&cfg)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &server{url: "http://" + ln.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	var log syncBuffer
	go func() { s.done <- serve(ctx, cfg, ln, &log) }()
	t.Cleanup(func() {
		cancel()
		if err := <-s.done; err != nil {
			t.Errorf("serve: %v", err)
		}
		if t.Failed() {
			t.Logf("the server's log:\n%s", log.String())
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(s.url + "/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("server not ready: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *server) client() openai.Client {
	return openai.NewClient(option.WithBaseURL(s.url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
}

type demoRef struct {
	Prompt    string  `json:"prompt"`
	GreedyIDs []int32 `json:"greedy_ids"`
	Text      string  `json:"text"`
}

func demoRefs(t testing.TB) []demoRef {
	raw, err := os.ReadFile(filepath.Join("..", "..", "models", "demo", demo.Name, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r struct{ Samples []demoRef }
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	return r.Samples
}

// bothSubmitPaths runs f with the gateway calling the schedulers of its
// process directly, then with it reaching them over the bus as it reaches
// those of other nodes: the expectations are the same.
func bothSubmitPaths(t *testing.T, f func(t *testing.T, overBus bool)) {
	t.Run("local", func(t *testing.T) { f(t, false) })
	t.Run("bus", func(t *testing.T) { f(t, true) })
}

// checkDemoCompletions asks c for the greedy completion of every demo prompt
// and checks the text and the usage against the reference.
func checkDemoCompletions(t *testing.T, c openai.Client) {
	t.Helper()
	for _, ref := range demoRefs(t) {
		resp, err := c.Completions.New(t.Context(), openai.CompletionNewParams{
			Model:       openai.CompletionNewParamsModel(demo.Name),
			Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String(ref.Prompt)},
			MaxTokens:   openai.Int(int64(len(ref.GreedyIDs))),
			Temperature: openai.Float(0),
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.Choices[0].Text; got != ref.Text {
			t.Errorf("prompt %q: got %q, want %q", ref.Prompt, got, ref.Text)
		}
		if resp.Usage.CompletionTokens != int64(len(ref.GreedyIDs)) {
			t.Errorf("prompt %q: usage %+v", ref.Prompt, resp.Usage)
		}
	}
}

// TestServeOpenAI drives the whole stack with the official Go client: the
// greedy completion of every demo prompt equals the reference text.
func TestServeOpenAI(t *testing.T) { bothSubmitPaths(t, testServeOpenAI) }

func testServeOpenAI(t *testing.T, overBus bool) {
	s := startServe(t, func(c *serveConfig) { c.Shards, c.submitOverBus = 2, overBus })
	c := s.client()
	checkDemoCompletions(t, c)
	ctx := context.Background()
	// A streamed chat completion with the final usage chunk.
	stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:         openai.ChatModel(demo.Name),
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("How do I list files?")},
		MaxTokens:     openai.Int(16),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	var text strings.Builder
	var usage int64
	for stream.Next() {
		ch := stream.Current()
		if len(ch.Choices) > 0 {
			text.WriteString(ch.Choices[0].Delta.Content)
		}
		if ch.Usage.CompletionTokens > 0 {
			usage = ch.Usage.CompletionTokens
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if text.Len() == 0 || usage == 0 || usage > 16 {
		t.Errorf("chat stream: text %q, usage %d", text.String(), usage)
	}
}

// TestServeJSONMode: with response_format json_object the demo model,
// which was not trained to write JSON, answers with a JSON object, greedy
// and sampled: one that closes (finish reason stop) or a prefix of one cut
// by max_tokens. A logit bias towards quotes and closing braces makes the
// sampled answers close their objects.
func TestServeJSONMode(t *testing.T) { bothSubmitPaths(t, testServeJSONMode) }

func testServeJSONMode(t *testing.T, overBus bool) {
	s := startServe(t, func(c *serveConfig) { c.submitOverBus = overBus })
	c := s.client()
	tok, err := tokenizer.Load(filepath.Join("..", "..", "models", "demo", demo.Name, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	closers := map[string]int64{}
	for _, c := range []string{`"`, `}`} {
		id, ok := tok.TokenID(c)
		if !ok {
			t.Fatalf("no token %s", c)
		}
		closers[strconv.Itoa(int(id))] = 6
	}
	for i, temp := range []float64{0, 0.8, 0.8, 1.2} {
		p := openai.ChatCompletionNewParams{
			Model:          openai.ChatModel(demo.Name),
			Messages:       []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Describe a file system as JSON.")},
			MaxTokens:      openai.Int(120),
			Temperature:    openai.Float(temp),
			Seed:           openai.Int(int64(i)),
			ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONObject: &shared.ResponseFormatJSONObjectParam{}},
		}
		if i > 0 {
			p.LogitBias = closers
		}
		resp, err := c.Chat.Completions.New(t.Context(), p)
		if err != nil {
			t.Fatal(err)
		}
		text, reason := resp.Choices[0].Message.Content, resp.Choices[0].FinishReason
		t.Logf("temperature %v: %q (%s)", temp, text, reason)
		if ok, done := jsonObjectPrefix(text); !ok || done != (reason == "stop") {
			t.Errorf("temperature %v: %q (%s): a JSON object's prefix %v, whole %v", temp, text, reason, ok, done)
		}
		if reason == "stop" {
			var v map[string]any
			if err := json.Unmarshal([]byte(text), &v); err != nil {
				t.Errorf("temperature %v: %q: %v", temp, text, err)
			}
		} else if i > 0 || reason != "length" || resp.Usage.CompletionTokens != 120 {
			t.Errorf("temperature %v: %q ended %q after %d tokens", temp, text, reason, resp.Usage.CompletionTokens)
		}
	}
}

// TestServeJSONSchema: with a json_schema response format the demo model
// answers with an object of the schema's properties, in the order the
// request lists them (the client sends a Go map's keys sorted), of their
// types and within their bounds; a schema troupe cannot follow is refused
// with a 400 naming what.
func TestServeJSONSchema(t *testing.T) {
	s := startServe(t, nil)
	c := s.client()
	tok, err := tokenizer.Load(filepath.Join("..", "..", "models", "demo", demo.Name, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	quote, ok := tok.TokenID(`"`)
	if !ok {
		t.Fatal(`no token "`)
	}
	schema := map[string]any{
		"type": "object",
		"properties": map[string]any{
			"name": map[string]any{"type": "string", "minLength": 2, "maxLength": 12},
			"kind": map[string]any{"enum": []any{"file", "directory", "link"}},
			"size": map[string]any{"type": []any{"integer", "null"}, "minimum": 1, "maximum": 4096},
			"rank": map[string]any{"type": "number", "exclusiveMinimum": 0, "maximum": 1},
			"tags": map[string]any{"type": "array", "items": map[string]any{"type": "string"}, "maxItems": 2},
			"code": map[string]any{"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"},
			"day":  map[string]any{"type": "string", "format": "date"},
			"lots": map[string]any{"type": "integer", "multipleOf": 4, "minimum": 0, "maximum": 100},
		},
		"required":             []any{"name", "kind", "size", "rank", "tags", "code", "day", "lots"},
		"additionalProperties": false,
	}
	format := func(schema any) openai.ChatCompletionNewParamsResponseFormatUnion {
		return openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
			JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "entry", Schema: schema, Strict: openai.Bool(true)}}}
	}
	for i, temp := range []float64{0, 0.8, 1.2} {
		resp, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
			Model:          openai.ChatModel(demo.Name),
			Messages:       []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Describe /etc/passwd.")},
			MaxTokens:      openai.Int(200),
			Temperature:    openai.Float(temp),
			Seed:           openai.Int(int64(i)),
			LogitBias:      map[string]int64{strconv.Itoa(int(quote)): 5},
			ResponseFormat: format(schema),
		})
		if err != nil {
			t.Fatal(err)
		}
		text, reason := resp.Choices[0].Message.Content, resp.Choices[0].FinishReason
		t.Logf("temperature %v: %q (%s)", temp, text, reason)
		if reason != "stop" {
			t.Errorf("temperature %v: finish reason %q after %q", temp, reason, text)
			continue
		}
		var got struct {
			Name string
			Kind string
			Size *int
			Rank float64
			Tags []string
			Code string
			Day  string
			Lots int
		}
		dec := json.NewDecoder(strings.NewReader(text))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&got); err != nil {
			t.Errorf("temperature %v: %q: %v", temp, text, err)
			continue
		}
		order := []int{strings.Index(text, `"kind"`), strings.Index(text, `"name"`), strings.Index(text, `"size"`), strings.Index(text, `"tags"`)}
		if n := utf8.RuneCountInString(got.Name); !slices.IsSorted(order) || order[0] < 0 || !slices.Contains([]string{"file", "directory", "link"}, got.Kind) ||
			len(got.Tags) > 2 || n < 2 || n > 12 || got.Size != nil && (*got.Size < 1 || *got.Size > 4096) || got.Rank <= 0 || got.Rank > 1 {
			t.Errorf("temperature %v: %q does not follow the schema", temp, text)
		}
		if _, err := time.Parse(time.DateOnly, got.Day); err != nil || !codeText.MatchString(got.Code) || got.Lots%4 != 0 || got.Lots < 0 || got.Lots > 100 {
			t.Errorf("temperature %v: code %q, day %q or lots %d does not follow the schema (%v)", temp, got.Code, got.Day, got.Lots, err)
		}
	}
	for _, c2 := range []struct {
		prop map[string]any
		want string
	}{
		{map[string]any{"type": "integer", "multipleOf": 7, "minimum": 1, "maximum": 6}, `no multiple of 7`},
		{map[string]any{"type": "string", "pattern": "^a(?=b)"}, `pattern "^a(?=b)"`},
		{map[string]any{"type": "string", "format": "idn-email"}, `format "idn-email" is not supported`},
	} {
		bad := map[string]any{"type": "object", "properties": map[string]any{"id": c2.prop}}
		_, err = c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
			Model:          openai.ChatModel(demo.Name),
			Messages:       []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")},
			ResponseFormat: format(bad),
		})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || !strings.Contains(apiErr.Message, c2.want) {
			t.Errorf("a schema with %v: %v, want a 400 with %q", c2.prop, err, c2.want)
		}
	}
}

var codeText = regexp.MustCompile(`^[A-Z]{3}-[0-9]{2,4}$`)

// jsonObjectPrefix reports whether text begins a JSON object as JSON mode
// writes it, and whether it is a whole one.
func jsonObjectPrefix(text string) (ok, whole bool) {
	vocab := make([][]byte, 256)
	for c := range vocab {
		vocab[c] = []byte{byte(c)}
	}
	v, err := grammar.NewVocab(vocab)
	if err != nil {
		panic(err)
	}
	q := v.JSON().Start()
	for i := range len(text) {
		if q.Accept(int32(text[i])) != nil {
			return false, false
		}
	}
	return true, q.Done()
}

// TestServeDisconnectFreesBlocks: a client that goes away mid-stream
// cancels its generation and its KV blocks return to the pool.
func TestServeDisconnectFreesBlocks(t *testing.T) { bothSubmitPaths(t, testServeDisconnectFreesBlocks) }

func testServeDisconnectFreesBlocks(t *testing.T, overBus bool) {
	s := startServe(t, func(c *serveConfig) { c.submitOverBus = overBus })
	c := s.client()
	ctx, cancel := context.WithCancel(context.Background())
	stream := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(demo.Name),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("The kernel")},
		MaxTokens: openai.Int(900),
	})
	if !stream.Next() {
		t.Fatalf("no first chunk: %v", stream.Err())
	}
	if kv := metric(t, s, "troupe_backend_kv_usage_ratio"); kv <= 0 {
		t.Errorf("kv usage %v while a request runs", kv)
	}
	cancel()
	stream.Close()
	deadline := time.Now().Add(30 * time.Second)
	for metric(t, s, "troupe_backend_kv_usage_ratio") != 0 || metric(t, s, "troupe_backend_running") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("blocks not freed after the client left")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestServeOverload: with one sequence at a time and a queue of one, a
// third concurrent request gets 429 with Retry-After; a request the
// model cannot take gets 400.
func TestServeOverload(t *testing.T) { bothSubmitPaths(t, testServeOverload) }

func testServeOverload(t *testing.T, overBus bool) {
	s := startServe(t, func(c *serveConfig) { c.MaxSeqs, c.MaxQueue, c.submitOverBus = 1, 1, overBus })
	body := `{"model":"` + demo.Name + `","prompt":"The kernel","max_tokens":600,"stream":true}`
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); wg.Wait() }()
	// Headers arrive with the first token, so each request runs in its own goroutine.
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, "POST", s.url+"/v1/completions", strings.NewReader(body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return // cancelled at the end of the test
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
		if i == 0 {
			// Wait until the first runs, so that the second waits in the queue.
			deadline := time.Now().Add(30 * time.Second)
			for metric(t, s, "troupe_backend_running") != 1 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for metric(t, s, "troupe_backend_queue_depth") != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	resp, err := http.Post(s.url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Errorf("third request: status %d, Retry-After %q; want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	long := `{"model":"` + demo.Name + `","prompt":"The kernel","max_tokens":100000}`
	resp, err = http.Post(s.url+"/v1/completions", "application/json", strings.NewReader(long))
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(msg), "context length") {
		t.Errorf("request over the context length: status %d, body %s; want 400 naming the context length", resp.StatusCode, msg)
	}
}

// metric reads one unlabelled value from /metrics.
func metric(t testing.TB, s *server, name string) float64 {
	t.Helper()
	resp, err := http.Get(s.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			var v float64
			fmt.Sscan(rest, &v)
			return v
		}
	}
	t.Fatalf("metric %s not exported:\n%s", name, raw)
	return 0
}

// TestServeMicroServices: every kind of actor of a serving node answers the
// micro service PING, INFO and STATS requests on the bus, naming the
// build's version.
func TestServeMicroServices(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	startServe(t, func(c *serveConfig) {
		c.Cluster.ClientListen, c.Cluster.User, c.Cluster.Password = addr, "ops", "secret"
	})
	nc, err := nats.Connect("nats://"+addr, nats.UserInfo("ops", "secret"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	version := buildVersion().semver()
	for _, kind := range []string{"gateway", "scheduler", "shard", "kvmgr", "spawner", "device"} {
		for _, verb := range []string{"PING", "INFO", "STATS"} {
			msg, err := nc.Request("$SRV."+verb+"."+kind, nil, 5*time.Second)
			if err != nil {
				t.Errorf("%s %s: %v", verb, kind, err)
				continue
			}
			if !strings.Contains(string(msg.Data), `"name":"`+kind+`"`) || !strings.Contains(string(msg.Data), `"version":"`+version+`"`) {
				t.Errorf("%s %s answered %s, want version %s", verb, kind, msg.Data, version)
			}
		}
	}
	if _, err := nats.Connect("nats://" + addr); err == nil {
		t.Error("a client without credentials connected")
	}
}

// TestServePenaltiesMatchGenerate: presence and frequency penalties and a
// logit bias sent through the OpenAI SDK give the text troupe generate
// gives with the same settings (the model's own loop, not the scheduler's),
// which differs from the plain greedy text and never holds the banned token.
func TestServePenaltiesMatchGenerate(t *testing.T) {
	s := startServe(t, nil)
	type gen struct {
		IDs  []int32 `json:"ids"`
		Text string  `json:"text"`
	}
	generate := func(args ...string) gen {
		t.Helper()
		out, _, err := runCLI(t, "", append([]string{"generate", "--prompt-ids", "473,623", "--max-tokens", "24", "--ignore-eos"}, args...)...)
		if err != nil {
			t.Fatalf("generate %v: %v", args, err)
		}
		var g gen
		if err := json.Unmarshal([]byte(out), &g); err != nil {
			t.Fatalf("generate %v: %q: %v", args, out, err)
		}
		return g
	}
	plain := generate()
	banned := plain.IDs[0]
	want := generate("--frequency-penalty", "1.5", "--presence-penalty", "0.5", "--logit-bias", fmt.Sprintf("%d:-100", banned))
	if slices.Equal(want.IDs, plain.IDs) {
		t.Fatalf("the penalties changed nothing: %v", want.IDs)
	}
	if slices.Contains(want.IDs, banned) {
		t.Errorf("the banned token %d came: %v", banned, want.IDs)
	}
	c := s.client()
	resp, err := c.Completions.New(context.Background(), openai.CompletionNewParams{
		Model:            openai.CompletionNewParamsModel(demo.Name),
		Prompt:           openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{473, 623}},
		MaxTokens:        openai.Int(24),
		Temperature:      openai.Float(0),
		FrequencyPenalty: openai.Float(1.5),
		PresencePenalty:  openai.Float(0.5),
		LogitBias:        map[string]int64{fmt.Sprint(banned): -100},
	}, option.WithJSONSet("ignore_eos", true))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Choices[0].Text; got != want.Text {
		t.Errorf("served %q, want %q (troupe generate, same settings; plain greedy %q)", got, want.Text, plain.Text)
	}
	// Out of range: refused, naming the parameter.
	_, err = c.Completions.New(context.Background(), openai.CompletionNewParams{
		Model:            openai.CompletionNewParamsModel(demo.Name),
		Prompt:           openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")},
		FrequencyPenalty: openai.Float(2.5),
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Param != "frequency_penalty" {
		t.Errorf("frequency_penalty 2.5: %v, want a 400 naming frequency_penalty", err)
	}
}

// TestLogitBiasLimitsAgree: the gateway, which imports nothing of the
// engine, refuses the same logit_bias sizes the engine does.
func TestLogitBiasLimitsAgree(t *testing.T) {
	if gateway.MaxLogitBias != sample.MaxLogitBias {
		t.Fatalf("gateway takes %d logit_bias tokens, the engine %d", gateway.MaxLogitBias, sample.MaxLogitBias)
	}
}

// TestServeKVCacheBF16: a server with a bf16 KV cache (--kv-cache bf16)
// still completes every demo prompt with the reference text.
func TestServeKVCacheBF16(t *testing.T) {
	s := startServe(t, func(c *serveConfig) { c.KVCache = "bf16" })
	checkDemoCompletions(t, s.client())
}

// TestServeToolCalls runs function calling through the official client
// against the demo model: with tool_choice "required" (two functions,
// one call, sampled and greedy) and a named function (streamed), the
// calls parse and follow their functions' parameters; a conversation that
// carries the calls and the tools' answers back is taken.
func TestServeToolCalls(t *testing.T) {
	s := startServe(t, nil)
	c := s.client()
	weather := openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
		Name:        "get_weather",
		Description: openai.String("The weather in a city now."),
		Parameters: shared.FunctionParameters{
			"type": "object",
			"properties": map[string]any{
				"city": map[string]any{"type": "string", "minLength": 1, "maxLength": 20},
				"unit": map[string]any{"enum": []any{"c", "f"}},
			},
			"required":             []any{"city", "unit"},
			"additionalProperties": false,
		},
	})
	clock := openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
		Name: "get_time",
		Parameters: shared.FunctionParameters{
			"type":                 "object",
			"properties":           map[string]any{"tz": map[string]any{"type": "string", "maxLength": 8}},
			"required":             []any{"tz"},
			"additionalProperties": false,
		},
	})
	tools := []openai.ChatCompletionToolUnionParam{weather, clock}
	// follows decodes a call's arguments by its function's parameters.
	follows := func(call openai.ChatCompletionMessageToolCallUnion) error {
		if !compactJSON(call.Function.Arguments) {
			return fmt.Errorf("arguments %q: more than a space between tokens", call.Function.Arguments)
		}
		dec := json.NewDecoder(strings.NewReader(call.Function.Arguments))
		dec.DisallowUnknownFields()
		switch call.Function.Name {
		case "get_weather":
			var a struct{ City, Unit *string }
			if err := dec.Decode(&a); err != nil {
				return err
			}
			if a.City == nil || a.Unit == nil || *a.Unit != "c" && *a.Unit != "f" || utf8.RuneCountInString(*a.City) < 1 {
				return fmt.Errorf("arguments %s", call.Function.Arguments)
			}
		case "get_time":
			var a struct{ Tz *string }
			if err := dec.Decode(&a); err != nil || a.Tz == nil {
				return fmt.Errorf("arguments %s: %v", call.Function.Arguments, err)
			}
		default:
			return fmt.Errorf("function %q", call.Function.Name)
		}
		if !strings.HasPrefix(call.ID, "call_") {
			return fmt.Errorf("id %q", call.ID)
		}
		return nil
	}
	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What is the weather in Oslo, and the time there?")}
	var last openai.ChatCompletionMessage
	for i, temp := range []float64{0, 0.9} {
		resp, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
			Model: openai.ChatModel(demo.Name), Messages: msgs, Tools: tools, MaxTokens: openai.Int(400),
			ToolChoice:  openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")},
			Temperature: openai.Float(temp), Seed: openai.Int(int64(i)),
			// One call: the demo model, left to call again, calls again
			// until its tokens run out.
			ParallelToolCalls: openai.Bool(false),
		})
		if err != nil {
			t.Fatal(err)
		}
		ch := resp.Choices[0]
		t.Logf("required, temperature %v: %d calls, %q", temp, len(ch.Message.ToolCalls), ch.Message.RawJSON())
		if ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) == 0 || ch.Message.Content != "" {
			t.Fatalf("temperature %v: finish %q, %d calls, content %q", temp, ch.FinishReason, len(ch.Message.ToolCalls), ch.Message.Content)
		}
		for _, call := range ch.Message.ToolCalls {
			if err := follows(call); err != nil {
				t.Errorf("temperature %v: %v", temp, err)
			}
		}
		last = ch.Message
	}

	stream := c.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
		Model: openai.ChatModel(demo.Name), Messages: msgs, Tools: tools, MaxTokens: openai.Int(400), Temperature: openai.Float(0.7),
		ToolChoice: openai.ToolChoiceOptionFunctionToolChoice(openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "get_time"}),
	})
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if ch := acc.Choices[0]; ch.FinishReason != "stop" || len(ch.Message.ToolCalls) != 1 || ch.Message.ToolCalls[0].Function.Name != "get_time" {
		t.Fatalf("named, streamed: finish %q, calls %+v", ch.FinishReason, ch.Message.ToolCalls)
	} else if err := follows(ch.Message.ToolCalls[0]); err != nil {
		t.Errorf("named, streamed: %v", err)
	}

	// The calls and their answers go back into the conversation.
	msgs = append(msgs, last.ToParam())
	for _, call := range last.ToolCalls {
		msgs = append(msgs, openai.ToolMessage(`{"ok": true}`, call.ID))
	}
	resp, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
		Model: openai.ChatModel(demo.Name), Messages: msgs, Tools: tools, MaxTokens: openai.Int(8), Temperature: openai.Float(0),
	})
	if err != nil {
		t.Fatal(err)
	}
	if ch := resp.Choices[0]; ch.FinishReason != "length" && ch.FinishReason != "stop" {
		t.Errorf("after the answers: finish %q", ch.FinishReason)
	}

	// A forced call's string of a format is written in it: a URI here.
	link := func(format string) openai.ChatCompletionToolUnionParam {
		return openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name: "open", Parameters: shared.FunctionParameters{"type": "object", "properties": map[string]any{"url": map[string]any{"type": "string", "format": format}},
				"required": []any{"url"}, "additionalProperties": false},
		})
	}
	resp, err = c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
		Model: openai.ChatModel(demo.Name), Messages: msgs[:1], Tools: []openai.ChatCompletionToolUnionParam{link("uri"), clock}, MaxTokens: openai.Int(200),
		ToolChoice: openai.ToolChoiceOptionFunctionToolChoice(openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "open"}),
	})
	if err != nil {
		t.Fatal(err)
	}
	// The demo model may not end its URI within the tokens: then the call
	// comes back as the text it was, cut.
	switch ch := resp.Choices[0]; {
	case len(ch.Message.ToolCalls) == 1:
		var a struct{ URL string }
		err := json.Unmarshal([]byte(ch.Message.ToolCalls[0].Function.Arguments), &a)
		u, perr := url.Parse(a.URL)
		if err != nil || perr != nil || u.Scheme == "" {
			t.Errorf("forced open: arguments %s (%v, %v), want a URI", ch.Message.ToolCalls[0].Function.Arguments, err, perr)
		}
	case ch.FinishReason != "length" || !strings.HasPrefix(strings.Join(strings.Fields(ch.Message.Content), ""), `{"url":"`):
		t.Errorf("forced open: finish %q, %s", ch.FinishReason, ch.Message.RawJSON())
	}
	// Parameters the grammar cannot follow are refused when a call is
	// forced, naming what.
	_, err = c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
		Model: openai.ChatModel(demo.Name), Messages: msgs[:1], Tools: []openai.ChatCompletionToolUnionParam{link("regex"), clock},
		ToolChoice: openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")},
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || !strings.Contains(apiErr.Message, `format "regex"`) {
		t.Errorf("parameters with a format of no grammar: %v, want a 400 that names it", err)
	}
}

// TestServeResponses runs the Responses API through the official client
// against the demo model: text whole and streamed (the events' text equal
// to the completed response's), a JSON schema by text.format, and a
// function call forced by tool_choice.
func TestServeResponses(t *testing.T) {
	s := startServe(t, nil)
	c := s.client()
	params := responses.ResponseNewParams{
		Model: demo.Name, Instructions: openai.String("Answer briefly."), MaxOutputTokens: openai.Int(24), Temperature: openai.Float(0),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("How do I list files?")},
	}
	resp, err := c.Responses.New(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	if resp.OutputText() == "" || resp.Usage.OutputTokens == 0 || resp.Usage.InputTokens == 0 {
		t.Fatalf("response %q, usage %+v", resp.OutputText(), resp.Usage)
	}
	stream := c.Responses.NewStreaming(t.Context(), params)
	var deltas strings.Builder
	var last responses.Response
	for stream.Next() {
		switch ev := stream.Current(); ev.Type {
		case "response.output_text.delta":
			deltas.WriteString(ev.Delta)
		case "response.completed", "response.incomplete":
			last = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if deltas.String() != resp.OutputText() || last.OutputText() != resp.OutputText() || last.Status != resp.Status {
		t.Errorf("streamed %q (%s), whole %q (%s)", deltas.String(), last.Status, resp.OutputText(), resp.Status)
	}

	// In the background, kept in the cluster's bucket as it runs: the
	// same answer, polled.
	bgParams := params
	bgParams.Background = openai.Bool(true)
	bg, err := c.Responses.New(t.Context(), bgParams)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for bg.Status == "queued" || bg.Status == "in_progress" {
		if time.Now().After(deadline) {
			t.Fatalf("background response still %s", bg.Status)
		}
		time.Sleep(20 * time.Millisecond)
		if bg, err = c.Responses.Get(t.Context(), bg.ID, responses.ResponseGetParams{}); err != nil {
			t.Fatal(err)
		}
	}
	if bg.OutputText() != resp.OutputText() || bg.Status != resp.Status || !bg.Background {
		t.Errorf("background: %q (%s), foreground %q (%s)", bg.OutputText(), bg.Status, resp.OutputText(), resp.Status)
	}

	schema := map[string]any{"type": "object", "properties": map[string]any{"cmd": map[string]any{"type": "string", "maxLength": 12}}, "required": []any{"cmd"}, "additionalProperties": false}
	resp, err = c.Responses.New(t.Context(), responses.ResponseNewParams{
		Model: demo.Name, MaxOutputTokens: openai.Int(200), Temperature: openai.Float(0),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("The command that lists files, as JSON.")},
		Text:  responses.ResponseTextConfigParam{Format: responses.ResponseFormatTextConfigParamOfJSONSchema("cmd", schema)},
	})
	if err != nil {
		t.Fatal(err)
	}
	var got struct{ Cmd *string }
	dec := json.NewDecoder(strings.NewReader(resp.OutputText()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil || got.Cmd == nil || utf8.RuneCountInString(*got.Cmd) > 12 || resp.Status != "completed" {
		t.Errorf("json_schema: %q (%s): %v", resp.OutputText(), resp.Status, err)
	}

	resp, err = c.Responses.New(t.Context(), responses.ResponseNewParams{
		Model: demo.Name, MaxOutputTokens: openai.Int(200), Temperature: openai.Float(0),
		Input:      responses.ResponseNewParamsInputUnion{OfString: openai.String("List the files in /tmp.")},
		Tools:      []responses.ToolUnionParam{responses.ToolParamOfFunction("ls", schema, true)},
		ToolChoice: responses.ResponseNewParamsToolChoiceUnion{OfToolChoiceMode: param.NewOpt(responses.ToolChoiceOptionsRequired)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Output) != 1 || resp.Output[0].Type != "function_call" {
		t.Fatalf("output %s", resp.RawJSON())
	}
	call := resp.Output[0].AsFunctionCall()
	dec = json.NewDecoder(strings.NewReader(call.Arguments))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil || call.Name != "ls" || got.Cmd == nil {
		t.Errorf("call %s(%s): %v", call.Name, call.Arguments, err)
	}

	// The call's output, sent back through the kept response (the
	// cluster's bucket), is answered in text; the call is fetched again.
	next, err := c.Responses.New(t.Context(), responses.ResponseNewParams{
		Model: demo.Name, MaxOutputTokens: openai.Int(16), Temperature: openai.Float(0), PreviousResponseID: openai.String(resp.ID),
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
			{OfFunctionCallOutput: &responses.ResponseInputItemFunctionCallOutputParam{CallID: param.NewOpt(call.CallID),
				Output: responses.ResponseInputItemFunctionCallOutputOutputUnionParam{OfString: param.NewOpt("a.txt b.txt")}}}}},
		Tools: []responses.ToolUnionParam{responses.ToolParamOfFunction("ls", schema, true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if next.PreviousResponseID != resp.ID || next.Usage.InputTokens <= resp.Usage.InputTokens {
		t.Errorf("continued: previous %q, %d input tokens after %d", next.PreviousResponseID, next.Usage.InputTokens, resp.Usage.InputTokens)
	}
	if kept, err := c.Responses.Get(t.Context(), resp.ID, responses.ResponseGetParams{}); err != nil || kept.RawJSON() != resp.RawJSON() {
		t.Errorf("fetched: %v", err)
	}

	// --kept-responses 0 keeps none.
	c = startServe(t, func(c *serveConfig) { c.KeptResponses = 0 }).client()
	resp, err = c.Responses.New(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	var apiErr *openai.Error
	if _, err := c.Responses.Get(t.Context(), resp.ID, responses.ResponseGetParams{}); strings.Contains(resp.RawJSON(), `"store":true`) || !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Errorf("--kept-responses 0: %s, get %v", resp.RawJSON(), err)
	}
}

// TestServePromptLogprobs scores a prompt as evaluation harnesses do
// (echo, logprobs, max_tokens 1) through the official client, in process
// and over the bus: the answer begins with the prompt's text and tokens,
// the first token's log-probability null and the others' those of one
// pass over the prompt, the same again when the prompt is in the cache
// and with max_tokens 0 (the prompt alone), and the completion's token as
// without echo.
func TestServePromptLogprobs(t *testing.T) { bothSubmitPaths(t, testServePromptLogprobs) }

func testServePromptLogprobs(t *testing.T, overBus bool) {
	s := startServe(t, func(c *serveConfig) { c.Shards, c.submitOverBus = 2, overBus })
	c := s.client()
	const prompt = "The kernel schedules"
	ask := func(echo bool, max int64) openai.Completion {
		resp, err := c.Completions.New(t.Context(), openai.CompletionNewParams{
			Model: openai.CompletionNewParamsModel(demo.Name), Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
			MaxTokens: openai.Int(max), Temperature: openai.Float(0), Logprobs: openai.Int(2), Echo: openai.Bool(echo),
		})
		if err != nil {
			t.Fatal(err)
		}
		return *resp
	}
	first, again, plain, alone := ask(true, 1), ask(true, 1), ask(false, 1), ask(true, 0)
	ch := first.Choices[0]
	lp := ch.Logprobs
	n := int(first.Usage.PromptTokens)
	if !strings.HasPrefix(ch.Text, prompt) || len(lp.Tokens) != n+1 || strings.Join(lp.Tokens[:n], "") != prompt || len(lp.TokenLogprobs) != n+1 {
		t.Fatalf("echo: %q, tokens %q (%d prompt tokens)", ch.Text, lp.Tokens, n)
	}
	if raw := ch.Logprobs.RawJSON(); !strings.Contains(raw, `"token_logprobs":[null,`) || !strings.Contains(raw, `"top_logprobs":[null,`) {
		t.Errorf("the first prompt token's log-probability is not null: %s", raw)
	}
	var raw struct {
		TopLogprobs []map[string]float64 `json:"top_logprobs"`
	}
	if err := json.Unmarshal([]byte(ch.Logprobs.RawJSON()), &raw); err != nil || len(raw.TopLogprobs) != n+1 {
		t.Fatalf("top_logprobs: %v (%d)", err, len(raw.TopLogprobs))
	}
	for k := 1; k <= n; k++ {
		if v := lp.TokenLogprobs[k]; !(v <= 0) || len(raw.TopLogprobs[k]) != 2 {
			t.Errorf("token %d: log-probability %v, top %v", k, v, raw.TopLogprobs[k])
		}
	}
	if lp2 := again.Choices[0].Logprobs; fmt.Sprint(lp2.TokenLogprobs) != fmt.Sprint(lp.TokenLogprobs) {
		t.Errorf("again: %v, first %v", lp2.TokenLogprobs, lp.TokenLogprobs)
	}
	if a := alone.Choices[0]; a.Text != prompt || fmt.Sprint(a.Logprobs.TokenLogprobs) != fmt.Sprint(lp.TokenLogprobs[:n]) || alone.Usage.CompletionTokens != 0 {
		t.Errorf("max_tokens 0: %q, %v (%d completion tokens)", a.Text, a.Logprobs.TokenLogprobs, alone.Usage.CompletionTokens)
	}
	if p := plain.Choices[0]; ch.Text != prompt+p.Text || math.Abs(lp.TokenLogprobs[n]-p.Logprobs.TokenLogprobs[0]) > 1e-6 {
		t.Errorf("the completion %q (%v), without echo %q (%v)", ch.Text[len(prompt):], lp.TokenLogprobs[n], p.Text, p.Logprobs.TokenLogprobs[0])
	}
}

// TestServeTokenize: /tokenize gives the model tokenizer's ids for a
// prompt and, for a conversation, the count a chat completion reports as
// its prompt tokens; /detokenize gives the text back; an id outside the
// vocabulary is a 400.
func TestServeTokenize(t *testing.T) {
	s := startServe(t, nil)
	tok, err := tokenizer.Load(filepath.Join("..", "..", "models", "demo", demo.Name, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	call := func(path string, req, resp any) int { t.Helper(); return postJSON(t, s.url+path, req, resp) }
	const prompt = "How do I list files?"
	var got struct {
		Count       int
		MaxModelLen int `json:"max_model_len"`
		Tokens      []int32
	}
	if code := call("/tokenize", map[string]any{"model": demo.Name, "prompt": prompt}, &got); code != 200 || !slices.Equal(got.Tokens, tok.Encode(prompt)) || got.Count != len(got.Tokens) || got.MaxModelLen != 1024 {
		t.Errorf("tokenize: %d %+v, want %v", code, got, tok.Encode(prompt))
	}
	var text struct{ Prompt string }
	if code := call("/detokenize", map[string]any{"model": demo.Name, "tokens": got.Tokens}, &text); code != 200 || text.Prompt != prompt {
		t.Errorf("detokenize: %d %q", code, text.Prompt)
	}
	var bad struct{ Error struct{ Param string } }
	if code := call("/detokenize", map[string]any{"model": demo.Name, "tokens": []int{8192}}, &bad); code != 400 || bad.Error.Param != "tokens" {
		t.Errorf("an id outside the vocabulary: %d %+v", code, bad)
	}
	msgs := []map[string]string{{"role": "user", "content": prompt}}
	if code := call("/tokenize", map[string]any{"model": demo.Name, "messages": msgs}, &got); code != 200 {
		t.Fatalf("tokenize messages: %d", code)
	}
	c := s.client()
	resp, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: openai.ChatModel(demo.Name),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}, MaxTokens: openai.Int(1)})
	if err != nil || int(resp.Usage.PromptTokens) != got.Count {
		t.Errorf("a conversation of %d tokens; the chat completion counts %d (%v)", got.Count, resp.Usage.PromptTokens, err)
	}
}

// compactJSON reports whether doc has at most one space, and no other
// whitespace, between its tokens (strings may hold any).
func compactJSON(doc string) bool {
	in, esc, space := false, false, false
	for _, c := range []byte(doc) {
		switch {
		case in:
			in = esc || c != '"'
			esc = !esc && c == '\\'
		case c == ' ':
			if space {
				return false
			}
			space = true
			continue
		case c == '\n' || c == '\t' || c == '\r':
			return false
		case c == '"':
			in = true
		}
		space = false
	}
	return true
}

// TestServeKeptResponsesOutliveRestart: with a store directory, a kept
// response is found after the node restarts.
func TestServeKeptResponsesOutliveRestart(t *testing.T) {
	dir := t.TempDir()
	first := startServe(t, func(c *serveConfig) { c.Cluster.StoreDir = dir })
	fc := first.client()
	resp, err := fc.Responses.New(t.Context(), responses.ResponseNewParams{Model: demo.Name, MaxOutputTokens: openai.Int(4),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("How do I list files?")}})
	if err != nil {
		t.Fatal(err)
	}
	first.cancel()
	err = <-first.done
	first.done <- err // for the cleanup
	if err != nil {
		t.Fatal(err)
	}
	c := startServe(t, func(c *serveConfig) { c.Cluster.StoreDir = dir }).client()
	got, err := c.Responses.Get(t.Context(), resp.ID, responses.ResponseGetParams{})
	if err != nil || got.OutputText() != resp.OutputText() {
		t.Fatalf("after a restart: %v", err)
	}
}

// TestServeCachedTokens: a conversation that begins as an earlier one
// reports, in its usage, the prompt tokens the KV manager's prefix cache
// held: whole blocks of the shared beginning, none the first time.
func TestServeCachedTokens(t *testing.T) {
	s := startServe(t, nil)
	c := s.client()
	msgs := []openai.ChatCompletionMessageParamUnion{
		openai.SystemMessage("You answer questions about troupe, a Go system that serves large language models across many GPUs and hosts as a troupe of actors."),
		openai.UserMessage("What is troupe?"),
	}
	var cached []int64
	for range 2 {
		r, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: openai.ChatModel(demo.Name), Messages: msgs, MaxTokens: openai.Int(3)})
		if err != nil {
			t.Fatal(err)
		}
		cached = append(cached, r.Usage.PromptTokensDetails.CachedTokens)
		if r.Usage.PromptTokens < 32 {
			t.Fatalf("a prompt of %d tokens: too short to fill two blocks", r.Usage.PromptTokens)
		}
	}
	if cached[0] != 0 || cached[1] == 0 || cached[1]%16 != 0 {
		t.Errorf("cached tokens %v, want 0 and then whole 16-token blocks", cached)
	}
}

// TestServeModelNames: --served-model-name replaces the model's own name
// in the API by the names given, each listed and each answering.
func TestServeModelNames(t *testing.T) {
	s := startServe(t, func(c *serveConfig) { c.ServedModelNames = []string{"docs", "gpt-4o-mini"} })
	c := s.client()
	pages := c.Models.ListAutoPaging(t.Context())
	var ids []string
	for pages.Next() {
		ids = append(ids, pages.Current().ID)
	}
	if err := pages.Err(); err != nil || strings.Join(ids, ",") != "docs,gpt-4o-mini" {
		t.Fatalf("models %v (%v), want docs and gpt-4o-mini", ids, err)
	}
	for _, id := range ids {
		r, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: openai.ChatModel(id), MaxTokens: openai.Int(2),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
		if err != nil || r.Model != id {
			t.Errorf("chat as %s: %v, answered as %q", id, err, r.Model)
		}
	}
	_, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: openai.ChatModel(demo.Name), MaxTokens: openai.Int(2),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || !strings.Contains(apiErr.Message, "does not exist") {
		t.Errorf("the model's own name: %v, want a 400 naming the served models", err)
	}
}

// TestServeChatTemplateFile: a checkpoint that keeps its chat template in
// chat_template.jinja, as newer ones do, is served with that template in
// the place of tokenizer_config.json's.
func TestServeChatTemplateFile(t *testing.T) {
	src, err := filepath.Abs(filepath.Join("..", "..", "models", "demo", demo.Name))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "kept-apart")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} {
		if _, err := os.Stat(filepath.Join(src, f)); err == nil {
			if err := os.Symlink(filepath.Join(src, f), filepath.Join(dir, f)); err != nil {
				t.Fatal(err)
			}
		}
	}
	const tmpl = `{% for m in messages %}[{{ m.role }}] {{ m.content }}
{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}`
	if err := os.WriteFile(filepath.Join(dir, "chat_template.jinja"), []byte(tmpl), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, func(c *serveConfig) { c.Model = dir })
	call := func(path string, req, resp any) int { t.Helper(); return postJSON(t, s.url+path, req, resp) }
	var tok struct{ Tokens []int32 }
	if status := call("/tokenize", map[string]any{"model": "kept-apart", "messages": []map[string]string{{"role": "user", "content": "hi"}}}, &tok); status != 200 {
		t.Fatalf("tokenize: %d", status)
	}
	var text struct{ Prompt string }
	if status := call("/detokenize", map[string]any{"model": "kept-apart", "tokens": tok.Tokens}, &text); status != 200 || text.Prompt != "[user] hi\n[assistant] " {
		t.Errorf("the conversation rendered as %q (%d), want chat_template.jinja's", text.Prompt, status)
	}
}

// postJSON posts req as JSON to url and decodes the answer into resp; it
// returns the status.
func postJSON(t *testing.T, url string, req, resp any) int {
	t.Helper()
	b, _ := json.Marshal(req)
	r, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	if err := json.NewDecoder(r.Body).Decode(resp); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return r.StatusCode
}
