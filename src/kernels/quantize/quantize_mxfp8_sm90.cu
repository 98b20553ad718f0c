// MXFP8 quantization of BF16 tiles: row-wise, column-wise (transposed), both in one pass, over a
// batch of matrices or over expert segments, optionally with the fast GEMM-ready form.
//
//   rowwise:  q[r, c]  = E4M3(x[r, c] · 2^-e[r, c/32]),  e from max|x| over 32 columns
//   colwise:  qT[c, r] = E4M3(x[r, c] · 2^-e[c, r/32]),  e from max|x| over 32 rows
//   fast:     q'      = E4M3(q · 2^(e_b − E)),           E = max exponent over a 128-chunk
// Layouts (mx_format.h, quantize.h): x BF16 [batch, rows, cols] row-major, 16-byte aligned;
// data E4M3 row-major; scales E8M0 [.., cols/32]; fast scales chunk-major [ceil(n/128), rows].
//
// One CTA of 256 threads owns a [128 rows, 128 cols] BF16 tile (32 KB):
//   load     : each thread issues 8 independent 16-byte loads (8 BF16 of one row each) up front;
//   rowwise  : from registers — 4 lanes hold one 32-block (2 shuffles for amax), 16 lanes one
//              128-chunk (2 more for the fast exponent); 8-byte stores of E4M3;
//   colwise  : through shared memory — each thread reads a pair of columns over 32 rows as 32
//              conflict-free 4-byte words and writes two 32-byte E4M3 runs of the transposed output;
//              the fast chunk exponent (4 row blocks) is exchanged through a 512-byte table.
// Registers: ~64-90 a thread (no spills; checked with -Xptxas -v). Shared: 32 KB (+512 B fast).
// Roofline: memory-bound. Bytes per element: read 2; write 1 + 1/32 per copy (+1 + 1/128 fast).
// Tests: tests/gpu/test_quantize_gpu.cpp (bit-exact against src/ref). Bench: bench/bench_quant.py.
#include <cstdint>

#include "device/mx_convert.cuh"
#include "host/check.h"
#include "kernels/quantize/quantize_launch.h"
#include "mxmoe/quantize.h"

namespace mxmoe::detail {
namespace {

constexpr int kTileRows = 128;
constexpr int kTileCols = 128;
constexpr int kThreads = 256;
constexpr int kVecPerRow = kTileCols / 8;            // 16-byte vectors (8 BF16) per tile row
constexpr int kRowsPerPass = kThreads / kVecPerRow;  // 16
constexpr int kLoads = kTileRows / kRowsPerPass;     // 8 vectors in flight per thread
constexpr int kRowBlocks = kTileRows / kMxBlock;     // 4 column-wise blocks per tile column
constexpr int kMaxGroupsPow2 = 1024;                 // one thread per group in the offsets scan
static_assert(kMaxGroups <= kMaxGroupsPow2, "padded_offsets_kernel scans with one thread per group");
static_assert(kTileCols == kFastChunk && kTileRows == kFastChunk, "a tile is one fast chunk each way");
static_assert(kThreads == (kTileCols / 2) * kRowBlocks, "colwise: one thread per (column pair, row block)");
static_assert(kVecPerRow * 8 == kTileCols && kMxBlock % 8 == 0, "a 16-byte vector never straddles a block");

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

constexpr int smem_bytes(bool col, bool fast) {
  return col ? kTileRows * kTileCols * 2 + (fast ? kRowBlocks * kTileCols : 0) : 0;
}

// Where the tile's rows come from. Dense: row r of batch entry b. Grouped: the tile lies inside
// one group's padded range; rows past the group's real count are padding (read as zeros).
struct TileRows {
  const uint16_t* src = nullptr;  // x row of tile row 0
  int64_t src_valid = 0;          // tile rows [0, src_valid) have source data
  int64_t out_valid = 0;          // tile rows [0, out_valid) are written
};

template <bool kGrouped>
__device__ __forceinline__ bool map_tile_rows(const QuantizeParams& p, int64_t r0, int64_t b,
                                              TileRows& t) {
  if constexpr (!kGrouped) {
    t.src = p.x + (b * p.rows_out + r0) * p.cols;
    t.out_valid = min64(kTileRows, p.rows_out - r0);
    t.src_valid = t.out_valid;
    return true;
  } else {
    __shared__ int s_group;
    if (threadIdx.x == 0) {
      // Last group whose padded start is <= r0 (upper_bound - 1); empty groups are skipped.
      int lo = 0, hi = p.num_groups;  // invariant: padded[lo] <= r0 < padded[hi] (if r0 in range)
      const int64_t end = p.padded_offsets[p.num_groups];
      if (r0 >= end) {
        lo = -1;
      } else {
        while (hi - lo > 1) {
          const int mid = (lo + hi) / 2;
          if (p.padded_offsets[mid] <= r0) lo = mid; else hi = mid;
        }
      }
      s_group = lo;
    }
    __syncthreads();
    const int g = s_group;
    if (g < 0) return false;
    const int64_t pad_start = p.padded_offsets[g], pad_end = p.padded_offsets[g + 1];
    const int64_t src_start = p.offsets[g], count = p.offsets[g + 1] - src_start;
    const int64_t j0 = r0 - pad_start;  // tile row 0 is row j0 of the group
    t.src = p.x + (src_start + j0) * p.cols;
    t.out_valid = min64(kTileRows, min64(pad_end, p.rows_out) - r0);
    t.src_valid = max64(0, min64(t.out_valid, min64(count, p.x_rows - src_start) - j0));
    return true;
  }
}

// ---- row-wise: one 16-byte vector = 8 values of one row; 4 lanes = one 32-block ----------------
template <bool kFast>
__device__ __forceinline__ void rowwise_vector(const QuantizeParams& p, uint4 v, int64_t out_row,
                                               bool row_ok, int64_t col, bool col_ok, int64_t b) {
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

  const bool store = row_ok && col_ok;
  const int64_t nblk = p.cols / kMxBlock;
  if (store) {
    *reinterpret_cast<uint2*>(p.row_data + (b * p.rows_out + out_row) * p.cols + col) = q;
    if ((threadIdx.x & 3) == 0) p.row_scales[(b * p.rows_out + out_row) * nblk + col / kMxBlock] = uint8_t(sbyte);
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
      *reinterpret_cast<uint2*>(p.row_fast_data + (b * p.rows_out + out_row) * p.cols + col) = f;
      if ((threadIdx.x & 15) == 0) {
        const int64_t nck = (p.cols + kFastChunk - 1) / kFastChunk;
        p.row_fast_scales[(b * nck + col / kFastChunk) * p.rows_out + out_row] = uint8_t(cmax);
      }
    }
  }
}

// ---- column-wise: one thread = columns (2j, 2j+1) of the tile over row block rb (32 rows) -------
__device__ __forceinline__ void quantize_column32(const uint32_t (&w)[kMxBlock], bool hi,
                                                  uint32_t sbyte, uint32_t (&q)[8]) {
  const float rcp = dev::e8m0_reciprocal(sbyte);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t* s = &w[4 * i];
    q[i] = hi ? dev::e4m3x4_from_f32(dev::bf16_hi(s[0]) * rcp, dev::bf16_hi(s[1]) * rcp,
                                     dev::bf16_hi(s[2]) * rcp, dev::bf16_hi(s[3]) * rcp)
              : dev::e4m3x4_from_f32(dev::bf16_lo(s[0]) * rcp, dev::bf16_lo(s[1]) * rcp,
                                     dev::bf16_lo(s[2]) * rcp, dev::bf16_lo(s[3]) * rcp);
    if (sbyte == kE8M0Nan) q[i] = dev::kE4M3NanX4;
  }
}

