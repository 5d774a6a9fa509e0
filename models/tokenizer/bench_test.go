package tokenizer

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/troupe/troupe/models/modeltest"
)

func benchText(b *testing.B) string {
	b.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "bench.txt"))
	if err != nil {
		b.Fatal(err)
	}
	return string(data)
}

// BenchmarkEncode measures Encode throughput on documentation-like text
// with the OLMo 2 tokenizer, its word cache warm.
func BenchmarkEncode(b *testing.B) {
	tok := loadShared(b, "tokenizers", "olmo2-dolma2", "tokenizer.json")
	text := benchText(b)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		tok.Encode(text)
	}
}

// BenchmarkEncodeUncached measures pre-tokenization and BPE merging alone,
// every piece merged afresh as if never seen.
func BenchmarkEncodeUncached(b *testing.B) {
	tok := loadShared(b, "tokenizers", "olmo2-dolma2", "tokenizer.json")
	text := benchText(b)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	var out []int32
	for b.Loop() {
		out = out[:0]
		tok.splits[0].split(text, func(p string) { out = tok.bpe(out, p) })
	}
}

func BenchmarkDecode(b *testing.B) {
	tok := loadShared(b, "tokenizers", "olmo2-dolma2", "tokenizer.json")
	text := benchText(b)
	ids := tok.Encode(text)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		tok.Decode(ids, false)
	}
}

func BenchmarkParse(b *testing.B) {
	data, err := os.ReadFile(modeltest.MustShared(b, "tokenizers", "olmo2-dolma2", "tokenizer.json"))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}
