// Mixture-of-experts SwiGLU with softmax routing. Expert weights arrive as
// tables of device pointers passed by value, so a recorded graph needs no
// device-side table.
//
// A token's k-th choice is slot t·topk + k. With the router's logits
// (moe_logits, in f32), moe_route chooses each token's experts and
// weights and groups the slots by expert into tiles of one expert's
// slots. moe_mm runs tiles of up to 64 slots on the tensor cores (16-bit
// weights, more than one token); moe_gateup and moe_down tiles of up to 4
// (one, for a lone token) on the CUDA cores. Either way each row of an
// expert is read once a tile, not once a slot (prompts and decode batches
// share experts), and every (row, slot) product is summed in the same
// order whatever the tile; moe_combine adds each token's weighted products
// in choice order.
#include "mma.cuh"

#define MAX_EXPERTS 128

struct Ptrs {
  const void* p[MAX_EXPERTS];
};

// moe_logits_*: grid (ceil(experts / 8), n), 256 threads; logits[t, e] =
// router[e]·x[t], a warp an expert, in f32 from x's f32 rows, so that the
// choice of experts is the CPU lane's, not one moved by x's rounding.
template <typename T>
DEV void moe_logits(float* __restrict__ logits, const float* __restrict__ x,
                    const typename Elem<T>::raw* __restrict__ router, int n, int dim, int experts) {
  pdl_begin();
  int t = blockIdx.y, e = blockIdx.x * 8 + (threadIdx.x >> 5);
  if (t >= n || e >= experts) return;
  const typename Elem<T>::raw* w = router + (long)e * dim;
  const float* xr = x + (long)t * dim;
  constexpr int VEC = 16 / sizeof(typename Elem<T>::raw);
  int lane = threadIdx.x & 31, kv = dim % VEC == 0 ? dim : 0;
  float s = 0.f;
#pragma unroll 4
  for (int i = lane * VEC; i < kv; i += 32 * VEC) {
    uint4 u = ld_stream(w + i);
    float f[8];
    if constexpr (VEC == 8) {
      unpack8<T>(u, f);
    } else {
      f[0] = __uint_as_float(u.x); f[1] = __uint_as_float(u.y); f[2] = __uint_as_float(u.z); f[3] = __uint_as_float(u.w);
    }
#pragma unroll
    for (int j = 0; j < VEC; j++) s = fmaf(f[j], xr[i + j], s);
  }
  for (int i = kv + lane; i < dim; i += 32) s = fmaf(Elem<T>::load(w, i), xr[i], s);
  s = warp_sum(s);
  if (lane == 0) logits[(long)t * experts + e] = s;
}

// topk: warp-wide, for token t of the router's logits (n rows of experts,
// lg the warp's MAX_EXPERTS floats of shared memory): softmax, the top k
// (ties to the lower expert index), optional renormalisation, into ids and
// wts (slot t·topk + k).
DEV void topk(int* ids, float* wts, const float* logits, float* lg, int t, int experts, int k_, int norm) {
  int lane = threadIdx.x & 31;
  for (int e = lane; e < experts; e += 32) lg[e] = logits[(long)t * experts + e];
  __syncwarp();
  float mx = -__int_as_float(0x7f800000);
  for (int e = lane; e < experts; e += 32) mx = fmaxf(mx, lg[e]);
  mx = warp_max(mx);
  float sum = 0.f;
  for (int e = lane; e < experts; e += 32) {
    lg[e] = expf(lg[e] - mx);
    sum += lg[e];
  }
  sum = warp_sum(sum);
  __syncwarp();
  float tot = 0.f;
  for (int k = 0; k < k_; k++) {
    // The largest probability left, the lowest expert among equals.
    int best = -1;
    float bv = -1.f;
    for (int e = lane; e < experts; e += 32)
      if (lg[e] > bv) {
        bv = lg[e];
        best = e;
      }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      int oe = __shfl_xor_sync(0xffffffffu, best, o);
      if (ov > bv || (ov == bv && oe >= 0 && (best < 0 || oe < best))) {
        bv = ov;
        best = oe;
      }
    }
    tot += bv / sum;
    if (lane == 0) {
      ids[t * k_ + k] = best;
      wts[t * k_ + k] = bv / sum;
      if (best >= 0) lg[best] = -2.f;
    }
    __syncwarp();
  }
  if (norm && lane == 0)
    for (int k = 0; k < k_; k++) wts[t * k_ + k] /= tot;
}

