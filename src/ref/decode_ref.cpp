// FP64 reference of the warp-decode path; see decode_ref.h.
#include "ref/decode_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace mxmoe::ref {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Candidate order: higher score first, ties → lower id.
struct Scored {
  double v;
  int id;
};
bool before(const Scored& a, const Scored& b) { return a.v > b.v || (a.v == b.v && a.id < b.id); }

double nan_to_neg_inf(double v) { return std::isnan(v) ? -kInf : v; }

const std::vector<double>& expert_rows(const ExpertsRef& w, int32_t id, int top_k, int j) {
  if (j >= top_k) {
    if (w.shared.empty()) throw std::invalid_argument("decode_ref: slot past top_k without a shared expert");
    return w.shared;
  }
  if (id < 0 || size_t(id) >= w.experts.size() || w.experts[size_t(id)].empty())
    throw std::invalid_argument("decode_ref: routed to expert " + std::to_string(id) + ", which was not provided");
  return w.experts[size_t(id)];
}

}  // namespace

double silu(double g) { return g / (1.0 + std::exp(-g)); }

RouterRefResult route_from_logits(const std::vector<double>& logits, int batch, int num_experts,
                                  const RouterRefParams& p) {
  const int E = num_experts, k = p.top_k;
  RouterRefResult r;
  r.logits = logits;
  r.ids.assign(size_t(batch) * k, 0);
  r.weights.assign(size_t(batch) * k, 0.0);
  r.margin.assign(size_t(batch), kInf);
  for (int b = 0; b < batch; ++b) {
    const double* l = &logits[size_t(b) * E];
    std::vector<double> sel(static_cast<size_t>(E)), src(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) {
      if (p.sigmoid) {
        src[e] = 1.0 / (1.0 + std::exp(-l[e]));
        sel[e] = src[e] + (p.bias ? double(p.bias[e]) : 0.0);
      } else {
        src[e] = l[e];
        sel[e] = l[e];
      }
      sel[e] = nan_to_neg_inf(sel[e]);
    }
    double margin = kInf;
    std::vector<char> allowed(size_t(E), 1);
    if (p.sigmoid && p.n_groups > 1) {
      const int G = E / p.n_groups;
      std::vector<Scored> groups;
      for (int g = 0; g < p.n_groups; ++g) {
        std::vector<double> v(sel.begin() + g * G, sel.begin() + (g + 1) * G);
        std::sort(v.begin(), v.end(), [](double a, double c) { return a > c; });
        groups.push_back({nan_to_neg_inf(v[0] + v[1]), g});
      }
      std::sort(groups.begin(), groups.end(), before);
      if (p.topk_groups < p.n_groups)
        margin = std::min(margin, groups[p.topk_groups - 1].v - groups[p.topk_groups].v);
      std::fill(allowed.begin(), allowed.end(), 0);
      for (int q = 0; q < p.topk_groups; ++q)
        for (int e = groups[q].id * G; e < (groups[q].id + 1) * G; ++e) allowed[e] = 1;
    }
    std::vector<Scored> cand;
    for (int e = 0; e < E; ++e)
      if (allowed[e]) cand.push_back({sel[e], e});
    std::sort(cand.begin(), cand.end(), before);
    const int last = std::min<int>(k, int(cand.size()) - 1);  // compare ranks 0..k (k+1 values)
    for (int q = 0; q < last; ++q) margin = std::min(margin, cand[q].v - cand[q + 1].v);
    r.margin[b] = margin;

    double den = 0.0;
    if (!p.sigmoid) {
      double m = -kInf;
      for (int e = 0; e < E; ++e) m = std::max(m, l[e]);
      if (p.renormalize) {
        for (int q = 0; q < k; ++q) den += std::exp(src[cand[q].id] - m);
      } else {
        for (int e = 0; e < E; ++e) den += std::exp(l[e] - m);
      }
      for (int q = 0; q < k; ++q)
        r.weights[size_t(b) * k + q] = std::exp(src[cand[q].id] - m) / den * p.scaling_factor;
    } else {
      for (int q = 0; q < k; ++q) den += src[cand[q].id];
      for (int q = 0; q < k; ++q) {
        const double s = src[cand[q].id];
        r.weights[size_t(b) * k + q] = (p.renormalize ? s / den : s) * p.scaling_factor;
      }
    }
    for (int q = 0; q < k; ++q) r.ids[size_t(b) * k + q] = cand[q].id;
  }
  return r;
}

RouterRefResult decode_router(const uint16_t* x, int batch, int hidden, const uint16_t* wr,
                              int num_experts, const RouterRefParams& p) {
  std::vector<double> logits(size_t(batch) * num_experts);
  for (int b = 0; b < batch; ++b)
    for (int e = 0; e < num_experts; ++e) {
      double s = 0.0;
      for (int h = 0; h < hidden; ++h)
        s += double(bf16_to_float(x[size_t(b) * hidden + h])) *
             double(bf16_to_float(wr[size_t(e) * hidden + h]));
      logits[size_t(b) * num_experts + e] = s;
    }
  return route_from_logits(logits, batch, num_experts, p);
}

