// gemm_wg_bf16: prompt products on Hopper's warpgroup tensor cores (wgmma,
// sm_90a) fed by the tensor memory accelerator (TMA):
//
//   out[n,m] (f32, row-major) = x[n,k] (bf16, row-major) · w[m,k]ᵀ (bf16, row-major)
//
// Requirements: k % 64 == 0 (the caller falls back otherwise); x, w 16-byte
// aligned. n and m are arbitrary: edge tiles are zero-filled by the TMA unit
// on load and masked on store.
//
// Design:
//   * Block = 3 warpgroups (384 threads), one block per SM, persistent:
//     grid = min(#tiles, #SMs), each block walks tiles blockIdx.x,
//     blockIdx.x + gridDim.x, ...; tile t covers x rows (t % NT)*128 and w
//     rows (t / NT)*256, so consecutive tiles share the same w rows and w
//     streams from memory about once.
//   * Warpgroup 0 is the producer: after setmaxnreg.dec one thread issues
//     two TMA copies (cp.async.bulk.tensor.2d, 128-byte swizzle) per k-step
//     into a 4-deep ring of shared-memory stages {A: 128x64, B: 256x64 bf16}.
//     full[s] (count 1 + transaction bytes) says a stage has landed;
//     empty[s] (count 8, one arrive per consumer warp) that it may be reused.
//   * Warpgroups 1 and 2 are consumers: each owns 64 rows of the 128-row
//     tile and all 256 columns; per k-step it issues 4 x
//     wgmma.mma_async.m64n256k16.f32.bf16.bf16 with A and B read from shared
//     memory through 64-bit matrix descriptors (K-major, 128-byte swizzle),
//     commits them as one group and keeps one group in flight before
//     releasing the previous stage.
//   * Epilogue: accumulators go straight from registers to global memory
//     (bounds checked) while the producer streams the next tile's stages.
//
// Host side (gpu/cuda/ops.go): two tensor maps (cuTensorMapEncodeTiled,
// bf16, rank 2, dims {k, rows}, row stride 2k bytes, box {64, 128} for x and
// {64, 256} for w, 128-byte swizzle, zero fill), passed by value after
// (out, x, w, n, k, m); dynamic shared memory GEMM_WG_SMEM; grid
// (min(tiles, SMs)); block 384.
#include "mma.cuh"

// Tile shape constants, for the host side.
#define GEMM_WG_BM 128
#define GEMM_WG_BK 64
#define GEMM_WG_THREADS 384
#define GEMM_WG_BN 256
#define GEMM_WG_STAGES 4
// Dynamic shared memory: stages + 1 KiB so the ring can be aligned to 1024
// bytes (128B-swizzle atoms) + 2 mbarriers (8 bytes each) per stage.
#define GEMM_WG_SMEM_FOR(BN, STAGES) ((STAGES) * (GEMM_WG_BM + (BN)) * GEMM_WG_BK * 2 + 1024 + (STAGES) * 16)
#define GEMM_WG_SMEM GEMM_WG_SMEM_FOR(GEMM_WG_BN, GEMM_WG_STAGES)                  // 197696

namespace wgk {

// Opaque stand-in for CUtensorMap (128 bytes, 64-byte aligned) so the kernel
// needs no driver header; the host copies a CUtensorMap into it bit for bit.
struct __align__(64) TMap {
  uint64_t v[16];
};

// Watchdog: a barrier wait that spins longer than this (ns) traps, so a
// protocol bug shows up as a launch error instead of a hang.
#define WG_WATCHDOG_NS 2000000000ull

DEV uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---- mbarrier (PTX ISA, "Parallel Synchronization and Communication Instructions: mbarrier") ----
DEV void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Producer: one arrival plus the number of bytes the TMA copies will deliver.
DEV void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile(
      "{\n.reg .b64 wg_state;\nmbarrier.arrive.expect_tx.shared::cta.b64 wg_state, [%0], %1;\n}\n" ::"r"(bar), "r"(bytes)
      : "memory");
}
DEV void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 wg_state;\nmbarrier.arrive.shared::cta.b64 wg_state, [%0];\n}\n" ::"r"(bar) : "memory");
}
DEV bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}
// Waits for the completion of the phase with the given parity.
DEV void mbar_wait(uint32_t bar, uint32_t parity) {
  if (mbar_try_wait(bar, parity)) return;
  uint64_t t0 = globaltimer();
  while (!mbar_try_wait(bar, parity)) {
    if (globaltimer() - t0 > WG_WATCHDOG_NS) {
      asm volatile("trap;");
    }
  }
}

