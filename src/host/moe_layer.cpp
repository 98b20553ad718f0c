// The MoE layer's forward: host orchestration of the kernels, in one stream, no host sync.
// Workspace: one cudaMalloc arena, carved once at construction (256-byte aligned pieces).
#include "mxmoe/moe_layer.h"

#include <string>
#include <vector>

#include "host/check.h"
#include "host/moe_expert_block.h"
#include "kernels/layer/moe_ops_launch.h"
#include "mxmoe/moe_ops.h"
#include "mxmoe/moe_plan.h"
#include "mxmoe/quantize.h"

namespace mxmoe {

using detail::throw_arg;
using detail::to_str;

struct MoeLayer::Impl {
  MoeLayerConfig cfg;
  int64_t cap = 0;
  size_t bytes = 0;
  uint8_t* arena = nullptr;
  int32_t* ids = nullptr;
  float* weights = nullptr;
  MoePlan plan;
  void* plan_ws = nullptr;
  size_t plan_ws_bytes = 0;
  detail::ExpertBlock blk;  // the expert GEMMs and their buffers
  int64_t tokens = 0;  // of the last forward

  void run_forward(const __nv_bfloat16* x, int64_t tokens, const __nv_bfloat16* wr, __nv_bfloat16* out,
                   cudaStream_t stream, bool quantize_weights, const __nv_bfloat16* w1, const __nv_bfloat16* w2);
  detail::StageTimer timer{"MoeLayer"};  // profiling
  void mark(const char* stage, cudaStream_t stream) { timer.mark(stage, stream); }
  detail::StageMark marker(cudaStream_t stream) { return timer.marker(stream); }
  // backward
  float* dw = nullptr;
  detail::RouterBlock router;

