// MXFP8 quantization of BF16 tiles: row-wise, column-wise (transposed), both in one pass, over a
// batch of matrices or over expert segments, optionally with the fast GEMM-ready form.
//
//   rowwise:  q[r, c]  = E4M3(x[r, c] · 2^-e[r, c/32]),  e from max|x| over 32 columns
//   colwise:  qT[c, r] = E4M3(x[r, c] · 2^-e[c, r/32]),  e from max|x| over 32 rows
//   fast:     q'      = E4M3(q · 2^(e_b − E)),           E = max exponent over a 128-chunk
// Layouts (mx_format.h, quantize.h): x BF16 [batch, rows, cols] row-major, 16-byte aligned;
// data E4M3 row-major; scales E8M0 [.., cols/32]; fast scales chunk-major [ceil(n/128), rows].
//
// Persistent CTAs of 256 threads walk [128 rows, 128 cols] BF16 tiles (32 KB) through a ring of
// cp.async stages (each thread loads 8 rows' 16-byte vectors of the tile, rows past the data
// zero-filled; a gather's row indices and row scales are fetched one tile ahead into registers, see
// "gather: ... one tile ahead"). A tile is exactly one fast 128-chunk in both directions. Four kernels:
//  - staged (the default for the plain MX copies alone and for the fast form alone, one
//    direction, or both of grouped inputs): a row-wise thread owns two whole 32-blocks of one row
//    (no shuffles; the fast form's chunk exponent takes one shuffle with the other half of the
//    row, lane ^ 16); a column-wise thread 4 columns x 16 rows (one shuffle completes a block, two
//    more the chunk over the quad's 8 lanes); E4M3 outputs (plain, or fast) go to swizzled staging
//    tiles in shared memory and leave by one TMA store per direction; scale bytes (plain, or the
//    chunk-major fast ones) are stored directly. 2-3 stages, 97-113 KB, 2 CTAs per SM. See
//    "Staged kernel" below for the barrier protocol.
//  - two-group (both plain copies of dense and gather inputs): the staged kernel's helpers in one
//    512-thread CTA per SM, one warp group per direction. (The fast form alone is faster on the
//    staged kernel, run 42.)
//  - pipelined (the default for the plain copy of ONE direction of a dense input since run 72; both
//    directions with MXMOE_QUANT_TMA=1): TMA loads into an mbarrier ring fed by one producer lane, 16 consumer warps that each own a
//    16-row or 16-column slice of a tile and store it by their own TMA store; no CTA-wide barrier
//    in the tile loop. See "Pipelined kernel" below.
//  - register-store (plain + fast together, or everything with MXMOE_QUANT_STAGED=0): the
//    row-wise pass from each thread's own slots (4 lanes per block, shuffles), 8-byte stores; the
//    column-wise pass through shared memory with 16-byte stores of whole 128-byte lines; 3 stages
//    (96 KB).
// Registers: at most 128 a thread (2 CTAs per SM; two-group: 512 threads, 1 CTA), no spills
// (checked with -Xptxas -v; fast-only staged 93-128, two-group 128; the column-wise 128x128-block
// form, kColBlock: 80-128, see "column-wise 128x128-block form").
// Roofline: memory-bound. Bytes per element: read 2; write 1 + 1/32 per copy (+1 + 1/128 fast).
// Tests: tests/gpu/test_quantize_gpu.cpp, test_quantize_col_block_gpu.cpp (bit-exact against src/ref).
// Bench: bench/bench_quant.py.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "device/cp_async.cuh"
#include "device/cp_async_bulk_tensor.cuh"
#include "device/mbarrier.cuh"
#include "device/fast_divmod.cuh"
#include "device/ld_st_shared.cuh"
#include "device/mx_convert.cuh"
#include "host/check.h"
#include "host/kernel_attr.h"
#include "kernels/gemm/tensor_map.h"
#include "kernels/quantize/block128_common.cuh"
#include "kernels/quantize/quantize_launch.h"
#include "kernels/quantize/pipe_slice.cuh"
#include "kernels/quantize/quantize_unit_walk.h"
#include "mxmoe/quantize.h"

namespace mxmoe::detail {
namespace {

constexpr int kTileRows = 128;
constexpr int kTileCols = 128;
constexpr int kThreads = 256;
constexpr int kVecPerRow = kTileCols / 8;            // 16-byte vectors (8 BF16) per tile row
constexpr int kRowsPerPass = kThreads / kVecPerRow;  // 16
constexpr int kLoads = kTileRows / kRowsPerPass;     // 8 vectors in flight per thread
constexpr int kMaxGroupsPow2 = 1024;                 // one thread per group in the offsets scan
static_assert(kMaxGroups <= kMaxGroupsPow2, "padded_offsets_kernel scans with one thread per group");
static_assert(kTileCols == kFastChunk && kTileRows == kFastChunk, "a tile is one fast chunk each way");
static_assert(kThreads == (kTileCols / 4) * (kTileRows / 16), "colwise: one thread per (column quad, 16-row group)");
static_assert(kVecPerRow * 8 == kTileCols && kMxBlock % 8 == 0, "a 16-byte vector never straddles a block");

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

constexpr int kStages = 3;  // tiles in the cp.async ring: kStages-1 in flight while one is converted
constexpr int kSmemBytes = kStages * kTileRows * kTileCols * 2;  // 96 KB: 2 CTAs per SM

// Tile order: groups of kGroupRowTiles row tiles; inside a group, consecutive tiles walk the row
// tiles of one column tile, then the next column tile. So the 32-byte sectors of both scale
// layouts (8 consecutive blocks along a row, or along a column) are completed by CTAs that run
// at the same time, instead of by CTAs far apart in time.
constexpr int kGroupRowTiles = 8;

// Tile raster, built on the host: id → (batch entry, row tile, column tile) without divisions.
struct TileGrid {
  int32_t tiles_r = 0, tiles_c = 0, num_tiles = 0, full_groups = 0;
  FastDivmod per_batch, per_group, last_group_rows;
};

// How output rows map to rows of x.
enum class RowMap : int {
  kDense = 0,    // row r of batch entry b
  kGrouped = 1,  // expert segments: padded row → offsets[g] + (r - padded_offsets[g])
  kGather = 2,   // row_index[r] (negative: a zero row)
};

struct Tile {
  int32_t b = 0, r0 = 0, c0 = 0;
  int32_t src_valid = 0;             // tile rows [0, src_valid) may have source data
  int32_t out_valid = 0;             // tile rows [0, out_valid) are written; 0: nothing to do
  const uint16_t* src = nullptr;     // x row of tile row 0, column c0 (dense, grouped)
  const int32_t* gather = nullptr;   // row_index of tile row 0 (gather)
};

// Grouped tiles: binary search of the tile's first row over the padded offsets. Gather tiles: `used`
// is *rows_used clamped to rows_out (gather_rows_used, read once per CTA); other maps ignore it.
template <RowMap kMap>
__device__ __forceinline__ Tile tile_at(const QuantizeParams& p, const TileGrid& g, uint32_t id, int64_t used) {
  Tile t;
  t.b = int32_t(g.per_batch.div(id));
  const uint32_t in_b = id - uint32_t(t.b) * g.per_batch.d;
  const uint32_t grp = g.per_group.div(in_b), rem = in_b - grp * g.per_group.d;
  uint32_t tr_in, tc;
  if (int32_t(grp) < g.full_groups) {
    tr_in = rem % kGroupRowTiles;
    tc = rem / kGroupRowTiles;
  } else {
    tc = g.last_group_rows.div(rem);
    tr_in = rem - tc * g.last_group_rows.d;
  }
  t.r0 = int32_t((grp * kGroupRowTiles + tr_in) * kTileRows);
  t.c0 = int32_t(tc * kTileCols);
  if constexpr (kMap == RowMap::kDense) {
    t.src = p.x + (int64_t(t.b) * p.rows_out + t.r0) * p.cols + t.c0;
    t.out_valid = int32_t(min64(kTileRows, p.rows_out - t.r0));
    t.src_valid = t.out_valid;
  } else if constexpr (kMap == RowMap::kGather) {
    t.out_valid = int32_t(max64(0, min64(kTileRows, used - t.r0)));
    t.src_valid = t.out_valid;
    t.gather = p.row_index + t.r0;
  } else {
    const int32_t* pad = p.padded_offsets;
    if (t.r0 >= __ldg(pad + p.num_groups)) return t;  // past the used rows: nothing to write
    int lo = 0, hi = p.num_groups;  // padded[lo] <= r0 < padded[hi]; empty groups are skipped
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (__ldg(pad + mid) <= t.r0) lo = mid; else hi = mid;
    }
    const int64_t pad_start = __ldg(pad + lo), pad_end = __ldg(pad + lo + 1);
    const int64_t src_start = __ldg(p.offsets + lo), count = __ldg(p.offsets + lo + 1) - src_start;
    const int64_t j0 = t.r0 - pad_start;  // tile row 0 is row j0 of the group
    t.src = p.x + (src_start + j0) * p.cols + t.c0;
    t.out_valid = int32_t(min64(kTileRows, min64(pad_end, p.rows_out) - t.r0));
    t.src_valid = int32_t(max64(0, min64(t.out_valid, min64(count, p.x_rows - src_start) - j0)));
  }
  return t;
}

// This CTA's k-th tile of the persistent walk (tile ids blockIdx.x + k * gridDim.x); a tile past the
// end is empty. Grouped maps read it from the ring slot k % kSlots that thread 0 filled when the
// tile's loads were issued (the binary search runs once per tile).
template <RowMap kMap, int kSlots>
__device__ __forceinline__ Tile cta_tile(const QuantizeParams& p, const TileGrid& g, const Tile* ring, uint32_t k,
                                         int64_t used) {
  if constexpr (kMap == RowMap::kGrouped) {
    return ring[k % kSlots];
  } else {
    const uint32_t id = blockIdx.x + k * gridDim.x;
    return id < uint32_t(g.num_tiles) ? tile_at<kMap>(p, g, id, used) : Tile{};
  }
}

// Gather: the used rows, *rows_used clamped to rows_out. The host contract (quantize.h) keeps
// *rows_used fixed during the launch, so every CTA reads it once, before its first tile.
template <RowMap kMap>
__device__ __forceinline__ int64_t gather_rows_used(const QuantizeParams& p) {
  if constexpr (kMap != RowMap::kGather) return 0;  // unused
  return p.rows_used ? min64(__ldg(p.rows_used), p.rows_out) : p.rows_out;
}

// Where a tile's outputs start; offsets inside a tile fit in 32 bits (host checks the sizes).
struct TileOut {
  uint8_t *rd, *rs, *rfd, *rfs;  // rowwise data, scales, fast data, fast scales
  uint8_t *cd, *cs, *cfd, *cfs;  // colwise
};

__device__ __forceinline__ TileOut tile_out(const QuantizeParams& p, const Tile& t) {
  const int64_t rows = p.rows_out, cols = p.cols, b = t.b;
  const int64_t nck = (cols + kFastChunk - 1) / kFastChunk, nrk = (rows + kFastChunk - 1) / kFastChunk;
  const int64_t row0 = b * rows + t.r0, col0 = b * cols + t.c0;
  TileOut o;
  o.rd = p.row_data + row0 * cols + t.c0;
  o.rs = p.row_scales + row0 * (cols / kMxBlock) + t.c0 / kMxBlock;
  o.rfd = p.row_fast_data + row0 * cols + t.c0;
  o.rfs = p.row_fast_scales + (b * nck + t.c0 / kFastChunk) * rows + t.r0;
  o.cd = p.col_data + col0 * rows + t.r0;
  o.cs = p.col_scales + col0 * (rows / kMxBlock) + t.r0 / kMxBlock;
  o.cfd = p.col_fast_data + col0 * rows + t.r0;
  o.cfs = p.col_fast_scales + (b * nrk + t.r0 / kFastChunk) * cols + t.c0;
  return o;
}

// The tile is stored row-major with its 16-byte vectors XOR-swizzled: vector v of row r sits at
// v ^ f(r), f(r) = (r % 8) ^ (2 * (r / 16 % 4)) (< 8, so a row's vectors stay in the row). Two
// readers are conflict-free with it:
//  - column-wise: a half-warp takes 8-byte words of 2 adjacent vectors from rows 16h + i of 4 row
//    groups h (same i): the 2 * (h % 4) term puts those 8 runs of 16 bytes in 8 different banks;
//  - row-wise (staged kernel): a quarter-warp takes vector v of 8 consecutive rows: the r % 8 term
//    spreads them over the 8 16-byte bank groups.
__device__ __forceinline__ int swz_vec(int row, int vec) { return vec ^ ((row & 7) ^ (2 * ((row >> 4) & 3))); }

// ---- gather: row indices and row scales fetched one tile ahead ---------------------------------
// Issuing a gather tile's loads needs its rows' indices, and the row scaling (gather_scaled) their
// scales: global loads that, fetched just before use, stalled every thread for their latency once
// per tile. Each thread instead fetches them into registers one tile ahead, and at the tile they
// move between lanes by shuffles (no shared memory, no barrier: each warp fetches exactly the 16
// tile rows it loads). Warp w (of the loading 256 threads) loads tile rows 16 i + 2 w + b, i < 8,
// b = lane / 16 (load_tile_async); lane l holds the value of row 16 (l % 8) + 2 w + (l / 8) % 2 (lanes
// 16-31 repeat lanes 0-15), so the value of a thread's row i is in lane 8 b + i.
//   index:       row_index of the lane's row in the next tile to be issued (-1 past its valid rows)
//   scale:       gather_scaled: row_scale of the lane's row in the next tile to be converted, 0 for a
//                row without x data (whose zero-filled slots then stay +0: bf16(0 · +0) = +0);
//   scale_index: gather_scaled: row_index of the lane's row in the tile after that one, so that the
//                scale load, which depends on it, is one tile ahead as well.
// Every kernel issues its tiles' loads once each, in order, and converts them once each, in order,
// so one register per value is the whole pipeline (no ring, whatever the number of stages).
struct GatherAhead {
  int64_t used = 0;
  int32_t index = -1;
  int32_t scale_index = -1;
  float scale = 0.0f;
};

__device__ __forceinline__ int ahead_row() {
  return 16 * (threadIdx.x % 8) + 2 * (threadIdx.x % kThreads / 32) + (threadIdx.x / 8) % 2;
}
__device__ __forceinline__ int ahead_lane(int i) { return 8 * (threadIdx.x % 32 / 16) + i; }

// Reads only rows below the tile's src_valid, and row_scale only for rows that take x data.
__device__ __forceinline__ int32_t fetch_row_index(const Tile& t) {
  const int r = ahead_row();
  return r < t.src_valid ? __ldg(t.gather + r) : -1;
}
__device__ __forceinline__ float fetch_row_scale(const QuantizeParams& p, const Tile& t, int32_t row) {
  return row >= 0 && row < p.x_rows ? __ldg(p.row_scale + t.r0 + ahead_row()) : 0.0f;
}

// Each thread copies 8 vectors of 8 BF16 (rows i*16 + tid/16, columns (tid%16)*8) into a stage
// with cp.async; rows without source data (past the matrix, or group padding) are zero-filled.
// The row-wise pass later reads back exactly these slots, so it needs no barrier. Gather: the row
// indices come from GatherAhead::index (fetched for this tile); every lane of the warp must call.
template <RowMap kMap>
__device__ __forceinline__ void load_tile_async(const QuantizeParams& p, const Tile& t, uint4* stage,
                                                int32_t ahead_index) {
  const int vec = threadIdx.x % kVecPerRow;
  const bool col_ok = t.c0 + vec * 8 < p.cols;
  const int32_t cols = int32_t(p.cols);
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int r = i * kRowsPerPass + threadIdx.x / kVecPerRow;
    bool ok = col_ok && r < t.src_valid;
    const uint16_t* src;
    if constexpr (kMap == RowMap::kGather) {
      const int32_t row = __shfl_sync(0xFFFFFFFFu, ahead_index, ahead_lane(i));  // -1 past src_valid
      ok = ok && row >= 0 && row < p.x_rows;
      src = p.x + int64_t(row) * p.cols + t.c0 + vec * 8;
    } else {
      src = t.src + r * cols + vec * 8;
    }
    dev::cp_async_cg_shared_global_16_zfill(&stage[r * kVecPerRow + swz_vec(r, vec)],
                                            ok ? static_cast<const void*>(src) : p.x, ok);
  }
}

// Gather with row_scale: each thread rescales, in place, the vectors it loaded itself, before either
// pass reads them: v = bf16_rn(row_scale[r] · v), the rounding of moe_combine_backward's dY. The
// scales come from GatherAhead::scale (fetched for this tile): a row without x data (a pad, an index
// out of range, a row past the valid ones) has scale 0 and zero-filled slots, which stay +0, as if
// untouched; its row_scale entry is never read. Columns past the matrix are skipped (their zeros
// must stay finite: the fast chunk exponent reads them). The row-wise pass reads back exactly these
// slots and the column-wise pass reads after the tile barrier, so no extra barrier is needed. Every
// lane of the warp must call.
__device__ __forceinline__ void scale_own_slots(const QuantizeParams& p, const Tile& t, uint4* stage,
                                                float ahead_scale) {
  const int vec = threadIdx.x % kVecPerRow;
  const bool col_ok = t.c0 + vec * 8 < p.cols;
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int r = i * kRowsPerPass + threadIdx.x / kVecPerRow;
    const float s = __shfl_sync(0xFFFFFFFFu, ahead_scale, ahead_lane(i));
    if (!col_ok) continue;
    uint4& v = stage[r * kVecPerRow + swz_vec(r, vec)];
    v.x = dev::pack_bf16x2_rn(s * dev::bf16_lo(v.x), s * dev::bf16_hi(v.x));
    v.y = dev::pack_bf16x2_rn(s * dev::bf16_lo(v.y), s * dev::bf16_hi(v.y));
    v.z = dev::pack_bf16x2_rn(s * dev::bf16_lo(v.z), s * dev::bf16_hi(v.z));
    v.w = dev::pack_bf16x2_rn(s * dev::bf16_lo(v.w), s * dev::bf16_hi(v.w));
  }
}

// Before the first issue: the values of tile 0 (and tile 1's indices for the scales).
template <RowMap kMap, class TileK>
__device__ __forceinline__ void gather_ahead_start(const QuantizeParams& p, GatherAhead& a, TileK tile_k) {
  if constexpr (kMap == RowMap::kGather) {
    a.index = fetch_row_index(tile_k(0u));
    if (p.row_scale != nullptr) {
      a.scale = fetch_row_scale(p, tile_k(0u), a.index);
      a.scale_index = fetch_row_index(tile_k(1u));
    }
  }
}

// Gather, at tile k: after its loads were issued, the next tile's indices; after its row scaling
// (gather_scaled), the scales of tile k + 1 and the indices of tile k + 2. The loads land while the
// tile is converted, one tile before their values are used.
template <RowMap kMap, class TileK>
__device__ __forceinline__ void gather_ahead_issued(const QuantizeParams& p, GatherAhead& a, TileK tile_k, uint32_t k) {
  if constexpr (kMap == RowMap::kGather) a.index = fetch_row_index(tile_k(k + 1));
}