// ---- TMA (PTX ISA, "Data Movement and Conversion Instructions: cp.async.bulk.tensor") ----
// Copies the box at (c0 = element along k, c1 = row) of the tensor map into
// shared memory at dst, completing bytes on the mbarrier bar. Rows beyond
// the tensor are zero-filled (and still counted in the transaction bytes).
DEV void tma_load_2d(uint32_t dst, const TMap* map, uint32_t bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// tma_load_once is tma_load_2d for bytes read once (evict_first): the
// decode-batch products' weights.
DEV void tma_load_once(uint32_t dst, const TMap* map, uint32_t bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "l"(evict_first())
      : "memory");
}

// ---- wgmma (PTX ISA 9.x section 9.7.15, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate") ----
DEV void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
DEV void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
DEV void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Pins accumulator registers in place relative to the (volatile) wgmma
// statements, so the compiler neither reads them while a wgmma that writes
// them may be in flight nor moves their initialisation past one.
template <int R>
DEV void fence_acc(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared-memory matrix descriptor (PTX ISA 9.7.15.5.1.2 "Shared Memory
// Matrix Layout", subsection "Matrix Descriptor Format"):
//   bits  0-13  start address >> 4
//   bits 16-29  leading-dimension byte offset >> 4 (unused for K-major
//               swizzled layouts whose K extent, 32 bytes here, lies inside
//               the 128-byte swizzle row; set to 1 by convention)
//   bits 32-45  stride-dimension byte offset >> 4: from one 8-row group to
//               the next = 8 rows x 128 bytes = 1024
//   bits 49-51  base offset = 0 (every stage is 1024-byte aligned)
//   bits 62-63  swizzle mode: 1 = 128-byte swizzle
// The tile is rows of 64 bf16 (128 bytes), row r at r*128, its 16-byte
// chunk c stored at chunk c ^ (r & 7): exactly what TMA SWIZZLE_128B writes.
// The k16 slice kk of the 64-wide row starts kk*32 bytes in: the hardware
// applies the XOR to the final address bits [4:6] ^ [7:9], so advancing the
// start address by 32 bytes inside a 1024-aligned atom selects the slice.
DEV uint64_t make_desc(uint32_t saddr) {
  return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
         ((uint64_t)1 << 62);
}

// d[128] += A(64x16, desc da) * B(16x256, desc db); both K-major, 128B swizzle.
DEV void wgmma_m64n256k16(float (&d)[128], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(1));
}

// d[32] += A(64x16, desc da) * B(16x64, desc db); both K-major, 128B
// swizzle; T the 16-bit type of both.
#define WGMMA_M64N64K16(TY)                                                                                           \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                      \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " "                                           \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                             \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "                   \
               "%32, %33, p, 1, 1, 0, 0;\n}\n"                                                                      \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),   \
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),         \
                 "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),       \
                 "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),       \
                 "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                                                            \
               : "l"(da), "l"(db), "r"(1))
template <typename T> DEV void wgmma_m64n64k16(float (&d)[32], uint64_t da, uint64_t db);
template <> DEV void wgmma_m64n64k16<BF16>(float (&d)[32], uint64_t da, uint64_t db) { WGMMA_M64N64K16("bf16"); }
template <> DEV void wgmma_m64n64k16<F16>(float (&d)[32], uint64_t da, uint64_t db) { WGMMA_M64N64K16("f16"); }

template <int BN>
struct Mma;
template <>
struct Mma<256> {
  static DEV void run(float (&d)[128], uint64_t da, uint64_t db) { wgmma_m64n256k16(d, da, db); }
};