// scan32: the warp's exclusive prefix sums of v, and their total in *all.
DEV int scan32(int v, int* all) {
  int lane = threadIdx.x & 31, x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  *all = __shfl_sync(0xffffffffu, x, 31);
  return x - v;
}

// moe_topk: grid ceil(n / 8), 256 threads; topk a warp a token, for
// prompts, whose tokens one block would choose in turn.
extern "C" __global__ void __launch_bounds__(256) moe_topk(int* __restrict__ ids, float* __restrict__ wts,
                                                           const float* __restrict__ logits, int n, int experts,
                                                           int k_, int norm) {
  pdl_begin();
  __shared__ float lgs[8][MAX_EXPERTS];
  int warp = threadIdx.x >> 5, t = blockIdx.x * 8 + warp;
  if (t < n) topk(ids, wts, logits, lgs[warp], t, experts, k_, norm);
}

// moe_route, one block of 1024 threads: unless moe_topk has (chosen), each
// warp chooses the experts of tokens warp, warp + 32, ... (topk), then the
// block groups the n·topk slots by expert. order lists them expert by expert (in any order within
// one: each slot's products are its own), tiles (ntiles of them) the runs
// of up to bn slots of one expert as {expert, first index into order,
// count}. A slot without an expert (its router logits NaN) records a fault
// and is left out.
extern "C" __global__ void __launch_bounds__(1024) moe_route(int* __restrict__ ids, float* __restrict__ wts,
                                                             const float* __restrict__ logits, int n, int experts,
                                                             int k_, int norm, int chosen, int bn,
                                                             int* __restrict__ order, int4* __restrict__ tiles,
                                                             int* __restrict__ ntiles, unsigned* fault) {
  pdl_begin();
  __shared__ float lgs[32][MAX_EXPERTS];
  __shared__ int cnt[MAX_EXPERTS], off[MAX_EXPERTS], toff[MAX_EXPERTS], cur[MAX_EXPERTS];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, slots = n * k_;
  if (!chosen)
    for (int t = warp; t < n; t += 32) topk(ids, wts, logits, lgs[warp], t, experts, k_, norm);
  for (int e = tid; e < experts; e += blockDim.x) cnt[e] = 0, cur[e] = 0;
  __syncthreads();  // ids are written, and visible to the block
  for (int s = tid; s < slots; s += blockDim.x) {
    int e = ids[s];
    if (e >= 0 && e < experts) atomicAdd(&cnt[e], 1);
    else record_fault(fault, FAULT_MOE_EXPERT, s, e);
  }
  __syncthreads();
  if (warp == 0) {
    // Prefix sums over the experts, four a lane.
    int c[4], tl[4], sc = 0, st = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      int e = lane * 4 + i;
      c[i] = e < experts ? cnt[e] : 0;
      tl[i] = (c[i] + bn - 1) / bn;
      sc += c[i];
      st += tl[i];
    }
    int allc, allt;
    int oc = scan32(sc, &allc), ot = scan32(st, &allt);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      int e = lane * 4 + i;
      if (e < experts) off[e] = oc, toff[e] = ot;
      oc += c[i];
      ot += tl[i];
    }
    if (lane == 0) *ntiles = allt;
  }
  __syncthreads();
  for (int s = tid; s < slots; s += blockDim.x) {
    int e = ids[s];
    if (e >= 0 && e < experts) order[off[e] + atomicAdd(&cur[e], 1)] = s;
  }
  for (int e = tid; e < experts; e += blockDim.x)
    for (int j = 0; j * bn < cnt[e]; j++) tiles[toff[e] + j] = make_int4(e, off[e] + j * bn, min(bn, cnt[e] - j * bn), 0);
}

