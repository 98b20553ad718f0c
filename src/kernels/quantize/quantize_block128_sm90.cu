// BF16 → the 128x128-block fast form in one pass (include/mxmoe/quantize.h, quantize_mxfp8_block128;
// the form: mx_format.h and gemm.h FastScaleLayout::kBlock128): what quantize_mxfp8 (plain copy) followed
// by rebase_mxfp8_fast_block128 makes, without writing and re-reading the plain copy.
//
// Input x BF16 [batch, rows, cols] (16-byte aligned). Outputs per direction (either may be null):
//   row-wise: data E4M3 [batch, rows, cols], scales E8M0 [batch, ceil(cols/128), pitch(rows)]
//   column-wise (the MX tensor of x[b]ᵀ): data E4M3 [batch, cols, rows], scales [batch, ceil(rows/128), pitch(cols)]
// with pitch(n) = fast_block_scales_pitch(n), padding bytes written as 0.
//
// One CTA of 256 threads per 128x128 tile of x[b] (tile rows [128i, +128), columns [128j, +128)): the
// tile is one block in both directions. Thread t loads row t/2, columns 64(t%2) .. +63 of the tile (8
// x 16 bytes: a warp reads 16 whole 256-byte row segments), which is also its row-wise work:
//   row-wise: per 32-block the MX scale byte from the amax (dev::e8m0_scale_byte, the quantizers'
//     rule), the CTA's maximum E over the tile's 32-blocks (0xFF — an Inf or NaN — wins and poisons the
//     block: data 0x7F, scale 0xFF; an all-zero block's byte 0 never raises it), every element's MX code
//     (x · 2^-e_b, E4M3 RNE satfinite: the quantizers' arithmetic) re-expressed against E (the rebase's
//     conversion). Bitwise ref::rebase_fast_block128(ref::quantize_rows(x)).
//   column-wise: the same on the transposed tile, read from shared memory (the loaded tile, padded
//     rows against bank conflicts): thread t owns column t/2, rows 64(t%2) .. +63, and writes them as
//     64 contiguous bytes of the output row. Bitwise ref::rebase_fast_block128(ref::quantize_cols(x[b])).
// Partial tiles (rows or cols not multiples of 128; multiples of 32 where the direction needs it) read
// and write only their valid part.
// Roofline: memory-bound; reads 2 bytes and writes 1 (+ scales) per element and direction.
// The default kernel is quantize_block128_pipelined_sm90.cu's (persistent, TMA); this one runs with
// MXMOE_QUANT_BLOCK128_KERNEL=simple and where that one does not apply (use_pipelined_kernel below).
// Tests: tests/gpu/test_quantize_block128_gpu.cpp; argument checks in tests/cpu/test_quantize_args.cpp.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "device/mx_convert.cuh"
#include "kernels/quantize/block128_common.cuh"
#include "kernels/quantize/quantize_block128_launch.h"
#include "host/check.h"
#include "mxmoe/quantize.h"

namespace mxmoe {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 128;
constexpr int kPadRow = kTile + 8;  // BF16 elements per shared row: column reads spread over the banks
static_assert(kThreads == 2 * kTile, "a thread per (row, half tile)");
static_assert(kPadRow * 2 % 16 == 0, "16-byte shared stores");

struct BlockQuantArgs {
  const uint16_t* x;
  int64_t rows, cols;
  ScaleMode mode;
  uint8_t *row_data, *row_scales;  // null: no row-wise output
  uint8_t *col_data, *col_scales;  // null: no column-wise output
  int64_t row_pitch, col_pitch;    // fast_block_scales_pitch(rows), (cols)
};

// The MX scale byte of one 32-block from its 16 words of BF16 pairs.
__device__ __forceinline__ uint32_t block_scale(const uint32_t* w, ScaleMode mode) {
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) m = dev::abs_max_bf16x2(m, w[i]);
  return dev::e8m0_scale_byte(dev::halves_max(m), mode);
}

// The 32 codes of a 32-block (16 words of BF16 pairs) as 8 words of E4M3 quads: MX code against the
// block's byte sb, then re-expressed against the tile's byte emax (0xFF: the whole block NaN).
__device__ __forceinline__ void block_codes(const uint32_t* w, uint32_t sb, uint32_t emax, uint32_t* out) {
  if (emax == kE8M0Nan) {
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = dev::kE4M3NanX4;
    return;
  }
  const float rcp = dev::e8m0_reciprocal(sb);
  const float pw = dev::exp2_nonpositive(int(sb) - int(emax));
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t w0 = w[2 * i], w1 = w[2 * i + 1];
    const uint32_t q = dev::e4m3x4_from_f32(dev::bf16_lo(w0) * rcp, dev::bf16_hi(w0) * rcp, dev::bf16_lo(w1) * rcp,
                                            dev::bf16_hi(w1) * rcp);
    out[i] = dev::e4m3x4_rebase(q, pw);
  }
}

