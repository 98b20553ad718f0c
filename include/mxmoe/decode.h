// Output-centric MoE decode ("warp decode", DESIGN.md §4) for small batches: a router kernel and
// two expert kernels per layer, with BF16 or MXFP8 weights. Contracts and layouts only; the
// kernels are in src/kernels/decode/, the FP64 reference in src/ref/decode_ref.h.
//
// One decode step of a layer, three launches, no host work in between (CUDA-graph capturable):
//   decode_router : logits[b, e] = X[b]·Wr[e] (FP32), top-k selection → topk_ids, topk_weights
//   decode_gate_up: h[b, j, i] = silu(X[b]·W1[e_j][i]) · (X[b]·W1[e_j][I + i])
//   decode_down   : out[b, n] = Σ_j w[b, j] · (h[b, j]·W2[e_j][n])     (BF16 out, written once)
// Convention Y = X · Wᵀ: every weight row is one output and its K elements are contiguous.
//
// Tensors (row-major, device memory; "16-byte aligned" applies to the base pointer):
//   x            BF16 [B, H], 16-byte aligned, H % 8 == 0
//   router_w     BF16 [E, H], 16-byte aligned
//   bias         FP32 [E] (sigmoid scoring only; optional)
//   topk_ids     int32 [B, k]  expert ids, in decreasing order of selection score
//   topk_weights FP32  [B, k]  routing weights of those experts
//   W1           [E, 2I, H]: rows [0, I) gate, [I, 2I) up
//   W2           [E, H, I]
//   h            FP32 or BF16 [B, S, I], S = k (+1 with a shared expert: slot k), 16-byte aligned
//   out          BF16 [B, H], 16-byte aligned
// Weights (DecodeWeights) are either BF16 [E, N, K], 16-byte aligned, K % 8 == 0, or the MX
// tensor of mx_format.h over the flattened [E·N, K]: data E4M3 [E, N, K] (16-byte aligned),
// scales E8M0 [E, N, K/32], blocks of 32 along K, K % 32 == 0 (so MXFP8 needs H % 32 == 0 and
// I % 32 == 0). MXFP8 weights are dequantized in registers exactly (E4M3 value × 2^(scale−127));
// activations stay BF16 (X is not quantized). A shared expert (DeepSeek-V3) has weights of the
// same dtype and I: W1s [2I, H], W2s [H, I]; it is slot S−1 = k of h and enters the sum with
// weight 1 after the routed experts.
//
// Numerics: every dot product accumulates in FP32 with a fixed order (per lane in increasing K,
// then a fixed butterfly across the 32 lanes); SwiGLU in FP32 (silu(g) = g / (1 + exp(−g)));
// decode_down sums the experts in slot order j = 0..S−1 in FP32 and rounds to BF16 once.
// No floating-point atomics. Results are bitwise deterministic, and batch-invariant: a token's
// outputs do not depend on the other tokens of the batch or on B.
//
// Launches use Programmatic Dependent Launch (sm_90): each kernel may start while the kernel ahead
// of it in the stream runs, and executes griddepcontrol.wait before it reads anything that kernel
// may write (decode_router: x; decode_gate_up: x and topk_ids; decode_down: everything its result
// depends on — before the wait it only prefetches weight rows into L2) and before it writes.
// Kernels launched without the attribute, and other stream work, are ordered as usual, so any
// producer of the inputs is safe. MXMOE_DECODE_PDL=0 in the environment turns the attribute off
// (for A/B timing).
// One exception, with a shared expert: decode_gate_up's CTAs that hold only shared-expert outputs
// (which need no routing) read x before their wait, so that they stream while decode_router still runs
// (DeepSeek-V3 B = 1: 1.04-1.05x a step). So x must be complete by the time the kernel ahead of
// decode_gate_up lets its dependents start: true when that kernel is decode_router (as in decode_step;
// it reads x itself first) or any kernel without the attribute. MXMOE_DECODE_SHARED_FIRST=0 turns it off.
//
// Routing (decode_router), per token, on FP32 logits l[e]:
//   kSoftmax (Qwen3): selection score = l[e]; weight source p[e] = softmax(l)[e];
//                     renormalize: w_j = p[e_j] / Σ_sel p  (= exp(l_j − m) / Σ_sel exp(l − m)).
//   kSigmoid (DeepSeek-V3): s[e] = sigmoid(l[e]); selection score = s[e] + bias[e] (bias is used
//                     for selection only); weight source s[e]; renormalize: w_j = s_j / Σ_sel s.
//   Group-limited (n_groups > 1, sigmoid only): the E experts form n_groups contiguous groups of
//   E/n_groups; a group's score is the sum of its two largest selection scores; the topk_groups
//   best groups are kept and the k experts are chosen among their experts only.
//   Then w_j *= scaling_factor. Ties (equal scores) go to the lower expert (or group) id; a NaN
//   score counts as −Inf. Without renormalize, softmax weights are p[e_j] over all E experts and
//   sigmoid weights are s_j.
//
// Sizes: 1 <= B <= kDecodeMaxBatch; 1 <= k <= kDecodeMaxTopK, k <= E <= kDecodeMaxExperts;
// H, I in [32, 2^16] (multiples of 8, of 32 for MXFP8). topk_ids given to the expert kernels must
// lie in [0, E) (decode_router guarantees it; out-of-range ids are clamped to stay in bounds and
// the result is then unspecified).
//
// All calls are asynchronous on `stream`, check their arguments on the host before any CUDA call
// (mxmoe::Error naming the argument) and never synchronise with the host.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "mxmoe/error.h"
#include "mxmoe/mx_format.h"

