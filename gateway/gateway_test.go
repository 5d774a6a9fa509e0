package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// byteTokenizer maps each byte to one token id.
type byteTokenizer struct{}

func (byteTokenizer) Encode(s string) []int32 {
	ids := make([]int32, len(s))
	for i := range len(s) {
		ids[i] = int32(s[i])
	}
	return ids
}

func (byteTokenizer) Decode(ids []int32, _ bool) string {
	b := make([]byte, len(ids))
	for i, id := range ids {
		b[i] = byte(id)
	}
	return string(b)
}

// lineTemplate renders "role: content\n" per message and "assistant: " to
// prompt a reply; template variables as "vars: name=value ...\n" and tools
// as "tools: a,b\n" first, a message's tool calls as " -> name(arguments)"
// and a tool's answer as "tool[id]: content".
type lineTemplate struct{}

func (lineTemplate) Render(msgs []Message, o RenderOptions) (string, error) {
	var sb strings.Builder
	if len(o.Vars) > 0 {
		var kv []string
		for k, v := range o.Vars {
			kv = append(kv, k+"="+v)
		}
		slices.Sort(kv)
		fmt.Fprintf(&sb, "vars: %s\n", strings.Join(kv, " "))
	}
	if len(o.Tools) > 0 {
		names := make([]string, len(o.Tools))
		for i, t := range o.Tools {
			names[i] = t.Name
		}
		fmt.Fprintf(&sb, "tools: %s\n", strings.Join(names, ","))
	}
	for _, m := range msgs {
		if m.Content == "fail-template" {
			return "", errors.New("template refused the message")
		}
		role := m.Role
		if m.ToolCallID != "" {
			role += "[" + m.ToolCallID + "]"
		}
		if m.Reasoning != "" {
			role += " (thought: " + m.Reasoning + ")"
		}
		fmt.Fprintf(&sb, "%s: %s", role, m.Content)
		for _, c := range m.ToolCalls {
			fmt.Fprintf(&sb, " -> %s(%s)", c.Name, c.Arguments)
		}
		sb.WriteString("\n")
	}
	if o.AddGenerationPrompt {
		sb.WriteString("assistant: ")
	}
	return sb.String(), nil
}

// echoBackend generates the prompt back, token by token: token i is prompt[i mod len].
// Without IgnoreEOS it finishes ("stop") after echoing the whole prompt once.
type echoBackend struct {
	delay   time.Duration // before each token
	gate    chan struct{} // when set, each generation waits for a value before its first token
	started chan string   // when set, receives each RequestID as its generation starts

	reply  string // when set, generated in place of the prompt
	cached int    // prompt tokens reported found cached (at most the prompt's)

	overloaded atomic.Bool
	notReady   atomic.Bool
	failAfter  atomic.Int64 // when > 0, fail with an error after this many tokens

	mu        sync.Mutex
	reqs      []GenerateRequest
	cancelled []string // RequestIDs that saw ctx cancelled
	emitErrs  []string // RequestIDs whose emit returned an error
}

func (b *echoBackend) Ready() (bool, string) {
	if b.notReady.Load() {
		return false, "loading weights"
	}
	return true, ""
}

func (b *echoBackend) Stats() Stats {
	return Stats{QueueDepth: 3, Running: 2, KVUsage: 0.25, MailboxDepths: map[string]int{"scheduler": 1, `shard "0"`: 4}}
}

func (b *echoBackend) requests() []GenerateRequest {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]GenerateRequest(nil), b.reqs...)
}

// lastPrompt is the text of the last generation's prompt.
func (b *echoBackend) lastPrompt(t *testing.T) string {
	t.Helper()
	reqs := b.requests()
	if len(reqs) == 0 {
		t.Fatal("no generation")
	}
	return byteTokenizer{}.Decode(reqs[len(reqs)-1].Prompt, false)
}

func (b *echoBackend) sawCancel(id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.cancelled {
		if c == id {
			return true
		}
	}
	return false
}

func (b *echoBackend) cancelCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.cancelled)
}

