// Package tokenizer loads Hugging Face tokenizer.json files for byte-level
// BPE models and turns text into token ids and back.
//
// Supported: a BPE model (vocab plus merges given as "a b" strings or [a, b]
// pairs, ignore_merges), an optional NFC normalizer, a pre-tokenizer made of
// Split (regex or literal pattern, any split behavior, invert) and ByteLevel
// steps, added tokens (special or not, with lstrip, rstrip, single_word and
// normalized) and the ByteLevel decoder. Anything else is refused by Parse
// with an error naming the unsupported component; a tokenizer that loads is
// one whose output matches Hugging Face tokenizers.
//
// The split regexes of the GPT-2, cl100k (OLMo 2, Llama 3) and Qwen 2
// families are matched by hand-written scanners; other regexes run on a
// backtracking engine (github.com/dlclark/regexp2), which is correct but
// slower.
//
// Concurrency: a *Tokenizer is immutable after Parse apart from its internal
// word cache, which is guarded; all methods are safe for concurrent use by
// multiple goroutines. A *Decoder holds streaming state and must be used by
// one goroutine at a time. The package starts no goroutines.
package tokenizer