__device__ __forceinline__ void store32(uint8_t* dst, const uint32_t (&q)[8]) {
  reinterpret_cast<uint4*>(dst)[0] = make_uint4(q[0], q[1], q[2], q[3]);
  reinterpret_cast<uint4*>(dst)[1] = make_uint4(q[4], q[5], q[6], q[7]);
}

template <bool kFast>
__device__ __forceinline__ void colwise_tile(const QuantizeParams& p, const uint32_t* tile_words,
                                             uint8_t* s_exp, int64_t r0, int64_t c0,
                                             const TileRows& t, int64_t b) {
  const int pair = threadIdx.x % (kTileCols / 2);  // lanes of a warp: 32 consecutive pairs
  const int rb = threadIdx.x / (kTileCols / 2);
  uint32_t w[kMxBlock];  // [32 rows] x 2 BF16
#pragma unroll
  for (int i = 0; i < kMxBlock; ++i) w[i] = tile_words[(rb * kMxBlock + i) * (kTileCols / 2) + pair];
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < kMxBlock; ++i) m = dev::abs_max_bf16x2(m, w[i]);
  const uint32_t s0 = dev::e8m0_scale_byte(m & 0xFFFFu, p.mode);
  const uint32_t s1 = dev::e8m0_scale_byte(m >> 16, p.mode);
  uint32_t q0[8], q1[8];
  quantize_column32(w, false, s0, q0);
  quantize_column32(w, true, s1, q1);

  const int64_t col = c0 + 2 * pair;
  const bool ok = col < p.cols && rb * kMxBlock < t.out_valid;
  const int64_t out_r = r0 + rb * kMxBlock;
  const int64_t nblk = p.rows_out / kMxBlock;
  if (ok) {
    store32(p.col_data + (b * p.cols + col) * p.rows_out + out_r, q0);
    store32(p.col_data + (b * p.cols + col + 1) * p.rows_out + out_r, q1);
    p.col_scales[(b * p.cols + col) * nblk + out_r / kMxBlock] = uint8_t(s0);
    p.col_scales[(b * p.cols + col + 1) * nblk + out_r / kMxBlock] = uint8_t(s1);
  }
  if (kFast && p.col_fast_data != nullptr) {  // uniform across the CTA: the barrier is safe
    s_exp[rb * kTileCols + 2 * pair] = uint8_t(s0);
    s_exp[rb * kTileCols + 2 * pair + 1] = uint8_t(s1);
    __syncthreads();
    uint32_t e0 = 0, e1 = 0;  // row blocks past the valid rows hold zeros → byte 0
#pragma unroll
    for (int k = 0; k < kRowBlocks; ++k) {
      e0 = max(e0, uint32_t(s_exp[k * kTileCols + 2 * pair]));
      e1 = max(e1, uint32_t(s_exp[k * kTileCols + 2 * pair + 1]));
    }
    const float pw0 = dev::exp2_nonpositive(int(s0) - int(e0));
    const float pw1 = dev::exp2_nonpositive(int(s1) - int(e1));
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      q0[i] = e0 == kE8M0Nan ? dev::kE4M3NanX4 : dev::e4m3x4_rebase(q0[i], pw0);
      q1[i] = e1 == kE8M0Nan ? dev::kE4M3NanX4 : dev::e4m3x4_rebase(q1[i], pw1);
    }
    if (ok) {
      store32(p.col_fast_data + (b * p.cols + col) * p.rows_out + out_r, q0);
      store32(p.col_fast_data + (b * p.cols + col + 1) * p.rows_out + out_r, q1);
      if (rb == 0) {
        const int64_t nrk = (p.rows_out + kFastChunk - 1) / kFastChunk;
        uint8_t* fs = p.col_fast_scales + (b * nrk + r0 / kFastChunk) * p.cols + col;
        fs[0] = uint8_t(e0);
        fs[1] = uint8_t(e1);
      }
    }
  }
}

