// RMSNorm and its fused residual variants; one block per row.
//   mode 0: out = rmsnorm(x) * w                      (out may alias x)
//   mode 1: r += x; out = rmsnorm(r) * w               (pre-norm residual)
//   mode 2: r += rmsnorm(x) * w; out unused            (post-norm residual)
#include "common.cuh"

template <typename T, int MODE>
DEV void rmsnorm(float* out, float* r, const float* x, const typename Elem<T>::raw* w, int n, int dim, float eps) {
  pdl_begin();
  __shared__ float scratch[32];
  int row = blockIdx.x;
  if (row >= n) return;
  const float* xr = x + (long)row * dim;
  float* rr = r + (long)row * dim;
  float* orow = out + (long)row * dim;
  float ss = 0.f;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) {
    float v = xr[j];
    if (MODE == 1) {
      v += rr[j];
      rr[j] = v;
    }
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  float inv = rsqrtf(ss / (float)dim + eps);
  for (int j = threadIdx.x; j < dim; j += blockDim.x) {
    float v = (MODE == 1 ? rr[j] : xr[j]) * inv * Elem<T>::load(w, j);
    if (MODE == 2) rr[j] += v;
    else orow[j] = v;
  }
}

#define NORM(T, name)                                                                                        \
  extern "C" __global__ void rmsnorm_##name(float* out, const float* x, const Elem<T>::raw* w, int n, int dim, \
                                            float eps) {                                                     \
    rmsnorm<T, 0>(out, nullptr, x, w, n, dim, eps);                                                           \
  }                                                                                                          \
  extern "C" __global__ void add_rmsnorm_##name(float* out, float* r, const float* x, const Elem<T>::raw* w,   \
                                                int n, int dim, float eps) {                                 \
    rmsnorm<T, 1>(out, r, x, w, n, dim, eps);                                                                 \
  }                                                                                                          \
  extern "C" __global__ void rmsnorm_add_##name(float* r, const float* x, const Elem<T>::raw* w, int n,        \
                                                int dim, float eps) {                                        \
    rmsnorm<T, 2>(nullptr, r, x, w, n, dim, eps);                                                             \
  }

NORM(float, f32)
NORM(BF16, bf16)
NORM(F16, f16)
