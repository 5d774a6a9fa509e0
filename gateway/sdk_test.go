package gateway

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

func sdkClient(env *testEnv, key string) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(env.ts.URL+"/v1/"),
		option.WithAPIKey(key),
		option.WithHTTPClient(env.client),
		option.WithMaxRetries(0),
	)
}

func TestSDKChatCompletion(t *testing.T) {
	env := newEnv(t, testConfig(), nil)
	c := sdkClient(env, "unused")
	ctx := t.Context()
	resp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:    testModel,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		Seed:     openai.Int(7),
	})
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	// The rendered prompt is "user: hi\nassistant: " and the backend echoes it once.
	want := "user: hi\nassistant: "
	if len(resp.Choices) != 1 {
		t.Fatalf("got %d choices, want 1", len(resp.Choices))
	}
	if got := resp.Choices[0].Message.Content; got != want {
		t.Errorf("content = %q, want %q", got, want)
	}
	if got := resp.Choices[0].FinishReason; got != "stop" {
		t.Errorf("finish_reason = %q, want stop", got)
	}
	if resp.Object != "chat.completion" || !strings.HasPrefix(resp.ID, "chatcmpl-") || resp.Model != testModel {
		t.Errorf("envelope = %q %q %q", resp.Object, resp.ID, resp.Model)
	}
	if resp.Usage.PromptTokens != int64(len(want)) || resp.Usage.CompletionTokens != int64(len(want)) || resp.Usage.TotalTokens != 2*int64(len(want)) {
		t.Errorf("usage = %+v, want %d prompt and %d completion", resp.Usage, len(want), len(want))
	}
	reqs := env.backend.requests()
	if len(reqs) != 1 || reqs[0].Seed == nil || *reqs[0].Seed != 7 || reqs[0].Model != testModel {
		t.Errorf("backend saw %+v, want one request with seed 7", reqs)
	}
}

func TestSDKChatStreamingWithUsage(t *testing.T) {
	env := newEnv(t, testConfig(), nil)
	c := sdkClient(env, "unused")
	stream := c.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
		Model:         testModel,
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage("abc")},
		MaxTokens:     openai.Int(5),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	var (
		text      strings.Builder
		chunks    int
		finish    string
		gotUsage  *openai.CompletionUsage
		roleFirst bool
	)
	for stream.Next() {
		ch := stream.Current()
		chunks++
		if len(ch.Choices) == 0 {
			u := ch.Usage
			gotUsage = &u
			continue
		}
		if chunks == 1 && ch.Choices[0].Delta.Role == "assistant" {
			roleFirst = true
		}
		text.WriteString(ch.Choices[0].Delta.Content)
		if ch.Choices[0].FinishReason != "" {
			finish = ch.Choices[0].FinishReason
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if got, want := text.String(), "syste"; got != want {
		t.Errorf("streamed %q, want %q", got, want)
	}
	if finish != "length" {
		t.Errorf("finish_reason = %q, want length", finish)
	}
	if !roleFirst {
		t.Error("first chunk does not carry role assistant")
	}
	if gotUsage == nil || gotUsage.CompletionTokens != 5 || gotUsage.PromptTokens != int64(len("system: be brief\nuser: abc\nassistant: ")) {
		t.Errorf("usage chunk = %+v", gotUsage)
	}
}

func TestSDKCompletions(t *testing.T) {
	env := newEnv(t, testConfig(), nil)
	c := sdkClient(env, "unused")
	ctx := t.Context()

	t.Run("string", func(t *testing.T) {
		resp, err := c.Completions.New(ctx, openai.CompletionNewParams{
			Model:     testModel,
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("hello world")},
			MaxTokens: openai.Int(4),
		})
		if err != nil {
			t.Fatalf("completion: %v", err)
		}
		if got := resp.Choices[0].Text; got != "hell" {
			t.Errorf("text = %q, want hell", got)
		}
		if resp.Choices[0].FinishReason != "length" || resp.Usage.CompletionTokens != 4 || resp.Usage.PromptTokens != 11 {
			t.Errorf("finish %q usage %+v", resp.Choices[0].FinishReason, resp.Usage)
		}
	})
	t.Run("token arrays and n", func(t *testing.T) {
		resp, err := c.Completions.New(ctx, openai.CompletionNewParams{
			Model:  testModel,
			Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfTokenArrays: [][]int64{{'a', 'b'}, {'x', 'y', 'z'}}},
			N:      openai.Int(2),
		})
		if err != nil {
			t.Fatalf("completion: %v", err)
		}
		want := []string{"ab", "ab", "xyz", "xyz"}
		if len(resp.Choices) != len(want) {
			t.Fatalf("got %d choices, want %d", len(resp.Choices), len(want))
		}
		for i, ch := range resp.Choices {
			if ch.Index != int64(i) || ch.Text != want[i] {
				t.Errorf("choice %d = (%d, %q), want (%d, %q)", i, ch.Index, ch.Text, i, want[i])
			}
		}
		if resp.Usage.PromptTokens != 5 || resp.Usage.CompletionTokens != 10 {
			t.Errorf("usage = %+v, want 5 prompt (each prompt once) and 10 completion", resp.Usage)
		}
	})
	t.Run("stop", func(t *testing.T) {
		resp, err := c.Completions.New(ctx, openai.CompletionNewParams{
			Model:  testModel,
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hello world")},
			Stop:   openai.CompletionNewParamsStopUnion{OfStringArray: []string{"xx", " wor"}},
		})
		if err != nil {
			t.Fatalf("completion: %v", err)
		}
		if got := resp.Choices[0].Text; got != "hello" || resp.Choices[0].FinishReason != "stop" {
			t.Errorf("text %q finish %q, want hello and stop", got, resp.Choices[0].FinishReason)
		}
	})
	t.Run("logprobs", func(t *testing.T) {
		resp, err := c.Completions.New(ctx, openai.CompletionNewParams{
			Model:    testModel,
			Prompt:   openai.CompletionNewParamsPromptUnion{OfString: openai.String("ab")},
			Logprobs: openai.Int(2),
		})
		if err != nil {
			t.Fatalf("completion: %v", err)
		}
		lp := resp.Choices[0].Logprobs
		if len(lp.Tokens) != 2 || lp.Tokens[1] != "b" || lp.TokenLogprobs[0] != -0.5 || lp.TextOffset[1] != 1 || len(lp.TopLogprobs[0]) != 2 {
			t.Errorf("logprobs = %+v", lp)
		}
	})
}

