// Fused decode-step kernels: the steps between the q/k/v projections and
// attention in one launch.
#include "common.cuh"

// pdl_begin_early is pdl_begin with the next kernel let start before the
// wait: the decode attention after qkv_prep_rows then takes SMs, and
// copies the cached keys it reads before its own wait, while the q|k|v
// product ahead still drains.
DEV void pdl_begin_early() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// QKVParams mirrors qkvParams in gpu/cuda/fused.go.
// ldq and ldk are the row strides of q and of k and v (the rows of a
// packed q|k|v product, or the projections' own widths).
// With norm 3, inv_qw and inv_kw are 1 / the widths of the whole q and k
// projections whose sums of squares sums holds.
struct QKVParams {
  int n, heads, kvheads, hd, norm, cap;
  float eps;
  int ldq, ldk;
  float inv_qw, inv_kw;
};

// qkv_prep: for each token t and head h of q (heads) then k (kvheads):
// optional RMSNorm (norm 1: over the token's whole q or k projection, OLMo 2;
// norm 2: over each head, Qwen 3; norm 3: as 1 for a tensor-parallel rank's
// slice of the projection, with the sums of squares of the whole rows in
// sums, q's then k's, all-reduced by the ranks), rotate-half RoPE at pos[t],
// then q goes to qout and k, with v, to cache slot slots[t]. One block per
// (token, head).
// Blocks read the whole projection for norm 1, so q is written to qout, not
// in place, and k only to the cache.
template <typename W, typename C>
DEV void qkv_prep(float* __restrict__ qout, const float* __restrict__ q, const float* __restrict__ k,
                  const float* __restrict__ v, const typename Elem<W>::raw* __restrict__ qn,
                  const typename Elem<W>::raw* __restrict__ kn, const int* __restrict__ pos,
                  const float* __restrict__ inv_freq, typename Elem<C>::raw* kc, typename Elem<C>::raw* vc,
                  const int* __restrict__ slots, const float* __restrict__ sums, QKVParams pa, unsigned* fault) {
  pdl_begin();
  const int n = pa.n, heads = pa.heads, kvheads = pa.kvheads, hd = pa.hd, norm = pa.norm, cap = pa.cap;
  const float eps = pa.eps;
  __shared__ float scratch[32];
  int all = heads + kvheads;
  int t = blockIdx.x / all, h = blockIdx.x % all;
  if (t >= n) return;
  bool isk = h >= heads;
  if (isk) h -= heads;
  int nh = isk ? kvheads : heads;
  const float* row = isk ? k + (long)t * pa.ldk : q + (long)t * pa.ldq;
  const float* x = row + (long)h * hd;
  const typename Elem<W>::raw* w = isk ? kn : qn;
  int slot = 0;
  if (isk) {
    slot = slots[t];
    if (slot < 0 || slot >= cap) {
      if (threadIdx.x == 0) record_fault(fault, FAULT_STOREKV_SLOT, t, slot);
      return;
    }
  }
  float inv = 1.f;
  long woff = 0;
  if (norm == 3) {
    inv = rsqrtf(sums[isk ? n + t : t] * (isk ? pa.inv_kw : pa.inv_qw) + eps);
    woff = (long)h * hd;
  } else if (norm != 0) {
    int width = norm == 1 ? nh * hd : hd;
    const float* s = norm == 1 ? row : x;
    float ss = 0.f;
    if ((width & 3) == 0 && (reinterpret_cast<uintptr_t>(s) & 15) == 0) {
      // 16-byte loads, up to eight in flight a thread.
      const float4* s4 = reinterpret_cast<const float4*>(s);
#pragma unroll 8
      for (int j = threadIdx.x; j < width / 4; j += blockDim.x) {
        float4 e = s4[j];
        ss += e.x * e.x + e.y * e.y + e.z * e.z + e.w * e.w;
      }
    } else {
      for (int j = threadIdx.x; j < width; j += blockDim.x) ss += s[j] * s[j];
    }
    ss = block_sum(ss, scratch);
    inv = rsqrtf(ss / (float)width + eps);
    woff = norm == 1 ? (long)h * hd : 0;
  }
  int half = hd >> 1;
  double p = (double)pos[t];
  float* qo = qout + ((long)t * heads + h) * hd;
  long d = ((long)slot * kvheads + h) * hd;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float a = x[i], b = x[i + half];
    if (norm != 0) {
      a = a * inv * Elem<W>::load(w, woff + i);
      b = b * inv * Elem<W>::load(w, woff + i + half);
    }
    float sn, cs;
    rope_sincos(p, inv_freq[i], &sn, &cs);
    float ra = a * cs - b * sn, rb = b * cs + a * sn;
    if (isk) {
      Elem<C>::store(kc, d + i, ra);
      Elem<C>::store(kc, d + i + half, rb);
    } else {
      qo[i] = ra;
      qo[i + half] = rb;
    }
  }
  if (isk) {
    const float* vr = v + (long)t * pa.ldk + (long)h * hd;
    for (int j = threadIdx.x; j < hd; j += blockDim.x) Elem<C>::store(vc, d + j, vr[j]);
  }
}

