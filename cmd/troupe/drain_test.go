package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/troupe/troupe/gateway"
	"github.com/troupe/troupe/models/demo"
)

// streamed is how a request ended: the tokens it got and its error.
type streamed struct {
	tokens int
	err    error
}

// longRequest starts a node serving the demo model, and on it a greedy
// request of 400 tokens; it returns once the first token has come, with
// the node and a channel that gets how the request ended. The node is
// closed when the test ends.
func longRequest(t *testing.T) (*node, <-chan streamed) {
	t.Helper()
	cfg := testServeConfig()
	n, tp := startTestNode(t, cfg, nil, nil)
	t.Cleanup(func() {
		n.Close()
		tp.Shutdown(context.Background())
	})
	first := make(chan struct{}, 1)
	res := make(chan streamed, 1)
	go func() {
		got := 0
		req := gateway.GenerateRequest{RequestID: "long", Model: demo.Name, Prompt: n.tok.Encode("The kernel"), MaxTokens: 400, IgnoreEOS: true}
		_, err := n.backend.Generate(context.Background(), req, func(gateway.Token) error {
			got++
			select {
			case first <- struct{}{}:
			default:
			}
			return nil
		})
		res <- streamed{got, err}
	}()
	select {
	case <-first:
	case <-time.After(time.Minute):
		t.Fatal("no first token")
	}
	return n, res
}

// TestDrainFinishesRequests: a node that drains before it stops finishes
// the requests its replicas run, whole, and takes no new one.
func TestDrainFinishesRequests(t *testing.T) {
	n, res := longRequest(t)
	n.drain(time.Minute)
	if r := <-res; r.err != nil || r.tokens != 400 {
		t.Errorf("the request across the drain: %d tokens, %v; want 400, no error", r.tokens, r.err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req := gateway.GenerateRequest{RequestID: "late", Model: demo.Name, Prompt: n.tok.Encode("The kernel"), MaxTokens: 4}
	if _, err := n.backend.Generate(ctx, req, func(gateway.Token) error { return nil }); err == nil {
		t.Error("a request after the drain was served")
	}
}

// TestCutRequestFails: a request its scheduler ends as it stops (no drain,
// or a drain past its time) fails with the reason, rather than ending as
// if its client had cancelled it.
func TestCutRequestFails(t *testing.T) {
	n, res := longRequest(t)
	n.replicasMu.Lock()
	rep := n.replicas[0]
	n.replicasMu.Unlock()
	now, cancel := context.WithCancel(context.Background())
	cancel()
	n.retire(now, rep, false)
	if r := <-res; r.err == nil || !strings.Contains(r.err.Error(), "shutting down") || r.tokens >= 400 {
		t.Errorf("the request its scheduler stopped: %d tokens, %v; want an error saying the server is shutting down", r.tokens, r.err)
	}
}
