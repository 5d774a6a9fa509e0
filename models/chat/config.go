package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/ardanlabs/jinja"
)

// Message is one turn of a conversation: an assistant's may hold the
// tool calls it made and the reasoning before its answer, and a tool's
// answers the call ToolCallID names.
type Message struct {
	Role             string     `json:"role"`
	Content          string     `json:"content"`
	ReasoningContent string     `json:"reasoning_content,omitempty"`
	Name             string     `json:"name,omitempty"`
	ToolCalls        []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID       string     `json:"tool_call_id,omitempty"`
}

// ToolCall is a call of a function: its id, name and arguments (JSON text,
// an object).
type ToolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Tool is a function the model may call: its name, description and
// parameters (a JSON schema, as JSON text; empty when it takes none).
type Tool struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Parameters  string `json:"parameters,omitempty"`
}

// Config is the part of tokenizer_config.json that shapes prompts.
type Config struct {
	// Template is the default chat template source; empty when the model
	// has none.
	Template string
	// Templates holds every named template, the default one under
	// "default" when the config gives a list.
	Templates map[string]string

	BOSToken    string
	EOSToken    string
	PadToken    string
	UnkToken    string
	AddBOSToken bool
	AddEOSToken bool

	compiled *jinja.Template
}

// configJSON is the subset of tokenizer_config.json that is read.
type configJSON struct {
	ChatTemplate json.RawMessage `json:"chat_template"`
	BOSToken     json.RawMessage `json:"bos_token"`
	EOSToken     json.RawMessage `json:"eos_token"`
	PadToken     json.RawMessage `json:"pad_token"`
	UnkToken     json.RawMessage `json:"unk_token"`
	AddBOSToken  *bool           `json:"add_bos_token"`
	AddEOSToken  *bool           `json:"add_eos_token"`
}

// LoadConfig reads tokenizer_config.json in dir. A chat template found in
// dir/chat_template.jinja or dir/chat_template.json, where newer
// checkpoints keep it, takes the place of the one in the config
// (ReadTemplate).
func LoadConfig(dir string) (*Config, error) {
	data, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		return nil, fmt.Errorf("load chat config: %w", err)
	}
	tmpl, err := ReadTemplate(os.DirFS(dir))
	if err != nil {
		return nil, fmt.Errorf("load chat config: %w", err)
	}
	c, err := ParseConfigTemplate(data, tmpl)
	if err != nil {
		return nil, fmt.Errorf("load chat config %s: %w", dir, err)
	}
	return c, nil
}

// ReadTemplate reads the chat template a checkpoint keeps apart from
// tokenizer_config.json, as newer ones do: chat_template.jinja, else
// chat_template.json's chat_template; nil where fsys holds neither.
func ReadTemplate(fsys fs.FS) ([]byte, error) {
	if src, err := fs.ReadFile(fsys, "chat_template.jinja"); err == nil {
		return src, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	js, err := fs.ReadFile(fsys, "chat_template.json")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var v struct {
		ChatTemplate *string `json:"chat_template"`
	}
	if err := json.Unmarshal(js, &v); err != nil || v.ChatTemplate == nil {
		return nil, fmt.Errorf("chat_template.json: want {\"chat_template\": \"...\"} (%v)", err)
	}
	return []byte(*v.ChatTemplate), nil
}

// ParseConfig parses the contents of a tokenizer_config.json and compiles
// its chat template; a template that does not compile is an error.
func ParseConfig(data []byte) (*Config, error) {
	return parseConfig(data, nil)
}

// ParseConfigTemplate is ParseConfig with template, where not nil, in the
// place of the config's (a checkpoint's chat_template.jinja).
func ParseConfigTemplate(data, template []byte) (*Config, error) {
	if template == nil {
		return parseConfig(data, nil)
	}
	s := string(template)
	return parseConfig(data, &s)
}

func parseConfig(data []byte, override *string) (*Config, error) {
	var raw configJSON
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("parse tokenizer_config.json: %w", err)
	}
	c := &Config{Templates: map[string]string{}}
	var err error
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		dst  *string
	}{
		{"bos_token", raw.BOSToken, &c.BOSToken},
		{"eos_token", raw.EOSToken, &c.EOSToken},
		{"pad_token", raw.PadToken, &c.PadToken},
		{"unk_token", raw.UnkToken, &c.UnkToken},
	} {
		if *f.dst, err = parseToken(f.raw); err != nil {
			return nil, fmt.Errorf("parse tokenizer_config.json: %s: %w", f.name, err)
		}
	}
	c.AddBOSToken = raw.AddBOSToken != nil && *raw.AddBOSToken
	c.AddEOSToken = raw.AddEOSToken != nil && *raw.AddEOSToken
	if err := c.parseTemplates(raw.ChatTemplate); err != nil {
		return nil, fmt.Errorf("parse tokenizer_config.json: chat_template: %w", err)
	}
	if override != nil {
		c.Template = *override
		c.Templates["default"] = *override
	}
	if c.Template != "" {
		if c.compiled, err = compile(c.Template); err != nil {
			return nil, fmt.Errorf("compile chat template: %w", err)
		}
	}
	return c, nil
}

