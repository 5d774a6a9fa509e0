package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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

// TestSDKResponsesStore: a kept response is continued by the next
// (previous_response_id: its conversation, output included, before the new
// input; its instructions not carried), fetched and deleted, by its tenant
// alone; one asked store: false is not kept.
func TestSDKResponsesStore(t *testing.T) {
	cfg := testConfig()
	cfg.Models[0].ContextLength = 1024
	cfg.APIKeys = []string{"sk-a", "sk-b"}
	env := newEnv(t, cfg, nil)
	c, other := sdkClient(env, "sk-a"), sdkClient(env, "sk-b")
	first, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, Instructions: openai.String("Be terse."),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(first.RawJSON(), `"store":true`) {
		t.Error("a response not said kept")
	}
	next, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, PreviousResponseID: openai.String(first.ID),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("more")}})
	if err != nil {
		t.Fatal(err)
	}
	if want := "user: hi\nassistant: " + first.OutputText() + "\nuser: more\nassistant: "; next.OutputText() != want {
		t.Errorf("continued: %q, want %q", next.OutputText(), want)
	}
	if next.PreviousResponseID != first.ID || first.PreviousResponseID != "" {
		t.Errorf("previous_response_id: %q after %q, want %q after none", next.PreviousResponseID, first.PreviousResponseID, first.ID)
	}
	got, err := c.Responses.Get(t.Context(), first.ID, responses.ResponseGetParams{})
	if err != nil || got.ID != first.ID || got.OutputText() != first.OutputText() {
		t.Fatalf("get: %v, %+v", err, got)
	}
	var apiErr *openai.Error
	if _, err := other.Responses.Get(t.Context(), first.ID, responses.ResponseGetParams{}); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Errorf("another tenant's get: %v", err)
	}
	if _, err := other.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, PreviousResponseID: openai.String(first.ID),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}}); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Param != "previous_response_id" {
		t.Errorf("another tenant's continuation: %v", err)
	}
	if err := c.Responses.Delete(t.Context(), first.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Responses.Get(t.Context(), first.ID, responses.ResponseGetParams{}); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Errorf("get after delete: %v", err)
	}
	// A streamed response is kept as it completed.
	stream := c.Responses.NewStreaming(t.Context(), responses.ResponseNewParams{Model: testModel,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("streamed")}})
	var done responses.Response
	for stream.Next() {
		if ev := stream.Current(); ev.Type == "response.completed" {
			done = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Responses.Get(t.Context(), done.ID, responses.ResponseGetParams{}); err != nil || got.OutputText() != done.OutputText() || got.OutputText() == "" {
		t.Errorf("a streamed response: %v, %q, completed %q", err, got.OutputText(), done.OutputText())
	}
	unkept, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, Store: openai.Bool(false),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Responses.Get(t.Context(), unkept.ID, responses.ResponseGetParams{}); strings.Contains(unkept.RawJSON(), `"store":true`) || !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Errorf("store false: %s, get %v", unkept.RawJSON(), err)
	}
}

// TestResponseStoreBound: the oldest responses go first, and a tenant
// sees its own alone.
func TestResponseStoreBound(t *testing.T) {
	ctx := t.Context()
	mem := MemoryResponses(3)
	s := keptResponses{mem}
	for i := range 10 {
		if err := s.put(ctx, fmt.Sprint(i), &storedResponse{Tenant: "t"}); err != nil {
			t.Fatal(err)
		}
		if i == 5 {
			if ok, err := s.drop(ctx, "4", "u"); ok || err != nil {
				t.Fatal("another tenant's drop:", ok, err)
			}
			if ok, err := s.drop(ctx, "4", "t"); !ok || err != nil {
				t.Fatal("drop:", ok, err)
			}
		}
	}
	for i := range 10 {
		if v, err := s.get(ctx, fmt.Sprint(i), "t"); err != nil || (v != nil) != (i >= 7) {
			t.Errorf("response %d kept %v (%v)", i, v != nil, err)
		}
		if v, _ := s.get(ctx, fmt.Sprint(i), "u"); v != nil {
			t.Errorf("response %d seen by another tenant", i)
		}
	}
	m := mem.(*memoryResponses)
	if len(m.byID) != 3 || len(m.order) > 2*3+16 {
		t.Errorf("%d kept, %d ids in order", len(m.byID), len(m.order))
	}
}

