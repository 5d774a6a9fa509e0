// Matrix-vector products for decode: out[b,j] = sum_i x[b,i] * w[j,i] with
// f32 x and out, f32/bf16/f16 w, f32 accumulation.
#include "common.cuh"

// gemv_bf16_fast: batch 1, k a multiple of 8 up to NV * KS * 256. A block
// is 8 warps; k is cut into units of 256 elements (the last may be short),
// unit u belonging to warp u % KS of a row's KS warps (split-K inside the
// block, combined through shared memory), at most NV units a warp. Each
// warp keeps its units of x in registers and walks R rows at a time with
// 16-byte streaming loads, so R*NV loads are in flight per lane. The grid
// strides over row groups; the first group's weights are requested before
// the kernel waits for x (pdl_begin). With SILU, x holds gate then up (2k
// elements) and the input is silu(gate) * up, formed as x is loaded (the
// down projection of a gated MLP).
template <int NV, int KS, int R, bool SILU = false>
DEV void gemv_bf16_fast(float* __restrict__ out, const float* __restrict__ x, const uint16_t* __restrict__ w, int k,
                        int m) {
  constexpr int GROUPS = 8 / KS;          // row groups per block
  constexpr int ROWS = GROUPS * R;        // rows per block iteration
  __shared__ float part[KS > 1 ? KS : 1][ROWS];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int ks = warp % KS, grp = warp / KS;
  // The lane's 8 elements of its warp's unit v start at off(v); with k % 8
  // == 0 they lie wholly inside k or wholly beyond it.
  auto off = [&](int v) { return (v * KS + ks) * 256 + lane * 8; };
  uint4 wv[R][NV];
  auto loadw = [&](int row0) {
#pragma unroll
    for (int r = 0; r < R; r++) {
      int row = min(row0 + r, m - 1);
      const uint16_t* wp = w + (long)row * k;
#pragma unroll
      for (int v = 0; v < NV; v++) wv[r][v] = off(v) < k ? ld_stream(wp + off(v)) : make_uint4(0, 0, 0, 0);
    }
  };
  // The first rows' weights are requested before waiting for x.
  int base = blockIdx.x * ROWS;
  if (base < m) loadw(base + grp * R);
  pdl_begin();
  float xv[NV][8];
#pragma unroll
  for (int v = 0; v < NV; v++) {
    if (off(v) >= k) {
#pragma unroll
      for (int j = 0; j < 8; j++) xv[v][j] = 0.f;
      continue;
    }
    const float4* xp = reinterpret_cast<const float4*>(x + off(v));
    float4 a = xp[0], b = xp[1];
    xv[v][0] = a.x; xv[v][1] = a.y; xv[v][2] = a.z; xv[v][3] = a.w;
    xv[v][4] = b.x; xv[v][5] = b.y; xv[v][6] = b.z; xv[v][7] = b.w;
    if (SILU) {
      const float4* up = reinterpret_cast<const float4*>(x + k + off(v));
      float4 c = up[0], e = up[1];
      float u[8] = {c.x, c.y, c.z, c.w, e.x, e.y, e.z, e.w};
#pragma unroll
      for (int j = 0; j < 8; j++) xv[v][j] = silu(xv[v][j]) * u[j];
    }
  }
  for (bool first = true; base < m; base += gridDim.x * ROWS, first = false) {
    int row0 = base + grp * R;
    if (!first) loadw(row0);
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
      float s = 0.f;
#pragma unroll
      for (int v = 0; v < NV; v++) {
        float f[8];
        unpack8<BF16>(wv[r][v], f);
#pragma unroll
        for (int e = 0; e < 8; e++) s = fmaf(f[e], xv[v][e], s);
      }
      acc[r] = warp_sum(s);
    }
    if (KS == 1) {
      if (lane < R) {
        float s = acc[0];
#pragma unroll
        for (int r = 1; r < R; r++)
          if (lane == r) s = acc[r];
        if (row0 + lane < m) out[row0 + lane] = s;
      }
    } else {
      if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; r++) part[ks][grp * R + r] = acc[r];
      }
      __syncthreads();
      if (threadIdx.x < ROWS && base + threadIdx.x < m) {
        float s = 0.f;
#pragma unroll
        for (int q = 0; q < KS; q++) s += part[q][threadIdx.x];
        out[base + threadIdx.x] = s;
      }
      __syncthreads();
    }
  }
}