// The row scaling of tile k (gather_scaled; `valid`: the tile has rows to write), then the scales
// one tile ahead.
template <RowMap kMap, class TileK>
__device__ __forceinline__ void gather_scale_tile(const QuantizeParams& p, GatherAhead& a, TileK tile_k, uint32_t k,
                                                  const Tile& t, bool valid, uint4* stage) {
  if constexpr (kMap == RowMap::kGather) {
    if (p.row_scale == nullptr) return;
    if (valid) scale_own_slots(p, t, stage, a.scale);
    a.scale = fetch_row_scale(p, tile_k(k + 1), a.scale_index);
    a.scale_index = fetch_row_index(tile_k(k + 2));
  }
}

// ---- row-wise: one 16-byte vector = 8 values of one row; 4 lanes = one 32-block ----------------
// r: tile row, vec: 16-byte vector of the row (8 columns), store: row and columns in range.
template <bool kFast>
__device__ __forceinline__ void rowwise_vector(const QuantizeParams& p, const TileOut& o, uint4 v, int r,
                                               int vec, bool store) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) m = dev::abs_max_bf16x2(m, w[i]);
  m = __vmaxu2(m, __shfl_xor_sync(0xFFFFFFFFu, m, 1));
  m = __vmaxu2(m, __shfl_xor_sync(0xFFFFFFFFu, m, 2));
  const uint32_t sbyte = dev::e8m0_scale_byte(dev::halves_max(m), p.mode);
  const float rcp = dev::e8m0_reciprocal(sbyte);
  uint2 q;
  q.x = dev::e4m3x4_from_f32(dev::bf16_lo(w[0]) * rcp, dev::bf16_hi(w[0]) * rcp,
                             dev::bf16_lo(w[1]) * rcp, dev::bf16_hi(w[1]) * rcp);
  q.y = dev::e4m3x4_from_f32(dev::bf16_lo(w[2]) * rcp, dev::bf16_hi(w[2]) * rcp,
                             dev::bf16_lo(w[3]) * rcp, dev::bf16_hi(w[3]) * rcp);
  if (sbyte == kE8M0Nan) q = make_uint2(dev::kE4M3NanX4, dev::kE4M3NanX4);

  const int32_t cols = int32_t(p.cols), nblk = cols / kMxBlock;
  const int32_t off = r * cols + vec * 8;
  if (store && p.row_data != nullptr) {  // null: only the fast form was asked for
    *reinterpret_cast<uint2*>(o.rd + off) = q;
    if ((vec & 3) == 0) o.rs[r * nblk + vec / 4] = uint8_t(sbyte);
  }
  if (kFast && p.row_fast_data != nullptr) {
    // Chunk exponent: max over the 16 lanes of this row (out-of-range columns read zeros and
    // contribute byte 0; a NaN block's 0xFF dominates).
    uint32_t cmax = max(sbyte, __shfl_xor_sync(0xFFFFFFFFu, sbyte, 4));
    cmax = max(cmax, __shfl_xor_sync(0xFFFFFFFFu, cmax, 8));
    uint2 f;
    if (cmax == kE8M0Nan) {
      f = make_uint2(dev::kE4M3NanX4, dev::kE4M3NanX4);
    } else {
      const float pw = dev::exp2_nonpositive(int(sbyte) - int(cmax));
      f = make_uint2(dev::e4m3x4_rebase(q.x, pw), dev::e4m3x4_rebase(q.y, pw));
    }
    if (store) {
      *reinterpret_cast<uint2*>(o.rfd + off) = f;
      if (vec == 0) o.rfs[r] = uint8_t(cmax);
    }
  }
}

// ---- column-wise through shared memory ---------------------------------------------------------
// Thread = (column quad q: tile columns 4q..4q+3, row group h: tile rows 16h..16h+15), with
// lane = 4·(h % 8) + q % 4. A 32-row block is two lanes (h, h^1): one shuffle completes its amax.
// For each of its 4 columns a thread writes 16 bytes; the 8 lanes of a quad cover the 128 rows
// of the tile, so every store instruction writes 4 whole 128-byte lines of the transposed output.
// This thread's column quad q and 16-row group h, quantized: sc[c] = the scale byte of column
// 4q + c over the 32-row block of h; qv[c][j] = E4M3 of rows 16h + 4j .. 16h + 4j + 3 of it.
struct ColQuad {
  int q, h;
  uint32_t sc[4];
  uint32_t qv[4][4];
};

// This thread's 16 rows x 4 columns of the tile: w[2i] = columns (4q, 4q+1) of row 16h + i,
// w[2i+1] = columns (4q+2, 4q+3).
struct ColWords {
  uint32_t w[32];
};

// (threadIdx.x % kThreads: the two-group kernel runs its column-wise pass on threads 256-511.)
__device__ __forceinline__ int col_quad() { return (threadIdx.x % kThreads / 32) * 4 + (threadIdx.x % 4); }
__device__ __forceinline__ int col_group() { return (threadIdx.x % 32) >> 2; }

__device__ __forceinline__ ColWords colwise_load(const uint32_t* tile_words) {
  ColWords cw;
  const int h = col_group(), q = col_quad();
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int row = 16 * h + i;
    const uint2 v = *reinterpret_cast<const uint2*>(&tile_words[row * (kTileCols / 2) + 4 * swz_vec(row, q / 2) + 2 * (q % 2)]);
    cw.w[2 * i] = v.x;
    cw.w[2 * i + 1] = v.y;
  }
  return cw;
}

// E4M3 codes of column c (0-3) of a ColWords' 4 columns, slots 4j .. 4j+3 (one per byte, slot 4j
// in the low byte), at the block scale's reciprocal rcp: colwise_quantize's inner loop, for the
// pipelined kernel. (colwise_quantize keeps its own copy: calling this from it changed ptxas's
// code for the measured kernels, 26 of them, by -14 to +241 instructions.)
__device__ __forceinline__ uint32_t col_codes_x4(const uint32_t* w, int c, int j, float rcp) {
  float f[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t word = w[2 * (4 * j + k) + c / 2];
    f[k] = (c % 2 ? dev::bf16_hi(word) : dev::bf16_lo(word)) * rcp;
  }
  return dev::e4m3x4_from_f32(f[0], f[1], f[2], f[3]);
}

__device__ __forceinline__ ColQuad colwise_quantize(const QuantizeParams& p, const ColWords& cw) {
  ColQuad r;
  r.h = col_group();  // 16-row group
  r.q = col_quad();   // column quad
  const uint32_t* w = cw.w;
  uint32_t m01 = 0, m23 = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    m01 = dev::abs_max_bf16x2(m01, w[2 * i]);
    m23 = dev::abs_max_bf16x2(m23, w[2 * i + 1]);
  }
  m01 = __vmaxu2(m01, __shfl_xor_sync(0xFFFFFFFFu, m01, 4));  // the other half of the 32-row block
  m23 = __vmaxu2(m23, __shfl_xor_sync(0xFFFFFFFFu, m23, 4));
  uint32_t* sc = r.sc;
  sc[0] = dev::e8m0_scale_byte(m01 & 0xFFFFu, p.mode);
  sc[1] = dev::e8m0_scale_byte(m01 >> 16, p.mode);
  sc[2] = dev::e8m0_scale_byte(m23 & 0xFFFFu, p.mode);
  sc[3] = dev::e8m0_scale_byte(m23 >> 16, p.mode);
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const float rcp = dev::e8m0_reciprocal(sc[c]);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float f[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t word = w[2 * (4 * j + k) + c / 2];
        f[k] = (c % 2 ? dev::bf16_hi(word) : dev::bf16_lo(word)) * rcp;
      }
      r.qv[c][j] = sc[c] == kE8M0Nan ? dev::kE4M3NanX4 : dev::e4m3x4_from_f32(f[0], f[1], f[2], f[3]);
    }
  }
  return r;
}

template <bool kFast, bool kFull>
__device__ __forceinline__ void colwise_tile(const QuantizeParams& p, const TileOut& o,
                                             const uint32_t* tile_words, const Tile& t) {
  ColQuad cq = colwise_quantize(p, colwise_load(tile_words));
  const int q = cq.q, h = cq.h;
  const uint32_t* sc = cq.sc;
  auto& qv = cq.qv;
  const int32_t rows = int32_t(p.rows_out), nblk = rows / kMxBlock;
  const bool ok = kFull || (t.c0 + 4 * q < p.cols && 16 * h < t.out_valid);
  if (ok && p.col_data != nullptr) {  // null: only the fast form was asked for
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      *reinterpret_cast<uint4*>(o.cd + (4 * q + c) * rows + 16 * h) = make_uint4(qv[c][0], qv[c][1], qv[c][2], qv[c][3]);
      if ((h & 1) == 0) o.cs[(4 * q + c) * nblk + h / 2] = uint8_t(sc[c]);
    }
  }
  if (kFast && p.col_fast_data != nullptr) {
    // Chunk exponents of the 4 columns, packed one per byte: max over the 8 row groups. Row blocks
    // past the valid rows hold zeros (byte 0); a NaN block's 0xFF dominates.
    uint32_t e = sc[0] | (sc[1] << 8) | (sc[2] << 16) | (sc[3] << 24);
    e = __vmaxu4(e, __shfl_xor_sync(0xFFFFFFFFu, e, 4));
    e = __vmaxu4(e, __shfl_xor_sync(0xFFFFFFFFu, e, 8));
    e = __vmaxu4(e, __shfl_xor_sync(0xFFFFFFFFu, e, 16));
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const uint32_t ec = (e >> (8 * c)) & 0xFFu;
      const float pw = dev::exp2_nonpositive(int(sc[c]) - int(ec));
#pragma unroll
      for (int j = 0; j < 4; ++j) qv[c][j] = ec == kE8M0Nan ? dev::kE4M3NanX4 : dev::e4m3x4_rebase(qv[c][j], pw);
      if (ok) {
        *reinterpret_cast<uint4*>(o.cfd + (4 * q + c) * rows + 16 * h) = make_uint4(qv[c][0], qv[c][1], qv[c][2], qv[c][3]);
        if (h == 0) o.cfs[4 * q + c] = uint8_t(ec);
      }
    }
  }
}

// Row-wise pass over one landed tile, from this thread's own slots (no barrier needed).
// kFull: the whole 128x128 tile is inside the matrix (no bounds checks on stores).
template <bool kFast, bool kFull>
__device__ __forceinline__ void rowwise_tile(const QuantizeParams& p, const TileOut& o, const Tile& t,
                                             const uint4* stage) {
  const int vec = threadIdx.x % kVecPerRow;
  const bool col_ok = kFull || t.c0 + vec * 8 < p.cols;
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int r = i * kRowsPerPass + threadIdx.x / kVecPerRow;
    rowwise_vector<kFast>(p, o, stage[r * kVecPerRow + swz_vec(r, vec)], r, vec,
                          kFull || (col_ok && r < t.out_valid));
  }
}

// Persistent CTAs: each walks tiles id = blockIdx.x + k·gridDim.x through a kStages-deep
// cp.async pipeline, so kStages-1 tiles (32 KB each) are in flight while one is converted.
template <bool kRow, bool kCol, bool kFast, RowMap kMap>
__global__ void __launch_bounds__(kThreads, 2) quantize_mxfp8_bf16_sm90_kernel(const QuantizeParams p,
                                                                            const TileGrid g) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint4* stages = reinterpret_cast<uint4*>(smem);  // [kStages][128 rows][16 vectors] BF16, swizzled
  constexpr int kStageVecs = kTileRows * kVecPerRow;
  const uint32_t first = blockIdx.x, step = gridDim.x, num_tiles = uint32_t(g.num_tiles);
  // Grouped tiles need a search over the offsets: thread 0 does it once per tile into a ring of
  // kStages slots (slot k % kStages holds tile k from its issue until it has been converted).
  constexpr bool kGrouped = kMap == RowMap::kGrouped;
  __shared__ Tile s_tiles[kGrouped ? kStages : 1];
  GatherAhead ahead;  // gather: row indices (and scales) one tile ahead
  ahead.used = gather_rows_used<kMap>(p);
  auto tile_k = [&](uint32_t k) { return cta_tile<kMap, kStages>(p, g, s_tiles, k, ahead.used); };
  auto issue = [&](uint32_t k) {  // loads of this CTA's k-th tile, one commit group per tile
    if constexpr (kGrouped) {
      const uint32_t id = first + k * step;
      __syncthreads();  // the slot's previous tile (k - kStages) has been converted
      if (threadIdx.x == 0) s_tiles[k % kStages] = id < num_tiles ? tile_at<RowMap::kGrouped>(p, g, id, 0) : Tile{};
      __syncthreads();
    }
    const Tile t = tile_k(k);
    if (t.out_valid > 0) load_tile_async<kMap>(p, t, stages + (k % kStages) * kStageVecs, ahead.index);
    gather_ahead_issued<kMap>(p, ahead, tile_k, k);
    dev::cp_async_commit_group();  // empty groups keep the count uniform
  };
  gather_ahead_start<kMap>(p, ahead, tile_k);
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) issue(k);
  for (uint32_t k = 0; first + k * step < num_tiles; ++k) {
    // Row-wise only: each thread reads back only its own slots, so the refill can go first and
    // no barrier is ever needed. With the column-wise pass, one barrier per tile does two jobs
    // (see below), and the refill of the stage freed by it follows it.
    if constexpr (!kCol) issue(k + kStages - 1);
    dev::cp_async_wait_group<kCol ? kStages - 2 : kStages - 1>();  // this thread's part of tile k landed
    const Tile t = tile_k(k);
    uint4* stage = stages + (k % kStages) * kStageVecs;
    gather_scale_tile<kMap>(p, ahead, tile_k, k, t, t.out_valid > 0, stage);
    // Whole tiles (the common case) run without per-store bounds checks: straight-line code
    // that the compiler can interleave across the 8 vectors / 4 columns of a thread.
    const bool valid = t.out_valid > 0;  // uniform across the CTA
    const bool full = t.out_valid == kTileRows && t.c0 + kTileCols <= p.cols;
    const TileOut o = valid ? tile_out(p, t) : TileOut{};
    if (kRow && valid) {
      if (full) rowwise_tile<kFast, true>(p, o, t, stage);
      else rowwise_tile<kFast, false>(p, o, t, stage);
    }
    if constexpr (kCol) {
      // After this barrier every thread's part of tile k is visible, and every thread has
      // finished reading stage (k-1) % kStages (column-wise pass of the previous tile), which is
      // the stage the next refill writes.
      __syncthreads();
      issue(k + kStages - 1);
      if (valid) {
        const uint32_t* words = reinterpret_cast<const uint32_t*>(stage);
        if (full) colwise_tile<kFast, true>(p, o, words, t);
        else colwise_tile<kFast, false>(p, o, words, t);
      }
    }
  }
  dev::cp_async_wait_group<0>();
}

// ==== Staged kernel: the plain MX copies, or the fast form alone, leave through shared memory by TMA stores ====
// Per tile k (stage k % S):
//   wait for this thread's loads of tile k (+ the gather's row scaling of its own slots);
//   barrier A: tile k is visible to every thread;
//   every thread loads the inputs of both passes into registers;
//   thread 0: the previous tile's TMA stores have finished reading the staging buffers;
//   barrier C: stage k % S has been read and the staging is free; the stage is refilled with
//   tile k + S at once, so those loads run while this tile is converted and stored (both
//   directions: the row-wise pass reads the stage between C and a barrier D, then the refill);
//   row-wise pass → row staging; column-wise pass → column staging (E4M3, 128x128 bytes each, in
//   the 128-byte swizzle that the TMA store reads: 16-byte chunk c of row y at c ^ (y % 8));
//   fence.proxy.async + barrier B: the staging is complete;
//   thread 0 issues one TMA store per direction (boxes reaching past the matrix are clipped by
//   the TMA unit; a gather tile with rows at or past *rows_used is copied out by every thread
//   instead, so that those rows are never written).
// (Run 26's ncu of the two-barrier version: 35-49% of warp samples waited at the barrier that
// also waited for the previous stores to leave the staging, with the refill issued only after
// the stores.)
// Scale bytes are stored directly. The row-wise pass reads other threads' slots, which barrier A
// covers: a thread owns one row and 64 columns, i.e. two whole 32-blocks (no shuffles).
// Fast form alone (kFast): the same protocol with the rebased codes in the staging, the TMA maps
// on the fast data and the chunk exponents stored as the scale bytes (128 contiguous bytes per
// tile and direction); plain + fast together would need a second staging tile per direction
// (2 CTAs per SM would no longer fit), so it stays on the register-store kernel.
// Column-wise 128x128-block form (kColBlock, QuantizeParams::col_fast_blocks): a tile's column-wise
// output is exactly one block of that form, so the staging gets the block's codes and thread 0
// stores its one exponent byte. Its exponent needs the whole tile: every thread publishes the
// largest |x| of its 16 x 4 inputs (a warp max, one shared word per warp) before barrier C, which
// already separates those writes from the reads after it (no extra barrier; the next tile's writes
// come after barrier B and A). See "column-wise 128x128-block form" below.
constexpr int kStageBytes = kTileRows * kTileCols * 2;  // one BF16 tile
constexpr int kOutTileBytes = kTileRows * kTileCols;    // one E4M3 tile

template <bool kRow, bool kCol>
struct StagedLayout {
  static constexpr int kStagesIn = kRow && kCol ? 2 : 3;  // 97 / 113 KB: 2 CTAs per SM either way
  static constexpr int kRowOut = kStagesIn * kStageBytes;  // multiples of 1024 (TMA swizzle atoms)
  static constexpr int kColOut = kRowOut + (kRow ? kOutTileBytes : 0);
  static constexpr int kTiles = kColOut + (kCol ? kOutTileBytes : 0);  // Tile ring (grouped)
  static constexpr int kBytes = kTiles + kStagesIn * int(sizeof(Tile));
};

__device__ __forceinline__ uint32_t e4m3x4_scaled(uint32_t w0, uint32_t w1, float rcp) {
  return dev::e4m3x4_from_f32(dev::bf16_lo(w0) * rcp, dev::bf16_hi(w0) * rcp, dev::bf16_lo(w1) * rcp,
                              dev::bf16_hi(w1) * rcp);
}

// Row-wise thread = (tile row r, half): 8 vectors = tile columns 64·half .. 64·half + 63.
__device__ __forceinline__ int row_of_thread() { return 16 * (threadIdx.x / 32) + (threadIdx.x % 16); }
__device__ __forceinline__ int half_of_thread() { return (threadIdx.x % 32) >> 4; }

struct RowVecs {
  uint4 v[8];
};

__device__ __forceinline__ RowVecs rowwise_load(const uint4* stage) {
  RowVecs rv;
  const int r = row_of_thread(), half = half_of_thread();
#pragma unroll
  for (int j = 0; j < 8; ++j) rv.v[j] = stage[r * kVecPerRow + swz_vec(r, 8 * half + j)];
  return rv;
}

