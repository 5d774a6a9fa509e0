// Token draws from rows of logits on the device, as gpu.SampleHost
// (gpu/sample.go) defines them. One block of ST threads draws a row. Every
// pass over the row is coalesced: warp w owns the w-th of 32 contiguous
// segments of the row (whole groups of 32 logits) and reads it 32
// consecutive logits at a time, lane by lane, with 8 or 16 loads in flight
// a thread. NaN logits count as -Inf.
//
// Greedy rows take the first largest logit: one pass.
//
// Unfiltered draws need the row's largest logit before its exponentials;
// one pass finds both. Each warp sums exp(l/T - ref) in float64 against a
// reference ref of its own, the largest logit it has seen over T, which it
// raises (rescaling its sums) only when a logit passes it by more than
// 300/T, so that no term overflows. The segments' sums, brought to
// exp(l/T - max/T), are scanned in index order to find the segment where
// u·total falls; that segment is cut into 32 pieces of whole 32-logit
// groups whose sums are scanned again, and one warp walks its piece with
// inclusive warp scans to the first logit whose cumulative sum passes
// u·total. Where the host's walk would end without a token (a NaN sum, or
// u·total rounded up to the total) the draw takes the first largest logit,
// as the host does.
//
// The passes' exponentials use exp_fast (a 64-entry table of 2^(j/64) and
// a degree-5 polynomial: within a few ulp of exp) of l/T - ref formed as
// EXACT_ABOVE says: as the host forms it where |ref| is large, else with
// l·(1/T), within 1e-12 of the host's for every term that counts; a logit
// equal to the reference's gives exactly 0 either way. The draws of host
// and device may part only where u lies within about 1e-12 of a token's
// edge, which gputest's tolerance (1e-9) covers.
//
// Top-k draws keep k candidates (k at most 1024). They find the k-th
// largest logit by a radix select over order-preserving keys (okey): the
// first pass over the row counts the keys' top 12 bits in shared memory (a
// thread adds runs of equal bins at once, so rows of equal or masked
// logits cost few atomics). A second pass compacts every logit whose key
// reaches the lower edge of the bin holding the k-th largest into shared
// memory (key and index, SAMPLE_CAP of them at most); the remaining 20
// bits are selected there. Ties at the k-th largest key keep the lowest
// indexes: among more tied candidates than needed, a radix select over the
// indexes finds the last index kept. Should the bin hold more candidates
// than SAMPLE_CAP, the row is counted again on the next 10 bits (twice at
// most); should 32 bits still leave too many (a mass of equal logits), the
// k are gathered from the row itself, the ties ranked in index order. The
// k candidates are sorted (value descending, index ascending) by a bitonic
// network over the next power of two from max(k, 32): one per thread,
// partners within a warp exchanged by shuffles and the others through
// shared memory. The host's float64 loop then runs across the block,
// thread i holding the i-th candidate: its probability as the host forms
// it (exp of l/T - max/T over the candidates' sum), min-p's cut a block
// maximum, top-p's cumulative sums a block scan whose first crossing a
// block minimum finds (should a sum lie within 1e-12 of top_p before the
// first clear crossing, one thread adds them one by one in sorted order
// instead, as the host does), and the draw's walk a block minimum over the
// same sums.
//
// Whole-row draws (top-p or min-p without a top-k below the width:
// gpu.SampleRow.Whole) are settled on the device for every row, as the
// host's whole settles them. A first pass finds the largest logit (a row
// without a finite one takes the host's answer: the least logit's last
// index). A second sums exp(l/T - max/T) (exp_fast) over the row and, for
// each candidate (min-p leaves out e < min_p), into the host's 4,096
// buckets (b = int((max - l)·scale), scale = 4096/(32·T), the last taking
// everything below) in shared float64 atomics, a lane adding runs of one
// bucket at once and keeping the first and last buckets, where ties and a
// row's tail crowd, in registers; the sums, brought to probabilities, are
// scanned into running sums P. Top-p's running sum, and then the draw's
// u·total, are walked over whole buckets by P (a block minimum finds the
// bucket where it ends) and token by token in that bucket: a pass gathers
// its tokens (float tests against the bucket's bounds rounded outward, a
// group of logits without one costing a vote, then the exact bucket) into
// shared memory, a bitonic network sorts them (value descending, index
// ascending) and a block scan of their probabilities finds the token, with
// the 1e-12 rule above for top-p. A bucket of more than WHOLE_CAP tokens
// (a row flatter than 1/128 of the temperature over thousands of tokens)
// is walked in sorted chunks of WHOLE_CAP: each the largest keys below the
// last chunk's least, found by a radix select over the row (12, 10 and 10
// bits of the logit's key, restricted to the bucket and the range left)
// and gathered with their ties in index order. As the host's walks, one
// that ends without a token (rounding) goes on from the next bucket, and
// the draw falls back on the last token kept (top-p's cut, or the last
// token of the last candidate bucket). The walks run out of line
// (whole_draw, w_masses, w_walk, w_gather_group), so that the other draws
// keep their registers.
//
// summary_rows summarises rows for log-probabilities as gpu.Summarize does
// (gpu.Summarizer): the chosen token's log-probability and the top (at most
// 20) most likely tokens with theirs, a block of ST threads for each of the
// host's 8 pieces of a row, which it reads once into registers: the
// piece's largest logit, its exponentials under it (exp_fast) and its top
// candidates, merged by the block that finishes last; the log-probabilities
// are the host's except near 0, where float32 resolves finer than the
// float64 log-sum-exp holds (summary_rows below says how).
#include "common.cuh"

#define ST 1024             // threads a row
#define SAMPLE_ROWS 64      // rows a launch (the rows travel by value)
#define SAMPLE_TOPK 1024    // gpu.MaxSampleTopK
#define SAMPLE_CAP 8192     // candidates compacted into shared memory
#define SAMPLE_BINS 4096    // bins of the first histogram (12 bits)
// Dynamic shared memory (gpu/cuda/sample.go passes SAMPLE_SMEM): the
// exponential table (16 copies of 64 doubles, 8 KiB), the histogram, whose
// 16 KiB the sort's two buffers of ST keys reuse, and the candidates' keys
// and indexes (2 × 32 KiB).
#define SAMPLE_TAB_OFF 0
#define SAMPLE_HIST_OFF 8192
#define SAMPLE_CKEY_OFF (SAMPLE_HIST_OFF + SAMPLE_BINS * 4)
#define SAMPLE_CIDX_OFF (SAMPLE_CKEY_OFF + SAMPLE_CAP * 4)
#define SAMPLE_SMEM (SAMPLE_CIDX_OFF + SAMPLE_CAP * 4)
#define LOADS 16          // loads in flight a thread in the light passes
#define SUM_LOADS 8       // and in those that sum exponentials
#define ALL_LANES 0xffffffffu
#define NO_INDEX 0x7fffffff

// SampleRow is gpu.SampleRow as the host packs it.
struct SampleRow {
  float temperature, top_p, min_p;
  int top_k;
  double u;
};
struct SampleRows {
  SampleRow r[SAMPLE_ROWS];
};

// SampleShared is a block's small shared state: per-warp partials, the
// scans' scratch and broadcasts.
struct SampleShared {
  double d[32], d2[32], bd;
  float f[32];
  int i[32];
  unsigned u[32], u2[32], sel[3], count;
  unsigned long long q[32], cu;  // whole-row draws: a block minimum's, a token's broadcast
  int wi;
};

// exp2_64[j] is 2^(j/64), correctly rounded.
__constant__ double exp2_64[64] = {
    0x1.0000000000000p+0, 0x1.02c9a3e778061p+0, 0x1.059b0d3158574p+0, 0x1.0874518759bc8p+0,
    0x1.0b5586cf9890fp+0, 0x1.0e3ec32d3d1a2p+0, 0x1.11301d0125b51p+0, 0x1.1429aaea92de0p+0,
    0x1.172b83c7d517bp+0, 0x1.1a35beb6fcb75p+0, 0x1.1d4873168b9aap+0, 0x1.2063b88628cd6p+0,
    0x1.2387a6e756238p+0, 0x1.26b4565e27cddp+0, 0x1.29e9df51fdee1p+0, 0x1.2d285a6e4030bp+0,
    0x1.306fe0a31b715p+0, 0x1.33c08b26416ffp+0, 0x1.371a7373aa9cbp+0, 0x1.3a7db34e59ff7p+0,
    0x1.3dea64c123422p+0, 0x1.4160a21f72e2ap+0, 0x1.44e086061892dp+0, 0x1.486a2b5c13cd0p+0,
    0x1.4bfdad5362a27p+0, 0x1.4f9b2769d2ca7p+0, 0x1.5342b569d4f82p+0, 0x1.56f4736b527dap+0,
    0x1.5ab07dd485429p+0, 0x1.5e76f15ad2148p+0, 0x1.6247eb03a5585p+0, 0x1.6623882552225p+0,
    0x1.6a09e667f3bcdp+0, 0x1.6dfb23c651a2fp+0, 0x1.71f75e8ec5f74p+0, 0x1.75feb564267c9p+0,
    0x1.7a11473eb0187p+0, 0x1.7e2f336cf4e62p+0, 0x1.82589994cce13p+0, 0x1.868d99b4492edp+0,
    0x1.8ace5422aa0dbp+0, 0x1.8f1ae99157736p+0, 0x1.93737b0cdc5e5p+0, 0x1.97d829fde4e50p+0,
    0x1.9c49182a3f090p+0, 0x1.a0c667b5de565p+0, 0x1.a5503b23e255dp+0, 0x1.a9e6b5579fdbfp+0,
    0x1.ae89f995ad3adp+0, 0x1.b33a2b84f15fbp+0, 0x1.b7f76f2fb5e47p+0, 0x1.bcc1e904bc1d2p+0,
    0x1.c199bdd85529cp+0, 0x1.c67f12e57d14bp+0, 0x1.cb720dcef9069p+0, 0x1.d072d4a07897cp+0,
    0x1.d5818dcfba487p+0, 0x1.da9e603db3285p+0, 0x1.dfc97337b9b5fp+0, 0x1.e502ee78b3ff6p+0,
    0x1.ea4afa2a490dap+0, 0x1.efa1bee615a27p+0, 0x1.f50765b6e4540p+0, 0x1.fa7c1819e90d8p+0,
};

DEV float neg_inf() { return -__int_as_float(0x7f800000); }

// clean reads NaN as -Inf.
DEV float clean(float f) { return f != f ? neg_inf() : f; }

// finite reports whether f is neither infinite nor NaN.
DEV bool finite(float f) { return fabsf(f) <= 3.40282347e38f; }

// okey orders floats as unsigned integers: NaN as -Inf, -0 as +0 (equal
// logits, equal keys).
DEV unsigned okey(float f) {
  unsigned b = __float_as_uint(clean(f));
  if (b == 0x80000000u) b = 0u;
  return b ^ ((unsigned)((int)b >> 31) | 0x80000000u);
}

// kval is the float whose key is k.
DEV float kval(unsigned k) { return __uint_as_float((k & 0x80000000u) ? k ^ 0x80000000u : ~k); }

// Shuffles of 64-bit values, as two 32-bit ones.
DEV double shfl_d(double v, int src) {
  int lo = __shfl_sync(ALL_LANES, __double2loint(v), src), hi = __shfl_sync(ALL_LANES, __double2hiint(v), src);
  return __hiloint2double(hi, lo);
}
DEV double shfl_xor_d(double v, int m) {
  int lo = __shfl_xor_sync(ALL_LANES, __double2loint(v), m), hi = __shfl_xor_sync(ALL_LANES, __double2hiint(v), m);
  return __hiloint2double(hi, lo);
}
DEV double shfl_up_d(double v, int d) {
  int lo = __shfl_up_sync(ALL_LANES, (unsigned)__double2loint(v), d);
  int hi = __shfl_up_sync(ALL_LANES, (unsigned)__double2hiint(v), d);
  return __hiloint2double(hi, lo);
}
DEV unsigned long long shfl_xor_u64(unsigned long long v, int m) {
  unsigned lo = (unsigned)__shfl_xor_sync(ALL_LANES, (int)(unsigned)v, m);
  unsigned hi = (unsigned)__shfl_xor_sync(ALL_LANES, (int)(unsigned)(v >> 32), m);
  return ((unsigned long long)hi << 32) | lo;
}

