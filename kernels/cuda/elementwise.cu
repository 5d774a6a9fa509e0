// Elementwise operations, RoPE, KV stores and argmax.
#include "common.cuh"

extern "C" __global__ void add_f32(float* out, const float* a, const float* b, int n) {
  pdl_begin();
  int n4 = n >> 2;
  int stride = gridDim.x * blockDim.x;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
    float4 x = reinterpret_cast<const float4*>(a)[i];
    float4 y = reinterpret_cast<const float4*>(b)[i];
    reinterpret_cast<float4*>(out)[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
  }
  for (int i = (n4 << 2) + blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = a[i] + b[i];
}

extern "C" __global__ void silumul_f32(float* out, const float* g, const float* u, int n) {
  pdl_begin();
  int n4 = n >> 2;
  int stride = gridDim.x * blockDim.x;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
    float4 x = reinterpret_cast<const float4*>(g)[i];
    float4 y = reinterpret_cast<const float4*>(u)[i];
    reinterpret_cast<float4*>(out)[i] = make_float4(silu(x.x) * y.x, silu(x.y) * y.y, silu(x.z) * y.z, silu(x.w) * y.w);
  }
  for (int i = (n4 << 2) + blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = silu(g[i]) * u[i];
}

// RoPE, rotate-half layout, in place on x [n, heads, hd]; one block per
// (token, head), one thread per rotated pair.
extern "C" __global__ void rope_f32(float* x, const int* pos, const float* inv_freq, int n, int heads, int hd) {
  pdl_begin();
  int th = blockIdx.x;
  if (th >= n * heads) return;
  int t = th / heads;
  int half = hd >> 1;
  double p = (double)pos[t];
  float* row = x + (long)th * hd;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float s, c;
    rope_sincos(p, inv_freq[i], &s, &c);
    float a = row[i], b = row[i + half];
    row[i] = a * c - b * s;
    row[i + half] = b * c + a * s;
  }
}

// StoreKV: kc/vc slot s holds width elements; the caches hold cap slots.
template <typename T>
DEV void storekv(typename Elem<T>::raw* kc, typename Elem<T>::raw* vc, const float* k, const float* v, const int* slots,
                 int n, int width, int cap, unsigned* fault) {
  pdl_begin();
  int t = blockIdx.x;
  if (t >= n) return;
  int s = slots[t];
  if (s < 0 || s >= cap) {
    if (threadIdx.x == 0) record_fault(fault, FAULT_STOREKV_SLOT, t, s);
    return;
  }
  long d = (long)s * width, o = (long)t * width;
  for (int j = threadIdx.x; j < width; j += blockDim.x) {
    Elem<T>::store(kc, d + j, k[o + j]);
    Elem<T>::store(vc, d + j, v[o + j]);
  }
}

extern "C" __global__ void storekv_f32(float* kc, float* vc, const float* k, const float* v, const int* slots, int n,
                                       int width, int cap, unsigned* fault) {
  storekv<float>(kc, vc, k, v, slots, n, width, cap, fault);
}
extern "C" __global__ void storekv_bf16(uint16_t* kc, uint16_t* vc, const float* k, const float* v, const int* slots,
                                        int n, int width, int cap, unsigned* fault) {
  storekv<BF16>(kc, vc, k, v, slots, n, width, cap, fault);
}
extern "C" __global__ void storekv_f16(uint16_t* kc, uint16_t* vc, const float* k, const float* v, const int* slots,
                                       int n, int width, int cap, unsigned* fault) {
  storekv<F16>(kc, vc, k, v, slots, n, width, cap, fault);
}

// Argmax over rows of width; ties go to the lowest index, NaNs are skipped
// (a row of NaNs gives 0). gridDim.x blocks share a row (blockIdx.y), each
// taking a chunk, and the last to finish reduces their results
// (grid_best, with cnt[row]).
extern "C" __global__ void argmax_f32(int* out, const float* logits, int n, int width, float* pv, int* pi,
                                      unsigned* cnt) {
  pdl_begin();
  int row = blockIdx.y;
  if (row >= n) return;
  const float* x = logits + (long)row * width;
  int chunk = (width + gridDim.x - 1) / gridDim.x;
  int lo = blockIdx.x * chunk, hi = min(width, lo + chunk);
  float bv = -__int_as_float(0x7f800000);
  int bi = 0x7fffffff;
  for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) better(bv, bi, x[i], i);
  long p = (long)row * gridDim.x;
  grid_best(bv, bi, pv + p, pi + p, cnt + row, out + row, blockIdx.x, gridDim.x);
}

// Read-only bandwidth probe: sums n4 float4s into *out.
extern "C" __global__ void reduce_sum_f32(float* out, const float4* x, long n4) {
  pdl_begin();
  __shared__ float scratch[32];
  float s = 0.f;
  long stride = (long)gridDim.x * blockDim.x;
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n4; i += 4 * stride) {
    float4 a = __ldcs(x + i), b = __ldcs(x + i + stride), c = __ldcs(x + i + 2 * stride), d = __ldcs(x + i + 3 * stride);
    s += (a.x + a.y + a.z + a.w) + (b.x + b.y + b.z + b.w) + (c.x + c.y + c.z + c.w) + (d.x + d.y + d.z + d.w);
  }
  for (; i < n4; i += stride) {
    float4 a = __ldcs(x + i);
    s += a.x + a.y + a.z + a.w;
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) atomicAdd(out, s);
}

// copy_words: n 32-bit words from src to dst, either of them pinned host
// memory mapped for the device: the small copies between a step's graphs
// (its indexes in, its chosen tokens out) without the copy engine.
extern "C" __global__ void copy_words(unsigned* dst, const unsigned* src, int n) {
  pdl_begin();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}
