package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Limits on request fields that are not configurable.
const (
	maxStops        = 4
	maxStopBytes    = 1024
	maxTopLogprobs  = 20 // chat
	maxLogprobsLeg  = 5  // legacy completions
	maxMessages     = 4096
	maxTemperature  = 2
	maxRepetitionPn = 10
)

// MaxLogitBias is the most tokens a request's logit_bias may name: the
// engine's limit too (the command's tests check that they agree).
const MaxLogitBias = 1024

// maxSchemaBytes bounds a json_schema response format's schema, compacted.
const maxSchemaBytes = 32 << 10

// stopList is the stop parameter: a string, an array of strings, or null.
type stopList []string

func (s *stopList) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")):
		*s = nil
		return nil
	case len(b) > 0 && b[0] == '"':
		var one string
		if err := json.Unmarshal(b, &one); err != nil {
			return &fieldError{"stop", "not a valid string"}
		}
		*s = stopList{one}
		return nil
	case len(b) > 0 && b[0] == '[':
		var many []string
		if err := json.Unmarshal(b, &many); err != nil {
			return &fieldError{"stop", "want a string or an array of strings"}
		}
		*s = many
		return nil
	}
	return &fieldError{"stop", "want a string or an array of strings"}
}

// promptInput is the completions prompt: a string, an array of strings, an array of
// token ids, or an array of arrays of token ids.
type promptInput struct {
	texts []string
	ids   [][]int32
	set   bool
}

func (p *promptInput) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	const want = "want a string, an array of strings, an array of token ids or an array of arrays of token ids"
	*p = promptInput{}
	if unset(b) {
		return nil
	}
	p.set = true
	switch b[0] {
	case '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return &fieldError{"prompt", "not a valid string"}
		}
		p.texts = []string{s}
		return nil
	case '[':
	default:
		return &fieldError{"prompt", want}
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(b, &elems); err != nil {
		return &fieldError{"prompt", want}
	}
	if len(elems) == 0 {
		return &fieldError{"prompt", "empty array"}
	}
	first := bytes.TrimSpace(elems[0])
	if len(first) == 0 {
		return &fieldError{"prompt", want}
	}
	switch {
	case first[0] == '"':
		if err := json.Unmarshal(b, &p.texts); err != nil {
			return &fieldError{"prompt", "mixes strings with other values; " + want}
		}
	case first[0] == '[':
		if err := json.Unmarshal(b, &p.ids); err != nil {
			return &fieldError{"prompt", "arrays of token ids must hold integers from 0 to 2147483647"}
		}
	case first[0] == '-' || (first[0] >= '0' && first[0] <= '9'):
		var ids []int32
		if err := json.Unmarshal(b, &ids); err != nil {
			return &fieldError{"prompt", "token ids must be integers from 0 to 2147483647"}
		}
		p.ids = [][]int32{ids}
	default:
		return &fieldError{"prompt", want}
	}
	return nil
}

// wsPrompt is the websocket prompt: a string or one array of token ids.
type wsPrompt struct {
	text string
	ids  []int32
	set  bool
}

func (p *wsPrompt) UnmarshalJSON(b []byte) error {
	var pi promptInput
	if err := pi.UnmarshalJSON(b); err != nil {
		return err
	}
	*p = wsPrompt{set: pi.set}
	switch {
	case !pi.set:
	case len(pi.texts) == 1:
		p.text = pi.texts[0]
	case len(pi.ids) == 1:
		p.ids = pi.ids[0]
	default:
		return &fieldError{"prompt", "want one string or one array of token ids"}
	}
	return nil
}

// messageContent is a chat message's content: a string, an array of text parts, or null.
type messageContent struct {
	text string
	set  bool
}

// MarshalJSON writes the content as a string, or null where it was not set
// (a kept conversation reads back as it was).
func (c messageContent) MarshalJSON() ([]byte, error) {
	if !c.set {
		return []byte("null"), nil
	}
	return json.Marshal(c.text)
}

