// stack_step: every layer of a post-norm decoder (OLMo 2: QK-norm over the
// whole projection, MHA or GQA, bf16 weights and KV cache) over one token,
// in one persistent kernel. A batch-1 decode step is bound by the stream of
// weights; as separate kernels it loses that stream at every kernel
// boundary and through the small kernels (norms, QK preparation,
// attention). Here one block per SM splits each product's rows with the
// others, and a producer warp streams the block's rows of every product of
// every layer into a ring of shared memory with bulk copies (TMA), ahead of
// the consumers: weights never depend on activations, so the stream runs on
// through the grid barriers, the norms and the attention, bounded only by
// the ring. The consumer warps wait at five grid barriers a layer:
//
//   qkv  = Wqkv · x                 (x: the residual; from layer 1 on,
//                                    x = h + rmsnorm(down) · w_ff, formed
//                                    by every block as it stages x)
//   att  = attention(qkv)           (QK-norm, RoPE, the new k and v stored
//                                    at the token's slot; (head, split)
//                                    items, the last split of a head to
//                                    finish combines the others)
//   o    = Wo · att
//   act  = silu(Wg · h) · (Wu · h)  (h = x + rmsnorm(o) · w_att, formed
//                                    by every block as it stages h)
//   down = Wd · act
//
// and block 0 writes the last layer's output into x. Each block forms the
// norms from the whole vector itself (a few KiB from L2), so no pass waits
// on another for them. Products keep x in f32 and sum in f32, as the
// GEMVs do. A bad position, slot or block table entry is recorded in the
// fault word and skipped; a grid barrier that waits more than about two
// seconds (blocks not all resident) records FAULT_STACK_STALL and goes on,
// so a misplaced launch fails the next Sync instead of hanging.
#include "common.cuh"

// A grid barrier given up on (faultStackStall in gpu/cuda/fault.go).
#define FAULT_STACK_STALL 7u

#define SK_WARPS 8                // consumer warps
#define SK_CONS (SK_WARPS * 32)   // consumer threads
#define SK_THREADS (SK_CONS + 32) // and one producer warp
#define SK_SLOT 16384             // bytes of a ring slot
#define SK_MAXRING 16
// SK_INFLIGHT is the most ring slots the producer has in flight: the
// ring holds more, landed, but every slot in flight delays the consumers'
// own reads (barrier polls, staging, attention) behind it.
#ifndef SK_INFLIGHT
#define SK_INFLIGHT 4
#endif
#define SK_MAXSPLIT 32            // splits of a head's keys in the attention

// Built with -DSK_PROFILE, block 0 records the global timer (ns) after
// each part of each layer into prof (BenchmarkStack prints them).
#ifdef SK_PROFILE
#define PROF(i)                                                                           \
  do {                                                                                    \
    if (b == 0 && threadIdx.x == 0) {                                                     \
      unsigned long long t_;                                                              \
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                              \
      prof[i] = t_;                                                                       \
    }                                                                                     \
  } while (0)
#else
#define PROF(i) \
  do {          \
  } while (0)
#endif

// StackLayer mirrors stackLayer in gpu/cuda/stack.go.
struct StackLayer {
  const uint16_t *qkv, *o, *gu, *down, *qn, *kn, *pa, *pf;
  uint16_t *kc, *vc;
};

// StackParams mirrors stackParams in gpu/cuda/stack.go.
struct StackParams {
  int layers, hidden, heads, kvheads, hd, inter;
  int block_size, max_blocks, cache_slots, bt_rows;
  int ring, splits;  // ring slots; most splits of a head's keys
  float eps, scale;
};

// Phases of a layer that stream weights, in order.
enum { PH_QKV, PH_O, PH_GU, PH_DOWN, PH_N };

// Work is this block's share of a product: rows [r0, r1) of w ([m, k]),
// rps rows a ring slot; glu products take gate row j and up row j (w2)
// together.
struct Work {
  const uint16_t *w, *w2;
  int k, r0, r1, rps, glu;
  DEV int slots() const { return (r1 - r0 + rps - 1) / rps; }
};

