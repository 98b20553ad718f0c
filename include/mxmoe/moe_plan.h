// Routing plan of the MoE layer (DESIGN.md §3): from the expert of every (token, slot), the
// per-expert counts, the expert-sorted offsets (unpadded and padded to 128 rows), the padded row
// of every (token, slot), and the token of every padded row. All on the device; deterministic;
// no host synchronisation (sizes are the worst case, known from T, k and E alone).
//
// Row order: within an expert, rows follow (token, slot) order ("stable by token"), so the plan
// is a stable counting sort of the flattened list i = t·k + j.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

#include "mxmoe/error.h"

namespace mxmoe {

struct MoePlan {
  int32_t* counts = nullptr;          // [E]      routed (token, slot) pairs per expert
  int32_t* offsets = nullptr;         // [E+1]    exclusive prefix of counts
  int32_t* padded_offsets = nullptr;  // [E+1]    exclusive prefix of roundup(counts, 128)
  int32_t* row_of = nullptr;          // [T·k]    padded row of (t, j); -1 for an invalid expert id
  int32_t* row_index = nullptr;       // [capacity] token of each padded row; -1 for pad rows and
                                      //            for every row at or beyond padded_offsets[E]
};

// Worst-case padded rows: roundup(T·k + E·127, 128). `capacity` must be at least this.
inline int64_t moe_plan_capacity(int64_t tokens, int top_k, int num_experts) {
  const int64_t worst = tokens * top_k + int64_t(num_experts) * 127;
  return (worst + 127) / 128 * 128;
}

// Bytes of device workspace moe_plan needs (per-chunk expert counts).
size_t moe_plan_workspace_bytes(int64_t tokens, int top_k, int num_experts);

// ids: int32 [tokens, top_k] in device memory, experts in [0, num_experts); an id outside that
// range is dropped (not counted, row_of = -1), never written out of bounds.
void moe_plan(const int32_t* ids, int64_t tokens, int top_k, int num_experts, int64_t capacity,
              void* workspace, size_t workspace_bytes, const MoePlan& plan, cudaStream_t stream = nullptr);

inline constexpr int kMaxExperts = 1024;
inline constexpr int kMaxTopK = 32;

}  // namespace mxmoe