// tile_rows: for the slots of tile (blockIdx.y; none past *ntiles), with
// their input rows (width k, of xs: row src(s) of in) staged in shared
// memory, each warp takes RW consecutive rows of ws[p] (p < NP products of
// the same rows: gate and up, or down) from row0 and sums
// w[row]·x[slot] for every slot of the tile: dot[p][r][j]. Lane l takes
// k's 8-element pieces l, l+32, ... (16-byte loads, four in flight a
// product and row) and the warp sums its lanes last, so a (row, slot)
// product is the same in any tile. fin(p-products, r, j) stores them.
template <typename T, int NP, int RW, int BN, typename Src, typename Fin>
DEV void tile_rows(const float* __restrict__ in, const int* __restrict__ order, const int4* __restrict__ tiles,
                   const int* __restrict__ ntiles, const typename Elem<T>::raw* const* ws, int k, int rows, Src src,
                   Fin fin) {
  extern __shared__ float xs[];  // BN rows of k
  typedef typename Elem<T>::raw raw;
  constexpr int VEC = 16 / sizeof(raw);
  if ((int)blockIdx.y >= *ntiles) return;
  const int4 tl = tiles[blockIdx.y];
  const int first = tl.y, cnt = tl.z;
  int slot[BN];
#pragma unroll
  for (int j = 0; j < BN; j++) slot[j] = j < cnt ? order[first + j] : -1;
  for (int j = 0; j < cnt; j++) {
    const float* x = in + (long)src(slot[j]) * k;
    for (int i = threadIdx.x; i < k; i += blockDim.x) xs[j * k + i] = x[i];
  }
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int r0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * RW;
  if (r0 >= rows) return;
  float acc[NP][RW][BN];
#pragma unroll
  for (int p = 0; p < NP; p++)
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
      for (int j = 0; j < BN; j++) acc[p][r][j] = 0.f;
  const bool vec = k % VEC == 0;
  const int kv = vec ? k : 0;
#pragma unroll 4
  for (int i = lane * VEC; i < kv; i += 32 * VEC) {
    float w[NP][RW][VEC];
#pragma unroll
    for (int p = 0; p < NP; p++)
#pragma unroll
      for (int r = 0; r < RW; r++) {
        int row = min(r0 + r, rows - 1);
        uint4 u = ld_stream(ws[p] + (long)row * k + i);
        if constexpr (VEC == 8) {
          unpack8<T>(u, w[p][r]);
        } else {
          w[p][r][0] = __uint_as_float(u.x); w[p][r][1] = __uint_as_float(u.y);
          w[p][r][2] = __uint_as_float(u.z); w[p][r][3] = __uint_as_float(u.w);
        }
      }
#pragma unroll
    for (int j = 0; j < BN; j++) {
      if (j >= cnt) break;
      float xv[VEC];
#pragma unroll
      for (int e = 0; e < VEC; e += 4) {
        float4 v = *reinterpret_cast<const float4*>(&xs[j * k + i + e]);
        xv[e] = v.x; xv[e + 1] = v.y; xv[e + 2] = v.z; xv[e + 3] = v.w;
      }
#pragma unroll
      for (int p = 0; p < NP; p++)
#pragma unroll
        for (int r = 0; r < RW; r++)
#pragma unroll
          for (int e = 0; e < VEC; e++) acc[p][r][j] = fmaf(w[p][r][e], xv[e], acc[p][r][j]);
    }
  }
  for (int i = kv + lane; i < k; i += 32) {
#pragma unroll
    for (int p = 0; p < NP; p++)
#pragma unroll
      for (int r = 0; r < RW; r++) {
        float wv = Elem<T>::load(ws[p], (long)min(r0 + r, rows - 1) * k + i);
#pragma unroll
        for (int j = 0; j < BN; j++)
          if (j < cnt) acc[p][r][j] = fmaf(wv, xs[j * k + i], acc[p][r][j]);
      }
  }
#pragma unroll
  for (int p = 0; p < NP; p++)
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
      for (int j = 0; j < BN; j++) acc[p][r][j] = warp_sum(acc[p][r][j]);
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < RW; r++)
#pragma unroll
    for (int j = 0; j < BN; j++)
      if (j < cnt && r0 + r < rows) fin(acc, r, j, r0 + r, slot[j]);
}

