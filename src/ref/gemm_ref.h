// CPU reference for the grouped GEMMs (include/mxmoe/gemm.h), FP64 accumulation, written from the
// definition and not from the kernels. Convention Y = X · Wᵀ.
#pragma once
#include <cstdint>
#include <vector>

#include "ref/mx_ref.h"

namespace mxmoe::ref {

// m-grouped: y[r, j] = Σ_k a[r, k] · b[e, j, k] for offsets[e] <= r < offsets[e+1].
//   a [m_total, k], b [num_experts, n, k], y [m_total, n], all row-major double.
//   Rows outside every segment are left untouched in y. When y_abs is given it receives
//   Σ_k |a[r, k]| · |b[e, j, k]| (the scale of the rounding-error bounds) for the same rows.
//   offsets are host values here: [num_experts + 1], non-decreasing, offsets[E] <= m_total.
//   Parallel over rows (std::thread); the result does not depend on the thread count.
void m_grouped_gemm_nt(const double* a, const double* b, int64_t m_total, int num_experts,
                       int64_t n, int64_t k, const std::vector<int32_t>& offsets, double* y,
                       double* y_abs = nullptr);

// The same on MX operands, dequantized exactly: a [m_total, k], b [num_experts·n, k] (i.e.
// [E, N, K]). Returns y [m_total, n] with zeros outside the segments.
std::vector<double> m_grouped_gemm_nt(const MxMatrix& a, const MxMatrix& b, int num_experts,
                                      const std::vector<int32_t>& offsets,
                                      std::vector<double>* y_abs = nullptr);
std::vector<double> m_grouped_gemm_nt(const FastMatrix& a, const FastMatrix& b, int num_experts,
                                      const std::vector<int32_t>& offsets,
                                      std::vector<double>* y_abs = nullptr);

// k-grouped (wgrad): dw[e, j, i] = Σ_{t = offsets[e]}^{offsets[e+1]-1} a[j, t] · b[i, t].
//   a [n, m_total] (= dYᵀ), b [k, m_total] (= Xᵀ), dw [num_experts, n, k], row-major double.
//   Every expert's block is written (zeros for an empty expert). dw_abs as above.
void k_grouped_gemm_nt(const double* a, const double* b, int64_t m_total, int num_experts,
                       int64_t n, int64_t k, const std::vector<int32_t>& offsets, double* dw,
                       double* dw_abs = nullptr);

// The same on column-wise MX operands (a: [n, m_total], b: [k, m_total], blocks along tokens).
std::vector<double> k_grouped_gemm_nt(const MxMatrix& a, const MxMatrix& b, int num_experts,
                                      const std::vector<int32_t>& offsets);

}  // namespace mxmoe::ref
