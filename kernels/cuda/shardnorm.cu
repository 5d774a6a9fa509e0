// Tensor parallelism: OLMo 2's QK-norm spans the whole q (k) projection,
// which the ranks hold in slices. Each rank sums the squares of its slice
// (sumsq2), the ranks all-reduce those sums, and each normalises its slice
// with the total (rmsnorm_shard). One block per row.
#include "common.cuh"

// sumsq2: out[row] = sum of a[row, :]^2 for rows [0, n), then
// out[n + row] = sum of b[row, :]^2.
extern "C" __global__ void __launch_bounds__(1024) sumsq2_f32(float* out, const float* a, const float* b, int n, int wa, int wb) {
  pdl_begin();
  __shared__ float scratch[32];
  int row = blockIdx.x;
  const float* x = row < n ? a + (long)row * wa : b + (long)(row - n) * wb;
  int w = row < n ? wa : wb;
  float ss = 0.f;
  for (int j = threadIdx.x; j < w; j += blockDim.x) {
    float v = x[j];
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  if (threadIdx.x == 0) out[row] = ss;
}

// rmsnorm_shard: x[row, :] *= w / sqrt(ss[row] * inv_total + eps), where
// ss holds the sums of squares over the whole projection (every rank's
// slice) and inv_total is 1 / its width.
template <typename T>
DEV void rmsnorm_shard(float* x, const float* ss, const typename Elem<T>::raw* w, int n, int dim, float inv_total,
                       float eps) {
  pdl_begin();
  int row = blockIdx.x;
  if (row >= n) return;
  float inv = rsqrtf(ss[row] * inv_total + eps);
  float* xr = x + (long)row * dim;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) xr[j] = xr[j] * inv * Elem<T>::load(w, j);
}

#define SHARDNORM(T, name)                                                                                                 \
  extern "C" __global__ void __launch_bounds__(1024)                                                                       \
      rmsnorm_shard_##name(float* x, const float* ss, const Elem<T>::raw* w, int n, int dim, float inv_total, float eps) { \
    rmsnorm_shard<T>(x, ss, w, n, dim, inv_total, eps);                                                                    \
  }

SHARDNORM(float, f32)
SHARDNORM(BF16, bf16)
SHARDNORM(F16, f16)