// Writes one warp's 16 x BN slab of the accumulator. Fragment layout of
// wgmma .m64nNk16 with .f32 D (PTX ISA 9.7.15.5.1.1.1, Figure "WGMMA
// .m64nNk16 register fragment layout for accumulator matrix D"): warp w of
// the warpgroup owns rows 16w..16w+15; with g = lane/4, q = lane%4,
//   d[4j+0], d[4j+1] -> row 16w+g,   cols 8j+2q, 8j+2q+1
//   d[4j+2], d[4j+3] -> row 16w+g+8, cols 8j+2q, 8j+2q+1      (j < N/8)
template <int BN>
DEV void store_slab(float* __restrict__ out, const float (&acc)[BN / 2], int n, int m, int r0, int c0, int lane) {
  const int g = lane >> 2, q = lane & 3;
  const bool pairs = (m & 1) == 0;  // then (row*m + even col) is 8-byte aligned
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int r = r0 + g + 8 * h;
    if (r < n) {
      float* orow = out + (size_t)r * (size_t)m;
#pragma unroll
      for (int j = 0; j < BN / 8; j++) {
        const int c = c0 + 8 * j + 2 * q;
        const float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
        if (pairs && c + 1 < m) {
          *reinterpret_cast<float2*>(orow + c) = make_float2(v0, v1);
        } else {
          if (c < m) orow[c] = v0;
          if (c + 1 < m) orow[c + 1] = v1;
        }
      }
    }
  }
}

template <int BN, int STAGES, bool SETMAXNREG>
DEV void gemm_wg_body(float* __restrict__ out, int n, int k, int m, const TMap* tmx, const TMap* tmw) {
  pdl_begin();
  constexpr int BM = GEMM_WG_BM, BK = GEMM_WG_BK;
  constexpr uint32_t A_BYTES = BM * BK * 2;  // 16 KiB
  constexpr uint32_t B_BYTES = BN * BK * 2;  // 32 or 16 KiB
  constexpr uint32_t STAGE_BYTES = A_BYTES + B_BYTES;
  static_assert(A_BYTES % 1024 == 0 && STAGE_BYTES % 1024 == 0, "stages must stay 1024-byte aligned");
  static_assert(GEMM_WG_SMEM_FOR(BN, STAGES) <= 227 * 1024, "too much shared memory");
  constexpr int NACC = BN / 2;

  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // Align the ring to 1024 bytes ourselves (the launch adds 1 KiB of slack):
  // the 128B swizzle pattern repeats every 1024 bytes and both TMA and the
  // wgmma descriptors (base offset 0) assume atoms start on that boundary.
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t full0 = base + STAGES * STAGE_BYTES;  // full[s]  = full0 + 8s
  const uint32_t empty0 = full0 + 8 * STAGES;          // empty[s] = empty0 + 8s

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; s++) {
      mbar_init(full0 + 8 * s, 1);   // the producer's arrive.expect_tx (+ tx bytes)
      mbar_init(empty0 + 8 * s, 8);  // lane 0 of each of the 8 consumer warps
    }
    // Make the initialised barriers visible to the async proxy (TMA).
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();

  const int NT = (n + BM - 1) / BM;  // tiles along x rows
  const int MT = (m + BN - 1) / BN;  // tiles along w rows
  const int tiles = NT * MT;
  const int KT = k / BK;
  const int wgi = threadIdx.x >> 7;  // warpgroup 0 producer, 1-2 consumers

  if (wgi == 0) {
    // ---------------- producer ----------------
    if constexpr (SETMAXNREG) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
    if (threadIdx.x == 0) {
      uint32_t it = 0;
      for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int rx = (tile % NT) * BM, rw = (tile / NT) * BN;
        for (int kt = 0; kt < KT; kt++, it++) {
          const uint32_t s = it % STAGES, u = it / STAGES;
          // Stage s was last used by iteration it - STAGES: wait for the
          // (u-1)-th completion of empty[s].
          if (u > 0) mbar_wait(empty0 + 8 * s, (u - 1) & 1);
          const uint32_t a = base + s * STAGE_BYTES;
          mbar_arrive_expect_tx(full0 + 8 * s, STAGE_BYTES);
          tma_load_2d(a, tmx, full0 + 8 * s, kt * BK, rx);
          tma_load_2d(a + A_BYTES, tmw, full0 + 8 * s, kt * BK, rw);
        }
      }
    }
  } else {
    // ---------------- consumers ----------------
    if constexpr (SETMAXNREG) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;" ::: "memory");
    const int c = wgi - 1;                 // which 64-row half of the tile
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    uint32_t it = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const int rx = (tile % NT) * BM, rw = (tile / NT) * BN;
      float acc[NACC];
#pragma unroll
      for (int i = 0; i < NACC; i++) acc[i] = 0.f;
      for (int kt = 0; kt < KT; kt++, it++) {
        const uint32_t s = it % STAGES;
        mbar_wait(full0 + 8 * s, (it / STAGES) & 1);
        const uint32_t a = base + s * STAGE_BYTES + c * (64 * 128);  // this half's 64 rows
        const uint32_t b = base + s * STAGE_BYTES + A_BYTES;
        fence_acc(acc);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) Mma<BN>::run(acc, make_desc(a + 32 * kk), make_desc(b + 32 * kk));
        wg_commit();
        fence_acc(acc);
        // Keep this k-step's group in flight; the previous one is done now,
        // so its stage can be refilled.
        wg_wait<1>();
        fence_acc(acc);
        if (kt > 0 && lane == 0) mbar_arrive(empty0 + 8 * ((it - 1) % STAGES));
      }
      wg_wait<0>();
      fence_acc(acc);
      if (KT > 0 && lane == 0) mbar_arrive(empty0 + 8 * ((it - 1) % STAGES));
      store_slab<BN>(out, acc, n, m, rx + c * 64 + warp * 16, rw, lane);
    }
  }
}


