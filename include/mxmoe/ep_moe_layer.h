// The expert-parallel MoE training layer (DESIGN.md §3 and §5; design and dataflow:
// docs/notes/ep.md "The EP layer"): MoeLayer's forward and backward with the experts sharded over
// the R ranks of an EpComm. Rank r owns experts [r·E/R, (r+1)·E/R) and its own tokens.
//
//   out [T_r, H] = Σ_j w[t, j] · W2[e_j] · SwiGLU(W1[e_j] · x[t])     (top-k routing of x·Wrᵀ)
//
// Forward: router logits (batch-invariant kernel) → top-k on this rank's tokens → dispatch of the
// BF16 rows to the experts' ranks (EpComm::dispatch_bf16) → local plan over the received rows →
// gather + quantize both ways (MoeLayer's quantizer, on the received BF16 rows) → GEMM1, SwiGLU +
// quantize, GEMM2 (MoeLayer's own launches) → combine at the token's rank (one row per (t, j),
// fixed j-order sum). Backward mirrors it: dw from the kept expert rows at the owner, router
// backward, dOut and the routing weights dispatched to the experts' ranks, dY = bf16(w · dOut)
// gathered and quantized there, the W2/W1 dgrad and wgrad GEMMs of the local experts, dX rows back
// to the owner and summed in slot order plus the router's part.
//
// Result: bitwise equal to MoeLayer (with cfg.batch_invariant_router = true, same mode) run on the
// concatenation of every rank's tokens in rank order with the same weights — out and dx of this
// rank's tokens, dW1/dW2 of the local experts, the routing weights and their gradient, dlogits —
// except the router weight gradient: dwr here is this rank's tokens' share, Σ_r dwr_r is the full
// gradient but its FP32 summation order differs from one GEMM over all tokens (docs/notes/ep.md).
//
// Every rank must construct, forward and backward in the same order (all are collective; a step
// is two dispatches and two combines). No host synchronisation in forward/backward: buffers are
// sized for the worst case (every token of every rank routed to this rank's experts), so a step
// can be captured in a CUDA graph on every rank. Deterministic run to run.
//
// Inputs (device, row-major, 16-byte aligned): x BF16 [T, H] (0 <= T <= max_tokens, may differ
// per rank); wr BF16 [E, H] (replicated); w1 BF16 [E/R, 2I, H], w2 BF16 [E/R, H, I] (this rank's
// experts, the slice [r·E/R, (r+1)·E/R) of the full tensors); out BF16 [T, H].
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "mxmoe/decode.h"
#include "mxmoe/ep.h"
#include "mxmoe/error.h"
#include "mxmoe/gemm.h"

namespace mxmoe {

struct EpMoeLayerConfig {
  int hidden = 0, inter = 0;
  int num_experts = 0;              // E over all ranks (a multiple of R)
  RouterParams routing;             // as MoeLayerConfig (renormalised routing only has a backward)
  GemmMode mode = GemmMode::kFast;
  int64_t max_tokens = 0;           // per rank
  // MoeLayerConfig::weight_fast_layout's counterpart, kRow128 only: kBlock128 is rejected
  // (mxmoe::Error naming cfg.weight_fast_layout), because GEMM2 and the W1 dgrad write their rows
  // through the fused combine's row-scatter GEMM entry, which reads per-row fast scales only. (Where
  // it would be legal, GEMM1 and the W2 dgrad, the weights would then differ from the single-GPU
  // layer's, and with them the bits this layer promises to share with MoeLayer.)
  FastScaleLayout weight_fast_layout = FastScaleLayout::kRow128;
  // MoeLayerConfig::activation_fast_layout's counterpart, kRow128 only: kBlock128 is rejected
  // (mxmoe::Error naming cfg.activation_fast_layout). Not for a kernel reason: the wgrad GEMMs are
  // MoeLayer's, but the block rebase of this layer's dispatched x is not wired, and the
  // multi-GPU tests have not run with it.
  FastScaleLayout activation_fast_layout = FastScaleLayout::kRow128;
};

class EpMoeLayer {
 public:
  // Collective over comm's ranks. Checks (mxmoe::Error naming the argument, thrown on every rank
  // when any rank's setup is bad or the ranks disagree): H, I multiples of 32 in [32, 65536];
  // E/R <= 512 (grouped GEMM) and E <= 512 (top-k); 1 <= top_k <= min(32, E); max_tokens >= 1;
  // comm.config() must match (hidden, top_k, num_experts, max_tokens) and have bf16_rows = true.
  // The layer keeps a reference to comm: it must outlive the layer.
  EpMoeLayer(const EpMoeLayerConfig& cfg, EpComm& comm);
  ~EpMoeLayer();
  EpMoeLayer(const EpMoeLayer&) = delete;
  EpMoeLayer& operator=(const EpMoeLayer&) = delete;

  void forward(const __nv_bfloat16* x, int64_t tokens, const __nv_bfloat16* wr, const __nv_bfloat16* w1,
               const __nv_bfloat16* w2, __nv_bfloat16* out, cudaStream_t stream = nullptr);

  // Backward of the last forward (same x and weights): dout BF16 [T, H] →
  //   dx BF16 [T, H]; dwr FP32 [E, H]: this rank's tokens' share of the router weight gradient
  //   (the caller sums it over ranks with the other replicated parameters' gradients);
  //   dw1 FP32 [E/R, 2I, H]; dw2 FP32 [E/R, H, I] (local experts; all overwritten).
  void backward(const __nv_bfloat16* dout, const __nv_bfloat16* x, const __nv_bfloat16* wr, __nv_bfloat16* dx,
                float* dwr, float* dw1, float* dw2, cudaStream_t stream = nullptr);

  // Per-stage CUDA-event timing, as MoeLayer's (eager runs only; off while capturing).
  // Communication stages are named "dispatch ..." and "combine ...".
  void set_profiling(bool on);
  std::vector<std::pair<std::string, float>> stage_times() const;

  // State of the last forward/backward (device pointers), e.g. for tests.
  const int32_t* topk_ids() const;           // [T, k] global expert ids
  const float* topk_weights() const;         // [T, k]
  const float* topk_weight_grads() const;    // [T, k]
  const float* router_logit_grads() const;   // [T, E]
  const int32_t* local_padded_offsets() const;  // [E/R + 1] of the local expert layout
  int64_t local_capacity() const;            // padded rows of the local expert layout
  size_t workspace_bytes() const;

  struct Impl;

 private:
  Impl* impl_;
};

}  // namespace mxmoe
