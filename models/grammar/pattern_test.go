package grammar

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// matches runs d over text: whether the whole text is accepted.
func (d *dfa) matches(text string) bool {
	st := int32(0)
	for _, r := range text {
		if st = d.step(st, r); st < 0 {
			return false
		}
	}
	return d.accept[st]
}

var testPatterns = []string{
	`^[A-Z]{2}-[0-9]+$`, `x\.y|\u00e9|^$`, `ab`, `^ab`, `ab$`, `^$`, `^(a|bc)*$`, `a*b?c{2,3}`, `[^a-c]x`,
	`^\d{3}(-\d{4})?$`, `é+ü`, `^[\x{1F600}-\x{1F64F}]+$`, `^\w+@\w+\.\w{2,}$`, `\s`, `^[^\n]*$`, `$^`, `^$^$`,
	`(^a|b$)`, `^.$`, `a.c`, `^(?:x|y)+z?$`, `[😀-😂]`, `\\`, `"`,
}

// The automata accept exactly the strings Go's regexp matches anywhere
// (each pattern's own anchors aside), over random strings of the
// characters the patterns tell apart and others.
func TestPatternAutomaton(t *testing.T) {
	alphabet := []rune("abcxyzABZ019-.@_ \t\n\\\"éü😀😁😂\U0001F64F\u4e16")
	r := rand.New(rand.NewPCG(3, 4))
	for _, p := range testPatterns {
		d, err := compilePattern(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		re := oraclePattern(t, p)
		matched := 0
		for range 4000 {
			n := r.IntN(8)
			var b strings.Builder
			for range n {
				b.WriteRune(alphabet[r.IntN(len(alphabet))])
			}
			text := b.String()
			if r.IntN(3) == 0 {
				// A match of a sibling pattern's shape, changed a little.
				shape := []string{"AB-12", "ab@cd.xyz", "ab", "019-1090"}[r.IntN(4)]
				text = strings.Repeat("ab", r.IntN(3)*r.IntN(2)) + shape + text[:min(len(text), r.IntN(3))]
			}
			want := re.MatchString(text)
			if got := d.matches(text); got != want {
				t.Fatalf("%s over %q: automaton %v, regexp %v", p, text, got, want)
			}
			if want {
				matched++
			}
		}
		if matched == 0 && p != "$^" && p != "^$^$" && p != "^$" {
			t.Errorf("%s: no random string matched", p)
		}
	}
	// ECMA-262's '.' takes no line terminator; RE2's takes all but \n.
	d, err := compilePattern(`^.$`)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"\n", "\r", "\u2028", "\u2029"} {
		if d.matches(s) {
			t.Errorf("'.' took %q", s)
		}
	}
	if !d.matches("\t") || !d.matches("😀") {
		t.Error("'.' refused a tab or an emoji")
	}
}

