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

}  // namespace mxmoe::detail
