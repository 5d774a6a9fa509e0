package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// The JSON shapes of tokenizer.json that this package reads. Fields it does
// not need (truncation, padding, post_processor) are ignored: Encode never
// adds special tokens.

type fileJSON struct {
	AddedTokens  []addedTokenJSON `json:"added_tokens"`
	Normalizer   json.RawMessage  `json:"normalizer"`
	PreTokenizer json.RawMessage  `json:"pre_tokenizer"`
	Decoder      json.RawMessage  `json:"decoder"`
	Model        json.RawMessage  `json:"model"`
}

type addedTokenJSON struct {
	ID         *int64 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type typed struct {
	Type string `json:"type"`
}

type bpeJSON struct {
	Type                    string            `json:"type"`
	Dropout                 *float64          `json:"dropout"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	FuseUnk                 bool              `json:"fuse_unk"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Vocab                   map[string]int64  `json:"vocab"`
	Merges                  []json.RawMessage `json:"merges"`
}

type normalizerJSON struct {
	Type        string            `json:"type"`
	Normalizers []json.RawMessage `json:"normalizers"`
}

type preTokenizerJSON struct {
	Type           string            `json:"type"`
	PreTokenizers  []json.RawMessage `json:"pretokenizers"`
	Pattern        *patternJSON      `json:"pattern"`
	Behavior       string            `json:"behavior"`
	Invert         bool              `json:"invert"`
	AddPrefixSpace bool              `json:"add_prefix_space"`
	UseRegex       *bool             `json:"use_regex"`
}

type patternJSON struct {
	Regex  *string `json:"Regex"`
	String *string `json:"String"`
}

type decoderJSON struct {
	Type     string            `json:"type"`
	Decoders []json.RawMessage `json:"decoders"`
}

// isNull reports whether raw is absent or JSON null.
func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}

// parseMerge reads one merge, either "left right" or ["left", "right"].
func parseMerge(raw json.RawMessage) (string, string, error) {
	var s string
	if n := len(raw); n >= 2 && raw[0] == '"' && raw[n-1] == '"' && !bytes.ContainsAny(raw[1:n-1], "\\\"") && utf8.Valid(raw) {
		s = string(raw[1 : n-1]) // fast path: no escapes to undo
	} else if err := json.Unmarshal(raw, &s); err != nil {
		s = ""
	}
	if s != "" {
		left, right, ok := strings.Cut(s, " ")
		if !ok || left == "" || right == "" || strings.Contains(right, " ") {
			return "", "", fmt.Errorf("merge %q is not two space-separated tokens", s)
		}
		return left, right, nil
	}
	var pair []string
	if err := json.Unmarshal(raw, &pair); err != nil {
		return "", "", errors.New("merge is neither a string nor a pair of strings")
	}
	if len(pair) != 2 {
		return "", "", fmt.Errorf("merge has %d parts, want 2", len(pair))
	}
	return pair[0], pair[1], nil
}

// parseNormalizer accepts no normalizer, NFC, or a Sequence of those.
func parseNormalizer(raw json.RawMessage) (nfc bool, err error) {
	if isNull(raw) {
		return false, nil
	}
	var n normalizerJSON
	if err := json.Unmarshal(raw, &n); err != nil {
		return false, fmt.Errorf("normalizer: %w", err)
	}
	switch n.Type {
	case "NFC":
		return true, nil
	case "Sequence":
		for i, sub := range n.Normalizers {
			subNFC, err := parseNormalizer(sub)
			if err != nil {
				return false, fmt.Errorf("normalizer sequence item %d: %w", i, err)
			}
			nfc = nfc || subNFC
		}
		return nfc, nil
	default:
		return false, fmt.Errorf("unsupported normalizer %q (supported: NFC)", n.Type)
	}
}

// parseDecoder accepts the ByteLevel decoder, alone or as the only member of
// a Sequence.
func parseDecoder(raw json.RawMessage) error {
	if isNull(raw) {
		return errors.New("decoder is missing (want ByteLevel)")
	}
	var d decoderJSON
	if err := json.Unmarshal(raw, &d); err != nil {
		return fmt.Errorf("decoder: %w", err)
	}
	switch d.Type {
	case "ByteLevel":
		return nil
	case "Sequence":
		if len(d.Decoders) != 1 {
			return fmt.Errorf("decoder sequence has %d decoders, want exactly one ByteLevel", len(d.Decoders))
		}
		return parseDecoder(d.Decoders[0])
	default:
		return fmt.Errorf("unsupported decoder %q (supported: ByteLevel)", d.Type)
	}
}

// parsePreTokenizer flattens the pre-tokenizer into Split steps followed by
// exactly one ByteLevel step, which must come last.
func parsePreTokenizer(raw json.RawMessage) ([]splitStep, byteLevelStep, error) {
	if isNull(raw) {
		return nil, byteLevelStep{}, errors.New("pre-tokenizer is missing (want ByteLevel, optionally after Split)")
	}
	var flat []preTokenizerJSON
	if err := flattenPreTokenizer(raw, &flat, 0); err != nil {
		return nil, byteLevelStep{}, err
	}
	var splits []splitStep
	for i, p := range flat {
		switch p.Type {
		case "Split":
			step, err := newSplitStep(p)
			if err != nil {
				return nil, byteLevelStep{}, fmt.Errorf("pre-tokenizer step %d: %w", i, err)
			}
			splits = append(splits, step)
		case "ByteLevel":
			if i != len(flat)-1 {
				return nil, byteLevelStep{}, fmt.Errorf("pre-tokenizer step %d: ByteLevel must be the last step", i)
			}
			bl := byteLevelStep{addPrefixSpace: p.AddPrefixSpace, useRegex: true}
			if p.UseRegex != nil {
				bl.useRegex = *p.UseRegex
			}
			return splits, bl, nil
		default:
			return nil, byteLevelStep{}, fmt.Errorf("pre-tokenizer step %d: unsupported type %q (supported: Split, ByteLevel)", i, p.Type)
		}
	}
	return nil, byteLevelStep{}, errors.New("pre-tokenizer has no ByteLevel step")
}

func flattenPreTokenizer(raw json.RawMessage, out *[]preTokenizerJSON, depth int) error {
	if depth > 8 {
		return errors.New("pre-tokenizer sequences nested too deeply")
	}
	var p preTokenizerJSON
	if err := json.Unmarshal(raw, &p); err != nil {
		return fmt.Errorf("pre-tokenizer: %w", err)
	}
	if p.Type != "Sequence" {
		*out = append(*out, p)
		return nil
	}
	for _, sub := range p.PreTokenizers {
		if err := flattenPreTokenizer(sub, out, depth+1); err != nil {
			return err
		}
	}
	return nil
}
