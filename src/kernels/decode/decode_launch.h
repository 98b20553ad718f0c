// Launch interface between the host wrappers (src/host/decode.cpp) and the warp-decode kernels
// (src/kernels/decode/warp_decode_*_sm90.cu). Arguments are validated before these are called.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace mxmoe::detail {

struct RouterLaunch {
  const uint16_t* x = nullptr;   // BF16 bits [B, H]
  const uint16_t* w = nullptr;   // BF16 bits [E, H]
  const float* bias = nullptr;   // [E] or null
  int32_t* ids = nullptr;        // [B, k]
  float* weights = nullptr;      // [B, k]
  int batch = 0, hidden = 0, num_experts = 0, top_k = 0;
  int sigmoid = 0, renormalize = 1, n_groups = 1, topk_groups = 1;
  float scaling = 1.0f;
};

struct ExpertWeights {
  int mxfp8 = 0;
  const void* data = nullptr;           // [E, N, K] BF16 or E4M3
  const uint8_t* scales = nullptr;      // [E, N, K/32]
  const void* shared_data = nullptr;    // [N, K] or null
  const uint8_t* shared_scales = nullptr;
};

struct GateUpLaunch {
  const uint16_t* x = nullptr;  // BF16 bits [B, H]
  ExpertWeights w1;             // N = 2I, K = H
  const int32_t* ids = nullptr; // [B, k]
  void* h = nullptr;            // [B, S, I]
  int h_bf16 = 0;
  int batch = 0, hidden = 0, inter = 0, num_experts = 0, top_k = 0, slots = 0;
  int min_ctas_per_sm = 3;      // MXFP8: 3 (launch bound, 80 registers) or 2 (102 registers)
};

struct DownLaunch {
  const void* h = nullptr;      // [B, S, I]
  int h_bf16 = 0;
  ExpertWeights w2;             // N = H, K = I
  const int32_t* ids = nullptr; // [B, k]
  const float* weights = nullptr;  // [B, k]
  uint16_t* out = nullptr;      // BF16 bits [B, H]
  int batch = 0, hidden = 0, inter = 0, num_experts = 0, top_k = 0, slots = 0;
};

void launch_decode_router(const RouterLaunch& p, cudaStream_t stream);
void launch_decode_gate_up(const GateUpLaunch& p, cudaStream_t stream);
void launch_decode_down(const DownLaunch& p, cudaStream_t stream);

}  // namespace mxmoe::detail
