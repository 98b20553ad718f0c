// Grouped MXFP8 GEMM for MoE, sm_90a, persistent and warp-specialised (TMA producer + 2 wgmma
// warpgroups). One kernel template, two schedules (the only difference is where tiles come from):
//
//   m-grouped (forward, dgrad):  Y[r, n] = Σ_k deq(A)[r, k] · deq(B[e])[n, k],  offsets[e] <= r < offsets[e+1]
//   k-grouped (wgrad):           dW[e][n, k] = Σ_{t = offsets[e]}^{offsets[e+1]-1} deq(dYᵀ)[n, t] · deq(Xᵀ)[k, t]
//
// and two operand forms (the mode): fast = E4M3 in the rebased 1×128 form + per-row chunk scales;
// exact = the BF16 images of the MX operands (deq rounded to BF16, exact for scale bytes 3..246:
// dequantize.h).
// Both are "NT": A [rows_a, kdim] and B [rows_b, kdim] K-major (kdim contiguous; E4M3, or BF16 in
// exact mode), read through 2-D TMA maps built on the host without reading offsets:
//   m-grouped: A = X [M_total, K] (box [128, 128 B]), B = W [E·N, K] (box [kBlockN, 128 B]), kdim = K.
//              A tile never crosses experts (segments are 128-aligned); the last N-tile's B box may
//              reach into expert e+1's rows, which only feed output columns >= N (never stored).
//   k-grouped: A = dYᵀ [N, M_total], B = Xᵀ [K, M_total], kdim = M_total (tokens); a tile sums the
//              chunks (128 tokens fast, 64 exact) of its expert's segment. Exact mode may read
//              either image token-blocked instead ([M_total/128][rows][128], ImageLayout::
//              kTokenBlocked; Params::a_blocked/b_blocked): a 3-D map {256 B, rows, M_total/128},
//              box [1, rows, 128 B], loads at (2·(t % 128) bytes, row, t / 128), landing in shared
//              memory as the 2-D box would (token_blocked_image_map, load_operand_box).
//   All boxes: 128 bytes along kdim, 128B swizzle; out-of-bounds elements are zero-filled.
// Scales (E8M0):
//   fast:  chunk-major [kdim/128 chunks, rows] — one byte per (row, 128-chunk); TMA boxes [1, 128].
//          m-grouped: A [ceil(K/128), M_total], B [E·ceil(K/128), N]; k-grouped: [M_total/128, N|K].
//   exact: none — exact mode reads BF16 images (A, B as [rows, kdim] BF16, made by
//          dequantize_mxfp8_bf16), through byte-typed maps of 2·kdim bytes per row (box [·, 128 B]
//          = 64 elements, same 128B swizzle as the FP8 boxes).
//   fast, B in 128x128 blocks (m-grouped only, kBlockB != kNone; gemm.h FastScaleLayout::kBlock128):
//          [E·ceil(K/128), pitch] with one byte per (expert, chunk, 128-row block of N), pitch =
//          fast_block_scales_pitch(N); a 192-wide n-tile (n0 = 192·j) spans blocks b0 = n0/128 and
//          b0 + 1, never three. Only blocks < ceil(N/128) are used (a tile's second block may lie
//          past N: its columns are never stored and get scale 0). The decoder warp reads the bytes
//          straight from global memory (kLdg, the default) or from a TMA box (kTma): box [1, 16] at
//          the 16-byte aligned (b0 & ~15, e·ceil(K/128) + chunk), plus the next box when b1 = b0 + 1
//          starts one (a TMA box's innermost start must be 16-byte aligned: at b0 itself, run 76's
//          illegal instruction; see BlockScalesB).
//   offsets: int32 [E+1] device, copied to shared memory once per CTA.
// Output: BF16 or FP32, row-major (m-grouped Y [M_total, N]; k-grouped dW [E, N, K]); 4/8-byte
// stores straight from the accumulator fragment, masked to the valid rows and columns; optional
// accumulate (read, add in FP32, write — each element owned by one thread, no atomics). Wide tiles
// by default through shared memory and TMA stores (OutStore::kTma, store_tile_tma); the EP layer's
// row epilogue (OutStore::kRows, store_tile_rows) sends each BF16 output row to its own address.
//
// Tiles: 128 (A rows) × kBlockN (B rows); the reduced dimension in chunks of 128 bytes per row
// (one stage: 128 E4M3 or 64 BF16). Per chunk:
//   fast:  4 × wgmma m64n128k32 into a fresh FP32 accumulator, then tot += acc · sa[row] · sb[col]
//          (DeepSeek 1×128 promotion with per-row scales on both operands). In a K-tail chunk the
//          zero-filled k-steps are issued anyway (they add exact zeros). Schedules (bitwise
//          identical results; kConfigFastPipelined):
//          pipelined (default): two accumulators in ping-pong across chunks (chunk c+1's wgmmas
//            are queued before chunk c is promoted) and scales decoded to FP32 once per stage by
//            a producer warp, so a math warp spends ~200 instructions per chunk (128 FMUL/FFMA).
//          serial: issue, wait for all, decode the scale bytes in every thread, promote (~290).
//          wide (kBlockN = 192, MXMOE_GEMM_TILE=192; off by default): 4 × m64n192k32 into one
//            accumulator per warpgroup, wait_group 0, promote (math_fast_single; 273 per chunk).
//          wide with B in 128x128 blocks (kBlockB != kNone): the same chunk, then 4 products
//            2^ea[row]·2^eb[block] and one FFMA per element (math_fast_single_block).
//   exact: 4 × wgmma m64nNk16.f32.bf16.bf16 (N = kBlockN: 256 by default, or 128) accumulating
//          straight into one FP32 accumulator that spans the whole reduction (math_exact): no
//          promotion, no scales. Chunk c+1 is issued while chunk c may still run (wait_group 1).
//          Tail chunks run on TMA's zero fill too.
//
// Warp roles (384 threads, 1 CTA/SM):
//   warpgroup 0: producer, setmaxnreg 40 (uses 35). Thread 0 issues TMA; in pipelined fast mode
//                warp 1 decodes each stage's scale bytes (uses 30).
//   warpgroups 1, 2: math, setmaxnreg 232. Each owns 64 rows: fast serial acc 64 + tot 64 + 32
//                scale regs (ptxas: up to R207); fast pipelined 2 × acc 64 + tot 64 (up to R229);
//                fast wide acc 96 + tot 96 (up to R225); exact acc 128 (256 wide: up to R151) or
//                acc 64 (128 wide: up to R101). No spills.
// Pipeline: kNumStages × [A 16 KB | B kBlockN·128 B | fast scales (| decoded scales)]; full barrier
// = TMA tx, empty barrier = one arrival per math warp, ready barrier (pipelined fast only) = 32
// decoder-lane arrivals.
// Optional 2-CTA multicast (fast mode, kMulticast; off by default): clusters of two CTAs on tiles
// that share A, each loading half of A for both; the empty barriers then span the cluster. See
// "2-CTA multicast" above the kernel for the barrier invariants.
//
// Roofline: FLOPs = 2·M·N·K; fewest bytes = M·K + E·N·K (+1/128 for fast scales; ×2 for exact
// mode's BF16 images) + output. Every model shape in docs/notes/gemm.md is compute-bound (>= 395
// FLOP/byte in FP8, half that in BF16). Ceilings: FP8 dense ~1250 TFLOP/s (fast); BF16 dense ~670
// (exact; docs/notes/gemm.md, "Exact mode on a BF16 image").
// Per SM and 128-chunk of a 128×128 tile the tensor core needs 512 cycles at peak; each of the
// 4 schedulers must issue the instructions of 2 math warps in that time: serial 2 × 287 (issue-
// bound), pipelined 2 × 199 (docs/notes/gemm.md, "Fast mode schedule").
// Tests: tests/gpu/test_gemm_gpu.cpp, tests/cpu/test_gemm_ref.cpp. Bench: bench/bench_gemm.py.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "host/check.h"
#include "host/kernel_attr.h"
#include "kernels/gemm/tensor_map.h"
#include "mxmoe/gemm.h"

#include "device/barrier_cluster.cuh"
#include "device/cp_async_bulk.cuh"
#include "device/cp_async_bulk_tensor.cuh"
#include "device/cp_reduce_async_bulk_tensor.cuh"
#include "device/mapa.cuh"
#include "device/mbarrier.cuh"
#include "device/named_barrier.cuh"
#include "device/setmaxnreg.cuh"
#include "device/wgmma_mma_async.cuh"

#ifndef MXMOE_GEMM_PRELOAD_QUADS
#define MXMOE_GEMM_PRELOAD_QUADS 4
#endif

namespace mxmoe::gemm_sm90 {

constexpr int kBlockM = 128;
constexpr int kBlockK = 128;        // bytes of a stage row along the reduced dimension (TMA box, 128B swizzle)
constexpr int kMxK = 32;            // one MX block, one FP8 wgmma k-step
constexpr int kKSteps = kBlockK / kMxK;  // wgmma k-steps per stage row (FP8 k32 or BF16 k16: 32 bytes each)
constexpr int kExactChunkK = 64;    // exact mode: BF16 elements per stage row (128 bytes)

// Elements of the reduced dimension per stage ("chunk"): one fast-mode scale chunk of 128 E4M3, or
// 64 BF16 in exact mode — 128 bytes per row either way.
template <bool kExact>
constexpr int chunk_k() { return kExact ? kExactChunkK : kBlockK; }
static_assert(kKSteps * 16 == kExactChunkK, "BF16: four k16 steps per 128-byte row");
constexpr int kNumMathWarpgroups = 2;
constexpr int kNumThreads = 128 * (1 + kNumMathWarpgroups);
constexpr int kProducerRegs = 40;
constexpr int kMathRegs = 232;
constexpr int kMaxExperts = 512;    // == mxmoe::kMaxGemmExperts
constexpr int kGroupM = 8;          // m-tiles per raster band

static_assert(kProducerRegs * 128 + kMathRegs * 128 * kNumMathWarpgroups <= 65536,
              "register file: producer + math warpgroups");
static_assert(kBlockM == 64 * kNumMathWarpgroups, "each math warpgroup owns 64 rows");

// Run-time problem description shared by both groupings. "Rows" are the rows of the A and B
// tiles (the M and N of the output tile); "kdim" is the contiguous, reduced dimension.
struct Params {
  const int32_t* offsets;   // [E+1] device: segment bounds (rows for m-grouped, tokens for k-grouped)
  void* y;                  // output; OutStore::kRows: the row table, void* const [m_tiles_cap · 128]:
                            // the address of output row r's column 0, or null (not stored). (A field
                            // of its own changed the other kernels' SASS: the Params layout shapes
                            // their parameter loads.)
  int num_experts;
  int n, k;                 // m-grouped: N, K. k-grouped: N, K of dW[e] [N, K]
  int kdim;                 // reduced length: K (m-grouped) or M_total (k-grouped)
  union {                   // (one slot, so the struct's layout and the kernels' parameter loads stay as they were)
    int m_tiles_cap;        // m-grouped: M_total / 128
    int k_raster_group;     // k-grouped: G | (min_chunks << 16): an expert with >= 128·min_chunks tokens is
                            // walked in groups of G n-tiles, the others n-major (KGroupedScheduler)
  };
  bool accumulate;          // k-grouped: y += result (read, add, write; no atomics)
  bool sort_experts;        // k-grouped: walk the experts by token count, largest first (k_grouped_expert_order)
  bool a_blocked, b_blocked;  // k-grouped exact: A's / B's image is token-blocked (3-D map and loads;
                              // in the struct's tail padding, so the other fields keep their offsets)
  // B's 128x128-block scale bytes [E·ceil(K/128), fast_block_scales_pitch(n)] for the kLdg decoder
  // (BlockScalesB); null otherwise. Last, so that every other field keeps its offset.
  const uint8_t* b_block_scales;
};

// Where a math warpgroup's finished tile goes (a template parameter of the kernel):
//   kDirect: store_tile, 4/8-byte stores from the fragment;
//   kTma:    store_tile_tma, swizzled boxes in shared memory, TMA tensor stores (wide tiles);
//   kRows:   store_tile_rows, row-contiguous staging, one 1-D bulk copy per row to row_dst[r]
//            (wide tiles, m-grouped, BF16 without accumulate): the EP layer's fused combine.
enum class OutStore : int { kDirect = 0, kTma = 1, kRows = 2 };

// One output tile as the roles see it: where its operands are, how many chunks (stages of
// chunk_k() elements) of the reduced dimension it sums, where its result goes.
struct Tile {
  int a_row, b_row;            // TMA row coordinates of the [128, 128 B] A and [kBlockN, 128 B] B boxes
  int k0;                      // element coordinate of chunk 0 along kdim
  int num_chunks;              // chunks to reduce (may be 0: the tile is all zeros)
  int sa_x, sa_y0, sb_x, sb_y0;  // fast scales: boxes at (x, y0 + chunk)
  int64_t out_offset;          // element offset of the tile's (0, 0) in y
  int out_ld;                  // row stride of y (elements)
  int out_rows_valid, out_cols_valid;  // <= 0: nothing of the tile is stored (a phantom tile)
  bool b_shared;               // m-grouped exact pairs (kPairM): both tiles of the pair read one expert's B
};

// kExact: the stage holds BF16 images (64 elements per 128-byte row) and no scales.
// kPipelined (fast mode only): adds, per stage, the decoded fast scales (FP32, in the order the
// math threads read them) and a "scales ready" barrier; see decode_fast_scales / math_fast_pipelined.
// kOutStage (bytes, 0 = none): the TMA-store epilogue's staging of the output tile, appended after
// everything else (1024-aligned for the 128B swizzle), so the other offsets do not move.
// How B's fast scales reach the decoder (a kernel template parameter):
//   kNone: the 1x128 form, a [1, kBlockN] TMA box per stage (every kernel but the block ones).
//   B in 128x128 blocks (gemm.h FastScaleLayout::kBlock128; MXMOE_GEMM_BLOCK_SCALES_LOAD, read per call):
//   kLdg (default): the decoder warp's lanes 0, 1 read the tile's two block bytes from global memory
//     (Params::b_block_scales, ld.global.nc); the producer loads no B scales.
//   kTma: [1, kBlockScaleBox] boxes into the B scale slot: at block x0 = b0 & ~15 (slot bytes
//     0..15) and, when b0 % 16 == 15 and block b0 + 1 is used, at x0 + 16 (slot bytes 128..143; TMA
//     destinations are 128-aligned). Why aligned: a tensor copy's box must start at a 16-byte
//     aligned global address along the innermost dimension, or the TMA unit raises an illegal
//     instruction (found by Triton's maintainers, triton-lang/triton#7385 and #8657, and stated in
//     their Gluon TMA tutorial; not in the CUDA docs read here). Session 10 loaded the
//     box at b0 = n0/128 itself (1 for the tile at n0 = 192): runs 76 and 77 died with
//     cudaErrorIllegalInstruction on the first launch. Every other box of this file starts at a
//     multiple of 16 bytes (rows of 128, columns of 64 or 192 elements, k in 128-byte chunks).
// Both give the decoder the same bytes, hence the same floats and output bits (GemmGpu test).
enum class BlockScalesB : int { kNone = 0, kTma = 1, kLdg = 2 };
// kBlockScalesB (SmemLayout): B's fast scales are 128x128-block bytes. The decoded floats of the
// tile's two blocks sit at the start of the decoded B slot; every offset stays that of the 1x128
// form, and kTxBytes leaves out B's scales (the kTma producer adds its boxes' bytes per stage).
constexpr int kBlockScaleBox = 16;  // bytes of one B block-scale box (TMA: 16-byte multiples)
template <int kBlockN, int kNumStages, bool kExact, bool kPipelined = false, int kOutStage = 0,
          bool kBlockScalesB = false>
struct SmemLayout {
  static constexpr int kTileA = kBlockM * kBlockK;  // [128, 128] fp8 or [128, 64] bf16, 128B swizzle
  static constexpr int kTileB = kBlockN * kBlockK;  // [kBlockN, 128] fp8 or [kBlockN, 64] bf16, 128B swizzle
  static constexpr int kScaleA = kExact ? 0 : kBlockM;  // fast u8 [128]
  // fast u8 [N], its slot rounded up to 128 bytes (TMA destination alignment)
  static constexpr int kScaleB = kExact ? 0 : (kBlockN + 127) / 128 * 128;
  static constexpr int kScaleAF = kPipelined ? kBlockM * 4 : 0;           // f32 [128], row pairs (r, r+8)
  static constexpr int kScaleBF = kPipelined ? kBlockN * 4 : 0;           // f32 [kBlockN], column quads
  static constexpr int kOffA = 0;
  static constexpr int kOffB = kOffA + kNumStages * kTileA;
  static constexpr int kOffScaleA = kOffB + kNumStages * kTileB;
  static constexpr int kOffScaleB = kOffScaleA + kNumStages * kScaleA;
  static constexpr int kOffScaleAF = kOffScaleB + kNumStages * kScaleB;
  static constexpr int kOffScaleBF = kOffScaleAF + kNumStages * kScaleAF;
  static constexpr int kOffBarriers = kOffScaleBF + kNumStages * kScaleBF;
  static constexpr int kNumBarriers = (kPipelined ? 3 : 2) * kNumStages;  // full, empty (, ready)
  static constexpr int kOffOffsets = kOffBarriers + kNumBarriers * 8;
  // k-grouped: the order in which the schedule walks the experts, u16 [kMaxExperts], right after
  // the offsets (KGroupedScheduler finds it there).
  static constexpr int kOffOrder = kOffOffsets + (kMaxExperts + 1) * 4;
  static constexpr int kOffOut = kOutStage == 0 ? kOffOrder + kMaxExperts * 2
                                                : (kOffOrder + kMaxExperts * 2 + 1023) / 1024 * 1024;
  static constexpr int kBytes = kOffOut + kOutStage;
  static constexpr int kAlloc = kBytes + 1024;  // slack to align the base to 1024 B (swizzle atoms)
  static constexpr uint32_t kTxBytes =
      kTileA + kTileB + (kExact ? 0 : kScaleA + (kBlockScalesB ? 0 : kBlockN));

