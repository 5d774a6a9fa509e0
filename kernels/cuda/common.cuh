// Shared helpers for the troupe CUDA kernels. Kernels are plain CUDA C++
// with extern "C" entry points; 16-bit floats travel as raw uint16 bits so
// the sources need no toolkit headers beyond what nvcc always includes.
#pragma once
#include <stdint.h>

#define DEV __device__ __forceinline__

// Fault codes written to the device's fault word when a kernel meets an
// index it must not follow. The host decodes them (gpu/cuda fault.go).
#define FAULT_EMBED_ID 1u
#define FAULT_STOREKV_SLOT 2u
#define FAULT_ATTN_POS 3u
#define FAULT_ATTN_BLOCK 4u
#define FAULT_MOE_EXPERT 5u

// record_fault stores the first fault of a run: word 0 holds the code,
// words 1 and 2 two details (an index and the bad value).
DEV void record_fault(unsigned* f, unsigned code, int a, int b) {
  if (f == nullptr) return;
  if (atomicCAS(f, 0u, code) == 0u) {
    volatile unsigned* v = f;
    v[1] = (unsigned)a;
    v[2] = (unsigned)b;
    __threadfence_system();
  }
}

// Programmatic dependent launch (Hopper). The host may start a kernel
// while the kernel before it on the stream is still running, so that the
// launch and the kernel's prologue overlap the other's tail. pdl_begin
// waits until that kernel has finished and its writes are visible, then
// lets the next kernel start in turn. Every entry point calls it before it
// reads or writes memory another kernel touches (the weights may be read
// before: nothing writes them); kernels_test checks that each one does.
// Both instructions do nothing when the launch was not programmatic, and
// the PTX for older GPUs leaves them out (the host enables the launches on
// the Hopper cubins only).
DEV void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

DEV float bf2f(uint16_t h) { return __uint_as_float(((uint32_t)h) << 16); }
DEV float bflo(uint32_t u) { return __uint_as_float(u << 16); }
DEV float bfhi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