// TestSharedResponseStore: gateways that share a store continue, fetch
// and delete each other's responses, with the conversation (tool calls
// included) as it was kept.
func TestSharedResponseStore(t *testing.T) {
	cfg := testConfig()
	cfg.Models[0].ContextLength = 1024
	cfg.Responses = MemoryResponses(16)
	a, b := sdkClient(newEnv(t, cfg, nil), "k"), sdkClient(newEnv(t, cfg, nil), "k")
	tools := []responses.ToolUnionParam{responses.ToolParamOfFunction("get_weather",
		map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}}, false)}
	first, err := a.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, Tools: tools,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(`<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>`)}})
	if err != nil {
		t.Fatal(err)
	}
	var call responses.ResponseFunctionToolCall
	for _, it := range first.Output {
		if it.Type == "function_call" {
			call = it.AsFunctionCall()
		}
	}
	if call.CallID == "" {
		t.Fatalf("no call in %s", first.RawJSON())
	}
	next, err := b.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, Tools: tools, PreviousResponseID: openai.String(first.ID),
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
			{OfFunctionCallOutput: &responses.ResponseInputItemFunctionCallOutputParam{CallID: param.NewOpt(call.CallID),
				Output: responses.ResponseInputItemFunctionCallOutputOutputUnionParam{OfString: param.NewOpt("-3")}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	want := "tools: get_weather\nuser:\nassistant: " + first.OutputText() + ` -> get_weather({"city": "Oslo"})` + "\ntool[" + call.CallID + "]: -3\nassistant: "
	if next.OutputText() != want {
		t.Errorf("continued on another gateway: %q, want %q", next.OutputText(), want)
	}
	if got, err := b.Responses.Get(t.Context(), first.ID, responses.ResponseGetParams{}); err != nil || got.RawJSON() != first.RawJSON() {
		t.Errorf("get on another gateway: %v\n%s\nwant\n%s", err, got.RawJSON(), first.RawJSON())
	}
	if err := b.Responses.Delete(t.Context(), first.ID); err != nil {
		t.Fatal(err)
	}
	var apiErr *openai.Error
	if _, err := a.Responses.Get(t.Context(), first.ID, responses.ResponseGetParams{}); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Errorf("get after a delete on another gateway: %v", err)
	}
}

// failingStore fails every call.
type failingStore struct{}

func (failingStore) Put(context.Context, string, []byte) error { return errors.New("store down") }
func (failingStore) Get(context.Context, string) ([]byte, bool, error) {
	return nil, false, errors.New("store down")
}
func (failingStore) Delete(context.Context, string) error { return errors.New("store down") }

// TestResponseStoreDown: a store that fails costs the answer nothing (it
// says it was not kept); reads of kept responses get a 503 that says why.
func TestResponseStoreDown(t *testing.T) {
	cfg := testConfig()
	cfg.Responses = failingStore{}
	c := sdkClient(newEnv(t, cfg, nil), "k")
	r, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}})
	if err != nil || r.OutputText() == "" || !strings.Contains(r.RawJSON(), `"store":false`) {
		t.Fatalf("answer with the store down: %v, %s", err, r.RawJSON())
	}
	var apiErr *openai.Error
	for name, call := range map[string]func() error{
		"get":    func() error { _, err := c.Responses.Get(t.Context(), r.ID, responses.ResponseGetParams{}); return err },
		"delete": func() error { return c.Responses.Delete(t.Context(), r.ID) },
		"continue": func() error {
			_, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, PreviousResponseID: openai.String(r.ID),
				Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}})
			return err
		},
	} {
		if err := call(); !errors.As(err, &apiErr) || apiErr.StatusCode != 503 || apiErr.Code != "response_store_unavailable" || !strings.Contains(apiErr.Message, "store down") {
			t.Errorf("%s with the store down: %v", name, err)
		}
	}
}

