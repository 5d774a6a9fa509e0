package models

import (
	"testing"

	"github.com/troupe/troupe/models/safetensors"
)

// BenchmarkDequant dequantizes a 4096 × 4096 e4m3 matrix with 128 × 128
// block scales to bf16: the rate a quantized checkpoint loads at.
func BenchmarkDequant(b *testing.B) {
	const n = 4096
	q := &Quant{Method: "fp8", DType: codeFP8, Scale: "_scale_inv", Block: [2]int{128, 128}}
	w := &safetensors.Tensor{DType: codeFP8, Shape: []int{n, n}, Data: make([]byte, n*n)}
	for i := range w.Data {
		w.Data[i] = byte(i * 7)
	}
	s := &safetensors.Tensor{DType: "F32", Shape: []int{n / 128, n / 128}, Data: make([]byte, 4*(n/128)*(n/128))}
	b.SetBytes(n * n)
	for b.Loop() {
		dequant(q, w, s)
	}
}
