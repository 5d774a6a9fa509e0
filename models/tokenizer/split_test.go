package tokenizer

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// splitSeeds are inputs that exercise every branch of the split regexes.
var splitSeeds = []string{
	"",
	"Hello, world!",
	"  two  spaces",
	"line1\nline2\n\nline4",
	"trailing spaces   ",
	"tabs\tand \t\tmixed \n \r\n  lines\r\r\n",
	"it's we'll they're I'M 'S 'Ve 'x ''s",
	"Café 123 456789 1234567 ² ½ Ⅻ",
	"emoji 😀 ok 👍🏽!",
	"(parens) [brackets] {braces} <angle> \"quotes\"",
	"   !!!   ???\n\n  ...\r\n",
	"über naïve 日本語のテキスト 한국어 العربية",
	"a\u00a0b\u2003c\u3000d\u2028e\u0085f",
	"x = y + 42; // comment\n\tif (x) { return; }\n",
	"invalid \xff\xfe bytes \xe2\x82 end",
	"'",
	" ",
	"\n",
	" '",
	" 's",
	"?a",
	"\ta",
	"1a",
	" 1",
}

// knownPatterns are the regexes the hand-written scanners implement.
var knownPatterns = []string{patternGPT2, patternCL100K, patternQwen2}

// collect runs m on s and returns the matched spans.
func collect(m matcher, s string) []string {
	var out []string
	m.matches(s, func(a, b int) { out = append(out, s[a:b]) })
	return out
}

// patternPair is a known pattern compiled both ways.
type patternPair struct {
	pattern          string
	scanner, general matcher
}

func compileBoth(t testing.TB) []patternPair {
	t.Helper()
	var out []patternPair
	for _, p := range knownPatterns {
		scanner, err := compilePattern(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := scanner.(scanMatcher); !ok {
			t.Fatalf("pattern %q is not matched by a scanner", p)
		}
		general, err := compileRegexp2(p)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, patternPair{p, scanner, general})
	}
	return out
}

// checkScannerAgainstRegexp2 compares the hand-written scanners with the
// same patterns run by the general regex engine.
func checkScannerAgainstRegexp2(t *testing.T, pairs []patternPair, s string) {
	t.Helper()
	for _, pp := range pairs {
		got, want := collect(pp.scanner, s), collect(pp.general, s)
		if !slices.Equal(got, want) {
			t.Errorf("pattern %q on %q:\n got %q\nwant %q", pp.pattern, s, got, want)
		}
	}
}

func TestScannersMatchRegexEngine(t *testing.T) {
	pairs := compileBoth(t)
	for _, s := range splitSeeds {
		if !utf8.ValidString(s) {
			continue
		}
		checkScannerAgainstRegexp2(t, pairs, s)
	}
}

// FuzzScanners checks the hand-written scanners against regexp2 on the
// same patterns, and that their matches tile the input.
func FuzzScanners(f *testing.F) {
	for _, s := range splitSeeds {
		f.Add(s)
	}
	pairs := compileBoth(f)
	f.Fuzz(func(t *testing.T, s string) {
		for _, pp := range pairs {
			if got := strings.Join(collect(pp.scanner, s), ""); got != s {
				t.Fatalf("pattern %q: matches of %q join to %q", pp.pattern, s, got)
			}
		}
		// regexp2 works on runes; it differs on invalid UTF-8 and on the
		// long s, which Unicode case folding (and so Hugging Face) equates
		// with s but regexp2 does not. Backtracking is quadratic on long
		// whitespace runs, so long inputs are left to the tiling check.
		if !utf8.ValidString(s) || strings.ContainsRune(s, 'ſ') || len(s) > 512 {
			return
		}
		checkScannerAgainstRegexp2(t, pairs, s)
	})
}

func TestScannerLongS(t *testing.T) {
	m, err := compilePattern(patternCL100K)
	if err != nil {
		t.Fatal(err)
	}
	got := collect(m, "it'ſ")
	want := []string{"it", "'ſ"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestSplitBehaviors uses the example from the Hugging Face documentation
// of SplitDelimiterBehavior.
func TestSplitBehaviors(t *testing.T) {
	const in = "the-final--countdown"
	tests := []struct {
		behavior string
		invert   bool
		want     []string
	}{
		{"Removed", false, []string{"the", "final", "countdown"}},
		{"Isolated", false, []string{"the", "-", "final", "-", "-", "countdown"}},
		{"MergedWithPrevious", false, []string{"the-", "final-", "-", "countdown"}},
		{"MergedWithNext", false, []string{"the", "-final", "-", "-countdown"}},
		{"Contiguous", false, []string{"the", "-", "final", "--", "countdown"}},
		{"Removed", true, []string{"-", "-", "-"}},
	}
	for _, tc := range tests {
		t.Run(tc.behavior, func(t *testing.T) {
			dash := "-"
			step, err := newSplitStep(preTokenizerJSON{Type: "Split", Pattern: &patternJSON{String: &dash}, Behavior: tc.behavior, Invert: tc.invert})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			step.split(in, func(p string) { got = append(got, p) })
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
