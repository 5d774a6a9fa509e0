package gateway

import (
	"errors"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/openai/openai-go/v3/responses"
)

// TestSDKResponses drives /v1/responses with the official client: the
// instructions and input reach the template as chat messages and the echo
// model's text comes back as the response's message, whole and streamed
// event by event, with usage; max_output_tokens cuts it to an incomplete
// response.
func TestSDKResponses(t *testing.T) {
	env := newEnv(t, testConfig(), nil)
	c := sdkClient(env, "unused")
	want := "system: Be terse.\nuser: hi\nassistant: "
	params := responses.ResponseNewParams{
		Model:        testModel,
		Instructions: openai.String("Be terse."),
		Input:        responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")},
	}
	resp, err := c.Responses.New(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	if resp.OutputText() != want || resp.Status != "completed" || !strings.HasPrefix(resp.ID, "resp_") || resp.Model != testModel {
		t.Errorf("response %q (%s, %s, %s)", resp.OutputText(), resp.Status, resp.ID, resp.Model)
	}
	if u := resp.Usage; u.InputTokens != int64(len(want)) || u.OutputTokens != int64(len(want)) || u.TotalTokens != 2*int64(len(want)) {
		t.Errorf("usage %+v", u)
	}
	if len(resp.Output) != 1 || resp.Output[0].Type != "message" || resp.Output[0].Role != "assistant" {
		t.Errorf("output %+v", resp.Output)
	}

	stream := c.Responses.NewStreaming(t.Context(), params)
	var deltas strings.Builder
	var types []string
	var done responses.Response
	for stream.Next() {
		ev := stream.Current()
		types = append(types, ev.Type)
		switch ev.Type {
		case "response.output_text.delta":
			deltas.WriteString(ev.Delta)
		case "response.completed":
			done = ev.Response
		}
		if ev.SequenceNumber != int64(len(types)-1) {
			t.Errorf("event %d (%s) numbered %d", len(types)-1, ev.Type, ev.SequenceNumber)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if deltas.String() != want || done.OutputText() != want || done.Status != "completed" || done.Usage.OutputTokens != int64(len(want)) {
		t.Errorf("streamed %q, completed %q (%s)", deltas.String(), done.OutputText(), done.Status)
	}
	head := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added", "response.output_text.delta"}
	tail := []string{"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"}
	if len(types) < len(head)+len(tail) || strings.Join(types[:len(head)], ",") != strings.Join(head, ",") || strings.Join(types[len(types)-len(tail):], ",") != strings.Join(tail, ",") {
		t.Errorf("events %v", types)
	}

	params.MaxOutputTokens = openai.Int(4)
	resp, err = c.Responses.New(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != "incomplete" || resp.IncompleteDetails.Reason != "max_output_tokens" || resp.OutputText() != want[:4] || resp.Output[0].Status != "incomplete" {
		t.Errorf("cut: %s (%s), %q", resp.Status, resp.IncompleteDetails.Reason, resp.OutputText())
	}
}

// TestSDKResponsesTools: function tools, calls sent back as function_call
// items with their outputs, and the model's calls as function_call output
// items, whole and streamed.
func TestSDKResponsesTools(t *testing.T) {
	cfg := testConfig()
	cfg.Models[0].ContextLength = 1024 // the echo repeats the whole conversation
	env := newEnv(t, cfg, nil)
	c := sdkClient(env, "unused")
	tools := []responses.ToolUnionParam{responses.ToolParamOfFunction("get_weather",
		map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}}, false)}
	call := `<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>`
	params := responses.ResponseNewParams{
		Model: testModel, Tools: tools,
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
			responses.ResponseInputItemParamOfMessage("w?", responses.EasyInputMessageRoleUser),
			responses.ResponseInputItemParamOfFunctionCall(`{"city":"Rome"}`, "call_1", "get_weather"),
			{OfFunctionCallOutput: &responses.ResponseInputItemFunctionCallOutputParam{CallID: param.NewOpt("call_1"),
				Output: responses.ResponseInputItemFunctionCallOutputOutputUnionParam{OfString: param.NewOpt("-3")}}},
			responses.ResponseInputItemParamOfMessage(call, responses.EasyInputMessageRoleUser),
		}},
	}
	resp, err := c.Responses.New(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	var calls []responses.ResponseFunctionToolCall
	text := ""
	for _, it := range resp.Output {
		switch it.Type {
		case "function_call":
			calls = append(calls, it.AsFunctionCall())
		case "message":
			text += it.AsMessage().Content[0].Text
		}
	}
	if len(calls) != 1 || calls[0].Name != "get_weather" || calls[0].Arguments != `{"city": "Oslo"}` || !strings.HasPrefix(calls[0].CallID, "call_") {
		t.Fatalf("calls %+v", calls)
	}
	if want := "tools: get_weather\nuser: w?\nassistant:  -> get_weather({\"city\":\"Rome\"})\ntool[call_1]: -3\nuser:\nassistant: "; text != want {
		t.Errorf("text %q, want %q", text, want)
	}

	stream := c.Responses.NewStreaming(t.Context(), params)
	var args, name, itemID string
	for stream.Next() {
		ev := stream.Current()
		switch ev.Type {
		case "response.output_item.added":
			if ev.Item.Type == "function_call" {
				name, itemID = ev.Item.Name, ev.Item.ID
			}
		case "response.function_call_arguments.delta":
			if ev.ItemID != itemID {
				t.Errorf("arguments for item %q, want %q", ev.ItemID, itemID)
			}
			args += ev.Delta
		case "response.output_text.delta":
			if strings.Contains(ev.Delta, "<tool") {
				t.Errorf("a call's text in the message: %q", ev.Delta)
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if name != "get_weather" || args != `{"city": "Oslo"}` {
		t.Errorf("streamed call %q(%s)", name, args)
	}
}

// TestResponsesBadRequests: what the Responses API spells differently is
// named so in the errors.
func TestResponsesBadRequests(t *testing.T) {
	env := newEnv(t, testConfig(), nil)
	c := sdkClient(env, "unused")
	for _, tc := range []struct {
		params responses.ResponseNewParams
		param  string
	}{
		{responses.ResponseNewParams{Model: testModel}, "input"},
		{responses.ResponseNewParams{Model: testModel, Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}, MaxOutputTokens: openai.Int(0)}, "max_output_tokens"},
		{responses.ResponseNewParams{Model: testModel, Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}, MaxOutputTokens: openai.Int(1000)}, "max_output_tokens"},
		{responses.ResponseNewParams{Model: testModel, Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}, PreviousResponseID: openai.String("resp_1")}, "previous_response_id"},
		{responses.ResponseNewParams{Model: "nope", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}}, "model"},
		{responses.ResponseNewParams{Model: testModel, Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
			responses.ResponseInputItemParamOfMessage("fail-template", responses.EasyInputMessageRoleUser)}}}, "input"},
	} {
		_, err := c.Responses.New(t.Context(), tc.params)
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != tc.param {
			t.Errorf("%+v: %v, want a 400 naming %s", tc.params, err, tc.param)
		}
	}
}
