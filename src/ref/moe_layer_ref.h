// FP64 CPU reference of the MoE training layer of DESIGN.md §3 (no quantization): routing,
// SwiGLU experts, combine, and the full backward. The oracle the GPU layer (issue 5) is checked
// against; tests/cpu/test_moe_layer_ref.cpp checks its gradients by finite differences.
//
// Shapes (row-major): X [T, H]; router Wr [E, H]; W1 [E, 2I, H] (rows [0, I) gate, [I, 2I) up);
// W2 [E, H, I]. Per token t and slot j (j = 0..k-1, the order of the top-k selection):
//   e = ids[t, j];  g = W1[e, :I]·x_t;  u = W1[e, I:]·x_t;  h = silu(g) ⊙ u;  y = W2[e]·h
//   out[t] = Σ_j w[t, j] · y_{t,j}   (summed in slot order)
#pragma once
#include <cstdint>
#include <vector>

namespace mxmoe::ref {

enum class Routing {
  kSoftmaxTopK,      // Qwen3: p = softmax(logits); top-k of p; w = p / Σ_selected p
  kSigmoidGrouped,   // DeepSeek-V3: s = sigmoid(logits); select by s + bias with group-limited
                     // top-k (group score = sum of its top-2 biased scores); w = scale · s / Σ_selected s
};

struct MoeConfig {
  int64_t tokens = 0, hidden = 0, inter = 0;
  int experts = 0, top_k = 0;
  Routing routing = Routing::kSoftmaxTopK;
  int n_groups = 1, topk_groups = 1;  // kSigmoidGrouped only
  double route_scale = 1.0;           // kSigmoidGrouped only
};

struct MoeWeights {
  std::vector<double> wr, w1, w2;  // [E, H], [E, 2I, H], [E, H, I]
  std::vector<double> bias;        // [E] selection bias (kSigmoidGrouped), no gradient
};

struct MoeForward {
  std::vector<int32_t> ids;   // [T, k]
  std::vector<double> w;      // [T, k] routing weights
  std::vector<double> logits; // [T, E]
  std::vector<double> g, u;   // [T, k, I] pre-activations (saved for backward)
  std::vector<double> y;      // [T, k, H] expert outputs before weighting
  std::vector<double> out;    // [T, H]
};

struct MoeGrads {
  std::vector<double> dx, dwr, dw1, dw2;  // like X, Wr, W1, W2
  std::vector<double> dw;                 // [T, k] gradient of the routing weights
};

// Top-k selection of one token (the rule of ref::route_from_logits in decode_ref.h: ties go to
// the lower expert id). bias: [E] or null, used by kSigmoidGrouped for selection only.
void route_token(const MoeConfig& c, const double* logits, const double* bias, int32_t* ids, double* w);

// d loss / d logits of one token from the gradient of its routing weights dw [k] (softmax
// renormalised or sigmoid scaled; the selection itself has no gradient). dlogit: [E].
void router_backward_token(const MoeConfig& c, const double* logits, const int32_t* ids, const double* dw,
                           double* dlogit);

MoeForward moe_forward(const MoeConfig& c, const MoeWeights& wt, const std::vector<double>& x);
MoeGrads moe_backward(const MoeConfig& c, const MoeWeights& wt, const std::vector<double>& x,
                      const MoeForward& f, const std::vector<double>& dout);

}  // namespace mxmoe::ref
