// CPU reference of the MXFP8 MoE layer (see moe_layer_mx_ref.h and docs/notes/layer.md "Recipe").
// Plain loops; GEMMs in FP64 on the operands' dequantized values; BF16 storage rounds through
// FP32 like a GPU epilogue rounding an FP32 accumulator.
#include "ref/moe_layer_mx_ref.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "ref/mx_ref.h"

namespace mxmoe::ref {
namespace {

double bf(uint16_t b) { return bf16_to_float(b); }
uint16_t to_bf(double v) { return float_to_bf16(float(v)); }
double sigm(double v) { return 1.0 / (1.0 + std::exp(-v)); }
double silu_d(double g) { return g * sigm(g); }
double dsilu_d(double g) {
  const double s = sigm(g);
  return s * (1.0 + g * (1.0 - s));
}

std::vector<double> as_double(const uint16_t* m, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n), 0.0);
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = bf(m[i]);
  return v;
}

// The values a GEMM multiplies for row(M): M [R, C] BF16, blocks of 32 along C.
std::vector<double> operand_rows(const uint16_t* m, int64_t R, int64_t C, const MxLayerOptions& o) {
  if (!o.quantize) return as_double(m, R * C);
  const MxMatrix q = quantize_rows(m, R, C, o.mode);
  return o.fast ? dequantize(rebase_fast(q)) : dequantize(q);
}

// The values for col(M) (the MX tensor of Mᵀ, blocks of 32 along R), laid out back as [R, C].
std::vector<double> operand_cols(const uint16_t* m, int64_t R, int64_t C, const MxLayerOptions& o) {
  if (!o.quantize) return as_double(m, R * C);
  const MxMatrix q = quantize_cols(m, R, C, o.mode);  // [C, R]
  const std::vector<double> t = o.fast ? dequantize(rebase_fast(q)) : dequantize(q);
  std::vector<double> v(static_cast<size_t>(R * C), 0.0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) v[size_t(r * C + c)] = t[size_t(c * R + r)];
  return v;
}

// out[r, n] = to_bf(Σ_k a[r, k] · b[n, k]) for rows [r0, r1); a [·, K], b [N, K].
void gemm_nt_bf16(const std::vector<double>& a, int64_t r0, int64_t r1, const double* b, int64_t N, int64_t K,
                  uint16_t* out) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t kk = 0; kk < K; ++kk) s += a[size_t(r * K + kk)] * b[n * K + kk];
      out[r * N + n] = to_bf(s);
    }
}

// dw[n, m] += Σ_{r in [r0, r1)} a[r, n] · b[r, m]   (the k-grouped wgrad of one expert)
void gemm_tn_acc(const std::vector<double>& a, const std::vector<double>& b, int64_t r0, int64_t r1, int64_t N,
                 int64_t M, double* dw) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t n = 0; n < N; ++n) {
      const double av = a[size_t(r * N + n)];
      if (av == 0.0) continue;
      for (int64_t m = 0; m < M; ++m) dw[n * M + m] += av * b[size_t(r * M + m)];
    }
}

}  // namespace

