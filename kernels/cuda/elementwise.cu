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
    // The angle reaches thousands of radians: form and reduce it in f64 so
    // that f32 rounding of the angle does not become the rotation's error.
    double sd, cd;
    sincos(p * (double)inv_freq[i], &sd, &cd);
    float s = (float)sd, c = (float)cd;
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
// (a row of NaNs gives 0). One block per row.
DEV void better(float& bv, int& bi, float v, int i) {
  if (v > bv || (v == bv && i < bi)) {
    bv = v;
    bi = i;
  }
}

extern "C" __global__ void argmax_f32(int* out, const float* logits, int n, int width) {
  pdl_begin();
  __shared__ float sv[32];
  __shared__ int si[32];
  int row = blockIdx.x;
  if (row >= n) return;
  const float* x = logits + (long)row * width;
  float bv = -__int_as_float(0x7f800000);
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < width; i += blockDim.x) better(bv, bi, x[i], i);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float v = __shfl_xor_sync(0xffffffffu, bv, o);
    int j = __shfl_xor_sync(0xffffffffu, bi, o);
    better(bv, bi, v, j);
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sv[warp] = bv;
    si[warp] = bi;
  }
  __syncthreads();
  if (warp == 0) {
    int nw = blockDim.x >> 5;
    bv = lane < nw ? sv[lane] : -__int_as_float(0x7f800000);
    bi = lane < nw ? si[lane] : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      float v = __shfl_xor_sync(0xffffffffu, bv, o);
      int j = __shfl_xor_sync(0xffffffffu, bi, o);
      better(bv, bi, v, j);
    }
    if (lane == 0) out[row] = bi == 0x7fffffff ? 0 : bi;
  }
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
