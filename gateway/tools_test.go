package gateway

import (
	"encoding/json"
	"strings"
	"testing"
)

const (
	weatherTool = `{"type":"function","function":{"name":"get_weather","description":"Now.","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}`
	timeTool    = `{"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"tz":{"type":"string"}}}}}`
	weatherArgs = `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`
	timeArgs    = `{"type":"object","properties":{"tz":{"type":"string"}}}`
)

// chatOut is a chat completion as a client reads it.
type chatOut struct {
	Choices []struct {
		Message struct {
			Content   *string       `json:"content"`
			ToolCalls []toolCallOut `json:"tool_calls"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
}

// streamOut is a streamed chat completion put together as a client's
// accumulator would: the content, the calls by index, the finish reason.
type streamOut struct {
	content string
	calls   []toolCallOut
	reason  string
	chunks  []string // the content deltas
}

// chatTools posts a chat request with the given extra fields (a JSON
// object's members) to a gateway whose backend replies reply, streamed or
// not; it returns the backend's request.
func chatTools(t *testing.T, reply, extra string, stream bool) (GenerateRequest, chatOut, streamOut) {
	t.Helper()
	b := &echoBackend{reply: reply}
	env := newEnv(t, testConfig(), b)
	body := `{"model":"echo-1","messages":[{"role":"user","content":"hi"}],` + extra
	if stream {
		body += `,"stream":true`
	}
	status, _, raw := post(t, env, "/v1/chat/completions", body+"}", nil)
	if status != 200 {
		t.Fatalf("status %d: %s", status, raw)
	}
	reqs := b.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d backend requests", len(reqs))
	}
	var out chatOut
	var so streamOut
	if !stream {
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		return reqs[0], out, so
	}
	sseData(raw, func(line []byte) {
		var ch struct {
			Choices []struct {
				Delta        chatDelta `json:"delta"`
				FinishReason *string   `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(line, &ch); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		for _, c := range ch.Choices {
			if c.Delta.Content != nil && *c.Delta.Content != "" {
				so.content += *c.Delta.Content
				so.chunks = append(so.chunks, *c.Delta.Content)
			}
			for _, d := range c.Delta.ToolCalls {
				if d.Index == nil {
					t.Fatalf("a streamed call without its index: %s", line)
				}
				for len(so.calls) <= *d.Index {
					so.calls = append(so.calls, toolCallOut{})
				}
				o := &so.calls[*d.Index]
				if d.ID != "" {
					if o.ID != "" {
						t.Errorf("call %d's id sent twice", *d.Index)
					}
					o.ID, o.Type, o.Function.Name = d.ID, d.Type, d.Function.Name
				}
				o.Function.Arguments += d.Function.Arguments
			}
			if c.FinishReason != nil {
				so.reason = *c.FinishReason
			}
		}
	})
	return reqs[0], out, so
}

// sameCalls checks calls against want (name, arguments), with call ids.
func sameCalls(t *testing.T, what string, got []toolCallOut, want ...[2]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d calls %+v, want %d", what, len(got), got, len(want))
	}
	for i, c := range got {
		if !strings.HasPrefix(c.ID, "call_") || c.Type != "function" || c.Function.Name != want[i][0] || c.Function.Arguments != want[i][1] {
			t.Errorf("%s: call %d is %+v, want %s(%s) with an id", what, i, c, want[i][0], want[i][1])
		}
	}
}

