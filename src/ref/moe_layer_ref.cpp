// FP64 reference of the MoE layer (see moe_layer_ref.h). Plain loops, fixed summation orders.
#include "ref/moe_layer_ref.h"

#include "ref/decode_ref.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace mxmoe::ref {
namespace {

double dsilu(double g) {
  const double s = 1.0 / (1.0 + std::exp(-g));
  return s * (1.0 + g * (1.0 - s));
}
double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

void check_config(const MoeConfig& c) {
  if (c.tokens < 0 || c.hidden <= 0 || c.inter <= 0 || c.experts <= 0 || c.top_k <= 0 || c.top_k > c.experts)
    throw std::invalid_argument("moe reference: bad sizes");
  if (c.routing == Routing::kSigmoidGrouped &&
      (c.n_groups <= 0 || c.experts % c.n_groups != 0 || c.topk_groups <= 0 || c.topk_groups > c.n_groups ||
       c.top_k > c.topk_groups * (c.experts / c.n_groups)))
    throw std::invalid_argument("moe reference: bad group routing");
}

}  // namespace

// The routing rule is decode_ref's (one CPU reference of routing for the whole library).
void route_token(const MoeConfig& c, const double* logits, const double* bias, int32_t* ids, double* w) {
  RouterRefParams rp;
  rp.sigmoid = c.routing == Routing::kSigmoidGrouped;
  rp.top_k = c.top_k;
  rp.renormalize = true;
  rp.n_groups = rp.sigmoid ? c.n_groups : 1;
  rp.topk_groups = rp.sigmoid ? c.topk_groups : 1;
  rp.scaling_factor = rp.sigmoid ? c.route_scale : 1.0;
  std::vector<float> fbias;
  if (rp.sigmoid && bias) {
    fbias.assign(bias, bias + c.experts);
    rp.bias = fbias.data();
  }
  const RouterRefResult r = route_from_logits(std::vector<double>(logits, logits + c.experts), 1, c.experts, rp);
  for (int j = 0; j < c.top_k; ++j) {
    ids[j] = r.ids[size_t(j)];
    w[j] = r.weights[size_t(j)];
  }
}

MoeForward moe_forward(const MoeConfig& c, const MoeWeights& wt, const std::vector<double>& x) {
  check_config(c);
  const int64_t T = c.tokens, H = c.hidden, I = c.inter;
  const int E = c.experts, k = c.top_k;
  MoeForward f;
  f.ids.resize(size_t(T * k));
  f.w.resize(size_t(T * k));
  f.logits.assign(size_t(T * E), 0.0);
  f.g.assign(size_t(T * k * I), 0.0);
  f.u.assign(size_t(T * k * I), 0.0);
  f.y.assign(size_t(T * k * H), 0.0);
  f.out.assign(size_t(T * H), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const double* xt = &x[size_t(t * H)];
    for (int e = 0; e < E; ++e) {
      double s = 0;
      for (int64_t h = 0; h < H; ++h) s += wt.wr[size_t(e * H + h)] * xt[h];
      f.logits[size_t(t * E + e)] = s;
    }
    route_token(c, &f.logits[size_t(t * E)], wt.bias.empty() ? nullptr : wt.bias.data(), &f.ids[size_t(t * k)],
                &f.w[size_t(t * k)]);
    for (int j = 0; j < k; ++j) {
      const int64_t e = f.ids[size_t(t * k + j)];
      const double* w1 = &wt.w1[size_t(e * 2 * I * H)];
      const double* w2 = &wt.w2[size_t(e * H * I)];
      double* g = &f.g[size_t((t * k + j) * I)];
      double* u = &f.u[size_t((t * k + j) * I)];
      std::vector<double> hv(static_cast<size_t>(I), 0.0);
      for (int64_t i = 0; i < I; ++i) {
        double sg = 0, su = 0;
        for (int64_t h = 0; h < H; ++h) {
          sg += w1[i * H + h] * xt[h];
          su += w1[(I + i) * H + h] * xt[h];
        }
        g[i] = sg;
        u[i] = su;
        hv[size_t(i)] = silu(sg) * su;
      }
      double* y = &f.y[size_t((t * k + j) * H)];
      for (int64_t n = 0; n < H; ++n) {
        double s = 0;
        for (int64_t i = 0; i < I; ++i) s += w2[n * I + i] * hv[size_t(i)];
        y[n] = s;
      }
    }
    for (int j = 0; j < k; ++j)  // combine in slot order
      for (int64_t n = 0; n < H; ++n)
        f.out[size_t(t * H + n)] += f.w[size_t(t * k + j)] * f.y[size_t((t * k + j) * H + n)];
  }
  return f;
}

