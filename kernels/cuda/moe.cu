// Mixture-of-experts SwiGLU with softmax routing. Expert weights arrive as
// tables of device pointers passed by value, so a recorded graph needs no
// device-side table. Each token is processed as a matrix-vector product
// per chosen expert (decode-shaped; prefill re-reads expert weights per
// token).
#include "common.cuh"

#define MAX_EXPERTS 128

struct Ptrs {
  const void* p[MAX_EXPERTS];
};

// warp_dot: sum_i w[i]*x[i] over k elements, result in every lane.
template <typename T>
DEV float warp_dot(const typename Elem<T>::raw* w, const float* x, int k) {
  int lane = threadIdx.x & 31;
  float s = 0.f;
  constexpr int VEC = 16 / sizeof(typename Elem<T>::raw);
  int kv = (k % VEC == 0) ? k : 0;
  for (int i = lane * VEC; i < kv; i += 32 * VEC) {
    uint4 u = *reinterpret_cast<const uint4*>(w + i);
    float f[8];
    if constexpr (VEC == 8) {
      unpack8<T>(u, f);
    } else {
      f[0] = __uint_as_float(u.x); f[1] = __uint_as_float(u.y); f[2] = __uint_as_float(u.z); f[3] = __uint_as_float(u.w);
    }
#pragma unroll
    for (int e = 0; e < VEC; e++) s = fmaf(f[e], x[i + e], s);
  }
  for (int i = kv + lane; i < k; i += 32) s = fmaf(Elem<T>::load(w, i), x[i], s);
  return warp_sum(s);
}

// moe_route: one block per token. Router logits, softmax, top-k (ties to
// the lower expert index), optional renormalisation.
template <typename T>
DEV void moe_route(int* ids, float* wts, const float* x, const typename Elem<T>::raw* router, int n, int dim,
                   int experts, int topk, int norm) {
  pdl_begin();
  __shared__ float lg[MAX_EXPERTS];
  int t = blockIdx.x;
  if (t >= n) return;
  int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int e = warp; e < experts; e += nw) {
    float v = warp_dot<T>(router + (long)e * dim, x + (long)t * dim, dim);
    if ((threadIdx.x & 31) == 0) lg[e] = v;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  float mx = lg[0];
  for (int e = 1; e < experts; e++) mx = fmaxf(mx, lg[e]);
  float sum = 0.f;
  for (int e = 0; e < experts; e++) {
    lg[e] = expf(lg[e] - mx);
    sum += lg[e];
  }
  float tot = 0.f;
  for (int k = 0; k < topk; k++) {
    int best = -1;
    float bv = -1.f;
    for (int e = 0; e < experts; e++)
      if (lg[e] > bv) {
        bv = lg[e];
        best = e;
      }
    ids[t * topk + k] = best;
    wts[t * topk + k] = bv / sum;
    tot += bv / sum;
    lg[best] = -2.f;
  }
  if (norm)
    for (int k = 0; k < topk; k++) wts[t * topk + k] /= tot;
}

// moe_gateup: grid (ceil(inter/8), n*topk); h[slot, r] = silu(gate·x) * (up·x).
template <typename T>
DEV void moe_gateup(float* h, const float* x, const int* ids, Ptrs gate, Ptrs up, int n, int topk, int dim, int inter,
                    int experts, unsigned* fault) {
  pdl_begin();
  int slot = blockIdx.y;
  int r = blockIdx.x * 8 + (threadIdx.x >> 5);
  if (slot >= n * topk || r >= inter) return;
  int e = ids[slot];
  if (e < 0 || e >= experts) {
    if ((threadIdx.x & 31) == 0) record_fault(fault, FAULT_MOE_EXPERT, slot, e);
    return;
  }
  const float* xr = x + (long)(slot / topk) * dim;
  typedef typename Elem<T>::raw raw;
  float g = warp_dot<T>(static_cast<const raw*>(gate.p[e]) + (long)r * dim, xr, dim);
  float u = warp_dot<T>(static_cast<const raw*>(up.p[e]) + (long)r * dim, xr, dim);
  if ((threadIdx.x & 31) == 0) h[(long)slot * inter + r] = silu(g) * u;
}

// moe_down: grid (ceil(dim/8), n); out[t, r] = sum_k w_k * (down_k[r]·h_k).
template <typename T>
DEV void moe_down(float* out, const float* h, const int* ids, const float* wts, Ptrs down, int n, int topk, int dim,
                  int inter, int experts) {
  pdl_begin();
  int t = blockIdx.y;
  int r = blockIdx.x * 8 + (threadIdx.x >> 5);
  if (t >= n || r >= dim) return;
  typedef typename Elem<T>::raw raw;
  float acc = 0.f;
  for (int k = 0; k < topk; k++) {
    int e = ids[t * topk + k];
    if (e < 0 || e >= experts) continue;
    acc += wts[t * topk + k] *
           warp_dot<T>(static_cast<const raw*>(down.p[e]) + (long)r * inter, h + (long)(t * topk + k) * inter, inter);
  }
  if ((threadIdx.x & 31) == 0) out[(long)t * dim + r] = acc;
}

#define MOE(T, name)                                                                                              \
  extern "C" __global__ void moe_route_##name(int* ids, float* wts, const float* x, const Elem<T>::raw* router,     \
                                              int n, int dim, int experts, int topk, int norm) {                   \
    moe_route<T>(ids, wts, x, router, n, dim, experts, topk, norm);                                                \
  }                                                                                                               \
  extern "C" __global__ void moe_gateup_##name(float* h, const float* x, const int* ids, Ptrs gate, Ptrs up, int n, \
                                               int topk, int dim, int inter, int experts, unsigned* fault) {        \
    moe_gateup<T>(h, x, ids, gate, up, n, topk, dim, inter, experts, fault);                                       \
  }                                                                                                               \
  extern "C" __global__ void moe_down_##name(float* out, const float* h, const int* ids, const float* wts,          \
                                             Ptrs down, int n, int topk, int dim, int inter, int experts) {         \
    moe_down<T>(out, h, ids, wts, down, n, topk, dim, inter, experts);                                             \
  }
MOE(float, f32)
MOE(BF16, bf16)
MOE(F16, f16)
