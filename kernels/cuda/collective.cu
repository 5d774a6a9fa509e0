// Collectives between the GPUs of one host through peer-mapped memory
// (xgmi's CUDA fabric). Every rank owns a window and a signal pad in its
// own memory; its peers address both directly (peer access in a process,
// IPC-mapped across processes). All data moves by remote stores ("push"):
// a rank writes into its peers' windows and then raises a flag in each
// peer's pad with a system-scope release store; a rank only ever polls its
// own pad. No argument changes between calls: the epoch lives in the pad
// and the kernel advances it, so the kernels can be recorded in a CUDA
// graph and replayed.
//
// Window of rank r: two halves, used alternately by epoch parity; each half
// holds nranks+1 slots of slot_bytes. Slot q (q < nranks) receives rank q's
// data. In one process the two-shot writes its sums straight into the
// peers' outputs, whose addresses the ranks exchange through the pads, and
// slot nranks is spare. Across processes a peer's output has no address
// here, so the _ipc two-shot writes its sums into slot nranks of the peers'
// windows instead, and every rank copies them out into its output.
//
// Every kernel starts with a barrier over all blocks of all ranks (after its
// pushes): when a rank passes it at epoch e, every block of every peer has
// finished epoch e-1, so the half written at e+1 (the one read at e-1) is
// free. Within a call blocks map chunks the same way on every rank, so the
// second barrier of the two-shot is per block.
//
// Summation order (xgmi.SumReference): acc = f32(x[0]), then acc += f32(x[q])
// for q = 1 .. n-1 in f32, rounded once to the element type (to nearest,
// ties to even). Every rank reduces in that order, so all get the same bits.
#include "common.cuh"

#define CO_MAX_RANKS 8
#define CO_MAX_BLOCKS 256
#define CO_THREADS 512

// Signal pad layout (32-bit words).
#define CO_EPOCH 0    // the last epoch this rank completed
#define CO_ARRIVE 1   // blocks of the current call that have finished
#define CO_DST 16     // [parity][rank] 64-bit: each peer's dst of the current two-shot
#define CO_START 64   // [block][rank]: start barrier flags
#define CO_MID (CO_START + CO_MAX_BLOCKS * CO_MAX_RANKS) // [block][rank]: second barrier

#define FAULT_COLLECTIVE_TIMEOUT 6u

// Addresses of every rank's window and pad as this rank's device sees them.
struct CommArgs {
  unsigned long long win[CO_MAX_RANKS];
  unsigned long long sig[CO_MAX_RANKS];
  unsigned long long slot_bytes;
  int rank;
  int nranks;
  long long timeout_ns; // a wait longer than this records a fault and gives up
};

DEV unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

DEV void st_release(unsigned* p, unsigned v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

DEV unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

DEV unsigned* pad(const CommArgs& a, int q) { return (unsigned*)a.sig[q]; }

// half returns the base of rank q's window half for epoch e.
DEV char* half(const CommArgs& a, int q, unsigned e) {
  return (char*)a.win[q] + (unsigned long long)(e & 1u) * (unsigned long long)(a.nranks + 1) * a.slot_bytes;
}

// wait_flag spins until *p reaches e (wrapping compare). On timeout it
// records a fault and returns; the results are then undefined.
DEV void wait_flag(const unsigned* p, unsigned e, const CommArgs& a, unsigned* fault, int who) {
  if ((int)(ld_acquire(p) - e) >= 0) return;
  unsigned long long t0 = globaltimer();
  for (;;) {
    if ((int)(ld_acquire(p) - e) >= 0) return;
    if ((long long)(globaltimer() - t0) > a.timeout_ns) {
      record_fault(fault, FAULT_COLLECTIVE_TIMEOUT, a.rank, who);
      return;
    }
  }
}

// barrier_all: this block tells every peer it reached epoch e, then waits
// until every block of every peer has.
DEV void barrier_all(const CommArgs& a, unsigned e, unsigned* fault) {
  __syncthreads();
  int t = threadIdx.x;
  if (t < a.nranks && t != a.rank) st_release(pad(a, t) + CO_START + blockIdx.x * CO_MAX_RANKS + a.rank, e);
  const unsigned* own = pad(a, a.rank);
  int total = gridDim.x * a.nranks;
  for (int i = t; i < total; i += blockDim.x) {
    int q = i % a.nranks, b = i / a.nranks;
    if (q != a.rank) wait_flag(own + CO_START + b * CO_MAX_RANKS + q, e, a, fault, q);
  }
  __syncthreads();
}

// barrier_block: block b of this rank and block b of every peer.
DEV void barrier_block(const CommArgs& a, unsigned e, unsigned* fault) {
  __syncthreads();
  int t = threadIdx.x;
  if (t < a.nranks && t != a.rank) {
    st_release(pad(a, t) + CO_MID + blockIdx.x * CO_MAX_RANKS + a.rank, e);
    wait_flag(pad(a, a.rank) + CO_MID + blockIdx.x * CO_MAX_RANKS + t, e, a, fault, t);
  }
  __syncthreads();
}

DEV unsigned begin(const CommArgs& a) { return *(volatile unsigned*)(pad(a, a.rank) + CO_EPOCH) + 1u; }

// finish: the last block of the call records the epoch for the next call
// (which, on the same stream, starts after every block of this one ends).
DEV void finish(const CommArgs& a, unsigned e) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned* own = pad(a, a.rank);
    if (atomicAdd(own + CO_ARRIVE, 1u) == gridDim.x - 1) {
      own[CO_ARRIVE] = 0;
      own[CO_EPOCH] = e;
    }
  }
}

