// The expert-centric decode step and the dispatcher (include/mxmoe/decode.h, "the expert-centric
// decode step" and "one decode step, dispatched"): host orchestration of the library's launches
// (moe_plan, moe_gather_rows / quantize_mxfp8_gather, m_grouped_mxfp8_gemm_nt, moe_swiglu,
// quantize_mxfp8_grouped, moe_combine), one stream, no host synchronisation, no new kernels.
// Workspace pieces are carved per call for the call's batch (256-byte aligned, Carver of
// host/moe_expert_block.h), so a workspace sized for a larger batch serves every smaller one.
// Notes: docs/notes/decode.md "Expert-centric path".
#include <algorithm>
#include <string>

#include "host/check.h"
#include "host/decode_checks.h"
#include "host/moe_expert_block.h"
#include "host/routing.h"
#include "mxmoe/decode.h"
#include "mxmoe/dequantize.h"
#include "mxmoe/gemm.h"
#include "mxmoe/moe_ops.h"
#include "mxmoe/moe_plan.h"
#include "mxmoe/quantize.h"

namespace mxmoe {
namespace {

using detail::throw_arg;
using detail::to_str;

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The prepared form of one MXFP8 projection: fast data [E, N, K], fast scales [E, ceil(K/128), N],
// and the shared expert's [N, K], [ceil(K/128), N] (null without one).
struct Prepared {
  uint8_t *data = nullptr, *scales = nullptr, *shared_data = nullptr, *shared_scales = nullptr;
};

Prepared carve_prepared(detail::Carver& c, int experts, int64_t n, int64_t k, bool shared) {
  Prepared p;
  p.data = c.take(size_t(experts) * size_t(n * k));
  p.scales = c.take(size_t(experts) * size_t(cdiv(k, 128) * n));
  if (shared) {
    p.shared_data = c.take(size_t(n * k));
    p.shared_scales = c.take(size_t(cdiv(k, 128) * n));
  }
  return p;
}

Prepared prepared_of(const void* base, int experts, int64_t n, int64_t k, bool shared) {
  detail::Carver c(static_cast<uint8_t*>(const_cast<void*>(base)));
  return carve_prepared(c, experts, n, k, shared);
}

// One chain of the step: the routed experts (top_k slots over E experts) or the shared expert
// (one group that every token takes: ids all 0, top_k 1, E 1). Buffers for B tokens.
struct Chain {
  int experts = 0, top_k = 0;
  bool shared = false, mx = false;
  int64_t cap = 0;           // padded rows, moe_plan_capacity(B, top_k, experts)
  int32_t* zero_ids = nullptr;  // shared: [B], set to 0 each step
  MoePlan plan;
  void* plan_ws = nullptr;
  size_t plan_ws_bytes = 0;
  __nv_bfloat16* xp = nullptr;  // BF16 weights: gathered x [cap, H] (the GEMM1 A image)
  detail::MxBuf xq, hq;         // MXFP8 weights: fast forms of gathered x [cap, H] and H [cap, I]
  __nv_bfloat16 *gu = nullptr, *h = nullptr;  // [cap, 2I], [cap, I]
  void* y = nullptr;  // routed: BF16 [cap, H]; shared: FP32 [cap, H] (the combine's addend)

  void carve(detail::Carver& c, int64_t batch, int64_t hidden, int64_t inter) {
    cap = moe_plan_capacity(batch, top_k, experts);
    if (shared) zero_ids = c.take_n<int32_t>(size_t(batch));
    detail::carve_plan(c, batch, top_k, experts, cap, plan, plan_ws, plan_ws_bytes);
    if (mx) {
      xq = detail::mx_buf(c, GemmMode::kFast, 1, cap, hidden);
      hq = detail::mx_buf(c, GemmMode::kFast, 1, cap, inter);
    } else {
      xp = c.take_n<__nv_bfloat16>(size_t(cap * hidden));
    }
    gu = c.take_n<__nv_bfloat16>(size_t(cap * 2 * inter));
    h = c.take_n<__nv_bfloat16>(size_t(cap * inter));
    y = c.take(size_t(cap * hidden) * (shared ? sizeof(float) : sizeof(__nv_bfloat16)));
  }

