// Matrix products for prefill and batched decode: out[n,m] = x[n,k] · w[m,k]ᵀ.
//
// The main path (k a multiple of 8, 16-bit weights): round_x rounds x from
// f32 to the weight's 16-bit type once, then gemm_{bf16,f16}_{l,s} run on
// the tensor cores (mma.sync m16n8k16, f32 accumulate) over a cp.async
// pipeline of swizzled shared-memory stages. _l tiles 128x128 for many rows
// (prefill), _s tiles 64x64 for few (batched decode). When the tiles alone
// would not fill the GPU, blockIdx.z splits k: each split writes its own
// partial product and splitk_sum adds them in split order, so results do
// not depend on scheduling.
//
// gemm_skinny_{bf16,f16}[_exact]: products of at most 64 rows of x (decode
// batches) are a stream of the weights. Each warp takes 32 rows of w and
// reads them straight from memory into registers, 16-byte loads one step
// ahead, as the A operand (the weights' rows are the mma's M); x's rows
// (tokens) are the N side, staged in shared memory for the block's four
// warps (the next 128 of k copied while the last are summed): rounded to
// 16 bits by round_x, or (_exact) in f32, split into its rounding and the
// remainder, each through an mma. The mma's k slots take the k of a
// thread's own 16-byte loads in a permuted order, the same for both
// operands, so no shuffling is needed: of each 64 of k a thread holds
// q·8 .. q·8+7 and 32+q·8 .. 32+q·8+7 (q = lane % 4), so a row's four lanes
// load 64 contiguous bytes and no 32-byte sector is fetched for half its
// bytes.
//
// gemm_bf16 / gemm_f16 are the older register-staged kernels, kept for k
// not a multiple of 8 (rows of w not 16-byte aligned); gemm_f32 is a plain
// f32 tiled kernel.
#include "mma.cuh"

#define BM 64   // rows of x per block
#define BN 128  // rows of w per block
#define BK 32
#define PAD 8   // 16 bytes of padding per shared-memory row: no bank conflicts for ldmatrix

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
  pdl_begin();
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
  pdl_begin();
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

// round_x_{bf16,f16}: out[i] = x[i] rounded to 16 bits, 8 elements a thread.
template <typename T>
DEV void round_x(uint16_t* __restrict__ out, const float* __restrict__ x, long count) {
  pdl_begin();
  long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
  if (i + 8 <= count) {
    float4 a = *reinterpret_cast<const float4*>(x + i), b = *reinterpret_cast<const float4*>(x + i + 4);
    *reinterpret_cast<uint4*>(out + i) =
        make_uint4(pack2<T>(a.x, a.y), pack2<T>(a.z, a.w), pack2<T>(b.x, b.y), pack2<T>(b.z, b.w));
  } else {
    for (; i < count; i++) out[i] = (uint16_t)(pack2<T>(x[i], 0.f) & 0xffffu);
  }
}
extern "C" __global__ void round_x_bf16(uint16_t* out, const float* x, long count) { round_x<BF16>(out, x, count); }
extern "C" __global__ void round_x_f16(uint16_t* out, const float* x, long count) { round_x<F16>(out, x, count); }

// split2 rounds a and b to T (hi, packed as pack2 does) and their
// remainders a - hi, b - hi to T (lo): hi + lo carries about twice T's
// mantissa, so x·w over both halves is within f32 rounding of the f32 x.
template <typename T> DEV void split2(float a, float b, uint32_t& hi, uint32_t& lo) {
  hi = pack2<T>(a, b);
  lo = pack2<T>(a - rounded<T>(a), b - rounded<T>(b));
}