func (c *messageContent) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	*c = messageContent{}
	if unset(b) {
		return nil
	}
	c.set = true
	if b[0] == '"' {
		if err := json.Unmarshal(b, &c.text); err != nil {
			return &fieldError{"messages", "content is not a valid string"}
		}
		return nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(b, &parts); err != nil {
		return &fieldError{"messages", "content must be a string or an array of content parts"}
	}
	var sb strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return &fieldError{"messages", fmt.Sprintf("content part type %q is not supported; only \"text\" is", p.Type)}
		}
		if p.Text == nil {
			return &fieldError{"messages", "a text content part lacks its text"}
		}
		sb.WriteString(*p.Text)
	}
	c.text = sb.String()
	return nil
}

type chatMessage struct {
	Role             string          `json:"role"`
	Content          messageContent  `json:"content"`
	Name             string          `json:"name,omitempty"`
	ToolCalls        json.RawMessage `json:"tool_calls,omitempty"`
	ToolCallID       string          `json:"tool_call_id,omitempty"`
	ReasoningContent string          `json:"reasoning_content,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// sampling holds the parameters shared by every generating request.
type sampling struct {
	Model             string          `json:"model"`
	MaxTokens         *int            `json:"max_tokens"`
	Temperature       *float64        `json:"temperature"`
	TopP              *float64        `json:"top_p"`
	TopK              *int            `json:"top_k"`
	MinP              *float64        `json:"min_p"`
	RepetitionPenalty *float64        `json:"repetition_penalty"`
	PresencePenalty   *float64        `json:"presence_penalty"`
	FrequencyPenalty  *float64        `json:"frequency_penalty"`
	LogitBias         map[string]any  `json:"logit_bias"`
	Seed              *int64          `json:"seed"`
	Stop              stopList        `json:"stop"`
	User              string          `json:"user"`
	IgnoreEOS         bool            `json:"ignore_eos"`
	N                 *int            `json:"n"`
	Stream            bool            `json:"stream"`
	StreamOptions     *streamOptions  `json:"stream_options"`
	ResponseFormat    json.RawMessage `json:"response_format"`
}

// toolFields are a chat request's tools and how the model may call them.
type toolFields struct {
	Tools             json.RawMessage `json:"tools"`
	ToolChoice        json.RawMessage `json:"tool_choice"`
	ParallelToolCalls *bool           `json:"parallel_tool_calls"`
}

type chatRequest struct {
	sampling
	Messages            []chatMessage `json:"messages"`
	MaxCompletionTokens *int          `json:"max_completion_tokens"`
	Logprobs            *bool         `json:"logprobs"`
	TopLogprobs         *int          `json:"top_logprobs"`
	toolFields
	Functions           json.RawMessage `json:"functions"`
	FunctionCall        json.RawMessage `json:"function_call"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
	// ChatTemplateKwargs are further variables for the chat template
	// (vLLM's extension; Qwen 3's enable_thinking, say).
	ChatTemplateKwargs map[string]json.RawMessage `json:"chat_template_kwargs"`
	// ReasoningEffort "none" asks a thinking model not to reason
	// (thinkingOff); the other efforts leave it as its template has it.
	ReasoningEffort *string `json:"reasoning_effort"`
	effortParam     string  // the parameter ReasoningEffort came from, where not reasoning_effort
}

type completionRequest struct {
	sampling
	Prompt   promptInput `json:"prompt"`
	Logprobs *int        `json:"logprobs"`
	Echo     bool        `json:"echo"`
	Suffix   *string     `json:"suffix"`
	BestOf   *int        `json:"best_of"`
}

// job is a validated request, ready to run: prompts × n generations.
type job struct {
	model        ModelInfo
	prompts      [][]int32
	maxTokens    []int // per prompt
	n            int
	base         GenerateRequest // sampling fields; RequestID, Prompt and MaxTokens unset
	stream       bool
	includeUsage bool
	tools        toolPlan // chat: the tools and how the choices' calls are read
	inThink      bool     // chat: the prompt ends inside <think> (ModelInfo.Reasoning)
	echo         []string // completions with echo: each prompt's text, which its choices begin with
	echoOnly     bool     // echo with max_tokens 0: the prompts alone, the token generated not sent
}

