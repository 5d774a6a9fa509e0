package grammar

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// scanAll scans text from the start and reports whether every byte was
// taken and whether the object closed.
func scanAll(text []byte) (ok, done bool) {
	var s scan
	for _, c := range text {
		if !s.step(c) {
			return false, false
		}
	}
	return true, s.mode == mDone
}

// objectText reports whether text is what JSON mode may produce in full:
// one valid JSON object in valid UTF-8, nothing before or after it,
// within the limits on whitespace and depth.
func objectText(text []byte) bool {
	if len(text) == 0 || text[0] != '{' || !json.Valid(text) || !utf8.Valid(text) || isSpace(text[len(text)-1]) {
		return false
	}
	depth, run, breaks, inString, escaped := 0, 0, 0, false, false
	for _, c := range text {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		case isSpace(c):
			if c == '\n' {
				breaks++
			}
			if run++; run > min(MaxWhitespace, 1+4*depth) || breaks > 1 {
				return false
			}
			continue
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			if depth++; depth > MaxDepth {
				return false
			}
		case c == '}' || c == ']':
			depth--
		}
		run, breaks = 0, 0
	}
	return true
}

var validObjects = []string{
	`{}`,
	`{"a":1}`,
	"{\n\t \"a\" : [1, -2, 3.5e+10, 0, -0.25E-3, 1e5], \"b\": {\"c\": null, \"d\": true, \"e\": false} }",
	`{"s":"esc \" \\ \/ \b \f \n \r \t \u00e9 \uD83D\uDE00","u":"é ☃ 𝄞 ✓"}`,
	`{"nested":[[[[]]],{},[{}],{"x":[{"y":{}}]}]}`,
	`{"":""}`,
	`{"n":123456789012345678901234567890}`,
	`{"a":[true,false,null]}`,
	`{"a":0.0}`,
	strings.Repeat(`{"a":`, MaxDepth) + "1" + strings.Repeat("}", MaxDepth),
	"{\n    }",
	`{"a":[[[[` + "\n" + strings.Repeat(" ", MaxWhitespace-1) + `1]]]]}`,
}