// silu_rows_{f32,bf16,f16}: out[r, i] = silu(gu[r, i]) * gu[r, k + i] for n
// rows of gate then up (2k elements each), in out's type: the input of a
// gated MLP's down projection, rounded for the tensor cores; with pairs
// (16-bit out, k % 8 = 0) the remainders' roundings follow in rows n..2n-1,
// as split_x writes them. gu may be the splits parts of a product whose k
// was split, summed in split order as splitk_sum would. 8 elements a
// thread.
template <typename T>
DEV void silu_rows(typename Elem<T>::raw* __restrict__ out, const float* __restrict__ gu, int n, int k, int splits,
                   int pairs) {
  pdl_begin();
  long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * 8, total = (long)n * k, part = 2 * total;
  if (i >= total) return;
  if ((k & 7) == 0) {
    long r = i / k, c = i - r * k;
    const float* g = gu + 2 * r * k + c;
    float4 a = *reinterpret_cast<const float4*>(g), b = *reinterpret_cast<const float4*>(g + 4);
    float4 u = *reinterpret_cast<const float4*>(g + k), v = *reinterpret_cast<const float4*>(g + k + 4);
    // Four parts' loads in flight, summed in split order.
    for (int s0 = 1; s0 < splits; s0 += 4) {
      float4 a1[4], b1[4], u1[4], v1[4];
#pragma unroll
      for (int q = 0; q < 4; q++)
        if (s0 + q < splits) {
          const float* gs = g + (s0 + q) * part;
          a1[q] = *reinterpret_cast<const float4*>(gs), b1[q] = *reinterpret_cast<const float4*>(gs + 4);
          u1[q] = *reinterpret_cast<const float4*>(gs + k), v1[q] = *reinterpret_cast<const float4*>(gs + k + 4);
        }
#pragma unroll
      for (int q = 0; q < 4; q++)
        if (s0 + q < splits) {
          a.x += a1[q].x; a.y += a1[q].y; a.z += a1[q].z; a.w += a1[q].w;
          b.x += b1[q].x; b.y += b1[q].y; b.z += b1[q].z; b.w += b1[q].w;
          u.x += u1[q].x; u.y += u1[q].y; u.z += u1[q].z; u.w += u1[q].w;
          v.x += v1[q].x; v.y += v1[q].y; v.z += v1[q].z; v.w += v1[q].w;
        }
    }
    float f[8] = {silu(a.x) * u.x, silu(a.y) * u.y, silu(a.z) * u.z, silu(a.w) * u.w,
                  silu(b.x) * v.x, silu(b.y) * v.y, silu(b.z) * v.z, silu(b.w) * v.w};
    if constexpr (sizeof(typename Elem<T>::raw) == 2) {
      uint4 hi, lo;
      split2<T>(f[0], f[1], hi.x, lo.x);
      split2<T>(f[2], f[3], hi.y, lo.y);
      split2<T>(f[4], f[5], hi.z, lo.z);
      split2<T>(f[6], f[7], hi.w, lo.w);
      *reinterpret_cast<uint4*>(out + i) = hi;
      if (pairs) *reinterpret_cast<uint4*>(out + total + i) = lo;
    } else {
      *reinterpret_cast<float4*>(out + i) = make_float4(f[0], f[1], f[2], f[3]);
      *reinterpret_cast<float4*>(out + i + 4) = make_float4(f[4], f[5], f[6], f[7]);
    }
    return;
  }
  for (long e = i; e < min(i + 8, total); e++) {
    long r = e / k, c = e - r * k;
    float g = gu[2 * r * k + c], u = gu[2 * r * k + k + c];
    for (int sp = 1; sp < splits; sp++) g += gu[sp * part + 2 * r * k + c], u += gu[sp * part + 2 * r * k + k + c];
    Elem<T>::store(out, e, silu(g) * u);
  }
}
extern "C" __global__ void silu_rows_f32(float* out, const float* gu, int n, int k, int splits, int pairs) {
  silu_rows<float>(out, gu, n, k, splits, 0);
}
extern "C" __global__ void silu_rows_bf16(uint16_t* out, const float* gu, int n, int k, int splits, int pairs) {
  silu_rows<BF16>(out, gu, n, k, splits, pairs);
}
extern "C" __global__ void silu_rows_f16(uint16_t* out, const float* gu, int n, int k, int splits, int pairs) {
  silu_rows<F16>(out, gu, n, k, splits, pairs);
}

