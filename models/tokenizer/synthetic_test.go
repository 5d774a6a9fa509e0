package tokenizer

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// spec describes a small byte-level BPE tokenizer built by the tests.
type spec struct {
	merges       []string // "left right", in rank order; merged tokens join the vocab
	pairMerges   bool     // write merges as [left, right] pairs
	ignoreMerges bool
	added        []map[string]any
	normalizer   any
	preTokenizer any
	decoder      any
}

// byteLevelOnly is a pre-tokenizer with the GPT-2 regex built into ByteLevel.
var byteLevelOnly = map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}

func (s spec) json(t testing.TB) []byte {
	t.Helper()
	alphabet := byteLevelAlphabet()
	vocab := map[string]int{}
	for b, r := range alphabet {
		vocab[string(r)] = b
	}
	var merges []any
	for _, m := range s.merges {
		l, r, _ := strings.Cut(m, " ")
		if _, ok := vocab[l+r]; !ok {
			vocab[l+r] = len(vocab)
		}
		if s.pairMerges {
			merges = append(merges, []string{l, r})
		} else {
			merges = append(merges, m)
		}
	}
	pre := s.preTokenizer
	if pre == nil {
		pre = byteLevelOnly
	}
	dec := s.decoder
	if dec == nil {
		dec = map[string]any{"type": "ByteLevel"}
	}
	doc := map[string]any{
		"version":       "1.0",
		"added_tokens":  s.added,
		"normalizer":    s.normalizer,
		"pre_tokenizer": pre,
		"decoder":       dec,
		"model": map[string]any{
			"type": "BPE", "vocab": vocab, "merges": merges, "ignore_merges": s.ignoreMerges,
		},
	}
	data, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func (s spec) build(t testing.TB) *Tokenizer {
	t.Helper()
	tok, err := Parse(s.json(t))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return tok
}

// ids maps vocabulary strings to ids, failing on unknown ones.
func ids(t *testing.T, tok *Tokenizer, toks ...string) []int32 {
	t.Helper()
	out := make([]int32, len(toks))
	for i, s := range toks {
		id, ok := tok.TokenID(s)
		if !ok {
			t.Fatalf("token %q not in vocab", s)
		}
		out[i] = id
	}
	return out
}

func added(id int, content string, special bool, opts ...string) map[string]any {
	m := map[string]any{"id": id, "content": content, "special": special,
		"lstrip": false, "rstrip": false, "single_word": false, "normalized": false}
	for _, o := range opts {
		m[o] = true
	}
	return m
}

func TestBPEMergeOrder(t *testing.T) {
	words := []string{"Ġ t", "h e", "Ġt he", "l l", "he ll", "hell o"}
	tests := []struct {
		name   string
		merges []string
		in     string
		want   []string
	}{
		// he, then ll, then he+ll, then hell+o.
		{"chain", words, "hello", []string{"hello"}},
		{"prefix space", words, " the", []string{"Ġthe"}},
		{"no merge", words, "xyz", []string{"x", "y", "z"}},
		// The lower-ranked pair wins even when it is to the right.
		{"rank ab first", []string{"a b", "b c"}, "abc", []string{"ab", "c"}},
		{"rank bc first", []string{"b c", "a b"}, "abc", []string{"a", "bc"}},
		// Equal pairs merge leftmost first.
		{"leftmost", []string{"a a"}, "aaa", []string{"aa", "a"}},
		{"two pairs", []string{"a a", "aa aa"}, "aaaaa", []string{"aaaa", "a"}},
		// The GPT-2 regex splits before BPE: no merge crosses " ".
		{"pieces", []string{"a Ġ", "Ġ b"}, "a b", []string{"a", "Ġb"}},
	}
	for _, tc := range tests {
		for _, pairs := range []bool{false, true} {
			tok := spec{merges: tc.merges, pairMerges: pairs}.build(t)
			got := tok.Encode(tc.in)
			want := ids(t, tok, tc.want...)
			if !slices.Equal(got, want) {
				t.Errorf("%s (pair merges %v): Encode(%q) = %v, want %v %q", tc.name, pairs, tc.in, got, want, tc.want)
			}
			if d := tok.Decode(got, false); d != tc.in {
				t.Errorf("%s: Decode = %q, want %q", tc.name, d, tc.in)
			}
		}
	}
}

func TestIgnoreMerges(t *testing.T) {
	// "abc" is in the vocab through the merges a+b and ab+c, but the rank
	// of b+c would split it as a, bc; ignore_merges takes the whole word.
	merges := []string{"b c", "a b", "ab c"}
	tok := spec{merges: merges}.build(t)
	if got, want := tok.Encode("abc"), ids(t, tok, "a", "bc"); !slices.Equal(got, want) {
		t.Errorf("without ignore_merges: got %v, want %v", got, want)
	}
	tok = spec{merges: merges, ignoreMerges: true}.build(t)
	if got, want := tok.Encode("abc"), ids(t, tok, "abc"); !slices.Equal(got, want) {
		t.Errorf("with ignore_merges: got %v, want %v", got, want)
	}
}

func TestAddedTokens(t *testing.T) {
	tok := spec{
		merges: []string{"h i"},
		added: []map[string]any{
			added(1000, "<|sp|>", true),
			added(1001, "[A]", false),
			added(1002, "[A]B", false),
			added(1003, "[L]", false, "lstrip"),
			added(1004, "[R]", false, "rstrip"),
			added(1005, "[W]", false, "single_word"),
		},
	}.build(t)
	tests := []struct {
		in   string
		want []any // vocabulary strings or added ids
	}{
		{"hi<|sp|>hi", []any{"hi", 1000, "hi"}},
		{"<|sp|><|sp|>", []any{1000, 1000}},
		{"[A]B", []any{1002}},
		{"[A]C", []any{1001, "C"}},
		{"x  [L]", []any{"x", 1003}},
		{"[R]  x", []any{1004, "x"}},
		{"hi [W] hi", []any{"hi", "Ġ", 1005, "Ġ", "hi"}},
		{"a[W]b", []any{"a", "[", "W", "]", "b"}},
		{"<|sp", []any{"<", "|", "s", "p"}},
	}
	for _, tc := range tests {
		var want []int32
		for _, w := range tc.want {
			switch w := w.(type) {
			case string:
				want = append(want, ids(t, tok, w)...)
			case int:
				want = append(want, int32(w))
			}
		}
		if got := tok.Encode(tc.in); !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, want %v", tc.in, got, want)
		}
	}
	if !tok.IsSpecial(1000) || tok.IsSpecial(1001) || tok.IsSpecial(5) {
		t.Error("IsSpecial wrong for special, non-special added and vocab ids")
	}
	if got := tok.Decode([]int32{1000, 1001}, false); got != "<|sp|>[A]" {
		t.Errorf("Decode keeping special = %q", got)
	}
	if got := tok.Decode([]int32{1000, 1001}, true); got != "[A]" {
		t.Errorf("Decode skipping special = %q", got)
	}
	if got := tok.VocabSize(); got != 1006 {
		t.Errorf("VocabSize = %d, want 1006", got)
	}
	if s, ok := tok.Token(1002); !ok || s != "[A]B" {
		t.Errorf("Token(1002) = %q, %v", s, ok)
	}
	if _, ok := tok.Token(600); ok {
		t.Error("Token of an unassigned id reported ok")
	}
}