// echoed is the text choice i begins with: its prompt's where echo asks.
func (j *job) echoed(i int) string {
	if j.echo == nil {
		return ""
	}
	return j.echo[i/j.n]
}

// choices is the number of generations the job runs.
func (j *job) choices() int { return len(j.prompts) * j.n }

// request returns the GenerateRequest of choice i.
func (j *job) request(id string, i int) GenerateRequest {
	r := j.base
	p := i / j.n
	r.RequestID = fmt.Sprintf("%s-%d", id, i)
	r.Prompt = j.prompts[p]
	r.MaxTokens = j.maxTokens[p]
	if j.base.Seed != nil {
		s := *j.base.Seed + int64(i)
		r.Seed = &s
	}
	return r
}

// validator checks requests against the server's configuration.
type validator struct {
	cfg    *Config
	models map[string]ModelInfo
	tok    Tokenizer
	tmpl   ChatTemplate
}

func (v *validator) model(name string) (ModelInfo, *apiError) {
	if name == "" {
		return ModelInfo{}, badRequest("model", "missing_model", "model is required")
	}
	m, ok := v.models[name]
	if !ok {
		return ModelInfo{}, badRequest("model", "model_not_found", "the model %q does not exist; served models: %s", truncate(name, 200), v.modelList())
	}
	return m, nil
}

func (v *validator) modelList() string {
	ids := make([]string, len(v.cfg.Models))
	for i, m := range v.cfg.Models {
		ids[i] = fmt.Sprintf("%q", m.ID)
	}
	return strings.Join(ids, ", ")
}

// sampling validates the shared parameters into j.base and j.n.
func (v *validator) sampling(s *sampling, j *job) *apiError {
	m, err := v.model(s.Model)
	if err != nil {
		return err
	}
	j.model = m
	b := &j.base
	b.Model = m.ID
	j.n = 1
	if s.N != nil {
		if *s.N < 1 || *s.N > v.cfg.MaxN {
			return invalidParam("n", "n is %d, want 1 to %d", *s.N, v.cfg.MaxN)
		}
		j.n = *s.N
	}
	m.Defaults.fill(s)
	if err := s.sampler(b); err != nil {
		return err
	}
	for _, p := range []struct {
		name string
		v    *float64
		dst  *float32
	}{{"presence_penalty", s.PresencePenalty, &b.PresencePenalty}, {"frequency_penalty", s.FrequencyPenalty, &b.FrequencyPenalty}} {
		if p.v != nil {
			if !(*p.v >= -2 && *p.v <= 2) {
				return invalidParam(p.name, "%s is %g, want -2 to 2", p.name, *p.v)
			}
			*p.dst = float32(*p.v)
		}
	}
	if err := logitBias(s.LogitBias, m.VocabSize, b); err != nil {
		return err
	}
	if len(s.Stop) > maxStops {
		return invalidParam("stop", "stop has %d sequences, want at most %d", len(s.Stop), maxStops)
	}
	for i, st := range s.Stop {
		if st == "" {
			return invalidParam("stop", "stop sequence %d is empty", i)
		}
		if len(st) > maxStopBytes {
			return invalidParam("stop", "stop sequence %d is %d bytes, want at most %d", i, len(st), maxStopBytes)
		}
	}
	b.Stop = append([]string(nil), s.Stop...)
	b.Seed = s.Seed
	b.User = s.User
	b.IgnoreEOS = s.IgnoreEOS
	if s.MaxTokens != nil && *s.MaxTokens < 1 {
		return invalidParam("max_tokens", "max_tokens is %d, want at least 1", *s.MaxTokens)
	}
	if s.StreamOptions != nil && !s.Stream {
		return invalidParam("stream_options", "stream_options is only allowed when stream is true")
	}
	j.stream = s.Stream
	j.includeUsage = s.StreamOptions != nil && s.StreamOptions.IncludeUsage
	if rf := s.ResponseFormat; !unset(rf) {
		var f struct {
			Type       string `json:"type"`
			JSONSchema *struct {
				Schema json.RawMessage `json:"schema"`
			} `json:"json_schema"`
		}
		switch err := json.Unmarshal(rf, &f); {
		case err == nil && f.Type == "text":
		case err == nil && f.Type == "json_object":
			b.JSON = true
		case err == nil && f.Type == "json_schema":
			var schema bytes.Buffer
			if f.JSONSchema == nil || json.Compact(&schema, f.JSONSchema.Schema) != nil || schema.Len() == 0 || schema.Bytes()[0] != '{' {
				return invalidParam("response_format", "response_format json_schema needs json_schema.schema, a JSON schema object")
			}
			if schema.Len() > maxSchemaBytes {
				return invalidParam("response_format", "json_schema.schema is %d bytes, want at most %d", schema.Len(), maxSchemaBytes)
			}
			b.JSON, b.Schema = true, schema.String()
		default:
			return badRequest("response_format", "unsupported_parameter", "response_format %s is not supported; the types are text, json_object and json_schema", truncate(string(rf), 80))
		}
	}
	return nil
}