// Scale byte of 32-block b (vectors 4b .. 4b+3) of a row-wise thread's 64 columns. kUnmasked: the
// same max from unsigned and signed maxima (abs_max_bf16x2_from_maxes, one instruction a word
// fewer; the pipelined kernel's; the other kernels keep the form they were measured with).
template <bool kUnmasked = false>
__device__ __forceinline__ uint32_t row_block_scale(const uint4* v, int b, ScaleMode mode) {
  uint32_t m = 0;
  if constexpr (kUnmasked) {
    uint32_t u = 0, s = 0;
#pragma unroll
    for (int j = 4 * b; j < 4 * b + 4; ++j) {
      for (const uint32_t w : {v[j].x, v[j].y, v[j].z, v[j].w}) {
        u = __vmaxu2(u, w);
        s = __vmaxs2(s, w);
      }
    }
    m = dev::abs_max_bf16x2_from_maxes(u, s);
  } else {
#pragma unroll
    for (int j = 4 * b; j < 4 * b + 4; ++j) {
      m = dev::abs_max_bf16x2(m, v[j].x);
      m = dev::abs_max_bf16x2(m, v[j].y);
      m = dev::abs_max_bf16x2(m, v[j].z);
      m = dev::abs_max_bf16x2(m, v[j].w);
    }
  }
  return dev::e8m0_scale_byte(dev::halves_max(m), mode);
}

// A thread's plain scale bytes, stored after the tile's fence.proxy.async instead of before it
// (`late scales`): the fence compiles to MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S, and the MEMBAR waits
// for this thread's outstanding global stores (the scale bytes just written) before the TMA store
// may be issued. Issued after the fence, they have a whole tile of work to complete before the next
// fence. Byte c (c < 4) goes to ptr + c * stride when bit c of mask is set; mask bit 4: bytes 0-1
// as one 16-bit store instead.
struct ScaleStores {
  uint8_t* ptr = nullptr;
  uint32_t stride = 1, bytes = 0, mask = 0;
};
__device__ __forceinline__ void store_scales(const ScaleStores& s) {
  if (s.mask & 16u) {
    *reinterpret_cast<uint16_t*>(s.ptr) = uint16_t(s.bytes);
    return;
  }
#pragma unroll
  for (int c = 0; c < 4; ++c)
    if (s.mask & (1u << c)) s.ptr[c * s.stride] = uint8_t(s.bytes >> (8 * c));
}
// The row-wise plain scale stores of thread (tile row r, half): rowwise_staged's choice of one
// 16-bit or up to two byte stores.
__device__ __forceinline__ ScaleStores row_scale_stores(const QuantizeParams& p, const Tile& t, int r, int half,
                                                        uint32_t sb0, uint32_t sb1) {
  ScaleStores s;
  if (r < t.out_valid) {
    const int32_t nblk = int32_t(p.cols / kMxBlock), blk = t.c0 / kMxBlock + 2 * half;
    s.ptr = p.row_scales + (int64_t(t.b) * p.rows_out + t.r0 + r) * nblk + blk;
    s.bytes = sb0 | (sb1 << 8);
    if (blk + 1 < nblk && nblk % 2 == 0) s.mask = 16u;
    else s.mask = (blk < nblk ? 1u : 0u) | (blk + 1 < nblk ? 2u : 0u);
  }
  return s;
}
// The column-wise plain scale stores of a thread of row group h (16 rows) and columns col0 .. col0 + 3
// of batch entry b: row block (r0 + 16 h) / 32; lanes with odd h store nothing (the lane of h - 1
// holds the same bytes), nor do row groups past the valid rows or columns past the matrix.
__device__ __forceinline__ ScaleStores col_scale_stores(const QuantizeParams& p, int32_t b, int32_t r0, int32_t out_valid,
                                                        int32_t col0, int h, uint32_t bytes) {
  ScaleStores s;
  const int64_t nblk = p.rows_out / kMxBlock;
  s.ptr = p.col_scales + (int64_t(b) * p.cols + col0) * nblk + r0 / kMxBlock + h / 2;
  s.stride = uint32_t(nblk);
  s.bytes = bytes;
  if ((h & 1) == 0 && 16 * h < out_valid) {
#pragma unroll
    for (int c = 0; c < 4; ++c) s.mask |= col0 + c < p.cols ? 1u << c : 0u;
  }
  return s;
}

// kFast: the staging gets the fast form instead of the plain codes (the launcher asks for one or
// the other), and the scale stores write the chunk-major fast scales.
// r: tile row, half: which 64 columns (the pipelined kernel places its row-wise warps itself).
// kUnmasked: row_block_scale's other form of the same max (the pipelined kernel).
// late != nullptr (plain copy only): the scale bytes are not stored but returned in *late
// (row_scale_stores), for a store after the fence (ScaleStores).
template <bool kFast, bool kUnmasked = false>
__device__ __forceinline__ void rowwise_staged(const QuantizeParams& p, const Tile& t, const RowVecs& rv,
                                               uint8_t* out, int r = row_of_thread(), int half = half_of_thread(),
                                               ScaleStores* late = nullptr) {
  const uint4* v = rv.v;
  uint32_t sb[2];
  // The 128-chunk is this row's 4 blocks: 2 here, 2 in the thread of the other half (lane ^ 16).
  // Columns past the matrix were zero-filled: byte 0, below every block; a NaN block's 0xFF wins.
  // (The plain copy computes each block's scale just before converting it, as before the fast
  // form was added here: its SASS stays the one measured in runs 28-32.)
  uint32_t chunk = 0;
  if constexpr (kFast) {
    sb[0] = row_block_scale(v, 0, p.mode);
    sb[1] = row_block_scale(v, 1, p.mode);
    chunk = max(sb[0], sb[1]);
    chunk = max(chunk, __shfl_xor_sync(0xFFFFFFFFu, chunk, 16));
  }
#pragma unroll
  for (int b = 0; b < 2; ++b) {
    if constexpr (!kFast) sb[b] = row_block_scale<kUnmasked>(v, b, p.mode);
    const uint32_t s = sb[b];
    const float rcp = dev::e8m0_reciprocal(s);
#pragma unroll
    for (int c = 0; c < 2; ++c) {  // 16-byte output chunk = 2 input vectors
      const uint4 a = v[4 * b + 2 * c], d = v[4 * b + 2 * c + 1];
      uint4 o = make_uint4(e4m3x4_scaled(a.x, a.y, rcp), e4m3x4_scaled(a.z, a.w, rcp),
                           e4m3x4_scaled(d.x, d.y, rcp), e4m3x4_scaled(d.z, d.w, rcp));
      if (s == kE8M0Nan) o = make_uint4(dev::kE4M3NanX4, dev::kE4M3NanX4, dev::kE4M3NanX4, dev::kE4M3NanX4);
      if constexpr (kFast) o = dev::rebase_x16(o, s, chunk);
      const int piece = 4 * half + 2 * b + c;
      *reinterpret_cast<uint4*>(out + r * kTileCols + 16 * (piece ^ (r & 7))) = o;
    }
  }
  if constexpr (kFast) {
    // Chunk-major [ceil(cols/128), rows]: a tile's 128 bytes are contiguous.
    if (half == 0 && r < t.out_valid) {
      const int64_t nck = (p.cols + kFastChunk - 1) / kFastChunk;
      p.row_fast_scales[(int64_t(t.b) * nck + t.c0 / kFastChunk) * p.rows_out + t.r0 + r] = uint8_t(chunk);
    }
  } else if (late != nullptr) {
    *late = row_scale_stores(p, t, r, half, sb[0], sb[1]);
  } else if (r < t.out_valid) {
    const int32_t nblk = int32_t(p.cols / kMxBlock), blk = t.c0 / kMxBlock + 2 * half;
    uint8_t* sp = p.row_scales + (int64_t(t.b) * p.rows_out + t.r0 + r) * nblk + blk;
    if (blk + 1 < nblk && nblk % 2 == 0) {
      *reinterpret_cast<uint16_t*>(sp) = uint16_t(sb[0] | (sb[1] << 8));
    } else {
      if (blk < nblk) sp[0] = uint8_t(sb[0]);
      if (blk + 1 < nblk) sp[1] = uint8_t(sb[1]);
    }
  }
}

// late != nullptr (plain copy only): the scale bytes are returned in *late instead of stored.
template <bool kFast>
__device__ __forceinline__ void colwise_staged(const QuantizeParams& p, const Tile& t, const ColWords& cw,
                                               uint8_t* out, ScaleStores* late = nullptr) {
  const ColQuad cq = colwise_quantize(p, cw);
  const int q = cq.q, h = cq.h;
  // The 128-chunk of a column is the 8 row groups h of its quad: lanes 4h + q % 4 of this warp.
  // Lanes h and h ^ 1 (xor 4) already share their block's scale, so xor 8 and 16 complete the max.
  // The 4 columns' exponents travel one per byte; rows past the data are zeros (byte 0).
  uint32_t chunks = 0;
  if constexpr (kFast) {
    chunks = cq.sc[0] | (cq.sc[1] << 8) | (cq.sc[2] << 16) | (cq.sc[3] << 24);
    chunks = __vmaxu4(chunks, __shfl_xor_sync(0xFFFFFFFFu, chunks, 8));
    chunks = __vmaxu4(chunks, __shfl_xor_sync(0xFFFFFFFFu, chunks, 16));
  }
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int y = 4 * q + c;  // staging row = tile column
    uint4 o = make_uint4(cq.qv[c][0], cq.qv[c][1], cq.qv[c][2], cq.qv[c][3]);
    if constexpr (kFast) o = dev::rebase_x16(o, cq.sc[c], (chunks >> (8 * c)) & 0xFFu);
    *reinterpret_cast<uint4*>(out + y * kTileRows + 16 * (h ^ (y & 7))) = o;
  }
  if constexpr (kFast) {
    if (h == 0) {  // chunk-major [ceil(rows/128), cols]: a tile's 128 bytes are contiguous
      const int64_t nrk = (p.rows_out + kFastChunk - 1) / kFastChunk;
      uint8_t* fs = p.col_fast_scales + (int64_t(t.b) * nrk + t.r0 / kFastChunk) * p.cols + t.c0;
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (t.c0 + 4 * q + c < p.cols) fs[4 * q + c] = uint8_t(chunks >> (8 * c));
    }
  } else if (late != nullptr) {
    *late = col_scale_stores(p, t.b, t.r0, t.out_valid, t.c0 + 4 * q, h,
                             cq.sc[0] | (cq.sc[1] << 8) | (cq.sc[2] << 16) | (cq.sc[3] << 24));
  } else if ((h & 1) == 0 && 16 * h < t.out_valid) {
    const int64_t nblk = p.rows_out / kMxBlock;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int32_t col = t.c0 + 4 * q + c;
      if (col < p.cols) p.col_scales[(int64_t(t.b) * p.cols + col) * nblk + t.r0 / kMxBlock + h / 2] = uint8_t(cq.sc[c]);
    }
  }
}

// ---- column-wise 128x128-block form (kColBlock) ------------------------------------------------
// The tile's column-wise output [128 columns of x, 128 rows (tokens)] is one block of gemm.h's
// FastScaleLayout::kBlock128 form of the column-wise copy (mx_format.h), block scales
// [batch, ceil(rows_out/128), fast_block_scales_pitch(cols)]. Bitwise what the plain column-wise
// copy followed by rebase_mxfp8_fast_block128 gives:
//  - the block exponent E is the largest 32-block scale byte of the tile; e8m0_scale_byte is
//    non-decreasing in |x|'s BF16 bits (Inf/NaN bits, the largest, give 0xFF), so E is the scale
//    byte of the tile's largest |x| as bits: one max over the CTA instead of one per 32-block.
//    Rows and columns past the data are zeros in the stage (byte 0, as a 32-block the rebase
//    never reads); a NaN or Inf anywhere makes E = 0xFF and the whole block 0x7F (rebase_x16);
//  - each code is the plain MX code (colwise_quantize) re-expressed against E by rebase_x16, the
//    rebase's conversion; E goes to [b][r0 / 128][c0 / 128], and the tile of the last column
//    block writes the row's pitch padding as 0 (block128::store_block_scale, as the rebase does).
constexpr int kColBlockSmemBytes = (kThreads / 32) * int(sizeof(uint32_t));  // one word per warp, after the layout

// Before barrier C: this warp's largest |x| (BF16 bits) of the tile's inputs held in cw.
__device__ __forceinline__ void publish_col_block_amax(const ColWords& cw, uint32_t* warp_amax) {
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < 32; ++i) m = dev::abs_max_bf16x2(m, cw.w[i]);
  const uint32_t wm = __reduce_max_sync(0xFFFFFFFFu, dev::halves_max(m));
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = wm;
}

// After barrier C: the codes of this thread's 4 columns x 16 rows against the block exponent, to
// the staging (as colwise_staged), and the block's scale byte.
__device__ __forceinline__ void colwise_staged_block(const QuantizeParams& p, const Tile& t, const ColWords& cw,
                                                     uint8_t* out, const uint32_t* warp_amax) {
  uint32_t amax = warp_amax[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) amax = max(amax, warp_amax[w]);
  const uint32_t emax = dev::e8m0_scale_byte(amax, p.mode);
  const ColQuad cq = colwise_quantize(p, cw);
  const int q = cq.q, h = cq.h;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int y = 4 * q + c;  // staging row = tile column
    const uint4 o = dev::rebase_x16(make_uint4(cq.qv[c][0], cq.qv[c][1], cq.qv[c][2], cq.qv[c][3]), cq.sc[c], emax);
    *reinterpret_cast<uint4*>(out + y * kTileRows + 16 * (h ^ (y & 7))) = o;
  }
  const int64_t nrb = (p.rows_out + kFastBlockRows - 1) / kFastBlockRows, ncb = (p.cols + kFastChunk - 1) / kFastChunk;
  const int64_t pitch = fast_block_scales_pitch(p.cols);
  block128::store_block_scale<kThreads>(p.col_fast_scales + (int64_t(t.b) * nrb + t.r0 / kFastBlockRows) * pitch,
                                        t.c0 / kFastChunk, ncb, pitch, emax);
}

// A gather tile with rows at or past *rows_used: every thread copies the valid part of the
// staging out (16-byte pieces; a column's last piece byte by byte when it is cut), to the plain
// data or, with kRowFast / kColFast, to that direction's fast data.
template <bool kRow, bool kCol, bool kRowFast, bool kColFast, int kNumThreads = kThreads>
__device__ __forceinline__ void copy_out_partial(const QuantizeParams& p, const Tile& t, const uint8_t* row_out,
                                                 const uint8_t* col_out) {
  const int32_t cols = int32_t(p.cols), rows = int32_t(p.rows_out);
  uint8_t* const row_data = kRowFast ? p.row_fast_data : p.row_data;
  uint8_t* const col_data = kColFast ? p.col_fast_data : p.col_data;
  const int ncol = min(kTileCols, cols - t.c0);
  for (int i = threadIdx.x; i < kTileRows * 8; i += kNumThreads) {
    const int y = i / 8, ch = i % 8;
    const uint4* src_r = reinterpret_cast<const uint4*>(row_out + y * kTileCols + 16 * (ch ^ (y & 7)));
    if (kRow && y < t.out_valid && 16 * ch < ncol)
      *reinterpret_cast<uint4*>(row_data + int64_t(t.r0 + y) * cols + t.c0 + 16 * ch) = *src_r;
    if (kCol && y < ncol && 16 * ch < t.out_valid) {
      const uint8_t* src = col_out + y * kTileRows + 16 * (ch ^ (y & 7));
      uint8_t* dst = col_data + int64_t(t.c0 + y) * rows + t.r0 + 16 * ch;
      const int n = min(16, t.out_valid - 16 * ch);
      if (n == 16) *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
      else for (int j = 0; j < n; ++j) dst[j] = src[j];
    }
  }
}

// The TMA stores' 128-byte swizzle needs 1024-byte aligned staging (the base is declared so;
// checked once, a trap rather than silently wrong bytes).
__device__ __forceinline__ void trap_unless_staging_aligned(const uint8_t* smem) {
  if (threadIdx.x == 0 && (device::smem_addr(smem) & 1023u) != 0) {
    printf("mxmoe: quantize_mxfp8 staging is not 1024-byte aligned\n");
    __trap();
  }
}

