// The expert part of the MoE layer (docs/notes/layer.md "Recipe", forward steps 5-7 and backward
// steps 2-6), shared by MoeLayer (all E experts, src/host/moe_layer.cpp) and EpMoeLayer (this
// rank's E/R experts, src/host/ep_moe_layer.cpp): the same launches on the same operands, so the
// two layers give the same bits for an expert whose rows, row order and padding agree.
// Internal to the library; buffers are carved from the caller's workspace.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "mxmoe/decode.h"

#include "mxmoe/gemm.h"
#include "mxmoe/moe_plan.h"
#include "mxmoe/quantize.h"

namespace mxmoe::detail {

// An MX copy in a workspace: data, scales, fast data, fast scales. fast_layout kBlock128 (weights,
// MoeLayerConfig::weight_fast_layout; the wgrad activations, activation_fast_layout): the quantizer
// writes the plain pair (out() gives only that), rebase_in_place makes the fast pair from it
// (fast == data: in place); or, for a column-wise activation copy, the quantizer writes the block
// form itself (block_out(), MXMOE_QUANT_COL_BLOCK=direct, ExpertBlock::act_col_out).
struct MxBuf {
  uint8_t *data = nullptr, *scales = nullptr, *fast = nullptr, *fast_scales = nullptr;
  FastScaleLayout fast_layout = FastScaleLayout::kRow128;
  MxOut out() const {
    if (fast_layout == FastScaleLayout::kBlock128) return MxOut{data, scales, nullptr, nullptr};
    return MxOut{data, scales, fast, fast_scales};
  }
  // A kBlock128 column-wise copy's block form, written by the quantizer (MxOut::fast_blocks).
  MxOut block_out() const {
    MxOut o;
    o.fast_data = fast;
    o.fast_scales = fast_scales;
    o.fast_blocks = true;
    return o;
  }
  MxOperand operand() const {
    MxOperand o{data, scales, fast, fast_scales};
    o.fast_scale_layout = fast_layout;
    return o;
  }
};

// Carves pieces of a workspace (256-byte aligned); with base == nullptr it only measures.
class Carver {
 public:
  explicit Carver(uint8_t* base) : base_(base) {}
  uint8_t* take(size_t n) {
    uint8_t* p = base_ ? base_ + off_ : nullptr;
    off_ += (n + 255) / 256 * 256;
    return p;
  }
  template <class T>
  T* take_n(size_t count) {
    return reinterpret_cast<T*>(take(count * sizeof(T)));
  }
  size_t bytes() const { return off_; }

 private:
  uint8_t* base_;
  size_t off_ = 0;
};

// An MX copy of [batch, rows, cols] in the one form a GEMM mode reads (fast: the rebased 1x128
// form, data [batch, rows, cols] + scales [batch, ceil(cols/128), rows]; exact: plain MX). The
// quantizers write only the pair that is given.
MxBuf mx_buf(Carver& c, GemmMode mode, int64_t batch, int64_t rows, int64_t cols);

// A copy [batch, rows, cols] in the 128x128-block fast form (fast mode): the plain pair,
// data [batch, rows, cols] + scales [batch, rows, cols/32], which the block rebase overwrites in
// place (fast = data), and the block scales [batch, ceil(cols/128), fast_block_scales_pitch(rows)].
// (A weight copy [E, N, K]; or a wgrad activation, batch 1, rows = H or I, cols = cap tokens.)
MxBuf mx_block_buf(Carver& c, int64_t batch, int64_t rows, int64_t cols);

// A kBlock128 copy's fast pair from its plain pair (rebase_mxfp8_fast_block128 in place, the shape
// the copy was carved with); a kRow128 copy is left as it is (the quantizer wrote its fast pair).
void rebase_in_place(const MxBuf& b, int64_t batch, int64_t rows, int64_t cols, cudaStream_t stream);

// MoeLayerConfig::weight_fast_layout against the GEMM mode (kBlock128: fast mode only); `ep`: the
// EP layer, which rejects kBlock128 (its GEMM2 and W1 dgrad may write through the row-scatter
// entry, which reads per-row scales only). Throws mxmoe::Error naming cfg.weight_fast_layout.
void check_weight_fast_layout(const char* fn, GemmMode mode, FastScaleLayout layout, bool ep);
// The same for MoeLayerConfig::activation_fast_layout (kBlock128: fast mode only; the EP layer
// rejects it: its x gather is its own and the form is not wired there). Names cfg.activation_fast_layout.
void check_activation_fast_layout(const char* fn, GemmMode mode, FastScaleLayout layout, bool ep);

// A routing plan's buffers (moe_plan.h) for `tokens` tokens of top_k slots over `experts` experts
// with `capacity` padded rows, and moe_plan's scratch (ws, ws_bytes).
void carve_plan(Carver& c, int64_t tokens, int top_k, int experts, int64_t capacity, MoePlan& plan,
                void*& ws, size_t& ws_bytes);

// Stage marks for profiling (MoeLayer::set_profiling); may be empty.
using StageMark = std::function<void(const char*)>;

// Per-stage timing with CUDA events (a reusable pool): restart() begins a record, mark(stage)
// ends a stage, times() waits for the last mark and returns (stage, ms) in order. Off: no-ops.
class StageTimer {
 public:
  explicit StageTimer(const char* owner) : owner_(owner) {}
  ~StageTimer();
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;
  bool on = false;
  void restart(cudaStream_t stream) {
    used_ = 0;
    mark("", stream);
  }
  void mark(const char* stage, cudaStream_t stream);  // "" = a start mark (not a stage)
  StageMark marker(cudaStream_t stream) {
    return [this, stream](const char* stage) { mark(stage, stream); };
  }
  std::vector<std::pair<std::string, float>> times() const;

