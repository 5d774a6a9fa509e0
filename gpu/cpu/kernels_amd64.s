//go:build amd64 && !purego

#include "textflag.h"

// Kernels for x86-64 with AVX2, FMA and F16C. Strides are in elements; the
// callers in kernels_amd64.go check bounds and handle the k%8 tails.

// LO_*(b, r) and HI_*(b, r) load into the eight f32 lanes of r the weights
// of row b at elements AX .. AX+7 and AX+8 .. AX+15, widened from bf16 or
// f16, or as they are (f32).
#define LO_BF16(b, r) VPMOVZXWD (b)(AX*2), r; VPSLLD $16, r, r
#define HI_BF16(b, r) VPMOVZXWD 16(b)(AX*2), r; VPSLLD $16, r, r
#define LO_F16(b, r) VCVTPH2PS (b)(AX*2), r
#define HI_F16(b, r) VCVTPH2PS 16(b)(AX*2), r
#define LO_F32(b, r) VMOVUPS (b)(AX*4), r
#define HI_F32(b, r) VMOVUPS 32(b)(AX*4), r

// PF4_* and PF2_* prefetch the next group of rows (from BX), four rows or
// two, as many bytes ahead as a 16-element step reads of the group being
// summed: when rows are contiguous the next group is in cache by the time
// it starts, across matrices too short for the hardware to catch up. Four
// f32 rows read 256 bytes a step, past the largest scale of an index, so
// BX walks them.
#define PF4_16 PREFETCHT0 (BX)(AX*8); PREFETCHT0 64(BX)(AX*8)
#define PF4_F32 PREFETCHT0 (BX); PREFETCHT0 64(BX); PREFETCHT0 128(BX); PREFETCHT0 192(BX); ADDQ $256, BX
#define PF2_16 PREFETCHT0 (BX)(AX*4)
#define PF2_F32 PREFETCHT0 (BX)(AX*8); PREFETCHT0 64(BX)(AX*8)

// ZERO8 clears the accumulators Y0 .. Y7.
#define ZERO8 VXORPS Y0, Y0, Y0; VXORPS Y1, Y1, Y1; VXORPS Y2, Y2, Y2; VXORPS Y3, Y3, Y3; VXORPS Y4, Y4, Y4; VXORPS Y5, Y5, Y5; VXORPS Y6, Y6, Y6; VXORPS Y7, Y7, Y7

// GEMV4_BODY(LO, HI, PF) is the body of the one-row GEMVs once their
// arguments are in DI (out), SI (x), DX (w), R8 (the stride in bytes), R9
// (rows) and R10 (k8): four weight rows at a time, then one, two
// accumulators a row by 16-element steps.
#define GEMV4_BODY(LO, HI, PF) \
	MOVQ R10, CX \
	ANDQ $-16, CX \
rows4: \
	CMPQ R9, $4 \
	JLT rows1 \
	LEAQ (DX)(R8*1), R11 \
	LEAQ (DX)(R8*2), R12 \
	LEAQ (R11)(R8*2), R13 \
	LEAQ (DX)(R8*4), BX \
	ZERO8 \
	XORQ AX, AX \
loop4x16: \
	CMPQ AX, CX \
	JGE loop4x8 \
	PF \
	VMOVUPS (SI)(AX*4), Y8 \
	VMOVUPS 32(SI)(AX*4), Y9 \
	LO(DX, Y10) \
	VFMADD231PS Y10, Y8, Y0 \
	HI(DX, Y11) \
	VFMADD231PS Y11, Y9, Y4 \
	LO(R11, Y10) \
	VFMADD231PS Y10, Y8, Y1 \
	HI(R11, Y11) \
	VFMADD231PS Y11, Y9, Y5 \
	LO(R12, Y10) \
	VFMADD231PS Y10, Y8, Y2 \
	HI(R12, Y11) \
	VFMADD231PS Y11, Y9, Y6 \
	LO(R13, Y10) \
	VFMADD231PS Y10, Y8, Y3 \
	HI(R13, Y11) \
	VFMADD231PS Y11, Y9, Y7 \
	ADDQ $16, AX \
	JMP loop4x16 \
loop4x8: \
	CMPQ AX, R10 \
	JGE reduce4 \
	VMOVUPS (SI)(AX*4), Y8 \
	LO(DX, Y10) \
	VFMADD231PS Y10, Y8, Y0 \
	LO(R11, Y10) \
	VFMADD231PS Y10, Y8, Y1 \
	LO(R12, Y10) \
	VFMADD231PS Y10, Y8, Y2 \
	LO(R13, Y10) \
	VFMADD231PS Y10, Y8, Y3 \
	ADDQ $8, AX \
reduce4: \
	VADDPS Y4, Y0, Y0 \
	VADDPS Y5, Y1, Y1 \
	VADDPS Y6, Y2, Y2 \
	VADDPS Y7, Y3, Y3 \
	VHADDPS Y1, Y0, Y0 \
	VHADDPS Y3, Y2, Y2 \
	VHADDPS Y2, Y0, Y0 \
	VEXTRACTF128 $1, Y0, X1 \
	VADDPS X1, X0, X0 \
	VMOVUPS X0, (DI) \
	ADDQ $16, DI \
	LEAQ (DX)(R8*4), DX \
	SUBQ $4, R9 \
	JMP rows4 \
rows1: \
	TESTQ R9, R9 \
	JEQ done \
	VXORPS Y0, Y0, Y0 \
	VXORPS Y4, Y4, Y4 \
	XORQ AX, AX \
loop1x16: \
	CMPQ AX, CX \
	JGE loop1x8 \
	VMOVUPS (SI)(AX*4), Y8 \
	VMOVUPS 32(SI)(AX*4), Y9 \
	LO(DX, Y10) \
	VFMADD231PS Y10, Y8, Y0 \
	HI(DX, Y11) \
	VFMADD231PS Y11, Y9, Y4 \
	ADDQ $16, AX \
	JMP loop1x16 \
loop1x8: \
	CMPQ AX, R10 \
	JGE reduce1 \
	VMOVUPS (SI)(AX*4), Y8 \
	LO(DX, Y10) \
	VFMADD231PS Y10, Y8, Y0 \
	ADDQ $8, AX \
reduce1: \
	VADDPS Y4, Y0, Y0 \
	VEXTRACTF128 $1, Y0, X1 \
	VADDPS X1, X0, X0 \
	VHADDPS X0, X0, X0 \
	VHADDPS X0, X0, X0 \
	VMOVSS X0, (DI) \
	ADDQ $4, DI \
	ADDQ R8, DX \
	DECQ R9 \
	JMP rows1 \
done: \
	VZEROUPPER \
	RET

// GEMV2_BODY(LO, HI, PF) is the body of the two-row GEMVs once their
// arguments are in DI (out0), R14 (out1), SI (x0), R12 (x1), DX (w), R8
// (the stride in bytes), R9 (pairs) and R10 (k8): two rows of x against
// two weight rows at a time, each weight loaded once. A row's sums are
// GEMV4_BODY's for a row of a group of four: the same accumulators by
// 16-element steps and the same horizontal tree.
#define GEMV2_BODY(LO, HI, PF) \
	MOVQ R10, CX \
	ANDQ $-16, CX \
pairs2: \
	TESTQ R9, R9 \
	JEQ done2 \
	LEAQ (DX)(R8*1), R11 \
	LEAQ (DX)(R8*2), BX \
	ZERO8 \
	XORQ AX, AX \
loop2x16: \
	CMPQ AX, CX \
	JGE loop2x8 \
	PF \
	VMOVUPS (SI)(AX*4), Y8 \
	VMOVUPS 32(SI)(AX*4), Y9 \
	VMOVUPS (R12)(AX*4), Y10 \
	VMOVUPS 32(R12)(AX*4), Y11 \
	LO(DX, Y12) \
	HI(DX, Y13) \
	VFMADD231PS Y12, Y8, Y0 \
	VFMADD231PS Y13, Y9, Y4 \
	VFMADD231PS Y12, Y10, Y2 \
	VFMADD231PS Y13, Y11, Y6 \
	LO(R11, Y14) \
	HI(R11, Y15) \
	VFMADD231PS Y14, Y8, Y1 \
	VFMADD231PS Y15, Y9, Y5 \
	VFMADD231PS Y14, Y10, Y3 \
	VFMADD231PS Y15, Y11, Y7 \
	ADDQ $16, AX \
	JMP loop2x16 \
loop2x8: \
	CMPQ AX, R10 \
	JGE reduce2 \
	VMOVUPS (SI)(AX*4), Y8 \
	VMOVUPS (R12)(AX*4), Y10 \
	LO(DX, Y12) \
	VFMADD231PS Y12, Y8, Y0 \
	VFMADD231PS Y12, Y10, Y2 \
	LO(R11, Y14) \
	VFMADD231PS Y14, Y8, Y1 \
	VFMADD231PS Y14, Y10, Y3 \
	ADDQ $8, AX \
reduce2: \
	VADDPS Y4, Y0, Y0 \
	VADDPS Y5, Y1, Y1 \
	VADDPS Y6, Y2, Y2 \
	VADDPS Y7, Y3, Y3 \
	VHADDPS Y1, Y0, Y0 \
	VHADDPS Y0, Y0, Y0 \
	VEXTRACTF128 $1, Y0, X8 \
	VADDPS X8, X0, X0 \
	VMOVQ X0, (DI) \
	VHADDPS Y3, Y2, Y2 \
	VHADDPS Y2, Y2, Y2 \
	VEXTRACTF128 $1, Y2, X9 \
	VADDPS X9, X2, X2 \
	VMOVQ X2, (R14) \
	ADDQ $8, DI \
	ADDQ $8, R14 \
	LEAQ (DX)(R8*2), DX \
	DECQ R9 \
	JMP pairs2 \
