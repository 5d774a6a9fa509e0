package grammar

// Limits of the JSON grammar (see the package doc).
const (
	MaxDepth      = 128
	MaxWhitespace = 20
)

// moreSpace adds whitespace byte c to a run ws (its length, and 0x80 once
// it holds a line break) at depth open objects and arrays, and reports
// whether the run is still allowed: at most one line break, and at most
// 1 + 4·depth bytes (a line break and an indent of four a level), capped at
// MaxWhitespace. Compact, a run is one space at most.
func moreSpace(ws uint8, c byte, depth int, compact bool) (uint8, bool) {
	if compact {
		return 1, ws == 0 && c == ' '
	}
	if c == '\n' {
		if ws&0x80 != 0 {
			return ws, false
		}
		ws |= 0x80
	}
	n := ws&0x7f + 1
	if int(n) > min(MaxWhitespace, 1+4*depth) {
		return ws, false
	}
	return ws&0x80 | n, true
}

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
	ws     uint8 // the whitespace in a row (moreSpace)
	// compact allows one space at most between tokens (Schema.Compact).
	compact bool
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

func isHex(c byte) bool { _, ok := hexDigit(c); return ok }

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
		var ok bool
		s.ws, ok = moreSpace(s.ws, c, int(s.depth), s.compact)
		return ok
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

// numberEnds reports whether s holds a whole number at its top level,
// which the next byte that is not part of it ends.
func (s *scan) numberEnds() bool {
	return s.depth == 0 && (s.mode == mZero || s.mode == mInt || s.mode == mFrac || s.mode == mExpInt)
}

// inNumber reports whether s is inside a number at its top level.
func (s *scan) inNumber() bool { return s.depth == 0 && s.mode >= mMinus && s.mode <= mExpInt }
