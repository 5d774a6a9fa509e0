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
//
// attn_decode: grid (splits, KVHeads * ceil(G/16), N), 128 threads: the
// split kernel's work for 16-bit caches on the tensor cores. A block takes
// one token, up to 16 query heads of one KV head (the rows of the mma
// tiles) and its split's keys, in tiles of 64 double-buffered through
// cp.async, each warp copying and reading 16 keys of a tile (no block
// barrier a tile); the warps' partial results are merged in shared memory
// and written as the split kernel's. Splits without keys return at once,
// and the last split of a (token, KV head) to finish combines the others
// (attn_combine's work, through a counter), unless no counters are given.
//
// attn_mha: grid (splits, Heads / G, N), 128 threads: attn_decode's work
// on the CUDA cores, G = 1 or 2 query heads of a KV head a block (MHA, and
// GQA steps of one token), keys streamed into registers (see the kernel).
//
// attn_prefill: grid (ceil(N/64), Heads), 128 threads: tensor-core
// attention for prompts (FlashAttention-2 style) over the paged cache with
// 16-bit K and V. A block takes 64 query tokens of one head; each warp 16 of
// them. Keys come in tiles of 64 through cp.async, scores and P·V run on
// mma.sync with an online softmax in registers. The tokens of a block may
// belong to several sequences: the block makes one pass per sequence, the
// other rows masked, so any batch is right and a prompt's tokens, which
// share a sequence, take one pass.
#include "mma.cuh"

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

// BlockRow is a sequence's row of the block table, with log2 of the block
// size when that is a power of two (else -1).
struct BlockRow {
  const int* bt;
  int sh;
};

DEV BlockRow block_row(const int* bt, AttnParams a, int s) {
  return {bt + (long)s * a.max_blocks, (a.block_size & (a.block_size - 1)) == 0 ? __ffs(a.block_size) - 1 : -1};
}

// slot_of is key's cache slot through the sequence's block table, or -1
// (the fault recorded for token t) when its block is bad. A block size
// that is a power of two divides by a shift: a general division is tens
// of instructions, and the decode kernels look up a slot for every key
// they read.
DEV int slot_of(BlockRow br, AttnParams a, unsigned* fault, int t, int key) {
  int bi = br.sh >= 0 ? key >> br.sh : key / a.block_size;
  int blk = br.bt[bi];
  long v = (long)blk * a.block_size + (key - bi * a.block_size);
  if (blk < 0 || v >= a.cache_slots) {
    record_fault(fault, FAULT_ATTN_BLOCK, t, blk);
    return -1;
  }
  return (int)v;
}

