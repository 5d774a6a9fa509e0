// Mixture-of-experts SwiGLU with softmax routing. Expert weights arrive as
// tables of device pointers passed by value, so a recorded graph needs no
// device-side table.
//
// A token's k-th choice is slot t·topk + k. With the router's logits
// (moe_logits, in f32), moe_route chooses each token's experts and
// weights and groups the slots by expert into tiles of one expert's
// slots. moe_mm runs tiles of up to 64 slots on the tensor cores (16-bit
// weights, more than one token); moe_gateup and moe_down tiles of up to 4
// on the CUDA cores. Either way each row of an expert is read once a
// tile, not once a slot (prompts and decode batches share experts), and
// every (row, slot) product is summed in the same order whatever the tile;
// moe_combine adds each token's weighted products in choice order. One to
// a few tokens take two kernels after their logits, each token's experts
// read for it alone: moe_gateup1 chooses them in every block (lone_choice)
// and moe_down1 sums the weighted products itself, so no routing or
// combining kernel runs between them.
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

// warp_softmax: the warp's exp(logits[e] - max) for a row of experts into
// pr (shared memory), returning their sum to every lane. topk and
// lone_choice both take it, so their probabilities agree bit for bit.
DEV float warp_softmax(float* pr, const float* logits, int experts) {
  int lane = threadIdx.x & 31;
  float mx = -__int_as_float(0x7f800000);
  for (int e = lane; e < experts; e += 32) mx = fmaxf(mx, logits[e]);
  mx = warp_max(mx);
  float sum = 0.f;
  for (int e = lane; e < experts; e += 32) {
    float v = expf(logits[e] - mx);
    pr[e] = v;
    sum += v;
  }
  sum = warp_sum(sum);
  __syncwarp();
  return sum;
}

// topk: warp-wide, for token t of the router's logits (n rows of experts,
// lg the warp's MAX_EXPERTS floats of shared memory): softmax, the top k
// (ties to the lower expert index), optional renormalisation, into ids and
// wts (slot t·topk + k).
DEV void topk(int* ids, float* wts, const float* logits, float* lg, int t, int experts, int k_, int norm) {
  int lane = threadIdx.x & 31;
  float sum = warp_softmax(lg, logits + (long)t * experts, experts);
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

// lone_choice: topk's choice for a lone token (its logits of `experts`), by
// the whole block (at least `experts` threads; every thread calls it):
// warp 0 forms topk's softmax (warp_softmax), then each expert's rank
// in topk's order (larger probability first, the lower expert among
// equals; NaN never chosen) places it. ids[k] and p[k] (shared memory, k <
// k_) get the k-th expert and its probability; a choice left without an
// expert gets -1 and -1 / sum, as in topk.
DEV void lone_choice(int* ids, float* p, const float* logits, int experts, int k_) {
  __shared__ __align__(16) float pr[MAX_EXPERTS];
  __shared__ float ssum;
  const int tid = threadIdx.x;
  if (tid < 32) {
    float sum = warp_softmax(pr, logits, experts);
    for (int k = tid; k < k_; k += 32) ids[k] = -1, p[k] = -1.f / sum;
    if (tid == 0) ssum = sum;
  }
  __syncthreads();
  if (tid < experts) {
    const float v = pr[tid];
    if (v == v) {
      int r = 0;
      const int n4 = experts & ~3;
#pragma unroll 8
      for (int j = 0; j < n4; j += 4) {
        const float4 u = *reinterpret_cast<const float4*>(&pr[j]);
        r += (u.x > v || (u.x == v && j < tid)) + (u.y > v || (u.y == v && j + 1 < tid)) +
             (u.z > v || (u.z == v && j + 2 < tid)) + (u.w > v || (u.w == v && j + 3 < tid));
      }
      for (int j = n4; j < experts; j++) r += pr[j] > v || (pr[j] == v && j < tid);
      if (r < k_) ids[r] = tid, p[r] = v / ssum;
    }
  }
  __syncthreads();
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

// dot_rows: each warp's RW consecutive rows from r0 (clamped to rows) of
// the NP products ws[p] against BN rows of width k from xs[p] (j < cnt):
// acc[p][r][j] = w_p[row]·x_p[j]. Lane l takes k's 8-element pieces l,
// l+32, ... (16-byte loads, four in flight a product and row) and the warp
// sums its lanes last, so a (row, x row) product is the same in any tile
// and any kernel; every lane gets the sums. ONE_X: every xs[p] is xs[0].
template <typename T, int NP, int RW, int BN, bool ONE_X>
DEV void dot_rows(float (&acc)[NP][RW][BN], const typename Elem<T>::raw* const* ws, const float* const* xs, int cnt,
                  int k, int rows, int r0) {
  constexpr int VEC = 16 / sizeof(typename Elem<T>::raw);
  const int lane = threadIdx.x & 31;
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
      float xv[NP][VEC];
#pragma unroll
      for (int p = 0; p < NP; p++)
#pragma unroll
        for (int e = 0; e < VEC; e += 4) {
          if (ONE_X && p > 0) {
            xv[p][e] = xv[0][e]; xv[p][e + 1] = xv[0][e + 1]; xv[p][e + 2] = xv[0][e + 2]; xv[p][e + 3] = xv[0][e + 3];
            continue;
          }
          float4 v = *reinterpret_cast<const float4*>(&xs[p][j * k + i + e]);
          xv[p][e] = v.x; xv[p][e + 1] = v.y; xv[p][e + 2] = v.z; xv[p][e + 3] = v.w;
        }
#pragma unroll
      for (int p = 0; p < NP; p++)
#pragma unroll
        for (int r = 0; r < RW; r++)
#pragma unroll
          for (int e = 0; e < VEC; e++) acc[p][r][j] = fmaf(w[p][r][e], xv[p][e], acc[p][r][j]);
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
          if (j < cnt) acc[p][r][j] = fmaf(wv, xs[p][j * k + i], acc[p][r][j]);
      }
  }
#pragma unroll
  for (int p = 0; p < NP; p++)
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
      for (int j = 0; j < BN; j++) acc[p][r][j] = warp_sum(acc[p][r][j]);
}