// Warp reductions and inclusive scans (every lane gets its result).
DEV double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v += shfl_xor_d(v, o);
  return v;
}
DEV int warp_max_i(int v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v = max(v, __shfl_xor_sync(ALL_LANES, v, o));
  return v;
}
DEV int warp_min_i(int v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v = min(v, __shfl_xor_sync(ALL_LANES, v, o));
  return v;
}
DEV unsigned warp_incl_u(unsigned x) {
  int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    unsigned y = __shfl_up_sync(ALL_LANES, x, o);
    if (lane >= o) x += y;
  }
  return x;
}
DEV double warp_incl_d(double x) {
  int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    double y = shfl_up_d(x, o);
    if (lane >= o) x += y;
  }
  return x;
}

// last_lane is the highest lane whose bit is set in m (m not 0).
DEV int last_lane(unsigned m) { return 31 - __clz(m); }

// Block-wide operations: every thread calls them and gets the result. Each
// starts with a barrier, so that its shared scratch is free.

// block_excl_u returns the sum of v over the threads before this one and
// sets total to the sum over all.
DEV unsigned block_excl_u(unsigned v, SampleShared& ss, unsigned& total) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  unsigned x = warp_incl_u(v);
  __syncthreads();
  if (lane == 31) ss.u[w] = x;
  __syncthreads();
  unsigned t = warp_incl_u(ss.u[lane]);
  total = (unsigned)__shfl_sync(ALL_LANES, (int)t, 31);
  unsigned before = (unsigned)__shfl_sync(ALL_LANES, (int)t, max(w - 1, 0));
  return (w ? before : 0u) + x - v;
}

// block_incl_d returns the sum of v over the threads up to this one, in
// thread order.
DEV double block_incl_d(double v, SampleShared& ss) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  double x = warp_incl_d(v);
  __syncthreads();
  if (lane == 31) ss.d2[w] = x;
  __syncthreads();
  double t = warp_incl_d(ss.d2[lane]);
  double before = shfl_d(t, max(w - 1, 0));
  return w ? before + x : x;
}

// block_reduce combines v over the block with the warp-level reduction
// warp (warp_sum_d, warp_max_i, warp_min_i), through the 32 entries sh of
// the shared scratch; every thread gets the result.
template <typename T, typename W>
DEV T block_reduce(T v, T* sh, W warp) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  v = warp(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  return warp(sh[lane]);
}
DEV double block_sum_d(double v, SampleShared& ss) { return block_reduce(v, ss.d2, warp_sum_d); }
DEV int block_max_i(int v, SampleShared& ss) { return block_reduce(v, ss.i, warp_max_i); }
DEV int block_min_i(int v, SampleShared& ss) { return block_reduce(v, ss.i, warp_min_i); }

// argmax_merge keeps the first largest of (bv, bi) and (ov, oi).
DEV void argmax_merge(float& bv, int& bi, float ov, int oi) {
  if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
}

// block_argmax returns the first largest logit's index over the threads'
// (bv, bi), each a thread's first largest (bi NO_INDEX where it has none).
DEV int block_argmax(float bv, int bi, SampleShared& ss) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o; o >>= 1)
    argmax_merge(bv, bi, __shfl_xor_sync(ALL_LANES, bv, o), __shfl_xor_sync(ALL_LANES, bi, o));
  __syncthreads();
  if (lane == 0) ss.f[w] = bv, ss.i[w] = bi;
  __syncthreads();
  bv = ss.f[lane], bi = ss.i[lane];
#pragma unroll
  for (int o = 16; o; o >>= 1)
    argmax_merge(bv, bi, __shfl_xor_sync(ALL_LANES, bv, o), __shfl_xor_sync(ALL_LANES, bi, o));
  return bi == NO_INDEX ? 0 : bi;
}

// load_group loads this lane's N logits of the group of 32·N from g
// (logit g + lane + 32u, fill past b), the loads in flight together.
template <int N>
DEV void load_group(const float* __restrict__ l, int g, int b, float (&v)[N], float fill) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int u = 0; u < N; u++) {
    int i = g + lane + 32 * u;
    v[u] = i < b ? l[i] : fill;
  }
}

// greedy_pass sets (bv, bi) to this lane's first largest logit of its
// warp's segment [a, b) (bi NO_INDEX if the lane has none).
DEV void greedy_pass(const float* __restrict__ l, int a, int b, float& bv, int& bi) {
  const int lane = threadIdx.x & 31;
  bv = neg_inf(), bi = NO_INDEX;
  for (int g = a; g < b; g += 32 * LOADS) {
    float v[LOADS];
    load_group(l, g, b, v, 0.f);
#pragma unroll
    for (int u = 0; u < LOADS; u++) {
      int i = g + lane + 32 * u;
      float c = clean(v[u]);
      if (i < b && (c > bv || bi == NO_INDEX)) bv = c, bi = i;
    }
  }
}

// exp_slow is exp(x) for exp_fast's rare arguments, out of line so that
// the passes' loops stay small.
__device__ __noinline__ double exp_slow(double x) { return x < -746.0 ? 0.0 : exp(x); }

// exp_fast returns e^x: x = (64n + j)·ln2/64 + r with |r| ≤ ln2/128, e^x =
// 2^n · 2^(j/64) · (1 + expm1(r)), expm1 by a degree-5 polynomial (its
// error under 4e-17), within a few ulp of exp for |x| < 704 and exp's
// below that. tab is this lane's copy of 2^(j/64) (entry j at tab[16j]):
// the 16 lanes of a half-warp read 16 different banks.
DEV double exp_fast(double x, const double* tab) {
  const double shifter = 0x1.8p52;  // adding it rounds to an integer
  double kd = fma(x, 0x1.71547652b82fep+6, shifter);  // x·64/ln2
  int n = __double2loint(kd);
  kd -= shifter;
  double r = fma(kd, -0x1.62e42fefa39efp-7, x);  // x - kd·ln2/64
  double q = fma(fma(fma(r, 1.0 / 120, 1.0 / 24), r, 1.0 / 6), r, 0.5);
  double em1 = fma(q, r * r, r);
  double tj = tab[(n & 63) << 4];
  double e = fma(tj, em1, tj);
  e = __hiloint2double((int)((unsigned)__double2hiint(e) + ((unsigned)(n >> 6) << 20)), __double2loint(e));
  if (!(fabs(x) < 704.0)) e = exp_slow(x);
  return e;
}

// quot is v/T rounded as a division rounds it: v·(1/T) (rt, itself a
// rounded quotient) corrected once (Markstein), which gives the rounded
// quotient for every finite float v and T > 0; ±Inf stays ±Inf.
DEV double quot(double v, double t, double rt) {
  double q = __dmul_rn(v, rt), c = fma(fma(-q, t, v), rt, q);
  return c == c ? c : q;
}

// The device forms l/T - ref as the host does, quot(l) - ref with ref a
// rounded quotient too, only where |ref| > EXACT_ABOVE; below, it takes
// l·(1/T) - ref', ref' the reference's rounded product, which differs from
// the host's by at most about 2^-52·|l/T|: below 1e-12 for every term that
// counts (within 1000 of ref). Both give exactly 0 for l equal to the
// reference's logit.
#define EXACT_ABOVE 4096.0

// ExpSum is a lane's share of a warp's sum of exp(l/T - ref): refq, the
// warp's reference (the largest logit it had seen when it last raised it,
// top, as quot(top); -Inf before any) and reff, top·(1/T); thr, the logit
// above which the warp raises them.
struct ExpSum {
  double s, refq, reff;
  float thr;
};

// row_pass reads the warp's segment [a, b) of the row l once (SUM_LOADS
// loads in flight with SUM, else LOADS): m becomes the larger of m and this lane's largest
// logit. With SUM, es sums exp(l/T - ref) (rt is 1/T) and the warp raises
// its reference as ExpSum says. With HIST, every logit whose key
// matches prefix under mask adds one to hist at its digit (key >> lo) &
// dmask; a lane adds a run of equal digits at once.
template <bool SUM, bool HIST>
DEV void row_pass(const float* __restrict__ l, int a, int b, double rt, float t, const double* tab, float& m,
                  ExpSum& es, unsigned* hist, unsigned mask, unsigned prefix, int lo, unsigned dmask) {
  constexpr int U = SUM ? SUM_LOADS : LOADS;
  const int lane = threadIdx.x & 31;
  unsigned run_d = 0u, run_n = 0u;
  for (int g = a; g < b; g += 32 * U) {
    float v[U];
    load_group(l, g, b, v, neg_inf());
    float bm = neg_inf();
#pragma unroll
    for (int u = 0; u < U; u++) v[u] = clean(v[u]), bm = fmaxf(bm, v[u]);
    m = fmaxf(m, bm);
    if (SUM) {
      if (__any_sync(ALL_LANES, bm > es.thr)) {
        float top = warp_max(m);
        double refq = (double)top / (double)t;
        es.s *= exp(es.refq - refq);
        es.refq = refq;
        es.reff = __dmul_rn((double)top, rt);
        es.thr = top + 300.f * t;
      }
      if (fabs(es.refq) <= EXACT_ABOVE) {
#pragma unroll
        for (int u = 0; u < U; u++) es.s += exp_fast(__dmul_rn((double)v[u], rt) - es.reff, tab);
      } else if (es.refq > (double)neg_inf()) {
#pragma unroll
        for (int u = 0; u < U; u++) es.s += exp_fast(quot((double)v[u], (double)t, rt) - es.refq, tab);
      }
    }
    if (HIST) {
#pragma unroll
      for (int u = 0; u < U; u++) {
        unsigned key = okey(v[u]);
        if (g + lane + 32 * u < b && (key & mask) == prefix) {
          unsigned d = (key >> lo) & dmask;
          if (run_n && d != run_d) atomicAdd(&hist[run_d], run_n), run_n = 0u;
          run_d = d, run_n++;
        }
      }
    }
  }
  if (HIST && run_n) atomicAdd(&hist[run_d], run_n);
}

// compact_pass copies every logit of the warp's segment [a, b) whose key
// is at least lo into the candidates (key, index), in no particular order,
// counting them in count. A batch of groups without one costs a vote.
DEV void compact_pass(const float* __restrict__ l, int a, int b, unsigned lo, unsigned* ckey, unsigned* cidx,
                      unsigned* count) {
  const int lane = threadIdx.x & 31;
  const unsigned below = (1u << lane) - 1u;
  for (int g = a; g < b; g += 32 * LOADS) {
    float v[LOADS];
    load_group(l, g, b, v, neg_inf());
    float bm = neg_inf();
#pragma unroll
    for (int u = 0; u < LOADS; u++) bm = fmaxf(bm, v[u]);  // NaN's key is -Inf's, the least
    if (!__any_sync(ALL_LANES, okey(bm) >= lo)) continue;
#pragma unroll
    for (int u = 0; u < LOADS; u++) {
      int i = g + lane + 32 * u;
      unsigned key = okey(v[u]);
      bool take = i < b && key >= lo;
      unsigned bal = __ballot_sync(ALL_LANES, take);
      if (bal) {
        int lead = __ffs(bal) - 1;
        unsigned base = 0u;
        if (lane == lead) base = atomicAdd(count, (unsigned)__popc(bal));
        base = (unsigned)__shfl_sync(ALL_LANES, (int)base, lead);
        unsigned at = base + __popc(bal & below);
        if (take && at < SAMPLE_CAP) ckey[at] = key, cidx[at] = (unsigned)i;
      }
    }
  }
}