// logitBias validates OpenAI's logit_bias (token ids as strings, biases
// from -100 to 100) into b.LogitBias; vocab 0 checks no upper bound.
func logitBias(lb map[string]any, vocab int, b *GenerateRequest) *apiError {
	if len(lb) == 0 {
		return nil
	}
	if len(lb) > MaxLogitBias {
		return invalidParam("logit_bias", "logit_bias has %d tokens, want at most %d", len(lb), MaxLogitBias)
	}
	b.LogitBias = make(map[int32]float32, len(lb))
	for k, v := range lb {
		id, err := strconv.ParseInt(k, 10, 32)
		if err != nil || id < 0 || vocab > 0 && id >= int64(vocab) {
			return invalidParam("logit_bias", "logit_bias key %q is not a token id of this model (0 to %d)", truncate(k, 40), max(vocab-1, 0))
		}
		f, ok := v.(float64)
		if !ok || !(f >= -100 && f <= 100) {
			return invalidParam("logit_bias", "logit_bias of token %d is %v, want a number from -100 to 100", id, v)
		}
		b.LogitBias[int32(id)] = float32(f)
	}
	return nil
}

// badTokenID returns the position of the first id outside [0, vocab) (with
// vocab 0, the first negative one), or -1.
func badTokenID(ids []int32, vocab int) int {
	for k, id := range ids {
		if id < 0 || vocab > 0 && int(id) >= vocab {
			return k
		}
	}
	return -1
}

// budget validates prompts against the context length and sets j.maxTokens.
func (v *validator) budget(j *job, maxTokens *int, param, promptParam string) *apiError {
	ctxLen := j.model.ContextLength
	j.maxTokens = make([]int, len(j.prompts))
	for i, p := range j.prompts {
		if len(p) == 0 {
			return invalidParam(promptParam, "%s %d is empty", promptParam, i)
		}
		if k := badTokenID(p, j.model.VocabSize); k >= 0 {
			if vs := j.model.VocabSize; vs > 0 {
				return invalidParam(promptParam, "token id %d at position %d of %s %d is outside the vocabulary [0, %d)", p[k], k, promptParam, i, vs)
			}
			return invalidParam(promptParam, "token id %d at position %d of %s %d is negative", p[k], k, promptParam, i)
		}
		if maxTokens != nil {
			if total := len(p) + *maxTokens; total > ctxLen {
				return badRequest(param, "context_length_exceeded",
					"this model's maximum context length is %d tokens, but %d tokens were requested (%d in the prompt + %d for the completion); reduce the prompt or %s",
					ctxLen, total, len(p), *maxTokens, param)
			}
			j.maxTokens[i] = *maxTokens
			continue
		}
		left := ctxLen - len(p)
		if left < 1 {
			return badRequest(promptParam, "context_length_exceeded",
				"this model's maximum context length is %d tokens, but the prompt has %d tokens, which leaves no room for a completion", ctxLen, len(p))
		}
		if d := v.cfg.DefaultMaxTokens; d > 0 && d < left {
			left = d
		}
		j.maxTokens[i] = left
	}
	return nil
}

