// Warp decode, gate/up projection with SwiGLU, BF16 weights (DESIGN.md §4, include/mxmoe/decode.h):
//   h[b, j, i] = silu(g) · u,  g = X[b]·W1[e_j][i],  u = X[b]·W1[e_j][I + i],  silu(g) = g/(1+e^-g)
//   X BF16 [B, H] (16-byte aligned); W1 BF16 [E, 2I, H]; shared expert W1s [2I, H] as slot j = k;
//   ids int32 [B, k]; h FP32 or BF16 [B, S, I].
// (MXFP8 weights: warp_decode_gate_up_mxfp8_sm90_mma.cu, on the tensor cores.)
// One warp owns one output h[b, j, i]: it streams the gate row and the up row (K-contiguous)
// with 16-byte loads, lane l taking the 16-byte chunks l, l+32, ... (each warp load reads 512
// contiguous bytes), kUnroll chunks of both rows in flight per lane before any is used
// (2·kUnroll·16 B = 128 B a lane, 4 KB a warp), FP32 accumulation, xor-butterfly warp sum, SwiGLU
// in registers, one store. Warps are numbered with i fastest, so a CTA's 8 warps read 8 adjacent
// rows of one expert. At B = 1 (Qwen3-30B: k = 8, I = 768) that is 6144 warps = 768 CTAs.
// Launched with Programmatic Dependent Launch: griddepcontrol.wait before the ids are read, then
// the dependents (decode_down) may launch.
// Registers: 54 a thread (-Xptxas -v, no spills).
// Roofline: 2·2·I·H FLOPs per (token, slot); bytes 2·I·H·2 per distinct expert.
// Tests: tests/gpu/test_decode_gpu.cpp. Bench: bench/bench_decode.py.
#include <cstdint>

#include "device/griddepcontrol.cuh"
#include "host/check.h"
#include "host/pdl_launch.h"
#include "kernels/decode/decode_launch.h"
#include "kernels/decode/warp_decode_common.cuh"

namespace mxmoe::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;  // chunks of each row in flight per lane
static_assert(kThreads % 32 == 0, "whole warps");

// Weight rows of slot j of token b: the routed expert's [2I, K] block, or the shared expert.
struct RowPair {
  const uint8_t* gate;
  const uint8_t* up;
};

__device__ __forceinline__ RowPair slot_rows(const GateUpLaunch& p, int b, int j, int i) {
  const int64_t H = p.hidden, I = p.inter;
  const int64_t row_bytes = 2 * H;
  const uint8_t* w;
  if (j < p.top_k) {
    const int64_t e = dev::clamp_expert(p.ids[int64_t(b) * p.top_k + j], p.num_experts);
    w = static_cast<const uint8_t*>(p.w1.data) + e * 2 * I * row_bytes;
  } else {
    w = static_cast<const uint8_t*>(p.w1.shared_data);
  }
  RowPair r;
  r.gate = w + int64_t(i) * row_bytes;
  r.up = w + (I + i) * row_bytes;
  return r;
}

// BF16 weights: chunks of 8 elements; lane sums g and u over its chunks in increasing K.
__device__ __forceinline__ void dot_rows_bf16(const RowPair& r, const uint8_t* x, int hidden,
                                              int lane, float& ag, float& au) {
  const int nchunks = hidden / 8;
  for (int c0 = lane; c0 < nchunks; c0 += 32 * kUnroll) {
    uint4 gw[kUnroll], uw[kUnroll];  // [kUnroll] x 16 B of each row
#pragma unroll
    for (int t = 0; t < kUnroll; ++t) {
      const int c = c0 + 32 * t;
      gw[t] = make_uint4(0u, 0u, 0u, 0u);
      uw[t] = gw[t];
      if (c < nchunks) {
        gw[t] = dev::ldg_stream_v4(r.gate + int64_t(c) * 16);
        uw[t] = dev::ldg_stream_v4(r.up + int64_t(c) * 16);
      }
    }
#pragma unroll
    for (int t = 0; t < kUnroll; ++t) {
      const int c = c0 + 32 * t;
      if (c < nchunks) {
        const uint4 xv = dev::ldg_v4(x + int64_t(c) * 16);
        ag = dev::dot8_bf16_bf16(gw[t], xv, ag);
        au = dev::dot8_bf16_bf16(uw[t], xv, au);
      }
    }
  }
}

template <bool kHBf16>
__global__ void __launch_bounds__(kThreads) warp_decode_gate_up_kernel(const GateUpLaunch p) {
  const int lane = threadIdx.x & 31;
  const int64_t task = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int64_t total = int64_t(p.batch) * p.slots * p.inter;
  dev::griddepcontrol_wait();  // ids come from the router (the kernel ahead of this one)
  dev::griddepcontrol_launch_dependents();
  if (task >= total) return;  // the whole warp leaves together
  const int i = int(task % p.inter);
  const int64_t bj = task / p.inter;
  const int j = int(bj % p.slots);
  const int b = int(bj / p.slots);

  const RowPair rows = slot_rows(p, b, j, i);
  const uint8_t* x = reinterpret_cast<const uint8_t*>(p.x + int64_t(b) * p.hidden);
  float ag = 0.0f, au = 0.0f;
  dot_rows_bf16(rows, x, p.hidden, lane, ag, au);
  ag = dev::warp_sum(ag);
  au = dev::warp_sum(au);
  if (lane == 0) dev::store_swiglu<kHBf16>(p.h, (int64_t(b) * p.slots + j) * p.inter + i, ag, au);
}

template <bool kHBf16>
void launch(const GateUpLaunch& p, cudaStream_t stream) {
  const int64_t total = int64_t(p.batch) * p.slots * p.inter;
  const int64_t blocks = (total + kWarps - 1) / kWarps;
  launch_with_pdl("decode_gate_up", warp_decode_gate_up_kernel<kHBf16>, dim3(unsigned(blocks)),
                  dim3(kThreads), 0, stream, p);
}

}  // namespace

void launch_decode_gate_up(const GateUpLaunch& p, cudaStream_t stream) {
  if (p.w1.mxfp8) {
    launch_decode_gate_up_mxfp8(p, stream);  // warp_decode_gate_up_mxfp8_sm90_mma.cu
    return;
  }
  if (p.h_bf16) launch<true>(p, stream); else launch<false>(p, stream);
  MXMOE_CHECK_LAUNCH("decode_gate_up");
}

}  // namespace mxmoe::detail
