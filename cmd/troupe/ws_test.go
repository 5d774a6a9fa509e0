package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"github.com/troupe/troupe/models/demo"
)

type wsFrame struct {
	Type    string `json:"type"`
	ID      string `json:"id"`
	Seq     int    `json:"seq"`
	Text    string `json:"text"`
	TokenID int32  `json:"token_id"`
	TraceID string `json:"trace_id"`
	Finish  string `json:"finish_reason"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// TestServeWebsocketClients: 100 concurrent websocket clients stream from
// two replicas of the real engine; every request completes with contiguous
// sequence numbers, and identical greedy requests get identical tokens.
func TestServeWebsocketClients(t *testing.T) {
	// Two replicas share the one CPU device through its device actor.
	s := startServe(t, func(c *serveConfig) { c.MaxSeqs, c.Replicas = 32, 2 })
	wsURL := "ws" + strings.TrimPrefix(s.url, "http") + "/v1/stream"
	const clients, tokens = 100, 8
	results := make([][]int32, clients)
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			conn, _, err := websocket.Dial(ctx, wsURL, nil)
			if err != nil {
				errs <- err
				return
			}
			defer conn.CloseNow()
			req := map[string]any{"type": "generate", "id": fmt.Sprint("c", c), "model": demo.Name, "prompt": "The kernel", "max_tokens": tokens, "temperature": 0, "ignore_eos": true}
			if err := wsjson.Write(ctx, conn, req); err != nil {
				errs <- err
				return
			}
			for {
				var f wsFrame
				if err := wsjson.Read(ctx, conn, &f); err != nil {
					errs <- fmt.Errorf("client %d: %w", c, err)
					return
				}
				switch f.Type {
				case "token":
					if f.Seq != len(results[c])+1 {
						errs <- fmt.Errorf("client %d: seq %d after %d tokens", c, f.Seq, len(results[c]))
						return
					}
					if f.TraceID == "" {
						errs <- fmt.Errorf("client %d: token without a trace id", c)
						return
					}
					results[c] = append(results[c], f.TokenID)
				case "done":
					if f.Finish != "length" {
						errs <- fmt.Errorf("client %d: finished %q", c, f.Finish)
					}
					conn.Close(websocket.StatusNormalClosure, "")
					return
				default:
					raw, _ := json.Marshal(f)
					errs <- fmt.Errorf("client %d: frame %s", c, raw)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	want := demoRefs(t)[0].GreedyIDs[:tokens]
	for c, got := range results {
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("client %d: tokens %v, want %v", c, got, want)
			break
		}
	}
}