// One direction of the tile: a thread's two 32-blocks in w (words 0-15 and 16-31; ok0 / ok1: inside
// the matrix) → their MX scale bytes, the tile's maximum E over the CTA, the 64 codes against E at dst,
// and the tile's scale byte at srow[blk] (pitch padding by the last block of the row).
__device__ __forceinline__ void tile_direction(const uint32_t* w, bool ok0, bool ok1, ScaleMode mode,
                                               uint32_t* warp_max, uint8_t* dst, uint8_t* srow, int64_t blk,
                                               int64_t nblk, int64_t pitch) {
  const uint32_t s0 = ok0 ? block_scale(w, mode) : 0u, s1 = ok1 ? block_scale(w + 16, mode) : 0u;
  const uint32_t emax = block128::block_max<kThreads>(s0 > s1 ? s0 : s1, warp_max);
  uint32_t out[8];
  if (ok0) {
    block_codes(w, s0, emax, out);
    reinterpret_cast<uint4*>(dst)[0] = make_uint4(out[0], out[1], out[2], out[3]);
    reinterpret_cast<uint4*>(dst)[1] = make_uint4(out[4], out[5], out[6], out[7]);
  }
  if (ok1) {
    block_codes(w + 16, s1, emax, out);
    reinterpret_cast<uint4*>(dst)[2] = make_uint4(out[0], out[1], out[2], out[3]);
    reinterpret_cast<uint4*>(dst)[3] = make_uint4(out[4], out[5], out[6], out[7]);
  }
  block128::store_block_scale<kThreads>(srow, blk, nblk, pitch, emax);
}

// grid (column tiles, row tiles, batch)
template <bool kRow, bool kCol>
__global__ void __launch_bounds__(kThreads) quantize_block128_kernel(const BlockQuantArgs a) {
  __shared__ __align__(16) uint16_t tile[kCol ? kTile * kPadRow : 8];
  __shared__ uint32_t warp_max[kThreads / 32];
  const int64_t tj = blockIdx.x, ti = blockIdx.y, b = blockIdx.z;
  const int64_t r0 = ti * kTile, c0 = tj * kTile;
  const int64_t nrt = gridDim.y, nct = gridDim.x;
  const int64_t vrows = min(int64_t(kTile), a.rows - r0), vcols = min(int64_t(kTile), a.cols - c0);
  const int r = threadIdx.x / 2, half = threadIdx.x % 2;
  // Load: row r, columns 64·half .. +63 (zeros outside the matrix).
  uint32_t w[32];
  const bool row_ok = r < vrows;
  const uint16_t* src = a.x + (b * a.rows + r0 + r) * a.cols + c0 + 64 * half;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const bool ok = row_ok && 64 * half + 8 * k < vcols;  // vcols is a multiple of 8 (of 32)
    const uint4 v = ok ? __ldg(reinterpret_cast<const uint4*>(src) + k) : make_uint4(0, 0, 0, 0);
    w[4 * k] = v.x;
    w[4 * k + 1] = v.y;
    w[4 * k + 2] = v.z;
    w[4 * k + 3] = v.w;
  }
  if constexpr (kCol) {  // 16-byte stores: the row pitch is 272 bytes, a multiple of 16
    uint4* trow = reinterpret_cast<uint4*>(tile + r * kPadRow + 64 * half);
#pragma unroll
    for (int k = 0; k < 8; ++k) trow[k] = make_uint4(w[4 * k], w[4 * k + 1], w[4 * k + 2], w[4 * k + 3]);
  }
  if constexpr (kRow)  // 32-blocks 2·half and 2·half + 1 of row r
    tile_direction(w, row_ok && 64 * half < vcols, row_ok && 64 * half + 32 < vcols, a.mode, warp_max,
                   a.row_data + (b * a.rows + r0 + r) * a.cols + c0 + 64 * half,
                   a.row_scales + (b * nct + tj) * a.row_pitch, ti, nrt, a.row_pitch);
  if constexpr (kCol) {
    __syncthreads();  // the tile is in shared memory (and warp_max free again)
    // Column c = r of the tile, rows 64·half .. +63: 32 words of BF16 pairs along the rows.
    const int c = r;
#pragma unroll
    for (int k = 0; k < 32; ++k) {
      const int rr = 64 * half + 2 * k;
      w[k] = uint32_t(tile[rr * kPadRow + c]) | (uint32_t(tile[(rr + 1) * kPadRow + c]) << 16);
    }
    const bool col_ok = c < vcols;
    tile_direction(w, col_ok && 64 * half < vrows, col_ok && 64 * half + 32 < vrows, a.mode, warp_max,
                   a.col_data + (b * a.cols + c0 + c) * a.rows + r0 + 64 * half,
                   a.col_scales + (b * nrt + ti) * a.col_pitch, tj, nct, a.col_pitch);
  }
}

