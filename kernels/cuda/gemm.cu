// Matrix products for prefill and batched decode: out[n,m] = x[n,k] · w[m,k]ᵀ.
//
// gemm_bf16 / gemm_f16 run on the tensor cores (mma.sync m16n8k16, f32
// accumulate): x is rounded from f32 to the weight's 16-bit type as it is
// loaded into shared memory. gemm_f32 is a plain f32 tiled kernel.
#include "common.cuh"

#define BM 64   // rows of x per block
#define BN 128  // rows of w per block
#define BK 32
#define PAD 8   // 16 bytes of padding per shared-memory row: no bank conflicts for ldmatrix

template <typename T> DEV uint32_t pack2(float a, float b);
template <> DEV uint32_t pack2<BF16>(float a, float b) { return (uint32_t)f2bf(a) | ((uint32_t)f2bf(b) << 16); }
template <> DEV uint32_t pack2<F16>(float a, float b) { return (uint32_t)f2h(a) | ((uint32_t)f2h(b) << 16); }

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

DEV void ldmatrix_x4(uint32_t* r, const void* p) {
  uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

// Global -> register staging for one BK slice.
struct Stage {
  uint4 a;     // 8 x elements (already 16-bit)
  uint4 b[2];  // 16 w elements
};

template <typename T>
DEV void load_stage(Stage& s, const float* x, const uint16_t* w, int n, int k, int m, int row0, int col0, int k0,
                    bool vec) {
  int t = threadIdx.x;
  // x: 64 rows x 32 cols; thread -> row t/4, 8 columns at (t%4)*8.
  {
    int r = row0 + (t >> 2), c = k0 + (t & 3) * 8;
    float f[8];
    if (r < n && vec && c + 8 <= k) {
      const float4* p = reinterpret_cast<const float4*>(x + (long)r * k + c);
      float4 u = p[0], v = p[1];
      f[0] = u.x; f[1] = u.y; f[2] = u.z; f[3] = u.w; f[4] = v.x; f[5] = v.y; f[6] = v.z; f[7] = v.w;
    } else {
#pragma unroll
      for (int e = 0; e < 8; e++) f[e] = (r < n && c + e < k) ? x[(long)r * k + c + e] : 0.f;
    }
    s.a.x = pack2<T>(f[0], f[1]);
    s.a.y = pack2<T>(f[2], f[3]);
    s.a.z = pack2<T>(f[4], f[5]);
    s.a.w = pack2<T>(f[6], f[7]);
  }
  // w: 128 rows x 32 cols; thread -> row t/2, 16 columns at (t%2)*16.
  {
    int r = col0 + (t >> 1), c = k0 + (t & 1) * 16;
#pragma unroll
    for (int h = 0; h < 2; h++) {
      int cc = c + h * 8;
      if (r < m && vec && cc + 8 <= k) {
        s.b[h] = *reinterpret_cast<const uint4*>(w + (long)r * k + cc);
      } else {
        uint16_t e[8];
#pragma unroll
        for (int j = 0; j < 8; j++) e[j] = (r < m && cc + j < k) ? w[(long)r * k + cc + j] : (uint16_t)0;
        s.b[h] = make_uint4(e[0] | (uint32_t)e[1] << 16, e[2] | (uint32_t)e[3] << 16, e[4] | (uint32_t)e[5] << 16,
                            e[6] | (uint32_t)e[7] << 16);
      }
    }
  }
}

template <typename T>
DEV void gemm_tc(float* __restrict__ out, const float* __restrict__ x, const uint16_t* __restrict__ w, int n, int k,
                 int m) {
  __shared__ __align__(16) uint16_t As[2][BM][BK + PAD];
  __shared__ __align__(16) uint16_t Bs[2][BN][BK + PAD];
  int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  int wm = warp >> 2, wn = warp & 3;  // 2 x 4 warps, each 32 x 32
  int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
  // 16-byte loads need 16-byte aligned rows: x rows of k floats (k%4) and
  // w rows of k 16-bit elements (k%8).
  bool vec = (k & 7) == 0;
  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[i][j][e] = 0.f;

  Stage st;
  int kt = (k + BK - 1) / BK;
  load_stage<T>(st, x, w, n, k, m, row0, col0, 0, vec);
  auto store = [&](int buf) {
    *reinterpret_cast<uint4*>(&As[buf][t >> 2][(t & 3) * 8]) = st.a;
    *reinterpret_cast<uint4*>(&Bs[buf][t >> 1][(t & 1) * 16]) = st.b[0];
    *reinterpret_cast<uint4*>(&Bs[buf][t >> 1][(t & 1) * 16 + 8]) = st.b[1];
  };
  store(0);
  __syncthreads();
  for (int it = 0; it < kt; it++) {
    int cur = it & 1;
    if (it + 1 < kt) load_stage<T>(st, x, w, n, k, m, row0, col0, (it + 1) * BK, vec);
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      uint32_t af[2][4], bfr[2][4];
#pragma unroll
      for (int i = 0; i < 2; i++)
        ldmatrix_x4(af[i], &As[cur][wm * 32 + i * 16 + (lane & 15)][kk + (lane >> 4) * 8]);
#pragma unroll
      for (int j = 0; j < 2; j++)
        ldmatrix_x4(bfr[j], &Bs[cur][wn * 32 + j * 16 + (lane & 7) + ((lane >> 4) << 3)][kk + ((lane >> 3) & 1) * 8]);
#pragma unroll
      for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) mma16816<T>(acc[i][j], af[i], &bfr[j >> 1][(j & 1) * 2]);
    }
    if (it + 1 < kt) store(cur ^ 1);
    __syncthreads();
  }
  int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) {
      int r = row0 + wm * 32 + i * 16 + g;
      int c = col0 + wn * 32 + j * 8 + q * 2;
#pragma unroll
      for (int h = 0; h < 2; h++) {
        int rr = r + h * 8;
        if (rr < n) {
          if (c < m) out[(long)rr * m + c] = acc[i][j][h * 2];
          if (c + 1 < m) out[(long)rr * m + c + 1] = acc[i][j][h * 2 + 1];
        }
      }
    }
}