void router_backward_token(const MoeConfig& c, const double* lg, const int32_t* ids, const double* dwt,
                           double* dlogit) {
  const int E = c.experts, k = c.top_k;
  std::fill(dlogit, dlogit + E, 0.0);
  if (c.routing == Routing::kSoftmaxTopK) {
    // w_j = p_j / S, S = Σ_sel p;  dp_e = dw_e / S - Σ_j dw_j p_j / S² (selected e);  dl = p ⊙ (dp - p·dp)
    const double m = *std::max_element(lg, lg + E);
    std::vector<double> p(static_cast<size_t>(E), 0.0);
    double z = 0;
    for (int e = 0; e < E; ++e) z += (p[size_t(e)] = std::exp(lg[e] - m));
    for (auto& v : p) v /= z;
    double S = 0, wsum = 0;
    for (int j = 0; j < k; ++j) S += p[size_t(ids[j])];
    for (int j = 0; j < k; ++j) wsum += dwt[j] * p[size_t(ids[j])];
    std::vector<double> dp(size_t(E), 0.0);
    for (int j = 0; j < k; ++j) dp[size_t(ids[j])] += dwt[j] / S - wsum / (S * S);
    double pdp = 0;
    for (int e = 0; e < E; ++e) pdp += p[size_t(e)] * dp[size_t(e)];
    for (int e = 0; e < E; ++e) dlogit[e] = p[size_t(e)] * (dp[size_t(e)] - pdp);
  } else {
    // w_j = c · s_j / S, S = Σ_sel s;  ds_e = c (dw_e / S - Σ_j dw_j s_j / S²);  dl = ds ⊙ s (1 - s)
    double S = 0, wsum = 0;
    for (int j = 0; j < k; ++j) S += sigmoid(lg[ids[j]]);
    for (int j = 0; j < k; ++j) wsum += dwt[j] * sigmoid(lg[ids[j]]);
    for (int j = 0; j < k; ++j) {
      const double s = sigmoid(lg[ids[j]]);
      const double ds = c.route_scale * (dwt[j] / S - wsum / (S * S));
      dlogit[ids[j]] += ds * s * (1 - s);
    }
  }
}

MoeGrads moe_backward(const MoeConfig& c, const MoeWeights& wt, const std::vector<double>& x,
                      const MoeForward& f, const std::vector<double>& dout) {
  check_config(c);
  const int64_t T = c.tokens, H = c.hidden, I = c.inter;
  const int E = c.experts, k = c.top_k;
  MoeGrads d;
  d.dx.assign(x.size(), 0.0);
  d.dwr.assign(wt.wr.size(), 0.0);
  d.dw1.assign(wt.w1.size(), 0.0);
  d.dw2.assign(wt.w2.size(), 0.0);
  d.dw.assign(size_t(T * k), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const double* xt = &x[size_t(t * H)];
    const double* go = &dout[size_t(t * H)];
    double* dxt = &d.dx[size_t(t * H)];
    for (int j = 0; j < k; ++j) {
      const int64_t e = f.ids[size_t(t * k + j)];
      const double wj = f.w[size_t(t * k + j)];
      const double* y = &f.y[size_t((t * k + j) * H)];
      double dwj = 0;
      for (int64_t n = 0; n < H; ++n) dwj += go[n] * y[n];
      d.dw[size_t(t * k + j)] = dwj;
      const double* g = &f.g[size_t((t * k + j) * I)];
      const double* u = &f.u[size_t((t * k + j) * I)];
      const double* w1 = &wt.w1[size_t(e * 2 * I * H)];
      const double* w2 = &wt.w2[size_t(e * H * I)];
      double* dw1 = &d.dw1[size_t(e * 2 * I * H)];
      double* dw2 = &d.dw2[size_t(e * H * I)];
      for (int64_t i = 0; i < I; ++i) {
        double dh = 0;
        for (int64_t n = 0; n < H; ++n) dh += w2[n * I + i] * wj * go[n];
        const double hv = silu(g[i]) * u[i];
        for (int64_t n = 0; n < H; ++n) dw2[n * I + i] += wj * go[n] * hv;
        const double dg = dh * u[i] * dsilu(g[i]), du = dh * silu(g[i]);
        for (int64_t h = 0; h < H; ++h) {
          dxt[h] += w1[i * H + h] * dg + w1[(I + i) * H + h] * du;
          dw1[i * H + h] += dg * xt[h];
          dw1[(I + i) * H + h] += du * xt[h];
        }
      }
    }
    // Router: gradient through the routing weights only (the selection is piecewise constant).
    std::vector<double> dlogit(size_t(E), 0.0);
    router_backward_token(c, &f.logits[size_t(t * E)], &f.ids[size_t(t * k)], &d.dw[size_t(t * k)], dlogit.data());
    for (int e = 0; e < E; ++e)
      for (int64_t h = 0; h < H; ++h) {
        d.dwr[size_t(e * H + h)] += dlogit[size_t(e)] * xt[h];
        dxt[h] += dlogit[size_t(e)] * wt.wr[size_t(e * H + h)];
      }
  }
  return d;
}

}  // namespace mxmoe::ref
