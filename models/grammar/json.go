package grammar

import (
	"bytes"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sync"
)

// Limits of the JSON grammar (see the package doc).
const (
	MaxDepth      = 128
	MaxWhitespace = 20
)

// What the scanner expects next.
const (
	mTop        uint8 = iota // the top-level '{'
	mValue                   // a value
	mValueOrEnd              // a value or ']' (after '[')
	mKeyOrEnd                // a key or '}' (after '{')
	mKey                     // a key (after ',' in an object)
	mColon                   // ':' after a key
	mAfter                   // ',' or the container's closer
	mString                  // inside a string (key says which kind)
	mEscape                  // after '\' in a string
	mHex                     // n of the 4 hex digits of \u read
	mUTF8                    // inside a multi-byte character
	mMinus                   // after a number's '-'
	mZero                    // after a number's leading 0
	mInt                     // in the integer part
	mDot                     // after '.'
	mFrac                    // in the fraction
	mExp                     // after 'e' or 'E'
	mExpSign                 // after the exponent's sign
	mExpInt                  // in the exponent
	mLiteral                 // in true, false or null
	mDone                    // the top-level object has closed
)

var literals = [...]string{"true", "false", "null"}

// scan is the state of a byte scanner over JSON: a small value, copied
// freely, and the key of the mask cache.
type scan struct {
	stack  [MaxDepth / 64]uint64 // bit i: level i is an object (else an array)
	depth  uint8
	mode   uint8
	key    bool  // the string is an object's key
	n      uint8 // mHex: digits read; mUTF8: bytes to come; mLiteral: bytes read
	lit    uint8 // mLiteral: which of literals
	lo, hi uint8 // mUTF8: the range of the next byte
	ws     uint8 // whitespace bytes in a row
}

func (s *scan) top() bool { return s.stack[(s.depth-1)/64]>>((s.depth-1)%64)&1 == 1 }

func (s *scan) push(object bool) bool {
	if s.depth == MaxDepth {
		return false
	}
	w, b := s.depth/64, s.depth%64
	if object {
		s.stack[w] |= 1 << b
	} else {
		s.stack[w] &^= 1 << b
	}
	s.depth++
	return true
}

// pop closes the innermost container, clearing its bit so that equal
// states compare equal.
func (s *scan) pop() {
	s.depth--
	s.stack[s.depth/64] &^= 1 << (s.depth % 64)
}

