// Matrix-vector products for decode: out[b,j] = sum_i x[b,i] * w[j,i] with
// f32 x and out, f32/bf16/f16 w, f32 accumulation.
#include "common.cuh"
#include "mma.cuh"

// What a fast GEMV gives: out = w·x (PLAIN), or a gated MLP's activation
// from its packed gate and up projection, w holding the gate rows then the
// up rows (m = 2f) and out[j] = silu(w[j]·x) * (w[f+j]·x) for j < f (GLU).
enum { GEMV_PLAIN, GEMV_GLU };

// gemv_bf16_fast: NB rows of x (n of them in use, n <= NB), k a multiple of 8
// up to NV * KS * 256. A block
// is 8 warps; k is cut into units of 256 elements (the last may be short),
// unit u belonging to warp u % KS of a row's KS warps (split-K inside the
// block, combined through shared memory), at most NV units a warp. Each
// warp keeps its units of every row of x in registers and walks R rows of
// w at a time with 16-byte streaming loads: R consecutive rows, or with
// GLU a gate row and its up row. Each weight is read once for all rows of
// x. The grid strides over row groups, and the loads of a block's
// next D-1 groups are issued before the current group is summed, so D*R*NV
// loads a lane stay in flight across the reductions (D = 3 where one or
// two blocks fill an SM's registers). The first D-1 groups' weights are
// requested before the kernel waits for x (pdl_begin).
//
// With POST_RES (one row of x), the product's input is a post-norm block's
// new residual, x = r + rmsnorm(y) * wn (wn bf16 or f32), formed in the
// block: x names y, and block 0 stores the new residual into r_out. With
// POST_HEAD, a step's last residual update and final norm before the LM
// head: x = rmsnorm(r + u) * wf, u = rmsnorm(y) * wn (a post-norm) or y
// (wn null); the residual is not stored.
enum { POST_NONE, POST_RES, POST_HEAD };
struct PostNorm {
  float* r_out;
  const float* r;
  const void* wn;  // the norm's weights: bf16, or f32 with wn_f32
  int wn_f32;
  float eps;
  const void* wf;  // POST_HEAD's final norm weights: bf16, or f32 with wf_f32
  int wf_f32;
};

// With AM, the product's argmax (ties to the lowest index, NaNs skipped)
// goes to *next: each block's best output to pv/pi, reduced by the last
// block to finish (grid_best, counted in *cnt).
struct ArgmaxOut {
  int* next;
  float* pv;
  int* pi;
  unsigned* cnt;
};

// Coded: the weights in the 12-bit code of gpu/code12 (k a multiple of
// 512, a unit 512 values, a lane 16 of them): each row's cap escape
// entries (column<<16 | bf16 bits, 0xffffffff for none) at esc[row*cap],
// base4 the window's first bucket in each byte, v0 the value an escape's
// code decodes to. The product adds (t - v0)*x[col] for each escape t.
struct Coded {
  const unsigned* esc;
  int cap;
  unsigned base4;
  float v0;
};

// A unit of weights a lane holds: 8 bf16 values, or 16 coded ones (their
// low bytes and codes).
struct CodedUnit {
  uint4 lo;
  uint2 codes;
};
template <bool CODED> struct UnitOf { using T = uint4; };
template <> struct UnitOf<true> { using T = CodedUnit; };

// ld_once8 is ld_once for 8 bytes.
DEV uint2 ld_once8(const void* p) {
  uint2 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v2.u32 {%0,%1}, [%2], %3;"
               : "=r"(r.x), "=r"(r.y) : "l"(p), "l"(weight_policy()));
  return r;
}

// decode_pairs turns quarter q (values 4q to 4q+3) of a lane's coded unit
// into two bf16 pairs: byte j of a code word holds value j's code in its
// low nibble and value j+4's in its high one, a code c standing for the
// high byte (c&8)<<4 | (base + c&7).
DEV void decode_pairs(const CodedUnit& u, int q, unsigned base4, unsigned& p01, unsigned& p23) {
  const unsigned lo = q == 0 ? u.lo.x : q == 1 ? u.lo.y : q == 2 ? u.lo.z : u.lo.w;
  const unsigned cw = q < 2 ? u.codes.x : u.codes.y;
  const unsigned c = (q & 1 ? cw >> 4 : cw) & 0x0f0f0f0fu;
  const unsigned h = ((c & 0x07070707u) + base4) | ((c << 4) & 0x80808080u);
  p01 = __byte_perm(lo, h, 0x5140);
  p23 = __byte_perm(lo, h, 0x7362);
}

