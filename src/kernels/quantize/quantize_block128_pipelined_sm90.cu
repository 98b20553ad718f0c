// BF16 → the 128x128-block fast form, persistent and warp-specialised (quantize_mxfp8_block128's default
// since session 12; MXMOE_QUANT_BLOCK128_KERNEL=simple selects quantize_block128_sm90.cu's kernel).
// Bitwise the simple kernel's output: per direction and 128x128 tile, every 32-block's MX scale byte
// e_b (dev::e8m0_scale_byte), the tile's maximum E (0xFF, an Inf or NaN, wins and poisons the tile:
// data 0x7F, scale 0xFF; an all-zero block's 0 never raises it), codes E4M3(E4M3(x · 2^-e_b) · 2^(e_b - E)).
//
// Input x BF16 [batch, rows, cols] (16-byte aligned). Outputs per direction (either may be null):
//   row-wise: data E4M3 [batch, rows, cols], scales E8M0 [batch, ceil(cols/128), pitch(rows)]
//   column-wise: data E4M3 [batch, cols, rows], scales [batch, ceil(rows/128), pitch(cols)]
// pitch(n) = fast_block_scales_pitch(n), padding bytes written as 0.
//
// The skeleton is quantize_mxfp8_pipelined_kernel's (quantize_mxfp8_sm90.cu, runs 56-72): one CTA of 17
// warps per SM walks the tiles round robin (tile ids blockIdx.x + k · gridDim.x, the raster of groups of
// 8 row tiles the other quantizers use).
//  - producer (warp 16, one lane): per tile, waits on the ring slot's `empty`, writes the tile's
//    coordinates, two TMA loads ([128 rows, 128 B] boxes of x seen as bytes, 128-byte swizzle; a box
//    wholly past the last column is not loaded) completing on `full`. 4 stages.
//  - 16 consumer warps in groups of 8 (a group = one direction of a tile; one direction alone: two
//    groups take alternate tiles): row-wise warp w owns tile rows 16w..16w+15 (thread: row, 64
//    columns = two 32-blocks), column-wise warp w tile columns 16w..16w+15 (lane q + 4.. : 4 columns x
//    16 rows; a 32-block is two lanes, lane ^ 1). A warp copies its slice into registers, arrives on
//    `empty`, computes its scale bytes, then the group's maximum: a warp max, one shared word per warp
//    (double-buffered by tile parity), a named barrier of the group's 256 threads (ids 1, 2), the max of
//    the 8 words. Then the codes into the warp's own staging slice (2 x 2 KB, 128-byte swizzle) and one
//    TMA store of the slice (16 rows or columns x 128 B). Warp 0 of the group stores the tile's one scale
//    byte (and the pitch padding where the tile is the last along its scale row) after issuing its store.
//    The only waits across warps are the ring's mbarriers and the group's barrier.
// Why double-buffered max words are enough: a warp writes word [w] of parity it & 1 for tile it + 2 only
// after passing the barrier of tile it + 1, which every warp of the group reaches only after reading the
// words of tile it.
// Registers: <= 120 (544 threads, 1 CTA per SM); see docs/notes/quantize.md "Session 12 (helper, branch
// bq2)" for the counts. Shared memory: 4 x 32 KB stages + 16 x 4 KB staging + barriers (~195 KB).
// Roofline: memory-bound; reads 2 bytes and writes 1 per element and direction (+ 1 byte a tile).
// Tests: tests/gpu/test_quantize_block128_gpu.cpp (every case on both kernels). Bench: bench/bench_rebase.py.
#include <algorithm>
#include <cstdint>

#include "device/cp_async_bulk_tensor.cuh"
#include "device/fast_divmod.cuh"
#include "device/ld_st_shared.cuh"
#include "device/mbarrier.cuh"
#include "device/mx_convert.cuh"
#include "device/named_barrier.cuh"
#include "host/check.h"
#include "host/kernel_attr.h"
#include "kernels/gemm/tensor_map.h"
#include "kernels/quantize/pipe_slice.cuh"
#include "kernels/quantize/quantize_block128_launch.h"