// compose makes a candidate's sort key: larger logits first, then lower
// indexes. 0 is below every candidate.
DEV unsigned long long compose(unsigned key, unsigned idx) { return ((unsigned long long)key << 32) | (unsigned)~idx; }

// gather_ordered writes into out[0, k) every logit of the row above the
// key K (ngt of them, in no particular order) and the first need of those
// equal to K in index order (ties to the lower index), for rows with more
// ties at K than the candidates hold: one pass counts each segment's ties,
// a second ranks them.
DEV void gather_ordered(const float* __restrict__ l, int a, int b, unsigned K, unsigned ngt, unsigned need,
                        unsigned long long* out, SampleShared& ss) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const unsigned below = (1u << lane) - 1u;
  auto tie = [&](float f) { return okey(f) == K; };
  unsigned ties = 0u;
  for (int g = a; g < b; g += 32 * LOADS) {
    float v[LOADS];
    load_group(l, g, b, v, 0.f);
#pragma unroll
    for (int u = 0; u < LOADS; u++) ties += __popc(__ballot_sync(ALL_LANES, g + lane + 32 * u < b && tie(v[u])));
  }
  __syncthreads();  // ss.u2 and ss.count are free
  if (lane == 0) ss.u2[w] = ties;
  if (threadIdx.x == 0) ss.count = 0u;
  __syncthreads();
  // The ties in the segments before this warp's.
  unsigned rank = (unsigned)__shfl_sync(ALL_LANES, (int)warp_incl_u(ss.u2[lane]), max(w - 1, 0));
  if (w == 0) rank = 0u;
  for (int g = a; g < b; g += 32 * LOADS) {
    float v[LOADS];
    load_group(l, g, b, v, 0.f);
#pragma unroll
    for (int u = 0; u < LOADS; u++) {
      int i = g + lane + 32 * u;
      unsigned key = okey(v[u]);
      bool gt = i < b && key > K, eq = i < b && tie(v[u]);
      unsigned bal = __ballot_sync(ALL_LANES, gt);
      if (bal) {
        int lead = __ffs(bal) - 1;
        unsigned base = 0u;
        if (lane == lead) base = atomicAdd(&ss.count, (unsigned)__popc(bal));
        base = (unsigned)__shfl_sync(ALL_LANES, (int)base, lead);
        unsigned at = base + __popc(bal & below);
        if (gt && at < ngt) out[at] = compose(key, (unsigned)i);
      }
      unsigned tb = __ballot_sync(ALL_LANES, eq);
      unsigned r = rank + __popc(tb & below);
      if (eq && r < need) out[ngt + r] = compose(key, (unsigned)i);
      rank += __popc(tb);
    }
  }
}

// Select tracks a radix select of the r-th largest of some keys, digit by
// digit from the top: the bits under mask are found (prefix), those below
// shift are not; above counts the keys above the bucket that prefix
// defines, at the keys within it, and r is the rank still wanted there.
struct Select {
  unsigned mask, prefix, above, r, at;
  int shift;
};

// select_step moves s one digit down: hist (1 << bits bins, at most 4096)
// counts the digit below s.shift of the keys in s's bucket; the digit
// taken is the largest whose count with the larger digits' reaches s.r.
// Every thread calls it; it ends after a barrier.
DEV void select_step(Select& s, int bits, const unsigned* hist, SampleShared& ss) {
  const int nb = 1 << bits, per = nb > ST ? nb / ST : 1, tid = threadIdx.x;
  unsigned c[4], sum = 0u;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    int from_top = tid * per + j;
    c[j] = j < per && from_top < nb ? hist[nb - 1 - from_top] : 0u;
    sum += c[j];
  }
  unsigned total, before = block_excl_u(sum, ss, total);
#pragma unroll
  for (int j = 0; j < 4; j++) {
    if (before < s.r && before + c[j] >= s.r) {  // one (thread, j) of all
      ss.sel[0] = nb - 1 - (tid * per + j);
      ss.sel[1] = before;
      ss.sel[2] = c[j];
    }
    before += c[j];
  }
  __syncthreads();
  s.shift -= bits;
  s.mask |= (unsigned)(nb - 1) << s.shift;
  s.prefix |= ss.sel[0] << s.shift;
  s.above += ss.sel[1];
  s.r -= ss.sel[1];
  s.at = ss.sel[2];
}

// cand_hist clears hist (1 << bits bins) and counts in it the digit below
// s.shift of the keys key(i) of the n candidates for which in(i) holds and
// that lie in s's bucket. Ends after a barrier.
template <typename Key, typename In>
DEV void cand_hist(const Select& s, int bits, int n, unsigned* hist, Key key, In in) {
  const int nb = 1 << bits;
  for (int i = threadIdx.x; i < nb; i += ST) hist[i] = 0u;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += ST) {
    unsigned k = key(i);
    if (in(i) && (k & s.mask) == s.prefix) atomicAdd(&hist[(k >> (s.shift - bits)) & (unsigned)(nb - 1)], 1u);
  }
  __syncthreads();
}

// bitonic_desc sorts the P keys x of threads 0 … P-1 (P a power of two,
// 32 to ST) into descending order and returns this thread's. Partners in
// the same warp swap by shuffles; the others through buf (2 × ST keys, the
// two used in turn, so one barrier a stage), whose first half may hold the
// keys on entry.
DEV unsigned long long bitonic_desc(unsigned long long x, int P, unsigned long long* buf) {
  const int tid = threadIdx.x;
  const bool in = tid < P;  // whole warps
  int half = 1;
  for (int size = 2; size <= P; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      unsigned long long y;
      if (stride >= 32) {
        if (in) buf[half * ST + tid] = x;
        __syncthreads();
        y = in ? buf[half * ST + (tid ^ stride)] : 0ull;
        half ^= 1;
      } else {
        y = shfl_xor_u64(x, stride);
      }
      // The lower of a pair keeps the larger key in a descending block.
      bool keep_max = ((tid & stride) == 0) == ((tid & size) == 0);
      if (in) x = keep_max ? (x > y ? x : y) : (x < y ? x : y);
    }
  return x;
}

// top_keys writes into buf[0, k) the row's k largest keys as candidates
// (compose), k = s.r when its first select_step took the top 12 bits of
// every key of the warps' segments [a, b) (hist): every key above the k-th
// largest, K, and as many of those equal to it as fit, the lowest indexes
// first, in no particular order. buf shares hist's room. Every thread
// calls it.
DEV void top_keys(const float* __restrict__ l, int a, int b, Select& sel, unsigned* hist, unsigned* ckey,
                  unsigned* cidx, unsigned long long* buf, SampleShared& ss) {
  const int tid = threadIdx.x;
  while (sel.above + sel.at > SAMPLE_CAP && sel.shift > 0) {
    // Too many candidates: the next 10 bits, over the row.
    const int bits = min(10, sel.shift);
    for (int i = tid; i < (1 << bits); i += ST) hist[i] = 0u;
    __syncthreads();
    float m = neg_inf();
    ExpSum es = {};
    row_pass<false, true>(l, a, b, 1.0, 1.f, nullptr, m, es, hist, sel.mask, sel.prefix, sel.shift - bits,
                          (1u << bits) - 1u);
    __syncthreads();
    select_step(sel, bits, hist, ss);
  }
  if (sel.above + sel.at <= SAMPLE_CAP) {
    const int n = (int)(sel.above + sel.at);
    if (tid == 0) ss.count = 0u;
    __syncthreads();
    compact_pass(l, a, b, sel.prefix, ckey, cidx, &ss.count);
    __syncthreads();
    while (sel.shift > 0) {
      const int bits = min(10, sel.shift);
      cand_hist(sel, bits, n, hist, [&](int i) { return ckey[i]; }, [](int) { return true; });
      select_step(sel, bits, hist, ss);
    }
    const unsigned K = sel.prefix;
    unsigned cut = 0xffffffffu;  // the last index kept among the ties
    if (sel.at > sel.r) {
      // The r lowest indexes among the ties: the r-th largest of ~index.
      Select ts = {0u, 0u, 0u, sel.r, 0u, 32};
      while (ts.shift > 0) {
        const int bits = ts.shift == 32 ? 12 : 10;
        cand_hist(ts, bits, n, hist, [&](int i) { return ~cidx[i]; }, [&](int i) { return ckey[i] == K; });
        select_step(ts, bits, hist, ss);
      }
      cut = ~ts.prefix;
    }
    if (tid == 0) ss.count = 0u;
    __syncthreads();  // hist is free for buf
    for (int i = tid; i < n; i += ST) {
      unsigned key = ckey[i], idx = cidx[i];
      if (key > K || (key == K && idx <= cut)) {
        unsigned at = atomicAdd(&ss.count, 1u);
        if (at < SAMPLE_TOPK) buf[at] = compose(key, idx);
      }
    }
  } else {
    gather_ordered(l, a, b, sel.prefix, sel.above, sel.r, buf, ss);
  }
}

// Whole-row draws (top-p or min-p over the whole row, gpu.SampleRow.Whole),
// as gpu's whole draws them: the candidates' probabilities summed by
// bucket of logits, walked bucket by bucket, and token by token, sorted,
// in the bucket where top-p's running sum or the draw ends.
#define SAMPLE_BUCKETS 4096  // gpu's sampleBuckets
#define SAMPLE_DEPTH 32.0    // gpu's sampleDepth
#define WHOLE_CAP 4096       // a bucket's tokens sorted at a time
// Their shared memory, after the exponential table: the buckets' running
// sums P (SAMPLE_BUCKETS + 1 doubles) and a bucket's tokens (WHOLE_CAP
// candidates, compose), whose room also holds a radix select's histogram
// and the sort's exchanges.
#define WHOLE_P_OFF SAMPLE_HIST_OFF
#define WHOLE_CB_OFF (WHOLE_P_OFF + (SAMPLE_BUCKETS + 2) * 8)
static_assert(WHOLE_CB_OFF + WHOLE_CAP * 8 <= SAMPLE_SMEM, "whole-row draws overrun the shared memory");
static_assert(SAMPLE_BUCKETS == 4 * ST && WHOLE_CAP == 4 * ST, "a thread holds four buckets and four tokens");

// The dynamic shared memory (every extern __shared__ array starts at its
// base) and the small shared state of sample_rows, at module scope so that
// whole_draw, a function of its own, addresses them as shared memory.
extern __shared__ __align__(16) unsigned char sample_smem[];
__shared__ SampleShared sample_ss;

// Whole is a whole-row draw's row and constants, and the bucket it walks.
struct Whole {
  const float* l;
  int a, b;                 // the warp's segment
  float t;                  // the temperature
  double rt, top, topf;     // 1/T, max/T (quot), max·(1/T)
  bool exact;               // terms formed as EXACT_ABOVE says
  double total;             // the row's sum of exp(l/T - top)
  double hi, scale, minp;   // the largest logit, buckets a unit of l, min_p
  const double* tab;
  double* P;                // P[b]: the candidates' probability in buckets before b
  unsigned long long* cb;   // a bucket's tokens
  int B;                    // the bucket walked
  float lo, hi_f;           // its tokens lie in [lo, hi_f]
};

// w_shared points w at sample_rows' shared memory (this lane's copy of
// the exponential table, P, the bucket's tokens), in the shared space.
DEV void w_shared(Whole& w) {
  w.tab = (const double*)(sample_smem + SAMPLE_TAB_OFF) + (threadIdx.x & 15);
  w.P = (double*)(sample_smem + WHOLE_P_OFF);
  w.cb = (unsigned long long*)(sample_smem + WHOLE_CB_OFF);
}

