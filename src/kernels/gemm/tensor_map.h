// Host-side encoding of 2-D TMA tensor maps (cuTensorMapEncodeTiled), fetched from the driver
// through the runtime so that nothing links libcuda directly.
#pragma once
#include <cstdint>
#include <string>

#include <cuda.h>
#include <cuda_runtime.h>

#include "host/check.h"

namespace mxmoe::detail {

// A 2-D uint8 tensor [rows, cols] (cols contiguous, row stride `row_stride` bytes), read in boxes
// of [box_rows, box_cols]. Out-of-bounds elements read as zero.
CUtensorMap make_tensor_map_2d_u8(const char* fn, const void* base, uint64_t rows, uint64_t cols,
                                  uint64_t row_stride, uint32_t box_rows, uint32_t box_cols,
                                  CUtensorMapSwizzle swizzle);

// A 3-D uint8 tensor [d2, d1, d0] (d0 contiguous; strides in bytes of dimensions 1 and 2), in
// boxes of [1, box1, box0]. Used for TMA stores of batched [batch, rows, cols] outputs: a box
// that reaches past any dimension is clipped (nothing is written there).
CUtensorMap make_tensor_map_3d_u8(const char* fn, void* base, uint64_t d2, uint64_t d1, uint64_t d0,
                                  uint64_t stride1, uint64_t stride2, uint32_t box1, uint32_t box0,
                                  CUtensorMapSwizzle swizzle);

// A 3-D uint8 tensor as above, read (TMA loads) in boxes of [1, box1, box0], with the 2-D maps'
// L2 promotion (256 B). Out-of-bounds elements read as zero. Used for the k-grouped GEMM's
// token-blocked images (d0 = 256 bytes = 128 BF16 tokens, d1 = rows, d2 = M_total / 128).
CUtensorMap make_tensor_map_3d_u8_load(const char* fn, const void* base, uint64_t d2, uint64_t d1, uint64_t d0,
                                       uint64_t stride1, uint64_t stride2, uint32_t box1, uint32_t box0,
                                       CUtensorMapSwizzle swizzle);

// A 3-D float32 tensor [d2, d1, d0] (elements; d0 contiguous, strides in bytes of dimensions 1
// and 2), in boxes of [1, box1, box0] elements: the typed map that TMA reduce-add needs (it adds in
// the map's data type). Used by the GEMMs' TMA-store epilogue for FP32 outputs.
CUtensorMap make_tensor_map_3d_f32(const char* fn, void* base, uint64_t d2, uint64_t d1, uint64_t d0,
                                   uint64_t stride1, uint64_t stride2, uint32_t box1, uint32_t box0,
                                   CUtensorMapSwizzle swizzle);

}  // namespace mxmoe::detail
