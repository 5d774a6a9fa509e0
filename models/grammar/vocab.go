package grammar

import (
	"bytes"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sync"
)

// Vocab is a vocabulary ready for masking: its tokens' bytes sorted, made
// once per model and shared by its grammars.
type Vocab struct {
	tokens [][]byte
	order  []int32 // the ids with bytes, by their bytes
	lcp    []int   // lcp[i]: bytes order[i] shares with order[i-1]
	plain  []int   // plain[id]: the leading bytes of id that leave a string as it is
	words  int     // uint64 words a mask takes

	jsonOnce sync.Once
	json     *Grammar
}

// NewVocab prepares a vocabulary: tokens[id] is the bytes token id
// decodes to, nil (or empty) for a token never allowed (a special token,
// an id without a token). It must hold a token of each single byte (as
// byte-level BPE's do): then some token continues every unfinished text.
func NewVocab(tokens [][]byte) (*Vocab, error) {
	var single [256]bool
	for _, b := range tokens {
		if len(b) == 1 {
			single[b[0]] = true
		}
	}
	for c, ok := range single {
		if !ok {
			return nil, fmt.Errorf("grammar: constrained decoding needs a token of each byte; the vocabulary has none of 0x%02x", c)
		}
	}
	v := &Vocab{tokens: tokens, words: (len(tokens) + 63) / 64, plain: make([]int, len(tokens))}
	for id, b := range tokens {
		if len(b) > 0 {
			v.order = append(v.order, int32(id))
		}
		for _, c := range b {
			if c < 0x20 || c >= 0x80 || c == '"' || c == '\\' {
				break
			}
			v.plain[id]++
		}
	}
	slices.SortFunc(v.order, func(a, b int32) int { return bytes.Compare(tokens[a], tokens[b]) })
	v.lcp = make([]int, len(v.order))
	for i := 1; i < len(v.order); i++ {
		a, b := tokens[v.order[i-1]], tokens[v.order[i]]
		n := 0
		for n < len(a) && n < len(b) && a[n] == b[n] {
			n++
		}
		v.lcp[i] = n
	}
	return v, nil
}

// JSON is JSON mode's grammar over v: one JSON object, any object. It
// caches up to 32 MiB of masks.
func (v *Vocab) JSON() *Grammar {
	v.jsonOnce.Do(func() { v.json = v.grammar(anyObject(), 32<<20) })
	return v.json
}

// Schema is the grammar of the documents a JSON schema accepts, over v.
// It caches up to 4 MiB of masks.
func (v *Vocab) Schema(s *Schema) *Grammar { return v.grammar(s, 4<<20) }

func (v *Vocab) grammar(s *Schema, cache int) *Grammar {
	return &Grammar{v: v, s: s, masks: map[state][]uint64{}, links: map[link]*link{}, maxLinks: 1 << 16,
		most: max(16, cache/(8*max(v.words, 1)))}
}

// Grammar is a grammar over a vocabulary: it masks the tokens that may
// come next, caching each scanner state's mask. It is safe for
// concurrent use; each sequence keeps a Seq of its own.
type Grammar struct {
	v *Vocab
	s *Schema

	mu    sync.Mutex
	masks map[state][]uint64 // guarded by mu
	most  int                // masks kept at most

	linkMu   sync.Mutex
	links    map[link]*link // the frames below the top, interned; guarded by linkMu
	maxLinks int            // links kept at most, emptied when full
}

// Start begins a sequence's output.
func (g *Grammar) Start() *Seq { return &Seq{g: g, s: g.start()} }