// exp_out is exp_fast out of line, for the few terms the walks form (the
// same arithmetic, so the same value).
__device__ __noinline__ double exp_out(double x, const double* tab) { return exp_fast(x, tab); }

// w_arg is l/T - top as the row's passes form it (EXACT_ABOVE).
DEV double w_arg(const Whole& w, float v) {
  return w.exact ? quot((double)v, (double)w.t, w.rt) - w.top : __dmul_rn((double)v, w.rt) - w.topf;
}

// w_index is v's bucket as gpu's bucket finds it: int((hi - v)·scale), the
// last one for everything past it.
DEV int w_index(const Whole& w, float v) {
  const double f = (w.hi - (double)v) * w.scale;
  return f < SAMPLE_BUCKETS - 1 ? (int)f : SAMPLE_BUCKETS - 1;
}

// w_bucket is v's bucket, or SAMPLE_BUCKETS where min-p leaves it out
// (less likely than min_p times the largest: e < min_p).
DEV int w_bucket(const Whole& w, float v) {
  if (w.minp > 0.0 && exp_out(w_arg(w, v), w.tab) < w.minp) return SAMPLE_BUCKETS;
  return w_index(w, v);
}

// w_focus makes B the bucket walked: its tokens lie within half a bucket
// of its range of logits (hi - l in [B, B+1)/scale up to rounding), whose
// bounds, rounded outward to floats, make a cheap test before w_bucket's.
DEV void w_focus(Whole& w, int B) {
  w.B = B;
  w.lo = B >= SAMPLE_BUCKETS - 1 ? neg_inf() : __double2float_rd(w.hi - ((double)B + 1.5) / w.scale);
  w.hi_f = __double2float_ru(w.hi - ((double)B - 0.5) / w.scale);
}

// w_near reports whether logit v may lie in the bucket walked (a NaN may).
DEV bool w_near(const Whole& w, float v) { return !(v < w.lo || v > w.hi_f); }

// w_in reports whether v (a clean logit) lies in the bucket walked.
DEV bool w_in(const Whole& w, float v) { return w_near(w, v) && w_bucket(w, v) == w.B; }

// w_take reports whether logit i (v) is one of the walked bucket's tokens
// whose candidate key lies in [stop, cursor).
DEV bool w_take(const Whole& w, float v, int i, unsigned long long cursor, unsigned long long stop) {
  if (!w_in(w, v)) return false;
  const unsigned long long c = compose(okey(v), (unsigned)i);
  return c < cursor && c >= stop;
}

// each_logit calls f(v, i, valid) for each logit of the warp's segment
// [a, b), v clean, N loads in flight a lane (LOADS, or fewer for the rare
// passes, whose code N copies); every lane of the warp calls f together,
// so f may vote (valid is false past b).
#define RARE_LOADS 4
template <int N = LOADS, typename F>
DEV void each_logit(const float* __restrict__ l, int a, int b, F f) {
  const int lane = threadIdx.x & 31;
  for (int g = a; g < b; g += 32 * N) {
    float v[N];
    load_group(l, g, b, v, neg_inf());
#pragma unroll
    for (int u = 0; u < N; u++) {
      const int i = g + lane + 32 * u;
      f(clean(v[u]), i, i < b);
    }
  }
}

DEV unsigned long long warp_min_u64(unsigned long long x) {
#pragma unroll
  for (int o = 16; o; o >>= 1) {
    const unsigned long long y = shfl_xor_u64(x, o);
    x = x < y ? x : y;
  }
  return x;
}

// block_min_u64 is the least of v over the block.
DEV unsigned long long block_min_u64(unsigned long long v, SampleShared& ss) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  v = warp_min_u64(v);
  __syncthreads();
  if (lane == 0) ss.q[w] = v;
  __syncthreads();
  return warp_min_u64(ss.q[lane]);
}

// block_excl_d returns the sum of v over the threads before this one, in
// thread order, and sets total to the sum over all.
DEV double block_excl_d(double v, SampleShared& ss, double& total) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const double x = warp_incl_d(v);
  const double xb = shfl_up_d(x, 1);
  __syncthreads();
  if (lane == 31) ss.d2[w] = x;
  __syncthreads();
  const double t = warp_incl_d(ss.d2[lane]);
  total = shfl_d(t, 31);
  const double before = shfl_d(t, max(w - 1, 0));
  return (w ? before : 0.0) + (lane ? xb : 0.0);
}

// MassOut is what w_masses returns: this thread's share of the row's sum
// of exp(l/T - top), of the first and last buckets' sums, and its last
// candidate bucket (-1 for none).
struct MassOut {
  double sum, head, tail;
  int last;
};

// w_masses sums exp(l/T - top) over the logits of [a, end) of l (hi the
// largest, the terms formed as w_arg does: EXACT, quot(l) - ref with ref =
// top; else l·rt - ref with ref = topf) and each candidate's (min-p leaves
// out those with e < minp: none for a min_p of 0) into P[its bucket] (P
// cleared before), runs of one bucket at once; the first and last
// buckets, where ties and a row's tail crowd, in registers. Out of line,
// its constants in registers.
template <bool EXACT>
__device__ __noinline__ MassOut w_masses(const float* __restrict__ l, int a, int end, double hi, double scale,
                                         double minp, float t, double rt, double ref) {
  const int lane = threadIdx.x & 31;
  const double* tab = (const double*)(sample_smem + SAMPLE_TAB_OFF) + (lane & 15);
  double* P = (double*)(sample_smem + WHOLE_P_OFF);
  MassOut o = {0.0, 0.0, 0.0, -1};
  int run_b = -1;
  double run = 0.0;
  for (int g = a; g < end; g += 32 * SUM_LOADS) {
    float v[SUM_LOADS];
    load_group(l, g, end, v, neg_inf());
#pragma unroll
    for (int u = 0; u < SUM_LOADS; u++) {
      if (g + lane + 32 * u >= end) continue;
      const float x = clean(v[u]);
      const double e = exp_fast((EXACT ? quot((double)x, (double)t, rt) : __dmul_rn((double)x, rt)) - ref, tab);
      o.sum += e;
      if (e < minp) continue;
      const double f = (hi - (double)x) * scale;  // w_index
      const int bk = f < SAMPLE_BUCKETS - 1 ? (int)f : SAMPLE_BUCKETS - 1;
      o.last = max(o.last, bk);
      if (bk == SAMPLE_BUCKETS - 1) {
        o.tail += e;
      } else if (bk == 0) {
        o.head += e;
      } else if (e > 0.0) {
        if (bk != run_b) {
          if (run_b >= 0) atomicAdd(&P[run_b], run);
          run_b = bk, run = 0.0;
        }
        run += e;
      }
    }
  }
  if (run_b >= 0) atomicAdd(&P[run_b], run);
  return o;
}

// chunk_sort sorts the n (at most WHOLE_CAP) candidates of cb into
// descending order, padded with 0 to the next power of two from
// max(n, 32): by bitonic_desc (cb its exchange room) up to ST, else by a
// bitonic network in shared memory. Ends after a barrier.
DEV void chunk_sort(unsigned long long* cb, int n) {
  const int tid = threadIdx.x;
  int P = 32;
  while (P < n) P <<= 1;
  for (int i = n + tid; i < P; i += ST) cb[i] = 0ull;
  __syncthreads();
  if (P <= ST) {
    unsigned long long x = tid < P ? cb[tid] : 0ull;
    x = bitonic_desc(x, P, cb);
    __syncthreads();  // the last exchanges are read
    if (tid < P) cb[tid] = x;
    __syncthreads();
    return;
  }
  for (int size = 2; size <= P; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int j = tid; j < P / 2; j += ST) {
        const int lo = 2 * j - (j & (stride - 1)), hi = lo + stride;
        const unsigned long long x = cb[lo], y = cb[hi];
        const bool desc = (lo & size) == 0;
        if (desc ? x < y : x > y) cb[lo] = y, cb[hi] = x;
      }
      __syncthreads();
    }
}

// w_gather_group appends the tokens of the walked bucket with keys in
// [stop, cursor) among this warp's group of 32·LOADS logits from g (those
// near, bit u for the lane's u-th) to cb, counting them in
// sample_ss.count. Out of line: few groups hold one.
__device__ __noinline__ void w_gather_group(const Whole& w, int g, unsigned near, unsigned long long cursor,
                                            unsigned long long stop) {
  const int lane = threadIdx.x & 31;
  const unsigned below = (1u << lane) - 1u;
  unsigned long long* cb = (unsigned long long*)(sample_smem + WHOLE_CB_OFF);
  float v[LOADS];
  load_group(w.l, g, w.b, v, neg_inf());
#pragma unroll
  for (int u = 0; u < LOADS; u++) {
    const int i = g + lane + 32 * u;
    const bool take = (near >> u & 1u) && i < w.b && w_take(w, clean(v[u]), i, cursor, stop);
    const unsigned bal = __ballot_sync(ALL_LANES, take);
    if (bal) {
      const int lead = __ffs(bal) - 1;
      unsigned at = 0u;
      if (lane == lead) at = atomicAdd(&sample_ss.count, (unsigned)__popc(bal));
      at = (unsigned)__shfl_sync(ALL_LANES, (int)at, lead) + __popc(bal & below);
      if (take && at < WHOLE_CAP) cb[at] = compose(okey(v[u]), (unsigned)i);
    }
  }
}

// w_gather appends to cb (WHOLE_CAP at most) the walked bucket's tokens
// whose keys (compose) lie in [stop, cursor), in no particular order,
// counting them in sample_ss.count (0 before): float tests of the logits
// against the bucket's bounds first, a group of 32·LOADS without one near
// costing a vote, then the exact test (w_gather_group).
DEV void w_gather(const Whole& w, unsigned long long cursor, unsigned long long stop) {
  const float* __restrict__ l = w.l;
  const int a = w.a, b = w.b;
  const float lo = w.lo, hi = w.hi_f;
  for (int g = a; g < b; g += 32 * LOADS) {
    float v[LOADS];
    load_group(l, g, b, v, neg_inf());
    unsigned near = 0u;  // bit u: this lane's u-th logit may be one
#pragma unroll
    for (int u = 0; u < LOADS; u++) near |= (unsigned)!(v[u] < lo || v[u] > hi) << u;
    if (__any_sync(ALL_LANES, near != 0u)) w_gather_group(w, g, near, cursor, stop);
  }
}

