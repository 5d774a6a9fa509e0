// Package code12 holds a bf16 matrix in 12 bits a value, losslessly, for
// products that stream their weights once a token (batch-1 decode).
//
// A bf16 value is a high byte (sign and the exponent's upper seven bits)
// and a low byte (the exponent's last bit and seven bits of mantissa). The
// weights of a trained or randomly initialised layer use few high bytes:
// their exponents cluster within a few powers of two of the largest. The
// code keeps every low byte and replaces the high byte by four bits, a
// sign and an index into a window of eight consecutive exponent buckets
// chosen for the matrix. The values the window misses (the smallest, zeros,
// outliers) are escapes: coded as 0 and listed in their row's entries, so
// that a product adds their true value back (see Matrix).
//
// A row of k values (k a multiple of 512) is k/512 chunks of 768 bytes:
// the chunk's 512 low bytes, then 256 bytes of codes. Lane l (0 to 31) of
// the warp that reads a chunk owns its values 16l to 16l+15: low bytes at
// 16l, codes at 512+8l, where byte j (0 to 3) of the first code word holds
// the code of value 16l+j in its low nibble and of value 16l+j+4 in its
// high nibble, and the second word likewise values 16l+8 to 16l+15.
// kernels/cuda/gemv.cu decodes it.
package code12