// parseToken reads a special token given as a string or as an AddedToken
// object {"content": ...}.
func parseToken(raw json.RawMessage) (string, error) {
	s := strings.TrimSpace(string(raw))
	if s == "" || s == "null" {
		return "", nil
	}
	var str string
	if err := json.Unmarshal(raw, &str); err == nil {
		return str, nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Content == nil {
		return "", errors.New("want a string or an object with content")
	}
	return *obj.Content, nil
}

// parseTemplates reads chat_template as a string or a list of
// {name, template}; the default is the one named "default".
func (c *Config) parseTemplates(raw json.RawMessage) error {
	s := strings.TrimSpace(string(raw))
	if s == "" || s == "null" {
		return nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		c.Template = one
		c.Templates["default"] = one
		return nil
	}
	var list []struct {
		Name     *string `json:"name"`
		Template *string `json:"template"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return errors.New("want a string or a list of {name, template}")
	}
	for i, e := range list {
		if e.Name == nil || e.Template == nil {
			return fmt.Errorf("entry %d lacks name or template", i)
		}
		c.Templates[*e.Name] = *e.Template
	}
	c.Template = c.Templates["default"]
	return nil
}

// HasTemplate reports whether the model ships a default chat template.
func (c *Config) HasTemplate() bool { return c.compiled != nil }

// Thinks reports whether the default template writes reasoning between
// <think> and </think> (Qwen 3's, DeepSeek-R1's): the model answers after
// its reasoning.
func (c *Config) Thinks() bool { return strings.Contains(c.Template, "</think>") }

// Options shape a rendering: the tools the model may call (none: nil),
// whether the result ends with the opening of an assistant turn, ready for
// generation, and further variables the template reads (a request's
// chat_template_kwargs, such as Qwen 3's enable_thinking): names to JSON
// values.
type Options struct {
	Tools               []Tool
	AddGenerationPrompt bool
	Vars                map[string]string
}

// reserved reports whether name is a variable Render sets itself, which
// Options.Vars may not.
func reserved(name string) bool {
	switch name {
	case "messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "pad_token", "unk_token", "raise_exception", "strftime_now":
		return true
	}
	return false
}

// Render applies the default chat template to msgs as o asks.
//
// The template sees what transformers gives it: messages as {role,
// content} with, where set, name, tool_calls ({id, type "function",
// function {name, arguments}}, the arguments decoded from their JSON),
// tool_call_id and reasoning_content; tools as {type "function", function {name, description,
// parameters}} (none where there are no tools); objects keep their keys'
// order, so that tojson writes them as they came.
func (c *Config) Render(msgs []Message, o Options) (string, error) {
	if c.compiled == nil {
		return "", errors.New("render chat template: model has no chat template")
	}
	tools := o.Tools
	messages := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		d := dict("role", jinja.NewString(m.Role), "content", jinja.NewString(m.Content))
		if m.Name != "" {
			d.AsDict().Set("name", jinja.NewString(m.Name))
		}
		if len(m.ToolCalls) > 0 {
			calls := make([]jinja.Value, len(m.ToolCalls))
			for k, tc := range m.ToolCalls {
				calls[k] = dict("id", jinja.NewString(tc.ID), "type", jinja.NewString("function"),
					"function", dict("name", jinja.NewString(tc.Name), "arguments", jsonOrString(tc.Arguments)))
			}
			d.AsDict().Set("tool_calls", jinja.NewList(calls))
		}
		if m.ToolCallID != "" {
			d.AsDict().Set("tool_call_id", jinja.NewString(m.ToolCallID))
		}
		if m.ReasoningContent != "" {
			d.AsDict().Set("reasoning_content", jinja.NewString(m.ReasoningContent))
		}
		messages[i] = d
	}
	data := map[string]jinja.Value{
		"messages":              jinja.NewList(messages),
		"add_generation_prompt": jinja.NewBool(o.AddGenerationPrompt),
		"tools":                 jinja.None(),
	}
	for name, v := range o.Vars {
		if reserved(name) {
			return "", fmt.Errorf("render chat template: variable %q is the template's own", name)
		}
		data[name] = jsonOrString(v)
	}
	if len(tools) > 0 {
		list := make([]jinja.Value, len(tools))
		for i, t := range tools {
			f := dict("name", jinja.NewString(t.Name))
			if t.Description != "" {
				f.AsDict().Set("description", jinja.NewString(t.Description))
			}
			if t.Parameters != "" {
				f.AsDict().Set("parameters", jsonOrString(t.Parameters))
			}
			list[i] = dict("type", jinja.NewString("function"), "function", f)
		}
		data["tools"] = jinja.NewList(list)
	}
	for name, v := range map[string]string{
		"bos_token": c.BOSToken, "eos_token": c.EOSToken,
		"pad_token": c.PadToken, "unk_token": c.UnkToken,
	} {
		if v != "" {
			data[name] = jinja.NewString(v)
		}
	}
	out, err := render(c.compiled, data)
	if err != nil {
		return "", fmt.Errorf("render chat template: %w", err)
	}
	return out, nil
}

// dict is a template object of the keys and values kv, in their order.
func dict(kv ...any) jinja.Value {
	d := jinja.NewDict()
	for i := 0; i+1 < len(kv); i += 2 {
		d.AsDict().Set(kv[i].(string), kv[i+1].(jinja.Value))
	}
	return d
}

// jsonOrString is the JSON text s as a template value, objects keeping
// their keys' order; s itself where it is not JSON.
func jsonOrString(s string) jinja.Value {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	v, err := jsonValue(dec, 0)
	if err != nil {
		return jinja.NewString(s)
	}
	if _, err := dec.Token(); err != io.EOF {
		return jinja.NewString(s)
	}
	return v
}

// maxJSONDepth bounds the nesting jsonValue follows.
const maxJSONDepth = 64

// jsonValue decodes the next JSON value of dec as a template value.
func jsonValue(dec *json.Decoder, depth int) (jinja.Value, error) {
	if depth > maxJSONDepth {
		return jinja.Value{}, errors.New("json: nested too deep")
	}
	tok, err := dec.Token()
	if err != nil {
		return jinja.Value{}, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			d := jinja.NewDict()
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return jinja.Value{}, err
				}
				v, err := jsonValue(dec, depth+1)
				if err != nil {
					return jinja.Value{}, err
				}
				d.AsDict().Set(k.(string), v)
			}
			_, err := dec.Token()
			return d, err
		case '[':
			var items []jinja.Value
			for dec.More() {
				v, err := jsonValue(dec, depth+1)
				if err != nil {
					return jinja.Value{}, err
				}
				items = append(items, v)
			}
			_, err := dec.Token()
			return jinja.NewList(items), err
		}
		return jinja.Value{}, fmt.Errorf("json: unexpected %v", t)
	default:
		return jinja.FromGoValue(t), nil
	}
}

// compile and render guard against panics in the template engine, so that
// a hostile template or input yields an error.
func compile(src string) (t *jinja.Template, err error) {
	defer func() {
		if r := recover(); r != nil {
			t, err = nil, fmt.Errorf("template engine failed: %v", r)
		}
	}()
	return jinja.Compile(src)
}

func render(t *jinja.Template, data map[string]jinja.Value) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("template engine failed: %v", r)
		}
	}()
	return t.RenderValues(data)
}