// chat validates a chat completion request.
func (v *validator) chat(r *chatRequest, tenant string) (*job, *apiError) {
	j := &job{}
	if err := v.sampling(&r.sampling, j); err != nil {
		return nil, err
	}
	j.base.Tenant = tenant
	if v.tmpl == nil {
		return nil, badRequest("messages", "chat_unsupported", "model %q has no chat template; use /v1/completions with a prompt", j.model.ID)
	}
	if err := rejectPresent("functions", r.Functions, "functions are not supported; use tools"); err != nil {
		return nil, err
	}
	if err := rejectPresent("function_call", r.FunctionCall, "function_call is not supported; use tool_choice"); err != nil {
		return nil, err
	}
	tools, aerr := v.useTools(j, r.toolFields)
	if aerr != nil {
		return nil, aerr
	}
	if r.Logprobs != nil && *r.Logprobs {
		j.base.Logprobs = true
	}
	if r.TopLogprobs != nil {
		if *r.TopLogprobs < 0 || *r.TopLogprobs > maxTopLogprobs {
			return nil, invalidParam("top_logprobs", "top_logprobs is %d, want 0 to %d", *r.TopLogprobs, maxTopLogprobs)
		}
		if *r.TopLogprobs > 0 && !j.base.Logprobs {
			return nil, invalidParam("top_logprobs", "top_logprobs requires logprobs to be true")
		}
		j.base.TopLogprobs = *r.TopLogprobs
	}
	text, aerr := v.chatText(r.Messages, tools, r.AddGenerationPrompt, r.ChatTemplateKwargs, r.ReasoningEffort, r.effortParam)
	if aerr != nil {
		return nil, aerr
	}
	j.prompts = [][]int32{v.tok.Encode(text)}
	j.inThink = strings.HasSuffix(strings.TrimRight(text, spaces), thinkOpen)
	maxTokens, param := r.MaxTokens, "max_tokens"
	if r.MaxCompletionTokens != nil {
		if *r.MaxCompletionTokens < 1 {
			return nil, invalidParam("max_completion_tokens", "max_completion_tokens is %d, want at least 1", *r.MaxCompletionTokens)
		}
		maxTokens, param = r.MaxCompletionTokens, "max_completion_tokens"
	}
	if err := v.budget(j, maxTokens, param, "messages"); err != nil {
		return nil, err
	}
	if err := v.fits(j); err != nil {
		return nil, err
	}
	return j, nil
}

// useTools validates a request's tools and tool_choice into j's plan (and,
// where tool_choice forces calls, the schema they are generated under) and
// returns the tools the template is given.
func (v *validator) useTools(j *job, f toolFields) ([]Tool, *apiError) {
	tools, aerr := parseTools(f.Tools)
	if aerr != nil {
		return nil, aerr
	}
	if j.tools, aerr = parseToolChoice(f.ToolChoice, tools, f.ParallelToolCalls); aerr != nil {
		return nil, aerr
	}
	if sc := j.tools.schema(); sc != "" {
		if j.base.JSON {
			return nil, invalidParam("response_format", "response_format cannot be combined with tool_choice %q: the calls are the completion", truncate(string(bytes.TrimSpace(f.ToolChoice)), 80))
		}
		if len(sc) > maxSchemaBytes {
			return nil, invalidParam("tools", "the called functions' parameters take %d bytes of schema, want at most %d", len(sc), maxSchemaBytes)
		}
		j.base.JSON, j.base.Schema, j.base.CompactJSON = true, sc, true
	}
	return tools, nil
}