 private:
  const char* owner_;
  std::vector<cudaEvent_t> events_;
  std::vector<std::string> names_;  // names_[i]: the stage that ends at events_[i] ("" for a start)
  size_t used_ = 0;
};

struct ExpertBlock {
  int64_t cap = 0, hidden = 0, inter = 0;  // padded rows (multiple of 128), H, I
  int experts = 0;                        // experts held here
  GemmMode mode = GemmMode::kFast;
  // Fast form of w1_row, w1_col, w2_row, w2_col (MoeLayerConfig::weight_fast_layout; kBlock128 in
  // fast mode only, with the y entry of the m-grouped GEMM: forward/backward's y_rows/dxp_rows null).
  FastScaleLayout weight_layout = FastScaleLayout::kRow128;
  // Fast form of x_col and h_col, the wgrad GEMMs' operand b (MoeLayerConfig::activation_fast_layout;
  // kBlock128 in fast mode only): the quantizers write their plain pair, rebase_x_col() (the caller,
  // after its gather-quantize) and forward() (after the Hact quantize) turn it into the block form.
  FastScaleLayout activation_layout = FastScaleLayout::kRow128;
  // X rows in the padded expert layout, both ways (the caller's gather-quantizer writes them)
  MxBuf x_row, x_col;
  MxBuf w1_row, w1_col, w2_row, w2_col, h_row, h_col, dy_row, dy_col, dgu_row, dgu_col;
  __nv_bfloat16 *gu = nullptr, *hact = nullptr, *y = nullptr, *dh = nullptr, *dgu = nullptr, *dxp = nullptr;
  float* row_w = nullptr;  // [cap]: routing weight of each padded row (dY = bf16(row_w · dout))
  MxOperand w1r_op, w1c_op, w2r_op, w2c_op;  // weight operands of the last forward
  // Exact mode: one scratch region for the BF16 images of the GEMM running now (A and B slots),
  // rewritten before every GEMM; stream order keeps the next GEMM's images from overwriting the
  // previous GEMM's operands while it runs. Null in fast mode. Sizes (elements): A holds X, dY
  // [cap, H] (or their transposes) or dGU [cap, 2I]; B holds W1 (2·E·I·H, either direction), W2
  // (E·H·I), or the wgrad operands Hact, X [I | H, cap].
  __nv_bfloat16 *img_a = nullptr, *img_b = nullptr;

  // The operand as the GEMM mode reads it: fast mode as it is; exact mode with its BF16 image,
  // made into `slot` from data/scales ([rows, cols]) unless the operand carries one (a
  // pre-quantized weight may: MxWeights). `layout`: the image's layout (kTokenBlocked for the
  // k-grouped wgrad operands, whose cols are the cap tokens, a multiple of 128).
  MxOperand gemm_operand(MxOperand o, int64_t rows, int64_t cols, __nv_bfloat16* slot, cudaStream_t stream,
                         ImageLayout layout = ImageLayout::kRowMajor) const;

