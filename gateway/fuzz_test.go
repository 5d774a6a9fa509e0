package gateway

import (
	"encoding/json"
	"strings"
	"testing"
)

func fuzzValidator() *validator {
	cfg := testConfig()
	cfg.Models = append(cfg.Models, ModelInfo{ID: "tiny", ContextLength: 8})
	v := &validator{cfg: &cfg, models: map[string]ModelInfo{}, tok: byteTokenizer{}, tmpl: lineTemplate{}}
	for _, m := range cfg.Models {
		v.models[m.ID] = m
	}
	return v
}

// checkJob asserts the invariants every validated job must hold.
func checkJob(t *testing.T, v *validator, j *job) {
	t.Helper()
	if j.n < 1 || j.n > v.cfg.MaxN {
		t.Fatalf("n = %d escaped validation", j.n)
	}
	if len(j.prompts) == 0 || len(j.prompts) != len(j.maxTokens) {
		t.Fatalf("%d prompts, %d budgets", len(j.prompts), len(j.maxTokens))
	}
	for i, p := range j.prompts {
		if len(p) == 0 || j.maxTokens[i] < 1 || len(p)+j.maxTokens[i] > j.model.ContextLength {
			t.Fatalf("prompt %d: %d tokens + %d over context %d", i, len(p), j.maxTokens[i], j.model.ContextLength)
		}
	}
	b := j.base
	if b.Temperature < 0 || b.Temperature > 2 || b.TopP <= 0 || b.TopP > 1 || len(b.Stop) > maxStops || b.TopLogprobs > maxTopLogprobs {
		t.Fatalf("sampling escaped validation: %+v", b)
	}
	for _, s := range b.Stop {
		if s == "" {
			t.Fatal("empty stop string escaped validation")
		}
	}
	if !(b.PresencePenalty >= -2 && b.PresencePenalty <= 2 && b.FrequencyPenalty >= -2 && b.FrequencyPenalty <= 2) || len(b.LogitBias) > MaxLogitBias {
		t.Fatalf("penalties escaped validation: %+v", b)
	}
	for id, bias := range b.LogitBias {
		if id < 0 || (j.model.VocabSize > 0 && int(id) >= j.model.VocabSize) || !(bias >= -100 && bias <= 100) {
			t.Fatalf("logit_bias %d: %v escaped validation", id, bias)
		}
	}
}

func FuzzChatRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"echo-1","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"echo-1","messages":[{"role":"system","content":[{"type":"text","text":"a"}]},{"role":"user","content":"b"}],"n":3,"stop":["x"],"temperature":0.7,"top_p":0.9,"seed":1,"logprobs":true,"top_logprobs":2,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":3}`,
		`{"model":"echo-1","messages":[{"role":"assistant","content":null}]}`,
		`{"model":"echo-1","messages":[{"role":"user","content":"x"}],"tools":[],"tool_choice":"none","response_format":{"type":"text"}}`,
		`{"model":"echo-1","messages":[{"role":"user","content":"x"}],"stop":"\u0000","max_tokens":-1}`,
		`{"model":"echo-1","messages":[{"role":"user","content":"x"}],"n":1e400}`,
		`[`, `null`, `{"messages":{}}`,
		`{"model":"echo-1","messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"1"}],` +
			`"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"string"}}}}},{"type":"function","function":{"name":"g"}}],"tool_choice":"required","parallel_tool_calls":false}`,
		`{"model":"echo-1","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f"}}}`,
	} {
		f.Add([]byte(s))
	}
	v := fuzzValidator()
	f.Fuzz(func(t *testing.T, data []byte) {
		var r chatRequest
		if aerr := decodeJSON(data, &r); aerr != nil {
			if aerr.Status != 400 || aerr.Message == "" {
				t.Fatalf("decode error %+v", aerr)
			}
			return
		}
		j, aerr := v.chat(&r, "")
		if aerr != nil {
			if aerr.Status != 400 || aerr.Message == "" {
				t.Fatalf("validation error %+v", aerr)
			}
			return
		}
		checkJob(t, v, j)
		if len(j.prompts) != 1 {
			t.Fatalf("chat job with %d prompts", len(j.prompts))
		}
		if sc := j.tools.schema(); (sc != "") != (j.tools.mode == toolsRequired || j.tools.mode == toolsNamed) || sc != "" && (!json.Valid([]byte(sc)) || j.base.Schema != sc) {
			t.Fatalf("tool mode %d with schema %q, the request's %q", j.tools.mode, sc, j.base.Schema)
		}
	})
}