var invalidObjects = []string{
	`[]`, `"x"`, `1`, `{]`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{,}`, `{"a":01}`, `{"a":1.}`, `{"a":.5}`,
	`{"a":-}`, `{"a":1e}`, `{"a":tru}`, `{"a":nul}`, `{"a":True}`, `{'a':1}`, `{"a":"\x"}`, `{"a":"\u12G4"}`,
	"{\"a\":\"\x01\"}", "{\"a\":\"\xff\"}", "{\"a\":\"\xc0\xaf\"}", "{\"a\":\"\xed\xa0\x80\"}", "{\"a\":\"\xf4\x90\x80\x80\"}",
	`{} `, `{}{}`, `{"a":1}}`, `{"a":[1}`, `{"a":{]}`, `{"a" 1}`, `{"a":1 "b":2}`,
	strings.Repeat(`{"a":`, MaxDepth+1) + "1" + strings.Repeat("}", MaxDepth+1),
	"{      }", "{\n\n}", "{ \n \n}", `{"a":[[[[` + "\n" + strings.Repeat(" ", MaxWhitespace) + `1]]]]}`, ` {}`, "\n{}",
}

func TestScanObjects(t *testing.T) {
	for _, s := range validObjects {
		if !objectText([]byte(s)) {
			t.Fatalf("the oracle refuses %.40q", s)
		}
		if ok, done := scanAll([]byte(s)); !ok || !done {
			t.Errorf("%.60q: taken %v, closed %v; want both", s, ok, done)
		}
	}
	for _, s := range invalidObjects {
		if objectText([]byte(s)) {
			t.Fatalf("the oracle takes %.40q", s)
		}
		if ok, done := scanAll([]byte(s)); ok && done {
			t.Errorf("%.60q: taken and closed; want refused or open", s)
		}
	}
	// A prefix of a valid object is taken but open.
	for _, s := range validObjects {
		for i := range len(s) - 1 {
			if ok, done := scanAll([]byte(s[:i])); !ok || done {
				t.Fatalf("prefix %.60q of %.40q: taken %v, closed %v; want taken, open", s[:i], s, ok, done)
			}
		}
	}
}

// randomValue is a random JSON value of up to depth levels.
func randomValue(r *rand.Rand, depth int) any {
	switch k := r.IntN(8); {
	case k == 0 && depth > 0:
		m := map[string]any{}
		for range r.IntN(4) {
			m[randomString(r)] = randomValue(r, depth-1)
		}
		return m
	case k == 1 && depth > 0:
		a := make([]any, r.IntN(4))
		for i := range a {
			a[i] = randomValue(r, depth-1)
		}
		return a
	case k == 2:
		return randomString(r)
	case k == 3:
		return r.NormFloat64() * math.Pow(10, float64(r.IntN(40)-20))
	case k == 4:
		return r.IntN(2000) - 1000
	case k == 5:
		return r.IntN(2) == 0
	case k == 6:
		return nil
	}
	return ""
}

func randomString(r *rand.Rand) string {
	runes := []rune{'a', 'Z', ' ', '"', '\\', '/', '\n', '\t', 0x01, 'é', '☃', '𝄞', 0x7f, 0x2028}
	var b strings.Builder
	for range r.IntN(6) {
		b.WriteRune(runes[r.IntN(len(runes))])
	}
	return b.String()
}

func TestScanRandomObjects(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		m := map[string]any{"k": randomValue(r, 5)}
		var text []byte
		var err error
		if i%2 == 0 {
			text, err = json.Marshal(m)
		} else {
			text, err = json.MarshalIndent(m, "", "  ")
		}
		if err != nil {
			t.Fatal(err)
		}
		if ok, done := scanAll(text); !ok || !done {
			t.Fatalf("%s: taken %v, closed %v; want both", text, ok, done)
		}
	}
}

func FuzzScan(f *testing.F) {
	for _, s := range append(validObjects, invalidObjects...) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, text []byte) {
		ok, done := scanAll(text)
		if want := objectText(text); (ok && done) != want {
			t.Fatalf("%q: taken %v, closed %v; a whole JSON-mode object: %v", text, ok, done, want)
		}
	})
}

// testVocab is every single byte and pieces of JSON that cross the
// grammar's boundaries.
func testVocab() [][]byte {
	var v [][]byte
	for c := range 256 {
		v = append(v, []byte{byte(c)})
	}
	for _, s := range []string{`{"`, `":`, `": "`, `"}`, `",`, `", "`, `"}}`, `}]}`, `]}`, ` {`, "{\n", "\n  ", "  ", "    ", `true`, `false`,
		`null`, `tr`, `nu`, `ll`, `12`, `0.`, `.5`, `e+`, `E-1`, `-0`, `00`, `1,`, `1}`, `\u`, `\u00`, `e9`, `\n`, `\"`, `é`, "\xc3", "\xa9",
		"\xe2\x98", "\x83", "\xf0\x9d", "\x84\x9e", "☃\"", `":{"`, `":[`, `[]`, `{}`, `"a"`, `abc`, ` the`, `<|endoftext|>`, "\x00"} {
		v = append(v, []byte(s))
	}
	return append(v, nil, []byte{}) // a special token and an empty one: never allowed
}

func TestMaskMatchesEachToken(t *testing.T) {
	vocab := testVocab()
	j := mustJSON(t, vocab)
	r := rand.New(rand.NewPCG(3, 4))
	logits := make([]float32, len(vocab)+3)
	objects := 0
	for walk := range 300 {
		q := j.Start()
		var text []byte
		for step := 0; step < 200 && !q.Done(); step++ {
			for i := range logits {
				logits[i] = 0
			}
			n := q.Mask(logits)
			var allowed []int32
			for id, b := range vocab {
				s := q.s
				want := len(b) > 0
				for _, c := range b {
					if want = q.g.step(&s, c); !want {
						break
					}
				}
				if got := !math.IsInf(float64(logits[id]), -1); got != want {
					t.Fatalf("walk %d after %q: token %d (%q) allowed %v, want %v", walk, text, id, b, got, want)
				}
				if q.Allowed(int32(id)) != want {
					t.Fatalf("walk %d after %q: Allowed(%d) disagrees with Mask", walk, text, id)
				}
				if want {
					allowed = append(allowed, int32(id))
				}
			}
			for id := len(vocab); id < len(logits); id++ {
				if !math.IsInf(float64(logits[id]), -1) {
					t.Fatalf("id %d past the vocabulary is not masked", id)
				}
			}
			if n != len(allowed) || n == 0 {
				t.Fatalf("walk %d after %q: Mask counts %d, %d allowed", walk, text, n, len(allowed))
			}
			// Short tokens mostly, so that walks close their objects.
			id := allowed[r.IntN(len(allowed))]
			if walk%2 == 0 {
				for range 3 {
					if c := allowed[r.IntN(len(allowed))]; len(vocab[c]) > len(vocab[id]) {
						id = c
					}
				}
			}
			if err := q.Accept(id); err != nil {
				t.Fatal(err)
			}
			text = append(text, vocab[id]...)
		}
		if q.Done() {
			objects++
			if !objectText(text) {
				t.Fatalf("walk %d closed on %q, not a JSON object", walk, text)
			}
		}
	}
	if objects == 0 {
		t.Fatal("no walk closed its object")
	}
	t.Logf("%d of 300 walks closed their objects", objects)
}

func TestAcceptRefuses(t *testing.T) {
	vocab := testVocab()
	q := mustJSON(t, vocab).Start()
	for _, id := range []int32{-1, int32(len(vocab)), int32(len(vocab) - 1), int32(len(vocab) - 2), '[', 'x'} {
		if err := q.Accept(id); err == nil {
			t.Errorf("token %d taken at the start", id)
		}
	}
	if err := q.Accept('{'); err != nil {
		t.Fatal(err)
	}
	if err := q.Accept('}'); err != nil || !q.Done() {
		t.Fatalf("{}: %v, done %v", err, q.Done())
	}
	logits := make([]float32, len(vocab))
	if n := q.Mask(logits); n != 0 {
		t.Fatalf("%d tokens allowed after the object closed", n)
	}
}

// The cache keeps masks by state; equal states must compare equal however
// they were reached.
func TestStatesCompareEqual(t *testing.T) {
	a, _ := scanState(`{"a":[1,{"b":"\u00e9"}],"c":tru`)
	b, _ := scanState(`{"xyz":[[],{}],"q":tru`)
	if a != b {
		t.Fatalf("states differ:\n%+v\n%+v", a, b)
	}
	c, _ := scanState(`{"a":{"b":[]},"c":"é`)
	d, _ := scanState(`{"a":"d","c":"`)
	if c != d {
		t.Fatalf("states differ:\n%+v\n%+v", c, d)
	}
}

func scanState(text string) (scan, bool) {
	var s scan
	for i := range len(text) {
		if !s.step(text[i]) {
			return s, false
		}
	}
	return s, true
}

func mustJSON(t testing.TB, vocab [][]byte) *Grammar {
	t.Helper()
	v, err := NewVocab(vocab)
	if err != nil {
		t.Fatal(err)
	}
	return v.JSON()
}

func TestVocabularyWithoutEveryByte(t *testing.T) {
	vocab := testVocab()
	vocab['}'] = nil
	if _, err := NewVocab(vocab); err == nil || !strings.Contains(err.Error(), "0x7d") {
		t.Fatalf("a vocabulary without '}': %v", err)
	}
}

func ExampleVocab_JSON() {
	// Every single byte, then a few longer tokens.
	vocab := make([][]byte, 256)
	for c := range vocab {
		vocab[c] = []byte{byte(c)}
	}
	vocab = append(vocab, []byte(`{"`), []byte(`answer`), []byte(`":`), []byte(` 42`), []byte(`Sure!`))
	v, err := NewVocab(vocab)
	if err != nil {
		panic(err)
	}
	q := v.JSON().Start()
	var out []string
	for _, id := range []int32{260, 256, 257, 258, 259, '}'} {
		if !q.Allowed(id) {
			out = append(out, fmt.Sprintf("(%s refused)", vocab[id]))
			continue
		}
		if err := q.Accept(id); err != nil {
			panic(err)
		}
		out = append(out, string(vocab[id]))
	}
	fmt.Println(strings.Join(out, ""), q.Done())
	// Output: (Sure! refused){"answer": 42} true
}
