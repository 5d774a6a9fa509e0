//go:build amd64 && !purego

#include "textflag.h"

// The AVX-512 kernels: the products whose 512-bit versions are faster than
// the AVX2 ones of kernels_amd64.s, whose macros for 8-element loads
// (LO_*) these repeat for the 8-element tails.

#define LO_BF16(b, r) VPMOVZXWD (b)(AX*2), r; VPSLLD $16, r, r
#define LO_F16(b, r) VCVTPH2PS (b)(AX*2), r
#define LO_F32(b, r) VMOVUPS (b)(AX*4), r

// ZLO_* and ZHI_* load 16 weights, widened to f32, into a 512-bit
// register: the first and second halves of a 32-element step from AX.
#define ZLO_BF16(b, r) VPMOVZXWD (b)(AX*2), r; VPSLLD $16, r, r
#define ZHI_BF16(b, r) VPMOVZXWD 32(b)(AX*2), r; VPSLLD $16, r, r
#define ZLO_F16(b, r) VCVTPH2PS (b)(AX*2), r
#define ZHI_F16(b, r) VCVTPH2PS 32(b)(AX*2), r
#define ZLO_F32(b, r) VMOVUPS (b)(AX*4), r
#define ZHI_F32(b, r) VMOVUPS 64(b)(AX*4), r

// ZPF4_* and ZPF2_* prefetch the next group of rows as PF4_* and PF2_* do,
// for 32-element steps.
#define ZPF4_16 PREFETCHT0 (BX)(AX*8); PREFETCHT0 64(BX)(AX*8); PREFETCHT0 128(BX)(AX*8); PREFETCHT0 192(BX)(AX*8)
#define ZPF4_F32 PREFETCHT0 (BX); PREFETCHT0 64(BX); PREFETCHT0 128(BX); PREFETCHT0 192(BX); PREFETCHT0 256(BX); PREFETCHT0 320(BX); PREFETCHT0 384(BX); PREFETCHT0 448(BX); ADDQ $512, BX
#define ZPF2_16 PREFETCHT0 (BX)(AX*4); PREFETCHT0 64(BX)(AX*4)
#define ZPF2_F32 PREFETCHT0 (BX)(AX*8); PREFETCHT0 64(BX)(AX*8); PREFETCHT0 128(BX)(AX*8); PREFETCHT0 192(BX)(AX*8)

// ZERO_ACC clears the accumulators: Z0 .. Z7 and the tails' Y8 .. Y11.
#define ZERO_ACC VPXORD Z0, Z0, Z0; VPXORD Z1, Z1, Z1; VPXORD Z2, Z2, Z2; VPXORD Z3, Z3, Z3; VPXORD Z4, Z4, Z4; VPXORD Z5, Z5, Z5; VPXORD Z6, Z6, Z6; VPXORD Z7, Z7, Z7; VXORPS Y8, Y8, Y8; VXORPS Y9, Y9, Y9; VXORPS Y10, Y10, Y10; VXORPS Y11, Y11, Y11

// FOLD(z, hi, y, tail) folds a row's sums into the 8 lanes of y (z's
// lower half): z + hi (the second halves' sums), its upper 8 lanes onto
// its lower 8, then the tail's sums.
#define FOLD(z, hi, y, yt, tail) VADDPS hi, z, z; VEXTRACTF64X4 $1, z, yt; VADDPS yt, y, y; VADDPS tail, y, y

// ZGEMV4_BODY(ZLO, ZHI, LO, PF) is GEMV4_BODY on 512-bit registers, with
// its arguments in the same registers: four weight rows at a time, then
// one. A row's sums: two accumulators by 32-element steps (Z0..Z3 the
// first halves, Z4..Z7 the second), one 16-element step into the first,
// one 8-element step into its own (Y8..Y11), folded to 8 lanes (FOLD) and
// summed by GEMV4_BODY's horizontal trees.
#define ZGEMV4_BODY(ZLO, ZHI, LO, PF) \
	MOVQ R10, CX \
	ANDQ $-32, CX \
	MOVQ R10, R15 \
	ANDQ $-16, R15 \
zrows4: \
	CMPQ R9, $4 \
	JLT zrows1 \
	LEAQ (DX)(R8*1), R11 \
	LEAQ (DX)(R8*2), R12 \
	LEAQ (R11)(R8*2), R13 \
	LEAQ (DX)(R8*4), BX \
	ZERO_ACC \
	XORQ AX, AX \