extern "C" __global__ void __launch_bounds__(256) gemm_bf16(float* out, const float* x, const uint16_t* w, int n, int k, int m) {
  gemm_tc<BF16>(out, x, w, n, k, m);
}
extern "C" __global__ void __launch_bounds__(256) gemm_f16(float* out, const float* x, const uint16_t* w, int n, int k, int m) {
  gemm_tc<F16>(out, x, w, n, k, m);
}

// gemm_f32: 64x64 tiles, 256 threads, 4x4 outputs per thread.
extern "C" __global__ void __launch_bounds__(256) gemm_f32(float* out, const float* x, const float* w, int n, int k, int m) {
  __shared__ float xs[16][64 + 1];
  __shared__ float ws[16][64 + 1];
  int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  int row0 = blockIdx.y * 64, col0 = blockIdx.x * 64;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < k; k0 += 16) {
    for (int i = threadIdx.x; i < 64 * 16; i += 256) {
      int r = i >> 4, c = i & 15;
      xs[c][r] = (row0 + r < n && k0 + c < k) ? x[(long)(row0 + r) * k + k0 + c] : 0.f;
      ws[c][r] = (col0 + r < m && k0 + c < k) ? w[(long)(col0 + r) * k + k0 + c] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < 16; c++) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; i++) {
        a[i] = xs[c][ty * 4 + i];
        b[i] = ws[c][tx * 4 + i];
      }
#pragma unroll
      for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) {
      int r = row0 + ty * 4 + i, c = col0 + tx * 4 + j;
      if (r < n && c < m) out[(long)r * m + c] = acc[i][j];
    }
}