// chatText renders a conversation through the model's chat template, with
// its generation prompt unless addGen is false.
func (v *validator) chatText(in []chatMessage, tools []Tool, addGen *bool, kwargs map[string]json.RawMessage, effort *string, effortParam string) (string, *apiError) {
	msgs, aerr := messages(in)
	if aerr != nil {
		return "", aerr
	}
	kwargs, aerr = thinkingOff(effort, effortParam, kwargs)
	if aerr != nil {
		return "", aerr
	}
	vars, aerr := templateVars(kwargs)
	if aerr != nil {
		return "", aerr
	}
	text, err := v.tmpl.Render(msgs, RenderOptions{Tools: tools, AddGenerationPrompt: addGen == nil || *addGen, Vars: vars})
	if err != nil {
		return "", invalidParam("messages", "cannot apply the chat template: %v", err)
	}
	return text, nil
}

// efforts are the reasoning efforts OpenAI's API names.
var efforts = []string{"none", "minimal", "low", "medium", "high", "xhigh"}

// thinkingOff returns kwargs with enable_thinking false where effort (the
// request's parameter param) is "none" and kwargs leave enable_thinking
// out: OpenAI's way to ask for no reasoning, as Qwen 3's template takes
// it. Other efforts change nothing: a template thinks or not.
func thinkingOff(effort *string, param string, kwargs map[string]json.RawMessage) (map[string]json.RawMessage, *apiError) {
	if param == "" {
		param = "reasoning_effort"
	}
	switch {
	case effort == nil:
		return kwargs, nil
	case !slices.Contains(efforts, *effort):
		return nil, invalidParam(param, "%s is %q, want one of %s", param, truncate(*effort, 20), strings.Join(efforts, ", "))
	case *effort != "none":
		return kwargs, nil
	}
	if _, ok := kwargs["enable_thinking"]; ok {
		return kwargs, nil
	}
	out := maps.Clone(kwargs)
	if out == nil {
		out = map[string]json.RawMessage{}
	}
	out["enable_thinking"] = json.RawMessage("false")
	return out, nil
}

// maxTemplateVars bounds a request's chat_template_kwargs.
const maxTemplateVars = 32

// templateVarRE is a template variable's name.
var templateVarRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// templateVars validates chat_template_kwargs into names and compact JSON
// values; the names the template is given by the gateway are refused.
func templateVars(in map[string]json.RawMessage) (map[string]string, *apiError) {
	if len(in) == 0 {
		return nil, nil
	}
	if len(in) > maxTemplateVars {
		return nil, invalidParam("chat_template_kwargs", "chat_template_kwargs has %d names, want at most %d", len(in), maxTemplateVars)
	}
	out := make(map[string]string, len(in))
	for name, raw := range in {
		switch name {
		case "messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "pad_token", "unk_token", "raise_exception", "strftime_now":
			return nil, invalidParam("chat_template_kwargs", "chat_template_kwargs may not set %q: the server sets it", name)
		}
		if !templateVarRE.MatchString(name) {
			return nil, invalidParam("chat_template_kwargs", "chat_template_kwargs name %q is not an identifier", truncate(name, 40))
		}
		var b bytes.Buffer
		if err := json.Compact(&b, raw); err != nil {
			return nil, invalidParam("chat_template_kwargs", "chat_template_kwargs %q is not JSON", name)
		}
		out[name] = b.String()
	}
	return out, nil
}