// w_fetch gathers into cb, sorted, the next tokens of the walked bucket
// in the candidates' order: the WHOLE_CAP largest keys (compose) in
// [stop, cursor), or all of them if fewer, and returns how many; more says
// whether any remain. One pass gathers them; where there are more, a
// radix select over the row finds the WHOLE_CAP-th largest logit key K of
// them (12, 10 and 10 bits), and two passes gather those above K and the
// first ties at K in index order. Every thread calls it.
DEV int w_fetch(const Whole& w, unsigned long long cursor, unsigned long long stop, bool& more, SampleShared& ss) {
  const int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5;
  const unsigned below = (1u << lane) - 1u;
  unsigned long long* cb = w.cb;
  __syncthreads();  // cb and ss.count are free
  if (tid == 0) ss.count = 0u;
  __syncthreads();
  w_gather(w, cursor, stop);
  __syncthreads();
  const unsigned cnt = ss.count;
  more = cnt > WHOLE_CAP;
  if (more) {
    // The WHOLE_CAP-th largest key of them, K.
    unsigned* hist = (unsigned*)cb;
    Select sel = {0u, 0u, 0u, WHOLE_CAP, 0u, 32};
    while (sel.shift > 0) {
      const int bits = sel.shift == 32 ? 12 : 10, nb = 1 << bits;
      __syncthreads();  // select_step has read hist
      for (int i = tid; i < nb; i += ST) hist[i] = 0u;
      __syncthreads();
      unsigned run_d = 0u, run_n = 0u;
      each_logit<RARE_LOADS>(w.l, w.a, w.b, [&](float v, int i, bool valid) {
        if (valid && w_take(w, v, i, cursor, stop)) {
          const unsigned key = okey(v);
          if ((key & sel.mask) == sel.prefix) {
            const unsigned d = (key >> (sel.shift - bits)) & (unsigned)(nb - 1);
            if (run_n && d != run_d) atomicAdd(&hist[run_d], run_n), run_n = 0u;
            run_d = d, run_n++;
          }
        }
      });
      if (run_n) atomicAdd(&hist[run_d], run_n);
      __syncthreads();
      select_step(sel, bits, hist, ss);
    }
    const unsigned K = sel.prefix, above = sel.above, need = sel.r;
    // The ties at K in the segments before this warp's.
    unsigned ties = 0u;
    each_logit<RARE_LOADS>(w.l, w.a, w.b, [&](float v, int i, bool valid) {
      ties += __popc(__ballot_sync(ALL_LANES, valid && okey(v) == K && w_take(w, v, i, cursor, stop)));
    });
    __syncthreads();  // ss.u2 and ss.count are free
    if (lane == 0) ss.u2[wp] = ties;
    if (tid == 0) ss.count = 0u;
    __syncthreads();
    unsigned rank = (unsigned)__shfl_sync(ALL_LANES, (int)warp_incl_u(ss.u2[lane]), max(wp - 1, 0));
    if (wp == 0) rank = 0u;
    each_logit<RARE_LOADS>(w.l, w.a, w.b, [&](float v, int i, bool valid) {
      const unsigned key = okey(v);
      const bool in = valid && key >= K && w_take(w, v, i, cursor, stop);
      const bool gt = in && key > K, eq = in && key == K;
      const unsigned bal = __ballot_sync(ALL_LANES, gt);
      if (bal) {
        const int lead = __ffs(bal) - 1;
        unsigned at = 0u;
        if (lane == lead) at = atomicAdd(&ss.count, (unsigned)__popc(bal));
        at = (unsigned)__shfl_sync(ALL_LANES, (int)at, lead) + __popc(bal & below);
        if (gt && at < above) cb[at] = compose(key, (unsigned)i);
      }
      const unsigned tb = __ballot_sync(ALL_LANES, eq);
      const unsigned r = rank + __popc(tb & below);
      if (eq && r < need) cb[above + r] = compose(key, (unsigned)i);
      rank += __popc(tb);
    });
    __syncthreads();
  }
  const int n = more ? WHOLE_CAP : (int)cnt;
  if (n > 0) chunk_sort(cb, n);
  return n;
}

// w_walk walks the tokens of bucket B whose keys reach stop (0: all) in
// the candidates' order, adding each one's probability to acc, to the
// first at which acc reaches x (ge: top-p) or passes it (the draw, whose
// point is x): it returns true with that token in tok and acc the sum up
// to it, else false with acc the sum over them all. The sums in a chunk
// are a block scan, thread t holding places 4t to 4t+3; where top-p's
// might cross within 1e-12 of x before a clear crossing, thread 0 adds
// them one by one, as the host does. Every thread calls it.
// Out of line: one copy for the three walks a draw may make.
__device__ __noinline__ bool w_walk(const Whole& row, int B, unsigned long long stop, double& acc, double x, bool ge,
                                    unsigned long long& tok) {
  const int tid = threadIdx.x;
  SampleShared& ss = sample_ss;
  Whole w = row;
  w_shared(w);
  w_focus(w, B);
  unsigned long long cursor = ~0ull;
  for (;;) {
    bool more;
    const int n = w_fetch(w, cursor, stop, more, ss);
    if (n == 0) return false;
    unsigned long long c[4];
    double pr[4], inc[4], q = 0.0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int pos = 4 * tid + j;
      c[j] = pos < n ? w.cb[pos] : 0ull;
      pr[j] = pos < n ? exp_out(w_arg(w, kval((unsigned)(c[j] >> 32))), w.tab) / w.total : 0.0;
      q += pr[j];
    }
    const unsigned long long lastc = w.cb[n - 1];
    double sum;
    double r = acc + block_excl_d(q, ss, sum);
    int f = NO_INDEX, clear = NO_INDEX;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int pos = 4 * tid + j;
      r += pr[j];
      inc[j] = r;
      if (pos < n) {
        if (ge ? r >= x - 1e-12 : r > x) f = min(f, pos);
        if (r >= x + 1e-12) clear = min(clear, pos);
      }
    }
    f = block_min_i(f, ss);
    bool seq = false;
    if (ge) {
      clear = block_min_i(clear, ss);
      if (f != clear) {
        // One by one in sorted order from acc (the candidates are in
        // registers; cb takes their probabilities).
        double* pv = (double*)w.cb;
#pragma unroll
        for (int j = 0; j < 4; j++)
          if (4 * tid + j < n) pv[4 * tid + j] = pr[j];
        __syncthreads();
        if (tid == 0) {
          double a = acc;
          int i = 0;
          for (; i < n; i++)
            if ((a += pv[i]) >= x) break;
          ss.wi = i < n ? i : NO_INDEX;
          ss.bd = a;
        }
        __syncthreads();
        f = ss.wi;
        seq = true;
      }
    }
    if (f != NO_INDEX) {
#pragma unroll
      for (int j = 0; j < 4; j++)
        if (4 * tid + j == f) {
          ss.cu = c[j];
          if (!seq) ss.bd = inc[j];
        }
      __syncthreads();
      tok = ss.cu;
      acc = ss.bd;
      __syncthreads();  // read before a later walk writes them
      return true;
    }
    acc += sum;
    if (!more) return false;
    cursor = lastc;
  }
}

// w_cross walks the candidates from bucket from to bucket to (at most
// last), whole buckets by their sums P and token by token in the one
// where the running sum, from acc, reaches (ge) or passes x (w_walk); a
// walk that ends without a token (rounding) goes on from the next bucket,
// as the host's does. It returns true with the token in tok, its bucket
// in at and acc the sum up to it, else false with acc the sum over the
// buckets. Every thread calls it.
DEV bool w_cross(Whole& w, int from, int to, double& acc, double x, bool ge, unsigned long long& tok, int& at,
                 SampleShared& ss) {
  const int tid = threadIdx.x;
  while (from <= to) {
    const double p0 = w.P[from];
    int bk = NO_INDEX;
#pragma unroll
    for (int j = 3; j >= 0; j--) {
      const int b = 4 * tid + j;
      if (b >= from && b <= to) {
        const double v = acc + (w.P[b + 1] - p0);
        if (ge ? v >= x : v > x) bk = b;
      }
    }
    bk = block_min_i(bk, ss);
    if (bk == NO_INDEX) break;
    double a = acc + (w.P[bk] - p0);
    if (w_walk(w, bk, 0ull, a, x, ge, tok)) {
      acc = a, at = bk;
      return true;
    }
    acc = a, from = bk + 1;
  }
  if (from <= to) acc += w.P[to + 1] - w.P[from];
  return false;
}

// w_least is the last candidate of bucket B in sorted order: its least key
// (compose). Every thread calls it.
DEV unsigned long long w_least(Whole& w, int B, SampleShared& ss) {
  w_focus(w, B);
  unsigned long long best = ~0ull;
  each_logit<RARE_LOADS>(w.l, w.a, w.b, [&](float v, int i, bool valid) {
    if (valid && w_in(w, v)) {
      const unsigned long long c = compose(okey(v), (unsigned)i);
      best = c < best ? c : best;
    }
  });
  return block_min_u64(best, ss);
}

// sample_whole draws from the row as gpu's whole does (the row's largest
// logit finite, total its sum of exp(l/T - top)) and returns the token.
// The candidates (every token, less those min-p leaves out) are summed by
// bucket (w_masses: shared float64 atomics) and the sums, brought to
// probabilities, scanned into P; top-p walks them to its cut (a token of
// bucket end, cut: the tokens kept are the buckets before end and those of
// end down to cut), and the draw walks the kept ones to u·total (total,
// the kept probability as top-p's walk added it, else every candidate
// bucket's). Where the host's walk would end without a token, the last
// kept token is taken: the cut, or the last of the last candidate bucket.
// Every thread calls it.
DEV int sample_whole(Whole& w, const SampleRow& p, SampleShared& ss) {
  const int tid = threadIdx.x;
  for (int i = tid; i < SAMPLE_BUCKETS; i += ST) w.P[i] = 0.0;
  __syncthreads();
  const MassOut mo = w.exact ? w_masses<true>(w.l, w.a, w.b, w.hi, w.scale, w.minp, w.t, w.rt, w.top)
                             : w_masses<false>(w.l, w.a, w.b, w.hi, w.scale, w.minp, w.t, w.rt, w.topf);
  const int last = block_max_i(mo.last, ss);  // at least 0: the largest logit's bucket
  w.total = block_sum_d(mo.sum, ss);
  const double head = block_sum_d(mo.head, ss), tail = block_sum_d(mo.tail, ss);
  if (tid == 0) w.P[0] += head, w.P[SAMPLE_BUCKETS - 1] += tail;
  __syncthreads();
  {
    double m[4], s = 0.0, all;
#pragma unroll
    for (int j = 0; j < 4; j++) m[j] = w.P[4 * tid + j] / w.total, s += m[j];
    double run = block_excl_d(s, ss, all);
#pragma unroll
    for (int j = 0; j < 4; j++) run += m[j], w.P[4 * tid + j + 1] = run;
    if (tid == 0) w.P[0] = 0.0;
    __syncthreads();
  }
  unsigned long long tok = 0ull, cut = 0ull;
  int end = last + 1, at = 0;
  double kept = w.P[last + 1];
  if (p.top_p > 0.f && p.top_p < 1.f) {
    double acc = 0.0;
    if (w_cross(w, 0, last, acc, (double)p.top_p, true, tok, at, ss)) cut = tok, end = at, kept = acc;
  }
  const double x = p.u * kept;
  double acc = 0.0;
  if (!w_cross(w, 0, end - 1, acc, x, false, tok, at, ss)) {
    if (cut) {
      if (!w_walk(w, end, cut, acc, x, false, tok)) tok = cut;
    } else {
      tok = w_least(w, last, ss);
    }
  }
  return (int)~(unsigned)tok;
}

// whole_draw settles a whole-row draw of the row l (warp segment [a, b))
// whose largest logit is mx and returns the token. Out of line, so that
// the other draws' registers stay as they were.
__device__ __noinline__ int whole_draw(const float* __restrict__ l, int a, int b, SampleRow p, float mx) {
  SampleShared& ss = sample_ss;
  if (!finite(mx)) {
    // No finite largest logit (every one -Inf or NaN, or +Inf among
    // them): every probability is NaN to the host, whose walk ends on the
    // last token of the sorted row, the least logit's last index.
    unsigned long long least = ~0ull;
    each_logit<RARE_LOADS>(l, a, b, [&](float v, int i, bool valid) {
      const unsigned long long c = compose(okey(v), (unsigned)i);
      if (valid && c < least) least = c;
    });
    return (int)~(unsigned)block_min_u64(least, ss);
  }
  const float t = p.temperature;
  Whole W;
  W.l = l, W.a = a, W.b = b, W.t = t;
  W.rt = 1.0 / (double)t, W.top = (double)mx / (double)t, W.topf = __dmul_rn((double)mx, W.rt);
  W.exact = !(fabs(W.top) <= EXACT_ABOVE);
  W.total = 0.0;
  W.hi = (double)mx, W.scale = (double)SAMPLE_BUCKETS / (SAMPLE_DEPTH * (double)t), W.minp = (double)p.min_p;
  w_shared(W);
  W.B = 0, W.lo = 0.f, W.hi_f = 0.f;
  return sample_whole(W, p, ss);
}

