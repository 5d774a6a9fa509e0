package grammar

import "math"

// The bounds of strings' lengths and numbers' values: a bounded string
// counts its characters in its frame, a bounded number keeps its sign and
// digits in state.num, and each byte is taken only while some value within
// the bounds begins with the text so far.

// plain takes p plain bytes inside a string (inString): each is a
// character, which a string with a minLength or a maxLength counts.
func (g *Grammar) plain(s *state, p int) bool {
	nd := &g.s.nodes[s.top.node]
	if p == 0 || !nd.bounded() {
		return true
	}
	s.top.rep = 0
	return more(&s.top, nd, p)
}

// more counts p characters of a bounded string of node nd in its frame f,
// refusing them past maxLength.
func more(f *frame, nd *node, p int) bool {
	if nd.maxItems >= 0 && int(f.idx)+p > nd.maxItems {
		return false
	}
	f.idx = uint16(min(int(f.idx)+p, max(nd.minItems, nd.maxItems)+1))
	return true
}

// A bounded string's frame counts its characters in idx (up to one more
// than the larger bound: past it only the lower bound matters) and keeps
// in rep what tells an escaped surrogate pair, which is one character,
// and in pos the digits of a \u escape so far.
const (
	sHigh    = 1 << iota // the last character was an escaped high surrogate
	sMaybeLo             // in an escape after it, counted: uncounted if a low surrogate
	sMustLo              // in an escape after it at maxLength: it must be a low surrogate
)

// length takes byte c of a string of node nd with a minLength or a
// maxLength, before the scanner does: a character begins at a plain byte,
// a UTF-8 lead byte or a backslash, and the closing quote needs
// minLength of them.
func (g *Grammar) length(s *state, nd *node, c byte) bool {
	f := &s.top
	switch s.sub.mode {
	case mString:
		switch {
		case c == '"':
			return int(f.idx) >= nd.minItems
		case c == '\\' && f.rep&sHigh != 0:
			if nd.maxItems >= 0 && int(f.idx) >= nd.maxItems {
				f.rep = sMustLo
				return true
			}
			f.rep = sMaybeLo
			return more(f, nd, 1)
		}
		f.rep = 0
		return more(f, nd, 1)
	case mEscape:
		if c != 'u' {
			if f.rep&sMustLo != 0 {
				return false
			}
			f.rep = 0
		}
		f.pos = 0
		return true
	case mHex:
		d, ok := hexDigit(c)
		if !ok {
			return true // the scanner refuses it
		}
		f.pos = f.pos<<4 | uint16(d)
		if f.rep&sMustLo != 0 && (s.sub.n == 0 && d != 0xd || s.sub.n == 1 && d < 0xc) {
			return false
		}
		if s.sub.n < 3 {
			return true
		}
		low := f.pos >= 0xdc00 && f.pos <= 0xdfff
		if f.rep&sMaybeLo != 0 && low {
			f.idx-- // the pair's second half: one character with the first
		}
		f.rep = 0
		if f.pos >= 0xd800 && f.pos <= 0xdbff {
			f.rep = sHigh
		}
		f.pos = 0
	}
	return true
}

// A bounded integer's sign and digits: bit 63 the minus sign, bit 62 set
// once a digit came, the rest the digits' value, held at numCap past every
// limit (maxLimit).
const (
	numNeg   = 1 << 63
	numDigit = 1 << 62
	numCap   = 10 * maxLimit
)

// integer takes byte c of an integer with limits, before the scanner
// does: a sign or digit only while some integer that begins so lies within
// them, and the byte after the integer only if it does.
func (g *Grammar) integer(s *state, nd *node, c byte) bool {
	switch {
	case c == '-' && s.sub.mode == mValue:
		s.num = numNeg
	case '0' <= c && c <= '9' && (s.sub.mode == mValue || s.sub.mode == mMinus || s.sub.mode == mInt):
		s.num = addDigit(s.num, c)
	case s.sub.numberEnds():
		return nd.holds(s.num)
	default:
		return true
	}
	return nd.open(s.num)
}

