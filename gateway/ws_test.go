package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// wsIn is any server frame, as a client decodes it.
type wsIn struct {
	Type         string        `json:"type"`
	ID           string        `json:"id"`
	Seq          int           `json:"seq"`
	Text         string        `json:"text"`
	TokenID      int32         `json:"token_id"`
	TraceID      string        `json:"trace_id"`
	Timings      *wsTimings    `json:"timings"`
	FinishReason string        `json:"finish_reason"`
	Usage        *usage        `json:"usage"`
	Code         string        `json:"code"`
	Message      string        `json:"message"`
	RetryAfterMs int64         `json:"retry_after_ms"`
	Content      *string       `json:"content"`
	ToolCalls    []toolCallOut `json:"tool_calls"`
}

func dialWS(t *testing.T, env *testEnv) *websocket.Conn {
	t.Helper()
	url := "ws" + strings.TrimPrefix(env.ts.URL, "http") + "/v1/stream"
	conn, _, err := websocket.Dial(t.Context(), url, &websocket.DialOptions{HTTPClient: env.client})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { conn.CloseNow() })
	return conn
}

func sendWS(t *testing.T, conn *websocket.Conn, frame string) {
	t.Helper()
	if err := conn.Write(t.Context(), websocket.MessageText, []byte(frame)); err != nil {
		t.Fatalf("write %s: %v", frame, err)
	}
}

func readWS(t *testing.T, conn *websocket.Conn) wsIn {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, b, err := conn.Read(ctx)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	var f wsIn
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("frame %s: %v", b, err)
	}
	return f
}

// collect reads frames until every id in ids is done or failed.
func collect(t *testing.T, conn *websocket.Conn, ids ...string) map[string][]wsIn {
	t.Helper()
	out := make(map[string][]wsIn)
	open := make(map[string]bool)
	for _, id := range ids {
		open[id] = true
	}
	for len(open) > 0 {
		f := readWS(t, conn)
		out[f.ID] = append(out[f.ID], f)
		if f.Type == "done" || f.Type == "error" {
			delete(open, f.ID)
		}
	}
	return out
}

// checkTokens verifies seqs 1..n in order, and returns the text.
func checkTokens(t *testing.T, frames []wsIn, from int) string {
	t.Helper()
	var sb strings.Builder
	want := from
	for _, f := range frames {
		if f.Type != "token" {
			continue
		}
		if f.Seq != want {
			t.Fatalf("frame seq %d, want %d (no gaps, no duplicates)", f.Seq, want)
		}
		want++
		sb.WriteString(f.Text)
	}
	return sb.String()
}

func TestWSTokensInOrder(t *testing.T) {
	env := newEnv(t, testConfig(), nil)
	conn := dialWS(t, env)
	sendWS(t, conn, `{"type":"generate","id":"a","model":"echo-1","prompt":"hello","logprobs":true}`)
	frames := collect(t, conn, "a")["a"]
	if got := checkTokens(t, frames, 1); got != "hello" {
		t.Errorf("text = %q, want hello", got)
	}
	last := frames[len(frames)-1]
	if last.Type != "done" || last.FinishReason != "stop" || last.Usage.PromptTokens != 5 || last.Usage.CompletionTokens != 5 || last.Usage.TotalTokens != 10 {
		t.Errorf("done frame = %+v", last)
	}
	first := frames[0]
	if first.TokenID != 'h' || !strings.HasPrefix(first.TraceID, "trace-ws-") || first.Timings == nil || first.Timings.SinceStartMs < 0 || first.Timings.ITLMs != 0 {
		t.Errorf("first token frame = %+v", first)
	}
	if frames[1].Timings.ITLMs < 0 {
		t.Errorf("second frame itl = %v", frames[1].Timings.ITLMs)
	}
}

