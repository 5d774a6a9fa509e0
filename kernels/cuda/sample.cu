// Token draws from rows of logits on the device, as gpu.SampleHost
// (gpu/sample.go) defines them: one block of ST threads a row, each thread
// a contiguous chunk of the row.
//
// Greedy rows take the first largest logit. Unfiltered draws sum
// exp(l/T - max/T) in float64 over each chunk, scan the chunks' sums in
// index order and let the chunk holding u·total walk to the token.
// Filtered draws keep k candidates: top-k's k (at most 1024), or, for
// top-p and min-p over the whole row, its 1024 most likely tokens, the
// head of the sorted order. They find the k-th largest logit by a radix
// select over order-preserving keys (four passes of 8-bit digits), gather
// the k candidates (ties to the lower index) into shared memory, sort them
// by a bitonic network, and run the host's float64 loop over them in one
// thread. A whole-row draw whose filters the head does not settle (it
// would keep more than 1024 tokens) writes -1: the caller draws that row
// on the host. NaN logits count as -Inf.
#include "common.cuh"

#define ST 1024          // threads a row
#define SAMPLE_ROWS 64   // rows a launch (the rows travel by value)
#define SAMPLE_TOPK 1024 // gpu.MaxSampleTopK

// SampleRow is gpu.SampleRow as the host packs it.
struct SampleRow {
  float temperature, top_p, min_p;
  int top_k;
  double u;
};
struct SampleRows {
  SampleRow r[SAMPLE_ROWS];
};

DEV float clean(float f) { return f != f ? -__int_as_float(0x7f800000) : f; }

// okey orders floats (NaN as -Inf) as unsigned integers.
DEV unsigned okey(float f) {
  unsigned b = __float_as_uint(clean(f));
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// block_sum adds v over the block; every thread gets the sum.
DEV unsigned block_sum(unsigned v, unsigned* sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // sh is free
  if (lane == 0) sh[w] = v;
  __syncthreads();
  v = lane < (int)(blockDim.x >> 5) ? sh[lane] : 0u;
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// block_scan returns the sum of v over the threads before this one (in
// thread order) and sets total to the sum over all.
template <typename T>
DEV T block_scan(T v, T* sh, T& total) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  T x = v;
  for (int o = 1; o < 32; o <<= 1) {
    T y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  T before = __shfl_up_sync(0xffffffffu, x, 1);
  if (lane == 0) before = T(0);
  __syncthreads();  // sh is free
  if (lane == 31) sh[w] = x;
  __syncthreads();
  if (w == 0) {
    T s = lane < nw ? sh[lane] : T(0);
    for (int o = 1; o < 32; o <<= 1) {
      T y = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += y;
    }
    if (lane < nw) sh[lane] = s;
  }
  __syncthreads();
  total = sh[nw - 1];
  return (w ? sh[w - 1] : T(0)) + before;
}

// before: candidate a comes before b (larger logit, then lower index).
DEV bool before(float av, int ai, float bv, int bi) { return av > bv || (av == bv && ai < bi); }

// kth_key returns the k-th largest of the row's keys (okey), 1 ≤ k ≤
// width: a digit of 8 bits a pass from the top, each pass counting the
// keys that share the digits found so far (one shared-memory add per
// warp and digit).
DEV unsigned kth_key(const float* __restrict__ l, int width, unsigned k, unsigned* hist, unsigned* sel) {
  int tid = threadIdx.x, lane = tid & 31;
  unsigned prefix = 0u, mask = 0u;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += ST) hist[i] = 0u;
    __syncthreads();
    for (int base = 0; base < width; base += ST) {
      int i = base + tid;
      unsigned key = i < width ? okey(l[i]) : 0u;
      bool in = i < width && (key & mask) == prefix;
      unsigned bin = in ? (key >> shift) & 255u : 256u;
      unsigned peers = __match_any_sync(0xffffffffu, bin);
      if (in && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (unsigned)__popc(peers));
    }
    __syncthreads();
    // The digit: the largest d whose count of keys with this digit or a
    // larger one reaches k; lane L of warp 0 takes digits 255-8L down.
    if (tid < 32) {
      unsigned c[8], s = 0u;
#pragma unroll
      for (int j = 0; j < 8; j++) s += c[j] = hist[255 - (lane * 8 + j)];
      unsigned x = s;
      for (int o = 1; o < 32; o <<= 1) {
        unsigned y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
      }
      unsigned acc = x - s;
#pragma unroll
      for (int j = 0; j < 8; j++) {
        if (acc < k && acc + c[j] >= k) sel[0] = 255 - (lane * 8 + j), sel[1] = acc;
        acc += c[j];
      }
    }
    __syncthreads();
    prefix |= sel[0] << shift;
    mask |= 255u << shift;
    k -= sel[1];
  }
  return prefix;
}

