package gateway_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/troupe/troupe/gateway"
)

// words is a toy tokenizer: one token per byte.
type words struct{}

func (words) Encode(s string) []int32 {
	ids := make([]int32, len(s))
	for i := range len(s) {
		ids[i] = int32(s[i])
	}
	return ids
}

func (words) Decode(ids []int32, _ bool) string {
	b := make([]byte, len(ids))
	for i, id := range ids {
		b[i] = byte(id)
	}
	return string(b)
}

// shout is a toy backend that answers every prompt with "OK".
type shout struct{}

func (shout) Ready() (bool, string) { return true, "" }

func (shout) Generate(ctx context.Context, req gateway.GenerateRequest, emit func(gateway.Token) error) (gateway.Finish, error) {
	for i, text := range []string{"O", "K"} {
		if err := emit(gateway.Token{ID: int32(text[0]), Text: text}); err != nil {
			return gateway.Finish{Reason: gateway.FinishCancelled, PromptTokens: len(req.Prompt), CompletionTokens: i}, err
		}
	}
	return gateway.Finish{Reason: gateway.FinishStop, PromptTokens: len(req.Prompt), CompletionTokens: 2}, nil
}

func Example() {
	cfg := gateway.DefaultConfig()
	cfg.Models = []gateway.ModelInfo{{ID: "toy", ContextLength: 128}}
	srv, err := gateway.New(cfg, shout{}, words{}, nil)
	if err != nil {
		panic(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	defer srv.Shutdown(context.Background())

	resp, err := http.Post(ts.URL+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"toy","prompt":"are you there?","stream":true}`))
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "data: ") {
			fmt.Println(strings.Contains(line, `"text":"O"`), strings.Contains(line, `"text":"K"`), line == "data: [DONE]")
		}
	}
	// Output:
	// true false false
	// false true false
	// false false false
	// false false true
}
