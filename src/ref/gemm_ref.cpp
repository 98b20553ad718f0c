// CPU reference for the grouped GEMMs; see gemm_ref.h.
#include "ref/gemm_ref.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <thread>

namespace mxmoe::ref {

void m_grouped_gemm_nt(const double* a, const double* b, int64_t m_total, int num_experts,
                       int64_t n, int64_t k, const std::vector<int32_t>& offsets, double* y,
                       double* y_abs) {
  if (int64_t(offsets.size()) != int64_t(num_experts) + 1)
    throw std::invalid_argument("ref::m_grouped_gemm_nt: offsets must hold num_experts + 1 entries");
  for (int e = 0; e < num_experts; ++e)
    if (offsets[e] > offsets[e + 1] || offsets[e] < 0 || offsets[e + 1] > m_total)
      throw std::invalid_argument("ref::m_grouped_gemm_nt: offsets must be non-decreasing in [0, m_total]");
  // Row -> expert (or -1 outside every segment).
  std::vector<int> expert(size_t(m_total), -1);
  for (int e = 0; e < num_experts; ++e)
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) expert[size_t(r)] = e;

  auto rows = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int e = expert[size_t(r)];
      if (e < 0) continue;
      const double* ar = a + r * k;
      for (int64_t j = 0; j < n; ++j) {
        const double* bj = b + (int64_t(e) * n + j) * k;
        double s = 0.0, sa = 0.0;
        for (int64_t i = 0; i < k; ++i) {
          s += ar[i] * bj[i];
          if (y_abs) sa += std::fabs(ar[i] * bj[i]);
        }
        y[r * n + j] = s;
        if (y_abs) y_abs[r * n + j] = sa;
      }
    }
  };
  const int64_t threads =
      std::max<int64_t>(1, std::min<int64_t>(std::thread::hardware_concurrency(), m_total / 16));
  std::vector<std::thread> pool;
  const int64_t chunk = (m_total + threads - 1) / std::max<int64_t>(threads, 1);
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t r0 = t * chunk, r1 = std::min(m_total, r0 + chunk);
    if (r0 < r1) pool.emplace_back(rows, r0, r1);
  }
  for (auto& th : pool) th.join();
}

template <class M>
static std::vector<double> mx_gemm(const M& a, const M& b, int num_experts,
                                   const std::vector<int32_t>& offsets, std::vector<double>* y_abs) {
  if (a.cols != b.cols) throw std::invalid_argument("ref::m_grouped_gemm_nt: a.cols != b.cols");
  if (num_experts <= 0 || b.rows % num_experts != 0)
    throw std::invalid_argument("ref::m_grouped_gemm_nt: b.rows must be num_experts · n");
  const int64_t n = b.rows / num_experts;
  const std::vector<double> da = dequantize(a), db = dequantize(b);
  std::vector<double> y(size_t(a.rows * n), 0.0);
  if (y_abs) y_abs->assign(y.size(), 0.0);
  m_grouped_gemm_nt(da.data(), db.data(), a.rows, num_experts, n, a.cols, offsets, y.data(),
                    y_abs ? y_abs->data() : nullptr);
  return y;
}

std::vector<double> m_grouped_gemm_nt(const MxMatrix& a, const MxMatrix& b, int num_experts,
                                      const std::vector<int32_t>& offsets,
                                      std::vector<double>* y_abs) {
  return mx_gemm(a, b, num_experts, offsets, y_abs);
}

std::vector<double> m_grouped_gemm_nt(const FastMatrix& a, const FastMatrix& b, int num_experts,
                                      const std::vector<int32_t>& offsets,
                                      std::vector<double>* y_abs) {
  return mx_gemm(a, b, num_experts, offsets, y_abs);
}

void k_grouped_gemm_nt(const double* a, const double* b, int64_t m_total, int num_experts,
                       int64_t n, int64_t k, const std::vector<int32_t>& offsets, double* dw,
                       double* dw_abs) {
  if (int64_t(offsets.size()) != int64_t(num_experts) + 1)
    throw std::invalid_argument("ref::k_grouped_gemm_nt: offsets must hold num_experts + 1 entries");
  for (int e = 0; e < num_experts; ++e)
    if (offsets[e] > offsets[e + 1] || offsets[e] < 0 || offsets[e + 1] > m_total)
      throw std::invalid_argument("ref::k_grouped_gemm_nt: offsets must be non-decreasing in [0, m_total]");
  auto rows = [&](int64_t j0, int64_t j1) {  // rows j of every expert's dW
    for (int e = 0; e < num_experts; ++e)
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t i = 0; i < k; ++i) {
          double s = 0.0, sa = 0.0;
          for (int64_t t = offsets[e]; t < offsets[e + 1]; ++t) {
            const double p = a[j * m_total + t] * b[i * m_total + t];
            s += p;
            sa += std::fabs(p);
          }
          dw[(int64_t(e) * n + j) * k + i] = s;
          if (dw_abs) dw_abs[(int64_t(e) * n + j) * k + i] = sa;
        }
  };
  const int64_t threads =
      std::max<int64_t>(1, std::min<int64_t>(std::thread::hardware_concurrency(), n));
  const int64_t chunk = (n + threads - 1) / threads;
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t j0 = t * chunk, j1 = std::min(n, j0 + chunk);
    if (j0 < j1) pool.emplace_back(rows, j0, j1);
  }
  for (auto& th : pool) th.join();
}

std::vector<double> k_grouped_gemm_nt(const MxMatrix& a, const MxMatrix& b, int num_experts,
                                      const std::vector<int32_t>& offsets) {
  if (a.cols != b.cols) throw std::invalid_argument("ref::k_grouped_gemm_nt: a.cols != b.cols");
  const std::vector<double> da = dequantize(a), db = dequantize(b);
  std::vector<double> dw(size_t(num_experts * a.rows * b.rows), 0.0);
  k_grouped_gemm_nt(da.data(), db.data(), a.cols, num_experts, a.rows, b.rows, offsets, dw.data());
  return dw;
}

}  // namespace mxmoe::ref
