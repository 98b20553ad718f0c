// Launch interface between the host wrappers (src/host/quantize.cpp) and the kernels
// (quantize_mxfp8_sm90.cu). Arguments are already validated when these are called.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "mxmoe/mx_format.h"

namespace mxmoe::detail {

struct QuantizeParams {
  const uint16_t* x = nullptr;  // BF16 bits
  int64_t batch = 1;
  int64_t rows_out = 0;         // rows of the output row space (dense: rows of x)
  int64_t cols = 0;
  int64_t x_rows = 0;           // rows of x per batch entry (guards the grouped gather)
  // rowwise copy: data [rows_out, cols], scales [rows_out, cols/32], fast scales [ceil(cols/128), rows_out]
  uint8_t* row_data = nullptr;
  uint8_t* row_scales = nullptr;
  uint8_t* row_fast_data = nullptr;
  uint8_t* row_fast_scales = nullptr;
  // colwise copy: data [cols, rows_out], scales [cols, rows_out/32], fast scales [ceil(rows_out/128), cols]
  uint8_t* col_data = nullptr;
  uint8_t* col_scales = nullptr;
  uint8_t* col_fast_data = nullptr;
  uint8_t* col_fast_scales = nullptr;
  // grouped: output row r of group g reads x row offsets[g] + (r - padded_offsets[g])
  const int32_t* offsets = nullptr;
  const int32_t* padded_offsets = nullptr;
  int num_groups = 0;
  // gather: output row r reads x row row_index[r] (a zero row where it is negative); rows at or
  // beyond *rows_used (when given) are not written
  const int32_t* row_index = nullptr;
  const int32_t* rows_used = nullptr;
  // gather only, optional: output row r holds bf16_rn(row_scale[r] · x[row_index[r]])
  const float* row_scale = nullptr;
  ScaleMode mode = ScaleMode::kRceil;
  // The column-wise fast pair in the 128x128-block form (MxOut::fast_blocks): col_fast_scales
  // [batch, ceil(rows_out/128), fast_block_scales_pitch(cols)]. Read by the host dispatch only (it
  // fills the tail padding after `mode`: the kernels' parameter layout is unchanged).
  bool col_fast_blocks = false;
};
static_assert(sizeof(QuantizeParams) == 160, "col_fast_blocks must stay in the tail padding after mode");

void launch_quantize_mxfp8(const QuantizeParams& p, cudaStream_t stream);
void launch_compute_padded_offsets(const int32_t* offsets, int32_t* padded, int num_groups,
                                   int align, cudaStream_t stream);

}  // namespace mxmoe::detail
