package grammar

import (
	"encoding/json"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/troupe/troupe/models/tokenizer"
)

// demoVocab is the demo model's vocabulary (8,192 tokens).
func demoVocab(t testing.TB) [][]byte {
	tok, err := tokenizer.Load(filepath.Join("..", "demo", "docs-olmo2-17m", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	return tok.TokenBytes()
}

// walk draws up to steps tokens for q, each the most likely of random
// logits that tilt (when set) changes by step, under q's mask. It
// returns the text and whether the document closed.
func walk(t testing.TB, q *Seq, r *rand.Rand, steps int, tilt func(step int, logits []float32)) ([]byte, bool) {
	vocab := q.g.v.tokens
	logits := make([]float32, len(vocab))
	var text []byte
	for step := 0; step < steps && !q.Done(); step++ {
		for i := range logits {
			logits[i] = float32(r.NormFloat64())
		}
		if tilt != nil {
			tilt(step, logits)
		}
		if n := q.Mask(logits); n == 0 {
			t.Fatalf("no token allowed after %q", text)
		}
		best := 0
		for i, l := range logits {
			if l > logits[best] {
				best = i
			}
		}
		if err := q.Accept(int32(best)); err != nil {
			t.Fatalf("after %q: %v", text, err)
		}
		text = append(text, vocab[best]...)
	}
	return text, q.Done()
}

// A walk through the demo vocabulary always has a token to take, and ends
// on a valid JSON object.
func TestDemoVocabularyWalks(t *testing.T) {
	vocab := demoVocab(t)
	v, err := NewVocab(vocab)
	if err != nil {
		t.Fatal(err)
	}
	var closers []int
	for id, b := range vocab {
		if len(b) == 1 && (b[0] == '}' || b[0] == ']' || b[0] == '"' || b[0] == '0') {
			closers = append(closers, id)
		}
	}
	// Favour closers late in a walk, so that most walks end.
	tilt := func(step int, logits []float32) {
		if step > 100 {
			for _, id := range closers {
				logits[id] += 6
			}
		}
	}
	r := rand.New(rand.NewPCG(5, 6))
	closed := 0
	for range 40 {
		text, done := walk(t, v.JSON().Start(), r, 400, tilt)
		if done {
			closed++
			var m map[string]any
			if err := json.Unmarshal(text, &m); err != nil {
				t.Fatalf("closed on %q: %v", text, err)
			}
		}
	}
	if closed < 20 {
		t.Fatalf("%d of 40 walks closed their objects", closed)
	}
}
