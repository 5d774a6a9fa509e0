// Fused decode-step kernels: the steps between the q/k/v projections and
// attention in one launch.
#include "common.cuh"

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

#define QKV_PREP(W, wn, C, cn)                                                                                       \
  extern "C" __global__ void qkv_prep_##wn##_##cn(                                                                   \
      float* qout, const float* q, const float* k, const float* v, const Elem<W>::raw* qn, const Elem<W>::raw* kn,   \
      const int* pos, const float* inv_freq, Elem<C>::raw* kc, Elem<C>::raw* vc, const int* slots, const float* sums, \
      QKVParams a, unsigned* fault) {                                                                                \
    qkv_prep<W, C>(qout, q, k, v, qn, kn, pos, inv_freq, kc, vc, slots, sums, a, fault);                             \
  }
#define QKV_PREP_W(C, cn) QKV_PREP(float, f32, C, cn) QKV_PREP(BF16, bf16, C, cn) QKV_PREP(F16, f16, C, cn)
QKV_PREP_W(float, f32)
QKV_PREP_W(BF16, bf16)
QKV_PREP_W(F16, f16)