  static_assert(kBlockN % 64 == 0 && kBlockN <= 256, "kBlockN: multiple of 64, TMA box <= 256");
  static_assert(kTileA % 1024 == 0 && kTileB % 1024 == 0, "swizzled tiles stay 1024-aligned");
  static_assert(kScaleA % 128 == 0 && kScaleB % 128 == 0, "TMA destinations 128-aligned");
  static_assert(!kPipelined || !kExact, "the pipelined schedule is fast mode's");
  static_assert(!kBlockScalesB || (!kExact && kBlockN > 128), "block scales: the wide fast kernel");
  static_assert(kOffScaleAF % 16 == 0 && kOffScaleBF % 16 == 0, "decoded scales: 16-byte vector loads");
  static_assert(kOffBarriers % 8 == 0, "mbarriers 8-aligned");
  static_assert(kAlloc <= 232448, "227 KB of shared memory per CTA");
};

// Fast-mode decode on the math warps' critical path: 2^(byte-127) for bytes 1..254, with byte 0
// read as 0 (not 2^-127: only all-zero blocks, pad rows and zero-filled tails have it, unless a
// block's amax is below 448·2^-127 ≈ 2.6e-36) and 0xFF as +Inf (its chunk's data are NaN, so the
// product stays NaN). Two integer ops instead of four.
__device__ __forceinline__ float e8m0_to_float_fast(uint32_t byte_in_low_bits) {
  return __uint_as_float((byte_in_low_bits & 0xFFu) << 23);
}

// m-grouped schedule (forward, dgrad): tiles (m-tile, n-tile) over the segments, identical in
// every role of every CTA (a pure function of the offsets in shared memory).
// kPair = 2 (2-CTA cluster, A multicast): linear tiles 2u and 2u + 1 are n-tiles 2q and 2q + 1 of
// one m-tile, so the two CTAs of a cluster (blockIdx.x = 2c, 2c + 1, stepping by the even
// gridDim.x) always share A rows and the number of chunks. The n-tile count is rounded up to
// even: an odd last n-tile gets a phantom partner (n0 >= N: B and its scales read zero fill or
// the next expert's rows, every output column is >= N so nothing is stored) that still takes part
// in every barrier. kPair = 1 is the plain schedule.
// kPairM (with kPair = 2; exact mode's clusters, B multicast): linear tiles 2u and 2u + 1 are instead
// m-tiles 2q and 2q + 1 of one band and one n-tile, so the two CTAs of a cluster read the same B
// rows whenever both m-tiles belong to one expert (Tile::b_shared; m-tiles never straddle experts,
// whose segments are padded to 128 rows, but a pair can). A band with an odd m-tile count ends in a
// phantom partner: it computes its partner's tile again (same A rows, same B) and stores nothing
// (out_rows_valid = 0), so that it takes part in every barrier.
// kChunkK: elements of K per stage (chunk_k()).
template <int kBlockN, int kPair = 1, int kChunkK = kBlockK, bool kPairM = false>
struct MGroupedScheduler {
  static_assert(kPair == 1 || kPair == 2, "pairs of tiles at most");
  static_assert(!kPairM || kPair == 2, "kPairM pairs m-tiles");
  static_assert(kGroupM % 2 == 0, "kPairM: whole pairs in every full band");
  static constexpr bool kIsKGrouped = false;
  const int32_t* s_off;
  const Params* p;
  int m_tile_begin, num_m_tiles, num_n_units, num_tiles, num_kc;
  __device__ int b_rows() const { return p->n; }  // rows of one B matrix (the block form's row blocks)

  __device__ MGroupedScheduler(const int32_t* s_off_, const Params& p_) : s_off(s_off_), p(&p_) {
    m_tile_begin = s_off[0] / kBlockM;
    const int m_tile_end = min(s_off[p_.num_experts] / kBlockM, p_.m_tiles_cap);
    num_m_tiles = max(0, m_tile_end - m_tile_begin);
    if constexpr (kPairM) {  // pairs of m-tiles: kGroupM / 2 per full band, the last band rounded up
      num_n_units = (p_.n + kBlockN - 1) / kBlockN;
      const int rem = num_m_tiles % kGroupM;
      num_tiles = 2 * ((num_m_tiles / kGroupM) * (kGroupM / 2) + (rem + 1) / 2) * num_n_units;
    } else {
      num_n_units = ((p_.n + kBlockN - 1) / kBlockN + kPair - 1) / kPair;  // n-tiles, or pairs of them
      num_tiles = num_m_tiles * num_n_units * kPair;
    }
    // host checks (m_tiles_cap + 1) · (num_n_units · kPair) < 2^31
    num_kc = (p_.k + kChunkK - 1) / kChunkK;
  }

  // Largest e in [0, E) with off[e] <= row (skips empty experts).
  __device__ int expert_of_row(int row) const {
    int lo = 0, hi = p->num_experts - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (s_off[mid] <= row) lo = mid; else hi = mid - 1;
    }
    return lo;
  }

  // Bands of kGroupM m-tiles; inside a band m runs fastest (then the n-unit; with kPair = 2 the
  // pair member fastest of all), so concurrent CTAs share A rows and one expert's B.
  __device__ Tile tile(int t) const {
    const int u = t / kPair, member = t % kPair;  // kPair = 1: u = t, member = 0
    constexpr int kUnitsM = kPairM ? kGroupM / 2 : kGroupM;  // m-units (m-tiles or pairs of them) a band
    const int per_band = kUnitsM * num_n_units;
    const int band = u / per_band;
    const int r = u - band * per_band;
    const int m0 = band * kGroupM;
    int m_tile, n_tile;
    bool phantom = false, b_shared = false;
    if constexpr (kPairM) {
      const int pairs_in_band = min(kUnitsM, (num_m_tiles - m0 + 1) / 2);
      const int m_first = m0 + 2 * (r % pairs_in_band);  // the pair's first m-tile
      n_tile = r / pairs_in_band;
      phantom = m_first + 1 >= num_m_tiles && member == 1;
      m_tile = m_tile_begin + m_first + (phantom ? 0 : member);
      b_shared = m_first + 1 >= num_m_tiles ||
                 expert_of_row((m_tile_begin + m_first) * kBlockM) == expert_of_row((m_tile_begin + m_first + 1) * kBlockM);
    } else {
      const int rows_in_band = min(kGroupM, num_m_tiles - m0);
      m_tile = m_tile_begin + m0 + r % rows_in_band;
      n_tile = (r / rows_in_band) * kPair + member;
    }
    const int row0 = m_tile * kBlockM, n0 = n_tile * kBlockN;
    const int e = expert_of_row(row0);
    Tile x;
    x.b_shared = b_shared;
    x.a_row = row0;
    x.b_row = e * p->n + n0;  // may reach into expert e+1's rows: only columns >= N, never stored
    x.k0 = 0;
    x.num_chunks = num_kc;
    x.sa_x = row0;
    x.sa_y0 = 0;
    x.sb_x = n0;
    x.sb_y0 = e * num_kc;
    x.out_offset = int64_t(row0) * p->n + n0;
    x.out_ld = p->n;
    x.out_rows_valid = phantom ? 0 : kBlockM;
    x.out_cols_valid = p->n - n0;
    return x;
  }
};

// The k-grouped schedule walks expert by expert (the CTAs share one expert's operand panels in
// L2). With skewed routing a few experts hold most tokens: their tiles reduce over long token
// ranges, and in index order the hot experts start at staggered times on different CTAs (each
// wave of a hot expert leaves a partial wave, whose CTAs move on a whole hot tile early), so the
// CTAs walk different token ranges of the same panels and L2 stops sharing them (ncu, run 57:
// Qwen3-235B gate-up exact skewed read 40.5 GB from DRAM at a 50% L2 hit rate against 7.2 GB and
// 84% uniform). Largest experts first keeps their waves aligned from the start and leaves the short
// tiles for the tail. ord[i] = the i-th expert to walk: by token count descending, ties by index
// (uniform routing: the index order); p.sort_experts == false: the index order. All threads of the
// CTA; the caller synchronises before the schedule reads ord. Results do not depend on the order.
__device__ __forceinline__ int k_grouped_tokens(const int32_t* s_off, int e, int kdim) {
  const int t0 = min(s_off[e], kdim);
  return min(max(s_off[e + 1], t0), kdim) - t0;
}
__device__ __forceinline__ void k_grouped_expert_order(const int32_t* s_off, const Params& p, uint16_t* ord,
                                                       int tid, int nthreads) {
  const int E = p.num_experts;
  for (int e = tid; e < E; e += nthreads) {
    int rank = e;
    if (p.sort_experts) {
      const int ce = k_grouped_tokens(s_off, e, p.kdim);
      rank = 0;
      for (int j = 0; j < E; ++j) {
        const int cj = k_grouped_tokens(s_off, j, p.kdim);
        rank += (cj > ce) || (cj == ce && j < e);
      }
    }
    ord[rank] = uint16_t(e);
  }
}

// k-grouped schedule (wgrad): dW[e] [N, K] = Σ_{t in segment e} dYᵀ[:, t] · Xᵀ[:, t]ᵀ. A = dYᵀ
// [N, M_total] and B = Xᵀ [K, M_total] are K-major along tokens; tiles (e, n-tile, k-tile), expert
// by expert (in the order k_grouped_expert_order gives: largest token count first) so that
// concurrent CTAs share one segment of both operands. Chunks of kChunkK tokens
// (128 fast, 64 exact) never cross experts (segments are 128-aligned). An empty expert's tiles
// reduce nothing and store zeros.
// kPair = 2 (2-CTA cluster, A multicast): the k-tile count is rounded up to even, so linear tiles
// 2u, 2u + 1 are k-tiles 2q, 2q + 1 of one (e, n-tile): the cluster shares A (dYᵀ rows) and the
// segment, hence the chunk count. A phantom k-tile (k0 >= K) reads zero fill and stores nothing.
// Within an expert (kPair = 1): p.k_raster_group = G > 0 walks the tiles in groups of G n-tiles,
// k-tile by k-tile with the n-tile fastest, so the ~#SM tiles in flight cover G n-tiles × ~#SM/G
// k-tiles (rows of both operands: 128·G + kBlockN·#SM/G) instead of ~#SM/k-tiles n-tiles × every
// k-tile (run 69: DSV3 gate-up exact at 8192 tokens an expert read 55 GB from DRAM for 5.9 GB of
// operands, each wave streaming the expert's whole Xᵀ, 117 MB, through the L2). G = 0: n-major, k-tile
// fastest (before session 9). Only experts with at least 128·min_chunks tokens take the groups
// (k_grouped_raster_group). Which CTA computes which tile changes, not what a tile computes.
template <int kBlockN, int kPair = 1, int kChunkK = kBlockK>
struct KGroupedScheduler {
  static_assert(kPair == 1 || kPair == 2, "pairs of k-tiles at most");
  static constexpr bool kIsKGrouped = true;
  const int32_t* s_off;
  const uint16_t* s_ord;  // the walk order of the experts (k_grouped_expert_order), after s_off in shared memory
  const Params* p;
  int num_n_tiles, num_k_tiles, num_tiles;
  __device__ int b_rows() const { return p->k; }  // rows of Xᵀ (the block form's row blocks)

  __device__ KGroupedScheduler(const int32_t* s_off_, const Params& p_)
      : s_off(s_off_), s_ord(reinterpret_cast<const uint16_t*>(s_off_ + kMaxExperts + 1)), p(&p_) {
    num_n_tiles = (p_.n + kBlockM - 1) / kBlockM;
    num_k_tiles = ((p_.k + kBlockN - 1) / kBlockN + kPair - 1) / kPair * kPair;
    num_tiles = p_.num_experts * num_n_tiles * num_k_tiles;  // host checks < 2^31
  }

  __device__ Tile tile(int t) const {
    const int per_e = num_n_tiles * num_k_tiles;
    const int slot = t / per_e;
    const int e = s_ord[slot];
    const int r = t - slot * per_e;
    int n_tile, k_tile;
    const int t0 = min(s_off[e], p->kdim), t1 = min(max(s_off[e + 1], t0), p->kdim);
    int g = kPair == 1 ? p->k_raster_group & 0xFFFF : 0;
    if (t1 - t0 < (p->k_raster_group >> 16) * kBlockK) g = 0;  // a short expert: n-major
    if (g > 0) {
      const int group = r / (g * num_k_tiles), in = r - group * (g * num_k_tiles);
      const int width = min(g, num_n_tiles - group * g);  // n-tiles in this group (the last may be short)
      k_tile = in / width;
      n_tile = group * g + (in - k_tile * width);
    } else {
      n_tile = r / num_k_tiles;
      k_tile = r - n_tile * num_k_tiles;
    }
    const int n0 = n_tile * kBlockM, k0 = k_tile * kBlockN;
    Tile x;
    x.b_shared = false;
    x.a_row = n0;
    x.b_row = k0;
    x.k0 = t0;
    x.num_chunks = (t1 - t0) / kChunkK;
    x.sa_x = n0;
    x.sa_y0 = t0 / kBlockK;
    x.sb_x = k0;
    x.sb_y0 = t0 / kBlockK;
    x.out_offset = (int64_t(e) * p->n + n0) * p->k + k0;
    x.out_ld = p->k;
    x.out_rows_valid = p->n - n0;
    x.out_cols_valid = p->k - k0;
    return x;
  }
};

// Position of one stage slot in the ring: stage index and the parity of its current phase.
template <int kNumStages>
struct PipeState {
  int s = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++s == kNumStages) { s = 0; phase ^= 1u; }
  }
};

// Slots of the decoded fast scales (pipelined schedule), chosen so that a math thread reads its
// scales with one vector load per row pair and per column quad (see wgmma_mma_async.cuh for the
// fragment):
//   A, row r:    2·((r/16)·8 + r%8) + (r/8)%2  -> rows r, r + 8 (r%16 < 8) are one float2.
//   B, column n: 16·(n/16) + 4·((n%8)/2) + 2·((n/8)%2) + n%2  -> columns 16m + 2q + {0, 1, 8, 9}
//                (q = lane%4: fragment pairs j = 2m and 2m + 1) are one float4 at 16m + 4q.
// Both are permutations within every aligned group of 16 (resp. 32) entries, so the decoder's
// 32 lanes store without bank conflicts, and the math loads are conflict-free broadcasts.
__device__ __forceinline__ int scale_a_slot(int r) { return 2 * ((r >> 4) * 8 + (r & 7)) + ((r >> 3) & 1); }
__device__ __forceinline__ int scale_b_slot(int n) {
  return (n & ~15) + ((n & 7) >> 1) * 4 + ((n >> 3) & 1) * 2 + (n & 1);
}

