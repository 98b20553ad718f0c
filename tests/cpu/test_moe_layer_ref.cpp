// The FP64 MoE layer reference (src/ref/moe_layer_ref.cpp): routing rules, and every gradient
// (dX, dWr, dW1, dW2) against central finite differences of L = Σ out ⊙ G.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ref/moe_layer_ref.h"

using namespace mxmoe::ref;

namespace {

struct Problem {
  MoeConfig c;
  MoeWeights w;
  std::vector<double> x, gout;
};

Problem make(Routing r, int T, int H, int I, int E, int k, std::mt19937& rng) {
  Problem p;
  p.c.tokens = T;
  p.c.hidden = H;
  p.c.inter = I;
  p.c.experts = E;
  p.c.top_k = k;
  p.c.routing = r;
  if (r == Routing::kSigmoidGrouped) {
    p.c.n_groups = 4;
    p.c.topk_groups = 2;
    p.c.route_scale = 2.5;
  }
  std::normal_distribution<double> g(0.0, 1.0);
  auto fill = [&](std::vector<double>& v, size_t n, double s) {
    v.resize(n);
    for (auto& e : v) e = g(rng) * s;
  };
  fill(p.x, size_t(T * H), 1.0);
  fill(p.w.wr, size_t(E * H), 1.0);  // large logits: well-separated routing scores
  fill(p.w.w1, size_t(E * 2 * I * H), 1.0 / std::sqrt(H));
  fill(p.w.w2, size_t(E * H * I), 1.0 / std::sqrt(I));
  fill(p.w.bias, size_t(E), 0.1);
  fill(p.gout, size_t(T * H), 1.0);
  return p;
}

double loss(const Problem& p, const MoeForward& f) {
  double s = 0;
  for (size_t i = 0; i < f.out.size(); ++i) s += f.out[i] * p.gout[i];
  return s;
}

// Central differences on `count` random entries of v; skips entries whose perturbation changes
// the routing (the selection is piecewise constant). Returns the number of entries checked.
int check_grad(Problem& p, std::vector<double>& v, const std::vector<double>& grad, const char* what,
               std::mt19937& rng, int count = 40) {
  const MoeForward base = moe_forward(p.c, p.w, p.x);
  int checked = 0;
  for (int n = 0; n < count; ++n) {
    const size_t i = rng() % v.size();
    const double keep = v[i], eps = 1e-5 * std::max(1.0, std::fabs(keep));
    v[i] = keep + eps;
    const MoeForward fp = moe_forward(p.c, p.w, p.x);
    v[i] = keep - eps;
    const MoeForward fm = moe_forward(p.c, p.w, p.x);
    v[i] = keep;
    if (fp.ids != base.ids || fm.ids != base.ids) continue;
    const double fd = (loss(p, fp) - loss(p, fm)) / (2 * eps);
    EXPECT_NEAR(grad[i], fd, 1e-6 * std::max(1.0, std::fabs(fd))) << what << "[" << i << "]";
    ++checked;
  }
  return checked;
}

}  // namespace

TEST(MoeLayerRef, SoftmaxTopKRenormalises) {
  MoeConfig c;
  c.experts = 6;
  c.top_k = 3;
  const double logits[6] = {0.5, 2.0, 2.0, -1.0, 1.0, 0.0};
  int32_t ids[3];
  double w[3];
  route_token(c, logits, nullptr, ids, w);
  EXPECT_EQ(ids[0], 1);  // tie between 1 and 2: lower id first
  EXPECT_EQ(ids[1], 2);
  EXPECT_EQ(ids[2], 4);
  EXPECT_NEAR(w[0] + w[1] + w[2], 1.0, 1e-15);
  EXPECT_DOUBLE_EQ(w[0], w[1]);
}

TEST(MoeLayerRef, SigmoidGroupLimitedSelectsInsideTopGroups) {
  MoeConfig c;
  c.experts = 8;
  c.top_k = 2;
  c.routing = Routing::kSigmoidGrouped;
  c.n_groups = 4;  // groups {0,1} {2,3} {4,5} {6,7}
  c.topk_groups = 1;
  c.route_scale = 2.0;
  // Expert 7 has the single largest score, but group {2,3} has the largest sum of its top-2.
  const double logits[8] = {-3, -3, 2.0, 2.0, -3, -3, -3, 3.0};
  int32_t ids[2];
  double w[2];
  route_token(c, logits, nullptr, ids, w);
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(ids[1], 3);
  EXPECT_NEAR(w[0] + w[1], 2.0, 1e-15);
  // A selection bias moves the choice but not the weights' formula.
  const double bias[8] = {0, 0, 0, -0.5, 0, 0, 0, 0};
  c.topk_groups = 2;
  route_token(c, logits, bias, ids, w);
  EXPECT_EQ(ids[0], 7);  // groups {6,7} (1.95 + 0.05) and {2,3} win; 7 has the top biased score
  EXPECT_EQ(ids[1], 2);
}

TEST(MoeLayerRef, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(std::random_device{}());
  for (Routing r : {Routing::kSoftmaxTopK, Routing::kSigmoidGrouped}) {
    Problem p = make(r, 5, 16, 8, 8, r == Routing::kSoftmaxTopK ? 2 : 3, rng);
    const MoeForward f = moe_forward(p.c, p.w, p.x);
    const MoeGrads d = moe_backward(p.c, p.w, p.x, f, p.gout);
    int n = 0;
    n += check_grad(p, p.x, d.dx, "dX", rng);
    n += check_grad(p, p.w.wr, d.dwr, "dWr", rng);
    n += check_grad(p, p.w.w1, d.dw1, "dW1", rng);
    n += check_grad(p, p.w.w2, d.dw2, "dW2", rng);
    EXPECT_GT(n, 120) << "too many entries skipped because routing flipped";
  }
}

TEST(MoeLayerRef, TopOneWithWeightOneIsThePlainExpert) {
  // k = 1 with softmax renormalisation gives weight 1: out = W2[e]·(silu(W1g x) ⊙ W1u x).
  std::mt19937 rng(7);
  Problem p = make(Routing::kSoftmaxTopK, 3, 8, 4, 4, 1, rng);
  const MoeForward f = moe_forward(p.c, p.w, p.x);
  for (int t = 0; t < 3; ++t) {
    EXPECT_DOUBLE_EQ(f.w[size_t(t)], 1.0);
    for (int n = 0; n < 8; ++n) EXPECT_DOUBLE_EQ(f.out[size_t(t * 8 + n)], f.y[size_t(t * 8 + n)]);
  }
}