// predecode turns a group of coded units into bf16 pairs, two a quarter.
template <int R, int NV>
DEV void predecode(const CodedUnit (&w)[R][NV], unsigned base4, unsigned (&pre)[R][NV][8]) {
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int v = 0; v < NV; v++)
#pragma unroll
      for (int q = 0; q < 4; q++) decode_pairs(w[r][v], q, base4, pre[r][v][2 * q], pre[r][v][2 * q + 1]);
}

// xs_at is where a coded product keeps x's value col in shared memory:
// quarter q of lane l's 16 values of unit u at float4 (u*4 + q)*32 + l, so
// that a warp reads a quarter of its unit without bank conflicts.
DEV int xs_at(int col) { return ((((col >> 9) * 4 + ((col >> 2) & 3)) * 32 + ((col >> 4) & 31)) << 2) + (col & 3); }

// norm8 reads the 8 norm weights at o (bf16, or f32 with f32 set).
DEV void norm8(const void* wn, int f32, int o, float (&wf)[8]) {
  if (f32) {
    const float4* wp = reinterpret_cast<const float4*>(wn) + o / 4;
    float4 p = wp[0], q = wp[1];
    wf[0] = p.x; wf[1] = p.y; wf[2] = p.z; wf[3] = p.w; wf[4] = q.x; wf[5] = q.y; wf[6] = q.z; wf[7] = q.w;
  } else {
    unpack8<BF16>(*(reinterpret_cast<const uint4*>(wn) + o / 8), wf);
  }
}