// Pipelined fast mode, producer warp 1: once stage s has landed, turn its E8M0 scale bytes into
// FP32 (the same e8m0_to_float_fast values the serial schedule computes in every math thread) in
// the slots above, then arrive on ready[s]. This takes ~110 integer/LDS instructions per chunk off
// each of the 8 math warps (measured in the serial schedule's SASS) for ~30 on one producer warp.
// Invariants: every chunk of every tile passes stage s in the same order for every role, so
// ready[s] completes exactly one phase per pass, in lockstep with full[s]. The decoder cannot be
// lapped on full[s] (its next phase needs empty[s], i.e. all math warps past ready[s] of this
// pass), and it overwrites stage s's decoded floats only after that same empty[s] completion
// (full[s] of the next pass follows the producer's wait on empty[s]), so no math warp still reads
// them.
// B in 128x128 blocks (kBlockB != kNone, see BlockScalesB): lanes 0 and 1 decode the bytes of the
// tile's blocks b0 = n0/128 and b0 + 1 into decoded B slots 0 and 1; a block >= ceil(N/128) (only
// ever the second, whose columns are >= N) decodes as 0 without being read. kLdg: the lane loads its
// byte from global memory before waiting on full[s] (the load does not depend on the stage, so its
// latency overlaps the wait); kTma: from the stage's box (block_scale_slot).
__device__ __forceinline__ int fast_block_scales_pitch_dev(int n) { return ((n + 127) / 128 + 15) / 16 * 16; }
// Byte of block b in the kTma B scale slot of a tile whose first block is b0 (BlockScalesB::kTma).
__device__ __forceinline__ int block_scale_slot(int b, int b0) {
  const int i = b - (b0 & ~15);  // 0..16
  return i < kBlockScaleBox ? i : 128 + (i - kBlockScaleBox);
}
template <int kBlockN, int kNumStages, BlockScalesB kBlockB = BlockScalesB::kNone, class Scheduler>
__device__ __forceinline__ void decode_fast_scales(uint8_t* smem, const Scheduler& sched,
                                                   uint64_t* full, uint64_t* ready) {
  using L = SmemLayout<kBlockN, kNumStages, false, true>;
  const int lane = threadIdx.x % 32;
  PipeState<kNumStages> at;
  for (int t = blockIdx.x; t < sched.num_tiles; t += gridDim.x) {
    const Tile x = sched.tile(t);
    const int num_chunks = x.num_chunks;
    // block form: this lane's block (lanes 0, 1 only) and whether it holds columns < N
    int b0 = 0, b = 0;
    bool b_used = false;
    if constexpr (kBlockB != BlockScalesB::kNone) {
      b0 = x.sb_x / 128;  // sb_x = n0 (m-grouped) or k0 (k-grouped): the tile's first B row
      b = b0 + (lane & 1);
      b_used = lane < 2 && b < (sched.b_rows() + 127) / 128;
    }
    for (int c = 0; c < num_chunks; ++c) {
      uint32_t vb_block = 0;  // block form: this lane's byte (0 where unused)
      if constexpr (kBlockB == BlockScalesB::kLdg) {
        const int64_t row = x.sb_y0 + c;  // m-grouped e·ceil(K/128) + chunk; k-grouped the token chunk
        if (b_used) vb_block = __ldg(sched.p->b_block_scales + row * fast_block_scales_pitch_dev(sched.b_rows()) + b);
      }
      device::mbarrier_wait_parity(&full[at.s], at.phase);  // acquire: TMA's scale bytes
      const uint8_t* sa8 = smem + L::kOffScaleA + at.s * L::kScaleA;              // [128] u8
      const uint8_t* sb8 = smem + L::kOffScaleB + at.s * L::kScaleB;              // [kBlockN] u8
      float* saf = reinterpret_cast<float*>(smem + L::kOffScaleAF + at.s * L::kScaleAF);  // [128] f32
      float* sbf = reinterpret_cast<float*>(smem + L::kOffScaleBF + at.s * L::kScaleBF);  // [kBlockN] f32
      // All loads first (the byte loads may alias the float stores, so the compiler would not
      // hoist them): one shared-memory latency per chunk instead of one per value.
      uint32_t va[kBlockM / 32];
#pragma unroll
      for (int i = 0; i < kBlockM / 32; ++i) va[i] = sa8[lane + 32 * i];
      if constexpr (kBlockB != BlockScalesB::kNone) {
        if constexpr (kBlockB == BlockScalesB::kTma) {
          if (b_used) vb_block = sb8[block_scale_slot(b, b0)];
        }
#pragma unroll
        for (int i = 0; i < kBlockM / 32; ++i) saf[scale_a_slot(lane + 32 * i)] = e8m0_to_float_fast(va[i]);
        if (lane < 2) sbf[lane] = e8m0_to_float_fast(vb_block);
      } else {
        uint32_t vb[kBlockN / 32];
#pragma unroll
        for (int i = 0; i < kBlockN / 32; ++i) vb[i] = sb8[lane + 32 * i];
#pragma unroll
        for (int i = 0; i < kBlockM / 32; ++i) saf[scale_a_slot(lane + 32 * i)] = e8m0_to_float_fast(va[i]);
#pragma unroll
        for (int i = 0; i < kBlockN / 32; ++i) sbf[scale_b_slot(lane + 32 * i)] = e8m0_to_float_fast(vb[i]);
      }
      device::mbarrier_arrive(&ready[at.s]);  // one of 32 arrivals; release: this lane's stores
      at.advance();
    }
  }
}

// kMulticast (2-CTA cluster; see "2-CTA multicast" at the kernel), fast mode: the pair shares the A
// tile; this CTA (cluster rank `rank`) loads A rows [64·rank, 64·rank + 64) of the tile with one
// multicast TMA (box [64, 128]) into both CTAs' stage s at the same offset, signalling both CTAs'
// full[s]; B and both scale boxes stay local. Exact mode (m-grouped): the pair shares the B tile
// (Tile::b_shared; MGroupedScheduler kPairM): this CTA loads B rows [kBlockN/2·rank, +kBlockN/2)
// into both CTAs, A stays local; a pair whose m-tiles belong to two experts (b_shared false) loads
// both halves of its own B locally, so every full[s] counts the same bytes either way. Each full[s]
// still expects kTxBytes per pass. empty[s] is then a cluster barrier (both CTAs' math warps
// arrive), waited with acquire at cluster scope because the partner's consumers release the stage
// that this CTA's multicast overwrites in the partner's shared memory.
// kExact: A and B are BF16 images read through byte-typed maps (2 bytes per element), so the TMA
// coordinate along kdim is in bytes; there are no scales to load. k-grouped exact: an operand with
// a token-blocked image (Params::a_blocked / b_blocked) is loaded by load_operand_box's 3-D form.
//
// One operand box at byte coordinate kc along kdim and row `row`. kMayBeBlocked (k-grouped exact
// kernels only; every other kernel compiles the 2-D load alone) and `blocked`: the token-blocked
// image's 3-D map, coordinates (kc % 256, row, kc / 256), i.e. (2·(t % 128) bytes, row, t / 128)
// for token t = kc / 2. A chunk is 64 tokens = 128 bytes starting at a multiple of 64 tokens (the
// segments start at multiples of 128), so kc % 256 is 0 or 128 and the box never leaves its
// 128-token block.
template <bool kMayBeBlocked>
__device__ __forceinline__ void load_operand_box(void* smem_dst, const CUtensorMap* map, uint64_t* bar, int kc,
                                                 int row, bool blocked) {
  if constexpr (kMayBeBlocked) {
    if (blocked) {
      device::cp_async_bulk_tensor_3d_global_to_shared(smem_dst, map, bar, kc & 255, row, kc >> 8);
      return;
    }
  }
  device::cp_async_bulk_tensor_2d_global_to_shared(smem_dst, map, bar, kc, row);
}

// kBlockB (m-grouped, fast; BlockScalesB): kLdg loads no B scales (the decoder reads them from
// global memory); kTma loads B's block-scale box at the 16-byte aligned block (x.sb_x / 128) & ~15
// and, when the tile's second block starts the next box and is used, that box too (expect_tx counts
// the boxes loaded).
template <int kBlockN, int kNumStages, bool kExact, bool kMulticast, BlockScalesB kBlockB = BlockScalesB::kNone,
          class Scheduler>
__device__ __forceinline__ void producer(const CUtensorMap* tm_a, const CUtensorMap* tm_b,
                                         const CUtensorMap* tm_sa, const CUtensorMap* tm_sb,
                                         uint8_t* smem, const Scheduler& sched, uint64_t* full,
                                         uint64_t* empty, uint32_t rank) {
  constexpr bool kBlockScalesB = kBlockB != BlockScalesB::kNone;
  using L = SmemLayout<kBlockN, kNumStages, kExact, false, 0, kBlockScalesB>;
  static_assert(!kBlockScalesB || L::kScaleB >= 128 + kBlockScaleBox, "kTma: the second box at slot byte 128");
  constexpr int kHalfA = kBlockM / 2;  // A rows each CTA of a fast multicast pair loads
  constexpr int kHalfB = kBlockN / 2;  // B rows each CTA of an exact multicast pair loads
  constexpr int kChunkK = chunk_k<kExact>(), kElemBytes = kExact ? 2 : 1;
  constexpr bool kMayBeBlocked = kExact && Scheduler::kIsKGrouped && !kMulticast;
  static_assert(!kMayBeBlocked || (kChunkK * kElemBytes == kBlockK && 2 * kImageBlockCols % kBlockK == 0),
                "token-blocked images: a chunk's 128 bytes lie inside one 256-byte token block");
  const bool lead = threadIdx.x == 0;
  if (!lead) return;  // one thread does everything
  bool a_blocked = false, b_blocked = false;
  if constexpr (kMayBeBlocked) {
    a_blocked = sched.p->a_blocked;
    b_blocked = sched.p->b_blocked;
  }
  if (lead) {  // (always true here; this shape keeps fast mode's SASS as measured)
    device::prefetch_tensormap(tm_a);
    device::prefetch_tensormap(tm_b);
    if (!kExact) {
      device::prefetch_tensormap(tm_sa);
      if (kBlockB != BlockScalesB::kLdg) device::prefetch_tensormap(tm_sb);  // kLdg: tm_sb unused
    }
  }
  int s = 0;
  uint32_t phase = 0;
  for (int t = blockIdx.x; t < sched.num_tiles; t += gridDim.x) {
    const Tile x = sched.tile(t);
    // kTma: the aligned first box's block and whether the tile's second block needs the next box
    int box_x = 0;
    bool second_box = false;
    if constexpr (kBlockB == BlockScalesB::kTma) {
      const int b0 = x.sb_x / 128;  // sb_x = the tile's first B row (n0, or k0 when k-grouped)
      box_x = b0 & ~15;             // box_x <= b0 < ceil(rows/128) <= pitch (16 | both): box_x + 16 <= pitch
      second_box = (b0 & 15) == 15 && b0 + 1 < (sched.b_rows() + 127) / 128;  // then box_x + 32 <= pitch
    }
    uint32_t tx_bytes = L::kTxBytes;
    if constexpr (kBlockB == BlockScalesB::kTma) tx_bytes += second_box ? 2 * kBlockScaleBox : kBlockScaleBox;
    for (int c = 0; c < x.num_chunks; ++c) {
      device::mbarrier_wait_parity(&empty[s], phase ^ 1u);
      uint8_t* sa = smem + L::kOffScaleA + s * L::kScaleA;
      uint8_t* sb = smem + L::kOffScaleB + s * L::kScaleB;
      if (lead) {
        device::mbarrier_arrive_expect_tx(&full[s], tx_bytes);
        const int kc = (x.k0 + c * kChunkK) * kElemBytes;  // bytes along kdim
        if constexpr (kMulticast && kExact) {  // A local; [kBlockN/2, 128] halves of B
          uint8_t* b_tile = smem + L::kOffB + s * L::kTileB;
          device::cp_async_bulk_tensor_2d_global_to_shared(smem + L::kOffA + s * L::kTileA, tm_a, &full[s], kc,
                                                           x.a_row);
          if (x.b_shared) {  // this CTA's half into both CTAs
            device::cp_async_bulk_tensor_2d_global_to_shared_multicast_cluster(
                b_tile + int(rank) * kHalfB * kBlockK, tm_b, &full[s], kc, x.b_row + int(rank) * kHalfB,
                uint16_t(0x3));
          } else {  // two experts: both halves of its own B, locally
            device::cp_async_bulk_tensor_2d_global_to_shared(b_tile, tm_b, &full[s], kc, x.b_row);
            device::cp_async_bulk_tensor_2d_global_to_shared(b_tile + kHalfB * kBlockK, tm_b, &full[s], kc,
                                                             x.b_row + kHalfB);
          }
        } else {
          if constexpr (kMulticast)  // [64, 128] half of A, 128B swizzle, into both CTAs
            device::cp_async_bulk_tensor_2d_global_to_shared_multicast_cluster(
                smem + L::kOffA + s * L::kTileA + int(rank) * kHalfA * kBlockK, tm_a, &full[s], kc,
                x.a_row + int(rank) * kHalfA, uint16_t(0x3));
          else
            load_operand_box<kMayBeBlocked>(smem + L::kOffA + s * L::kTileA, tm_a, &full[s], kc, x.a_row, a_blocked);
          load_operand_box<kMayBeBlocked>(smem + L::kOffB + s * L::kTileB, tm_b, &full[s], kc, x.b_row, b_blocked);
        }
        if constexpr (!kExact) {
          device::cp_async_bulk_tensor_2d_global_to_shared(sa, tm_sa, &full[s], x.sa_x, x.sa_y0 + c);
          if constexpr (kBlockB == BlockScalesB::kNone) {
            device::cp_async_bulk_tensor_2d_global_to_shared(sb, tm_sb, &full[s], x.sb_x, x.sb_y0 + c);
          } else if constexpr (kBlockB == BlockScalesB::kTma) {
            device::cp_async_bulk_tensor_2d_global_to_shared(sb, tm_sb, &full[s], box_x, x.sb_y0 + c);
            if (second_box)
              device::cp_async_bulk_tensor_2d_global_to_shared(sb + 128, tm_sb, &full[s], box_x + kBlockScaleBox,
                                                               x.sb_y0 + c);
          }
        }
      }
      if (++s == kNumStages) { s = 0; phase ^= 1u; }
    }
  }
}

// One math warp (lane 0, after __syncwarp) hands stage `bar`'s slot back. kMulticast: to both
// CTAs of the cluster (the stage is filled by both producers), release at cluster scope.
template <bool kMulticast>
__device__ __forceinline__ void arrive_empty(uint64_t* bar) {
  if constexpr (kMulticast) {
    const uint32_t local = device::smem_addr(bar);
#pragma unroll
    for (uint32_t r = 0; r < 2; ++r)
      device::mbarrier_arrive_release_cta_shared_cluster(device::mapa_shared_cluster_u32(local, r));
  } else {
    device::mbarrier_arrive(bar);
  }
}

// tot += acc · sa[row] · sb[col] over the thread's fragment (see wgmma_mma_async.cuh).
template <int kBlockN>
__device__ __forceinline__ void promote(float (&tot)[kBlockN / 2], const float (&acc)[kBlockN / 2],
                                        float sa0, float sa1, const float2* sb_pairs) {
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j) {
    const float2 sb = sb_pairs[j];
    tot[4 * j + 0] = fmaf(acc[4 * j + 0], sa0 * sb.x, tot[4 * j + 0]);
    tot[4 * j + 1] = fmaf(acc[4 * j + 1], sa0 * sb.y, tot[4 * j + 1]);
    tot[4 * j + 2] = fmaf(acc[4 * j + 2], sa1 * sb.x, tot[4 * j + 2]);
    tot[4 * j + 3] = fmaf(acc[4 * j + 3], sa1 * sb.y, tot[4 * j + 3]);
  }
}

template <bool kOutF32>
__device__ __forceinline__ void store_pair(void* y, int64_t i, float v0, float v1, bool accumulate) {
  if constexpr (kOutF32) {
    float2* q = reinterpret_cast<float2*>(static_cast<float*>(y) + i);
    if (accumulate) {
      const float2 old = *q;
      v0 += old.x;
      v1 += old.y;
    }
    *q = make_float2(v0, v1);
  } else {
    __nv_bfloat162* q = reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(y) + i);
    if (accumulate) {
      const float2 old = __bfloat1622float2(*q);
      v0 += old.x;
      v1 += old.y;
    }
    *q = __floats2bfloat162_rn(v0, v1);
  }
}

// Rows r, r + 8 and column pairs (8j + c, +1) of the fragment; columns and rows masked to the
// tile's valid extent (column counts are even, so a pair is all in or all out).
template <int kBlockN, bool kOutF32>
__device__ __forceinline__ void store_tile(const Params& p, const Tile& x,
                                           const float (&tot)[kBlockN / 2], int r, int c) {
  const bool row0_ok = r < x.out_rows_valid, row1_ok = r + 8 < x.out_rows_valid;
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j) {
    const int col = c + 8 * j;
    if (col < x.out_cols_valid) {
      const int64_t i0 = x.out_offset + int64_t(r) * x.out_ld + col;
      if (row0_ok) store_pair<kOutF32>(p.y, i0, tot[4 * j + 0], tot[4 * j + 1], p.accumulate);
      if (row1_ok)
        store_pair<kOutF32>(p.y, i0 + int64_t(8) * x.out_ld, tot[4 * j + 2], tot[4 * j + 3],
                            p.accumulate);
    }
  }
}

// ---- TMA-store epilogue (wide fast tiles) -------------------------------------------------------
//
// With store_tile the two math warpgroups write their fragments (4- or 8-byte stores) at the end
// of every tile while the tensor core idles, and with uniform tiles every SM gets there at about
// the same time, so the writes arrive as one burst (a 128 x 192 tile is 48 KB in BF16, 96 KB in
// FP32). Here each warpgroup writes its 64 x kBlockN fragment into shared memory as boxes of
// 64 rows x 128 bytes in the 128B-swizzled layout (no bank conflicts: for one column group j the
// 8 rows of a warp land in different 16-byte chunks), one thread hands the boxes to TMA stores,
// and the warpgroup goes on to the next tile; the stores drain while it computes. The staging holds
// one BF16 fragment per warpgroup (kBlockN / 64 boxes: fast 192 wide 24 KB, exact 256 wide 32 KB):
// BF16 goes in one round, FP32 (twice the boxes) in two, the second after the first round's boxes
// have been read out of shared memory (wait_group.read). Before it overwrites the staging at the
// next tile, the issuing thread waits the same way. Values: __floats2bfloat162_rn of the same tot as store_pair,
// or tot itself; with accumulate (FP32 only) the boxes go by TMA reduce-add, which adds each
// element once to y in FP32 (y + tot, one rounding, as store_pair's read-add-write).
// Output maps (out_tma_map): y as [E, rows, cols] (m-grouped E = 1, rows M_total, cols N;
// k-grouped dW [E, N, K]); BF16 as bytes in boxes [1, 64, 128 B], FP32 as f32 in boxes
// [1, 64, 32]; 128B swizzle. Rows and columns past the problem are clipped by the map (per expert
// for dW), so partial tiles need no masks.
constexpr int kOutBoxRows = 64;                   // rows of an output box (a math warpgroup's)
constexpr int kOutBoxBytes = kOutBoxRows * 128;   // 8 KB
// Staging per math warpgroup: one BF16 fragment's boxes (fast 192 wide: 3 boxes = 24 KB; exact
// 256 wide: 4 = 32 KB); FP32 fragments go through it in two rounds.
template <int kBlockN>
constexpr int out_boxes_per_round() { return kBlockN / 64; }
template <int kBlockN>
constexpr int out_stage_bytes() { return kNumMathWarpgroups * out_boxes_per_round<kBlockN>() * kOutBoxBytes; }