// splitk_sum: out[i] = Σ_s part[s*count + i] in split order.
extern "C" __global__ void splitk_sum(float* __restrict__ out, const float* __restrict__ part, long count, int splits) {
  pdl_begin();
  long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (i + 4 <= count && (count & 3) == 0) {
    float4 acc = *reinterpret_cast<const float4*>(part + i);
    // Eight parts' loads in flight, summed in split order.
    for (int s0 = 1; s0 < splits; s0 += 8) {
      float4 v[8];
#pragma unroll
      for (int u = 0; u < 8; u++)
        if (s0 + u < splits) v[u] = *reinterpret_cast<const float4*>(part + (long)(s0 + u) * count + i);
#pragma unroll
      for (int u = 0; u < 8; u++)
        if (s0 + u < splits) acc.x += v[u].x, acc.y += v[u].y, acc.z += v[u].z, acc.w += v[u].w;
    }
    *reinterpret_cast<float4*>(out + i) = acc;
  } else {
    for (long e = i; e < min(i + 4, count); e++) {
      float acc = part[e];
      for (int s = 1; s < splits; s++) acc += part[(long)s * count + e];
      out[e] = acc;
    }
  }
}

// gemm_pipe: out (+ blockIdx.z*n*m when k is split) [n,m] = x16[n,k] · w[m,k]ᵀ
// over k in [blockIdx.z*kchunk, +kchunk). k % 8 == 0, kchunk % 32 == 0.
// WM x WN warps; each warp owns a (BM/WM) x (BN/WN) tile of the output.
#define PBK 32
template <typename T, int PM, int PN, int PWM, int PWN, int STAGES>
DEV void gemm_pipe(float* __restrict__ out, const uint16_t* __restrict__ x, const uint16_t* __restrict__ w, int n, int k,
                   int m, int kchunk) {
  pdl_begin();
  constexpr int NT = PWM * PWN * 32;
  constexpr int TM = PM / PWM, TN = PN / PWN;
  constexpr int MI = TM / 16, NJ = TN / 8;
  static_assert(NJ % 2 == 0, "warp tile width must be a multiple of 16");
  constexpr int STAGE = (PM + PN) * PBK;  // elements per stage
  extern __shared__ __align__(16) uint16_t smem[];
  int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  int wm = warp / PWN, wn = warp % PWN;
  int row0 = blockIdx.y * PM, col0 = blockIdx.x * PN;
  int kbeg = blockIdx.z * kchunk, kend = min(k, kbeg + kchunk);
  int kt = (kend - kbeg + PBK - 1) / PBK;
  out += (long)blockIdx.z * n * m;

  auto load = [&](int stage, int tile) {
    uint16_t* as = smem + stage * STAGE;
    uint16_t* bs = as + PM * PBK;
    int k0 = kbeg + tile * PBK;
#pragma unroll
    for (int i = t; i < PM * 4; i += NT) {
      int r = i >> 2, c = i & 3;
      int gr = row0 + r, gc = k0 + c * 8;
      bool ok = gr < n && gc < kend;
      cp_async16(as + swz<4>(r, c), ok ? x + (long)gr * k + gc : x, ok);
    }
#pragma unroll
    for (int i = t; i < PN * 4; i += NT) {
      int r = i >> 2, c = i & 3;
      int gr = col0 + r, gc = k0 + c * 8;
      bool ok = gr < m && gc < kend;
      cp_async16(bs + swz<4>(r, c), ok ? w + (long)gr * k + gc : w, ok);
    }
  };
  float acc[MI][NJ][4];
  mma_pipe<T, PM, STAGE, STAGES, MI, NJ, TM, TN>(acc, smem, kt, load, wm, wn, lane);

  int g = lane >> 2, q = lane & 3;
  bool pairs = (m & 1) == 0;
#pragma unroll
  for (int i = 0; i < MI; i++)
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      int r = row0 + wm * TM + i * 16 + g;
      int c = col0 + wn * TN + j * 8 + q * 2;
#pragma unroll
      for (int h = 0; h < 2; h++) {
        int rr = r + h * 8;
        if (rr >= n) continue;
        float* o = out + (long)rr * m + c;
        if (pairs && c + 1 < m) {
          *reinterpret_cast<float2*>(o) = make_float2(acc[i][j][h * 2], acc[i][j][h * 2 + 1]);
        } else {
          if (c < m) o[0] = acc[i][j][h * 2];
          if (c + 1 < m) o[1] = acc[i][j][h * 2 + 1];
        }
      }
    }
}

