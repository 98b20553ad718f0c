// The MoE layer's forward: host orchestration of the kernels, in one stream, no host sync.
// Workspace: one cudaMalloc arena, carved once at construction (256-byte aligned pieces).
#include "mxmoe/moe_layer.h"

#include <cublas_v2.h>

#include <algorithm>
#include <string>
#include <vector>

#include "host/check.h"
#include "kernels/layer/moe_ops_launch.h"
#include "mxmoe/dequantize.h"
#include "mxmoe/moe_ops.h"
#include "mxmoe/moe_plan.h"
#include "mxmoe/quantize.h"

namespace mxmoe {
namespace {

using detail::throw_arg;
using detail::to_str;

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw CudaError(std::string("mxmoe::MoeLayer: ") + what + ": cuBLAS status " + std::to_string(int(s)));
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// An MX copy in the workspace: data, scales, fast data, fast scales.
struct MxBuf {
  uint8_t *data = nullptr, *scales = nullptr, *fast = nullptr, *fast_scales = nullptr;
  MxOut out() const { return MxOut{data, scales, fast, fast_scales}; }
  MxOperand operand() const { return MxOperand{data, scales, fast, fast_scales}; }
};

}  // namespace

struct MoeLayer::Impl {
  MoeLayerConfig cfg;
  int64_t cap = 0;
  size_t bytes = 0;
  uint8_t* arena = nullptr;
  cublasHandle_t cublas = nullptr;
  float* logits = nullptr;
  int32_t* ids = nullptr;
  float* weights = nullptr;
  MoePlan plan;
  void* plan_ws = nullptr;
  size_t plan_ws_bytes = 0;
  MxBuf x_row, x_col, w1_row, w1_col, w2_row, w2_col, h_row, h_col;
  __nv_bfloat16 *gu = nullptr, *hact = nullptr, *y = nullptr;
  int64_t tokens = 0;  // of the last forward
  MxOperand w1r_op, w1c_op, w2r_op, w2c_op;  // weight operands of the last forward
  // Exact mode: one scratch region for the BF16 images of the GEMM running now (A and B slots),
  // rewritten before every GEMM; stream order keeps the next GEMM's images from overwriting the
  // previous GEMM's operands while it runs. Null in fast mode.
  __nv_bfloat16 *img_a = nullptr, *img_b = nullptr;

  // The operand as the layer's GEMM mode reads it: fast mode as it is; exact mode with its BF16
  // image, made into `slot` from data/scales ([rows, cols]) unless the operand carries one (a
  // pre-quantized weight may: MxWeights).
  MxOperand gemm_operand(MxOperand o, int64_t rows, int64_t cols, __nv_bfloat16* slot, cudaStream_t stream) const {
    if (cfg.mode != GemmMode::kExact || o.image != nullptr) return o;
    dequantize_mxfp8_bf16(o.data, o.scales, rows, cols, slot, stream);
    o.image = slot;
    return o;
  }

  void run_forward(const __nv_bfloat16* x, int64_t tokens, const __nv_bfloat16* wr, __nv_bfloat16* out,
                   cudaStream_t stream, bool quantize_weights, const __nv_bfloat16* w1, const __nv_bfloat16* w2);
  // profiling: events recorded after each stage (a reusable pool)
  bool profile = false;
  std::vector<cudaEvent_t> events;
  std::vector<std::string> names;  // names[i]: the stage that ends at events[i] ("" for the start)
  size_t used_marks = 0;
  void mark(const char* stage, cudaStream_t stream) {
    if (!profile) return;
    if (used_marks == events.size()) {
      cudaEvent_t e;
      MXMOE_CUDA_CHECK("MoeLayer", cudaEventCreate(&e));
      events.push_back(e);
      names.emplace_back();
    }
    names[used_marks] = stage;
    MXMOE_CUDA_CHECK("MoeLayer", cudaEventRecord(events[used_marks++], stream));
  }
  // backward
  MxBuf dy_row, dy_col, dgu_row, dgu_col;
  __nv_bfloat16 *dh = nullptr, *dgu = nullptr, *dxp = nullptr;
  float* row_w = nullptr;  // [cap]: routing weight of each padded row (dY = bf16(row_w · dout))
  float *dw = nullptr, *dlogits = nullptr, *x_f32 = nullptr, *wr_f32 = nullptr, *dx_router = nullptr;

