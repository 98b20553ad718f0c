// The expert part of the MoE layer, shared by MoeLayer and EpMoeLayer (src/host/moe_expert_block.h).
#include "host/moe_expert_block.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "host/check.h"
#include "kernels/gemm/m_grouped_gemm_rows.h"
#include "kernels/layer/moe_ops_launch.h"
#include "mxmoe/dequantize.h"
#include "mxmoe/moe_ops.h"

namespace mxmoe::detail {

namespace {
int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// An m-grouped GEMM whose BF16 output goes to y, or row by row to rows[r] when rows is given.
void m_grouped_to(const MxOperand& a, int64_t m_total, const MxOperand& b, int experts, int64_t n, int64_t k,
                  const int32_t* offsets, void* y, void* const* rows, const GemmOptions& go) {
  if (rows != nullptr) m_grouped_mxfp8_gemm_nt_to_rows(a, m_total, b, experts, n, k, offsets, rows, go);
  else m_grouped_mxfp8_gemm_nt(a, m_total, b, experts, n, k, offsets, y, go);
}

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw CudaError(std::string("mxmoe::MoeLayer: ") + what + ": cuBLAS status " + std::to_string(int(s)));
}
}  // namespace

StageTimer::~StageTimer() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

void StageTimer::mark(const char* stage, cudaStream_t stream) {
  if (!on) return;
  if (used_ == events_.size()) {
    cudaEvent_t e;
    MXMOE_CUDA_CHECK(owner_, cudaEventCreate(&e));
    events_.push_back(e);
    names_.emplace_back();
  }
  names_[used_] = stage;
  MXMOE_CUDA_CHECK(owner_, cudaEventRecord(events_[used_++], stream));
}

std::vector<std::pair<std::string, float>> StageTimer::times() const {
  std::vector<std::pair<std::string, float>> out;
  if (used_ == 0) return out;
  MXMOE_CUDA_CHECK(owner_, cudaEventSynchronize(events_[used_ - 1]));
  for (size_t i = 1; i < used_; ++i) {
    if (names_[i].empty()) continue;  // a start mark (backward's first)
    float ms = 0.0f;
    MXMOE_CUDA_CHECK(owner_, cudaEventElapsedTime(&ms, events_[i - 1], events_[i]));
    out.emplace_back(names_[i], ms);
  }
  return out;
}

void carve_plan(Carver& c, int64_t tokens, int top_k, int experts, int64_t capacity, MoePlan& plan,
                void*& ws, size_t& ws_bytes) {
  plan.counts = c.take_n<int32_t>(size_t(experts));
  plan.offsets = c.take_n<int32_t>(size_t(experts + 1));
  plan.padded_offsets = c.take_n<int32_t>(size_t(experts + 1));
  plan.row_of = c.take_n<int32_t>(size_t(tokens * top_k));
  plan.row_index = c.take_n<int32_t>(size_t(capacity));
  ws_bytes = moe_plan_workspace_bytes(tokens, top_k, experts);
  ws = c.take(ws_bytes);
}

MxBuf mx_buf(Carver& c, GemmMode mode, int64_t batch, int64_t rows, int64_t cols) {
  MxBuf b;
  if (mode == GemmMode::kFast) {
    b.fast = c.take(size_t(batch * rows * cols));
    b.fast_scales = c.take(size_t(batch * cdiv(cols, 128) * rows));
  } else {
    b.data = c.take(size_t(batch * rows * cols));
    b.scales = c.take(size_t(batch * rows * cols / 32));
  }
  return b;
}

MxBuf mx_block_buf(Carver& c, int64_t batch, int64_t rows, int64_t cols) {
  MxBuf b;
  b.data = b.fast = c.take(size_t(batch * rows * cols));
  b.scales = c.take(size_t(batch * rows * cols / 32));
  b.fast_scales = c.take(size_t(batch * cdiv(cols, 128) * fast_block_scales_pitch(rows)));
  b.fast_layout = FastScaleLayout::kBlock128;
  return b;
}