DEV Work work_of(const StackLayer& L, const StackParams& p, int layer, int ph, int b, int G) {
  int qw = p.heads * p.hd, kw = p.kvheads * p.hd, H = p.hidden, F = p.inter;
  Work w;
  int m;
  w.glu = 0;
  w.w2 = nullptr;
  switch (ph) {
    case PH_QKV: w.w = L.qkv; w.k = H; m = qw + 2 * kw; break;
    case PH_O: w.w = L.o; w.k = qw; m = H; break;
    case PH_GU: w.w = L.gu; w.w2 = L.gu + (long)F * H; w.k = H; m = F; w.glu = 1; break;
    default: w.w = L.down; w.k = F; m = H; break;
  }
  // Blocks whose (rotated) index is below m % G take one row more; the
  // rotation moves that extra row to other blocks in every product.
  int base = m / G, extra = m % G;
  int bb = (b + (layer * PH_N + ph) * 37) % G;
  w.r0 = bb * base + min(bb, extra);
  w.r1 = w.r0 + base + (bb < extra ? 1 : 0);
  w.rps = SK_SLOT / (w.k * 2 * (w.glu + 1));
  return w;
}

DEV unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

DEV void mbar_init(uint64_t* b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(b)), "r"(count) : "memory");
}

DEV void mbar_wait(uint64_t* b, unsigned parity) {
  unsigned a = smem_addr(b), done = 0;
  while (!done) {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done) : "r"(a), "r"(parity) : "memory");
  }
}

DEV void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(b)) : "memory");
}

DEV void mbar_expect(uint64_t* b, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(b)), "r"(bytes) : "memory");
}

// bulk_load copies bytes (a multiple of 16, both ends 16-byte aligned)
// from global memory into shared memory, completing on barrier b.
DEV void bulk_load(void* dst, const void* src, unsigned bytes, uint64_t* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(b))
               : "memory");
#endif
}

DEV void cons_sync() { asm volatile("bar.sync 1, %0;" ::"n"(SK_CONS) : "memory"); }

// cons_sum reduces v over the consumer threads; every one gets the total,
// summed in the same order every time. red holds SK_WARPS floats.
DEV float cons_sum(float v, float* red) {
  v = warp_sum(v);
  cons_sync();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  cons_sync();
  float t = 0.f;
#pragma unroll
  for (int i = 0; i < SK_WARPS; i++) t += red[i];
  return t;
}

DEV unsigned long long ld_acquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Grid barriers count arrivals on one 64-bit counter that only grows: a
// launch's k-th barrier is passed when it reaches base + k·G, base being
// its value when the launch began (a multiple of G, since every launch
// passes all its barriers; blocks that arrived first have added less than
// G). An arrival is one reduction, the wait a poll: no round trip to
// elect the last arrival.
struct Barrier {
  unsigned long long* cnt;
  unsigned long long next;  // thread 0 only: the count that passes the next barrier
};

DEV Barrier barrier_open(unsigned long long* cnt) {
  Barrier b{cnt, 0};
  if (threadIdx.x == 0) {
    unsigned long long v = ld_acquire(cnt);
    b.next = v - v % gridDim.x + gridDim.x;
  }
  return b;
}

// grid_sync: every consumer thread of every block.
DEV void grid_sync(Barrier& bar, unsigned* fault) {
  cons_sync();
#ifdef SK_NOBARRIER
  return;  // timing experiments only: wrong results
#endif
  if (threadIdx.x == 0) {
    __threadfence();
    asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(bar.cnt) : "memory");
    long long t0 = clock64();
    while (ld_acquire(bar.cnt) < bar.next) {
      if (clock64() - t0 > (4ll << 30)) {
        record_fault(fault, FAULT_STACK_STALL, (int)blockIdx.x, (int)gridDim.x);
        break;
      }
    }
    bar.next += gridDim.x;
  }
  cons_sync();
}

// Staged vectors live in shared memory permuted so that lane l's two
// float4 for elements i·256 + l·8 .. +7 are contiguous across the warp.
DEV int xpos(int e) {
  int it = e >> 8, lane = (e >> 3) & 31, j = e & 7;
  return ((((it << 1) | (j >> 2)) << 5 | lane) << 2) | (j & 3);
}