extern "C" __global__ void __launch_bounds__(ST) sample_rows(int* __restrict__ out, const float* __restrict__ logits,
                                                             int width, SampleRows rows) {
  unsigned char* smem = sample_smem;
  SampleShared& ss = sample_ss;
  double* tab = (double*)(smem + SAMPLE_TAB_OFF);
  unsigned* hist = (unsigned*)(smem + SAMPLE_HIST_OFF);
  unsigned long long* buf = (unsigned long long*)(smem + SAMPLE_HIST_OFF);
  unsigned* ckey = (unsigned*)(smem + SAMPLE_CKEY_OFF);
  unsigned* cidx = (unsigned*)(smem + SAMPLE_CIDX_OFF);
  const SampleRow p = rows.r[blockIdx.x];
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const float* l = logits + (long)blockIdx.x * width;
  // Warp w's segment: whole groups of 32 logits.
  const int seg = (width + ST - 1) / ST * 32;
  const int a = min(width, w * seg), b = min(width, a + seg);
  tab[tid] = exp2_64[tid >> 4];  // 16 copies of the table, interleaved
  const double* tabl = tab + (lane & 15);
  pdl_begin();
  __syncthreads();

  if (p.temperature == 0.f) {
    float bv;
    int bi;
    greedy_pass(l, a, b, bv, bi);
    int best = block_argmax(bv, bi, ss);
    if (tid == 0) out[blockIdx.x] = best;
    return;
  }
  const float t = p.temperature;
  const double rt = 1.0 / (double)t;
  const bool plain = p.top_k == 0 && (p.top_p == 0.f || p.top_p >= 1.f) && p.min_p == 0.f;
  const bool whole = p.top_k == 0 || p.top_k >= width;  // top-p or min-p over the whole row
  float m = neg_inf();
  ExpSum es = {0.0, (double)neg_inf(), (double)neg_inf(), neg_inf()};

  if (plain) {
    // The largest logit and each segment's sum, in one pass.
    row_pass<true, false>(l, a, b, rt, t, tabl, m, es, nullptr, 0u, 0u, 0, 0u);
    float wm = warp_max(m);
    double ws = warp_sum_d(es.s);
    if (lane == 0) ss.f[w] = wm, ss.d[w] = ws, ss.d2[w] = es.refq;
    __syncthreads();
    const float mx = warp_max(ss.f[lane]);
    const double top = (double)mx / (double)t, topf = __dmul_rn((double)mx, rt);
    const bool exact = !(fabs(top) <= EXACT_ABOVE);
    // term is exp(l/T - max/T), formed as row_pass forms its terms.
    auto term = [&](float v) {
      return exp_fast(exact ? quot((double)v, (double)t, rt) - top : __dmul_rn((double)v, rt) - topf, tabl);
    };
    // Every warp finds the segment where u·total falls (the first whose
    // inclusive sum passes it) and what remains of u·total there.
    double sv = ss.d[lane] * exp(ss.d2[lane] - top);
    double inc = warp_incl_d(sv);
    double r = p.u * shfl_d(inc, 31);
    unsigned hit = __ballot_sync(ALL_LANES, r < inc);
    if (!finite(mx) || !hit) {
      // The host's walk ends without a token (its sum NaN: the largest
      // logit infinite or every logit -Inf; or u·total rounded up to the
      // total): it takes the first largest.
      float bv;
      int bi;
      greedy_pass(l, a, b, bv, bi);
      int best = block_argmax(bv, bi, ss);
      if (tid == 0) out[blockIdx.x] = best;
      return;
    }
    int s = __ffs(hit) - 1;
    double rr = s ? r - shfl_d(inc, max(s - 1, 0)) : r;
    // The segment in 32 pieces, a warp each: their sums, scanned again
    // (the last piece with mass should rounding leave rr past them).
    const int sa = s * seg, sb = min(width, sa + seg);
    const int per = ((sb - sa + 31) / 32 + 31) / 32 * 32;  // logits a piece
    const int pa = min(sb, sa + w * per), pb = min(sb, pa + per);
    double ps = 0.0;
    for (int g = pa; g < pb; g += 32 * 4) {
      float v[4];
#pragma unroll
      for (int u = 0; u < 4; u++) {
        int i = g + lane + 32 * u;
        v[u] = i < pb ? clean(l[i]) : neg_inf();
      }
#pragma unroll
      for (int u = 0; u < 4; u++) ps += term(v[u]);
    }
    ps = warp_sum_d(ps);
    __syncthreads();  // ss.d is read
    if (lane == 0) ss.d[w] = ps;
    __syncthreads();
    double pv = ss.d[lane];
    double inc2 = warp_incl_d(pv);
    hit = __ballot_sync(ALL_LANES, rr < inc2);
    unsigned pos = __ballot_sync(ALL_LANES, pv > 0.0);
    int s2 = hit ? __ffs(hit) - 1 : pos ? last_lane(pos) : 0;
    double rr2 = s2 ? rr - shfl_d(inc2, max(s2 - 1, 0)) : rr;
    if (w != s2) return;
    // This warp's piece: the first logit whose cumulative sum passes rr2
    // (the last with mass should rounding leave rr2 past them all).
    double acc = 0.0;
    int pick = -1, last = -1;
    for (int g = pa; g < pb && pick < 0; g += 32 * 4) {
      double e[4], c[4];
#pragma unroll
      for (int u = 0; u < 4; u++) {
        int i = g + lane + 32 * u;
        e[u] = i < pb ? term(clean(l[i])) : 0.0;
      }
#pragma unroll
      for (int u = 0; u < 4; u++) c[u] = warp_incl_d(e[u]);
#pragma unroll
      for (int u = 0; u < 4; u++) {
        if (pick < 0) {
          bool valid = g + lane + 32 * u < pb;
          unsigned x = __ballot_sync(ALL_LANES, valid && acc + c[u] > rr2);
          unsigned y = __ballot_sync(ALL_LANES, e[u] > 0.0);
          if (x) pick = g + 32 * u + __ffs(x) - 1;
          if (y) last = g + 32 * u + last_lane(y);
          acc += shfl_d(c[u], 31);
        }
      }
    }
    if (lane == 0) out[blockIdx.x] = pick >= 0 ? pick : last >= 0 ? last : pa;
    return;
  }

  if (whole) {
    // The largest logit; the rest out of line.
#pragma unroll 1
    for (int g = a; g < b; g += 32 * LOADS) {
      float v[LOADS];
      load_group(l, g, b, v, neg_inf());
#pragma unroll
      for (int u = 0; u < LOADS; u++) m = fmaxf(m, clean(v[u]));
    }
    m = warp_max(m);
    if (lane == 0) ss.f[w] = m;
    __syncthreads();
    const int pick = whole_draw(l, a, b, p, warp_max(ss.f[lane]));
    if (tid == 0) out[blockIdx.x] = pick;
    return;
  }

  // Top-k: the k candidates, every key above the k-th largest, K, and as
  // many of those equal to it as fit, the lowest indexes first.
  const int k = min(p.top_k, SAMPLE_TOPK);
  for (int i = tid; i < SAMPLE_BINS; i += ST) hist[i] = 0u;
  __syncthreads();
  row_pass<false, true>(l, a, b, rt, t, tabl, m, es, hist, 0u, 0u, 20, SAMPLE_BINS - 1);
  {
    float wm = warp_max(m);
    if (lane == 0) ss.f[w] = wm;
  }
  __syncthreads();
  const float mx = warp_max(ss.f[lane]);
  const double top = (double)mx / (double)t;
  Select sel = {0u, 0u, 0u, (unsigned)k, 0u, 32};
  select_step(sel, 12, hist, ss);
  top_keys(l, a, b, sel, hist, ckey, cidx, buf, ss);
  int P = 32;
  while (P < k) P <<= 1;
  for (int i = k + tid; i < P; i += ST) buf[i] = 0ull;
  __syncthreads();
  unsigned long long x = bitonic_desc(tid < P ? buf[tid] : 0ull, P, buf);

  // The host's loop over the sorted candidates, thread i holding the i-th.
  const bool in = tid < k;
  const int idx = (int)~(unsigned)x;
  const double e = in ? exp((double)kval((unsigned)(x >> 32)) / (double)t - top) : 0.0;
  const double total = block_sum_d(e, ss);  // normalised among the candidates
  const double pr = e / total;
  int kk = k;
  if (p.min_p > 0.f) {
    // Drop the tail less likely than min_p times the first (which every
    // thread computes as thread 0 does).
    const double cut = (double)p.min_p * (exp((double)mx / (double)t - top) / total);
    kk = 1 + block_max_i(in && !(pr < cut) ? tid : 0, ss);
  }
  // Cumulative sums of the kept, for top-p's cut and the draw.
  const double c = block_incl_d(tid < kk ? pr : 0.0, ss);
  if (p.top_p > 0.f && p.top_p < 1.f) {
    // The first cumulative sum to reach top_p. The host adds one by one,
    // these sums in a tree: where one lies within 1e-12 of top_p before
    // the first clear crossing, thread 0 adds one by one, so that ties
    // summing to top_p cut where the host's do.
    const double tp = (double)p.top_p;
    int f = block_min_i(tid < kk && c >= tp - 1e-12 ? tid : NO_INDEX, ss);
    const int clear = block_min_i(tid < kk && c >= tp + 1e-12 ? tid : NO_INDEX, ss);
    if (f != clear) {
      double* pv = (double*)buf;  // free since the sort
      if (tid < kk) pv[tid] = pr;
      __syncthreads();
      if (tid == 0) {
        double acc = 0.0;
        int i = 0;
        for (; i < kk; i++)
          if ((acc += pv[i]) >= tp) break;
        ss.i[0] = i < kk ? i : NO_INDEX;
      }
      __syncthreads();
      f = ss.i[0];
    }
    if (f != NO_INDEX) kk = f + 1;
  }
  if (tid == kk - 1) ss.bd = c;
  __syncthreads();
  const double r = p.u * ss.bd;
  int pick = block_min_i(tid < kk && c > r ? tid : NO_INDEX, ss);
  if (pick == NO_INDEX) pick = kk - 1;
  if (tid == pick) out[blockIdx.x] = idx;
}

// SummaryRows are the rows of logits a launch of summary_rows summarises.
struct SummaryRows {
  int r[SAMPLE_ROWS];
};

#define SUMMARY_PIECES 8  // gpu.logProbChunks: a row's pieces, a block each
#define SUMMARY_TOP 20    // gpu.MaxSummaryTop
#define SUMMARY_J 5       // float4s of its piece a thread holds in registers
#define SUMMARY_CAP 1024  // candidates compacted into shared memory (32 warps' lists of 32)

// SummaryPart is what a piece's block leaves for the block that merges the
// row (gpu/cuda/summary.go allocates summaryPartWords words a part): the
// piece's sum of exponentials under its largest logit, that logit, and its
// top candidates (compose), most likely first, 0 past them.
struct SummaryPart {
  double sum;
  float max;
  int pad;
  unsigned long long cand[SUMMARY_TOP];
};

// SummaryShared is summary_rows' small shared state.
struct SummaryShared {
  unsigned wk[32];                // the warps' largest keys
  double ws[32];                  // the warps' sums
  unsigned long long best[2][32]; // the warps' best candidates, by round (summary_rounds)
  unsigned t0, n0, gt0, n1;       // the candidates' least key; the compactions' counts
};

// pkey is okey with NaN (and a place outside the piece, which holds a NaN)
// at 0, below every other key: NaN logits are no candidates.
DEV unsigned pkey(float f) { return f != f ? 0u : okey(f); }

// f4at is element e (0 to 3) of x.
DEV float f4at(const float4& x, int e) { return e == 0 ? x.x : e == 1 ? x.y : e == 2 ? x.z : x.w; }

