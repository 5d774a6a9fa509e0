package bus

import (
	"errors"
	"fmt"
	"math/bits"

	"github.com/nats-io/nats.go"
)

// ErrPayloadTooLarge is returned for a payload over the connection's
// max_payload.
var ErrPayloadTooLarge = errors.New("payload exceeds max_payload")

// CheckPayload fails when data is larger than nc's max_payload (or
// MaxMessageSize when nc is nil). Bulk data belongs on the data plane, named
// in messages by a TensorRef.
func CheckPayload(nc *nats.Conn, data []byte) error {
	limit := int64(MaxMessageSize)
	if nc != nil {
		if mp := nc.MaxPayload(); mp > 0 {
			limit = mp
		}
	}
	if int64(len(data)) > limit {
		return fmt.Errorf("bus: %d bytes: %w (%d); send a TensorRef to a data-plane buffer instead", len(data), ErrPayloadTooLarge, limit)
	}
	return nil
}

// Location says which memory a TensorRef points into.
type Location string

// Locations.
const (
	LocationDevice Location = "device" // memory of Device on Node
	LocationHost   Location = "host"   // (pinned) host memory on Node
)

// DType is an element type.
type DType string

// Element types and their sizes in bytes.
const (
	F32  DType = "f32"
	F16  DType = "f16"
	BF16 DType = "bf16"
	F8   DType = "f8e4m3"
	I64  DType = "i64"
	I32  DType = "i32"
	I8   DType = "i8"
	U8   DType = "u8"
)

var dtypeSize = map[DType]uint64{F32: 4, F16: 2, BF16: 2, F8: 1, I64: 8, I32: 4, I8: 1, U8: 1}

// Size is the size of one element in bytes, or 0 for an unknown type.
func (d DType) Size() uint64 { return dtypeSize[d] }

// TensorRef names a data-plane buffer instead of carrying it: Bytes bytes at
// Offset in Buffer, which lives in Location memory of Device on Node. The
// actors at both ends agree, over the bus, on how the bytes move (a peer
// copy on one host, a direct stream between hosts).
type TensorRef struct {
	Location Location
	Node     string
	Device   int
	// Buffer identifies the allocation to its owner: an IPC handle, a
	// buffer id, a stream name.
	Buffer string
	Offset uint64
	Bytes  uint64
	DType  DType
	Shape  []int64
}

// Schema implements Message.
func (TensorRef) Schema() Schema { return Schema{ID: "troupe.tensor_ref", Version: 1} }

// Validate checks that t names a non-empty region whose size matches its
// shape and type.
func (t TensorRef) Validate() error {
	if t.Location != LocationDevice && t.Location != LocationHost {
		return fmt.Errorf("bus: tensor ref: location %q: want %q or %q", t.Location, LocationDevice, LocationHost)
	}
	if t.Node == "" {
		return errors.New("bus: tensor ref: empty node")
	}
	if t.Device < 0 {
		return fmt.Errorf("bus: tensor ref: device %d: want >= 0", t.Device)
	}
	size := t.DType.Size()
	if size == 0 {
		return fmt.Errorf("bus: tensor ref: unknown dtype %q", t.DType)
	}
	n := size
	for _, d := range t.Shape {
		if d < 0 {
			return fmt.Errorf("bus: tensor ref: shape %v: negative dimension", t.Shape)
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 {
			return fmt.Errorf("bus: tensor ref: shape %v overflows", t.Shape)
		}
		n = lo
	}
	if n != t.Bytes {
		return fmt.Errorf("bus: tensor ref: shape %v of %s is %d bytes, ref says %d", t.Shape, t.DType, n, t.Bytes)
	}
	if _, carry := bits.Add64(t.Offset, t.Bytes, 0); carry != 0 {
		return fmt.Errorf("bus: tensor ref: offset %d + bytes %d overflows", t.Offset, t.Bytes)
	}
	return nil
}