// qkv_prep_rows: qkv_prep for the rows of a packed q|k|v product (row
// stride ldq) in blocks of a token and a third of its row: grid (3, n),
// blockIdx.x 0 for q, 1 for k, 2 for v, where qkv_prep takes a block a
// head. The rows are read from src. With splits > 1, src holds the parts of
// a product whose k was split (part s at src + s·n·ldq): they are summed in
// split order, as splitk_sum sums them, and stored to qkv, so that the
// product is in place as if summed. q and k are then normalised (norms 1
// to 3 as qkv_prep's) and rotated, q going to qout and k and v to cache
// slot slots[t]. A thread takes a pair of values, dims d and d + hd/2 of a
// head, QP_PAIRS times at most: up to 4,096 values a row with 1,024
// threads. hd % 64 == 0, so that a warp's pairs lie in one head.
#define QP_PAIRS 2
template <typename W, typename C>
DEV void qkv_prep_rows(float* __restrict__ qout, float* qkv, const float* src, int splits,
                       const typename Elem<W>::raw* __restrict__ qn, const typename Elem<W>::raw* __restrict__ kn,
                       const int* __restrict__ pos, const float* __restrict__ inv_freq, typename Elem<C>::raw* kc,
                       typename Elem<C>::raw* vc, const int* __restrict__ slots, const float* __restrict__ sums,
                       QKVParams pa, unsigned* fault) {
  __shared__ float scratch[32];
  __shared__ float hs[QP_PAIRS][32];  // the warps' sums of squares (norm 2)
  const int heads = pa.heads, kvheads = pa.kvheads, hd = pa.hd, half = hd >> 1, norm = pa.norm;
  const int part = blockIdx.x, t = blockIdx.y, nt = blockDim.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nh = part == 0 ? heads : kvheads, pairs = nh * half;
  const long count = (long)pa.n * pa.ldq;
  const long row = (long)t * pa.ldq + (part == 0 ? 0 : part == 1 ? (long)heads * hd : (long)(heads + kvheads) * hd);
  const bool rotate = part < 2, normed = rotate && norm != 0;
  const typename Elem<W>::raw* w = part == 0 ? qn : kn;
  // The pairs' elements in the row (-1: none), and before the wait for
  // the kernel ahead, what nothing writes: the norm weights and the
  // rotation's frequencies.
  long e[QP_PAIRS];
  float w0[QP_PAIRS], w1[QP_PAIRS], fr[QP_PAIRS];
#pragma unroll
  for (int j = 0; j < QP_PAIRS; j++) {
    int i = threadIdx.x + j * nt, h = i / half, d = i % half;
    e[j] = i < pairs ? row + (long)h * hd + d : -1;
    w0[j] = w1[j] = fr[j] = 0.f;
    if (e[j] >= 0 && normed) {
      long wo = norm == 2 ? d : (long)h * hd + d;
      w0[j] = Elem<W>::load(w, wo);
      w1[j] = Elem<W>::load(w, wo + half);
    }
    if (e[j] >= 0 && rotate) fr[j] = inv_freq[d];
  }
  pdl_begin_early();
  float a[QP_PAIRS], b[QP_PAIRS];
#pragma unroll
  for (int j = 0; j < QP_PAIRS; j++) {
    a[j] = e[j] >= 0 ? src[e[j]] : 0.f;
    b[j] = e[j] >= 0 ? src[e[j] + half] : 0.f;
  }
  // Four parts' loads in flight, summed in split order.
  for (int s0 = 1; s0 < splits; s0 += 4) {
    float a1[4][QP_PAIRS], b1[4][QP_PAIRS];
#pragma unroll
    for (int u = 0; u < 4; u++)
#pragma unroll
      for (int j = 0; j < QP_PAIRS; j++)
        if (s0 + u < splits && e[j] >= 0) {
          const float* ps = src + (long)(s0 + u) * count;
          a1[u][j] = ps[e[j]];
          b1[u][j] = ps[e[j] + half];
        }
#pragma unroll
    for (int u = 0; u < 4; u++)
#pragma unroll
      for (int j = 0; j < QP_PAIRS; j++)
        if (s0 + u < splits && e[j] >= 0) {
          a[j] += a1[u][j];
          b[j] += b1[u][j];
        }
  }
#pragma unroll
  for (int j = 0; j < QP_PAIRS; j++)
    if (e[j] >= 0 && splits > 1) {
      qkv[e[j]] = a[j];
      qkv[e[j] + half] = b[j];
    }
  float inv[QP_PAIRS];
#pragma unroll
  for (int j = 0; j < QP_PAIRS; j++) inv[j] = 1.f;
  if (normed && norm == 1) {
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < QP_PAIRS; j++) ss += a[j] * a[j] + b[j] * b[j];
    ss = block_sum(ss, scratch);
    float iv = rsqrtf(ss / (float)(nh * hd) + pa.eps);
#pragma unroll
    for (int j = 0; j < QP_PAIRS; j++) inv[j] = iv;
  } else if (normed && norm == 3) {
    float iv = rsqrtf(sums[part == 0 ? t : pa.n + t] * (part == 0 ? pa.inv_qw : pa.inv_kw) + pa.eps);
#pragma unroll
    for (int j = 0; j < QP_PAIRS; j++) inv[j] = iv;
  } else if (normed) {  // norm 2: a head's sums are its warps', in order
#pragma unroll
    for (int j = 0; j < QP_PAIRS; j++) {
      float s = warp_sum(a[j] * a[j] + b[j] * b[j]);
      if (lane == 0) hs[j][warp] = s;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < QP_PAIRS; j++)
      if (e[j] >= 0) {
        int h = (threadIdx.x + j * nt) / half;
        float s = 0.f;
        for (int p = h * half; p < (h + 1) * half; p += 32) s += hs[p / nt][(p % nt) >> 5];
        inv[j] = rsqrtf(s / (float)hd + pa.eps);
      }
  }
  int slot = 0;
  if (part != 0) {
    slot = slots[t];
    if (slot < 0 || slot >= pa.cap) {
      if (threadIdx.x == 0 && part == 1) record_fault(fault, FAULT_STOREKV_SLOT, t, slot);
      return;
    }
  }
  const double p = (double)pos[t];
