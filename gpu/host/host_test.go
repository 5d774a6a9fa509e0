package host

import (
	"slices"
	"testing"

	"github.com/troupe/troupe/gpu"
)

var _ gpu.LateReader = Memory{}

// TestReadRowsLater reads rows of a buffer in the order asked for, and
// refuses rows past the buffer, a destination that is not whole rows and
// rows of no width.
func TestReadRowsLater(t *testing.T) {
	var m Memory
	b, err := m.Alloc(gpu.F32, 12)
	if err != nil {
		t.Fatal(err)
	}
	vals := make([]float32, 12)
	for i := range vals {
		vals[i] = float32(i)
	}
	if err := m.Write(b, 0, gpu.F32Bytes(vals)); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, 6)
	wait, err := m.ReadRowsLater(gpu.F32Bytes(got), b, []int32{3, 0}, 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	if want := []float32{9, 10, 11, 0, 1, 2}; !slices.Equal(got, want) {
		t.Fatalf("rows 3 and 0: %v, want %v", got, want)
	}
	for name, c := range map[string]struct {
		dst   []float32
		rows  []int32
		width int
	}{
		"past the end":   {got, []int32{3, 4}, 3},
		"negative":       {got, []int32{-1, 0}, 3},
		"not whole rows": {got[:5], []int32{3, 0}, 3},
		"no width":       {got, []int32{3, 0}, 0},
		"no rows":        {nil, nil, 3},
	} {
		if _, err := m.ReadRowsLater(gpu.F32Bytes(c.dst), b, c.rows, c.width); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