// kLate (MXMOE_QUANT_LATE_SCALES=1; plain copies of dense inputs, one direction): the scale bytes
// are stored after barrier B and the TMA store instead of before the fence (ScaleStores).
// kRowFast / kColFast: that direction's staging gets the fast form instead of the plain codes (each
// direction writes one of its two forms; they may differ, e.g. the layer's fast row-wise x with a
// plain column-wise copy to rebase into the 128x128-block form).
// kColBlock (with kColFast): the column-wise fast form in 128x128 blocks instead of per row (the
// layer's fast row-wise x with its column-wise copy straight in the block form).
template <bool kRow, bool kCol, bool kRowFast, bool kColFast, RowMap kMap, bool kLate = false, bool kColBlock = false>
__global__ void __launch_bounds__(kThreads, 2) quantize_mxfp8_staged_kernel(const QuantizeParams p, const TileGrid g,
                                                                          const __grid_constant__ CUtensorMap row_map,
                                                                          const __grid_constant__ CUtensorMap col_map) {
  using L = StagedLayout<kRow, kCol>;
  constexpr int S = L::kStagesIn;
  constexpr int kStageVecs = kTileRows * kVecPerRow;
  constexpr bool kGrouped = kMap == RowMap::kGrouped;
  // Its own name: extern shared arrays of one file share a symbol, and the register-store
  // kernel declares `smem` with 128-byte alignment (nvcc #1886-D when both used one name).
  extern __shared__ __align__(1024) uint8_t staged_smem[];
  uint8_t* smem = staged_smem;
  uint4* stages = reinterpret_cast<uint4*>(smem);
  uint8_t* row_out = smem + L::kRowOut;
  uint8_t* col_out = smem + L::kColOut;
  Tile* s_tiles = reinterpret_cast<Tile*>(smem + L::kTiles);
  trap_unless_staging_aligned(smem);
  const uint32_t first = blockIdx.x, step = gridDim.x, num_tiles = uint32_t(g.num_tiles);
  GatherAhead ahead;  // gather: row indices (and scales) one tile ahead
  ahead.used = gather_rows_used<kMap>(p);
  auto tile_k = [&](uint32_t k) { return cta_tile<kMap, S>(p, g, s_tiles, k, ahead.used); };
  // Loads of this CTA's k-th tile into stage k % S, one commit group per tile (empty groups keep the
  // count uniform). Grouped: thread 0 places the tile in the ring slot first; every thread has
  // copied slot k % S's previous tile (k - S) into registers before barrier B of its iteration.
  auto issue = [&](uint32_t k) {
    if constexpr (kGrouped) {
      const uint32_t id = first + k * step;
      if (threadIdx.x == 0) s_tiles[k % S] = id < num_tiles ? tile_at<RowMap::kGrouped>(p, g, id, 0) : Tile{};
      __syncthreads();
    }
    const Tile t = tile_k(k);
    if (t.out_valid > 0) load_tile_async<kMap>(p, t, stages + (k % S) * kStageVecs, ahead.index);
    gather_ahead_issued<kMap>(p, ahead, tile_k, k);
    dev::cp_async_commit_group();
  };
  gather_ahead_start<kMap>(p, ahead, tile_k);
#pragma unroll
  for (int k = 0; k < S; ++k) issue(k);
  static_assert(!kLate || (!(kRow && kCol) && !kRowFast && !kColFast), "late scales: plain copies, one direction");
  static_assert(!kColBlock || (kCol && kColFast), "the column-wise block form is a column-wise fast form");
  uint32_t* const warp_amax = reinterpret_cast<uint32_t*>(smem + L::kBytes);  // kColBlock: kColBlockSmemBytes
  for (uint32_t k = 0; first + k * step < num_tiles; ++k) {
    dev::cp_async_wait_group<S - 1>();  // this thread's part of tile k landed
    const Tile t = tile_k(k);
    uint4* stage = stages + (k % S) * kStageVecs;
    const bool valid = t.out_valid > 0;  // uniform across the CTA
    gather_scale_tile<kMap>(p, ahead, tile_k, k, t, valid, stage);
    __syncthreads();  // A: tile k is visible to every thread
    ScaleStores late;  // kLate: this thread's scale bytes, stored after the TMA store
    if constexpr (kRow && kCol) {
      // Both passes' inputs (64 registers) do not fit beside the rest, so the row-wise pass runs
      // between two barriers instead: C frees the staging, D ends the reads of the stage.
      ColWords cw;
      if (valid) cw = colwise_load(reinterpret_cast<const uint32_t*>(stage));
      if constexpr (kColBlock) {
        if (valid) publish_col_block_amax(cw, warp_amax);
      }
      if (threadIdx.x == 0) device::cp_async_bulk_wait_group_read<0>();  // previous stores read the staging
      __syncthreads();  // C: the staging is free (kColBlock: the warps' maxima are visible)
      if (valid) rowwise_staged<kRowFast>(p, t, rowwise_load(stage), row_out);
      __syncthreads();  // D: stage k % S has been read
      issue(k + S);
      if constexpr (kColBlock) {
        if (valid) colwise_staged_block(p, t, cw, col_out, warp_amax);
      } else {
        if (valid) colwise_staged<kColFast>(p, t, cw, col_out);
      }
    } else {
      // The pass's inputs into registers, then the stage is refilled while they are converted.
      RowVecs rv;
      ColWords cw;
      if (valid) {
        if constexpr (kRow) rv = rowwise_load(stage);
        if constexpr (kCol) cw = colwise_load(reinterpret_cast<const uint32_t*>(stage));
        if constexpr (kColBlock) publish_col_block_amax(cw, warp_amax);
      }
      if (threadIdx.x == 0) device::cp_async_bulk_wait_group_read<0>();  // previous stores read the staging
      __syncthreads();  // C: stage k % S has been read; the staging is free
      issue(k + S);     // the refill runs while this tile is converted and stored
      if (valid) {
        if constexpr (kRow) rowwise_staged<kRowFast>(p, t, rv, row_out, row_of_thread(), half_of_thread(), kLate ? &late : nullptr);
        if constexpr (kColBlock) colwise_staged_block(p, t, cw, col_out, warp_amax);
        else if constexpr (kCol) colwise_staged<kColFast>(p, t, cw, col_out, kLate ? &late : nullptr);
      }
    }
    device::fence_proxy_async_shared_cta();
    __syncthreads();  // B: the staging is complete
    if (valid) {
      if (kMap == RowMap::kGather && t.out_valid < kTileRows) {
        copy_out_partial<kRow, kCol, kRowFast, kColFast>(p, t, row_out, col_out);
      } else if (threadIdx.x == 0) {
        if constexpr (kRow) device::cp_async_bulk_tensor_3d_shared_to_global(&row_map, row_out, t.c0, t.r0, t.b);
        if constexpr (kCol) device::cp_async_bulk_tensor_3d_shared_to_global(&col_map, col_out, t.r0, t.c0, t.b);
        device::cp_async_bulk_commit_group();
      }
    }
    if constexpr (kLate) store_scales(late);
  }
  if (threadIdx.x == 0) device::cp_async_bulk_wait_group<0>();
  dev::cp_async_wait_group<0>();
}

// ==== Two-group kernel: both plain MX copies, one warp group per direction ====
// The staged kernel with both directions runs both passes on the same 256 threads (64 + 32 input
// registers do not fit at once, so the row-wise pass needs a fourth barrier and the refill waits
// for it), 2 stages, one tile in flight per CTA: 73-77% of copy (run 28). Here one CTA of 512
// threads per SM: warps 0-7 load the tiles (as in the staged kernel) and run the row-wise pass,
// warps 8-15 run the column-wise pass, each group on its own inputs in registers, so the stage is
// refilled right after barrier C; 4 input stages (3 tiles in flight) and double-buffered staging
// (the stores of tile k-1 may still read theirs while tile k is converted). Per tile k:
//   loaders wait for tile k (+ gather row scaling); A; each group loads its pass's inputs;
//   thread 0 waits until the stores of tile k-2 have read staging k % 2; C; refill with tile
//   k + S; convert → staging k % 2; fence.proxy.async; B; thread 0 issues both TMA stores and
//   commits one bulk group per tile (empty when there is nothing to store, so the group count
//   stays one per tile). Same helpers, so the same bytes as the staged kernel. Plain copies of
//   dense and gather inputs only (grouped inputs and the fast form alone stay on the staged
//   kernel, see launch_staged).
// Run 32 (bench_quant --quick): 74.1 / 78.1 / 74.7% of copy on 16384x7168 / 65536x2048 /
// 32768x2880 and 79.7% on weights 128x1536x2048, against 72.7 / 76.2 / 72.8 / 75.1% for the
// staged kernel in the same run: +1.4 to +4.6 points, still short of 85%.
constexpr int kWsThreads = 2 * kThreads;
struct WsLayout {
  static constexpr int kStagesIn = 4;
  static constexpr int kOut = kStagesIn * kStageBytes;         // staging: [2][row tile, col tile]
  static constexpr int kBytes = kOut + 4 * kOutTileBytes;       // 192 KB
};

// kLate (MXMOE_QUANT_LATE_SCALES=1, dense inputs): the scale bytes are stored after barrier B and
// the TMA stores instead of before the fence (ScaleStores).
template <RowMap kMap, bool kLate = false>
__global__ void __launch_bounds__(kWsThreads, 1) quantize_mxfp8_two_group_kernel(
    const QuantizeParams p, const TileGrid g, const __grid_constant__ CUtensorMap row_map,
    const __grid_constant__ CUtensorMap col_map) {
  static_assert(kMap != RowMap::kGrouped, "grouped inputs take the staged kernel (run 32)");
  using L = WsLayout;
  constexpr int S = L::kStagesIn;
  constexpr int kStageVecs = kTileRows * kVecPerRow;
  extern __shared__ __align__(1024) uint8_t two_group_smem[];
  uint8_t* smem = two_group_smem;
  uint4* stages = reinterpret_cast<uint4*>(smem);
  trap_unless_staging_aligned(smem);
  const bool row_group = threadIdx.x < kThreads;  // loads + row-wise pass; else column-wise pass
  const uint32_t num_tiles = uint32_t(g.num_tiles);
  GatherAhead ahead;  // gather: row indices (and scales) one tile ahead, in the loading warps
  ahead.used = gather_rows_used<kMap>(p);
  auto tile_k = [&](uint32_t k) { return cta_tile<kMap, S>(p, g, nullptr, k, ahead.used); };
  auto issue = [&](uint32_t k) {
    if (row_group) {
      const Tile t = tile_k(k);
      if (t.out_valid > 0) load_tile_async<kMap>(p, t, stages + (k % S) * kStageVecs, ahead.index);
      gather_ahead_issued<kMap>(p, ahead, tile_k, k);
      dev::cp_async_commit_group();
    }
  };
  if (row_group) gather_ahead_start<kMap>(p, ahead, tile_k);
#pragma unroll
  for (int k = 0; k < S; ++k) issue(k);
  // The loop is written once per group (kRowGroup), so that each group's inputs are the only
  // ones live across barrier C; both groups pass the same barriers in the same order.
  auto run = [&](auto row_tag) {
    constexpr bool kRowGroup = decltype(row_tag)::value;
    for (uint32_t k = 0; blockIdx.x + k * gridDim.x < num_tiles; ++k) {
      const Tile t = tile_k(k);
      uint4* stage = stages + (k % S) * kStageVecs;
      const bool valid = t.out_valid > 0;  // uniform across the CTA
      if constexpr (kRowGroup) {
        dev::cp_async_wait_group<S - 1>();  // this thread's part of tile k landed
        gather_scale_tile<kMap>(p, ahead, tile_k, k, t, valid, stage);
      }
      __syncthreads();  // A: tile k is visible to every thread
      using In = std::conditional_t<kRowGroup, RowVecs, ColWords>;
      In in;
      if (valid) {
        if constexpr (kRowGroup) in = rowwise_load(stage);
        else in = colwise_load(reinterpret_cast<const uint32_t*>(stage));
      }
      if (threadIdx.x == 0) device::cp_async_bulk_wait_group_read<1>();  // tile k-2's stores read staging k % 2
      __syncthreads();  // C: stage k % S has been read; staging k % 2 is free
      issue(k + S);
      uint8_t* row_out = smem + L::kOut + (k & 1) * 2 * kOutTileBytes;
      uint8_t* col_out = row_out + kOutTileBytes;
      ScaleStores late;  // kLate: this thread's scale bytes, stored after the TMA stores
      if (valid) {
        if constexpr (kRowGroup) rowwise_staged<false>(p, t, in, row_out, row_of_thread(), half_of_thread(), kLate ? &late : nullptr);
        else colwise_staged<false>(p, t, in, col_out, kLate ? &late : nullptr);
      }
      device::fence_proxy_async_shared_cta();
      __syncthreads();  // B: the staging is complete
      if (valid && kMap == RowMap::kGather && t.out_valid < kTileRows) {
        copy_out_partial<true, true, false, false, kWsThreads>(p, t, row_out, col_out);
      } else if (valid && threadIdx.x == 0) {
        device::cp_async_bulk_tensor_3d_shared_to_global(&row_map, row_out, t.c0, t.r0, t.b);
        device::cp_async_bulk_tensor_3d_shared_to_global(&col_map, col_out, t.r0, t.c0, t.b);
      }
      if (threadIdx.x == 0) device::cp_async_bulk_commit_group();
      if constexpr (kLate) store_scales(late);
    }
  };
  if (row_group) run(std::true_type{});
  else run(std::false_type{});
  if (threadIdx.x == 0) device::cp_async_bulk_wait_group<0>();
  if (row_group) dev::cp_async_wait_group<0>();
}

// ==== Pipelined kernel (one direction by default; both with MXMOE_QUANT_TMA=1): TMA loads into an mbarrier ring; no CTA-wide barrier ====
// The plain MX copies of dense inputs (a matrix or a batch of them; rows, columns or both). One CTA
// of 18 warps per SM (persistent; warp 17 is the scale writer, idle unless MXMOE_QUANT_TMA_SCALES=warp):
//  - warp 16 (one lane) is the producer: for each tile of the walk it waits until the ring slot is
//    free (mbarrier `empty`), writes the tile's coordinates into the slot, and loads the 128x128
//    BF16 tile with two TMA copies (two [128 rows, 64 columns] boxes, 128-byte swizzle: 16-byte
//    chunk c of row r at c ^ (r % 8)) that complete on the slot's mbarrier `full`; a box wholly
//    past the last column is not loaded (its bytes are not waited for, and nothing reads them into
//    an output that is stored);
//  - warps 0-15 are consumers, each on its own 16-row (row-wise) or 16-column (column-wise) slice
//    of a tile: wait for `full`, copy the slice's inputs into registers, arrive on `empty` (one
//    arrival per warp), convert into the warp's own 2 KB staging slice (double-buffered), fence,
//    and one lane stores the slice with a TMA store (full 128-byte lines); the scale bytes are
//    stored after that (session 10: before the fence, its MEMBAR.ALL.CTA waited for them, see
//    ScaleStores; PipeOpts.late_scales has the other orders). Warps synchronise only
//    through the ring's mbarriers and their own bulk groups: none waits for another warp's
//    conversion or stores, unlike barriers A-C-B of the staged and two-group kernels, where ncu saw
//    35-49% of samples at a barrier and ~1.1 eligible warps a scheduler (runs 26, 37).
// Both directions: 8 row-wise + 8 column-wise warps per tile. One direction: two teams of 8 warps
// take alternate tiles.
// Row-wise warp w: tile rows 16w..16w+15, thread = (row, half): the staged kernel's two 32-blocks a
// thread (rowwise_staged, the same arithmetic and bytes). Column-wise warp w: tile columns
// 16w..16w+15, lane = h + 8q: column quad q (4 columns), 16-row group h. So that its 16 loads of 8
// bytes are free of bank conflicts on the TMA layout, thread h reads its rows in the order
// 16h + (i ^ h) (in each half-warp the 8 rows then sit in 8 different chunks); the codes are put
// back in row order with one byte permutation (PRMT) per 4 output bytes. Lanes h and h ^ 1 hold
// the two halves of a 32-row block (one shuffle for its amax). Staging row = tile column, chunk
// h: the 8 lanes of a quarter-warp store 8 different chunks of one row.
// Tile walk: by default the unit round robin with TMA-stored scale units where the shape qualifies —
// one direction (session 12): units of 8 tiles along the scales' lines ("TMA-stored scale units"
// below); both directions (session 12, quant-tmas2; they reach this kernel only with MXMOE_QUANT_TMA=1,
// the two-group kernel being their default, run 90): units of 4x4 tiles where rows and K are multiples
// of 512 ("... of both directions"); elsewhere, and with MXMOE_QUANT_SCALE_TMA=0, the round robin (tile
// ids c + k * grid) of runs 56-68 with per-tile scale stores. MXMOE_QUANT_SCALE_UNIT=1 / RxC: session
// 11's unit walk (quantize_unit_walk.h; CTA
// c converts a contiguous range of tile positions ordered by units of gr x gc tiles) with the scale
// writer warp storing each unit's bytes as runs of 4 gc / 4 gr bytes (run 64: slower; opt-in).
// Smem: 4 stages x 32 KB + 16 warps x 2 x 2 KB staging + 8 x 1 KB scale slots + 16 KB unit buffer +
// 2 KB alignment slack (218.25 KB); both directions 8 KB more (the 4x4 units' second buffer). The
// stage and staging bases are 2048-byte aligned at run time, so that the swizzled addresses are
// one XOR of a per-thread base (no 64-bit or IMAD address arithmetic per access).
constexpr int kPipeStages = 4;
constexpr int kPipeConsumerWarps = 16;
constexpr int kPipeThreads = (kPipeConsumerWarps + 2) * 32;  // + the producer warp + the scale writer warp
constexpr int kPipeBoxCols = 64;                              // BF16 columns of one TMA load box (128 B)
constexpr int kPipeBoxBytes = kTileRows * kPipeBoxCols * 2;   // 16 KB
constexpr int kPipeSliceBytes = 16 * 128;                     // one warp's output slice: 16 rows x 128 B
struct PipeTile {
  int32_t b, r0, c0, out_valid;
};
// Diagnostic switches of the pipelined kernel (read from the environment on every call, see
// pipe_options): none changes an output byte.
//  - group: the tile raster's group height in row tiles (today's kernels: kGroupRowTiles = 8).
//    Consecutive tile ids walk the G row tiles of one column tile, then the next column tile, so
//    the ~132 tiles in flight at once cover G row tiles x (132 / G) column tiles: contiguous runs
//    of ~G x 128 B in each column-wise output row and ~(132 / G) x 128 B in each row-wise output
//    row (x2 for the input). G = 1: row-major; G = tiles_r: column-major.
//  - load_hint / store_hint: L2 cache policy of the TMA loads / TMA stores (-1: no hint; 0 evict_normal,
//    1 evict_first, 2 evict_last; createpolicy_l2). Default: loads without a hint, stores evict_last
//    (run 59: +2.3 to +5.6 points in back-to-back timing, +3.6 for both directions with the flush).
//  - late_scales: 1 (default) = the scale bytes are stored after the slice's TMA store is issued,
//    0 = before the fence, as measured in runs 56-59 (see ScaleStores); 2 = the consumer warps put
//    them in shared memory and the scale writer warp stores them (4 bytes a row or column of a
//    tile in one store where aligned), so no consumer warp has a global store in flight at its fence.
//    3 (the default with the unit walk) = the scale writer collects a unit's scale bytes in shared
//    memory and stores them when the CTA's part of the unit is done, consecutive bytes of a row
//    (column) from consecutive lanes (quantize_unit_walk.h): runs of 4 gc (4 gr) bytes instead of 4.
//  - skel_scales (skeleton only): 1 = the skeleton also stores scale bytes (0x7F) to the real
//    addresses, in the order late_scales says; 0 = no scale stores (runs 56-59's skeleton).
//  - unit (MXMOE_QUANT_SCALE_UNIT, session 11; off unless asked for since run 64 measured it slower):
//    1 = the unit walk (quantize_unit_walk.h: CTA c converts a contiguous range of tile positions,
//    ordered by units of walk.gr x walk.gc tiles; `group` is then unused); 0 = the round-robin walk
//    of runs 56-62 (tile ids c + k * grid in the raster of `group`).
//  - tmas (MXMOE_QUANT_SCALE_TMA, session 12; both directions: 4x4-tile units, see "... of both
//    directions"; one direction:): 1 = the unit round robin (CTA c
//    takes units c, c + P, c + 2P, ... of kTmasUnit tiles adjacent along the scales' contiguous
//    dimension, and walks each unit's tiles in order; see "TMA-stored scale units" below), with
//    late_scales 4 (the default where the shape qualifies: the unit's scale bytes leave by one TMA
//    tensor store) or 1 (MXMOE_QUANT_SCALE_TMA=walk: per-tile scale stores on the same walk).
struct PipeOpts {
  int32_t group = kGroupRowTiles, full_groups = 0;
  int32_t load_hint = -1, store_hint = 2;
  int32_t late_scales = 1, skel_scales = 0;
  int32_t unit = 0;
  FastDivmod per_group, group_rows, last_group_rows;
  UnitWalk walk;
  // The unit round robin (tmas = 1). Per batch entry the units form a grid [tmas_across lines,
  // ceil(tmas_along / kTmasUnit) units a line] (row-wise: lines = 128-row bands, units along K;
  // column-wise: lines = 128-column bands, units along the rows). Unit ids run along a line, then
  // the next line (tmas_order 0), or across the lines first (tmas_order 1, MXMOE_QUANT_TMA_UNIT_ORDER).
  // Units [0, tmas_whole) are taken whole; units [tmas_whole, tmas_units) are split into single tiles
  // dealt round robin (the guided tail; their scale bytes are stored per tile).
  int32_t tmas = 0, tmas_order = 0;
  int32_t tmas_along = 0, tmas_across = 0, tmas_units = 0, tmas_whole = 0;
  FastDivmod tmas_per_batch, tmas_minor;
};