GateUpRef decode_gate_up(const std::vector<double>& x, int batch, int hidden, int inter,
                         const ExpertsRef& w1, const int32_t* ids, int top_k) {
  if (w1.n != 2 * int64_t(inter) || w1.k != hidden)
    throw std::invalid_argument("decode_ref::decode_gate_up: w1 experts must be [2·inter, hidden]");
  GateUpRef r;
  r.slots = top_k + (w1.shared.empty() ? 0 : 1);
  const size_t n = size_t(batch) * r.slots * inter;
  r.h.assign(n, 0.0);
  r.g.assign(n, 0.0);
  r.u.assign(n, 0.0);
  r.g_abs.assign(n, 0.0);
  r.u_abs.assign(n, 0.0);
  for (int b = 0; b < batch; ++b) {
    const double* xb = &x[size_t(b) * hidden];
    for (int j = 0; j < r.slots; ++j) {
      const int32_t id = j < top_k ? ids[size_t(b) * top_k + j] : -1;
      const std::vector<double>& w = expert_rows(w1, id, top_k, j);
      for (int i = 0; i < inter; ++i) {
        const double* wg = &w[size_t(i) * hidden];
        const double* wu = &w[(size_t(inter) + i) * hidden];
        double g = 0, u = 0, ga = 0, ua = 0;
        for (int q = 0; q < hidden; ++q) {
          g += xb[q] * wg[q];
          u += xb[q] * wu[q];
          ga += std::fabs(xb[q] * wg[q]);
          ua += std::fabs(xb[q] * wu[q]);
        }
        const size_t o = (size_t(b) * r.slots + j) * inter + i;
        r.g[o] = g;
        r.u[o] = u;
        r.g_abs[o] = ga;
        r.u_abs[o] = ua;
        r.h[o] = silu(g) * u;
      }
    }
  }
  return r;
}

void decode_down(const std::vector<double>& h, int batch, int inter, int hidden,
                 const ExpertsRef& w2, const int32_t* ids, const double* weights, int top_k,
                 std::vector<double>* out, std::vector<double>* out_abs) {
  if (w2.n != hidden || w2.k != inter)
    throw std::invalid_argument("decode_ref::decode_down: w2 experts must be [hidden, inter]");
  const int slots = top_k + (w2.shared.empty() ? 0 : 1);
  if (h.size() != size_t(batch) * slots * inter)
    throw std::invalid_argument("decode_ref::decode_down: h must be [batch, slots, inter]");
  out->assign(size_t(batch) * hidden, 0.0);
  if (out_abs) out_abs->assign(size_t(batch) * hidden, 0.0);
  for (int b = 0; b < batch; ++b)
    for (int j = 0; j < slots; ++j) {
      const int32_t id = j < top_k ? ids[size_t(b) * top_k + j] : -1;
      const std::vector<double>& w = expert_rows(w2, id, top_k, j);
      const double wj = j < top_k ? weights[size_t(b) * top_k + j] : 1.0;
      const double* hb = &h[(size_t(b) * slots + j) * inter];
      for (int n = 0; n < hidden; ++n) {
        const double* wr = &w[size_t(n) * inter];
        double s = 0, sa = 0;
        for (int i = 0; i < inter; ++i) {
          s += hb[i] * wr[i];
          sa += std::fabs(hb[i] * wr[i]);
        }
        (*out)[size_t(b) * hidden + n] += wj * s;
        if (out_abs) (*out_abs)[size_t(b) * hidden + n] += std::fabs(wj) * sa;
      }
    }
}

std::vector<double> fast_form_values(const uint16_t* v, int64_t rows, int64_t cols) {
  return dequantize(rebase_fast(quantize_rows(v, rows, cols, ScaleMode::kRceil)));
}

std::vector<double> decode_expert_centric(const std::vector<uint16_t>& x_bf16, int batch, int hidden,
                                          int inter, const ExpertsRef& w1, const ExpertsRef& w2,
                                          const int32_t* ids, const double* weights, int top_k,
                                          bool mxfp8) {
  if (x_bf16.size() != size_t(batch) * hidden)
    throw std::invalid_argument("decode_ref::decode_expert_centric: x must be [batch, hidden]");
  if (w2.n != hidden || w2.k != inter)
    throw std::invalid_argument("decode_ref::decode_expert_centric: w2 experts must be [hidden, inter]");
  std::vector<double> x(x_bf16.size());
  if (mxfp8) {
    x = fast_form_values(x_bf16.data(), batch, hidden);
  } else {
    for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_float(x_bf16[i]);
  }
  const GateUpRef gu = decode_gate_up(x, batch, hidden, inter, w1, ids, top_k);
  const int slots = gu.slots;
  // H as stored (BF16), then its MX values for the fast GEMM2
  std::vector<uint16_t> hb(gu.h.size());
  for (size_t i = 0; i < hb.size(); ++i) {
    const double g = bf16_to_float(bf16_from_double(gu.g[i])), u = bf16_to_float(bf16_from_double(gu.u[i]));
    hb[i] = bf16_from_double(silu(g) * u);
  }
  std::vector<double> h(hb.size());
  if (mxfp8) {
    h = fast_form_values(hb.data(), int64_t(batch) * slots, inter);
  } else {
    for (size_t i = 0; i < h.size(); ++i) h[i] = bf16_to_float(hb[i]);
  }
  std::vector<double> out(size_t(batch) * hidden, 0.0);
  for (int b = 0; b < batch; ++b)
    for (int j = 0; j < slots; ++j) {
      const int32_t id = j < top_k ? ids[size_t(b) * top_k + j] : -1;
      const std::vector<double>& w = expert_rows(w2, id, top_k, j);
      const double* hr = &h[(size_t(b) * slots + j) * inter];
      for (int n = 0; n < hidden; ++n) {
        const double* wr = &w[size_t(n) * inter];
        double y = 0;
        for (int i = 0; i < inter; ++i) y += hr[i] * wr[i];
        if (j < top_k) {
          out[size_t(b) * hidden + n] += weights[size_t(b) * top_k + j] * bf16_to_float(bf16_from_double(y));
        } else {
          out[size_t(b) * hidden + n] += y;
        }
      }
    }
  return out;
}

}  // namespace mxmoe::ref