// piece_vec loads the v-th float4 of a piece read from the 16-byte aligned
// av, which starts mis floats before the piece of len logits (nv float4s
// in all): places before or after the piece, and float4s past nv, hold
// NaNs. The float4 never leaves the 16 bytes that hold a logit of the
// piece.
DEV float4 piece_vec(const float4* __restrict__ av, int v, int nv, int mis, int len) {
  const float nan = __int_as_float(0x7fc00000);
  float4 x = make_float4(nan, nan, nan, nan);
  if (v < nv) {
    x = __ldcg(av + v);
    const int q = 4 * v - mis;  // the piece's place of x.x
    if (q < 0 || q + 4 > len) {
      if ((unsigned)q >= (unsigned)len) x.x = nan;
      if ((unsigned)(q + 1) >= (unsigned)len) x.y = nan;
      if ((unsigned)(q + 2) >= (unsigned)len) x.z = nan;
      if ((unsigned)(q + 3) >= (unsigned)len) x.w = nan;
    }
  }
  return x;
}

// piece_for calls f(x, v) for each float4 x of this thread's share of the
// piece, v its place: the SUMMARY_J in registers (v = tid + ST·j), then, for
// pieces longer than the registers hold, the rest from memory. The calls
// are uniform over the block (a float4 past nv holds NaNs), so f may vote
// and wait at barriers; float4 rounds wholly past nv are skipped.
template <typename F>
DEV void piece_for(const float4 (&reg)[SUMMARY_J], const float4* __restrict__ av, int nv, int mis, int len, F f) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int j = 0; j < SUMMARY_J; j++)
    if (ST * j < nv) f(reg[j], tid + ST * j);
  for (int j = SUMMARY_J; ST * j < nv; j++) f(piece_vec(av, tid + ST * j, nv, mis, len), tid + ST * j);
}

// Sorting 32 candidates of a warp, one a lane, into descending order
// (warp_sort_desc), and a bitonic sequence of them (warp_merge_desc):
// the lower lane of a pair keeps the larger in a descending block.
DEV unsigned long long warp_sort_desc(unsigned long long x) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int size = 2; size <= 32; size <<= 1)
#pragma unroll
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      const unsigned long long y = shfl_xor_u64(x, stride);
      const bool keep_max = ((lane & stride) == 0) == ((lane & size) == 0);
      x = keep_max ? (x > y ? x : y) : (x < y ? x : y);
    }
  return x;
}
DEV unsigned long long warp_merge_desc(unsigned long long x) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int stride = 16; stride > 0; stride >>= 1) {
    const unsigned long long y = shfl_xor_u64(x, stride);
    x = (lane & stride) == 0 ? (x > y ? x : y) : (x < y ? x : y);
  }
  return x;
}

// top_merge returns the 32 largest of two descending lists of 32, a (this
// lane's entry) and b (whose entry 31 - lane this lane passes as br), in
// descending order: the larger of a[i] and b[31-i] are those 32, a bitonic
// sequence.
DEV unsigned long long top_merge(unsigned long long a, unsigned long long br) {
  return warp_merge_desc(a > br ? a : br);
}

DEV unsigned long long warp_max_u64(unsigned long long x) {
#pragma unroll
  for (int o = 16; o; o >>= 1) {
    const unsigned long long y = shfl_xor_u64(x, o);
    x = x > y ? x : y;
  }
  return x;
}

DEV unsigned long long shfl_u64(unsigned long long v, int src) {
  unsigned lo = (unsigned)__shfl_sync(ALL_LANES, (int)(unsigned)v, src);
  unsigned hi = (unsigned)__shfl_sync(ALL_LANES, (int)(unsigned)(v >> 32), src);
  return ((unsigned long long)hi << 32) | lo;
}

// summary_rows writes gpu.Summarize's summary of row rows.r[s] of logits
// and its token ids[row] into out[s·W, (s+1)·W), W = 2 + 2·top (top at
// most gpu.MaxSummaryTop, and at most width): the token's
// log-probability (NaN for an id outside [0, width)), how many likely
// tokens follow, then each one's id (its bits) and log-probability, most
// likely first, ties to the lower id, NaN logits left out; unused places
// 0. Block (c, s) of ST threads takes piece c of the host's SUMMARY_PIECES
// (gpu.LogProbs: [c·size, (c+1)·size), size = ceil(width/8)) of summary
// s's row, up to SAMPLE_ROWS summaries a launch, and reads it once, into
// registers (SUMMARY_J float4s a thread, coalesced 16-byte loads from the
// 16-byte boundary at or before the piece; what does not fit is read again
// from memory by each step). From the registers it finds the piece's
// largest logit pm (NaNs left out), its sum of exp(l - pm) (the subtraction
// in float32, exp_fast, float64 sums; none where pm is -Inf, as for an
// empty piece) and its top candidates (below), and leaves them in parts;
// the block that takes the last of the row's tickets (cnt[s], which it
// sets back to 0 for the next launch and the graphs' replays) merges the
// eight: the pieces' sums brought to the row's largest mx and added in
// piece order, lse = mx + log(sum), as the host does. Only the order of
// the float64 additions within a piece and exp_fast (for the host's
// ExpNonPos) differ, so the log-probabilities are the host's
// (TestCUDASummarize: bit for bit on its rows, within 2 ulps allowed)
// except near 0, where float32 resolves finer than the float64
// log-sum-exp holds.
//
// A piece's candidates (compose: key, then the lower index first) are its
// top most likely logits, NaNs left out (pkey). The top-th largest of the
// 32 warps' largest keys, L, is at most the piece's top-th largest key (or
// 0 where fewer than top warps hold a logit that is not NaN), so the
// logits whose key reaches t0 = max(L, 1) hold the top: they are compacted
// into shared memory, few where the logits are not tied (about top + top/2
// for random ones). At most SUMMARY_CAP of them, each warp sorts 32 and a
// tree of merges (each the 32 largest of two sorted lists: one comparison,
// five shuffles) leaves the top in warp 0. More (a mass of logits tied at
// t0, -Inf ones say): where fewer than top lie above t0, the top-th is t0,
// and those above it are kept with the first ties in index order (block
// scans over the float4s in index order); where up to SUMMARY_CAP lie
// above t0, those are compacted and sorted; otherwise top rounds of a
// block maximum below the last one found. The merging block takes the top
// of the eight pieces' sorted lists by a tree of the same merges.
extern "C" __global__ void __launch_bounds__(ST) summary_rows(float* __restrict__ out, const float* __restrict__ logits,
                                                              const int* __restrict__ ids, int width, int top,
                                                              SummaryRows rows, SummaryPart* __restrict__ parts,
                                                              unsigned* __restrict__ cnt) {
  __shared__ double tab[ST];
  __shared__ unsigned long long cbuf[SUMMARY_CAP];
  __shared__ SummaryShared sh;
  __shared__ SampleShared ss;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int c = blockIdx.x, s = blockIdx.y, k = top;
  const int row = rows.r[s];
  const float* l = logits + (long)row * width;
  const int size = (width + SUMMARY_PIECES - 1) / SUMMARY_PIECES;
  const int pa = min(width, c * size), pb = min(width, pa + size), len = pb - pa;
  const float* base = l + pa;
  const int mis = (int)(((unsigned long long)base >> 2) & 3u);
  const float4* av = (const float4*)(base - mis);
  const int nv = len > 0 ? (mis + len + 3) >> 2 : 0;
  tab[tid] = exp2_64[tid >> 4];  // 16 copies of the table, interleaved
  const double* tabl = tab + (lane & 15);
  pdl_begin();
  float4 reg[SUMMARY_J];
#pragma unroll
  for (int j = 0; j < SUMMARY_J; j++) reg[j] = piece_vec(av, tid + ST * j, nv, mis, len);
  // The chosen token's logit, for the block that merges.
  int id = -1;
  float lid = 0.f;
  if (tid == 0) {
    id = ids[row];
    if (id >= 0 && id < width) lid = l[id];
    sh.n0 = 0u, sh.gt0 = 0u, sh.n1 = 0u;
  }

  // This thread's largest key, the warps', the piece's largest logit.
  unsigned mk = 0u;
  piece_for(reg, av, nv, mis, len, [&](const float4& x4, int) {
    mk = max(mk, max(max(pkey(x4.x), pkey(x4.y)), max(pkey(x4.z), pkey(x4.w))));
  });
  {
    const unsigned wk = __reduce_max_sync(ALL_LANES, mk);
    if (lane == 0) sh.wk[w] = wk;
  }
  __syncthreads();
  const unsigned kmax = __reduce_max_sync(ALL_LANES, sh.wk[lane]);
  const float pm = kmax ? kval(kmax) : neg_inf();
  if (w == 0 && k > 0) {
    // L: the top-th largest of the warps' largest keys.
    const unsigned long long sorted = warp_sort_desc((unsigned long long)sh.wk[lane]);
    const unsigned L = (unsigned)__shfl_sync(ALL_LANES, (int)(unsigned)sorted, k - 1);
    if (lane == 0) sh.t0 = max(L, 1u);
  }
  // The piece's exponentials under its largest (none where that is -Inf).
  double sum = 0.0;
  if (pm > neg_inf()) {
    piece_for(reg, av, nv, mis, len, [&](const float4& x4, int v) {
      if (v < nv) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const float a = f4at(x4, e);
          if (a == a) sum += exp_fast((double)__fsub_rn(a, pm), tabl);
        }
      }
    });
  }
  sum = warp_sum_d(sum);
  if (lane == 0) sh.ws[w] = sum;
  __syncthreads();

  unsigned long long x = 0ull;  // warp 0: the piece's top candidates, most likely first
  if (k > 0) {
    const unsigned below = (1u << lane) - 1u;
    unsigned t0 = sh.t0;
    // compact appends every logit whose key reaches lo to cbuf (count in
    // *n, SUMMARY_CAP kept) and counts those above lo in *gt (if any).
    auto compact = [&](unsigned lo, unsigned* n, unsigned* gt) {
      if (!__any_sync(ALL_LANES, mk >= lo)) return;
      unsigned above = 0u;
      piece_for(reg, av, nv, mis, len, [&](const float4& x4, int v) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const unsigned key = pkey(f4at(x4, e));
          const bool take = key >= lo;
          const unsigned bal = __ballot_sync(ALL_LANES, take);
          if (bal) {
            const int lead = __ffs(bal) - 1;
            unsigned at = 0u;
            if (lane == lead) at = atomicAdd(n, (unsigned)__popc(bal));
            at = (unsigned)__shfl_sync(ALL_LANES, (int)at, lead) + __popc(bal & below);
            if (take && at < SUMMARY_CAP) cbuf[at] = compose(key, (unsigned)(pa + 4 * v + e - mis));
            above += key > lo;
          }
        }
      });
      if (gt != nullptr) {
        above = (unsigned)__reduce_add_sync(ALL_LANES, above);
        if (lane == 0 && above) atomicAdd(gt, above);
      }
    };
    compact(t0, &sh.n0, &sh.gt0);
    __syncthreads();
    unsigned n = sh.n0;
    const unsigned ngt = sh.gt0;
    // Too many candidates, at most SUMMARY_CAP of them above t0: those
    // alone, which hold the top where they are top or more; else the
    // top-th is t0, and the ties that follow them are gathered.
    const bool again = n > SUMMARY_CAP && ngt <= SUMMARY_CAP;
    if (again) {
      compact(t0 + 1u, &sh.n1, nullptr);
      __syncthreads();
      n = sh.n1;
    }
    if (n <= SUMMARY_CAP && !(again && n < (unsigned)k)) {
      // Each warp sorts 32, and the lists are merged in a tree, the result
      // in warp 0.
      const int nw = (int)(n + 31) / 32;
      if (w < nw) x = warp_sort_desc(32 * w + lane < (int)n ? cbuf[32 * w + lane] : 0ull);
      for (int step = 1; step < nw; step <<= 1) {
        if (w < nw && (w & (2 * step - 1)) == step) cbuf[32 * w + lane] = x;
        __syncthreads();
        if ((w & (2 * step - 1)) == 0 && w + step < nw) x = top_merge(x, cbuf[32 * (w + step) + 31 - lane]);
      }
    } else {
      if (again) {
        // The n above t0 are in cbuf: then the first ties at t0 in index
        // order (a block scan for each round of float4s).
        const unsigned need = (unsigned)k - n;
        unsigned got = 0u;
        piece_for(reg, av, nv, mis, len, [&](const float4& x4, int v) {
          if (got >= need) return;  // uniform
          unsigned ties = 0u;
#pragma unroll
          for (int e = 0; e < 4; e++) ties += pkey(f4at(x4, e)) == t0;
          unsigned total;
          unsigned r = got + block_excl_u(ties, ss, total);
#pragma unroll
          for (int e = 0; e < 4; e++) {
            if (pkey(f4at(x4, e)) == t0) {
              if (r < need) cbuf[n + r] = compose(t0, (unsigned)(pa + 4 * v + e - mis));
              r++;
            }
          }
          got += total;
        });
      } else {
        // More than SUMMARY_CAP above t0: top rounds of the block's
        // largest candidate below the last.
        unsigned long long prev = ~0ull;
        for (int r = 0; r < k; r++) {
          unsigned long long best = 0ull;
          piece_for(reg, av, nv, mis, len, [&](const float4& x4, int v) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
              const unsigned key = pkey(f4at(x4, e));
              const unsigned long long cd = compose(key, (unsigned)(pa + 4 * v + e - mis));
              if (key && cd < prev && cd > best) best = cd;
            }
          });
          best = warp_max_u64(best);
          if (lane == 0) sh.best[r & 1][w] = best;
          __syncthreads();
          best = warp_max_u64(sh.best[r & 1][lane]);
          if (tid == 0) cbuf[r] = best;
          prev = best;
        }
      }
      __syncthreads();
      if (w == 0) x = warp_sort_desc(lane < k ? cbuf[lane] : 0ull);
    }
  }
  if (w != 0) return;

  // Warp 0 leaves the piece's part and takes a ticket.
  SummaryPart* part = parts + (long)s * SUMMARY_PIECES;
  {
    const double psum = warp_sum_d(sh.ws[lane]);
    if (lane < SUMMARY_TOP) part[c].cand[lane] = lane < k ? x : 0ull;
    if (lane == 0) part[c].sum = psum, part[c].max = pm;
    __threadfence();
    __syncwarp();
    unsigned ticket = 0u;
    if (lane == 0) {
      __threadfence();
      ticket = atomicAdd(cnt + s, 1u);
    }
    ticket = (unsigned)__shfl_sync(ALL_LANES, (int)ticket, 0);
    if (ticket != SUMMARY_PIECES - 1) return;
  }
  __threadfence();

  // The last block merges: the row's log-sum-exp, the host's way.
  const float qm = lane < SUMMARY_PIECES ? __ldcg(&part[lane].max) : neg_inf();
  const double qs = lane < SUMMARY_PIECES ? __ldcg(&part[lane].sum) : 0.0;
  // The even pieces' lists, and the odd ones' reversed.
  unsigned long long a[SUMMARY_PIECES / 2], br[SUMMARY_PIECES / 2];