done2: \
	VZEROUPPER \
	RET

// func gemvF32AVX2(out *float32, x *float32, w *float32, stride int, rows int, k8 int)
// out[r] = x[0:k8] · w[r*stride : r*stride+k8] for r < rows; k8 is a multiple of 8.
TEXT ·gemvF32AVX2(SB), NOSPLIT, $0-48
	MOVQ out+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), DX
	MOVQ stride+24(FP), R8
	MOVQ rows+32(FP), R9
	MOVQ k8+40(FP), R10
	SHLQ $2, R8
	GEMV4_BODY(LO_F32, HI_F32, PF4_F32)

// func gemv2F32AVX2(out0, out1, x0, x1 *float32, w *float32, stride int, pairs int, k8 int)
// gemv2BF16AVX2 for f32 weights.
TEXT ·gemv2F32AVX2(SB), NOSPLIT, $0-64
	MOVQ out0+0(FP), DI
	MOVQ out1+8(FP), R14
	MOVQ x0+16(FP), SI
	MOVQ x1+24(FP), R12
	MOVQ w+32(FP), DX
	MOVQ stride+40(FP), R8
	MOVQ pairs+48(FP), R9
	MOVQ k8+56(FP), R10
	SHLQ $2, R8
	GEMV2_BODY(LO_F32, HI_F32, PF2_F32)

// func gemvBF16AVX2(out *float32, x *float32, w *uint16, stride int, rows int, k8 int)
// gemvF32AVX2 for bf16 weights.
TEXT ·gemvBF16AVX2(SB), NOSPLIT, $0-48
	MOVQ out+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), DX
	MOVQ stride+24(FP), R8
	MOVQ rows+32(FP), R9
	MOVQ k8+40(FP), R10
	SHLQ $1, R8
	GEMV4_BODY(LO_BF16, HI_BF16, PF4_16)

// func gemvF16AVX2(out *float32, x *float32, w *uint16, stride int, rows int, k8 int)
// gemvF32AVX2 for f16 weights.
TEXT ·gemvF16AVX2(SB), NOSPLIT, $0-48
	MOVQ out+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), DX
	MOVQ stride+24(FP), R8
	MOVQ rows+32(FP), R9
	MOVQ k8+40(FP), R10
	SHLQ $1, R8
	GEMV4_BODY(LO_F16, HI_F16, PF4_16)

// func gemv2BF16AVX2(out0, out1, x0, x1 *float32, w *uint16, stride int, pairs int, k8 int)
// out0[r] = x0[0:k8] · w[r*stride : r*stride+k8] and out1[r] likewise with
// x1, for r < 2*pairs; k8 is a multiple of 8.
TEXT ·gemv2BF16AVX2(SB), NOSPLIT, $0-64
	MOVQ out0+0(FP), DI
	MOVQ out1+8(FP), R14
	MOVQ x0+16(FP), SI
	MOVQ x1+24(FP), R12
	MOVQ w+32(FP), DX
	MOVQ stride+40(FP), R8
	MOVQ pairs+48(FP), R9
	MOVQ k8+56(FP), R10
	SHLQ $1, R8
	GEMV2_BODY(LO_BF16, HI_BF16, PF2_16)

// func gemv2F16AVX2(out0, out1, x0, x1 *float32, w *uint16, stride int, pairs int, k8 int)
// gemv2BF16AVX2 for f16 weights.
TEXT ·gemv2F16AVX2(SB), NOSPLIT, $0-64
	MOVQ out0+0(FP), DI
	MOVQ out1+8(FP), R14
	MOVQ x0+16(FP), SI
	MOVQ x1+24(FP), R12
	MOVQ w+32(FP), DX
	MOVQ stride+40(FP), R8
	MOVQ pairs+48(FP), R9
	MOVQ k8+56(FP), R10
	SHLQ $1, R8
	GEMV2_BODY(LO_F16, HI_F16, PF2_16)

// func accumF32AVX2(acc *float32, v *float32, vstride int, p *float32, rows int, hd8 int)
// acc[c] += Σ_r p[r]*v[r*vstride+c] for c < hd8; rows > 0, hd8 a multiple of 8.
TEXT ·accumF32AVX2(SB), NOSPLIT, $0-48
	MOVQ acc+0(FP), DI
	MOVQ v+8(FP), SI
	MOVQ vstride+16(FP), R8
	SHLQ $2, R8
	MOVQ p+24(FP), DX
	MOVQ rows+32(FP), R9
	MOVQ hd8+40(FP), CX
	SHLQ $2, CX
	XORQ AX, AX
chunk64:
	LEAQ 256(AX), BX
	CMPQ BX, CX
	JGT chunk8
	VMOVUPS 0(DI)(AX*1), Y0
	VMOVUPS 32(DI)(AX*1), Y1
	VMOVUPS 64(DI)(AX*1), Y2
	VMOVUPS 96(DI)(AX*1), Y3
	VMOVUPS 128(DI)(AX*1), Y4
	VMOVUPS 160(DI)(AX*1), Y5
	VMOVUPS 192(DI)(AX*1), Y6
	VMOVUPS 224(DI)(AX*1), Y7
	MOVQ SI, R11
	MOVQ DX, R12
	MOVQ R9, R13
rows64:
	VBROADCASTSS (R12), Y8
	VFMADD231PS 0(R11)(AX*1), Y8, Y0
	VFMADD231PS 32(R11)(AX*1), Y8, Y1
	VFMADD231PS 64(R11)(AX*1), Y8, Y2
	VFMADD231PS 96(R11)(AX*1), Y8, Y3
	VFMADD231PS 128(R11)(AX*1), Y8, Y4
	VFMADD231PS 160(R11)(AX*1), Y8, Y5
	VFMADD231PS 192(R11)(AX*1), Y8, Y6
	VFMADD231PS 224(R11)(AX*1), Y8, Y7
	ADDQ $4, R12
	ADDQ R8, R11
	DECQ R13
	JNZ rows64
	VMOVUPS Y0, 0(DI)(AX*1)
	VMOVUPS Y1, 32(DI)(AX*1)
	VMOVUPS Y2, 64(DI)(AX*1)
	VMOVUPS Y3, 96(DI)(AX*1)
	VMOVUPS Y4, 128(DI)(AX*1)
	VMOVUPS Y5, 160(DI)(AX*1)
	VMOVUPS Y6, 192(DI)(AX*1)
	VMOVUPS Y7, 224(DI)(AX*1)
	ADDQ $256, AX
	JMP chunk64
chunk8:
	CMPQ AX, CX
	JGE done
	VMOVUPS (DI)(AX*1), Y0
	VXORPS Y1, Y1, Y1
	MOVQ SI, R11
	MOVQ DX, R12
	MOVQ R9, R13
rows8:
	VBROADCASTSS (R12), Y8
	VFMADD231PS (R11)(AX*1), Y8, Y0
	ADDQ $4, R12
	ADDQ R8, R11
	DECQ R13
	JNZ rows8
	VMOVUPS Y0, (DI)(AX*1)
	ADDQ $32, AX
	JMP chunk8
done:
	VZEROUPPER
	RET

// func cvtBF16AVX2(dst *float32, src *uint16, n8 int)
// dst[i] = float32(src[i]) for i < n8, a multiple of 8.
TEXT ·cvtBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n8+16(FP), CX
	XORQ AX, AX
loop:
	CMPQ AX, CX
	JGE done
	VPMOVZXWD (SI)(AX*2), Y0
	VPSLLD $16, Y0, Y0
	VMOVUPS Y0, (DI)(AX*4)
	ADDQ $8, AX
	JMP loop
done:
	VZEROUPPER
	RET

// func cvtF16AVX2(dst *float32, src *uint16, n8 int)
// dst[i] = float32(src[i]) for i < n8, a multiple of 8.
TEXT ·cvtF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n8+16(FP), CX
	XORQ AX, AX
loop:
	CMPQ AX, CX
	JGE done
	VCVTPH2PS (SI)(AX*2), Y0
	VMOVUPS Y0, (DI)(AX*4)
	ADDQ $8, AX
	JMP loop
done:
	VZEROUPPER
	RET

// func sumF32AVX2(p *float32, n32 int) float32
// Σ p[i] for i < n32, a multiple of 32; used to measure read bandwidth.
TEXT ·sumF32AVX2(SB), NOSPLIT, $0-20
	MOVQ p+0(FP), SI
	MOVQ n32+8(FP), CX
	SHLQ $2, CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	XORQ AX, AX
loop:
	CMPQ AX, CX
	JGE done
	VADDPS (SI)(AX*1), Y0, Y0
	VADDPS 32(SI)(AX*1), Y1, Y1
	VADDPS 64(SI)(AX*1), Y2, Y2
	VADDPS 96(SI)(AX*1), Y3, Y3
	ADDQ $128, AX
	JMP loop
done:
	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
	VMOVSS X0, ret+16(FP)
	VZEROUPPER
	RET

// func accumBF16AVX2(acc *float32, v *uint16, vstride int, p *float32, rows int, hd8 int)
// acc[c] += Σ_r p[r]*float32(v[r*vstride+c]) for c < hd8; rows > 0, hd8 a multiple of 8.
TEXT ·accumBF16AVX2(SB), NOSPLIT, $0-48
	MOVQ acc+0(FP), DI
	MOVQ v+8(FP), SI
	MOVQ vstride+16(FP), R8
	SHLQ $1, R8
	MOVQ p+24(FP), DX
	MOVQ rows+32(FP), R9
	MOVQ hd8+40(FP), CX
	XORQ AX, AX
