// Launch interface between quantize_mxfp8_block128 (quantize_block128_sm90.cu: argument checks, the
// simple kernel, the choice) and the pipelined kernel (quantize_block128_pipelined_sm90.cu).
// Arguments are already validated when these are called.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "mxmoe/mx_format.h"

namespace mxmoe::detail {

struct Block128Params {
  const uint16_t* x = nullptr;  // BF16 bits [batch, rows, cols]
  int64_t batch = 1, rows = 0, cols = 0;
  ScaleMode mode = ScaleMode::kRceil;
  uint8_t *row_data = nullptr, *row_scales = nullptr;  // null: no row-wise output
  uint8_t *col_data = nullptr, *col_scales = nullptr;  // null: no column-wise output
  int64_t row_pitch = 0, col_pitch = 0;                // fast_block_scales_pitch(rows), (cols)
};

// Whether the pipelined kernel can take the call: every TMA tensor map encodable (dimensions below
// 2^32, strides below 2^40, 16-byte aligned data pointers, coordinates and tile ids in int32).
bool block128_pipelined_applies(const Block128Params& p);
void launch_quantize_block128_pipelined(const Block128Params& p, cudaStream_t stream);

}  // namespace mxmoe::detail