template <typename T, int HD>
DEV void attn_split(float* part_acc, float* part_ml, const float* q, const typename Elem<T>::raw* kc,
                    const typename Elem<T>::raw* vc, const int* pos, const int* seq, const int* bt, AttnParams a,
                    unsigned* fault) {
  pdl_begin();
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
  const BlockRow br = block_row(bt, a, bad ? 0 : s);

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
    int slot = tid < nk ? slot_of(br, a, fault, t, j) : -1;
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
  pdl_begin();
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

// online_softmax updates the running max m and sum l of a thread's two
// rows (g and g+8 of an m16n8 tile: sc[n][0..1] and sc[n][2..3]) with NT
// tiles of base-2 logits (masked ones -inf), rescales the output o and
// leaves the probabilities in sc. l stays a per-thread partial: the four
// lanes of a row add theirs at the end.
template <int NT, int DT>
DEV void online_softmax(float (&sc)[NT][4], float* m, float* l, float (&o)[DT][4]) {
  const float NEG = -__int_as_float(0x7f800000);
#pragma unroll
  for (int i = 0; i < 2; i++) {
    float mx = NEG;
#pragma unroll
    for (int n = 0; n < NT; n++) mx = fmaxf(mx, fmaxf(sc[n][i * 2], sc[n][i * 2 + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    float mnew = fmaxf(m[i], mx);
    float alpha = m[i] == NEG ? (mnew == NEG ? 1.f : 0.f) : exp2f(m[i] - mnew);
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        float p = mnew == NEG ? 0.f : exp2f(sc[n][i * 2 + e] - mnew);
        sc[n][i * 2 + e] = p;
        sum += p;
      }
    l[i] = l[i] * alpha + sum;
    m[i] = mnew;
#pragma unroll
    for (int d = 0; d < DT; d++) {
      o[d][i * 2] *= alpha;
      o[d][i * 2 + 1] *= alpha;
    }
  }
}

// pack_p turns the probabilities of KT·16 keys (accumulator layout) into
// A fragments for P·V.
template <typename T, int KT>
DEV void pack_p(const float (&sc)[KT * 2][4], uint32_t (&pf)[KT][4]) {
#pragma unroll
  for (int kt = 0; kt < KT; kt++) {
    pf[kt][0] = pack2<T>(sc[2 * kt][0], sc[2 * kt][1]);
    pf[kt][1] = pack2<T>(sc[2 * kt][2], sc[2 * kt][3]);
    pf[kt][2] = pack2<T>(sc[2 * kt + 1][0], sc[2 * kt + 1][1]);
    pf[kt][3] = pack2<T>(sc[2 * kt + 1][2], sc[2 * kt + 1][3]);
  }
}

// qk_tile: s[2j], s[2j+1] += q · K[key0 + 16j .. +16]ᵀ for J pairs of
// 8-key tiles, K a swizzled [keys][HD] tile in shared memory.
template <typename T, int HD, int J>
DEV void qk_tile(float (&s)[2 * J][4], const uint32_t (&qf)[HD / 16][4], const uint16_t* ks, int key0, int lane) {
#pragma unroll
  for (int k = 0; k < HD / 16; k++)
#pragma unroll
    for (int j = 0; j < J; j++) {
      uint32_t b[4];
      ldmatrix_x4(b, ks + swz<HD / 8>(key0 + j * 16 + (lane & 7) + ((lane >> 4) << 3), k * 2 + ((lane >> 3) & 1)));
      mma16816<T>(s[j * 2], qf[k], b);
      mma16816<T>(s[j * 2 + 1], qf[k], b + 2);
    }
}

// pv_tile: o += P · V[key0 .. key0 + 16·KT] with V a swizzled [keys][HD]
// tile in shared memory.
template <typename T, int HD, int KT>
DEV void pv_tile(float (&o)[HD / 8][4], const uint32_t (&pf)[KT][4], const uint16_t* vs, int key0, int lane) {
#pragma unroll
  for (int kt = 0; kt < KT; kt++)
#pragma unroll
    for (int dp = 0; dp < HD / 16; dp++) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, vs + swz<HD / 8>(key0 + kt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, dp * 2 + (lane >> 4)));
      mma16816<T>(o[dp * 2], pf[kt], b);
      mma16816<T>(o[dp * 2 + 1], pf[kt], b + 2);
    }
}

#define PKV 64  // keys per tile

// attn_prefill: 4 warps, 16 query rows each. K and V tiles are
// double-buffered in dynamic shared memory (2 stages of K, then 2 of V:
// 4·PKV·HD·2 bytes), tile j+1 is requested as tile j's scores start, and
// the cache slots of tile j+2 are looked up then (a key a thread, into
// shared memory), so the copies run under the math and one barrier a tile
// suffices. Warps whose rows all lie past a tile's keys skip its mask.
template <typename T, int HD>
DEV void attn_prefill(float* __restrict__ out, const float* __restrict__ q, const uint16_t* __restrict__ kc,
                      const uint16_t* __restrict__ vc, const int* __restrict__ pos, const int* __restrict__ seq,
                      const int* __restrict__ bt, AttnParams a, unsigned* fault) {
  pdl_begin();
  constexpr int PQ = 64, NT = 128;  // query rows and threads a block
  constexpr int CH = HD / 8;      // 16-byte chunks per row
  constexpr int KS = HD / 16;     // k-steps over the head dimension
  constexpr int DT = HD / 8;      // 8-wide output tiles per row
  constexpr int TILE = PKV * HD;  // elements of one K or V tile
  static_assert(PQ * HD <= 2 * TILE, "Q is staged in the K stages");
  const float NEG = -__int_as_float(0x7f800000);
  extern __shared__ __align__(16) uint16_t dsm[];  // K[2][TILE], V[2][TILE]
  uint16_t* Ks = dsm;
  uint16_t* Vs = dsm + 2 * TILE;
  __shared__ int pos_s[PQ], seq_s[PQ];
  __shared__ int pass_seq, pass_max;
  __shared__ unsigned char done_s[PQ];
  __shared__ long slot_s[2][PKV];  // where the next two tiles' keys start (locate)

  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int g = lane >> 2, q4 = lane & 3;
  int tile = gridDim.x - 1 - blockIdx.x;  // the longest rows first
  int t0 = tile * PQ;
  int h = blockIdx.y, kh = h / (a.heads / a.kv_heads);
  long qw = (long)a.heads * HD, kw = (long)a.kv_heads * HD;
  int ctx_cap = a.max_blocks * a.block_size;

  if (tid < PQ) {
    int t = t0 + tid, p = -1, s = -1;
    if (t < a.n) {
      p = pos[t];
      s = seq[t];
      if (p < 0 || p >= ctx_cap || s < 0 || s >= a.bt_rows) {
        if (h == 0) record_fault(fault, FAULT_ATTN_POS, t, p);
        s = -1;
      }
    }
    pos_s[tid] = p;
    seq_s[tid] = s;
    done_s[tid] = s < 0;
  }
  // Q rows, rounded to 16 bits, staged through the K stages into registers.
  for (int i = tid; i < PQ * CH; i += NT) {
    int r = i / CH, c = i % CH, t = t0 + r;
    uint4 u = make_uint4(0, 0, 0, 0);
    if (t < a.n) {
      const float* src = q + t * qw + (long)h * HD + c * 8;
      float4 x0 = *reinterpret_cast<const float4*>(src), x1 = *reinterpret_cast<const float4*>(src + 4);
      u = make_uint4(pack2<T>(x0.x, x0.y), pack2<T>(x0.z, x0.w), pack2<T>(x1.x, x1.y), pack2<T>(x1.z, x1.w));
    }
    *reinterpret_cast<uint4*>(Ks + swz<CH>(r, c)) = u;
  }
  __syncthreads();
  uint32_t qf[KS][4];
#pragma unroll
  for (int ks = 0; ks < KS; ks++) ldmatrix_x4(qf[ks], Ks + swz<CH>(warp * 16 + (lane & 15), ks * 2 + (lane >> 4)));

  // Rows of this thread: r[0] = warp*16+g, r[1] = r[0]+8 (in the block).
  int rl[2] = {warp * 16 + g, warp * 16 + g + 8};
  float o[DT][4];
#pragma unroll
  for (int d = 0; d < DT; d++)
#pragma unroll
    for (int e = 0; e < 4; e++) o[d][e] = 0.f;
  float mrow[2] = {NEG, NEG}, lrow[2] = {0.f, 0.f};
  const float sl2 = a.scale * 1.4426950408889634f;  // softmax in base 2

  for (;;) {
    __syncthreads();  // the stages free (Q read, the last pass done), done_s settled
    if (tid == 0) {
      int s = -1, mx = -1;
      for (int r = 0; r < PQ; r++)
        if (!done_s[r]) {
          if (s < 0) s = seq_s[r];
          if (seq_s[r] == s) {
            mx = max(mx, pos_s[r]);
            done_s[r] = 1;
          }
        }
      pass_seq = s;
      pass_max = mx;
    }
    __syncthreads();
    int s = pass_seq, maxp = pass_max;
    if (s < 0) break;
    bool act[2];
    int prow[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
      act[i] = seq_s[rl[i]] == s;
      prow[i] = pos_s[rl[i]];
    }
    int ntiles = maxp / PKV + 1;
    const BlockRow br = block_row(bt, a, s);
    // Each thread copies chunks tid + NT*i of a tile: rows tid/CH + (NT/CH)*i.
    constexpr int RPI = NT / CH, NI = PKV / RPI;
    static_assert(PKV % RPI == 0 && PKV <= NT, "whole rows a pass, a thread a key");
    // locate puts where tile j's keys start in the caches (the head's
    // slice of each key's slot) in slot_s[j & 1], a key a thread (-1 past
    // the pass's last key or at a bad block).
    auto locate = [&](int j) {
      if (tid < PKV) {
        int key = j * PKV + tid;
        int sl = key <= maxp ? slot_of(br, a, fault, t0, key) : -1;
        slot_s[j & 1][tid] = sl < 0 ? -1 : (long)sl * kw + (long)kh * HD;
      }
    };
    // issue requests tile j's keys and values into stage j & 1.
    auto issue = [&](int j) {
      int c = tid % CH, st = j & 1;
#pragma unroll
      for (int i = 0; i < NI; i++) {
        int r = tid / CH + RPI * i;
        long off = slot_s[st][r];
        bool ok = off >= 0;
        off = ok ? off + c * 8 : 0;
        cp_async16(Ks + st * TILE + swz<CH>(r, c), kc + off, ok);
        cp_async16(Vs + st * TILE + swz<CH>(r, c), vc + off, ok);
      }
      cp_async_commit();
    };
    locate(0);
    __syncthreads();
    issue(0);
    if (ntiles > 1) locate(1);
    for (int j = 0; j < ntiles; j++) {
      int kb = j * PKV, st = j & 1;
      cp_async_wait<0>();
      // Tile j is in and tile j+1 located; every warp is done with stage
      // st ^ 1, and issue(j) with slot_s[st].
      __syncthreads();
      if (j + 1 < ntiles) issue(j + 1);
      if (j + 2 < ntiles) locate(j + 2);
      float sc[PKV / 8][4];
#pragma unroll
      for (int n = 0; n < PKV / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) sc[n][e] = 0.f;
      qk_tile<T, HD, PKV / 16>(sc, qf, Ks + st * TILE, 0, lane);
      // Base-2 logits, masked where a warp's rows end inside the tile or
      // belong to another pass; online softmax; P as the next A operand.
      bool whole = act[0] && act[1] && kb + PKV - 1 <= min(prow[0], prow[1]);
      if (__all_sync(0xffffffffu, whole)) {
#pragma unroll
        for (int n = 0; n < PKV / 8; n++)
#pragma unroll
          for (int e = 0; e < 4; e++) sc[n][e] *= sl2;
      } else {
#pragma unroll
        for (int n = 0; n < PKV / 8; n++)
#pragma unroll
          for (int e = 0; e < 4; e++) {
            int i = e >> 1, key = kb + n * 8 + q4 * 2 + (e & 1);
            sc[n][e] = (act[i] && key <= prow[i]) ? sc[n][e] * sl2 : NEG;
          }
      }
      online_softmax<PKV / 8, DT>(sc, mrow, lrow, o);
      uint32_t pf[PKV / 16][4];
      pack_p<T, PKV / 16>(sc, pf);
      pv_tile<T, HD, PKV / 16>(o, pf, Vs + st * TILE, 0, lane);
    }
  }
  // The row sums are spread over the quad of lanes sharing a row.
#pragma unroll
  for (int i = 0; i < 2; i++) {
    float l = lrow[i];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    int t = t0 + rl[i];
    if (t >= a.n) continue;
    float inv = l > 0.f ? 1.f / l : 0.f;
    float* dst = out + t * qw + (long)h * HD;
#pragma unroll
    for (int d = 0; d < DT; d++)
      *reinterpret_cast<float2*>(dst + d * 8 + q4 * 2) = make_float2(o[d][i * 2] * inv, o[d][i * 2 + 1] * inv);
  }
}

// Three blocks an SM: ptxas keeps the head dim 128 kernels to 168
// registers (16 bytes of stack), 1.1x faster than two blocks with 224-236
// (docs/cuda.md).
#define PREFILL(T, name, HD)                                                                                     \
  extern "C" __global__ void __launch_bounds__(128, 3)                                                           \
      attn_prefill_##name##_hd##HD(float* out, const float* q, const uint16_t* kc, const uint16_t* vc,           \
                                   const int* pos, const int* seq, const int* bt, AttnParams a, unsigned* fault) { \
    attn_prefill<T, HD>(out, q, kc, vc, pos, seq, bt, a, fault);                                                 \
  }
