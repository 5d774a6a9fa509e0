package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"
)

// The Responses API (POST /v1/responses): a request is read into the
// chat completion it asks for (its input items as messages, instructions
// first, its tools, tool_choice and text.format as the chat's) and
// validated as one; the answer comes back as the response's output items,
// whole or as its stream of events. The last responses are kept
// (ResponseStore), so that a request may continue one (previous_response_id)
// and a client fetch or delete it.

// responsesRequest is what a Responses request holds beyond the chat
// completion fields of the same names (model, temperature, top_p, stream,
// user and the sampling extensions), which are read as chat's.
type responsesRequest struct {
	Input              json.RawMessage   `json:"input"`
	Instructions       *string           `json:"instructions"`
	MaxOutputTokens    *int              `json:"max_output_tokens"`
	TopLogprobs        *int              `json:"top_logprobs"`
	Include            []string          `json:"include"`
	Tools              json.RawMessage   `json:"tools"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	ParallelToolCalls  *bool             `json:"parallel_tool_calls"`
	Text               json.RawMessage   `json:"text"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Background         *bool             `json:"background"`
	Store              *bool             `json:"store"`
	Truncation         *string           `json:"truncation"`
	Metadata           map[string]string `json:"metadata"`
	Reasoning          *struct {
		Effort *string `json:"effort"`
	} `json:"reasoning"`
	User *string `json:"user"`
}

// inputItem is an item of a Responses input: a message, a function call
// the model made, or a call's output.
type inputItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
	Summary   json.RawMessage `json:"summary"`           // a reasoning item's
	Encrypted string          `json:"encrypted_content"` // a reasoning item's
}

// chat is the chat completion request r asks for, cr holding the fields
// read from the same body, after the conversation prior continues (the
// previous response's); it returns r's input as messages.
func (r *responsesRequest) chat(cr *chatRequest, prior []chatMessage) ([]chatMessage, *apiError) {
	// Chat's fields that the Responses API spells otherwise, or lacks.
	cr.N, cr.StreamOptions, cr.MaxTokens, cr.ResponseFormat, cr.AddGenerationPrompt = nil, nil, nil, nil, nil
	cr.Functions, cr.FunctionCall, cr.Logprobs, cr.TopLogprobs, cr.ReasoningEffort = nil, nil, nil, nil, nil
	if r.Reasoning != nil {
		cr.ReasoningEffort, cr.effortParam = r.Reasoning.Effort, "reasoning.effort"
	}
	input, aerr := r.input()
	if aerr != nil {
		return nil, aerr
	}
	// A response's instructions are its own, not carried on.
	cr.Messages = nil
	if r.Instructions != nil && *r.Instructions != "" {
		cr.Messages = append(cr.Messages, chatMessage{Role: "system", Content: messageContent{text: *r.Instructions, set: true}})
	}
	cr.Messages = append(append(cr.Messages, prior...), input...)
	cr.MaxCompletionTokens = r.MaxOutputTokens
	if r.TopLogprobs != nil || slices.Contains(r.Include, "message.output_text.logprobs") {
		cr.Logprobs, cr.TopLogprobs = ptr(true), r.TopLogprobs
	}
	var err error
	if cr.Tools, err = responseTools(r.Tools); err != nil {
		return nil, invalidParam("tools", `tools must be an array of {"type": "function", "name": ..., "parameters": ...}`)
	}
	if cr.ToolChoice, err = responseToolChoice(r.ToolChoice); err != nil {
		return nil, invalidParam("tool_choice", `tool_choice must be "none", "auto", "required", {"type": "function", "name": ...} or {"type": "allowed_tools", "mode", "tools"}`)
	}
	cr.ParallelToolCalls = r.ParallelToolCalls
	if t := r.Text; !unset(t) {
		var text struct {
			Format json.RawMessage `json:"format"`
		}
		if json.Unmarshal(t, &text) != nil {
			return nil, invalidParam("text", "text must be an object")
		}
		if cr.ResponseFormat, err = responseFormat(text.Format); err != nil {
			return nil, invalidParam("text.format", `text.format must be {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "name", "schema"}`)
		}
	}
	return input, nil
}