// The formats' automata take valid texts only, by the oracle of the
// schema tests, and some of each.
func TestFormats(t *testing.T) {
	for _, c := range []struct {
		format, text string
		ok           bool
	}{
		{"ipv6", "::1", true}, {"ipv6", "::", true}, {"ipv6", "2001:db8::ff00:42:8329", true}, {"ipv6", "1:2:3:4:5:6:7:8", true},
		{"ipv6", "1::2::3", false}, {"ipv6", "1:2:3:4:5:6:7:8:9", false}, {"ipv6", "12345::", false}, {"ipv6", "::ffff:1.2.3.4", false},
		{"hostname", "example.com", true}, {"hostname", "a-b.c", true}, {"hostname", "-a.com", false}, {"hostname", "a..b", false},
		{"email", "ada.l@math.example.org", true}, {"email", "a@b", false}, {"email", "a..b@c.io", false}, {"email", "@c.io", false},
		{"date", "2023-11-30", true}, {"date", "2023-11-31", false}, {"time", "23:59:59+14:00", true}, {"time", "23:59:59", false},
		{"duration", "P1Y2M3DT4H5M6S", true}, {"duration", "P3W", true}, {"duration", "PT36H", true}, {"duration", "P2D", true},
		{"duration", "P", false}, {"duration", "PT", false}, {"duration", "P1D2Y", false}, {"duration", "PT1H1S", false}, {"duration", "P1W2D", false},
		{"uuid", "123e4567-e89b-12d3-a456-426614174000", true}, {"ipv4", "255.255.255.255", true}, {"ipv4", "1.2.3", false},
		{"uri", "https://example.com/a/b?x=1&y=%C3%A9#top", true}, {"uri", "mailto:ada@example.org", true}, {"uri", "urn:isbn:0451450523", true},
		{"uri", "http://[::1]:8080/", true}, {"uri", "http://[v7.fe80::a]/", true}, {"uri", "foo:", true}, {"uri", "file:///etc/hosts", true},
		{"uri", "http://user:pw@h:/p;q=1/%41", true}, {"uri", "//example.com", false}, {"uri", "http://exa mple.com", false},
		{"uri", "1http://x", false}, {"uri", "http://h/%4", false}, {"uri", "http://[::1/", false}, {"uri", "http://h/<a>", false},
		{"uri-reference", "", true}, {"uri-reference", "../a/b?c", true}, {"uri-reference", "//host/p", true}, {"uri-reference", "#frag", true},
		{"uri-reference", "a:b", true}, {"uri-reference", "./a:b", true}, {"uri-reference", ":x", false}, {"uri-reference", "a b", false},
		{"uri-reference", "/p%zz", false}, {"uri", "https://例え.jp/パス", false},
		{"iri", "https://例え.jp/パス?q=値#frag", true}, {"iri", "mailto:ünïcode@example.org", true}, {"iri", "http://a/?\ue000", true},
		{"iri", "http://a/\ue000", false}, {"iri", "x:\ufffe", false}, {"iri", "http://a/ b", false},
		{"iri-reference", "../ünï/côdé", true}, {"iri-reference", "ü:b", false},
		{"json-pointer", "", true}, {"json-pointer", "/a~1b/~0c", true}, {"json-pointer", "/", true}, {"json-pointer", "/a b/\u00e9", true},
		{"json-pointer", "a", false}, {"json-pointer", "/~2", false},
		{"relative-json-pointer", "0", true}, {"relative-json-pointer", "1/a", true}, {"relative-json-pointer", "2#", true},
		{"relative-json-pointer", "01", false}, {"relative-json-pointer", "#", false}, {"relative-json-pointer", "0/~", false},
		{"uri-template", "https://api.example.com/users/{id}{?fields*,page}", true}, {"uri-template", "{+path:6}/here{#frag}", true},
		{"uri-template", "/a{b.c,d%20e}", true}, {"uri-template", "plain", true}, {"uri-template", "", true},
		{"uri-template", "{}", false}, {"uri-template", "{a:0}", false}, {"uri-template", "{a:10000}", false}, {"uri-template", "{a..b}", false},
		{"uri-template", "a b", false}, {"uri-template", "{a", false}, {"uri-template", "a}", false}, {"uri-template", "{a b}", false},
	} {
		d, err := compilePattern(formats[c.format])
		if err != nil {
			t.Fatal(err)
		}
		if got := d.matches(c.text); got != c.ok || got && !validFormat(c.format, c.text) {
			t.Errorf("%s %q: taken %v, want %v", c.format, c.text, got, c.ok)
		}
	}
	r := rand.New(rand.NewPCG(8, 9))
	for name, src := range formats {
		d, err := compilePattern(src)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		// Random walks through the automaton: each accepted text validates.
		accepted := 0
		for range 2000 {
			st, text := int32(0), []rune{}
			for len(text) < 40 && !(d.accept[st] && r.IntN(4) == 0) {
				var next []rune
				for c := range d.classes {
					if d.next[int(st)*d.classes+c] >= 0 {
						lo := d.bounds[c]
						hi := rune(utf8.MaxRune)
						if c+1 < d.classes {
							hi = d.bounds[c+1] - 1
						}
						next = append(next, lo+rune(r.Int64N(int64(min(hi-lo, 64))+1)))
					}
				}
				if len(next) == 0 {
					if !d.accept[st] {
						t.Fatalf("%s: stuck after %q", name, string(text))
					}
					break
				}
				c := next[r.IntN(len(next))]
				text, st = append(text, c), d.step(st, c)
			}
			if d.accept[st] {
				accepted++
				if !validFormat(name, string(text)) {
					t.Fatalf("%s: %q is not valid", name, string(text))
				}
			}
		}
		if accepted < 1000 {
			t.Errorf("%s: %d of 2000 walks ended on a text", name, accepted)
		}
	}
}

// FuzzPattern compiles a pattern and checks its automaton against Go's
// regexp on a text; it never panics, whatever the pattern.
func FuzzPattern(f *testing.F) {
	for i, p := range testPatterns {
		f.Add(p, []string{"ab", "AB-12", "x.y", "é", "", "a\nb"}[i%6])
	}
	f.Fuzz(func(t *testing.T, p, text string) {
		if !utf8.ValidString(text) || strings.ContainsAny(text, "\r\u2028\u2029") && strings.Contains(p, ".") {
			return
		}
		d, err := compilePattern(p)
		if err != nil {
			return
		}
		for _, r := range text {
			if r >= 0xD800 && r < 0xE000 || r == utf8.RuneError {
				return
			}
		}
		if got, want := d.matches(text), oraclePattern(t, p).MatchString(text); got != want {
			t.Fatalf("%q over %q: automaton %v, regexp %v", p, text, got, want)
		}
	})
}

// The strings of a schema that share a pattern or format share one
// automaton, built once.
func TestPatternsShared(t *testing.T) {
	s, err := CompileSchema([]byte(`{"type":"object","properties":{"a":{"type":"string","format":"date"},` +
		`"b":{"type":"array","items":{"type":"string","format":"date"}},"c":{"type":"string","pattern":"^x+$"},"d":{"type":"string","pattern":"^x+$"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	byPattern := map[*dfa]int{}
	for _, n := range s.nodes {
		if n.pat != nil {
			byPattern[n.pat]++
		}
	}
	if len(byPattern) != 2 {
		t.Fatalf("%d automata for two patterns", len(byPattern))
	}
	for _, n := range byPattern {
		if n != 2 {
			t.Errorf("an automaton serves %d strings, want 2", n)
		}
	}
}