// Element types: 16-byte vectors of VEC elements, unpacked to f32.
template <typename T> struct Vec;
template <> struct Vec<float> {
  enum { N = 4 };
  typedef float raw;
  static DEV void unpack(uint4 u, float* o) {
    o[0] = __uint_as_float(u.x); o[1] = __uint_as_float(u.y);
    o[2] = __uint_as_float(u.z); o[3] = __uint_as_float(u.w);
  }
  static DEV uint4 pack(const float* o) {
    return make_uint4(__float_as_uint(o[0]), __float_as_uint(o[1]), __float_as_uint(o[2]), __float_as_uint(o[3]));
  }
  static DEV float load1(const void* p, long long i) { return __ldcg((const float*)p + i); }
  static DEV void store1(void* p, long long i, float x) { ((float*)p)[i] = x; }
};

// f16 rounding as xgmi's oracle does it: NaN becomes sign | 0x7e00.
DEV uint16_t f2h_oracle(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(((u >> 16) & 0x8000u) | 0x7e00u);
  return f2h(f);
}

DEV uint32_t pk(uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); }

template <> struct Vec<BF16> {
  enum { N = 8 };
  typedef uint16_t raw;
  static DEV void unpack(uint4 u, float* o) { unpack8<BF16>(u, o); }
  static DEV uint4 pack(const float* o) {
    return make_uint4(pk(f2bf(o[0]), f2bf(o[1])), pk(f2bf(o[2]), f2bf(o[3])), pk(f2bf(o[4]), f2bf(o[5])),
                      pk(f2bf(o[6]), f2bf(o[7])));
  }
  static DEV float load1(const void* p, long long i) { return bf2f(__ldcg((const unsigned short*)p + i)); }
  static DEV void store1(void* p, long long i, float x) { ((uint16_t*)p)[i] = f2bf(x); }
};
template <> struct Vec<F16> {
  enum { N = 8 };
  typedef uint16_t raw;
  static DEV void unpack(uint4 u, float* o) { unpack8<F16>(u, o); }
  static DEV uint4 pack(const float* o) {
    return make_uint4(pk(f2h_oracle(o[0]), f2h_oracle(o[1])), pk(f2h_oracle(o[2]), f2h_oracle(o[3])),
                      pk(f2h_oracle(o[4]), f2h_oracle(o[5])), pk(f2h_oracle(o[6]), f2h_oracle(o[7])));
  }
  static DEV float load1(const void* p, long long i) { return h2f(__ldcg((const unsigned short*)p + i)); }
  static DEV void store1(void* p, long long i, float x) { ((uint16_t*)p)[i] = f2h_oracle(x); }
};