// row_dot2: the dots of two bf16 rows of k in shared memory with the
// staged x, which each lane loads once for both; two accumulators a row,
// so each FMA chain is half as long.
DEV float2 row_dot2(const uint16_t* wa, const uint16_t* wb, const float4* xs, int k, int lane) {
  float a0 = 0.f, a1 = 0.f, b0 = 0.f, b1 = 0.f;
#pragma unroll 4
  for (int it = 0; it * 256 < k; it++) {
    int e = it * 256 + lane * 8;
    if (e < k) {
      uint4 u = *reinterpret_cast<const uint4*>(wa + e), v = *reinterpret_cast<const uint4*>(wb + e);
      float4 x = xs[(it * 2) * 32 + lane], y = xs[(it * 2 + 1) * 32 + lane];
      a0 = fmaf(bflo(u.x), x.x, a0);
      a1 = fmaf(bfhi(u.x), x.y, a1);
      b0 = fmaf(bflo(v.x), x.x, b0);
      b1 = fmaf(bfhi(v.x), x.y, b1);
      a0 = fmaf(bflo(u.y), x.z, a0);
      a1 = fmaf(bfhi(u.y), x.w, a1);
      b0 = fmaf(bflo(v.y), x.z, b0);
      b1 = fmaf(bfhi(v.y), x.w, b1);
      a0 = fmaf(bflo(u.z), y.x, a0);
      a1 = fmaf(bfhi(u.z), y.y, a1);
      b0 = fmaf(bflo(v.z), y.x, b0);
      b1 = fmaf(bfhi(v.z), y.y, b1);
      a0 = fmaf(bflo(u.w), y.z, a0);
      a1 = fmaf(bfhi(u.w), y.w, a1);
      b0 = fmaf(bflo(v.w), y.z, b0);
      b1 = fmaf(bfhi(v.w), y.w, b1);
    }
  }
  return make_float2(warp_sum(a0 + a1), warp_sum(b0 + b1));
}

// consume runs this block's share of one product from the ring: warp w
// takes the phase's slots w, w + SK_WARPS, ...; g is the ring position of
// the phase's first slot.
DEV void consume(const Work& w, unsigned g, uint8_t* ring, uint64_t* full, uint64_t* empty, int R,
                 const float4* xs, float* out) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n = w.slots();
  for (int s = warp; s < n; s += SK_WARPS) {
    unsigned gi = g + s, idx = gi % R;
    mbar_wait(&full[idx], (gi / R) & 1);
    const uint16_t* sl = reinterpret_cast<const uint16_t*>(ring + (long)idx * SK_SLOT);
    int row = w.r0 + s * w.rps, c = min(w.rps, w.r1 - row);
#ifndef SK_NOCONSUME
    if (w.glu) {
      for (int i = 0; i < c; i++) {
        float2 d = row_dot2(sl + (long)i * w.k, sl + (long)(c + i) * w.k, xs, w.k, lane);
        if (lane == 0) out[row + i] = silu(d.x) * d.y;
      }
    } else {
      for (int i = 0; i < c; i += 2) {
        int j = min(i + 1, c - 1);  // an odd last row pairs with itself
        float2 d = row_dot2(sl + (long)i * w.k, sl + (long)j * w.k, xs, w.k, lane);
        if (lane == 0) {
          out[row + i] = d.x;
          out[row + j] = d.y;
        }
      }
    }
#endif
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[idx]);
  }
}

// ldcg_batch loads E values a thread, elements base + tid + j·SK_CONS
// below n, through L2 (other blocks wrote them), all in flight at once.
template <int E>
DEV void ldcg_batch(float (&v)[E], const float* src, int base, int n) {
#pragma unroll
  for (int j = 0; j < E; j++) {
    int e = base + threadIdx.x + j * SK_CONS;
    v[j] = e < n ? __ldcg(src + e) : 0.f;
  }
}

// NORM_E is how many elements of a norm's row each consumer thread holds:
// rows up to NORM_E · SK_CONS take one pass, their weights loaded early.
#define NORM_E 16

// load_w loads a thread's norm weights, elements tid + j·SK_CONS below n.
DEV void load_w(float (&wv)[NORM_E], const uint16_t* w, int n) {
#pragma unroll
  for (int j = 0; j < NORM_E; j++) {
    int e = threadIdx.x + j * SK_CONS;
    wv[j] = e < n ? bf2f(w[e]) : 0.f;
  }
}

// sum_squares is Σ src[e]² over n elements, on every consumer thread.
DEV float sum_squares(const float* src, int n, float* red) {
  float ss = 0.f;
  for (int base = 0; base < n; base += NORM_E * SK_CONS) {
    float v[NORM_E];
    ldcg_batch(v, src, base, n);
#pragma unroll
    for (int j = 0; j < NORM_E; j++) ss += v[j] * v[j];
  }
  return cons_sum(ss, red);
}

