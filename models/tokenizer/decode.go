package tokenizer

import "unicode/utf8"

// Decoder turns a stream of ids into text as they arrive, returning only
// complete UTF-8: the bytes of a character split across tokens are held
// until the character is complete. The concatenation of everything Next and
// Flush return equals Tokenizer.Decode of the same ids. A Decoder must be
// used by one goroutine at a time.
type Decoder struct {
	t           *Tokenizer
	skipSpecial bool
	pending     []byte // bytes of an incomplete trailing character
	out         []byte
}

// NewDecoder returns a streaming decoder; skipSpecial drops special tokens.
func (t *Tokenizer) NewDecoder(skipSpecial bool) *Decoder {
	return &Decoder{t: t, skipSpecial: skipSpecial}
}

// Next adds one id and returns the text it completes, possibly empty.
func (d *Decoder) Next(id int32) string {
	b := d.t.idBytes(id, d.skipSpecial)
	if len(b) == 0 {
		return ""
	}
	if len(d.pending) == 0 && utf8.Valid(b) {
		return string(b)
	}
	d.pending = append(d.pending, b...)
	var n int
	d.out, n = appendLossy(d.out[:0], d.pending, false)
	d.pending = d.pending[:copy(d.pending, d.pending[n:])]
	return string(d.out)
}

// Flush returns what is held back, an incomplete character becoming U+FFFD,
// and resets the decoder for a new stream.
func (d *Decoder) Flush() string {
	if len(d.pending) == 0 {
		return ""
	}
	d.out, _ = appendLossy(d.out[:0], d.pending, true)
	d.pending = d.pending[:0]
	return string(d.out)
}

const replacement = "\uFFFD"

// appendLossy appends src to dst as valid UTF-8, replacing each maximal
// subpart of an ill-formed sequence with U+FFFD (the Unicode "best
// practice", as Rust's String::from_utf8_lossy does). Unless final, a
// trailing sequence that may yet be completed is left unconsumed; it returns
// the number of bytes of src consumed.
func appendLossy(dst, src []byte, final bool) ([]byte, int) {
	i := 0
	for i < len(src) {
		c := src[i]
		if c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		size, lo, hi := seqInfo(c)
		if size == 0 {
			dst = append(dst, replacement...)
			i++
			continue
		}
		k := 1 // bytes of the sequence that are valid so far
		for k < size && i+k < len(src) {
			b := src[i+k]
			if k == 1 {
				if b < lo || b > hi {
					break
				}
			} else if b < 0x80 || b > 0xBF {
				break
			}
			k++
		}
		switch {
		case k == size:
			dst = append(dst, src[i:i+k]...)
		case i+k == len(src) && !final:
			return dst, i
		default:
			dst = append(dst, replacement...)
		}
		i += k
	}
	return dst, i
}

// seqInfo returns the length of the UTF-8 sequence led by c and the range
// of its second byte, or size 0 for a byte that cannot lead one.
func seqInfo(c byte) (size int, lo, hi byte) {
	switch {
	case c >= 0xC2 && c <= 0xDF:
		return 2, 0x80, 0xBF
	case c == 0xE0:
		return 3, 0xA0, 0xBF
	case c == 0xED:
		return 3, 0x80, 0x9F
	case c >= 0xE1 && c <= 0xEF:
		return 3, 0x80, 0xBF
	case c == 0xF0:
		return 4, 0x90, 0xBF
	case c >= 0xF1 && c <= 0xF3:
		return 4, 0x80, 0xBF
	case c == 0xF4:
		return 4, 0x80, 0x8F
	}
	return 0, 0, 0
}
