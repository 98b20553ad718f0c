// Launch interface between the host wrappers (src/host/decode.cpp) and the warp-decode kernels
// (src/kernels/decode/warp_decode_*_sm90.cu). Arguments are validated before these are called.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "mxmoe/decode.h"

namespace mxmoe::detail {

// The top-k selection's forms (router_select.cuh; MXMOE_ROUTER_SELECT; every form the same ids and
// weights). RouterLaunch::select_form holds one of the first three; kSelectRuntime is for code compiled
// with every form that reads it at run time (the fused step, the training layer's top-k).
enum RouterSelectForm : int {
  kSelectParallel = 0,    // group scores by warp reductions, a comparison tree a round
  kSelectSerial = 1,      // the forms before session 16: one lane a group over shared memory, a chain a round
  kSelectGroupWarps = 2,  // the default (run 126): in the decode router each (token, group) score by a warp
                          // of its own, rounds that find only the winner's id; elsewhere = kSelectParallel
  kSelectRuntime = -1,
};

struct RouterLaunch {
  const uint16_t* x = nullptr;   // BF16 bits [B, H]
  const uint16_t* w = nullptr;   // BF16 bits [E, H]
  const float* bias = nullptr;   // [E] or null
  int32_t* ids = nullptr;        // [B, k]
  float* weights = nullptr;      // [B, k]
  int batch = 0, hidden = 0, num_experts = 0, top_k = 0;
  int sigmoid = 0, renormalize = 1, n_groups = 1, topk_groups = 1;
  float scaling = 1.0f;
  int argmax_shuffle = 0;        // router_select.cuh warp_argmax: 0 redux.sync (default), 1 the xor-shuffle
                                 // butterfly (MXMOE_ROUTER_ARGMAX=shuffle; same ids and weights)
  int slots = 0;                 // scores a lane in the top-k: 0 the fewest for E (select_top_k_any), else
                                 // 4, 8 or 16 with 32·slots >= E (MXMOE_ROUTER_SLOTS; same ids and weights)
  int cluster = 0;               // decode router's CTAs a cluster: 0 by rule (router_cluster_size), 8 or 16
                                 // (MXMOE_ROUTER_CLUSTER; 16 is non-portable; same ids and weights)
  int unroll = 0;                // decode router: chunks of Wr in flight a lane, 0 by rule (router_unroll), 8
                                 // or 16 (MXMOE_ROUTER_UNROLL; same ids and weights)
  int x_global = 0;              // decode router: 1 reads X from global memory, not from a shared copy
                                 // (MXMOE_ROUTER_XSMEM=0; same ids and weights)
  int select_form = kSelectGroupWarps;  // RouterSelectForm (MXMOE_ROUTER_SELECT; default group warps since
                                        // run 126); in the decode router the serial form also has rank 0 score
                                        // every expert and a release/acquire first cluster barrier
};

struct ExpertWeights {
  int mxfp8 = 0;
  const void* data = nullptr;           // [E, N, K] BF16 or E4M3
  const uint8_t* scales = nullptr;      // [E, N, K/32]
  const void* shared_data = nullptr;    // [N, K] or null
  const uint8_t* shared_scales = nullptr;
};

inline ExpertWeights expert_weights(const DecodeWeights& w) {
  ExpertWeights e;
  e.mxfp8 = w.dtype == DecodeWeightDtype::kMXFP8 ? 1 : 0;
  e.data = w.data;
  e.scales = w.scales;
  e.shared_data = w.shared_data;
  e.shared_scales = w.shared_scales;
  return e;
}

struct GateUpLaunch {
  const uint16_t* x = nullptr;  // BF16 bits [B, H]
  ExpertWeights w1;             // N = 2I, K = H
  const int32_t* ids = nullptr; // [B, k]
  void* h = nullptr;            // [B, S, I]
  int h_bf16 = 0;
  int batch = 0, hidden = 0, inter = 0, num_experts = 0, top_k = 0, slots = 0;
  int min_ctas_per_sm = 3;      // MXFP8: 3 (launch bound, 80 registers) or 2 (102 registers)
  int persist = 0;              // 0: one task a warp; N: N·SMs CTAs whose warps walk the tasks
  int rows_order = 1;           // 1: 8-row blocks of every (token, slot) side by side (all tokens' rows of
                                // an expert at once); 0: token by token (MXMOE_DECODE_ORDER; same bits)
  int shared_first = 0;         // 1 (a shared expert, persist = 0): its tasks first, their CTAs started before
                                // griddepcontrol.wait; x must be complete when this kernel starts
                                // (gate_up::task_of_shared_first; MXMOE_DECODE_SHARED_FIRST, default on
                                // since run 137; same bits)
  int x_smem = 0;               // 1 (one task a warp, H <= kDecodeGateUpMaxXSmem / 4): each CTA copies its token's
                                // x into shared memory as FP32 first (MXMOE_DECODE_GATE_UP_XSMEM; same bits)
};
inline constexpr int kDecodeGateUpMaxXSmem = 47 * 1024;  // bytes of the staged x (+ 1 KB of scales: under 48 KB,
                                                         // no opt-in attribute needed)

struct DownLaunch {
  const void* h = nullptr;      // [B, S, I]
  int h_bf16 = 0;
  ExpertWeights w2;             // N = H, K = I
  const int32_t* ids = nullptr; // [B, k]
  const float* weights = nullptr;  // [B, k]
  uint16_t* out = nullptr;      // BF16 bits [B, H]
  int batch = 0, hidden = 0, inter = 0, num_experts = 0, top_k = 0, slots = 0;
  // Design-space switches (MXMOE_DECODE_DOWN_*, src/host/decode.cpp read_down_switches, which also
  // sets the defaults by dtype: MXFP8 8 rows x 1): anything but the values below runs
  // warp_decode_down_sweep_*_sm90.cu (same bits); these select the base kernel (down_default).
  int down_rows = 4;            // outputs per tile: 4, 8, 16
  int down_unroll = 2;          // chunks of each row in flight per lane: 1, 2, 4 (rows·unroll <= 16)
  int down_persist = 0;         // 0: one CTA a tile; N: N·SMs CTAs walking the tiles
  int down_prefetch = 0;        // persistent: L2 prefetch of the next tile's rows
  int down_row_scales = 0;      // MXFP8: scale bytes warp-wide per round instead of a byte per chunk
  int down_regs = 128;          // register cap: 128 (the default's bound), 112, 80, 64
  int down_balance = 0;         // persistent: equal shares of the B·H outputs a CTA, not whole tiles
  int rows_order = 1;           // tiles numbered n-major (every token's tile n side by side) or b-major (0;
                                // MXMOE_DECODE_ORDER; same bits)
  int down_group = 8;           // tile walk: tiles a CTA computes between two CTA barriers (1 = a barrier a tile)
  bool down_default() const {
    return down_rows == 4 && down_unroll == 2 && down_persist == 0 && down_prefetch == 0 &&
           down_row_scales == 0 && down_regs == 128 && down_balance == 0;
  }
};

// The fused step (warp_decode_fused_sm90.cu): router, gate/up and down in one persistent kernel.
inline constexpr int kFusedMaxBatch = kDecodeFusedMaxBatch;
inline constexpr int kFusedMaxExperts = kDecodeFusedMaxExperts;  // selection: <= 8 scores a lane
struct FusedLaunch {
  RouterLaunch router;           // x, w, bias, ids / weights (the step's outputs), sizes, scoring
  ExpertWeights w1, w2;          // W1: N = 2I, K = H; W2: N = H, K = I (same dtype)
  int inter = 0, slots = 0;      // I, S = k (+1 with a shared expert)
  void* barrier = nullptr;       // device::GridBarrierState (workspace, initialised once)
  float* logits = nullptr;       // [B, E] FP32 (workspace)
  float* h = nullptr;            // [B, S, I] FP32 (workspace)
  uint16_t* out = nullptr;       // BF16 bits [B, H]
  int wr_prefetch = 1;           // L2 prefetch of Wr before griddepcontrol.wait
  int w2_prefetch = 1;           // L2 prefetch of each CTA's first W2 rows before the second barrier
  int cooperative = 0;           // launch with cudaLaunchAttributeCooperative
};

void launch_decode_router(const RouterLaunch& p, cudaStream_t stream);
void launch_decode_fused(const FusedLaunch& p, cudaStream_t stream);
// One thread writes the barrier's initial state (magic, arrive = 0) at `barrier`.
void launch_decode_fused_init(void* barrier, cudaStream_t stream);
void launch_decode_gate_up(const GateUpLaunch& p, cudaStream_t stream);
void launch_decode_down(const DownLaunch& p, cudaStream_t stream);
// The design-space variants (warp_decode_down_sweep_sm90.cuh; instantiated per weight and h dtype).
template <bool kMx, bool kHBf16>
void launch_decode_down_sweep(const DownLaunch& p, cudaStream_t stream);

}  // namespace mxmoe::detail