// TestSDKInputItems lists a continued response's input items through the
// official client: the first turn's message, its answer and call, then the
// call's output; newest first by default, a page at a time, the same ids
// on every read; bad parameters are 400s.
func TestSDKInputItems(t *testing.T) {
	cfg := testConfig()
	cfg.Models[0].ContextLength = 1024
	env := newEnv(t, cfg, nil)
	c := sdkClient(env, "k")
	tools := []responses.ToolUnionParam{responses.ToolParamOfFunction("get_weather",
		map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}}, false)}
	first, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, Tools: tools, Instructions: openai.String("Be terse."),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(`<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>`)}})
	if err != nil {
		t.Fatal(err)
	}
	call := first.Output[len(first.Output)-1].AsFunctionCall()
	next, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, Tools: tools, PreviousResponseID: openai.String(first.ID),
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
			{OfFunctionCallOutput: &responses.ResponseInputItemFunctionCallOutputParam{CallID: param.NewOpt(call.CallID),
				Output: responses.ResponseInputItemFunctionCallOutputOutputUnionParam{OfString: param.NewOpt("-3")}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	list := func(p responses.InputItemListParams) []responses.ResponseItemUnion {
		t.Helper()
		pages := c.Responses.InputItems.ListAutoPaging(t.Context(), next.ID, p)
		var items []responses.ResponseItemUnion
		for pages.Next() {
			items = append(items, pages.Current())
		}
		if err := pages.Err(); err != nil {
			t.Fatal(err)
		}
		return items
	}
	asc := list(responses.InputItemListParams{Order: responses.InputItemListParamsOrderAsc})
	type item struct {
		Type, Role, Name, Arguments, Output string
		CallID                              string `json:"call_id"`
		Content                             []struct{ Type, Text string }
	}
	var got []item
	var kinds []string
	for _, it := range asc {
		var v item
		if err := json.Unmarshal([]byte(it.RawJSON()), &v); err != nil {
			t.Fatal(err)
		}
		got = append(got, v)
		kinds = append(kinds, v.Type+"/"+v.Role)
	}
	if want := []string{"message/user", "message/assistant", "function_call/", "function_call_output/"}; !slices.Equal(kinds, want) {
		t.Fatalf("items %v, want %v", kinds, want)
	}
	if got[0].Content[0].Text != `<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>` || got[0].Content[0].Type != "input_text" ||
		got[1].Content[0].Text != first.OutputText() || got[1].Content[0].Type != "output_text" ||
		got[2].CallID != call.CallID || got[2].Name != "get_weather" || got[2].Arguments != call.Arguments || got[3].CallID != call.CallID || got[3].Output != "-3" {
		t.Errorf("items %+v", got)
	}
	desc := list(responses.InputItemListParams{Limit: openai.Int(1)}) // one a page
	if len(desc) != len(asc) {
		t.Fatalf("%d items a page at a time, %d at once", len(desc), len(asc))
	}
	for i := range desc {
		if desc[i].ID != asc[len(asc)-1-i].ID || desc[i].ID == "" {
			t.Errorf("item %d: %q newest first, %q oldest first", i, desc[i].ID, asc[len(asc)-1-i].ID)
		}
	}
	var apiErr *openai.Error
	for _, p := range []responses.InputItemListParams{{Limit: openai.Int(101)}, {Order: "up"}, {After: openai.String("msg_nope")}} {
		if _, err := c.Responses.InputItems.List(t.Context(), next.ID, p); !errors.As(err, &apiErr) || apiErr.StatusCode != 400 {
			t.Errorf("%+v: %v", p, err)
		}
	}
	if _, err := c.Responses.InputItems.List(t.Context(), "resp_none", responses.InputItemListParams{}); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Errorf("an unknown response: %v", err)
	}
}

// TestResponsesTruncation: a continued conversation past the context is
// refused with truncation disabled (the default), and with "auto" loses
// its oldest turns, the fewest that make it fit, the new input kept; the
// response says which truncation it took, and its kept conversation is the
// one the model saw.
func TestResponsesTruncation(t *testing.T) {
	cfg := testConfig() // a context of 256 tokens, a byte a token
	env := newEnv(t, cfg, nil)
	c := sdkClient(env, "k")
	say := func(prev, text string, trunc responses.ResponseNewParamsTruncation) (*responses.Response, error) {
		p := responses.ResponseNewParams{Model: testModel, MaxOutputTokens: openai.Int(8), Truncation: trunc,
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(text)}}
		if prev != "" {
			p.PreviousResponseID = openai.String(prev)
		}
		return c.Responses.New(t.Context(), p)
	}
	a, b, cc := strings.Repeat("a", 90), strings.Repeat("b", 90), strings.Repeat("c", 90)
	first, err := say("", a, "")
	if err != nil {
		t.Fatal(err)
	}
	second, err := say(first.ID, b, "")
	if err != nil {
		t.Fatal(err)
	}
	var apiErr *openai.Error
	if _, err := say(second.ID, cc, ""); !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Code != "context_length_exceeded" {
		t.Fatalf("past the context, not truncated: %v", err)
	}
	third, err := say(second.ID, cc, responses.ResponseNewParamsTruncationAuto)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(third.RawJSON(), `"truncation":"auto"`) || !strings.Contains(second.RawJSON(), `"truncation":"disabled"`) {
		t.Errorf("truncation named %s / %s", third.RawJSON(), second.RawJSON())
	}
	// The model saw the second turn and the new input, not the first.
	req := env.backend.reqs[len(env.backend.reqs)-1]
	seen := string(toBytes(req.Prompt))
	if strings.Contains(seen, a) || !strings.Contains(seen, b) || !strings.Contains(seen, cc) {
		t.Errorf("the model saw %q", seen)
	}
	items := c.Responses.InputItems.ListAutoPaging(t.Context(), third.ID, responses.InputItemListParams{Order: responses.InputItemListParamsOrderAsc})
	n := 0
	for items.Next() {
		n++
	}
	if items.Err() != nil || n != 3 {
		t.Errorf("the kept conversation has %d items (%v), want the second turn's two and the input", n, items.Err())
	}
	if _, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, Truncation: "sometimes",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}}); !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "truncation" {
		t.Errorf("an unknown truncation: %v", err)
	}
	// A single input past the context stays refused.
	if _, err := say("", strings.Repeat("d", 300), responses.ResponseNewParamsTruncationAuto); !errors.As(err, &apiErr) || apiErr.Code != "context_length_exceeded" {
		t.Errorf("an input alone past the context: %v", err)
	}
}