func addDigit(num uint64, c byte) uint64 {
	m := min((num&^(numNeg|numDigit))*10+uint64(c-'0'), numCap)
	return num&numNeg | numDigit | m
}

// holds reports whether the whole integer num lies within the node's
// limits.
func (n *node) holds(num uint64) bool {
	v := int64(num &^ (numNeg | numDigit))
	if num&numNeg != 0 {
		v = -v
	}
	return (n.limits&limMin == 0 || v >= n.min) && (n.limits&limMax == 0 || v <= n.max) && (n.mult == 0 || v%n.mult == 0)
}

// reaches reports whether some magnitude from a to b lies within lo and
// hi (where each is set) and, with a multipleOf, is a multiple of it.
func (n *node) reaches(a, b, lo, hi int64, hasLo, hasHi bool) bool {
	if hasLo {
		a = max(a, lo)
	}
	if hasHi {
		b = min(b, hi)
	}
	if n.mult > 0 {
		a = ceilMultiple(a, n.mult)
	}
	return a <= b
}

// ceilMultiple is the least multiple of m at or above a.
func ceilMultiple(a, m int64) int64 {
	r := a % m
	if r < 0 {
		r += m
	}
	if r == 0 {
		return a
	}
	return a - r + m
}

// open reports whether some integer that begins with num's sign and
// digits, and may have more digits, lies within the node's limits.
func (n *node) open(num uint64) bool {
	lo, hi, hasLo, hasHi, _, _ := n.magnitudeLimits(num) // an integer's limits are inclusive
	m := int64(num &^ (numNeg | numDigit))
	switch {
	case num&numDigit == 0: // a minus sign alone: any magnitude
		return n.reaches(0, math.MaxInt64, lo, hi, hasLo, hasHi)
	case m == 0: // 0 or -0: no digit may follow
		return n.reaches(0, 0, lo, hi, hasLo, hasHi)
	}
	// With j more digits the magnitude lies in [m·10^j, m·10^j + 10^j - 1].
	for p := int64(1); ; p *= 10 {
		a := m * p
		if hasHi && a > hi {
			return false
		}
		if n.reaches(a, a+p-1, lo, hi, hasLo, hasHi) {
			return true
		}
	}
}

// A bounded number's sign, digits and point (state.num): the flags below,
// the integer part in the low 36 bits (held at decCap, past every limit),
// the first decPlaces digits after the point as a number at bit 36 and
// their count at bit 56. Limits lie within maxDecLimit of zero with at
// most decPlaces digits after the point, so values compare in millionths
// (decUnit) exactly; a nonzero digit past them only says the value lies
// strictly between two millionths.
const (
	decNeg      = 1 << 63
	decDigit    = 1 << 62
	decDot      = 1 << 61
	decMore     = 1 << 60 // a nonzero digit past decPlaces
	decPlaces   = 6
	decUnit     = 1_000_000
	maxDecLimit = 1e9
	decCap      = 10 * maxDecLimit
)

// decimal takes byte c of a number with limits, before the scanner does:
// a sign, digit or point only while some number that begins so lies
// within them, and the byte after the number only if it does. Exponents
// are not written.
func (g *Grammar) decimal(s *state, nd *node, c byte) bool {
	switch {
	case (c == 'e' || c == 'E') && s.sub.inNumber():
		return false
	case c == '-' && s.sub.mode == mValue:
		s.num = decNeg
	case c == '.' && (s.sub.mode == mZero || s.sub.mode == mInt):
		s.num |= decDot
	case '0' <= c && c <= '9' && (s.sub.mode == mValue || s.sub.mode == mMinus || s.sub.mode == mInt || s.sub.mode == mDot || s.sub.mode == mFrac):
		s.num = addDec(s.num, c)
	case s.sub.numberEnds():
		return nd.decHolds(s.num)
	default:
		return true
	}
	return nd.decOpen(s.num)
}