void rebase_in_place(const MxBuf& b, int64_t batch, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (b.fast_layout == FastScaleLayout::kBlock128)
    rebase_mxfp8_fast_block128(b.data, b.scales, batch, rows, cols, b.fast, b.fast_scales, stream);
}

namespace {
// A layer's FastScaleLayout field `arg` (kBlock128: fast mode only); ep_reason: why the EP layer
// rejects kBlock128 (null: not the EP layer). `what` names the operands in the messages.
void check_fast_layout(const char* fn, const char* arg, const char* what, GemmMode mode, FastScaleLayout layout,
                       const char* ep_reason) {
  if (layout == FastScaleLayout::kRow128) return;
  if (layout != FastScaleLayout::kBlock128)
    throw_arg(fn, arg, to_str(int(layout)), "must be FastScaleLayout::kRow128 or kBlock128");
  if (ep_reason != nullptr)
    throw_arg(fn, arg, "kBlock128",
              std::string("the EP layer supports FastScaleLayout::kRow128 only (") + ep_reason +
                  "); use MoeLayer for 128x128-block " + what);
  if (mode != GemmMode::kFast)
    throw_arg(fn, arg, "kBlock128",
              std::string("128x128-block ") + what +
                  " are a fast-mode form: use GemmMode::kFast, or kRow128 with GemmMode::kExact");
}
}  // namespace

void check_weight_fast_layout(const char* fn, GemmMode mode, FastScaleLayout layout, bool ep) {
  check_fast_layout(fn, "cfg.weight_fast_layout", "weights", mode, layout,
                    ep ? "its GEMM2 and W1 dgrad write through the row-scatter GEMM entry, which reads per-row "
                         "fast scales"
                       : nullptr);
}

void check_activation_fast_layout(const char* fn, GemmMode mode, FastScaleLayout layout, bool ep) {
  check_fast_layout(fn, "cfg.activation_fast_layout", "wgrad activations", mode, layout,
                    ep ? "the block rebase of its dispatched x is not wired" : nullptr);
}

bool ExpertBlock::direct_col_blocks() const {
  if (!activation_blocks()) return false;
  const char* e = std::getenv("MXMOE_QUANT_COL_BLOCK");
  if (e == nullptr || *e == 0 || std::strcmp(e, "direct") == 0) return true;
  if (std::strcmp(e, "rebase") == 0) return false;
  throw_arg("MoeLayer", "MXMOE_QUANT_COL_BLOCK", e,
            "must be direct (default: the quantizer writes the 128x128-block form) or rebase (plain copy, then "
            "rebase_mxfp8_fast_block128)");
}

MxBuf ExpertBlock::mx(Carver& c, int64_t batch, int64_t rows, int64_t cols) const {
  return mx_buf(c, mode, batch, rows, cols);
}

void ExpertBlock::carve(Carver& c) {
  const int64_t H = hidden, I = inter, E = experts;
  // The wgrad operands b (x_col, h_col): [rows, cap], per row or in 128x128 blocks
  auto wgrad_b = [&](int64_t rows) { return activation_blocks() ? mx_block_buf(c, 1, rows, cap) : mx(c, 1, rows, cap); };
  x_row = mx(c, 1, cap, H);
  x_col = wgrad_b(H);
  const bool blocks = weight_layout == FastScaleLayout::kBlock128;  // fast mode (checked by the layers)
  auto weight = [&](int64_t rows, int64_t cols) {
    return blocks ? mx_block_buf(c, E, rows, cols) : mx(c, E, rows, cols);
  };
  w1_row = weight(2 * I, H);
  w1_col = weight(H, 2 * I);
  w2_row = weight(H, I);
  w2_col = weight(I, H);
  gu = c.take_n<__nv_bfloat16>(size_t(cap * 2 * I));
  hact = c.take_n<__nv_bfloat16>(size_t(cap * I));
  h_row = mx(c, 1, cap, I);
  h_col = wgrad_b(I);
  y = c.take_n<__nv_bfloat16>(size_t(cap * H));
  row_w = c.take_n<float>(size_t(cap));
  dy_row = mx(c, 1, cap, H);
  dy_col = mx(c, 1, H, cap);
  dh = c.take_n<__nv_bfloat16>(size_t(cap * I));
  dgu = c.take_n<__nv_bfloat16>(size_t(cap * 2 * I));
  dgu_row = mx(c, 1, cap, 2 * I);
  dgu_col = mx(c, 1, 2 * I, cap);
  dxp = c.take_n<__nv_bfloat16>(size_t(cap * H));
  if (mode == GemmMode::kExact) {
    const int64_t a_max = cap * std::max(H, 2 * I), b_max = std::max(2 * E * I * H, cap * std::max(H, I));
    img_a = c.take_n<__nv_bfloat16>(size_t(a_max));
    img_b = c.take_n<__nv_bfloat16>(size_t(b_max));
  }
}

