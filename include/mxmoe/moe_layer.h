// The MXFP8 MoE training layer (DESIGN.md §3; recipe: docs/notes/layer.md): forward and backward.
//
//   out [T, H] = Σ_j w[t, j] · W2[e_j] · SwiGLU(W1[e_j] · x[t])   (top-k routing of x·Wrᵀ)
//
// The layer object owns a device workspace sized at construction for max_tokens tokens and the
// worst-case routing (capacity roundup(T·k + E·127, 128) rows), so a step never asks the host for
// token counts: forward() is a fixed sequence of launches on `stream` (cuBLAS router GEMM, top-k,
// routing plan, gather + quantize of x, weight quantization both ways, m-grouped GEMM1, SwiGLU,
// quantization, m-grouped GEMM2, combine), capturable in a CUDA graph and bitwise deterministic.
//
// Inputs (device, row-major, 16-byte aligned): x BF16 [T, H]; BF16 master weights wr [E, H],
// w1 [E, 2I, H] (rows [0, I) gate, [I, 2I) up), w2 [E, H, I]; out BF16 [T, H].
// Requirements (checked at construction / call, mxmoe::Error naming the argument): H and I
// multiples of 32; 1 <= E <= 512; 1 <= top_k <= min(32, E); 1 <= T <= max_tokens;
// weight_fast_layout and activation_fast_layout kRow128, or kBlock128 in fast mode.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "mxmoe/decode.h"
#include "mxmoe/error.h"
#include "mxmoe/gemm.h"

namespace mxmoe {

struct MoeLayerConfig {
  int hidden = 0, inter = 0, num_experts = 0;
  RouterParams routing;             // scoring, top_k, groups, scaling (bias: device pointer or null)
  // GEMM mode: kFast (default) or kExact. Exact mode quantizes to plain MX and makes each GEMM's
  // BF16 operand images (dequantize_mxfp8_bf16) right before the GEMM, into one scratch region
  // reused by all six GEMMs: the workspace grows by 2·(cap·max(H, 2I) + max(2·E·I·H, cap·max(H, I)))
  // bytes (cap = capacity()), and each step spends one bandwidth-bound pass (3 bytes per element)
  // per GEMM operand on the images (the GEMM1/GEMM2/backward stages' times include it).
  GemmMode mode = GemmMode::kFast;
  int64_t max_tokens = 0;           // workspace sized for up to this many tokens
  // Router logits and the router's part of dX by a fixed-order FP32 kernel whose per-token result
  // does not depend on the number of tokens (cuBLAS may choose another algorithm, hence another
  // summation order, for another T). Slower (a plain tiled SGEMM); what EpMoeLayer always uses, so
  // a single-GPU layer compared bitwise with the EP layer must set it. (When E <= 4·(2·top_k + 2)
  // the router's part of dX is computed inside the un-permute in the fixed-order kernel's order in
  // both settings; dWr is a fixed-order sum in both.)
  bool batch_invariant_router = false;
  // Fast form of the expert weights the m-grouped GEMMs read as operand b (gemm.h FastScaleLayout):
  // the four weight operands, i.e. GEMM1 and GEMM2 with the row-wise copies of W1 and W2 and the two
  // dgrad GEMMs with the column-wise copies. kRow128 (default): DESIGN §2's per-row fast form,
  // written by the quantizer. kBlock128: each step quantizes the weights to plain MX both ways
  // (quantize_mxfp8), then re-expresses each of the four copies per 128x128 block in place
  // (rebase_mxfp8_fast_block128: one extra read + write of the FP8 weights per copy), and the four
  // GEMMs run on the 128 x 192 tile with one scale byte per block (docs/notes/gemm.md "Run 80":
  // 1.19-1.28x the per-row form's speed on every model shape; docs/notes/layer.md "Block-form
  // weights (session 11)"). A deviation from DESIGN §2's per-row form (a block's rows share the
  // largest exponent of the block, so elements far below it lose more bits), hence opt-in; its
  // error against the FP64 reference is checked with the fast mode's bounds in
  // tests/gpu/test_moe_layer_gpu.cpp (MoeLayerGpu.BlockWeights*). Workspace: the block scales and
  // the plain copies' scales instead of the per-row fast scales, net +3/128 byte per weight element
  // of the four copies (2·3·E·I·H elements; DeepSeek-V3 EP8-local, E = 32: +66 MB). Fast mode only:
  // kBlock128 with GemmMode::kExact throws mxmoe::Error naming cfg.weight_fast_layout. Applies to
  // the weights the layer quantizes; pre-quantized MxWeights carry their own layout per operand.
  FastScaleLayout weight_fast_layout = FastScaleLayout::kRow128;
  // Fast form of the activations the two wgrad GEMMs (k_grouped_mxfp8_gemm_nt) read as operand b:
  // the column-wise copies of X (dW1 = Σ dGUᵀ·X, b = Xᵀ [H, cap]) and of Hact (dW2 = Σ dYᵀ·Hact,
  // b = Hactᵀ [I, cap]), cap = capacity(). kRow128 (default): DESIGN §2's per-row fast form, written
  // by the quantizer. kBlock128: the gather-quantize of x and the quantize after SwiGLU write those
  // two copies as plain MX (their row-wise copies stay fast-only; one call per tensor, on the staged
  // quantizer with a form per direction, quantize_mxfp8_sm90.cu), and each is re-expressed
  // per 128x128 block (128 rows x 128 tokens) in place right after its quantization
  // (rebase_mxfp8_fast_block128 with batch 1 over all cap columns: one extra read + write of the
  // copy; the forward's "permute + quantize x" and "SwiGLU + quantize" stages include it and say so).
  // The wgrad GEMMs then run on the 128 x 192 block tile (docs/notes/gemm.md "Run 83": 1.26-1.49x the
  // per-row form's speed, the same error; docs/notes/layer.md "Block-form weights (session 11)").
  // Forward outputs, dx, dw and dWr are unchanged bit for bit; only dW1 and dW2 change. A deviation
  // from DESIGN §2's per-row form (a block's rows share the largest exponent of the block), hence
  // opt-in; its error against the FP64 reference is checked with the fast mode's bounds in
  // tests/gpu/test_moe_layer_gpu.cpp (MoeLayerGpu.BlockWeights*). Workspace: the plain copies' scales
  // and the block scales instead of the per-row fast scales, net +3/128 byte per element of the two
  // copies ((H + I)·cap elements; DeepSeek-V3 EP8-local at T = 16384: +29 MB). Fast mode only:
  // kBlock128 with GemmMode::kExact throws mxmoe::Error naming cfg.activation_fast_layout.
  // Independent of weight_fast_layout.
  FastScaleLayout activation_fast_layout = FastScaleLayout::kRow128;
};

// A weight tensor [E, N, K] already quantized both ways, as quantize_mxfp8(w, E, N, K, &row, &col)
// writes it: rowwise = MX of W[e] ([E, N, K], fast scales [E, ceil(K/128), N]) for the forward GEMM,
// colwise = MX of W[e]ᵀ ([E, K, N], fast scales [E, ceil(N/128), K]) for the dgrad GEMM. The layer's
// GEMM mode reads the matching form: fast_data + fast_scales; in exact mode the BF16 image when
// given (e.g. made once with dequantize_mxfp8_bf16 and reused across steps), else data + scales,
// from which the layer makes the image before each GEMM. Fast mode also takes any of the four
// operands in the 128x128-block form (fast_scale_layout = FastScaleLayout::kBlock128, whatever
// cfg.weight_fast_layout says): fast_data from rebase_mxfp8_fast_block128 (quantize.h) of that
// copy, fast_scales E8M0 [E, ceil(K/128), fast_block_scales_pitch(N)] for a copy [E, N, K]
// (rowwise: N = the weight's rows; colwise [E, K, N]: its columns), both 16-byte aligned.
// Exact mode rejects kBlock128 (mxmoe::Error naming "<w1|w2>.<rowwise|colwise>.fast_scale_layout").
struct MxWeights {
  MxOperand rowwise, colwise;
};

class MoeLayer {
 public:
  explicit MoeLayer(const MoeLayerConfig& cfg);  // validates, allocates the workspace
  ~MoeLayer();
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  void forward(const __nv_bfloat16* x, int64_t tokens, const __nv_bfloat16* wr, const __nv_bfloat16* w1,
               const __nv_bfloat16* w2, __nv_bfloat16* out, cudaStream_t stream = nullptr);
  // The same with pre-quantized expert weights (no weight quantization in the step); they must stay
  // valid and unchanged until the matching backward.
  void forward(const __nv_bfloat16* x, int64_t tokens, const __nv_bfloat16* wr, const MxWeights& w1,
               const MxWeights& w2, __nv_bfloat16* out, cudaStream_t stream = nullptr);