// copy_chunk copies chunk c (16 bytes, or the tail's tail elements of size
// es). Loads bypass L1 (ld.global.cg): windows are written by other GPUs,
// and an SM's L1 could still hold a line of the same half from two calls ago.
DEV void copy_chunk(char* dst, const char* src, long long c, long long full, int tail, int es) {
  if (c < full) {
    *(uint4*)(dst + c * 16) = __ldcg((const uint4*)(src + c * 16));
  } else {
    for (int i = 0; i < tail * es; i++) dst[c * 16 + i] = __ldcg(src + c * 16 + i);
  }
}

// reduce_chunk sums chunk c of the n inputs in rank order into dst and,
// for the two-shot (outs != null), into every peer's output outs[q].
template <typename T>
DEV void reduce_chunk(const CommArgs& a, unsigned e, const char* src, char* dst, long long c, long long cin,
                      long long full, int tail, char* const* outs) {
  const int N = Vec<T>::N;
  char* mine = half(a, a.rank, e);
  if (c < full) {
    float acc[N], x[N];
    for (int q = 0; q < a.nranks; q++) {
      const char* p = q == a.rank ? src + c * 16 : mine + (unsigned long long)q * a.slot_bytes + cin * 16;
      uint4 u = __ldcg((const uint4*)p);
      if (q == 0) {
        Vec<T>::unpack(u, acc);
      } else {
        Vec<T>::unpack(u, x);
#pragma unroll
        for (int i = 0; i < N; i++) acc[i] += x[i];
      }
    }
    uint4 r = Vec<T>::pack(acc);
    *(uint4*)(dst + c * 16) = r;
    if (outs) {
      for (int q = 0; q < a.nranks; q++)
        if (q != a.rank) *(uint4*)(outs[q] + c * 16) = r;
    }
  } else {
    for (int i = 0; i < tail; i++) {
      float acc = 0.f;
      for (int q = 0; q < a.nranks; q++) {
        const char* p = q == a.rank ? src + c * 16 : mine + (unsigned long long)q * a.slot_bytes + cin * 16;
        float x = Vec<T>::load1(p, i);
        acc = q == 0 ? x : acc + x;
      }
      Vec<T>::store1(dst + c * 16, i, acc);
      if (outs) {
        for (int q = 0; q < a.nranks; q++)
          if (q != a.rank) Vec<T>::store1(outs[q] + c * 16, i, acc);
      }
    }
  }
}

// One-shot: push the whole input into slot `rank` of every peer; barrier;
// reduce the n slots (this rank's own input read in place) into dst.
template <typename T>
DEV void allreduce_oneshot(CommArgs a, char* dst, const char* src, long long n, unsigned* fault) {
  pdl_begin();
  const int N = Vec<T>::N, es = sizeof(typename Vec<T>::raw);
  unsigned e = begin(a);
  long long full = n / N, chunks = (n + N - 1) / N;
  int tail = (int)(n - full * N);
  long long stride = (long long)gridDim.x * blockDim.x, g = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (long long c = g; c < chunks; c += stride) {
    for (int q = 0; q < a.nranks; q++)
      if (q != a.rank) copy_chunk(half(a, q, e) + (unsigned long long)a.rank * a.slot_bytes, src, c, full, tail, es);
  }
  barrier_all(a, e, fault);
  for (long long c = g; c < chunks; c += stride) reduce_chunk<T>(a, e, src, dst, c, c, full, tail, nullptr);
  finish(a, e);
}