MxOperand ExpertBlock::gemm_operand(MxOperand o, int64_t rows, int64_t cols, __nv_bfloat16* slot,
                                    cudaStream_t stream, ImageLayout layout) const {
  if (mode != GemmMode::kExact || o.image != nullptr) return o;
  if (layout == ImageLayout::kTokenBlocked)
    dequantize_mxfp8_bf16_token_blocked(o.data, o.scales, rows, cols, slot, stream);
  else
    dequantize_mxfp8_bf16(o.data, o.scales, rows, cols, slot, stream);
  o.image = slot;
  o.image_layout = layout;
  return o;
}

void ExpertBlock::quantize_weights(const __nv_bfloat16* w1, const __nv_bfloat16* w2, cudaStream_t stream) {
  const int64_t H = hidden, I = inter;
  if (weight_layout == FastScaleLayout::kBlock128) {
    // BF16 straight to the block form, both ways in one pass per tensor (quantize_mxfp8_block128:
    // bitwise the plain copy rebased by rebase_mxfp8_fast_block128, without writing it)
    const MxBlockOut w1r{w1_row.fast, w1_row.fast_scales}, w1c{w1_col.fast, w1_col.fast_scales};
    const MxBlockOut w2r{w2_row.fast, w2_row.fast_scales}, w2c{w2_col.fast, w2_col.fast_scales};
    quantize_mxfp8_block128(w1, experts, 2 * I, H, &w1r, &w1c, ScaleMode::kRceil, stream);
    quantize_mxfp8_block128(w2, experts, H, I, &w2r, &w2c, ScaleMode::kRceil, stream);
  } else {
    const MxOut w1r = w1_row.out(), w1c = w1_col.out(), w2r = w2_row.out(), w2c = w2_col.out();
    quantize_mxfp8(w1, experts, 2 * I, H, &w1r, &w1c, ScaleMode::kRceil, stream);
    quantize_mxfp8(w2, experts, H, I, &w2r, &w2c, ScaleMode::kRceil, stream);
  }
  w1r_op = w1_row.operand();
  w1c_op = w1_col.operand();
  w2r_op = w2_row.operand();
  w2c_op = w2_col.operand();
}

void ExpertBlock::forward(const int32_t* padded_offsets, cudaStream_t stream, const StageMark& mark,
                          void* const* y_rows) const {
  const int64_t H = hidden, I = inter;
  const int32_t* rows_used = padded_offsets + experts;
  GemmOptions go;  // fast_tile_n 0, the library's choice: 192 wide, which block-form weights need
  go.mode = mode;
  go.stream = stream;
  // GEMM1: GU [cap, 2I] = x_p · W1[e]ᵀ
  m_grouped_mxfp8_gemm_nt(gemm_operand(x_row.operand(), cap, H, img_a, stream), cap,
                          gemm_operand(w1r_op, experts * 2 * I, H, img_b, stream), experts, 2 * I, H, padded_offsets,
                          gu, go);
  mark("GEMM1 (gate/up)");
  // SwiGLU, then quantize both ways over the used rows (pad rows are exact zeros)
  moe_swiglu(gu, cap, I, rows_used, hact, stream);
  // (activation blocks: Hactᵀ [I, cap] in the block form, written directly or rebased after)
  const bool direct = direct_col_blocks();
  const MxOut hr = h_row.out(), hc = act_col_out(h_col, direct);
  quantize_mxfp8_grouped(hact, cap, I, padded_offsets, padded_offsets, experts, cap, &hr, &hc, ScaleMode::kRceil,
                         stream);
  if (!direct) rebase_in_place(h_col, 1, I, cap, stream);
  mark(!activation_blocks() ? "SwiGLU + quantize"
       : direct             ? "SwiGLU + quantize (Hact col-wise in 128x128 blocks)"
                            : "SwiGLU + quantize + 128x128-block rebase of Hact col-wise");
  // GEMM2: Y [cap, H] = Hact · W2[e]ᵀ (to y, or to the rows' combine slots)
  m_grouped_to(gemm_operand(h_row.operand(), cap, I, img_a, stream), cap,
               gemm_operand(w2r_op, experts * H, I, img_b, stream), experts, H, I, padded_offsets, y, y_rows, go);
  mark(y_rows ? "GEMM2 (down) + rows to owners" : "GEMM2 (down)");
}