  // Backward of the last forward (same x and weights): dout BF16 [T, H] →
  //   dx BF16 [T, H]; dwr FP32 [E, H]; dw1 FP32 [E, 2I, H]; dw2 FP32 [E, H, I] (all overwritten).
  // Weight gradients come from the k-grouped MXFP8 GEMMs; the router's from FP32 cuBLAS GEMMs on
  // the BF16 x and wr. Deterministic; no host synchronisation.
  void backward(const __nv_bfloat16* dout, const __nv_bfloat16* x, const __nv_bfloat16* wr, __nv_bfloat16* dx,
                float* dwr, float* dw1, float* dw2, cudaStream_t stream = nullptr);

  // Per-stage timing with CUDA events, for benchmarks: when on, forward() starts a new record and
  // forward()/backward() mark every stage; stage_times() waits for the last mark and returns
  // (stage, milliseconds) in order. Eager runs only: leave it off while capturing a CUDA graph.
  void set_profiling(bool on);
  std::vector<std::pair<std::string, float>> stage_times() const;

  // State of the last forward (device pointers into the workspace), e.g. for tests and backward.
  const int32_t* topk_ids() const;        // [T, k]
  const float* topk_weights() const;      // [T, k]
  const float* topk_weight_grads() const; // [T, k] d loss / d w of the last backward
  const float* router_logit_grads() const;  // [T, E] d loss / d logits of the last backward
  const int32_t* row_of() const;          // [T, k] padded row of (t, j)
  const int32_t* padded_offsets() const;  // [E+1]
  int64_t capacity() const;               // padded rows of the workspace
  size_t workspace_bytes() const;

  struct Impl;

 private:
  Impl* impl_;
};

}  // namespace mxmoe
