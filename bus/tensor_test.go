package bus

import (
	"errors"
	"strings"
	"testing"
)

func TestTensorRefValidate(t *testing.T) {
	good := TensorRef{Location: LocationDevice, Node: "n", Device: 0, Buffer: "b", Bytes: 2 * 3 * 2, DType: BF16, Shape: []int64{2, 3}}
	if err := good.Validate(); err != nil {
		t.Fatalf("Validate(%+v) = %v, want nil", good, err)
	}
	tests := []struct {
		name string
		edit func(*TensorRef)
		want string
	}{
		{"location", func(r *TensorRef) { r.Location = "moon" }, "location"},
		{"node", func(r *TensorRef) { r.Node = "" }, "node"},
		{"device", func(r *TensorRef) { r.Device = -1 }, "device"},
		{"dtype", func(r *TensorRef) { r.DType = "f128" }, "dtype"},
		{"negative dim", func(r *TensorRef) { r.Shape = []int64{-1, 3} }, "negative"},
		{"size mismatch", func(r *TensorRef) { r.Bytes = 10 }, "ref says 10"},
		{"overflow", func(r *TensorRef) { r.Shape = []int64{1 << 40, 1 << 40} }, "overflows"},
		{"offset overflow", func(r *TensorRef) { r.Offset = ^uint64(0) }, "offset"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := good
			tt.edit(&r)
			err := r.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want error mentioning %q", err, tt.want)
			}
		})
	}
}

func TestCheckPayload(t *testing.T) {
	if err := CheckPayload(nil, make([]byte, MaxMessageSize)); err != nil {
		t.Errorf("CheckPayload(limit) = %v, want nil", err)
	}
	err := CheckPayload(nil, make([]byte, MaxMessageSize+1))
	if !errors.Is(err, ErrPayloadTooLarge) || !strings.Contains(err.Error(), "TensorRef") {
		t.Errorf("CheckPayload(limit+1) = %v, want ErrPayloadTooLarge pointing at TensorRef", err)
	}
}
