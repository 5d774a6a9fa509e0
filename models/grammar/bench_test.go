package grammar

import (
	"testing"

	"github.com/troupe/troupe/models/modeltest"
	"github.com/troupe/troupe/models/tokenizer"
)

// olmoVocab is OLMo 2's vocabulary (100,278 tokens) from the shared test
// data beside the repository, which only the benchmark needs.
func olmoVocab(b *testing.B) [][]byte {
	tok, err := tokenizer.Load(modeltest.MustShared(b, "tokenizers", "olmo2-dolma2", "tokenizer.json"))
	if err != nil {
		b.Fatal(err)
	}
	return tok.TokenBytes()
}

// BenchmarkMask times a mask over OLMo 2's vocabulary where it is
// scanned (every state new) and where the cache has it.
func BenchmarkMask(b *testing.B) {
	vocab := olmoVocab(b)
	logits := make([]float32, len(vocab))
	j := mustJSON(b, vocab)
	for _, c := range []struct{ name, text string }{
		{"start", ``},
		{"key", `{"`},
		{"string", `{"name": "Ada`},
		{"number", `{"n": 12`},
		{"after", `{"a": [1, 2]`},
	} {
		q := j.Start()
		for i := range len(c.text) {
			if err := q.Accept(int32(findByte(b, vocab, c.text[i]))); err != nil {
				b.Fatal(err)
			}
		}
		b.Run("scan/"+c.name, func(b *testing.B) {
			for b.Loop() {
				clear(j.masks)
				q.Mask(logits)
			}
		})
	}
	// A string with a maxLength counts its characters, and one with a
	// pattern moves its automaton, so every byte changes the state: no
	// plain-text shortcut.
	v, err := NewVocab(vocab)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct{ name, schema string }{
		{"bounded string", `{"type":"string","maxLength":64}`},
		{"patterned string", `{"type":"string","pattern":"^[A-Z][a-z]+( [A-Z][a-z]+)*$"}`},
		{"date-time", `{"type":"string","format":"date-time"}`},
	} {
		sc, err := CompileSchema([]byte(`{"type":"object","properties":{"name":` + c.schema + `}}`))
		if err != nil {
			b.Fatal(err)
		}
		g := v.Schema(sc)
		q := g.Start()
		text := `{"name":"Ada`
		if c.name == "date-time" {
			text = `{"name":"2024-`
		}
		for _, ch := range []byte(text) {
			if err := q.Accept(int32(findByte(b, vocab, ch))); err != nil {
				b.Fatal(err)
			}
		}
		b.Run("scan/"+c.name, func(b *testing.B) {
			for b.Loop() {
				clear(g.masks)
				q.Mask(logits)
			}
		})
	}
	b.Run("cached", func(b *testing.B) {
		q := j.Start()
		q.Mask(logits)
		for b.Loop() {
			q.Mask(logits)
		}
	})
}

// findByte is the id of the token of one byte c.
func findByte(b testing.TB, vocab [][]byte, c byte) int {
	for id, v := range vocab {
		if len(v) == 1 && v[0] == c {
			return id
		}
	}
	b.Fatalf("no token for byte %q", c)
	return -1
}
