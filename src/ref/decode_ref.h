// CPU reference of the warp-decode path (include/mxmoe/decode.h), FP64, written from the
// contract and not from the kernels: router (logits, scoring, group-limited top-k, weights),
// gate/up with SwiGLU, down with the routing-weighted sum. MX weights enter as their exactly
// dequantized values (ref::dequantize), so one reference serves BF16 and MXFP8 weights.
#pragma once
#include <cstdint>
#include <vector>

#include "ref/mx_ref.h"

namespace mxmoe::ref {

struct RouterRefParams {
  bool sigmoid = false;
  int top_k = 1;
  bool renormalize = true;
  int n_groups = 1, topk_groups = 1;
  double scaling_factor = 1.0;
  const float* bias = nullptr;  // host [E] or null (sigmoid only)
};

struct RouterRefResult {
  std::vector<double> logits;   // [B, E]
  std::vector<int32_t> ids;     // [B, k], decreasing selection score, ties → lower id
  std::vector<double> weights;  // [B, k]
  // [B]: the smallest gap between two selection values the result depends on (consecutive group
  // scores around the topk_groups cut; consecutive expert scores among the first k+1 candidates
  // of the kept groups). A GPU whose scores differ from these by less than margin/2 selects the
  // same ids in the same order.
  std::vector<double> margin;
};

// Selection from given logits [B, E] (FP64 scoring).
RouterRefResult route_from_logits(const std::vector<double>& logits, int batch, int num_experts,
                                  const RouterRefParams& p);
// logits[b, e] = Σ_h x[b, h] · wr[e, h] (BF16 bits in), then route_from_logits.
RouterRefResult decode_router(const uint16_t* x, int batch, int hidden, const uint16_t* wr,
                              int num_experts, const RouterRefParams& p);

// One projection's expert weights as dequantized doubles. experts[e] is [n, k] row-major, or
// empty when expert e is not provided (a test provides only the routed experts); shared is the
// shared expert's [n, k] or empty (no shared expert).
struct ExpertsRef {
  int64_t n = 0, k = 0;
  std::vector<std::vector<double>> experts;
  std::vector<double> shared;
};

// h[b, j, i] = silu(g)·u with g = x[b]·w1_j[i], u = x[b]·w1_j[I + i]; w1 experts are [2I, H].
// S = k + (shared ? 1 : 0). Also returns g, u and their absolute sums Σ|x·w| (error scales).
struct GateUpRef {
  int slots = 0;
  std::vector<double> h, g, u, g_abs, u_abs;  // [B, S, I]
};
GateUpRef decode_gate_up(const std::vector<double>& x, int batch, int hidden, int inter,
                         const ExpertsRef& w1, const int32_t* ids, int top_k);

// out[b, n] = Σ_j w_j · Σ_i h[b, j, i] · w2_j[n, i] (w = 1 for the shared slot); w2 experts are
// [H, I]. out_abs[b, n] = Σ_j |w_j| · Σ_i |h · w2|.
void decode_down(const std::vector<double>& h, int batch, int inter, int hidden,
                 const ExpertsRef& w2, const int32_t* ids, const double* weights, int top_k,
                 std::vector<double>* out, std::vector<double>* out_abs);

double silu(double g);

// The expert-centric step's recipe (include/mxmoe/decode.h, "the expert-centric decode step") on
// the values the GPU computes with, FP64 sums: x_bf16 [B, H] (BF16 bits) is used as it is
// (mxfp8 = false) or as its row-wise RCEIL fast-form MX values (mxfp8 = true: quantize_rows,
// rebase_fast, dequantize); g and u are rounded to BF16 (GU), h = silu(g)·u to BF16 (H), then
// for mxfp8 H is replaced by its row-wise fast-form MX values; each routed slot's down product is
// rounded to BF16 (Y), the shared slot's is not (FP32 on the GPU); out[b, n] = Σ_j w_j·Y_j + Ys
// (FP64, not rounded). w1, w2: the weight values the GEMMs read (BF16 values, or for MXFP8 the
// prepared fast form's values).
std::vector<double> decode_expert_centric(const std::vector<uint16_t>& x_bf16, int batch, int hidden,
                                          int inter, const ExpertsRef& w1, const ExpertsRef& w2,
                                          const int32_t* ids, const double* weights, int top_k,
                                          bool mxfp8);
// The values of the row-wise RCEIL fast form of v [rows, cols] (BF16 bits): what the GPU's
// quantizers give a fast-mode GEMM.
std::vector<double> fast_form_values(const uint16_t* v, int64_t rows, int64_t cols);

}  // namespace mxmoe::ref