func (b *echoBackend) Generate(ctx context.Context, req GenerateRequest, emit func(Token) error) (Finish, error) {
	b.mu.Lock()
	b.reqs = append(b.reqs, req)
	b.mu.Unlock()
	fin := Finish{PromptTokens: len(req.Prompt), CachedTokens: min(b.cached, len(req.Prompt))}
	cancelled := func() (Finish, error) {
		b.mu.Lock()
		b.cancelled = append(b.cancelled, req.RequestID)
		b.mu.Unlock()
		fin.Reason = FinishCancelled
		return fin, ctx.Err()
	}
	if b.overloaded.Load() {
		return fin, &OverloadedError{RetryAfter: 3 * time.Second, Reason: "queue full"}
	}
	queued := time.Now()
	if b.started != nil {
		select {
		case b.started <- req.RequestID:
		case <-ctx.Done():
			return cancelled()
		}
	}
	if b.gate != nil {
		select {
		case <-b.gate:
		case <-ctx.Done():
			return cancelled()
		}
	}
	begun := time.Now()
	src := req.Prompt
	if b.reply != "" {
		src = byteTokenizer{}.Encode(b.reply)
	}
	for i := 0; i < req.MaxTokens; i++ {
		if !req.IgnoreEOS && i == len(src) {
			fin.Reason = FinishStop
			return fin, nil
		}
		if n := b.failAfter.Load(); n > 0 && int64(i) == n {
			fin.Reason = FinishError
			return fin, errors.New("device lost")
		}
		if b.delay > 0 {
			select {
			case <-time.After(b.delay):
			case <-ctx.Done():
				return cancelled()
			}
		} else if ctx.Err() != nil {
			return cancelled()
		}
		id := src[i%len(src)]
		tok := Token{ID: id, Text: string(rune(byte(id))), Logprob: -0.5, TraceID: "trace-" + req.RequestID,
			TopLogprobs: []TokenLogprob{{ID: id, Logprob: -0.5}, {ID: 'z', Text: "z", Logprob: -1.5}},
			QueuedAt:    queued, StartedAt: begun}
		if i == 0 && req.PromptLogprobs {
			// Prompt token k's log-probability is -k.
			for k, pid := range req.Prompt[1:] {
				tok.Prompt = append(tok.Prompt, PromptLogprob{ID: pid, Logprob: -float32(k + 1),
					Top: []TokenLogprob{{ID: pid, Logprob: -float32(k + 1)}, {ID: 'z', Text: "z", Logprob: -9}}})
			}
		}
		if id >= 128 {
			tok.Text = "?"
		}
		if err := emit(tok); err != nil {
			b.mu.Lock()
			b.emitErrs = append(b.emitErrs, req.RequestID)
			b.mu.Unlock()
			fin.Reason = FinishCancelled
			fin.CompletionTokens = i + 1
			return fin, err
		}
		fin.CompletionTokens = i + 1
	}
	fin.Reason = FinishLength
	return fin, nil
}

const testModel = "echo-1"

func testConfig() Config {
	cfg := DefaultConfig()
	cfg.Models = []ModelInfo{{ID: testModel, ContextLength: 256, VocabSize: 256, Created: 1700000000, OwnedBy: "troupe"}}
	return cfg
}

type testEnv struct {
	srv     *Server
	ts      *httptest.Server
	backend *echoBackend
	client  *http.Client
}

// testLimit bounds a test of the package that starts a gateway: each takes
// seconds, so one still running after this is stuck.
const testLimit = 3 * time.Minute

// newEnv starts a gateway on a loopback httptest server. Cleanup shuts both down.
func newEnv(t *testing.T, cfg Config, b *echoBackend) *testEnv {
	t.Helper()
	if b == nil {
		b = &echoBackend{}
	}
	srv, err := New(cfg, b, byteTokenizer{}, lineTemplate{})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ts := httptest.NewServer(srv.Handler())
	tr := &http.Transport{MaxIdleConnsPerHost: 200}
	env := &testEnv{srv: srv, ts: ts, backend: b, client: &http.Client{Transport: tr}}
	watchdog := time.AfterFunc(testLimit, func() {
		// A test that hangs names itself last, after every goroutine's stack.
		buf := make([]byte, 1<<22)
		os.Stderr.Write(buf[:runtime.Stack(buf, true)])
		panic(fmt.Sprintf("%s still running after %s", t.Name(), testLimit))
	})
	t.Cleanup(func() {
		defer watchdog.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		tr.CloseIdleConnections()
		ts.Close()
	})
	return env
}

// sseData calls each with the data of every server-sent event in raw but
// the closing [DONE].
func sseData(raw []byte, each func(data []byte)) {
	for _, line := range strings.Split(string(raw), "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok && data != "[DONE]" {
			each([]byte(data))
		}
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