func addDec(num uint64, c byte) uint64 {
	d := uint64(c - '0')
	p, f, n := num&(1<<36-1), num>>36&(1<<20-1), num>>56&7
	switch {
	case num&decDot == 0:
		p = min(p*10+d, decCap)
	case n < decPlaces:
		f, n = f*10+d, n+1
	case d != 0:
		num |= decMore
	}
	return num&(decNeg|decDot|decMore) | decDigit | n<<56 | f<<36 | p
}

// decSpan is the magnitudes, in millionths, that a bounded number's text
// so far may still come to in [a, b) (a excluded with open), for j more
// digits of its integer part; ok false once no j is left.
func decSpan(num uint64, j int) (a, b int64, open, ok bool) {
	p, f, n := int64(num&(1<<36-1)), int64(num>>36&(1<<20-1)), int(num>>56&7)
	switch {
	case num&decDigit == 0: // a minus sign alone
		return 0, math.MaxInt64, false, j == 0
	case num&decDot != 0:
		if j > 0 {
			return 0, 0, false, false
		}
		w := int64(decUnit)
		for range n {
			w /= 10
		}
		a = p*decUnit + f*w
		if num&decMore != 0 {
			return a, a + 1, true, true
		}
		return a, a + w, false, true
	case p == 0: // 0 or -0, then at most a fraction
		return 0, decUnit, false, j == 0
	}
	a, b = p*decUnit, (p+1)*decUnit
	for range j {
		if a > 10*maxDecLimit*decUnit {
			return 0, 0, false, false
		}
		a, b = a*10, b*10
	}
	return a, b, false, true
}

// magnitudeLimits is the node's limits for a number or an integer of
// num's sign (bit 63 in both encodings, decNeg and numNeg), as limits of
// its magnitude: lo, hi and whether each is set and exclusive. -m lies
// within [lo, hi] where m lies within [-hi, -lo].
func (n *node) magnitudeLimits(num uint64) (lo, hi int64, hasLo, hasHi, loEx, hiEx bool) {
	lo, hi = n.min, n.max
	hasLo, hasHi, loEx, hiEx = n.limits&limMin != 0, n.limits&limMax != 0, n.limits&limMinEx != 0, n.limits&limMaxEx != 0
	if num&decNeg != 0 {
		return -hi, -lo, hasHi, hasLo, hiEx, loEx
	}
	return
}

// decOpen reports whether some number that begins with num's text lies
// within the node's limits.
func (n *node) decOpen(num uint64) bool {
	lo, hi, hasLo, hasHi, loEx, hiEx := n.magnitudeLimits(num)
	for j := 0; ; j++ {
		a, b, open, ok := decSpan(num, j)
		if !ok {
			return false
		}
		// The larger lower end and the smaller upper end, each excluded
		// where either that meets there excludes it.
		l, lOpen := a, open
		if hasLo && (lo > l || lo == l && loEx) {
			l, lOpen = lo, loEx || lo == a && open
		}
		h, hOpen := b, true
		if hasHi && hi <= h {
			h, hOpen = hi, hiEx || hi == b
		}
		if n.mult > 0 {
			// The least multiple past the lower end.
			x := ceilMultiple(l, n.mult)
			if x == l && lOpen {
				x += n.mult
			}
			l, lOpen = x, false
		}
		if l < h || l == h && !lOpen && !hOpen {
			return true
		}
	}
}

// decHolds reports whether the whole number num lies within the node's
// limits.
func (n *node) decHolds(num uint64) bool {
	lo, hi, hasLo, hasHi, loEx, hiEx := n.magnitudeLimits(num)
	v, _, more, _ := decSpan(num, 0)
	above := func(b int64, ex bool) bool { return v > b || v == b && (more || !ex) }
	below := func(b int64, ex bool) bool { return v < b || v == b && !ex && !more }
	return (!hasLo || above(lo, loEx)) && (!hasHi || below(hi, hiEx)) && (n.mult == 0 || !more && v%n.mult == 0)
}

func hexDigit(c byte) (int, bool) {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0'), true
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10, true
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10, true
	}
	return 0, false
}