zloop4x32: \
	CMPQ AX, CX \
	JGE zloop4x16 \
	PF \
	VMOVUPS (SI)(AX*4), Z12 \
	VMOVUPS 64(SI)(AX*4), Z13 \
	ZLO(DX, Z16) \
	VFMADD231PS Z16, Z12, Z0 \
	ZHI(DX, Z17) \
	VFMADD231PS Z17, Z13, Z4 \
	ZLO(R11, Z18) \
	VFMADD231PS Z18, Z12, Z1 \
	ZHI(R11, Z19) \
	VFMADD231PS Z19, Z13, Z5 \
	ZLO(R12, Z20) \
	VFMADD231PS Z20, Z12, Z2 \
	ZHI(R12, Z21) \
	VFMADD231PS Z21, Z13, Z6 \
	ZLO(R13, Z22) \
	VFMADD231PS Z22, Z12, Z3 \
	ZHI(R13, Z23) \
	VFMADD231PS Z23, Z13, Z7 \
	ADDQ $32, AX \
	JMP zloop4x32 \
zloop4x16: \
	CMPQ AX, R15 \
	JGE zloop4x8 \
	VMOVUPS (SI)(AX*4), Z12 \
	ZLO(DX, Z16) \
	VFMADD231PS Z16, Z12, Z0 \
	ZLO(R11, Z18) \
	VFMADD231PS Z18, Z12, Z1 \
	ZLO(R12, Z20) \
	VFMADD231PS Z20, Z12, Z2 \
	ZLO(R13, Z22) \
	VFMADD231PS Z22, Z12, Z3 \
	ADDQ $16, AX \
zloop4x8: \
	CMPQ AX, R10 \
	JGE zreduce4 \
	VMOVUPS (SI)(AX*4), Y12 \
	LO(DX, Y14) \
	VFMADD231PS Y14, Y12, Y8 \
	LO(R11, Y15) \
	VFMADD231PS Y15, Y12, Y9 \
	LO(R12, Y14) \
	VFMADD231PS Y14, Y12, Y10 \
	LO(R13, Y15) \
	VFMADD231PS Y15, Y12, Y11 \
	ADDQ $8, AX \
zreduce4: \
	FOLD(Z0, Z4, Y0, Y4, Y8) \
	FOLD(Z1, Z5, Y1, Y5, Y9) \
	FOLD(Z2, Z6, Y2, Y6, Y10) \
	FOLD(Z3, Z7, Y3, Y7, Y11) \
	VHADDPS Y1, Y0, Y0 \
	VHADDPS Y3, Y2, Y2 \
	VHADDPS Y2, Y0, Y0 \
	VEXTRACTF128 $1, Y0, X1 \
	VADDPS X1, X0, X0 \
	VMOVUPS X0, (DI) \
	ADDQ $16, DI \
	LEAQ (DX)(R8*4), DX \
	SUBQ $4, R9 \
	JMP zrows4 \
zrows1: \
	TESTQ R9, R9 \
	JEQ zdone \
	ZERO_ACC \
	XORQ AX, AX \
zloop1x32: \
	CMPQ AX, CX \
	JGE zloop1x16 \
	VMOVUPS (SI)(AX*4), Z12 \
	VMOVUPS 64(SI)(AX*4), Z13 \
	ZLO(DX, Z16) \
	VFMADD231PS Z16, Z12, Z0 \
	ZHI(DX, Z17) \
	VFMADD231PS Z17, Z13, Z4 \
	ADDQ $32, AX \
	JMP zloop1x32 \
zloop1x16: \
	CMPQ AX, R15 \
	JGE zloop1x8 \
	VMOVUPS (SI)(AX*4), Z12 \
	ZLO(DX, Z16) \
	VFMADD231PS Z16, Z12, Z0 \
	ADDQ $16, AX \
zloop1x8: \
	CMPQ AX, R10 \
	JGE zreduce1 \
	VMOVUPS (SI)(AX*4), Y12 \
	LO(DX, Y14) \
	VFMADD231PS Y14, Y12, Y8 \
	ADDQ $8, AX \
zreduce1: \
	FOLD(Z0, Z4, Y0, Y4, Y8) \
	VEXTRACTF128 $1, Y0, X1 \
	VADDPS X1, X0, X0 \
	VHADDPS X0, X0, X0 \
	VHADDPS X0, X0, X0 \
	VMOVSS X0, (DI) \
	ADDQ $4, DI \
	ADDQ R8, DX \
	DECQ R9 \
	JMP zrows1 \
zdone: \
	VZEROUPPER \
	RET