// Two-shot: chunks are split into nranks segments. Every rank publishes
// the address of its dst in its peers' pads (the ranks share one address
// space); pushes segment q of the input into slot `rank` of rank q;
// barrier; reduces its own segment and writes the sum into its dst and
// straight into every peer's dst; and a per-block barrier tells the peers
// that their segments have landed.
//
// With IPC (ranks in separate processes, each with its own address space)
// nothing is published: the sums go into slot nranks of every peer's
// window, and after the per-block barrier each block copies the peers'
// segments that the same block of each peer wrote from its own slot nranks
// into dst. The half is free again by the same argument as the input slots:
// a peer writes it next at epoch e+2, after the barrier of epoch e+1.
template <typename T, bool IPC>
DEV void allreduce_twoshot(CommArgs a, char* dst, const char* src, long long n, unsigned* fault) {
  pdl_begin();
  const int N = Vec<T>::N, es = sizeof(typename Vec<T>::raw);
  unsigned e = begin(a);
  if (!IPC && blockIdx.x == 0 && threadIdx.x < a.nranks && threadIdx.x != a.rank) {
    // The same thread's release store in barrier_all publishes it.
    unsigned* p = pad(a, threadIdx.x) + CO_DST + ((e & 1u) * CO_MAX_RANKS + a.rank) * 2;
    *(volatile unsigned long long*)p = (unsigned long long)dst;
  }
  long long full = n / N, chunks = (n + N - 1) / N;
  int tail = (int)(n - full * N);
  long long stride = (long long)gridDim.x * blockDim.x, g = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (int k = 1; k < a.nranks; k++) {
    int q = (a.rank + k) % a.nranks;
    long long lo = chunks * q / a.nranks, hi = chunks * (q + 1) / a.nranks;
    char* slot = half(a, q, e) + (unsigned long long)a.rank * a.slot_bytes - lo * 16;
    for (long long c = lo + g; c < hi; c += stride) copy_chunk(slot, src, c, full, tail, es);
  }
  barrier_all(a, e, fault);
  char* peers[CO_MAX_RANKS];
  for (int q = 0; q < a.nranks; q++) {
    if (q == a.rank) {
      peers[q] = dst;
    } else if (IPC) {
      peers[q] = half(a, q, e) + (unsigned long long)a.nranks * a.slot_bytes;
    } else {
      const unsigned* p = pad(a, a.rank) + CO_DST + ((e & 1u) * CO_MAX_RANKS + q) * 2;
      peers[q] = (char*)__ldcg((const unsigned long long*)p);
    }
  }
  {
    long long lo = chunks * a.rank / a.nranks, hi = chunks * (a.rank + 1) / a.nranks;
    for (long long c = lo + g; c < hi; c += stride) reduce_chunk<T>(a, e, src, dst, c, c - lo, full, tail, peers);
  }
  barrier_block(a, e, fault);
  if (IPC) {
    const char* sums = half(a, a.rank, e) + (unsigned long long)a.nranks * a.slot_bytes;
    for (int k = 1; k < a.nranks; k++) {
      int q = (a.rank + k) % a.nranks;
      long long lo = chunks * q / a.nranks, hi = chunks * (q + 1) / a.nranks;
      for (long long c = lo + g; c < hi; c += stride) copy_chunk(dst, sums, c, full, tail, es);
    }
  }
  finish(a, e);
}

// All-gather of n bytes per rank: rank q's part lands at dst + q * stride.
// 16-byte vectors when n and stride are multiples of 16, bytes otherwise.
extern "C" __global__ void __launch_bounds__(CO_THREADS)
    allgather_u8(CommArgs a, char* dst, const char* src, long long n, long long stride, unsigned* fault) {
  pdl_begin();
  unsigned e = begin(a);
  long long full = n / 16, chunks = (n + 15) / 16;
  int tail = (int)(n - full * 16);
  long long step = (long long)gridDim.x * blockDim.x, g = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  bool vec = (n % 16) == 0 && (stride % 16) == 0;
  for (long long c = g; c < chunks; c += step) {
    for (int q = 0; q < a.nranks; q++)
      if (q != a.rank) copy_chunk(half(a, q, e) + (unsigned long long)a.rank * a.slot_bytes, src, c, full, tail, 1);
    char* d = dst + (long long)a.rank * stride;
    if (vec) {
      copy_chunk(d, src, c, full, tail, 1);
    } else {
      for (long long i = c * 16; i < n && i < c * 16 + 16; i++) d[i] = src[i];
    }
  }
  barrier_all(a, e, fault);
  char* mine = half(a, a.rank, e);
  for (long long c = g; c < chunks; c += step) {
    for (int q = 0; q < a.nranks; q++) {
      if (q == a.rank) continue;
      const char* s = mine + (unsigned long long)q * a.slot_bytes;
      char* d = dst + (long long)q * stride;
      if (vec) {
        copy_chunk(d, s, c, full, tail, 1);
      } else {
        for (long long i = c * 16; i < n && i < c * 16 + 16; i++) d[i] = __ldcg(s + i);
      }
    }
  }
  finish(a, e);
}

