package tokenizer

import (
	"encoding/binary"
	"testing"
	"unicode/utf8"
)

// fuzzTokenizers returns the tokenizers the round-trip targets run on: a
// small synthetic one and the demo model's.
func fuzzTokenizers(f *testing.F) []*Tokenizer {
	f.Helper()
	return []*Tokenizer{spec{
		merges: []string{"Ġ t", "h e", "Ġt he", "l l", "he ll", "Ġ Ġ", "Ã ©"},
		added:  []map[string]any{added(1000, "<|sp|>", true), added(1001, "[R]", false, "rstrip")},
	}.build(f), loadDemo(f)}
}

// FuzzEncodeDecode checks that decoding undoes encoding for valid UTF-8 and
// that streamed decoding matches whole decoding.
func FuzzEncodeDecode(f *testing.F) {
	for _, s := range splitSeeds {
		f.Add(s)
	}
	f.Add("<|im_start|>user\nhi<|im_end|>\n<|endoftext|>")
	f.Add("[R]   x <|sp|><|sp")
	toks := fuzzTokenizers(f)
	f.Fuzz(func(t *testing.T, s string) {
		for _, tok := range toks {
			ids := tok.Encode(s)
			got := tok.Decode(ids, false)
			if utf8.ValidString(s) && got != s && !hasRStrip(s) {
				t.Fatalf("Decode(Encode(%q)) = %q (ids %v)", s, got, ids)
			}
			for _, skip := range []bool{false, true} {
				if stream, whole := decodeStream(tok, ids, skip), tok.Decode(ids, skip); stream != whole {
					t.Fatalf("streamed %q, whole %q (ids %v, skip %v)", stream, whole, ids, skip)
				}
			}
		}
	})
}

// hasRStrip reports whether s uses the synthetic rstrip token, whose
// swallowed whitespace does not come back.
func hasRStrip(s string) bool {
	for i := 0; i+3 <= len(s); i++ {
		if s[i:i+3] == "[R]" {
			return true
		}
	}
	return false
}

// FuzzDecodeIDs feeds arbitrary id sequences, including invalid ids and
// tokens that split characters, to both decoders.
func FuzzDecodeIDs(f *testing.F) {
	f.Add([]byte{0xe2, 0, 0, 0, 0x82, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4, 0xe8, 0x03, 0, 0})
	toks := fuzzTokenizers(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, tok := range toks {
			var ids []int32
			for i := 0; i+4 <= len(data); i += 4 {
				id := int32(binary.LittleEndian.Uint32(data[i:]))
				if id >= 0 {
					id %= int32(tok.VocabSize() + 8)
				}
				ids = append(ids, id)
			}
			for _, skip := range []bool{false, true} {
				whole := tok.Decode(ids, skip)
				if !utf8.ValidString(whole) {
					t.Fatalf("Decode returned invalid UTF-8 %q", whole)
				}
				if stream := decodeStream(tok, ids, skip); stream != whole {
					t.Fatalf("streamed %q, whole %q (ids %v)", stream, whole, ids)
				}
			}
		}
	})
}

// lossyOracle is a second, slower statement of the replacement rule: a
// maximal subpart is the longest prefix that some valid sequence begins
// with, which utf8.FullRune tells apart.
func lossyOracle(src []byte) string {
	var out []byte
	for i := 0; i < len(src); {
		r, n := utf8.DecodeRune(src[i:])
		if r != utf8.RuneError || n > 1 {
			out = append(out, src[i:i+n]...)
			i += n
			continue
		}
		k := 1
		for j := 2; j <= 3 && i+j <= len(src); j++ {
			if !utf8.FullRune(src[i : i+j]) {
				k = j
			}
		}
		out = append(out, "\uFFFD"...)
		i += k
	}
	return string(out)
}

func FuzzLossy(f *testing.F) {
	for _, s := range []string{"", "abc", "\xe2\x82", "\xe2\x82\xac", "\xf0\x80\x80", "\xed\xa0\x80", "\xf4\x90", "\xc0\xaf", "a\xf0\x9f\x98"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		got, n := appendLossy(nil, src, true)
		if want := lossyOracle(src); string(got) != want || n != len(src) {
			t.Fatalf("appendLossy(%q) = %q (consumed %d of %d), want %q", src, got, n, len(src), want)
		}
		// Fed in two parts with the tail held back, the result is the same.
		for cut := range len(src) + 1 {
			head, used := appendLossy(nil, src[:cut], false)
			rest := append(append([]byte(nil), src[used:cut]...), src[cut:]...)
			tail, _ := appendLossy(nil, rest, true)
			if string(head)+string(tail) != string(got) {
				t.Fatalf("cut %d of %q: %q + %q, want %q", cut, src, head, tail, got)
			}
		}
	})
}

// FuzzParse checks that malformed tokenizer.json never panics, and that
// whatever parses can encode and decode.
func FuzzParse(f *testing.F) {
	f.Add(spec{merges: []string{"h e", "he l"}}.json(f))
	f.Add(spec{merges: []string{"a b"}, pairMerges: true, ignoreMerges: true,
		added: []map[string]any{added(300, "<s>", true, "lstrip", "rstrip", "single_word")}}.json(f))
	f.Add(spec{normalizer: map[string]any{"type": "NFC"}, preTokenizer: map[string]any{"type": "Sequence", "pretokenizers": []any{
		map[string]any{"type": "Split", "pattern": map[string]any{"Regex": patternCL100K}, "behavior": "Removed", "invert": true},
		map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
	}}}.json(f))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"pre_tokenizer":{"type":"ByteLevel"},"decoder":{"type":"ByteLevel"}}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":[["a","b"]]},"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"String":"b"},"behavior":"MergedWithNext"},{"type":"ByteLevel"}]},"decoder":{"type":"ByteLevel"},"added_tokens":[{"id":5,"content":"ab"}]}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":99999999},"merges":["a"]}}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tok, err := Parse(data)
		if err != nil {
			return
		}
		for _, s := range []string{"", "ab a  b\n", "<s> x", "é😀"} {
			ids := tok.Encode(s)
			_ = tok.Decode(ids, true)
			if stream, whole := decodeStream(tok, ids, false), tok.Decode(ids, false); stream != whole {
				t.Fatalf("streamed %q, whole %q", stream, whole)
			}
		}
	})
}