// TestSDKInputTokens: the official client's input token count of a
// Responses request is the prompt /v1/responses gives the model (its
// instructions, tools, previous conversation and input through the
// template), as /tokenize counts the same conversation; the model may be
// left out; an input longer than the context is counted; an unknown model
// and a previous response not kept are refused.
func TestSDKInputTokens(t *testing.T) {
	cfg := testConfig()
	cfg.Responses = MemoryResponses(8)
	be := &echoBackend{reply: "ok"}
	env := newEnv(t, cfg, be)
	c := sdkClient(env, "unused")
	tools := []responses.ToolUnionParam{responses.ToolParamOfFunction("get_time", map[string]any{"type": "object"}, false)}
	got, err := c.Responses.InputTokens.Count(t.Context(), responses.InputTokenCountParams{Model: openai.String(testModel),
		Instructions: openai.String("be brief"), Tools: tools,
		Input: responses.InputTokenCountParamsInputUnion{OfString: openai.String("what time is it?")}})
	if err != nil {
		t.Fatal(err)
	}
	status, _, raw := post(t, env, "/tokenize", `{"model":"echo-1","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"what time is it?"}],`+
		`"tools":[{"type":"function","function":{"name":"get_time","parameters":{"type":"object"}}}]}`, nil)
	var tok tokenizeResponse
	if status != 200 || json.Unmarshal(raw, &tok) != nil || got.InputTokens != int64(tok.Count) || tok.Count == 0 {
		t.Fatalf("input tokens %d (%s); /tokenize %d %s", got.InputTokens, got.RawJSON(), status, raw)
	}
	// As the model gets it from /v1/responses.
	first, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, Instructions: openai.String("be brief"), Tools: tools,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("what time is it?")}})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(be.requests()[0].Prompt); int64(n) != got.InputTokens || first.Usage.InputTokens != got.InputTokens {
		t.Errorf("the model got %d prompt tokens (usage %d), counted %d", n, first.Usage.InputTokens, got.InputTokens)
	}
	// After a previous response, the model left out.
	next, err := c.Responses.InputTokens.Count(t.Context(), responses.InputTokenCountParams{PreviousResponseID: openai.String(first.ID),
		Input: responses.InputTokenCountParamsInputUnion{OfString: openai.String("and now?")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, PreviousResponseID: openai.String(first.ID),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("and now?")}}); err != nil {
		t.Fatal(err)
	}
	if n := len(be.requests()[1].Prompt); int64(n) != next.InputTokens {
		t.Errorf("continued: the model got %d prompt tokens, counted %d", n, next.InputTokens)
	}
	// Longer than the context: counted all the same.
	long, err := c.Responses.InputTokens.Count(t.Context(), responses.InputTokenCountParams{
		Input: responses.InputTokenCountParamsInputUnion{OfString: openai.String(strings.Repeat("x", 2*cfg.Models[0].ContextLength))}})
	if err != nil || long.InputTokens <= int64(cfg.Models[0].ContextLength) {
		t.Errorf("an input past the context: %v, %v", long, err)
	}
	_, err = c.Responses.InputTokens.Count(t.Context(), responses.InputTokenCountParams{Model: openai.String("nope"),
		Input: responses.InputTokenCountParamsInputUnion{OfString: openai.String("x")}})
	wantAPIStatus(t, "an unknown model", err, 400)
	_, err = c.Responses.InputTokens.Count(t.Context(), responses.InputTokenCountParams{PreviousResponseID: openai.String("resp_gone"),
		Input: responses.InputTokenCountParamsInputUnion{OfString: openai.String("x")}})
	wantAPIStatus(t, "a previous response not kept", err, 404)
}