namespace mxmoe::detail {
namespace {

constexpr int kTile = 128;
constexpr int kStages = 4;
constexpr int kConsumerWarps = 16;
constexpr int kGroupWarps = 8;                           // one direction of one tile
constexpr int kThreads = (kConsumerWarps + 1) * 32;      // + the producer warp
constexpr int kBoxCols = 64;                             // BF16 columns of a TMA load box (128 B)
constexpr int kBoxBytes = kTile * kBoxCols * 2;          // 16 KB
constexpr int kStageBytes = 2 * kBoxBytes;               // one BF16 tile
constexpr int kSliceBytes = 16 * 128;                    // a warp's output slice: 16 rows x 128 B
constexpr int kGroupRowTiles = 8;                        // the raster's group height (as the other quantizers)
constexpr int kProducerWarp = kConsumerWarps;
static_assert(kGroupWarps * 16 == kTile, "8 warps of 16 rows / columns cover a tile");
static_assert(kConsumerWarps == 2 * kGroupWarps, "two groups: one per direction, or alternate tiles");

struct PipeTile {
  int32_t b, r0, c0, unused;
};

struct Layout {
  static constexpr int kStaging = kStages * kStageBytes;                         // [S][2 boxes][128][128 B]
  static constexpr int kTiles = kStaging + kConsumerWarps * 2 * kSliceBytes;    // [S] PipeTile
  static constexpr int kFull = kTiles + kStages * int(sizeof(PipeTile));        // [S] mbarrier
  static constexpr int kEmpty = kFull + kStages * 8;                             // [S] mbarrier
  static constexpr int kMax = kEmpty + kStages * 8;                              // [2 groups][2 parities][8] u32
  static constexpr int kUsed = kMax + 2 * 2 * kGroupWarps * 4;
  static constexpr int kBytes = kUsed + 2048;  // slack: the base is aligned up to 2048 at run time
};
static_assert(kBoxBytes % 2048 == 0 && kSliceBytes == 2048 && Layout::kStaging % 2048 == 0,
              "2048-byte aligned stages, boxes and slices (the XOR addressing below)");
static_assert(kBoxBytes == pipe_slice::kBoxBytes, "pipe_slice.cuh's box");
static_assert(Layout::kMax % 16 == 0, "max words read as uint4");
static_assert(Layout::kBytes <= 227 * 1024, "one CTA per SM");

struct PipeParams {
  const uint16_t* x;  // (the tensor maps carry the data pointers)
  int32_t rows, cols, tiles_r, tiles_c, num_tiles, full_groups;
  ScaleMode mode;
  uint8_t *row_scales, *col_scales;
  int64_t row_pitch, col_pitch;
  FastDivmod per_batch, per_group, group_rows, last_group_rows;
};

// Tile id → tile: per batch entry, groups of 8 row tiles, in a group column tile by column tile.
__device__ __forceinline__ PipeTile tile_at(const PipeParams& p, uint32_t id) {
  PipeTile t;
  t.b = int32_t(p.per_batch.div(id));
  const uint32_t in_b = id - uint32_t(t.b) * p.per_batch.d;
  const uint32_t grp = p.per_group.div(in_b), rem = in_b - grp * p.per_group.d;
  const FastDivmod& rows_in_group = int32_t(grp) < p.full_groups ? p.group_rows : p.last_group_rows;
  const uint32_t tc = rows_in_group.div(rem), tr_in = rem - tc * rows_in_group.d;
  t.r0 = int32_t((grp * uint32_t(kGroupRowTiles) + tr_in) * kTile);
  t.c0 = int32_t(tc * kTile);
  t.unused = 0;
  return t;
}

// The group's maximum scale byte from every thread's `mine` (see the file comment).
__device__ __forceinline__ uint32_t group_max(uint32_t mine, uint32_t* words, int w, uint32_t bar_id) {
  const uint32_t wm = __reduce_max_sync(0xFFFFFFFFu, mine);
  if (threadIdx.x % 32 == 0) words[w] = wm;
  device::named_barrier_sync(bar_id, kGroupWarps * 32);
  const uint4 a = reinterpret_cast<const uint4*>(words)[0], b = reinterpret_cast<const uint4*>(words)[1];
  return max(max(max(a.x, a.y), max(a.z, a.w)), max(max(b.x, b.y), max(b.z, b.w)));
}

// The tile's scale byte at srow[blk] of its scale row of nblk blocks, and the row's pitch padding (0)
// by the tile that is last along it: warp 0 of the group, after its slice's store was issued.
__device__ __forceinline__ void store_tile_scale(uint8_t* srow, int32_t blk, int32_t nblk, int64_t pitch,
                                                 uint32_t emax, int lane) {
  if (lane == 0) srow[blk] = uint8_t(emax);
  if (blk == nblk - 1)
    for (int64_t q = nblk + lane; q < pitch; q += 32) srow[q] = 0;
}

// 4 codes against the block byte sb's reciprocal, re-expressed with pw = 2^(sb - E).
__device__ __forceinline__ uint32_t rebased_x4(float a, float b, float c, float d, float pw) {
  return dev::e4m3x4_rebase(dev::e4m3x4_from_f32(a, b, c, d), pw);
}

// ---- row-wise warp w: thread = tile row r = 16w + lane % 16, columns 64 half .. +63 (half = lane / 16),
// loaded by pipe_slice::row_load.
__device__ __forceinline__ uint32_t row_block_scale(const uint4 (&v)[8], int b, ScaleMode mode) {
  uint32_t u = 0, s = 0;
#pragma unroll
  for (int j = 4 * b; j < 4 * b + 4; ++j) {
    for (const uint32_t x : {v[j].x, v[j].y, v[j].z, v[j].w}) {
      u = __vmaxu2(u, x);
      s = __vmaxs2(s, x);
    }
  }
  return dev::e8m0_scale_byte(dev::halves_max(dev::abs_max_bf16x2_from_maxes(u, s)), mode);
}

// The row's 64 codes into the staging slice (tile row r at out + 128 r, 16-byte piece p at p ^ (r % 8)).
__device__ __forceinline__ void row_codes(const uint4 (&v)[8], const uint32_t (&sb)[2], uint32_t emax, int r, int half,
                                          uint32_t slice_row) {
#pragma unroll
  for (int b = 0; b < 2; ++b) {
    const float rcp = dev::e8m0_reciprocal(sb[b]);
    const float pw = dev::exp2_nonpositive(int(sb[b]) - int(emax));
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const uint4 a = v[4 * b + 2 * c], d = v[4 * b + 2 * c + 1];
      using dev::bf16_hi;
      using dev::bf16_lo;
      uint4 o = make_uint4(rebased_x4(bf16_lo(a.x) * rcp, bf16_hi(a.x) * rcp, bf16_lo(a.y) * rcp, bf16_hi(a.y) * rcp, pw),
                           rebased_x4(bf16_lo(a.z) * rcp, bf16_hi(a.z) * rcp, bf16_lo(a.w) * rcp, bf16_hi(a.w) * rcp, pw),
                           rebased_x4(bf16_lo(d.x) * rcp, bf16_hi(d.x) * rcp, bf16_lo(d.y) * rcp, bf16_hi(d.y) * rcp, pw),
                           rebased_x4(bf16_lo(d.z) * rcp, bf16_hi(d.z) * rcp, bf16_lo(d.w) * rcp, bf16_hi(d.w) * rcp, pw));
      if (emax == kE8M0Nan) o = make_uint4(dev::kE4M3NanX4, dev::kE4M3NanX4, dev::kE4M3NanX4, dev::kE4M3NanX4);
      const int piece = 4 * half + 2 * b + c;
      device::st_shared_v4_u32(slice_row + uint32_t(16 * (piece ^ (r & 7))), o);
    }
  }
}

// ---- column-wise warp w: thread (q = lane / 8, h = lane % 8): x[2i] = columns (16w + 4q, +1) and
// x[2i+1] = (16w + 4q + 2, +3) of tile row 16h + (i ^ h), i < 16 (pipe_slice::col_load, bank-conflict
// free); scale bytes by pipe_slice::col_scale_bytes (a 32-block is two lanes, lane ^ 1).

// The codes of column c (0-3), slots 4j .. 4j + 3 (slot order, slot 4j in the low byte), rebased.
__device__ __forceinline__ uint32_t col_codes_x4(const uint32_t (&x)[32], int c, int j, float rcp, float pw) {
  float f[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t word = x[2 * (4 * j + k) + c / 2];
    f[k] = (c % 2 ? dev::bf16_hi(word) : dev::bf16_lo(word)) * rcp;
  }
  return rebased_x4(f[0], f[1], f[2], f[3], pw);
}

// The 4 columns' codes in row order into the warp's staging slice (pipe_slice.cuh's layout).
__device__ __forceinline__ void col_codes(const uint32_t (&x)[32], const uint32_t (&sc)[4], uint32_t emax, int q, int h,
                                          uint32_t slice) {
  const uint32_t sel = pipe_slice::col_selector(h);
  const uint32_t row0 = pipe_slice::col_row0(slice, q, h);
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const float rcp = dev::e8m0_reciprocal(sc[c]);
    const float pw = dev::exp2_nonpositive(int(sc[c]) - int(emax));
    uint32_t nat[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) nat[j] = col_codes_x4(x, c, j, rcp, pw);
    uint4 o = pipe_slice::col_in_row_order(nat, sel);
    if (emax == kE8M0Nan) o = make_uint4(dev::kE4M3NanX4, dev::kE4M3NanX4, dev::kE4M3NanX4, dev::kE4M3NanX4);
    pipe_slice::col_store(row0, c, o);
  }
}

