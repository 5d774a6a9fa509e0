package gateway

import (
	"bytes"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
)

// Tool calling in chat completions: a request's tools reach the chat
// template, and its tool_choice says how a choice's calls are read. With
// "required" or a named function the calls are generated under a JSON
// schema (the backend's constrained decoding), so they always parse and
// follow the functions' parameters; with "auto" the model calls a function
// by writing <tool_call>{"name": ..., "arguments": ...}</tool_call>, as
// templates of the Hermes convention (Qwen among them) teach it to, or by
// answering with nothing but calls in bare JSON, as Llama 3's do.

const (
	maxTools     = 128 // tools in a request, as OpenAI allows
	maxToolCalls = 128 // calls in one assistant message of the history
	callOpen     = "<tool_call>"
	callClose    = "</tool_call>"
	spaces       = " \t\r\n"
)

// toolNameRE is OpenAI's rule for a function's name.
var toolNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// toolMode is how a choice's text becomes tool calls.
type toolMode uint8

const (
	toolsOff      toolMode = iota // no tools, or tool_choice "none": text
	toolsAuto                     // the model's own <tool_call> blocks, where it writes any
	toolsRequired                 // the calls' document (callsSchema)
	toolsNamed                    // one function's arguments: the text is the arguments object
)

// toolPlan is a chat job's tools and how its choices' calls are read.
type toolPlan struct {
	mode  toolMode
	tools []Tool // the functions the model may call (tool_choice's allowed_tools)
	// name is the function whose arguments the text is (toolsNamed, or
	// toolsRequired of a single function).
	name string
	// parallel lets "required" make several calls (parallel_tool_calls).
	parallel bool
}