// moe_gateup: grid (ceil(inter / 16), tiles bound), 256 threads, BN·dim
// floats of dynamic shared memory; h[s, r] = silu(gate_e[r]·x_t) ·
// (up_e[r]·x_t) for each slot s of the tile (token t = s / topk, expert e
// the tile's).
template <typename T, int BN>
DEV void moe_gateup(float* h, const float* x, const int* order, const int4* tiles, const int* ntiles, Ptrs gate,
                    Ptrs up, int topk, int dim, int inter) {
  pdl_begin();
  typedef typename Elem<T>::raw raw;
  if ((int)blockIdx.y >= *ntiles) return;
  const int e = tiles[blockIdx.y].x;
  const raw* ws[2] = {static_cast<const raw*>(gate.p[e]), static_cast<const raw*>(up.p[e])};
  tile_rows<T, 2, 2, BN>(x, order, tiles, ntiles, ws, dim, inter, [=](int s) { return s / topk; },
                         [=](float (&acc)[2][2][BN], int r, int j, int row, int s) {
                           h[(long)s * inter + row] = silu(acc[0][r][j]) * acc[1][r][j];
                         });
}

// moe_down: grid (ceil(dim / 32), tiles bound), 256 threads, BN·inter
// floats of dynamic shared memory; y[s, r] = down_e[r]·h[s].
template <typename T, int BN>
DEV void moe_down(float* y, const float* h, const int* order, const int4* tiles, const int* ntiles, Ptrs down,
                  int dim, int inter) {
  pdl_begin();
  typedef typename Elem<T>::raw raw;
  if ((int)blockIdx.y >= *ntiles) return;
  const raw* ws[1] = {static_cast<const raw*>(down.p[tiles[blockIdx.y].x])};
  tile_rows<T, 1, 4, BN>(h, order, tiles, ntiles, ws, inter, dim, [=](int s) { return s; },
                         [=](float (&acc)[1][4][BN], int r, int j, int row, int s) {
                           y[(long)s * dim + row] = acc[0][r][j];
                         });
}

// moe_mm_{bf16,f16}: the expert products of prompts and decode batches on
// the tensor cores, with gemm_pipe's pipeline (gemm.cu): a block of four
// warps takes a tile of up to 64 slots of one expert (the A side: row
// order[first + r] / div of a, 16-bit: x rounded, or the rounded SwiGLU
// of the gate|up product) and 64 rows of the expert's weights (rows below
// m1 of table w0, the others of w1 from row m1: gate then up, or down
// twice), and writes out[slot, col] (f32) for its columns of m. k % 8 == 0.
template <typename T>
DEV void moe_mm(float* __restrict__ out, const uint16_t* __restrict__ a, const int* __restrict__ order,
                const int4* __restrict__ tiles, const int* __restrict__ ntiles, Ptrs w0, Ptrs w1, int m1, int div,
                int k, int m) {
  pdl_begin();
  constexpr int PM = 64, PN = 64, PWN = 2, NT = 128, STAGES = 4, BK = 32;
  constexpr int TM = 32, TN = 32, MI = TM / 16, NJ = TN / 8;
  constexpr int STAGE = (PM + PN) * BK;
  extern __shared__ __align__(16) uint16_t smem[];
  if ((int)blockIdx.y >= *ntiles) return;
  const int4 tl = tiles[blockIdx.y];
  const int e = tl.x, first = tl.y, cnt = tl.z;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, wm = warp / PWN, wn = warp % PWN;
  const int col0 = blockIdx.x * PN, c8 = (t & 3) * 8;
  // This thread's two rows of each side's stages: (t >> 2) and + 32.
  const uint16_t* ap[2];
  const uint16_t* bp[2];
  bool aok[2], bok[2];
#pragma unroll
  for (int j = 0; j < 2; j++) {
    int r = (t >> 2) + 32 * j, gr = col0 + r;
    aok[j] = r < cnt;
    ap[j] = aok[j] ? a + (long)(order[first + r] / div) * k : a;
    bok[j] = gr < m;
    const uint16_t* w = static_cast<const uint16_t*>(gr < m1 ? w0.p[e] : w1.p[e]);
    bp[j] = bok[j] ? w + (long)(gr < m1 ? gr : gr - m1) * k : a;
  }
  const int kt = (k + BK - 1) / BK;
  auto load = [&](int stage, int tile) {
    uint16_t* as = smem + stage * STAGE;
    uint16_t* bs = as + PM * BK;
    int gc = tile * BK + c8;
#pragma unroll
    for (int j = 0; j < 2; j++) {
      int r = (t >> 2) + 32 * j;
      cp_async16(as + swz<4>(r, t & 3), aok[j] && gc < k ? ap[j] + gc : a, aok[j] && gc < k);
      cp_async16(bs + swz<4>(r, t & 3), bok[j] && gc < k ? bp[j] + gc : a, bok[j] && gc < k);
    }
  };
  float acc[MI][NJ][4];
  mma_pipe<T, PM, STAGE, STAGES, MI, NJ, TM, TN>(acc, smem, kt, load, wm, wn, lane);
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int i = 0; i < MI; i++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      int r = wm * TM + i * 16 + g + h * 8;
      if (r >= cnt) continue;
      float* o = out + (long)order[first + r] * m;
#pragma unroll
      for (int j = 0; j < NJ; j++) {
        int c = col0 + wn * TN + j * 8 + q * 2;
        if (c < m) o[c] = acc[i][j][h * 2];
        if (c + 1 < m) o[c + 1] = acc[i][j][h * 2 + 1];
      }
    }
}

