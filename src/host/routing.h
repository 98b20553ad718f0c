// Host side of the routing rule shared by decode_router and moe_topk (include/mxmoe/decode.h).
#pragma once
#include <cstdint>

#include "kernels/decode/decode_launch.h"
#include "mxmoe/decode.h"

namespace mxmoe::detail {

// Checks num_experts, params (top_k, scoring, groups, bias, scaling) and the outputs; throws
// mxmoe::Error naming the argument ("params.top_k", ...).
void check_routing(const char* fn, int num_experts, const RouterParams& params, const int32_t* topk_ids,
                   const float* topk_weights);

// The selection part of a RouterLaunch (x, w, batch, hidden left unset).
RouterLaunch routing_launch(int num_experts, const RouterParams& params, int32_t* topk_ids, float* topk_weights);

}  // namespace mxmoe::detail