// ---- TMA-stored scale units (MXMOE_QUANT_SCALE_TMA, session 12; one direction alone) ----
// Run 62: the per-tile scale stores (4-byte runs, one L2 sector and request each) cost ~6 points
// row-wise and ~5 column-wise (skeleton 92.5 -> 86.7, 89.4 -> 84.3); runs 64 and 68 made longer runs
// by walking far-apart tiles or by moving bytes between CTAs, and lost more than they saved. Here:
//  - walk: round robin over units of kTmasUnit = 8 tiles adjacent along the scales' contiguous
//    dimension (row-wise: 8 tiles along K = 32 scale bytes of each of 128 rows; column-wise: 8 tiles
//    along the rows = 32 bytes of each of 128 columns); CTA c converts units c, c + P, ... tile by
//    tile, so the P units in flight are neighbours (consecutive unit ids are adjacent);
//  - scale bytes: the consumer warps write each tile's 4 bytes a row (column) into a shared unit
//    buffer [128][32 B] (two of them, alternate units); when every consumer warp has arrived on the
//    buffer's `ufull` mbarrier for the unit, the scale writer warp's lane 0 stores it with one TMA
//    tensor store (box [128 rows][32 B] of the scale array seen as uint8 [batch, rows, nblk]; the
//    TMA unit clips what lies past the tensor), waits until the store has read it and arrives on
//    `uempty`, which the consumers wait on before writing that buffer again. Needs nblk % 16 == 0
//    (global strides in multiples of 16 bytes) and a 16-byte aligned scale pointer; otherwise (K =
//    2880: nblk = 90) the round-robin walk with per-tile stores runs instead (pipe_options).
//  - tail: U units on P CTAs leave a last wave of U mod P units; where that costs more than 3% of
//    the tile round robin's waves, those units are split into single tiles dealt round robin, whose
//    scale bytes are stored per tile (late, as late_scales 1).
// The ufull / uempty mbarriers are the scale slots' sfull[0..1] / sempty[0..1] (unused otherwise in
// this mode), with ufull counting one arrival per consumer warp (all 16, whether or not a warp had a
// tile in the unit: a warp arrives for unit n only after its wait on uempty for n, so it can never
// arrive on a phase still waiting for unit n - 2).
constexpr int kTmasUnit = 8;                         // tiles a unit
constexpr int kTmasBufBytes = kTileRows * 4 * kTmasUnit;  // [128 rows or columns][32 B]
struct TmasUnit {
  int32_t b, a, x, w;  // batch entry, unit index along its line, line, tiles in the unit
};
// Unit u of the unit round robin: its batch entry, line and index along the line (o.tmas_order: ids
// along a line, then the next line; or across the lines first).
struct UnitPos {
  int32_t b, line, along;
};
__device__ __forceinline__ UnitPos unit_pos(const PipeOpts& o, uint32_t u) {
  UnitPos up;
  up.b = int32_t(o.tmas_per_batch.div(u));
  const uint32_t rem = u - uint32_t(up.b) * o.tmas_per_batch.d;
  const uint32_t hi = o.tmas_minor.div(rem), lo = rem - hi * o.tmas_minor.d;
  up.line = int32_t(o.tmas_order == 0 ? hi : lo);
  up.along = int32_t(o.tmas_order == 0 ? lo : hi);
  return up;
}
__device__ __forceinline__ TmasUnit tmas_unit_at(const PipeOpts& o, uint32_t u) {
  const UnitPos up = unit_pos(o, u);
  TmasUnit un;
  un.b = up.b;
  un.x = up.line;
  un.a = up.along;
  un.w = min(kTmasUnit, o.tmas_along - kTmasUnit * un.a);
  return un;
}
// Tile j of a unit: row-wise (kRow) tile (line, 8a + j), column-wise (8a + j, line).
template <bool kRow>
__device__ __forceinline__ PipeTile tmas_tile(const QuantizeParams& p, const TmasUnit& un, int32_t j) {
  const int32_t along = kTmasUnit * un.a + j;
  PipeTile t;
  t.b = un.b;
  t.r0 = (kRow ? un.x : along) * kTileRows;
  t.c0 = (kRow ? along : un.x) * kTileCols;
  t.out_valid = int32_t(min64(kTileRows, p.rows_out - t.r0));
  return t;
}
// This CTA's walk over units of at most kUnitTiles tiles (unit_at(u): unit u, whose .w tiles are
// tiles 0 .. w - 1 of it): on_tile(k, unit, n, j) for its k-th tile (tile j of the unit; n = the
// CTA's n-th whole unit, -1 for a tail tile), on_unit_end(unit, n) after each whole unit's tiles.
// Every role (producer, consumers, scale writer) runs the same walk.
template <int kUnitTiles, class UnitAt, class OnTile, class OnUnitEnd>
__device__ __forceinline__ void unit_round_robin(const PipeOpts& o, UnitAt&& unit_at, OnTile&& on_tile,
                                                 OnUnitEnd&& on_unit_end) {
  const uint32_t P = gridDim.x;
  uint32_t k = 0;
  int32_t n = 0;
  for (uint32_t u = blockIdx.x; u < uint32_t(o.tmas_whole); u += P, ++n) {
    const auto un = unit_at(u);
    for (int32_t j = 0; j < un.w; ++j, ++k) on_tile(k, un, n, j);
    on_unit_end(un, n);
  }
  const uint32_t tail = uint32_t(kUnitTiles) * uint32_t(o.tmas_units - o.tmas_whole);
  for (uint32_t v = blockIdx.x; v < tail; v += P) {
    const auto un = unit_at(uint32_t(o.tmas_whole) + v / kUnitTiles);
    const int32_t j = int32_t(v % kUnitTiles);
    if (j < un.w) on_tile(k++, un, -1, j);
  }
}
template <class OnTile, class OnUnitEnd>
__device__ __forceinline__ void tmas_walk(const PipeOpts& o, OnTile&& on_tile, OnUnitEnd&& on_unit_end) {
  unit_round_robin<kTmasUnit>(o, [&](uint32_t u) { return tmas_unit_at(o, u); }, on_tile, on_unit_end);
}

// ---- TMA-stored scale units of both directions (MXMOE_QUANT_SCALE_TMA with MXMOE_QUANT_TMA=1; session
// 12, branch quant-tmas2) ----
// Units of 4 x 4 tiles (512 rows x 512 columns): a unit's row-wise scale bytes are 512 rows x 16
// contiguous bytes (4 tiles along K) and its column-wise ones 512 columns x 16 bytes (4 tiles along
// the rows): 16-byte runs, the TMA's least inner box. Only where rows and K are multiples of 512
// (then every unit is whole and every tile full: nothing to clip) and both scale pointers are
// 16-byte aligned (pipe_options); otherwise the round robin with per-tile stores runs, as before.
//  - walk: unit_round_robin over units with ids along the columns within a 512-row band (order 0)
//    or along the rows within a 512-column band (order 1, MXMOE_QUANT_TMA_UNIT_ORDER=across); tile j
//    of a unit is row tile 4 ur + j % 4, column tile 4 uc + j / 4 (down the unit's 4 row tiles first,
//    as the tile raster walks its group of row tiles);
//  - scale bytes: two unit buffers (alternate units), each a row-wise part [512 rows][16 B] and a
//    column-wise part [512 columns][16 B] (PipeLayout::tmas2_part): row r of tile j at row
//    128 (j % 4) + r, bytes 4 (j / 4) + block; column c at column 128 (j / 4) + c, bytes 4 (j % 4) + block;
//  - the scale writer's lane 0 stores a unit with 4 TMA stores of [256][16 B] boxes (2 a direction)
//    once every consumer warp has arrived on ufull = sfull[n % 2] (16 arrivals, one per consumer warp
//    after its 16 tiles' fenced writes), waits for them to have read the buffer and arrives on
//    uempty = sempty[n % 2]; consumers wait on uempty before writing a buffer and before arriving;
//  - tail: as for one direction (a last partial wave of units split into single tiles with per-tile
//    late stores where that wave costs > 3% over the tile round robin; 16384x7168 on 132 CTAs: 448
//    units, 396 whole + 832 single tiles: 55 tile times, the tile round robin's 55).
// Waits of this path trap after kTmas2TimeoutNs (a mis-counted barrier fails the launch, no hang).
constexpr int kTmas2Side = 4;                                   // tiles a unit side
constexpr int kTmas2Tiles = kTmas2Side * kTmas2Side;            // tiles a unit
constexpr int kTmas2Lines = kTmas2Side * kTileRows;             // rows (columns) of a unit: 512
constexpr int kTmas2Run = 4 * kTmas2Side;                       // scale bytes a row (column) of a unit: 16
constexpr int kTmas2PartBytes = kTmas2Lines * kTmas2Run;        // [512][16 B] = 8 KB
constexpr int kTmas2BoxLines = 256;                             // a TMA box dimension is at most 256
constexpr uint64_t kTmas2TimeoutNs = 2000000000ull;             // 2 s
struct Tmas2Unit {
  int32_t b, ur, uc, w;  // batch entry, unit row and column (in units), tiles in the unit (16)
};
// (Lines are 512-row bands, units along the columns: tmas_walk_options.)
__device__ __forceinline__ Tmas2Unit tmas2_unit_at(const PipeOpts& o, uint32_t u) {
  const UnitPos up = unit_pos(o, u);
  return Tmas2Unit{up.b, up.line, up.along, kTmas2Tiles};
}
__device__ __forceinline__ PipeTile tmas2_tile(const QuantizeParams& p, const Tmas2Unit& un, int32_t j) {
  PipeTile t;
  t.b = un.b;
  t.r0 = (kTmas2Side * un.ur + j % kTmas2Side) * kTileRows;
  t.c0 = (kTmas2Side * un.uc + j / kTmas2Side) * kTileCols;
  t.out_valid = int32_t(min64(kTileRows, p.rows_out - t.r0));
  return t;
}
template <class OnTile, class OnUnitEnd>
__device__ __forceinline__ void tmas2_walk(const PipeOpts& o, OnTile&& on_tile, OnUnitEnd&& on_unit_end) {
  unit_round_robin<kTmas2Tiles>(o, [&](uint32_t u) { return tmas2_unit_at(o, u); }, on_tile, on_unit_end);
}

// Tile id → tile of the walk with the raster of `o` (tile_at's order when o.group == kGroupRowTiles).
__device__ __forceinline__ PipeTile pipe_tile_at(const QuantizeParams& p, const TileGrid& g, const PipeOpts& o,
                                                 uint32_t id) {
  PipeTile t;
  t.b = int32_t(g.per_batch.div(id));
  const uint32_t in_b = id - uint32_t(t.b) * g.per_batch.d;
  const uint32_t grp = o.per_group.div(in_b), rem = in_b - grp * o.per_group.d;
  const FastDivmod& rows_in_group = int32_t(grp) < o.full_groups ? o.group_rows : o.last_group_rows;
  const uint32_t tc = rows_in_group.div(rem), tr_in = rem - tc * rows_in_group.d;
  t.r0 = int32_t((grp * uint32_t(o.group) + tr_in) * kTileRows);
  t.c0 = int32_t(tc * kTileCols);
  t.out_valid = int32_t(min64(kTileRows, p.rows_out - t.r0));
  return t;
}
// Scale slots of the writer warp (late_scales 2, 3): tile k's bytes go to slot k % kPipeScaleSlots.
// 8 rather than the ring's 4 (session 11): the writer spends ~2-3 tile times storing a 4x4 unit, and
// the consumer warps must not wait for a slot meanwhile.
constexpr int kPipeScaleSlots = 8;
struct PipeLayout {
  static constexpr int kStaging = kPipeStages * kStageBytes;                           // [S][2 boxes][128][128 B]
  static constexpr int kTiles = kStaging + kPipeConsumerWarps * 2 * kPipeSliceBytes;  // [S] PipeTile
  static constexpr int kFull = kTiles + kPipeStages * int(sizeof(PipeTile));          // [S] mbarrier
  static constexpr int kEmpty = kFull + kPipeStages * 8;                               // [S] mbarrier
  // Scale writer (late_scales 2, 3): per scale slot, the tile's row-wise scale bytes [128 rows][4 blocks]
  // then its column-wise ones [128 columns][4 blocks]; `sfull` (one arrival per consumer warp of the
  // tile) and `sempty` (the writer's arrival) mbarriers per slot.
  static constexpr int kScaleSlot = 2 * kTileRows * 4;
  static constexpr int kScales = kEmpty + kPipeStages * 8;
  static constexpr int kSFull = kScales + kPipeScaleSlots * kScaleSlot;
  static constexpr int kSEmpty = kSFull + kPipeScaleSlots * 8;
  // The unit buffer (late_scales 3; quantize_unit_walk.h): row part [gr * 128][4 gc], then col part
  // [gc * 128][4 gr]; 16 KB (4x4 units both ways, 1x8 / 8x1 one way, at most 32 tiles one way).
  static constexpr int kUnit = kSEmpty + kPipeScaleSlots * 8;
  static constexpr int kUsed = kUnit + kUnitBufferBytes;
  static constexpr int kBytes = kUsed + 2048;  // slack: the base is aligned up to 2048 at run time
  // TMA scale units of both directions: buffer bb's row-wise / column-wise part [512][16 B] (8 KB
  // each): buffer 0's in the scale slots and the first half of the unit buffer, buffer 1's in the
  // second half and in 8 KB past kUsed (kBytesBoth: that kernel's allocation, 226.25 KB).
  static constexpr int tmas2_part(int bb, bool col) {
    return bb == 0 ? (col ? kUnit : kScales) : (col ? kUsed : kUnit + kTmas2PartBytes);
  }
  static constexpr int kBytesBoth = kBytes + kTmas2PartBytes;
};
static_assert(kPipeBoxBytes == pipe_slice::kBoxBytes, "pipe_slice.cuh's box");
static_assert(kStageBytes == 2 * kPipeBoxBytes && kPipeBoxBytes % 2048 == 0 && kPipeSliceBytes == 2048,
              "2048-byte aligned stages, boxes and slices");
static_assert(kTileRows == 8 * 16 && kTileCols == 8 * 16, "8 warps of 16 rows / 16 columns cover a tile");
static_assert(PipeLayout::kBytes <= 227 * 1024, "one CTA per SM");
static_assert(PipeLayout::kBytes == 223488, "the layout measured by ptxas in session 11 (218.25 KB)");
static_assert(unit_buffer_bytes(4, 4, 2) <= kUnitBufferBytes && unit_buffer_bytes(1, 8, 1) <= kUnitBufferBytes,
              "the default units fit the unit buffer");
static_assert(PipeLayout::kUnit % 16 == 0, "unit buffer words");
static_assert(PipeLayout::kUnit % 128 == 0 && 2 * kTmasBufBytes <= kUnitBufferBytes,
              "two TMA scale unit buffers in the unit buffer, 128-byte aligned (TMA store source)");
static_assert(kPipeScaleSlots >= 2, "ufull / uempty are sfull / sempty [0..1]");
static_assert(kPipeScaleSlots * PipeLayout::kScaleSlot == kTmas2PartBytes && 2 * kTmas2PartBytes == kUnitBufferBytes,
              "both directions' unit buffers: one part in the scale slots, two in the unit buffer");
static_assert(PipeLayout::kScales % 128 == 0 && PipeLayout::kUsed % 128 == 0 && kTmas2BoxLines * kTmas2Run % 128 == 0,
              "TMA store sources 128-byte aligned");
static_assert(PipeLayout::kBytesBoth <= 227 * 1024, "one CTA per SM with both directions' unit buffers");
static_assert(kTmas2Lines % kTmas2BoxLines == 0 && kTmas2BoxLines <= 256, "a unit part is whole boxes");

// Row-wise slice: the thread's row (tile row r) and half (pipe_slice.cuh).
__device__ __forceinline__ RowVecs pipe_row_load(uint32_t stage, int r, int half) {
  RowVecs rv;
  pipe_slice::row_load(stage, r, half, rv.v);
  return rv;
}

// Column-wise slice of warp w (tile columns 16w..16w+15), thread (q, h): w[2i] = columns
// (16w + 4q, +1) and w[2i+1] = (16w + 4q + 2, +3) of tile row 16h + (i ^ h) (pipe_slice.cuh).
__device__ __forceinline__ ColWords pipe_col_load(uint32_t stage, int w, int q, int h) {
  ColWords cw;
  pipe_slice::col_load(stage, w, q, h, cw.w);
  return cw;
}

// Quantizes a column-wise slice (the arithmetic of colwise_quantize, block partner lane ^ 1) and
// writes its codes in row order to the warp's staging slice (row 4q + c = column, chunk h = rows
// 16h..16h+15); returns the scale bytes' stores (col_scale_stores).
__device__ __forceinline__ ScaleStores pipe_col_convert(const QuantizeParams& p, const PipeTile& t, const ColWords& cw,
                                                        int w, int q, int h, uint32_t slice) {
  const uint32_t* x = cw.w;
  uint32_t sc[4];
  pipe_slice::col_scale_bytes(x, p.mode, sc);
  const uint32_t sel = pipe_slice::col_selector(h);
  const uint32_t row0 = pipe_slice::col_row0(slice, q, h);
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const float rcp = dev::e8m0_reciprocal(sc[c]);
    // A NaN block's codes are all NaN; a mask (one LOP3 a word) rather than a select, which ptxas
    // turned into a branch around every word's conversion.
    const uint32_t nan_mask = 0u - uint32_t(sc[c] == kE8M0Nan);
    uint32_t nat[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) nat[j] = (col_codes_x4(x, c, j, rcp) & ~nan_mask) | (dev::kE4M3NanX4 & nan_mask);
    pipe_slice::col_store(row0, c, pipe_slice::col_in_row_order(nat, sel));
  }
  return col_scale_stores(p, t.b, t.r0, t.out_valid, t.c0 + 16 * w + 4 * q, h,
                          sc[0] | (sc[1] << 8) | (sc[2] << 16) | (sc[3] << 24));
}