// input reads the input (a string, or items) as chat messages:
// consecutive function calls make one assistant message.
func (r *responsesRequest) input() ([]chatMessage, *apiError) {
	var msgs []chatMessage
	in := bytes.TrimSpace(r.Input)
	if unset(in) {
		return nil, invalidParam("input", "input is required")
	}
	var text string
	if json.Unmarshal(in, &text) == nil {
		return append(msgs, chatMessage{Role: "user", Content: messageContent{text: text, set: true}}), nil
	}
	var items []inputItem
	if err := json.Unmarshal(in, &items); err != nil {
		return nil, invalidParam("input", "input must be a string or an array of items")
	}
	var calls []toolCallOut // the assistant message being gathered
	var reasoning string    // the reasoning before the next assistant message
	flush := func() {
		if calls != nil {
			raw, _ := json.Marshal(calls)
			msgs = append(msgs, chatMessage{Role: "assistant", ToolCalls: raw, ReasoningContent: reasoning})
			calls, reasoning = nil, ""
		}
	}
	for i, it := range items {
		switch it.Type {
		case "", "message":
			flush()
			content, aerr := itemText(i, it.Content)
			if aerr != nil {
				return nil, aerr
			}
			m := chatMessage{Role: it.Role, Content: content}
			if it.Role == "assistant" {
				m.ReasoningContent = reasoning
			}
			reasoning = "" // another turn's, where no assistant's message took it
			msgs = append(msgs, m)
		case "reasoning":
			// A reasoning item, as a response's output holds it: its text
			// goes with the assistant's turn after it (chat templates show
			// it or drop it as the model was trained).
			flush()
			text, aerr := reasoningText(i, it)
			if aerr != nil {
				return nil, aerr
			}
			reasoning += text
		case "function_call":
			if it.CallID == "" || !toolNameRE.MatchString(it.Name) {
				return nil, invalidParam("input", "input[%d]: a function_call needs a call_id and a function name", i)
			}
			calls = append(calls, callOut(ToolCall{ID: it.CallID, Name: it.Name, Arguments: it.Arguments}))
		case "function_call_output":
			flush()
			content, aerr := itemText(i, it.Output)
			if aerr != nil {
				return nil, aerr
			}
			if it.CallID == "" {
				return nil, invalidParam("input", "input[%d]: a function_call_output needs a call_id", i)
			}
			msgs = append(msgs, chatMessage{Role: "tool", Content: content, ToolCallID: it.CallID})
		default:
			return nil, badRequest("input", "unsupported_parameter", "input[%d]: item type %q is not supported; message, reasoning, function_call and function_call_output are", i, truncate(it.Type, 40))
		}
	}
	flush()
	return msgs, nil
}

// reasoningText is a reasoning item's text: its reasoning_text parts, or
// where it has none its summary_text parts, or where it has neither its
// encrypted_content, where this gateway sealed it.
func reasoningText(i int, it inputItem) (string, *apiError) {
	type part struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	var content, summary []part
	if !unset(it.Content) && json.Unmarshal(it.Content, &content) != nil || !unset(it.Summary) && json.Unmarshal(it.Summary, &summary) != nil {
		return "", invalidParam("input", "input[%d]: a reasoning item's content and summary must be arrays of parts", i)
	}
	var b strings.Builder
	for _, ps := range [][]part{content, summary} {
		for _, p := range ps {
			if p.Type != "reasoning_text" && p.Type != "summary_text" || p.Text == nil {
				return "", badRequest("input", "unsupported_parameter", "input[%d]: reasoning part type %q is not supported; reasoning_text and summary_text are", i, truncate(p.Type, 40))
			}
			b.WriteString(*p.Text)
		}
		if b.Len() > 0 {
			return b.String(), nil
		}
	}
	// A client that keeps only what it is to pass back; another
	// service's sealed reasoning is dropped.
	text, _ := openReasoning(it.Encrypted)
	return text, nil
}

// itemText is an item's content: a string, or text parts (input_text,
// output_text).
func itemText(i int, raw json.RawMessage) (messageContent, *apiError) {
	raw = bytes.TrimSpace(raw)
	var c messageContent
	if unset(raw) {
		return c, nil
	}
	c.set = true
	if json.Unmarshal(raw, &c.text) == nil {
		return c, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return c, invalidParam("input", "input[%d]: content must be a string or an array of parts", i)
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type != "input_text" && p.Type != "output_text" && p.Type != "text" || p.Text == nil {
			return c, badRequest("input", "unsupported_parameter", "input[%d]: content part type %q is not supported; only text is", i, truncate(p.Type, 40))
		}
		b.WriteString(*p.Text)
	}
	c.text = b.String()
	return c, nil
}