void ExpertBlock::backward(const int32_t* padded_offsets, float* dw1, float* dw2, cudaStream_t stream,
                           const StageMark& mark, void* const* dxp_rows) const {
  const int64_t H = hidden, I = inter;
  const int32_t* rows_used = padded_offsets + experts;
  GemmOptions go;
  go.mode = mode;
  go.stream = stream;
  GemmOptions go32 = go;
  go32.out_dtype = GemmOutDtype::kFP32;
  // Exact mode's wgrad images are token-blocked (dequantize.h; gemm.h, k-grouped): same values and
  // bits of dW as row-major ones, without a memory page per image row in every token window.
  constexpr ImageLayout kWgradImage = ImageLayout::kTokenBlocked;
  // dH [cap, I] = dY · W2[e] (B = col(W2) [E, I, H]);  dW2[e] = Σ dYᵀ · Hact
  m_grouped_mxfp8_gemm_nt(gemm_operand(dy_row.operand(), cap, H, img_a, stream), cap,
                          gemm_operand(w2c_op, experts * I, H, img_b, stream), experts, I, H, padded_offsets, dh, go);
  k_grouped_mxfp8_gemm_nt(gemm_operand(dy_col.operand(), H, cap, img_a, stream, kWgradImage),
                          gemm_operand(h_col.operand(), I, cap, img_b, stream, kWgradImage), cap, experts, H, I,
                          padded_offsets, dw2, go32);
  mark("bwd: W2 dgrad + wgrad GEMMs");
  // SwiGLU backward, quantize dGU both ways
  moe_swiglu_backward(gu, dh, cap, I, rows_used, dgu, stream);
  const MxOut gr = dgu_row.out(), gc = dgu_col.out();
  quantize_mxfp8_grouped(dgu, cap, 2 * I, padded_offsets, padded_offsets, experts, cap, &gr, &gc, ScaleMode::kRceil,
                         stream);
  mark("bwd: SwiGLU backward + quantize");
  // dXp [cap, H] = dGU · W1[e] (B = col(W1) [E, H, 2I]; to dxp, or to the rows' combine slots);
  // dW1[e] = Σ dGUᵀ · Xp
  m_grouped_to(gemm_operand(dgu_row.operand(), cap, 2 * I, img_a, stream), cap,
               gemm_operand(w1c_op, experts * H, 2 * I, img_b, stream), experts, H, 2 * I, padded_offsets, dxp,
               dxp_rows, go);
  k_grouped_mxfp8_gemm_nt(gemm_operand(dgu_col.operand(), 2 * I, cap, img_a, stream, kWgradImage),
                          gemm_operand(x_col.operand(), H, cap, img_b, stream, kWgradImage), cap, experts, 2 * I, H,
                          padded_offsets, dw1, go32);
  mark(dxp_rows ? "bwd: W1 dgrad (+ rows to owners) + wgrad GEMMs" : "bwd: W1 dgrad + wgrad GEMMs");
}