func TestWSConcurrentRequestsOnOneSocket(t *testing.T) {
	env := newEnv(t, testConfig(), &echoBackend{delay: time.Millisecond})
	conn := dialWS(t, env)
	prompts := map[string]string{"r1": "first prompt", "r2": "second one", "r3": "third"}
	for id, p := range prompts {
		sendWS(t, conn, fmt.Sprintf(`{"type":"generate","id":%q,"model":"echo-1","prompt":%q}`, id, p))
	}
	sendWS(t, conn, `{"type":"generate","id":"r4","model":"echo-1","messages":[{"role":"user","content":"x"}],"max_tokens":3}`)
	got := collect(t, conn, "r1", "r2", "r3", "r4")
	for id, p := range prompts {
		if text := checkTokens(t, got[id], 1); text != p {
			t.Errorf("%s: %q, want %q", id, text, p)
		}
	}
	if text := checkTokens(t, got["r4"], 1); text != "use" {
		t.Errorf("chat over websocket: %q, want %q", text, "use")
	}
}

// TestWSToolCalls: a conversation with tools streams its raw tokens, and
// its done frame carries the answer read from the whole text, as a chat
// completion's message: the content without the call's markup and the
// call; tools without messages are refused.
func TestWSToolCalls(t *testing.T) {
	cfg := testConfig()
	cfg.Models[0].ContextLength = 1024
	env := newEnv(t, cfg, nil)
	conn := dialWS(t, env)
	call := `<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>`
	tools := `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`
	sendWS(t, conn, `{"type":"generate","id":"c","model":"echo-1","messages":[{"role":"user","content":"`+call+`"}],"tools":`+tools+`}`)
	frames := collect(t, conn, "c")["c"]
	text := checkTokens(t, frames, 1)
	last := frames[len(frames)-1]
	if !strings.Contains(text, "<tool_call>") || last.FinishReason != "tool_calls" || len(last.ToolCalls) != 1 || last.Content == nil {
		t.Fatalf("tokens %q, done frame %+v", text, last)
	}
	if c := last.ToolCalls[0]; c.Function.Name != "get_weather" || c.Function.Arguments != `{"city": "Oslo"}` || !strings.HasPrefix(c.ID, "call_") || c.Type != "function" {
		t.Errorf("call %+v", c)
	}
	if want := "tools: get_weather\nuser:\nassistant: "; *last.Content != want {
		t.Errorf("content %q, want %q", *last.Content, want)
	}
	sendWS(t, conn, `{"type":"generate","id":"n","model":"echo-1","messages":[{"role":"user","content":"hi"}],"tools":`+tools+`,"tool_choice":"none"}`)
	frames = collect(t, conn, "n")["n"]
	last = frames[len(frames)-1]
	if last.FinishReason != "stop" || len(last.ToolCalls) != 0 || last.Content == nil || !strings.HasSuffix(*last.Content, "user: hi\nassistant: ") {
		t.Errorf("tool_choice none: %+v", last)
	}
	sendWS(t, conn, `{"type":"generate","id":"p","model":"echo-1","prompt":"x","tools":`+tools+`}`)
	if f := readWS(t, conn); f.Type != "error" || !strings.Contains(f.Message, "tools need messages") {
		t.Errorf("tools with a prompt: %+v", f)
	}
}

func TestWSStopStringHeldBack(t *testing.T) {
	env := newEnv(t, testConfig(), nil)
	conn := dialWS(t, env)
	sendWS(t, conn, `{"type":"generate","id":"s","model":"echo-1","prompt":"abcabd","stop":["abd","zz"]}`)
	frames := collect(t, conn, "s")["s"]
	text := checkTokens(t, frames, 1)
	last := frames[len(frames)-1]
	if text+last.Text != "abc" || last.FinishReason != "stop" {
		t.Errorf("text %q + tail %q finish %q, want abc and stop", text, last.Text, last.FinishReason)
	}
	sendWS(t, conn, `{"type":"generate","id":"t","model":"echo-1","prompt":"xyza","stop":["ab"]}`)
	frames = collect(t, conn, "t")["t"]
	text = checkTokens(t, frames, 1)
	last = frames[len(frames)-1]
	if text != "xyz" || last.Text != "a" {
		t.Errorf("text %q tail %q, want xyz and the held-back a in the done frame", text, last.Text)
	}
}