// responseTools rewrites Responses tools ({"type": "function", "name",
// ...}) as chat's ({"type": "function", "function": {"name", ...}});
// other types pass as they are, for chat to refuse by name.
func responseTools(raw json.RawMessage) (json.RawMessage, error) {
	if unset(raw) {
		return nil, nil
	}
	var in []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &in); err != nil {
		return nil, err
	}
	out := make([]map[string]any, len(in))
	for i, t := range in {
		var typ string
		_ = json.Unmarshal(t["type"], &typ)
		if typ != "function" {
			out[i] = map[string]any{"type": t["type"]}
			continue
		}
		f := map[string]json.RawMessage{}
		for _, k := range []string{"name", "description", "parameters", "strict"} {
			if v, ok := t[k]; ok {
				f[k] = v
			}
		}
		out[i] = map[string]any{"type": "function", "function": f}
	}
	return json.Marshal(out)
}

// responseToolChoice rewrites a Responses tool_choice as chat's.
func responseToolChoice(raw json.RawMessage) (json.RawMessage, error) {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || t[0] != '{' {
		return raw, nil
	}
	var c struct {
		Type  string `json:"type"`
		Name  string `json:"name"`
		Mode  string `json:"mode"`
		Tools []struct {
			Type string `json:"type"`
			Name string `json:"name"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(t, &c); err != nil {
		return nil, err
	}
	named := func(name string) map[string]any {
		return map[string]any{"type": "function", "function": map[string]string{"name": name}}
	}
	switch c.Type {
	case "function":
		return json.Marshal(named(c.Name))
	case "allowed_tools":
		tools := make([]map[string]any, len(c.Tools))
		for i, tl := range c.Tools {
			tools[i] = named(tl.Name)
			tools[i]["type"] = tl.Type
		}
		return json.Marshal(map[string]any{"type": "allowed_tools", "allowed_tools": map[string]any{"mode": c.Mode, "tools": tools}})
	}
	return raw, nil
}

// responseFormat rewrites text.format as chat's response_format.
func responseFormat(raw json.RawMessage) (json.RawMessage, error) {
	t := bytes.TrimSpace(raw)
	if unset(t) {
		return nil, nil
	}
	var f map[string]json.RawMessage
	if err := json.Unmarshal(t, &f); err != nil {
		return nil, err
	}
	var typ string
	_ = json.Unmarshal(f["type"], &typ)
	if typ != "json_schema" {
		return t, nil
	}
	delete(f, "type")
	return json.Marshal(map[string]any{"type": "json_schema", "json_schema": f})
}

// responsesParam renames what the chat validator calls a Responses
// parameter.
var responsesParam = map[string]string{"messages": "input", "max_completion_tokens": "max_output_tokens", "response_format": "text.format"}

// responsesError names aerr's parameter as the Responses API does.
func responsesError(aerr *apiError) *apiError {
	if p, ok := responsesParam[aerr.Param]; ok {
		aerr.Message = strings.ReplaceAll(aerr.Message, aerr.Param, p)
		aerr.Param = p
	}
	return aerr
}

// previous is the conversation of rr's previous response, where it names
// one: kept for tenant, and ended.
func (s *Server) previous(r *http.Request, rr *responsesRequest, tenant string) ([]chatMessage, *apiError) {
	id := rr.PreviousResponseID
	if id == nil || *id == "" {
		return nil, nil
	}
	prev, err := s.responses.get(r.Context(), *id, tenant)
	if err != nil {
		return nil, storeError(err)
	}
	if prev == nil {
		return nil, &apiError{Status: http.StatusNotFound, Type: typeInvalidRequest, Param: "previous_response_id", Code: "previous_response_not_found",
			Message: "previous response " + truncate(*id, 80) + " is not kept here (it expired, was deleted, was not stored, or another node answered it)"}
	}
	if st := statusOf(prev.Object); st.running() {
		return nil, invalidParam("previous_response_id", "previous response %s is still %s; wait for it to end or cancel it", truncate(*id, 80), st.Status)
	}
	return prev.Conv, nil
}

// handleInputTokens counts a Responses request's input tokens (POST
// /v1/responses/input_tokens) as /v1/responses would give them to the
// model: its instructions, the previous response's conversation, its
// input and its tools through the chat template. Nothing runs and nothing
// is kept; an input longer than the context is counted too.
func (s *Server) handleInputTokens(w http.ResponseWriter, r *http.Request) {
	var cr chatRequest
	var rr responsesRequest
	if !s.readJSON(w, r, &cr, &rr) {
		return
	}
	count := func() (int, *apiError) {
		if cr.Model == "" && len(s.cfg.Models) == 1 {
			cr.Model = s.cfg.Models[0].ID // the model is optional here
		}
		if _, aerr := s.val.model(cr.Model); aerr != nil {
			return 0, aerr
		}
		if s.val.tmpl == nil {
			return 0, badRequest("input", "chat_unsupported", "model %q has no chat template", cr.Model)
		}
		prior, aerr := s.previous(r, &rr, tenantOf(r.Context()))
		if aerr != nil {
			return 0, aerr
		}
		if _, aerr := rr.chat(&cr, prior); aerr != nil {
			return 0, aerr
		}
		tools, aerr := parseTools(cr.Tools)
		if aerr != nil {
			return 0, aerr
		}
		text, aerr := s.val.chatText(cr.Messages, tools, nil, cr.ChatTemplateKwargs, cr.ReasoningEffort, cr.effortParam)
		if aerr != nil {
			return 0, aerr
		}
		return len(s.val.tok.Encode(text)), nil
	}
	n, aerr := count()
	if aerr != nil {
		writeAPIError(w, responsesError(aerr))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "response.input_tokens", "input_tokens": n})
}

func (s *Server) handleResponses(w http.ResponseWriter, r *http.Request) {
	received := time.Now()
	var cr chatRequest
	var rr responsesRequest
	if !s.readJSON(w, r, &cr, &rr) {
		return
	}
	tenant := tenantOf(r.Context())
	prior, aerr := s.previous(r, &rr, tenant)
	if aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	prior, input, j, aerr := s.val.responseChat(&rr, &cr, prior, tenant)
	if aerr != nil {
		writeAPIError(w, responsesError(aerr))
		return
	}
	rs := &responseRun{s: s, ctx: context.WithoutCancel(r.Context()), j: j, rr: &rr, w: w, id: newID("resp_"), created: received.Unix(), msg: -1, rsn: -1,
		tenant: tenant, conv: append(slices.Clip(prior), input...), store: s.responses.enabled() && (rr.Store == nil || *rr.Store)}
	rs.answer = j.newAnswerStream()
	if rr.Background != nil && *rr.Background {
		s.startBackground(w, r, rs, received)
		return
	}
	ctx, cancel, release, ok := s.admit(w, r, j)
	if !ok {
		return
	}
	defer release()
	defer cancel()
	if j.stream {
		rs.out = &sse{w: w}
	}
	res, err := s.generate(ctx, j.request(rs.id, 0), received, j.newThinkStream(), rs.token)
	if err == nil && rs.out != nil {
		err = rs.out.err
	}
	if err != nil {
		ae := s.backendError(err)
		switch {
		case rs.out == nil || !rs.out.isStarted():
			writeAPIError(w, ae)
		case rs.out.err == nil:
			_ = rs.event("error", map[string]any{"code": ae.Code, "message": ae.Message, "param": ae.Param})
		}
		return
	}
	switch {
	case r.Context().Err() != nil:
		return // the client went away; nobody to answer
	case s.base.Err() != nil && rs.out == nil:
		writeAPIError(w, s.backendError(context.Canceled))
		return
	case ctx.Err() != nil:
		return // shutting down: the stream just ends
	}
	rs.finish(res)
}

// responseRun is one Responses request's answer in the making: its items
// as they come (streamed as events where out is set).
type responseRun struct {
	s       *Server
	ctx     context.Context // the request's, not cancelled with it: a response is kept once answered
	j       *job
	rr      *responsesRequest
	w       http.ResponseWriter
	tenant  string
	conv    []chatMessage // the conversation the response continues: prior then input
	store   bool          // kept once answered
	bg      bool          // a background response: answered at once as queued, kept as it goes
	id      string
	created int64
	out     *sse
	seq     int

	answer  *answerStream
	reason  strings.Builder // the reasoning's text
	rsn     int             // the reasoning's output index, -1 until it has text
	text    strings.Builder // the message's text
	lps     []chatLogprob
	msg     int // the message's output index, -1 until it has text
	items   []any
	callIdx map[int]int // a call's index in the stream → its output index

	// held is a streamed background response's last state, kept only
	// once its events are (runBackground): a gateway that sees it ended may
	// delete everything kept of it.
	held func() error
}

type responseMessage struct {
	Type    string         `json:"type"`
	ID      string         `json:"id"`
	Status  string         `json:"status"`
	Role    string         `json:"role"`
	Content []responsePart `json:"content"`
}

type responsePart struct {
	Type        string        `json:"type"`
	Text        string        `json:"text"`
	Annotations []any         `json:"annotations"`
	Logprobs    []chatLogprob `json:"logprobs"`
}

// textPart is a message's output_text part.
func textPart(text string, lps []chatLogprob) responsePart {
	return responsePart{Type: "output_text", Text: text, Annotations: []any{}, Logprobs: nonNil(lps)}
}

type responseReasoning struct {
	Type    string          `json:"type"`
	ID      string          `json:"id"`
	Status  string          `json:"status"`
	Summary []any           `json:"summary"`
	Content []reasoningPart `json:"content"`
	// EncryptedContent, where the request's include asks for
	// reasoning.encrypted_content, carries the reasoning for a client that
	// keeps no response (store false) to pass back (sealReasoning).
	EncryptedContent string `json:"encrypted_content,omitempty"`
}

type reasoningPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// reasoningItem is the reasoning as an output item, sealed into its
// encrypted_content too where the request's include asks.
func (rs *responseRun) reasoningItem(id, status, text string) responseReasoning {
	it := responseReasoning{Type: "reasoning", ID: id, Status: status, Summary: []any{},
		Content: []reasoningPart{{Type: "reasoning_text", Text: text}}}
	if slices.Contains(rs.rr.Include, "reasoning.encrypted_content") {
		it.EncryptedContent = sealReasoning(text)
	}
	return it
}

// sealedPrefix marks reasoning this gateway sealed.
const sealedPrefix = "troupe-reasoning-v1."

// sealReasoning is text as a reasoning item's encrypted_content: opaque to
// the client, which passes it back, and read by any gateway (openReasoning).
// It hides nothing the response's content does not show.
func sealReasoning(text string) string {
	return sealedPrefix + base64.RawStdEncoding.EncodeToString([]byte(text))
}

// openReasoning reads what sealReasoning made; ok false for anything else
// (another service's encrypted reasoning, which no gateway can read).
func openReasoning(s string) (string, bool) {
	rest, ok := strings.CutPrefix(s, sealedPrefix)
	if !ok {
		return "", false
	}
	b, err := base64.RawStdEncoding.DecodeString(rest)
	if err != nil || !utf8.Valid(b) {
		return "", false
	}
	return string(b), true
}

type responseCall struct {
	Type      string `json:"type"`
	ID        string `json:"id"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	Status    string `json:"status"`
}

// event sends a stream event of type typ with fields.
func (rs *responseRun) event(typ string, fields map[string]any) error {
	fields["type"] = typ
	fields["sequence_number"] = rs.seq
	rs.seq++
	return rs.out.named(typ, fields)
}

// token takes a token's text: content goes to the message, calls to
// their items.
func (rs *responseRun) token(ev *tokenEvent) error {
	if err := rs.start(); err != nil {
		return err
	}
	var lp *chatLogprob
	if rs.j.base.Logprobs {
		l := rs.s.chatLogprob(ev.tok, rs.j.base.TopLogprobs)
		rs.lps = append(rs.lps, l)
		lp = &l
	}
	if rs.out == nil {
		rs.text.WriteString(ev.text)
		return nil
	}
	reasoning, text, tc := rs.answer.push(ev.text)
	return rs.send(reasoning, text, tc, lp)
}

// start opens a stream with the response's first events, once.
func (rs *responseRun) start() error {
	if rs.out == nil || rs.seq > 0 {
		return nil
	}
	if err := rs.event("response.created", map[string]any{"response": rs.object("in_progress", nil, nil)}); err != nil {
		return err
	}
	return rs.event("response.in_progress", map[string]any{"response": rs.object("in_progress", nil, nil)})
}

// send streams reasoning, content and call deltas.
func (rs *responseRun) send(reasoning, text string, tc []toolCallOut, lp *chatLogprob) error {
	if reasoning != "" {
		if rs.rsn < 0 {
			rs.rsn = len(rs.items)
			it := responseReasoning{Type: "reasoning", ID: newID("rs_"), Status: "in_progress", Summary: []any{}, Content: []reasoningPart{}}
			rs.items = append(rs.items, it)
			if err := rs.event("response.output_item.added", map[string]any{"output_index": rs.rsn, "item": it}); err != nil {
				return err
			}
		}
		rs.reason.WriteString(reasoning)
		if err := rs.event("response.reasoning_text.delta", map[string]any{"item_id": rs.items[rs.rsn].(responseReasoning).ID,
			"output_index": rs.rsn, "content_index": 0, "delta": reasoning}); err != nil {
			return err
		}
	}
	if text != "" {
		if rs.msg < 0 {
			rs.msg = len(rs.items)
			m := responseMessage{Type: "message", ID: newID("msg_"), Status: "in_progress", Role: "assistant", Content: []responsePart{}}
			rs.items = append(rs.items, m)
			if err := rs.event("response.output_item.added", map[string]any{"output_index": rs.msg, "item": m}); err != nil {
				return err
			}
			if err := rs.event("response.content_part.added", map[string]any{"item_id": m.ID, "output_index": rs.msg, "content_index": 0,
				"part": textPart("", nil)}); err != nil {
				return err
			}
		}
		rs.text.WriteString(text)
		lps := []chatLogprob{}
		if lp != nil {
			lps = append(lps, *lp)
		}
		if err := rs.event("response.output_text.delta", map[string]any{"item_id": rs.items[rs.msg].(responseMessage).ID, "output_index": rs.msg,
			"content_index": 0, "delta": text, "logprobs": lps}); err != nil {
			return err
		}
	}
	for _, d := range tc {
		k := *d.Index
		if d.ID != "" {
			if rs.callIdx == nil {
				rs.callIdx = map[int]int{}
			}
			rs.callIdx[k] = len(rs.items)
			c := responseCall{Type: "function_call", ID: newID("fc_"), CallID: d.ID, Name: d.Function.Name, Status: "in_progress"}
			rs.items = append(rs.items, c)
			if err := rs.event("response.output_item.added", map[string]any{"output_index": rs.callIdx[k], "item": c}); err != nil {
				return err
			}
		}
		at := rs.callIdx[k]
		c := rs.items[at].(responseCall)
		c.Arguments += d.Function.Arguments
		rs.items[at] = c
		if d.Function.Arguments != "" {
			if err := rs.event("response.function_call_arguments.delta", map[string]any{"item_id": c.ID, "output_index": at, "delta": d.Function.Arguments}); err != nil {
				return err
			}
		}
	}
	return nil
}

// finish answers the whole response, or closes the stream's items and
// sends the response's last event.
func (rs *responseRun) finish(res genResult) {
	// A cut response's text items are incomplete; its calls parsed whole.
	status, details := rs.status(res)
	if rs.out == nil {
		rs.text.WriteString(res.tail)
		o := rs.whole(status, details, &res, nil)
		if !rs.bg {
			writeJSON(rs.w, http.StatusOK, o)
		}
		return
	}
	if rs.start() != nil {
		return
	}
	reasoning, text, tc, _ := rs.answer.end(res.tail)
	if err := rs.send(reasoning, text, tc, nil); err != nil {
		return
	}
	for i, it := range rs.items {
		switch it := it.(type) {
		case responseMessage:
			part := textPart(rs.text.String(), rs.lps)
			it.Status, it.Content = status, []responsePart{part}
			rs.items[i] = it
			if rs.event("response.output_text.done", map[string]any{"item_id": it.ID, "output_index": i, "content_index": 0, "text": part.Text, "logprobs": part.Logprobs}) != nil ||
				rs.event("response.content_part.done", map[string]any{"item_id": it.ID, "output_index": i, "content_index": 0, "part": part}) != nil ||
				rs.event("response.output_item.done", map[string]any{"output_index": i, "item": it}) != nil {
				return
			}
		case responseReasoning:
			it = rs.reasoningItem(it.ID, status, rs.reason.String())
			rs.items[i] = it
			if rs.event("response.reasoning_text.done", map[string]any{"item_id": it.ID, "output_index": i, "content_index": 0, "text": rs.reason.String()}) != nil ||
				rs.event("response.output_item.done", map[string]any{"output_index": i, "item": it}) != nil {
				return
			}
		case responseCall:
			it.Status = "completed"
			rs.items[i] = it
			if rs.event("response.function_call_arguments.done", map[string]any{"item_id": it.ID, "output_index": i, "name": it.Name, "arguments": it.Arguments}) != nil ||
				rs.event("response.output_item.done", map[string]any{"output_index": i, "item": it}) != nil {
				return
			}
		}
	}
	last := "response.completed"
	if status == "incomplete" {
		last = "response.incomplete"
	}
	var calls []ToolCall
	for _, it := range rs.items {
		if c, ok := it.(responseCall); ok {
			calls = append(calls, ToolCall{ID: c.CallID, Name: c.Name, Arguments: c.Arguments})
		}
	}
	_ = rs.event(last, map[string]any{"response": rs.keep(rs.object(status, details, &res), rs.text.String(), calls)})
}

// whole makes the response's output items from its whole text, and keeps
// and returns the response with status, details, res's usage and
// failure's error.
func (rs *responseRun) whole(status string, details any, res *genResult, failure any) map[string]any {
	reasoning, content, calls := rs.j.answer(rs.text.String())
	rs.reason.Reset()
	rs.reason.WriteString(reasoning) // kept with the conversation (put)
	rs.items = rs.items[:0]
	if reasoning != "" {
		rs.items = append(rs.items, rs.reasoningItem(newID("rs_"), status, reasoning))
	}
	if content != "" || len(calls) == 0 {
		rs.items = append(rs.items, responseMessage{Type: "message", ID: newID("msg_"), Status: status, Role: "assistant",
			Content: []responsePart{textPart(content, rs.lps)}})
	}
	for _, c := range calls {
		rs.items = append(rs.items, responseCall{Type: "function_call", ID: newID("fc_"), CallID: c.ID, Name: c.Name, Arguments: c.Arguments, Status: "completed"})
	}
	o := rs.object(status, details, res)
	o["error"] = failure
	return rs.keep(o, content, calls)
}

// keep stores the answered response o, whose output is content and calls,
// where it is to be kept, and returns it. A streamed background
// response's is held until its events are kept (runBackground).
func (rs *responseRun) keep(o map[string]any, content string, calls []ToolCall) map[string]any {
	if !rs.store {
		return o
	}
	o["store"] = true
	if rs.bg && rs.out != nil {
		rs.held = func() error { return rs.put(o, content, calls) }
		return o
	}
	if rs.put(o, content, calls) != nil {
		o["store"] = false // not kept: a later request will not find it
	}
	return o
}

// put stores o, whose output is content and calls, under the response's
// id with the conversation it ends.
func (rs *responseRun) put(o map[string]any, content string, calls []ToolCall) error {
	b, err := json.Marshal(o)
	if err != nil {
		return err
	}
	out := chatMessage{Role: "assistant", Content: messageContent{text: content, set: content != ""}, ReasoningContent: rs.reason.String()}
	if len(calls) > 0 {
		tc := make([]toolCallOut, len(calls))
		for i, c := range calls {
			tc[i] = callOut(c)
		}
		out.ToolCalls, _ = json.Marshal(tc)
	}
	v := &storedResponse{Tenant: rs.tenant, Conv: append(slices.Clip(rs.conv), out), Object: b}
	if rs.bg {
		v.Beat = time.Now().UnixMilli()
	}
	return rs.s.responses.put(rs.ctx, rs.id, v)
}

// status is the response's status, with why it is incomplete.
func (rs *responseRun) status(res genResult) (string, any) {
	if res.finish.Reason == FinishLength {
		return "incomplete", map[string]string{"reason": "max_output_tokens"}
	}
	return "completed", nil
}

// object is the response as the API shows it: its items so far, and with
// res its usage.
func (rs *responseRun) object(status string, details any, res *genResult) map[string]any {
	rr := rs.rr
	o := map[string]any{
		"id": rs.id, "object": "response", "created_at": rs.created, "status": status, "error": nil,
		"incomplete_details": details, "instructions": rr.Instructions, "max_output_tokens": rr.MaxOutputTokens,
		"model": rs.j.model.ID, "output": nonNil(rs.items), "parallel_tool_calls": rs.j.tools.parallel,
		"previous_response_id": previousID(rr.PreviousResponseID), "store": false, "temperature": rs.j.base.Temperature, "top_p": rs.j.base.TopP,
		"tool_choice": orDefault(rr.ToolChoice, `"auto"`), "tools": orDefault(rr.Tools, `[]`),
		"text": orDefault(rr.Text, `{"format":{"type":"text"}}`), "truncation": truncationOf(rr), "metadata": nonNilMap(rr.Metadata),
		"usage": nil, "user": rr.User, "background": rs.bg,
	}
	if res != nil {
		in := len(rs.j.prompts[0])
		o["usage"] = map[string]any{
			"input_tokens": in, "input_tokens_details": map[string]int{"cached_tokens": res.finish.CachedTokens},
			"output_tokens": res.finish.CompletionTokens, "output_tokens_details": map[string]int{"reasoning_tokens": res.reasoning},
			"total_tokens": in + res.finish.CompletionTokens,
		}
	}
	return o
}

// responseChat validates a Responses request as the chat completion it
// asks for, after the conversation prior. With truncation "auto", a
// conversation that does not fit the context loses its oldest turns: the
// fewest that make it fit, cut before a user's message (so that no answer
// or tool output is left without what it answers), the request's own
// input kept. It returns the prior turns kept
// and the input.
func (v *validator) responseChat(rr *responsesRequest, cr *chatRequest, prior []chatMessage, tenant string) (kept, input []chatMessage, j *job, aerr *apiError) {
	auto := false
	if t := rr.Truncation; t != nil && *t != "disabled" {
		if *t != "auto" {
			return nil, nil, nil, invalidParam("truncation", "truncation is %q, want auto or disabled", truncate(*t, 20))
		}
		auto = true
	}
	try := func(cut int) *apiError {
		if input, aerr = rr.chat(cr, prior[cut:]); aerr == nil {
			j, aerr = v.chat(cr, tenant)
		}
		return aerr
	}
	tooLong := func(e *apiError) bool { return e != nil && e.Code == "context_length_exceeded" }
	if !tooLong(try(0)) || !auto || len(prior) == 0 {
		return prior, input, j, aerr
	}
	// A shorter conversation fits where a longer one does: the first cut
	// that fits is found by halving.
	var cuts []int
	for c := 1; c <= len(prior); c++ {
		if c == len(prior) || prior[c].Role == "user" {
			cuts = append(cuts, c)
		}
	}
	i := sort.Search(len(cuts), func(i int) bool { return !tooLong(try(cuts[i])) })
	cut := cuts[min(i, len(cuts)-1)]
	try(cut)
	return prior[cut:], input, j, aerr
}

// truncationOf is the truncation a response names: its request's, or
// "disabled".
func truncationOf(rr *responsesRequest) string {
	if rr.Truncation != nil && *rr.Truncation == "auto" {
		return "auto"
	}
	return "disabled"
}

// previousID is the response a request continued, or null.
func previousID(id *string) any {
	if id == nil || *id == "" {
		return nil
	}
	return *id
}

func orDefault(raw json.RawMessage, def string) json.RawMessage {
	if !unset(raw) {
		return raw
	}
	return json.RawMessage(def)
}

func nonNilMap(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// storeError is the answer to a request the response store failed.
func storeError(err error) *apiError {
	return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "response_store_unavailable",
		Message: "the store of kept responses failed: " + truncate(err.Error(), 200)}
}

// notKept is the answer about a response the store has none of.
func notKept(id string) *apiError {
	return &apiError{Status: http.StatusNotFound, Type: typeInvalidRequest, Code: "response_not_found", Message: "response " + truncate(id, 80) + " is not kept here"}
}

// keptResponse is the kept response the path's id names, for the
// request's tenant; where there is none, or the store failed, it has
// answered and returns nil.
func (s *Server) keptResponse(w http.ResponseWriter, r *http.Request) *storedResponse {
	id := r.PathValue("id")
	resp, err := s.responses.get(r.Context(), id, tenantOf(r.Context()))
	switch {
	case err != nil:
		writeAPIError(w, storeError(err))
	case resp == nil:
		writeAPIError(w, notKept(id))
	}
	return resp
}

func (s *Server) handleGetResponse(w http.ResponseWriter, r *http.Request) {
	if streamAsked(r) {
		s.handleStreamResponse(w, r)
		return
	}
	if resp := s.settle(w, r, s.keptResponse(w, r)); resp != nil {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(resp.Object)
	}
}

// handleDeleteResponse deletes a kept response, a running background
// response once it is cancelled.
func (s *Server) handleDeleteResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	resp := s.keptResponse(w, r)
	if resp == nil || s.stopBackground(w, r, resp) == nil {
		return
	}
	ok, err := s.responses.drop(r.Context(), id, tenantOf(r.Context()))
	if err != nil {
		writeAPIError(w, storeError(err))
		return
	}
	if !ok {
		writeAPIError(w, notKept(id))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": "response", "deleted": true})
}