template <int kBlockN, bool kOutF32>
struct OutBoxes {
  static constexpr int kElemBytes = kOutF32 ? 4 : 2;
  static constexpr int kCols = 128 / kElemBytes;                  // columns per box: 64 BF16, 32 FP32
  static constexpr int kBoxes = kBlockN / kCols;                  // per fragment
  static constexpr int kPerRound = out_boxes_per_round<kBlockN>();
  static constexpr int kRounds = kBoxes / kPerRound;              // 1 (BF16) or 2 (FP32)
  static constexpr int kGroupsPerRound = kBlockN / 8 / kRounds;   // fragment column groups j per round
  static_assert(kBlockN % 64 == 0 && kBoxes % kPerRound == 0, "whole rounds of boxes");
};

template <int kBlockN, bool kOutF32, bool kKGrouped>
__device__ __forceinline__ void store_tile_tma(const Params& p, const CUtensorMap* tm_y, const Tile& x,
                                               const float (&tot)[kBlockN / 2], uint8_t* stage,
                                               int math_wg, int warp, int lane) {
  using B = OutBoxes<kBlockN, kOutF32>;
  if (x.out_rows_valid <= 0) return;  // a phantom tile (exact multicast pairs): stores nothing
  const bool leader = threadIdx.x % 128 == 0;
  const int lr = warp * 16 + lane / 4;  // fragment rows lr, lr + 8 of this warpgroup's 64
  // The tile's output coordinates: row 0 of this warpgroup, column 0, expert (FP32 maps), and
  // the column extent beyond which boxes would write nothing.
  int row0, col0, e = 0, cols;
  if constexpr (kKGrouped) {  // dW[e] [N, K]: a_row = n0, b_row = k0
    row0 = x.a_row;
    col0 = x.b_row;
    e = int((x.out_offset / x.out_ld) / p.n);
    cols = p.k;
  } else {
    row0 = x.a_row;
    col0 = p.n - x.out_cols_valid;
    cols = p.n;
  }
  row0 += kOutBoxRows * math_wg;
#pragma unroll
  for (int round = 0; round < B::kRounds; ++round) {
    if (leader) device::cp_async_bulk_wait_group_read<0>();  // earlier boxes have left the staging
    device::named_barrier_sync(1 + math_wg, 128);
#pragma unroll
    for (int jj = 0; jj < B::kGroupsPerRound; ++jj) {
      const int j = round * B::kGroupsPerRound + jj;     // columns 8j + 2·(lane%4) (+1)
      const int col = 8 * j + 2 * (lane % 4);
      const int box = col / B::kCols - round * B::kPerRound;
      const int byte = (col % B::kCols) * B::kElemBytes;  // inside the box's 128-byte row
      // 16-byte chunk swizzled by the row's place in its 8-row atom (lr % 8 == (lr + 8) % 8)
      uint8_t* q = stage + box * kOutBoxBytes + lr * 128 + (((byte / 16) ^ (lane / 4)) * 16) + byte % 16;
      if constexpr (kOutF32) {
        *reinterpret_cast<float2*>(q) = make_float2(tot[4 * j + 0], tot[4 * j + 1]);
        *reinterpret_cast<float2*>(q + 8 * 128) = make_float2(tot[4 * j + 2], tot[4 * j + 3]);
      } else {
        *reinterpret_cast<__nv_bfloat162*>(q) = __floats2bfloat162_rn(tot[4 * j + 0], tot[4 * j + 1]);
        *reinterpret_cast<__nv_bfloat162*>(q + 8 * 128) = __floats2bfloat162_rn(tot[4 * j + 2], tot[4 * j + 3]);
      }
    }
    device::fence_proxy_async_shared_cta();  // these writes, before the async proxy reads them
    device::named_barrier_sync(1 + math_wg, 128);
    if (leader) {
#pragma unroll
      for (int i = 0; i < B::kPerRound; ++i) {
        const int c = col0 + (round * B::kPerRound + i) * B::kCols;
        if (c >= cols) continue;  // a box wholly past the last column would write nothing
        const uint8_t* src = stage + i * kOutBoxBytes;
        if constexpr (kOutF32) {
          if (p.accumulate) device::cp_reduce_async_bulk_tensor_3d_add_shared_to_global(tm_y, src, c, row0, e);
          else device::cp_async_bulk_tensor_3d_shared_to_global(tm_y, src, c, row0, e);
        } else {
          device::cp_async_bulk_tensor_3d_shared_to_global(tm_y, src, 2 * c, row0, e);
        }
      }
      device::cp_async_bulk_commit_group();
    }
  }
}

// ---- row epilogue (OutStore::kRows; m-grouped BF16, wide tiles) --------------------------------
//
// The EP layer's fused combine (docs/notes/ep.md, "Fused combine"): output row r does not go to
// y[r] but to row_dst[r] (row_dst = p.y, the row table): a peer GPU's combine slot through an NCCL
// LSA pointer, or this GPU's; null: a pad row, not stored. A destination is a whole row, so the
// staging must keep each row contiguous, which the 128B-swizzled boxes of store_tile_tma do not
// (they permute a row's 16-byte chunks). Each math warpgroup writes its 64 x kBlockN BF16 fragment into its own staging, row-major
// with a pitch of kBlockN·2 + 16 bytes (row_stage_pitch); a store warp of the producer warpgroup
// (warp 2 serves math warpgroup 0, warp 3 warpgroup 1; both idle otherwise) hands each stored row to
// one `cp.async.bulk.global.shared::cta` of 2·cols bytes (384 for a full 192-wide tile) and the math
// warpgroup goes on with its next tile.
// Bank math of the fragment stores (pitch P = 400 B for 192 wide, 528 B for 256 wide: P/16 odd).
// For one column group j a warp stores 4 bytes per lane at row lr = 16·warp + lane/4 (8 rows) and
// byte 16j + 4·(lane%4); bank = (lr·P/4 + 4j + lane%4) mod 32, and P/4 = 100 (132) ≡ 4 (mod 32),
// so the 8 rows start 4 banks apart: 8 rows x 4 lanes = 32 distinct banks, conflict-free (the
// unpadded pitch 384 ≡ 0 (mod 128) would put all 8 rows on the same 4 banks: 8-way conflicts).
// Handoff per math warpgroup wg and tile (named barriers of 160 threads: 128 math + 32 store):
//   math:  [not its first tile: bar.sync FREE(wg)] -> fragment stores -> fence.proxy.async (the
//          generic writes before the async proxy reads them) -> bar.arrive STAGED(wg)
//   store: bar.sync STAGED(wg) -> lane 0: one bulk copy per row with a destination, commit,
//          wait_group.read 0 (the staging has been read) -> [not its last tile: bar.arrive FREE(wg)]
// Both roles walk the same tiles (t = blockIdx.x, += gridDim.x), so the arrivals pair up: a second
// STAGED arrival needs a FREE that needs the first STAGED's sync, and vice versa; no barrier is
// left half-arrived at exit. After its last tile the store warp waits for its copies' writes
// (wait_group 0), then fence.proxy.async.global and fence.sc.sys: the rows are written and
// ordered at system scope before anything this thread (and, by stream order, the next kernel:
// the EP barrier that publishes them) does afterwards. The staging stays valid until then because
// the CTA lives until its store warps return.
constexpr uint32_t kBarRowsStaged = 3;  // + math warpgroup (ids 1, 2: store_tile_tma's)
constexpr uint32_t kBarRowsFree = 5;    // + math warpgroup
constexpr uint32_t kRowHandoffThreads = 128 + 32;
template <int kBlockN>
constexpr int row_stage_pitch() { return kBlockN * 2 + 16; }  // bytes; /16 odd: conflict-free stores
template <int kBlockN>
constexpr int row_stage_bytes() { return kNumMathWarpgroups * kOutBoxRows * row_stage_pitch<kBlockN>(); }
static_assert((row_stage_pitch<192>() / 16) % 2 == 1 && (row_stage_pitch<256>() / 16) % 2 == 1,
              "row staging pitch: an odd number of 16-byte chunks");

// Staging bytes appended to the shared-memory layout for an epilogue.
template <int kBlockN, OutStore kOut>
constexpr int out_stage_bytes_for() {
  return kOut == OutStore::kTma ? out_stage_bytes<kBlockN>() : kOut == OutStore::kRows ? row_stage_bytes<kBlockN>() : 0;
}

// Math warpgroup side: the fragment (BF16, the same __floats2bfloat162_rn of the same values as
// store_pair) into this warpgroup's staging rows, then handed to the store warp.
template <int kBlockN>
__device__ __forceinline__ void store_tile_rows(const float (&tot)[kBlockN / 2], uint8_t* stage, int math_wg,
                                                int warp, int lane, bool first_tile) {
  constexpr int kPitch = row_stage_pitch<kBlockN>();
  if (!first_tile) device::named_barrier_sync(kBarRowsFree + math_wg, kRowHandoffThreads);
  uint8_t* q = stage + (warp * 16 + lane / 4) * kPitch + 4 * (lane % 4);  // row lr, columns 2·(lane%4)
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j) {
    *reinterpret_cast<__nv_bfloat162*>(q + 16 * j) = __floats2bfloat162_rn(tot[4 * j + 0], tot[4 * j + 1]);
    *reinterpret_cast<__nv_bfloat162*>(q + 16 * j + 8 * kPitch) = __floats2bfloat162_rn(tot[4 * j + 2], tot[4 * j + 3]);
  }
  device::fence_proxy_async_shared_cta();
  device::named_barrier_arrive(kBarRowsStaged + math_wg, kRowHandoffThreads);
}

// Store warp side (producer warpgroup warp 2 + wg, all 32 lanes): per tile, the destinations of
// this warpgroup's 64 rows (lane l holds rows l and l + 32, loaded before the wait), then lane 0
// issues the copies. Columns: the tile's valid ones (a multiple of 32, so 2·cols is a multiple of
// 64 bytes; the destination row + 2·n0 is 16-byte aligned when the row address is).
template <int kBlockN, class Scheduler>
__device__ __forceinline__ void row_store_warp(const Params& p, const Scheduler& sched, uint8_t* stage, int math_wg,
                                               int lane) {
  constexpr int kPitch = row_stage_pitch<kBlockN>();
  // The writes below are the async proxy's; order them after this thread's generic-proxy past (the
  // stream order that made the destinations free: docs/notes/ep.md, "Fused combine").
  if (lane == 0) device::fence_proxy_async_global();
  for (int t = blockIdx.x; t < sched.num_tiles; t += gridDim.x) {
    const Tile x = sched.tile(t);
    const int row0 = x.a_row + kOutBoxRows * math_wg;
    const int n0 = p.n - x.out_cols_valid;
    const uint32_t bytes = 2u * uint32_t(min(kBlockN, x.out_cols_valid));
    void* const* row_dst = static_cast<void* const*>(p.y);  // the row table (Params::y)
    const uint64_t d_lo = reinterpret_cast<uint64_t>(row_dst[row0 + lane]);
    const uint64_t d_hi = reinterpret_cast<uint64_t>(row_dst[row0 + 32 + lane]);
    device::named_barrier_sync(kBarRowsStaged + math_wg, kRowHandoffThreads);
#pragma unroll 4
    for (int i = 0; i < kOutBoxRows; ++i) {
      const uint64_t d = __shfl_sync(0xFFFFFFFFu, i < 32 ? d_lo : d_hi, i % 32);
      if (lane == 0 && d != 0)
        device::cp_async_bulk_shared_to_global(reinterpret_cast<uint8_t*>(d) + 2 * int64_t(n0), stage + i * kPitch,
                                               bytes);
    }
    if (lane == 0) {
      device::cp_async_bulk_commit_group();
      device::cp_async_bulk_wait_group_read<0>();  // the staging has been read out
    }
    __syncwarp();
    if (t + int(gridDim.x) < sched.num_tiles) device::named_barrier_arrive(kBarRowsFree + math_wg, kRowHandoffThreads);
  }
  if (lane == 0) {
    device::cp_async_bulk_wait_group<0>();  // the rows are written (visible to this thread)
    device::fence_proxy_async_global();     // ... and ordered before its later generic accesses
    __threadfence_system();                 // ... at system scope (peers read them after the EP barrier)
  }
}

// A math warpgroup's end of tile t: its fragment out through store_tile_tma (kTma; staging at
// kOffOut of the layout with out_stage_bytes), store_tile_rows (kRows) or store_tile; and, after its
// last tile, finish_tile_stores: the TMA stores' global writes are done before the issuing thread
// leaves (the staging must stay valid while they read it; kRows: the store warps wait instead).
template <int kBlockN, int kNumStages, bool kExact, bool kPipelined, bool kOutF32, OutStore kOut, class Scheduler>
__device__ __forceinline__ void store_tile_any(const Params& p, const CUtensorMap* tm_y, const Scheduler& sched, int t,
                                               const float (&frag)[kBlockN / 2], uint8_t* smem, int math_wg, int warp,
                                               int lane, int r_tile, int c_frag) {
  if constexpr (kOut != OutStore::kDirect) {
    using LO = SmemLayout<kBlockN, kNumStages, kExact, kPipelined, out_stage_bytes_for<kBlockN, kOut>()>;
    uint8_t* stage = smem + LO::kOffOut + math_wg * (out_stage_bytes_for<kBlockN, kOut>() / kNumMathWarpgroups);
    if constexpr (kOut == OutStore::kTma) {
      store_tile_tma<kBlockN, kOutF32, Scheduler::kIsKGrouped>(p, tm_y, sched.tile(t), frag, stage, math_wg, warp,
                                                               lane);
    } else {
      static_assert(!kOutF32 && !Scheduler::kIsKGrouped, "row epilogue: m-grouped BF16");
      store_tile_rows<kBlockN>(frag, stage, math_wg, warp, lane, t == int(blockIdx.x));
    }
  } else {
    store_tile<kBlockN, kOutF32>(p, sched.tile(t), frag, r_tile, c_frag);
  }
}

template <OutStore kOut>
__device__ __forceinline__ void finish_tile_stores() {
  if constexpr (kOut == OutStore::kTma)
    if (threadIdx.x % 128 == 0) device::cp_async_bulk_wait_group<0>();
}

// Fast mode, serial schedule (kConfigFastPipelined = false): issue a chunk's four wgmmas, wait for
// them, decode the scale bytes in every thread, promote.
template <int kBlockN, int kNumStages, bool kOutF32, bool kMulticast, class Scheduler>
__device__ __forceinline__ void math_fast_serial(const Params& p, uint8_t* smem, const Scheduler& sched,
                                                 uint64_t* full, uint64_t* empty) {
  static_assert(kBlockN == 128, "the wgmma wrapper is m64n128k32");
  using L = SmemLayout<kBlockN, kNumStages, false>;
  const int math_wg = threadIdx.x / 128 - 1;  // 0, 1
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int r_tile = math_wg * 64 + warp * 16 + lane / 4;  // fragment rows r_tile, r_tile + 8
  const int c_frag = 2 * (lane % 4);                       // fragment columns 8j + c_frag (+1)

  int s = 0;
  uint32_t phase = 0;
  float acc[kBlockN / 2], tot[kBlockN / 2];
  for (int t = blockIdx.x; t < sched.num_tiles; t += gridDim.x) {
    const Tile x = sched.tile(t);
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) tot[i] = 0.0f;
    for (int c = 0; c < x.num_chunks; ++c) {
      device::mbarrier_wait_parity(&full[s], phase);
      const uint64_t desc_a = device::make_wgmma_desc_kmajor_sw128(
          device::smem_addr(smem + L::kOffA + s * L::kTileA + math_wg * 64 * kBlockK));
      const uint64_t desc_b =
          device::make_wgmma_desc_kmajor_sw128(device::smem_addr(smem + L::kOffB + s * L::kTileB));
      const uint8_t* sa = smem + L::kOffScaleA + s * L::kScaleA;  // [128] u8
      const uint8_t* sb = smem + L::kOffScaleB + s * L::kScaleB;  // [kBlockN] u8
      device::wgmma_fence_operand(acc);
      device::wgmma_fence_sync_aligned();
      // All four k-steps even in a tail chunk: TMA zero-filled both operands past kdim, so the
      // extra steps add exact zeros, and an unconditional sequence keeps ptxas from fencing
      // every wgmma. +2 in the descriptor's address field = 32 bytes along the swizzled row.
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks)
        device::wgmma_mma_async_m64nNk32_f32_e4m3_e4m3_ss<128>(acc, desc_a + 2 * ks,
                                                             desc_b + 2 * ks, ks > 0);
      device::wgmma_commit_group_sync_aligned();
      const float sa0 = e8m0_to_float_fast(sa[r_tile]), sa1 = e8m0_to_float_fast(sa[r_tile + 8]);
      float2 sb_pairs[kBlockN / 8];
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
        const uint32_t v = *reinterpret_cast<const uint16_t*>(sb + 8 * j + c_frag);
        sb_pairs[j] = make_float2(e8m0_to_float_fast(v), __uint_as_float((v & 0xFF00u) << 15));
      }
      device::wgmma_wait_group_sync_aligned<0>();
      device::wgmma_fence_operand(acc);
      // Stage s is no longer read (tiles by the finished wgmmas, scales already in registers;
      // the arrive's release orders the loads above): hand it back before promoting.
      __syncwarp();
      if (lane == 0) arrive_empty<kMulticast>(&empty[s]);
      promote<kBlockN>(tot, acc, sa0, sa1, sb_pairs);
      if (++s == kNumStages) { s = 0; phase ^= 1u; }
    }
    store_tile<kBlockN, kOutF32>(p, x, tot, r_tile, c_frag);
  }
}

