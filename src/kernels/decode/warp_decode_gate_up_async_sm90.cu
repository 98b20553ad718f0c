// Warp decode, gate/up projection with SwiGLU, fed by cp.async (MXMOE_DECODE_GATE_UP_ASYNC = 4 | 6 | 8;
// session 18, an A/B switch): the tasks and arithmetic of warp_decode_gate_up_sm90.cu (same bits), but
// each warp streams its weight chunks through a ring of that many stages in shared memory
// (gate_up::walk_async, warp_decode_gate_up.cuh) instead of loading them into registers, so that a
// warp keeps loads in flight while it converts and multiplies. In a file of its own so that the
// default kernels' object (and instruction cache) stays as measured.
// Shared memory: 8 warps x depth x (1 KB, + 256 B for MXFP8) a CTA (MXFP8 at depth 6: 60 KB).
// Tests: tests/gpu/test_decode_gpu.cpp (DownSwitchesGiveDefaultBits). Bench: bench/bench_decode_split.py.
#include <cstdint>

#include "device/griddepcontrol.cuh"
#include "host/check.h"
#include "host/pdl_launch.h"
#include "kernels/decode/decode_launch.h"
#include "kernels/decode/warp_decode_gate_up.cuh"

namespace mxmoe::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// The cp.async walk (gate_up::walk_async): every warp has its ring of kDepth stages in dynamic shared
// memory; the tasks of warp_decode_gate_up_kernel (warp_decode_gate_up_sm90.cu) per warp, so the same bits.
template <bool kMx, bool kHBf16, int kDepth, int kMinCtas>
__global__ void __launch_bounds__(kThreads, kMinCtas) warp_decode_gate_up_async_kernel(const GateUpLaunch p) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  device::griddepcontrol_wait();  // ids come from the router (the kernel ahead of this one)
  device::griddepcontrol_launch_dependents();
  gate_up::walk_async<kMx, kHBf16, kDepth, kWarps>(p, int64_t(blockIdx.x) * kWarps + warp, int64_t(gridDim.x) * kWarps,
                                                   lane, smem + warp * kDepth * gate_up::async_stage_bytes<kMx>());
}

template <bool kMx, bool kHBf16, int kDepth>
void launch_async(const GateUpLaunch& p, cudaStream_t stream) {
  constexpr int kMinCtas = kMx ? 3 : 1;  // MXFP8: the default's 80-register bound
  auto kernel = warp_decode_gate_up_async_kernel<kMx, kHBf16, kDepth, kMinCtas>;
  const int smem = kWarps * kDepth * gate_up::async_stage_bytes<kMx>();
  MXMOE_CUDA_CHECK("decode_gate_up",
                   cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  launch_with_pdl("decode_gate_up", kernel, dim3(unsigned(gate_up_grid_blocks(p))), dim3(kThreads), size_t(smem), stream, p);
}

template <bool kMx, bool kHBf16>
void launch_async_depth(const GateUpLaunch& p, cudaStream_t stream) {
  if (p.async_depth == 4) {
    launch_async<kMx, kHBf16, 4>(p, stream);
  } else if (p.async_depth == 6) {
    launch_async<kMx, kHBf16, 6>(p, stream);
  } else {
    launch_async<kMx, kHBf16, 8>(p, stream);
  }
}

}  // namespace

void launch_decode_gate_up_async(const GateUpLaunch& p, cudaStream_t stream) {
  if (p.w1.mxfp8) {
    if (p.h_bf16) launch_async_depth<true, true>(p, stream); else launch_async_depth<true, false>(p, stream);
  } else {
    if (p.h_bf16) launch_async_depth<false, true>(p, stream); else launch_async_depth<false, false>(p, stream);
  }
}

}  // namespace mxmoe::detail