#define FAST(NV, KS)                                                                                              \
  extern "C" __global__ void __launch_bounds__(256) gemv_bf16_nv##NV##_ks##KS(float* out, const float* x,        \
                                                                               const uint16_t* w, int k, int m) { \
    gemv_bf16_fast<NV, KS, 2>(out, x, w, k, m);                                                                   \
  }
FAST(1, 1) FAST(1, 2) FAST(1, 4) FAST(1, 8)
FAST(2, 1) FAST(2, 2) FAST(2, 4) FAST(2, 8)
FAST(4, 1) FAST(4, 2) FAST(4, 4) FAST(4, 8)
FAST(8, 1) FAST(8, 2) FAST(8, 4) FAST(8, 8)

#define SILUFAST(NV, KS)                                                                                          \
  extern "C" __global__ void __launch_bounds__(256)                                                             \
      gemv_silu_bf16_nv##NV##_ks##KS(float* out, const float* x, const uint16_t* w, int k, int m) {                \
    gemv_bf16_fast<NV, KS, 2, true>(out, x, w, k, m);                                                             \
  }
SILUFAST(1, 1) SILUFAST(1, 2) SILUFAST(1, 4) SILUFAST(1, 8)
SILUFAST(2, 1) SILUFAST(2, 2) SILUFAST(2, 4) SILUFAST(2, 8)
SILUFAST(4, 1) SILUFAST(4, 2) SILUFAST(4, 4) SILUFAST(4, 8)
SILUFAST(8, 1) SILUFAST(8, 2) SILUFAST(8, 4) SILUFAST(8, 8)

// gemv: any k, up to 8 rows of x; one warp per row of w, 8 rows per block.
// Uses 16-byte loads of w when rows stay 16-byte aligned.
template <typename T>
DEV void gemv(float* __restrict__ out, const float* __restrict__ x, const typename Elem<T>::raw* __restrict__ w, int n,
              int k, int m) {
  pdl_begin();
  constexpr int NB = 8;
  int lane = threadIdx.x & 31;
  int row = blockIdx.x * 8 + (threadIdx.x >> 5);
  if (row >= m) return;
  const typename Elem<T>::raw* wr = w + (long)row * k;
  float acc[NB];
#pragma unroll
  for (int b = 0; b < NB; b++) acc[b] = 0.f;
  constexpr int VEC = 16 / sizeof(typename Elem<T>::raw);
  int kv = (k % VEC == 0) ? k : 0;
  for (int i = lane * VEC; i < kv; i += 32 * VEC) {
    uint4 u = *reinterpret_cast<const uint4*>(wr + i);
    float f[8];
    if constexpr (VEC == 8) {
      unpack8<T>(u, f);
    } else {
      f[0] = __uint_as_float(u.x); f[1] = __uint_as_float(u.y); f[2] = __uint_as_float(u.z); f[3] = __uint_as_float(u.w);
    }
#pragma unroll
    for (int b = 0; b < NB; b++) {
      if (b < n) {
        const float* xb = x + (long)b * k + i;
#pragma unroll
        for (int e = 0; e < VEC; e++) acc[b] = fmaf(f[e], xb[e], acc[b]);
      }
    }
  }
  for (int i = kv + lane; i < k; i += 32) {
    float f = Elem<T>::load(wr, i);
#pragma unroll
    for (int b = 0; b < NB; b++)
      if (b < n) acc[b] = fmaf(f, x[(long)b * k + i], acc[b]);
  }
#pragma unroll
  for (int b = 0; b < NB; b++) {
    if (b < n) {
      float s = warp_sum(acc[b]);
      if (lane == 0) out[(long)b * m + row] = s;
    }
  }
}

extern "C" __global__ void __launch_bounds__(256) gemv_f32(float* out, const float* x, const float* w, int n, int k, int m) {
  gemv<float>(out, x, w, n, k, m);
}
extern "C" __global__ void __launch_bounds__(256) gemv_bf16(float* out, const float* x, const uint16_t* w, int n, int k, int m) {
  gemv<BF16>(out, x, w, n, k, m);
}
extern "C" __global__ void __launch_bounds__(256) gemv_f16(float* out, const float* x, const uint16_t* w, int n, int k, int m) {
  gemv<F16>(out, x, w, n, k, m);
}