MxLayerForward moe_forward_mx(const MoeConfig& c, const MxLayerInputs& in, const MxLayerOptions& o) {
  const int64_t T = c.tokens, H = c.hidden, I = c.inter;
  const int E = c.experts, k = c.top_k;
  if (H % 32 || I % 32) throw std::invalid_argument("moe_forward_mx: H and I must be multiples of 32");
  MxLayerForward f;
  // 1. logits (FP64 of the BF16 inputs) and routing
  f.logits.assign(size_t(T * E), 0.0);
  f.ids.assign(size_t(T * k), 0);
  f.w.assign(size_t(T * k), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) {
      double s = 0;
      for (int64_t h = 0; h < H; ++h) s += bf(in.x[size_t(t * H + h)]) * bf(in.wr[size_t(e * H + h)]);
      f.logits[size_t(t * E + e)] = s;
    }
    route_token(c, &f.logits[size_t(t * E)], in.bias.empty() ? nullptr : in.bias.data(), &f.ids[size_t(t * k)],
                &f.w[size_t(t * k)]);
  }
  // 2. plan: stable by (token, slot), segments padded to 128
  std::vector<int32_t> counts(size_t(E), 0);
  for (int32_t e : f.ids) ++counts[size_t(e)];
  f.padded.assign(size_t(E) + 1, 0);
  for (int e = 0; e < E; ++e) f.padded[size_t(e) + 1] = f.padded[size_t(e)] + (counts[size_t(e)] + 127) / 128 * 128;
  f.rows = f.padded[size_t(E)];
  std::vector<int32_t> next(f.padded.begin(), f.padded.end() - 1);
  f.row_of.assign(size_t(T * k), -1);
  for (int64_t i = 0; i < T * k; ++i) f.row_of[size_t(i)] = next[size_t(f.ids[size_t(i)])]++;
  // 3. gather X
  const int64_t R = f.rows;
  f.xp.assign(size_t(R * H), 0);
  for (int64_t i = 0; i < T * k; ++i)
    std::copy_n(&in.x[size_t((i / k) * H)], H, &f.xp[size_t(f.row_of[size_t(i)] * H)]);
  // 4-5. GEMM1 per expert segment
  const std::vector<double> a1 = operand_rows(f.xp.data(), R, H, o);
  f.gu.assign(size_t(R * 2 * I), 0);
  for (int e = 0; e < E; ++e) {
    const std::vector<double> b1 = operand_rows(&in.w1[size_t(e * 2 * I * H)], 2 * I, H, o);
    gemm_nt_bf16(a1, f.padded[size_t(e)], f.padded[size_t(e) + 1], b1.data(), 2 * I, H, f.gu.data());
  }
  // 6. SwiGLU
  f.hact.assign(size_t(R * I), 0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < I; ++i)
      f.hact[size_t(r * I + i)] = to_bf(silu_d(bf(f.gu[size_t(r * 2 * I + i)])) * bf(f.gu[size_t(r * 2 * I + I + i)]));
  // 7. GEMM2
  const std::vector<double> a2 = operand_rows(f.hact.data(), R, I, o);
  f.y.assign(size_t(R * H), 0);
  for (int e = 0; e < E; ++e) {
    const std::vector<double> b2 = operand_rows(&in.w2[size_t(e * H * I)], H, I, o);
    gemm_nt_bf16(a2, f.padded[size_t(e)], f.padded[size_t(e) + 1], b2.data(), H, I, f.y.data());
  }
  // 8. combine in slot order
  f.out.assign(size_t(T * H), 0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      double s = 0;
      for (int j = 0; j < k; ++j)
        s += f.w[size_t(t * k + j)] * bf(f.y[size_t(f.row_of[size_t(t * k + j)] * H + h)]);
      f.out[size_t(t * H + h)] = to_bf(s);
    }
  return f;
}