  // Carves (or, with base == nullptr, only measures) the workspace.
  size_t carve(uint8_t* base) {
    size_t off = 0;
    auto take = [&](size_t n) {
      uint8_t* p = base ? base + off : nullptr;
      off += (n + 255) / 256 * 256;
      return p;
    };
    const int64_t T = cfg.max_tokens, H = cfg.hidden, I = cfg.inter, E = cfg.num_experts, k = cfg.routing.top_k;
    // An MX copy of [batch, rows, cols] in the one form the GEMM mode reads (fast: the rebased
    // 1x128 form; exact: plain MX). The quantizers write only the pair that is given, so fast
    // mode neither writes nor holds the plain copies.
    const bool fast = cfg.mode == GemmMode::kFast;
    auto mx = [&](int64_t batch, int64_t rows, int64_t cols) {
      MxBuf b;
      if (fast) {
        b.fast = take(size_t(batch * rows * cols));
        b.fast_scales = take(size_t(batch * cdiv(cols, 128) * rows));
      } else {
        b.data = take(size_t(batch * rows * cols));
        b.scales = take(size_t(batch * rows * cols / 32));
      }
      return b;
    };
    logits = reinterpret_cast<float*>(take(size_t(T * E) * 4));
    ids = reinterpret_cast<int32_t*>(take(size_t(T * k) * 4));
    weights = reinterpret_cast<float*>(take(size_t(T * k) * 4));
    plan.counts = reinterpret_cast<int32_t*>(take(size_t(E) * 4));
    plan.offsets = reinterpret_cast<int32_t*>(take(size_t(E + 1) * 4));
    plan.padded_offsets = reinterpret_cast<int32_t*>(take(size_t(E + 1) * 4));
    plan.row_of = reinterpret_cast<int32_t*>(take(size_t(T * k) * 4));
    plan.row_index = reinterpret_cast<int32_t*>(take(size_t(cap) * 4));
    plan_ws_bytes = moe_plan_workspace_bytes(T, int(k), int(E));
    plan_ws = take(plan_ws_bytes);
    x_row = mx(1, cap, H);
    x_col = mx(1, H, cap);
    w1_row = mx(E, 2 * I, H);
    w1_col = mx(E, H, 2 * I);
    w2_row = mx(E, H, I);
    w2_col = mx(E, I, H);
    gu = reinterpret_cast<__nv_bfloat16*>(take(size_t(cap * 2 * I) * 2));
    hact = reinterpret_cast<__nv_bfloat16*>(take(size_t(cap * I) * 2));
    h_row = mx(1, cap, I);
    h_col = mx(1, I, cap);
    y = reinterpret_cast<__nv_bfloat16*>(take(size_t(cap * H) * 2));
    row_w = reinterpret_cast<float*>(take(size_t(cap) * 4));
    dy_row = mx(1, cap, H);
    dy_col = mx(1, H, cap);
    dh = reinterpret_cast<__nv_bfloat16*>(take(size_t(cap * I) * 2));
    dgu = reinterpret_cast<__nv_bfloat16*>(take(size_t(cap * 2 * I) * 2));
    dgu_row = mx(1, cap, 2 * I);
    dgu_col = mx(1, 2 * I, cap);
    dxp = reinterpret_cast<__nv_bfloat16*>(take(size_t(cap * H) * 2));
    dw = reinterpret_cast<float*>(take(size_t(T * k) * 4));
    dlogits = reinterpret_cast<float*>(take(size_t(T * E) * 4));
    x_f32 = reinterpret_cast<float*>(take(size_t(T * H) * 4));
    wr_f32 = reinterpret_cast<float*>(take(size_t(E * H) * 4));
    dx_router = reinterpret_cast<float*>(take(size_t(T * H) * 4));
    if (!fast) {
      // The largest A and B operands of the six GEMMs (elements): A is x, dY [cap, H] (or their
      // transposes) or dGU [cap, 2I]; B is W1 (2·E·I·H, either direction), W2 (E·H·I), or the
      // wgrad operands Hact, X [I | H, cap].
      const int64_t a_max = cap * std::max(H, 2 * I), b_max = std::max(2 * E * I * H, cap * std::max(H, I));
      img_a = reinterpret_cast<__nv_bfloat16*>(take(size_t(a_max) * 2));
      img_b = reinterpret_cast<__nv_bfloat16*>(take(size_t(b_max) * 2));
    }
    return off;
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
    impl_->cfg = cfg;
    impl_->cap = moe_plan_capacity(cfg.max_tokens, cfg.routing.top_k, cfg.num_experts);
    impl_->bytes = impl_->carve(nullptr);
    MXMOE_CUDA_CHECK(fn, cudaMalloc(&impl_->arena, impl_->bytes));
    impl_->carve(impl_->arena);
    check_cublas(cublasCreate(&impl_->cublas), "cublasCreate");
  } catch (...) {
    if (impl_->arena) cudaFree(impl_->arena);
    delete impl_;
    throw;
  }
}

MoeLayer::~MoeLayer() {
  for (cudaEvent_t e : impl_->events) cudaEventDestroy(e);
  if (impl_->cublas) cublasDestroy(impl_->cublas);
  if (impl_->arena) cudaFree(impl_->arena);
  delete impl_;
}

namespace {

void check_forward_inputs(const char* fn, const MoeLayerConfig& c, const __nv_bfloat16* x, int64_t tokens,
                          const __nv_bfloat16* wr, const __nv_bfloat16* out) {
  if (tokens < 1 || tokens > c.max_tokens)
    throw_arg(fn, "tokens", to_str(tokens), "must be in [1, max_tokens = " + to_str(c.max_tokens) + "]");
  for (auto [name, p] : {std::pair<const char*, const void*>{"x", x}, {"wr", wr}, {"out", out}}) {
    detail::check_not_null(fn, name, p);
    detail::check_aligned(fn, name, p, 16);
  }
}

// A pre-quantized weight operand must carry the pair the GEMM mode reads, 16-byte aligned; in exact
// mode a BF16 image (then used as it is) instead of data + scales will do.
void check_weight_operand(const char* fn, const std::string& name, const MxOperand& o, GemmMode mode) {
  const bool fast = mode == GemmMode::kFast;
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
  const int64_t H = c.hidden, I = c.inter, E = c.num_experts;
  const int k = c.routing.top_k;
  m.used_marks = 0;
  m.mark("", stream);
  // 1. logits [T, E] = x · wrᵀ (FP32 out): column-major C[E, T] = op(Wr)[E, H] · X[H, T].
  const float one = 1.0f, zero = 0.0f;
  check_cublas(cublasSetStream(m.cublas, stream), "cublasSetStream");
  check_cublas(cublasGemmEx(m.cublas, CUBLAS_OP_T, CUBLAS_OP_N, int(E), int(tokens), int(H), &one, wr, CUDA_R_16BF,
                            int(H), x, CUDA_R_16BF, int(H), &zero, m.logits, CUDA_R_32F, int(E), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT),
               "router GEMM");
  m.mark("router GEMM (cuBLAS)", stream);
  // 2-3. top-k and the routing plan
  moe_topk(m.logits, tokens, int(E), c.routing, m.ids, m.weights, stream);
  moe_plan(m.ids, tokens, k, int(E), m.cap, m.plan_ws, m.plan_ws_bytes, m.plan, stream);
  const int32_t* rows_used = m.plan.padded_offsets + E;
  m.mark("top-k + routing plan", stream);
  // 4. gather + quantize x both ways (the column-wise copy is the W1 wgrad operand)
  const MxOut xr = m.x_row.out(), xc = m.x_col.out();
  quantize_mxfp8_gather(x, tokens, H, m.plan.row_index, m.cap, rows_used, &xr, &xc, ScaleMode::kRceil, stream);
  m.mark("permute + quantize x", stream);
  // 5. weights, both directions, one pass each (unless given pre-quantized)
  if (quantize_weights) {
    const MxOut w1r = m.w1_row.out(), w1c = m.w1_col.out(), w2r = m.w2_row.out(), w2c = m.w2_col.out();
    quantize_mxfp8(w1, E, 2 * I, H, &w1r, &w1c, ScaleMode::kRceil, stream);
    quantize_mxfp8(w2, E, H, I, &w2r, &w2c, ScaleMode::kRceil, stream);
    m.w1r_op = m.w1_row.operand();
    m.w1c_op = m.w1_col.operand();
    m.w2r_op = m.w2_row.operand();
    m.w2c_op = m.w2_col.operand();
    m.mark("quantize W1, W2 (both ways)", stream);
  }
  // 6. GEMM1: GU [cap, 2I] = x_p · W1[e]ᵀ
  GemmOptions go;
  go.mode = c.mode;
  go.stream = stream;
  m_grouped_mxfp8_gemm_nt(m.gemm_operand(m.x_row.operand(), m.cap, H, m.img_a, stream), m.cap,
                          m.gemm_operand(m.w1r_op, E * 2 * I, H, m.img_b, stream), int(E), 2 * I, H,
                          m.plan.padded_offsets, m.gu, go);
  m.mark("GEMM1 (gate/up)", stream);
  // 7. SwiGLU, then quantize both ways over the used rows (pad rows are exact zeros)
  moe_swiglu(m.gu, m.cap, I, rows_used, m.hact, stream);
  const MxOut hr = m.h_row.out(), hc = m.h_col.out();
  quantize_mxfp8_grouped(m.hact, m.cap, I, m.plan.padded_offsets, m.plan.padded_offsets, int(E), m.cap, &hr, &hc,
                         ScaleMode::kRceil, stream);
  m.mark("SwiGLU + quantize", stream);
  // 8. GEMM2: Y [cap, H] = Hact · W2[e]ᵀ
  m_grouped_mxfp8_gemm_nt(m.gemm_operand(m.h_row.operand(), m.cap, I, m.img_a, stream), m.cap,
                          m.gemm_operand(m.w2r_op, E * H, I, m.img_b, stream), int(E), H, I, m.plan.padded_offsets,
                          m.y, go);
  m.mark("GEMM2 (down)", stream);
  // 9. combine in slot order
  moe_combine(m.y, m.cap, H, m.plan.row_of, m.weights, tokens, k, nullptr, out, stream);
  m.mark("combine", stream);
  m.tokens = tokens;
}

void MoeLayer::forward(const __nv_bfloat16* x, int64_t tokens, const __nv_bfloat16* wr, const __nv_bfloat16* w1,
                       const __nv_bfloat16* w2, __nv_bfloat16* out, cudaStream_t stream) {
  const char* fn = "MoeLayer::forward";
  check_forward_inputs(fn, impl_->cfg, x, tokens, wr, out);
  for (auto [name, p] : {std::pair<const char*, const void*>{"w1", w1}, {"w2", w2}}) {
    detail::check_not_null(fn, name, p);
    detail::check_aligned(fn, name, p, 16);
  }
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
  m.w1r_op = w1.rowwise;
  m.w1c_op = w1.colwise;
  m.w2r_op = w2.rowwise;
  m.w2c_op = w2.colwise;
  m.run_forward(x, tokens, wr, out, stream, false, nullptr, nullptr);
}

void MoeLayer::backward(const __nv_bfloat16* dout, const __nv_bfloat16* x, const __nv_bfloat16* wr,
                        __nv_bfloat16* dx, float* dwr, float* dw1, float* dw2, cudaStream_t stream) {
  const char* fn = "MoeLayer::backward";
  Impl& m = *impl_;
  const MoeLayerConfig& c = m.cfg;
  const int64_t H = c.hidden, I = c.inter, E = c.num_experts, T = m.tokens;
  const int k = c.routing.top_k;
  if (T == 0) throw Error("mxmoe::MoeLayer::backward: no forward to differentiate (call forward first)");
  for (auto [name, p] : {std::pair<const char*, const void*>{"dout", dout}, {"x", x}, {"wr", wr}, {"dx", dx},
                         {"dwr", dwr}, {"dw1", dw1}, {"dw2", dw2}}) {
    detail::check_not_null(fn, name, p);
    detail::check_aligned(fn, name, p, 16);
  }
  const int32_t* rows_used = m.plan.padded_offsets + E;
  GemmOptions go;
  go.mode = c.mode;
  go.stream = stream;
  GemmOptions go32 = go;
  go32.out_dtype = GemmOutDtype::kFP32;
  m.mark("", stream);
  // 1. dw = dout · Y and each padded row's weight; then dY = bf16(w · dout) gathered into the padded
  //    layout and quantized both ways in one pass (no BF16 dY in memory)
  moe_combine_backward_scales(dout, m.y, m.cap, H, rows_used, m.plan.row_index, m.plan.row_of, m.weights, T, k,
                              m.row_w, m.dw, stream);
  const MxOut dyr = m.dy_row.out(), dyc = m.dy_col.out();
  quantize_mxfp8_gather_scaled(dout, T, H, m.plan.row_index, m.row_w, m.cap, rows_used, &dyr, &dyc,
                               ScaleMode::kRceil, stream);
  m.mark("bwd: gather dOut·w, dw, quantize dY", stream);
  // 2. dH [cap, I] = dY · W2[e] (B = col(W2) [E, I, H]);  3. dW2[e] = Σ dYᵀ · Hact
  m_grouped_mxfp8_gemm_nt(m.gemm_operand(m.dy_row.operand(), m.cap, H, m.img_a, stream), m.cap,
                          m.gemm_operand(m.w2c_op, E * I, H, m.img_b, stream), int(E), I, H, m.plan.padded_offsets,
                          m.dh, go);
  k_grouped_mxfp8_gemm_nt(m.gemm_operand(m.dy_col.operand(), H, m.cap, m.img_a, stream),
                          m.gemm_operand(m.h_col.operand(), I, m.cap, m.img_b, stream), m.cap, int(E), H, I,
                          m.plan.padded_offsets, dw2, go32);
  m.mark("bwd: W2 dgrad + wgrad GEMMs", stream);
  // 4. SwiGLU backward, quantize dGU both ways
  moe_swiglu_backward(m.gu, m.dh, m.cap, I, rows_used, m.dgu, stream);
  const MxOut gr = m.dgu_row.out(), gc = m.dgu_col.out();
  quantize_mxfp8_grouped(m.dgu, m.cap, 2 * I, m.plan.padded_offsets, m.plan.padded_offsets, int(E), m.cap, &gr, &gc,
                         ScaleMode::kRceil, stream);
  m.mark("bwd: SwiGLU backward + quantize", stream);
  // 5. dXp [cap, H] = dGU · W1[e] (B = col(W1) [E, H, 2I]);  6. dW1[e] = Σ dGUᵀ · Xp
  m_grouped_mxfp8_gemm_nt(m.gemm_operand(m.dgu_row.operand(), m.cap, 2 * I, m.img_a, stream), m.cap,
                          m.gemm_operand(m.w1c_op, E * H, 2 * I, m.img_b, stream), int(E), H, 2 * I,
                          m.plan.padded_offsets, m.dxp, go);
  k_grouped_mxfp8_gemm_nt(m.gemm_operand(m.dgu_col.operand(), 2 * I, m.cap, m.img_a, stream),
                          m.gemm_operand(m.x_col.operand(), H, m.cap, m.img_b, stream), m.cap, int(E), 2 * I, H,
                          m.plan.padded_offsets, dw1, go32);
  m.mark("bwd: W1 dgrad + wgrad GEMMs", stream);
  // 7. router: dlogits, then FP32 GEMMs dWr = dlogitsᵀ·X and dX_router = dlogits·Wr
  moe_router_backward(m.logits, m.ids, m.dw, T, int(E), c.routing, m.dlogits, stream);
  detail::launch_bf16_to_f32(reinterpret_cast<const uint16_t*>(x), T * H, m.x_f32, stream);
  detail::launch_bf16_to_f32(reinterpret_cast<const uint16_t*>(wr), E * H, m.wr_f32, stream);
  const float one = 1.0f, zero = 0.0f;
  check_cublas(cublasSetStream(m.cublas, stream), "cublasSetStream");
  // column-major: dWr_cm [H, E] = X_cm [H, T] · (dlogits_cm [E, T])ᵀ
  check_cublas(cublasSgemm(m.cublas, CUBLAS_OP_N, CUBLAS_OP_T, int(H), int(E), int(T), &one, m.x_f32, int(H),
                           m.dlogits, int(E), &zero, dwr, int(H)),
               "router wgrad GEMM");
  // column-major: dXr_cm [H, T] = Wr_cm [H, E] · dlogits_cm [E, T]
  check_cublas(cublasSgemm(m.cublas, CUBLAS_OP_N, CUBLAS_OP_N, int(H), int(T), int(E), &one, m.wr_f32, int(H),
                           m.dlogits, int(E), &zero, m.dx_router, int(H)),
               "router dgrad GEMM");
  m.mark("bwd: router backward", stream);
  // 8. un-permute in slot order, plus the router's part
  moe_combine(m.dxp, m.cap, H, m.plan.row_of, nullptr, T, k, m.dx_router, dx, stream);
  m.mark("bwd: un-permute dX", stream);
}

void MoeLayer::set_profiling(bool on) { impl_->profile = on; }

std::vector<std::pair<std::string, float>> MoeLayer::stage_times() const {
  const Impl& m = *impl_;
  std::vector<std::pair<std::string, float>> out;
  if (m.used_marks == 0) return out;
  MXMOE_CUDA_CHECK("MoeLayer::stage_times", cudaEventSynchronize(m.events[m.used_marks - 1]));
  for (size_t i = 1; i < m.used_marks; ++i) {
    if (m.names[i].empty()) continue;  // a start mark (backward's first)
    float ms = 0.0f;
    MXMOE_CUDA_CHECK("MoeLayer::stage_times", cudaEventElapsedTime(&ms, m.events[i - 1], m.events[i]));
    out.emplace_back(m.names[i], ms);
  }
  return out;
}

const int32_t* MoeLayer::topk_ids() const { return impl_->ids; }
const float* MoeLayer::topk_weights() const { return impl_->weights; }
const float* MoeLayer::topk_weight_grads() const { return impl_->dw; }
const int32_t* MoeLayer::row_of() const { return impl_->plan.row_of; }
const int32_t* MoeLayer::padded_offsets() const { return impl_->plan.padded_offsets; }
int64_t MoeLayer::capacity() const { return impl_->cap; }
size_t MoeLayer::workspace_bytes() const { return impl_->bytes; }

}  // namespace mxmoe