  // mx_buf in this block's GEMM mode.
  MxBuf mx(Carver& c, int64_t batch, int64_t rows, int64_t cols) const;
  bool activation_blocks() const { return activation_layout == FastScaleLayout::kBlock128; }
  // With activation_blocks(), how this call makes x_col's and h_col's block form: true (the default,
  // MXMOE_QUANT_COL_BLOCK unset or "direct") the quantizer writes it (act_col_out); false ("rebase",
  // session 11's path) the quantizer writes the plain pair and rebase_in_place turns it into the
  // block form. Read on every call, so that one process can time both; any other value throws
  // mxmoe::Error naming the variable. Without activation blocks: false, and nothing is read.
  bool direct_col_blocks() const;
  // The column-wise output of x_col or h_col for a quantizer call (direct: direct_col_blocks()).
  static MxOut act_col_out(const MxBuf& b, bool direct) { return direct ? b.block_out() : b.out(); }
  // After the caller's gather-quantize of x: x_col [H, cap] to the block form (activation_blocks()
  // without direct_col_blocks(); otherwise nothing).
  void rebase_x_col(bool direct, cudaStream_t stream) const {
    if (!direct) rebase_in_place(x_col, 1, hidden, cap, stream);
  }
  void carve(Carver& c);  // every buffer above (cap, hidden, inter, experts, mode set before)

  // Quantize BF16 master weights w1 [experts, 2I, H], w2 [experts, H, I] both ways (kBlock128: to
  // plain MX, then each copy rebased to the block form in place); the operands of the next
  // forward/backward become these copies.
  void quantize_weights(const __nv_bfloat16* w1, const __nv_bfloat16* w2, cudaStream_t stream);
  // GEMM1 → SwiGLU + quantize → GEMM2: y [cap, H] from x_row (rows of expert e in
  // [padded_offsets[e], padded_offsets[e+1]); rows at or beyond padded_offsets[experts] untouched).
  // y_rows (EpMoeLayer's fused combine): [cap] row addresses; GEMM2 then writes row r to y_rows[r]
  // (null: not written) instead of y (m_grouped_mxfp8_gemm_nt_to_rows: the same bits).
  void forward(const int32_t* padded_offsets, cudaStream_t stream, const StageMark& mark,
               void* const* y_rows = nullptr) const;
  // From dy_row/dy_col (filled by the caller): dH, dW2, SwiGLU backward + quantize, dXp [cap, H], dW1.
  // dxp_rows: as y_rows, for dXp.
  void backward(const int32_t* padded_offsets, float* dw1, float* dw2, cudaStream_t stream, const StageMark& mark,
                void* const* dxp_rows = nullptr) const;
};

// The router's GEMMs (forward logits; backward dlogits, dWr, the router's part of dX), shared by
// both layers. batch_invariant: logits by the fixed-order kernel (moe_router_gemm_sm90.cu), whose
// per-token rows do not depend on the number of tokens; else cuBLAS (faster; its algorithm, and so
// its summation order, may change with T). dWr: the fixed-order kernel from BF16 x in both modes
// (launch_router_wgrad_fixed). The router's part of dX: when router_dgrad_in_combine(E, top_k),
// computed inside the un-permute (unpermute()) in the fixed kernel's order, in both modes; else a
// separate FP32 [T, H] (the fixed-order kernel, or cuBLAS when not batch_invariant) that the
// un-permute adds.
struct RouterBlock {
  int64_t max_tokens = 0;
  int hidden = 0, experts = 0, top_k = 0;
  bool batch_invariant = false;
  cublasHandle_t cublas = nullptr;  // owned: create() / destroy()
  float *logits = nullptr, *dlogits = nullptr, *wgrad_partials = nullptr;
  float *wr_f32 = nullptr, *dx_router = nullptr;  // the separate dX path only (else null)

  bool dgrad_in_unpermute() const;
  void carve(Carver& c);  // max_tokens, hidden, experts, top_k, batch_invariant set before
  void create();
  void destroy() noexcept;
  const char* logits_stage() const { return batch_invariant ? "router GEMM (batch-invariant)" : "router GEMM (cuBLAS)"; }
  // logits [tokens, E] = x [tokens, H] · wr [E, H]ᵀ, FP32
  void forward(const __nv_bfloat16* x, int64_t tokens, const __nv_bfloat16* wr, cudaStream_t stream) const;
  // dlogits from dw [tokens, k] (moe_router_backward), then dwr FP32 [E, H] = dlogitsᵀ · x and,
  // unless dgrad_in_unpermute(), dx_router FP32 [tokens, H] = dlogits · wr.
  void backward(const __nv_bfloat16* x, int64_t tokens, const __nv_bfloat16* wr, const int32_t* ids, const float* dw,
                const RouterParams& routing, float* dwr, cudaStream_t stream) const;
  // The layer's last step, after backward(): dx [tokens, H] = Σ_j rows[row_of[t, j]] (slot order,
  // FP32, rows outside [0, num_rows) skipped) + the router's part (dlogits · wr), rounded to BF16.
  void unpermute(const __nv_bfloat16* rows, int64_t num_rows, const int32_t* row_of, int64_t tokens,
                 const __nv_bfloat16* wr, __nv_bfloat16* dx, cudaStream_t stream) const;
};

}  // namespace mxmoe::detail