// x_map: x as bytes [batch, rows, 2 cols], boxes [128, 128 B]; row_map: row-wise data [batch, rows, cols],
// col_map: column-wise data [batch, cols, rows], both stored in boxes [16, 128 B]; all 128-byte swizzle.
template <bool kRow, bool kCol>
__global__ void __launch_bounds__(kThreads, 1) quantize_block128_pipelined_kernel(
    const PipeParams p, const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap row_map,
    const __grid_constant__ CUtensorMap col_map) {
  using L = Layout;
  constexpr int S = kStages;
  constexpr int kWarpsPerTile = kGroupWarps * (int(kRow) + int(kCol));
  constexpr int kTeams = kConsumerWarps / kWarpsPerTile;  // 1 (both directions) or 2
  static_assert(kRow || kCol, "at least one direction");
  extern __shared__ __align__(1024) uint8_t block_pipe_smem[];
  const uint32_t raw = device::smem_addr(block_pipe_smem);
  uint8_t* smem = block_pipe_smem + ((2048u - (raw & 2047u)) & 2047u);
  const uint32_t sbase = device::smem_addr(smem);
  PipeTile* ring = reinterpret_cast<PipeTile*>(smem + L::kTiles);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kFull);
  uint64_t* empty = reinterpret_cast<uint64_t*>(smem + L::kEmpty);
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const uint32_t first = blockIdx.x, step = gridDim.x;
  const uint32_t count = (uint32_t(p.num_tiles) - first + step - 1) / step;  // (grid <= tiles)
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      device::mbarrier_init(&full[s], 1);               // the producer's arrive.expect_tx
      device::mbarrier_init(&empty[s], kWarpsPerTile);  // one arrival per consumer warp of the tile
    }
    device::fence_mbarrier_init_release_cluster();
  }
  __syncthreads();  // the only CTA-wide barrier

  if (warp == kProducerWarp) {
    if (lane != 0) return;
    device::prefetch_tensormap(&x_map);
    for (uint32_t k = 0; k < count; ++k) {
      const int s = int(k % S);
      const PipeTile t = tile_at(p, first + k * step);
      device::mbarrier_wait_parity(&empty[s], ((k / S) & 1) ^ 1);  // fresh slots pass at once
      ring[s] = t;
      const bool right = t.c0 + kBoxCols < p.cols;  // the right box holds columns of the matrix
      device::mbarrier_arrive_expect_tx(&full[s], right ? 2 * kBoxBytes : kBoxBytes);
      uint8_t* stage = smem + s * kStageBytes;
      for (int box = 0; box < (right ? 2 : 1); ++box)
        device::cp_async_bulk_tensor_3d_global_to_shared(stage + box * kBoxBytes, &x_map, &full[s],
                                                         2 * (t.c0 + box * kBoxCols), t.r0, t.b);
    }
    return;
  }

  // ---- consumers
  const int group = warp / kGroupWarps, w = warp % kGroupWarps;
  const int team = warp / kWarpsPerTile;
  const bool row_warp = kRow && (!kCol || group == 0);
  const uint32_t bar_id = 1u + uint32_t(group);
  uint32_t* max_words = reinterpret_cast<uint32_t*>(smem + L::kMax) + group * 2 * kGroupWarps;
  const uint32_t slices = sbase + uint32_t(L::kStaging + warp * 2 * kSliceBytes);
  if (lane == 0) device::prefetch_tensormap(row_warp ? &row_map : &col_map);
  uint32_t it = 0;  // this warp's tiles so far: staging slice and max words it % 2
  for (uint32_t k = uint32_t(team); k < count; k += kTeams, ++it) {
    const int s = int(k % S);
    const uint32_t stage = sbase + uint32_t(s * kStageBytes);
    device::mbarrier_wait_parity(&full[s], (k / S) & 1);
    const PipeTile t = ring[s];
    const int32_t vrows = min(kTile, p.rows - t.r0), vcols = min(kTile, p.cols - t.c0);
    const int32_t ti = t.r0 / kTile, tj = t.c0 / kTile;
    const uint32_t slice = slices + (it & 1) * kSliceBytes;
    uint32_t* words = max_words + (it & 1) * kGroupWarps;
    if (row_warp) {
      const int r = 16 * w + lane % 16, half = lane / 16;
      uint4 v[8];
      pipe_slice::row_load(stage, r, half, v);
      __syncwarp();
      if (lane == 0) {
        device::mbarrier_arrive(&empty[s]);          // the slice's inputs are in registers
        device::cp_async_bulk_wait_group_read<1>();  // the store of tile it - 2 has read this slice
      }
      __syncwarp();
      // Blocks past the last column (a stale right box) count as 0; rows past the matrix were
      // zero-filled by the TMA load (byte 0). vcols is a multiple of 32.
      uint32_t sb[2];
      sb[0] = 64 * half < vcols ? row_block_scale(v, 0, p.mode) : 0u;
      sb[1] = 64 * half + 32 < vcols ? row_block_scale(v, 1, p.mode) : 0u;
      const uint32_t emax = group_max(max(sb[0], sb[1]), words, w, bar_id);
      row_codes(v, sb, emax, r, half, slice + uint32_t((r - 16 * w) * 128));
      device::fence_proxy_async_shared_cta();
      __syncwarp();
      if (lane == 0) {
        if (16 * w < vrows)
          device::cp_async_bulk_tensor_3d_shared_to_global(&row_map, smem + (slice - sbase), t.c0, t.r0 + 16 * w, t.b);
        device::cp_async_bulk_commit_group();
      }
      if (w == 0)
        store_tile_scale(p.row_scales + (int64_t(t.b) * p.tiles_c + tj) * p.row_pitch, ti, p.tiles_r, p.row_pitch,
                         emax, lane);
    } else {
      const int q = lane / 8, h = lane % 8;
      uint32_t x[32];
      pipe_slice::col_load(stage, w, q, h, x);
      __syncwarp();
      if (lane == 0) {
        device::mbarrier_arrive(&empty[s]);
        device::cp_async_bulk_wait_group_read<1>();
      }
      __syncwarp();
      uint32_t sc[4];
      pipe_slice::col_scale_bytes(x, p.mode, sc);
      // Columns past the matrix (a stale right box; vcols is a multiple of 32, so the warp's 16
      // columns are all in or all out) count as 0; rows past it were zero-filled.
      const bool col_ok = 16 * w < vcols;
      uint32_t mine = 0;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        sc[c] = col_ok ? sc[c] : 0u;
        mine = max(mine, sc[c]);
      }
      const uint32_t emax = group_max(mine, words, w, bar_id);
      col_codes(x, sc, emax, q, h, slice);
      device::fence_proxy_async_shared_cta();
      __syncwarp();
      if (lane == 0) {
        if (col_ok)
          device::cp_async_bulk_tensor_3d_shared_to_global(&col_map, smem + (slice - sbase), t.r0, t.c0 + 16 * w, t.b);
        device::cp_async_bulk_commit_group();
      }
      if (w == 0)
        store_tile_scale(p.col_scales + (int64_t(t.b) * p.tiles_r + ti) * p.col_pitch, tj, p.tiles_c, p.col_pitch,
                         emax, lane);
    }
  }
  if (lane == 0) device::cp_async_bulk_wait_group<0>();
}