bool RouterBlock::dgrad_in_unpermute() const { return router_dgrad_in_combine(experts, top_k); }

void RouterBlock::carve(Carver& c) {
  const int64_t T = max_tokens, H = hidden, E = experts;
  logits = c.take_n<float>(size_t(T * E));
  dlogits = c.take_n<float>(size_t(T * E));
  wgrad_partials = c.take_n<float>(router_wgrad_partial_floats(T, int(E), int(H)));
  const bool separate = !dgrad_in_unpermute();
  wr_f32 = separate && !batch_invariant ? c.take_n<float>(size_t(E * H)) : nullptr;
  dx_router = separate ? c.take_n<float>(size_t(T * H)) : nullptr;
}

void RouterBlock::create() { check_cublas(cublasCreate(&cublas), "cublasCreate"); }

void RouterBlock::destroy() noexcept {
  if (cublas) cublasDestroy(cublas);
  cublas = nullptr;
}

void RouterBlock::forward(const __nv_bfloat16* x, int64_t tokens, const __nv_bfloat16* wr, cudaStream_t stream) const {
  const int64_t H = hidden, E = experts;
  if (batch_invariant) {
    launch_router_logits_fixed(reinterpret_cast<const uint16_t*>(x), reinterpret_cast<const uint16_t*>(wr), tokens,
                               int(E), int(H), logits, stream);
    return;
  }
  // column-major C[E, T] = op(Wr)[E, H] · X[H, T]
  const float one = 1.0f, zero = 0.0f;
  check_cublas(cublasSetStream(cublas, stream), "cublasSetStream");
  check_cublas(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, int(E), int(tokens), int(H), &one, wr, CUDA_R_16BF,
                            int(H), x, CUDA_R_16BF, int(H), &zero, logits, CUDA_R_32F, int(E), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT),
               "router GEMM");
}

void RouterBlock::backward(const __nv_bfloat16* x, int64_t tokens, const __nv_bfloat16* wr, const int32_t* ids,
                           const float* dw, const RouterParams& routing, float* dwr, cudaStream_t stream) const {
  const int64_t H = hidden, E = experts, T = tokens;
  moe_router_backward(logits, ids, dw, T, int(E), routing, dlogits, stream);
  launch_router_wgrad_fixed(dlogits, reinterpret_cast<const uint16_t*>(x), T, int(E), int(H), wgrad_partials, dwr,
                            stream);
  if (dgrad_in_unpermute()) return;  // unpermute() makes it
  if (batch_invariant) {
    launch_router_dgrad_fixed(dlogits, reinterpret_cast<const uint16_t*>(wr), T, int(E), int(H), dx_router, stream);
    return;
  }
  // column-major: dXr_cm [H, T] = Wr_cm [H, E] · dlogits_cm [E, T]
  launch_bf16_to_f32(reinterpret_cast<const uint16_t*>(wr), E * H, wr_f32, stream);
  const float one = 1.0f, zero = 0.0f;
  check_cublas(cublasSetStream(cublas, stream), "cublasSetStream");
  check_cublas(cublasSgemm(cublas, CUBLAS_OP_N, CUBLAS_OP_N, int(H), int(T), int(E), &one, wr_f32, int(H), dlogits,
                           int(E), &zero, dx_router, int(H)),
               "router dgrad GEMM");
}

void RouterBlock::unpermute(const __nv_bfloat16* rows, int64_t num_rows, const int32_t* row_of, int64_t tokens,
                            const __nv_bfloat16* wr, __nv_bfloat16* dx, cudaStream_t stream) const {
  if (!dgrad_in_unpermute()) {
    moe_combine(rows, num_rows, hidden, row_of, nullptr, tokens, top_k, dx_router, dx, stream);
    return;
  }
  launch_moe_combine_router_dgrad(reinterpret_cast<const uint16_t*>(rows), num_rows, hidden, row_of, nullptr, tokens,
                                  top_k, dlogits, reinterpret_cast<const uint16_t*>(wr), experts,
                                  reinterpret_cast<uint16_t*>(dx), stream);
}

}  // namespace mxmoe::detail