// coded_sums sums rows r < R of a group of coded units against x in
// shared memory (xs_at), a quarter of a unit at a time for every row, adds
// the rows' escapes (a lane each, e) and reduces each row over the warp.
// With PRE, the group's values were decoded already into bf16 pairs
// (pre, predecode) and w is not read.
template <int NV, int KS, int R, bool PRE>
DEV void coded_sums(const CodedUnit (&w)[R][NV], const unsigned (&pre)[R][NV][8], const unsigned (&e)[R],
                    const float* xs, int ks, int lane, const Coded& cd, float (&acc)[R][1]) {
  float s[R];
#pragma unroll
  for (int r = 0; r < R; r++) s[r] = 0.f;
#pragma unroll
  for (int v = 0; v < NV; v++) {
#pragma unroll
    for (int q = 0; q < 4; q++) {
      const float4 xq = reinterpret_cast<const float4*>(xs)[((v * KS + ks) * 4 + q) * 32 + lane];
#pragma unroll
      for (int r = 0; r < R; r++) {
        unsigned p01, p23;
        if constexpr (PRE) {
          p01 = pre[r][v][2 * q];
          p23 = pre[r][v][2 * q + 1];
        } else {
          decode_pairs(w[r][v], q, cd.base4, p01, p23);
        }
        const float f[4] = {bflo(p01), bfhi(p01), bflo(p23), bfhi(p23)};
        s[r] = fmaf(f[0], xq.x, s[r]);
        s[r] = fmaf(f[1], xq.y, s[r]);
        s[r] = fmaf(f[2], xq.z, s[r]);
        s[r] = fmaf(f[3], xq.w, s[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
    if (e[r] != 0xffffffffu) {
      const float xc = xs[xs_at(e[r] >> 16)];
      s[r] = fmaf(bflo(e[r]), xc, s[r]);
      s[r] = fmaf(-cd.v0, xc, s[r]);
    }
    acc[r][0] = warp_sum(s[r]);
  }
}

// With AHEAD (POST_RES, up to two units a warp), the group after the
// first is asked for before the post-norm's prologue (see below). With
// CODED, w is in the 12-bit code (Coded; one row of x, no AHEAD): a unit
// is 512 values, 16 a lane, and x goes to shared memory too, for the
// escapes.
template <int NV, int KS, int R, int MODE, int D, int NB, int POST = POST_NONE, bool AM = false, bool AHEAD = false,
          bool CODED = false>
DEV void gemv_bf16_fast(float* __restrict__ out, const float* __restrict__ x, const uint16_t* __restrict__ w, int n,
                        int k, int m, PostNorm pn = {}, ArgmaxOut am = {}, Coded cd = {}) {
  static_assert(!AHEAD || (POST == POST_RES && NV <= 2 && D == 2 && !CODED), "the group ahead goes to shared memory");
  static_assert(MODE != GEMV_GLU || (R == 2 && NB == 1), "GLU pairs a gate row with its up row, for one row of x");
  static_assert(POST == POST_NONE || NB == 1, "a post-norm forms one row of x");
  static_assert(!AM || (MODE == GEMV_PLAIN && NB == 1), "the argmax of one plain row");
  static_assert(!CODED || NB == 1, "coded weights for one row of x");
  using Unit = typename UnitOf<CODED>::T;
  constexpr int E = CODED ? 16 : 8;               // values of a unit a lane holds
  constexpr int U = 32 * E;                       // values of a unit
  constexpr int GROUPS = 8 / KS;                  // row groups per block
  constexpr int IR = MODE == GEMV_GLU ? 1 : R;    // outputs of a row group
  constexpr int ITEMS = GROUPS * IR;              // outputs per block iteration and row of x
  const int mo = MODE == GEMV_GLU ? m / 2 : m;    // outputs per row of x
  // Two buffers of partial sums, so one barrier an iteration suffices.
  __shared__ float part[2][KS > 1 ? KS : 1][NB * GROUPS * R];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int ks = warp % KS, grp = warp / KS;
  // The lane's E elements of its warp's unit v start at off(v); with k % E
  // == 0 they lie wholly inside k or wholly beyond it.
  auto off = [&](int v) { return (v * KS + ks) * U + lane * E; };
  static_assert(D == 2 || D == 3, "two or three groups of loads");
  // A group's weights, and with CODED its rows' escape entries (a lane
  // each, in the warps of ks 0).
  struct Group {
    Unit w[R][NV];
    unsigned e[CODED ? R : 1];
  };
  Group g0, g1, g2;  // g2 only with D == 3
  // row is row r of the group whose first output is i0 (rows past the end
  // read the last row; their sums are not stored); loadw loads its rows.
  auto row = [&](int i0, int r) { return min(MODE == GEMV_GLU ? i0 + r * mo : i0 + r, m - 1); };
  auto loadw = [&](Group& g, int i0) {
#pragma unroll
    for (int r = 0; r < R; r++) {
      const long rw = row(i0, r);
#pragma unroll
      for (int v = 0; v < NV; v++) {
        if constexpr (CODED) {
          const uint8_t* cp = reinterpret_cast<const uint8_t*>(w) + rw * (k / 2 * 3) + (v * KS + ks) * 768;
          if (off(v) < k) {
            g.w[r][v].lo = ld_once(cp + lane * 16);
            g.w[r][v].codes = ld_once8(cp + 512 + lane * 8);
          } else {
            g.w[r][v].lo = make_uint4(0, 0, 0, 0);
            g.w[r][v].codes = make_uint2(0, 0);
          }
        } else {
          const uint16_t* wp = w + rw * k;
          g.w[r][v] = off(v) < k ? ld_once(wp + off(v)) : make_uint4(0, 0, 0, 0);
        }
      }
      if constexpr (CODED) g.e[r] = ks == 0 && lane < cd.cap ? __ldg(cd.esc + rw * cd.cap + lane) : 0xffffffffu;
    }
  };
  const int stride = gridDim.x * ITEMS;
  int base = blockIdx.x * ITEMS;
  if (base < mo) loadw(g0, base + grp * IR);
  if (D == 3 && base + stride < mo) loadw(g1, base + stride + grp * IR);
  // With CODED, the first group is decoded as soon as its loads land,
  // before the wait: in a short product that group is all the weights a
  // warp has, and its decoding then overlaps the kernel ahead.
  unsigned pre[CODED ? R : 1][CODED ? NV : 1][8];
  if constexpr (CODED) {
    if (base < mo) predecode(g0.w, cd.base4, pre);
  }
  pdl_begin();
  // With AHEAD, the second group, which the first step would ask for
  // after the post-norm's prologue (two waits on loads of y and r, and
  // two barriers), is asked for before it, so that the weights keep
  // streaming: into shared memory (cp.async; the registers are full),
  // each thread to its own slots, moved to registers once the first group
  // is summed.
  __shared__ uint4 wsm[AHEAD ? R * NV * 256 : 1];
  if constexpr (AHEAD) {
    if (base + stride < mo) {
      const uint64_t pol = weight_policy();
#pragma unroll
      for (int r = 0; r < R; r++) {
        const uint16_t* wp = w + (long)row(base + stride + grp * IR, r) * k;
#pragma unroll
        for (int v = 0; v < NV; v++)
          cp_async16_hint(&wsm[(r * NV + v) * 256 + threadIdx.x], wp + off(v), off(v) < k, pol);
      }
      cp_async_commit();
    }
  }
  float xv[NB][NV][E];
#pragma unroll
  for (int b = 0; b < NB; b++)
#pragma unroll
    for (int v = 0; v < NV; v++) {
      if ((NB > 1 && b >= n) || off(v) >= k) {
#pragma unroll
        for (int j = 0; j < E; j++) xv[b][v][j] = 0.f;
        continue;
      }
#pragma unroll
      for (int h = 0; h < E / 8; h++) {
        const float4* xp = reinterpret_cast<const float4*>(x + (long)b * k + off(v) + 8 * h);
        float4 a = xp[0], c = xp[1];
        float* xh = &xv[b][v][8 * h];
        xh[0] = a.x; xh[1] = a.y; xh[2] = a.z; xh[3] = a.w;
        xh[4] = c.x; xh[5] = c.y; xh[6] = c.z; xh[7] = c.w;
      }
    }
  if constexpr (POST != POST_NONE) {
    // Each row group's KS warps hold every unit of k, so the block sums
    // x's squares from registers, every group (and block) in one order.
    __shared__ float ssw[2][8];
    auto inv_rms = [&](int s) {
      float ss = 0.f;
#pragma unroll
      for (int v = 0; v < NV; v++)
#pragma unroll
        for (int e = 0; e < E; e++) ss = fmaf(xv[0][v][e], xv[0][v][e], ss);
      ss = warp_sum(ss);
      if (lane == 0) ssw[s][warp] = ss;
      __syncthreads();
      float tot = 0.f;
#pragma unroll
      for (int q = 0; q < KS; q++) tot += ssw[s][grp * KS + q];
      return rsqrtf(tot / (float)k + pn.eps);
    };
    const bool normy = POST == POST_RES || pn.wn != nullptr;  // uniform over the block
    const float inv = normy ? inv_rms(0) : 1.f;
    const bool keep = POST == POST_RES && blockIdx.x == 0 && grp == 0;
#pragma unroll
    for (int v = 0; v < NV; v++) {
      if (off(v) >= k) continue;
#pragma unroll
      for (int h = 0; h < E / 8; h++) {
        const int o = off(v) + 8 * h;
        float* xh = &xv[0][v][8 * h];
        const float4* rp = reinterpret_cast<const float4*>(pn.r + o);
        float4 a = rp[0], c = rp[1];
        float rv[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w}, wf[8];
        if (normy) {
          norm8(pn.wn, pn.wn_f32, o, wf);
#pragma unroll
          for (int e = 0; e < 8; e++) xh[e] = xh[e] * inv * wf[e] + rv[e];
        } else {
#pragma unroll
          for (int e = 0; e < 8; e++) xh[e] += rv[e];
        }
        if (keep) {
          float4* op = reinterpret_cast<float4*>(pn.r_out + o);
          op[0] = make_float4(xh[0], xh[1], xh[2], xh[3]);
          op[1] = make_float4(xh[4], xh[5], xh[6], xh[7]);
        }
      }
    }
    if constexpr (POST == POST_HEAD) {
      const float invf = inv_rms(1);
#pragma unroll
      for (int v = 0; v < NV; v++) {
        if (off(v) >= k) continue;
#pragma unroll
        for (int h = 0; h < E / 8; h++) {
          float wf[8];
          norm8(pn.wf, pn.wf_f32, off(v) + 8 * h, wf);
#pragma unroll
          for (int e = 0; e < 8; e++) xv[0][v][8 * h + e] *= invf * wf[e];
        }
      }
    }
  }
  // With CODED, x in shared memory as well, for the escapes' columns.
  __shared__ float xs[CODED ? NV * KS * U : 1];
  if constexpr (CODED) {
    if (grp == 0) {
#pragma unroll
      for (int v = 0; v < NV; v++)
        if (off(v) < k) {
#pragma unroll
          for (int q = 0; q < 4; q++)
            reinterpret_cast<float4*>(xs)[((v * KS + ks) * 4 + q) * 32 + lane] =
                make_float4(xv[0][v][4 * q], xv[0][v][4 * q + 1], xv[0][v][4 * q + 2], xv[0][v][4 * q + 3]);
        }
    }
    __syncthreads();
  }
  // The block's best output so far, with AM.
  float bv = -__int_as_float(0x7f800000);
  int bi = 0x7fffffff;
  // step sums the group at base from cur, after issuing the loads of the
  // group D-1 ahead into nxt (cur's predecessor, summed already).
  auto step = [&](Group& cur, Group& nxt, int base, int buf, bool first, bool predecoded) {
    if (!(AHEAD && first) && base + (D - 1) * stride < mo) loadw(nxt, base + (D - 1) * stride + grp * IR);
    int i0 = base + grp * IR;
    float acc[R][NB];
    if constexpr (CODED) {
      if (predecoded) coded_sums<NV, KS, R, true>(cur.w, pre, cur.e, xs, ks, lane, cd, acc);
      else coded_sums<NV, KS, R, false>(cur.w, pre, cur.e, xs, ks, lane, cd, acc);
    } else {
#pragma unroll
      for (int r = 0; r < R; r++) {
        float s[NB];
#pragma unroll
        for (int b = 0; b < NB; b++) s[b] = 0.f;
#pragma unroll
        for (int v = 0; v < NV; v++) {
          float f[8];
          unpack8<BF16>(cur.w[r][v], f);
#pragma unroll
          for (int b = 0; b < NB; b++)
#pragma unroll
            for (int e = 0; e < 8; e++) s[b] = fmaf(f[e], xv[b][v][e], s[b]);
        }
#pragma unroll
        for (int b = 0; b < NB; b++) acc[r][b] = warp_sum(s[b]);
      }
    }
    if (KS == 1) {
      if (MODE == GEMV_GLU) {
        if (lane == 0 && i0 < mo) out[i0] = silu(acc[0][0]) * acc[1][0];
      } else if (lane < R * NB) {
        // Lane b*R + r stores row b's output i0 + r.
        float s = 0.f;
#pragma unroll
        for (int b = 0; b < NB; b++)
#pragma unroll
          for (int r = 0; r < R; r++)
            if (lane == b * R + r) s = acc[r][b];
        if constexpr (NB == 1) {
          if (i0 + lane < mo) {
            out[i0 + lane] = s;
            if constexpr (AM) better(bv, bi, s, i0 + lane);
          }
        } else {
          int b = lane / R, r = lane % R;
          if (b < n && i0 + r < mo) out[(long)b * mo + i0 + r] = s;
        }
      }
      return;
    }
    if (lane == 0) {
#pragma unroll
      for (int b = 0; b < NB; b++)
#pragma unroll
        for (int r = 0; r < R; r++) part[buf][ks][b * GROUPS * R + grp * R + r] = acc[r][b];
    }
    __syncthreads();
    int j = threadIdx.x;
    if (MODE == GEMV_GLU) {
      if (j < ITEMS && base + j < mo) {
        float g = 0.f, u = 0.f;
#pragma unroll
        for (int q = 0; q < KS; q++) {
          g += part[buf][q][2 * j];
          u += part[buf][q][2 * j + 1];
        }
        out[base + j] = silu(g) * u;
      }
    } else if (j < NB * ITEMS) {
      int b = NB == 1 ? 0 : j / ITEMS, i = NB == 1 ? j : j % ITEMS;
      if ((NB == 1 || b < n) && base + i < mo) {
        float s = 0.f;
#pragma unroll
        for (int q = 0; q < KS; q++) s += part[buf][q][j];
        out[(long)b * mo + base + i] = s;
        if constexpr (AM) better(bv, bi, s, base + i);
      }
    }
  };
  // The buffers rotate by name, so that they stay in registers; a
  // predecoded first group is summed on its own.
  int it = 0;
  if constexpr (CODED) {
    if (base < mo) {
      step(g0, D == 3 ? g2 : g1, base, 0, true, true);
      it = 1;
      base += stride;
    }
  }
  for (; base < mo; it++, base += stride) {
    int ph = it % D;
    if constexpr (AHEAD) {
      if (it == 1) {
        cp_async_wait<0>();
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
          for (int v = 0; v < NV; v++) g1.w[r][v] = wsm[(r * NV + v) * 256 + threadIdx.x];
      }
    }
    if (ph == 0) step(g0, D == 3 ? g2 : g1, base, it & 1, it == 0, false);
    else if (ph == 1) step(g1, g0, base, it & 1, false, false);
    else step(g2, g1, base, it & 1, false, false);
  }
  if constexpr (AM) {
    if (am.next != nullptr) grid_best(bv, bi, am.pv, am.pi, am.cnt, am.next, blockIdx.x, gridDim.x);
  }
}

// Entry points for the (NV, KS) pairs gemvShape in gpu/cuda picks: KS = 8
// with NV in {2, 3, 4, 6, 8}, and NV = 2 or 1 for k under 4096. Up to two
// units a warp, four blocks fit on an SM (64 registers a thread). One row
// of x: gemv_bf16_* and gemv_glu_bf16_*; two and up to four rows (n of
// them): gemv_bf16_b2_* (NV <= 6) and gemv_bf16_b4_* (NV <= 4), whose
// registers of x allow two blocks an SM where one row allows four.
#define FAST1(NAME, MODE, NV, KS)                                                                                   \
  extern "C" __global__ void __launch_bounds__(256, NV <= 2 ? 4 : 1)                                               \
      NAME##_nv##NV##_ks##KS(float* out, const float* x, const uint16_t* w, int k, int m) {                         \
    gemv_bf16_fast<NV, KS, 2, MODE, (NV == 3 || NV == 6) ? 3 : 2, 1>(out, x, w, 1, k, m);                          \
  }
#define FASTB(NB, NV, KS)                                                                                           \
  extern "C" __global__ void __launch_bounds__(256, NV <= 2 ? 2 : 1)                                               \
      gemv_bf16_b##NB##_nv##NV##_ks##KS(float* out, const float* x, const uint16_t* w, int n, int k, int m) {      \
    gemv_bf16_fast<NV, KS, 2, GEMV_PLAIN, 2, NB>(out, x, w, n, k, m);                                              \
  }
// gemv_bf16_post_* and gemv_glu_bf16_post_*: one row of x formed from a
// post-norm (PostNorm).
#define POST1(NAME, MODE, NV, KS)                                                                                   \
  extern "C" __global__ void __launch_bounds__(256, NV <= 2 ? 4 : 1)                                               \
      NAME##_post_nv##NV##_ks##KS(float* out, const float* y, const uint16_t* w, int k, int m, float* r_out,       \
                                  const float* r, const void* wn, int wn_f32, float eps) {                        \
    gemv_bf16_fast<NV, KS, 2, MODE, (NV == 3 || NV == 6) ? 3 : 2, 1, POST_RES>(out, y, w, 1, k, m,                 \
                                                                               PostNorm{r_out, r, wn, wn_f32, eps}); \
  }
// gemv_bf16_post_ahead_* and gemv_glu_bf16_post_ahead_*: the same with the
// second group asked for before the prologue (AHEAD), for up to two units
// a warp.
#define POSTA(NAME, MODE, NV, KS)                                                                                   \
  extern "C" __global__ void __launch_bounds__(256, 4)                                                              \
      NAME##_post_ahead_nv##NV##_ks##KS(float* out, const float* y, const uint16_t* w, int k, int m, float* r_out, \
                                        const float* r, const void* wn, int wn_f32, float eps) {                  \
    gemv_bf16_fast<NV, KS, 2, MODE, 2, 1, POST_RES, false, true>(out, y, w, 1, k, m,                               \
                                                                 PostNorm{r_out, r, wn, wn_f32, eps});             \
  }