MxLayerGrads moe_backward_mx(const MoeConfig& c, const MxLayerInputs& in, const MxLayerForward& f,
                             const std::vector<uint16_t>& dout, const MxLayerOptions& o) {
  const int64_t T = c.tokens, H = c.hidden, I = c.inter, R = f.rows;
  const int E = c.experts, k = c.top_k;
  MxLayerGrads d;
  // 1. dw and dY = bf16(w · dOut) gathered into the padded layout
  d.dw.assign(size_t(T * k), 0.0);
  std::vector<uint16_t> dy(size_t(R * H), 0);
  for (int64_t i = 0; i < T * k; ++i) {
    const int64_t t = i / k, row = f.row_of[size_t(i)];
    double s = 0;
    for (int64_t h = 0; h < H; ++h) {
      s += bf(dout[size_t(t * H + h)]) * bf(f.y[size_t(row * H + h)]);
      dy[size_t(row * H + h)] = to_bf(f.w[size_t(i)] * bf(dout[size_t(t * H + h)]));
    }
    d.dw[size_t(i)] = s;
  }
  // 2-3. W2 dgrad and wgrad
  const std::vector<double> dy_rows = operand_rows(dy.data(), R, H, o), dy_cols = operand_cols(dy.data(), R, H, o);
  const std::vector<double> h_cols = operand_cols(f.hact.data(), R, I, o);
  std::vector<uint16_t> dh(size_t(R * I), 0);
  d.dw2.assign(size_t(E * H * I), 0.0);
  for (int e = 0; e < E; ++e) {
    const int64_t r0 = f.padded[size_t(e)], r1 = f.padded[size_t(e) + 1];
    const std::vector<double> w2c = operand_cols(&in.w2[size_t(e * H * I)], H, I, o);  // [H, I]
    std::vector<double> w2t(size_t(I * H));  // [I, H]: the dgrad B operand, K = H contiguous
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < I; ++i) w2t[size_t(i * H + h)] = w2c[size_t(h * I + i)];
    gemm_nt_bf16(dy_rows, r0, r1, w2t.data(), I, H, dh.data());
    gemm_tn_acc(dy_cols, h_cols, r0, r1, H, I, &d.dw2[size_t(e * H * I)]);
  }
  // 4. SwiGLU backward
  std::vector<uint16_t> dgu(size_t(R * 2 * I), 0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < I; ++i) {
      const double g = bf(f.gu[size_t(r * 2 * I + i)]), u = bf(f.gu[size_t(r * 2 * I + I + i)]);
      const double dhv = bf(dh[size_t(r * I + i)]);
      dgu[size_t(r * 2 * I + i)] = to_bf(dhv * u * dsilu_d(g));
      dgu[size_t(r * 2 * I + I + i)] = to_bf(dhv * silu_d(g));
    }
  // 5-6. W1 dgrad and wgrad
  const std::vector<double> dgu_rows = operand_rows(dgu.data(), R, 2 * I, o);
  const std::vector<double> dgu_cols = operand_cols(dgu.data(), R, 2 * I, o), x_cols = operand_cols(f.xp.data(), R, H, o);
  std::vector<uint16_t> dxp(size_t(R * H), 0);
  d.dw1.assign(size_t(E * 2 * I * H), 0.0);
  for (int e = 0; e < E; ++e) {
    const int64_t r0 = f.padded[size_t(e)], r1 = f.padded[size_t(e) + 1];
    const std::vector<double> w1c = operand_cols(&in.w1[size_t(e * 2 * I * H)], 2 * I, H, o);  // [2I, H]
    std::vector<double> w1t(size_t(H * 2 * I));  // [H, 2I]: dgrad B operand, K = 2I contiguous
    for (int64_t n = 0; n < 2 * I; ++n)
      for (int64_t h = 0; h < H; ++h) w1t[size_t(h * 2 * I + n)] = w1c[size_t(n * H + h)];
    gemm_nt_bf16(dgu_rows, r0, r1, w1t.data(), H, 2 * I, dxp.data());
    gemm_tn_acc(dgu_cols, x_cols, r0, r1, 2 * I, H, &d.dw1[size_t(e * 2 * I * H)]);
  }
  // 7-8. un-permute in slot order plus the router's part; router weight gradient
  d.dx.assign(size_t(T * H), 0);
  d.dwr.assign(size_t(E * H), 0.0);
  std::vector<double> dlogit(size_t(E), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    router_backward_token(c, &f.logits[size_t(t * E)], &f.ids[size_t(t * k)], &d.dw[size_t(t * k)], dlogit.data());
    for (int64_t h = 0; h < H; ++h) {
      double s = 0;
      for (int j = 0; j < k; ++j) s += bf(dxp[size_t(f.row_of[size_t(t * k + j)] * H + h)]);
      for (int e = 0; e < E; ++e) s += dlogit[size_t(e)] * bf(in.wr[size_t(e * H + h)]);
      d.dx[size_t(t * H + h)] = to_bf(s);
    }
    for (int e = 0; e < E; ++e)
      for (int64_t h = 0; h < H; ++h) d.dwr[size_t(e * H + h)] += dlogit[size_t(e)] * bf(in.x[size_t(t * H + h)]);
  }
  return d;
}

}  // namespace mxmoe::ref
