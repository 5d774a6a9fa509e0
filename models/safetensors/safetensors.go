package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"sort"
)

// MaxHeader is the largest header accepted (the format's own limit).
const MaxHeader = 100 << 20

// Tensor is a view of one tensor's bytes (none where only its file's
// header was read: ParseHeader).
type Tensor struct {
	Name  string
	DType string // "BF16", "F16", "F32", ...
	Shape []int
	Data  []byte

	begin, end int64 // its bytes' span in its file's data
}

// Bytes is the tensor's size: its elements times its dtype's size.
func (t *Tensor) Bytes() int64 { return int64(t.Elements()) * int64(DTypeSize(t.DType)) }

// Elements is the product of the shape.
func (t *Tensor) Elements() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// DTypeSize is the element size of a safetensors dtype, or 0 if unknown.
func DTypeSize(dt string) int {
	switch dt {
	case "F64", "I64", "U64":
		return 8
	case "F32", "I32", "U32":
		return 4
	case "F16", "BF16", "I16", "U16":
		return 2
	case "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2":
		return 1
	}
	return 0
}

type rawEntry struct {
	DType       string  `json:"dtype"`
	Shape       []int64 `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

// Parse validates a whole safetensors file held in buf and returns views of
// its tensors (aliasing buf) and its metadata.
func Parse(buf []byte) (map[string]*Tensor, map[string]string, error) {
	hlen, err := headerLen(buf, int64(len(buf)))
	if err != nil {
		return nil, nil, err
	}
	data := buf[8+hlen:]
	tensors, meta, err := parseHeader(buf[8:8+hlen], int64(len(data)))
	if err != nil {
		return nil, nil, err
	}
	for _, t := range tensors {
		t.Data = data[t.begin:t.end:t.end]
	}
	return tensors, meta, nil
}

// ParseHeader validates the header of a safetensors file of size bytes
// from prefix, its first bytes (at least the header's), and returns its
// tensors without their data: what a remote file's first bytes say.
func ParseHeader(prefix []byte, size int64) (map[string]*Tensor, error) {
	hlen, err := headerLen(prefix, size)
	if err != nil {
		return nil, err
	}
	if uint64(len(prefix)) < 8+hlen {
		return nil, fmt.Errorf("%d bytes hold less than the %d-byte header", len(prefix), 8+hlen)
	}
	tensors, _, err := parseHeader(prefix[8:8+hlen], size-8-int64(hlen))
	return tensors, err
}

// HeaderLen is how many bytes of a safetensors file hold its header, the
// 8-byte length included, read from its first 8 bytes.
func HeaderLen(first8 []byte) (int64, error) {
	hlen, err := headerLen(first8, math.MaxInt64)
	return 8 + int64(hlen), err
}

// headerLen reads the header's length from buf, the start of a file of
// size bytes.
func headerLen(buf []byte, size int64) (uint64, error) {
	if len(buf) < 8 || size < 8 {
		return 0, fmt.Errorf("file of %d bytes is too short for a header", min(int64(len(buf)), size))
	}
	hlen := binary.LittleEndian.Uint64(buf)
	if hlen > MaxHeader {
		return 0, fmt.Errorf("header of %d bytes exceeds the %d-byte limit", hlen, MaxHeader)
	}
	if hlen > uint64(size-8) {
		return 0, fmt.Errorf("header of %d bytes runs past the end of a %d-byte file (truncated?)", hlen, size)
	}
	return hlen, nil
}

// parseHeader validates a header's entries against dataLen bytes of data
// and returns its tensors, their spans set and no data, and its metadata.
func parseHeader(header []byte, dataLen int64) (map[string]*Tensor, map[string]string, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(header, &raw); err != nil {
		return nil, nil, fmt.Errorf("header is not a JSON object: %w", err)
	}
	meta := map[string]string{}
	tensors := make(map[string]*Tensor, len(raw))
	spans := make([]*Tensor, 0, len(raw))
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &meta); err != nil {
				return nil, nil, fmt.Errorf("__metadata__ is not a string map: %w", err)
			}
			continue
		}
		var e rawEntry
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, nil, fmt.Errorf("tensor %q: bad header entry: %w", name, err)
		}
		size := DTypeSize(e.DType)
		if size == 0 {
			return nil, nil, fmt.Errorf("tensor %q: unknown dtype %q", name, e.DType)
		}
		if len(e.DataOffsets) != 2 {
			return nil, nil, fmt.Errorf("tensor %q: data_offsets has %d entries, want 2", name, len(e.DataOffsets))
		}
		begin, end := e.DataOffsets[0], e.DataOffsets[1]
		if begin < 0 || end < begin || end > dataLen {
			return nil, nil, fmt.Errorf("tensor %q: data_offsets [%d, %d] outside the %d data bytes", name, begin, end, dataLen)
		}
		elems := int64(1)
		shape := make([]int, len(e.Shape))
		for i, d := range e.Shape {
			if d < 0 || (d > 0 && elems > math.MaxInt32*int64(1<<16)/d) {
				return nil, nil, fmt.Errorf("tensor %q: invalid shape %v", name, e.Shape)
			}
			elems *= d
			shape[i] = int(d)
		}
		if elems*int64(size) != end-begin {
			return nil, nil, fmt.Errorf("tensor %q: shape %v of %s needs %d bytes, data_offsets give %d", name, e.Shape, e.DType, elems*int64(size), end-begin)
		}
		t := &Tensor{Name: name, DType: e.DType, Shape: shape, begin: begin, end: end}
		tensors[name] = t
		spans = append(spans, t)
	}
	sort.Slice(spans, func(i, j int) bool {
		if spans[i].begin != spans[j].begin {
			return spans[i].begin < spans[j].begin
		}
		return spans[i].Name < spans[j].Name
	})
	for i := 1; i < len(spans); i++ {
		if spans[i].begin < spans[i-1].end {
			return nil, nil, fmt.Errorf("tensors %q and %q overlap (bytes %d-%d and %d-%d)", spans[i-1].Name, spans[i].Name, spans[i-1].begin, spans[i-1].end, spans[i].begin, spans[i].end)
		}
	}
	return tensors, meta, nil
}