  // plan → gather (+ quantize) x → GEMM1 → SwiGLU (+ quantize) → GEMM2 into y.
  // w1, w2: the weight operands (BF16: image = the weights; MXFP8: the prepared fast form).
  void run(const __nv_bfloat16* x, int64_t batch, int64_t hidden, int64_t inter, const int32_t* ids,
           const MxOperand& w1, const MxOperand& w2, cudaStream_t stream) const {
    const char* fn = "decode_expert_centric";
    if (shared) {
      MXMOE_CUDA_CHECK(fn, cudaMemsetAsync(zero_ids, 0, size_t(batch) * sizeof(int32_t), stream));
      ids = zero_ids;
    }
    moe_plan(ids, batch, top_k, experts, cap, plan_ws, plan_ws_bytes, plan, stream);
    const int32_t* rows_used = plan.padded_offsets + experts;
    GemmOptions go;
    go.mode = mx ? GemmMode::kFast : GemmMode::kExact;
    go.fast_tile_n = 128;  // the width decode_step's crossover table was measured with (run 42)
    go.stream = stream;
    MxOperand a;
    if (mx) {
      const MxOut xo = xq.out();
      quantize_mxfp8_gather(x, batch, hidden, plan.row_index, cap, rows_used, &xo, nullptr, ScaleMode::kRceil,
                            stream);
      a = xq.operand();
    } else {
      moe_gather_rows(x, batch, hidden, plan.row_index, cap, rows_used, xp, stream);
      a.image = xp;
    }
    // GU [cap, 2I] = x_p · W1[e]ᵀ (BF16), then H = SwiGLU(GU) (BF16) over the used rows
    m_grouped_mxfp8_gemm_nt(a, cap, w1, experts, 2 * inter, hidden, plan.padded_offsets, gu, go);
    moe_swiglu(gu, cap, inter, rows_used, h, stream);
    MxOperand ah;
    if (mx) {
      const MxOut ho = hq.out();
      quantize_mxfp8_grouped(h, cap, inter, plan.padded_offsets, plan.padded_offsets, experts, cap, &ho, nullptr,
                             ScaleMode::kRceil, stream);
      ah = hq.operand();
    } else {
      ah.image = h;
    }
    // Y [cap, H] = H · W2[e]ᵀ
    go.out_dtype = shared ? GemmOutDtype::kFP32 : GemmOutDtype::kBF16;
    m_grouped_mxfp8_gemm_nt(ah, cap, w2, experts, hidden, inter, plan.padded_offsets, y, go);
  }
};

// The step's two chains, carved from `base` (null: measure only) for `batch` tokens.
struct Step {
  Chain routed, shared;
  bool has_shared = false;
  size_t bytes = 0;