// The scale writer warp with the unit walk (late_scales == 3; quantize_unit_walk.h): for each tile of
// the CTA's walk, copies the tile's scale slot (filled by the consumer warps) into the unit buffer
// and frees the slot; when the CTA's part [a, i + 1) of a unit is complete (the unit's last tile, or
// the CTA's last), stores it: byte e of a part by lane e % 32, so one store instruction writes 32
// consecutive bytes of the part: 32 / (4 gc) whole row runs (or one row's 32 bytes), and the L1
// sends one request per run and 128-byte line instead of one per 4-byte run. Byte stores, so no
// alignment is assumed (K = 2880: rows of 90 bytes). Which bytes are stored is the per-tile rule of
// every other path (unit_row_scale_dst / unit_col_scale_dst; tests/cpu/test_quantize_unit_walk.cpp).
template <bool kRow, bool kCol>
__device__ __forceinline__ void pipe_unit_scale_writer(const QuantizeParams& p, const UnitWalk& u, uint8_t* smem,
                                                       uint64_t* sfull, uint64_t* sempty, uint32_t first,
                                                       uint32_t count, int lane) {
  using L = PipeLayout;
  uint8_t* rpart = smem + L::kUnit;                                    // [gr * 128][4 gc]
  uint8_t* cpart = rpart + (kRow ? unit_row_part_bytes(u, u.gr) : 0);  // [gc * 128][4 gr]
  int32_t a = 0;  // the first position of the CTA's part of the current unit
  for (uint32_t k = 0; k < count; ++k) {
    const int s = int(k % kPipeScaleSlots);
    device::mbarrier_wait_parity(&sfull[s], (k / kPipeScaleSlots) & 1);
    const UnitTile t = unit_tile_at(u, first + k);
    if (k == 0 || t.i == 0) a = t.i;
    const int32_t tr_in = t.tr - t.ur0, tc_in = t.tc - t.uc0;
    const uint32_t* slot = reinterpret_cast<const uint32_t*>(smem + L::kScales + s * L::kScaleSlot);
#pragma unroll
    for (int i = 0; i < kTileRows / 32; ++i) {
      const int x = 32 * i + lane;
      if constexpr (kRow) reinterpret_cast<uint32_t*>(rpart)[unit_row_word(u, tr_in, tc_in, x)] = slot[x];
      if constexpr (kCol) reinterpret_cast<uint32_t*>(cpart)[unit_col_word(u, tr_in, tc_in, x)] = slot[kTileRows + x];
    }
    __syncwarp();
    if (lane == 0) device::mbarrier_arrive(&sempty[s]);  // the slot has been read
    if (k + 1 < count && t.i + 1 < t.h * t.w) continue;
    const int32_t e_end = t.i + 1;  // the part [a, e_end) is complete: store it
    if constexpr (kRow) {
      const int32_t bytes = unit_row_part_bytes(u, t.h);
#pragma unroll 4
      for (int32_t e = lane; e < bytes; e += 32) {
        const int64_t d = unit_row_scale_dst(u, t, a, e_end, p.rows_out, p.cols, e);
        if (d >= 0) p.row_scales[d] = rpart[e];
      }
    }
    if constexpr (kCol) {
      const int32_t bytes = unit_col_part_bytes(u, t.w);
#pragma unroll 4
      for (int32_t e = lane; e < bytes; e += 32) {
        const int64_t d = unit_col_scale_dst(u, t, a, e_end, p.rows_out, p.cols, e);
        if (d >= 0) p.col_scales[d] = cpart[e];
      }
    }
    __syncwarp();  // every lane has read the unit buffer before the next tile's copy overwrites it
  }
}

// kSkel (diagnostic, MXMOE_QUANT_TMA=skel): the same TMA loads and data stores, mbarriers and bulk
// groups, but no conversion and no scale stores: each warp stores its staging slice as it is
// (stale bytes). What the memory system gives this access pattern with no arithmetic in the way.
// scale_map (one direction, o.late_scales == 4): the scale array as uint8 [batch, rows (row-wise) or
// cols (column-wise), nblk], boxes [1, 128, 32] (TMA-stored scale units). Both directions with
// o.late_scales == 4: scale_map the row-wise scales [batch, rows, nblk_r] and col_scale_map the
// column-wise ones [batch, cols, nblk_c], boxes [1, 256, 16] (kTmas2).
template <bool kRow, bool kCol, bool kSkel>
__global__ void __launch_bounds__(kPipeThreads, 1) quantize_mxfp8_pipelined_kernel(
    const QuantizeParams p, const TileGrid g, const PipeOpts o, const __grid_constant__ CUtensorMap x_map,
    const __grid_constant__ CUtensorMap row_map, const __grid_constant__ CUtensorMap col_map,
    const __grid_constant__ CUtensorMap scale_map, const __grid_constant__ CUtensorMap col_scale_map) {
  using L = PipeLayout;
  constexpr int S = kPipeStages;
  constexpr int kWarpsPerTile = 8 * (int(kRow) + int(kCol));
  constexpr int kTeams = kPipeConsumerWarps / kWarpsPerTile;  // 1 (both directions) or 2
  constexpr bool kTmas = kRow != kCol;  // the unit round robin of one direction (units of 8 tiles)
  constexpr bool kTmas2 = kRow && kCol && !kSkel;  // both directions' (4x4 tiles; not in the skeleton)
  // Both directions: every mbarrier wait traps after kTmas2TimeoutNs (a hang fails the launch instead).
  const auto wait = [](uint64_t* bar, uint32_t parity) {
    if constexpr (kTmas2) device::mbarrier_wait_parity_or_trap(bar, parity, kTmas2TimeoutNs);
    else device::mbarrier_wait_parity(bar, parity);
  };
  static_assert(kRow || kCol, "at least one direction");
  extern __shared__ __align__(1024) uint8_t pipe_smem[];
  // Align the base up to 2048 bytes (the XOR addressing of pipe_row_load / pipe_col_load).
  const uint32_t raw = device::smem_addr(pipe_smem);
  uint8_t* smem = pipe_smem + ((2048u - (raw & 2047u)) & 2047u);
  const uint32_t sbase = device::smem_addr(smem);
  PipeTile* ring = reinterpret_cast<PipeTile*>(smem + L::kTiles);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kFull);
  uint64_t* empty = reinterpret_cast<uint64_t*>(smem + L::kEmpty);
  uint64_t* sfull = reinterpret_cast<uint64_t*>(smem + L::kSFull);
  uint64_t* sempty = reinterpret_cast<uint64_t*>(smem + L::kSEmpty);
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  // This CTA's walk: tiles k = 0 .. count - 1. Round robin (o.unit == 0): tile id first + k * step in
  // the raster of o.group; unit walk: tile position first + k (quantize_unit_walk.h).
  const uint32_t num_tiles = uint32_t(g.num_tiles);
  uint32_t first = blockIdx.x, step = gridDim.x, count = 0;
  if (o.unit) unit_cta_range(num_tiles, gridDim.x, blockIdx.x, &first, &count);
  else count = (num_tiles - first + step - 1) / step;  // (grid <= tiles: first < num_tiles)
  const auto tile_of = [&](uint32_t k) {
    if (!o.unit) return pipe_tile_at(p, g, o, first + k * step);
    const UnitTile u = unit_tile_at(o.walk, first + k);
    PipeTile t;
    t.b = u.b;
    t.r0 = u.tr * kTileRows;
    t.c0 = u.tc * kTileCols;
    t.out_valid = int32_t(min64(kTileRows, p.rows_out - t.r0));
    return t;
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      device::mbarrier_init(&full[s], 1);                 // the producer's arrive.expect_tx
      device::mbarrier_init(&empty[s], kWarpsPerTile);    // one arrival per consumer warp of the tile
    }
    // Scale writer: one arrival per consumer warp of the tile; TMA scale units (ufull = sfull[0..1]):
    // one per consumer warp of the CTA.
    const uint32_t sfull_count = kTmas && o.late_scales == 4 ? kPipeConsumerWarps : kWarpsPerTile;
    for (int s = 0; s < kPipeScaleSlots; ++s) {
      device::mbarrier_init(&sfull[s], sfull_count);
      device::mbarrier_init(&sempty[s], 1);               // the scale writer's arrival
    }
    device::fence_mbarrier_init_release_cluster();
  }
  __syncthreads();  // the only CTA-wide barrier

  if (warp == kPipeConsumerWarps + 1) {  // ---- scale writer (late_scales 2, 3 and 4 only)
    if constexpr (kTmas) {
      if (o.late_scales == 4) {  // TMA-stored scale units: lane 0 stores each whole unit's buffer
        if (lane != 0) return;
        device::prefetch_tensormap(&scale_map);
        const bool hint = o.store_hint >= 0;
        const uint64_t policy = hint ? device::createpolicy_l2(o.store_hint) : 0;
        tmas_walk(o, [](uint32_t, const TmasUnit&, int32_t, int32_t) {}, [&](const TmasUnit& un, int32_t n) {
          const int bb = n & 1;
          device::mbarrier_wait_parity(&sfull[bb], uint32_t(n >> 1) & 1);  // every consumer warp's bytes
          const void* src = smem + L::kUnit + bb * kTmasBufBytes;  // [128][32 B]
          const int32_t c0 = 4 * kTmasUnit * un.a, c1 = kTileRows * un.x;
          if (hint) device::cp_async_bulk_tensor_3d_shared_to_global_hint(&scale_map, src, c0, c1, un.b, policy);
          else device::cp_async_bulk_tensor_3d_shared_to_global(&scale_map, src, c0, c1, un.b);
          device::cp_async_bulk_commit_group();
          device::cp_async_bulk_wait_group_read<0>();  // the store has read the buffer
          device::mbarrier_arrive(&sempty[bb]);
        });
        device::cp_async_bulk_wait_group<0>();
        return;
      }
    }
    if constexpr (kTmas2) {
      if (o.late_scales == 4) {  // both directions: lane 0 stores each whole unit's two parts, 2 boxes each
        if (lane != 0) return;
        device::prefetch_tensormap(&scale_map);
        device::prefetch_tensormap(&col_scale_map);
        const bool hint = o.store_hint >= 0;
        const uint64_t policy = hint ? device::createpolicy_l2(o.store_hint) : 0;
        const auto put = [&](const CUtensorMap* map, const void* src, int32_t c0, int32_t c1, int32_t c2) {
          if (hint) device::cp_async_bulk_tensor_3d_shared_to_global_hint(map, src, c0, c1, c2, policy);
          else device::cp_async_bulk_tensor_3d_shared_to_global(map, src, c0, c1, c2);
        };
        tmas2_walk(o, [](uint32_t, const Tmas2Unit&, int32_t, int32_t) {}, [&](const Tmas2Unit& un, int32_t n) {
          const int bb = n & 1;
          wait(&sfull[bb], uint32_t(n >> 1) & 1);  // every consumer warp's bytes of the unit
          const uint8_t* rsrc = smem + L::tmas2_part(bb, false);  // [512 rows][16 B]
          const uint8_t* csrc = smem + L::tmas2_part(bb, true);   // [512 columns][16 B]
#pragma unroll
          for (int h = 0; h < kTmas2Lines / kTmas2BoxLines; ++h) {
            const int32_t off = h * kTmas2BoxLines;
            put(&scale_map, rsrc + off * kTmas2Run, kTmas2Run * un.uc, kTmas2Lines * un.ur + off, un.b);
            put(&col_scale_map, csrc + off * kTmas2Run, kTmas2Run * un.ur, kTmas2Lines * un.uc + off, un.b);
          }
          device::cp_async_bulk_commit_group();
          device::cp_async_bulk_wait_group_read<0>();  // the stores have read the buffer
          device::mbarrier_arrive(&sempty[bb]);
        });
        device::cp_async_bulk_wait_group<0>();
        return;
      }
    }
    if (o.late_scales == 3) {
      pipe_unit_scale_writer<kRow, kCol>(p, o.walk, smem, sfull, sempty, first, count, lane);
      return;
    }
    if (o.late_scales != 2) return;
    const int32_t nblk_r = int32_t(p.cols / kMxBlock), nblk_c = int32_t(p.rows_out / kMxBlock);
    // 4-byte stores where a tile's 4 blocks are a whole aligned word (128-multiple widths).
    const bool wide_r = (reinterpret_cast<uintptr_t>(p.row_scales) & 3u) == 0 && nblk_r % 4 == 0;
    const bool wide_c = (reinterpret_cast<uintptr_t>(p.col_scales) & 3u) == 0 && nblk_c % 4 == 0;
    for (uint32_t k = 0; k < count; ++k) {
      const int s = int(k % kPipeScaleSlots);
      device::mbarrier_wait_parity(&sfull[s], (k / kPipeScaleSlots) & 1);
      const PipeTile t = tile_of(k);
      const uint32_t* slot = reinterpret_cast<const uint32_t*>(smem + L::kScales + s * L::kScaleSlot);
      if constexpr (kRow) {
#pragma unroll
        for (int i = 0; i < kTileRows / 32; ++i) {
          const int r = 32 * i + lane;
          const uint32_t v = slot[r];
          if (r < t.out_valid) {
            uint8_t* dst = p.row_scales + (int64_t(t.b) * p.rows_out + t.r0 + r) * nblk_r + t.c0 / kMxBlock;
            if (wide_r) {
              *reinterpret_cast<uint32_t*>(dst) = v;
            } else {
#pragma unroll
              for (int j = 0; j < 4; ++j)
                if (t.c0 + kMxBlock * j < p.cols) dst[j] = uint8_t(v >> (8 * j));
            }
          }
        }
      }
      if constexpr (kCol) {
#pragma unroll
        for (int i = 0; i < kTileCols / 32; ++i) {
          const int c = 32 * i + lane;
          const uint32_t v = slot[kTileRows + c];
          if (t.c0 + c < p.cols) {
            uint8_t* dst = p.col_scales + (int64_t(t.b) * p.cols + t.c0 + c) * nblk_c + t.r0 / kMxBlock;
            if (wide_c && t.out_valid == kTileRows) {
              *reinterpret_cast<uint32_t*>(dst) = v;
            } else {
#pragma unroll
              for (int j = 0; j < 4; ++j)
                if (kMxBlock * j < t.out_valid) dst[j] = uint8_t(v >> (8 * j));
            }
          }
        }
      }
      __syncwarp();
      if (lane == 0) device::mbarrier_arrive(&sempty[s]);  // the slot has been read
    }
    return;
  }

  if (warp == kPipeConsumerWarps) {  // ---- producer
    if (lane != 0) return;
    device::prefetch_tensormap(&x_map);
    const bool hint = o.load_hint >= 0;
    const uint64_t policy = hint ? device::createpolicy_l2(o.load_hint) : 0;
    const auto produce = [&](uint32_t k, const PipeTile& t) {
      const int s = int(k % S);
      wait(&empty[s], ((k / S) & 1) ^ 1);  // fresh slots pass at once
      ring[s] = t;
      const bool right = t.c0 + kPipeBoxCols < p.cols;  // the right box holds columns of the matrix
      device::mbarrier_arrive_expect_tx(&full[s], right ? 2 * kPipeBoxBytes : kPipeBoxBytes);
      uint8_t* stage = smem + s * kStageBytes;
      for (int box = 0; box < (right ? 2 : 1); ++box) {
        uint8_t* dst = stage + box * kPipeBoxBytes;
        const int32_t c = 2 * (t.c0 + box * kPipeBoxCols);
        if (hint) device::cp_async_bulk_tensor_3d_global_to_shared_hint(dst, &x_map, &full[s], c, t.r0, t.b, policy);
        else device::cp_async_bulk_tensor_3d_global_to_shared(dst, &x_map, &full[s], c, t.r0, t.b);
      }
    };
    if constexpr (kTmas) {
      if (o.tmas) {
        tmas_walk(o, [&](uint32_t k, const TmasUnit& un, int32_t, int32_t j) { produce(k, tmas_tile<kRow>(p, un, j)); },
                  [](const TmasUnit&, int32_t) {});
        return;
      }
    }
    if constexpr (kTmas2) {
      if (o.tmas) {
        tmas2_walk(o, [&](uint32_t k, const Tmas2Unit& un, int32_t, int32_t j) { produce(k, tmas2_tile(p, un, j)); },
                   [](const Tmas2Unit&, int32_t) {});
        return;
      }
    }
    for (uint32_t k = 0; k < count; ++k) produce(k, tile_of(k));
    return;
  }

  // ---- consumers
  const int team = warp / kWarpsPerTile, role = warp % kWarpsPerTile;
  const bool row_warp = kRow && role < 8;
  const int w = role % 8;  // slice: tile rows (row-wise) or tile columns (column-wise) 16w..16w+15
  const uint32_t slices = sbase + uint32_t(L::kStaging + warp * 2 * kPipeSliceBytes);
  if (lane == 0) device::prefetch_tensormap(row_warp ? &row_map : &col_map);
  const bool store_hint = o.store_hint >= 0;
  const uint64_t store_policy = store_hint && lane == 0 ? device::createpolicy_l2(o.store_hint) : 0;
  // One lane: the TMA store of a slice (with the L2 policy when asked for).
  const auto store = [&](const CUtensorMap* map, uint32_t slice, int32_t c0, int32_t c1, int32_t c2) {
    const void* src = smem + (slice - sbase);
    if (store_hint) device::cp_async_bulk_tensor_3d_shared_to_global_hint(map, src, c0, c1, c2, store_policy);
    else device::cp_async_bulk_tensor_3d_shared_to_global(map, src, c0, c1, c2);
  };
  uint32_t it = 0;  // this warp's tiles so far: staging slice it % 2
  // Tile k of the CTA's walk; n >= 0 (TMA scale units only): tile j of the CTA's n-th whole unit,
  // whose scale bytes go to unit buffer n % 2.
  const auto consume = [&](uint32_t k, int32_t n, int32_t j) {
    const int s = int(k % S);
    const uint32_t stage = sbase + uint32_t(s * kStageBytes);
    wait(&full[s], (k / S) & 1);
    const PipeTile pt = ring[s];
    const Tile t = [&] {
      Tile x;
      x.b = pt.b;
      x.r0 = pt.r0;
      x.c0 = pt.c0;
      x.out_valid = pt.out_valid;
      x.src_valid = pt.out_valid;
      return x;
    }();
    const uint32_t slice = slices + (it & 1) * kPipeSliceBytes;
    ScaleStores scales;  // this thread's scale bytes (none in the skeleton unless o.skel_scales)
    const CUtensorMap* map;
    int32_t c0, c1;
    bool has_slice;
    if (kRow && (!kCol || row_warp)) {  // (one direction: a constant)
      const int r = 16 * w + lane % 16, half = lane / 16;
      RowVecs rv;
      if constexpr (!kSkel) rv = pipe_row_load(stage, r, half);
      __syncwarp();
      if (lane == 0) {
        device::mbarrier_arrive(&empty[s]);                 // the slice's inputs are in registers
        device::cp_async_bulk_wait_group_read<1>();          // the store of it - 2 has read this slice
      }
      __syncwarp();
      if constexpr (!kSkel) {
        uint8_t* out = smem + (slice - sbase) - 16 * w * kTileCols;  // tile row r at out + 128 r
        rowwise_staged<false, true>(p, t, rv, out, r, half, &scales);
      } else if (o.skel_scales) {
        scales = row_scale_stores(p, t, r, half, 0x7Fu, 0x7Fu);
      }
      map = &row_map;
      c0 = t.c0;
      c1 = t.r0 + 16 * w;
      has_slice = 16 * w < t.out_valid;
    } else {
      const int q = lane / 8, h = lane % 8;
      ColWords cw;
      if constexpr (!kSkel) cw = pipe_col_load(stage, w, q, h);
      __syncwarp();
      if (lane == 0) {
        device::mbarrier_arrive(&empty[s]);
        device::cp_async_bulk_wait_group_read<1>();
      }
      __syncwarp();
      if constexpr (!kSkel) scales = pipe_col_convert(p, pt, cw, w, q, h, slice);
      else if (o.skel_scales) scales = col_scale_stores(p, t.b, t.r0, t.out_valid, t.c0 + 16 * w + 4 * q, h, 0x7F7F7F7Fu);
      map = &col_map;
      c0 = t.r0;
      c1 = t.c0 + 16 * w;
      has_slice = c1 < p.cols;
    }
    // Scale bytes before the fence (o.late_scales == 0, the measured order of runs 56-59), after
    // the slice's TMA store is issued (1; ScaleStores: the fence's MEMBAR waits for them otherwise),
    // through the scale writer warp (2, 3): into slot k % kPipeScaleSlots once the writer has read
    // its tile k - kPipeScaleSlots, or (4, a tile of a whole unit) into the unit buffer n % 2 once its
    // store of unit n - 2 has read it (byte 4 j + block of row / column y at y * 32; the fence below
    // makes them visible to the writer's TMA store; a tail tile (n < 0) stores its bytes late).
    if (kTmas && n >= 0) {
      device::mbarrier_wait_parity(&sempty[n & 1], (uint32_t(n >> 1) & 1) ^ 1);  // fresh buffers pass at once
      uint8_t* ub = smem + L::kUnit + (n & 1) * kTmasBufBytes;  // [128][32 B]
      if (kRow && (!kCol || row_warp)) {
        const int r = 16 * w + lane % 16, half = lane / 16;  // blocks 2 half, 2 half + 1 of row r
        *reinterpret_cast<uint16_t*>(ub + 32 * r + 4 * j + 2 * half) = uint16_t(scales.bytes);
      } else if ((lane % 8) % 2 == 0) {  // h even: block h / 2 of columns 16 w + 4 q + c
        const int q = lane / 8, h = lane % 8;
#pragma unroll
        for (int c = 0; c < 4; ++c) ub[32 * (16 * w + 4 * q + c) + 4 * j + h / 2] = uint8_t(scales.bytes >> (8 * c));
      }
    } else if (kTmas2 && n >= 0) {  // both directions: tile j = (row tile j % 4, column tile j / 4) of the unit
      wait(&sempty[n & 1], (uint32_t(n >> 1) & 1) ^ 1);  // fresh buffers pass at once
      const int tr = j % kTmas2Side, tc = j / kTmas2Side;
      if (row_warp) {  // blocks 4 tc + 2 half, + 1 of unit row 128 tr + r
        const int r = 16 * w + lane % 16, half = lane / 16;
        uint8_t* rb = smem + L::tmas2_part(n & 1, false);  // [512 rows][16 B]
        *reinterpret_cast<uint16_t*>(rb + kTmas2Run * (kTileRows * tr + r) + 4 * tc + 2 * half) = uint16_t(scales.bytes);
      } else if ((lane % 8) % 2 == 0) {  // h even: block 4 tr + h / 2 of unit columns 128 tc + 16 w + 4 q + c
        const int q = lane / 8, h = lane % 8;
        uint8_t* cb = smem + L::tmas2_part(n & 1, true) + kTmas2Run * (kTileCols * tc + 16 * w + 4 * q) + 4 * tr + h / 2;
#pragma unroll
        for (int c = 0; c < 4; ++c) cb[kTmas2Run * c] = uint8_t(scales.bytes >> (8 * c));
      }
    } else if (o.late_scales == 2 || o.late_scales == 3) {
      const int ss = int(k % kPipeScaleSlots);
      device::mbarrier_wait_parity(&sempty[ss], ((k / kPipeScaleSlots) & 1) ^ 1);  // fresh slots pass at once
      uint8_t* slot = smem + L::kScales + ss * L::kScaleSlot;
      if (kRow && (!kCol || row_warp)) {
        const int r = 16 * w + lane % 16, half = lane / 16;  // blocks 2 half, 2 half + 1 of row r
        *reinterpret_cast<uint16_t*>(slot + 4 * r + 2 * half) = uint16_t(scales.bytes);
      } else if ((lane % 8) % 2 == 0) {  // h even: block h / 2 of columns 16 w + 4 q + c
        const int q = lane / 8, h = lane % 8;
#pragma unroll
        for (int c = 0; c < 4; ++c) slot[4 * kTileRows + 4 * (16 * w + 4 * q + c) + h / 2] = uint8_t(scales.bytes >> (8 * c));
      }
      __syncwarp();
      if (lane == 0) device::mbarrier_arrive(&sfull[ss]);
    } else if (o.late_scales == 0) {
      store_scales(scales);
    }
    device::fence_proxy_async_shared_cta();
    __syncwarp();
    if (lane == 0) {
      if (has_slice) store(map, slice, c0, c1, t.b);
      device::cp_async_bulk_commit_group();
    }
    if (o.late_scales == 1 || (o.late_scales == 4 && n < 0)) store_scales(scales);
    ++it;
  };
  if constexpr (kTmas) {
    if (o.tmas) {
      const bool units = o.late_scales == 4;
      tmas_walk(
          o,
          [&](uint32_t k, const TmasUnit&, int32_t n, int32_t j) {
            if (int(k % kTeams) == team) consume(k, units ? n : -1, j);
          },
          [&](const TmasUnit&, int32_t n) {
            if (!units) return;
            // Every consumer warp arrives once per unit, after its own bytes of it (fenced above),
            // and only once unit n - 2's store has read the buffer (see "TMA-stored scale units").
            device::mbarrier_wait_parity(&sempty[n & 1], (uint32_t(n >> 1) & 1) ^ 1);
            __syncwarp();
            if (lane == 0) device::mbarrier_arrive(&sfull[n & 1]);
          });
      if (lane == 0) device::cp_async_bulk_wait_group<0>();
      return;
    }
  }
  if constexpr (kTmas2) {
    if (o.tmas) {  // (kTeams == 1: every consumer warp takes every tile)
      const bool units = o.late_scales == 4;
      tmas2_walk(
          o, [&](uint32_t k, const Tmas2Unit&, int32_t n, int32_t j) { consume(k, units ? n : -1, j); },
          [&](const Tmas2Unit&, int32_t n) {
            if (!units) return;
            // As for one direction: one arrival per consumer warp and unit, after its fenced bytes of
            // the unit's 16 tiles, and only once unit n - 2's stores have read the buffer.
            wait(&sempty[n & 1], (uint32_t(n >> 1) & 1) ^ 1);
            __syncwarp();
            if (lane == 0) device::mbarrier_arrive(&sfull[n & 1]);
          });
      if (lane == 0) device::cp_async_bulk_wait_group<0>();
      return;
    }
  }
  for (uint32_t k = uint32_t(team); k < count; k += kTeams) consume(k, -1, 0);
  if (lane == 0) device::cp_async_bulk_wait_group<0>();
}