// messages validates and converts chat messages.
func messages(in []chatMessage) ([]Message, *apiError) {
	if len(in) == 0 {
		return nil, invalidParam("messages", "messages is empty, want at least one message")
	}
	if len(in) > maxMessages {
		return nil, invalidParam("messages", "messages has %d entries, want at most %d", len(in), maxMessages)
	}
	out := make([]Message, len(in))
	for i, m := range in {
		switch m.Role {
		case "system", "developer", "user", "assistant", "tool":
		case "function":
			return nil, badRequest("messages", "unsupported_parameter", "message %d: role \"function\" is not supported; use tools and role \"tool\"", i)
		case "":
			return nil, invalidParam("messages", "message %d has no role", i)
		default:
			return nil, invalidParam("messages", "message %d: unknown role %q, want system, developer, user, assistant or tool", i, truncate(m.Role, 40))
		}
		calls, err := messageCalls(i, m)
		if err != nil {
			return nil, err
		}
		switch {
		case m.Role == "tool" && m.ToolCallID == "":
			return nil, invalidParam("messages", "message %d (tool) has no tool_call_id", i)
		case !m.Content.set && m.Role != "assistant":
			return nil, invalidParam("messages", "message %d (%s) has no content", i, m.Role)
		case m.ReasoningContent != "" && m.Role != "assistant":
			return nil, invalidParam("messages", "message %d (%s): only an assistant's message has reasoning_content", i, m.Role)
		}
		out[i] = Message{Role: m.Role, Content: m.Content.text, Name: m.Name, ToolCalls: calls, Reasoning: m.ReasoningContent}
		if m.Role == "tool" {
			out[i].ToolCallID = m.ToolCallID
		}
	}
	return out, nil
}

// messageCalls validates the tool calls of message i (an assistant's).
func messageCalls(i int, m chatMessage) ([]ToolCall, *apiError) {
	raw := bytes.TrimSpace(m.ToolCalls)
	if noList(raw) {
		return nil, nil
	}
	if m.Role != "assistant" {
		return nil, invalidParam("messages", "message %d (%s) has tool_calls; only an assistant's may", i, m.Role)
	}
	var in []struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &in); err != nil {
		return nil, invalidParam("messages", `message %d: tool_calls must be an array of {"id", "type": "function", "function": {"name", "arguments"}}`, i)
	}
	if len(in) > maxToolCalls {
		return nil, invalidParam("messages", "message %d has %d tool calls, want at most %d", i, len(in), maxToolCalls)
	}
	calls := make([]ToolCall, len(in))
	for k, c := range in {
		if c.Type != "function" || c.ID == "" || !toolNameRE.MatchString(c.Function.Name) {
			return nil, invalidParam("messages", "message %d: tool call %d needs an id, type \"function\" and a function name", i, k)
		}
		calls[k] = ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments}
	}
	return calls, nil
}

// completion validates a legacy completion request.
func (v *validator) completion(r *completionRequest, tenant string) (*job, *apiError) {
	j := &job{}
	if r.Echo && r.MaxTokens != nil && *r.MaxTokens == 0 {
		// The prompt alone, as OpenAI's legacy completions answer: one
		// token is generated, for the prompt's log-probabilities, and
		// not sent.
		j.echoOnly, r.MaxTokens = true, ptr(1)
	}
	if err := v.sampling(&r.sampling, j); err != nil {
		return nil, err
	}
	j.base.Tenant = tenant
	if r.Logprobs != nil {
		if *r.Logprobs < 0 || *r.Logprobs > maxLogprobsLeg {
			return nil, invalidParam("logprobs", "logprobs is %d, want 0 to %d", *r.Logprobs, maxLogprobsLeg)
		}
		j.base.Logprobs = true
		j.base.TopLogprobs = *r.Logprobs
	}

	if r.Suffix != nil && *r.Suffix != "" {
		return nil, badRequest("suffix", "unsupported_parameter", "suffix is not supported")
	}
	if r.BestOf != nil && *r.BestOf != 1 && *r.BestOf != j.n {
		return nil, badRequest("best_of", "unsupported_parameter", "best_of other than 1 is not supported")
	}
	if !r.Prompt.set {
		return nil, invalidParam("prompt", "prompt is required")
	}
	count := len(r.Prompt.texts) + len(r.Prompt.ids)
	if count > v.cfg.MaxPrompts {
		return nil, invalidParam("prompt", "prompt holds %d prompts, want at most %d", count, v.cfg.MaxPrompts)
	}
	for _, t := range r.Prompt.texts {
		j.prompts = append(j.prompts, v.tok.Encode(t))
	}
	j.prompts = append(j.prompts, r.Prompt.ids...)
	if err := v.budget(j, r.MaxTokens, "max_tokens", "prompt"); err != nil {
		return nil, err
	}
	if r.Echo {
		// The prompts come back before their completions, with their
		// tokens' log-probabilities where logprobs asks.
		for _, p := range j.prompts {
			j.echo = append(j.echo, v.tok.Decode(p, false))
		}
		j.base.PromptLogprobs = j.base.Logprobs
	}
	if err := v.fits(j); err != nil {
		return nil, err
	}
	return j, nil
}