// mask returns the tokens allowed in state s, as a bitset by id, from the
// cache or scanned.
func (g *Grammar) mask(s state) []uint64 {
	g.mu.Lock()
	m, ok := g.masks[s]
	g.mu.Unlock()
	if ok {
		return m
	}
	v := g.v
	m = make([]uint64, v.words)
	if s.inString() && g.s.nodes[s.top.node].pat == nil {
		// Inside a string without a pattern, most tokens are plain text,
		// which leaves the state as it is but for a bounded string's
		// count: scan each token from its first other byte.
		for _, id := range v.order {
			t := s
			ok := g.plain(&t, v.plain[id])
			rest := v.tokens[id][v.plain[id]:]
			for i := 0; ok && i < len(rest); i++ {
				ok = g.step(&t, rest[i])
			}
			if ok {
				m[id/64] |= 1 << (id % 64)
			}
		}
	} else {
		// states[k] is the state after the current token's first k bytes,
		// valid for k < len(states); bad is the length of the shortest
		// refused prefix of the previous token, or -1.
		states := make([]state, 1, 64)
		states[0] = s
		bad := -1
		for i, id := range v.order {
			b := v.tokens[id]
			l := v.lcp[i]
			if bad >= 0 && l >= bad {
				continue // shares a refused prefix
			}
			states = states[:min(l, len(states)-1)+1]
			bad = -1
			for k := len(states) - 1; k < len(b); k++ {
				t := states[k]
				if !g.step(&t, b[k]) {
					bad = k + 1
					break
				}
				states = append(states, t)
			}
			if bad < 0 {
				m[id/64] |= 1 << (id % 64)
			}
		}
	}
	g.mu.Lock()
	if len(g.masks) >= g.most {
		clear(g.masks)
	}
	g.masks[s] = m
	g.mu.Unlock()
	return m
}

// Seq is one sequence's place in a grammar. It is not safe for concurrent
// use.
type Seq struct {
	g *Grammar
	s state
}

// Done reports whether the output is a whole document.
func (q *Seq) Done() bool { return q.s.n == 0 }

// Mask sets the logits of the tokens that may not come next to -Inf
// (every id past the vocabulary too) and returns how many may.
func (q *Seq) Mask(logits []float32) int {
	m := q.g.mask(q.s)
	inf := float32(math.Inf(-1))
	n := 0
	for w := 0; w*64 < len(logits); w++ {
		row := logits[w*64 : min(w*64+64, len(logits))]
		var word uint64
		if w < len(m) {
			word = m[w]
		}
		if len(row) < 64 {
			word &= 1<<len(row) - 1
		}
		n += bits.OnesCount64(word)
		if word == ^uint64(0) {
			continue
		}
		for i := range row {
			if word>>i&1 == 0 {
				row[i] = inf
			}
		}
	}
	return n
}

// Banned returns the ids of the vocabulary (the tokens NewVocab was given,
// nil ones included) that may not come next, when
// there are at most limit of them (inside a string, where nearly every
// token may); else nil and false.
func (q *Seq) Banned(limit int) ([]int32, bool) {
	m := q.g.mask(q.s)
	n := len(q.g.v.tokens)
	var out []int32
	for w, word := range m {
		if word == ^uint64(0) {
			continue
		}
		for i := range min(64, n-w*64) {
			if word>>i&1 == 0 {
				if len(out) == limit {
					return nil, false
				}
				out = append(out, int32(w*64+i))
			}
		}
	}
	return out, true
}

// AllowedIDs appends to dst the ids that may come next, in order.
func (q *Seq) AllowedIDs(dst []int32) []int32 {
	for w, word := range q.g.mask(q.s) {
		for word != 0 {
			i := bits.TrailingZeros64(word)
			dst = append(dst, int32(w*64+i))
			word &= word - 1
		}
	}
	return dst
}

// Stuck reports whether no token may come next, though the document is
// not whole: a schema whose documents nest deeper than the grammar goes.
func (q *Seq) Stuck() bool {
	return !q.Done() && !slices.ContainsFunc(q.g.mask(q.s), func(w uint64) bool { return w != 0 })
}

// Allowed reports whether token id may come next.
func (q *Seq) Allowed(id int32) bool {
	if id < 0 || int(id) >= len(q.g.v.tokens) {
		return false
	}
	return q.g.mask(q.s)[id/64]>>(id%64)&1 == 1
}

// Accept moves past token id, which must be allowed.
func (q *Seq) Accept(id int32) error {
	if id < 0 || int(id) >= len(q.g.v.tokens) || len(q.g.v.tokens[id]) == 0 {
		return fmt.Errorf("grammar: token %d is not in the vocabulary", id)
	}
	t := q.s
	for _, c := range q.g.v.tokens[id] {
		if !q.g.step(&t, c) {
			return fmt.Errorf("grammar: token %d (%q) does not continue the document", id, q.g.v.tokens[id])
		}
	}
	q.s = t
	return nil
}