// gemv_bf16_head_*: an LM head over one row whose x is formed from the
// step's last residual update and final norm (POST_HEAD), with the
// argmax of its outputs into *next unless next is null. One instantiation
// serves both, so that a coded head's x in shared memory is declared once
// (two would pass the 48 KiB of static shared memory that the PTX for
// other GPUs may hold).
#define HEAD1(NV, KS)                                                                                               \
  extern "C" __global__ void __launch_bounds__(256, NV <= 2 ? 4 : 1)                                               \
      gemv_bf16_head_nv##NV##_ks##KS(float* out, const float* y, const uint16_t* w, int k, int m, const float* r,  \
                                     const void* wn, int wn_f32, const void* wf, int wf_f32, float eps, int* next, \
                                     float* pv, int* pi, unsigned* cnt) {                                          \
    constexpr int D = (NV == 3 || NV == 6) ? 3 : 2;                                                                \
    gemv_bf16_fast<NV, KS, 2, GEMV_PLAIN, D, 1, POST_HEAD, true>(out, y, w, 1, k, m,                                \
                                                                 PostNorm{nullptr, r, wn, wn_f32, eps, wf, wf_f32}, \
                                                                 ArgmaxOut{next, pv, pi, cnt});                    \
  }
#define FAST(NV, KS)                                                                                                \
  FAST1(gemv_bf16, GEMV_PLAIN, NV, KS) FAST1(gemv_glu_bf16, GEMV_GLU, NV, KS) POST1(gemv_bf16, GEMV_PLAIN, NV, KS)   \
  POST1(gemv_glu_bf16, GEMV_GLU, NV, KS) HEAD1(NV, KS)
