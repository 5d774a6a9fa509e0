package xgmi

import "testing"

func TestHost(t *testing.T) {
	h := NewHost("n1")
	h.Publish("a", []float32{1, 2, 3, 4})
	got, err := h.Read("a", 1, 2)
	if err != nil || len(got) != 2 || got[0] != 2 || got[1] != 3 {
		t.Fatalf("read: %v %v", got, err)
	}
	if _, err := h.Read("a", 3, 2); err == nil {
		t.Error("read past the end: no error")
	}
	if _, err := h.Read("b", 0, 1); err == nil {
		t.Error("read of an unknown buffer: no error")
	}
	h.Remove("a")
	if _, err := h.Read("a", 0, 1); err == nil {
		t.Error("read after remove: no error")
	}
}