// tile_rows: for the slots of tile (blockIdx.y; none past *ntiles), with
// their input rows (width k, of xs: row src(s) of in) staged in shared
// memory, each warp takes RW consecutive rows of ws[p] (p < NP products of
// the same rows: gate and up, or down) and sums w[row]·x[slot] for every
// slot of the tile (dot_rows). fin(products, r, j, row, slot) stores them.
template <typename T, int NP, int RW, int BN, typename Src, typename Fin>
DEV void tile_rows(const float* __restrict__ in, const int* __restrict__ order, const int4* __restrict__ tiles,
                   const int* __restrict__ ntiles, const typename Elem<T>::raw* const* ws, int k, int rows, Src src,
                   Fin fin) {
  extern __shared__ float xs[];  // BN rows of k
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
  const int r0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * RW;
  if (r0 >= rows) return;
  const float* xp[NP];
#pragma unroll
  for (int p = 0; p < NP; p++) xp[p] = xs;
  float acc[NP][RW][BN];
  dot_rows<T, NP, RW, BN, true>(acc, ws, xp, cnt, k, rows, r0);
  if ((threadIdx.x & 31) != 0) return;
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

// moe_gateup1: the gate|up of a few tokens' experts, each token's chosen
// and read for it alone, grid (ceil(inter / 16), n · topk), 256 threads:
// block (bx, t·topk + k) takes token t's k-th choice. Every block chooses
// its token's experts (lone_choice); block (0, t·topk) stores them and
// their weights (renormalised with norm) in ids and wts for moe_down1, and
// block (0, s) records the fault of a slot s without an expert. h[s, r] =
// silu(gate_e[r]·x_t) · (up_e[r]·x_t) for the block's slot s of expert e,
// a warp two rows, x read in place.
template <typename T>
DEV void moe_gateup1(float* h, const float* x, const float* logits, int* ids, float* wts, Ptrs gate, Ptrs up,
                     int experts, int topk, int norm, int dim, int inter, unsigned* fault) {
  pdl_begin();
  typedef typename Elem<T>::raw raw;
  __shared__ int sid[MAX_EXPERTS];
  __shared__ float sp[MAX_EXPERTS];
  const int s = blockIdx.y, t = s / topk, tid = threadIdx.x;
  lone_choice(sid, sp, logits + (long)t * experts, experts, topk);
  const int e = sid[s - t * topk];
  if (blockIdx.x == 0 && s == t * topk && tid < topk) {
    // topk's renormalisation: the probabilities added in choice order.
    float tot = 0.f;
    for (int k = 0; k < topk; k++) tot += sp[k];
    ids[s + tid] = sid[tid], wts[s + tid] = norm ? sp[tid] / tot : sp[tid];
  }
  if (e < 0) {
    if (blockIdx.x == 0 && tid == 0) record_fault(fault, FAULT_MOE_EXPERT, s, e);
    return;
  }
  const int r0 = (blockIdx.x * (blockDim.x >> 5) + (tid >> 5)) * 2;
  if (r0 >= inter) return;
  const raw* ws[2] = {static_cast<const raw*>(gate.p[e]), static_cast<const raw*>(up.p[e])};
  const float* xs[2] = {x + (long)t * dim, x + (long)t * dim};
  float acc[2][2][1];
  dot_rows<T, 2, 2, 1, true>(acc, ws, xs, 1, dim, inter, r0);
  if ((tid & 31) != 0) return;
#pragma unroll
  for (int r = 0; r < 2; r++)
    if (r0 + r < inter) h[(long)s * inter + r0 + r] = silu(acc[0][r][0]) * acc[1][r][0];
}

// weighted_rows: o plus, for a lone token's choices k0 .. k0+NP-1 in
// order, wts[k] · down_e[r]·h[k], a choice without an expert skipped.
template <typename T, int NP>
DEV float weighted_rows(float o, const float* h, const int* ids, const float* wts, const Ptrs& down, int experts,
                        int k0, int dim, int inter, int r) {
  typedef typename Elem<T>::raw raw;
  const raw* ws[NP];
  const float* xs[NP];
  bool ok[NP];
#pragma unroll
  for (int p = 0; p < NP; p++) {
    const int e = ids[k0 + p];
    ok[p] = e >= 0 && e < experts;
    ws[p] = static_cast<const raw*>(down.p[ok[p] ? e : 0]);
    xs[p] = h + (long)(k0 + p) * inter;
  }
  float acc[NP][1][1];
  dot_rows<T, NP, 1, 1, false>(acc, ws, xs, 1, inter, dim, r);
#pragma unroll
  for (int p = 0; p < NP; p++)
    if (ok[p]) o = fmaf(wts[k0 + p], acc[p][0][0], o);
  return o;
}

// moe_down1: the down products of moe_gateup1's tokens and their weighted
// sums, as moe_down and moe_combine form them, grid (ceil(dim / 8), n),
// 256 threads, a warp a row r of token t = blockIdx.y: out[t, r] = the sum
// over its choices k in order of wts[t·topk + k] · down_e[r]·h[t·topk +
// k], the experts' rows read four at a time.
template <typename T>
DEV void moe_down1(float* out, const float* h, const int* ids, const float* wts, Ptrs down, int experts, int topk,
                   int dim, int inter) {
  pdl_begin();
  const int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), t = blockIdx.y;
  if (r >= dim) return;
  h += (long)t * topk * inter, ids += t * topk, wts += t * topk, out += (long)t * dim;
  float o = 0.f;
  int k = 0;
  for (; k + 4 <= topk; k += 4) o = weighted_rows<T, 4>(o, h, ids, wts, down, experts, k, dim, inter, r);
  if (k + 2 <= topk) o = weighted_rows<T, 2>(o, h, ids, wts, down, experts, k, dim, inter, r), k += 2;
  if (k < topk) o = weighted_rows<T, 1>(o, h, ids, wts, down, experts, k, dim, inter, r);
  if ((threadIdx.x & 31) == 0) out[r] = o;
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

// moe_gateup_* and moe_down_* take tiles of up to 4 slots; moe_gateup1_*
// and moe_down1_* each of a few tokens' experts for that token alone.
#define MOE(T, name)                                                                                              \
  extern "C" __global__ void __launch_bounds__(256, 2)                                                            \
      moe_gateup_##name(float* h, const float* x, const int* order, const int4* tiles, const int* ntiles,          \
                        Ptrs gate, Ptrs up, int topk, int dim, int inter) {                                        \
    moe_gateup<T, 4>(h, x, order, tiles, ntiles, gate, up, topk, dim, inter);                                     \
  }                                                                                                               \
  extern "C" __global__ void __launch_bounds__(256, 2)                                                            \
      moe_down_##name(float* y, const float* h, const int* order, const int4* tiles, const int* ntiles, Ptrs down, \
                      int dim, int inter) {                                                                       \
    moe_down<T, 4>(y, h, order, tiles, ntiles, down, dim, inter);                                                 \
  }                                                                                                               \
  extern "C" __global__ void __launch_bounds__(256, 4)                                                            \
      moe_gateup1_##name(float* h, const float* x, const float* logits, int* ids, float* wts, Ptrs gate, Ptrs up,  \
                         int experts, int topk, int norm, int dim, int inter, unsigned* fault) {                    \
    moe_gateup1<T>(h, x, logits, ids, wts, gate, up, experts, topk, norm, dim, inter, fault);                      \
  }                                                                                                               \
  extern "C" __global__ void __launch_bounds__(256, 2)                                                            \
      moe_down1_##name(float* out, const float* h, const int* ids, const float* wts, Ptrs down, int experts,       \
                       int topk, int dim, int inter) {                                                            \
    moe_down1<T>(out, h, ids, wts, down, experts, topk, dim, inter);                                              \
  }
MOE(float, f32)
MOE(BF16, bf16)
MOE(F16, f16)
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