// sampler checks the sampler's parameters (temperature, top_p, top_k,
// min_p, repetition_penalty) and sets them in b, the API's defaults where
// s leaves them out.
func (s *sampling) sampler(b *GenerateRequest) *apiError {
	b.Temperature = 1
	if s.Temperature != nil {
		if !(*s.Temperature >= 0 && *s.Temperature <= maxTemperature) {
			return invalidParam("temperature", "temperature is %g, want 0 to %d", *s.Temperature, maxTemperature)
		}
		b.Temperature = float32(*s.Temperature)
	}
	b.TopP = 1
	if s.TopP != nil {
		if !(*s.TopP > 0 && *s.TopP <= 1) {
			return invalidParam("top_p", "top_p is %g, want greater than 0 and at most 1", *s.TopP)
		}
		b.TopP = float32(*s.TopP)
	}
	if s.TopK != nil {
		switch {
		case *s.TopK == -1:
		case *s.TopK < 0:
			return invalidParam("top_k", "top_k is %d, want 0 or -1 (off) or a positive count", *s.TopK)
		default:
			b.TopK = *s.TopK
		}
	}
	if s.MinP != nil {
		if !(*s.MinP >= 0 && *s.MinP <= 1) {
			return invalidParam("min_p", "min_p is %g, want 0 to 1", *s.MinP)
		}
		b.MinP = float32(*s.MinP)
	}
	b.RepetitionPenalty = 1
	if s.RepetitionPenalty != nil {
		if !(*s.RepetitionPenalty > 0 && *s.RepetitionPenalty <= maxRepetitionPn) {
			return invalidParam("repetition_penalty", "repetition_penalty is %g, want greater than 0 and at most %d", *s.RepetitionPenalty, maxRepetitionPn)
		}
		b.RepetitionPenalty = float32(*s.RepetitionPenalty)
	}
	return nil
}

// fill gives s the defaults d names where s leaves them out.
func (d Sampling) fill(s *sampling) {
	for _, f := range []struct{ dst, def **float64 }{{&s.Temperature, &d.Temperature}, {&s.TopP, &d.TopP}, {&s.MinP, &d.MinP}, {&s.RepetitionPenalty, &d.RepetitionPenalty}} {
		if *f.dst == nil {
			*f.dst = *f.def
		}
	}
	if s.TopK == nil {
		s.TopK = d.TopK
	}
}

// fits rejects a job that could never get its generations admitted at once.
func (v *validator) fits(j *job) *apiError {
	if j.choices() > v.cfg.MaxInFlight {
		return invalidParam("n", "%d prompt(s) × n=%d is %d generations, more than this server runs at once (%d)", len(j.prompts), j.n, j.choices(), v.cfg.MaxInFlight)
	}
	return nil
}

// unset reports whether a raw JSON value is absent or null.
func unset(raw []byte) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

// noList reports whether a raw JSON list is absent, null or empty.
func noList(raw []byte) bool {
	return unset(raw) || bytes.Equal(bytes.TrimSpace(raw), []byte("[]"))
}

func rejectPresent(param string, raw json.RawMessage, msg string) *apiError {
	if noList(raw) {
		return nil
	}
	return badRequest(param, "unsupported_parameter", "%s", msg)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
