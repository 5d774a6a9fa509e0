package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// addedToken is an entry of added_tokens.
type addedToken struct {
	content    string
	id         int32
	special    bool
	lstrip     bool
	rstrip     bool
	singleWord bool
	normalized bool
}

// addedMatcher finds added tokens in text, leftmost first and longest
// among those starting at the same place, through a byte trie.
type addedMatcher struct {
	tokens []addedToken
	first  [256]bool
	edges  map[uint64]int32 // node<<8 | byte -> child node
	term   []int32          // node -> index into tokens, or -1
}

func newAddedMatcher(tokens []addedToken) *addedMatcher {
	m := &addedMatcher{tokens: tokens, edges: make(map[uint64]int32), term: []int32{-1}}
	for ti, tok := range tokens {
		node := int32(0)
		for i := 0; i < len(tok.content); i++ {
			c := tok.content[i]
			if i == 0 {
				m.first[c] = true
			}
			k := uint64(node)<<8 | uint64(c)
			child, ok := m.edges[k]
			if !ok {
				child = int32(len(m.term))
				m.term = append(m.term, -1)
				m.edges[k] = child
			}
			node = child
		}
		m.term[node] = int32(ti)
	}
	return m
}

// longest returns the index of the longest token starting at s[i] and its
// end, or -1.
func (m *addedMatcher) longest(s string, i int) (int32, int) {
	best, end := int32(-1), 0
	node := int32(0)
	for j := i; j < len(s); j++ {
		child, ok := m.edges[uint64(node)<<8|uint64(s[j])]
		if !ok {
			break
		}
		node = child
		if t := m.term[node]; t >= 0 {
			best, end = t, j+1
		}
	}
	return best, end
}

// split passes the text between added tokens to text and each added token
// found to token, in order.
func (m *addedMatcher) split(s string, text func(string), token func(int32)) {
	if m == nil || len(m.tokens) == 0 {
		if s != "" {
			text(s)
		}
		return
	}
	start := 0
	for i := 0; i < len(s); {
		if !m.first[s[i]] {
			i++
			continue
		}
		ti, end := m.longest(s, i)
		if ti < 0 {
			i++
			continue
		}
		tok := &m.tokens[ti]
		ms, me := i, end
		if ms < start {
			// The previous token's rstrip swallowed this one's start.
			i++
			continue
		}
		if tok.singleWord && (endsWithWordChar(s[:ms]) || startsWithWordChar(s[me:])) {
			i = me
			continue
		}
		if tok.lstrip {
			ms = max(start, trimRightSpace(s, ms))
		}
		if tok.rstrip {
			me = skipSpace(s, me)
		}
		if start < ms {
			text(s[start:ms])
		}
		token(tok.id)
		start, i = me, me
	}
	if start < len(s) {
		text(s[start:])
	}
}

func isWordChar(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) }

func endsWithWordChar(s string) bool {
	r, n := utf8.DecodeLastRuneInString(s)
	return n > 0 && isWordChar(r)
}

func startsWithWordChar(s string) bool {
	r, n := utf8.DecodeRuneInString(s)
	return n > 0 && isWordChar(r)
}

// trimRightSpace returns the end of s[:i] without its trailing whitespace.
func trimRightSpace(s string, i int) int {
	for i > 0 {
		r, n := utf8.DecodeLastRuneInString(s[:i])
		if !unicode.IsSpace(r) {
			break
		}
		i -= n
	}
	return i
}

// skipSpace returns the index of the first non-whitespace rune at or after i.
func skipSpace(s string, i int) int {
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !unicode.IsSpace(r) {
			break
		}
		i += n
	}
	return i
}