// Broadcast of n bytes from root: root pushes into slot root of every
// peer; the others copy it out after the barrier.
extern "C" __global__ void __launch_bounds__(CO_THREADS)
    broadcast_u8(CommArgs a, char* buf, long long n, int root, unsigned* fault) {
  pdl_begin();
  unsigned e = begin(a);
  long long full = n / 16, chunks = (n + 15) / 16;
  int tail = (int)(n - full * 16);
  long long stride = (long long)gridDim.x * blockDim.x, g = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (a.rank == root) {
    for (long long c = g; c < chunks; c += stride)
      for (int q = 0; q < a.nranks; q++)
        if (q != a.rank) copy_chunk(half(a, q, e) + (unsigned long long)root * a.slot_bytes, buf, c, full, tail, 1);
  }
  barrier_all(a, e, fault);
  if (a.rank != root) {
    const char* s = half(a, a.rank, e) + (unsigned long long)root * a.slot_bytes;
    for (long long c = g; c < chunks; c += stride) copy_chunk(buf, s, c, full, tail, 1);
  }
  finish(a, e);
}

// Low-latency (LL) exchange, for the small messages of decoding: values
// travel in 16-byte lines {x0, e, x1, e} stored with one instruction, the
// epoch beside each value, so a reader polls the data itself: no fence, no
// flag, no barrier. The lines live in the pads, after the flags: per epoch
// parity and sender, CO_LL_BYTES (CO_LL_BYTES / 8 values), apart from the
// windows, whose raw data could pass for an epoch. A half is free again
// when a rank starts epoch e: its previous call waited for every peer's
// data of epoch e-1, which each peer sent after finishing its epoch e-2.
#define CO_LL_OFFSET (32 << 10)
#define CO_LL_BYTES (256 << 10)

DEV uint4* ll_lines(const CommArgs& a, int q, unsigned e, int from) {
  return (uint4*)((char*)a.sig[q] + CO_LL_OFFSET +
                  (unsigned long long)((e & 1u) * CO_MAX_RANKS + from) * CO_LL_BYTES);
}

DEV void ll_store(uint4* p, unsigned x0, unsigned x1, unsigned e) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(x0), "r"(e), "r"(x1), "r"(e)
               : "memory");
}

DEV void ll_store(uint4* p, float x0, float x1, unsigned e) {
  ll_store(p, __float_as_uint(x0), __float_as_uint(x1), e);
}

// ll_wait waits for line p of epoch e and returns its two words. On
// timeout it records a fault and returns what it read.
DEV uint2 ll_wait(const uint4* p, unsigned e, const CommArgs& a, unsigned* fault, int who) {
  uint4 v;
  unsigned long long t0 = 0;
  for (;;) {
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    if (v.y == e && v.w == e) break;
    if (t0 == 0) {
      t0 = globaltimer();
    } else if ((long long)(globaltimer() - t0) > a.timeout_ns) {
      record_fault(fault, FAULT_COLLECTIVE_TIMEOUT, a.rank, who);
      break;
    }
  }
  return make_uint2(v.x, v.z);
}

DEV float2 ll_load(const uint4* p, unsigned e, const CommArgs& a, unsigned* fault, int who) {
  uint2 v = ll_wait(p, e, a, fault, who);
  return make_float2(__uint_as_float(v.x), __uint_as_float(v.y));
}

// word_elem is element i of a 32-bit word of T values.
template <typename T> DEV float word_elem(unsigned w, int i);
template <> DEV float word_elem<float>(unsigned w, int) { return __uint_as_float(w); }
template <> DEV float word_elem<BF16>(unsigned w, int i) { return bf2f((uint16_t)(i ? w >> 16 : w)); }
template <> DEV float word_elem<F16>(unsigned w, int i) { return h2f((uint16_t)(i ? w >> 16 : w)); }

// src_line is line l (8 bytes) of a message of nb bytes, zeros past its end.
DEV uint2 src_line(const char* src, long long l, long long nb) {
  long long off = l * 8;
  if (off + 8 <= nb) return *(const uint2*)(src + off);
  unsigned w[2] = {0, 0};
  for (int i = 0; off + i < nb; i++) w[i / 4] |= (unsigned)(unsigned char)src[off + i] << (8 * (i % 4));
  return make_uint2(w[0], w[1]);
}