// parseTools validates a request's tools.
func parseTools(raw json.RawMessage) ([]Tool, *apiError) {
	if unset(raw) {
		return nil, nil
	}
	var in []struct {
		Type     string `json:"type"`
		Function *struct {
			Name        string          `json:"name"`
			Description string          `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
			Strict      *bool           `json:"strict"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &in); err != nil {
		return nil, invalidParam("tools", `tools must be an array of {"type": "function", "function": {"name": ..., "parameters": ...}}`)
	}
	if len(in) > maxTools {
		return nil, invalidParam("tools", "tools has %d functions, want at most %d", len(in), maxTools)
	}
	out := make([]Tool, len(in))
	seen := make(map[string]bool, len(in))
	for i, t := range in {
		if t.Type != "function" {
			return nil, badRequest("tools", "unsupported_parameter", "tools[%d]: type %q is not supported; only \"function\" is", i, truncate(t.Type, 40))
		}
		f := t.Function
		if f == nil {
			return nil, invalidParam("tools", "tools[%d] has no function", i)
		}
		if !toolNameRE.MatchString(f.Name) {
			return nil, invalidParam("tools", "tools[%d]: function name %q must be 1 to 64 letters, digits, underscores or dashes", i, truncate(f.Name, 80))
		}
		if seen[f.Name] {
			return nil, invalidParam("tools", "tools[%d]: function %q is named twice", i, f.Name)
		}
		seen[f.Name] = true
		out[i] = Tool{Name: f.Name, Description: f.Description}
		if p := f.Parameters; !unset(p) {
			var c bytes.Buffer
			if json.Compact(&c, p) != nil || c.Bytes()[0] != '{' {
				return nil, invalidParam("tools", "tools[%d]: function %q: parameters must be a JSON schema object", i, f.Name)
			}
			out[i].Parameters = c.String()
		}
	}
	return out, nil
}

// parseToolChoice reads tool_choice (and parallel_tool_calls) against the
// request's tools into its plan: "none", "auto", "required", a named
// function, or allowed_tools (auto or required among some of the tools).
func parseToolChoice(raw json.RawMessage, tools []Tool, parallel *bool) (toolPlan, *apiError) {
	p := toolPlan{tools: tools}
	raw = bytes.TrimSpace(raw)
	choice := "auto"
	const forms = `"none", "auto", "required", {"type": "function", "function": {"name": ...}} or {"type": "allowed_tools", "allowed_tools": {"mode", "tools"}}`
	if !unset(raw) {
		var obj struct {
			Type     string `json:"type"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
			AllowedTools struct {
				Mode  string `json:"mode"`
				Tools []struct {
					Type     string `json:"type"`
					Function struct {
						Name string `json:"name"`
					} `json:"function"`
				} `json:"tools"`
			} `json:"allowed_tools"`
		}
		switch {
		case json.Unmarshal(raw, &choice) == nil:
			if choice != "none" && choice != "auto" && choice != "required" {
				return p, invalidParam("tool_choice", "tool_choice %q is not one of %s", truncate(choice, 40), forms)
			}
		case json.Unmarshal(raw, &obj) != nil:
			return p, invalidParam("tool_choice", "tool_choice must be %s", forms)
		case obj.Type == "function":
			if !toolNamed(tools, obj.Function.Name) {
				return p, invalidParam("tool_choice", "tool_choice names function %q, which tools does not list", truncate(obj.Function.Name, 80))
			}
			choice, p.name = "function", obj.Function.Name
		case obj.Type == "allowed_tools":
			at := obj.AllowedTools
			if at.Mode != "auto" && at.Mode != "required" || len(at.Tools) == 0 {
				return p, invalidParam("tool_choice", `allowed_tools needs a mode, "auto" or "required", and tools`)
			}
			p.tools = nil
			for _, t := range at.Tools {
				if t.Type != "function" || !toolNamed(tools, t.Function.Name) {
					return p, invalidParam("tool_choice", "allowed_tools names function %q, which tools does not list", truncate(t.Function.Name, 80))
				}
				if !toolNamed(p.tools, t.Function.Name) {
					p.tools = append(p.tools, tools[slices.IndexFunc(tools, func(x Tool) bool { return x.Name == t.Function.Name })])
				}
			}
			choice = at.Mode
		default:
			return p, invalidParam("tool_choice", "tool_choice must be %s", forms)
		}
		if choice != "none" && len(tools) == 0 {
			return p, invalidParam("tool_choice", "tool_choice %s needs tools", truncate(string(raw), 80))
		}
	}
	if parallel != nil && len(tools) == 0 {
		return p, invalidParam("parallel_tool_calls", "parallel_tool_calls is only allowed with tools")
	}
	p.parallel = parallel == nil || *parallel
	switch {
	case len(tools) == 0 || choice == "none":
		p.mode = toolsOff
	case choice == "auto":
		p.mode = toolsAuto
	case choice == "function":
		p.mode = toolsNamed
	case len(p.tools) == 1:
		// One function: the text is its arguments, as for a named one.
		p.mode, p.name = toolsRequired, p.tools[0].Name
	default:
		p.mode = toolsRequired
	}
	return p, nil
}

func toolNamed(tools []Tool, name string) bool {
	for _, t := range tools {
		if t.Name == name {
			return true
		}
	}
	return false
}

// schema is the JSON schema a constrained plan's text follows, compact;
// "" where the text is free.
func (p *toolPlan) schema() string {
	switch {
	case p.mode != toolsNamed && p.mode != toolsRequired:
		return ""
	case p.name != "":
		for _, t := range p.tools {
			if t.Name == p.name {
				return argumentsSchema(t)
			}
		}
		return ""
	}
	// {"tool_calls": [{"<name>": <arguments>}, ...]}: each item one
	// function's key, whose value is its arguments.
	var b strings.Builder
	b.WriteString(`{"type":"object","properties":{"tool_calls":{"type":"array","minItems":1,`)
	if !p.parallel {
		b.WriteString(`"maxItems":1,`)
	}
	b.WriteString(`"items":{"type":"object","properties":{`)
	for i, t := range p.tools {
		if i > 0 {
			b.WriteByte(',')
		}
		name, _ := json.Marshal(t.Name)
		b.Write(name)
		b.WriteByte(':')
		// The function's references are to its own parameters' root,
		// which is here in the document (names need no escaping in a
		// JSON pointer: toolNameRE).
		args := argumentsSchema(t)
		if moved, err := rebaseRefs(args, "#/properties/tool_calls/items/properties/"+t.Name); err == nil {
			args = moved
		}
		b.WriteString(args)
	}
	b.WriteString(`},"additionalProperties":false,"minProperties":1,"maxProperties":1}}},"required":["tool_calls"],"additionalProperties":false}`)
	return b.String()
}

// argumentsSchema is a function's parameters: for one that takes none the
// empty object's, and for {} (any value) any object's.
func argumentsSchema(t Tool) string {
	switch t.Parameters {
	case "":
		return `{"type":"object","additionalProperties":false}`
	case "{}":
		return `{"type":"object"}`
	}
	return t.Parameters
}

// calls reads the tool calls a choice's whole text makes under the plan:
// the text left as content, and the calls, whose ids newCallID gives.
// Text that does not parse (cut by max_tokens, say) is all content.
func (p *toolPlan) calls(text string) (string, []ToolCall) {
	switch p.mode {
	case toolsNamed, toolsRequired:
		if p.name != "" {
			if args := strings.TrimSpace(text); json.Valid([]byte(args)) && strings.HasPrefix(args, "{") {
				return "", []ToolCall{{ID: newCallID(), Name: p.name, Arguments: args}}
			}
			return text, nil
		}
		var doc struct {
			ToolCalls []map[string]json.RawMessage `json:"tool_calls"`
		}
		if json.Unmarshal([]byte(text), &doc) != nil || len(doc.ToolCalls) == 0 {
			return text, nil
		}
		var calls []ToolCall
		for _, item := range doc.ToolCalls {
			if len(item) != 1 {
				return text, nil
			}
			for name, args := range item {
				calls = append(calls, ToolCall{ID: newCallID(), Name: name, Arguments: string(args)})
			}
		}
		return "", calls
	case toolsAuto:
		return p.hermesCalls(text)
	}
	return text, nil
}

// hermesCalls reads the <tool_call> blocks of text as callStream does
// streamed: the text around them is content, and so is a block that does
// not hold a call ({"name": ..., "arguments": {...}}, or "parameters") of
// one of the plan's tools.
func (p *toolPlan) hermesCalls(text string) (string, []ToolCall) {
	s := callStream{plan: p}
	s.held.WriteString(text)
	content, calls := s.finish()
	if len(calls) == 0 {
		return text, nil
	}
	return content, calls
}

// parseCall reads one call's JSON: {"name": "f", "arguments": {...}}, the
// arguments also as a string of JSON or under "parameters".
func parseCall(block string) (ToolCall, bool) {
	var c struct {
		Name       string          `json:"name"`
		Arguments  json.RawMessage `json:"arguments"`
		Parameters json.RawMessage `json:"parameters"`
	}
	if json.Unmarshal([]byte(strings.TrimSpace(block)), &c) != nil || !toolNameRE.MatchString(c.Name) {
		return ToolCall{}, false
	}
	args := bytes.TrimSpace(c.Arguments)
	if len(args) == 0 {
		args = bytes.TrimSpace(c.Parameters)
	}
	if len(args) > 0 && args[0] == '"' {
		var s string
		if json.Unmarshal(args, &s) != nil {
			return ToolCall{}, false
		}
		args = []byte(strings.TrimSpace(s))
	}
	switch {
	case unset(args):
		args = []byte("{}")
	case args[0] != '{' || !json.Valid(args):
		return ToolCall{}, false
	}
	return ToolCall{ID: newCallID(), Name: c.Name, Arguments: string(args)}, true
}

// newCallID is a tool call's id, as OpenAI's: "call_" and random letters.
func newCallID() string { return newID("call_") }

// callStream turns a streamed choice's text into the content and tool
// calls to send as they come: under "auto" text that may open a
// <tool_call> is held until it does or cannot, and a block is sent as one
// call once it closes; a named function's arguments stream as they come;
// the calls' document of "required" is read whole at the end.
type callStream struct {
	plan      *toolPlan
	held      strings.Builder // auto: text that may open a block, or an open block; required: all
	calls     int             // calls sent
	afterCall bool            // auto: no content since the last call
	wrote     bool            // auto: content sent
	bare      int8            // auto: 1 where the answer begins with '{' (bareAnswer), -1 where not, 0 while blank
}

// push takes a token's text and returns the content and calls to send.
func (s *callStream) push(text string) (string, []toolCallOut) {
	switch s.plan.mode {
	case toolsNamed, toolsRequired:
		if s.plan.name == "" {
			s.held.WriteString(text)
			return "", nil
		}
		if s.calls == 0 {
			if text == "" {
				return "", nil
			}
			s.calls = 1
			return "", []toolCallOut{callDelta(0, ToolCall{ID: newCallID(), Name: s.plan.name, Arguments: text})}
		}
		if text == "" {
			return "", nil
		}
		return "", []toolCallOut{{Index: ptr(0), Function: toolFunctionOut{Arguments: text}}}
	case toolsAuto:
		s.held.WriteString(text)
		if s.bareAnswer() {
			return "", nil
		}
		content, calls := s.scan(false)
		return content, s.deltas(calls)
	}
	return text, nil
}

// bareAnswer reports whether the answer so far may be calls written as
// bare JSON (Llama 3's convention: {"name": ..., "parameters": {...}},
// several parted by ';'), which wait whole for the end: while it is
// blank, and once it begins with '{'.
func (s *callStream) bareAnswer() bool {
	if s.bare == 0 {
		t := strings.TrimLeft(s.held.String(), spaces)
		switch {
		case t == "":
			return true
		case t[0] == '{':
			s.bare = 1
		default:
			s.bare = -1
		}
	}
	return s.bare > 0
}

// finish reads what auto's held text makes at the end: bare calls, or
// content and blocks' calls.
func (s *callStream) finish() (string, []ToolCall) {
	if s.bareAnswer() {
		if calls := bareCalls(s.held.String(), s.plan.tools); calls != nil {
			s.held.Reset()
			return "", calls
		}
	}
	return s.scan(true)
}

// bareCalls reads text as one or more calls of tools in bare JSON, parted
// by ';' and spaces, or returns nil.
func bareCalls(text string, tools []Tool) []ToolCall {
	var calls []ToolCall
	for {
		if text = strings.TrimLeft(text, spaces); text == "" {
			return calls
		}
		dec := json.NewDecoder(strings.NewReader(text))
		var raw json.RawMessage
		if dec.Decode(&raw) != nil {
			return nil
		}
		c, ok := parseCall(string(raw))
		if !ok || !toolNamed(tools, c.Name) {
			return nil
		}
		calls = append(calls, c)
		text, _ = strings.CutPrefix(strings.TrimLeft(text[dec.InputOffset():], spaces), ";")
	}
}

// end takes the text held for a stop string and returns what is left to
// send, and whether the choice made calls.
func (s *callStream) end(tail string) (string, []toolCallOut, bool) {
	switch s.plan.mode {
	case toolsNamed, toolsRequired:
		if s.plan.name != "" {
			content, calls := s.push(tail)
			return content, calls, s.calls > 0
		}
		s.held.WriteString(tail)
		content, calls := s.plan.calls(s.held.String())
		return content, s.deltas(calls), len(calls) > 0
	case toolsAuto:
		s.held.WriteString(tail)
		content, calls := s.finish()
		return content, s.deltas(calls), s.calls > 0
	}
	return tail, nil, false
}

// scan sends what the held text settles: content before a possible
// opening, and each closed block's call; at the end (last), all of it.
// The spaces between content and a call are neither's; content on both
// sides of calls is parted by a newline.
func (s *callStream) scan(last bool) (string, []ToolCall) {
	var content strings.Builder
	var calls []ToolCall
	emit := func(seg string) {
		if s.afterCall {
			if seg = strings.TrimLeft(seg, spaces); seg == "" {
				return
			}
			s.afterCall = false
			if s.wrote {
				content.WriteByte('\n')
			}
		}
		s.wrote = s.wrote || seg != ""
		content.WriteString(seg)
	}
	h := s.held.String()
	for {
		i := strings.Index(h, callOpen)
		if i < 0 {
			break
		}
		j := strings.Index(h[i:], callClose)
		if j < 0 {
			// An open block waits, with the spaces before it.
			cut := len(strings.TrimRight(h[:i], spaces))
			if last {
				cut = len(h)
			}
			emit(h[:cut])
			s.held.Reset()
			s.held.WriteString(h[cut:])
			return content.String(), calls
		}
		if c, ok := parseCall(h[i+len(callOpen) : i+j]); ok && toolNamed(s.plan.tools, c.Name) {
			emit(strings.TrimRight(h[:i], spaces))
			calls = append(calls, c)
			s.afterCall = true
		} else {
			emit(h[:i+j+len(callClose)])
		}
		h = h[i+j+len(callClose):]
	}
	keep := 0
	if !last {
		// What may open a block waits, and the spaces before it.
		keep = suffixOf(h, callOpen)
		body := h[:len(h)-keep]
		keep += len(body) - len(strings.TrimRight(body, spaces))
	}
	emit(h[:len(h)-keep])
	s.held.Reset()
	s.held.WriteString(h[len(h)-keep:])
	return content.String(), calls
}

// deltas are calls as a stream's deltas, numbered on from those sent.
func (s *callStream) deltas(calls []ToolCall) []toolCallOut {
	var out []toolCallOut
	for _, c := range calls {
		out = append(out, callDelta(s.calls, c))
		s.calls++
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// toolCallOut is a tool call in a response, or (with Index) a streamed
// delta of one.
type toolCallOut struct {
	Index    *int            `json:"index,omitempty"`
	ID       string          `json:"id,omitempty"`
	Type     string          `json:"type,omitempty"`
	Function toolFunctionOut `json:"function"`
}

type toolFunctionOut struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// callOut is call c in a message.
func callOut(c ToolCall) toolCallOut {
	return toolCallOut{ID: c.ID, Type: "function", Function: toolFunctionOut{Name: c.Name, Arguments: c.Arguments}}
}

// callDelta is call c, the choice's i-th, as a streamed delta's first.
func callDelta(i int, c ToolCall) toolCallOut {
	o := callOut(c)
	o.Index = ptr(i)
	return o
}
