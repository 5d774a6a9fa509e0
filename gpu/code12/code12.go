package code12

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

const (
	// Chunk is how many values a chunk of a row codes.
	Chunk = 512
	// ChunkBytes is a chunk's size: a low byte and half a byte a value.
	ChunkBytes = Chunk * 3 / 2
	// MaxK is the longest row: an escape names its column in 15 bits.
	MaxK = 32768
	// MaxCap is the most escapes a row may hold (one a lane of a warp).
	MaxCap = 32
	// NoEscape fills a row's unused escape entries.
	NoEscape = 0xffffffff
)

// ErrNotCodable reports a matrix the code does not fit: its rows' length,
// or more escapes in a row than MaxCap. Such a matrix stays in bf16.
var ErrNotCodable = errors.New("not codable")

// Matrix is a bf16 matrix of Rows × K values in the code.
type Matrix struct {
	Rows, K int
	// Data is Rows × K*3/2 bytes (the package comment's layout).
	Data []byte
	// Base is the window's first exponent bucket: code c stands for the
	// high byte (c&8)<<4 | (Base + c&7), and code 0, an escape's, for the
	// value V0 (high byte Base, low byte 0).
	Base uint8
	// Cap is how many escape entries each row has; Esc holds Rows × Cap of
	// them, a row's escapes first: column<<16 | the value's bf16 bits, and
	// NoEscape after them.
	Cap int
	Esc []uint32
}

// V0 is the value an escape's code decodes to; a product adds
// (t - V0)·x for each escape of true value t.
func (m *Matrix) V0() float32 { return math.Float32frombits(uint32(m.Base) << 24) }

// Base4 is Base in each byte of a word, as the decoder adds it.
func (m *Matrix) Base4() uint32 { return uint32(m.Base) * 0x01010101 }

// Escapes is how many values the rows' entries hold.
func (m *Matrix) Escapes() int {
	n := 0
	for _, e := range m.Esc {
		if e != NoEscape {
			n++
		}
	}
	return n
}

// Encode codes rows × k bf16 values (little-endian), given as parts that
// hold whole rows one after another (a product's packed weights).
func Encode(rows, k int, parts ...[]byte) (*Matrix, error) {
	if rows <= 0 || k <= 0 || k%Chunk != 0 || k > MaxK {
		return nil, fmt.Errorf("code12: %d × %d: rows of a multiple of %d values up to %d: %w", rows, k, Chunk, MaxK, ErrNotCodable)
	}
	total := 0
	for _, p := range parts {
		if len(p)%(2*k) != 0 {
			return nil, fmt.Errorf("code12: a part of %d bytes is not whole rows of %d bf16 values", len(p), k)
		}
		total += len(p)
	}
	if total != 2*rows*k {
		return nil, fmt.Errorf("code12: %d bytes for %d × %d bf16 values (want %d)", total, rows, k, 2*rows*k)
	}
	// The window of eight buckets that leaves the fewest escapes: values
	// outside it, and the positive values of its first bucket (code 0).
	var hist, pos [128]int
	for _, p := range parts {
		for i := 1; i < len(p); i += 2 {
			h := p[i]
			hist[h&0x7f]++
			if h < 0x80 {
				pos[h]++
			}
		}
	}
	best, base := -1, 0
	for b := 0; b+8 <= 128; b++ {
		in := -pos[b]
		for j := b; j < b+8; j++ {
			in += hist[j]
		}
		if in > best {
			best, base = in, b
		}
	}
	m := &Matrix{Rows: rows, K: k, Base: uint8(base), Data: make([]byte, rows*k*3/2)}
	// Each row's escapes, then the entries at the largest count.
	var esc [][]uint32
	r := 0
	for _, p := range parts {
		for o := 0; o < len(p); o, r = o+2*k, r+1 {
			e, err := m.encodeRow(r, p[o:o+2*k])
			if err != nil {
				return nil, err
			}
			m.Cap = max(m.Cap, len(e))
			esc = append(esc, e)
		}
	}
	m.Esc = make([]uint32, rows*m.Cap)
	for r, e := range esc {
		row := m.Esc[r*m.Cap : (r+1)*m.Cap]
		n := copy(row, e)
		for i := n; i < len(row); i++ {
			row[i] = NoEscape
		}
	}
	return m, nil
}

// encodeRow codes row r from its bf16 bytes and returns its escapes.
func (m *Matrix) encodeRow(r int, src []byte) ([]uint32, error) {
	var esc []uint32
	row := m.Data[r*m.K*3/2 : (r+1)*m.K*3/2]
	for c := 0; c < m.K/Chunk; c++ {
		chunk := row[c*ChunkBytes : (c+1)*ChunkBytes]
		for i := 0; i < Chunk; i++ {
			col := c*Chunk + i
			lo, hi := src[2*col], src[2*col+1]
			code, ok := m.code(hi)
			if !ok {
				if len(esc) == MaxCap {
					return nil, fmt.Errorf("code12: row %d has more than %d values outside the window of exponents: %w", r, MaxCap, ErrNotCodable)
				}
				esc = append(esc, uint32(col)<<16|uint32(binary.LittleEndian.Uint16(src[2*col:])))
				lo, code = 0, 0
			}
			chunk[i] = lo
			at, shift := codeAt(i)
			chunk[at] |= code << shift
		}
	}
	return esc, nil
}

// code is the high byte h's code, false for an escape.
func (m *Matrix) code(h byte) (byte, bool) {
	idx := int(h&0x7f) - int(m.Base)
	if idx < 0 || idx > 7 {
		return 0, false
	}
	c := h>>7<<3 | byte(idx)
	return c, c != 0
}

// codeAt is where value i of a chunk keeps its code: the byte of the
// chunk and the nibble's shift.
func codeAt(i int) (int, uint) {
	lane, j := i/16, i%16
	word, j := j/8, j%8
	return Chunk + 8*lane + 4*word + j%4, uint(j / 4 * 4)
}

// Decode returns the matrix's bf16 values (little-endian), as the
// products see them: every code decoded and every escape put back.
func (m *Matrix) Decode() []byte {
	out := make([]byte, 2*m.Rows*m.K)
	for r := 0; r < m.Rows; r++ {
		row := m.Data[r*m.K*3/2:]
		for col := 0; col < m.K; col++ {
			chunk := row[col/Chunk*ChunkBytes:]
			i := col % Chunk
			at, shift := codeAt(i)
			c := chunk[at] >> shift & 0xf
			out[2*(r*m.K+col)] = chunk[i]
			out[2*(r*m.K+col)+1] = c&8<<4 | (m.Base + c&7)
		}
		for _, e := range m.Esc[r*m.Cap : (r+1)*m.Cap] {
			if e == NoEscape {
				break
			}
			binary.LittleEndian.PutUint16(out[2*(r*m.K+int(e>>16)):], uint16(e))
		}
	}
	return out
}