func TestWSCancel(t *testing.T) {
	b := &echoBackend{delay: 5 * time.Millisecond}
	env := newEnv(t, testConfig(), b)
	conn := dialWS(t, env)
	sendWS(t, conn, `{"type":"generate","id":"c","model":"echo-1","prompt":"abc","max_tokens":200,"ignore_eos":true}`)
	for range 2 {
		if f := readWS(t, conn); f.Type != "token" {
			t.Fatalf("got %+v, want a token", f)
		}
	}
	sendWS(t, conn, `{"type":"cancel","id":"c"}`)
	var last wsIn
	for last = readWS(t, conn); last.Type == "token"; last = readWS(t, conn) {
	}
	if last.Type != "done" || last.FinishReason != "cancelled" || last.Usage.CompletionTokens >= 200 {
		t.Errorf("after cancel: %+v, want done/cancelled", last)
	}
	reqs := b.requests()
	waitFor(t, "backend cancellation", func() bool { return b.sawCancel(reqs[0].RequestID) })
	sendWS(t, conn, `{"type":"cancel","id":"c"}`)
	if f := readWS(t, conn); f.Type != "error" || f.Code != "unknown_id" {
		t.Errorf("cancel of a finished request: %+v, want unknown_id", f)
	}
}

func TestWSResumeAfterReconnect(t *testing.T) {
	for _, finishWhileAway := range []bool{false, true} {
		t.Run(fmt.Sprintf("finished_while_away=%v", finishWhileAway), func(t *testing.T) {
			b := &echoBackend{delay: 3 * time.Millisecond}
			env := newEnv(t, testConfig(), b)
			conn := dialWS(t, env)
			const total = 60
			sendWS(t, conn, fmt.Sprintf(`{"type":"generate","id":"r","model":"echo-1","prompt":"0123456789","max_tokens":%d,"ignore_eos":true}`, total))
			var before []wsIn
			for len(before) < 7 {
				before = append(before, readWS(t, conn))
			}
			conn.CloseNow() // the network drops; generation goes on
			if finishWhileAway {
				waitFor(t, "the generation to finish", func() bool {
					env.srv.mu.Lock()
					defer env.srv.mu.Unlock()
					st := env.srv.streams[streamKey{"", "r"}]
					return st != nil && st.isFinal()
				})
			}
			conn2 := dialWS(t, env)
			sendWS(t, conn2, `{"type":"resume","id":"r","after_seq":7}`)
			after := collect(t, conn2, "r")["r"]
			all := append(before, after...)
			text := checkTokens(t, all, 1)
			if want := strings.Repeat("0123456789", 6); text != want {
				t.Errorf("text after resume = %q, want %q", text, want)
			}
			last := all[len(all)-1]
			if last.Type != "done" || last.FinishReason != "length" || last.Usage.CompletionTokens != total {
				t.Errorf("last frame %+v, want done/length with %d tokens", last, total)
			}
			if b.cancelCount() != 0 {
				t.Error("the generation was cancelled by the disconnect")
			}
			// Delivered: the request is gone.
			sendWS(t, conn2, `{"type":"resume","id":"r","after_seq":0}`)
			if f := readWS(t, conn2); f.Type != "error" || f.Code != "unknown_id" {
				t.Errorf("second resume: %+v, want unknown_id", f)
			}
		})
	}
}

func TestWSResumeTakesOverLiveSocket(t *testing.T) {
	env := newEnv(t, testConfig(), &echoBackend{delay: 3 * time.Millisecond})
	conn := dialWS(t, env)
	sendWS(t, conn, `{"type":"generate","id":"x","model":"echo-1","prompt":"abcdefghijklmnopqrstuvwxyz"}`)
	f := readWS(t, conn)
	conn2 := dialWS(t, env)
	sendWS(t, conn2, fmt.Sprintf(`{"type":"resume","id":"x","after_seq":%d}`, f.Seq))
	text := f.Text + checkTokens(t, collect(t, conn2, "x")["x"], f.Seq+1)
	if text != "abcdefghijklmnopqrstuvwxyz" {
		t.Errorf("text = %q", text)
	}
}