// TestToolsReachTheTemplate: the tools, an assistant's calls, the tools'
// answers and chat_template_kwargs reach the chat template, and under
// "auto" a model that writes no call answers in text.
func TestToolsReachTheTemplate(t *testing.T) {
	b := &echoBackend{}
	cfg := testConfig()
	cfg.Models[0].ContextLength = 1024 // the echo repeats the whole conversation
	env := newEnv(t, cfg, b)
	status, _, raw := post(t, env, "/v1/chat/completions", `{"model":"echo-1","chat_template_kwargs":{"enable_thinking":false,"x":{"a": [1]}},"tools":[`+weatherTool+`,`+timeTool+`],"messages":[
		{"role":"user","content":"weather?"},
		{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}}]},
		{"role":"tool","tool_call_id":"call_1","content":"-3"}]}`, nil)
	if status != 200 {
		t.Fatalf("status %d: %s", status, raw)
	}
	reqs := b.requests()
	prompt := byteTokenizer{}.Decode(reqs[0].Prompt, false)
	want := "vars: enable_thinking=false x={\"a\":[1]}\ntools: get_weather,get_time\nuser: weather?\nassistant:  -> get_weather({\"city\":\"Oslo\"})\ntool[call_1]: -3\nassistant: "
	if prompt != want {
		t.Errorf("prompt %q, want %q", prompt, want)
	}
	if reqs[0].JSON || reqs[0].Schema != "" || reqs[0].CompactJSON {
		t.Errorf("auto constrains the text: JSON %v, schema %q", reqs[0].JSON, reqs[0].Schema)
	}
	var out chatOut
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	if c := out.Choices[0]; c.Message.Content == nil || *c.Message.Content != want || len(c.Message.ToolCalls) != 0 || c.FinishReason != "stop" {
		t.Errorf("choice %+v", c)
	}
}

// TestToolChoiceNamed: a named function's arguments are generated under
// its parameters' schema and come back as its one call, streamed as they
// come; finish_reason is "stop", as OpenAI's for a forced function.
func TestToolChoiceNamed(t *testing.T) {
	const args = `{"city": "Paris"}`
	extra := `"tools":[` + weatherTool + `,` + timeTool + `],"tool_choice":{"type":"function","function":{"name":"get_weather"}}`
	req, out, _ := chatTools(t, args, extra, false)
	if !req.JSON || req.Schema != weatherArgs || !req.CompactJSON {
		t.Errorf("backend request: JSON %v, schema %q, want %q", req.JSON, req.Schema, weatherArgs)
	}
	c := out.Choices[0]
	if c.Message.Content != nil || c.FinishReason != "stop" {
		t.Errorf("content %v, finish_reason %q", c.Message.Content, c.FinishReason)
	}
	sameCalls(t, "whole", c.Message.ToolCalls, [2]string{"get_weather", args})

	_, _, so := chatTools(t, args, extra, true)
	if so.content != "" || so.reason != "stop" {
		t.Errorf("streamed: content %q, finish_reason %q", so.content, so.reason)
	}
	sameCalls(t, "streamed", so.calls, [2]string{"get_weather", args})

	// Cut by max_tokens: no call, the text as it came.
	req2, out2, _ := chatTools(t, args, extra+`,"max_tokens":5`, false)
	if c := out2.Choices[0]; c.Message.Content == nil || *c.Message.Content != args[:5] || len(c.Message.ToolCalls) != 0 || c.FinishReason != "length" {
		t.Errorf("cut: %+v (max tokens %d)", c, req2.MaxTokens)
	}
}