PREFILL(BF16, bf16, 64) PREFILL(BF16, bf16, 128)
PREFILL(F16, f16, 64) PREFILL(F16, f16, 128)

// XQ is where the o product's x goes beside out (q not null): rounded to
// the cache's 16-bit type, as round_x writes it, and with pairs the
// remainders' roundings total elements further on, as split_x writes them.
struct XQ {
  uint16_t* q;
  int pairs;
};

// store_out stores element i (of total) of the attention's output.
template <typename T>
DEV void store_out(float* __restrict__ out, XQ xq, long i, long total, float v) {
  out[i] = v;
  if (xq.q != nullptr) store_x16<T>(xq.q, i, total, v, xq.pairs);
}

// combine_tail: the last of a (token, KV head)'s used splits to finish
// merges the partials of its G query heads (h0..) into out, as
// attn_combine would, and leaves the counter zero for the next launch.
// Every block that wrote partials calls it; sm holds 2·G·used floats.
template <typename T, int HD>
DEV void combine_tail(float* __restrict__ out, XQ xq, const float* __restrict__ part_acc,
                      const float* __restrict__ part_ml, unsigned* cnt, float* sm, AttnParams a, int t, int h0,
                      int G, int used) {
  const float NEG = -__int_as_float(0x7f800000);
  int tid = threadIdx.x;
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  unsigned* c = cnt + (long)t * gridDim.y + blockIdx.y;
  if (tid == 0) last = atomicAdd(c, 1u) == (unsigned)(used - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  // Each head's split weights exp(m - M) / L, computed once into shared
  // memory, then the weighted sum of the partial outputs with their loads
  // in flight together.
  float* wt = sm;              // [G][used] maxima, then weights
  float* ls = sm + G * used;   // [G][used] sums
  for (int i = tid; i < G * used; i += blockDim.x) {
    long o_ = ((long)t * a.heads + h0 + i / used) * a.splits + i % used;
    wt[i] = __ldcg(part_ml + o_ * 2);
    ls[i] = __ldcg(part_ml + o_ * 2 + 1);
  }
  __syncthreads();
  if (tid < G) {
    float* wr = wt + tid * used;
    float M = NEG, L = 0.f;
    for (int sp = 0; sp < used; sp++) M = fmaxf(M, wr[sp]);
    for (int sp = 0; sp < used; sp++) {
      wr[sp] = wr[sp] == NEG ? 0.f : __expf(wr[sp] - M);
      L += wr[sp] * ls[tid * used + sp];
    }
    float inv = L > 0.f ? 1.f / L : 0.f;
    for (int sp = 0; sp < used; sp++) wr[sp] *= inv;
  }
  __syncthreads();
  for (int i = tid; i < G * HD; i += blockDim.x) {
    int r = i / HD, d = i % HD;
    const float* pa = part_acc + ((long)t * a.heads + h0 + r) * a.splits * HD + d;
    const float* wr = wt + r * used;
    float acc = 0.f;
#pragma unroll 8
    for (int sp = 0; sp < used; sp++) acc += wr[sp] * __ldcg(pa + (long)sp * HD);
    store_out<T>(out, xq, ((long)t * a.heads + h0 + r) * HD + d, (long)a.n * a.heads * HD, acc);
  }
  if (tid == 0) *c = 0;
}

// store_split stores dim d of head h's result over one split of the keys
// (A the weighted sum, M the base-2 max, L the sum of weights): the
// result itself when it is the only split, else the partial and, from
// d = 0, its max (in natural log, as attn_combine reads it) and sum.
template <typename T, int HD>
DEV void store_split(float* __restrict__ out, XQ xq, float* __restrict__ part_acc, float* __restrict__ part_ml, AttnParams a,
                     int t, int h, int split, int d, float A, float M, float L, bool only) {
  if (only) {
    store_out<T>(out, xq, ((long)t * a.heads + h) * HD + d, (long)a.n * a.heads * HD, L > 0.f ? A / L : 0.f);
    return;
  }
  long o_ = ((long)t * a.heads + h) * a.splits + split;
  part_acc[o_ * HD + d] = A;
  if (d == 0) {
    part_ml[o_ * 2] = M == -__int_as_float(0x7f800000) ? M : M * 0.6931471805599453f;
    part_ml[o_ * 2 + 1] = L;
  }
}

// ld_cg16 loads 16 bytes through L2 only (cache rows another kernel of
// the step may have just written), under the L2 cache policy pol.
DEV uint4 ld_cg16(const void* p, uint64_t pol) {
  uint4 r;
  asm volatile("ld.global.cg.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "l"(pol));
  return r;
}

// kv_policy is the L2 policy of a decode block's cache reads: evict_first
// where a layer's keys and values for the step (n tokens, each estimated at
// this token's p + 1 positions) exceed KV_KEEP bytes, so that the layers'
// caches outgrow the L2 and a step reads each row once; else the default,
// so that a small cache stays in the L2 from one step to the next.
// Measured on an H200 at 512 tokens (docs/cuda.md, "Bytes read once,
// evicted first"): OLMo-2-1B's 4 MiB a layer gain from evict_first,
// Llama-3.2-1B's 1 MiB lose.
#define KV_KEEP (2L << 20)
template <int HD>
DEV uint64_t kv_policy(AttnParams a, int p) {
  return (long)a.n * (p + 1) * a.kv_heads * HD * 4 > KV_KEEP ? evict_first() : evict_normal();
}

#define DKV 64  // keys per tile of attn_decode (16 per warp)

// KeySplit is a decode block's share of its token's keys: j0 .. j1 - 1 of
// the keys 0 .. p, used the number of splits that hold keys, br the
// sequence's block table.
struct KeySplit {
  int p, j0, j1, used;
  BlockRow br;
};

// key_split divides token t's keys into a.splits chunks of whole tiles and
// returns split's; a bad position or sequence (recorded once, from the
// grid's first block) leaves no keys.
DEV KeySplit key_split(const int* __restrict__ pos, const int* __restrict__ seq, const int* __restrict__ bt, AttnParams a,
                       unsigned* fault, int t, int split) {
  int p = pos[t], s = seq[t];
  bool bad = p < 0 || p >= a.max_blocks * a.block_size || s < 0 || s >= a.bt_rows;
  if (bad && threadIdx.x == 0 && split == 0 && blockIdx.y == 0) record_fault(fault, FAULT_ATTN_POS, t, p);
  int len = bad ? 0 : p + 1;
  int chunk = (len + a.splits - 1) / a.splits;
  chunk = (chunk + DKV - 1) / DKV * DKV;
  KeySplit k;
  k.p = p;
  k.j0 = split * chunk;
  k.j1 = min(len, k.j0 + chunk);
  k.used = chunk > 0 ? (len + chunk - 1) / chunk : 1;
  k.br = block_row(bt, a, bad ? 0 : s);
  return k;
}

template <typename T, int HD>
DEV void attn_decode(float* __restrict__ part_acc, float* __restrict__ part_ml, const float* __restrict__ q,
                     const uint16_t* __restrict__ kc, const uint16_t* __restrict__ vc, const int* __restrict__ pos,
                     const int* __restrict__ seq, const int* __restrict__ bt, AttnParams a, unsigned* fault,
                     float* __restrict__ out, unsigned* cnt, XQ xq) {
  constexpr int CH = HD / 8, DT = HD / 8, TILE = DKV * HD;
  const float NEG = -__int_as_float(0x7f800000);
  extern __shared__ __align__(16) uint16_t dsm[];  // K[2][TILE], V[2][TILE]; reused to merge the warps
  __shared__ __align__(16) uint16_t qs[16 * HD];
  __shared__ float ml_s[4][16][2];
  uint16_t* Ks = dsm;
  uint16_t* Vs = dsm + 2 * TILE;

  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q4 = lane & 3;
  int split = blockIdx.x, t = blockIdx.z;
  int group = a.heads / a.kv_heads, ngroup = (group + 15) / 16;
  int kh = blockIdx.y / ngroup;
  int h0 = kh * group + (blockIdx.y % ngroup) * 16;
  int G = min(16, kh * group + group - h0);
  long kw = (long)a.kv_heads * HD;
  // Until pdl_begin the kernel ahead (the KV store of this step's tokens,
  // and q) may still run: positions, sequences and block tables are the
  // step's inputs, and the cache rows of keys below p - 63 were written by
  // earlier steps (a step holds at most 64 tokens of a sequence through
  // this kernel), so those are read before the wait.
  const KeySplit ks = key_split(pos, seq, bt, a, fault, t, split);
  const int p = ks.p, j0 = ks.j0, j1 = ks.j1, used = ks.used;
  const uint64_t pol = kv_policy<HD>(a, p);
  int ntiles = j1 > j0 ? (j1 - j0 + DKV - 1) / DKV : 0;
  // The splits that hold keys; with the combine here (cnt set) the others
  // have nothing to do.
  if (cnt != nullptr && split >= used) return;

  // Tile copies: each warp copies the 16 keys of a tile it reads (rows
  // warp·16 ..), lane % CH taking chunk c of rows lane / CH + RPW·i, so a
  // warp waits for its own copies alone, with no barrier a tile. Lane l
  // looks up the slot of the warp's key l % 16 of the next tile as the warp
  // requests one, and the copies take their rows' slots from those lanes.
  constexpr int RPW = 32 / CH, NI = 16 / RPW;
  int nsl = -1;  // the slot of the lane's key of the next tile (-1: none)
  auto lookup = [&](int j) {
    int key = j0 + j * DKV + warp * 16 + (lane & 15);
    nsl = j < ntiles && key < j1 ? slot_of(ks.br, a, fault, t, key) : -1;
  };
  const int c = lane % CH;
  const uint16_t* kcl = kc + (long)kh * HD + c * 8;
  const uint16_t* vcl = vc + (long)kh * HD + c * 8;
  auto issue = [&](int j) {
    if (j < ntiles) {
      int st = j & 1;
#pragma unroll
      for (int i = 0; i < NI; i++) {
        int sl = __shfl_sync(0xffffffffu, nsl, lane / CH + RPW * i);
        int r = warp * 16 + lane / CH + RPW * i;
        long off = (long)max(sl, 0) * kw;
        cp_async16_hint(Ks + st * TILE + swz<CH>(r, c), kcl + off, sl >= 0, pol);
        cp_async16_hint(Vs + st * TILE + swz<CH>(r, c), vcl + off, sl >= 0, pol);
      }
    }
    cp_async_commit();
    lookup(j + 1);
  };
  // Tile j holds keys j0 + 64j .. j0 + 64j + 63.
  lookup(0);
  bool pre0 = ntiles > 0 && j0 + DKV <= p - 63, pre1 = ntiles > 1 && j0 + 2 * DKV <= p - 63;
  if (pre0) issue(0);
  if (pre1) issue(1);  // pre1 implies pre0: the requests stay in order
  pdl_begin();
  if (!pre0) issue(0);
  if (!pre1) issue(1);

  for (int i = tid; i < 16 * CH; i += 128) {
    int r = i / CH, c = i % CH;
    uint4 u = make_uint4(0, 0, 0, 0);
    if (r < G) {
      const float* src = q + ((long)t * a.heads + h0 + r) * HD + c * 8;
      float4 x0 = *reinterpret_cast<const float4*>(src), x1 = *reinterpret_cast<const float4*>(src + 4);
      u = make_uint4(pack2<T>(x0.x, x0.y), pack2<T>(x0.z, x0.w), pack2<T>(x1.x, x1.y), pack2<T>(x1.z, x1.w));
    }
    *reinterpret_cast<uint4*>(qs + swz<CH>(r, c)) = u;
  }
  __syncthreads();
  uint32_t qf[HD / 16][4];
#pragma unroll
  for (int k = 0; k < HD / 16; k++) ldmatrix_x4(qf[k], qs + swz<CH>(lane & 15, k * 2 + (lane >> 4)));

  float o[DT][4];
#pragma unroll
  for (int d = 0; d < DT; d++)
#pragma unroll
    for (int e = 0; e < 4; e++) o[d][e] = 0.f;
  float m[2] = {NEG, NEG}, l[2] = {0.f, 0.f};
  const float sl2 = a.scale * 1.4426950408889634f;

  for (int j = 0; j < ntiles; j++) {
    cp_async_wait<1>();
    __syncwarp();  // the warp's rows of tile j are in
    const uint16_t* ks = Ks + (j & 1) * TILE;
    const uint16_t* vs = Vs + (j & 1) * TILE;
    float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    qk_tile<T, HD, 1>(sc, qf, ks, warp * 16, lane);
    int kb = j0 + j * DKV + warp * 16;
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int key = kb + n * 8 + q4 * 2 + (e & 1);
        sc[n][e] = key < j1 ? sc[n][e] * sl2 : NEG;
      }
    online_softmax<2, DT>(sc, m, l, o);
    uint32_t pf[1][4];
    pack_p<T, 1>(sc, pf);
    pv_tile<T, HD, 1>(o, pf, vs, warp * 16, lane);
    __syncwarp();  // every lane is done with its rows of stage j & 1
    issue(j + 2);
  }
  cp_async_wait<0>();
  __syncthreads();

  // Merge the four warps: each stores its rows' max, sum and output.
  float* os = reinterpret_cast<float*>(dsm);  // [4][16][HD]
#pragma unroll
  for (int i = 0; i < 2; i++) {
    float li = l[i];
    li += __shfl_xor_sync(0xffffffffu, li, 1);
    li += __shfl_xor_sync(0xffffffffu, li, 2);
    int r = g + i * 8;
    if (q4 == 0) {
      ml_s[warp][r][0] = m[i];
      ml_s[warp][r][1] = li;
    }
#pragma unroll
    for (int d = 0; d < DT; d++)
      *reinterpret_cast<float2*>(os + (warp * 16 + r) * HD + d * 8 + q4 * 2) = make_float2(o[d][i * 2], o[d][i * 2 + 1]);
  }
  __syncthreads();
  for (int i = tid; i < G * HD; i += 128) {
    int r = i / HD, d = i % HD;
    float M = NEG;
#pragma unroll
    for (int w = 0; w < 4; w++) M = fmaxf(M, ml_s[w][r][0]);
    float acc = 0.f, L = 0.f;
#pragma unroll
    for (int w = 0; w < 4; w++) {
      float c = ml_s[w][r][0] == NEG ? 0.f : exp2f(ml_s[w][r][0] - M);
      acc += c * os[(w * 16 + r) * HD + d];
      L += c * ml_s[w][r][1];
    }
    store_split<T, HD>(out, xq, part_acc, part_ml, a, t, h0 + r, split, d, acc, M, L, cnt != nullptr && used == 1);
  }
  if (cnt == nullptr || used == 1) return;
  combine_tail<T, HD>(out, xq, part_acc, part_ml, cnt, reinterpret_cast<float*>(dsm), a, t, h0, G, used);
}

// Dynamic shared memory: 2 stages of K and V, 4·DKV·HD·2 bytes. With cnt
// (one zeroed counter per token and blockIdx.y) the kernel also combines
// the splits into out; without, attn_combine does.
#define DECODE(T, name, HD)                                                                                    \
  extern "C" __global__ void __launch_bounds__(128)                                                            \
      attn_decode_##name##_hd##HD(float* part_acc, float* part_ml, const float* q, const uint16_t* kc,         \
                                  const uint16_t* vc, const int* pos, const int* seq, const int* bt, AttnParams a, \
                                  unsigned* fault, float* out, unsigned* cnt, uint16_t* xq, int pairs) {      \
    attn_decode<T, HD>(part_acc, part_ml, q, kc, vc, pos, seq, bt, a, fault, out, cnt, XQ{xq, pairs});         \
  }