// Low-latency one-shot all-reduce of n elements, for small messages: every
// rank sends its input to every peer as LL lines (8 bytes of it a line,
// n * sizeof(T) at most CO_LL_BYTES / 2) and sums each line in rank order
// as the peers' arrive. One thread a line; no barrier, so the grid need
// not be resident at once.
template <typename T>
DEV void allreduce_ll(CommArgs a, char* dst, const char* src, long long n, unsigned* fault) {
  pdl_begin();
  constexpr int es = sizeof(typename Vec<T>::raw), per = 8 / es, half = per / 2;
  unsigned e = begin(a);
  long long nb = n * es, lines = (nb + 7) / 8;
  long long stride = (long long)gridDim.x * blockDim.x, g = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (long long l = g; l < lines; l += stride) {
    uint2 v = src_line(src, l, nb);
    for (int q = 0; q < a.nranks; q++)
      if (q != a.rank) ll_store(ll_lines(a, q, e, a.rank) + l, v.x, v.y, e);
  }
  for (long long l = g; l < lines; l += stride) {
    float acc[per];
    for (int q = 0; q < a.nranks; q++) {
      uint2 v = q == a.rank ? src_line(src, l, nb) : ll_wait(ll_lines(a, a.rank, e, q) + l, e, a, fault, q);
#pragma unroll
      for (int j = 0; j < per; j++) {
        float x = word_elem<T>(j < half ? v.x : v.y, j % half);
        acc[j] = q == 0 ? x : acc[j] + x;
      }
    }
#pragma unroll
    for (int j = 0; j < per; j++)
      if (l * per + j < n) Vec<T>::store1(dst + l * 8, j, acc[j]);
  }
  finish(a, e);
}

// All-reduce fused with the residual norm after it (tensor parallelism's
// row-parallel products), over LL lines: n rows of dim f32 values (dim
// even, n * dim at most CO_LL_BYTES / 8), rows strided over the grid. Each
// block sends its rows to every peer, sums them in rank order into dst as
// the peers' lines arrive (src's own rows read in place; dst may be src),
// and then
//   MODE 1: r += sum; out = rmsnorm(r) * w   (pre-norm residual)
//   MODE 2: r += rmsnorm(sum) * w            (post-norm residual)
template <typename W, int MODE>
DEV void allreduce_norm(CommArgs a, float* dst, const float* src, float* r, float* out,
                        const typename Elem<W>::raw* w, int n, int dim, float eps, unsigned* fault) {
  __shared__ float scratch[32];
  pdl_begin();
  unsigned e = begin(a);
  const int lines = dim / 2;
  for (int row = blockIdx.x; row < n; row += gridDim.x) {
    const float2* s = (const float2*)(src + (long long)row * dim);
    for (int l = threadIdx.x; l < lines; l += blockDim.x) {
      float2 v = s[l];
      for (int q = 0; q < a.nranks; q++)
        if (q != a.rank) ll_store(ll_lines(a, q, e, a.rank) + (long long)row * lines + l, v.x, v.y, e);
    }
  }
  for (int row = blockIdx.x; row < n; row += gridDim.x) {
    long long base = (long long)row * dim;
    float2* d2 = (float2*)(dst + base);
    float2* r2 = (float2*)(r + base);
    float ss = 0.f;
    for (int l = threadIdx.x; l < lines; l += blockDim.x) {
      float2 acc = make_float2(0.f, 0.f);
      for (int q = 0; q < a.nranks; q++) {
        float2 v = q == a.rank ? ((const float2*)(src + base))[l]
                               : ll_load(ll_lines(a, a.rank, e, q) + (long long)row * lines + l, e, a, fault, q);
        acc = q == 0 ? v : make_float2(acc.x + v.x, acc.y + v.y);
      }
      d2[l] = acc;
      if (MODE == 1) {
        float2 o = r2[l];
        acc = make_float2(acc.x + o.x, acc.y + o.y);
        r2[l] = acc;
      }
      ss += acc.x * acc.x + acc.y * acc.y;
    }
    ss = block_sum(ss, scratch);
    float inv = rsqrtf(ss / (float)dim + eps);
    // Each thread reads back the lines it wrote.
    for (int l = threadIdx.x; l < lines; l += blockDim.x) {
      float2 v = MODE == 1 ? r2[l] : d2[l];
      float y0 = v.x * inv * Elem<W>::load(w, 2 * l), y1 = v.y * inv * Elem<W>::load(w, 2 * l + 1);
      if (MODE == 1) {
        ((float2*)(out + base))[l] = make_float2(y0, y1);
      } else {
        float2 o = r2[l];
        r2[l] = make_float2(o.x + y0, o.y + y1);
      }
    }
  }
  finish(a, e);
}

