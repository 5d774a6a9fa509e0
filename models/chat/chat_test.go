package chat

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/troupe/troupe/models/demo"
)

// The golden files in testdata hold what Jinja (with the trim_blocks and
// lstrip_blocks settings transformers uses) produces for each template and
// conversation in testdata/cases.json.

type chatCase struct {
	Name                string    `json:"name"`
	AddGenerationPrompt bool      `json:"add_generation_prompt"`
	Messages            []Message `json:"messages"`
}

func loadCases(t testing.TB) []chatCase {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases []chatCase
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) == 0 {
		t.Fatal("no cases")
	}
	return cases
}

// configFor builds a tokenizer_config.json around a template file.
func configFor(t testing.TB, templateFile string, extra map[string]any) *Config {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("testdata", templateFile))
	if err != nil {
		t.Fatal(err)
	}
	doc := map[string]any{"chat_template": string(src)}
	for k, v := range extra {
		doc[k] = v
	}
	data, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		t.Fatalf("ParseConfig: %v", err)
	}
	return c
}

// demoModel is the demo model's folder in this repository.
var demoModel = filepath.Join("..", "demo", demo.Name)

func checkGolden(t *testing.T, c *Config, prefix string, cases []chatCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(prefix+"/"+tc.Name, func(t *testing.T) {
			want, err := os.ReadFile(filepath.Join("testdata", prefix+"."+tc.Name+".golden"))
			if err != nil {
				t.Fatal(err)
			}
			got, err := c.Render(tc.Messages, Options{AddGenerationPrompt: tc.AddGenerationPrompt})
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			if got != string(want) {
				t.Errorf("Render:\n got %q\nwant %q", got, want)
			}
		})
	}
}

// TestToolTemplates renders conversations with tools, tool calls and tool
// answers through a template that writes them (testdata/tools.jinja) as
// Jinja does with what transformers passes: tool_cases.json's tools and
// messages, the calls' arguments decoded from JSON where they are JSON,
// objects in their keys' order.
func TestToolTemplates(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "tool_cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		chatCase
		Tools []Tool `json:"tools"`
	}
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	c := configFor(t, "tools.jinja", nil)
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			want, err := os.ReadFile(filepath.Join("testdata", "tools."+tc.Name+".golden"))
			if err != nil {
				t.Fatal(err)
			}
			got, err := c.Render(tc.Messages, Options{Tools: tc.Tools, AddGenerationPrompt: tc.AddGenerationPrompt})
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			if got != string(want) {
				t.Errorf("Render:\n got %q\nwant %q", got, want)
			}
		})
	}
}