FAST(1, 1) FAST(2, 1) FAST(2, 2) FAST(2, 4) FAST(2, 8) FAST(3, 8) FAST(4, 8) FAST(6, 8) FAST(8, 8)
#define AHEADS(NV, KS) POSTA(gemv_bf16, GEMV_PLAIN, NV, KS) POSTA(gemv_glu_bf16, GEMV_GLU, NV, KS)
AHEADS(1, 1) AHEADS(2, 1) AHEADS(2, 2) AHEADS(2, 4) AHEADS(2, 8)
// The same over weights in the 12-bit code (Coded, its four arguments
// last): gemv_c12_*, gemv_glu_c12_*, gemv_c12_post_*, gemv_glu_c12_post_*
// and gemv_c12_head_*, for one row of x, k up to 8192 (x in shared memory).
// Two groups in flight and two blocks an SM, measured best on an H200
// (docs/cuda.md, "Weights in a 12-bit code"): three groups ran OLMo-2-1B
// at 0.809 ms a token against 0.773, three blocks an SM at 0.838, and x in
// registers rather than shared memory at 0.775.
#define CODED_ARGS const unsigned *esc, int cap, unsigned base4, float v0
#define CFAST1(NAME, MODE, NV, KS)                                                                                  \
  extern "C" __global__ void __launch_bounds__(256, 2)                                                              \
      NAME##_nv##NV##_ks##KS(float* out, const float* x, const uint16_t* w, int k, int m, CODED_ARGS) {             \
    gemv_bf16_fast<NV, KS, 2, MODE, 2, 1, POST_NONE, false, false, true>(out, x, w, 1, k, m, PostNorm{}, ArgmaxOut{}, \
                                                                         Coded{esc, cap, base4, v0});               \
  }