// ZGEMV2_BODY(ZLO, ZHI, LO, PF) is GEMV2_BODY on 512-bit registers: two
// rows of x against two weight rows at a time, each row's sums those of
// ZGEMV4_BODY (Z0/Z1 and Z2/Z3 rows of x0 and x1; Z4..Z7 their second
// halves; Y8..Y11 their tails).
#define ZGEMV2_BODY(ZLO, ZHI, LO, PF) \
	MOVQ R10, CX \
	ANDQ $-32, CX \
	MOVQ R10, R15 \
	ANDQ $-16, R15 \
zpairs2: \
	TESTQ R9, R9 \
	JEQ zdone2 \
	LEAQ (DX)(R8*1), R11 \
	LEAQ (DX)(R8*2), BX \
	ZERO_ACC \
	XORQ AX, AX \
zloop2x32: \
	CMPQ AX, CX \
	JGE zloop2x16 \
	PF \
	VMOVUPS (SI)(AX*4), Z12 \
	VMOVUPS 64(SI)(AX*4), Z13 \
	VMOVUPS (R12)(AX*4), Z14 \
	VMOVUPS 64(R12)(AX*4), Z15 \
	ZLO(DX, Z16) \
	ZHI(DX, Z17) \
	VFMADD231PS Z16, Z12, Z0 \
	VFMADD231PS Z17, Z13, Z4 \
	VFMADD231PS Z16, Z14, Z2 \
	VFMADD231PS Z17, Z15, Z6 \
	ZLO(R11, Z18) \
	ZHI(R11, Z19) \
	VFMADD231PS Z18, Z12, Z1 \
	VFMADD231PS Z19, Z13, Z5 \
	VFMADD231PS Z18, Z14, Z3 \
	VFMADD231PS Z19, Z15, Z7 \
	ADDQ $32, AX \
	JMP zloop2x32 \
zloop2x16: \
	CMPQ AX, R15 \
	JGE zloop2x8 \
	VMOVUPS (SI)(AX*4), Z12 \
	VMOVUPS (R12)(AX*4), Z14 \
	ZLO(DX, Z16) \
	VFMADD231PS Z16, Z12, Z0 \
	VFMADD231PS Z16, Z14, Z2 \
	ZLO(R11, Z18) \
	VFMADD231PS Z18, Z12, Z1 \
	VFMADD231PS Z18, Z14, Z3 \
	ADDQ $16, AX \
zloop2x8: \
	CMPQ AX, R10 \
	JGE zreduce2 \
	VMOVUPS (SI)(AX*4), Y12 \
	VMOVUPS (R12)(AX*4), Y13 \
	LO(DX, Y14) \
	VFMADD231PS Y14, Y12, Y8 \
	VFMADD231PS Y14, Y13, Y10 \
	LO(R11, Y15) \
	VFMADD231PS Y15, Y12, Y9 \
	VFMADD231PS Y15, Y13, Y11 \
	ADDQ $8, AX \
zreduce2: \
	FOLD(Z0, Z4, Y0, Y4, Y8) \
	FOLD(Z1, Z5, Y1, Y5, Y9) \
	FOLD(Z2, Z6, Y2, Y6, Y10) \
	FOLD(Z3, Z7, Y3, Y7, Y11) \
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
	JMP zpairs2 \
zdone2: \
	VZEROUPPER \
	RET

// func gemvF32AVX512(out *float32, x *float32, w *float32, stride int, rows int, k8 int)
// gemvF32AVX2's product on 512-bit registers.
TEXT ·gemvF32AVX512(SB), NOSPLIT, $0-48
	MOVQ out+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), DX
	MOVQ stride+24(FP), R8
	MOVQ rows+32(FP), R9
	MOVQ k8+40(FP), R10
	SHLQ $2, R8
	ZGEMV4_BODY(ZLO_F32, ZHI_F32, LO_F32, ZPF4_F32)

// func gemv2F32AVX512(out0, out1, x0, x1 *float32, w *float32, stride int, pairs int, k8 int)
// gemv2F32AVX2's product on 512-bit registers.
TEXT ·gemv2F32AVX512(SB), NOSPLIT, $0-64
	MOVQ out0+0(FP), DI
	MOVQ out1+8(FP), R14
	MOVQ x0+16(FP), SI
	MOVQ x1+24(FP), R12
	MOVQ w+32(FP), DX
	MOVQ stride+40(FP), R8
	MOVQ pairs+48(FP), R9
	MOVQ k8+56(FP), R10
	SHLQ $2, R8
	ZGEMV2_BODY(ZLO_F32, ZHI_F32, LO_F32, ZPF2_F32)