#define CO_NORM_KERNELS(W, S)                                                                                  \
  extern "C" __global__ void __launch_bounds__(CO_THREADS)                                                     \
      allreduce_add_rmsnorm_##S(CommArgs a, float* dst, const float* src, float* r, float* out,               \
                                const Elem<W>::raw* w, int n, int dim, float eps, unsigned* fault) {           \
    allreduce_norm<W, 1>(a, dst, src, r, out, w, n, dim, eps, fault);                                          \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(CO_THREADS)                                                     \
      allreduce_rmsnorm_add_##S(CommArgs a, float* dst, const float* src, float* r, const Elem<W>::raw* w,     \
                                int n, int dim, float eps, unsigned* fault) {                                  \
    allreduce_norm<W, 2>(a, dst, src, r, nullptr, w, n, dim, eps, fault);                                      \
  }

CO_NORM_KERNELS(float, f32)
CO_NORM_KERNELS(BF16, bf16)
CO_NORM_KERNELS(F16, f16)

// sumsq2_allreduce: OLMo 2's sharded QK-norm. out[row] is the sum over the
// ranks of the squares of their slices of a's row (rows [0, n), width wa)
// and out[n + row] of b's (width wb): sumsq2 and the all-reduce of its 2n
// sums in one kernel, over LL lines (2n at most CO_LL_BYTES / 16).
extern "C" __global__ void __launch_bounds__(CO_THREADS)
    sumsq2_allreduce_f32(CommArgs a, float* out, const float* x, const float* y, int n, int wa, int wb,
                         unsigned* fault) {
  __shared__ float scratch[32];
  pdl_begin();
  unsigned e = begin(a);
  for (int row = blockIdx.x; row < 2 * n; row += gridDim.x) {
    const float* p = row < n ? x + (long long)row * wa : y + (long long)(row - n) * wb;
    int wd = row < n ? wa : wb;
    float ss = 0.f;
    for (int j = threadIdx.x; j < wd; j += blockDim.x) ss += p[j] * p[j];
    ss = block_sum(ss, scratch);
    if (threadIdx.x == 0) {
      out[row] = ss;
      for (int q = 0; q < a.nranks; q++)
        if (q != a.rank) ll_store(ll_lines(a, q, e, a.rank) + row, ss, 0.f, e);
    }
  }
  if (threadIdx.x == 0) {
    for (int row = blockIdx.x; row < 2 * n; row += gridDim.x) {
      float acc = 0.f;
      for (int q = 0; q < a.nranks; q++) {
        float v = q == a.rank ? out[row] : ll_load(ll_lines(a, a.rank, e, q) + row, e, a, fault, q).x;
        acc = q == 0 ? v : acc + v;
      }
      out[row] = acc;
    }
  }
  finish(a, e);
}

#define CO_KERNELS(T, S)                                                                                       \
  extern "C" __global__ void __launch_bounds__(CO_THREADS)                                                     \
      allreduce_oneshot_##S(CommArgs a, char* dst, const char* src, long long n, unsigned* fault) {            \
    allreduce_oneshot<T>(a, dst, src, n, fault);                                                               \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(CO_THREADS)                                                     \
      allreduce_twoshot_##S(CommArgs a, char* dst, const char* src, long long n, unsigned* fault) {            \
    allreduce_twoshot<T, false>(a, dst, src, n, fault);                                                        \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(CO_THREADS)                                                     \
      allreduce_twoshot_ipc_##S(CommArgs a, char* dst, const char* src, long long n, unsigned* fault) {        \
    allreduce_twoshot<T, true>(a, dst, src, n, fault);                                                         \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(CO_THREADS)                                                     \
      allreduce_ll_##S(CommArgs a, char* dst, const char* src, long long n, unsigned* fault) {                 \
    allreduce_ll<T>(a, dst, src, n, fault);                                                                    \
  }

CO_KERNELS(float, f32)
CO_KERNELS(BF16, bf16)
CO_KERNELS(F16, f16)