  // Carves (or, with base == nullptr, only measures) the workspace.
  size_t carve(uint8_t* base) {
    detail::Carver c(base);
    const int64_t T = cfg.max_tokens, H = cfg.hidden, E = cfg.num_experts, k = cfg.routing.top_k;
    ids = c.take_n<int32_t>(size_t(T * k));
    weights = c.take_n<float>(size_t(T * k));
    detail::carve_plan(c, T, int(k), int(E), cap, plan, plan_ws, plan_ws_bytes);
    blk.cap = cap;
    blk.hidden = H;
    blk.inter = cfg.inter;
    blk.experts = int(E);
    blk.mode = cfg.mode;
    blk.weight_layout = cfg.weight_fast_layout;
    blk.activation_layout = cfg.activation_fast_layout;
    blk.carve(c);
    dw = c.take_n<float>(size_t(T * k));
    router.max_tokens = T;
    router.hidden = int(H);
    router.experts = int(E);
    router.top_k = int(k);
    router.batch_invariant = cfg.batch_invariant_router;
    router.carve(c);
    return c.bytes();
  }
};

MoeLayer::MoeLayer(const MoeLayerConfig& cfg) : impl_(new Impl) {
  const char* fn = "MoeLayer";
  try {
    if (cfg.hidden < 32 || cfg.hidden % 32 != 0 || cfg.hidden > (1 << 16))
      throw_arg(fn, "cfg.hidden", to_str(cfg.hidden), "must be a multiple of 32 in [32, 65536]");
    if (cfg.inter < 32 || cfg.inter % 32 != 0 || cfg.inter > (1 << 16))
      throw_arg(fn, "cfg.inter", to_str(cfg.inter), "must be a multiple of 32 in [32, 65536]");
    if (cfg.num_experts < 1 || cfg.num_experts > kMaxGemmExperts)
      throw_arg(fn, "cfg.num_experts", to_str(cfg.num_experts), "must be in [1, " + to_str(kMaxGemmExperts) + "]");
    if (cfg.routing.top_k < 1 || cfg.routing.top_k > 32 || cfg.routing.top_k > cfg.num_experts)
      throw_arg(fn, "cfg.routing.top_k", to_str(cfg.routing.top_k), "must be in [1, min(32, num_experts)]");
    if (cfg.max_tokens < 1 || cfg.max_tokens > (int64_t(1) << 24))
      throw_arg(fn, "cfg.max_tokens", to_str(cfg.max_tokens), "must be in [1, 2^24]");
    if (cfg.mode != GemmMode::kFast && cfg.mode != GemmMode::kExact)
      throw_arg(fn, "cfg.mode", to_str(int(cfg.mode)), "must be GemmMode::kFast or GemmMode::kExact");
    detail::check_weight_fast_layout(fn, cfg.mode, cfg.weight_fast_layout, false);
    detail::check_activation_fast_layout(fn, cfg.mode, cfg.activation_fast_layout, false);
    impl_->cfg = cfg;
    impl_->cap = moe_plan_capacity(cfg.max_tokens, cfg.routing.top_k, cfg.num_experts);
    impl_->bytes = impl_->carve(nullptr);
    MXMOE_CUDA_CHECK(fn, cudaMalloc(&impl_->arena, impl_->bytes));
    impl_->carve(impl_->arena);
    impl_->router.create();
  } catch (...) {
    if (impl_->arena) cudaFree(impl_->arena);
    delete impl_;
    throw;
  }
}

MoeLayer::~MoeLayer() {
  impl_->router.destroy();
  if (impl_->arena) cudaFree(impl_->arena);
  delete impl_;
}

namespace {

void check_forward_inputs(const char* fn, const MoeLayerConfig& c, const __nv_bfloat16* x, int64_t tokens,
                          const __nv_bfloat16* wr, const __nv_bfloat16* out) {
  if (tokens < 1 || tokens > c.max_tokens)
    throw_arg(fn, "tokens", to_str(tokens), "must be in [1, max_tokens = " + to_str(c.max_tokens) + "]");
  detail::check_device_ptrs(fn, {{"x", x}, {"wr", wr}, {"out", out}});
}

// A pre-quantized weight operand must carry the pair the GEMM mode reads, 16-byte aligned; in exact
// mode a BF16 image (then used as it is) instead of data + scales will do. Fast scales per row or
// per 128x128 block (fast mode only; either layout's rows are 16-byte multiples, so the same checks).
void check_weight_operand(const char* fn, const std::string& name, const MxOperand& o, GemmMode mode) {
  const bool fast = mode == GemmMode::kFast;
  const std::string layout = name + ".fast_scale_layout";
  if (o.fast_scale_layout != FastScaleLayout::kRow128 && o.fast_scale_layout != FastScaleLayout::kBlock128)
    throw_arg(fn, layout.c_str(), to_str(int(o.fast_scale_layout)), "must be FastScaleLayout::kRow128 or kBlock128");
  if (!fast && o.fast_scale_layout == FastScaleLayout::kBlock128)
    throw_arg(fn, layout.c_str(), "kBlock128", "exact mode reads data + scales or the BF16 image: use kRow128");
  if (!fast && o.image != nullptr) {
    detail::check_aligned(fn, (name + ".image").c_str(), o.image, 16);
    return;
  }
  const std::string d = name + (fast ? ".fast_data" : ".data"), sc = name + (fast ? ".fast_scales" : ".scales");
  const void* data = fast ? o.fast_data : o.data;
  const void* scales = fast ? o.fast_scales : o.scales;
  detail::check_not_null(fn, d.c_str(), data);
  detail::check_aligned(fn, d.c_str(), data, 16);
  detail::check_not_null(fn, sc.c_str(), scales);
  if (fast) detail::check_aligned(fn, sc.c_str(), scales, 16);
}

}  // namespace

// Steps 1-4 and 6-9 of the recipe with the given weight operands (step 5 is the caller's).
void MoeLayer::Impl::run_forward(const __nv_bfloat16* x, int64_t tokens, const __nv_bfloat16* wr, __nv_bfloat16* out,
                                 cudaStream_t stream, bool quantize_weights, const __nv_bfloat16* w1,
                                 const __nv_bfloat16* w2) {
  Impl& m = *this;
  const MoeLayerConfig& c = m.cfg;
  const int64_t H = c.hidden, E = c.num_experts;
  const int k = c.routing.top_k;
  const bool direct = m.blk.direct_col_blocks();  // MXMOE_QUANT_COL_BLOCK, checked before any launch
  m.timer.restart(stream);
  // 1. logits [T, E] = x · wrᵀ (FP32 out)
  m.router.forward(x, tokens, wr, stream);
  m.mark(m.router.logits_stage(), stream);
  // 2-3. top-k and the routing plan
  moe_topk(m.router.logits, tokens, int(E), c.routing, m.ids, m.weights, stream);
  moe_plan(m.ids, tokens, k, int(E), m.cap, m.plan_ws, m.plan_ws_bytes, m.plan, stream);
  const int32_t* rows_used = m.plan.padded_offsets + E;
  m.mark("top-k + routing plan", stream);
  // 4. gather + quantize x both ways (the column-wise copy is the W1 wgrad operand; activation
  //    blocks: written in the block form, or plain and then rebased to it here, where backward
  //    finds it; MXMOE_QUANT_COL_BLOCK)
  const MxOut xr = m.blk.x_row.out(), xc = detail::ExpertBlock::act_col_out(m.blk.x_col, direct);
  quantize_mxfp8_gather(x, tokens, H, m.plan.row_index, m.cap, rows_used, &xr, &xc, ScaleMode::kRceil, stream);
  if (m.blk.activation_blocks()) m.blk.rebase_x_col(direct, stream);
  m.mark(!m.blk.activation_blocks() ? "permute + quantize x"
         : direct                   ? "permute + quantize x (x col-wise in 128x128 blocks)"
                                    : "permute + quantize x + 128x128-block rebase of x col-wise",
         stream);
  // 5. weights, both directions, one pass each (unless given pre-quantized)
  if (quantize_weights) {
    m.blk.quantize_weights(w1, w2, stream);
    m.mark(m.blk.weight_layout == FastScaleLayout::kBlock128 ? "quantize W1, W2 (both ways) + 128x128-block rebase"
                                                             : "quantize W1, W2 (both ways)",
           stream);
  }
  // 6-8. GEMM1, SwiGLU + quantize, GEMM2
  m.blk.forward(m.plan.padded_offsets, stream, m.marker(stream));
  // 9. combine in slot order
  moe_combine(m.blk.y, m.cap, H, m.plan.row_of, m.weights, tokens, k, nullptr, out, stream);
  m.mark("combine", stream);
  m.tokens = tokens;
}

void MoeLayer::forward(const __nv_bfloat16* x, int64_t tokens, const __nv_bfloat16* wr, const __nv_bfloat16* w1,
                       const __nv_bfloat16* w2, __nv_bfloat16* out, cudaStream_t stream) {
  const char* fn = "MoeLayer::forward";
  check_forward_inputs(fn, impl_->cfg, x, tokens, wr, out);
  detail::check_device_ptrs(fn, {{"w1", w1}, {"w2", w2}});
  impl_->run_forward(x, tokens, wr, out, stream, true, w1, w2);
}

void MoeLayer::forward(const __nv_bfloat16* x, int64_t tokens, const __nv_bfloat16* wr, const MxWeights& w1,
                       const MxWeights& w2, __nv_bfloat16* out, cudaStream_t stream) {
  const char* fn = "MoeLayer::forward";
  Impl& m = *impl_;
  check_forward_inputs(fn, m.cfg, x, tokens, wr, out);
  check_weight_operand(fn, "w1.rowwise", w1.rowwise, m.cfg.mode);
  check_weight_operand(fn, "w1.colwise", w1.colwise, m.cfg.mode);
  check_weight_operand(fn, "w2.rowwise", w2.rowwise, m.cfg.mode);
  check_weight_operand(fn, "w2.colwise", w2.colwise, m.cfg.mode);
  m.blk.w1r_op = w1.rowwise;
  m.blk.w1c_op = w1.colwise;
  m.blk.w2r_op = w2.rowwise;
  m.blk.w2c_op = w2.colwise;
  m.run_forward(x, tokens, wr, out, stream, false, nullptr, nullptr);
}

void MoeLayer::backward(const __nv_bfloat16* dout, const __nv_bfloat16* x, const __nv_bfloat16* wr,
                        __nv_bfloat16* dx, float* dwr, float* dw1, float* dw2, cudaStream_t stream) {
  const char* fn = "MoeLayer::backward";
  Impl& m = *impl_;
  const MoeLayerConfig& c = m.cfg;
  const int64_t H = c.hidden, E = c.num_experts, T = m.tokens;
  const int k = c.routing.top_k;
  if (T == 0) throw Error("mxmoe::MoeLayer::backward: no forward to differentiate (call forward first)");
  detail::check_device_ptrs(
      fn, {{"dout", dout}, {"x", x}, {"wr", wr}, {"dx", dx}, {"dwr", dwr}, {"dw1", dw1}, {"dw2", dw2}});
  const int32_t* rows_used = m.plan.padded_offsets + E;
  m.mark("", stream);
  // 1. dw = dout · Y and each padded row's weight; then dY = bf16(w · dout) gathered into the padded
  //    layout and quantized both ways in one pass (no BF16 dY in memory)
  moe_combine_backward_scales(dout, m.blk.y, m.cap, H, rows_used, m.plan.row_index, m.plan.row_of, m.weights, T, k,
                              m.blk.row_w, m.dw, stream);
  const MxOut dyr = m.blk.dy_row.out(), dyc = m.blk.dy_col.out();
  quantize_mxfp8_gather_scaled(dout, T, H, m.plan.row_index, m.blk.row_w, m.cap, rows_used, &dyr, &dyc,
                               ScaleMode::kRceil, stream);
  m.mark("bwd: gather dOut·w, dw, quantize dY", stream);
  // 2-6. W2 dgrad + wgrad, SwiGLU backward + quantize, W1 dgrad + wgrad
  m.blk.backward(m.plan.padded_offsets, dw1, dw2, stream, m.marker(stream));
  // 7. router: dlogits, then dWr = dlogitsᵀ·X (and dX_router = dlogits·Wr when not folded into 8)
  m.router.backward(x, T, wr, m.ids, m.dw, c.routing, dwr, stream);
  m.mark("bwd: router backward", stream);
  // 8. un-permute in slot order, plus the router's part
  m.router.unpermute(m.blk.dxp, m.cap, m.plan.row_of, T, wr, dx, stream);
  m.mark("bwd: un-permute dX", stream);
}

void MoeLayer::set_profiling(bool on) { impl_->timer.on = on; }

std::vector<std::pair<std::string, float>> MoeLayer::stage_times() const { return impl_->timer.times(); }

const int32_t* MoeLayer::topk_ids() const { return impl_->ids; }
const float* MoeLayer::topk_weights() const { return impl_->weights; }
const float* MoeLayer::topk_weight_grads() const { return impl_->dw; }
const float* MoeLayer::router_logit_grads() const { return impl_->router.dlogits; }
const int32_t* MoeLayer::row_of() const { return impl_->plan.row_of; }
const int32_t* MoeLayer::padded_offsets() const { return impl_->plan.padded_offsets; }
int64_t MoeLayer::capacity() const { return impl_->cap; }
size_t MoeLayer::workspace_bytes() const { return impl_->bytes; }

}  // namespace mxmoe