// func gemvBF16AVX512(out *float32, x *float32, w *uint16, stride int, rows int, k8 int)
// gemvBF16AVX2's product on 512-bit registers.
TEXT ·gemvBF16AVX512(SB), NOSPLIT, $0-48
	MOVQ out+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), DX
	MOVQ stride+24(FP), R8
	MOVQ rows+32(FP), R9
	MOVQ k8+40(FP), R10
	SHLQ $1, R8
	ZGEMV4_BODY(ZLO_BF16, ZHI_BF16, LO_BF16, ZPF4_16)

// func gemv2BF16AVX512(out0, out1, x0, x1 *float32, w *uint16, stride int, pairs int, k8 int)
// gemv2BF16AVX2's product on 512-bit registers.
TEXT ·gemv2BF16AVX512(SB), NOSPLIT, $0-64
	MOVQ out0+0(FP), DI
	MOVQ out1+8(FP), R14
	MOVQ x0+16(FP), SI
	MOVQ x1+24(FP), R12
	MOVQ w+32(FP), DX
	MOVQ stride+40(FP), R8
	MOVQ pairs+48(FP), R9
	MOVQ k8+56(FP), R10
	SHLQ $1, R8
	ZGEMV2_BODY(ZLO_BF16, ZHI_BF16, LO_BF16, ZPF2_16)

// func gemvF16AVX512(out *float32, x *float32, w *uint16, stride int, rows int, k8 int)
// gemvF16AVX2's product on 512-bit registers.
TEXT ·gemvF16AVX512(SB), NOSPLIT, $0-48
	MOVQ out+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), DX
	MOVQ stride+24(FP), R8
	MOVQ rows+32(FP), R9
	MOVQ k8+40(FP), R10
	SHLQ $1, R8
	ZGEMV4_BODY(ZLO_F16, ZHI_F16, LO_F16, ZPF4_16)

// func gemv2F16AVX512(out0, out1, x0, x1 *float32, w *uint16, stride int, pairs int, k8 int)
// gemv2F16AVX2's product on 512-bit registers.
TEXT ·gemv2F16AVX512(SB), NOSPLIT, $0-64
	MOVQ out0+0(FP), DI
	MOVQ out1+8(FP), R14
	MOVQ x0+16(FP), SI
	MOVQ x1+24(FP), R12
	MOVQ w+32(FP), DX
	MOVQ stride+40(FP), R8
	MOVQ pairs+48(FP), R9
	MOVQ k8+56(FP), R10
	SHLQ $1, R8
	ZGEMV2_BODY(ZLO_F16, ZHI_F16, LO_F16, ZPF2_16)

// func gemm6x16AVX512(out *float32, ostride int, x *float32, xstride int, wp *float32, k int, n16 int, add int)
// gemm6x16AVX2's product on 512-bit registers: strips of 16 weight rows
// are one register wide, so two strips go together (six rows by 32
// columns, 12 accumulators, enough to hide the FMA latency); an odd last
// strip goes alone.
TEXT ·gemm6x16AVX512(SB), NOSPLIT, $0-64
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
	MOVQ CX, R15
	SHLQ $6, R15
pair:
	CMPQ R13, $2
	JLT one
	LEAQ (DX)(R15*1), R14
	CMPQ add+56(FP), $0
	JNE pload
	VXORPS Z0, Z0, Z0
	VXORPS Z1, Z1, Z1
	VXORPS Z2, Z2, Z2
	VXORPS Z3, Z3, Z3
	VXORPS Z4, Z4, Z4
	VXORPS Z5, Z5, Z5
	VXORPS Z6, Z6, Z6
	VXORPS Z7, Z7, Z7
	VXORPS Z8, Z8, Z8
	VXORPS Z9, Z9, Z9
	VXORPS Z10, Z10, Z10
	VXORPS Z11, Z11, Z11
	JMP psums
pload:
	VMOVUPS (DI), Z0
	VMOVUPS 64(DI), Z1
	VMOVUPS (DI)(BX*1), Z2
	VMOVUPS 64(DI)(BX*1), Z3
	VMOVUPS (DI)(BX*2), Z4
	VMOVUPS 64(DI)(BX*2), Z5
	LEAQ (DI)(R9*1), R11
	VMOVUPS (R11), Z6
	VMOVUPS 64(R11), Z7
	VMOVUPS (R11)(BX*1), Z8
	VMOVUPS 64(R11)(BX*1), Z9
	VMOVUPS (R11)(BX*2), Z10
	VMOVUPS 64(R11)(BX*2), Z11
