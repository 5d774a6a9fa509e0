package safetensors

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"sort"
)

// Write writes tensors as one safetensors file, in name order, with
// optional metadata. Each tensor's Data must hold exactly its shape's bytes.
func Write(w io.Writer, tensors []*Tensor, meta map[string]string) error {
	sorted := append([]*Tensor(nil), tensors...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	header := map[string]any{}
	if len(meta) > 0 {
		header["__metadata__"] = meta
	}
	var off int64
	for _, t := range sorted {
		size := DTypeSize(t.DType)
		if size == 0 {
			return fmt.Errorf("tensor %q: unknown dtype %q", t.Name, t.DType)
		}
		if n := int64(t.Elements() * size); n != int64(len(t.Data)) {
			return fmt.Errorf("tensor %q: shape %v needs %d bytes, has %d", t.Name, t.Shape, n, len(t.Data))
		}
		header[t.Name] = rawEntry{DType: t.DType, Shape: toInt64(t.Shape), DataOffsets: []int64{off, off + int64(len(t.Data))}}
		off += int64(len(t.Data))
	}
	h, err := json.Marshal(header)
	if err != nil {
		return err
	}
	// Pad the header with spaces so the data starts 8-byte aligned.
	for (len(h)+8)%8 != 0 {
		h = append(h, ' ')
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(h)))
	bw.Write(n[:])
	bw.Write(h)
	for _, t := range sorted {
		if _, err := bw.Write(t.Data); err != nil {
			return err
		}
	}
	return bw.Flush()
}

func toInt64(s []int) []int64 {
	out := make([]int64, len(s))
	for i, v := range s {
		out[i] = int64(v)
	}
	return out
}
