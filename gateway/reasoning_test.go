package gateway

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
)

// TestThinkSplit: a thinking model's text parts into reasoning and
// content, where the answer opens <think> itself or the prompt did.
func TestThinkSplit(t *testing.T) {
	for _, c := range []struct {
		text               string
		inThink            bool
		reasoning, content string
	}{
		{"<think>\nI add.\n</think>\n\nFour.", false, "I add.", "Four."},
		{"I add.\n</think>\n\nFour.", true, "I add.", "Four."},
		{"\n<think>\n\n</think>\n\nFour.", false, "", "Four."},
		{"Four.", false, "", "Four."},
		{"Four. </think> x", false, "", "Four. </think> x"},
		{"<think>cut sh", false, "cut sh", ""},
		{"  <thi", false, "", "  <thi"},
		{"", true, "", ""},
	} {
		j := &job{model: ModelInfo{Reasoning: true}, inThink: c.inThink}
		r, ct := j.split(c.text)
		if r != c.reasoning || ct != c.content {
			t.Errorf("%q (in think %v): %q, %q; want %q, %q", c.text, c.inThink, r, ct, c.reasoning, c.content)
		}
		if r, ct := (&job{}).split(c.text); r != "" || ct != c.text {
			t.Errorf("%q, a model that does not think: %q, %q", c.text, r, ct)
		}
	}
}

// FuzzThinkSplit: the text whole and in pieces parts alike.
func FuzzThinkSplit(f *testing.F) {
	f.Add("<think>\na b\n</think>\n\nc", uint8(3), false)
	f.Add("x </thi nk> </think>  y", uint8(1), true)
	f.Fuzz(func(t *testing.T, text string, piece uint8, inThink bool) {
		j := &job{model: ModelInfo{Reasoning: true}, inThink: inThink}
		wr, wc := j.split(text)
		s := j.newThinkStream()
		var r, c strings.Builder
		n := int(piece%16) + 1
		for i := 0; i < len(text); i += n {
			a, b := s.push(text[i:min(i+n, len(text))])
			r.WriteString(a)
			c.WriteString(b)
		}
		a, b := s.end()
		r.WriteString(a)
		c.WriteString(b)
		if r.String() != wr || c.String() != wc {
			t.Fatalf("%q in pieces of %d: %q, %q; whole %q, %q", text, n, r.String(), c.String(), wr, wc)
		}
	})
}

// TestReasoningContent: a thinking model's chat answers carry the
// reasoning as reasoning_content, whole and streamed, with the calls read
// from the content alone; a response carries it as a reasoning item.
func TestReasoningContent(t *testing.T) {
	cfg := testConfig()
	cfg.Models[0].Reasoning = true
	reply := "<think>\nCall it.\n</think>\n\nSure. <tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>"
	env := newEnv(t, cfg, &echoBackend{reply: reply})
	body := `{"model":"echo-1","messages":[{"role":"user","content":"t?"}],"tools":[` + timeTool + `]`
	status, _, raw := post(t, env, "/v1/chat/completions", body+`}`, nil)
	if status != 200 {
		t.Fatalf("%d %s", status, raw)
	}
	var out struct {
		Choices []struct {
			Message struct {
				Content          *string       `json:"content"`
				ReasoningContent *string       `json:"reasoning_content"`
				ToolCalls        []toolCallOut `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	m := out.Choices[0].Message
	if m.ReasoningContent == nil || *m.ReasoningContent != "Call it." || m.Content == nil || *m.Content != "Sure." || out.Choices[0].FinishReason != "tool_calls" {
		t.Errorf("message %s", raw)
	}
	// The reasoning's tokens, a byte each here: "<think>\nCall it.\n</think>".
	if d := out.Usage.CompletionTokensDetails; d == nil || d.ReasoningTokens != len("<think>\nCall it.\n</think>") {
		t.Errorf("usage %s: want %d reasoning tokens", raw, len("<think>\nCall it.\n</think>"))
	}
	sameCalls(t, "whole", m.ToolCalls, [2]string{"get_time", "{}"})

	status, _, raw = post(t, env, "/v1/chat/completions", body+`,"stream":true}`, nil)
	if status != 200 {
		t.Fatalf("%d %s", status, raw)
	}
	var reasoning, content strings.Builder
	sseData(raw, func(data []byte) {
		var ch struct {
			Choices []struct {
				Delta chatDelta `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(data, &ch); err != nil {
			t.Fatal(err)
		}
		for _, c := range ch.Choices {
			if c.Delta.ReasoningContent != nil {
				reasoning.WriteString(*c.Delta.ReasoningContent)
			}
			if c.Delta.Content != nil {
				content.WriteString(*c.Delta.Content)
			}
		}
	})
	if reasoning.String() != "Call it." || content.String() != "Sure." {
		t.Errorf("streamed reasoning %q, content %q", reasoning.String(), content.String())
	}

	c := sdkClient(env, "unused")
	resp, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("t?")},
		Tools: []responses.ToolUnionParam{responses.ToolParamOfFunction("get_time", map[string]any{"type": "object"}, false)}})
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, it := range resp.Output {
		types = append(types, it.Type)
	}
	if strings.Join(types, ",") != "reasoning,message,function_call" || resp.Output[0].AsReasoning().Content[0].Text != "Call it." || resp.OutputText() != "Sure." {
		t.Errorf("response %s", resp.RawJSON())
	}
	if got := resp.Usage.OutputTokensDetails.ReasoningTokens; got != int64(len("<think>\nCall it.\n</think>")) {
		t.Errorf("response usage %s", resp.Usage.RawJSON())
	}
	stream := c.Responses.NewStreaming(t.Context(), responses.ResponseNewParams{Model: testModel,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("t?")}})
	var streamed strings.Builder
	for stream.Next() {
		if ev := stream.Current(); ev.Type == "response.reasoning_text.delta" {
			streamed.WriteString(ev.Delta)
		}
	}
	if err := stream.Err(); err != nil || streamed.String() != "Call it." {
		t.Errorf("streamed reasoning %q: %v", streamed.String(), err)
	}
}