extern "C" __global__ void __launch_bounds__(ST) sample_rows(int* __restrict__ out, const float* __restrict__ logits,
                                                             int width, SampleRows rows) {
  __shared__ unsigned shu[32];
  __shared__ double shd[32];
  __shared__ float bv_s[32];
  __shared__ int bi_s[32];
  __shared__ unsigned hist[256], sel[2];
  __shared__ float cv[SAMPLE_TOPK];
  __shared__ int ci[SAMPLE_TOPK];
  __shared__ double pr[SAMPLE_TOPK];
  __shared__ int pick_s;
  __shared__ unsigned fill;
  pdl_begin();
  const SampleRow p = rows.r[blockIdx.x];
  const float* l = logits + (long)blockIdx.x * width;
  int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  int chunk = (width + ST - 1) / ST, c0 = min(width, tid * chunk), c1 = min(width, c0 + chunk);

  // The first largest logit (each thread's first among its equals, then
  // the lowest index).
  float bv = -__int_as_float(0x7f800000);
  int bi = 0x7fffffff;
  for (int i = tid; i < width; i += ST) {
    float v = clean(l[i]);
    if (v > bv || bi == 0x7fffffff) bv = v, bi = i;
  }
  for (int o = 16; o; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
  }
  if (lane == 0) bv_s[w] = bv, bi_s[w] = bi;
  __syncthreads();
  bv = bv_s[0], bi = bi_s[0];
  for (int i = 1; i < ST / 32; i++)
    if (bv_s[i] > bv || (bv_s[i] == bv && bi_s[i] < bi)) bv = bv_s[i], bi = bi_s[i];
  if (bi == 0x7fffffff) bi = 0;
  if (p.temperature == 0.f) {
    if (tid == 0) out[blockIdx.x] = bi;
    return;
  }
  const double t = (double)p.temperature, top = (double)bv / t;
  const bool plain = p.top_k == 0 && (p.top_p == 0.f || p.top_p >= 1.f) && p.min_p == 0.f;
  const bool whole = p.top_k == 0 || p.top_k >= width;  // top-p or min-p over the whole row

  // The row's sum of exp(l/T - max/T), in chunk order for the walk.
  double s = 0.0, total = 0.0, excl = 0.0;
  if (plain || whole) {
    for (int i = c0; i < c1; i++) s += exp((double)clean(l[i]) / t - top);
    excl = block_scan(s, shd, total);
  }
  if (plain) {
    double r = p.u * total;
    if (tid == 0) pick_s = 0x7fffffff;
    __syncthreads();
    if (c0 < c1 && r >= excl && r < excl + s) {
      double rr = r - excl;
      for (int i = c0; i < c1; i++) {
        rr -= exp((double)clean(l[i]) / t - top);
        if (rr < 0.0) {
          atomicMin(&pick_s, i);
          break;
        }
      }
    }
    __syncthreads();
    if (tid == 0) out[blockIdx.x] = pick_s == 0x7fffffff ? bi : pick_s;
    return;
  }

  // The k candidates: every key above the k-th largest, K, and as many of
  // those equal to it as fit, the lowest indexes first.
  unsigned k = (unsigned)min(whole ? SAMPLE_TOPK : p.top_k, width);
  unsigned K = kth_key(l, width, k, hist, sel);
  unsigned gt = 0, ties = 0;
  for (int i = c0; i < c1; i++) {
    unsigned key = okey(l[i]);
    gt += key > K;
    ties += key == K;
  }
  unsigned ngt = block_sum(gt, shu), tot;
  unsigned rank = block_scan(ties, shu, tot);  // ties before this chunk
  unsigned need = k - ngt;
  if (tid == 0) fill = 0;
  for (int i = tid; i < SAMPLE_TOPK; i += ST) cv[i] = -__int_as_float(0x7f800000), ci[i] = 0x7fffffff;
  __syncthreads();
  for (int i = c0; i < c1; i++) {
    unsigned key = okey(l[i]);
    if (key > K) {
      unsigned at = atomicAdd(&fill, 1u);
      cv[at] = clean(l[i]), ci[at] = i;
    } else if (key == K) {
      if (rank < need) cv[ngt + rank] = clean(l[i]), ci[ngt + rank] = i;
      rank++;
    }
  }
  __syncthreads();
  for (int size = 2; size <= SAMPLE_TOPK; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = tid; i < SAMPLE_TOPK; i += ST) {
        int j = i ^ stride;
        if (j > i) {
          bool sw = (i & size) == 0 ? before(cv[j], ci[j], cv[i], ci[i]) : before(cv[i], ci[i], cv[j], ci[j]);
          if (sw) {
            float v = cv[i];
            int x = ci[i];
            cv[i] = cv[j], ci[i] = ci[j], cv[j] = v, ci[j] = x;
          }
        }
      }
      __syncthreads();
    }
  for (int i = tid; i < (int)k; i += ST) pr[i] = exp((double)cv[i] / t - top);
  __syncthreads();
  if (tid != 0) return;
  // Normalised among the candidates (top-k), or over the row.
  if (!whole) {
    total = 0.0;
    for (int i = 0; i < (int)k; i++) total += pr[i];
  }
  for (int i = 0; i < (int)k; i++) pr[i] /= total;
  int kk = k;
  bool known = !whole || (int)k == width;
  if (p.min_p > 0.f) {
    double cut = (double)p.min_p * pr[0];
    while (kk > 1 && pr[kk - 1] < cut) kk--;
    known = known || kk < (int)k;
  }
  if (p.top_p > 0.f && p.top_p < 1.f) {
    double acc = 0.0;
    for (int i = 0; i < kk; i++) {
      acc += pr[i];
      if (acc >= (double)p.top_p) {
        kk = i + 1;
        known = true;
        break;
      }
    }
  }
  if (!known) {
    out[blockIdx.x] = -1;
    return;
  }
  double sum = 0.0;
  for (int i = 0; i < kk; i++) sum += pr[i];
  double r = p.u * sum;
  int pick = kk - 1;
  for (int i = 0; i < kk; i++) {
    r -= pr[i];
    if (r < 0.0) {
      pick = i;
      break;
    }
  }
  out[blockIdx.x] = ci[pick];
}
