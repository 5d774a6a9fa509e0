package bus

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Schema names a message type on the wire. A type has exactly one Schema;
// changing the meaning of a field or removing one means a new Version, and
// both sides of a subject must agree on it.
type Schema struct {
	ID      string
	Version uint16
}

func (s Schema) String() string { return fmt.Sprintf("%s/v%d", s.ID, s.Version) }

// Message is a control-plane message: a struct whose Schema method, on the
// value receiver, returns a constant. Fields are encoded by name (or by their
// msgpack tag) and must themselves be closed types: no interface fields.
type Message interface {
	Schema() Schema
}

// MaxMessageSize bounds what Encode produces and Decode accepts. It equals
// the default max_payload; a server configured with a smaller max_payload is
// checked again by CheckPayload.
const MaxMessageSize = DefaultMaxPayload

// Codec errors; Decode and Encode wrap them with detail.
var (
	ErrTooLarge      = errors.New("message too large")
	ErrMalformed     = errors.New("malformed message")
	ErrUnknownSchema = errors.New("unknown schema")
	ErrWrongVersion  = errors.New("wrong schema version")
)

// Encode returns msg's wire form.
func Encode[T Message](msg T) ([]byte, error) {
	s := msg.Schema()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true) // an integer takes the fewest bytes its value needs
	err := enc.EncodeArrayLen(3)
	if err == nil {
		err = enc.EncodeString(s.ID)
	}
	if err == nil {
		err = enc.EncodeUint16(s.Version)
	}
	if err == nil {
		err = enc.Encode(msg)
	}
	if err != nil {
		return nil, fmt.Errorf("bus: encode %s: %w", s, err)
	}
	if buf.Len() > MaxMessageSize {
		return nil, fmt.Errorf("bus: encode %s: %d bytes: %w (limit %d)", s, buf.Len(), ErrTooLarge, MaxMessageSize)
	}
	return buf.Bytes(), nil
}

// Decode parses data into *msg. It fails, leaving *msg in an unspecified
// state, when data is larger than MaxMessageSize, is not exactly one
// well-formed message, names another schema or version than T's, or holds
// a field T does not declare.
func Decode[T Message](data []byte, msg *T) error {
	var zero T
	want := zero.Schema()
	if len(data) > MaxMessageSize {
		return fmt.Errorf("bus: decode %s: %d bytes: %w (limit %d)", want, len(data), ErrTooLarge, MaxMessageSize)
	}
	if err := scan(data); err != nil {
		return fmt.Errorf("bus: decode %s: %w", want, err)
	}
	got, body, err := header(data)
	if err != nil {
		return fmt.Errorf("bus: decode %s: %w", want, err)
	}
	if got.ID != want.ID {
		return fmt.Errorf("bus: decode %s: got schema %q: %w", want, got.ID, ErrUnknownSchema)
	}
	if got.Version != want.Version {
		return fmt.Errorf("bus: decode %s: got version %d: %w", want, got.Version, ErrWrongVersion)
	}
	if len(body) == 0 || !isMap(body[0]) {
		return fmt.Errorf("bus: decode %s: body is not a map: %w", want, ErrMalformed)
	}
	dec := msgpack.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields(true)
	if err := dec.Decode(msg); err != nil {
		return fmt.Errorf("bus: decode %s: %w", want, err)
	}
	return nil
}

// PeekSchema returns the schema named by data without decoding the body, for
// subjects that carry more than one message type.
func PeekSchema(data []byte) (Schema, error) {
	if len(data) > MaxMessageSize {
		return Schema{}, fmt.Errorf("bus: peek schema: %d bytes: %w", len(data), ErrTooLarge)
	}
	if err := scan(data); err != nil {
		return Schema{}, fmt.Errorf("bus: peek schema: %w", err)
	}
	s, _, err := header(data)
	if err != nil {
		return Schema{}, fmt.Errorf("bus: peek schema: %w", err)
	}
	return s, nil
}