// TestReasoningSentBack: a thinking model's reasoning sent back with its
// turn, as a Responses reasoning item (a response's output passed back as
// input, as a stateless client does) or as a chat message's
// reasoning_content, reaches the chat template with the assistant's turn
// it came before; one with no assistant's turn after it is dropped; a
// kept response's conversation keeps its reasoning, which its input items
// list; a client that keeps no response gets the reasoning sealed into
// encrypted_content and passes that back alone (another service's is
// dropped); a reasoning_content on another role is refused.
func TestReasoningSentBack(t *testing.T) {
	cfg := testConfig()
	cfg.Models[0].Reasoning = true
	cfg.Responses = MemoryResponses(16)
	reply := "<think>\nCall it.\n</think>\n\nSure. <tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>"
	be := &echoBackend{reply: reply}
	env := newEnv(t, cfg, be)
	c := sdkClient(env, "unused")
	tools := []responses.ToolUnionParam{responses.ToolParamOfFunction("get_time", map[string]any{"type": "object"}, false)}
	first, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, Tools: tools,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("t?")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Output) != 3 {
		t.Fatalf("output %s", first.RawJSON())
	}
	rs, msg, fc := first.Output[0].AsReasoning().ToParam(), first.Output[1].AsMessage().ToParam(), first.Output[2].AsFunctionCall().ToParam()
	lost := responses.ResponseReasoningItemParam{ID: "rs_lost", Summary: []responses.ResponseReasoningItemSummaryParam{{Text: "Never said."}}}
	input := responses.ResponseInputParam{
		{OfReasoning: &lost}, // before a user's turn: dropped
		responses.ResponseInputItemParamOfMessage("t?", responses.EasyInputMessageRoleUser),
		{OfReasoning: &rs}, {OfOutputMessage: &msg}, {OfFunctionCall: &fc},
		{OfFunctionCallOutput: &responses.ResponseInputItemFunctionCallOutputParam{CallID: openai.String(first.Output[2].AsFunctionCall().CallID),
			Output: responses.ResponseInputItemFunctionCallOutputOutputUnionParam{OfString: openai.String("12:00")}}},
	}
	next, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, Tools: tools,
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: input}})
	if err != nil {
		var ae *openai.Error
		if errors.As(err, &ae) {
			t.Fatal(ae.Message)
		}
		t.Fatal(err)
	}
	prompt := be.lastPrompt(t)
	if !strings.Contains(prompt, "assistant (thought: Call it.): Sure.\n") || strings.Contains(prompt, "Never said") {
		t.Errorf("prompt %q: want the reasoning with the assistant's turn after it, the lost one dropped", prompt)
	}
	// Reasoning before calls alone goes with them.
	input = responses.ResponseInputParam{responses.ResponseInputItemParamOfMessage("t?", responses.EasyInputMessageRoleUser),
		{OfReasoning: &rs}, {OfFunctionCall: &fc}}
	if _, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, Tools: tools,
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: input}}); err != nil {
		t.Fatal(err)
	}
	if prompt := be.lastPrompt(t); !strings.Contains(prompt, "assistant (thought: Call it.):  -> get_time({})") {
		t.Errorf("prompt %q: want the reasoning with the calls after it", prompt)
	}
	// A kept response continued: its reasoning is in the conversation.
	if _, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, PreviousResponseID: openai.String(next.ID),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("and now?")}}); err != nil {
		t.Fatal(err)
	}
	if prompt := be.lastPrompt(t); strings.Count(prompt, "(thought: Call it.)") != 2 {
		t.Errorf("prompt %q: want the reasoning of both earlier turns", prompt)
	}
	pages := c.Responses.InputItems.ListAutoPaging(t.Context(), next.ID, responses.InputItemListParams{Order: responses.InputItemListParamsOrderAsc})
	var kinds []string
	for pages.Next() {
		kinds = append(kinds, pages.Current().Type)
	}
	if err := pages.Err(); err != nil || strings.Join(kinds, ",") != "message,reasoning,message,function_call,function_call_output" {
		t.Errorf("input items %v (%v)", kinds, err)
	}

	// Sealed: a client that keeps no response asks for the reasoning's
	// encrypted_content and passes back that alone.
	sealed, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: testModel, Tools: tools, Store: openai.Bool(false),
		Include: []responses.ResponseIncludable{responses.ResponseIncludableReasoningEncryptedContent},
		Input:   responses.ResponseNewParamsInputUnion{OfString: openai.String("t?")}})
	if err != nil {
		t.Fatal(err)
	}
	enc := sealed.Output[0].AsReasoning().EncryptedContent
	if enc == "" || strings.Contains(enc, "Call it.") {
		t.Fatalf("encrypted_content %q", enc)
	}
	for _, c2 := range []struct {
		enc, want string
	}{{enc, "(thought: Call it.)"}, {"gAAAAABo-another-service", ""}} {
		body := `{"model":"echo-1","input":[{"role":"user","content":"t?"},{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"` + c2.enc + `"},` +
			`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Sure."}]},{"role":"user","content":"ok"}]}`
		if status, _, raw := post(t, env, "/v1/responses", body, nil); status != 200 {
			t.Fatalf("%d %s", status, raw)
		}
		prompt := be.lastPrompt(t)
		if c2.want != "" && !strings.Contains(prompt, c2.want) || c2.want == "" && strings.Contains(prompt, "thought") {
			t.Errorf("encrypted_content %q: prompt %q", c2.enc, prompt)
		}
	}

	// Chat: reasoning_content on an assistant's message.
	body := `{"model":"echo-1","messages":[{"role":"user","content":"t?"},{"role":"assistant","content":"Sure.","reasoning_content":"Call it."},{"role":"user","content":"ok"}]}`
	if status, _, raw := post(t, env, "/v1/chat/completions", body, nil); status != 200 {
		t.Fatalf("%d %s", status, raw)
	}
	if prompt := be.lastPrompt(t); !strings.Contains(prompt, "assistant (thought: Call it.): Sure.\n") {
		t.Errorf("chat prompt %q", prompt)
	}
	body = `{"model":"echo-1","messages":[{"role":"user","content":"t?","reasoning_content":"x"}]}`
	if status, _, raw := post(t, env, "/v1/chat/completions", body, nil); status != 400 || !strings.Contains(string(raw), "only an assistant's message has reasoning_content") {
		t.Errorf("reasoning_content on a user's message: %d %s", status, raw)
	}
}