// ended moves past a complete value, clearing what the value's scan kept.
func (s *scan) ended() {
	s.key, s.n, s.lit, s.lo, s.hi = false, 0, 0, 0, 0
	if s.depth == 0 {
		s.mode = mDone
	} else {
		s.mode = mAfter
	}
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

// step scans one byte and reports whether the text is still a prefix of a
// valid JSON object.
func (s *scan) step(c byte) bool {
	switch s.mode {
	case mString:
		switch {
		case c == '"':
			if s.key {
				s.mode, s.key = mColon, false
			} else {
				s.ended()
			}
		case c == '\\':
			s.mode = mEscape
		case c < 0x20:
			return false
		case c < 0x80:
		default:
			return s.lead(c)
		}
		return true
	case mEscape:
		switch c {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			s.mode = mString
		case 'u':
			s.mode, s.n = mHex, 0
		default:
			return false
		}
		return true
	case mHex:
		if !isHex(c) {
			return false
		}
		if s.n++; s.n == 4 {
			s.mode, s.n = mString, 0
		}
		return true
	case mUTF8:
		if c < s.lo || c > s.hi {
			return false
		}
		s.lo, s.hi = 0x80, 0xBF
		if s.n--; s.n == 0 {
			s.mode, s.lo, s.hi = mString, 0, 0
		}
		return true
	case mLiteral:
		if c != literals[s.lit][s.n] {
			return false
		}
		if s.n++; int(s.n) == len(literals[s.lit]) {
			s.ended()
		}
		return true
	case mMinus:
		switch {
		case c == '0':
			s.mode = mZero
		case '1' <= c && c <= '9':
			s.mode = mInt
		default:
			return false
		}
		return true
	case mZero, mInt:
		switch {
		case s.mode == mInt && '0' <= c && c <= '9':
		case c == '.':
			s.mode = mDot
		case c == 'e' || c == 'E':
			s.mode = mExp
		default:
			s.ended()
			return s.step(c)
		}
		return true
	case mDot, mFrac:
		switch {
		case '0' <= c && c <= '9':
			s.mode = mFrac
		case s.mode == mFrac && (c == 'e' || c == 'E'):
			s.mode = mExp
		case s.mode == mFrac:
			s.ended()
			return s.step(c)
		default:
			return false
		}
		return true
	case mExp, mExpSign:
		switch {
		case '0' <= c && c <= '9':
			s.mode = mExpInt
		case s.mode == mExp && (c == '+' || c == '-'):
			s.mode = mExpSign
		default:
			return false
		}
		return true
	case mExpInt:
		if '0' <= c && c <= '9' {
			return true
		}
		s.ended()
		return s.step(c)
	case mDone:
		return false
	case mTop:
		if c != '{' {
			return false
		}
		s.push(true)
		s.mode = mKeyOrEnd
		return true
	}
	// The structural modes, where whitespace may come.
	if isSpace(c) {
		if s.ws == MaxWhitespace {
			return false
		}
		s.ws++
		return true
	}
	s.ws = 0
	switch s.mode {
	case mKeyOrEnd, mKey:
		switch {
		case c == '"':
			s.mode, s.key = mString, true
		case c == '}' && s.mode == mKeyOrEnd:
			s.pop()
			s.ended()
		default:
			return false
		}
		return true
	case mColon:
		if c != ':' {
			return false
		}
		s.mode = mValue
		return true
	case mAfter:
		object := s.top()
		switch {
		case c == ',' && object:
			s.mode = mKey
		case c == ',':
			s.mode = mValue
		case c == '}' && object, c == ']' && !object:
			s.pop()
			s.ended()
		default:
			return false
		}
		return true
	case mValueOrEnd:
		if c == ']' {
			s.pop()
			s.ended()
			return true
		}
	}
	// mValue, or mValueOrEnd with a value.
	switch {
	case c == '{':
		s.mode = mKeyOrEnd
		return s.push(true)
	case c == '[':
		s.mode = mValueOrEnd
		return s.push(false)
	case c == '"':
		s.mode, s.key = mString, false
	case c == '-':
		s.mode = mMinus
	case c == '0':
		s.mode = mZero
	case '1' <= c && c <= '9':
		s.mode = mInt
	case c == 't':
		s.mode, s.n, s.lit = mLiteral, 1, 0
	case c == 'f':
		s.mode, s.n, s.lit = mLiteral, 1, 1
	case c == 'n':
		s.mode, s.n, s.lit = mLiteral, 1, 2
	default:
		return false
	}
	return true
}

// lead starts a multi-byte UTF-8 character in a string: the well-formed
// sequences of Unicode's table 3-7 only (no overlong forms, no
// surrogates, nothing past U+10FFFF).
func (s *scan) lead(c byte) bool {
	s.lo, s.hi = 0x80, 0xBF
	switch {
	case 0xC2 <= c && c <= 0xDF:
		s.n = 1
	case c == 0xE0:
		s.n, s.lo = 2, 0xA0
	case c == 0xED:
		s.n, s.hi = 2, 0x9F
	case 0xE1 <= c && c <= 0xEF:
		s.n = 2
	case c == 0xF0:
		s.n, s.lo = 3, 0x90
	case c == 0xF4:
		s.n, s.hi = 3, 0x8F
	case 0xF1 <= c && c <= 0xF3:
		s.n = 3
	default:
		return false
	}
	s.mode = mUTF8
	return true
}

// JSON constrains a vocabulary's tokens to JSON mode.
type JSON struct {
	vocab [][]byte
	order []int32 // the ids with bytes, by their bytes
	lcp   []int   // lcp[i]: bytes order[i] shares with order[i-1]
	plain []int   // plain[id]: the leading bytes of id that leave a string as it is
	words int     // uint64 words a mask takes

	mu    sync.Mutex
	masks map[scan][]uint64 // guarded by mu
	most  int               // masks kept at most
}

// NewJSON returns the constraint for a vocabulary: vocab[id] is the
// bytes token id decodes to, nil (or empty) for a token never allowed
// (a special token, an id without a token). The vocabulary must hold a
// token of each single byte (as byte-level BPE's do): then some token
// continues every unfinished object.
func NewJSON(vocab [][]byte) (*JSON, error) {
	var single [256]bool
	for _, b := range vocab {
		if len(b) == 1 {
			single[b[0]] = true
		}
	}
	for c, ok := range single {
		if !ok {
			return nil, fmt.Errorf("grammar: JSON mode needs a token of each byte; the vocabulary has none of 0x%02x", c)
		}
	}
	j := &JSON{vocab: vocab, words: (len(vocab) + 63) / 64, masks: map[scan][]uint64{}, plain: make([]int, len(vocab))}
	for id, b := range vocab {
		if len(b) > 0 {
			j.order = append(j.order, int32(id))
		}
		for _, c := range b {
			if c < 0x20 || c >= 0x80 || c == '"' || c == '\\' {
				break
			}
			j.plain[id]++
		}
	}
	slices.SortFunc(j.order, func(a, b int32) int { return bytes.Compare(vocab[a], vocab[b]) })
	j.lcp = make([]int, len(j.order))
	for i := 1; i < len(j.order); i++ {
		a, b := vocab[j.order[i-1]], vocab[j.order[i]]
		n := 0
		for n < len(a) && n < len(b) && a[n] == b[n] {
			n++
		}
		j.lcp[i] = n
	}
	// About 32 MiB of masks.
	j.most = max(16, (32<<20)/(8*max(j.words, 1)))
	return j, nil
}

// mask returns the tokens allowed in state s, as a bitset by id, from the
// cache or scanned.
func (j *JSON) mask(s scan) []uint64 {
	j.mu.Lock()
	m, ok := j.masks[s]
	j.mu.Unlock()
	if ok {
		return m
	}
	m = make([]uint64, j.words)
	if s.mode == mString {
		// Inside a string, most tokens are plain text, which leaves the
		// state as it is: scan each token from its first other byte.
		for _, id := range j.order {
			t, ok := s, true
			for _, c := range j.vocab[id][j.plain[id]:] {
				if ok = t.step(c); !ok {
					break
				}
			}
			if ok {
				m[id/64] |= 1 << (id % 64)
			}
		}
		j.keep(s, m)
		return m
	}
	// states[k] is the state after the current token's first k bytes,
	// valid for k <= good; bad is the length of the shortest refused
	// prefix of the previous token, or -1.
	states := make([]scan, 1, 64)
	states[0] = s
	bad := -1
	for i, id := range j.order {
		b := j.vocab[id]
		l := j.lcp[i]
		if bad >= 0 && l >= bad {
			continue // shares a refused prefix
		}
		states = states[:min(l, len(states)-1)+1]
		bad = -1
		for k := len(states) - 1; k < len(b); k++ {
			t := states[k]
			if !t.step(b[k]) {
				bad = k + 1
				break
			}
			states = append(states, t)
		}
		if bad < 0 {
			m[id/64] |= 1 << (id % 64)
		}
	}
	j.keep(s, m)
	return m
}

// keep caches state s's mask m, emptying a full cache first.
func (j *JSON) keep(s scan, m []uint64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(j.masks) >= j.most {
		clear(j.masks)
	}
	j.masks[s] = m
}

// Start begins a sequence's output.
func (j *JSON) Start() *Seq { return &Seq{j: j} }

// Seq is one sequence's place in the grammar. It is not safe for
// concurrent use.
type Seq struct {
	j *JSON
	s scan
}

// Done reports whether the output is a complete JSON object.
func (q *Seq) Done() bool { return q.s.mode == mDone }

// Mask sets the logits of the tokens that may not come next to -Inf
// (every id past the vocabulary too) and returns how many may.
func (q *Seq) Mask(logits []float32) int {
	m := q.j.mask(q.s)
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

// Allowed reports whether token id may come next.
func (q *Seq) Allowed(id int32) bool {
	if id < 0 || int(id) >= len(q.j.vocab) {
		return false
	}
	return q.j.mask(q.s)[id/64]>>(id%64)&1 == 1
}

// Accept moves past token id, which must be allowed.
func (q *Seq) Accept(id int32) error {
	if id < 0 || int(id) >= len(q.j.vocab) || len(q.j.vocab[id]) == 0 {
		return fmt.Errorf("grammar: token %d is not in the vocabulary's JSON", id)
	}
	t := q.s
	for _, c := range q.j.vocab[id] {
		if !t.step(c) {
			return fmt.Errorf("grammar: token %d (%q) does not continue JSON", id, q.j.vocab[id])
		}
	}
	q.s = t
	return nil
}