// Shared memory (dynamic): _l 4 stages x 16 KiB, _s 6 stages x 8 KiB.
#define PIPE(name, T)                                                                                               \
  extern "C" __global__ void __launch_bounds__(256) gemm_##name##_l(float* out, const uint16_t* x, const uint16_t* w, \
                                                                    int n, int k, int m, int kchunk) {              \
    gemm_pipe<T, 128, 128, 2, 4, 4>(out, x, w, n, k, m, kchunk);                                                    \
  }                                                                                                                 \
  extern "C" __global__ void __launch_bounds__(128) gemm_##name##_s(float* out, const uint16_t* x, const uint16_t* w, \
                                                                    int n, int k, int m, int kchunk) {              \
    gemm_pipe<T, 64, 64, 2, 2, 6>(out, x, w, n, k, m, kchunk);                                                      \
  }
PIPE(bf16, BF16)
PIPE(f16, F16)

#define SK_ROWS 128  // weight rows per block, 32 per warp
#define SK_XK 256    // k of x staged in shared memory at a time, for the rows of x's token tiles

DEV uint32_t word(const uint4& lo, const uint4& hi, int i) {
  switch (i) {
    case 0: return lo.x;
    case 1: return lo.y;
    case 2: return lo.z;
    case 3: return lo.w;
    case 4: return hi.x;
    case 5: return hi.y;
    case 6: return hi.z;
    default: return hi.w;
  }
}

// split_x_{bf16,f16}: x's rounding to 16 bits in out[i] and its
// remainder's in out[count + i] (split2), 8 elements a thread, count a
// multiple of 8: a decode batch's product over both halves, as rows of x of
// their own, is as exact as over f32 x.
template <typename T>
DEV void split_x(uint16_t* __restrict__ out, const float* __restrict__ x, long count) {
  pdl_begin();
  long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
  if (i >= count) return;
  float4 a = *reinterpret_cast<const float4*>(x + i), b = *reinterpret_cast<const float4*>(x + i + 4);
  uint4 hi, lo;
  split2<T>(a.x, a.y, hi.x, lo.x);
  split2<T>(a.z, a.w, hi.y, lo.y);
  split2<T>(b.x, b.y, hi.z, lo.z);
  split2<T>(b.z, b.w, hi.w, lo.w);
  *reinterpret_cast<uint4*>(out + i) = hi;
  *reinterpret_cast<uint4*>(out + count + i) = lo;
}
extern "C" __global__ void split_x_bf16(uint16_t* out, const float* x, long count) { split_x<BF16>(out, x, count); }
extern "C" __global__ void split_x_f16(uint16_t* out, const float* x, long count) { split_x<F16>(out, x, count); }

// skinny_chunk is the place of 16-byte chunk c of row r of the staged x
// (8 values of 16 bits, or 4 f32): a 16-byte load phase reads two rows at
// four chunks, 1 (16-bit) or 2 (f32) apart, and the XOR with odd rows'
// bit o puts the two rows in different halves of the 32 banks.
template <int o> DEV int skinny_chunk(int c, int r) { return c ^ ((r & 1) * o); }