// header reads the envelope of a scanned message and returns the body bytes.
func header(data []byte) (Schema, []byte, error) {
	r := bytes.NewReader(data)
	dec := msgpack.NewDecoder(r)
	n, err := dec.DecodeArrayLen()
	if err != nil || n != 3 {
		return Schema{}, nil, fmt.Errorf("envelope is not [schema, version, body]: %w", ErrMalformed)
	}
	id, err := dec.DecodeString()
	if err != nil {
		return Schema{}, nil, fmt.Errorf("schema id: %w", ErrMalformed)
	}
	v, err := dec.DecodeUint16()
	if err != nil {
		return Schema{}, nil, fmt.Errorf("schema version: %w", ErrMalformed)
	}
	return Schema{ID: id, Version: v}, data[len(data)-r.Len():], nil
}

func isMap(c byte) bool { return c&0xf0 == 0x80 || c == 0xde || c == 0xdf }

// scan checks that data is exactly one well-formed msgpack value whose
// declared lengths fit in the bytes that remain. The decoder trusts declared
// lengths when it allocates; scan runs first so it never has to.
func scan(data []byte) error {
	pending := 1 // values still to read; each needs at least one byte
	i := 0
	for pending > 0 {
		if pending > len(data)-i {
			return fmt.Errorf("truncated or impossible length at byte %d: %w", i, ErrMalformed)
		}
		c := data[i]
		i++
		pending--
		var skip, elems int // payload bytes to skip, child values to read
		switch {
		case c <= 0x7f || c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3:
		case c&0xf0 == 0x80:
			elems = 2 * int(c&0x0f)
		case c&0xf0 == 0x90:
			elems = int(c & 0x0f)
		case c&0xe0 == 0xa0:
			skip = int(c & 0x1f)
		case c == 0xcc, c == 0xd0:
			skip = 1
		case c == 0xcd, c == 0xd1:
			skip = 2
		case c == 0xca, c == 0xce, c == 0xd2:
			skip = 4
		case c == 0xcb, c == 0xcf, c == 0xd3:
			skip = 8
		case c >= 0xd4 && c <= 0xd8: // fixext: type byte + 1,2,4,8,16
			skip = 1 + 1<<(c-0xd4)
		case c == 0xc4, c == 0xc5, c == 0xc6, c == 0xd9, c == 0xda, c == 0xdb,
			c == 0xc7, c == 0xc8, c == 0xc9, c == 0xdc, c == 0xdd, c == 0xde, c == 0xdf:
			n, w, ok := length(c, data[i:])
			if !ok {
				return fmt.Errorf("truncated length at byte %d: %w", i, ErrMalformed)
			}
			i += w
			switch c {
			case 0xc7, 0xc8, 0xc9:
				skip = n + 1 // ext type byte
			case 0xdc, 0xdd:
				elems = n
			case 0xde, 0xdf:
				if n > len(data) { // keeps 2*n from overflowing
					return fmt.Errorf("impossible map length at byte %d: %w", i, ErrMalformed)
				}
				elems = 2 * n
			default:
				skip = n
			}
		default: // 0xc1 is never used
			return fmt.Errorf("invalid type byte 0x%02x at byte %d: %w", c, i-1, ErrMalformed)
		}
		if skip > len(data)-i {
			return fmt.Errorf("truncated value at byte %d: %w", i, ErrMalformed)
		}
		i += skip
		pending += elems
	}
	if i != len(data) {
		return fmt.Errorf("%d trailing bytes: %w", len(data)-i, ErrMalformed)
	}
	return nil
}

// length reads the big-endian length that follows type byte c.
func length(c byte, b []byte) (n, width int, ok bool) {
	switch c {
	case 0xc4, 0xc7, 0xd9:
		width = 1
	case 0xc5, 0xc8, 0xda, 0xdc, 0xde:
		width = 2
	default:
		width = 4
	}
	if len(b) < width {
		return 0, 0, false
	}
	switch width {
	case 1:
		n = int(b[0])
	case 2:
		n = int(binary.BigEndian.Uint16(b))
	default:
		n = int(binary.BigEndian.Uint32(b))
	}
	return n, width, true
}
