// MXFP8 quantization kernels (BF16 in). Layouts and numerics: include/mxmoe/mx_format.h.
//
// All pointers are device pointers. x, every data and fast_data pointer must be 16-byte aligned;
// scale pointers need no alignment. Arguments are checked on the host before any launch and a bad
// one throws mxmoe::Error naming it. Calls are asynchronous on `stream` and do no host sync.
// Results are bitwise deterministic.
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "mxmoe/error.h"
#include "mxmoe/mx_format.h"

namespace mxmoe {

// One quantized copy of a matrix whose blocks of 32 run along its last dimension.
// For logical shape [rows, cols] (per batch entry):
//   data        E4M3 [rows, cols]
//   scales      E8M0 [rows, cols/32]
//   fast_data   E4M3 [rows, cols]                (optional; give both fast pointers or neither)
//   fast_scales E8M0 [ceil(cols/128), rows]      (optional; chunk-major, see mx_format.h)
// data and scales may also both be null when the fast pair is given: then only the fast form is
// written (what a fast-mode GEMM reads), saving half the output bytes. At least one pair is needed.
// fast_blocks (column-wise copies only): the fast pair in the 128x128-block form instead (gemm.h
// FastScaleLayout::kBlock128, the wgrad GEMMs' operand b): fast_scales E8M0
// [ceil(cols/128), fast_block_scales_pitch(rows)] of the copy [rows, cols] (for colwise of x [R, C]:
// [ceil(R/128), fast_block_scales_pitch(C)]), padding bytes written as 0; bitwise the plain copy
// followed by rebase_mxfp8_fast_block128. Only with data = scales = null, and with rowwise null or
// its fast pair alone (the training layer's request); other mixes throw.
struct MxOut {
  uint8_t* data = nullptr;
  uint8_t* scales = nullptr;
  uint8_t* fast_data = nullptr;
  uint8_t* fast_scales = nullptr;
  bool fast_blocks = false;
};

// Quantize x [batch, rows, cols] (row-major BF16; batch = 1 for a matrix, E for weights [E, N, K]).
//   rowwise (may be null): per batch entry the MX tensor of x[b]   — [rows, cols], needs cols % 32 == 0
//   colwise (may be null): per batch entry the MX tensor of x[b]ᵀ — [cols, rows], needs rows % 32 == 0
// With both given, x is read once and both copies (and their fast forms) are written in one pass.
void quantize_mxfp8(const __nv_bfloat16* x, int64_t batch, int64_t rows, int64_t cols,
                    const MxOut* rowwise, const MxOut* colwise,
                    ScaleMode mode = ScaleMode::kRceil, cudaStream_t stream = nullptr);

// Quantize rows grouped by expert into the padded expert layout of the grouped GEMMs.
//   x              BF16 [x_rows, cols]; group g owns rows [offsets[g], offsets[g+1])
//   offsets        int32 [num_groups+1], device memory, non-decreasing, offsets[num_groups] <= x_rows
//   padded_offsets int32 [num_groups+1], device memory: padded_offsets[0] = 0 and
//                  padded_offsets[g+1] - padded_offsets[g] = roundup(count_g, 128)
//                  (compute_padded_offsets fills it). Neither array is ever read by the host.
//   Output row space [0, out_rows), out_rows % 128 == 0 (a worst-case capacity): row j of group g
//   lands at padded_offsets[g] + j; the pad rows of each group are written as zeros (data 0,
//   scales 0x00, i.e. an all-zero block). Rows at or beyond padded_offsets[num_groups] are not
//   written, and nothing at or beyond out_rows is ever written.
//   rowwise (may be null): [out_rows, cols] (and [out_rows, cols/32], fast [ceil(cols/128), out_rows])
//   colwise (may be null): [cols, out_rows] (and [cols, out_rows/32], fast [out_rows/128, cols]),
//                          blocks of 32 along tokens within each group (the wgrad operand).
void quantize_mxfp8_grouped(const __nv_bfloat16* x, int64_t x_rows, int64_t cols,
                            const int32_t* offsets, const int32_t* padded_offsets, int num_groups,
                            int64_t out_rows, const MxOut* rowwise, const MxOut* colwise,
                            ScaleMode mode = ScaleMode::kRceil, cudaStream_t stream = nullptr);

// Gather rows, then quantize (the fused "permute + quantize" of the MoE layer).
//   x          BF16 [x_rows, cols]
//   row_index  int32 [out_rows], device memory: output row r is x[row_index[r]], or a zero row
//              (pad) where row_index[r] < 0; an index >= x_rows also reads as a zero row.
//   rows_used  optional int32 scalar in device memory (e.g. &padded_offsets[E]): rows at or beyond
//              *rows_used are not written. A multiple of 128, at most out_rows. Never read by the host;
//              read once per launch on the device, so it must not change while the call runs.
//   out_rows % 128 == 0 (a worst-case capacity). Outputs as for quantize_mxfp8_grouped.
void quantize_mxfp8_gather(const __nv_bfloat16* x, int64_t x_rows, int64_t cols, const int32_t* row_index,
                           int64_t out_rows, const int32_t* rows_used, const MxOut* rowwise,
                           const MxOut* colwise, ScaleMode mode = ScaleMode::kRceil,
                           cudaStream_t stream = nullptr);

// quantize_mxfp8_gather with a per-output-row scale (the combine backward's dY, fused):
//   row_scale  FP32 [out_rows], device memory, 4-byte aligned: output row r is
//              bf16_rn(row_scale[r] · x[row_index[r]]) (FP32 product, rounded to BF16 to nearest
//              even), then quantized. row_scale[r] is read only for rows that take x data (pads and
//              rows at or beyond *rows_used are zeros/unwritten as in quantize_mxfp8_gather).
void quantize_mxfp8_gather_scaled(const __nv_bfloat16* x, int64_t x_rows, int64_t cols, const int32_t* row_index,
                                  const float* row_scale, int64_t out_rows, const int32_t* rows_used,
                                  const MxOut* rowwise, const MxOut* colwise, ScaleMode mode = ScaleMode::kRceil,
                                  cudaStream_t stream = nullptr);

// The 128x128-block fast form of the weights (gemm.h FastScaleLayout::kBlock128, mx_format.h; an
// opt-in alternative to DESIGN §2's per-row fast form for operand B of m_grouped_mxfp8_gemm_nt),
// made from plain MX copies of [batch, rows, cols] (per matrix blocks of 32 along cols, as
// quantize_mxfp8 writes them: data E4M3 [batch, rows, cols], scales E8M0 [batch, rows, cols/32]):
//   block_data   E4M3 [batch, rows, cols]
//   block_scales E8M0 [batch, ceil(cols/128), fast_block_scales_pitch(rows)]; byte [b][c][j] is the
//                exponent of rows [128j, min(128j + 128, rows)) of matrix b over columns [128c, 128c + 128);
//                the pitch's padding bytes are written as 0.
// Bitwise ref::rebase_fast_block128(m, batch): per block E = the largest scale byte of its 32-blocks
// (a NaN byte 0xFF poisons the whole block: scale 0xFF, data 0x7F), every code re-expressed as
// E4M3_rne_satfinite(code · 2^(e_b − E)). For the column-wise copy of a weight [E, N, K] (the dgrad
// operand [E, K, N]) call it with rows = K, cols = N. data and block_data 16-byte aligned (they may be
// the same buffer: in place); block_scales must not overlap scales. batch <= 65535, rows <= 65535 · 128.
// Kernel: src/kernels/quantize/rebase_fast_block128_sm90.cu (memory-bound, 2 bytes per element).
void rebase_mxfp8_fast_block128(const uint8_t* data, const uint8_t* scales, int64_t batch, int64_t rows,
                                int64_t cols, uint8_t* block_data, uint8_t* block_scales,
                                cudaStream_t stream = nullptr);

// One block-form copy (gemm.h FastScaleLayout::kBlock128) of a [rows, cols] matrix whose 32-blocks
// run along cols: data E4M3 [rows, cols] (16-byte aligned), scales E8M0 [ceil(cols/128),
// fast_block_scales_pitch(rows)] per batch entry (padding bytes written as 0).
struct MxBlockOut {
  uint8_t* data = nullptr;
  uint8_t* scales = nullptr;
};

// BF16 x [batch, rows, cols] → the 128x128-block fast form in one pass: rowwise (may be null) the
// block form of x[b] ([rows, cols]), colwise (may be null) that of x[b]ᵀ ([cols, rows], needs
// rows % 32 == 0). Bitwise what quantize_mxfp8 (plain copy) and then rebase_mxfp8_fast_block128
// make, without the plain copy in between (for weights that change every step).
// Kernels: src/kernels/quantize/quantize_block128_pipelined_sm90.cu (default), quantize_block128_sm90.cu
// (MXMOE_QUANT_BLOCK128_KERNEL=simple, or where the pipelined kernel's TMA maps cannot be made).
void quantize_mxfp8_block128(const __nv_bfloat16* x, int64_t batch, int64_t rows, int64_t cols,
                             const MxBlockOut* rowwise, const MxBlockOut* colwise,
                             ScaleMode mode = ScaleMode::kRceil, cudaStream_t stream = nullptr);

// padded_offsets[g] = Σ_{j<g} roundup(offsets[j+1] - offsets[j], align), for g = 0..num_groups.
// One small kernel; device in, device out.
void compute_padded_offsets(const int32_t* offsets, int32_t* padded_offsets, int num_groups,
                            int align = 128, cudaStream_t stream = nullptr);

inline constexpr int kMaxGroups = 1024;

}  // namespace mxmoe
