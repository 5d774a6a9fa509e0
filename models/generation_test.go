package models_test

import (
	"io/fs"
	"maps"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/troupe/troupe/models"
	"github.com/troupe/troupe/models/demo"
)

// TestMergeGeneration: generation_config.json's end tokens join
// config.json's, once each; a malformed one is refused by name.
func TestMergeGeneration(t *testing.T) {
	c := &models.Config{EOS: []int32{128001}}
	if err := c.MergeGeneration([]byte(`{"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "temperature": 0.6}`)); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.EOS, []int32{128001, 128008, 128009}) {
		t.Errorf("EOS %v", c.EOS)
	}
	if err := c.MergeGeneration([]byte(`{"eos_token_id": 7}`)); err != nil || !slices.Equal(c.EOS, []int32{128001, 128008, 128009, 7}) {
		t.Errorf("one id: %v, %v", c.EOS, err)
	}
	if err := c.MergeGeneration(nil); err != nil || len(c.EOS) != 4 {
		t.Errorf("none: %v, %v", c.EOS, err)
	}
	for _, bad := range []string{`{"eos_token_id": "x"}`, `[`} {
		if err := c.MergeGeneration([]byte(bad)); err == nil || !strings.Contains(err.Error(), "generation_config.json") {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

// TestBundleGenerationEOS: a bundle's end tokens include its
// generation_config.json's.
func TestBundleGenerationEOS(t *testing.T) {
	if !demo.Embedded() {
		t.Skip("built without the demo model (nodemo)")
	}
	files := demoFiles(t)
	files["generation_config.json"] = &fstest.MapFile{Data: []byte(`{"eos_token_id": [0, 5]}`)}
	b, err := models.OpenFS("eos", files, demo.Weights())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if !slices.Equal(b.Config.EOS, []int32{0, 5}) {
		t.Errorf("EOS %v, want config.json's 0 and generation_config.json's 5", b.Config.EOS)
	}
}

// TestBundleChatTemplate: a bundle takes the chat template a checkpoint
// keeps apart, from chat_template.jinja before chat_template.json; a
// chat_template.json without one is refused.
func TestBundleChatTemplate(t *testing.T) {
	if !demo.Embedded() {
		t.Skip("built without the demo model (nodemo)")
	}
	base := demoFiles(t)
	for _, c := range []struct {
		files map[string]string
		want  string // "" for none; "error" for a refusal
	}{
		{nil, ""},
		{map[string]string{"chat_template.jinja": "J"}, "J"},
		{map[string]string{"chat_template.json": `{"chat_template": "S"}`}, "S"},
		{map[string]string{"chat_template.jinja": "J", "chat_template.json": `{"chat_template": "S"}`}, "J"},
		{map[string]string{"chat_template.json": `{"template": "S"}`}, "error"},
	} {
		files := maps.Clone(base)
		for name, data := range c.files {
			files[name] = &fstest.MapFile{Data: []byte(data)}
		}
		b, err := models.OpenFS("t", files, demo.Weights())
		switch {
		case c.want == "error":
			if err == nil {
				b.Close()
				t.Errorf("%v: opened", c.files)
			}
			continue
		case err != nil:
			t.Fatalf("%v: %v", c.files, err)
		}
		if string(b.ChatTemplate) != c.want || (c.want == "") != (b.ChatTemplate == nil) {
			t.Errorf("%v: template %q, want %q", c.files, b.ChatTemplate, c.want)
		}
		b.Close()
	}
}

// demoFiles are the embedded demo model's config and tokenizer files.
func demoFiles(t *testing.T) fstest.MapFS {
	t.Helper()
	files := fstest.MapFS{}
	for _, name := range []string{"config.json", "tokenizer.json", "tokenizer_config.json"} {
		b, err := fs.ReadFile(demo.FS(), name)
		if err != nil {
			t.Fatal(err)
		}
		files[name] = &fstest.MapFile{Data: b}
	}
	return files
}