#pragma unroll
  for (int j = 0; j < QP_PAIRS; j++) {
    if (e[j] < 0) continue;
    int i = threadIdx.x + j * nt, h = i / half, d = i % half;
    float x0 = a[j], x1 = b[j];
    long c = ((long)slot * kvheads + h) * hd + d;
    if (!rotate) {
      Elem<C>::store(vc, c, x0);
      Elem<C>::store(vc, c + half, x1);
      continue;
    }
    if (normed) {
      x0 = x0 * inv[j] * w0[j];
      x1 = x1 * inv[j] * w1[j];
    }
    float sn, cs;
    rope_sincos(p, fr[j], &sn, &cs);
    float ra = x0 * cs - x1 * sn, rb = x1 * cs + x0 * sn;
    if (part == 1) {
      Elem<C>::store(kc, c, ra);
      Elem<C>::store(kc, c + half, rb);
    } else {
      float* qo = qout + ((long)t * heads + h) * hd + d;
      qo[0] = ra;
      qo[half] = rb;
    }
  }
}

#define QKV_PREP(W, wn, C, cn)                                                                                       \
  extern "C" __global__ void qkv_prep_##wn##_##cn(                                                                   \
      float* qout, const float* q, const float* k, const float* v, const Elem<W>::raw* qn, const Elem<W>::raw* kn,   \
      const int* pos, const float* inv_freq, Elem<C>::raw* kc, Elem<C>::raw* vc, const int* slots, const float* sums, \
      QKVParams a, unsigned* fault) {                                                                                \
    qkv_prep<W, C>(qout, q, k, v, qn, kn, pos, inv_freq, kc, vc, slots, sums, a, fault);                             \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(1024) qkv_prep_rows_##wn##_##cn(                                      \
      float* qout, float* qkv, const float* src, int splits, const Elem<W>::raw* qn, const Elem<W>::raw* kn,         \
      const int* pos, const float* inv_freq, Elem<C>::raw* kc, Elem<C>::raw* vc, const int* slots, const float* sums, \
      QKVParams a, unsigned* fault) {                                                                                \
    qkv_prep_rows<W, C>(qout, qkv, src, splits, qn, kn, pos, inv_freq, kc, vc, slots, sums, a, fault);               \
  }
#define QKV_PREP_W(C, cn) QKV_PREP(float, f32, C, cn) QKV_PREP(BF16, bf16, C, cn) QKV_PREP(F16, f16, C, cn)
QKV_PREP_W(float, f32)
QKV_PREP_W(BF16, bf16)
QKV_PREP_W(F16, f16)
