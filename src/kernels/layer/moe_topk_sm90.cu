// Training-layer top-k from FP32 logits [T, E]: one warp per token copies its logits row into
// shared memory and runs the shared selection (kernels/common/router_select.cuh), so the layer
// and the decode router route identically. 8 tokens per 256-thread CTA, 4 KB of shared memory a
// warp (logits + group scratch). Bytes: 4·E per token read, 8·k written. No atomics.
// Tests: tests/gpu/test_moe_ops_gpu.cpp (against ref::route_from_logits).
#include <cstdint>

#include "host/check.h"
#include "kernels/common/router_select.cuh"
#include "kernels/layer/moe_ops_launch.h"

namespace mxmoe::detail {
namespace {

constexpr int kWarpsPerCta = 8;

__global__ void __launch_bounds__(32 * kWarpsPerCta) moe_topk_kernel(const float* __restrict__ logits, int64_t tokens,
                                                                     const RouterLaunch p) {
  __shared__ float s_logits[kWarpsPerCta][kDecodeMaxExperts];
  __shared__ float s_scratch[kWarpsPerCta][kDecodeMaxExperts];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * kWarpsPerCta + warp;
  if (t >= tokens) return;  // whole warp
  const float* row = logits + t * p.num_experts;
  for (int e = lane; e < p.num_experts; e += 32) s_logits[warp][e] = __ldg(row + e);
  __syncwarp();
  select_top_k_any(p, s_logits[warp], s_scratch[warp], int(t), lane);
}

// The value lane q holds for slot q whose expert is e (lane q < k holds expert id_q), or 0 when e
// is not selected. Every lane of the warp must call it (shuffles); the ids of a token are distinct.
__device__ __forceinline__ float slot_value(int e, int id, float v, int k) {
  float r = 0.0f;
  for (int q = 0; q < k; ++q) {
    const float vq = __shfl_sync(dev::kFullMask, v, q);
    if (__shfl_sync(dev::kFullMask, id, q) == e) r = vq;
  }
  return r;
}

// One warp per token: dlogits from dw through the routing weights (see moe_ops.h). p.ids holds
// the selected experts; lane j < k owns slot j. Warp sums are fixed butterflies (deterministic).
__global__ void __launch_bounds__(32 * kWarpsPerCta) moe_router_backward_kernel(const float* __restrict__ logits,
                                                                                const float* __restrict__ dw,
                                                                                int64_t tokens, const RouterLaunch p,
                                                                                float* __restrict__ dlogits) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * kWarpsPerCta + warp;
  if (t >= tokens) return;
  const int E = p.num_experts, k = p.top_k;
  const float* lg = logits + t * E;
  const bool mine = lane < k;
  const int id = mine ? p.ids[t * k + lane] : 0;
  const float dwj = mine ? __ldg(dw + t * k + lane) : 0.0f;
  float* out = dlogits + t * E;
  if (!p.sigmoid) {
    float m = -INFINITY;
    for (int e = lane; e < E; e += 32) m = fmaxf(m, __ldg(lg + e));
    m = dev::warp_max(m);
    float z = 0.0f;
    for (int e = lane; e < E; e += 32) z += expf(__ldg(lg + e) - m);
    z = dev::warp_sum(z);
    const float pj = mine ? expf(__ldg(lg + id) - m) / z : 0.0f;
    const float S = dev::warp_sum(pj), wsum = dev::warp_sum(dwj * pj);
    // w_j = scaling · p_j / S (the forward router scales softmax weights too)
    const float dpj = mine ? p.scaling * (dwj / S - wsum / (S * S)) : 0.0f;  // dp of the selected expert
    const float pdp = dev::warp_sum(pj * dpj);
    for (int e0 = 0; e0 < E; e0 += 32) {  // whole warp per step: slot_value shuffles
      const int e = e0 + lane;
      const float dp = slot_value(e, id, dpj, k);
      if (e < E) out[e] = expf(__ldg(lg + e) - m) / z * (dp - pdp);
    }
  } else {
    const float sj = mine ? 1.0f / (1.0f + expf(-__ldg(lg + id))) : 0.0f;
    const float S = dev::warp_sum(sj), wsum = dev::warp_sum(dwj * sj);
    const float dlj = mine ? p.scaling * (dwj / S - wsum / (S * S)) * sj * (1.0f - sj) : 0.0f;
    for (int e0 = 0; e0 < E; e0 += 32) {  // whole warp per step: slot_value shuffles
      const int e = e0 + lane;
      const float dl = slot_value(e, id, dlj, k);
      if (e < E) out[e] = dl;
    }
  }
}

}  // namespace

void launch_moe_router_backward(const float* logits, const float* dw, int64_t tokens, const RouterLaunch& p,
                                float* dlogits, cudaStream_t stream) {
  const unsigned grid = unsigned((tokens + kWarpsPerCta - 1) / kWarpsPerCta);
  moe_router_backward_kernel<<<grid, 32 * kWarpsPerCta, 0, stream>>>(logits, dw, tokens, p, dlogits);
  MXMOE_CHECK_LAUNCH("moe_router_backward");
}

void launch_moe_topk(const float* logits, int64_t tokens, const RouterLaunch& p, cudaStream_t stream) {
  const unsigned grid = unsigned((tokens + kWarpsPerCta - 1) / kWarpsPerCta);
  moe_topk_kernel<<<grid, 32 * kWarpsPerCta, 0, stream>>>(logits, tokens, p);
  MXMOE_CHECK_LAUNCH("moe_topk");
}

}  // namespace mxmoe::detail