// moe_combine: grid (ceil(dim / 256), n), 256 threads; out[t, r] = the sum
// over k in order of wts[t, k] · y[t·topk + k, r], skipping slots without
// an expert.
extern "C" __global__ void __launch_bounds__(256) moe_combine(float* __restrict__ out, const float* __restrict__ y,
                                                              const int* __restrict__ ids,
                                                              const float* __restrict__ wts, int n, int topk,
                                                              int dim, int experts) {
  pdl_begin();
  int t = blockIdx.y, r = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n || r >= dim) return;
  float acc = 0.f;
  for (int k = 0; k < topk; k++) {
    int s = t * topk + k, e = ids[s];
    if (e >= 0 && e < experts) acc = fmaf(wts[s], y[(long)s * dim + r], acc);
  }
  out[(long)t * dim + r] = acc;
}

// moe_gateup_* and moe_down_* take tiles of up to 4 slots (MoEArgs.N > 1);
// moe_gateup1_* and moe_down1_* tiles of one (a lone token's experts).
#define MOE(T, name, BN, sfx, MINB)                                                                               \
  extern "C" __global__ void __launch_bounds__(256, MINB)                                                         \
      moe_gateup##sfx##_##name(float* h, const float* x, const int* order, const int4* tiles, const int* ntiles,  \
                               Ptrs gate, Ptrs up, int topk, int dim, int inter) {                                 \
    moe_gateup<T, BN>(h, x, order, tiles, ntiles, gate, up, topk, dim, inter);                                    \
  }                                                                                                               \
  extern "C" __global__ void __launch_bounds__(256, MINB)                                                         \
      moe_down##sfx##_##name(float* y, const float* h, const int* order, const int4* tiles, const int* ntiles,    \
                             Ptrs down, int dim, int inter) {                                                      \
    moe_down<T, BN>(y, h, order, tiles, ntiles, down, dim, inter);                                                \
  }
MOE(float, f32, 4, , 2)
MOE(BF16, bf16, 4, , 2)
MOE(F16, f16, 4, , 2)
MOE(float, f32, 1, 1, 4)
MOE(BF16, bf16, 1, 1, 4)
MOE(F16, f16, 1, 1, 4)
#define MOE_LOGITS(T, name)                                                                                       \
  extern "C" __global__ void __launch_bounds__(256) moe_logits_##name(float* logits, const float* x,              \
                                                                      const Elem<T>::raw* router, int n, int dim,   \
                                                                      int experts) {                                \
    moe_logits<T>(logits, x, router, n, dim, experts);                                                            \
  }
MOE_LOGITS(float, f32)
MOE_LOGITS(BF16, bf16)
MOE_LOGITS(F16, f16)
#define MOE_MM(T, name)                                                                                           \
  extern "C" __global__ void __launch_bounds__(128) moe_mm_##name(float* out, const uint16_t* a, const int* order,  \
                                                                  const int4* tiles, const int* ntiles, Ptrs w0,    \
                                                                  Ptrs w1, int m1, int div, int k, int m) {         \
    moe_mm<T>(out, a, order, tiles, ntiles, w0, w1, m1, div, k, m);                                                \
  }
MOE_MM(BF16, bf16)
MOE_MM(F16, f16)
