// Launch interface of src/kernels/layer/moe_elementwise_sm90.cu (arguments already validated).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace mxmoe::detail {

void launch_moe_swiglu(const uint16_t* gu, int64_t rows, int64_t inter, const int32_t* rows_used, uint16_t* h,
                       cudaStream_t stream);
void launch_moe_combine(const uint16_t* y, int64_t y_rows, int64_t cols, const int32_t* row_of, const float* w,
                        int64_t tokens, int top_k, const float* addend, uint16_t* out, cudaStream_t stream);

}  // namespace mxmoe::detail