// TestToolChoiceRequired: with several functions the calls are generated
// as one document of {"name": arguments} items under their parameters'
// schemas (one item at most without parallel_tool_calls), read back as
// calls with finish_reason "tool_calls"; a single function's arguments
// are generated alone.
func TestToolChoiceRequired(t *testing.T) {
	const doc = `{"tool_calls":[{"get_time":{"tz":"UTC"}},{"get_weather":{"city":"Oslo"}}]}`
	extra := `"tools":[` + weatherTool + `,` + timeTool + `],"tool_choice":"required"`
	items := `"items":{"type":"object","properties":{"get_weather":` + weatherArgs + `,"get_time":` + timeArgs +
		`},"additionalProperties":false,"minProperties":1,"maxProperties":1}}},"required":["tool_calls"],"additionalProperties":false}`
	req, out, _ := chatTools(t, doc, extra, false)
	if want := `{"type":"object","properties":{"tool_calls":{"type":"array","minItems":1,` + items; !req.JSON || req.Schema != want || !req.CompactJSON {
		t.Errorf("schema %q, want %q", req.Schema, want)
	}
	want := [][2]string{{"get_time", `{"tz":"UTC"}`}, {"get_weather", `{"city":"Oslo"}`}}
	sameCalls(t, "whole", out.Choices[0].Message.ToolCalls, want...)
	if c := out.Choices[0]; c.Message.Content != nil || c.FinishReason != "tool_calls" {
		t.Errorf("content %v, finish_reason %q", c.Message.Content, c.FinishReason)
	}
	_, _, so := chatTools(t, doc, extra, true)
	sameCalls(t, "streamed", so.calls, want...)
	if so.content != "" || so.reason != "tool_calls" {
		t.Errorf("streamed: content %q, finish_reason %q", so.content, so.reason)
	}

	req, _, _ = chatTools(t, doc, extra+`,"parallel_tool_calls":false`, false)
	if want := `{"type":"object","properties":{"tool_calls":{"type":"array","minItems":1,"maxItems":1,` + items; req.Schema != want {
		t.Errorf("one call: schema %q, want %q", req.Schema, want)
	}

	req, out, _ = chatTools(t, `{"tz":"CET"}`, `"tools":[`+timeTool+`],"tool_choice":"required"`, false)
	if req.Schema != timeArgs {
		t.Errorf("one function: schema %q, want %q", req.Schema, timeArgs)
	}
	sameCalls(t, "one function", out.Choices[0].Message.ToolCalls, [2]string{"get_time", `{"tz":"CET"}`})
	if r := out.Choices[0].FinishReason; r != "tool_calls" {
		t.Errorf("one function: finish_reason %q", r)
	}
}

// TestToolChoiceAuto: under "auto" the model's <tool_call> blocks become
// calls and the text around them content; streamed, no part of a block
// reaches the content. Text whose blocks do not hold calls stays content.
// An answer that is only calls in bare JSON (Llama 3's way) is calls.
func TestToolChoiceAuto(t *testing.T) {
	extra := `"tools":[` + weatherTool + `,` + timeTool + `]`
	for _, c := range []struct {
		reply, content, reason string
		calls                  [][2]string
	}{
		{"Let me look. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>\n<tool_call>{\"name\":\"get_time\",\"arguments\":\"{\\\"tz\\\":\\\"UTC\\\"}\"}</tool_call>",
			"Let me look.", "tool_calls", [][2]string{{"get_weather", `{"city": "Rome"}`}, {"get_time", `{"tz":"UTC"}`}}},
		{`<tool_call>{"name": "get_time", "parameters": {}}</tool_call>`, "", "tool_calls", [][2]string{{"get_time", `{}`}}},
		{"a < b, <tool_ and <tool_call>not json</tool_call>", "a < b, <tool_ and <tool_call>not json</tool_call>", "stop", nil},
		{"Plain <tool_call>{\"name\": \"x\"", "Plain <tool_call>{\"name\": \"x\"", "stop", nil},
		{` {"name": "get_weather", "parameters": {"city": "Rome"}}; {"name": "get_time", "parameters": {}}`, "", "tool_calls",
			[][2]string{{"get_weather", `{"city": "Rome"}`}, {"get_time", `{}`}}},
		{`{"name": "get_weather", "parameters": {"city": "Rome"}} and more`, `{"name": "get_weather", "parameters": {"city": "Rome"}} and more`, "stop", nil},
		{`{"city": "Rome"}`, `{"city": "Rome"}`, "stop", nil},
	} {
		_, out, _ := chatTools(t, c.reply, extra, false)
		m := out.Choices[0].Message
		got := ""
		if m.Content != nil {
			got = *m.Content
		}
		if got != c.content || out.Choices[0].FinishReason != c.reason || c.content == "" && m.Content != nil {
			t.Errorf("%q: content %v, finish_reason %q; want %q, %q", c.reply, m.Content, out.Choices[0].FinishReason, c.content, c.reason)
		}
		sameCalls(t, c.reply, m.ToolCalls, c.calls...)

		_, _, so := chatTools(t, c.reply, extra, true)
		if so.content != c.content || so.reason != c.reason {
			t.Errorf("%q streamed: content %q, finish_reason %q; want %q, %q", c.reply, so.content, so.reason, c.content, c.reason)
		}
		if c.calls != nil {
			for _, ch := range so.chunks {
				if strings.Contains(ch, "<") {
					t.Errorf("%q streamed: content %q holds a block's part", c.reply, ch)
				}
			}
		}
		sameCalls(t, c.reply+" streamed", so.calls, c.calls...)
	}
	// tool_choice "none": the blocks stay text.
	reply := `<tool_call>{"name": "get_time", "arguments": {}}</tool_call>`
	_, out, _ := chatTools(t, reply, extra+`,"tool_choice":"none"`, false)
	if m := out.Choices[0].Message; m.Content == nil || *m.Content != reply || len(m.ToolCalls) != 0 {
		t.Errorf("none: %+v", m)
	}
}

