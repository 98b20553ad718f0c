// Launch interface of the routing-plan kernels (src/kernels/layer/moe_plan_sm90.cu).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "mxmoe/moe_plan.h"

namespace mxmoe::detail {

inline constexpr int kPlanChunk = 2048;  // (token, slot) items per warp, in order

inline int64_t plan_chunks(int64_t items) { return (items + kPlanChunk - 1) / kPlanChunk; }

// Validated arguments; chunk_counts: int32 [plan_chunks(tokens·top_k), num_experts] workspace.
void launch_moe_plan(const int32_t* ids, int64_t tokens, int top_k, int num_experts, int64_t capacity,
                     int32_t* chunk_counts, const MoePlan& plan, cudaStream_t stream);

}  // namespace mxmoe::detail