DECODE(BF16, bf16, 64) DECODE(BF16, bf16, 128)
DECODE(F16, f16, 64) DECODE(F16, f16, 128)

// attn_mha: decode attention for 16-bit caches on the CUDA cores, a block
// taking G query heads of one KV head (MHA, or GQA where attn_decode's mma
// rows would be mostly empty). grid (splits, KVHeads * group / G, N), 128
// threads, static shared memory only. A key row is HD/8 chunks of 16
// bytes, one a thread: TPR threads take a row, RP rows a pass, and U
// passes (64 keys) are loaded at once straight into registers, then
// scored against each of the G heads. Scores are reduced over a row's
// threads by shuffles; each row's threads keep a running max, sum and
// their 8 output dims a head, merged over the rows in shared memory at the
// end. Splits, partials, the combine and the early copies are as in
// attn_decode.
template <typename T, int HD, int G>
DEV void attn_mha(float* __restrict__ part_acc, float* __restrict__ part_ml, const float* __restrict__ q,
                  const uint16_t* __restrict__ kc, const uint16_t* __restrict__ vc, const int* __restrict__ pos,
                  const int* __restrict__ seq, const int* __restrict__ bt, AttnParams a, unsigned* fault,
                  float* __restrict__ out, unsigned* cnt, XQ xq) {
  constexpr int TPR = HD / 8, RP = 128 / TPR, U = DKV / RP;
  const float NEG = -__int_as_float(0x7f800000);
  __shared__ float ms[G][RP], lsum[G][RP];
  __shared__ __align__(16) float accs[G][RP][HD];
  __shared__ float tail[512 * G];  // combine_tail's scratch: 2 · G · used ≤ 2 · G · 256
  int tid = threadIdx.x, c = tid % TPR, r = tid / TPR;
  int split = blockIdx.x, t = blockIdx.z;
  int group = a.heads / a.kv_heads;
  int h0 = blockIdx.y * G, kh = h0 / group;  // G divides group
  long kw = (long)a.kv_heads * HD;
  // Before pdl_begin, as in attn_decode: the step's inputs, and the cache
  // rows of keys below p - 63.
  const KeySplit ks = key_split(pos, seq, bt, a, fault, t, split);
  const int p = ks.p, j0 = ks.j0, j1 = ks.j1, used = ks.used;
  const uint64_t pol = kv_policy<HD>(a, p);
  if (cnt != nullptr && split >= used) return;

  uint4 kr[U], vr[U];
  bool ok[U];
  // A warp's rows r take keys kb + u·RP + r, 16 of each tile of 64 keys:
  // lane l looks up the slot of the warp's key l % 16 of the next tile
  // (pass l / RW, row l % RW of the warp's RW) while the block works on
  // one, so a tile's loads never wait for the block table, and fetch takes
  // each row's slot from its lane.
  constexpr int RW = 32 / TPR;
  static_assert(U * RW == 16, "16 keys a warp a tile");
  int nsl = -1;  // the slot of the lane's key of the next tile (-1: none)
  auto lookup = [&](int kb) {
    int l = tid & 15, key = kb + (l / RW) * RP + (tid >> 5) * RW + l % RW;
    nsl = key < j1 ? slot_of(ks.br, a, fault, t, key) : -1;
  };
  const uint16_t* kcl = kc + (long)kh * HD + c * 8;
  const uint16_t* vcl = vc + (long)kh * HD + c * 8;
  auto fetch = [&]() {
#pragma unroll
    for (int u = 0; u < U; u++) {
      int sl = __shfl_sync(0xffffffffu, nsl, u * RW + (tid & 31) / TPR);
      ok[u] = sl >= 0;
      long off = (long)sl * kw;
      kr[u] = ok[u] ? ld_cg16(kcl + off, pol) : make_uint4(0, 0, 0, 0);
      vr[u] = ok[u] ? ld_cg16(vcl + off, pol) : make_uint4(0, 0, 0, 0);
    }
  };
  bool pre = j1 > j0 && j0 + DKV <= p - 63;
  if (j1 > j0) lookup(j0);
  if (pre) fetch();
  pdl_begin();
  if (!pre && j1 > j0) fetch();

  const float sl2 = a.scale * 1.4426950408889634f;  // logits in base 2
  float qf[G][8];
#pragma unroll
  for (int g = 0; g < G; g++) {
    const float4* qp = reinterpret_cast<const float4*>(q + ((long)t * a.heads + h0 + g) * HD + c * 8);
    float4 x0 = qp[0], x1 = qp[1];
    qf[g][0] = x0.x * sl2; qf[g][1] = x0.y * sl2; qf[g][2] = x0.z * sl2; qf[g][3] = x0.w * sl2;
    qf[g][4] = x1.x * sl2; qf[g][5] = x1.y * sl2; qf[g][6] = x1.z * sl2; qf[g][7] = x1.w * sl2;
  }
  float m[G], l[G], acc[G][8];
#pragma unroll
  for (int g = 0; g < G; g++) {
    m[g] = NEG;
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; e++) acc[g][e] = 0.f;
  }
  for (int kb = j0; kb < j1; kb += DKV) {
    if (kb != j0) fetch();
    if (kb + DKV < j1) lookup(kb + DKV);
    float sc[G][U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      float kf[8];
      unpack8<T>(kr[u], kf);
#pragma unroll
      for (int g = 0; g < G; g++) {
        float d = 0.f;
#pragma unroll
        for (int e = 0; e < 8; e++) d = fmaf(qf[g][e], kf[e], d);
#pragma unroll
        for (int o = TPR / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        sc[g][u] = ok[u] ? d : NEG;
      }
    }
    // Whether the pass holds keys of this row, or earlier passes did: the
    // same for every head.
    bool any = false;
#pragma unroll
    for (int g = 0; g < G; g++) {
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < U; u++) mx = fmaxf(mx, sc[g][u]);
      any = mx != NEG;
      if (!any) break;
      float corr = exp2f(m[g] - mx);
      l[g] *= corr;
#pragma unroll
      for (int e = 0; e < 8; e++) acc[g][e] *= corr;
#pragma unroll
      for (int u = 0; u < U; u++) {
        sc[g][u] = exp2f(sc[g][u] - mx);  // the key's weight
        l[g] += sc[g][u];
      }
      m[g] = mx;
    }
    if (!any) continue;
#pragma unroll
    for (int u = 0; u < U; u++) {
      float vf[8];
      unpack8<T>(vr[u], vf);
#pragma unroll
      for (int g = 0; g < G; g++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[g][e] = fmaf(sc[g][u], vf[e], acc[g][e]);
    }
  }
  // Merge the RP rows' results.
#pragma unroll
  for (int g = 0; g < G; g++) {
    if (c == 0) {
      ms[g][r] = m[g];
      lsum[g][r] = l[g];
    }
    *reinterpret_cast<float4*>(&accs[g][r][c * 8]) = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
    *reinterpret_cast<float4*>(&accs[g][r][c * 8 + 4]) = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
  }
  __syncthreads();
  for (int i = tid; i < G * HD; i += 128) {
    int g = i / HD, d = i % HD;
    float M = NEG;
#pragma unroll
    for (int j = 0; j < RP; j++) M = fmaxf(M, ms[g][j]);
    float A = 0.f, L = 0.f;
#pragma unroll
    for (int j = 0; j < RP; j++) {
      float e = ms[g][j] == NEG ? 0.f : exp2f(ms[g][j] - M);
      A += e * accs[g][j][d];
      L += e * lsum[g][j];
    }
    store_split<T, HD>(out, xq, part_acc, part_ml, a, t, h0 + g, split, d, A, M, L, cnt != nullptr && used == 1);
  }
  if (cnt == nullptr || used == 1) return;
  combine_tail<T, HD>(out, xq, part_acc, part_ml, cnt, tail, a, t, h0, G, used);
}

// attn_mha_* take one query head a block, attn_mha2_* two.
#define MHA(T, name, HD, G, suffix)                                                                            \
  extern "C" __global__ void __launch_bounds__(128)                                                            \
      attn_mha##suffix##_##name##_hd##HD(float* part_acc, float* part_ml, const float* q, const uint16_t* kc,  \
                                         const uint16_t* vc, const int* pos, const int* seq, const int* bt,    \
                                         AttnParams a, unsigned* fault, float* out, unsigned* cnt, uint16_t* xq, \
                                         int pairs) {                                                          \
    attn_mha<T, HD, G>(part_acc, part_ml, q, kc, vc, pos, seq, bt, a, fault, out, cnt, XQ{xq, pairs});         \
  }
#define MHAS(T, name, HD) MHA(T, name, HD, 1, ) MHA(T, name, HD, 2, 2)
MHAS(BF16, bf16, 64) MHAS(BF16, bf16, 128)
MHAS(F16, f16, 64) MHAS(F16, f16, 128)