func TestNFCNormalizer(t *testing.T) {
	tok := spec{
		normalizer: map[string]any{"type": "NFC"},
		added:      []map[string]any{added(300, "é!", false, "normalized")},
	}.build(t)
	composed, decomposed := tok.Encode("café"), tok.Encode("cafe\u0301")
	if !slices.Equal(composed, decomposed) {
		t.Errorf("NFC: %v for composed, %v for decomposed", composed, decomposed)
	}
	if got := tok.Encode("e\u0301!"); !slices.Equal(got, []int32{300}) {
		t.Errorf("normalized added token: got %v, want [300]", got)
	}
}

func TestPrefixSpace(t *testing.T) {
	tok := spec{
		merges:       []string{"Ġ t"},
		preTokenizer: map[string]any{"type": "ByteLevel", "add_prefix_space": true, "use_regex": true},
	}.build(t)
	if got, want := tok.Encode("t"), ids(t, tok, "Ġt"); !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		edit func(m map[string]any)
		want string
	}{
		{"unigram", func(m map[string]any) { m["model"].(map[string]any)["type"] = "Unigram" }, "unsupported model type"},
		{"bad merge", func(m map[string]any) { m["model"].(map[string]any)["merges"] = []any{"a"} }, "not two space-separated"},
		{"merge out of vocab", func(m map[string]any) { m["model"].(map[string]any)["merges"] = []any{"ą ę"} }, "missing from the vocab"},
		{"negative id", func(m map[string]any) { m["model"].(map[string]any)["vocab"] = map[string]any{"a": -1} }, "out of range"},
		{"sparse ids", func(m map[string]any) { m["model"].(map[string]any)["vocab"] = map[string]any{"a": 1 << 20} }, "too sparse"},
		{"no pre-tokenizer", func(m map[string]any) { m["pre_tokenizer"] = nil }, "pre-tokenizer is missing"},
		{"metaspace", func(m map[string]any) { m["pre_tokenizer"] = map[string]any{"type": "Metaspace"} }, "unsupported type"},
		{"bad regex", func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
				map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "("}, "behavior": "Isolated"}, byteLevelOnly}}
		}, "compile regex"},
		{"nfkc", func(m map[string]any) { m["normalizer"] = map[string]any{"type": "NFKC"} }, "unsupported normalizer"},
		{"wordpiece decoder", func(m map[string]any) { m["decoder"] = map[string]any{"type": "WordPiece"} }, "unsupported decoder"},
		{"added without id", func(m map[string]any) { m["added_tokens"] = []any{map[string]any{"content": "x"}} }, "no id"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var m map[string]any
			if err := json.Unmarshal(spec{}.json(t), &m); err != nil {
				t.Fatal(err)
			}
			tc.edit(m)
			data, _ := json.Marshal(m)
			_, err := Parse(data)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse error = %v, want one containing %q", err, tc.want)
			}
		})
	}
	if _, err := Parse([]byte("{")); err == nil {
		t.Error("Parse of truncated JSON succeeded")
	}
}

func TestGeneralRegexFallback(t *testing.T) {
	// An unknown pattern runs on the general engine: split on digits.
	tok := spec{preTokenizer: map[string]any{"type": "Sequence", "pretokenizers": []any{
		map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `\d+`}, "behavior": "Isolated", "invert": false},
		map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
	}}, merges: []string{"a b", "ab 1"}}.build(t)
	if got, want := tok.Encode("ab1"), ids(t, tok, "ab", "1"); !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