chunk64:
	LEAQ 64(AX), BX
	CMPQ BX, CX
	JGT chunk8
	VMOVUPS 0(DI)(AX*4), Y0
	VMOVUPS 32(DI)(AX*4), Y1
	VMOVUPS 64(DI)(AX*4), Y2
	VMOVUPS 96(DI)(AX*4), Y3
	VMOVUPS 128(DI)(AX*4), Y4
	VMOVUPS 160(DI)(AX*4), Y5
	VMOVUPS 192(DI)(AX*4), Y6
	VMOVUPS 224(DI)(AX*4), Y7
	MOVQ SI, R11
	MOVQ DX, R12
	MOVQ R9, R13
rows64:
	VBROADCASTSS (R12), Y8
	VPMOVZXWD 0(R11)(AX*2), Y9
	VPSLLD $16, Y9, Y9
	VFMADD231PS Y9, Y8, Y0
	VPMOVZXWD 16(R11)(AX*2), Y10
	VPSLLD $16, Y10, Y10
	VFMADD231PS Y10, Y8, Y1
	VPMOVZXWD 32(R11)(AX*2), Y11
	VPSLLD $16, Y11, Y11
	VFMADD231PS Y11, Y8, Y2
	VPMOVZXWD 48(R11)(AX*2), Y12
	VPSLLD $16, Y12, Y12
	VFMADD231PS Y12, Y8, Y3
	VPMOVZXWD 64(R11)(AX*2), Y9
	VPSLLD $16, Y9, Y9
	VFMADD231PS Y9, Y8, Y4
	VPMOVZXWD 80(R11)(AX*2), Y10
	VPSLLD $16, Y10, Y10
	VFMADD231PS Y10, Y8, Y5
	VPMOVZXWD 96(R11)(AX*2), Y11
	VPSLLD $16, Y11, Y11
	VFMADD231PS Y11, Y8, Y6
	VPMOVZXWD 112(R11)(AX*2), Y12
	VPSLLD $16, Y12, Y12
	VFMADD231PS Y12, Y8, Y7
	ADDQ $4, R12
	ADDQ R8, R11
	DECQ R13
	JNZ rows64
	VMOVUPS Y0, 0(DI)(AX*4)
	VMOVUPS Y1, 32(DI)(AX*4)
	VMOVUPS Y2, 64(DI)(AX*4)
	VMOVUPS Y3, 96(DI)(AX*4)
	VMOVUPS Y4, 128(DI)(AX*4)
	VMOVUPS Y5, 160(DI)(AX*4)
	VMOVUPS Y6, 192(DI)(AX*4)
	VMOVUPS Y7, 224(DI)(AX*4)
	ADDQ $64, AX
	JMP chunk64
chunk8:
	CMPQ AX, CX
	JGE done
	VMOVUPS (DI)(AX*4), Y0
	MOVQ SI, R11
	MOVQ DX, R12
	MOVQ R9, R13
rows8:
	VBROADCASTSS (R12), Y8
	VPMOVZXWD (R11)(AX*2), Y9
	VPSLLD $16, Y9, Y9
	VFMADD231PS Y9, Y8, Y0
	ADDQ $4, R12
	ADDQ R8, R11
	DECQ R13
	JNZ rows8
	VMOVUPS Y0, (DI)(AX*4)
	ADDQ $8, AX
	JMP chunk8
done:
	VZEROUPPER
	RET

// func accumF16AVX2(acc *float32, v *uint16, vstride int, p *float32, rows int, hd8 int)
// acc[c] += Σ_r p[r]*float32(v[r*vstride+c]) for c < hd8; rows > 0, hd8 a multiple of 8.
TEXT ·accumF16AVX2(SB), NOSPLIT, $0-48
	MOVQ acc+0(FP), DI
	MOVQ v+8(FP), SI
	MOVQ vstride+16(FP), R8
	SHLQ $1, R8
	MOVQ p+24(FP), DX
	MOVQ rows+32(FP), R9
	MOVQ hd8+40(FP), CX
	XORQ AX, AX
chunk64:
	LEAQ 64(AX), BX
	CMPQ BX, CX
	JGT chunk8
	VMOVUPS 0(DI)(AX*4), Y0
	VMOVUPS 32(DI)(AX*4), Y1
	VMOVUPS 64(DI)(AX*4), Y2
	VMOVUPS 96(DI)(AX*4), Y3
	VMOVUPS 128(DI)(AX*4), Y4
	VMOVUPS 160(DI)(AX*4), Y5
	VMOVUPS 192(DI)(AX*4), Y6
	VMOVUPS 224(DI)(AX*4), Y7
	MOVQ SI, R11
	MOVQ DX, R12
	MOVQ R9, R13
rows64:
	VBROADCASTSS (R12), Y8
	VCVTPH2PS 0(R11)(AX*2), Y9
	VFMADD231PS Y9, Y8, Y0
	VCVTPH2PS 16(R11)(AX*2), Y10
	VFMADD231PS Y10, Y8, Y1
	VCVTPH2PS 32(R11)(AX*2), Y11
	VFMADD231PS Y11, Y8, Y2
	VCVTPH2PS 48(R11)(AX*2), Y12
	VFMADD231PS Y12, Y8, Y3
	VCVTPH2PS 64(R11)(AX*2), Y9
	VFMADD231PS Y9, Y8, Y4
	VCVTPH2PS 80(R11)(AX*2), Y10
	VFMADD231PS Y10, Y8, Y5
	VCVTPH2PS 96(R11)(AX*2), Y11
	VFMADD231PS Y11, Y8, Y6
	VCVTPH2PS 112(R11)(AX*2), Y12
	VFMADD231PS Y12, Y8, Y7
	ADDQ $4, R12
	ADDQ R8, R11
	DECQ R13
	JNZ rows64
	VMOVUPS Y0, 0(DI)(AX*4)
	VMOVUPS Y1, 32(DI)(AX*4)
	VMOVUPS Y2, 64(DI)(AX*4)
	VMOVUPS Y3, 96(DI)(AX*4)
	VMOVUPS Y4, 128(DI)(AX*4)
	VMOVUPS Y5, 160(DI)(AX*4)
	VMOVUPS Y6, 192(DI)(AX*4)
	VMOVUPS Y7, 224(DI)(AX*4)
	ADDQ $64, AX
	JMP chunk64
chunk8:
	CMPQ AX, CX
	JGE done
	VMOVUPS (DI)(AX*4), Y0
	MOVQ SI, R11
	MOVQ DX, R12
	MOVQ R9, R13
rows8:
	VBROADCASTSS (R12), Y8
	VCVTPH2PS (R11)(AX*2), Y9
	VFMADD231PS Y9, Y8, Y0
	ADDQ $4, R12
	ADDQ R8, R11
	DECQ R13
	JNZ rows8
	VMOVUPS Y0, (DI)(AX*4)
	ADDQ $8, AX
	JMP chunk8
done:
	VZEROUPPER
	RET