#define CPOST1(NAME, MODE, NV, KS)                                                                                  \
  extern "C" __global__ void __launch_bounds__(256, 2)                                                              \
      NAME##_post_nv##NV##_ks##KS(float* out, const float* y, const uint16_t* w, int k, int m, float* r_out,        \
                                  const float* r, const void* wn, int wn_f32, float eps, CODED_ARGS) {              \
    gemv_bf16_fast<NV, KS, 2, MODE, 2, 1, POST_RES, false, false, true>(                                            \
        out, y, w, 1, k, m, PostNorm{r_out, r, wn, wn_f32, eps}, ArgmaxOut{}, Coded{esc, cap, base4, v0});          \
  }
#define CHEAD1(NV, KS)                                                                                              \
  extern "C" __global__ void __launch_bounds__(256, 2)                                                              \
      gemv_c12_head_nv##NV##_ks##KS(float* out, const float* y, const uint16_t* w, int k, int m, const float* r,    \
                                    const void* wn, int wn_f32, const void* wf, int wf_f32, float eps, int* next,   \
                                    float* pv, int* pi, unsigned* cnt, CODED_ARGS) {                                \
    gemv_bf16_fast<NV, KS, 2, GEMV_PLAIN, 2, 1, POST_HEAD, true, false, true>(                                      \
        out, y, w, 1, k, m, PostNorm{nullptr, r, wn, wn_f32, eps, wf, wf_f32}, ArgmaxOut{next, pv, pi, cnt},        \
        Coded{esc, cap, base4, v0});                                                                                \
  }