// gemm_skinny: out (+ blockIdx.y*n*m when k is split) [n,m] = x[n,k] · w[m,k]ᵀ over k in
// [blockIdx.y*kchunk, +kchunk); n <= NT*8, k % 64 == 0, kchunk % 64 == 0.
// x is 16-bit (X = uint16_t, rounded by round_x), staged in 32 KiB of
// static shared memory 128 of k at a time, in two halves, so that the
// weights' stream does not stop for a stage; or (EXACT, X = float, n <= 8)
// f32, staged in 8 KiB of dynamic shared memory and split into T's
// rounding and its remainder as the mma's B operands are formed, two mmas
// each, so that the product is as exact as f32 x·w: it reads twice the
// bytes of x, which matters less the fewer its rows. Only the rows of the
// token tiles in use are staged.
template <typename T, bool EXACT, typename X, int NT>
DEV void gemm_skinny(float* __restrict__ out, const X* __restrict__ x, const uint16_t* __restrict__ w, int n, int k,
                     int m, int kchunk) {
  __shared__ __align__(16) uint16_t xs16[EXACT ? 8 : NT * 8 * SK_XK];
  extern __shared__ __align__(16) float xs32[];
  X* xs = EXACT ? reinterpret_cast<X*>(xs32) : reinterpret_cast<X*>(xs16);
  constexpr int XE = 16 / sizeof(X);  // x's elements a 16-byte chunk
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;
  int row0 = blockIdx.x * SK_ROWS + warp * 32;
  int kbeg = blockIdx.y * kchunk, kend = min(k, kbeg + kchunk);
  int ntn = (n + 7) >> 3;
  float acc[2][NT][4] = {};
  // The thread's rows of w are row0 + g + 8i (i = 2rs + hh: the mma's row
  // g + 8hh of its 16-row slice rs), each from its first k slot; rows past
  // m read row m - 1, whose sums are not stored. Every address below is
  // formed once, so that a step is its loads and mmas.
  const uint16_t* wr[4];
#pragma unroll
  for (int i = 0; i < 4; i++) wr[i] = w + (long)min(row0 + g + 8 * i, m - 1) * k + q * 8;
  auto loadw = [&](uint4 (&v)[4][2], int kk) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
      v[i][0] = ld_once(wr[i] + kk);
      v[i][1] = ld_once(wr[i] + kk + 32);
    }
  };
  // mma16 adds x's B fragment b times the A fragment of this thread's rows
  // from its weights' words 2s and 2s+1.
  auto mma16 = [&](float (&c)[2][NT][4], const uint4 (&v)[4][2], int t, int s, const uint32_t (&b)[2]) {
#pragma unroll
    for (int rs = 0; rs < 2; rs++) {
      const uint4 &a0 = v[2 * rs][0], &a1 = v[2 * rs][1], &b0 = v[2 * rs + 1][0], &b1 = v[2 * rs + 1][1];
      uint32_t a[4] = {word(a0, a1, 2 * s), word(b0, b1, 2 * s), word(a0, a1, 2 * s + 1), word(b0, b1, 2 * s + 1)};
      mma16816<T>(c[rs][t], a, b);
    }
  };
  // Staging: x comes SZ of k at a time; rounded x in two halves of the
  // buffer, so that the next half is copied while one is summed (f32 x, a
  // few rows, fills its buffer at once). The thread copies chunk sc of rows
  // sr, sr + RP, ... of the token tiles, rows of one parity, so one swizzle
  // serves them all.
  constexpr int SZ = EXACT ? SK_XK : SK_XK / 2, NBUF = SK_XK / SZ;
  constexpr int CPR = SZ / XE, RP = 128 / CPR;  // chunks a row, rows a pass
  const int sc = tid % CPR, sr = tid / CPR;
  const X* xsrc = x + (long)sr * k + sc * XE;
  auto stage = [&](int xk, int b) {
    const int xlen = min(SZ, kend - xk);
    const X* src = xsrc + xk;
    X* dst = xs + sr * SK_XK + skinny_chunk<EXACT ? 1 : 4>(sc + b * CPR, sr) * XE;
#pragma unroll 4
    for (int r = sr, j = 0; r < ntn * 8; r += RP, j++, src += (long)RP * k) {
      bool ok = r < n && sc * XE < xlen;
      cp_async16(dst + j * RP * SK_XK, ok ? src : x, ok);
    }
    cp_async_commit();
  };
  // x's fragments, row g of each token tile: 16-bit x takes chunks kk/8 + q
  // and kk/8 + q + 4 of the row (their swizzle only flips bit 2); f32 x
  // chunks kk/4 + 2q + 8(s/2) + s%2 (the swizzle flips bit 0).
  const X* xf0 = xs + g * SK_XK + (EXACT ? (2 * q) * 4 + (g & 1) * 4 : (q ^ ((g & 1) * 4)) * 8);
  const X* xf1 = xs + g * SK_XK + (EXACT ? (2 * q) * 4 + (~g & 1) * 4 : ((q + 4) ^ ((g & 1) * 4)) * 8);
  auto step = [&](const uint4 (&v)[4][2], int kk) {
    // x: token rows t*8+g, the 16 k of this thread, one token tile at a
    // time (registers bound the blocks per SM), or two when rounded.
#pragma unroll
    for (int t = 0; t < NT; t += EXACT ? 1 : 2) {
      if (t >= ntn) break;
      if constexpr (EXACT) {
#pragma unroll
        for (int s = 0; s < 4; s++) {
          float4 xv = *reinterpret_cast<const float4*>((s & 1 ? xf1 : xf0) + t * 8 * SK_XK + (s >> 1) * 32 + kk);
          uint32_t bh[2], bl[2];
          split2<T>(xv.x, xv.y, bh[0], bl[0]);
          split2<T>(xv.z, xv.w, bh[1], bl[1]);
          mma16(acc, v, t, s, bh);
          mma16(acc, v, t, s, bl);
        }
      } else {
        // Two tiles (the second unused, with rows never staged, when n
        // ends in the first): four mmas a step on distinct accumulators.
        uint4 x0[2], x1[2];
#pragma unroll
        for (int j = 0; j < 2; j++) {
          x0[j] = *reinterpret_cast<const uint4*>(xf0 + (t + j) * 8 * SK_XK + kk);
          x1[j] = *reinterpret_cast<const uint4*>(xf1 + (t + j) * 8 * SK_XK + kk);
        }
#pragma unroll
        for (int s = 0; s < 4; s++)
#pragma unroll
          for (int j = 0; j < 2; j++) {
            uint32_t b[2] = {word(x0[j], x1[j], 2 * s), word(x0[j], x1[j], 2 * s + 1)};
            mma16(acc, v, t + j, s, b);
          }
      }
    }
  };
  // Each step's weights are requested before the step before it runs
  // (nxt); the copy into cur at the step's end is where the mma's A
  // fragments are laid out, a step after their loads.
  uint4 cur[4][2], nxt[4][2];
  loadw(cur, kbeg);  // the weights, before waiting for x
  pdl_begin();
  stage(kbeg, 0);
  for (int xk = kbeg, b = 0; xk < kend; xk += SZ, b ^= NBUF - 1) {
    const int xlen = min(SZ, kend - xk);
    if (NBUF == 1 && xk != kbeg) {
      __syncthreads();  // the last stage of x is consumed
      stage(xk, 0);
    }
    cp_async_wait<0>();
    __syncthreads();  // this stage is in; with two halves, the other is consumed
    if (NBUF == 2 && xk + SZ < kend) stage(xk + SZ, b ^ 1);
    for (int kk = 0; kk < xlen; kk += 64) {
      if (xk + kk + 64 < kend) loadw(nxt, xk + kk + 64);
      step(cur, b * SZ + kk);
#pragma unroll
      for (int i = 0; i < 4; i++) {
        cur[i][0] = nxt[i][0];
        cur[i][1] = nxt[i][1];
      }
    }
  }
  store_skinny<NT>(out, acc, n, m, row0, ntn);
}

// Entry points: gemm_skinny_<type>_t8, x rounded, up to eight token tiles
// of 8 rows (three blocks an SM); gemm_skinny_<type>_exact_t1, f32 x, one
// tile, whose few accumulators let four blocks fit on an SM. More rows of
// f32 x take the rounded kernel as pairs of rows (gpu/cuda's skinnyPairs).
#define SKINNY1(NAME, T, EXACT, X, NT)                                                                             \
  extern "C" __global__ void __launch_bounds__(128, 3)                                                             \
      NAME##_t##NT(float* out, const X* x, const uint16_t* w, int n, int k, int m, int kchunk) {                   \
    gemm_skinny<T, EXACT, X, NT>(out, x, w, n, k, m, kchunk);                                                      \
  }
SKINNY1(gemm_skinny_bf16, BF16, false, uint16_t, 8) SKINNY1(gemm_skinny_f16, F16, false, uint16_t, 8)
SKINNY1(gemm_skinny_bf16_exact, BF16, true, float, 1) SKINNY1(gemm_skinny_f16_exact, F16, true, float, 1)
