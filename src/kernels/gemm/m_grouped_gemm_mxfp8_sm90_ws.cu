// m-grouped MXFP8 GEMM (forward, dgrad): host checks, tensor maps, launch; also the row-scatter
// entry of the EP layer (m_grouped_gemm_rows.h). The kernel and its
// contract: grouped_gemm_mxfp8_sm90_ws.cuh; public API: include/mxmoe/gemm.h.
#include <cstdint>
#include <string>

#include "host/check.h"
#include "kernels/gemm/grouped_gemm_checks.h"
#include "kernels/gemm/grouped_gemm_mxfp8_sm90_ws.cuh"
#include "kernels/gemm/m_grouped_gemm_rows.h"
#include "mxmoe/gemm.h"

namespace mxmoe {
namespace {

constexpr const char* kFn = "m_grouped_mxfp8_gemm_nt";
using gemm_sm90::kBlockK;
using gemm_sm90::kBlockM;

}  // namespace


namespace {

// Both entries: y (gemm.h) or, with row_dst non-null, the row epilogue (m_grouped_gemm_rows.h).
void m_grouped_impl(const char* fn, const MxOperand& a, int64_t m_total, const MxOperand& b, int num_experts,
                    int64_t n, int64_t k, const int32_t* offsets, void* y, void* const* row_dst,
                    const GemmOptions& opts) {
  using detail::throw_arg;
  using detail::to_str;
  // ---- argument checks: no CUDA call before all of them pass ----
  detail::check_grouped_common(fn, num_experts, n, k, m_total, offsets, opts);
  detail::check_fast_scale_layout(fn, "a", a, opts.mode, false);  // activations: 1x128 only
  detail::check_fast_scale_layout(fn, "b", b, opts.mode, row_dst == nullptr);  // the row entry: 1x128 only
  const bool exact = opts.mode == GemmMode::kExact;
  const bool out_f32 = opts.out_dtype == GemmOutDtype::kFP32;
  const bool block_b = b.fast_scale_layout == FastScaleLayout::kBlock128;  // fast mode, y entry (checked)
  gemm_sm90::KernelPath path;
  if (row_dst != nullptr) {  // the row epilogue: the mode's wide tile, nothing from the environment
    if (out_f32) throw_arg(fn, "opts.out_dtype", "kFP32", "must be kBF16 (the rows are BF16)");
    if (opts.accumulate) throw_arg(fn, "opts.accumulate", "true", "must be false (rows are stored, not added)");
    path.block_n = exact ? gemm_sm90::kConfigExactWideBlockN : gemm_sm90::kConfigWideBlockN;
    path.rows = true;
  } else if (block_b) {  // 128x128 weight blocks: the 192-wide block kernel
    path = gemm_sm90::block_scales_path(fn, opts);
  } else {
    path = gemm_sm90::choose_kernel_path(exact, opts.fast_tile_n != 0 ? opts.fast_tile_n
                                                                       : gemm_sm90::kConfigFastBlockN);
    path.tma_store = gemm_sm90::use_tma_store(path, exact, out_f32, opts.accumulate);
    if (exact && path.block_n == gemm_sm90::kConfigExactWideBlockN)  // clusters sharing B (pairs of m-tiles)
      path.multicast = gemm_sm90::exact_multicast_requested(fn);
  }
  const bool multicast = path.multicast;
  const int block_n = path.block_n;
  int64_t n_tiles = (n + block_n - 1) / block_n;
  if (multicast && !exact) n_tiles += n_tiles % 2;  // fast: pairs of n-tiles (phantom partner if odd)
  // (exact multicast pairs m-tiles: the last band may end in a phantom, hence the + 1 below)
  if ((m_total / kBlockM + 1) * n_tiles >= (int64_t(1) << 31))
    throw_arg(fn, "m_total", to_str(m_total), "(m_total/128 + 1)·ceil(n/block_n) must be < 2^31");
  detail::check_grouped_operand(fn, "b", b, opts.mode);
  if (m_total == 0) return;  // nothing can be written
  detail::check_grouped_operand(fn, "a", a, opts.mode);
  if (row_dst == nullptr) {
    detail::check_not_null(fn, "y", y);
    detail::check_aligned(fn, "y", y, 16);
  } else {
    detail::check_aligned(fn, "row_dst", row_dst, 8);
  }

  // ---- tensor maps (no offsets read) and launch ----
  const int grid = gemm_sm90::persistent_grid(fn, opts.num_sms);
  const int64_t num_kc = (k + kBlockK - 1) / kBlockK;
  const CUtensorMap tm_a =  // [128 (64 when multicast in fast mode), 128 B]
      gemm_sm90::operand_map(fn, a, exact, m_total, k, gemm_sm90::a_box_rows(multicast, exact));
  const CUtensorMap tm_b =  // [block_n (block_n/2 when multicast in exact mode), 128 B]
      gemm_sm90::operand_map(fn, b, exact, num_experts * n, k, gemm_sm90::b_box_rows(multicast, exact, block_n));
  CUtensorMap tm_sa = tm_a, tm_sb = tm_b;  // unused in exact mode
  if (!exact) {
    tm_sa = detail::make_tensor_map_2d_u8(fn, a.fast_scales, num_kc, m_total, m_total, 1,
                                          kBlockM, CU_TENSOR_MAP_SWIZZLE_NONE);  // [1, 128]
    if (!block_b)
      tm_sb = detail::make_tensor_map_2d_u8(fn, b.fast_scales, num_experts * num_kc, n, n, 1, block_n,
                                            CU_TENSOR_MAP_SWIZZLE_NONE);  // [1, block_n]
    else if (!path.block_scales_ldg)  // kTma: [1, 16] boxes; kLdg reads p.b_block_scales (tm_sb unused)
      tm_sb = gemm_sm90::block_scales_map(fn, b.fast_scales, num_experts, num_kc, n);
  }
  gemm_sm90::Params p{};
  p.offsets = offsets;
  p.y = row_dst != nullptr ? const_cast<void**>(row_dst) : y;  // kRows: the row table
  p.num_experts = num_experts;
  p.n = int(n);
  p.k = int(k);
  p.kdim = int(k);
  p.m_tiles_cap = int(m_total / kBlockM);
  p.accumulate = opts.accumulate;
  p.b_block_scales = block_b && path.block_scales_ldg ? b.fast_scales : nullptr;
  // the TMA-store epilogue's map of Y [m_total, n] (unused otherwise)
  const CUtensorMap tm_y = path.tma_store ? gemm_sm90::out_tma_map(fn, y, out_f32, 1, m_total, n) : tm_a;
  gemm_sm90::dispatch_grouped<false>(fn, exact, out_f32, path, tm_a, tm_b, tm_sa, tm_sb, p, grid, opts.stream, tm_y);
}

}  // namespace

void m_grouped_mxfp8_gemm_nt(const MxOperand& a, int64_t m_total, const MxOperand& b,
                             int num_experts, int64_t n, int64_t k, const int32_t* offsets,
                             void* y, const GemmOptions& opts) {
  m_grouped_impl(kFn, a, m_total, b, num_experts, n, k, offsets, y, nullptr, opts);
}

void detail::m_grouped_mxfp8_gemm_nt_to_rows(const MxOperand& a, int64_t m_total, const MxOperand& b,
                                             int num_experts, int64_t n, int64_t k, const int32_t* offsets,
                                             void* const* row_dst, const GemmOptions& opts) {
  constexpr const char* fn = "m_grouped_mxfp8_gemm_nt_to_rows";
  detail::check_not_null(fn, "row_dst", row_dst);
  m_grouped_impl(fn, a, m_total, b, num_experts, n, k, offsets, nullptr, row_dst, opts);
}

}  // namespace mxmoe
