package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/troupe/troupe/models/demo"
)

// TestScaleWhileServing adds a replica and removes it again while requests
// stream; every request completes with all its tokens.
func TestScaleWhileServing(t *testing.T) {
	s := startServe(t, nil)
	scale := func(args ...string) string {
		t.Helper()
		out, _, err := runCLI(t, "", append([]string{"scale", "--server", s.url}, args...)...)
		if err != nil {
			t.Fatalf("scale %v: %v", args, err)
		}
		return strings.TrimSpace(out)
	}
	if got := scale(); got != "1 replicas" {
		t.Fatalf("at start: %q", got)
	}
	if got := scale("--replicas", "2"); got != "2 replicas" {
		t.Fatalf("after growing: %q", got)
	}
	c := s.client()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	const tokens = 48
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.Completions.New(context.Background(), openai.CompletionNewParams{
				Model:       openai.CompletionNewParamsModel(demo.Name),
				Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String("The kernel")},
				MaxTokens:   openai.Int(tokens),
				Temperature: openai.Float(0),
			})
			if err != nil {
				errs <- err
				return
			}
			if resp.Choices[0].Text != demoRefs(t)[0].Text {
				errs <- fmt.Errorf("request %d: text %q", i, resp.Choices[0].Text)
			}
		}()
	}
	// Shrink while the requests run: the replica that goes finishes its own.
	if got := scale("--replicas", "1"); got != "1 replicas" {
		t.Errorf("after shrinking: %q", got)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if _, _, err := runCLI(t, "", "scale", "--server", s.url, "--replicas", "-1"); err == nil {
		t.Error("scaling to -1 replicas: no error")
	}
}