// TestToolChoiceAllowed: allowed_tools keeps every tool in the prompt but
// lets the model call only those it lists: "required" generates among
// them, "auto" reads only their calls (as it reads only the request's
// tools' calls).
func TestToolChoiceAllowed(t *testing.T) {
	extra := `"tools":[` + weatherTool + `,` + timeTool + `],"tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"%s","tools":[{"type":"function","function":{"name":"get_time"}}]}}`
	req, out, _ := chatTools(t, `{"tz":"UTC"}`, strings.Replace(extra, "%s", "required", 1), false)
	if req.Schema != timeArgs {
		t.Errorf("required among one: schema %q, want %q", req.Schema, timeArgs)
	}
	if p := (byteTokenizer{}).Decode(req.Prompt, false); !strings.HasPrefix(p, "tools: get_weather,get_time\n") {
		t.Errorf("prompt %q does not list every tool", p)
	}
	sameCalls(t, "required among one", out.Choices[0].Message.ToolCalls, [2]string{"get_time", `{"tz":"UTC"}`})

	reply := `<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call><tool_call>{"name": "get_time", "arguments": {}}</tool_call><tool_call>{"name": "nope", "arguments": {}}</tool_call>`
	_, out, _ = chatTools(t, reply, strings.Replace(extra, "%s", "auto", 1), false)
	sameCalls(t, "auto among one", out.Choices[0].Message.ToolCalls, [2]string{"get_time", `{}`})
	want := `<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>` + "\n" + `<tool_call>{"name": "nope", "arguments": {}}</tool_call>`
	if m := out.Choices[0].Message; m.Content == nil || *m.Content != want {
		t.Errorf("auto among one: content %v, want %q", m.Content, want)
	}
	_, _, so := chatTools(t, reply, strings.Replace(extra, "%s", "auto", 1), true)
	sameCalls(t, "auto among one, streamed", so.calls, [2]string{"get_time", `{}`})
	if so.content != want {
		t.Errorf("auto among one, streamed: content %q, want %q", so.content, want)
	}

	env := newEnv(t, testConfig(), nil)
	for _, bad := range []string{
		`{"type":"allowed_tools","allowed_tools":{"mode":"sometimes","tools":[{"type":"function","function":{"name":"get_time"}}]}}`,
		`{"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[]}}`,
		`{"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[{"type":"function","function":{"name":"other"}}]}}`,
		`{"type":"custom","custom":{"name":"x"}}`,
	} {
		status, _, body := post(t, env, "/v1/chat/completions", `{"model":"echo-1","messages":[{"role":"user","content":"x"}],"tools":[`+timeTool+`],"tool_choice":`+bad+`}`, nil)
		if status != 400 || deref(decodeError(t, body).Param) != "tool_choice" {
			t.Errorf("tool_choice %s: %d %s", bad, status, body)
		}
	}
}