func TestWSGraceExpiryCancels(t *testing.T) {
	cfg := testConfig()
	cfg.ResumeGrace = 30 * time.Millisecond
	b := &echoBackend{delay: 5 * time.Millisecond}
	env := newEnv(t, cfg, b)
	conn := dialWS(t, env)
	sendWS(t, conn, `{"type":"generate","id":"g","model":"echo-1","prompt":"abc","max_tokens":200,"ignore_eos":true}`)
	readWS(t, conn)
	conn.CloseNow()
	waitFor(t, "the grace period to cancel the generation", func() bool { return b.cancelCount() == 1 })
	conn2 := dialWS(t, env)
	sendWS(t, conn2, `{"type":"resume","id":"g","after_seq":1}`)
	if f := readWS(t, conn2); f.Type != "error" || f.Code != "unknown_id" {
		t.Errorf("resume after the grace period: %+v, want unknown_id", f)
	}
}

func TestWSBadFrames(t *testing.T) {
	cfg := testConfig()
	cfg.MaxBodyBytes = 4096
	env := newEnv(t, cfg, nil)
	conn := dialWS(t, env)
	for _, tc := range []struct{ frame, code, id string }{
		{`{"type":"generate","id":"a",`, "invalid_json", ""},
		{`{"type":"launch","id":"a"}`, "bad_frame", "a"},
		{`{"id":"a"}`, "bad_frame", "a"},
		{`{"type":"generate"}`, "bad_frame", ""},
		{`{"type":"resume","id":"a"}`, "bad_frame", "a"},
		{`{"type":"resume","id":"a","after_seq":-1}`, "bad_frame", "a"},
		{`{"type":"generate","id":"a","model":"echo-1"}`, "invalid_value", "a"},
		{`{"type":"generate","id":"a","model":"echo-1","prompt":"x","messages":[{"role":"user","content":"y"}]}`, "invalid_value", "a"},
		{`{"type":"generate","id":"a","model":"other","prompt":"x"}`, "model_not_found", "a"},
		{`{"type":"generate","id":"a","model":"echo-1","prompt":"x","n":2}`, "invalid_value", "a"},
		{`{"type":"generate","id":"a","model":"echo-1","prompt":"x","max_tokens":1000}`, "context_length_exceeded", "a"},
		{`{"type":"resume","id":"nobody","after_seq":0}`, "unknown_id", "nobody"},
	} {
		sendWS(t, conn, tc.frame)
		f := readWS(t, conn)
		if f.Type != "error" || f.Code != tc.code || f.ID != tc.id || f.Message == "" {
			t.Errorf("frame %s: got %+v, want error %s for id %q", tc.frame, f, tc.code, tc.id)
		}
	}
	if err := conn.Write(t.Context(), websocket.MessageBinary, []byte{1, 2}); err != nil {
		t.Fatal(err)
	}
	if f := readWS(t, conn); f.Code != "bad_frame" {
		t.Errorf("binary frame: %+v", f)
	}
	// Still usable after all that.
	sendWS(t, conn, `{"type":"generate","id":"ok","model":"echo-1","prompt":"fine"}`)
	if got := checkTokens(t, collect(t, conn, "ok")["ok"], 1); got != "fine" {
		t.Errorf("text = %q", got)
	}
	// An oversized message closes the socket with 1009.
	sendWS(t, conn, `{"type":"generate","id":"big","model":"echo-1","prompt":"`+strings.Repeat("a", 5000)+`"}`)
	_, _, err := conn.Read(t.Context())
	if websocket.CloseStatus(err) != websocket.StatusMessageTooBig {
		t.Errorf("oversized frame: %v, want close status 1009", err)
	}
}

