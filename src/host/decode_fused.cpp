// Host side of the fused warp-decode step (include/mxmoe/decode.h, decode_step_fused): argument
// checks before any CUDA call, the workspace layout, the launch (src/kernels/decode/warp_decode_fused_sm90.cu).
#include <cstdint>

#include "host/check.h"
#include "host/decode_checks.h"
#include "host/routing.h"
#include "kernels/decode/decode_launch.h"
#include "mxmoe/decode.h"

namespace mxmoe {
namespace {

using detail::throw_arg;
using detail::to_str;

constexpr size_t kAlign = 256;
size_t round_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Workspace: [0, 256) the grid barrier's state; logits [kDecodeFusedMaxBatch, E] FP32 (a fixed size,
// so that h's offset does not depend on the batch); h [B, S, I] FP32.
struct FusedLayout {
  size_t logits = kAlign, h = 0, bytes = 0;
  FusedLayout(const DecodeShape& s, int batch) {
    h = logits + round_up(size_t(kDecodeFusedMaxBatch) * size_t(s.num_experts) * sizeof(float));
    bytes = h + size_t(batch) * size_t(s.top_k + (s.shared_expert ? 1 : 0)) * size_t(s.inter) * sizeof(float);
  }
};

void check_shape(const char* fn, const DecodeShape& s, int batch, bool mx) {
  if (batch < 1 || batch > kDecodeFusedMaxBatch)
    throw_arg(fn, "batch", to_str(batch), "must be in [1, " + to_str(kDecodeFusedMaxBatch) + "] for the fused step");
  detail::check_dim(fn, "shape.hidden", s.hidden, mx);
  detail::check_dim(fn, "shape.inter", s.inter, mx);
  detail::check_experts(fn, s.num_experts);
  if (s.num_experts > kDecodeFusedMaxExperts)
    throw_arg(fn, "shape.num_experts", to_str(s.num_experts),
              "must be at most " + to_str(kDecodeFusedMaxExperts) + " for the fused step");
  detail::check_top_k(fn, "shape.top_k", s.top_k, s.num_experts);
}

void check_workspace(const char* fn, const void* workspace, size_t workspace_bytes, size_t need) {
  detail::check_ptr(fn, "workspace", workspace, kAlign);
  if (workspace_bytes < need)
    throw_arg(fn, "workspace_bytes", to_str(workspace_bytes), "must be at least " + to_str(need) + " for this batch");
}

bool overlap(const void* a, size_t an, const void* b, size_t bn) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + bn && pb < pa + an;
}

}  // namespace

size_t decode_step_fused_workspace_bytes(const DecodeShape& shape, int batch) {
  check_shape("decode_step_fused_workspace_bytes", shape, batch, false);
  return FusedLayout(shape, batch).bytes;
}

void decode_step_fused_init_workspace(void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const char* fn = "decode_step_fused_init_workspace";
  check_workspace(fn, workspace, workspace_bytes, kAlign);
  detail::launch_decode_fused_init(workspace, stream);
}

void decode_step_fused(const __nv_bfloat16* x, int batch, const DecodeShape& shape, const __nv_bfloat16* router_w,
                       const RouterParams& params, const DecodeWeights& w1, const DecodeWeights& w2,
                       int32_t* topk_ids, float* topk_weights, __nv_bfloat16* out, void* workspace,
                       size_t workspace_bytes, cudaStream_t stream) {
  const char* fn = "decode_step_fused";
  const bool mx = detail::is_mx(fn, "w1", w1.dtype);
  detail::check_ptr(fn, "x", x, 16);
  check_shape(fn, shape, batch, mx);
  detail::check_weights(fn, "w1", w1);
  detail::check_weights(fn, "w2", w2);
  if (w1.dtype != w2.dtype)
    throw_arg(fn, "w2.dtype", to_str(int(w2.dtype)), "must equal w1.dtype = " + to_str(int(w1.dtype)));
  if (shape.shared_expert != (w1.shared_data != nullptr) || shape.shared_expert != (w2.shared_data != nullptr))
    throw_arg(fn, "shape.shared_expert", to_str(shape.shared_expert),
              "must say whether w1 and w2 both carry a shared expert (shared_data)");
  if (params.top_k != shape.top_k)
    throw_arg(fn, "params.top_k", to_str(params.top_k), "must equal shape.top_k = " + to_str(shape.top_k));
  detail::check_ptr(fn, "router_w", router_w, 16);
  detail::check_routing(fn, shape.num_experts, params, topk_ids, topk_weights);
  detail::check_ptr(fn, "out", out, 16);
  const FusedLayout lay(shape, batch);
  check_workspace(fn, workspace, workspace_bytes, lay.bytes);
  const size_t act = size_t(batch) * size_t(shape.hidden) * 2;
  if (overlap(out, act, x, act))
    throw_arg(fn, "out", to_str(static_cast<const void*>(out)), "must not overlap x (x is read until the last phase)");
  if (overlap(out, act, workspace, lay.bytes))
    throw_arg(fn, "out", to_str(static_cast<const void*>(out)), "must not overlap the workspace");
  if (overlap(x, act, workspace, lay.bytes))  // x is read through the non-coherent path while h is written
    throw_arg(fn, "x", to_str(static_cast<const void*>(x)), "must not overlap the workspace");
  // CTA 0 writes the ids and routing weights while other CTAs still read x and the logits.
  const size_t sel = size_t(batch) * size_t(shape.top_k);
  const struct { const char* name; const void* p; size_t n; } outs[] = {
      {"topk_ids", topk_ids, sel * sizeof(int32_t)}, {"topk_weights", topk_weights, sel * sizeof(float)}};
  for (const auto& o : outs) {
    if (overlap(o.p, o.n, x, act) || overlap(o.p, o.n, out, act) || overlap(o.p, o.n, workspace, lay.bytes))
      throw_arg(fn, o.name, to_str(o.p), "must not overlap x, out or the workspace");
  }
  if (overlap(topk_ids, sel * sizeof(int32_t), topk_weights, sel * sizeof(float)))
    throw_arg(fn, "topk_weights", to_str(static_cast<const void*>(topk_weights)), "must not overlap topk_ids");

  detail::FusedLaunch p;
  p.router = detail::routing_launch(shape.num_experts, params, topk_ids, topk_weights);
  p.router.x = reinterpret_cast<const uint16_t*>(x);
  p.router.w = reinterpret_cast<const uint16_t*>(router_w);
  p.router.batch = batch;
  p.router.hidden = shape.hidden;
  p.w1 = detail::expert_weights(w1);
  p.w2 = detail::expert_weights(w2);
  p.inter = shape.inter;
  p.slots = shape.top_k + (shape.shared_expert ? 1 : 0);
  auto* ws = static_cast<uint8_t*>(workspace);
  p.barrier = ws;
  p.logits = reinterpret_cast<float*>(ws + lay.logits);
  p.h = reinterpret_cast<float*>(ws + lay.h);
  p.out = reinterpret_cast<uint16_t*>(out);
  p.wr_prefetch = detail::env_int("MXMOE_DECODE_FUSED_WR_PREFETCH", 1) != 0 ? 1 : 0;
  p.w2_prefetch = detail::env_int("MXMOE_DECODE_FUSED_W2_PREFETCH", 1) != 0 ? 1 : 0;
  p.cooperative = detail::env_int("MXMOE_DECODE_FUSED_COOP", 0) != 0 ? 1 : 0;
  detail::launch_decode_fused(p, stream);
}

}  // namespace mxmoe