// ---- gemm_stream: decode-batch products fed by the TMA unit ----
//
// gemm_skinny's product for up to NT·8 rows of 16-bit x (NT token tiles:
// 4, or 8 for up to 64 rows; out [+ blockIdx.y·n·m] = x[n,k] · w[m,k]ᵀ over
// the block's split of k; RT·4 warps of 32 rows of w a block, RT tiles of
// 128 rows sharing each stage of x), with the weights' bytes in flight
// held in shared memory instead of registers: each warp streams its 32
// rows through a ring of ST slots of 64 k (4 KiB, one TMA copy each,
// 128-byte swizzle), refilling a slot as soon as it is summed, so ST - 1
// copies stay in flight while the block works, and the first ST are asked
// for before the wait for the kernel ahead. x comes a stage of
// GS_XK·4·XM/NT of k at a time (XM·16 KiB), one TMA copy of its NT·8 rows
// (zeros past n) a 64 k, into two buffers: the next stage's copies are in
// flight while the block sums one, and the block waits at a barrier once
// a stage.
//
// With WG (eight token tiles), each warpgroup sums its 128 rows on the
// warpgroup tensor cores: wgmma m64n64k16 with the weights as A and the
// stage of x as B, both read by descriptor from the swizzled slots. The
// ring then lies slot by slot, every warp's 4 KiB of a slot warp after
// warp, so that a warpgroup's 128 rows are two runs of 64 (wgmma's M); a
// slot's four copies complete one barrier of the warpgroup, and the warps
// refill it once all four are past it. Otherwise each warp forms both
// operands' fragments by ldmatrix and sums on mma.sync, waiting only for
// its own slots. The k slots are k in order either way.
#define GS_XK 256
#define GS_SMEM_FOR(RT, ST, XM) (4 * (RT) * (ST) * 4096 + 2 * (XM) * (GS_XK / 64) * 4096 + 1024 + 8 * (4 * (RT) * (ST) + 2))

// silu_fast is silu(g) = g·σ(g) = h + h·tanh(h), h = g/2, on the
// hardware's approximate tanh: one special-function instruction, where
// __expf and __fdividef take two (and expf and a true division more). The
// gated product (GLU below) forms its block's 64 × 64 activations after
// its last weights, in the product's tail, where each of those
// instructions shows in a 64 × 512 OLMo-2-1B step (docs/cuda.md). Its
// error is below the 16-bit rounding of the result but for silu's small
// negative tail, where it is about |g|·2^-12 absolute.
DEV float silu_fast(float g) {
  const float h = 0.5f * g;
  float t;
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(h));
  return fmaf(h, t, h);
}