// stage_norm stages x = res + rmsnorm(src) · w (width n) into xs (unless
// null), and stores it at dst too when dst is not null. wv holds the
// thread's weights (load_w) when n ≤ NORM_E · SK_CONS: then src and res
// are read once, all in flight together.
DEV void stage_norm(float* xs, const float* res, const float* src, const float (&wv)[NORM_E], const uint16_t* w,
                    int n, float eps, float* dst, float* red) {
  auto put = [&](int e, float v) {
    if (xs != nullptr) xs[xpos(e)] = v;
    if (dst != nullptr) dst[e] = v;
  };
  if (n <= NORM_E * SK_CONS) {
    float sv[NORM_E], rv[NORM_E];
    ldcg_batch(sv, src, 0, n);
    ldcg_batch(rv, res, 0, n);
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < NORM_E; j++) ss += sv[j] * sv[j];
    float inv = rsqrtf(cons_sum(ss, red) / (float)n + eps);
#pragma unroll
    for (int j = 0; j < NORM_E; j++) {
      int e = threadIdx.x + j * SK_CONS;
      if (e < n) put(e, rv[j] + sv[j] * inv * wv[j]);
    }
    return;
  }
  float inv = rsqrtf(sum_squares(src, n, red) / (float)n + eps);
  for (int base = 0; base < n; base += NORM_E * SK_CONS) {
    float sv[NORM_E], rv[NORM_E];
    ldcg_batch(sv, src, base, n);
    ldcg_batch(rv, res, base, n);
#pragma unroll
    for (int j = 0; j < NORM_E; j++) {
      int e = base + threadIdx.x + j * SK_CONS;
      if (e < n) put(e, rv[j] + sv[j] * inv * bf2f(w[e]));
    }
  }
}

DEV void stage_copy(float* xs, const float* src, int n) {
  constexpr int E = 32;
  for (int base = 0; base < n; base += E * SK_CONS) {
    float v[E];
    ldcg_batch(v, src, base, n);
#pragma unroll
    for (int j = 0; j < E; j++) {
      int e = base + threadIdx.x + j * SK_CONS;
      if (e < n) xs[xpos(e)] = v[j];
    }
  }
}

// AttnPlan splits each head's keys 0..pos into used splits of chunk keys
// (a multiple of 64), the same way in every block.
struct AttnPlan {
  int chunk, used;
};

DEV AttnPlan attn_plan(const StackParams& p, int pos) {
  int len = pos + 1;
  int S = min(min((len + 63) / 64, p.splits), max(1, (int)gridDim.x / p.heads));
  AttnPlan a;
  a.chunk = ((len + S - 1) / S + 63) / 64 * 64;
  a.used = (len + a.chunk - 1) / a.chunk;
  return a;
}

// Attn is a block's attention item (head h, split sp of its keys), and
// what it loads before the barrier that makes q, k and v ready: the first
// 64 of its cached keys and values (earlier steps wrote them), its head's
// norm weights and RoPE's rotation at the token's position.
template <int HD>
struct Attn {
  static constexpr int TPR = HD / 8, RP = SK_CONS / TPR, U = 64 / RP;
  bool on, last;  // the block has an item; its split holds the token's own key
  int h, kh, sp, j0, j1, jc;
  uint4 kr[U], vr[U];
  bool ok[U];
  float wq0, wq1, wk0, wk1, sn, cs;  // threads below HD/2: their pair of dims
};

// attn_tile loads this thread's rows of the 64 cached keys from kb.
template <int HD>
DEV void attn_tile(Attn<HD>& a, const StackLayer& L, const StackParams& p, int kb, const int* btr, unsigned* fault) {
  constexpr int TPR = Attn<HD>::TPR, RP = Attn<HD>::RP;
  int c = threadIdx.x % TPR, r = threadIdx.x / TPR;
  long kw = (long)p.kvheads * HD;
#pragma unroll
  for (int u = 0; u < Attn<HD>::U; u++) {
    int key = kb + u * RP + r;
    a.ok[u] = false;
    a.kr[u] = a.vr[u] = make_uint4(0, 0, 0, 0);
    if (key < a.jc) {
      int blk = btr[key / p.block_size];
      long v = (long)blk * p.block_size + key % p.block_size;
      if (blk < 0 || v >= p.cache_slots) {
        record_fault(fault, FAULT_ATTN_BLOCK, 0, blk);
      } else {
        a.ok[u] = true;
        long off = v * kw + (long)a.kh * HD + c * 8;
        a.kr[u] = *reinterpret_cast<const uint4*>(L.kc + off);
        a.vr[u] = *reinterpret_cast<const uint4*>(L.vc + off);
      }
    }
  }
}