func TestSDKCompletionStreamingStopAcrossTokens(t *testing.T) {
	env := newEnv(t, testConfig(), nil)
	c := sdkClient(env, "unused")
	stream := c.Completions.NewStreaming(t.Context(), openai.CompletionNewParams{
		Model:  testModel,
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("one two three")},
		Stop:   openai.CompletionNewParamsStopUnion{OfString: openai.String("two")},
		N:      openai.Int(2),
	})
	texts := map[int64]*strings.Builder{0: {}, 1: {}}
	finishes := map[int64]string{}
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			texts[ch.Index].WriteString(ch.Text)
			if ch.FinishReason != "" {
				finishes[ch.Index] = string(ch.FinishReason)
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	for i := range int64(2) {
		if got := texts[i].String(); got != "one " || finishes[i] != "stop" {
			t.Errorf("choice %d: %q finish %q, want \"one \" and stop", i, got, finishes[i])
		}
	}
	reqs := env.backend.requests()
	if len(reqs) != 2 || len(reqs[0].Stop) != 1 || reqs[0].Stop[0] != "two" {
		t.Errorf("backend requests = %+v", reqs)
	}
}

func TestSDKChatLogprobs(t *testing.T) {
	env := newEnv(t, testConfig(), nil)
	c := sdkClient(env, "unused")
	resp, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
		Model:       testModel,
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage("q")},
		MaxTokens:   openai.Int(2),
		Logprobs:    openai.Bool(true),
		TopLogprobs: openai.Int(1),
	})
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	lp := resp.Choices[0].Logprobs.Content
	if len(lp) != 2 || lp[0].Token != "u" || lp[0].Logprob != -0.5 || len(lp[0].TopLogprobs) != 1 || lp[0].TopLogprobs[0].Token != "u" {
		t.Errorf("logprobs = %+v", lp)
	}
}