// gemm_stream with GLU (one tile a block, on the warpgroup tensor cores,
// one split of k): w is a gated MLP's gate rows then its up rows (m = 2f),
// and the block's tile is 64 gate rows (warps 0 and 1) and the same 64 up
// rows (warps 2 and 3). wgmma's two halves then hold gate and up of the
// same (token, row) in the same registers, and the block stores
// silu_fast(gate)·up rounded to T, out [n, f] of 16 bits: the down
// product's x.
template <typename T, int NT, int RT, int ST, int XM, bool WG, bool GLU = false>
DEV void gemm_stream(void* __restrict__ out, int n, int k, int m, int kchunk, const TMap* tmx, const TMap* tmw) {
#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("trap;");  // no TMA: the host launches the sm_90a cubin only
#else
  static_assert(!WG || NT == 8, "the warpgroup product takes 64 rows of x");
  static_assert(!GLU || (WG && RT == 1), "the gated product takes one warpgroup tile a block");
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  constexpr int W = 4 * RT;                              // warps
  // A warp's rows of slot s: warp after warp within each slot with WG (a
  // warpgroup's 128 rows in one run), else slot after slot within each
  // warp's ring.
  auto slot = [&](int s) { return WG ? base + s * (W * 4096) + warp * 4096 : base + (warp * ST + s) * 4096; };
  constexpr int XK = GS_XK * 4 * XM / NT;                // k of x a stage
  constexpr uint32_t XSTAGE = XM * (GS_XK / 64) * 4096;  // bytes of a stage
  const uint32_t xs = base + ST * W * 4096;             // two stages of x
  // The weights' barriers: a warp's a slot, or with WG its warpgroup's
  // (four arrivals, one a warp's copy).
  const uint32_t xbar = xs + 2 * XSTAGE, wbar = xbar + 16 + (WG ? warp >> 2 : warp) * (8 * ST);
  const int row0 = GLU ? (warp >> 1) * (m >> 1) + blockIdx.x * 64 + (warp & 1) * 32 : blockIdx.x * (128 * RT) + warp * 32;
  const int kbeg = blockIdx.y * kchunk, kend = min(k, kbeg + kchunk), steps = (kend - kbeg) / 64;
  const uint32_t xbox = NT * 8 * 128;  // bytes of a 64 k of x (the host's box: the tiles' rows)
  if (lane == 0 && (!WG || (warp & 3) == 0)) {
#pragma unroll
    for (int s = 0; s < ST; s++) mbar_init(wbar + 8 * s, WG ? 4 : 1);
    if (warp == 0) {
      mbar_init(xbar, 1);
      mbar_init(xbar + 8, 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  if constexpr (WG) __syncthreads();  // a warpgroup's barriers, before its warps' copies
  // fill asks for step u's 64 k of the warp's rows in its slot of the ring.
  auto fill = [&](int u) {
    if (u >= steps) return;
    const uint32_t bar = wbar + 8 * (u % ST);
    mbar_arrive_expect_tx(bar, 4096);
    tma_load_once(slot(u % ST), tmw, bar, kbeg + 64 * u, row0);
  };
  // stage asks for x's k from xk (to the split's end, at most XK) in
  // buffer b.
  auto stage = [&](int xk, int b) {
    const int slices = min(XK, kend - xk) / 64;
    mbar_arrive_expect_tx(xbar + 8 * b, slices * xbox);
    for (int i = 0; i < slices; i++) tma_load_2d(xs + b * XSTAGE + i * xbox, tmx, xbar + 8 * b, xk + 64 * i, 0);
  };
  // The weights, before the wait for the kernel ahead: nothing writes them.
  if (lane == 0)
    for (int u = 0; u < ST; u++) fill(u);
  pdl_begin();
  __syncthreads();  // x's barriers are initialised
  if (tid == 0) stage(kbeg, 0);

  float acc[2][NT][4] = {};  // mma.sync: [row slice][token tile]; WG: acc[h] is m64n64's 32 of half h
  // ldmatrix addresses: lane l gives row l % 8 of matrix l / 8. A (weights,
  // rows × k): matrices (rows 0-7 | 8-15) × (chunk c | c + 1) of a 16-row
  // slice; B (x, tokens × k): chunks c .. c + 3 of a token tile's 8 rows.
  // A row r's 16-byte chunk c lies at r·128 + (c ^ r % 8)·16.
  const int lr = lane & 7, lm = lane >> 3;
  const uint32_t aoff = ((lm & 1) * 8 + lr) * 128, boff = lr * 128;
  uint32_t xph = 0;  // bit b: the phase of buffer b's barrier
  int j = 0;         // the step: 64 k
  for (int xk = kbeg, b = 0; xk < kend; xk += XK, b ^= 1) {
    const int slices = min(XK, kend - xk) / 64;
    if (xk != kbeg) __syncthreads();  // the stage before is consumed: its buffer is free
    if (tid == 0 && xk + XK < kend) stage(xk + XK, b ^ 1);
    mbar_wait(xbar + 8 * b, (xph >> b) & 1);
    xph ^= 1u << b;
    for (int sl = 0; sl < slices; sl++, j++) {
      const uint32_t xa = xs + b * XSTAGE + sl * xbox;
      mbar_wait(wbar + 8 * (j % ST), (j / ST) & 1);
      if constexpr (WG) {
        float (&d0)[32] = *reinterpret_cast<float(*)[32]>(&acc[0][0][0]);
        float (&d1)[32] = *reinterpret_cast<float(*)[32]>(&acc[1][0][0]);
        const uint32_t wa = base + (j % ST) * (W * 4096) + (warp >> 2) * 16384;  // the warpgroup's 128 rows
        wg_fence();
        fence_acc(d0);
        fence_acc(d1);
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
          const uint64_t db = make_desc(xa + 32 * kk);
          wgmma_m64n64k16<T>(d0, make_desc(wa + 32 * kk), db);
          wgmma_m64n64k16<T>(d1, make_desc(wa + 8192 + 32 * kk), db);
        }
        wg_commit();
        wg_wait<0>();
        fence_acc(d0);
        fence_acc(d1);
        // The warpgroup's four warps are past the slot (a named barrier).
        asm volatile("bar.sync %0, 128;" ::"r"(1 + (warp >> 2)) : "memory");
      } else {
        const uint32_t wa = slot(j % ST);
#pragma unroll
        for (int h = 0; h < 2; h++) {  // k 32h .. 32h + 31: two mma k-steps
          uint32_t a[2][2][4], bx[NT][4];  // a[row slice][k-step]; bx[token tile]: both k-steps
#pragma unroll
          for (int rs = 0; rs < 2; rs++)
#pragma unroll
            for (int ks = 0; ks < 2; ks++)
              ldsm4(a[rs][ks], wa + rs * 2048 + aoff + (((4 * h + 2 * ks + (lm >> 1)) ^ lr) << 4));
#pragma unroll
          for (int t = 0; t < NT; t++) ldsm4(bx[t], xa + t * 1024 + boff + (((4 * h + lm) ^ lr) << 4));
#pragma unroll
          for (int ks = 0; ks < 2; ks++)
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
              for (int rs = 0; rs < 2; rs++) mma16816<T>(acc[rs][t], a[rs][ks], &bx[t][2 * ks]);
        }
        __syncwarp();
      }
      if (lane == 0) fill(j + ST);  // the slot is summed: refill it
    }
  }
  if constexpr (GLU) {
    // Half 0 holds the gate rows, half 1 the same up rows (fragment as below).
    // The tile goes through shared memory (the ring's first slots, all
    // summed): [token][row], rows padded to 72 so that a warp's stores
    // fall in distinct banks, then 16 bytes a thread, a token's 64 rows
    // in one 128-byte run (f is a multiple of 64: the host launches f / 64
    // blocks). Stored one value at a time from the fragments, the tile
    // made the 64 × 512 step 0.7% slower (docs/cuda.md).
    const int f = m >> 1, g = lane >> 2, q = lane & 3, rl = (warp & 3) * 16 + g;
    uint16_t* st = reinterpret_cast<uint16_t*>(smem_raw + (base - smem_addr(smem_raw)));
    __syncthreads();
#pragma unroll
    for (int e = 0; e < 32; e++) {
      const int t = 8 * (e >> 2) + 2 * q + (e & 1), row = rl + 8 * ((e >> 1) & 1);
      Elem<T>::store(st, t * 72 + row, silu_fast(acc[0][e >> 2][e & 3]) * acc[1][e >> 2][e & 3]);
    }
    __syncthreads();
    uint16_t* o = static_cast<uint16_t*>(out);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int c = tid + 128 * i, t = c >> 3, p = c & 7;
      if (t < n) *reinterpret_cast<uint4*>(o + (long)t * f + blockIdx.x * 64 + 8 * p) = *reinterpret_cast<const uint4*>(st + t * 72 + 8 * p);
    }
  } else if constexpr (WG) {
    // wgmma's m64nN f32 fragment: warp w of the warpgroup holds rows
    // 16w + g (+ 8) of each 64, columns (tokens) 8c + 2q (+ 1).
    const int g = lane >> 2, q = lane & 3, r = blockIdx.x * (128 * RT) + (warp >> 2) * 128 + (warp & 3) * 16 + g;
    float* o = static_cast<float*>(out) + (long)blockIdx.y * n * m;
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
      for (int e = 0; e < 32; e++) {
        const int t = 8 * (e >> 2) + 2 * q + (e & 1), row = r + 64 * h + 8 * ((e >> 1) & 1);
        if (t < n && row < m) o[(long)t * m + row] = acc[h][e >> 2][e & 3];
      }
  } else {
    store_skinny<NT>(static_cast<float*>(out), acc, n, m, row0, NT);
  }
#endif
}
}  // namespace wgk