template <bool kRow, bool kCol>
void launch(const Block128Params& a, const PipeParams& p, cudaStream_t stream) {
  constexpr auto kernel = quantize_block128_pipelined_kernel<kRow, kCol>;
  constexpr const char* fn = "quantize_mxfp8_block128";
  set_smem_limit_once<kernel>(fn, Layout::kBytes);
  const int resident = max_resident_ctas<kernel>(fn, kThreads, Layout::kBytes);
  const unsigned grid = unsigned(std::min<int64_t>(p.num_tiles, resident));
  const auto sw = CU_TENSOR_MAP_SWIZZLE_128B;
  const uint64_t rows = uint64_t(a.rows), cols = uint64_t(a.cols), batch = uint64_t(a.batch);
  const CUtensorMap x_map = make_tensor_map_3d_u8(fn, const_cast<uint16_t*>(a.x), batch, rows, 2 * cols, 2 * cols,
                                                  2 * rows * cols, kTile, 2 * kBoxCols, sw);
  CUtensorMap row_map{}, col_map{};
  if (kRow) row_map = make_tensor_map_3d_u8(fn, a.row_data, batch, rows, cols, cols, rows * cols, 16, kTile, sw);
  if (kCol) col_map = make_tensor_map_3d_u8(fn, a.col_data, batch, cols, rows, rows, rows * cols, 16, kTile, sw);
  kernel<<<grid, kThreads, Layout::kBytes, stream>>>(p, x_map, row_map, col_map);
  MXMOE_CHECK_LAUNCH(fn);
}

}  // namespace

