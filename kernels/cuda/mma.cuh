// Tensor-core building blocks shared by the GEMM and the prefill attention:
// mma.sync m16n8k16 with f32 accumulators, ldmatrix, cp.async and a
// swizzle that keeps ldmatrix free of shared-memory bank conflicts.
#pragma once
#include "common.cuh"

// pack2 rounds two floats to the 16-bit type T and packs them (a low).
template <typename T> DEV uint32_t pack2(float a, float b);
template <> DEV uint32_t pack2<BF16>(float a, float b) { return (uint32_t)f2bf(a) | ((uint32_t)f2bf(b) << 16); }
template <> DEV uint32_t pack2<F16>(float a, float b) { return (uint32_t)f2h(a) | ((uint32_t)f2h(b) << 16); }

// mma16816: c[4] += a[4] · b[2] for one 16x8x16 tile (A row-major, B column-major).
template <typename T> DEV void mma16816(float* c, const uint32_t* a, const uint32_t* b);
template <> DEV void mma16816<BF16>(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> DEV void mma16816<F16>(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

DEV uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// ldsm4 loads four 8x8 matrices of 16-bit elements from shared memory at
// addr (a shared-space address); ldmatrix_x4 from a pointer.
DEV void ldsm4(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

DEV void ldmatrix_x4(uint32_t* r, const void* p) { ldsm4(r, smem_addr(p)); }

DEV void ldmatrix_x4_trans(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

// cp_async16 copies 16 bytes from global to shared memory; with ok false it
// reads nothing and writes zeros (src must still be a valid address).
DEV void cp_async16(void* dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(ok ? 16 : 0));
}
// cp_async16_hint is cp_async16 under the L2 cache policy pol.
DEV void cp_async16_hint(void* dst, const void* src, bool ok, uint64_t pol) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(smem_addr(dst)), "l"(src),
               "r"(ok ? 16 : 0), "l"(pol));
}
DEV void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> DEV void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

// swz is the 16-bit element offset of 16-byte chunk c of row r in a tile
// of rows of `chunks` chunks (4, 8 or 16): the chunk index is XORed with
// the row so that the 8 rows one ldmatrix reads land in distinct banks.
template <int CHUNKS> DEV int swz(int r, int c) {
  if constexpr (CHUNKS == 4) return r * 32 + ((c ^ ((r >> 1) & 3)) << 3);
  else return r * (CHUNKS * 8) + ((c ^ (r & 7)) << 3);
}

// mma_pipe is the k loop of a tile product through STAGES stages of shared
// memory from smem, each PM rows of A then the rows of B, 32 k a row
// (swz<4>): load(stage, tile) requests k tile `tile` (of kt) into stage
// `stage`, its copies in one commit group with the loop's. Warp (wm, wn)
// sums its TM × TN part of the tile, MI × NJ mma tiles, into acc, which
// starts at zero. It leaves no copies in flight.
template <typename T, int PM, int STAGE, int STAGES, int MI, int NJ, int TM, int TN, typename Load>
DEV void mma_pipe(float (&acc)[MI][NJ][4], const uint16_t* smem, int kt, Load load, int wm, int wn, int lane) {
#pragma unroll
  for (int i = 0; i < MI; i++)
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[i][j][e] = 0.f;
#pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    if (s < kt) load(s, s);
    cp_async_commit();
  }
  for (int it = 0; it < kt; it++) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    int nx = it + STAGES - 1;
    if (nx < kt) load(nx % STAGES, nx);
    cp_async_commit();
    const uint16_t* as = smem + (it % STAGES) * STAGE;
    const uint16_t* bs = as + PM * 32;
#pragma unroll
    for (int kk = 0; kk < 2; kk++) {
      uint32_t af[MI][4], bfr[NJ / 2][4];
#pragma unroll
      for (int i = 0; i < MI; i++) ldmatrix_x4(af[i], as + swz<4>(wm * TM + i * 16 + (lane & 15), kk * 2 + (lane >> 4)));
#pragma unroll
      for (int j = 0; j < NJ / 2; j++)
        ldmatrix_x4(bfr[j], bs + swz<4>(wn * TN + j * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1)));
#pragma unroll
      for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++) mma16816<T>(acc[i][j], af[i], &bfr[j >> 1][(j & 1) * 2]);
    }
  }
  cp_async_wait<0>();
}

// store_skinny stores a decode-batch product's sums (gemm_skinny,
// gemm_stream) of up to NT token tiles, ntn of them in use: acc[rs][t][e]
// is row row0 + g + 8(2rs + e/2), token t·8 + 2q + e%2 (g = lane / 4, q =
// lane % 4) of out (n rows of m, at split blockIdx.y), stored where the
// row is below m and the token below n.
template <int NT>
DEV void store_skinny(float* __restrict__ out, const float (&acc)[2][NT][4], int n, int m, int row0, int ntn) {
  const int g = (threadIdx.x & 31) >> 2, q = threadIdx.x & 3;
  float* o = out + (long)blockIdx.y * n * m + (long)(2 * q) * m + row0 + g;
#pragma unroll
  for (int t = 0; t < NT; t++, o += 8L * m) {
    if (t >= ntn) break;
#pragma unroll
    for (int e2 = 0; e2 < 2; e2++) {
      if (t * 8 + 2 * q + e2 >= n) continue;
#pragma unroll
      for (int i = 0; i < 4; i++)
        if (row0 + g + 8 * i < m) o[e2 * (long)m + 8 * i] = acc[i >> 1][t][(i & 1) * 2 + e2];
    }
  }
}