// wgmma descriptors of stage s: this math warpgroup's 64 rows of A and the whole B tile, kept in
// 32-bit halves: the address field (bits 0-13, address >> 4; shared memory is below 256 KB) never
// carries into the upper half when stepped along K (+2 = 32 bytes), so the steps stay 32-bit adds.
struct StageDescs {
  uint32_t a_lo, b_lo;
  uint64_t a_hi, b_hi;
  __device__ __forceinline__ uint64_t a(int ks) const { return a_hi | (a_lo + 2 * ks); }
  __device__ __forceinline__ uint64_t b(int ks) const { return b_hi | (b_lo + 2 * ks); }
};

template <class L>
__device__ __forceinline__ StageDescs stage_descs(uint8_t* smem, int s, int math_wg) {
  const uint64_t desc_a = device::make_wgmma_desc_kmajor_sw128(
      device::smem_addr(smem + L::kOffA + s * L::kTileA + math_wg * 64 * kBlockK));
  const uint64_t desc_b =
      device::make_wgmma_desc_kmajor_sw128(device::smem_addr(smem + L::kOffB + s * L::kTileB));
  return {uint32_t(desc_a), uint32_t(desc_b), desc_a & 0xFFFFFFFF00000000ull,
          desc_b & 0xFFFFFFFF00000000ull};
}

// ---- exact mode: BF16 images, one FP32 accumulator over the whole reduction ------------------
//
// Each math warpgroup owns 64 rows of the tile: acc [kBlockN / 2] FP32 (64 for 128 wide, 128 for
// 256 wide), zeroed per tile. Per stage (64 K elements, 128 bytes per row of A and B): four
// wgmma.m64nNk16.f32.bf16.bf16, stepping both descriptors by 32 bytes (+2) along the swizzled
// row as fast mode's k32 steps do, each accumulating into acc (scale-d = 1), then one commit.
// There is no promotion: BF16 × BF16 products are exact in FP32 and the tensor core adds them
// into the FP32 accumulator (error model: tests/gpu/test_gemm_gpu.cpp).
// Pipelining: after committing chunk c, wait_group 1 retires chunk c-1 (chunk c stays queued on
// the tensor core while this warp waits for the next stage) and hands its stage back. Each tile
// drains with wait_group 0 before the epilogue reads acc; chunks past kdim are TMA zero fill
// (exact zeros), so a K tail needs no branch.
// kOut: where the output leaves (store_tile_any). kMulticast (m-grouped, B shared by a 2-CTA
// cluster): stages are handed back to both CTAs (arrive_empty).
template <int kBlockN, int kNumStages, bool kOutF32, OutStore kOut, bool kMulticast, class Scheduler>
__device__ __forceinline__ void math_exact(const Params& p, uint8_t* smem, const Scheduler& sched,
                                           uint64_t* full, uint64_t* empty, const CUtensorMap* tm_y) {
  using L = SmemLayout<kBlockN, kNumStages, true>;
  // Through a shuffle so that the compiler knows it is warp-uniform (descriptors in uniform regs).
  const int math_wg = __shfl_sync(0xFFFFFFFFu, int(threadIdx.x) / 128 - 1, 0);  // 0, 1
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int r_tile = math_wg * 64 + warp * 16 + lane / 4;  // fragment rows r_tile, r_tile + 8
  const int c_frag = 2 * (lane % 4);                       // fragment columns 8j + c_frag (+1)

  PipeState<kNumStages> at, held;  // held: the stage of the chunk whose wgmmas may still run
  float acc[kBlockN / 2];
  for (int t = blockIdx.x; t < sched.num_tiles; t += gridDim.x) {
    const int n = sched.tile(t).num_chunks;
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) acc[i] = 0.0f;
    for (int c = 0; c < n; ++c) {
      device::mbarrier_wait_parity(&full[at.s], at.phase);  // acquire: the stage's tiles
      const StageDescs d = stage_descs<L>(smem, at.s, math_wg);
      device::wgmma_fence_operand(acc);
      device::wgmma_fence_sync_aligned();
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks)
        device::wgmma_mma_async_m64nNk16_f32_bf16_bf16_ss<kBlockN>(acc, d.a(ks), d.b(ks), true);
      device::wgmma_commit_group_sync_aligned();
      device::wgmma_wait_group_sync_aligned<1>();  // chunk c-1 retired, chunk c in flight
      if (c > 0) {  // chunk c-1's stage is no longer read
        __syncwarp();
        if (lane == 0) arrive_empty<kMulticast>(&empty[held.s]);
      }
      held = at;
      at.advance();
    }
    device::wgmma_wait_group_sync_aligned<0>();
    device::wgmma_fence_operand(acc);  // reads of acc stay below the wait
    if (n > 0) {
      __syncwarp();
      if (lane == 0) arrive_empty<kMulticast>(&empty[held.s]);
    }
    store_tile_any<kBlockN, kNumStages, true, false, kOutF32, kOut>(p, tm_y, sched, t, acc, smem, math_wg, warp,
                                                                         lane, r_tile, c_frag);
  }
  finish_tile_stores<kOut>();
}

// ---- fast mode, pipelined schedule (kConfigFastPipelined) -----------------------------------
//
// Per math warpgroup, two accumulators in ping-pong across chunks: chunk c+1's four wgmmas are
// committed into the other accumulator before chunk c is promoted, so the tensor core always has
// this warpgroup's next chunk queued while its CUDA cores promote (on top of the two warpgroups
// interleaving). Registers: acc0 64 + acc1 64 + tot 64 + ~30 (ptxas: see docs/notes/gemm.md).
// The scales come pre-decoded (decode_fast_scales): per chunk a thread loads one float2 (its two
// rows) and kBlockN/16 float4 (its column pairs), then 64 × (FMUL + FFMA) — the floor for
// per-row × per-column scales. Numerics are bitwise those of the serial schedule: the same
// decoded scale values, the same fmaf(acc, sa·sb, tot) per element, chunks in the same order.
//
// wgmma ordering, by construction:
//  * issue_chunk waits full[s] (acquire: the stage's tiles), then wgmma.fence (the accumulator
//    was last read by the promotion's ordinary instructions), 4 × wgmma, commit: one group per
//    chunk, so "wait_group 1" right after committing chunk c+1 means chunk c's group is done.
//  * An accumulator is read (promote_chunk) only after the wait that retires its group, behind a
//    wgmma_fence_operand so the compiler cannot hoist the reads above the wait; it is written
//    again only by the next issue_chunk, which starts with wgmma.fence.
//  * Stage s of chunk c is handed back (empty[s]) after chunk c's group is retired and its
//    decoded scales are loaded: the tiles and the floats may then be overwritten.
//  * Every tile ends with wait_group 0: no group crosses a tile (the epilogue reads tot only).
template <int kBlockN, int kNumStages>
__device__ __forceinline__ void issue_chunk(float (&acc)[kBlockN / 2], uint8_t* smem, uint64_t* full,
                                            PipeState<kNumStages>& at, int math_wg) {
  using L = SmemLayout<kBlockN, kNumStages, false, true>;
  device::mbarrier_wait_parity(&full[at.s], at.phase);
  // (The descriptors as in stage_descs, written out: composed from it, ptxas allocated this
  // kernel's registers differently, and this fast path's SASS is the one measured.)
  const uint64_t desc_a = device::make_wgmma_desc_kmajor_sw128(
      device::smem_addr(smem + L::kOffA + at.s * L::kTileA + math_wg * 64 * kBlockK));
  const uint64_t desc_b =
      device::make_wgmma_desc_kmajor_sw128(device::smem_addr(smem + L::kOffB + at.s * L::kTileB));
  const uint32_t a_lo = uint32_t(desc_a), b_lo = uint32_t(desc_b);
  const uint64_t a_hi = desc_a & 0xFFFFFFFF00000000ull, b_hi = desc_b & 0xFFFFFFFF00000000ull;
  device::wgmma_fence_operand(acc);
  device::wgmma_fence_sync_aligned();
  // All four k-steps even in a K-tail chunk (TMA zero fill adds exact zeros; see the serial path).
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks)
    device::wgmma_mma_async_m64nNk32_f32_e4m3_e4m3_ss<kBlockN>(acc, a_hi | (a_lo + 2 * ks),
                                                                b_hi | (b_lo + 2 * ks), ks > 0);
  device::wgmma_commit_group_sync_aligned();
  at.advance();
}

// tot += acc · sa[row] · sb[col] for fragment pairs 2m and 2m + 1: sa = the thread's rows (r,
// r + 8), v = columns 16m + c_frag + {0, 1} (pair 2m) and + {8, 9} (pair 2m + 1), as decoded.
template <int kBlockN>
__device__ __forceinline__ void promote_quad(float (&tot)[kBlockN / 2], const float (&acc)[kBlockN / 2],
                                             int m, float2 sa, float4 v) {
  const int j0 = 2 * m, j1 = 2 * m + 1;
  tot[4 * j0 + 0] = fmaf(acc[4 * j0 + 0], sa.x * v.x, tot[4 * j0 + 0]);
  tot[4 * j0 + 1] = fmaf(acc[4 * j0 + 1], sa.x * v.y, tot[4 * j0 + 1]);
  tot[4 * j0 + 2] = fmaf(acc[4 * j0 + 2], sa.y * v.x, tot[4 * j0 + 2]);
  tot[4 * j0 + 3] = fmaf(acc[4 * j0 + 3], sa.y * v.y, tot[4 * j0 + 3]);
  tot[4 * j1 + 0] = fmaf(acc[4 * j1 + 0], sa.x * v.z, tot[4 * j1 + 0]);
  tot[4 * j1 + 1] = fmaf(acc[4 * j1 + 1], sa.x * v.w, tot[4 * j1 + 1]);
  tot[4 * j1 + 2] = fmaf(acc[4 * j1 + 2], sa.y * v.z, tot[4 * j1 + 2]);
  tot[4 * j1 + 3] = fmaf(acc[4 * j1 + 3], sa.y * v.w, tot[4 * j1 + 3]);
}

// tot += acc · sa[row] · sb[col] for the chunk at `at`, whose wgmma group has been retired.
// (Written out rather than as load_chunk_scales + promote_loaded: that composition compiles to a
// different register allocation, and this default path's SASS is the one measured.)
template <int kBlockN, int kNumStages, bool kMulticast>
__device__ __forceinline__ void promote_chunk(float (&tot)[kBlockN / 2], float (&acc)[kBlockN / 2],
                                              uint8_t* smem, uint64_t* empty, uint64_t* ready,
                                              PipeState<kNumStages>& at, int sa_slot, int sb_slot,
                                              int lane) {
  using L = SmemLayout<kBlockN, kNumStages, false, true>;
  device::wgmma_fence_operand(acc);  // reads of acc stay below the wait that retired its group
  device::mbarrier_wait_parity(&ready[at.s], at.phase);  // acquire: the decoder's floats
  const float* saf = reinterpret_cast<const float*>(smem + L::kOffScaleAF + at.s * L::kScaleAF);
  const float* sbf = reinterpret_cast<const float*>(smem + L::kOffScaleBF + at.s * L::kScaleBF);
  const float2 sa = *reinterpret_cast<const float2*>(saf + sa_slot);  // rows r, r + 8
  const float4* sbq = reinterpret_cast<const float4*>(sbf + sb_slot);  // quad m at sbq[4m]
#pragma unroll
  for (int m = 0; m < kBlockN / 16; ++m) promote_quad<kBlockN>(tot, acc, m, sa, sbq[4 * m]);
  // Stage at.s is no longer read: its wgmmas are retired, its scales are in registers (the
  // arrive's release orders this warp's loads, __syncwarp the other lanes').
  __syncwarp();
  if (lane == 0) arrive_empty<kMulticast>(&empty[at.s]);
  at.advance();
}

// Retires the chunk at `at` (wait_group kWaitGroups: the other accumulator's chunk may stay queued)
// and promotes it.
template <int kBlockN, int kNumStages, bool kMulticast, int kWaitGroups>
__device__ __forceinline__ void retire_and_promote(float (&tot)[kBlockN / 2], float (&acc)[kBlockN / 2],
                                                   uint8_t* smem, uint64_t* empty, uint64_t* ready,
                                                   PipeState<kNumStages>& at, int sa_slot, int sb_slot,
                                                   int lane) {
  device::wgmma_wait_group_sync_aligned<kWaitGroups>();
  promote_chunk<kBlockN, kNumStages, kMulticast>(tot, acc, smem, empty, ready, at, sa_slot, sb_slot, lane);
}

template <int kBlockN, int kNumStages, bool kOutF32, bool kMulticast, class Scheduler>
__device__ __forceinline__ void math_fast_pipelined(const Params& p, uint8_t* smem,
                                                    const Scheduler& sched, uint64_t* full,
                                                    uint64_t* empty, uint64_t* ready) {
  static_assert(kBlockN == 128, "the wgmma wrapper is m64n128k32");
  static_assert(kNumStages >= 2, "ping-pong holds two stages per math warpgroup");
  // Through a shuffle so that the compiler knows it is warp-uniform (descriptors in uniform regs).
  const int math_wg = __shfl_sync(0xFFFFFFFFu, int(threadIdx.x) / 128 - 1, 0);  // 0, 1
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int r_tile = math_wg * 64 + warp * 16 + lane / 4;  // fragment rows r_tile, r_tile + 8
  const int c_frag = 2 * (lane % 4);                       // fragment columns 8j + c_frag (+1)
  const int sa_slot = scale_a_slot(r_tile);                // r_tile % 16 < 8: the (r, r+8) pair
  const int sb_slot = 4 * (lane % 4);

  // issue_at runs one chunk ahead of promote_at inside a tile; they meet at every tile boundary.
  PipeState<kNumStages> issue_at, promote_at;
  float acc0[kBlockN / 2], acc1[kBlockN / 2], tot[kBlockN / 2];
  for (int t = blockIdx.x; t < sched.num_tiles; t += gridDim.x) {
    const int n = sched.tile(t).num_chunks;
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) tot[i] = 0.0f;
    if (n > 0) {
      issue_chunk<kBlockN>(acc0, smem, full, issue_at, math_wg);  // chunk 0 -> acc0
      int c = 0;
      // Invariant at the loop head: chunk c is in flight in acc0, chunks c+1, c+2 exist.
      for (; c + 2 < n; c += 2) {
        issue_chunk<kBlockN>(acc1, smem, full, issue_at, math_wg);  // chunk c+1 -> acc1
        retire_and_promote<kBlockN, kNumStages, kMulticast, 1>(  // chunk c
            tot, acc0, smem, empty, ready, promote_at, sa_slot, sb_slot, lane);
        issue_chunk<kBlockN>(acc0, smem, full, issue_at, math_wg);  // chunk c+2 -> acc0
        retire_and_promote<kBlockN, kNumStages, kMulticast, 1>(  // chunk c+1
            tot, acc1, smem, empty, ready, promote_at, sa_slot, sb_slot, lane);
      }
      // Chunk c is in flight in acc0 and is the last or the second to last.
      if (c + 1 < n) {
        issue_chunk<kBlockN>(acc1, smem, full, issue_at, math_wg);  // chunk c+1 (last) -> acc1
        retire_and_promote<kBlockN, kNumStages, kMulticast, 1>(
            tot, acc0, smem, empty, ready, promote_at, sa_slot, sb_slot, lane);
        retire_and_promote<kBlockN, kNumStages, kMulticast, 0>(
            tot, acc1, smem, empty, ready, promote_at, sa_slot, sb_slot, lane);
      } else {
        retire_and_promote<kBlockN, kNumStages, kMulticast, 0>(
            tot, acc0, smem, empty, ready, promote_at, sa_slot, sb_slot, lane);
      }
    }
    store_tile<kBlockN, kOutF32>(p, sched.tile(t), tot, r_tile, c_frag);
  }
}

// The decoded scales of the chunk at `at` that this thread's fragment needs (one-accumulator
// schedules): waits for the decoder's floats, loads the row pair (r, r + 8); the column quads are
// read by the caller at sbq[4m].
struct ThreadScales {
  float2 sa;
  const float4* sbq;
};

template <int kBlockN, int kNumStages>
__device__ __forceinline__ ThreadScales thread_scales(uint8_t* smem, uint64_t* ready,
                                                      const PipeState<kNumStages>& at, int sa_slot,
                                                      int sb_slot) {
  using L = SmemLayout<kBlockN, kNumStages, false, true>;
  device::mbarrier_wait_parity(&ready[at.s], at.phase);  // acquire: the decoder's floats
  const float* saf = reinterpret_cast<const float*>(smem + L::kOffScaleAF + at.s * L::kScaleAF);
  const float* sbf = reinterpret_cast<const float*>(smem + L::kOffScaleBF + at.s * L::kScaleBF);
  return {*reinterpret_cast<const float2*>(saf + sa_slot), reinterpret_cast<const float4*>(sbf + sb_slot)};
}