// Constants of the exponential, each repeated in eight lanes: log2(e), ln2 split
// in a high and a low part, the Cephes expf polynomial, 0.5, 1, the clamp
// bounds -87.33654 and 88, and the exponent bias 127.
DATA expc<>+0(SB)/4, $0x3fb8aa3b
DATA expc<>+4(SB)/4, $0x3fb8aa3b
DATA expc<>+8(SB)/4, $0x3fb8aa3b
DATA expc<>+12(SB)/4, $0x3fb8aa3b
DATA expc<>+16(SB)/4, $0x3fb8aa3b
DATA expc<>+20(SB)/4, $0x3fb8aa3b
DATA expc<>+24(SB)/4, $0x3fb8aa3b
DATA expc<>+28(SB)/4, $0x3fb8aa3b
DATA expc<>+32(SB)/4, $0x3f318000
DATA expc<>+36(SB)/4, $0x3f318000
DATA expc<>+40(SB)/4, $0x3f318000
DATA expc<>+44(SB)/4, $0x3f318000
DATA expc<>+48(SB)/4, $0x3f318000
DATA expc<>+52(SB)/4, $0x3f318000
DATA expc<>+56(SB)/4, $0x3f318000
DATA expc<>+60(SB)/4, $0x3f318000
DATA expc<>+64(SB)/4, $0xb95e8083
DATA expc<>+68(SB)/4, $0xb95e8083
DATA expc<>+72(SB)/4, $0xb95e8083
DATA expc<>+76(SB)/4, $0xb95e8083
DATA expc<>+80(SB)/4, $0xb95e8083
DATA expc<>+84(SB)/4, $0xb95e8083
DATA expc<>+88(SB)/4, $0xb95e8083
DATA expc<>+92(SB)/4, $0xb95e8083
DATA expc<>+96(SB)/4, $0x3950696f
DATA expc<>+100(SB)/4, $0x3950696f
DATA expc<>+104(SB)/4, $0x3950696f
DATA expc<>+108(SB)/4, $0x3950696f
DATA expc<>+112(SB)/4, $0x3950696f
DATA expc<>+116(SB)/4, $0x3950696f
DATA expc<>+120(SB)/4, $0x3950696f
DATA expc<>+124(SB)/4, $0x3950696f
DATA expc<>+128(SB)/4, $0x3ab743ce
DATA expc<>+132(SB)/4, $0x3ab743ce
DATA expc<>+136(SB)/4, $0x3ab743ce
DATA expc<>+140(SB)/4, $0x3ab743ce
DATA expc<>+144(SB)/4, $0x3ab743ce
DATA expc<>+148(SB)/4, $0x3ab743ce
DATA expc<>+152(SB)/4, $0x3ab743ce
DATA expc<>+156(SB)/4, $0x3ab743ce
DATA expc<>+160(SB)/4, $0x3c088908
DATA expc<>+164(SB)/4, $0x3c088908
DATA expc<>+168(SB)/4, $0x3c088908
DATA expc<>+172(SB)/4, $0x3c088908
DATA expc<>+176(SB)/4, $0x3c088908
DATA expc<>+180(SB)/4, $0x3c088908
DATA expc<>+184(SB)/4, $0x3c088908
DATA expc<>+188(SB)/4, $0x3c088908
DATA expc<>+192(SB)/4, $0x3d2aa9c1
DATA expc<>+196(SB)/4, $0x3d2aa9c1
DATA expc<>+200(SB)/4, $0x3d2aa9c1
DATA expc<>+204(SB)/4, $0x3d2aa9c1
DATA expc<>+208(SB)/4, $0x3d2aa9c1
DATA expc<>+212(SB)/4, $0x3d2aa9c1
DATA expc<>+216(SB)/4, $0x3d2aa9c1
DATA expc<>+220(SB)/4, $0x3d2aa9c1
DATA expc<>+224(SB)/4, $0x3e2aaaaa
DATA expc<>+228(SB)/4, $0x3e2aaaaa
DATA expc<>+232(SB)/4, $0x3e2aaaaa
DATA expc<>+236(SB)/4, $0x3e2aaaaa
DATA expc<>+240(SB)/4, $0x3e2aaaaa
DATA expc<>+244(SB)/4, $0x3e2aaaaa
DATA expc<>+248(SB)/4, $0x3e2aaaaa
DATA expc<>+252(SB)/4, $0x3e2aaaaa
DATA expc<>+256(SB)/4, $0x3f000000
DATA expc<>+260(SB)/4, $0x3f000000
DATA expc<>+264(SB)/4, $0x3f000000
DATA expc<>+268(SB)/4, $0x3f000000
DATA expc<>+272(SB)/4, $0x3f000000
DATA expc<>+276(SB)/4, $0x3f000000
DATA expc<>+280(SB)/4, $0x3f000000
DATA expc<>+284(SB)/4, $0x3f000000
DATA expc<>+288(SB)/4, $0x3f800000
DATA expc<>+292(SB)/4, $0x3f800000
DATA expc<>+296(SB)/4, $0x3f800000
DATA expc<>+300(SB)/4, $0x3f800000
DATA expc<>+304(SB)/4, $0x3f800000
DATA expc<>+308(SB)/4, $0x3f800000
DATA expc<>+312(SB)/4, $0x3f800000
DATA expc<>+316(SB)/4, $0x3f800000
DATA expc<>+320(SB)/4, $0xc2aeac50
DATA expc<>+324(SB)/4, $0xc2aeac50
DATA expc<>+328(SB)/4, $0xc2aeac50
DATA expc<>+332(SB)/4, $0xc2aeac50
DATA expc<>+336(SB)/4, $0xc2aeac50
DATA expc<>+340(SB)/4, $0xc2aeac50
DATA expc<>+344(SB)/4, $0xc2aeac50
DATA expc<>+348(SB)/4, $0xc2aeac50
DATA expc<>+352(SB)/4, $0x42b00000
DATA expc<>+356(SB)/4, $0x42b00000
DATA expc<>+360(SB)/4, $0x42b00000
DATA expc<>+364(SB)/4, $0x42b00000
DATA expc<>+368(SB)/4, $0x42b00000
DATA expc<>+372(SB)/4, $0x42b00000
DATA expc<>+376(SB)/4, $0x42b00000
DATA expc<>+380(SB)/4, $0x42b00000
DATA expc<>+384(SB)/4, $0x0000007f
DATA expc<>+388(SB)/4, $0x0000007f
DATA expc<>+392(SB)/4, $0x0000007f
DATA expc<>+396(SB)/4, $0x0000007f
DATA expc<>+400(SB)/4, $0x0000007f
DATA expc<>+404(SB)/4, $0x0000007f
DATA expc<>+408(SB)/4, $0x0000007f
DATA expc<>+412(SB)/4, $0x0000007f
GLOBL expc<>(SB), RODATA|NOPTR, $416

// func expShiftAVX2(s *float32, n8 int, m float32) float32
// s[i] = exp(s[i]-m) for i < n8 (a multiple of 8); returns their sum.
// Arguments are clamped to [-87.33654, 88].
TEXT ·expShiftAVX2(SB), NOSPLIT, $0-28
	MOVQ s+0(FP), DI
	MOVQ n8+8(FP), CX
	VBROADCASTSS m+16(FP), Y4
	VXORPS Y5, Y5, Y5
	XORQ AX, AX
loop:
	CMPQ AX, CX
	JGE done
	VMOVUPS (DI)(AX*4), Y0
	VSUBPS Y4, Y0, Y0
	VMAXPS expc<>+320(SB), Y0, Y0
	VMINPS expc<>+352(SB), Y0, Y0
	VMOVUPS expc<>+0(SB), Y1
	VFMADD213PS expc<>+256(SB), Y0, Y1
	VROUNDPS $1, Y1, Y1
	VFNMADD231PS expc<>+32(SB), Y1, Y0
	VFNMADD231PS expc<>+64(SB), Y1, Y0
	VCVTTPS2DQ Y1, Y1
	VPADDD expc<>+384(SB), Y1, Y1
	VPSLLD $23, Y1, Y1
	VMOVUPS expc<>+96(SB), Y2
	VFMADD213PS expc<>+128(SB), Y0, Y2
	VFMADD213PS expc<>+160(SB), Y0, Y2
	VFMADD213PS expc<>+192(SB), Y0, Y2
	VFMADD213PS expc<>+224(SB), Y0, Y2
	VFMADD213PS expc<>+256(SB), Y0, Y2
	VMULPS Y0, Y0, Y3
	VFMADD213PS Y0, Y3, Y2
	VADDPS expc<>+288(SB), Y2, Y2
	VMULPS Y1, Y2, Y0
	VADDPS Y0, Y5, Y5
	VMOVUPS Y0, (DI)(AX*4)
	ADDQ $8, AX
	JMP loop
done:
	VEXTRACTF128 $1, Y5, X1
	VADDPS X1, X5, X5
	VHADDPS X5, X5, X5
	VHADDPS X5, X5, X5
	VMOVSS X5, ret+24(FP)
	VZEROUPPER
	RET

