// Host entry of the routing plan: argument checks before any CUDA call, then the launch.
#include "mxmoe/moe_plan.h"

#include "host/check.h"
#include "kernels/layer/moe_plan_launch.h"

namespace mxmoe {

using detail::check_aligned;
using detail::check_not_null;
using detail::throw_arg;
using detail::to_str;

size_t moe_plan_workspace_bytes(int64_t tokens, int top_k, int num_experts) {
  return size_t(detail::plan_chunks(tokens * top_k)) * size_t(num_experts) * sizeof(int32_t);
}

void moe_plan(const int32_t* ids, int64_t tokens, int top_k, int num_experts, int64_t capacity,
              void* workspace, size_t workspace_bytes, const MoePlan& plan, cudaStream_t stream) {
  const char* fn = "moe_plan";
  if (tokens < 0 || tokens > (int64_t(1) << 26)) throw_arg(fn, "tokens", to_str(tokens), "must be in [0, 2^26]");
  if (num_experts < 1 || num_experts > kMaxExperts)
    throw_arg(fn, "num_experts", to_str(num_experts), "must be in [1, " + to_str(kMaxExperts) + "]");
  if (top_k < 1 || top_k > kMaxTopK || top_k > num_experts)
    throw_arg(fn, "top_k", to_str(top_k), "must be in [1, min(32, num_experts)]");
  if (tokens > 0) check_not_null(fn, "ids", ids);
  check_aligned(fn, "ids", ids, 4);
  const int64_t need = moe_plan_capacity(tokens, top_k, num_experts);
  if (capacity < need || capacity % 128 != 0)
    throw_arg(fn, "capacity", to_str(capacity),
              "must be a multiple of 128 and at least roundup(tokens*top_k + num_experts*127, 128) = " + to_str(need));
  const size_t ws_need = moe_plan_workspace_bytes(tokens, top_k, num_experts);
  if (ws_need > 0) check_not_null(fn, "workspace", workspace);
  check_aligned(fn, "workspace", workspace, 4);
  if (workspace_bytes < ws_need)
    throw_arg(fn, "workspace_bytes", to_str(workspace_bytes), "must be at least moe_plan_workspace_bytes() = " + to_str(ws_need));
  // row_of has tokens·top_k entries: with no tokens there is nothing to point at (an empty
  // tensor's data pointer may be null). Every other output always has entries.
  const struct { const char* name; const void* p; bool has_entries; } outs[] = {
      {"plan.counts", plan.counts, true},        {"plan.offsets", plan.offsets, true},
      {"plan.padded_offsets", plan.padded_offsets, true}, {"plan.row_of", plan.row_of, tokens > 0},
      {"plan.row_index", plan.row_index, true}};
  for (const auto& o : outs) {
    if (o.has_entries) check_not_null(fn, o.name, o.p);
    check_aligned(fn, o.name, o.p, 4);
  }
  detail::launch_moe_plan(ids, tokens, top_k, num_experts, capacity, static_cast<int32_t*>(workspace), plan, stream);
}

}  // namespace mxmoe