#pragma unroll
  for (int q = 0; q < SUMMARY_PIECES / 2; q++) {
    a[q] = lane < k ? __ldcg(&part[2 * q].cand[lane]) : 0ull;
    br[q] = 31 - lane < k ? __ldcg(&part[2 * q + 1].cand[31 - lane]) : 0ull;
  }
  const float mx = warp_max(qm);
  double total = 0.0;
  if (mx > neg_inf()) {
#pragma unroll
    for (int q = 0; q < SUMMARY_PIECES; q++) {
      const float m = __shfl_sync(ALL_LANES, qm, q);
      const double ps = shfl_d(qs, q);
      if (m > neg_inf()) total += ps * exp((double)m - (double)mx);
    }
  }
  const double lse = (double)mx + log(total);
  // The top of the pieces' lists: a tree of merges.
  unsigned long long t = 0ull;
  if (k > 0) {
    unsigned long long m2[SUMMARY_PIECES / 2];
#pragma unroll
    for (int q = 0; q < SUMMARY_PIECES / 2; q++) m2[q] = top_merge(a[q], br[q]);
    const unsigned long long m01 = top_merge(m2[0], shfl_u64(m2[1], 31 - lane));
    const unsigned long long m23 = top_merge(m2[2], shfl_u64(m2[3], 31 - lane));
    t = top_merge(m01, shfl_u64(m23, 31 - lane));
  }
  float* o = out + (long)s * (2 + 2 * top);
  const bool valid = lane < k && t != 0ull;
  const int found = __popc(__ballot_sync(ALL_LANES, valid));
  if (lane < k) {
    o[2 + 2 * lane] = valid ? __int_as_float((int)~(unsigned)t) : 0.f;
    o[3 + 2 * lane] = valid ? (float)((double)kval((unsigned)(t >> 32)) - lse) : 0.f;
  }
  // The chosen token's log-probability: thread 0 of each block read it.
  const int cid = __shfl_sync(ALL_LANES, id, 0);
  const float cl = __shfl_sync(ALL_LANES, lid, 0);
  if (lane == 0) {
    o[0] = cid >= 0 && cid < width ? (float)((double)cl - lse) : __int_as_float(0x7fc00000);
    o[1] = (float)found;
    cnt[s] = 0u;
  }
}

// Logit adjustments before a draw (gpu.SampleRow's Penalties and
// Adjust). A list of entries (AdjEntry: the row, the token, whether the
// sequence saw it, its count in the output, its bias, and the logit kept
// while the draw runs) lives on the device between the draws into one
// buffer of tokens, so that a step fed by the one before can update it
// there (gpu.SampleRow.Follows). meta[0] counts the entries in use (at
// most the bound the host passes, which it knows), meta[1 + r] marks that
// adjust_follow found row r's token. Each row's AdjRow says whether it
// follows and its penalties.
struct AdjEntry {
  int row, token, seen, count;
  float bias, saved;
};
struct AdjRow {
  int follows;
  float rep, pres, freq;
};

DEV bool adj_active(const AdjRow& p) { return (p.rep != 0.f && p.rep != 1.f) || p.pres != 0.f || p.freq != 0.f; }

// adj_value is gpu.Penalties.Adjust, each operation rounded to float32.
DEV float adj_value(float x, const AdjEntry& a, const AdjRow& p) {
  float add = a.bias;
  if (a.count > 0 && (p.pres != 0.f || p.freq != 0.f))
    add = __fadd_rn(-__fadd_rn(p.pres, __fmul_rn((float)a.count, p.freq)), a.bias);
  if (a.seen && p.rep != 0.f && p.rep != 1.f) x = x > 0.f ? __fdiv_rn(x, p.rep) : __fmul_rn(x, p.rep);
  return __fadd_rn(x, add);
}

// adjust_follow updates the entries of the previous draw for the token it
// drew (out): the entry of a following row's token is seen and counts one
// more (gpu.LogitAdjust.Saw); the entries of rows that do not follow are
// dropped.
extern "C" __global__ void __launch_bounds__(256) adjust_follow(AdjEntry* __restrict__ e, int* __restrict__ meta,
                                                                const int* __restrict__ out,
                                                                const AdjRow* __restrict__ rows, int bound) {
  pdl_begin();
  int n = min(meta[0], bound);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    AdjEntry a = e[i];
    if (a.token < 0) continue;
    const AdjRow p = rows[a.row];
    if (!p.follows) {
      e[i].token = -1;
    } else if (adj_active(p) && a.token == out[a.row]) {
      e[i].seen = 1;
      e[i].count = a.count + 1;
      meta[1 + a.row] = 1;
    }
  }
}

// adjust_append, one block, adds the entries adjust_follow did not find
// (a following row's new token, in row order) after the first
// min(meta[0], bound) entries, then the host's h entries, and counts them.
extern "C" __global__ void __launch_bounds__(256) adjust_append(AdjEntry* __restrict__ e, int* __restrict__ meta,
                                                                const int* __restrict__ out,
                                                                const AdjRow* __restrict__ rows, int nrows,
                                                                const AdjEntry* __restrict__ host, int h, int bound) {
  pdl_begin();
  __shared__ int base;
  if (threadIdx.x == 0) {
    int n = min(meta[0], bound);
    for (int r = 0; r < nrows; r++) {
      const AdjRow p = rows[r];
      if (p.follows && adj_active(p) && !meta[1 + r] && out[r] >= 0) {
        AdjEntry a = {r, out[r], 1, 1, 0.f, 0.f};
        e[n++] = a;
      }
      meta[1 + r] = 0;
    }
    base = n;
    meta[0] = n + h;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < h; i += blockDim.x) e[base + i] = host[i];
}

// adjust_compact, one block of 1024 threads, moves the live entries among
// the first min(meta[0], bound) (those adjust_follow did not drop) to the
// front, in order, and counts them, so that lists kept over a long run of
// draws take the room of their live entries alone. Each pass reads a
// thread's entry before any thread writes, and an entry moves only down,
// to a place the pass or an earlier one has read.
extern "C" __global__ void __launch_bounds__(1024) adjust_compact(AdjEntry* __restrict__ e, int* __restrict__ meta,
                                                                  int bound) {
  pdl_begin();
  __shared__ int n_s, warps[32];
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  if (tid == 0) n_s = min(meta[0], bound);
  __syncthreads();
  const int n = n_s;
  int kept = 0;
  for (int i0 = 0; i0 < n; i0 += 1024) {
    const int i = i0 + tid;
    AdjEntry a;
    const bool keep = i < n && (a = e[i]).token >= 0;
    const unsigned m = __ballot_sync(0xffffffffu, keep);
    if (lane == 0) warps[w] = __popc(m);
    __syncthreads();
    int before = kept + __popc(m & ((1u << lane) - 1)), all = 0;
    for (int j = 0; j < 32; j++) {
      before += j < w ? warps[j] : 0;
      all += warps[j];
    }
    if (keep) e[before] = a;
    kept += all;
    __syncthreads();  // warps is read before the next pass writes it
  }
  if (tid == 0) meta[0] = kept;
}

// adj_entry loads this thread's entry (the i-th) into a and returns the
// logit it names, or null past the entries or for a token outside
// [0, width).
DEV float* adj_entry(float* logits, int width, const AdjEntry* e, const int* meta, int i, AdjEntry& a) {
  if (i >= meta[0]) return nullptr;
  a = e[i];
  return a.token < 0 || a.token >= width ? nullptr : logits + (long)a.row * width + a.token;
}

// adjust_apply keeps each entry's logit in saved and changes it
// (adj_value); adjust_restore puts the kept logits back after the draw,
// so the rows read as they were (a row left to the host is drawn from its
// own logits). Entries name distinct (row, token) pairs; tokens outside
// [0, width) are skipped.
extern "C" __global__ void __launch_bounds__(256) adjust_apply(float* __restrict__ logits, int width,
                                                               AdjEntry* __restrict__ e, const int* __restrict__ meta,
                                                               const AdjRow* __restrict__ rows) {
  pdl_begin();
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  AdjEntry a;
  float* l = adj_entry(logits, width, e, meta, i, a);
  if (l == nullptr) return;
  float x = *l;
  e[i].saved = x;
  *l = adj_value(x, a, rows[a.row]);
}

extern "C" __global__ void __launch_bounds__(256) adjust_restore(float* __restrict__ logits, int width,
                                                                 const AdjEntry* __restrict__ e,
                                                                 const int* __restrict__ meta) {
  pdl_begin();
  AdjEntry a;
  float* l = adj_entry(logits, width, e, meta, blockIdx.x * blockDim.x + threadIdx.x, a);
  if (l != nullptr) *l = a.saved;
}