bool block128_pipelined_applies(const Block128Params& a) {
  const auto aligned = [](const void* q) { return q == nullptr || reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  const int64_t tiles = a.batch * ((a.rows + kTile - 1) / kTile) * ((a.cols + kTile - 1) / kTile);
  return aligned(a.x) && aligned(a.row_data) && aligned(a.col_data) &&
         a.cols < (int64_t(1) << 30) && a.rows < (int64_t(1) << 30) &&  // int32 TMA coordinates (2 cols bytes)
         2 * a.rows * a.cols < (int64_t(1) << 40) &&                     // the batch stride of x (TMA: < 2^40)
         (a.row_data == nullptr || a.cols % 16 == 0) &&                  // row strides: multiples of 16 bytes
         (a.col_data == nullptr || a.rows % 16 == 0) && tiles < (int64_t(1) << 31);
}

void launch_quantize_block128_pipelined(const Block128Params& a, cudaStream_t stream) {
  PipeParams p{};
  p.x = a.x;
  p.rows = int32_t(a.rows);
  p.cols = int32_t(a.cols);
  p.tiles_r = int32_t((a.rows + kTile - 1) / kTile);
  p.tiles_c = int32_t((a.cols + kTile - 1) / kTile);
  p.num_tiles = int32_t(a.batch * p.tiles_r * p.tiles_c);
  p.full_groups = p.tiles_r / kGroupRowTiles;
  p.mode = a.mode;
  p.row_scales = a.row_scales;
  p.col_scales = a.col_scales;
  p.row_pitch = a.row_pitch;
  p.col_pitch = a.col_pitch;
  p.per_batch = FastDivmod(uint32_t(p.tiles_r * p.tiles_c));
  p.per_group = FastDivmod(uint32_t(kGroupRowTiles * p.tiles_c));
  p.group_rows = FastDivmod(uint32_t(kGroupRowTiles));
  p.last_group_rows = FastDivmod(uint32_t(std::max(1, p.tiles_r % kGroupRowTiles)));
  const bool row = a.row_data != nullptr, col = a.col_data != nullptr;
  if (row && col) launch<true, true>(a, p, stream);
  else if (row) launch<true, false>(a, p, stream);
  else launch<false, true>(a, p, stream);
}

}  // namespace mxmoe::detail