  Step(uint8_t* base, int batch, int hidden, int inter, int num_experts, int top_k, bool shared_expert, bool mx) {
    detail::Carver c(base);
    routed.experts = num_experts;
    routed.top_k = top_k;
    routed.mx = mx;
    routed.carve(c, batch, hidden, inter);
    has_shared = shared_expert;
    if (has_shared) {
      shared.experts = 1;
      shared.top_k = 1;
      shared.shared = true;
      shared.mx = mx;
      shared.carve(c, batch, hidden, inter);
    }
    bytes = c.bytes();
  }
};

void check_gemm_dim(const char* fn, const char* arg, int v) {
  if (v < 32 || v > detail::kDecodeMaxDim || v % 32 != 0)
    throw_arg(fn, arg, to_str(v),
              "must be a multiple of 32 in [32, " + to_str(detail::kDecodeMaxDim) +
                  "] (the grouped GEMMs' N and K)");
}

void check_ec_shape(const char* fn, int batch, int hidden, int inter, int num_experts, int top_k) {
  detail::check_batch(fn, batch);
  check_gemm_dim(fn, "hidden", hidden);
  check_gemm_dim(fn, "inter", inter);
  detail::check_experts(fn, num_experts);
  if (num_experts > kMaxGemmExperts)
    throw_arg(fn, "num_experts", to_str(num_experts), "must be at most " + to_str(kMaxGemmExperts));
  detail::check_top_k(fn, "top_k", top_k, num_experts);
}

void check_workspace(const char* fn, const void* workspace, size_t workspace_bytes, size_t need) {
  detail::check_not_null(fn, "workspace", workspace);
  detail::check_aligned(fn, "workspace", workspace, 256);
  if (workspace_bytes < need)
    throw_arg(fn, "workspace_bytes", to_str(workspace_bytes), "must be at least " + to_str(need) + " for this batch");
}

// Everything decode_expert_centric needs, checked before any CUDA call (also by decode_step).
void check_expert_centric(const char* fn, const __nv_bfloat16* x, int batch, int hidden, int inter,
                          const DecodeWeights& w1, const DecodeWeights& w2, int num_experts,
                          const int32_t* topk_ids, const float* topk_weights, int top_k, const __nv_bfloat16* out) {
  detail::check_ptr(fn, "x", x, 16);
  check_ec_shape(fn, batch, hidden, inter, num_experts, top_k);
  detail::check_weights(fn, "w1", w1);
  detail::check_weights(fn, "w2", w2);
  if (w1.dtype != w2.dtype)
    throw_arg(fn, "w2.dtype", to_str(int(w2.dtype)), "must equal w1.dtype = " + to_str(int(w1.dtype)));
  if ((w1.shared_data != nullptr) != (w2.shared_data != nullptr))
    throw_arg(fn, "w2.shared_data", to_str(w2.shared_data), "a shared expert must be given in both w1 and w2 or in neither");
  const bool mx = w1.dtype == DecodeWeightDtype::kMXFP8;
  const struct { const char* name; const void* p; } prepared[] = {{"w1.prepared", w1.prepared},
                                                                   {"w2.prepared", w2.prepared}};
  for (const auto& q : prepared) {
    if (mx) {
      if (q.p == nullptr)
        throw_arg(fn, q.name, "null", "MXFP8 weights need their prepared form (decode_prepare_weights)");
      detail::check_aligned(fn, q.name, q.p, 256);
    } else if (q.p != nullptr) {
      throw_arg(fn, q.name, to_str(q.p), "must be null for BF16 weights");
    }
  }
  detail::check_ptr(fn, "topk_ids", topk_ids, 4);
  detail::check_ptr(fn, "topk_weights", topk_weights, 4);
  detail::check_ptr(fn, "out", out, 16);
}

size_t warp_h_bytes(int batch, const DecodeShape& s) {
  return size_t(batch) * size_t(s.top_k + (s.shared_expert ? 1 : 0)) * size_t(s.inter) * sizeof(float);
}

}  // namespace

size_t decode_prepared_weights_bytes(int num_experts, int n, int k, bool shared_expert) {
  const char* fn = "decode_prepared_weights_bytes";
  detail::check_experts(fn, num_experts);
  check_gemm_dim(fn, "n", n);
  check_gemm_dim(fn, "k", k);
  detail::Carver c(nullptr);
  carve_prepared(c, num_experts, n, k, shared_expert);
  return c.bytes();
}

void decode_prepare_weights(const DecodeWeights& w, int num_experts, int n, int k, void* prepared,
                            size_t prepared_bytes, cudaStream_t stream) {
  const char* fn = "decode_prepare_weights";
  if (w.dtype != DecodeWeightDtype::kMXFP8)
    throw_arg(fn, "w.dtype", to_str(int(w.dtype)), "must be kMXFP8 (BF16 weights are used as they are)");
  detail::check_weights(fn, "w", w);
  const bool shared = w.shared_data != nullptr;
  const size_t need = decode_prepared_weights_bytes(num_experts, n, k, shared);
  detail::check_not_null(fn, "prepared", prepared);
  detail::check_aligned(fn, "prepared", prepared, 256);
  if (prepared_bytes < need)
    throw_arg(fn, "prepared_bytes", to_str(prepared_bytes), "must be at least decode_prepared_weights_bytes() = " + to_str(need));

  const Prepared p = prepared_of(prepared, num_experts, n, k, shared);
  const int64_t nk = int64_t(n) * k, kc = cdiv(k, 128);
  // Experts per pass: a BF16 temporary of at most 256 MB (at least one expert).
  const int64_t per = std::max<int64_t>(1, std::min<int64_t>(num_experts, (int64_t(256) << 20) / (nk * 2)));
  __nv_bfloat16* tmp = nullptr;
  MXMOE_CUDA_CHECK(fn, cudaMallocAsync(reinterpret_cast<void**>(&tmp), size_t(per * nk) * 2, stream));
  // The given MX values → BF16 (exact for scale bytes in [3, 246], dequantize.h) → the fast form.
  auto one = [&](const void* data, const uint8_t* scales, int64_t experts, uint8_t* fast, uint8_t* fast_scales) {
    dequantize_mxfp8_bf16(static_cast<const uint8_t*>(data), scales, experts * n, k, tmp, stream);
    const MxOut o{nullptr, nullptr, fast, fast_scales};
    quantize_mxfp8(tmp, experts, n, k, &o, nullptr, ScaleMode::kRceil, stream);
  };
  try {
    const auto* data = static_cast<const uint8_t*>(w.data);
    for (int64_t e0 = 0; e0 < num_experts; e0 += per) {
      const int64_t ne = std::min<int64_t>(per, num_experts - e0);
      one(data + e0 * nk, w.scales + e0 * nk / 32, ne, p.data + e0 * nk, p.scales + e0 * kc * n);
    }
    if (shared) one(w.shared_data, w.shared_scales, 1, p.shared_data, p.shared_scales);
  } catch (...) {
    cudaFreeAsync(tmp, stream);
    throw;
  }
  MXMOE_CUDA_CHECK(fn, cudaFreeAsync(tmp, stream));
}

size_t decode_expert_centric_workspace_bytes(int batch, int hidden, int inter, int num_experts, int top_k,
                                             bool shared_expert, DecodeWeightDtype dtype) {
  const char* fn = "decode_expert_centric_workspace_bytes";
  check_ec_shape(fn, batch, hidden, inter, num_experts, top_k);
  if (dtype != DecodeWeightDtype::kBF16 && dtype != DecodeWeightDtype::kMXFP8)
    throw_arg(fn, "dtype", to_str(int(dtype)), "must be kBF16 or kMXFP8");
  return Step(nullptr, batch, hidden, inter, num_experts, top_k, shared_expert, dtype == DecodeWeightDtype::kMXFP8)
      .bytes;
}

void decode_expert_centric(const __nv_bfloat16* x, int batch, int hidden, int inter, const DecodeWeights& w1,
                           const DecodeWeights& w2, int num_experts, const int32_t* topk_ids,
                           const float* topk_weights, int top_k, __nv_bfloat16* out, void* workspace,
                           size_t workspace_bytes, cudaStream_t stream) {
  const char* fn = "decode_expert_centric";
  check_expert_centric(fn, x, batch, hidden, inter, w1, w2, num_experts, topk_ids, topk_weights, top_k, out);
  const bool mx = w1.dtype == DecodeWeightDtype::kMXFP8, shared = w1.shared_data != nullptr;
  const Step st(static_cast<uint8_t*>(workspace), batch, hidden, inter, num_experts, top_k, shared, mx);
  check_workspace(fn, workspace, workspace_bytes, st.bytes);

  // Weight operands: BF16 weights are their own exact-mode images; MXFP8 reads the prepared form.
  const int64_t H = hidden, I = inter;
  MxOperand w1r, w2r, w1s, w2s;
  if (mx) {
    const Prepared p1 = prepared_of(w1.prepared, num_experts, 2 * I, H, shared);
    const Prepared p2 = prepared_of(w2.prepared, num_experts, H, I, shared);
    w1r = MxOperand{nullptr, nullptr, p1.data, p1.scales, nullptr};
    w2r = MxOperand{nullptr, nullptr, p2.data, p2.scales, nullptr};
    w1s = MxOperand{nullptr, nullptr, p1.shared_data, p1.shared_scales, nullptr};
    w2s = MxOperand{nullptr, nullptr, p2.shared_data, p2.shared_scales, nullptr};
  } else {
    w1r.image = static_cast<const __nv_bfloat16*>(w1.data);
    w2r.image = static_cast<const __nv_bfloat16*>(w2.data);
    w1s.image = static_cast<const __nv_bfloat16*>(w1.shared_data);
    w2s.image = static_cast<const __nv_bfloat16*>(w2.shared_data);
  }
  st.routed.run(x, batch, H, I, topk_ids, w1r, w2r, stream);
  if (shared) st.shared.run(x, batch, H, I, nullptr, w1s, w2s, stream);
  // out[t] = bf16(Σ_{j<k} w[t, j]·Y[row(t, j)] + Ys[t]) in FP32, slot order, then the shared term.
  // Ys row t is token t: the shared plan puts every token in its one group, in token order.
  moe_combine(static_cast<const __nv_bfloat16*>(st.routed.y), st.routed.cap, H, st.routed.plan.row_of, topk_weights,
              batch, top_k, shared ? static_cast<const float*>(st.shared.y) : nullptr, out, stream);
}

size_t decode_step_workspace_bytes(const DecodeShape& shape, DecodeWeightDtype dtype, int batch) {
  const size_t ec = decode_expert_centric_workspace_bytes(batch, shape.hidden, shape.inter, shape.num_experts,
                                                          shape.top_k, shape.shared_expert, dtype);
  return std::max(ec, warp_h_bytes(batch, shape));
}

DecodePath decode_step(const __nv_bfloat16* x, int batch, const DecodeShape& shape, const __nv_bfloat16* router_w,
                       const RouterParams& params, const DecodeWeights& w1, const DecodeWeights& w2,
                       int32_t* topk_ids, float* topk_weights, __nv_bfloat16* out, void* workspace,
                       size_t workspace_bytes, cudaStream_t stream) {
  const char* fn = "decode_step";
  // Every check of both paths and of the router before the first launch.
  check_expert_centric(fn, x, batch, shape.hidden, shape.inter, w1, w2, shape.num_experts, topk_ids, topk_weights,
                       shape.top_k, out);
  if (params.top_k != shape.top_k)
    throw_arg(fn, "params.top_k", to_str(params.top_k), "must equal shape.top_k = " + to_str(shape.top_k));
  if (shape.shared_expert != (w1.shared_data != nullptr))
    throw_arg(fn, "shape.shared_expert", to_str(shape.shared_expert),
              "must say whether w1/w2 carry a shared expert (w1.shared_data)");
  detail::check_ptr(fn, "router_w", router_w, 16);
  detail::check_routing(fn, shape.num_experts, params, topk_ids, topk_weights);
  check_workspace(fn, workspace, workspace_bytes, decode_step_workspace_bytes(shape, w1.dtype, batch));

  decode_router(x, batch, shape.hidden, router_w, shape.num_experts, params, topk_ids, topk_weights, stream);
  const DecodePath path = choose_decode_path(shape, w1.dtype, batch);
  if (path == DecodePath::kWarpDecode) {
    decode_gate_up(x, batch, shape.hidden, shape.inter, w1, shape.num_experts, topk_ids, shape.top_k, workspace,
                   DecodeHDtype::kFP32, stream);
    decode_down(workspace, DecodeHDtype::kFP32, batch, shape.inter, shape.hidden, w2, shape.num_experts, topk_ids,
                topk_weights, shape.top_k, out, stream);
  } else {
    decode_expert_centric(x, batch, shape.hidden, shape.inter, w1, w2, shape.num_experts, topk_ids, topk_weights,
                          shape.top_k, out, workspace, workspace_bytes, stream);
  }
  return path;
}

}  // namespace mxmoe
