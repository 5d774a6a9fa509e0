package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"golang.org/x/text/unicode/norm"
)

// Tokenizer encodes text to token ids and decodes ids to text. It is safe
// for concurrent use.
type Tokenizer struct {
	vocab        map[string]int32 // model vocabulary and added tokens
	tokens       []string         // id -> token string ("" for unused ids)
	bytes        [][]byte         // id -> decoded bytes
	special      []bool           // id -> special added token
	known        []bool           // id -> assigned
	merges       map[uint64]merge // pair of ids -> merge
	alphabet     [256]rune        // byte -> byte-level rune
	inverse      map[rune]byte    // byte-level rune -> byte
	byteIDs      [256]int32       // byte -> id of its single-rune token, or -1
	ignoreMerges bool
	nfc          bool
	splits       []splitStep
	byteLevel    byteLevelStep
	rawAdded     *addedMatcher // added tokens matched before normalization
	normAdded    *addedMatcher // added tokens matched after normalization

	cache   *wordCache
	scratch sync.Pool // of *bpeScratch
}

// maxTokenID bounds ids so that a malformed file cannot make Parse
// allocate without limit.
const maxTokenID = 1 << 24

// Load reads and parses a tokenizer.json file.
func Load(path string) (*Tokenizer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer %s: %w", path, err)
	}
	return t, nil
}

// Parse builds a Tokenizer from the contents of a tokenizer.json file. It
// returns an error for malformed input and for components this package does
// not implement.
func Parse(data []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("parse tokenizer.json: %w", err)
	}
	t := &Tokenizer{cache: newWordCache(), alphabet: byteLevelAlphabet(), inverse: make(map[rune]byte, 256)}
	for b, r := range t.alphabet {
		t.inverse[r] = byte(b)
	}
	t.scratch.New = func() any { return new(bpeScratch) }
	if err := t.parseModel(f.Model); err != nil {
		return nil, fmt.Errorf("parse tokenizer.json: model: %w", err)
	}
	if err := t.parseAdded(f.AddedTokens); err != nil {
		return nil, fmt.Errorf("parse tokenizer.json: added_tokens: %w", err)
	}
	var err error
	if t.nfc, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, fmt.Errorf("parse tokenizer.json: %w", err)
	}
	if t.splits, t.byteLevel, err = parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, fmt.Errorf("parse tokenizer.json: %w", err)
	}
	if err := parseDecoder(f.Decoder); err != nil {
		return nil, fmt.Errorf("parse tokenizer.json: %w", err)
	}
	return t, nil
}

func (t *Tokenizer) parseModel(raw json.RawMessage) error {
	if isNull(raw) {
		return errors.New("missing")
	}
	var m bpeJSON
	if err := json.Unmarshal(raw, &m); err != nil {
		return err
	}
	if m.Type != "BPE" && !(m.Type == "" && m.Vocab != nil && m.Merges != nil) {
		return fmt.Errorf("unsupported model type %q (supported: BPE)", m.Type)
	}
	switch {
	case m.Dropout != nil && *m.Dropout != 0:
		return errors.New("BPE dropout is not supported")
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "":
		return errors.New("continuing_subword_prefix is not supported")
	case m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return errors.New("end_of_word_suffix is not supported")
	case m.ByteFallback:
		return errors.New("byte_fallback is not supported (byte-level BPE needs none)")
	case len(m.Vocab) == 0:
		return errors.New("empty vocab")
	}
	t.ignoreMerges = m.IgnoreMerges
	t.vocab = make(map[string]int32, len(m.Vocab))
	maxID := int64(-1)
	for tok, id := range m.Vocab {
		if id < 0 || id >= maxTokenID {
			return fmt.Errorf("token %q has id %d out of range", tok, id)
		}
		t.vocab[tok] = int32(id)
		maxID = max(maxID, id)
	}
	if err := t.growIDs(maxID, len(m.Vocab)); err != nil {
		return err
	}
	for tok, id := range t.vocab {
		if t.known[id] {
			return fmt.Errorf("id %d is assigned to both %q and %q", id, t.tokens[id], tok)
		}
		t.known[id] = true
		t.tokens[id] = tok
	}
	for id, tok := range t.tokens {
		if t.known[id] {
			t.bytes[id] = tokenBytes(tok, t.inverse)
		}
	}
	unk := int32(-1)
	if m.UnkToken != nil {
		if id, ok := t.vocab[*m.UnkToken]; ok {
			unk = id
		}
	}
	for b, r := range t.alphabet {
		t.byteIDs[b] = unk
		if id, ok := t.vocab[string(r)]; ok {
			t.byteIDs[b] = id
		}
	}
	t.merges = make(map[uint64]merge, len(m.Merges))
	for rank, raw := range m.Merges {
		left, right, err := parseMerge(raw)
		if err != nil {
			return fmt.Errorf("merge %d: %w", rank, err)
		}
		l, okL := t.vocab[left]
		r, okR := t.vocab[right]
		id, okM := t.vocab[left+right]
		if !okL || !okR || !okM {
			return fmt.Errorf("merge %d (%q %q) uses a token missing from the vocab", rank, left, right)
		}
		t.merges[pairKey(l, r)] = merge{rank: int32(rank), id: id}
	}
	return nil
}

// growIDs extends the per-id tables to cover maxID, refusing id spaces far
// sparser than the number of tokens in them.
func (t *Tokenizer) growIDs(maxID int64, count int) error {
	n := int(maxID) + 1
	if n <= len(t.tokens) {
		return nil
	}
	if n > 2*(len(t.tokens)+count)+1024 {
		return fmt.Errorf("ids up to %d for %d tokens: id space too sparse", maxID, len(t.tokens)+count)
	}
	grow := n - len(t.tokens)
	t.tokens = append(t.tokens, make([]string, grow)...)
	t.bytes = append(t.bytes, make([][]byte, grow)...)
	t.special = append(t.special, make([]bool, grow)...)
	t.known = append(t.known, make([]bool, grow)...)
	return nil
}