TileGrid make_grid(const QuantizeParams& p) {
  TileGrid g;
  g.tiles_r = int32_t((p.rows_out + kTileRows - 1) / kTileRows);
  g.tiles_c = int32_t((p.cols + kTileCols - 1) / kTileCols);
  g.num_tiles = int32_t(p.batch * g.tiles_r * g.tiles_c);  // < 2^31: checked by the host wrapper
  g.full_groups = g.tiles_r / kGroupRowTiles;
  g.per_batch = FastDivmod(uint32_t(g.tiles_r * g.tiles_c));
  g.per_group = FastDivmod(uint32_t(kGroupRowTiles * g.tiles_c));
  g.last_group_rows = FastDivmod(uint32_t(std::max(1, g.tiles_r % kGroupRowTiles)));
  return g;
}

// Persistent grid: every CTA of `kernel` that fits on the device at once (at most one per tile).
template <auto kernel>
unsigned persistent_grid(int smem, int32_t num_tiles, int threads = kThreads) {
  detail::set_smem_limit_once<kernel>("quantize_mxfp8", smem);
  const int resident = detail::max_resident_ctas<kernel>("quantize_mxfp8", threads, smem);
  return unsigned(std::min<int64_t>(num_tiles, resident));
}

template <bool kRow, bool kCol, bool kFast, RowMap kMap>
void launch(const QuantizeParams& p, cudaStream_t stream) {
  constexpr auto kernel = quantize_mxfp8_bf16_sm90_kernel<kRow, kCol, kFast, kMap>;
  const TileGrid g = make_grid(p);
  kernel<<<persistent_grid<kernel>(kSmemBytes, g.num_tiles), kThreads, kSmemBytes, stream>>>(p, g);
  MXMOE_CHECK_LAUNCH("quantize_mxfp8");
}

// MXMOE_QUANT_TWO_GROUP=0 (read on every call, so that one process can time both) runs both
// plain copies on the 256-thread staged kernel instead of the two-group kernel (the fast form
// alone is always on the staged kernel).
bool use_two_group() {
  const char* e = std::getenv("MXMOE_QUANT_TWO_GROUP");
  return e == nullptr || std::strcmp(e, "0") != 0;
}

// MXMOE_QUANT_LATE_SCALES=1 (read on every call; off by default until measured): the plain copies
// of dense inputs on the two-group kernel (both directions) and the staged kernel (one direction)
// store their scale bytes after the tile's TMA stores instead of before the fence (ScaleStores).
bool use_late_scales() {
  const char* e = std::getenv("MXMOE_QUANT_LATE_SCALES");
  return e != nullptr && std::strcmp(e, "1") == 0;
}

// kRowFast / kColFast: that direction's fast form alone (its plain pointers null); otherwise its plain
// copy alone. kFast: both directions' forms fast (the paths measured before the mixed form).
// kColBlock (with kColFast): the column-wise fast form in 128x128 blocks (QuantizeParams::col_fast_blocks).
template <bool kRow, bool kCol, bool kRowFast, bool kColFast, RowMap kMap, bool kColBlock = false>
void launch_staged(const QuantizeParams& p, cudaStream_t stream) {
  constexpr bool kAnyFast = kRowFast || kColFast;
  const TileGrid g = make_grid(p);
  // TMA store maps: row-wise data [batch, rows_out, cols], column-wise data [batch, cols, rows_out]
  // (the fast data has the plain data's layout).
  CUtensorMap row_map{}, col_map{};
  const auto sw = CU_TENSOR_MAP_SWIZZLE_128B;
  uint8_t* const row_data = kRowFast ? p.row_fast_data : p.row_data;
  uint8_t* const col_data = kColFast ? p.col_fast_data : p.col_data;
  if (kRow)
    row_map = make_tensor_map_3d_u8("quantize_mxfp8", row_data, uint64_t(p.batch), uint64_t(p.rows_out),
                                    uint64_t(p.cols), uint64_t(p.cols), uint64_t(p.rows_out * p.cols), kTileRows,
                                    kTileCols, sw);
  if (kCol)
    col_map = make_tensor_map_3d_u8("quantize_mxfp8", col_data, uint64_t(p.batch), uint64_t(p.cols),
                                    uint64_t(p.rows_out), uint64_t(p.rows_out), uint64_t(p.rows_out * p.cols),
                                    kTileCols, kTileRows, sw);
  // Expert-grouped inputs stay on the staged kernel: run 32 measured the two-group kernel at 63.8%
  // of copy there against 72.2% (thread 0's binary search for the next tile stalls the only CTA of
  // the SM at the ring barrier, where two CTAs per SM hide it). The fast form alone also stays on
  // the staged kernel: run 42 measured it at 81.1 / 81.7 / 79.6% of copy on 16384x7168 /
  // 65536x2048 / 32768x2880, 85.1 / 84.6% on weights and 36.5% on a gather, against 75.5 / 76.1 /
  // 72.8, 79.9 / 80.3 and 32.2% for the two-group kernel (half the output bytes leave the two
  // staging tiles less busy, and two CTAs per SM beat one).
  if constexpr (kRow && kCol && kMap == RowMap::kDense && !kAnyFast) {
    if (use_two_group() && use_late_scales()) {
      constexpr auto kernel = quantize_mxfp8_two_group_kernel<kMap, true>;
      constexpr int kSmem = WsLayout::kBytes;
      kernel<<<persistent_grid<kernel>(kSmem, g.num_tiles, kWsThreads), kWsThreads, kSmem, stream>>>(
          p, g, row_map, col_map);
      MXMOE_CHECK_LAUNCH("quantize_mxfp8");
      return;
    }
  }
  if constexpr (!(kRow && kCol) && kMap == RowMap::kDense && !kAnyFast) {
    if (use_late_scales()) {
      constexpr auto kernel = quantize_mxfp8_staged_kernel<kRow, kCol, kRowFast, kColFast, kMap, true>;
      constexpr int kSmem = StagedLayout<kRow, kCol>::kBytes;
      kernel<<<persistent_grid<kernel>(kSmem, g.num_tiles), kThreads, kSmem, stream>>>(p, g, row_map, col_map);
      MXMOE_CHECK_LAUNCH("quantize_mxfp8");
      return;
    }
  }
  if constexpr (kRow && kCol && kMap != RowMap::kGrouped && !kAnyFast) {
    if (use_two_group()) {
      constexpr auto kernel = quantize_mxfp8_two_group_kernel<kMap>;
      constexpr int kSmem = WsLayout::kBytes;
      kernel<<<persistent_grid<kernel>(kSmem, g.num_tiles, kWsThreads), kWsThreads, kSmem, stream>>>(
          p, g, row_map, col_map);
      MXMOE_CHECK_LAUNCH("quantize_mxfp8");
      return;
    }
  }
  {
    constexpr auto kernel = quantize_mxfp8_staged_kernel<kRow, kCol, kRowFast, kColFast, kMap, false, kColBlock>;
    constexpr int kSmem = StagedLayout<kRow, kCol>::kBytes + (kColBlock ? kColBlockSmemBytes : 0);
    kernel<<<persistent_grid<kernel>(kSmem, g.num_tiles), kThreads, kSmem, stream>>>(p, g, row_map, col_map);
  }
  MXMOE_CHECK_LAUNCH("quantize_mxfp8");
}

// Which plain copies of dense inputs the pipelined kernel takes (MXMOE_QUANT_TMA, read on every
// call, so that one process can time every path): unset or "auto" = one direction alone (run 72,
// 16384x7168 and 65536x2048 with flush: row-wise 85.7-87.7% of copy, column-wise 85.5-85.9%,
// against the staged kernel's 80.6-85.3 / 81.0-81.6 in the same run; docs/notes/quantize.md
// "Run 72"), both directions stay on the two-group kernel (run 90: the pipelined kernel with the 4x4
// TMA scale units 78.5 / 79.3% of copy against its 76.7 / 81.1%); "1" = both directions too; "0" = never
// (the staged kernel, the default before run 72); "skel" (diagnostic, wrong outputs) = the kernel's
// memory traffic without the conversion (kSkel), every dense plain copy.
bool use_pipelined(bool both_directions) {
  const char* e = std::getenv("MXMOE_QUANT_TMA");
  if (e == nullptr || *e == 0 || std::strcmp(e, "auto") == 0) return !both_directions;
  if (std::strcmp(e, "1") == 0 || std::strcmp(e, "skel") == 0) return true;
  if (std::strcmp(e, "0") == 0) return false;
  throw_arg("quantize_mxfp8", "MXMOE_QUANT_TMA", e, "must be auto (default), 1, 0 or skel");
}
bool pipelined_skeleton() {
  const char* e = std::getenv("MXMOE_QUANT_TMA");
  return e != nullptr && std::strcmp(e, "skel") == 0;
}