func TestWSDuplicateAndOverload(t *testing.T) {
	cfg := testConfig()
	cfg.MaxInFlight = 1
	b := &echoBackend{gate: make(chan struct{}), started: make(chan string, 1)}
	env := newEnv(t, cfg, b)
	conn := dialWS(t, env)
	sendWS(t, conn, `{"type":"generate","id":"one","model":"echo-1","prompt":"ab"}`)
	<-b.started
	sendWS(t, conn, `{"type":"generate","id":"one","model":"echo-1","prompt":"ab"}`)
	if f := readWS(t, conn); f.Code != "duplicate_id" {
		t.Errorf("duplicate id: %+v", f)
	}
	sendWS(t, conn, `{"type":"generate","id":"two","model":"echo-1","prompt":"ab"}`)
	if f := readWS(t, conn); f.Code != "queue_full" || f.RetryAfterMs != 1000 {
		t.Errorf("over the in-flight limit: %+v, want queue_full with retry_after_ms 1000", f)
	}
	close(b.gate)
	if got := checkTokens(t, collect(t, conn, "one")["one"], 1); got != "ab" {
		t.Errorf("text = %q", got)
	}
	// A finished, delivered id may be reused.
	sendWS(t, conn, `{"type":"generate","id":"one","model":"echo-1","prompt":"cd"}`)
	<-b.started
	if got := checkTokens(t, collect(t, conn, "one")["one"], 1); got != "cd" {
		t.Errorf("reused id text = %q", got)
	}
}

func TestWSBackendErrors(t *testing.T) {
	b := &echoBackend{}
	b.overloaded.Store(true)
	env := newEnv(t, testConfig(), b)
	conn := dialWS(t, env)
	sendWS(t, conn, `{"type":"generate","id":"o","model":"echo-1","prompt":"ab"}`)
	if f := readWS(t, conn); f.Type != "error" || f.Code != "backend_overloaded" || f.RetryAfterMs != 3000 {
		t.Errorf("overloaded backend: %+v", f)
	}
	b.overloaded.Store(false)
	b.failAfter.Store(2)
	sendWS(t, conn, `{"type":"generate","id":"f","model":"echo-1","prompt":"abcd"}`)
	frames := collect(t, conn, "f")["f"]
	if len(frames) != 3 || frames[2].Code != "generation_failed" {
		t.Errorf("failing backend: %+v", frames)
	}
}

// TestWSPingDropsSilentClient: a client that answers pings stays connected and
// served; one that never reads (so never answers) is disconnected.
func TestWSPingDropsSilentClient(t *testing.T) {
	cfg := testConfig()
	cfg.PingInterval = 50 * time.Millisecond
	env := newEnv(t, cfg, nil)
	live := dialWS(t, env)
	frames := make(chan wsIn, 64)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		defer close(frames)
		for {
			_, b, err := live.Read(t.Context())
			if err != nil {
				return
			}
			var f wsIn
			if json.Unmarshal(b, &f) == nil {
				frames <- f
			}
		}
	}()
	t.Cleanup(func() {
		live.CloseNow()
		<-readerDone
	})
	_ = dialWS(t, env) // never reads, so never pongs
	waitFor(t, "both sockets open", func() bool { return env.srv.met.wsConns.Load() == 2 })
	waitFor(t, "the silent socket dropped", func() bool { return env.srv.met.wsConns.Load() == 1 })
	time.Sleep(4 * cfg.PingInterval) // the live socket answers several more pings

	sendWS(t, live, `{"type":"generate","id":"a","model":"echo-1","prompt":"hi"}`)
	var text string
	timeout := time.After(10 * time.Second)
	for done := false; !done; {
		select {
		case f, ok := <-frames:
			if !ok {
				t.Fatalf("live socket closed after %q", text)
			}
			if f.Type == "error" {
				t.Fatalf("error frame %+v", f)
			}
			if f.Type == "token" {
				text += f.Text
			}
			done = f.Type == "done"
		case <-timeout:
			t.Fatalf("live socket: no done frame within 10 s, text so far %q", text)
		}
	}
	if text != "hi" {
		t.Errorf("live socket after pings: text %q, want hi", text)
	}
	if n := env.srv.met.wsConns.Load(); n != 1 {
		t.Errorf("open sockets = %d, want 1", n)
	}
}