// FuzzToolCalls reads "auto"'s calls from a text whole and streamed in
// pieces: both ways agree on the calls and the content, and every call
// has a name and an arguments object.
func FuzzToolCalls(f *testing.F) {
	for _, s := range []string{
		"Hi <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>",
		"<tool_call>{\"name\":\"g\",\"parameters\":{}}</tool_call>\n<tool_call>{\"name\":\"f\",\"arguments\":\"{}\"}</tool_call> bye",
		"<tool_call><tool_call>{}</tool_call></tool_call>",
		"a <tool_ b <tool_call>{\"name\": \"f\"",
		" {\"name\": \"f\", \"parameters\": {\"a\": [1]}} ;{\"name\": \"g\", \"arguments\": \"{}\"}",
		"{\"name\": \"f\"} x",
	} {
		f.Add(s, uint8(3))
	}
	f.Fuzz(func(t *testing.T, text string, piece uint8) {
		plan := toolPlan{mode: toolsAuto, tools: []Tool{{Name: "f"}, {Name: "g"}, {Name: "0"}}}
		content, calls := plan.calls(text)
		if len(calls) == 0 && content != text {
			t.Fatalf("no calls, content %q of %q", content, text)
		}
		for _, c := range calls {
			if !toolNameRE.MatchString(c.Name) || !json.Valid([]byte(c.Arguments)) || !strings.HasPrefix(c.Arguments, "{") {
				t.Fatalf("call %+v of %q", c, text)
			}
		}
		cs := callStream{plan: &plan}
		var got strings.Builder
		var streamed []toolCallOut
		n := int(piece%16) + 1
		for i := 0; i < len(text); i += n {
			c, tc := cs.push(text[i:min(i+n, len(text))])
			got.WriteString(c)
			streamed = append(streamed, tc...)
		}
		c, tc, called := cs.end("")
		got.WriteString(c)
		streamed = append(streamed, tc...)
		if called != (len(calls) > 0) || len(streamed) != len(calls) {
			t.Fatalf("%q in pieces of %d: %d calls streamed, %d whole", text, n, len(streamed), len(calls))
		}
		for i, c := range streamed {
			if *c.Index != i || c.Function.Name != calls[i].Name || c.Function.Arguments != calls[i].Arguments {
				t.Fatalf("%q: streamed call %d %+v, whole %+v", text, i, c, calls[i])
			}
		}
		if got.String() != content {
			t.Fatalf("%q in pieces of %d: content %q, whole %q", text, n, got.String(), content)
		}
	})
}

func FuzzCompletionRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"echo-1","prompt":"hello"}`,
		`{"model":"echo-1","prompt":["a","b"],"n":2,"max_tokens":4}`,
		`{"model":"echo-1","prompt":[1,2,3],"logprobs":5,"stop":"x"}`,
		`{"model":"echo-1","prompt":[[1],[2,3]],"best_of":1}`,
		`{"model":"tiny","prompt":"12345678"}`,
		`{"model":"echo-1","prompt":[[]]}`,
		`{"model":"echo-1","prompt":[1.5]}`,
		`{"model":"echo-1","prompt":[99999999999]}`,
		`{"model":"echo-1","prompt":["a",[1]]}`,
		`{"model":"echo-1","prompt":{}}`,
		`{"model":"echo-1","prompt":"x","presence_penalty":-2,"frequency_penalty":1.5,"logit_bias":{"5":-100,"17":3.5}}`,
		`{"model":"echo-1","prompt":"x","logit_bias":{"-1":1,"1e3":2,"5":null}}`,
	} {
		f.Add([]byte(s))
	}
	v := fuzzValidator()
	f.Fuzz(func(t *testing.T, data []byte) {
		var r completionRequest
		if aerr := decodeJSON(data, &r); aerr != nil {
			if aerr.Status != 400 || aerr.Message == "" {
				t.Fatalf("decode error %+v", aerr)
			}
			return
		}
		j, aerr := v.completion(&r, "")
		if aerr != nil {
			if aerr.Status != 400 || aerr.Message == "" {
				t.Fatalf("validation error %+v", aerr)
			}
			return
		}
		checkJob(t, v, j)
		for _, p := range j.prompts {
			for _, id := range p {
				if id < 0 || (j.model.VocabSize > 0 && int(id) >= j.model.VocabSize) {
					t.Fatalf("token id %d escaped validation", id)
				}
			}
		}
	})
}

func FuzzWSFrame(f *testing.F) {
	for _, s := range []string{
		`{"type":"generate","id":"a","model":"echo-1","prompt":"hi","max_tokens":4}`,
		`{"type":"generate","id":"a","model":"echo-1","prompt":[104,105]}`,
		`{"type":"generate","id":"a","model":"echo-1","messages":[{"role":"user","content":"x"}],"stop":["a"]}`,
		`{"type":"cancel","id":"a"}`,
		`{"type":"resume","id":"a","after_seq":3}`,
		`{"type":"resume","id":"a","after_seq":-3}`,
		`{"type":"generate","id":"` + strings.Repeat("x", 200) + `"}`,
		`{"type":"generate","id":"a","prompt":[[1],[2]]}`,
		`{"type":7}`,
		`{"type":"generate","id":"a","model":"echo-1","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required","chat_template_kwargs":{"k":1}}`,
		`{"type":"generate","id":"a","model":"echo-1","prompt":"x","tools":[]}`,
	} {
		f.Add([]byte(s))
	}
	v := fuzzValidator()
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, aerr := decodeWSFrame(data)
		if fr == nil {
			t.Fatal("nil frame")
		}
		if aerr != nil {
			if aerr.Message == "" || aerr.Code == "" {
				t.Fatalf("error without message or code: %+v", aerr)
			}
			return
		}
		if fr.ID == "" || len(fr.ID) > maxStreamID {
			t.Fatalf("id %q escaped validation", fr.ID)
		}
		switch fr.Type {
		case "resume":
			if fr.AfterSeq == nil || *fr.AfterSeq < 0 {
				t.Fatal("resume without a valid after_seq")
			}
		case "generate":
			j, aerr := v.ws(fr, "t")
			if aerr != nil {
				if aerr.Message == "" {
					t.Fatalf("validation error %+v", aerr)
				}
				return
			}
			checkJob(t, v, j)
			if j.choices() != 1 {
				t.Fatalf("websocket job with %d choices", j.choices())
			}
		case "cancel":
		default:
			t.Fatalf("type %q escaped validation", fr.Type)
		}
	})
}

func FuzzStopper(f *testing.F) {
	f.Add("hello world", "wor", "ld", 3)
	f.Add("aaab", "aab", "", 1)
	f.Add("abcabd", "abd", "zz", 2)
	f.Fuzz(func(t *testing.T, text, stop1, stop2 string, chunk int) {
		var stops []string
		for _, s := range []string{stop1, stop2} {
			if s != "" {
				stops = append(stops, s)
			}
		}
		if chunk < 1 || chunk > 16 {
			chunk = 1
		}
		st := stopper{stops: stops}
		var out strings.Builder
		stopped := false
		for i := 0; i < len(text) && !stopped; i += chunk {
			piece, s := st.push(text[i:min(i+chunk, len(text))])
			out.WriteString(piece)
			stopped = s
		}
		if !stopped {
			out.WriteString(st.flush())
		}
		// Reference: at each chunk boundary, the first boundary where some stop string
		// has occurred cuts the text at the earliest such occurrence.
		want, wantStop := text, false
		for end := min(chunk, len(text)); ; end = min(end+chunk, len(text)) {
			cut := -1
			for _, s := range stops {
				if i := strings.Index(text[:end], s); i >= 0 && (cut < 0 || i < cut) {
					cut = i
				}
			}
			if cut >= 0 {
				want, wantStop = text[:cut], true
				break
			}
			if end == len(text) {
				break
			}
		}
		if out.String() != want || stopped != wantStop {
			t.Fatalf("text %q stops %q chunk %d: got %q stopped=%v, want %q stopped=%v", text, stops, chunk, out.String(), stopped, want, wantStop)
		}
	})
}

// FuzzResponsesRequest reads Responses requests as the chat completions
// they ask for: anything either refuses is a 400, and what passes holds a
// chat job's invariants.
func FuzzResponsesRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"echo-1","input":"hi","instructions":"be brief","max_output_tokens":5}`,
		`{"model":"echo-1","input":[{"role":"user","content":[{"type":"input_text","text":"a"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},` +
			`{"type":"function_call_output","call_id":"c","output":"1"}],"tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"tool_choice":{"type":"function","name":"f"}}`,
		`{"model":"echo-1","input":"x","text":{"format":{"type":"json_schema","name":"n","schema":{"type":"object"}}},"top_logprobs":2,"stream":true}`,
		`{"model":"echo-1","input":"x","truncation":"auto"}`, `{"model":"echo-1","input":"x","truncation":7}`,
		`{"model":"echo-1","input":[{"type":"reasoning"}],"previous_response_id":"r"}`,
		`{"model":"echo-1","input":[{"role":"user","content":"a"},{"type":"reasoning","content":[{"type":"reasoning_text","text":"r"}],"summary":[]},` +
			`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"b"}]},{"type":"reasoning","summary":[{"type":"summary_text","text":"s"}]},` +
			`{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}]}`,
		`{"model":"echo-1","input":5}`, `{"input":[]}`,
	} {
		f.Add([]byte(s))
	}
	v := fuzzValidator()
	f.Fuzz(func(t *testing.T, data []byte) {
		var cr chatRequest
		var rr responsesRequest
		if decodeJSON(data, &cr) != nil || decodeJSON(data, &rr) != nil {
			return
		}
		// A conversation before it, of turns that fill the context, for
		// truncation to cut.
		var prior []chatMessage
		for i := range 3 {
			prior = append(prior, chatMessage{Role: "user", Content: messageContent{text: strings.Repeat("u", 40*i), set: true}},
				chatMessage{Role: "assistant", Content: messageContent{text: "ok", set: true}})
		}
		kept, _, j, aerr := v.responseChat(&rr, &cr, prior, "")
		if aerr != nil {
			if aerr.Status != 400 || aerr.Message == "" {
				t.Fatalf("validation error %+v", aerr)
			}
			return
		}
		if len(kept) > 0 && (kept[0].Role != "user" || &kept[len(kept)-1] != &prior[len(prior)-1]) {
			t.Fatalf("kept %d turns of %d, beginning with a %s message", len(kept), len(prior), kept[0].Role)
		}
		checkJob(t, v, j)
		if j.n != 1 || len(j.prompts) != 1 {
			t.Fatalf("a response of %d prompts × %d", len(j.prompts), j.n)
		}
	})
}