// ---- fast mode, one accumulator per math warpgroup (wide tiles: kBlockN = 192) ---------------
//
// A 64 × 192 fragment per math warpgroup: acc 96 + tot 96 registers leave no room for a second
// accumulator (232 per thread), so a warpgroup issues chunk c (4 × wgmma m64n192k32, 384 tensor
// cycles at peak), retires it (wait_group 0) and promotes it; meanwhile the tensor core runs the
// other warpgroup's chunk, so the two fall into alternation (DeepGEMM's sm90 schedule). While its
// own wgmmas run, a warpgroup waits for the decoded scales and loads its row pair and the first
// kPreloadQuads column quads, so the promotion does not begin with a shared-memory round trip.
// Why wider: per 32 of K a m64n192 wgmma reads 8 KB of shared memory for 96 tensor cycles (85
// B/clk) against 6 KB per 64 (96 B/clk) for m64n128, and the TMA fill per FLOP drops by 1/6
// (docs/notes/gemm.md, "128 × 192 tiles"). The promotion is the same per element
// (promote_quad, chunks in order): results are bitwise those of the other fast schedules.
// Stage s is handed back after the promotion (the decoded floats are read during it), so a
// warpgroup holds one stage from its wait on full[s] to the end of the promotion.

// kOut: where the output leaves (store_tile_any).
template <int kBlockN, int kNumStages, bool kOutF32, OutStore kOut, class Scheduler>
__device__ __forceinline__ void math_fast_single(const Params& p, uint8_t* smem,
                                                 const Scheduler& sched, uint64_t* full,
                                                 uint64_t* empty, uint64_t* ready, const CUtensorMap* tm_y) {
  constexpr int kQuads = kBlockN / 16;
  constexpr int kPreloadQuads = MXMOE_GEMM_PRELOAD_QUADS;  // registers: 4 per quad, beside acc + tot
  static_assert(kPreloadQuads <= kQuads, "preload at most the tile's column quads");
  // Through a shuffle so that the compiler knows it is warp-uniform (descriptors in uniform regs).
  const int math_wg = __shfl_sync(0xFFFFFFFFu, int(threadIdx.x) / 128 - 1, 0);  // 0, 1
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int r_tile = math_wg * 64 + warp * 16 + lane / 4;  // fragment rows r_tile, r_tile + 8
  const int c_frag = 2 * (lane % 4);                       // fragment columns 8j + c_frag (+1)
  const int sa_slot = scale_a_slot(r_tile);
  const int sb_slot = 4 * (lane % 4);

  PipeState<kNumStages> at;
  float acc[kBlockN / 2], tot[kBlockN / 2];
  for (int t = blockIdx.x; t < sched.num_tiles; t += gridDim.x) {
    const int n = sched.tile(t).num_chunks;
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) tot[i] = 0.0f;
    for (int c = 0; c < n; ++c) {
      const PipeState<kNumStages> cur = at;
      issue_chunk<kBlockN>(acc, smem, full, at, math_wg);  // chunk c -> acc (advances at)
      const ThreadScales ts = thread_scales<kBlockN>(smem, ready, cur, sa_slot, sb_slot);
      const float2 sa = ts.sa;
      const float4* sbq = ts.sbq;
      float4 pre[kPreloadQuads > 0 ? kPreloadQuads : 1];
#pragma unroll
      for (int m = 0; m < kPreloadQuads; ++m) pre[m] = sbq[4 * m];
      device::wgmma_wait_group_sync_aligned<0>();  // chunk c retired
      device::wgmma_fence_operand(acc);            // reads of acc stay below the wait
#pragma unroll
      for (int m = 0; m < kQuads; ++m)
        promote_quad<kBlockN>(tot, acc, m, sa, m < kPreloadQuads ? pre[m] : sbq[4 * m]);
      // Stage cur.s is no longer read: its wgmmas are retired, its floats consumed (the arrive's
      // release orders this warp's loads, __syncwarp the other lanes').
      __syncwarp();
      if (lane == 0) arrive_empty<false>(&empty[cur.s]);
    }
    store_tile_any<kBlockN, kNumStages, false, true, kOutF32, kOut>(p, tm_y, sched, t, tot, smem, math_wg, warp,
                                                                         lane, r_tile, c_frag);
  }
  finish_tile_stores<kOut>();
}

// ---- fast mode, wide tiles, B scales per 128x128 block (kBlockB != kNone; m-grouped only) --------
//
// gemm.h FastScaleLayout::kBlock128: B's scale is one per (expert, 128-chunk, 128-row block of N), so
// a thread's 96 accumulators (rows r, r + 8; columns 8j + c_frag (+1), j < 24) need only four
// products sa[row]·sb[block]: 2 rows × the tile's 2 blocks (a 192-wide n-tile at n0 = 192·q spans
// blocks n0/128 and n0/128 + 1). Columns 8j + c with j < kSplitJ lie in the first block:
// kSplitJ = (128 - n0 % 128) / 8, i.e. 16 when n0 % 128 == 0 (q even) and 8 when it is 64 (q odd);
// the split falls between fragment column groups, so each tile runs one of two unrolled chunk loops
// (DeepGEMM's 1D2D kernel selects its loop the same way) rather than a select per column.
// Arithmetic per element: tot = fmaf(acc, sa·sb, tot) with sa·sb formed in FP32 exactly as
// promote_quad forms sa·sb[col]: when every row of a block carries the block's scale in the 1x128
// form, the two forms give bitwise the same output (GemmGpu.BlockScalesBitwiseMatchRowScales).
template <int kBlockN, int kSplitJ>
__device__ __forceinline__ void promote_block_split(float (&tot)[kBlockN / 2], const float (&acc)[kBlockN / 2],
                                                    float2 sa, float2 sb) {
  static_assert(kSplitJ > 0 && kSplitJ <= kBlockN / 8, "the first block holds at least one column group");
  const float lo0 = sa.x * sb.x, lo1 = sa.y * sb.x;  // rows r, r + 8 x the first block
  const float hi0 = sa.x * sb.y, hi1 = sa.y * sb.y;  // ... x the second block
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j) {
    const float p0 = j < kSplitJ ? lo0 : hi0, p1 = j < kSplitJ ? lo1 : hi1;
    tot[4 * j + 0] = fmaf(acc[4 * j + 0], p0, tot[4 * j + 0]);
    tot[4 * j + 1] = fmaf(acc[4 * j + 1], p0, tot[4 * j + 1]);
    tot[4 * j + 2] = fmaf(acc[4 * j + 2], p1, tot[4 * j + 2]);
    tot[4 * j + 3] = fmaf(acc[4 * j + 3], p1, tot[4 * j + 3]);
  }
}

// math_fast_single's schedule (one accumulator per warpgroup, stage handed back after the promotion)
// with promote_block_split. Per chunk a thread loads two float2 (its rows' decoded A scales, the
// tile's two decoded block scales), both before the wgmma wait.
template <int kBlockN, int kNumStages, bool kOutF32, OutStore kOut, class Scheduler>
__device__ __forceinline__ void math_fast_single_block(const Params& p, uint8_t* smem, const Scheduler& sched,
                                                       uint64_t* full, uint64_t* empty, uint64_t* ready,
                                                       const CUtensorMap* tm_y) {
  static_assert(kBlockN == 192, "block scales: 128 x 192 tiles");
  // Through a shuffle so that the compiler knows it is warp-uniform (descriptors in uniform regs).
  const int math_wg = __shfl_sync(0xFFFFFFFFu, int(threadIdx.x) / 128 - 1, 0);  // 0, 1
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int r_tile = math_wg * 64 + warp * 16 + lane / 4;  // fragment rows r_tile, r_tile + 8
  const int c_frag = 2 * (lane % 4);                       // fragment columns 8j + c_frag (+1)
  const int sa_slot = scale_a_slot(r_tile);

  PipeState<kNumStages> at;
  float acc[kBlockN / 2], tot[kBlockN / 2];
  // The chunks of one tile, with the first block's column groups j < split (a compile-time value).
  const auto reduce_tile = [&](int num_chunks, auto split) {
    for (int c = 0; c < num_chunks; ++c) {
      const PipeState<kNumStages> cur = at;
      issue_chunk<kBlockN>(acc, smem, full, at, math_wg);  // chunk c -> acc (advances at)
      // sb_slot 0: the decoded B slot starts with the tile's two block scales
      const ThreadScales ts = thread_scales<kBlockN>(smem, ready, cur, sa_slot, 0);
      const float2 sb = *reinterpret_cast<const float2*>(ts.sbq);
      device::wgmma_wait_group_sync_aligned<0>();  // chunk c retired
      device::wgmma_fence_operand(acc);            // reads of acc stay below the wait
      promote_block_split<kBlockN, decltype(split)::value>(tot, acc, ts.sa, sb);
      __syncwarp();  // stage cur.s no longer read (as in math_fast_single)
      if (lane == 0) arrive_empty<false>(&empty[cur.s]);
    }
  };
  for (int t = blockIdx.x; t < sched.num_tiles; t += gridDim.x) {
    const Tile x = sched.tile(t);
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) tot[i] = 0.0f;
    if (x.sb_x % 128 == 0)  // sb_x = n0 or k0, a multiple of 192: % 128 is 0 or 64
      reduce_tile(x.num_chunks, std::integral_constant<int, 128 / 8>{});
    else
      reduce_tile(x.num_chunks, std::integral_constant<int, 64 / 8>{});
    store_tile_any<kBlockN, kNumStages, false, true, kOutF32, kOut>(p, tm_y, sched, t, tot, smem, math_wg, warp,
                                                                         lane, r_tile, c_frag);
  }
  finish_tile_stores<kOut>();
}

// ---- 2-CTA multicast (kMulticast; off by default: kConfigClusterMulticast, kConfigExactMulticast) --
//
// A cluster of two CTAs (ranks 0, 1 = blockIdx.x % 2) works on two tiles that share the A tile
// (scheduler kPair = 2: n-tiles 2q, 2q + 1 of one m-tile; k-grouped: k-tiles 2q, 2q + 1 of one
// (expert, n-tile)). Per chunk each producer loads half of A (rows 64·rank..) with one multicast
// TMA into both CTAs, its own B, and both scale boxes locally: per CTA 8 + 16 KB of tiles from L2
// instead of 16 + 16 (-25% L2->SM bytes per FLOP).
// Exact mode (m-grouped, 128 x 256 tiles on BF16 images) pairs m-tiles instead (kPairM: m-tiles
// 2q, 2q + 1 of one band and one n-tile, as CUTLASS's 2x1 clusters and torch's BF16 grouped GEMM
// do): each producer loads its A locally and half of B (rows 128·rank..) into both CTAs when both
// m-tiles belong to one expert (Tile::b_shared), else both halves of its own B locally; per CTA
// 16 + 16 KB a stage instead of 16 + 32 (-33%). I1-I6 hold as stated with "B" for "A"; the phantom
// of an odd band recomputes its partner's tile and stores nothing.
// Barrier invariants (each CTA has its own ring):
//  I1 Same walk. Both CTAs visit the same units in the same order (t = blockIdx.x, stepping by the
//     even gridDim.x; tiles 2u, 2u + 1 go to one cluster in the same iteration) with the same
//     chunk count, so chunk c of unit u uses the same stage s and phase in both rings. Phantom
//     tiles keep this: they load, compute and arrive like real ones and only skip the stores.
//  I2 full[s] (1 local arrival + kTxBytes per pass): the local producer's arrive_expect_tx, 8 KB
//     of A from each producer's multicast, B and the scales from the local producer. The partner's
//     complete_tx may land before the local expect_tx; the phase cannot complete early because
//     its one arrival (the local producer's) is still pending, and transaction counts may go
//     transiently negative within a phase.
//  I3 empty[s] (16 arrivals per pass: every math warp of both CTAs, release.cluster via mapa). A
//     producer writes stage s of BOTH CTAs, so it waits (acquire.cluster) until both CTAs'
//     consumers have released the previous pass: no write-after-read on either side.
//  I4 No lapping. The partner's pass-k+1 write to my full[s] comes after its wait on its empty[s]
//     for pass k, which needs my math warps' arrivals for pass k, which follow their wait on my
//     full[s] for pass k: my full[s] phase k has completed first. Symmetrically, an arrival for
//     pass k+1 on my empty[s] needs that pass's full[s] in the arriving CTA, which needs my
//     producer's pass-k+1 multicast, issued after my empty[s] pass k completed.
//  I5 ready[s] (decoded scales) stays CTA-local; its invariant (decode_fast_scales) is unchanged,
//     because full[s] of the next pass still needs the local producer's arrival after its empty[s]
//     wait, i.e. after every local math warp finished reading stage s's floats.
//  I6 Start/exit. Both CTAs initialise their barriers and meet at a cluster barrier before any
//     remote arrival or multicast. At the end every thread meets at a cluster barrier again, so
//     no CTA exits while its partner may still arrive on its empty barriers (the multicast writes
//     into a CTA are all consumed by that CTA's own math warps before they get there).

// kKGrouped selects the schedule: false = m-grouped (forward/dgrad), true = k-grouped (wgrad).
// kPipelined (fast mode only) selects decode_fast_scales + math_fast_pipelined (or, for wide
// tiles, math_fast_single) over the serial fast path math_fast_serial; kExact runs math_exact on
// BF16 images. kMulticast: launched as 2-CTA clusters, see above; fast mode shares A (pairs of
// n-tiles), exact mode (m-grouped, 256 wide) shares B (pairs of m-tiles, MGroupedScheduler kPairM).
// kOut (store_tile_any): kTma (wide tiles; not BF16 with accumulate) the TMA-store epilogue
// (store_tile_tma) through tm_y; kRows (wide tiles, m-grouped BF16) the row epilogue to the row table
// (store_tile_rows + row_store_warp in producer warps 2 and 3); tm_y is unused otherwise.
// kBlockB != kNone (m-grouped, 192-wide pipelined fast mode, kDirect or kTma): B's fast scales in
// 128x128 blocks (FastScaleLayout::kBlock128), read by the decoder from global memory (kLdg) or
// from the producer's aligned TMA boxes (kTma), decode_fast_scales' two block floats,
// math_fast_single_block. (A trailing parameter: the other kernels' code is unchanged, their names
// gain "(BlockScalesB)0".)
template <int kBlockN, int kNumStages, bool kExact, bool kOutF32, bool kKGrouped, bool kPipelined,
          bool kMulticast = false, OutStore kOut = OutStore::kDirect, BlockScalesB kBlockB = BlockScalesB::kNone>