// x and w are not read by the kernel (the tensor maps point at them); they
// stay in the signature so the entry matches the other gemm kernels. The
// portable PTX build (compute_80) has no wgmma or TMA: there the kernel
// traps, and the host launches it only from the sm_90a cubin.
extern "C" __global__ void __launch_bounds__(GEMM_WG_THREADS, 1)
    gemm_wg_bf16(float* out, const uint16_t* x, const uint16_t* w, int n, int k, int m,
                 const __grid_constant__ wgk::TMap tmx, const __grid_constant__ wgk::TMap tmw) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  wgk::gemm_wg_body<GEMM_WG_BN, GEMM_WG_STAGES, true>(out, n, k, m, &tmx, &tmw);
#else
  asm volatile("trap;");
#endif
}

// gemm_stream_{bf16,f16}: decode-batch products of up to 32 rows of 16-bit
// x (four token tiles, every one summed whatever its rows, so that no
// branch keeps the mmas apart) with the weights streamed by TMA
// (gemm_stream above), a tile of 128 rows of w a block; gemm_stream8_{bf16,f16}
// the same for up to 64 rows (eight tiles) on the warpgroup tensor cores,
// two tiles of w a block sharing x's stages of 128 k (32 KiB), a ring of
// three slots a warp; gemm_stream8n_{bf16,f16} the same at one tile of w
// a block and four slots, for weights of too few rows to fill the SMs
// with two tiles a block. Grid
// (ceil(m/(128·RT)), splits of k), 128·RT threads, GS_SMEM_FOR(RT, ST, XM)
// bytes of dynamic shared memory; tmx boxes 64 k of 32 (64) rows of x, tmw
// 64 k of 32 rows of w. The portable PTX traps, as gemm_wg_bf16 does. The
// host's streamShapes (gpu/cuda) mirror the RT, ST and XM of each.
#define STREAM(NAME, T, NT, RT, ST, XM)                                                                              \
  extern "C" __global__ void __launch_bounds__(128 * RT) NAME(float* out, const uint16_t* x, const uint16_t* w,     \
                                                              int n, int k, int m, int kchunk,                     \
                                                              const __grid_constant__ wgk::TMap tmx,               \
                                                              const __grid_constant__ wgk::TMap tmw) {             \
    wgk::gemm_stream<T, NT, RT, ST, XM, NT == 8>(out, n, k, m, kchunk, &tmx, &tmw);                                  \
  }
