// Paged attention, split over the keys (FlashDecoding) with a tree combine.
//
// attn_split: grid (splits, KVHeads * ceil(G/8), N), 128 threads. A block
// takes one query token, up to 8 query heads that share one KV head (GQA),
// and the split's share of that token's keys 0..pos (the share is computed
// from the token's own position, so a fixed grid serves any context length
// and can be recorded in a graph). It writes an unnormalised partial result
// (running max m, sum l, acc[HD]) per head and split.
//
// attn_combine: grid (N * Heads), HD threads: merges the splits' partials
// (max and sum by a tree reduction in shared memory) into out.
#include "common.cuh"

#define ATT_THREADS 128
#define ATT_TILE 128  // keys per tile: one per thread in the score phase
#define MAXG 8

template <typename T> DEV void load8(const typename Elem<T>::raw* p, float* f);
template <> DEV void load8<float>(const float* p, float* f) {
  float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w; f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
}
template <> DEV void load8<BF16>(const uint16_t* p, float* f) { unpack8<BF16>(*reinterpret_cast<const uint4*>(p), f); }
template <> DEV void load8<F16>(const uint16_t* p, float* f) { unpack8<F16>(*reinterpret_cast<const uint4*>(p), f); }

struct AttnParams {
  int n, heads, kv_heads, hd, block_size, max_blocks, cache_slots, splits, bt_rows;
  float scale;
};

template <typename T, int HD>
DEV void attn_split(float* part_acc, float* part_ml, const float* q, const typename Elem<T>::raw* kc,
                    const typename Elem<T>::raw* vc, const int* pos, const int* seq, const int* bt, AttnParams a,
                    unsigned* fault) {
  // Value phase: each thread owns DV consecutive elements of a V row; TPR
  // threads cover a row, KP rows (key partitions) are read at once.
  constexpr int DV = 8;
  constexpr int TPR = HD / DV;
  constexpr int KP = ATT_THREADS / TPR;
  __shared__ __align__(16) float qs[MAXG][HD];
  __shared__ float ps[MAXG][ATT_TILE];
  __shared__ int slot_s[ATT_TILE];
  __shared__ float m_s[MAXG], l_s[MAXG], scale_s[MAXG];
  __shared__ float red[KP][MAXG][HD];

  int split = blockIdx.x, t = blockIdx.z;
  int group = a.heads / a.kv_heads;
  int ngroup = (group + MAXG - 1) / MAXG;
  int kh = blockIdx.y / ngroup;
  int h0 = kh * group + (blockIdx.y % ngroup) * MAXG;
  int G = min(MAXG, kh * group + group - h0);
  int tid = threadIdx.x;
  int p = pos[t], s = seq[t];
  int ctx_cap = a.max_blocks * a.block_size;
  bool bad = p < 0 || p >= ctx_cap || s < 0 || s >= a.bt_rows;
  if (bad && tid == 0 && split == 0 && blockIdx.y == 0) record_fault(fault, FAULT_ATTN_POS, t, p);
  int len = bad ? 0 : p + 1;
  // Whole tiles per split: a short context uses fewer splits and leaves
  // the rest empty, so one grid serves every length.
  int chunk = (len + a.splits - 1) / a.splits;
  chunk = (chunk + ATT_TILE - 1) / ATT_TILE * ATT_TILE;
  int j0 = split * chunk, j1 = min(len, j0 + chunk);

  for (int i = tid; i < MAXG * HD; i += ATT_THREADS) {
    int g = i / HD, d = i % HD;
    qs[g][d] = g < G ? q[((long)t * a.heads + h0 + g) * HD + d] : 0.f;
  }
  if (tid < MAXG) {
    m_s[tid] = -__int_as_float(0x7f800000);
    l_s[tid] = 0.f;
  }
  // Value-phase ownership: elements d0..d0+DV of each head, keys kp, kp+KP, ...
  int kp = tid / TPR, d0 = (tid % TPR) * DV;
  float acc[MAXG][DV];
#pragma unroll
  for (int g = 0; g < MAXG; g++)
#pragma unroll
    for (int e = 0; e < DV; e++) acc[g][e] = 0.f;
  long kw = (long)a.kv_heads * HD;
  __syncthreads();

  for (int tile = j0; tile < j1; tile += ATT_TILE) {
    int nk = min(ATT_TILE, j1 - tile);
    // Scores: one key per thread.
    float sc[MAXG];
    int j = tile + tid;
    int slot = -1;
    if (tid < nk) {
      int blk = bt[(long)s * a.max_blocks + j / a.block_size];
      long sl = (long)blk * a.block_size + j % a.block_size;
      slot = (int)sl;
      if (blk < 0 || sl >= a.cache_slots) {
        record_fault(fault, FAULT_ATTN_BLOCK, t, blk);
        slot = -1;
      }
    }
    slot_s[tid] = slot < 0 ? 0 : slot;  // masked keys read slot 0 with probability 0
#pragma unroll
    for (int g = 0; g < MAXG; g++) sc[g] = 0.f;
    if (slot >= 0) {
      const typename Elem<T>::raw* kr = kc + slot * kw + (long)kh * HD;
#pragma unroll
      for (int d = 0; d < HD; d += 8) {
        float f[8];
        load8<T>(kr + d, f);
#pragma unroll
        for (int g = 0; g < MAXG; g++) {
          if (g < G) {
            float4 qa = *reinterpret_cast<const float4*>(&qs[g][d]);
            float4 qb = *reinterpret_cast<const float4*>(&qs[g][d + 4]);
            sc[g] += f[0] * qa.x + f[1] * qa.y + f[2] * qa.z + f[3] * qa.w + f[4] * qb.x + f[5] * qb.y +
                     f[6] * qb.z + f[7] * qb.w;
          }
        }
      }
    }
#pragma unroll
    for (int g = 0; g < MAXG; g++)
      ps[g][tid] = (slot >= 0 && g < G) ? sc[g] * a.scale : -__int_as_float(0x7f800000);
    __syncthreads();
    // Online softmax: warp w handles heads w, w+4.
    int lane = tid & 31, warp = tid >> 5;
    for (int g = warp; g < G; g += ATT_THREADS / 32) {
      float mx = -__int_as_float(0x7f800000);
      for (int i = lane; i < ATT_TILE; i += 32) mx = fmaxf(mx, ps[g][i]);
      mx = warp_max(mx);
      float mold = m_s[g];
      float mnew = fmaxf(mold, mx);
      float sum = 0.f;
      for (int i = lane; i < ATT_TILE; i += 32) {
        float e = mnew == -__int_as_float(0x7f800000) ? 0.f : __expf(ps[g][i] - mnew);
        ps[g][i] = e;
        sum += e;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        float c = mold == -__int_as_float(0x7f800000) ? 0.f : __expf(mold - mnew);
        scale_s[g] = c;
        l_s[g] = l_s[g] * c + sum;
        m_s[g] = mnew;
      }
    }
    __syncthreads();
    // Values, UNR keys per thread at a time with all their loads first.
#pragma unroll
    for (int g = 0; g < MAXG; g++) {
      float c = g < G ? scale_s[g] : 0.f;
#pragma unroll
      for (int e = 0; e < DV; e++) acc[g][e] *= c;
    }
    constexpr int UNR = 4;
    for (int jb = kp; jb < nk; jb += UNR * KP) {
      float v[UNR][DV];
#pragma unroll
      for (int u = 0; u < UNR; u++) {
        int jj = jb + u * KP;
        load8<T>(vc + (long)slot_s[jj < nk ? jj : 0] * kw + (long)kh * HD + d0, v[u]);
      }
#pragma unroll
      for (int u = 0; u < UNR; u++) {
        int jj = jb + u * KP;
        if (jj < nk) {
#pragma unroll
          for (int g = 0; g < MAXG; g++) {
            if (g < G) {
              float pj = ps[g][jj];
#pragma unroll
              for (int e = 0; e < DV; e++) acc[g][e] = fmaf(pj, v[u][e], acc[g][e]);
            }
          }
        }
      }
    }
    __syncthreads();
  }
  // Reduce the key partitions and write the partials.
#pragma unroll
  for (int g = 0; g < MAXG; g++)
    if (g < G) {
#pragma unroll
      for (int e = 0; e < DV; e++) red[kp][g][d0 + e] = acc[g][e];
    }
  __syncthreads();
  for (int i = tid; i < G * HD; i += ATT_THREADS) {
    int g = i / HD, d = i % HD;
    float v = 0.f;
#pragma unroll
    for (int r = 0; r < KP; r++) v += red[r][g][d];
    long o = ((long)t * a.heads + h0 + g) * a.splits + split;
    part_acc[o * HD + d] = v;
    if (d == 0) {
      part_ml[o * 2] = m_s[g];
      part_ml[o * 2 + 1] = l_s[g];
    }
  }
}