__global__ void __launch_bounds__(kNumThreads, 1)
grouped_gemm_mxfp8_sm90_ws_kernel(const __grid_constant__ CUtensorMap tm_a,
                                  const __grid_constant__ CUtensorMap tm_b,
                                  const __grid_constant__ CUtensorMap tm_sa,
                                  const __grid_constant__ CUtensorMap tm_sb, const Params p,
                                  const __grid_constant__ CUtensorMap tm_y) {
  static_assert(!(kExact && kPipelined), "the pipelined schedule is fast mode's");
  static_assert(!(kExact && kMulticast) || (!kKGrouped && kBlockN == 256),
                "exact multicast (B shared): m-grouped, 256-wide tiles (kConfigExactWideBlockN)");
  static_assert(kBlockN == 128 || (kPipelined && !kMulticast) || kExact,
                "wide tiles: pipelined fast mode without multicast (192) or exact mode (256)");
  static_assert(kBlockM % 32 == 0 && kBlockN % 32 == 0, "decoder: whole rounds of 32 lanes");
  static_assert(!kMulticast || (kBlockM / 2) % 8 == 0,
                "multicast halves of A keep whole 1024-byte swizzle atoms");
  static_assert(kOut == OutStore::kDirect || (kBlockN > 128 && (!kMulticast || kExact) && (kPipelined || kExact)),
                "the TMA-store and row epilogues: wide tiles (fast 192, exact 256)");
  static_assert(kOut != OutStore::kRows || !kMulticast, "the row epilogue: one CTA a tile");
  static_assert(kOut != OutStore::kRows || (!kOutF32 && !kKGrouped), "the row epilogue: m-grouped BF16");
  constexpr bool kBlockScalesB = kBlockB != BlockScalesB::kNone;
  static_assert(!kBlockScalesB || (kPipelined && kBlockN == 192 && !kMulticast && kOut != OutStore::kRows),
                "B block scales: 192-wide fast mode, direct or TMA-store epilogue");
  constexpr int kClusterSize = kMulticast ? 2 : 1;
  using L = SmemLayout<kBlockN, kNumStages, kExact, kPipelined, out_stage_bytes_for<kBlockN, kOut>(), kBlockScalesB>;
  using L0 = SmemLayout<kBlockN, kNumStages, kExact, false, 0, kBlockScalesB>;  // what producer() and math_*() index with
  static_assert(L::kOffA == L0::kOffA && L::kOffB == L0::kOffB && L::kOffScaleA == L0::kOffScaleA &&
                    L::kOffScaleB == L0::kOffScaleB && L::kTxBytes == L0::kTxBytes,
                "the pipelined layout only appends to the serial one");
  extern __shared__ uint8_t smem_raw[];
  // Pointer arithmetic on the shared array itself, so the compiler keeps LDS/STS (not generic).
  // Same offset in every CTA (same kernel), as multicast requires.
  uint8_t* smem = smem_raw + ((1024u - (device::smem_addr(smem_raw) & 1023u)) & 1023u);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kOffBarriers);
  uint64_t* empty = full + kNumStages;
  uint64_t* ready = empty + kNumStages;  // kPipelined only: decoded scales of stage s written
  int32_t* s_off = reinterpret_cast<int32_t*>(smem + L::kOffOffsets);

  for (int i = threadIdx.x; i <= p.num_experts; i += kNumThreads) s_off[i] = p.offsets[i];
  if (threadIdx.x == 0) {
    for (int i = 0; i < kNumStages; ++i) {
      device::mbarrier_init(&full[i], 1);  // the producer's arrive_expect_tx (+ TMA bytes)
      // one arrival per math warp (of both CTAs when multicasting: I3)
      device::mbarrier_init(&empty[i], 4 * kNumMathWarpgroups * kClusterSize);
      if (kPipelined) device::mbarrier_init(&ready[i], 32);      // every decoder lane arrives
    }
    device::fence_mbarrier_init_release_cluster();
    device::fence_proxy_async_shared_cta();
  }
  __syncthreads();
  if constexpr (kKGrouped) {
    k_grouped_expert_order(s_off, p, reinterpret_cast<uint16_t*>(smem + L::kOffOrder), int(threadIdx.x), kNumThreads);
    __syncthreads();
  }
  uint32_t rank = 0;
  if constexpr (kMulticast) {  // I6: the partner's barriers exist before any remote access
    rank = device::cluster_ctarank();
    device::barrier_cluster_arrive_release();
    device::barrier_cluster_wait_acquire();
  }

  constexpr int kPair = kMulticast ? 2 : 1;
  constexpr int kChunkK = chunk_k<kExact>();
  using Scheduler = std::conditional_t<kKGrouped, KGroupedScheduler<kBlockN, kPair, kChunkK>,
                                       MGroupedScheduler<kBlockN, kPair, kChunkK, kExact && kMulticast>>;
  // Wide tiles (kBlockN > 128): each role builds its scheduler after its setmaxnreg; built once
  // before it, ptxas spilled scheduler fields across the register reallocation (k-grouped and
  // m-grouped FP32 kernels). The 128-wide kernels keep the single construction (SASS unchanged).
  constexpr bool kLateScheduler = kBlockN > 128;
  const Scheduler sched_early(s_off, p);  // dead when kLateScheduler
  if (threadIdx.x < 128) {
    device::setmaxnreg_dec_sync_aligned_u32<kProducerRegs>();
    const Scheduler sched = kLateScheduler ? Scheduler(s_off, p) : sched_early;
    if (kPipelined && threadIdx.x / 32 == 1) {  // producer warp 1 decodes scales; warp 0 lane 0 issues TMA
      if constexpr (kPipelined) decode_fast_scales<kBlockN, kNumStages, kBlockB>(smem, sched, full, ready);
    } else if (kOut == OutStore::kRows && threadIdx.x / 32 >= 2) {  // warps 2, 3: row stores of math wg 0, 1
      if constexpr (kOut == OutStore::kRows) {
        const int wg = int(threadIdx.x) / 32 - 2;
        row_store_warp<kBlockN>(p, sched, smem + L::kOffOut + wg * (row_stage_bytes<kBlockN>() / kNumMathWarpgroups),
                                wg, int(threadIdx.x) % 32);
      }
    } else {
      producer<kBlockN, kNumStages, kExact, kMulticast, kBlockB>(&tm_a, &tm_b, &tm_sa, &tm_sb, smem, sched, full,
                                                                 empty, rank);
    }
  } else {
    device::setmaxnreg_inc_sync_aligned_u32<kMathRegs>();
    const Scheduler sched = kLateScheduler ? Scheduler(s_off, p) : sched_early;
    if constexpr (kBlockScalesB)  // wide tile, B scales per 128x128 block
      math_fast_single_block<kBlockN, kNumStages, kOutF32, kOut>(p, smem, sched, full, empty, ready, &tm_y);
    else if constexpr (kPipelined && kBlockN <= 128)  // two accumulators fit: ping-pong
      math_fast_pipelined<kBlockN, kNumStages, kOutF32, kMulticast>(p, smem, sched, full, empty, ready);
    else if constexpr (kPipelined)  // wide tile: one accumulator per warpgroup
      math_fast_single<kBlockN, kNumStages, kOutF32, kOut>(p, smem, sched, full, empty, ready, &tm_y);
    else if constexpr (kExact)  // BF16 images, no promotion
      math_exact<kBlockN, kNumStages, kOutF32, kOut, kMulticast>(p, smem, sched, full, empty, &tm_y);
    else
      math_fast_serial<kBlockN, kNumStages, kOutF32, kMulticast>(p, smem, sched, full, empty);
  }
  if constexpr (kMulticast) {  // I6: no CTA leaves while its partner may still arrive on it
    device::barrier_cluster_arrive_release();
    device::barrier_cluster_wait_acquire();
  }
}

// ---- host side --------------------------------------------------------------------------------

// Configuration (both groupings):
//   kBlockN = 128: m64n128k32 wgmma per math warpgroup, 64 + 64 accumulator registers.
//   kNumStages = 6: 6 × 32 KB operand tiles (+ scales, + 1 KB decoded scales when pipelined)
//   fit 227 KB in both modes.
//   kConfigFastPipelined: fast mode's schedule. true = ping-pong accumulators per math warpgroup
//   + scales decoded once per stage by producer warp 1 (math_fast_pipelined); false = the
//   original serial schedule (math_fast_serial: issue, wait 0, decode scales in every thread, promote).
//   Both give bitwise identical results. Measured alternatives: docs/notes/gemm.md.
//   kConfigClusterMulticast: fast mode as 2-CTA clusters sharing the A tile by TMA multicast
//   (-25% L2->SM bytes per FLOP). Bitwise identical results (same tiles, same chunk order; GPU
//   test passes). Measured in run 16: no faster (0.96-1.02x the default path, slower on the down
//   projections), so L2->SM bandwidth is not what limits the kernel; off by default. The
//   environment variable MXMOE_GEMM_MULTICAST=1 (or 0) overrides it per call.
// To measure (docs/notes/gemm.md): the wide tile (below), epilogue overlapped with the next
// tile's first chunk, multicast of both operands (2×2 clusters).
//   kConfigFastBlockN: the m-grouped GEMM's fast tile width. 128 = the kernel above (ping-pong);
//   192 = wide tiles, one accumulator per math warpgroup (math_fast_single), 5 stages of 40 KB.
//   Measured (bench_gemm --tile-both, T = 2048/expert, 12 forward cases a run): run 25 0.91-1.11x,
//   run 39 1.01-1.12x on 11 of 12 (0.92 on DSV3 gate-up skewed); in the layer (bench_layer
//   --variant MXMOE_GEMM_TILE=192, T = 16384) DeepSeek-V3 EP8 fwd+bwd 2.3-5.5% faster in all four
//   comparisons of runs 45 and 47, Qwen3-30B +2.4% uniform, -5.3% skewed (run 45, one sample).
//   So 192 is the m-grouped default since session 6; wgrad picks by k (k_grouped_fast_block_n).
//   GemmOptions::fast_tile_n sets it per call (expert-centric decode keeps 128, the width its
//   crossover table was measured with); MXMOE_GEMM_TILE=192 (or 128) overrides both per call.
//   Wide tiles never multicast (MXMOE_GEMM_MULTICAST is then ignored).
//   kConfigExactBlockN: exact mode's tile width (BF16 images, math_exact). 256 = m64n256k16 per
//   math warpgroup (acc 128 registers), 4 stages of 48 KB; 128 = m64n128k16, 6 stages of 32 KB.
//   256 is the default by reasoning, not yet by measurement (docs/notes/gemm.md, "Exact mode on a
//   BF16 image"): per 64-K stage the 128 x 256 tile moves 48 KB by TMA and 80 KB of wgmma operand
//   reads for 1024 tensor cycles (125 B/clk of shared memory), the 128 x 128 tile 32 + 48 KB for
//   512 (156 B/clk, above the ~128 B/clk the SM's shared memory delivers); cuBLAS/CUTLASS BF16 on
//   Hopper use 128 x 256 for the same reason. MXMOE_GEMM_EXACT_TILE=128 (or 256) overrides it per
//   call, to compare the two on the GPU.
constexpr int kConfigBlockN = 128;
constexpr int kConfigStages = 6;
constexpr bool kConfigFastPipelined = true;
constexpr bool kConfigClusterMulticast = false;
//   kConfigExactMulticast: exact m-grouped 256-wide tiles as 2-CTA clusters sharing B (pairs of
//   m-tiles, MGroupedScheduler kPairM; -33% L2->SM bytes a stage). Same bytes as the plain kernel
//   (GemmGpu.ExactMulticastBitwiseMatchesDefault). Measured in run 100: 0.85-0.97x the default on
//   all 24 m-grouped bench cases, so off by default (docs/notes/gemm.md, "Runs 99-100");
//   MXMOE_GEMM_EXACT_MULTICAST=1 (or 0) overrides it per call (exact_multicast_requested).
constexpr bool kConfigExactMulticast = false;
constexpr int kConfigFastBlockN = 192;
// Measured and deleted (docs/notes/gemm.md): the ping-pong schedule with scales loaded before the
// wgmma wait (run 30: 0.91-1.03x) and a 128-wide one-accumulator schedule with the scale products
// formed under the wgmmas (run 39: 0.77-0.93x on the forward).
constexpr int kConfigWideBlockN = 192;
constexpr int kConfigWideStages = 5;  // 5 × (16 + 24 KB) + scales = 211 KB of 227
//   kConfigTmaStore: wide tiles (fast 192, exact 256; both groupings) write their output through
//   shared memory and TMA stores (store_tile_tma), overlapping the next tile's math; the staging
//   (48 / 64 KB) leaves room for 4 stages instead of 5 (fast), 3 instead of 4 (exact; not yet
//   measured). Not for BF16 output with accumulate
//   (TMA's BF16 reduce-add would round the addend first). MXMOE_GEMM_TMA_STORE=0 (or 1) overrides
//   it per call. Same bytes (GemmGpu tests). Measured (run 51, m-grouped BF16): 1.07-1.44x the
//   direct-store 192 kernel on bench_gemm's forward shapes; DeepSeek-V3 layer -1.7 to -2.1 ms.
constexpr bool kConfigTmaStore = true;
constexpr int kConfigTmaStoreStages = 4;  // fast 192: 4 × (16 + 24 KB) + scales + 48 KB staging = 218 KB of 227
constexpr int kConfigExactTmaStoreStages = 3;  // exact 256: 3 × (16 + 32 KB) + 64 KB staging = 212 KB
constexpr int kConfigExactBlockN = 256;
constexpr int kConfigExactWideBlockN = 256;
constexpr int kConfigExactWideStages = 4;  // 4 × (16 + 32 KB) = 192 KB of 227 (5 would not fit)

// Stages for a tile width (the widths the host launches: 192 is fast mode's, 256 exact mode's).
template <int kBlockN>
constexpr int stages_for() {
  static_assert(kBlockN == kConfigBlockN || kBlockN == kConfigWideBlockN ||
                    kBlockN == kConfigExactWideBlockN, "instantiated widths");
  return kBlockN == kConfigWideBlockN        ? kConfigWideStages
         : kBlockN == kConfigExactWideBlockN ? kConfigExactWideStages
                                             : kConfigStages;
}

// Which kernel a call runs, from the compile-time defaults and the environment (read on every
// call, so that one process can time every path). Fast mode: block_n 128 or 192
// (MXMOE_GEMM_TILE), multicast (MXMOE_GEMM_MULTICAST "1" on, "0" off; 128-wide only). Exact mode:
// block_n 256 or 128 (MXMOE_GEMM_EXACT_TILE); multicast only where the m-grouped launcher sets it
// (exact_multicast_requested, 256 wide: clusters sharing B), never here.
struct KernelPath {
  int block_n = kConfigBlockN;
  bool multicast = false;
  bool tma_store = false;  // set by the launchers (use_tma_store)
  bool rows = false;       // the row epilogue (OutStore::kRows): set by the EP layer's entry only
  bool block_scales_b = false;  // B's fast scales in 128x128 blocks (block_n 192): block_scales_path
  bool block_scales_ldg = true;  // ... read by the decoder from global memory, else TMA (block_scales_load_ldg)
};

// Whether a call on `path` takes the TMA-store epilogue: wide fast tiles, FP32 output or BF16
// without accumulate; kConfigTmaStore unless MXMOE_GEMM_TMA_STORE says otherwise (read per call).
inline bool tma_store_requested() {
  const char* v = std::getenv("MXMOE_GEMM_TMA_STORE");
  return (v != nullptr && v[0] != '\0') ? v[0] != '0' : kConfigTmaStore;
}
// k-grouped: walk the experts by token count, largest first (k_grouped_expert_order; the default),
// unless MXMOE_GEMM_K_ORDER=index (read per call). Same results either way.
inline bool k_grouped_sort_experts() {
  const char* v = std::getenv("MXMOE_GEMM_K_ORDER");
  if (v == nullptr || v[0] == '\0' || std::strcmp(v, "tokens") == 0) return true;
  if (std::strcmp(v, "index") == 0) return false;
  throw Error(std::string("mxmoe: environment variable MXMOE_GEMM_K_ORDER = '") + v +
              "': must be 'tokens' (default) or 'index'");
}
// B in 128x128 blocks: how the kernel gets the block bytes (BlockScalesB), from
// MXMOE_GEMM_BLOCK_SCALES_LOAD (read per call): "ldg" (default) the decoder warp reads them from
// global memory (kLdg), "tma" the producer's aligned TMA boxes (kTma). Same results either way.
// Another value throws (before any CUDA call), naming the variable.
inline bool block_scales_load_ldg(const char* fn) {
  const char* v = std::getenv("MXMOE_GEMM_BLOCK_SCALES_LOAD");
  if (v == nullptr || v[0] == '\0' || std::strcmp(v, "ldg") == 0) return true;
  if (std::strcmp(v, "tma") == 0) return false;
  detail::throw_arg(fn, "MXMOE_GEMM_BLOCK_SCALES_LOAD", std::string("'") + v + "'",
                    "environment variable: must be 'ldg' (default) or 'tma'");
}
// k-grouped: the tile order within an expert (Params::k_raster_group = G | (min_chunks << 16)). G n-tiles
// per raster group, chosen so that the `grid` tiles in flight span as few operand rows as they can:
// G ≈ sqrt(grid · block_n / 128) minimises 128·G + block_n·grid/G (G = 16 for 132 SMs and 256-wide
// exact k-tiles, 14 for 192); at most the n-tile count. An expert takes the groups only when it holds
// at least 128·min_chunks tokens, else the n-major order. Default by mode: exact mode groups for
// every expert (run 87, reps 9 in alternation: the groups beat n-major 1.04-1.24x on every skewed
// wgrad shape at 8192 tokens an expert and tie it within 2% on the uniform ones; session 11's rule
// "groups only for experts of >= 16384 tokens", from reps-3 runs, lost 0.84 vs 1.04x BF16 on DSV3
// gate-up skewed), fast mode n-major everywhere (the groups cost fast mode up to 7% on DeepSeek-V3,
// run 70; they gain 1.2x on Qwen3-235B gate-up at 8192, run 80: no rule yet).
// MXMOE_GEMM_K_RASTER (read per call) overrides it: "group" = G for every expert, "nmajor" = n-major
// everywhere, a number = that G for every expert, "auto:N" = G for experts of at least N tokens
// (rounded up to whole 128-token chunks; both modes); unset or "auto" = the default by mode. Same
// results whatever the order.
inline int k_grouped_raster_group(int grid, int block_n, int64_t n, bool exact) {
  const int n_tiles = int((n + kBlockM - 1) / kBlockM);
  const char* v = std::getenv("MXMOE_GEMM_K_RASTER");
  int g = int(std::lround(std::sqrt(double(grid) * block_n / kBlockM)));
  long min_tokens = 0;
  const auto bad = [&]() {
    throw Error(std::string("mxmoe: environment variable MXMOE_GEMM_K_RASTER = '") + v +
                "': must be 'auto' (default), 'auto:N' (N tokens, 0..4194176), 'group', 'nmajor' or a number of "
                "n-tiles in 0..65535");
  };
  if (v == nullptr || v[0] == '\0' || std::strcmp(v, "auto") == 0) {
    if (!exact) return 0;
  } else if (std::strncmp(v, "auto:", 5) == 0) {
    char* end = nullptr;
    min_tokens = std::strtol(v + 5, &end, 10);
    if (end == v + 5 || *end != '\0' || min_tokens < 0 || min_tokens > 32767L * kBlockK) bad();
  } else if (std::strcmp(v, "nmajor") == 0) {
    return 0;
  } else if (std::strcmp(v, "group") != 0) {
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || x < 0 || x > 65535) bad();
    g = int(x);
  }
  g = std::max(0, std::min(g, n_tiles));
  const int min_chunks = int((min_tokens + kBlockK - 1) / kBlockK);
  return g == 0 ? 0 : g | (min_chunks << 16);
}
inline bool use_tma_store(const KernelPath& path, bool exact, bool out_f32, bool accumulate) {
  if (path.block_n != (exact ? kConfigExactWideBlockN : kConfigWideBlockN) || (!out_f32 && accumulate)) return false;
  return tma_store_requested();
}