namespace mxmoe {

inline constexpr int kDecodeMaxBatch = 4096;
inline constexpr int kDecodeMaxTopK = 32;
inline constexpr int kDecodeMaxExperts = 512;
inline constexpr int kDecodeMaxGroups = 32;

enum class DecodeWeightDtype : int { kBF16 = 0, kMXFP8 = 1 };
enum class DecodeHDtype : int { kFP32 = 0, kBF16 = 1 };
enum class RouterScoring : int { kSoftmax = 0, kSigmoid = 1 };

struct RouterParams {
  RouterScoring scoring = RouterScoring::kSoftmax;
  int top_k = 8;
  bool renormalize = true;
  int n_groups = 1;       // sigmoid only; 1 = no group limit
  int topk_groups = 1;    // groups kept, 1 <= topk_groups <= n_groups
  float scaling_factor = 1.0f;
  const float* bias = nullptr;  // FP32 [E], device; sigmoid only; null = no bias
};

// One projection's weights: routed experts [E, N, K] and an optional shared expert [N, K].
struct DecodeWeights {
  DecodeWeightDtype dtype = DecodeWeightDtype::kBF16;
  const void* data = nullptr;             // BF16 or E4M3 [E, N, K]
  const uint8_t* scales = nullptr;        // E8M0 [E, N, K/32] (MXFP8 only)
  const void* shared_data = nullptr;      // BF16 or E4M3 [N, K], or null: no shared expert
  const uint8_t* shared_scales = nullptr; // E8M0 [N, K/32] (MXFP8 with a shared expert)
  // MXFP8 only, read only by the expert-centric path (decode_expert_centric, decode_step): the
  // fast-mode GEMM form of these weights, made once by decode_prepare_weights. Null otherwise
  // (the warp-decode kernels ignore it; it must be null for BF16 weights).
  const void* prepared = nullptr;
};

// topk_ids int32 [B, k], topk_weights FP32 [B, k] (both 4-byte aligned).
void decode_router(const __nv_bfloat16* x, int batch, int hidden, const __nv_bfloat16* router_w,
                   int num_experts, const RouterParams& params, int32_t* topk_ids,
                   float* topk_weights, cudaStream_t stream = nullptr);

// h [B, S, I] with S = top_k + (w1.shared_data ? 1 : 0).
void decode_gate_up(const __nv_bfloat16* x, int batch, int hidden, int inter,
                    const DecodeWeights& w1, int num_experts, const int32_t* topk_ids, int top_k,
                    void* h, DecodeHDtype h_dtype, cudaStream_t stream = nullptr);

// h as written by decode_gate_up with the same top_k and the same shared-expert choice
// (S = top_k + (w2.shared_data ? 1 : 0)). out BF16 [B, H].
void decode_down(const void* h, DecodeHDtype h_dtype, int batch, int inter, int hidden,
                 const DecodeWeights& w2, int num_experts, const int32_t* topk_ids,
                 const float* topk_weights, int top_k, __nv_bfloat16* out,
                 cudaStream_t stream = nullptr);

// ---- dispatcher: warp decode or the expert-centric path ----------------------------------------
struct DecodeShape {
  int hidden = 0, inter = 0, num_experts = 0, top_k = 0;
  bool shared_expert = false;
};
enum class DecodePath : int { kWarpDecode = 0, kExpertCentric = 1 };

struct DecodeCrossover {
  int max_batch = 0;      // warp decode is used for batch <= max_batch
  bool measured = false;  // false: a guess for a shape the table lacks (bench/bench_decode.py prints the data)
};
// The crossover for a shape and weight dtype: the table entry when the shape is listed, otherwise
// a default (not measured).
DecodeCrossover decode_crossover(const DecodeShape& shape, DecodeWeightDtype dtype);
DecodePath choose_decode_path(const DecodeShape& shape, DecodeWeightDtype dtype, int batch);

// ---- the expert-centric decode step (above the crossover) ---------------------------------------
// One decode step of a layer for B tokens with the training layer's launches (DESIGN.md §3),
// same contract as decode_gate_up + decode_down (x, the routing, the weights → out; a shared
// expert is slot k with weight 1, summed after the routed experts):
//   moe_plan(topk_ids) → gather x into the padded per-expert layout (moe_gather_rows, or
//   quantize_mxfp8_gather for MXFP8) → GU = m_grouped GEMM(x_p, W1) (BF16) → H = moe_swiglu(GU)
//   (BF16) [→ quantize H (MXFP8)] → Y = m_grouped GEMM(H, W2) (BF16) → moe_combine.
//   Shared expert: the same chain with one group (a moe_plan of the all-zero ids [B, 1], so its
//   offsets are {0, roundup(B, 128)}) whose GEMM2 writes FP32 Ys [B, H], the combine's addend:
//     out[t, n] = bf16( (Σ_{j<k} w[t, j] · Y[row(t, j), n]) + Ys[t, n] )
//   summed in FP32 in slot order j = 0..k−1, then the shared term, rounded once.
// Numerics:
//   * BF16 weights: exact-mode GEMMs (GemmMode::kExact) on BF16 "images" that are the tensors
//     themselves (the gathered BF16 x rows, the BF16 weights, the BF16 H): plain BF16 × BF16
//     products accumulated in FP32, no quantization anywhere. Against warp decode the extra
//     roundings are GU, H and Y stored in BF16 (2^-8 relative each) where warp decode keeps h in
//     FP32 and never stores g, u or a slot's product.
//   * MXFP8 weights: fast-mode GEMMs (GemmMode::kFast, FP8 wgmma, 1×128 promotion) on the
//     prepared weights (decode_prepare_weights: the given MX tensors dequantized exactly to BF16
//     and re-quantized with RCEIL into the fast form; the dequantized values are unchanged except
//     where the fast form's 128-chunk rebasing drops an element below E4M3's normal range, as in
//     the training layer, and for blocks with scale bytes outside [3, 246]). Above the crossover
//     the ACTIVATIONS ARE QUANTIZED: x and H are MXFP8-quantized row-wise (RCEIL, fast form) per
//     step, as in the training layer's fast mode — unlike warp decode, which keeps x in BF16 and h
//     in FP32. Expect an output error of about 6% relative (Frobenius) against the FP64 reference
//     on Gaussian data (E4M3 keeps 3 mantissa bits; docs/notes/decode.md "Expert-centric path").
//   * Deterministic (no atomics; fixed orders). Batch invariance: every output row of the grouped
//     GEMMs depends only on its own A row and the expert's weights (row-wise quantization, the
//     same K order in every tile), the combine sums a token's slots in a fixed order, so a token's
//     output does not depend on the other tokens (tests/gpu/test_decode_gpu.cpp checks it).
// Out-of-range ids are dropped by moe_plan (they contribute nothing; warp decode clamps them).
// Sizes: as warp decode, and H, I multiples of 32 for both dtypes (the GEMMs' N and K);
// num_experts <= kMaxGemmExperts.
// workspace: device memory of at least decode_expert_centric_workspace_bytes(batch, …) bytes,
// 256-byte aligned; a workspace sized for a larger batch serves every smaller one. It is sized for
// the worst-case routing (moe_plan_capacity(B, k, E) = roundup(B·k + E·127, 128) padded rows), so
// no step reads anything back to the host; the GEMMs and the element-wise kernels touch only the
// rows in use. Asynchronous on `stream`, no host synchronisation, no host read of device data:
// capturable in a CUDA graph. Arguments are checked before any CUDA call.

// Bytes of the prepared form of one MXFP8 projection [E, N, K] (+ shared [N, K]).
size_t decode_prepared_weights_bytes(int num_experts, int n, int k, bool shared_expert);
// Writes the prepared (fast GEMM) form of the MXFP8 weights w ([E, N, K], + shared [N, K] when
// w.shared_data is set) into `prepared` (256-byte aligned, decode_prepared_weights_bytes bytes);
// then set w.prepared = prepared. Once per weight tensor, not per step: it allocates a temporary
// BF16 buffer of at most ~256 MB (or one expert) with cudaMallocAsync on `stream` and frees it
// there. Asynchronous; w must stay unchanged until it has run.
void decode_prepare_weights(const DecodeWeights& w, int num_experts, int n, int k, void* prepared,
                            size_t prepared_bytes, cudaStream_t stream = nullptr);

size_t decode_expert_centric_workspace_bytes(int batch, int hidden, int inter, int num_experts,
                                             int top_k, bool shared_expert, DecodeWeightDtype dtype);
// w1, w2 as for decode_gate_up / decode_down (MXFP8: with .prepared set); a shared expert is
// given in both or neither. out BF16 [B, H].
void decode_expert_centric(const __nv_bfloat16* x, int batch, int hidden, int inter,
                           const DecodeWeights& w1, const DecodeWeights& w2, int num_experts,
                           const int32_t* topk_ids, const float* topk_weights, int top_k,
                           __nv_bfloat16* out, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream = nullptr);

// ---- one decode step, dispatched ----------------------------------------------------------------
// decode_router, then warp decode (decode_gate_up with FP32 h, decode_down) when
// choose_decode_path(shape, w1.dtype, batch) says so (batch <= the crossover), else
// decode_expert_centric. The router runs inside, so topk_ids [B, k] and topk_weights [B, k]
// (caller-provided, 4-byte aligned) are outputs: the routing this step used. params.top_k must
// equal shape.top_k; shape.shared_expert must match w1/w2.shared_data. Both paths' requirements
// are checked at every batch (MXFP8 weights need .prepared; H, I multiples of 32), so a
// configuration that runs at one batch runs at every batch. workspace: at least
// decode_step_workspace_bytes(shape, dtype, batch) bytes, 256-byte aligned (sized for a max batch,
// it serves every smaller one). Returns the path taken (host-side choice; no device read).
size_t decode_step_workspace_bytes(const DecodeShape& shape, DecodeWeightDtype dtype, int batch);
DecodePath decode_step(const __nv_bfloat16* x, int batch, const DecodeShape& shape,
                       const __nv_bfloat16* router_w, const RouterParams& params,
                       const DecodeWeights& w1, const DecodeWeights& w2, int32_t* topk_ids,
                       float* topk_weights, __nv_bfloat16* out, void* workspace,
                       size_t workspace_bytes, cudaStream_t stream = nullptr);

// ---- one warp-decode step in ONE persistent kernel (small batches) -------------------------------
// decode_step_fused: decode_router + decode_gate_up (FP32 h) + decode_down of the warp path fused
// into one kernel whose CTAs (one per SM) meet at two grid barriers (docs/notes/decode.md, "fused
// step"). Same arguments and outputs as decode_step on its warp path: topk_ids [B, k],
// topk_weights [B, k] and out are bitwise those of the three kernels (every reduction order is
// theirs), deterministic and batch-invariant. It never takes the expert-centric path; the caller
// chooses it for 1 <= batch <= kDecodeFusedMaxBatch. Opt-in, not used by decode_step: run 63
// (H200, CUDA graphs, B = 1 / 2 / 8) measured it 1.04-1.11x the three kernels with BF16 weights on
// Qwen3-235B and DeepSeek-V3 (DeepSeek-V3 B = 1: 211 us = 88% of copy), 0.99-1.02x on Qwen3-30B,
// and with MXFP8 weights 1.09-1.20x on DeepSeek-V3 but 0.87-0.98x on the Qwen3 shapes.
// Requirements beyond the warp path's: num_experts <= kDecodeFusedMaxExperts; w1 and w2 of the
// same dtype, a shared expert in both or neither (shape.shared_expert says which);
// params.top_k == shape.top_k; x, out, topk_ids, topk_weights and the workspace pairwise disjoint
// (checked). MXFP8 weights need no prepared form.
// workspace: decode_step_fused_workspace_bytes(shape, batch) bytes (sized for a batch, it serves
// every smaller one), 256-byte aligned, holding the grid barrier's state, the logits and h. It must
// be initialised ONCE with decode_step_fused_init_workspace before its first fused step (and again
// if anything else writes into it); every step leaves the barrier state ready for the next, so CUDA
// graph replays need no reset. One workspace per stream: two steps running at the same time on one
// workspace corrupt each other (as they would through h on any path).
// Co-residency: the grid is exactly as many CTAs as the device holds at once (an occupancy query,
// cached per device; a device that cannot hold one CTA per SM throws). The kernel waits at its
// barriers for all of its CTAs, so two fused steps running concurrently on one device (two
// streams), or a device whose SMs are partitioned away (MPS limits, green contexts) can stall it:
// the barrier traps after 5 s instead of hanging (a launch failure, as for an uninitialised
// workspace). MXMOE_DECODE_FUSED_COOP=1 launches with cudaLaunchAttributeCooperative, where the
// driver guarantees co-residency (run once with PDL in bench_decode_split, bitwise equal; not in the
// tests: off by default).
// Launch: PDL as the other decode kernels (griddepcontrol.wait before x or the workspace is read
// or anything is written; before it, only an L2 prefetch of router_w).
// Switches (environment, read at every call; for A/B timing): MXMOE_DECODE_FUSED_WR_PREFETCH=0 and
// MXMOE_DECODE_FUSED_W2_PREFETCH=0 turn off the L2 prefetches of the router weights and of the
// first down rows; neither changes results.
inline constexpr int kDecodeFusedMaxBatch = 8;
inline constexpr int kDecodeFusedMaxExperts = 256;
size_t decode_step_fused_workspace_bytes(const DecodeShape& shape, int batch);
void decode_step_fused_init_workspace(void* workspace, size_t workspace_bytes, cudaStream_t stream = nullptr);
void decode_step_fused(const __nv_bfloat16* x, int batch, const DecodeShape& shape,
                       const __nv_bfloat16* router_w, const RouterParams& params, const DecodeWeights& w1,
                       const DecodeWeights& w2, int32_t* topk_ids, float* topk_weights, __nv_bfloat16* out,
                       void* workspace, size_t workspace_bytes, cudaStream_t stream = nullptr);

}  // namespace mxmoe