#define CFAST(NV, KS)                                                                                               \
  CFAST1(gemv_c12, GEMV_PLAIN, NV, KS) CFAST1(gemv_glu_c12, GEMV_GLU, NV, KS) CPOST1(gemv_c12, GEMV_PLAIN, NV, KS)  \
  CPOST1(gemv_glu_c12, GEMV_GLU, NV, KS) CHEAD1(NV, KS)
CFAST(1, 1) CFAST(2, 1) CFAST(2, 2) CFAST(2, 4) CFAST(2, 8)
FASTB(2, 1, 1) FASTB(2, 2, 1) FASTB(2, 2, 2) FASTB(2, 2, 4) FASTB(2, 2, 8) FASTB(2, 3, 8) FASTB(2, 4, 8) FASTB(2, 6, 8)
FASTB(4, 1, 1) FASTB(4, 2, 1) FASTB(4, 2, 2) FASTB(4, 2, 4) FASTB(4, 2, 8) FASTB(4, 3, 8) FASTB(4, 4, 8)

// gemv: any k, up to 8 rows of x; one warp per row of w, 8 rows per block.
// Uses 16-byte loads of w when rows stay 16-byte aligned.
template <typename T>
DEV void gemv(float* __restrict__ out, const float* __restrict__ x, const typename Elem<T>::raw* __restrict__ w, int n,
              int k, int m) {
  pdl_begin();
  constexpr int NB = 8;
  int lane = threadIdx.x & 31;
  int row = blockIdx.x * 8 + (threadIdx.x >> 5);
  if (row >= m) return;
  const typename Elem<T>::raw* wr = w + (long)row * k;
  float acc[NB];
#pragma unroll
  for (int b = 0; b < NB; b++) acc[b] = 0.f;
  constexpr int VEC = 16 / sizeof(typename Elem<T>::raw);
  int kv = (k % VEC == 0) ? k : 0;
  for (int i = lane * VEC; i < kv; i += 32 * VEC) {
    uint4 u = *reinterpret_cast<const uint4*>(wr + i);
    float f[8];
    if constexpr (VEC == 8) {
      unpack8<T>(u, f);
    } else {
      f[0] = __uint_as_float(u.x); f[1] = __uint_as_float(u.y); f[2] = __uint_as_float(u.z); f[3] = __uint_as_float(u.w);
    }
#pragma unroll
    for (int b = 0; b < NB; b++) {
      if (b < n) {
        const float* xb = x + (long)b * k + i;
#pragma unroll
        for (int e = 0; e < VEC; e++) acc[b] = fmaf(f[e], xb[e], acc[b]);
      }
    }
  }
  for (int i = kv + lane; i < k; i += 32) {
    float f = Elem<T>::load(wr, i);
#pragma unroll
    for (int b = 0; b < NB; b++)
      if (b < n) acc[b] = fmaf(f, x[(long)b * k + i], acc[b]);
  }
#pragma unroll
  for (int b = 0; b < NB; b++) {
    if (b < n) {
      float s = warp_sum(acc[b]);
      if (lane == 0) out[(long)b * m + row] = s;
    }
  }
}

extern "C" __global__ void __launch_bounds__(256) gemv_f32(float* out, const float* x, const float* w, int n, int k, int m) {
  gemv<float>(out, x, w, n, k, m);
}
extern "C" __global__ void __launch_bounds__(256) gemv_bf16(float* out, const float* x, const uint16_t* w, int n, int k, int m) {
  gemv<BF16>(out, x, w, n, k, m);
}
extern "C" __global__ void __launch_bounds__(256) gemv_f16(float* out, const float* x, const uint16_t* w, int n, int k, int m) {
  gemv<F16>(out, x, w, n, k, m);
}
