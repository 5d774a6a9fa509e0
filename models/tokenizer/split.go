package tokenizer

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// Split regexes recognised by text and matched by hand-written scanners.
const (
	// patternGPT2 is the GPT-2 regex, also applied by ByteLevel when
	// use_regex is true.
	patternGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	// patternCL100K is the cl100k regex used by OLMo 2 (dolma2) and Llama 3.
	patternCL100K = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patternQwen2 is the cl100k regex with single digits, used by Qwen 2 and 3.
	patternQwen2 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// matcher finds the leftmost-first, non-overlapping, non-empty matches of a
// pattern in s, in order.
type matcher interface {
	matches(s string, fn func(start, end int))
}

// behavior is a Hugging Face SplitDelimiterBehavior.
type behavior int

const (
	behaviorRemoved behavior = iota
	behaviorIsolated
	behaviorMergedWithPrevious
	behaviorMergedWithNext
	behaviorContiguous
)

var behaviorNames = map[string]behavior{
	"Removed":            behaviorRemoved,
	"Isolated":           behaviorIsolated,
	"MergedWithPrevious": behaviorMergedWithPrevious,
	"MergedWithNext":     behaviorMergedWithNext,
	"Contiguous":         behaviorContiguous,
}

// splitStep is one Split pre-tokenizer.
type splitStep struct {
	m        matcher
	behavior behavior
	invert   bool
}

// byteLevelStep is the ByteLevel pre-tokenizer.
type byteLevelStep struct {
	addPrefixSpace bool
	useRegex       bool
}

func newSplitStep(p preTokenizerJSON) (splitStep, error) {
	b, ok := behaviorNames[p.Behavior]
	if !ok {
		return splitStep{}, fmt.Errorf("split: unknown behavior %q", p.Behavior)
	}
	if p.Pattern == nil {
		return splitStep{}, fmt.Errorf("split: missing pattern")
	}
	var m matcher
	switch {
	case p.Pattern.Regex != nil:
		var err error
		if m, err = compilePattern(*p.Pattern.Regex); err != nil {
			return splitStep{}, fmt.Errorf("split: %w", err)
		}
	case p.Pattern.String != nil:
		if *p.Pattern.String == "" {
			return splitStep{}, fmt.Errorf("split: empty string pattern")
		}
		m = literalMatcher(*p.Pattern.String)
	default:
		return splitStep{}, fmt.Errorf("split: pattern has neither Regex nor String")
	}
	return splitStep{m: m, behavior: b, invert: p.Invert}, nil
}

// compilePattern returns a hand-written scanner for the known regexes and a
// regexp2 matcher for any other.
func compilePattern(expr string) (matcher, error) {
	switch expr {
	case patternGPT2:
		return scanMatcher(scanGPT2), nil
	case patternCL100K:
		return scanMatcher(scanCL100K3), nil
	case patternQwen2:
		return scanMatcher(scanCL100K1), nil
	}
	return compileRegexp2(expr)
}

func compileRegexp2(expr string) (matcher, error) {
	re, err := regexp2.Compile(expr, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("compile regex %q: %w", expr, err)
	}
	return regexpMatcher{re}, nil
}

// regexpMatcher runs an arbitrary regex on regexp2.
type regexpMatcher struct{ re *regexp2.Regexp }

func (r regexpMatcher) matches(s string, fn func(start, end int)) {
	idx, err := r.re.FindAllStringIndex(s, -1)
	if err != nil {
		// A match that exceeds regexp2's limits leaves the rest unmatched:
		// it still reaches the model, byte for byte, as one piece.
		return
	}
	for _, m := range idx {
		if m[1] > m[0] {
			fn(m[0], m[1])
		}
	}
}

// literalMatcher splits on every occurrence of a fixed string.
type literalMatcher string

func (l literalMatcher) matches(s string, fn func(start, end int)) {
	off := 0
	for {
		i := strings.Index(s[off:], string(l))
		if i < 0 {
			return
		}
		fn(off+i, off+i+len(l))
		off += i + len(l)
	}
}

// scanMatcher adapts a scanner that returns the end of the match starting at
// i; the supported patterns match at every position, so matches tile s.
type scanMatcher func(s string, i int) int

func (f scanMatcher) matches(s string, fn func(start, end int)) {
	for i := 0; i < len(s); {
		e := f(s, i)
		fn(i, e)
		i = e
	}
}

// split applies step to s and passes each resulting piece to emit.
func (st *splitStep) split(s string, emit func(string)) {
	sink := segmentSink{s: s, behavior: st.behavior, invert: st.invert, emit: emit}
	prev := 0
	st.m.matches(s, func(start, end int) {
		if start > prev {
			sink.add(prev, start, false)
		}
		sink.add(start, end, true)
		prev = end
	})
	if prev < len(s) {
		sink.add(prev, len(s), false)
	}
	sink.flush()
}

// segmentSink turns a stream of (segment, is-delimiter) into pieces,
// following the Hugging Face delimiter behaviors.
type segmentSink struct {
	s        string
	behavior behavior
	invert   bool
	emit     func(string)

	hasPend            bool
	pendStart, pendEnd int
	pendMatch          bool
	prevMatch          bool
}

func (k *segmentSink) add(start, end int, isMatch bool) {
	if k.invert {
		isMatch = !isMatch
	}
	switch k.behavior {
	case behaviorRemoved:
		if !isMatch {
			k.emit(k.s[start:end])
		}
	case behaviorIsolated:
		k.emit(k.s[start:end])
	case behaviorMergedWithPrevious:
		if isMatch && !k.prevMatch && k.hasPend {
			k.pendEnd = end
		} else {
			k.flush()
			k.pend(start, end, isMatch)
		}
	case behaviorMergedWithNext:
		if k.hasPend && k.pendMatch && !isMatch {
			k.pendEnd = end
			k.pendMatch = false
			k.flush()
		} else {
			k.flush()
			k.pend(start, end, isMatch)
		}
	case behaviorContiguous:
		if k.hasPend && isMatch == k.prevMatch {
			k.pendEnd = end
		} else {
			k.flush()
			k.pend(start, end, isMatch)
		}
	}
	k.prevMatch = isMatch
}

func (k *segmentSink) pend(start, end int, isMatch bool) {
	k.hasPend, k.pendStart, k.pendEnd, k.pendMatch = true, start, end, isMatch
}

func (k *segmentSink) flush() {
	if k.hasPend {
		k.emit(k.s[k.pendStart:k.pendEnd])
		k.hasPend = false
	}
}

// Character classes of the split regexes. Invalid UTF-8 bytes decode as
// utf8.RuneError, which falls in none of \s, \p{L}, \p{N}.

// asciiClass holds the class bits of ASCII runes.
var asciiClass = func() (t [utf8.RuneSelf]uint8) {
	for c := range utf8.RuneSelf {
		switch {
		case 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
			t[c] = classLetter
		case '0' <= c && c <= '9':
			t[c] = classNumber
		case c == ' ' || '\t' <= c && c <= '\r':
			t[c] = classSpace
		}
	}
	return t
}()

const (
	classLetter = 1 << iota
	classNumber
	classSpace
)

func isLetter(r rune) bool {
	if r < utf8.RuneSelf {
		return asciiClass[r] == classLetter
	}
	return unicode.IsLetter(r)
}

func isNumber(r rune) bool {
	if r < utf8.RuneSelf {
		return asciiClass[r] == classNumber
	}
	return unicode.IsNumber(r)
}

func isSpace(r rune) bool {
	if r < utf8.RuneSelf {
		return asciiClass[r] == classSpace
	}
	return unicode.IsSpace(r)
}

func isPunct(r rune) bool {
	if r < utf8.RuneSelf {
		return asciiClass[r] == 0
	}
	return !unicode.IsSpace(r) && !unicode.IsLetter(r) && !unicode.IsNumber(r)
}

func decodeAt(s string, i int) (rune, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// contraction returns the end of 's|'t|'re|'ve|'m|'ll|'d when s[i] is the
// apostrophe, or -1. With fold, letters match case-insensitively, including
// the long s (U+017F), which Unicode case folding equates with s.
func contraction(s string, i int, fold bool) int {
	j := i + 1
	if j >= len(s) {
		return -1
	}
	lower := func(c byte) byte {
		if fold && 'A' <= c && c <= 'Z' {
			return c + 'a' - 'A'
		}
		return c
	}
	switch lower(s[j]) {
	case 's', 't', 'm', 'd':
		return j + 1
	case 'r', 'v':
		if j+1 < len(s) && lower(s[j+1]) == 'e' {
			return j + 2
		}
	case 'l':
		if j+1 < len(s) && lower(s[j+1]) == 'l' {
			return j + 2
		}
	case 0xC5: // U+017F is C5 BF
		if fold && j+1 < len(s) && s[j+1] == 0xBF {
			return j + 2
		}
	}
	return -1
}

// letterRun returns the end of the run of letters from i.
func letterRun(s string, i int) int {
	for i < len(s) {
		if c := s[i]; c < utf8.RuneSelf {
			if asciiClass[c] != classLetter {
				return i
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if !unicode.IsLetter(r) {
			return i
		}
		i += n
	}
	return i
}

// runOf returns the end of the run of runes satisfying class from i.
func runOf(s string, i int, class func(rune) bool) int {
	for i < len(s) {
		r, n := decodeAt(s, i)
		if !class(r) {
			break
		}
		i += n
	}
	return i
}

// scanWhitespace matches \s+(?!\S)|\s+ at i, where s[i] is whitespace.
func scanWhitespace(s string, i int) int {
	last := i // start of the last whitespace rune of the run
	j := i
	for j < len(s) {
		r, n := decodeAt(s, j)
		if !isSpace(r) {
			break
		}
		last = j
		j += n
	}
	if j == len(s) || last == i {
		return j
	}
	return last
}

// scanGPT2 matches patternGPT2 at i.
func scanGPT2(s string, i int) int {
	r, n := decodeAt(s, i)
	if r == '\'' {
		if e := contraction(s, i, false); e > 0 {
			return e
		}
	}
	j, rj, nj := i, r, n
	if r == ' ' && i+1 < len(s) {
		j = i + 1
		rj, nj = decodeAt(s, j)
	}
	if j > i || r != ' ' {
		switch {
		case isLetter(rj):
			return letterRun(s, j+nj)
		case isNumber(rj):
			return runOf(s, j+nj, isNumber)
		case isPunct(rj):
			return runOf(s, j+nj, isPunct)
		}
	}
	return scanWhitespace(s, i)
}

func scanCL100K3(s string, i int) int { return scanCL100K(s, i, 3) }
func scanCL100K1(s string, i int) int { return scanCL100K(s, i, 1) }

// scanCL100K matches patternCL100K (maxDigits 3) or patternQwen2
// (maxDigits 1) at i.
func scanCL100K(s string, i, maxDigits int) int {
	r, n := decodeAt(s, i)
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if r == '\'' {
		if e := contraction(s, i, true); e > 0 {
			return e
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if isLetter(r) {
		return letterRun(s, i+n)
	}
	if r != '\r' && r != '\n' && !isNumber(r) && i+n < len(s) {
		if r2, n2 := decodeAt(s, i+n); isLetter(r2) {
			return letterRun(s, i+n+n2)
		}
	}
	// \p{N}{1,maxDigits}
	if isNumber(r) {
		j := i + n
		for k := 1; k < maxDigits && j < len(s); k++ {
			r2, n2 := decodeAt(s, j)
			if !isNumber(r2) {
				break
			}
			j += n2
		}
		return j
	}
	// ` ?[^\s\p{L}\p{N}]+[\r\n]*`
	j := i
	if r == ' ' {
		j = i + 1
	}
	if j < len(s) {
		if rj, nj := decodeAt(s, j); isPunct(rj) {
			e := runOf(s, j+nj, isPunct)
			for e < len(s) && (s[e] == '\r' || s[e] == '\n') {
				e++
			}
			return e
		}
	}
	// Only whitespace is left: \s*[\r\n]+ ends after the run's last line
	// break; otherwise \s+(?!\S)|\s+.
	lastBreak := -1
	e := i
	for e < len(s) {
		r2, n2 := decodeAt(s, e)
		if !isSpace(r2) {
			break
		}
		if r2 == '\r' || r2 == '\n' {
			lastBreak = e
		}
		e += n2
	}
	if lastBreak >= 0 {
		return lastBreak + 1
	}
	return scanWhitespace(s, i)
}