psums:
	MOVQ SI, R11
	LEAQ (SI)(R10*1), R12
	MOVQ CX, AX
pdepth:
	VMOVUPS (DX), Z12
	VMOVUPS (R14), Z13
	VBROADCASTSS (R11), Z14
	VBROADCASTSS (R11)(R8*1), Z15
	VBROADCASTSS (R11)(R8*2), Z16
	VBROADCASTSS (R12), Z17
	VBROADCASTSS (R12)(R8*1), Z18
	VBROADCASTSS (R12)(R8*2), Z19
	VFMADD231PS Z12, Z14, Z0
	VFMADD231PS Z13, Z14, Z1
	VFMADD231PS Z12, Z15, Z2
	VFMADD231PS Z13, Z15, Z3
	VFMADD231PS Z12, Z16, Z4
	VFMADD231PS Z13, Z16, Z5
	VFMADD231PS Z12, Z17, Z6
	VFMADD231PS Z13, Z17, Z7
	VFMADD231PS Z12, Z18, Z8
	VFMADD231PS Z13, Z18, Z9
	VFMADD231PS Z12, Z19, Z10
	VFMADD231PS Z13, Z19, Z11
	ADDQ $64, DX
	ADDQ $64, R14
	ADDQ $4, R11
	ADDQ $4, R12
	DECQ AX
	JNZ pdepth
	VMOVUPS Z0, (DI)
	VMOVUPS Z1, 64(DI)
	VMOVUPS Z2, (DI)(BX*1)
	VMOVUPS Z3, 64(DI)(BX*1)
	VMOVUPS Z4, (DI)(BX*2)
	VMOVUPS Z5, 64(DI)(BX*2)
	LEAQ (DI)(R9*1), R11
	VMOVUPS Z6, (R11)
	VMOVUPS Z7, 64(R11)
	VMOVUPS Z8, (R11)(BX*1)
	VMOVUPS Z9, 64(R11)(BX*1)
	VMOVUPS Z10, (R11)(BX*2)
	VMOVUPS Z11, 64(R11)(BX*2)
	ADDQ $128, DI
	MOVQ R14, DX
	SUBQ $2, R13
	JMP pair
one:
	TESTQ R13, R13
	JZ done
	CMPQ add+56(FP), $0
	JNE sload
	VXORPS Z0, Z0, Z0
	VXORPS Z2, Z2, Z2
	VXORPS Z4, Z4, Z4
	VXORPS Z6, Z6, Z6
	VXORPS Z8, Z8, Z8
	VXORPS Z10, Z10, Z10
	JMP ssums
sload:
	VMOVUPS (DI), Z0
	VMOVUPS (DI)(BX*1), Z2
	VMOVUPS (DI)(BX*2), Z4
	LEAQ (DI)(R9*1), R11
	VMOVUPS (R11), Z6
	VMOVUPS (R11)(BX*1), Z8
	VMOVUPS (R11)(BX*2), Z10
ssums:
	MOVQ SI, R11
	LEAQ (SI)(R10*1), R12
	MOVQ CX, AX
sdepth:
	VMOVUPS (DX), Z12
	VBROADCASTSS (R11), Z14
	VBROADCASTSS (R11)(R8*1), Z15
	VBROADCASTSS (R11)(R8*2), Z16
	VBROADCASTSS (R12), Z17
	VBROADCASTSS (R12)(R8*1), Z18
	VBROADCASTSS (R12)(R8*2), Z19
	VFMADD231PS Z12, Z14, Z0
	VFMADD231PS Z12, Z15, Z2
	VFMADD231PS Z12, Z16, Z4
	VFMADD231PS Z12, Z17, Z6
	VFMADD231PS Z12, Z18, Z8
	VFMADD231PS Z12, Z19, Z10
	ADDQ $64, DX
	ADDQ $4, R11
	ADDQ $4, R12
	DECQ AX
	JNZ sdepth
	VMOVUPS Z0, (DI)
	VMOVUPS Z2, (DI)(BX*1)
	VMOVUPS Z4, (DI)(BX*2)
	LEAQ (DI)(R9*1), R11
	VMOVUPS Z6, (R11)
	VMOVUPS Z8, (R11)(BX*1)
	VMOVUPS Z10, (R11)(BX*2)
done:
	VZEROUPPER
	RET