// TestReasoningEffortNone: reasoning_effort "none" (chat and /tokenize)
// and reasoning {"effort": "none"} (responses) ask the template not to
// think
// (enable_thinking false), unless chat_template_kwargs say otherwise;
// other efforts change nothing, and unknown ones are refused by name.
func TestReasoningEffortNone(t *testing.T) {
	cfg := testConfig()
	cfg.Models[0].Reasoning = true
	be := &echoBackend{reply: "ok"}
	env := newEnv(t, cfg, be)
	for _, c := range []struct {
		path, extra string
		vars        string // the template's variables, "" for none
		bad         string // the parameter a 400 names
	}{
		{"/v1/chat/completions", `,"reasoning_effort":"none"`, "enable_thinking=false", ""},
		{"/v1/chat/completions", `,"reasoning_effort":"none","chat_template_kwargs":{"enable_thinking":true}`, "enable_thinking=true", ""},
		{"/v1/chat/completions", `,"reasoning_effort":"high"`, "", ""},
		{"/v1/chat/completions", `,"reasoning_effort":"max"`, "", "reasoning_effort"},
		{"/v1/responses", `,"reasoning":{"effort":"none","summary":"auto"}`, "enable_thinking=false", ""},
		{"/v1/responses", `,"reasoning":{"effort":"low"}`, "", ""},
		{"/v1/responses", `,"reasoning":{"effort":"bogus"}`, "", "reasoning.effort"},
	} {
		body := `{"model":"echo-1","messages":[{"role":"user","content":"t?"}]` + c.extra + `}`
		if c.path == "/v1/responses" {
			body = `{"model":"echo-1","input":"t?"` + c.extra + `}`
		}
		status, _, raw := post(t, env, c.path, body, nil)
		if c.bad != "" {
			if status != 400 || !strings.Contains(string(raw), `"param":"`+c.bad+`"`) {
				t.Errorf("%s %s: %d %s, want a 400 naming %s", c.path, c.extra, status, raw, c.bad)
			}
			continue
		}
		if status != 200 {
			t.Fatalf("%s %s: %d %s", c.path, c.extra, status, raw)
		}
		prompt := be.lastPrompt(t)
		if got := strings.HasPrefix(prompt, "vars: "+c.vars+"\n"); c.vars != "" && !got || c.vars == "" && strings.HasPrefix(prompt, "vars:") {
			t.Errorf("%s %s: prompt %q, want vars %q", c.path, c.extra, prompt, c.vars)
		}
	}
	// /tokenize counts the prompt the chat completion would have.
	status, _, raw := post(t, env, "/tokenize", `{"model":"echo-1","messages":[{"role":"user","content":"t?"}],"reasoning_effort":"none"}`, nil)
	var tok struct{ Tokens []int32 }
	if status != 200 || json.Unmarshal(raw, &tok) != nil || !strings.HasPrefix(byteTokenizer{}.Decode(tok.Tokens, false), "vars: enable_thinking=false\n") {
		t.Errorf("tokenize with reasoning_effort none: %d %s", status, raw)
	}
}