STREAM(gemm_stream_bf16, BF16, 4, 1, 4, 1) STREAM(gemm_stream_f16, F16, 4, 1, 4, 1)
STREAM(gemm_stream8_bf16, BF16, 8, 2, 3, 2) STREAM(gemm_stream8_f16, F16, 8, 2, 3, 2)
STREAM(gemm_stream8n_bf16, BF16, 8, 1, 4, 2) STREAM(gemm_stream8n_f16, F16, 8, 1, 4, 2)

// gemm_stream8g_{bf16,f16}: gemm_stream8n's block for a gated MLP's gate|up
// weights ([2f, k], f a multiple of 64), k unsplit: out [n, f] (16-bit) =
// silu(x·gateᵀ)·(x·upᵀ) rounded to T, the down product's x (GLU above).
// Grid (f/64, 1).
#define STREAM_GLU(NAME, T, NT, RT, ST, XM)                                                                          \
  extern "C" __global__ void __launch_bounds__(128 * RT) NAME(uint16_t* out, const uint16_t* x, const uint16_t* w,  \
                                                              int n, int k, int m, int kchunk,                     \
                                                              const __grid_constant__ wgk::TMap tmx,               \
                                                              const __grid_constant__ wgk::TMap tmw) {             \
    wgk::gemm_stream<T, NT, RT, ST, XM, true, true>(out, n, k, m, kchunk, &tmx, &tmw);                               \
  }
STREAM_GLU(gemm_stream8g_bf16, BF16, 8, 1, 4, 2) STREAM_GLU(gemm_stream8g_f16, F16, 8, 1, 4, 2)
