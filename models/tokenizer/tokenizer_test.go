package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/troupe/troupe/models/demo"
	"github.com/troupe/troupe/models/modeltest"
)

var (
	loadMu    sync.Mutex
	loadCache = map[string]*Tokenizer{}
)

// demoModel is the demo model's folder in this repository.
var demoModel = filepath.Join("..", "demo", demo.Name)

// loadDemo loads the demo model's tokenizer once per test binary.
func loadDemo(t testing.TB) *Tokenizer {
	t.Helper()
	return load(t, filepath.Join(demoModel, "tokenizer.json"))
}

// loadShared loads a tokenizer from the shared data once per test binary,
// skipping the test when it is absent.
func loadShared(t testing.TB, parts ...string) *Tokenizer {
	t.Helper()
	return load(t, modeltest.MustShared(t, parts...))
}

// load loads the tokenizer at p once per test binary.
func load(t testing.TB, p string) *Tokenizer {
	t.Helper()
	loadMu.Lock()
	defer loadMu.Unlock()
	if tok, ok := loadCache[p]; ok {
		return tok
	}
	tok, err := Load(p)
	if err != nil {
		t.Fatalf("Load(%s): %v", p, err)
	}
	loadCache[p] = tok
	return tok
}

func readJSON(t testing.TB, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// decodeStream decodes ids one at a time through a Decoder.
func decodeStream(tok *Tokenizer, ids []int32, skipSpecial bool) string {
	d := tok.NewDecoder(skipSpecial)
	var out []byte
	for _, id := range ids {
		out = append(out, d.Next(id)...)
	}
	return string(append(out, d.Flush()...))
}

func TestDolma2Samples(t *testing.T) {
	tok := loadShared(t, "tokenizers", "olmo2-dolma2", "tokenizer.json")
	dir := modeltest.MustShared(t, "tokenizers", "olmo2-dolma2")
	var strs []string
	readJSON(t, filepath.Join(dir, "sample_strings.json"), &strs)
	var want []struct {
		Text    string  `json:"text"`
		IDs     []int32 `json:"ids"`
		Decoded string  `json:"decoded"`
	}
	readJSON(t, filepath.Join(dir, "sample_expected.json"), &want)
	if len(want) != len(strs) || len(want) == 0 {
		t.Fatalf("%d expected entries for %d strings", len(want), len(strs))
	}
	for i, w := range want {
		if w.Text != strs[i] {
			t.Fatalf("entry %d: text %q, string %q", i, w.Text, strs[i])
		}
		t.Run(w.Text, func(t *testing.T) {
			got := tok.Encode(w.Text)
			if !slices.Equal(got, w.IDs) {
				t.Errorf("Encode(%q) = %v, want %v", w.Text, got, w.IDs)
			}
			if d := tok.Decode(w.IDs, false); d != w.Decoded {
				t.Errorf("Decode = %q, want %q", d, w.Decoded)
			}
			if d := decodeStream(tok, w.IDs, false); d != w.Decoded {
				t.Errorf("streamed decode = %q, want %q", d, w.Decoded)
			}
		})
	}
}

func TestDemoModelPrompts(t *testing.T) {
	tok := loadDemo(t)
	var ref struct {
		Samples []struct {
			Prompt    string  `json:"prompt"`
			PromptIDs []int32 `json:"prompt_ids"`
			GreedyIDs []int32 `json:"greedy_ids"`
			Text      string  `json:"text"`
		} `json:"samples"`
	}
	readJSON(t, filepath.Join(demoModel, "reference.json"), &ref)
	if len(ref.Samples) == 0 {
		t.Fatal("reference.json has no samples")
	}
	for _, s := range ref.Samples {
		t.Run(s.Prompt, func(t *testing.T) {
			if got := tok.Encode(s.Prompt); !slices.Equal(got, s.PromptIDs) {
				t.Errorf("Encode(%q) = %v, want %v", s.Prompt, got, s.PromptIDs)
			}
			if got := tok.Decode(s.PromptIDs, false); got != s.Prompt {
				t.Errorf("Decode(prompt_ids) = %q, want %q", got, s.Prompt)
			}
			if got := tok.Decode(s.GreedyIDs, true); got != s.Text {
				t.Errorf("Decode(greedy_ids) = %q, want %q", got, s.Text)
			}
			if got := decodeStream(tok, s.GreedyIDs, true); got != s.Text {
				t.Errorf("streamed decode = %q, want %q", got, s.Text)
			}
		})
	}
}

func TestConcurrentEncode(t *testing.T) {
	tok := loadDemo(t)
	texts := []string{"The kernel's boot loader", "To create a new branch, run `git branch`", "SELECT * FROM t;\n", "  spaces\tand\ttabs  "}
	want := make([][]int32, len(texts))
	for i, s := range texts {
		want[i] = tok.Encode(s)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := range 8 {
		wg.Go(func() {
			for n := range 200 {
				i := (g + n) % len(texts)
				if got := tok.Encode(texts[i]); !slices.Equal(got, want[i]) {
					errs <- texts[i]
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for s := range errs {
		t.Errorf("concurrent Encode(%q) differs from serial", s)
	}
}