// Which kernel (MXMOE_QUANT_BLOCK128_KERNEL, read on every call so that one process can time both):
// unset, empty or "pipelined" = quantize_block128_pipelined_sm90.cu's where its TMA maps can be made
// (detail::block128_pipelined_applies), this file's otherwise; "simple" = this file's kernel.
bool use_pipelined_kernel(const char* fn) {
  const char* e = std::getenv("MXMOE_QUANT_BLOCK128_KERNEL");
  if (e == nullptr || *e == 0 || std::strcmp(e, "pipelined") == 0) return true;
  if (std::strcmp(e, "simple") == 0) return false;
  detail::throw_arg(fn, "MXMOE_QUANT_BLOCK128_KERNEL", e, "must be pipelined (default) or simple");
}

}  // namespace

void quantize_mxfp8_block128(const __nv_bfloat16* x, int64_t batch, int64_t rows, int64_t cols,
                             const MxBlockOut* rowwise, const MxBlockOut* colwise, ScaleMode mode,
                             cudaStream_t stream) {
  constexpr const char* fn = "quantize_mxfp8_block128";
  using detail::throw_arg;
  using detail::to_str;
  if (rowwise == nullptr && colwise == nullptr)
    throw_arg(fn, "rowwise", "null", "at least one of rowwise and colwise must be given");
  if (mode != ScaleMode::kRceil && mode != ScaleMode::kFloor) throw_arg(fn, "mode", to_str(int(mode)), "must be kRceil or kFloor");
  if (batch < 1 || batch > 65535) throw_arg(fn, "batch", to_str(batch), "must be in [1, 65535]");
  if (rows <= 0) throw_arg(fn, "rows", to_str(rows), "must be > 0");
  if (cols <= 0 || cols % kMxBlock != 0)
    throw_arg(fn, "cols", to_str(cols), "must be a positive multiple of 32 (BF16 rows are loaded 16 bytes at a time, "
                                        "and row-wise blocks run along it)");
  if (colwise != nullptr && rows % kMxBlock != 0)
    throw_arg(fn, "rows", to_str(rows), "must be a multiple of 32 for the column-wise copy (its blocks run along rows)");
  const int64_t nrt = (rows + kTile - 1) / kTile, nct = (cols + kTile - 1) / kTile;
  if (nrt > 65535) throw_arg(fn, "rows", to_str(rows), "must be at most 65535 · 128");
  if (nct > 0x7FFFFFFF) throw_arg(fn, "cols", to_str(cols), "must be below 2^38");
  if (cols > ((int64_t(1) << 62) / (rows * batch)))
    throw_arg(fn, "rows", to_str(rows), "batch · rows · cols must be below 2^62");
  detail::check_device_ptrs(fn, {{"x", x}});
  BlockQuantArgs a{reinterpret_cast<const uint16_t*>(x), rows, cols, mode, nullptr, nullptr, nullptr, nullptr,
                   fast_block_scales_pitch(rows), fast_block_scales_pitch(cols)};
  if (rowwise != nullptr) {
    detail::check_device_ptrs(fn, {{"rowwise.data", rowwise->data}});
    detail::check_not_null(fn, "rowwise.scales", rowwise->scales);
    a.row_data = rowwise->data;
    a.row_scales = rowwise->scales;
  }
  if (colwise != nullptr) {
    detail::check_device_ptrs(fn, {{"colwise.data", colwise->data}});
    detail::check_not_null(fn, "colwise.scales", colwise->scales);
    a.col_data = colwise->data;
    a.col_scales = colwise->scales;
  }
  if (use_pipelined_kernel(fn)) {
    detail::Block128Params bp;
    bp.x = a.x;
    bp.batch = batch;
    bp.rows = rows;
    bp.cols = cols;
    bp.mode = mode;
    bp.row_data = a.row_data;
    bp.row_scales = a.row_scales;
    bp.col_data = a.col_data;
    bp.col_scales = a.col_scales;
    bp.row_pitch = a.row_pitch;
    bp.col_pitch = a.col_pitch;
    if (detail::block128_pipelined_applies(bp)) {
      detail::launch_quantize_block128_pipelined(bp, stream);
      return;
    }
  }
  const dim3 grid{unsigned(nct), unsigned(nrt), unsigned(batch)};
  if (rowwise != nullptr && colwise != nullptr)
    quantize_block128_kernel<true, true><<<grid, kThreads, 0, stream>>>(a);
  else if (rowwise != nullptr)
    quantize_block128_kernel<true, false><<<grid, kThreads, 0, stream>>>(a);
  else
    quantize_block128_kernel<false, true><<<grid, kThreads, 0, stream>>>(a);
  MXMOE_CHECK_LAUNCH(fn);
}

}  // namespace mxmoe