// PipeOpts from the environment (diagnostic A/B switches, none changes an output byte):
// MXMOE_QUANT_TMA_GROUP = raster group height in row tiles (default 8; clamped to [1, row tiles]);
// MXMOE_QUANT_TMA_LOAD_HINT / MXMOE_QUANT_TMA_STORE_HINT = none | normal | first | last (L2 policy
// of the TMA loads / stores; unset: loads none, stores last);
// MXMOE_QUANT_TMA_SCALES = late (default) | early | warp (scale bytes after / before the fence, or by
// the scale writer warp; PipeOpts);
// MXMOE_QUANT_TMA_SKEL_SCALES = 1: the skeleton (MXMOE_QUANT_TMA=skel) stores scale bytes too;
// MXMOE_QUANT_SCALE_UNIT = 0 | 1 | auto | RxC (session 11): unset or 0 = the round-robin walk of runs
// 56-62 (since session 12: run 64 measured the unit walk slower); 1 or auto = the unit walk with the
// default unit (both directions 4x4, row-wise alone 1x8, column-wise alone 8x1: pipe_default_unit);
// RxC = units of R row tiles x C column tiles (powers of 2, at most 32; R C = 16 at most with both
// directions: the 16 KB unit buffer). With the unit walk the scale bytes default to the unit writer
// (MXMOE_QUANT_TMA_SCALES=unit); an explicit late, early or warp keeps the unit walk but stores per
// tile as before; MXMOE_QUANT_TMA_GROUP applies to the round-robin walk only.
// MXMOE_QUANT_SCALE_TMA = 1 | 0 | walk (session 12, one direction alone; see "TMA-stored scale
// units"): unset or 1 = the unit round robin with TMA-stored scale units where the shape qualifies
// (nblk % 16 == 0, 16-byte aligned scale pointer; else the round-robin walk with per-tile stores) and
// neither MXMOE_QUANT_SCALE_UNIT nor MXMOE_QUANT_TMA_SCALES is set; 0 = the round-robin walk with
// per-tile stores (runs 56-68's `tma`); walk = the unit round robin with per-tile late stores, any
// shape (the walk's cost alone); force (tests) = 1, but throws where the units would not run.
// Both directions (MXMOE_QUANT_TMA=1, session 12 quant-tmas2): 1 = units of 4x4 tiles with TMA-stored
// scale units where rows and K are multiples of 512 and both scale pointers 16-byte aligned (else the
// round robin with per-tile stores); walk = the same 4x4 walk with per-tile stores (same shapes). MXMOE_QUANT_TMA_SPLIT = auto (default) | 0 | 1: split the last
// partial wave of units into single tiles where that wave costs > 3% over the tile round robin /
// never / whenever there is one. MXMOE_QUANT_TMA_UNIT_ORDER = along (default) | across: unit ids
// along a line (row-wise: K within a 128-row band) or across the lines first.
// MXMOE_QUANT_TMA_GRID = N > 0: at most N CTAs (tests and diagnostics; default one per SM).
int pipe_hint_env(const char* name, int unset) {
  const char* e = std::getenv(name);
  if (e == nullptr || *e == 0) return unset;
  if (std::strcmp(e, "none") == 0) return -1;
  if (std::strcmp(e, "normal") == 0) return 0;
  if (std::strcmp(e, "first") == 0) return 1;
  if (std::strcmp(e, "last") == 0) return 2;
  throw_arg("quantize_mxfp8", name, e, "must be none, normal, first or last");
}
int pipe_late_scales(bool unit) {
  const char* e = std::getenv("MXMOE_QUANT_TMA_SCALES");
  if (e == nullptr || *e == 0) return unit ? 3 : 1;
  if (std::strcmp(e, "late") == 0) return 1;
  if (std::strcmp(e, "early") == 0) return 0;
  if (std::strcmp(e, "warp") == 0) return 2;
  if (std::strcmp(e, "unit") == 0) {
    if (!unit) throw_arg("quantize_mxfp8", "MXMOE_QUANT_TMA_SCALES", e, "needs the unit walk (MXMOE_QUANT_SCALE_UNIT != 0)");
    return 3;
  }
  throw_arg("quantize_mxfp8", "MXMOE_QUANT_TMA_SCALES", e, "must be late, early, warp or unit");
}
// The default unit (session 11, not measured): both directions 4x4 (16-byte runs each way, the most
// that fits 16 KB: runs per tile 128 (1/gr + 1/gc) is least for gr = gc); one direction 8 tiles along
// the scales' contiguous dimension (32-byte runs: a whole sector where the run is 32-byte aligned).
void pipe_default_unit(bool row, bool col, int32_t* gr, int32_t* gc) {
  *gr = row && col ? 4 : (row ? 1 : 8);
  *gc = row && col ? 4 : (row ? 8 : 1);
}
// MXMOE_QUANT_SCALE_UNIT → (gr, gc); false: the round-robin walk.
bool pipe_unit_env(bool row, bool col, int32_t* gr, int32_t* gc) {
  const char* e = std::getenv("MXMOE_QUANT_SCALE_UNIT");
  pipe_default_unit(row, col, gr, gc);
  if (e == nullptr || *e == 0 || std::strcmp(e, "0") == 0) return false;
  if (std::strcmp(e, "1") == 0 || std::strcmp(e, "auto") == 0) return true;
  int r = 0, c = 0;
  char tail = 0;
  const auto pow2 = [](int v) { return v >= 1 && v <= 32 && (v & (v - 1)) == 0; };
  if (std::sscanf(e, "%dx%d%c", &r, &c, &tail) != 2 || !pow2(r) || !pow2(c) ||
      unit_buffer_bytes(r, c, int(row) + int(col)) > kUnitBufferBytes)
    throw_arg("quantize_mxfp8", "MXMOE_QUANT_SCALE_UNIT", e,
              "must be 0, 1, auto or RxC with powers of 2 up to 32 and R*C <= 16 (both directions) or 32 (one)");
  *gr = r;
  *gc = c;
  return true;
}
// MXMOE_QUANT_SCALE_TMA → 0 (off), 1 (TMA scale units where the shape qualifies), 2 (the walk alone),
// 3 ("force", tests: as 1, but a pipelined launch whose shape or pointers do not qualify throws, so
// that a test knows the units ran).
int pipe_scale_tma_env() {
  const char* e = std::getenv("MXMOE_QUANT_SCALE_TMA");
  if (e == nullptr || *e == 0 || std::strcmp(e, "1") == 0) return 1;
  if (std::strcmp(e, "0") == 0) return 0;
  if (std::strcmp(e, "walk") == 0) return 2;
  if (std::strcmp(e, "force") == 0) return 3;
  throw_arg("quantize_mxfp8", "MXMOE_QUANT_SCALE_TMA", e, "must be 1, 0, walk or force");
}
// Whether the scale array of the one direction can take the TMA scale units' stores: uint8
// [batch, lines, nblk] with nblk % 16 == 0 (TMA global strides are multiples of 16 bytes) at a
// 16-byte aligned address.
bool tmas_scales_qualify(const QuantizeParams& p, bool row) {
  const int64_t nblk = (row ? p.cols : p.rows_out) / kMxBlock;
  const uint8_t* scales = row ? p.row_scales : p.col_scales;
  return nblk % 16 == 0 && (reinterpret_cast<uintptr_t>(scales) & 15u) == 0;
}
// Both directions (4x4-tile units): rows and K multiples of 512 (whole units of full tiles; nblk_r and
// nblk_c multiples of 16) and both scale arrays qualify.
bool tmas2_scales_qualify(const QuantizeParams& p) {
  return p.rows_out % kTmas2Lines == 0 && p.cols % kTmas2Lines == 0 && tmas_scales_qualify(p, true) &&
         tmas_scales_qualify(p, false);
}
// The unit round robin's walk (PipeOpts::tmas*) for `grid` CTAs: one direction (row or column-wise,
// units of 8 tiles along the scales' lines) or both (units of 4x4 tiles; `both`).
void tmas_walk_options(PipeOpts& o, const TileGrid& g, const QuantizeParams& p, bool row, bool both, uint32_t grid) {
  o.tmas = 1;
  o.tmas_along = row ? g.tiles_c : g.tiles_r;
  o.tmas_across = row ? g.tiles_r : g.tiles_c;
  const int32_t unit_tiles = both ? kTmas2Tiles : kTmasUnit;
  // Both: lines are 512-row bands (order 0, units along the columns) of tiles_c / 4 units each.
  if (both) {
    o.tmas_along = g.tiles_c / kTmas2Side;
    o.tmas_across = g.tiles_r / kTmas2Side;
  }
  const int32_t per_line = both ? o.tmas_along : (o.tmas_along + kTmasUnit - 1) / kTmasUnit;
  const char* ord = std::getenv("MXMOE_QUANT_TMA_UNIT_ORDER");
  if (ord == nullptr || *ord == 0 || std::strcmp(ord, "along") == 0) o.tmas_order = 0;
  else if (std::strcmp(ord, "across") == 0) o.tmas_order = 1;
  else throw_arg("quantize_mxfp8", "MXMOE_QUANT_TMA_UNIT_ORDER", ord, "must be along or across");
  o.tmas_per_batch = FastDivmod(uint32_t(per_line * o.tmas_across));
  o.tmas_minor = FastDivmod(uint32_t(o.tmas_order == 0 ? per_line : o.tmas_across));
  o.tmas_units = int32_t(p.batch * per_line * o.tmas_across);
  // Tail: whole units take ceil(U / P) unit times of up to 8 (16) tiles; the tile round robin
  // ceil(N / P) tile times. Split the last partial wave into single tiles where it costs more than 3%.
  const int64_t U = o.tmas_units, P = grid, N = g.num_tiles;
  const int64_t unit_waves = (U + P - 1) / P * unit_tiles, tile_waves = (N + P - 1) / P;
  const char* sp = std::getenv("MXMOE_QUANT_TMA_SPLIT");
  bool split = 100 * unit_waves > 103 * tile_waves;
  if (sp != nullptr && *sp != 0 && std::strcmp(sp, "auto") != 0) {
    if (std::strcmp(sp, "0") == 0) split = false;
    else if (std::strcmp(sp, "1") == 0) split = true;
    else throw_arg("quantize_mxfp8", "MXMOE_QUANT_TMA_SPLIT", sp, "must be auto, 0 or 1");
  }
  o.tmas_whole = int32_t(split ? U / P * P : U);
}
// MXMOE_QUANT_TMA_GRID → the most CTAs asked for (0: no limit).
int64_t pipe_grid_env() {
  const char* e = std::getenv("MXMOE_QUANT_TMA_GRID");
  if (e == nullptr || *e == 0) return 0;
  const long v = std::atol(e);
  if (v <= 0) throw_arg("quantize_mxfp8", "MXMOE_QUANT_TMA_GRID", e, "must be a positive CTA count");
  return v;
}
PipeOpts pipe_options(const TileGrid& g, const QuantizeParams& p, bool row, bool col, bool skel, uint32_t grid) {
  PipeOpts o;
  const char* e = std::getenv("MXMOE_QUANT_TMA_GROUP");
  int group = e != nullptr && *e != 0 ? std::atoi(e) : kGroupRowTiles;
  group = std::max(1, std::min(group, int(g.tiles_r)));
  o.group = group;
  o.full_groups = g.tiles_r / group;
  o.per_group = FastDivmod(uint32_t(group * g.tiles_c));
  o.group_rows = FastDivmod(uint32_t(group));
  o.last_group_rows = FastDivmod(uint32_t(std::max(1, g.tiles_r % group)));
  o.load_hint = pipe_hint_env("MXMOE_QUANT_TMA_LOAD_HINT", -1);
  o.store_hint = pipe_hint_env("MXMOE_QUANT_TMA_STORE_HINT", 2);
  int32_t gr = 1, gc = 1;
  o.unit = pipe_unit_env(row, col, &gr, &gc) ? 1 : 0;
  if (o.unit) o.walk = make_unit_walk(p.batch, g.tiles_r, g.tiles_c, gr, gc);
  o.late_scales = pipe_late_scales(o.unit != 0);
  // TMA scale units (one direction): unless the session-11 unit walk or a per-tile order is asked for.
  const char* order = std::getenv("MXMOE_QUANT_TMA_SCALES");
  const int tma_env = pipe_scale_tma_env();
  const int tma = tma_env == 3 ? 1 : tma_env;
  if (row != col && !o.unit && (order == nullptr || *order == 0)) {
    if (tma == 2) {
      tmas_walk_options(o, g, p, row, false, grid);
    } else if (tma == 1 && tmas_scales_qualify(p, row)) {
      tmas_walk_options(o, g, p, row, false, grid);
      o.late_scales = 4;
    }
  }
  // Both directions (not the skeleton): the 4x4-tile units where the shape qualifies (=walk too: the
  // walk needs whole units).
  if (row && col && !skel && !o.unit && (order == nullptr || *order == 0) && tma != 0 && tmas2_scales_qualify(p)) {
    tmas_walk_options(o, g, p, row, true, grid);
    if (tma == 1) o.late_scales = 4;
  }
  if (tma_env == 3 && o.late_scales != 4)
    throw_arg("quantize_mxfp8", "MXMOE_QUANT_SCALE_TMA", "force",
              "the shape or a scale pointer does not qualify for TMA scale units (or another walk was asked for)");
  const char* sk = std::getenv("MXMOE_QUANT_TMA_SKEL_SCALES");
  o.skel_scales = sk != nullptr && std::strcmp(sk, "1") == 0 ? 1 : 0;
  // The skeleton without scale stores stores none in every order (the writer warp would store its
  // slots' stale bytes otherwise).
  if (skel && !o.skel_scales) o.late_scales = 1;
  return o;
}

template <bool kRow, bool kCol, bool kSkel>
void launch_pipelined(const QuantizeParams& p, cudaStream_t stream) {
  constexpr auto kernel = quantize_mxfp8_pipelined_kernel<kRow, kCol, kSkel>;
  // (Both directions: room for the 4x4-tile units' second buffer whether or not they run.)
  constexpr int kSmem = kRow && kCol && !kSkel ? PipeLayout::kBytesBoth : PipeLayout::kBytes;
  const TileGrid g = make_grid(p);
  unsigned grid = persistent_grid<kernel>(kSmem, g.num_tiles, kPipeThreads);
  if (const int64_t most = pipe_grid_env(); most > 0) grid = unsigned(std::min<int64_t>(grid, most));
  const PipeOpts o = pipe_options(g, p, kRow, kCol, kSkel, grid);
  const auto sw = CU_TENSOR_MAP_SWIZZLE_128B;
  const uint64_t rows = uint64_t(p.rows_out), cols = uint64_t(p.cols), batch = uint64_t(p.batch);
  // x as bytes [batch, rows, 2 cols], loaded in [128 rows, 128 B] boxes; outputs stored in slices of
  // 16 rows (row-wise [batch, rows, cols]) or 16 columns (column-wise [batch, cols, rows]) x 128 B.
  const CUtensorMap x_map = make_tensor_map_3d_u8("quantize_mxfp8", const_cast<uint16_t*>(p.x), batch, rows, 2 * cols,
                                                  2 * cols, 2 * rows * cols, kTileRows, 2 * kPipeBoxCols, sw);
  CUtensorMap row_map{}, col_map{};
  if (kRow)
    row_map = make_tensor_map_3d_u8("quantize_mxfp8", p.row_data, batch, rows, cols, cols, rows * cols, 16, kTileCols, sw);
  if (kCol)
    col_map = make_tensor_map_3d_u8("quantize_mxfp8", p.col_data, batch, cols, rows, rows, rows * cols, 16, kTileRows, sw);
  // TMA scale units: the one direction's scale array as uint8 [batch, rows or cols, nblk] in boxes
  // [1, 128, 32] (no swizzle; pipe_options checked nblk % 16 and the alignment).
  // Both directions: the row-wise scales [batch, rows, nblk_r] and the column-wise ones [batch, cols,
  // nblk_c] in boxes [1, 256, 16] (tmas2_scales_qualify checked the strides and alignment).
  CUtensorMap scale_map{}, col_scale_map{};
  const auto scale_tensor = [&](uint8_t* base, uint64_t lines, uint64_t nblk, uint32_t box_lines, uint32_t box_bytes) {
    return make_tensor_map_3d_u8("quantize_mxfp8", base, batch, lines, nblk, nblk, lines * nblk, box_lines, box_bytes,
                                 CU_TENSOR_MAP_SWIZZLE_NONE);
  };
  if (o.late_scales == 4 && kRow && kCol) {
    scale_map = scale_tensor(p.row_scales, rows, cols / kMxBlock, kTmas2BoxLines, kTmas2Run);
    col_scale_map = scale_tensor(p.col_scales, cols, rows / kMxBlock, kTmas2BoxLines, kTmas2Run);
  } else if (o.late_scales == 4) {
    const uint64_t lines = kRow ? rows : cols, nblk = (kRow ? cols : rows) / kMxBlock;
    scale_map = scale_tensor(kRow ? p.row_scales : p.col_scales, lines, nblk, kTileRows, 4 * kTmasUnit);
  }
  kernel<<<grid, kPipeThreads, kSmem, stream>>>(p, g, o, x_map, row_map, col_map, scale_map, col_scale_map);
  MXMOE_CHECK_LAUNCH("quantize_mxfp8");
}

// The staged kernels write the plain MX copies, or the fast form alone; MXMOE_QUANT_STAGED=0 (read
// on every call, so that one process can time both) selects the register-store kernel instead.
bool use_staged() {
  const char* e = std::getenv("MXMOE_QUANT_STAGED");
  return e == nullptr || std::strcmp(e, "0") != 0;
}


template <bool kFast, RowMap kMap>
void dispatch_dirs(const QuantizeParams& p, cudaStream_t stream) {
  // A direction is on when either of its forms is asked for (plain MX, fast, or both).
  const bool row = p.row_data != nullptr || p.row_fast_data != nullptr;
  const bool col = p.col_data != nullptr || p.col_fast_data != nullptr;
  if (row && col) launch<true, true, kFast, kMap>(p, stream);
  else if (row) launch<true, false, kFast, kMap>(p, stream);
  else if (col) launch<false, true, kFast, kMap>(p, stream);
}

template <bool kFast, RowMap kMap>
void dispatch_staged(bool row, bool col, const QuantizeParams& p, cudaStream_t stream) {
  if (row && col) launch_staged<true, true, kFast, kFast, kMap>(p, stream);
  else if (row) launch_staged<true, false, kFast, kFast, kMap>(p, stream);
  else if (col) launch_staged<false, true, kFast, kFast, kMap>(p, stream);
}

// The column-wise fast form in 128x128 blocks (QuantizeParams::col_fast_blocks; the host checks allow
// it alone or with the row-wise fast form alone): staged kernels only, whatever MXMOE_QUANT_STAGED
// says (no other kernel writes it).
template <RowMap kMap>
void dispatch_col_blocks(const QuantizeParams& p, cudaStream_t stream) {
  if (p.row_fast_data != nullptr) launch_staged<true, true, true, true, kMap, true>(p, stream);
  else launch_staged<false, true, false, true, kMap, true>(p, stream);
}

// Plain copies alone, or fast forms alone (the training layer's fast mode), or the row-wise fast form
// alone with the column-wise plain copy alone: staged kernels. Other mixes of plain and fast: the
// register-store kernel (the staged kernels stage one E4M3 tile per direction, and a second one
// would cost the 2 CTAs per SM).
template <RowMap kMap>
void dispatch_fast(const QuantizeParams& p, cudaStream_t stream) {
  const bool row_fast = p.row_fast_data != nullptr, col_fast = p.col_fast_data != nullptr;
  const bool row_plain = p.row_data != nullptr, col_plain = p.col_data != nullptr;
  const bool fast = row_fast || col_fast, plain = row_plain || col_plain;
  // (The register-store launches come first in this file's text on purpose: the order in which
  // the kernels are instantiated orders the extern shared arrays in the PTX, and with the 1024-byte
  // aligned one first, ptxas moved the grouped register-store kernels' dynamic shared memory from
  // offset 0x80 to 0x400.)
  // The one mixed request the staged kernel takes: row-wise fast form alone + column-wise plain copy
  // alone (the layer's activation_fast_layout = kBlock128). Others with both forms: register-store.
  // (dispatch_dirs stays first in the text, see above.)
  const bool mixed_staged = use_staged() && row_fast && !row_plain && col_plain && !col_fast;
  if (fast && (plain || !use_staged()) && !mixed_staged && !p.col_fast_blocks) {
    dispatch_dirs<true, kMap>(p, stream);
  } else if (p.col_fast_blocks) {
    dispatch_col_blocks<kMap>(p, stream);
  } else if (mixed_staged) {
    launch_staged<true, true, true, false, kMap>(p, stream);
  } else if (fast) {
    dispatch_staged<true, kMap>(row_fast, col_fast, p, stream);
  } else if (use_staged() && (reinterpret_cast<uintptr_t>(p.row_scales) & 1u) == 0) {
    // (The staged kernel stores a row's two scale bytes as one 16-bit word; quantize.h promises
    // that scale pointers need no alignment, so an odd row-wise scale pointer takes the
    // register-store kernel, whose scale stores are bytes. Fast scales are stored as bytes.)
    const bool row = row_plain, col = col_plain;
    if (kMap == RowMap::kDense && use_pipelined(row && col)) {  // (the pipelined kernel's row-wise pass is the staged one's)
      if (pipelined_skeleton()) {
        if (row && col) launch_pipelined<true, true, true>(p, stream);
        else if (row) launch_pipelined<true, false, true>(p, stream);
        else launch_pipelined<false, true, true>(p, stream);
      } else {
        if (row && col) launch_pipelined<true, true, false>(p, stream);
        else if (row) launch_pipelined<true, false, false>(p, stream);
        else launch_pipelined<false, true, false>(p, stream);
      }
      return;
    }
    dispatch_staged<false, kMap>(row, col, p, stream);
  } else {
    dispatch_dirs<false, kMap>(p, stream);
  }
}

__global__ void padded_offsets_kernel(const int32_t* offsets, int32_t* padded, int n, int align) {
  __shared__ int32_t s[kMaxGroupsPow2];
  const int g = threadIdx.x;
  int32_t v = 0;
  if (g < n) {
    const int32_t cnt = offsets[g + 1] - offsets[g];
    v = (cnt + align - 1) / align * align;
  }
  s[g] = v;
  __syncthreads();
  for (int d = 1; d < blockDim.x; d *= 2) {  // inclusive Hillis-Steele scan, fixed order
    const int32_t add = g >= d ? s[g - d] : 0;
    __syncthreads();
    s[g] += add;
    __syncthreads();
  }
  if (g == 0) padded[0] = 0;
  if (g < n) padded[g + 1] = s[g];
}

}  // namespace

void launch_quantize_mxfp8(const QuantizeParams& p, cudaStream_t stream) {
  if (p.padded_offsets != nullptr) dispatch_fast<RowMap::kGrouped>(p, stream);
  else if (p.row_index != nullptr) dispatch_fast<RowMap::kGather>(p, stream);
  else dispatch_fast<RowMap::kDense>(p, stream);
}

void launch_compute_padded_offsets(const int32_t* offsets, int32_t* padded, int num_groups,
                                   int align, cudaStream_t stream) {
  padded_offsets_kernel<<<1, kMaxGroupsPow2, 0, stream>>>(offsets, padded, num_groups, align);
  MXMOE_CHECK_LAUNCH("compute_padded_offsets");
}

}  // namespace mxmoe::detail