#define SPLIT(T, name, HD)                                                                                       \
  extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                                      \
      attn_split_##name##_hd##HD(float* part_acc, float* part_ml, const float* q, const Elem<T>::raw* kc,        \
                                 const Elem<T>::raw* vc, const int* pos, const int* seq, const int* bt,           \
                                 AttnParams a, unsigned* fault) {                                                \
    attn_split<T, HD>(part_acc, part_ml, q, kc, vc, pos, seq, bt, a, fault);                                     \
  }
SPLIT(float, f32, 64) SPLIT(float, f32, 128) SPLIT(float, f32, 256)
SPLIT(BF16, bf16, 64) SPLIT(BF16, bf16, 128) SPLIT(BF16, bf16, 256)
SPLIT(F16, f16, 64) SPLIT(F16, f16, 128) SPLIT(F16, f16, 256)

// attn_combine: blockDim.x == hd (at most 256); splits at most 1024.
extern "C" __global__ void attn_combine(float* out, const float* part_acc, const float* part_ml, int n_heads, int hd,
                                        int splits) {
  __shared__ float red[256];
  __shared__ float M_s, L_s;
  int th = blockIdx.x;
  int d = threadIdx.x;
  const float* ml = part_ml + (long)th * splits * 2;
  // Tree reduction of the maximum over splits.
  float mx = -__int_as_float(0x7f800000);
  for (int s = d; s < splits; s += blockDim.x) mx = fmaxf(mx, ml[s * 2]);
  red[d] = mx;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (d < w) red[d] = fmaxf(red[d], red[d + w]);
    __syncthreads();
  }
  if (d == 0) M_s = red[0];
  __syncthreads();
  float M = M_s;
  float l = 0.f;
  for (int s = d; s < splits; s += blockDim.x) {
    float m = ml[s * 2];
    if (m != -__int_as_float(0x7f800000)) l += __expf(m - M) * ml[s * 2 + 1];
  }
  red[d] = l;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (d < w) red[d] += red[d + w];
    __syncthreads();
  }
  if (d == 0) L_s = red[0];
  __syncthreads();
  float L = L_s;
  float acc = 0.f;
  for (int s = 0; s < splits; s++) {
    float m = ml[s * 2];
    if (m != -__int_as_float(0x7f800000)) acc += __expf(m - M) * part_acc[((long)th * splits + s) * hd + d];
  }
  out[(long)th * hd + d] = L > 0.f ? acc / L : 0.f;
}
