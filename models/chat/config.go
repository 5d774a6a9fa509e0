package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/ardanlabs/jinja"
)

// Message is one turn of a conversation.
type Message struct {
	Role    string
	Content string
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
// checkpoints keep it, takes the place of the one in the config.
func LoadConfig(dir string) (*Config, error) {
	data, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		return nil, fmt.Errorf("load chat config: %w", err)
	}
	var override *string
	if src, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja")); err == nil {
		s := string(src)
		override = &s
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("load chat config: %w", err)
	} else if js, err := os.ReadFile(filepath.Join(dir, "chat_template.json")); err == nil {
		var v struct {
			ChatTemplate string `json:"chat_template"`
		}
		if err := json.Unmarshal(js, &v); err != nil {
			return nil, fmt.Errorf("load chat config: chat_template.json: %w", err)
		}
		override = &v.ChatTemplate
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("load chat config: %w", err)
	}
	c, err := parseConfig(data, override)
	if err != nil {
		return nil, fmt.Errorf("load chat config %s: %w", dir, err)
	}
	return c, nil
}

// ParseConfig parses the contents of a tokenizer_config.json and compiles
// its chat template; a template that does not compile is an error.
func ParseConfig(data []byte) (*Config, error) {
	return parseConfig(data, nil)
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

// Render applies the default chat template to msgs. With
// addGenerationPrompt the result ends with the opening of an assistant
// turn, ready for generation.
func (c *Config) Render(msgs []Message, addGenerationPrompt bool) (string, error) {
	if c.compiled == nil {
		return "", errors.New("render chat template: model has no chat template")
	}
	messages := make([]any, len(msgs))
	for i, m := range msgs {
		messages[i] = map[string]any{"role": m.Role, "content": m.Content}
	}
	data := map[string]any{
		"messages":              messages,
		"add_generation_prompt": addGenerationPrompt,
	}
	for name, v := range map[string]string{
		"bos_token": c.BOSToken, "eos_token": c.EOSToken,
		"pad_token": c.PadToken, "unk_token": c.UnkToken,
	} {
		if v != "" {
			data[name] = v
		}
	}
	out, err := render(c.compiled, data)
	if err != nil {
		return "", fmt.Errorf("render chat template: %w", err)
	}
	return out, nil
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

func render(t *jinja.Template, data map[string]any) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("template engine failed: %v", r)
		}
	}()
	return t.Render(data)
}