func TestTemplates(t *testing.T) {
	cases := loadCases(t)
	if !configFor(t, "qwen3.jinja", nil).Thinks() || configFor(t, "llama3.jinja", nil).Thinks() {
		t.Error("Qwen 3's template thinks and Llama 3's does not")
	}
	llama := configFor(t, "llama3.jinja", map[string]any{
		"bos_token": map[string]any{"content": "<|begin_of_text|>", "lstrip": false},
		"eos_token": "<|eot_id|>",
	})
	checkGolden(t, llama, "llama3", cases)
	qwen := configFor(t, "qwen3.jinja", map[string]any{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
	checkGolden(t, qwen, "qwen3", cases)
}

func TestDemoModel(t *testing.T) {
	c, err := LoadConfig(demoModel)
	if err != nil {
		t.Fatal(err)
	}
	if !c.HasTemplate() {
		t.Fatal("demo model has no template")
	}
	if c.EOSToken != "<|endoftext|>" || c.PadToken != "<|pad|>" {
		t.Errorf("eos %q, pad %q", c.EOSToken, c.PadToken)
	}
	checkGolden(t, c, "chatml", loadCases(t))
}

func TestLoadConfigTemplateFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("tokenizer_config.json", `{"eos_token": "</s>", "add_bos_token": true}`)
	c, err := LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.HasTemplate() || !c.AddBOSToken || c.EOSToken != "</s>" {
		t.Errorf("HasTemplate %v, AddBOSToken %v, EOSToken %q", c.HasTemplate(), c.AddBOSToken, c.EOSToken)
	}
	if _, err := c.Render(nil, Options{AddGenerationPrompt: true}); err == nil || !strings.Contains(err.Error(), "no chat template") {
		t.Errorf("Render without a template: err = %v", err)
	}
	write("chat_template.json", `{"chat_template": "{{ eos_token }}json"}`)
	if got := mustRender(t, dir); got != "</s>json" {
		t.Errorf("chat_template.json: got %q", got)
	}
	write("chat_template.jinja", "{% for m in messages %}[{{ m.role }}]{% endfor %}{{ eos_token }}")
	if got := mustRender(t, dir); got != "[user]</s>" {
		t.Errorf("chat_template.jinja: got %q", got)
	}
	if _, err := LoadConfig(filepath.Join(dir, "missing")); err == nil {
		t.Error("LoadConfig of a missing folder succeeded")
	}
}

func mustRender(t *testing.T, dir string) string {
	t.Helper()
	c, err := LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Render([]Message{{Role: "user", Content: "x"}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestTemplateList(t *testing.T) {
	c, err := ParseConfig([]byte(`{"chat_template": [
		{"name": "tool_use", "template": "tools"},
		{"name": "default", "template": "{{ messages[0].content }}!"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Templates["tool_use"] != "tools" {
		t.Errorf("named templates: %v", c.Templates)
	}
	got, err := c.Render([]Message{{Role: "user", Content: "hi"}}, Options{})
	if err != nil || got != "hi!" {
		t.Errorf("Render = %q, %v; want %q", got, err, "hi!")
	}
}

func TestErrors(t *testing.T) {
	tests := []struct {
		name, config, want string
	}{
		{"bad json", `{`, "parse tokenizer_config.json"},
		{"bad template type", `{"chat_template": 3}`, "chat_template"},
		{"list entry without name", `{"chat_template": [{"template": "x"}]}`, "lacks name"},
		{"bad token", `{"eos_token": 5}`, "eos_token"},
		{"unclosed block", `{"chat_template": "{% for m in messages %}x"}`, "compile chat template"},
		{"bad expression", `{"chat_template": "{{ 1 + }}"}`, "compile chat template"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.config))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
	c, err := ParseConfig([]byte(`{"chat_template": "{% if messages[0].role != 'system' %}{{ raise_exception('system message first') }}{% endif %}ok"}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Render([]Message{{Role: "user", Content: "x"}}, Options{}); err == nil || !strings.Contains(err.Error(), "system message first") {
		t.Errorf("raise_exception: err = %v", err)
	}
	if got, err := c.Render([]Message{{Role: "system", Content: "x"}}, Options{}); err != nil || got != "ok" {
		t.Errorf("Render = %q, %v", got, err)
	}
}

func TestConcurrentRender(t *testing.T) {
	c := configFor(t, "qwen3.jinja", nil)
	msgs := []Message{{Role: "user", Content: "hi"}}
	want, err := c.Render(msgs, Options{AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []string
	for range 8 {
		wg.Go(func() {
			for range 50 {
				if got, err := c.Render(msgs, Options{AddGenerationPrompt: true}); err != nil || got != want {
					mu.Lock()
					bad = append(bad, got)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Errorf("concurrent Render differs: %q", bad[0])
	}
}

// FuzzRender renders odd message content through real templates: it must
// never panic, and content must reach the output unchanged where the
// template copies it verbatim.
func FuzzRender(f *testing.F) {
	for _, s := range []string{"", "{{ 7*7 }}", "{% endfor %}", "<|im_end|>", "\x00\xff", "</think>", "<think>\n</think>", "'\"\\", "😀\n\r\t"} {
		f.Add("user", s, true)
	}
	f.Add("assistant", "<think>x</think>y", false)
	f.Add("tool", "{\"a\": 1}", true)
	f.Add("assistant", `{"type": "object", "properties": {"b": [1, 2.5, null, true, "x"]}}`, true)
	f.Add("assistant", `[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[`, true)
	f.Add("", "", false)
	chatml := `{% for m in messages %}<|im_start|>{{ m['role'] }}
{{ m['content'] }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}`
	data, err := json.Marshal(map[string]any{"chat_template": chatml})
	if err != nil {
		f.Fatal(err)
	}
	plain, err := ParseConfig(data)
	if err != nil {
		f.Fatal(err)
	}
	configs := []*Config{plain, configFor(f, "qwen3.jinja", nil), configFor(f, "llama3.jinja", map[string]any{"bos_token": "<s>"}), configFor(f, "tools.jinja", nil)}
	f.Fuzz(func(t *testing.T, role, content string, gen bool) {
		// The content also stands as a call's arguments and a tool's
		// parameters, which the template reads as JSON where they are.
		msgs := []Message{{Role: "system", Content: "sys"}, {Role: role, Content: content, ToolCalls: []ToolCall{{ID: "c", Name: "f", Arguments: content}}},
			{Role: "tool", Content: content, ToolCallID: "c"}, {Role: "user", Content: content}}
		tools := []Tool{{Name: "f", Description: content, Parameters: content}}
		for i, c := range configs {
			out, err := c.Render(msgs, Options{Tools: tools, AddGenerationPrompt: gen})
			if i == 0 && err != nil {
				t.Fatalf("ChatML template failed: %v", err)
			}
			if i == 0 && !strings.Contains(out, "<|im_start|>"+role+"\n"+content+"<|im_end|>\n") {
				t.Fatalf("ChatML output %q lacks the message verbatim", out)
			}
			if i == 3 && err != nil {
				t.Fatalf("tools template failed: %v", err)
			}
		}
	})
}

// FuzzParseConfig feeds arbitrary configs and templates to the parser and
// renders whatever compiles.
func FuzzParseConfig(f *testing.F) {
	f.Add(`{"chat_template": "{% for m in messages %}{{ m.content | trim }}{% endfor %}", "bos_token": {"content": "<s>"}}`)
	f.Add(`{"chat_template": [{"name": "default", "template": "{{ bos_token ~ messages|length }}"}]}`)
	f.Add(`{"chat_template": "{%- set ns = namespace(a=1) %}{% set ns.a = 2 %}{{ ns.a }}{{ messages[::-1][0]['role'] }}"}`)
	f.Add(`{"chat_template": "{{ messages[0].content.split('x')[-1].lstrip('\n') }}{% if 'a' in messages[0].content %}A{% endif %}"}`)
	f.Fuzz(func(t *testing.T, config string) {
		c, err := ParseConfig([]byte(config))
		if err != nil || !c.HasTemplate() {
			return
		}
		_, _ = c.Render([]Message{{Role: "user", Content: "xa\n"}, {Role: "assistant", Content: ""}}, Options{AddGenerationPrompt: true})
	})
}

// TestRenderVars: a request's template variables reach the template as
// JSON values (Qwen 3's enable_thinking, say); the template's own names
// are refused.
func TestRenderVars(t *testing.T) {
	data, err := json.Marshal(map[string]any{"chat_template": `{% if enable_thinking is defined and not enable_thinking %}no-think {% endif %}{{ extra.a | tojson }} {{ note }}`})
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Render(nil, Options{Vars: map[string]string{"enable_thinking": "false", "extra": `{"a": [1, "x"]}`, "note": "not JSON"}})
	if want := `no-think [1, "x"] not JSON`; err != nil || got != want {
		t.Errorf("Render: %q, %v; want %q", got, err, want)
	}
	if _, err := c.Render(nil, Options{Vars: map[string]string{"messages": "[]"}}); err == nil || !strings.Contains(err.Error(), `"messages"`) {
		t.Errorf("a reserved variable: %v", err)
	}
}