func TestSDKErrors(t *testing.T) {
	cfg := testConfig()
	cfg.MaxN = 4
	env := newEnv(t, cfg, nil)
	c := sdkClient(env, "unused")
	ctx := t.Context()
	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}
	tests := []struct {
		name      string
		call      func() error
		status    int
		param     string
		code      string
		inMessage []string
	}{
		{"unknown model", func() error {
			_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-nope", Messages: msgs})
			return err
		}, 400, "model", "model_not_found", []string{`"gpt-nope"`, testModel}},
		{"context length", func() error {
			_, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: testModel,
				Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(strings.Repeat("a", 200))}, MaxTokens: openai.Int(100)})
			return err
		}, 400, "max_tokens", "context_length_exceeded", []string{"256", "300", "200", "100"}},
		{"n too large", func() error {
			_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: testModel, Messages: msgs, N: openai.Int(5)})
			return err
		}, 400, "n", "invalid_value", []string{"5", "1 to 4"}},
		{"temperature", func() error {
			_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: testModel, Messages: msgs, Temperature: openai.Float(2.5)})
			return err
		}, 400, "temperature", "invalid_value", []string{"2.5"}},
		{"too many stops", func() error {
			_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: testModel, Messages: msgs,
				Stop: openai.ChatCompletionNewParamsStopUnion{OfStringArray: []string{"a", "b", "c", "d", "e"}}})
			return err
		}, 400, "stop", "invalid_value", []string{"at most 4"}},
		{"max_tokens zero", func() error {
			_, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: testModel,
				Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}, MaxTokens: openai.Int(0), Seed: openai.Int(1), Temperature: openai.Float(0)})
			return err
		}, 400, "max_tokens", "invalid_value", []string{"at least 1"}},
		{"presence penalty", func() error {
			_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: testModel, Messages: msgs, PresencePenalty: openai.Float(-2.5)})
			return err
		}, 400, "presence_penalty", "invalid_value", []string{"-2 to 2"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("got %v, want *openai.Error", err)
			}
			if apiErr.StatusCode != tc.status || apiErr.Param != tc.param || apiErr.Code != tc.code || apiErr.Type != typeInvalidRequest {
				t.Errorf("got status %d param %q code %q type %q, want %d %q %q", apiErr.StatusCode, apiErr.Param, apiErr.Code, apiErr.Type, tc.status, tc.param, tc.code)
			}
			for _, s := range tc.inMessage {
				if !strings.Contains(apiErr.Message, s) {
					t.Errorf("message %q does not mention %q", apiErr.Message, s)
				}
			}
		})
	}
}

func TestSDKModels(t *testing.T) {
	env := newEnv(t, testConfig(), nil)
	c := sdkClient(env, "unused")
	page, err := c.Models.List(t.Context())
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	if len(page.Data) != 1 || page.Data[0].ID != testModel || page.Data[0].OwnedBy != "troupe" || page.Data[0].Created != 1700000000 {
		t.Errorf("models = %+v", page.Data)
	}
	m, err := c.Models.Get(t.Context(), testModel)
	if err != nil || m.ID != testModel {
		t.Errorf("get = %+v, %v", m, err)
	}
	_, err = c.Models.Get(t.Context(), "nope")
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" {
		t.Errorf("get unknown = %v, want 404 model_not_found", err)
	}
}

func TestSDKOverloadedBackend(t *testing.T) {
	b := &echoBackend{}
	b.overloaded.Store(true)
	env := newEnv(t, testConfig(), b)
	c := sdkClient(env, "unused")
	var resp *http.Response
	_, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
		Model: testModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	}, option.WithResponseInto(&resp))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Code != "backend_overloaded" {
		t.Fatalf("got %v, want 429 backend_overloaded", err)
	}
	if got := apiErr.Response.Header.Get("Retry-After"); got != "3" {
		t.Errorf("Retry-After = %q, want 3 (from the backend)", got)
	}
	// Streaming: the overload happens before any token, so it is still a plain 429.
	stream := c.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
		Model: testModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	for stream.Next() {
	}
	if !errors.As(stream.Err(), &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests {
		t.Errorf("stream err = %v, want 429", stream.Err())
	}

}

// TestSDKCachedTokens: the prompt tokens a backend found cached reach the
// official client as usage's cached tokens: chat's prompt_tokens_details
// (a prompt counted once however many choices, each prompt of a
// completion counted), and a response's input_tokens_details.
func TestSDKCachedTokens(t *testing.T) {
	env := newEnv(t, testConfig(), &echoBackend{cached: 3})
	c := sdkClient(env, "unused")
	chat, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: testModel, N: openai.Int(2),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello there")}})
	if err != nil {
		t.Fatal(err)
	}
	if got := chat.Usage.PromptTokensDetails.CachedTokens; got != 3 {
		t.Errorf("chat with n=2: cached tokens %d, want 3 (%s)", got, chat.Usage.RawJSON())
	}
	comp, err := c.Completions.New(t.Context(), openai.CompletionNewParams{Model: openai.CompletionNewParamsModel(testModel),
		Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfStrings: []string{"one prompt", "two prompt"}}, MaxTokens: openai.Int(2)})
	if err != nil {
		t.Fatal(err)
	}
	if got := comp.Usage.PromptTokensDetails.CachedTokens; got != 6 {
		t.Errorf("two prompts: cached tokens %d, want 6 (%s)", got, comp.Usage.RawJSON())
	}
	resp, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello there")}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Usage.InputTokensDetails.CachedTokens; got != 3 {
		t.Errorf("response: cached tokens %d, want 3 (%s)", got, resp.Usage.RawJSON())
	}
}