template <int HD>
DEV void attn_pre(Attn<HD>& a, const StackLayer& L, const StackParams& p, AttnPlan pl, const float* inv_freq, int pos,
                  const int* btr, unsigned* fault) {
  const int len = pos + 1, item = blockIdx.x, S = pl.used;
  a.on = item < p.heads * S;
  if (!a.on) return;
  a.h = item / S;
  a.sp = item % S;
  a.kh = a.h / (p.heads / p.kvheads);
  a.j0 = a.sp * pl.chunk;
  a.j1 = min(len, a.j0 + pl.chunk);
  a.last = a.j1 == len;
  a.jc = min(a.j1, len - 1);  // cached keys end before the token's own
  attn_tile(a, L, p, a.j0, btr, fault);
  int i = threadIdx.x;
  if (i < HD / 2) {
    a.wq0 = bf2f(L.qn[a.h * HD + i]);
    a.wq1 = bf2f(L.qn[a.h * HD + i + HD / 2]);
    a.wk0 = bf2f(L.kn[a.kh * HD + i]);
    a.wk1 = bf2f(L.kn[a.kh * HD + i + HD / 2]);
    rope_sincos((double)pos, inv_freq[i], &a.sn, &a.cs);
  }
}

// attn_run: the item's share of the attention, once q, k and v are ready:
// the QK-norm over the whole q and k projections, RoPE, the new k and v
// stored at the token's slot (by the first query head of each KV head),
// and the softmax-weighted values of the split's keys: the result itself
// when the keys are not split, else a partial (sum, max, weighted values)
// that attn_combine merges. sm holds hd · (3 + RP) + 2 · RP floats.
template <int HD>
DEV void attn_run(Attn<HD>& a, const StackLayer& L, const StackParams& p, AttnPlan pl, const float* qkv, float* att,
                  float* part, int slot, const int* btr, float* sm, float* red, unsigned* fault) {
  constexpr int TPR = Attn<HD>::TPR, RP = Attn<HD>::RP, U = Attn<HD>::U, half = HD / 2;
  const float NEG = -__int_as_float(0x7f800000);
  const int qw = p.heads * HD, kw = p.kvheads * HD, tid = threadIdx.x, c = tid % TPR, r = tid / TPR;
  float* qs = sm;             // [HD] q, scaled to base-2 logits
  float* kn = sm + HD;        // [HD] the new key, rounded as the cache rounds
  float* vn = sm + 2 * HD;    // [HD] the new value, the same
  float* accs = sm + 3 * HD;  // [RP][HD]
  float* ms = accs + RP * HD;
  float* ls = ms + RP;

  // The head's q, k and v with the sums of squares, all loads in flight.
  const long qo = (long)a.h * HD, ko = (long)qw + a.kh * HD, vo = (long)qw + kw + a.kh * HD;
  float q0 = 0.f, q1 = 0.f, k0 = 0.f, k1 = 0.f, v0 = 0.f, v1 = 0.f;
  if (tid < half) {
    q0 = __ldcg(qkv + qo + tid);
    q1 = __ldcg(qkv + qo + tid + half);
    if (a.last) {
      k0 = __ldcg(qkv + ko + tid);
      k1 = __ldcg(qkv + ko + tid + half);
      v0 = __ldcg(qkv + vo + tid);
      v1 = __ldcg(qkv + vo + tid + half);
    }
  }
  float iq = rsqrtf(sum_squares(qkv, qw, red) / (float)qw + p.eps);
  float ik = rsqrtf(sum_squares(qkv + qw, kw, red) / (float)kw + p.eps);
  const float sl2 = p.scale * 1.4426950408889634f;
  if (tid < half) {
    float x = q0 * iq * a.wq0, y = q1 * iq * a.wq1;
    qs[tid] = (x * a.cs - y * a.sn) * sl2;
    qs[tid + half] = (y * a.cs + x * a.sn) * sl2;
    if (a.last) {
      x = k0 * ik * a.wk0;
      y = k1 * ik * a.wk1;
      uint16_t ka = f2bf(x * a.cs - y * a.sn), kb = f2bf(y * a.cs + x * a.sn), va = f2bf(v0), vb = f2bf(v1);
      kn[tid] = bf2f(ka);
      kn[tid + half] = bf2f(kb);
      vn[tid] = bf2f(va);
      vn[tid + half] = bf2f(vb);
      if (a.h % (p.heads / p.kvheads) == 0 && slot >= 0) {
        long d = (long)slot * kw + (long)a.kh * HD;
        L.kc[d + tid] = ka;
        L.kc[d + tid + half] = kb;
        L.vc[d + tid] = va;
        L.vc[d + tid + half] = vb;
      }
    }
  }
  cons_sync();

  float qf[8];
#pragma unroll
  for (int e = 0; e < 8; e++) qf[e] = qs[c * 8 + e];
  float m = NEG, l = 0.f, acc[8];
#pragma unroll
  for (int e = 0; e < 8; e++) acc[e] = 0.f;
  for (int kb = a.j0; kb < a.jc; kb += 64) {
    if (kb != a.j0) attn_tile(a, L, p, kb, btr, fault);
    float sc[U];
    float mx = m;
#pragma unroll
    for (int u = 0; u < U; u++) {
      float kf[8];
      unpack8<BF16>(a.kr[u], kf);
      float d = 0.f;
#pragma unroll
      for (int e = 0; e < 8; e++) d = fmaf(qf[e], kf[e], d);
#pragma unroll
      for (int o = TPR / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
      sc[u] = a.ok[u] ? d : NEG;
      mx = fmaxf(mx, sc[u]);
    }
    if (mx == NEG) continue;
    float corr = exp2f(m - mx);
    l *= corr;
#pragma unroll
    for (int e = 0; e < 8; e++) acc[e] *= corr;
#pragma unroll
    for (int u = 0; u < U; u++) {
      float pw = exp2f(sc[u] - mx), vf[8];
      unpack8<BF16>(a.vr[u], vf);
      l += pw;
#pragma unroll
      for (int e = 0; e < 8; e++) acc[e] = fmaf(pw, vf[e], acc[e]);
    }
    m = mx;
  }
  if (c == 0) {
    ms[r] = m;
    ls[r] = l;
  }
#pragma unroll
  for (int e = 0; e < 8; e++) accs[r * HD + c * 8 + e] = acc[e];
  cons_sync();
  if (tid >= HD) return;
  float A = 0.f, M = NEG, Ls = 0.f, sn = NEG;
  for (int i = 0; i < RP; i++) M = fmaxf(M, ms[i]);
  if (a.last) {
    sn = 0.f;
    for (int e = 0; e < HD; e++) sn = fmaf(qs[e], kn[e], sn);
    M = fmaxf(M, sn);
  }
  for (int i = 0; i < RP; i++) {
    float e = ms[i] == NEG ? 0.f : exp2f(ms[i] - M);
    A += e * accs[i * HD + tid];
    Ls += e * ls[i];
  }
  if (a.last) {
    float e = exp2f(sn - M);
    A += e * vn[tid];
    Ls += e;
  }
  if (pl.used == 1) {
    att[qo + tid] = Ls > 0.f ? A / Ls : 0.f;
    return;
  }
  long o_ = ((long)a.h * SK_MAXSPLIT + a.sp) * (HD + 2);
  part[o_ + tid] = A;
  if (tid == 0) {
    part[o_ + HD] = M;
    part[o_ + HD + 1] = Ls;
  }
}

// attn_combine: the last of a head's splits to finish (a counter per
// head, left zero) merges their partials into att. Every consumer thread
// of the item's block calls it; wt holds SK_MAXSPLIT floats.
template <int HD>
DEV void attn_combine(const Attn<HD>& a, AttnPlan pl, float* att, const float* part, unsigned* cnt, float* wt) {
  const float NEG = -__int_as_float(0x7f800000);
  const int tid = threadIdx.x, used = pl.used;
  __shared__ bool lastb;
  __threadfence();
  cons_sync();
  if (tid == 0) lastb = atomicAdd(cnt + a.h, 1u) == (unsigned)(used - 1);
  cons_sync();
  if (!lastb) return;
  __threadfence();
  const float* ph = part + (long)a.h * SK_MAXSPLIT * (HD + 2);
  float pv[SK_MAXSPLIT];
  if (tid < HD) {
#pragma unroll
    for (int s = 0; s < SK_MAXSPLIT; s++) pv[s] = s < used ? __ldcg(ph + s * (HD + 2) + tid) : 0.f;
  }
  if (tid < 32) {
    // One warp weighs the splits: lane s holds split s's max and sum.
    float mm = tid < used ? __ldcg(ph + tid * (HD + 2) + HD) : NEG;
    float ll = tid < used ? __ldcg(ph + tid * (HD + 2) + HD + 1) : 0.f;
    float Mx = warp_max(mm);
    float e = mm == NEG ? 0.f : exp2f(mm - Mx);
    float Lt = warp_sum(e * ll);
    wt[tid] = Lt > 0.f ? e / Lt : 0.f;
    if (tid == 0) cnt[a.h] = 0;
  }
  cons_sync();
  if (tid < HD) {
    float v = 0.f;
#pragma unroll
    for (int s = 0; s < SK_MAXSPLIT; s++)
      if (s < used) v += wt[s] * pv[s];
    att[(long)a.h * HD + tid] = v;
  }
}

// work: qkv [qw + 2kw], att [qw], o [H], act [F], h [H], part
// [heads][SK_MAXSPLIT][hd + 2], floats, then (8-byte aligned) the profile's
// 14 · layers + 2 timestamps; sync: the grid barriers' 64-bit counter,
// then a counter per head (zero at the first launch; the heads' are left
// zero).
template <int HD>
DEV void stack_step(const StackLayer* __restrict__ layers, float* x, float* work, unsigned long long* sync,
                    const int* pos, const int* seq, const int* slots, const int* bt, const float* inv_freq,
                    StackParams p, unsigned* fault) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) uint8_t dsm[];
  __shared__ __align__(8) uint64_t full[SK_MAXRING], empty[SK_MAXRING];
  __shared__ float red[SK_WARPS];
  const int R = p.ring, G = gridDim.x, b = blockIdx.x;
  const int H = p.hidden, F = p.inter, qw = p.heads * HD, kw = p.kvheads * HD;
  uint8_t* ring = dsm;
  float* xs = reinterpret_cast<float*>(dsm + (long)R * SK_SLOT);
  if (threadIdx.x == 0) {
    for (int i = 0; i < R; i++) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (threadIdx.x >= SK_CONS) {
    // The producer: every layer's rows of this block, in the consumers'
    // order, as far ahead as the ring allows. Weights only: nothing
    // another kernel writes, so no wait for the kernel ahead.
    if (threadIdx.x != SK_CONS) return;
    unsigned g = 0;
    for (int l = 0; l < p.layers; l++) {
      StackLayer L = layers[l];
      for (int ph = 0; ph < PH_N; ph++) {
        Work w = work_of(L, p, l, ph, b, G);
        int n = w.slots();
        for (int s = 0; s < n; s++, g++) {
          unsigned idx = g % R;
          if (g >= (unsigned)R) mbar_wait(&empty[idx], ((g / R) - 1) & 1);
          if (g >= SK_INFLIGHT) mbar_wait(&full[(g - SK_INFLIGHT) % R], ((g - SK_INFLIGHT) / R) & 1);
          int row = w.r0 + s * w.rps, c = min(w.rps, w.r1 - row);
          unsigned bytes = (unsigned)c * w.k * 2;
          uint8_t* dst = ring + (long)idx * SK_SLOT;
          mbar_expect(&full[idx], bytes * (w.glu + 1));
          bulk_load(dst, w.w + (long)row * w.k, bytes, &full[idx]);
          if (w.glu) bulk_load(dst + bytes, w.w2 + (long)row * w.k, bytes, &full[idx]);
        }
      }
    }
    return;
  }

  pdl_begin();
  float* qkv = work;
  float* att = qkv + qw + 2 * kw;
  float* o = att + qw;
  float* act = o + H;
  float* hb = act + F;
  float* part = hb + H;
  unsigned long long* prof = reinterpret_cast<unsigned long long*>(part + p.heads * SK_MAXSPLIT * (HD + 2) + 2);
  (void)prof;
  int ps = pos[0], sq = seq[0], slot = slots[0];
  bool bad = ps < 0 || ps >= p.max_blocks * p.block_size || sq < 0 || sq >= p.bt_rows;
  if (bad) {
    if (b == 0 && threadIdx.x == 0) record_fault(fault, FAULT_ATTN_POS, 0, ps);
    ps = 0;
    sq = 0;
  }
  if (slot < 0 || slot >= p.cache_slots) {
    if (b == 0 && threadIdx.x == 0) record_fault(fault, FAULT_STOREKV_SLOT, 0, slot);
    slot = -1;
  }
  const int* btr = bt + (long)sq * p.max_blocks;
  const float4* xs4 = reinterpret_cast<const float4*>(xs);
  const AttnPlan pl = attn_plan(p, ps);
  Barrier bar = barrier_open(sync);
  unsigned* cnt = reinterpret_cast<unsigned*>(sync + 1);
  float wv[NORM_E];
  load_w(wv, layers[0].pf, 0);  // unused before layer 1
  unsigned g = 0;
  PROF(0);
  for (int l = 0; l < p.layers; l++) {
    StackLayer L = layers[l];
    const int P = l * 14 + 1;
    // q|k|v from the residual (the previous layer's output, formed here).
    if (l == 0) stage_copy(xs, x, H);
    else stage_norm(xs, hb, o, wv, layers[l - 1].pf, H, p.eps, b == 0 ? x : nullptr, red);
    cons_sync();
    PROF(P);
    Work w = work_of(L, p, l, PH_QKV, b, G);
    consume(w, g, ring, full, empty, R, xs4, qkv);
    g += w.slots();
    PROF(P + 1);
    Attn<HD> at;
    attn_pre(at, L, p, pl, inv_freq, ps, btr, fault);
    grid_sync(bar, fault);
    PROF(P + 2);
    if (at.on) {
      attn_run(at, L, p, pl, qkv, att, part, slot, btr, xs, red, fault);
      if (pl.used > 1) attn_combine(at, pl, att, part, cnt, xs + HD * (3 + Attn<HD>::RP) + 2 * Attn<HD>::RP);
    }
    PROF(P + 3);
    grid_sync(bar, fault);
    PROF(P + 4);
    stage_copy(xs, att, qw);
    cons_sync();
    PROF(P + 5);
    w = work_of(L, p, l, PH_O, b, G);
    consume(w, g, ring, full, empty, R, xs4, o);
    g += w.slots();
    PROF(P + 6);
    load_w(wv, L.pa, H);
    grid_sync(bar, fault);
    PROF(P + 7);
    stage_norm(xs, x, o, wv, L.pa, H, p.eps, b == 0 ? hb : nullptr, red);
    cons_sync();
    PROF(P + 8);
    w = work_of(L, p, l, PH_GU, b, G);
    consume(w, g, ring, full, empty, R, xs4, act);
    g += w.slots();
    PROF(P + 9);
    grid_sync(bar, fault);
    PROF(P + 10);
    stage_copy(xs, act, F);
    cons_sync();
    PROF(P + 11);
    w = work_of(L, p, l, PH_DOWN, b, G);
    consume(w, g, ring, full, empty, R, xs4, o);
    g += w.slots();
    PROF(P + 12);
    load_w(wv, L.pf, H);
    grid_sync(bar, fault);
    PROF(P + 13);
  }
  // The last layer's output: x = h + rmsnorm(down) · w_ff.
  if (b == 0) stage_norm(nullptr, hb, o, wv, layers[p.layers - 1].pf, H, p.eps, x, red);
  PROF(p.layers * 14 + 1);
#else
  pdl_begin();  // bulk copies and mbarrier waits need sm_90: the host launches it there only
#endif
}

#define STACK(HD)                                                                                             \
  extern "C" __global__ void __launch_bounds__(SK_THREADS, 1)                                                 \
      stack_step_hd##HD(const StackLayer* layers, float* x, float* work, unsigned long long* sync,            \
                        const int* pos, const int* seq, const int* slots, const int* bt, const float* inv_freq, \
                        StackParams p, unsigned* fault) {                                                     \
    stack_step<HD>(layers, x, work, sync, pos, seq, slots, bt, inv_freq, p, fault);                           \
  }
STACK(64) STACK(128)