// TestReasoningTokens: the tokens of a reasoning are counted as they come:
// its opening, its text and its close, blanks before an opening with it,
// and nothing of an answer that does not think.
func TestReasoningTokens(t *testing.T) {
	for _, c := range []struct {
		tokens  []string
		inThink bool
		want    int
	}{
		{[]string{"<think>", "\n", "I", " add", ".", "\n", "</think>", "\n\n", "Four", "."}, false, 7},
		{[]string{"<", "think", ">", "x", "</", "think", ">", "y"}, false, 7},
		{[]string{"\n", "<think>", "x", "</think>", "y"}, false, 4},
		{[]string{"I add.", "\n", "</think>", "\n\n", "Four."}, true, 3},
		{[]string{"<think>", "cut sh"}, false, 2},
		{[]string{"Four", "."}, false, 0},
		{[]string{"\n", "Four"}, false, 0},
		{[]string{"<thin", "king", " aloud"}, false, 0},
	} {
		s := &thinkStream{inThink: c.inThink}
		for _, tok := range c.tokens {
			s.countToken(tok)
		}
		if got := s.reasoningTokens(); got != c.want {
			t.Errorf("%q (in think %v): %d reasoning tokens, want %d", c.tokens, c.inThink, got, c.want)
		}
	}
	var none *thinkStream
	none.countToken("<think>")
	if none.reasoningTokens() != 0 {
		t.Error("a model that does not think counted reasoning")
	}
}