// Fast mode with B in 128x128 blocks (FastScaleLayout::kBlock128, checked by the caller): the 192-wide
// block kernel whatever MXMOE_GEMM_TILE / MXMOE_GEMM_MULTICAST say (opts.fast_tile_n must be 0 or 192),
// the block bytes loaded as MXMOE_GEMM_BLOCK_SCALES_LOAD says, the TMA-store epilogue where it applies.
inline KernelPath block_scales_path(const char* fn, const GemmOptions& opts) {
  if (opts.fast_tile_n == 128)
    detail::throw_arg(fn, "opts.fast_tile_n", "128",
                      "must be 0 or 192 with b.fast_scale_layout = kBlock128 (that form runs on 128 x 192 tiles only)");
  KernelPath path;
  path.block_n = kConfigWideBlockN;
  path.block_scales_b = true;
  path.block_scales_ldg = block_scales_load_ldg(fn);  // MXMOE_GEMM_BLOCK_SCALES_LOAD
  path.tma_store = use_tma_store(path, false, opts.out_dtype == GemmOutDtype::kFP32, opts.accumulate);
  return path;
}

// m-grouped exact mode: clusters sharing B (kConfigExactMulticast unless MXMOE_GEMM_EXACT_MULTICAST,
// read per call, says "1" or "0"). Another value throws (before any CUDA call), naming the variable.
inline bool exact_multicast_requested(const char* fn) {
  const char* v = std::getenv("MXMOE_GEMM_EXACT_MULTICAST");
  if (v == nullptr || v[0] == '\0') return kConfigExactMulticast;
  if (std::strcmp(v, "1") == 0) return true;
  if (std::strcmp(v, "0") == 0) return false;
  detail::throw_arg(fn, "MXMOE_GEMM_EXACT_MULTICAST", std::string("'") + v + "'",
                    "environment variable: must be '1' or '0'");
}

// fast_block_n: the caller's default width for fast mode (kConfigFastBlockN, or a width chosen
// from the shape, see k_grouped_fast_block_n).
inline KernelPath choose_kernel_path(bool exact, int fast_block_n = kConfigFastBlockN) {
  KernelPath k;
  if (exact) {
    const char* tile = std::getenv("MXMOE_GEMM_EXACT_TILE");
    k.block_n = kConfigExactBlockN;
    if (tile != nullptr && tile[0] != '\0') k.block_n = std::atoi(tile) == 128 ? 128 : kConfigExactWideBlockN;
    return k;
  }
  k.block_n = fast_block_n;
  const char* tile = std::getenv("MXMOE_GEMM_TILE");
  if (tile != nullptr && tile[0] != '\0') k.block_n = std::atoi(tile) == 192 ? 192 : 128;
  if (k.block_n != kConfigBlockN) return k;
  const char* mc = std::getenv("MXMOE_GEMM_MULTICAST");
  k.multicast = (mc != nullptr && mc[0] != '\0') ? mc[0] != '0' : kConfigClusterMulticast;
  return k;
}

// Wgrad's default tile width: 192 when dW has at least 1024 columns (k). Measured in run 25
// (bench_gemm --quick --wgrad --tile-both, T = 2048/expert, uniform and skewed): 192 ran
// 1.02-1.24x the 128-wide kernel on all 10 wgrad cases with k >= 1536 (Qwen3-30B/235B,
// DeepSeek-V3 EP8) and 0.91-0.93x on the two with k = 768 (Qwen3-30B down). With the TMA-store
// epilogue 192 also wins at k = 768: run 52 measured 912 / 745 TFLOP/s against 741 / 708 for 128
// wide (1.23x / 1.05x, uniform / skewed), so with the epilogue on 192 is the width for every k.
// MXMOE_GEMM_TILE overrides.
inline int k_grouped_fast_block_n(int64_t k) {
  return k >= 1024 || tma_store_requested() ? kConfigWideBlockN : kConfigBlockN;
}

// Rows of the A box: half a tile per CTA when multicasting in fast mode (each CTA loads its half for
// both). Exact mode's clusters share B instead: b_box_rows.
inline uint32_t a_box_rows(bool multicast, bool exact = false) {
  return multicast && !exact ? kBlockM / 2 : kBlockM;
}
inline uint32_t b_box_rows(bool multicast, bool exact, int block_n) {
  return multicast && exact ? uint32_t(block_n / 2) : uint32_t(block_n);
}

// TMA map of one operand's K-major data [rows, kdim] in the form its mode reads, as bytes: fast
// mode its fast_data (E4M3, kdim bytes per row), exact mode its BF16 image (2·kdim bytes per row;
// a box of 128 bytes is 64 elements, zero fill is BF16 +0). Boxes [box_rows, 128 B], 128B swizzle.
inline CUtensorMap operand_map(const char* fn, const MxOperand& x, bool exact, int64_t rows,
                               int64_t kdim, uint32_t box_rows) {
  const int64_t row_bytes = exact ? 2 * kdim : kdim;
  const void* base = exact ? static_cast<const void*>(x.image) : static_cast<const void*>(x.fast_data);
  return detail::make_tensor_map_2d_u8(fn, base, uint64_t(rows), uint64_t(row_bytes), uint64_t(row_bytes),
                                       box_rows, kBlockK, CU_TENSOR_MAP_SWIZZLE_128B);
}

// TMA map of a k-grouped operand's token-blocked BF16 image (ImageLayout::kTokenBlocked,
// [kdim/128][rows][128] BF16, kdim = M_total a multiple of 128) as bytes: a 3-D map {256 B (one
// block's 128 tokens of a row), rows, kdim/128}, strides 256 B and rows·256 B, box [1, box_rows,
// 128 B] (64 tokens, one exact chunk), 128B swizzle and L2 promotion as operand_map's. Rows past
// `rows` (a partial last tile) read zero fill as with operand_map. The producer loads it with
// load_operand_box (blocked = true).
inline CUtensorMap token_blocked_image_map(const char* fn, const __nv_bfloat16* image, int64_t rows, int64_t kdim,
                                           uint32_t box_rows) {
  constexpr uint64_t kRowBytes = 2 * kImageBlockCols;  // a row's piece of one token block
  return detail::make_tensor_map_3d_u8_load(fn, image, uint64_t(kdim / kImageBlockCols), uint64_t(rows), kRowBytes,
                                            kRowBytes, kRowBytes * uint64_t(rows), box_rows, kBlockK,
                                            CU_TENSOR_MAP_SWIZZLE_128B);
}

// The TMA-store epilogue's output map (store_tile_tma) of y [batch, rows, cols] (m-grouped: batch
// 1; k-grouped: dW [E, N, K], so that a box is clipped at its own expert's N): BF16 as bytes in
// boxes of [1, 64, 128 B], FP32 as f32 (typed, for reduce-add) in boxes of [1, 64, 32]; 128B
// swizzle. y 16-byte aligned and cols a multiple of 32 (both checked by the launchers).
inline CUtensorMap out_tma_map(const char* fn, void* y, bool out_f32, int64_t batch, int64_t rows, int64_t cols) {
  if (!out_f32)
    return detail::make_tensor_map_3d_u8(fn, y, uint64_t(batch), uint64_t(rows), uint64_t(2 * cols),
                                         uint64_t(2 * cols), uint64_t(2 * cols * rows), kOutBoxRows, 128,
                                         CU_TENSOR_MAP_SWIZZLE_128B);
  return detail::make_tensor_map_3d_f32(fn, y, uint64_t(batch), uint64_t(rows), uint64_t(cols), uint64_t(4 * cols),
                                        uint64_t(4 * cols * rows), kOutBoxRows, 32, CU_TENSOR_MAP_SWIZZLE_128B);
}

// TMA map of B's 128x128-block fast scales (FastScaleLayout::kBlock128, gemm.h; BlockScalesB::kTma):
// u8 [E·num_kc, pitch] with pitch = fast_block_scales_pitch(n) (>= 16, a multiple of 16) as both the
// row length and the row stride, boxes [1, kBlockScaleBox]; the producer loads them at 16-byte
// aligned block coordinates only (x = (n0/128) & ~15 and x + 16), so every box lies inside its row.
// (Run 76 loaded at x = n0/128 itself: cudaErrorIllegalInstruction, docs/notes/gemm.md "Session 10
// fixes".) Bytes in [ceil(n/128), pitch) may be loaded from the caller's padding; the decoder never
// uses them.
inline CUtensorMap block_scales_map(const char* fn, const uint8_t* scales, int num_experts, int64_t num_kc,
                                    int64_t n) {
  const uint64_t pitch = uint64_t(fast_block_scales_pitch(n));
  return detail::make_tensor_map_2d_u8(fn, scales, uint64_t(num_experts * num_kc), pitch, pitch, 1, kBlockScaleBox,
                                       CU_TENSOR_MAP_SWIZZLE_NONE);
}

// Launch configuration of 2-CTA clusters along x. It points at its own attribute, so it is neither
// copied nor moved: build it where it is used.
struct PairClusterLaunch {
  cudaLaunchAttribute attr[1];
  cudaLaunchConfig_t cfg{};
  PairClusterLaunch(unsigned grid, int smem, cudaStream_t stream) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 2;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(kNumThreads);
    cfg.dynamicSmemBytes = size_t(smem);
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  PairClusterLaunch(const PairClusterLaunch&) = delete;
  PairClusterLaunch& operator=(const PairClusterLaunch&) = delete;
};

// Clusters of `kernel` (2 CTAs of `smem` bytes) that fit on the device at once, cached per device
// (a GPC's SM count may be odd, so this can be below #SMs / 2).
template <auto kernel>
int max_active_pairs(const char* fn, int smem) {
  return detail::once_per_device<kernel, detail::MaxResidentTag>(fn, [&](int) {
    const PairClusterLaunch l(2, smem, nullptr);
    int clusters = 0;
    MXMOE_CUDA_CHECK(fn, cudaOccupancyMaxActiveClusters(&clusters, kernel, &l.cfg));
    if (clusters < 1)
      throw CudaError(std::string("mxmoe::") + fn + ": no 2-CTA cluster of the GEMM kernel fits");
    return clusters;
  });
}

template <int kBlockN, bool kExact, bool kOutF32, bool kKGrouped, OutStore kOut = OutStore::kDirect,
          BlockScalesB kBlockB = BlockScalesB::kNone>
void launch_grouped(const char* fn, bool multicast, const CUtensorMap& tm_a,
                    const CUtensorMap& tm_b, const CUtensorMap& tm_sa, const CUtensorMap& tm_sb,
                    const Params& p, int grid, cudaStream_t stream, const CUtensorMap& tm_y) {
  // Wide tiles exist only as the pipelined fast schedule.
  constexpr bool kPipelined = !kExact && (kConfigFastPipelined || kBlockN != kConfigBlockN);
  // The row epilogue's staging (50 / 66 KB) is 2 KB over the TMA one's, so it runs with the same stages.
  constexpr int kStages = kOut != OutStore::kDirect ? (kExact ? kConfigExactTmaStoreStages : kConfigTmaStoreStages)
                                                    : stages_for<kBlockN>();
  using L = SmemLayout<kBlockN, kStages, kExact, kPipelined, out_stage_bytes_for<kBlockN, kOut>(),
                       kBlockB != BlockScalesB::kNone>;
  // Multicast kernels: fast mode 128 wide (A shared), exact m-grouped 256 wide (B shared).
  constexpr bool kMayMulticast = kOut != OutStore::kRows && kBlockB == BlockScalesB::kNone &&
                                 (kExact ? !kKGrouped && kBlockN == kConfigExactWideBlockN : kBlockN == kConfigBlockN);
  if constexpr (kMayMulticast) {
    if (multicast) {
      constexpr auto kernel = grouped_gemm_mxfp8_sm90_ws_kernel<kBlockN, kStages, kExact, kOutF32,
                                                                kKGrouped, kPipelined, true, kOut>;
      detail::set_smem_limit_once<kernel>(fn, L::kAlloc);
      // An even grid (I1), at most the clusters that are co-resident, at least one cluster.
      const int pairs = std::max(1, std::min(grid / 2, max_active_pairs<kernel>(fn, L::kAlloc)));
      const PairClusterLaunch l(unsigned(2 * pairs), L::kAlloc, stream);
      MXMOE_CUDA_CHECK(fn, cudaLaunchKernelEx(&l.cfg, kernel, tm_a, tm_b, tm_sa, tm_sb, p, tm_y));
      MXMOE_CHECK_LAUNCH(fn);
      return;
    }
  }
  constexpr auto kernel = grouped_gemm_mxfp8_sm90_ws_kernel<kBlockN, kStages, kExact, kOutF32, kKGrouped,
                                                            kPipelined, false, kOut, kBlockB>;
  detail::set_smem_limit_once<kernel>(fn, L::kAlloc);
  kernel<<<grid, kNumThreads, L::kAlloc, stream>>>(tm_a, tm_b, tm_sa, tm_sb, p, tm_y);
  MXMOE_CHECK_LAUNCH(fn);
}

// One (width, mode): the four output forms, FP32 or BF16, with the TMA-store epilogue (wide
// widths only; use_tma_store never asks it of 128) or direct stores.
template <int kBlockN, bool kExact, bool kKGrouped, BlockScalesB kBlockB = BlockScalesB::kNone>
void launch_by_output(const char* fn, bool out_f32, bool tma_store, bool multicast, const CUtensorMap& tm_a,
                      const CUtensorMap& tm_b, const CUtensorMap& tm_sa, const CUtensorMap& tm_sb, const Params& p,
                      int grid, cudaStream_t stream, const CUtensorMap& tm_y) {
  constexpr OutStore kD = OutStore::kDirect, kT = OutStore::kTma;
  if constexpr (kBlockN > kConfigBlockN) {
    if (tma_store) {
      if (out_f32)
        launch_grouped<kBlockN, kExact, true, kKGrouped, kT, kBlockB>(fn, multicast, tm_a, tm_b, tm_sa, tm_sb, p,
                                                                      grid, stream, tm_y);
      else
        launch_grouped<kBlockN, kExact, false, kKGrouped, kT, kBlockB>(fn, multicast, tm_a, tm_b, tm_sa, tm_sb, p,
                                                                       grid, stream, tm_y);
      return;
    }
  }
  if (out_f32)
    launch_grouped<kBlockN, kExact, true, kKGrouped, kD, kBlockB>(fn, multicast, tm_a, tm_b, tm_sa, tm_sb, p, grid,
                                                                  stream, tm_y);
  else
    launch_grouped<kBlockN, kExact, false, kKGrouped, kD, kBlockB>(fn, multicast, tm_a, tm_b, tm_sa, tm_sb, p, grid,
                                                                   stream, tm_y);
}

// path: from choose_kernel_path (the A map's box must have a_box_rows(path.multicast) rows, the B
// map's box and the B scale map's box path.block_n rows). tm_y: the output map of the TMA-store
// epilogue (path.tma_store; out_tma_map), otherwise any map (unused). path.rows (m-grouped, BF16,
// the wide width of the mode): the row epilogue to the row table (Params::y). path.block_scales_b
// (m-grouped fast, block_n 192): B's scales in 128x128 blocks; path.block_scales_ldg: read from
// Params::b_block_scales (tm_sb unused), else tm_sb from block_scales_map.
template <bool kKGrouped>
void dispatch_grouped(const char* fn, bool exact, bool out_f32, const KernelPath& path,
                      const CUtensorMap& tm_a, const CUtensorMap& tm_b, const CUtensorMap& tm_sa,
                      const CUtensorMap& tm_sb, const Params& p, int grid, cudaStream_t stream,
                      const CUtensorMap& tm_y) {
  constexpr int kN = kConfigBlockN, kW = kConfigWideBlockN, kXW = kConfigExactWideBlockN;
  if constexpr (!kKGrouped) {
    if (path.rows) {  // checked by the caller: BF16 output, path.block_n the mode's wide width
      if (exact) launch_grouped<kXW, true, false, false, OutStore::kRows>(fn, false, tm_a, tm_b, tm_sa, tm_sb, p, grid,
                                                                          stream, tm_y);
      else launch_grouped<kW, false, false, false, OutStore::kRows>(fn, false, tm_a, tm_b, tm_sa, tm_sb, p, grid,
                                                                     stream, tm_y);
      return;
    }
  }
  if (path.block_scales_b) {  // checked by the caller: fast mode, block_n 192
    if (path.block_scales_ldg)
      launch_by_output<kW, false, kKGrouped, BlockScalesB::kLdg>(fn, out_f32, path.tma_store, false, tm_a, tm_b, tm_sa,
                                                                 tm_sb, p, grid, stream, tm_y);
    else
      launch_by_output<kW, false, kKGrouped, BlockScalesB::kTma>(fn, out_f32, path.tma_store, false, tm_a, tm_b, tm_sa,
                                                                 tm_sb, p, grid, stream, tm_y);
    return;
  }
  const auto launch = [&](auto width, auto exact_mode) {
    launch_by_output<decltype(width)::value, decltype(exact_mode)::value, kKGrouped>(
        fn, out_f32, path.tma_store, path.multicast, tm_a, tm_b, tm_sa, tm_sb, p, grid, stream, tm_y);
  };
  using std::integral_constant;
  if (exact && path.block_n == kXW) launch(integral_constant<int, kXW>{}, std::true_type{});
  else if (exact) launch(integral_constant<int, kN>{}, std::true_type{});
  else if (path.block_n == kW) launch(integral_constant<int, kW>{}, std::false_type{});
  else launch(integral_constant<int, kN>{}, std::false_type{});
}

// Persistent grid: opts.num_sms if in (0, #SMs), else every SM. (The multicast launch rounds it
// down to whole co-resident clusters of 2, at least one.)
inline int persistent_grid(const char* fn, int num_sms) {
  int device = 0, sms = 0;
  MXMOE_CUDA_CHECK(fn, cudaGetDevice(&device));
  MXMOE_CUDA_CHECK(fn, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return num_sms > 0 && num_sms < sms ? num_sms : sms;
}

}  // namespace mxmoe::gemm_sm90