DEV uint16_t f2bf(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

DEV float h2f(uint16_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

DEV uint16_t f2h(float f) {
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

// Element access by storage type: float, or raw 16-bit bf16 / f16.
struct BF16 { uint16_t v; };
struct F16 { uint16_t v; };

template <typename T> struct Elem;
template <> struct Elem<float> {
  typedef float raw;
  static DEV float load(const float* p, long i) { return p[i]; }
  static DEV void store(float* p, long i, float x) { p[i] = x; }
};
template <> struct Elem<BF16> {
  typedef uint16_t raw;
  static DEV float load(const uint16_t* p, long i) { return bf2f(p[i]); }
  static DEV void store(uint16_t* p, long i, float x) { p[i] = f2bf(x); }
};
template <> struct Elem<F16> {
  typedef uint16_t raw;
  static DEV float load(const uint16_t* p, long i) { return h2f(p[i]); }
  static DEV void store(uint16_t* p, long i, float x) { p[i] = f2h(x); }
};

// A product whose x comes as 16-bit rows takes each value v as rounded<T>(v)
// (its rounding to T) or, where it must be as exact as f32 x, as a pair:
// that rounding and the rounding of the remainder v - rounded<T>(v), which
// together carry about twice T's mantissa. round_x and split_x form them in
// kernels of their own; the kernels ahead of a product (the norms,
// silu_rows, the decode attention) store them as they write x, with
// store_x16, so that the product need not.
template <typename T> DEV float rounded(float v) {
  typename Elem<T>::raw h;
  Elem<T>::store(&h, 0, v);
  return Elem<T>::load(&h, 0);
}

// store_x16 stores v rounded to T at q[i] and, with pairs, its remainder's
// rounding at q[total + i] (total: the values of the rounded rows).
template <typename T> DEV void store_x16(uint16_t* q, long i, long total, float v, int pairs) {
  Elem<T>::store(q, i, v);
  if (pairs) Elem<T>::store(q, total + i, v - rounded<T>(v));
}

// Unpacks 8 16-bit floats held in a uint4.
template <typename T> DEV void unpack8(uint4 u, float* o);
template <> DEV void unpack8<BF16>(uint4 u, float* o) {
  o[0] = bflo(u.x); o[1] = bfhi(u.x); o[2] = bflo(u.y); o[3] = bfhi(u.y);
  o[4] = bflo(u.z); o[5] = bfhi(u.z); o[6] = bflo(u.w); o[7] = bfhi(u.w);
}
template <> DEV void unpack8<F16>(uint4 u, float* o) {
  o[0] = h2f(u.x & 0xffff); o[1] = h2f(u.x >> 16); o[2] = h2f(u.y & 0xffff); o[3] = h2f(u.y >> 16);
  o[4] = h2f(u.z & 0xffff); o[5] = h2f(u.z >> 16); o[6] = h2f(u.w & 0xffff); o[7] = h2f(u.w >> 16);
}

// Streaming 16-byte load that skips L1.
DEV uint4 ld_stream(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

// evict_first is an L2 cache policy for bytes a step reads once (a decode
// step's weights, and its cached keys and values when they outgrow the
// L2): the L2 evicts them before anything else, which keeps what is read
// again (the stages of x, a split product's parts, the activations)
// resident while they stream through. evict_normal is the default.
DEV uint64_t evict_first() {
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
DEV uint64_t evict_normal() {
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}

// weight_policy is the L2 policy of a decode product's weights, read
// once a step.
DEV uint64_t weight_policy() { return evict_first(); }

// ld_once is ld_stream for bytes read once a step (weight_policy): the
// decode products' weights.
DEV uint4 ld_once(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "l"(weight_policy()));
  return r;
}

DEV float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// better keeps (v, i) in (bv, bi) when v is larger, or equal at a lower
// index: an argmax whose ties go to the lowest index and which skips NaNs.
DEV void better(float& bv, int& bi, float v, int i) {
  if (v > bv || (v == bv && i < bi)) {
    bv = v;
    bi = i;
  }
}

// block_best reduces (bv, bi) over the block; thread 0 gets the result.
DEV void block_best(float& bv, int& bi, float* sv, int* si) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float v = __shfl_xor_sync(0xffffffffu, bv, o);
    int j = __shfl_xor_sync(0xffffffffu, bi, o);
    better(bv, bi, v, j);
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
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
  }
}

// grid_best finishes an argmax that nb blocks share: block b hands its
// (bv, bi) to pv[b] and pi[b], and the last block to arrive (counted in
// *cnt, which it resets for the next launch) reduces them and stores the
// best index to *out (0 when every value was NaN). Every thread of the
// block calls it.
DEV void grid_best(float bv, int bi, float* pv, int* pi, unsigned* cnt, int* out, int b, int nb) {
  __shared__ float sv[32];
  __shared__ int si[32];
  __shared__ bool last;
  block_best(bv, bi, sv, si);
  if (threadIdx.x == 0) {
    pv[b] = bv;
    pi[b] = bi;
    __threadfence();
    last = atomicAdd(cnt, 1u) == (unsigned)nb - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  bv = -__int_as_float(0x7f800000);
  bi = 0x7fffffff;
  for (int j = threadIdx.x; j < nb; j += blockDim.x) better(bv, bi, __ldcg(pv + j), __ldcg(pi + j));
  block_best(bv, bi, sv, si);
  if (threadIdx.x == 0) {
    *out = bi == 0x7fffffff ? 0 : bi;
    *cnt = 0;
  }
}

DEV float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// block_sum reduces v over the block (blockDim.x a multiple of 32, at most
// 1024); every thread gets the total. scratch holds 32 floats.
DEV float block_sum(float v, float* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  int nw = blockDim.x >> 5;
  v = lane < nw ? scratch[lane] : 0.f;
  return warp_sum(v);
}

// rope_sincos: the sine and cosine of RoPE's angle pos * inv_freq. The
// angle reaches thousands of radians: it is formed and reduced to [-pi, pi]
// in f64, so that f32 rounding of the angle does not become the rotation's
// error, and the reduced angle's sine and cosine are taken in f32 (within
// about 2.4e-7 of the f64 values, at a fraction of f64 sincos's cost).
DEV void rope_sincos(double pos, float inv_freq, float* s, float* c) {
  const double twopi = 6.283185307179586476925286766559;
  double a = pos * (double)inv_freq;
  a -= rint(a * (1.0 / twopi)) * twopi;
  sincosf((float)a, s, c);
}

DEV float silu(float x) { return x / (1.f + expf(-x)); }
