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
  select_top_k(p, s_logits[warp], s_scratch[warp], int(t), lane);
}

}  // namespace

void launch_moe_topk(const float* logits, int64_t tokens, const RouterLaunch& p, cudaStream_t stream) {
  const unsigned grid = unsigned((tokens + kWarpsPerCta - 1) / kWarpsPerCta);
  moe_topk_kernel<<<grid, 32 * kWarpsPerCta, 0, stream>>>(logits, tokens, p);
  MXMOE_CHECK_LAUNCH("moe_topk");
}

}  // namespace mxmoe::detail
