package grammar_test

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/troupe/troupe/models/grammar"
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

// A walk through the demo vocabulary that draws from random logits under
// the mask always has a token to take, and ends on a valid JSON object.
func TestDemoVocabularyWalks(t *testing.T) {
	vocab := demoVocab(t)
	v, err := grammar.NewVocab(vocab)
	if err != nil {
		t.Fatal(err)
	}
	j := v.JSON()
	r := rand.New(rand.NewPCG(5, 6))
	logits := make([]float32, len(vocab))
	var closers []int
	for id, b := range vocab {
		if len(b) == 1 && (b[0] == '}' || b[0] == ']' || b[0] == '"' || b[0] == '0') {
			closers = append(closers, id)
		}
	}
	closed := 0
	for walk := range 40 {
		q := j.Start()
		var text []byte
		for step := 0; step < 400 && !q.Done(); step++ {
			for i := range logits {
				logits[i] = float32(r.NormFloat64())
			}
			// Favour closers late in a walk, so that most walks end.
			if step > 100 {
				for _, id := range closers {
					logits[id] += 6
				}
			}
			if n := q.Mask(logits); n == 0 {
				t.Fatalf("walk %d: no token allowed after %q", walk, text)
			}
			best := 0
			for i, l := range logits {
				if l > logits[best] {
					best = i
				}
			}
			if math.IsInf(float64(logits[best]), -1) {
				t.Fatalf("walk %d: every logit masked after %q", walk, text)
			}
			if err := q.Accept(int32(best)); err != nil {
				t.Fatalf("walk %d after %q: %v", walk, text, err)
			}
			text = append(text, vocab[best]...)
		}
		if q.Done() {
			closed++
			var v map[string]any
			if err := json.Unmarshal(text, &v); err != nil {
				t.Fatalf("walk %d closed on %q: %v", walk, text, err)
			}
		}
	}
	if closed < 20 {
		t.Fatalf("%d of 40 walks closed their objects", closed)
	}
}