// func siluMulAVX2(out, gate, up *float32, n8 int)
// out[i] = silu(gate[i]) * up[i] for i < n8 (a multiple of 8).
TEXT ·siluMulAVX2(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ gate+8(FP), SI
	MOVQ up+16(FP), DX
	MOVQ n8+24(FP), CX
	XORQ AX, AX
	VXORPS Y6, Y6, Y6
loop:
	CMPQ AX, CX
	JGE done
	VMOVUPS (SI)(AX*4), Y4
	VMOVUPS (DX)(AX*4), Y5
	VSUBPS Y4, Y6, Y0
	VMAXPS expc<>+320(SB), Y0, Y0
	VMINPS expc<>+352(SB), Y0, Y0
	VMOVUPS expc<>+0(SB), Y1
	VFMADD213PS expc<>+256(SB), Y0, Y1
	VROUNDPS $1, Y1, Y1
	VFNMADD231PS expc<>+32(SB), Y1, Y0
	VFNMADD231PS expc<>+64(SB), Y1, Y0
	VCVTTPS2DQ Y1, Y1
	VPADDD expc<>+384(SB), Y1, Y1
	VPSLLD $23, Y1, Y1
	VMOVUPS expc<>+96(SB), Y2
	VFMADD213PS expc<>+128(SB), Y0, Y2
	VFMADD213PS expc<>+160(SB), Y0, Y2
	VFMADD213PS expc<>+192(SB), Y0, Y2
	VFMADD213PS expc<>+224(SB), Y0, Y2
	VFMADD213PS expc<>+256(SB), Y0, Y2
	VMULPS Y0, Y0, Y3
	VFMADD213PS Y0, Y3, Y2
	VADDPS expc<>+288(SB), Y2, Y2
	VMULPS Y1, Y2, Y0
	VADDPS expc<>+288(SB), Y0, Y0
	VMULPS Y5, Y4, Y4
	VDIVPS Y0, Y4, Y4
	VMOVUPS Y4, (DI)(AX*4)
	ADDQ $8, AX
	JMP loop
done:
	VZEROUPPER
	RET

// func dots3BF16AVX2(s *float32, sstride int, q *float32, qstride int, k *uint16, kstride int, nk4 int, hd8 int)
// s[i*sstride+j] = q[i*qstride : +hd8] · k[j*kstride : +hd8] for i < 3, j < nk4;
// nk4 is a positive multiple of 4 and hd8 of 8. Each key row is widened once
// for the three queries.
TEXT ·dots3BF16AVX2(SB), NOSPLIT, $0-64
	MOVQ s+0(FP), DI
	MOVQ q+16(FP), SI
	MOVQ qstride+24(FP), AX
	SHLQ $2, AX
	LEAQ (SI)(AX*1), R11
	LEAQ (SI)(AX*2), R12
	MOVQ k+32(FP), DX
	MOVQ kstride+40(FP), R10
	SHLQ $1, R10
	LEAQ (DX)(R10*1), R8
	LEAQ (DX)(R10*2), R9
	LEAQ (R8)(R10*2), R13
	MOVQ nk4+48(FP), CX
	MOVQ hd8+56(FP), BX
	SHLQ $1, BX
group:
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	XORQ AX, AX
inner:
	VMOVUPS (SI)(AX*2), Y12
	VMOVUPS (R11)(AX*2), Y13
	VMOVUPS (R12)(AX*2), Y14
	VPMOVZXWD (DX)(AX*1), Y15
	VPSLLD $16, Y15, Y15
	VFMADD231PS Y15, Y12, Y0
	VFMADD231PS Y15, Y13, Y4
	VFMADD231PS Y15, Y14, Y8
	VPMOVZXWD (R8)(AX*1), Y15
	VPSLLD $16, Y15, Y15
	VFMADD231PS Y15, Y12, Y1
	VFMADD231PS Y15, Y13, Y5
	VFMADD231PS Y15, Y14, Y9
	VPMOVZXWD (R9)(AX*1), Y15
	VPSLLD $16, Y15, Y15
	VFMADD231PS Y15, Y12, Y2
	VFMADD231PS Y15, Y13, Y6
	VFMADD231PS Y15, Y14, Y10
	VPMOVZXWD (R13)(AX*1), Y15
	VPSLLD $16, Y15, Y15
	VFMADD231PS Y15, Y12, Y3
	VFMADD231PS Y15, Y13, Y7
	VFMADD231PS Y15, Y14, Y11
	ADDQ $16, AX
	CMPQ AX, BX
	JLT inner
	VHADDPS Y1, Y0, Y0
	VHADDPS Y3, Y2, Y2
	VHADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X12
	VADDPS X12, X0, X0
	VHADDPS Y5, Y4, Y4
	VHADDPS Y7, Y6, Y6
	VHADDPS Y6, Y4, Y4
	VEXTRACTF128 $1, Y4, X13
	VADDPS X13, X4, X4
	VHADDPS Y9, Y8, Y8
	VHADDPS Y11, Y10, Y10
	VHADDPS Y10, Y8, Y8
	VEXTRACTF128 $1, Y8, X14
	VADDPS X14, X8, X8
	MOVQ sstride+8(FP), AX
	SHLQ $2, AX
	VMOVUPS X0, (DI)
	VMOVUPS X4, (DI)(AX*1)
	VMOVUPS X8, (DI)(AX*2)
	ADDQ $16, DI
	LEAQ (DX)(R10*4), DX
	LEAQ (R8)(R10*4), R8
	LEAQ (R9)(R10*4), R9
	LEAQ (R13)(R10*4), R13
	SUBQ $4, CX
	JNZ group
	VZEROUPPER
	RET

// func dots3F32AVX2(s *float32, sstride int, q *float32, qstride int, k *float32, kstride int, nk4 int, hd8 int)
// dots3BF16AVX2 for float32 keys.
TEXT ·dots3F32AVX2(SB), NOSPLIT, $0-64
	MOVQ s+0(FP), DI
	MOVQ q+16(FP), SI
	MOVQ qstride+24(FP), AX
	SHLQ $2, AX
	LEAQ (SI)(AX*1), R11
	LEAQ (SI)(AX*2), R12
	MOVQ k+32(FP), DX
	MOVQ kstride+40(FP), R10
	SHLQ $2, R10
	LEAQ (DX)(R10*1), R8
	LEAQ (DX)(R10*2), R9
	LEAQ (R8)(R10*2), R13
	MOVQ nk4+48(FP), CX
	MOVQ hd8+56(FP), BX
	SHLQ $2, BX
group:
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	XORQ AX, AX
inner:
	VMOVUPS (SI)(AX*1), Y12
	VMOVUPS (R11)(AX*1), Y13
	VMOVUPS (R12)(AX*1), Y14
	VMOVUPS (DX)(AX*1), Y15
	VFMADD231PS Y15, Y12, Y0
	VFMADD231PS Y15, Y13, Y4
	VFMADD231PS Y15, Y14, Y8
	VMOVUPS (R8)(AX*1), Y15
	VFMADD231PS Y15, Y12, Y1
	VFMADD231PS Y15, Y13, Y5
	VFMADD231PS Y15, Y14, Y9
	VMOVUPS (R9)(AX*1), Y15
	VFMADD231PS Y15, Y12, Y2
	VFMADD231PS Y15, Y13, Y6
	VFMADD231PS Y15, Y14, Y10
	VMOVUPS (R13)(AX*1), Y15
	VFMADD231PS Y15, Y12, Y3
	VFMADD231PS Y15, Y13, Y7
	VFMADD231PS Y15, Y14, Y11
	ADDQ $32, AX
	CMPQ AX, BX
	JLT inner
	VHADDPS Y1, Y0, Y0
	VHADDPS Y3, Y2, Y2
	VHADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X12
	VADDPS X12, X0, X0
	VHADDPS Y5, Y4, Y4
	VHADDPS Y7, Y6, Y6
	VHADDPS Y6, Y4, Y4
	VEXTRACTF128 $1, Y4, X13
	VADDPS X13, X4, X4
	VHADDPS Y9, Y8, Y8
	VHADDPS Y11, Y10, Y10
	VHADDPS Y10, Y8, Y8
	VEXTRACTF128 $1, Y8, X14
	VADDPS X14, X8, X8
	MOVQ sstride+8(FP), AX
	SHLQ $2, AX
	VMOVUPS X0, (DI)
	VMOVUPS X4, (DI)(AX*1)
	VMOVUPS X8, (DI)(AX*2)
	ADDQ $16, DI
	LEAQ (DX)(R10*4), DX
	LEAQ (R8)(R10*4), R8
	LEAQ (R9)(R10*4), R9
	LEAQ (R13)(R10*4), R13
	SUBQ $4, CX
	JNZ group
	VZEROUPPER
	RET

// func accum2BF16AVX2(acc *float32, astride int, v *uint16, vstride int, p *float32, pstride int, rows int, hd8 int)
// acc[a*astride+c] += Σ_r p[a*pstride+r]*float32(v[r*vstride+c]) for a < 2,
// c < hd8; rows > 0, hd8 a multiple of 8. Each value row is widened once
// for the two accumulators.
TEXT ·accum2BF16AVX2(SB), NOSPLIT, $0-64
	MOVQ acc+0(FP), DI
	MOVQ astride+8(FP), AX
	LEAQ (DI)(AX*4), R10
	MOVQ v+16(FP), SI
	MOVQ vstride+24(FP), R8
	SHLQ $1, R8
	MOVQ p+32(FP), DX
	MOVQ pstride+40(FP), AX
	LEAQ (DX)(AX*4), R9
	MOVQ hd8+56(FP), CX
	XORQ AX, AX
chunk32:
	LEAQ 32(AX), BX
	CMPQ BX, CX
	JGT chunk8
	VMOVUPS 0(DI)(AX*4), Y0
	VMOVUPS 32(DI)(AX*4), Y1
	VMOVUPS 64(DI)(AX*4), Y2
	VMOVUPS 96(DI)(AX*4), Y3
	VMOVUPS 0(R10)(AX*4), Y4
	VMOVUPS 32(R10)(AX*4), Y5
	VMOVUPS 64(R10)(AX*4), Y6
	VMOVUPS 96(R10)(AX*4), Y7
	MOVQ SI, R11
	XORQ R12, R12
	MOVQ rows+48(FP), R13
rows32:
	VBROADCASTSS (DX)(R12*1), Y8
	VBROADCASTSS (R9)(R12*1), Y9
	VPMOVZXWD 0(R11)(AX*2), Y10
	VPSLLD $16, Y10, Y10
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y10, Y9, Y4
	VPMOVZXWD 16(R11)(AX*2), Y11
	VPSLLD $16, Y11, Y11
	VFMADD231PS Y11, Y8, Y1
	VFMADD231PS Y11, Y9, Y5
	VPMOVZXWD 32(R11)(AX*2), Y12
	VPSLLD $16, Y12, Y12
	VFMADD231PS Y12, Y8, Y2
	VFMADD231PS Y12, Y9, Y6
	VPMOVZXWD 48(R11)(AX*2), Y13
	VPSLLD $16, Y13, Y13
	VFMADD231PS Y13, Y8, Y3
	VFMADD231PS Y13, Y9, Y7
	ADDQ $4, R12
	ADDQ R8, R11
	DECQ R13
	JNZ rows32
	VMOVUPS Y0, 0(DI)(AX*4)
	VMOVUPS Y1, 32(DI)(AX*4)
	VMOVUPS Y2, 64(DI)(AX*4)
	VMOVUPS Y3, 96(DI)(AX*4)
	VMOVUPS Y4, 0(R10)(AX*4)
	VMOVUPS Y5, 32(R10)(AX*4)
	VMOVUPS Y6, 64(R10)(AX*4)
	VMOVUPS Y7, 96(R10)(AX*4)
	ADDQ $32, AX
	JMP chunk32
chunk8:
	CMPQ AX, CX
	JGE done
	VMOVUPS (DI)(AX*4), Y0
	VMOVUPS (R10)(AX*4), Y4
	MOVQ SI, R11
	XORQ R12, R12
	MOVQ rows+48(FP), R13
rows8:
	VBROADCASTSS (DX)(R12*1), Y8
	VBROADCASTSS (R9)(R12*1), Y9
	VPMOVZXWD (R11)(AX*2), Y10
	VPSLLD $16, Y10, Y10
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y10, Y9, Y4
	ADDQ $4, R12
	ADDQ R8, R11
	DECQ R13
	JNZ rows8
	VMOVUPS Y0, (DI)(AX*4)
	VMOVUPS Y4, (R10)(AX*4)
	ADDQ $8, AX
	JMP chunk8
done:
	VZEROUPPER
	RET

// func accum2F32AVX2(acc *float32, astride int, v *float32, vstride int, p *float32, pstride int, rows int, hd8 int)
// accum2BF16AVX2 for float32 values.
TEXT ·accum2F32AVX2(SB), NOSPLIT, $0-64
	MOVQ acc+0(FP), DI
	MOVQ astride+8(FP), AX
	LEAQ (DI)(AX*4), R10
	MOVQ v+16(FP), SI
	MOVQ vstride+24(FP), R8
	SHLQ $2, R8
	MOVQ p+32(FP), DX
	MOVQ pstride+40(FP), AX
	LEAQ (DX)(AX*4), R9
	MOVQ hd8+56(FP), CX
	XORQ AX, AX
chunk32:
	LEAQ 32(AX), BX
	CMPQ BX, CX
	JGT chunk8
	VMOVUPS 0(DI)(AX*4), Y0
	VMOVUPS 32(DI)(AX*4), Y1
	VMOVUPS 64(DI)(AX*4), Y2
	VMOVUPS 96(DI)(AX*4), Y3
	VMOVUPS 0(R10)(AX*4), Y4
	VMOVUPS 32(R10)(AX*4), Y5
	VMOVUPS 64(R10)(AX*4), Y6
	VMOVUPS 96(R10)(AX*4), Y7
	MOVQ SI, R11
	XORQ R12, R12
	MOVQ rows+48(FP), R13
rows32:
	VBROADCASTSS (DX)(R12*1), Y8
	VBROADCASTSS (R9)(R12*1), Y9
	VMOVUPS 0(R11)(AX*4), Y10
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y10, Y9, Y4
	VMOVUPS 32(R11)(AX*4), Y11
	VFMADD231PS Y11, Y8, Y1
	VFMADD231PS Y11, Y9, Y5
	VMOVUPS 64(R11)(AX*4), Y12
	VFMADD231PS Y12, Y8, Y2
	VFMADD231PS Y12, Y9, Y6
	VMOVUPS 96(R11)(AX*4), Y13
	VFMADD231PS Y13, Y8, Y3
	VFMADD231PS Y13, Y9, Y7
	ADDQ $4, R12
	ADDQ R8, R11
	DECQ R13
	JNZ rows32
	VMOVUPS Y0, 0(DI)(AX*4)
	VMOVUPS Y1, 32(DI)(AX*4)
	VMOVUPS Y2, 64(DI)(AX*4)
	VMOVUPS Y3, 96(DI)(AX*4)
	VMOVUPS Y4, 0(R10)(AX*4)
	VMOVUPS Y5, 32(R10)(AX*4)
	VMOVUPS Y6, 64(R10)(AX*4)
	VMOVUPS Y7, 96(R10)(AX*4)
	ADDQ $32, AX
	JMP chunk32
chunk8:
	CMPQ AX, CX
	JGE done
	VMOVUPS (DI)(AX*4), Y0
	VMOVUPS (R10)(AX*4), Y4
	MOVQ SI, R11
	XORQ R12, R12
	MOVQ rows+48(FP), R13
rows8:
	VBROADCASTSS (DX)(R12*1), Y8
	VBROADCASTSS (R9)(R12*1), Y9
	VMOVUPS (R11)(AX*4), Y10
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y10, Y9, Y4
	ADDQ $4, R12
	ADDQ R8, R11
	DECQ R13
	JNZ rows8
	VMOVUPS Y0, (DI)(AX*4)
	VMOVUPS Y4, (R10)(AX*4)
	ADDQ $8, AX
	JMP chunk8
done:
	VZEROUPPER
	RET

// func maxF32AVX2(s *float32, n8 int) float32
// max(s[i]) for i < n8, a positive multiple of 8.
TEXT ·maxF32AVX2(SB), NOSPLIT, $0-20
	MOVQ s+0(FP), SI
	MOVQ n8+8(FP), CX
	SHLQ $2, CX
	VMOVUPS (SI), Y0
	VMOVAPS Y0, Y1
	MOVQ $32, AX
loop16:
	LEAQ 32(AX), BX
	CMPQ BX, CX
	JGT loop8
	VMAXPS (SI)(AX*1), Y0, Y0
	VMAXPS 32(SI)(AX*1), Y1, Y1
	ADDQ $64, AX
	JMP loop16
loop8:
	CMPQ AX, CX
	JGE done
	VMAXPS (SI)(AX*1), Y0, Y0
done:
	VMAXPS Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VMAXPS X1, X0, X0
	VPERMILPS $0x4e, X0, X1
	VMAXPS X1, X0, X0
	VPERMILPS $0xb1, X0, X1
	VMAXPS X1, X0, X0
	VMOVSS X0, ret+16(FP)
	VZEROUPPER
	RET

// func cvtBF16RowsAVX2(dst *float32, src *uint16, sstride int, rows int, n8 int)
// dst[r*n8+i] = float32(src[r*sstride+i]) for r < rows, i < n8; rows > 0,
// n8 a positive multiple of 8.
TEXT ·cvtBF16RowsAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ sstride+16(FP), R8
	SHLQ $1, R8
	MOVQ rows+24(FP), R9
	MOVQ n8+32(FP), CX
row:
	XORQ AX, AX
loop:
	VPMOVZXWD (SI)(AX*2), Y0
	VPSLLD $16, Y0, Y0
	VMOVUPS Y0, (DI)(AX*4)
	ADDQ $8, AX
	CMPQ AX, CX
	JLT loop
	LEAQ (DI)(CX*4), DI
	ADDQ R8, SI
	DECQ R9
	JNZ row
	VZEROUPPER
	RET

// Blocked attention kernels. A unit of work holds 24 query lanes; scores
// and probabilities are kept key-major, [key][24 lanes], so that the
// softmax runs down columns with whole vectors and the value sums broadcast
// six lanes' probabilities at a time.

// func flashScoresAVX2(s *float32, k *float32, kstride int, nk int, qt *float32, hd int, scale float32)
// s[j*24+i] = scale * Σ_{d<hd} k[j*kstride+d] * qt[d*24+i] for j < nk,
// i < 24: four keys against the 24 lanes per step (12 accumulators), then
// single keys.
TEXT ·flashScoresAVX2(SB), NOSPLIT, $0-52
	MOVQ s+0(FP), DI
	MOVQ k+8(FP), SI
	MOVQ kstride+16(FP), R8
	SHLQ $2, R8
	MOVQ nk+24(FP), CX
	MOVQ qt+32(FP), DX
	MOVQ hd+40(FP), BX
	LEAQ (R8)(R8*2), R9
quad:
	CMPQ CX, $4
	JLT single
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	MOVQ DX, R10
	MOVQ SI, R11
	MOVQ BX, R12
qd:
	VMOVUPS (R10), Y12
	VMOVUPS 32(R10), Y13
	VMOVUPS 64(R10), Y14
	VBROADCASTSS (R11), Y15
	VFMADD231PS Y12, Y15, Y0
	VFMADD231PS Y13, Y15, Y1
	VFMADD231PS Y14, Y15, Y2
	VBROADCASTSS (R11)(R8*1), Y15
	VFMADD231PS Y12, Y15, Y3
	VFMADD231PS Y13, Y15, Y4
	VFMADD231PS Y14, Y15, Y5
	VBROADCASTSS (R11)(R8*2), Y15
	VFMADD231PS Y12, Y15, Y6
	VFMADD231PS Y13, Y15, Y7
	VFMADD231PS Y14, Y15, Y8
	VBROADCASTSS (R11)(R9*1), Y15
	VFMADD231PS Y12, Y15, Y9
	VFMADD231PS Y13, Y15, Y10
	VFMADD231PS Y14, Y15, Y11
	ADDQ $96, R10
	ADDQ $4, R11
	DECQ R12
	JNZ qd
	VBROADCASTSS scale+48(FP), Y12
	VMULPS Y12, Y0, Y0
	VMULPS Y12, Y1, Y1
	VMULPS Y12, Y2, Y2
	VMULPS Y12, Y3, Y3
	VMULPS Y12, Y4, Y4
	VMULPS Y12, Y5, Y5
	VMULPS Y12, Y6, Y6
	VMULPS Y12, Y7, Y7
	VMULPS Y12, Y8, Y8
	VMULPS Y12, Y9, Y9
	VMULPS Y12, Y10, Y10
	VMULPS Y12, Y11, Y11
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	VMOVUPS Y4, 128(DI)
	VMOVUPS Y5, 160(DI)
	VMOVUPS Y6, 192(DI)
	VMOVUPS Y7, 224(DI)
	VMOVUPS Y8, 256(DI)
	VMOVUPS Y9, 288(DI)
	VMOVUPS Y10, 320(DI)
	VMOVUPS Y11, 352(DI)
	ADDQ $384, DI
	LEAQ (SI)(R8*4), SI
	SUBQ $4, CX
	JMP quad
single:
	TESTQ CX, CX
	JZ sdone
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	MOVQ DX, R10
	MOVQ SI, R11
	MOVQ BX, R12
sd:
	VBROADCASTSS (R11), Y15
	VFMADD231PS 0(R10), Y15, Y0
	VFMADD231PS 32(R10), Y15, Y1
	VFMADD231PS 64(R10), Y15, Y2
	ADDQ $96, R10
	ADDQ $4, R11
	DECQ R12
	JNZ sd
	VBROADCASTSS scale+48(FP), Y12
	VMULPS Y12, Y0, Y0
	VMULPS Y12, Y1, Y1
	VMULPS Y12, Y2, Y2
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	ADDQ $96, DI
	ADDQ R8, SI
	DECQ CX
	JMP single
sdone:
	VZEROUPPER
	RET

// EXPY0 sets Y0 = exp(Y0) lane by lane (the algorithm of expShiftAVX2);
// it clobbers Y1-Y3.
#define EXPY0 \
	VMAXPS expc<>+320(SB), Y0, Y0; \
	VMINPS expc<>+352(SB), Y0, Y0; \
	VMOVUPS expc<>+0(SB), Y1; \
	VFMADD213PS expc<>+256(SB), Y0, Y1; \
	VROUNDPS $1, Y1, Y1; \
	VFNMADD231PS expc<>+32(SB), Y1, Y0; \
	VFNMADD231PS expc<>+64(SB), Y1, Y0; \
	VCVTTPS2DQ Y1, Y1; \
	VPADDD expc<>+384(SB), Y1, Y1; \
	VPSLLD $23, Y1, Y1; \
	VMOVUPS expc<>+96(SB), Y2; \
	VFMADD213PS expc<>+128(SB), Y0, Y2; \
	VFMADD213PS expc<>+160(SB), Y0, Y2; \
	VFMADD213PS expc<>+192(SB), Y0, Y2; \
	VFMADD213PS expc<>+224(SB), Y0, Y2; \
	VFMADD213PS expc<>+256(SB), Y0, Y2; \
	VMULPS Y0, Y0, Y3; \
	VFMADD213PS Y0, Y3, Y2; \
	VADDPS expc<>+288(SB), Y2, Y2; \
	VMULPS Y1, Y2, Y0

// func flashSoftmaxAVX2(s *float32, nk int, m, l, f *float32)
// One step of the online softmax over nk > 0 rows of 24 lanes, a column of
// eight lanes at a time: mn = max(m, max_j s[j]); f = exp(m-mn);
// s[j] = exp(s[j]-mn); l = l*f + Σ_j s[j]; m = mn.
TEXT ·flashSoftmaxAVX2(SB), NOSPLIT, $0-40
	MOVQ s+0(FP), DI
	MOVQ nk+8(FP), CX
	MOVQ m+16(FP), R8
	MOVQ l+24(FP), R9
	MOVQ f+32(FP), R10
	XORQ BX, BX
col:
	VMOVUPS (R8)(BX*1), Y4
	VMOVAPS Y4, Y5
	LEAQ (DI)(BX*1), SI
	MOVQ CX, AX
colmax:
	VMAXPS (SI), Y5, Y5
	ADDQ $96, SI
	DECQ AX
	JNZ colmax
	VSUBPS Y5, Y4, Y0
	EXPY0
	VMOVUPS Y0, (R10)(BX*1)
	VMULPS (R9)(BX*1), Y0, Y6
	VMOVUPS Y5, (R8)(BX*1)
	LEAQ (DI)(BX*1), SI
	MOVQ CX, AX
colexp:
	VMOVUPS (SI), Y0
	VSUBPS Y5, Y0, Y0
	EXPY0
	VADDPS Y0, Y6, Y6
	VMOVUPS Y0, (SI)
	ADDQ $96, SI
	DECQ AX
	JNZ colexp
	VMOVUPS Y6, (R9)(BX*1)
	ADDQ $32, BX
	CMPQ BX, $96
	JLT col
	VZEROUPPER
	RET

// func flashPVAVX2(o *float32, p *float32, nk int, v *float32, vstride int, f *float32, hd16 int)
// o holds 24 lanes × 16*hd16 dims as tiles of 6 lanes × 16 dims, 96
// floats each, lane group-major: tile (g, c) starts at (g*hd16+c)*96. Each
// tile is scaled by its lanes' f and then gains Σ_j p[j*24+6g+r] *
// v[j*vstride+16c : +16] for j < nk (12 accumulators per tile).
TEXT ·flashPVAVX2(SB), NOSPLIT, $0-56
	MOVQ o+0(FP), DI
	MOVQ p+8(FP), SI
	MOVQ nk+16(FP), CX
	MOVQ vstride+32(FP), R8
	SHLQ $2, R8
	MOVQ f+40(FP), R9
	MOVQ $4, R11
group:
	MOVQ v+24(FP), DX
	MOVQ hd16+48(FP), R12
tile:
	VBROADCASTSS 0(R9), Y14
	VMULPS 0(DI), Y14, Y0
	VMULPS 32(DI), Y14, Y1
	VBROADCASTSS 4(R9), Y14
	VMULPS 64(DI), Y14, Y2
	VMULPS 96(DI), Y14, Y3
	VBROADCASTSS 8(R9), Y14
	VMULPS 128(DI), Y14, Y4
	VMULPS 160(DI), Y14, Y5
	VBROADCASTSS 12(R9), Y14
	VMULPS 192(DI), Y14, Y6
	VMULPS 224(DI), Y14, Y7
	VBROADCASTSS 16(R9), Y14
	VMULPS 256(DI), Y14, Y8
	VMULPS 288(DI), Y14, Y9
	VBROADCASTSS 20(R9), Y14
	VMULPS 320(DI), Y14, Y10
	VMULPS 352(DI), Y14, Y11
	MOVQ SI, AX
	MOVQ DX, BX
	MOVQ CX, R13
	TESTQ R13, R13
	JZ tstore
keys:
	VMOVUPS 0(BX), Y12
	VMOVUPS 32(BX), Y13
	VBROADCASTSS 0(AX), Y14
	VFMADD231PS Y12, Y14, Y0
	VFMADD231PS Y13, Y14, Y1
	VBROADCASTSS 4(AX), Y14
	VFMADD231PS Y12, Y14, Y2
	VFMADD231PS Y13, Y14, Y3
	VBROADCASTSS 8(AX), Y14
	VFMADD231PS Y12, Y14, Y4
	VFMADD231PS Y13, Y14, Y5
	VBROADCASTSS 12(AX), Y14
	VFMADD231PS Y12, Y14, Y6
	VFMADD231PS Y13, Y14, Y7
	VBROADCASTSS 16(AX), Y14
	VFMADD231PS Y12, Y14, Y8
	VFMADD231PS Y13, Y14, Y9
	VBROADCASTSS 20(AX), Y14
	VFMADD231PS Y12, Y14, Y10
	VFMADD231PS Y13, Y14, Y11
	ADDQ $96, AX
	ADDQ R8, BX
	DECQ R13
	JNZ keys
tstore:
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	VMOVUPS Y4, 128(DI)
	VMOVUPS Y5, 160(DI)
	VMOVUPS Y6, 192(DI)
	VMOVUPS Y7, 224(DI)
	VMOVUPS Y8, 256(DI)
	VMOVUPS Y9, 288(DI)
	VMOVUPS Y10, 320(DI)
	VMOVUPS Y11, 352(DI)
	ADDQ $384, DI
	ADDQ $64, DX
	DECQ R12
	JNZ tile
	ADDQ $24, SI
	ADDQ $24, R9
	DECQ R11
	JNZ group
	VZEROUPPER
	RET

// func gemm6x16AVX2(out *float32, ostride int, x *float32, xstride int, wp *float32, k int, n16 int, add int)
// out[i*ostride+16*s+j] (+)= Σ_{c<k} x[i*xstride+c] * wp[(s*k+c)*16+j] for
// i < 6, j < 16, s < n16 (k, n16 > 0), adding to out where add is not
// zero: six rows of x against n16 strips of 16 packed weight rows (each
// strip k-major), 12 accumulators, no horizontal sums.
TEXT ·gemm6x16AVX2(SB), NOSPLIT, $0-64
	MOVQ out+0(FP), DI
	MOVQ ostride+8(FP), BX
	SHLQ $2, BX
	MOVQ x+16(FP), SI
	MOVQ xstride+24(FP), R8
	SHLQ $2, R8
	MOVQ wp+32(FP), DX
	MOVQ k+40(FP), CX
	MOVQ n16+48(FP), R13
	LEAQ (R8)(R8*2), R10
	LEAQ (BX)(BX*2), R9
strip:
	CMPQ add+56(FP), $0
	JNE load
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	JMP sums
load:
	VMOVUPS (DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS (DI)(BX*1), Y2
	VMOVUPS 32(DI)(BX*1), Y3
	VMOVUPS (DI)(BX*2), Y4
	VMOVUPS 32(DI)(BX*2), Y5
	LEAQ (DI)(R9*1), R11
	VMOVUPS (R11), Y6
	VMOVUPS 32(R11), Y7
	VMOVUPS (R11)(BX*1), Y8
	VMOVUPS 32(R11)(BX*1), Y9
	VMOVUPS (R11)(BX*2), Y10
	VMOVUPS 32(R11)(BX*2), Y11
sums:
	MOVQ SI, R11
	LEAQ (SI)(R10*1), R12
	MOVQ CX, AX
	SHRQ $1, AX
	JZ depth1
depth2:
	VMOVUPS (DX), Y12
	VMOVUPS 32(DX), Y13
	VBROADCASTSS (R11), Y14
	VFMADD231PS Y12, Y14, Y0
	VFMADD231PS Y13, Y14, Y1
	VBROADCASTSS (R11)(R8*1), Y15
	VFMADD231PS Y12, Y15, Y2
	VFMADD231PS Y13, Y15, Y3
	VBROADCASTSS (R11)(R8*2), Y14
	VFMADD231PS Y12, Y14, Y4
	VFMADD231PS Y13, Y14, Y5
	VBROADCASTSS (R12), Y15
	VFMADD231PS Y12, Y15, Y6
	VFMADD231PS Y13, Y15, Y7
	VBROADCASTSS (R12)(R8*1), Y14
	VFMADD231PS Y12, Y14, Y8
	VFMADD231PS Y13, Y14, Y9
	VBROADCASTSS (R12)(R8*2), Y15
	VFMADD231PS Y12, Y15, Y10
	VFMADD231PS Y13, Y15, Y11
	VMOVUPS 64(DX), Y12
	VMOVUPS 96(DX), Y13
	VBROADCASTSS 4(R11), Y14
	VFMADD231PS Y12, Y14, Y0
	VFMADD231PS Y13, Y14, Y1
	VBROADCASTSS 4(R11)(R8*1), Y15
	VFMADD231PS Y12, Y15, Y2
	VFMADD231PS Y13, Y15, Y3
	VBROADCASTSS 4(R11)(R8*2), Y14
	VFMADD231PS Y12, Y14, Y4
	VFMADD231PS Y13, Y14, Y5
	VBROADCASTSS 4(R12), Y15
	VFMADD231PS Y12, Y15, Y6
	VFMADD231PS Y13, Y15, Y7
	VBROADCASTSS 4(R12)(R8*1), Y14
	VFMADD231PS Y12, Y14, Y8
	VFMADD231PS Y13, Y14, Y9
	VBROADCASTSS 4(R12)(R8*2), Y15
	VFMADD231PS Y12, Y15, Y10
	VFMADD231PS Y13, Y15, Y11
	ADDQ $128, DX
	ADDQ $8, R11
	ADDQ $8, R12
	DECQ AX
	JNZ depth2
depth1:
	TESTQ $1, CX
	JZ stored
	VMOVUPS (DX), Y12
	VMOVUPS 32(DX), Y13
	VBROADCASTSS (R11), Y14
	VFMADD231PS Y12, Y14, Y0
	VFMADD231PS Y13, Y14, Y1
	VBROADCASTSS (R11)(R8*1), Y15
	VFMADD231PS Y12, Y15, Y2
	VFMADD231PS Y13, Y15, Y3
	VBROADCASTSS (R11)(R8*2), Y14
	VFMADD231PS Y12, Y14, Y4
	VFMADD231PS Y13, Y14, Y5
	VBROADCASTSS (R12), Y15
	VFMADD231PS Y12, Y15, Y6
	VFMADD231PS Y13, Y15, Y7
	VBROADCASTSS (R12)(R8*1), Y14
	VFMADD231PS Y12, Y14, Y8
	VFMADD231PS Y13, Y14, Y9
	VBROADCASTSS (R12)(R8*2), Y15
	VFMADD231PS Y12, Y15, Y10
	VFMADD231PS Y13, Y15, Y11
	ADDQ $64, DX
stored:
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, (DI)(BX*1)
	VMOVUPS Y3, 32(DI)(BX*1)
	VMOVUPS Y4, (DI)(BX*2)
	VMOVUPS Y5, 32(DI)(BX*2)
	LEAQ (DI)(R9*1), R11
	VMOVUPS Y6, (R11)
	VMOVUPS Y7, 32(R11)
	VMOVUPS Y8, (R11)(BX*1)
	VMOVUPS Y9, 32(R11)(BX*1)
	VMOVUPS Y10, (R11)(BX*2)
	VMOVUPS Y11, 32(R11)(BX*2)
	ADDQ $64, DI
	DECQ R13
	JNZ strip
	VZEROUPPER
	RET

// func packTAVX2(dst *float32, dstride int, src *float32, sstride int, k8 int, groups int)
// dst[c*dstride+j] = src[j*sstride+c] for j < 8*groups, c < k8 (k8 a
// positive multiple of 8, groups > 0): rows transposed into columns, an
// 8x8 block at a time.
TEXT ·packTAVX2(SB), NOSPLIT, $0-48
	MOVQ dstride+8(FP), R13
	SHLQ $2, R13
	LEAQ (R13)(R13*2), BX
	MOVQ sstride+24(FP), R9
	SHLQ $2, R9
	MOVQ groups+40(FP), R12
	MOVQ src+16(FP), R8
	MOVQ dst+0(FP), DI
group:
	LEAQ (R8)(R9*2), R10
	ADDQ R9, R10
	LEAQ (R10)(R9*2), R11
	ADDQ R9, R11
	MOVQ DI, DX
	MOVQ R8, SI
	MOVQ k8+32(FP), CX
block:
	VMOVUPS (SI), Y0
	VMOVUPS (SI)(R9*1), Y1
	VMOVUPS (SI)(R9*2), Y2
	VMOVUPS (R10), Y3
	VMOVUPS (R10)(R9*1), Y4
	VMOVUPS (R10)(R9*2), Y5
	VMOVUPS (R11), Y6
	VMOVUPS (R11)(R9*1), Y7
	VUNPCKLPS Y1, Y0, Y8
	VUNPCKHPS Y1, Y0, Y9
	VUNPCKLPS Y3, Y2, Y10
	VUNPCKHPS Y3, Y2, Y11
	VUNPCKLPS Y5, Y4, Y12
	VUNPCKHPS Y5, Y4, Y13
	VUNPCKLPS Y7, Y6, Y14
	VUNPCKHPS Y7, Y6, Y15
	VSHUFPS $0x44, Y10, Y8, Y0
	VSHUFPS $0xEE, Y10, Y8, Y1
	VSHUFPS $0x44, Y11, Y9, Y2
	VSHUFPS $0xEE, Y11, Y9, Y3
	VSHUFPS $0x44, Y14, Y12, Y4
	VSHUFPS $0xEE, Y14, Y12, Y5
	VSHUFPS $0x44, Y15, Y13, Y6
	VSHUFPS $0xEE, Y15, Y13, Y7
	VPERM2F128 $0x20, Y4, Y0, Y8
	VPERM2F128 $0x20, Y5, Y1, Y9
	VPERM2F128 $0x20, Y6, Y2, Y10
	VPERM2F128 $0x20, Y7, Y3, Y11
	VPERM2F128 $0x31, Y4, Y0, Y12
	VPERM2F128 $0x31, Y5, Y1, Y13
	VPERM2F128 $0x31, Y6, Y2, Y14
	VPERM2F128 $0x31, Y7, Y3, Y15
	LEAQ (DX)(R13*4), AX
	VMOVUPS Y8, (DX)
	VMOVUPS Y9, (DX)(R13*1)
	VMOVUPS Y10, (DX)(R13*2)
	VMOVUPS Y11, (DX)(BX*1)
	VMOVUPS Y12, (AX)
	VMOVUPS Y13, (AX)(R13*1)
	VMOVUPS Y14, (AX)(R13*2)
	VMOVUPS Y15, (AX)(BX*1)
	LEAQ (AX)(R13*4), DX
	ADDQ $32, SI
	ADDQ $32, R10
	ADDQ $32, R11
	SUBQ $8, CX
	JNZ block
	LEAQ (R8)(R9*8), R8
	ADDQ $32, DI
	DECQ R12
	JNZ group
	VZEROUPPER
	RET

// func sumSqF32AVX2(p *float32, n8 int) float32
// Σ p[i]² for i < n8 (a multiple of 8): four accumulators over 32
// elements a step, then eight at a time.
TEXT ·sumSqF32AVX2(SB), NOSPLIT, $0-20
	MOVQ p+0(FP), SI
	MOVQ n8+8(FP), CX
	SHLQ $2, CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	XORQ AX, AX
sq32:
	LEAQ 128(AX), BX
	CMPQ BX, CX
	JGT sq8
	VMOVUPS (SI)(AX*1), Y4
	VFMADD231PS Y4, Y4, Y0
	VMOVUPS 32(SI)(AX*1), Y5
	VFMADD231PS Y5, Y5, Y1
	VMOVUPS 64(SI)(AX*1), Y6
	VFMADD231PS Y6, Y6, Y2
	VMOVUPS 96(SI)(AX*1), Y7
	VFMADD231PS Y7, Y7, Y3
	MOVQ BX, AX
	JMP sq32
sq8:
	CMPQ AX, CX
	JGE sqdone
	VMOVUPS (SI)(AX*1), Y4
	VFMADD231PS Y4, Y4, Y0
	ADDQ $32, AX
	JMP sq8
sqdone:
	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
	VMOVSS X0, ret+16(FP)
	VZEROUPPER
	RET

// func scaleMulAVX2(o, x, w *float32, s float32, n8 int)
// o[i] = x[i] * s * w[i] for i < n8 (a multiple of 8).
TEXT ·scaleMulAVX2(SB), NOSPLIT, $0-40
	MOVQ o+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), DX
	VBROADCASTSS s+24(FP), Y3
	MOVQ n8+32(FP), CX
	SHLQ $2, CX
	XORQ AX, AX
sm:
	CMPQ AX, CX
	JGE smdone
	VMULPS (SI)(AX*1), Y3, Y0
	VMULPS (DX)(AX*1), Y0, Y0
	VMOVUPS Y0, (DI)(AX*1)
	ADDQ $32, AX
	JMP sm
smdone:
	VZEROUPPER
	RET

// func addF32AVX2(o, x, y *float32, n8 int)
// o[i] = x[i] + y[i] for i < n8 (a multiple of 8).
TEXT ·addF32AVX2(SB), NOSPLIT, $0-32
	MOVQ o+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ y+16(FP), DX
	MOVQ n8+24(FP), CX
	SHLQ $2, CX
	XORQ AX, AX
add:
	CMPQ AX, CX
	JGE adddone
	VMOVUPS (SI)(AX*1), Y0
	VADDPS (DX)(AX*1), Y0, Y0
	VMOVUPS Y0, (DI)(AX*1)
	ADDQ $32, AX
	JMP add
adddone:
	VZEROUPPER
	RET

// func rotateAVX2(lo, hi, cos, sin *float32, n8 int)
// (lo[i], hi[i]) = (lo[i]*cos[i] - hi[i]*sin[i], hi[i]*cos[i] + lo[i]*sin[i])
// for i < n8 (a multiple of 8).
TEXT ·rotateAVX2(SB), NOSPLIT, $0-40
	MOVQ lo+0(FP), DI
	MOVQ hi+8(FP), SI
	MOVQ cos+16(FP), DX
	MOVQ sin+24(FP), R8
	MOVQ n8+32(FP), CX
	SHLQ $2, CX
	XORQ AX, AX
rot:
	CMPQ AX, CX
	JGE rotdone
	VMOVUPS (DI)(AX*1), Y0
	VMOVUPS (SI)(AX*1), Y1
	VMOVUPS (DX)(AX*1), Y2
	VMOVUPS (R8)(AX*1), Y3
	VMULPS Y2, Y0, Y4
	VFNMADD231PS Y3, Y1, Y4
	VMULPS Y2, Y1, Y5
	VFMADD231PS Y3, Y0, Y5
	VMOVUPS Y4, (DI)(AX*1)
	VMOVUPS Y5, (SI)(AX*1)
	ADDQ $32, AX
	JMP rot
rotdone:
	VZEROUPPER
	RET
