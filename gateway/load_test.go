package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
)

const loadClients = 100

// TestConcurrentStreamingClients runs 100 websocket clients and 100 SSE clients at once
// on loopback: every request completes with contiguous sequence numbers and the right
// text, and nothing is left in flight afterwards.
func TestConcurrentStreamingClients(t *testing.T) {
	const tokens = 32
	env := newEnv(t, testConfig(), &echoBackend{delay: time.Millisecond})
	url := "ws" + strings.TrimPrefix(env.ts.URL, "http") + "/v1/stream"
	var (
		wg       sync.WaitGroup
		total    atomic.Int64
		failures = make(chan string, 2*loadClients)
	)
	start := time.Now()
	for i := range loadClients {
		prompt := fmt.Sprintf("client %03d says hi", i)
		want := strings.Repeat(prompt, 2)[:tokens]
		wg.Go(func() {
			conn, _, err := websocket.Dial(t.Context(), url, &websocket.DialOptions{HTTPClient: env.client})
			if err != nil {
				failures <- fmt.Sprintf("ws %d: dial: %v", i, err)
				return
			}
			defer conn.CloseNow()
			id := fmt.Sprintf("req-%d", i)
			msg := fmt.Sprintf(`{"type":"generate","id":%q,"model":"echo-1","prompt":%q,"max_tokens":%d,"ignore_eos":true}`, id, prompt, tokens)
			if err := conn.Write(t.Context(), websocket.MessageText, []byte(msg)); err != nil {
				failures <- fmt.Sprintf("ws %d: write: %v", i, err)
				return
			}
			var sb strings.Builder
			next := 1
			for {
				_, b, err := conn.Read(t.Context())
				if err != nil {
					failures <- fmt.Sprintf("ws %d: read: %v", i, err)
					return
				}
				var f wsIn
				if err := json.Unmarshal(b, &f); err != nil || f.ID != id {
					failures <- fmt.Sprintf("ws %d: frame %s", i, b)
					return
				}
				if f.Type == "token" {
					if f.Seq != next {
						failures <- fmt.Sprintf("ws %d: seq %d, want %d", i, f.Seq, next)
						return
					}
					next++
					sb.WriteString(f.Text)
					total.Add(1)
					continue
				}
				if f.Type != "done" || f.Usage.CompletionTokens != tokens || sb.String() != want {
					failures <- fmt.Sprintf("ws %d: ended with %s after %q", i, b, sb.String())
				}
				return
			}
		})
		wg.Go(func() {
			body := fmt.Sprintf(`{"model":"echo-1","prompt":%q,"max_tokens":%d,"ignore_eos":true,"stream":true}`, prompt, tokens)
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, env.ts.URL+"/v1/completions", strings.NewReader(body))
			resp, err := env.client.Do(req)
			if err != nil {
				failures <- fmt.Sprintf("sse %d: %v", i, err)
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				failures <- fmt.Sprintf("sse %d: status %d", i, resp.StatusCode)
				return
			}
			var sb strings.Builder
			sc := bufio.NewScanner(resp.Body)
			done := false
			for sc.Scan() {
				data, ok := strings.CutPrefix(sc.Text(), "data: ")
				if !ok {
					continue
				}
				if data == "[DONE]" {
					done = true
					break
				}
				var c completionResponse
				if err := json.Unmarshal([]byte(data), &c); err != nil || len(c.Choices) != 1 {
					failures <- fmt.Sprintf("sse %d: chunk %s", i, data)
					return
				}
				sb.WriteString(c.Choices[0].Text)
				total.Add(1)
			}
			if !done || sb.String() != want {
				failures <- fmt.Sprintf("sse %d: done=%v text %q, want %q", i, done, sb.String(), want)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(failures)
	for f := range failures {
		t.Error(f)
	}
	// The last chunk of each SSE stream carries only the finish reason.
	if got, want := total.Load(), int64(2*loadClients*tokens+loadClients); got != want {
		t.Errorf("received %d token frames and chunks, want %d", got, want)
	}
	t.Logf("%d clients × %d tokens in %v (%.0f tokens/s through the gateway)", 2*loadClients, tokens, elapsed, float64(2*loadClients*tokens)/elapsed.Seconds())
	waitFor(t, "the in-flight count to drain", func() bool { return env.srv.lim.inUse() == 0 })
}