template <bool kRow, bool kCol, bool kFast, bool kGrouped>
__global__ void __launch_bounds__(kThreads) quantize_mxfp8_bf16_sm90_kernel(const QuantizeParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int64_t c0 = int64_t(blockIdx.x) * kTileCols;
  const int64_t r0 = int64_t(blockIdx.y) * kTileRows;
  const int64_t b = blockIdx.z;
  TileRows t;
  if (!map_tile_rows<kGrouped>(p, r0, b, t)) return;

  const int vec = threadIdx.x % kVecPerRow;
  const int64_t col = c0 + vec * 8;
  const bool col_ok = col < p.cols;
  uint4 v[kLoads];  // [8 passes] 8 BF16 each
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int r = i * kRowsPerPass + threadIdx.x / kVecPerRow;
    v[i] = (col_ok && r < t.src_valid) ? __ldcs(reinterpret_cast<const uint4*>(t.src + r * p.cols + col))
                                       : make_uint4(0, 0, 0, 0);
  }
  if constexpr (kCol) {
    uint4* tile = reinterpret_cast<uint4*>(smem);  // [128 rows][16 vectors] BF16, unswizzled
#pragma unroll
    for (int i = 0; i < kLoads; ++i) tile[(i * kRowsPerPass + threadIdx.x / kVecPerRow) * kVecPerRow + vec] = v[i];
  }
  if constexpr (kRow) {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int r = i * kRowsPerPass + threadIdx.x / kVecPerRow;
      rowwise_vector<kFast>(p, v[i], r0 + r, r < t.out_valid, col, col_ok, b);
    }
  }
  if constexpr (kCol) {
    __syncthreads();
    colwise_tile<kFast>(p, reinterpret_cast<const uint32_t*>(smem), smem + kTileRows * kTileCols * 2,
                        r0, c0, t, b);
  }
}

template <bool kRow, bool kCol, bool kFast, bool kGrouped>
void launch(const QuantizeParams& p, cudaStream_t stream) {
  const dim3 grid(unsigned((p.cols + kTileCols - 1) / kTileCols),
                  unsigned((p.rows_out + kTileRows - 1) / kTileRows), unsigned(p.batch));
  quantize_mxfp8_bf16_sm90_kernel<kRow, kCol, kFast, kGrouped>
      <<<grid, kThreads, smem_bytes(kCol, kFast), stream>>>(p);
  MXMOE_CHECK_LAUNCH("quantize_mxfp8");
}

template <bool kFast, bool kGrouped>
void dispatch_dirs(const QuantizeParams& p, cudaStream_t stream) {
  const bool row = p.row_data != nullptr, col = p.col_data != nullptr;
  if (row && col) launch<true, true, kFast, kGrouped>(p, stream);
  else if (row) launch<true, false, kFast, kGrouped>(p, stream);
  else if (col) launch<false, true, kFast, kGrouped>(p, stream);
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
  const bool fast = (p.row_fast_data != nullptr) || (p.col_fast_data != nullptr);
  const bool grouped = p.padded_offsets != nullptr;
  if (grouped) {
    if (fast) dispatch_dirs<true, true>(p, stream); else dispatch_dirs<false, true>(p, stream);
  } else {
    if (fast) dispatch_dirs<true, false>(p, stream); else dispatch_dirs<false, false>(p, stream);
  }
}

void launch_compute_padded_offsets(const int32_t* offsets, int32_t* padded, int num_groups,
                                   int align, cudaStream_t stream) {
  padded_offsets_kernel<<<1, kMaxGroupsPow2, 0, stream>>>(offsets, padded, num_groups, align);
  MXMOE_CHECK_LAUNCH("compute_padded_offsets");
}

}  // namespace mxmoe::detail