func (t *Tokenizer) parseAdded(list []addedTokenJSON) error {
	var raw, normalized []addedToken
	maxID := int64(-1)
	for i, a := range list {
		if a.ID == nil {
			return fmt.Errorf("token %d (%q) has no id", i, a.Content)
		}
		if *a.ID < 0 || *a.ID >= maxTokenID {
			return fmt.Errorf("token %q has id %d out of range", a.Content, *a.ID)
		}
		if a.Content == "" {
			return fmt.Errorf("token %d has empty content", i)
		}
		maxID = max(maxID, *a.ID)
	}
	if err := t.growIDs(maxID, len(list)); err != nil {
		return err
	}
	for _, a := range list {
		id := int32(*a.ID)
		tok := addedToken{content: a.Content, id: id, special: a.Special, lstrip: a.LStrip,
			rstrip: a.RStrip, singleWord: a.SingleWord, normalized: a.Normalized}
		if t.known[id] && t.tokens[id] != a.Content {
			// The added token replaces the model's entry for this id.
			if t.vocab[t.tokens[id]] == id {
				delete(t.vocab, t.tokens[id])
			}
		}
		t.known[id] = true
		t.tokens[id] = a.Content
		t.bytes[id] = tokenBytes(a.Content, t.inverse)
		t.special[id] = a.Special
		t.vocab[a.Content] = id
		if a.Normalized {
			normalized = append(normalized, tok)
		} else {
			raw = append(raw, tok)
		}
	}
	t.rawAdded = newAddedMatcher(raw)
	t.normAdded = newAddedMatcher(normalized)
	return nil
}

// Encode returns the ids of s. It adds no special tokens (no BOS or EOS);
// added and special tokens written in s are recognised and get their ids.
func (t *Tokenizer) Encode(s string) []int32 {
	e := encoder{t: t, out: make([]int32, 0, len(s)/4+4)}
	e.textFn, e.normFn, e.pieceFn, e.tokenFn = e.text, e.normText, e.piece, e.token
	t.rawAdded.split(s, e.textFn, e.tokenFn)
	return e.out
}

// encoder holds the state of one Encode call; its method values are made
// once per call.
type encoder struct {
	t       *Tokenizer
	out     []int32
	textFn  func(string)
	normFn  func(string)
	pieceFn func(string)
	tokenFn func(int32)
}

func (e *encoder) token(id int32) { e.out = append(e.out, id) }

// text handles a span between raw added tokens: normalize, then look for
// normalized added tokens.
func (e *encoder) text(s string) {
	if e.t.nfc {
		s = norm.NFC.String(s)
	}
	e.t.normAdded.split(s, e.normFn, e.tokenFn)
}

// normText pre-tokenizes a span of normalized text.
func (e *encoder) normText(s string) { e.preTokenize(s, 0) }

func (e *encoder) preTokenize(s string, step int) {
	t := e.t
	if step < len(t.splits) {
		t.splits[step].split(s, func(p string) { e.preTokenize(p, step+1) })
		return
	}
	if t.byteLevel.addPrefixSpace && !strings.HasPrefix(s, " ") {
		s = " " + s
	}
	if t.byteLevel.useRegex {
		scanMatcher(scanGPT2).matches(s, func(a, b int) { e.piece(s[a:b]) })
		return
	}
	e.piece(s)
}

func (e *encoder) piece(p string) { e.out = e.t.encodePiece(e.out, p) }

// Decode returns the text of ids. Ids outside the vocabulary are skipped,
// and so are special tokens when skipSpecial is set. Byte sequences that are
// not valid UTF-8 become U+FFFD, one for each maximal invalid subsequence.
func (t *Tokenizer) Decode(ids []int32, skipSpecial bool) string {
	var buf []byte
	for _, id := range ids {
		buf = append(buf, t.idBytes(id, skipSpecial)...)
	}
	out, _ := appendLossy(nil, buf, true)
	return string(out)
}

// idBytes returns the bytes id decodes to, or nil when it is skipped.
func (t *Tokenizer) idBytes(id int32, skipSpecial bool) []byte {
	if id < 0 || int(id) >= len(t.tokens) || !t.known[id] || skipSpecial && t.special[id] {
		return nil
	}
	return t.bytes[id]
}

// TokenBytes returns, by id, the bytes each token decodes to: nil for
// special tokens and ids without a token. The slices are the tokenizer's
// own and must not be modified.
func (t *Tokenizer) TokenBytes() [][]byte {
	out := make([][]byte, len(t.tokens))
	for id := range out {
		out[id] = t.idBytes(int32(id), true)
	}
	return out
}

// VocabSize returns one more than the largest id, covering the model
// vocabulary and the added tokens: the number of rows an embedding needs.
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// TokenID returns the id of a token as written in the vocabulary (in the
// byte-level alphabet, e.g. "Ġthe") or of an added token by its content.
func (t *Tokenizer) TokenID(tok string) (int32, bool) {
	id, ok := t.vocab[tok]
	return id, ok
}

// Token returns the vocabulary string of id.
func (t *Tokenizer) Token(id int32) (string, bool) {
	if id < 0 || int(id) >= len(t.tokens) || !t.known[id] {
		return "", false
	}
	return t.tokens[id], true
}

// IsSpecial reports whether id is an added token marked special.
func (t *Tokenizer) IsSpecial(id int32) bool {
	return id >= 0 && int(id) < len(t.special) && t.special[id]
}
