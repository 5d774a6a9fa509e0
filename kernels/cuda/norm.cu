// RMSNorm and its fused residual variants; one block per row, up to 1,024
// threads (a row of 4,096 or more takes all of them, so registers are held
// to 64 a thread).
//   mode 0: out = rmsnorm(x) * w                      (out may alias x)
//   mode 1: r += x; out = rmsnorm(r) * w               (pre-norm residual)
//   mode 2: r += rmsnorm(x) * w; out unused            (post-norm residual)
// With xq not null (16-bit w only), the rows the next product reads (out,
// or r in mode 2) are also stored rounded to w's type, as round_x would;
// with pairs, the remainders' roundings follow the n rows, as split_x
// writes them.
#include "common.cuh"

template <typename T, int MODE>
DEV void rmsnorm(float* out, float* r, const float* x, const typename Elem<T>::raw* w, int n, int dim, float eps,
                 typename Elem<T>::raw* xq, int pairs) {
  constexpr int E = 8;  // elements a thread holds in registers when the row fits
  __shared__ float scratch[32];
  const int nb = blockDim.x;
  const bool fits = dim <= E * nb;
  float wv[E];
  if (fits) {  // the weights first: nothing writes them
#pragma unroll
    for (int e = 0; e < E; e++) {
      int j = threadIdx.x + e * nb;
      wv[e] = j < dim ? Elem<T>::load(w, j) : 0.f;
    }
  }
  pdl_begin();
  int row = blockIdx.x;
  if (row >= n) return;
  const float* xr = x + (long)row * dim;
  float* rr = r + (long)row * dim;
  float* orow = out + (long)row * dim;
  auto keep = [&](int j, float v) {
    if constexpr (sizeof(typename Elem<T>::raw) == 2) {
      if (xq != nullptr) store_x16<T>(xq, (long)row * dim + j, (long)n * dim, v, pairs);
    }
  };
  float ss = 0.f;
  if (fits) {
    // One pass over memory: x (and r) into registers, the sum, the stores.
    float xv[E], rv[E];
#pragma unroll
    for (int e = 0; e < E; e++) {
      int j = threadIdx.x + e * nb;
      xv[e] = j < dim ? xr[j] : 0.f;
      rv[e] = (MODE != 0 && j < dim) ? rr[j] : 0.f;
    }
#pragma unroll
    for (int e = 0; e < E; e++) {
      if (MODE == 1) {
        xv[e] += rv[e];
        int j = threadIdx.x + e * nb;
        if (j < dim) rr[j] = xv[e];
      }
      ss += xv[e] * xv[e];
    }
    ss = block_sum(ss, scratch);
    float inv = rsqrtf(ss / (float)dim + eps);
#pragma unroll
    for (int e = 0; e < E; e++) {
      int j = threadIdx.x + e * nb;
      if (j >= dim) continue;
      float v = xv[e] * inv * wv[e];
      if (MODE == 2) v += rv[e], rr[j] = v;
      else orow[j] = v;
      keep(j, v);
    }
    return;
  }
  for (int j = threadIdx.x; j < dim; j += nb) {
    float v = xr[j];
    if (MODE == 1) {
      v += rr[j];
      rr[j] = v;
    }
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  float inv = rsqrtf(ss / (float)dim + eps);
  for (int j = threadIdx.x; j < dim; j += nb) {
    float v = (MODE == 1 ? rr[j] : xr[j]) * inv * Elem<T>::load(w, j);
    if (MODE == 2) v += rr[j], rr[j] = v;
    else orow[j] = v;
    keep(j, v);
  }
}

#define NORM(T, name)                                                                                        \
  extern "C" __global__ void __launch_bounds__(1024) rmsnorm_##name(                                                 \
      float* out, const float* x, const Elem<T>::raw* w, int n, int dim, float eps, Elem<T>::raw* xq, int pairs) {   \
    rmsnorm<T, 0>(out, nullptr, x, w, n, dim, eps, xq, pairs);                                                       \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(1024)                                                                 \
      add_rmsnorm_##name(float* out, float* r, const float* x, const Elem<T>::raw* w, int n, int dim, float eps,     \
                         Elem<T>::raw* xq, int pairs) {                                                              \
    rmsnorm<T, 1>(out, r, x, w, n, dim, eps, xq, pairs);                                                             \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(1024) rmsnorm_add_##name(                                             \
      float* r, const float* x, const Elem<T>::raw* w, int n, int dim, float eps, Elem<T>::raw* xq, int pairs) {     \
    rmsnorm<T, 2>(nullptr, r, x, w, n, dim, eps, xq, pairs);                                                         \
  }

NORM(float, f32)
NORM(BF16, bf16)
NORM(F16, f16)
