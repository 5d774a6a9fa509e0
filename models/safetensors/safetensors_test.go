package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func sample(t testing.TB) []byte {
	var buf bytes.Buffer
	ts := []*Tensor{
		{Name: "a", DType: "F32", Shape: []int{2, 3}, Data: make([]byte, 24)},
		{Name: "b", DType: "BF16", Shape: []int{4}, Data: []byte{1, 2, 3, 4, 5, 6, 7, 8}},
		{Name: "empty", DType: "F16", Shape: []int{0, 5}, Data: nil},
	}
	if err := Write(&buf, ts, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestRoundTrip(t *testing.T) {
	ts, meta, err := Parse(sample(t))
	if err != nil {
		t.Fatal(err)
	}
	if meta["format"] != "pt" {
		t.Errorf("metadata = %v", meta)
	}
	b := ts["b"]
	if b == nil || b.DType != "BF16" || len(b.Shape) != 1 || b.Shape[0] != 4 || !bytes.Equal(b.Data, []byte{1, 2, 3, 4, 5, 6, 7, 8}) {
		t.Errorf("tensor b = %+v", b)
	}
	if a := ts["a"]; a.Elements() != 6 || len(a.Data) != 24 {
		t.Errorf("tensor a = %+v", a)
	}
}

// header builds a file from a literal header and n data bytes.
func header(h string, n int) []byte {
	out := make([]byte, 8, 8+len(h)+n)
	binary.LittleEndian.PutUint64(out, uint64(len(h)))
	out = append(out, h...)
	return append(out, make([]byte, n)...)
}

func TestMalformed(t *testing.T) {
	huge := make([]byte, 8)
	binary.LittleEndian.PutUint64(huge, 1<<40)
	for _, c := range []struct {
		name string
		buf  []byte
		want string
	}{
		{"empty", nil, "too short"},
		{"oversized header", huge, "exceeds"},
		{"truncated header", header(`{"a":{}}`, 0)[:10], "past the end"},
		{"not json", header(`nope`, 0), "not a JSON object"},
		{"unknown dtype", header(`{"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}`, 1), "unknown dtype"},
		{"offsets past end", header(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 4), "outside"},
		{"negative offsets", header(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}}`, 4), "outside"},
		{"shape mismatch", header(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, 8), "needs 12 bytes"},
		{"negative shape", header(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, 4), "invalid shape"},
		{"overflowing shape", header(`{"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}}`, 4), "invalid shape"},
		{"overlap", header(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8), "overlap"},
		{"bad offsets count", header(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}}`, 4), "want 2"},
		{"bad metadata", header(`{"__metadata__":{"a":1}}`, 0), "__metadata__"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := Parse(c.buf)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
}

func TestOpenDirSharded(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, ts ...*Tensor) {
		var buf bytes.Buffer
		if err := Write(&buf, ts, nil); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("m-1.safetensors", &Tensor{Name: "x", DType: "F32", Shape: []int{1}, Data: []byte{0, 0, 128, 63}})
	write("m-2.safetensors", &Tensor{Name: "y", DType: "F16", Shape: []int{2}, Data: []byte{1, 2, 3, 4}})
	idx, _ := json.Marshal(map[string]any{"weight_map": map[string]string{"x": "m-1.safetensors", "y": "m-2.safetensors"}})
	os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), idx, 0o644)
	c, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := strings.Join(c.Names(), ","); got != "x,y" {
		t.Errorf("names = %s", got)
	}
	if got := c.Bytes(); got != 8 {
		t.Errorf("the shards' tensors hold %d bytes, want 8", got)
	}
	if x, _ := c.Tensor("x"); !bytes.Equal(x.Data, []byte{0, 0, 128, 63}) {
		t.Errorf("x = %v", x.Data)
	}

	// An index naming a tensor its shard lacks is refused.
	idx, _ = json.Marshal(map[string]any{"weight_map": map[string]string{"x": "m-1.safetensors", "z": "m-1.safetensors", "y": "m-2.safetensors"}})
	os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), idx, 0o644)
	if _, err := OpenDir(dir); err == nil || !strings.Contains(err.Error(), `"z"`) {
		t.Errorf("missing tensor: got %v", err)
	}
	// An index escaping the directory is refused.
	idx, _ = json.Marshal(map[string]any{"weight_map": map[string]string{"x": "../m-1.safetensors"}})
	os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), idx, 0o644)
	if _, err := OpenDir(dir); err == nil {
		t.Error("escaping index: got no error")
	}
}

func TestOpenDirMissing(t *testing.T) {
	if _, err := OpenDir(t.TempDir()); err == nil || !strings.Contains(err.Error(), "neither") {
		t.Errorf("got %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(sample(f))
	f.Add(header(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 8))
	f.Add(header(`{"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[],"data_offsets":[8,12]}}`, 12))
	f.Fuzz(func(t *testing.T, buf []byte) {
		// A header read alone says what the whole file says.
		hs, herr := ParseHeader(buf, int64(len(buf)))
		ts, _, err := Parse(buf)
		if (err == nil) != (herr == nil) {
			t.Fatalf("Parse: %v; ParseHeader: %v", err, herr)
		}
		if err != nil {
			return
		}
		for _, x := range ts {
			if len(x.Data) != x.Elements()*DTypeSize(x.DType) || int64(len(x.Data)) != x.Bytes() {
				t.Fatalf("tensor %q: %d bytes for shape %v", x.Name, len(x.Data), x.Shape)
			}
			h := hs[x.Name]
			if h == nil || h.DType != x.DType || !slices.Equal(h.Shape, x.Shape) || h.Data != nil {
				t.Fatalf("tensor %q: header alone gives %+v", x.Name, h)
			}
		}
		if len(hs) != len(ts) {
			t.Fatalf("%d tensors from the header, %d from the file", len(hs), len(ts))
		}
	})
}

// TestParseHeader: a file's header, read from its first bytes, gives its
// tensors' names, dtypes and shapes without their data; too few bytes, or
// a size the offsets run past, are refused.
func TestParseHeader(t *testing.T) {
	buf := sample(t)
	n, err := HeaderLen(buf[:8])
	if err != nil {
		t.Fatal(err)
	}
	hs, err := ParseHeader(buf[:n], int64(len(buf)))
	if err != nil {
		t.Fatal(err)
	}
	ts, _, _ := Parse(buf)
	ckpt, err := FromHeaders(hs)
	if err != nil || len(hs) != len(ts) {
		t.Fatalf("%d tensors from the header, %d from the file: %v", len(hs), len(ts), err)
	}
	full, _ := FromBytes(buf)
	if ckpt.Bytes() != full.Bytes() || ckpt.Bytes() == 0 {
		t.Errorf("header-only checkpoint holds %d bytes, the file's %d", ckpt.Bytes(), full.Bytes())
	}
	if _, err := ParseHeader(buf[:n-1], int64(len(buf))); err == nil {
		t.Error("a prefix short of the header: no error")
	}
	if _, err := ParseHeader(buf[:n], n+1); err == nil {
		t.Error("a size the data offsets run past: no error")
	}
	if _, err := FromHeaders(hs, hs); err == nil {
		t.Error("a tensor in two files: no error")
	}
}

// FuzzOpenDirIndex opens a directory of two shards through an arbitrary
// index: it must refuse or give every tensor the index lists.
func FuzzOpenDirIndex(f *testing.F) {
	dir := f.TempDir()
	for name, x := range map[string]*Tensor{
		"m-1.safetensors": {Name: "x", DType: "F32", Shape: []int{1}, Data: []byte{0, 0, 128, 63}},
		"m-2.safetensors": {Name: "y", DType: "F16", Shape: []int{2}, Data: []byte{1, 2, 3, 4}},
	} {
		var buf bytes.Buffer
		if err := Write(&buf, []*Tensor{x}, nil); err != nil {
			f.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), buf.Bytes(), 0o644); err != nil {
			f.Fatal(err)
		}
	}
	f.Add([]byte(`{"weight_map":{"x":"m-1.safetensors","y":"m-2.safetensors"}}`))
	f.Add([]byte(`{"weight_map":{"x":"m-1.safetensors"},"metadata":{"total_size":4}}`))
	f.Add([]byte(`{"weight_map":{"x":"../m-1.safetensors"}}`))
	f.Add([]byte(`{"weight_map":{"x":"m-2.safetensors"}}`))
	f.Add([]byte(`{"weight_map":{}}`))
	f.Add([]byte(`{"weight_map":{"x":".."}}`))
	f.Fuzz(func(t *testing.T, index []byte) {
		d := t.TempDir()
		for _, name := range []string{"m-1.safetensors", "m-2.safetensors"} {
			if err := os.Symlink(filepath.Join(dir, name), filepath.Join(d, name)); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(d, "model.safetensors.index.json"), index, 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := OpenDir(d)
		if err != nil {
			return
		}
		defer c.Close()
		var idx struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(index, &idx); err != nil || len(idx.WeightMap) == 0 {
			t.Fatalf("opened through an index that is not one: %v", err)
		}
		for name := range idx.WeightMap {
			if _, ok := c.Tensor(name); !ok {
				t.Errorf("tensor %q of the index is missing", name)
			}
		}
	})
}
