// k-grouped MXFP8 GEMM (wgrad): host checks, tensor maps, launch. The kernel and its contract:
// grouped_gemm_mxfp8_sm90_ws.cuh (KGroupedScheduler); public API: include/mxmoe/gemm.h.
#include <cstdint>

#include "host/check.h"
#include "kernels/gemm/grouped_gemm_checks.h"
#include "kernels/gemm/grouped_gemm_mxfp8_sm90_ws.cuh"
#include "mxmoe/gemm.h"

namespace mxmoe {
namespace {

constexpr const char* kFn = "k_grouped_mxfp8_gemm_nt";
using gemm_sm90::kBlockK;
using gemm_sm90::kBlockM;

}  // namespace

void k_grouped_mxfp8_gemm_nt(const MxOperand& a, const MxOperand& b, int64_t m_total,
                             int num_experts, int64_t n, int64_t k, const int32_t* offsets,
                             void* dw, const GemmOptions& opts) {
  // ---- argument checks: no CUDA call before all of them pass ----
  detail::check_grouped_common(kFn, num_experts, n, k, m_total, offsets, opts);
  detail::check_fast_scale_layout(kFn, "a", a, opts.mode, false);  // dYᵀ: 1x128 only
  detail::check_fast_scale_layout(kFn, "b", b, opts.mode, true);   // Xᵀ: 1x128 or 128x128 blocks
  if (int64_t(num_experts) * k > (int64_t(1) << 30))
    detail::throw_arg(kFn, "k", detail::to_str(k), "num_experts * k must be < 2^30");
  detail::check_not_null(kFn, "dw", dw);
  detail::check_aligned(kFn, "dw", dw, 16);
  const size_t out_bytes =
      size_t(num_experts) * size_t(n) * size_t(k) * (opts.out_dtype == GemmOutDtype::kFP32 ? 4 : 2);
  if (m_total == 0) {  // no tokens: dW = 0 (or unchanged when accumulating)
    if (!opts.accumulate) MXMOE_CUDA_CHECK(kFn, cudaMemsetAsync(dw, 0, out_bytes, opts.stream));
    return;
  }
  detail::check_grouped_operand(kFn, "a", a, opts.mode, /*token_blocked_ok=*/true);
  detail::check_grouped_operand(kFn, "b", b, opts.mode, /*token_blocked_ok=*/true);
  const bool exact = opts.mode == GemmMode::kExact;
  if (exact && m_total > (int64_t(1) << 30))  // TMA coordinates are int32 bytes: 2 per token
    detail::throw_arg(kFn, "m_total", detail::to_str(m_total), "exact mode needs m_total <= 2^30");

  // ---- tensor maps (no offsets read) and launch (the path first: its checks precede any CUDA call) ----
  const bool block_b = b.fast_scale_layout == FastScaleLayout::kBlock128;  // fast mode (checked)
  const bool out_f32 = opts.out_dtype == GemmOutDtype::kFP32;
  gemm_sm90::KernelPath path;
  if (block_b) {  // Xᵀ in 128x128 blocks (128 rows of K x 128 tokens): the 192-wide block kernel
    path = gemm_sm90::block_scales_path(kFn, opts);
  } else {
    path = gemm_sm90::choose_kernel_path(
        exact, opts.fast_tile_n != 0 ? opts.fast_tile_n : gemm_sm90::k_grouped_fast_block_n(k));
    path.tma_store = gemm_sm90::use_tma_store(path, exact, out_f32, opts.accumulate);
  }
  const int grid = gemm_sm90::persistent_grid(kFn, opts.num_sms);
  const bool multicast = path.multicast;  // 2-CTA clusters sharing dYᵀ
  const int block_n = path.block_n;      // k-tile width (rows of Xᵀ)
  const int64_t num_tc = m_total / kBlockK;  // 128-token chunks
  // Exact mode: an operand with a token-blocked image is read through a 3-D map (same boxes in
  // shared memory; the kernel's producer switches its loads on p.a_blocked / p.b_blocked).
  const bool a_blocked = exact && a.image_layout == ImageLayout::kTokenBlocked;
  const bool b_blocked = exact && b.image_layout == ImageLayout::kTokenBlocked;
  const CUtensorMap tm_a =  // dYᵀ [128 (64 when multicast), 128 B]
      a_blocked ? gemm_sm90::token_blocked_image_map(kFn, a.image, n, m_total, gemm_sm90::a_box_rows(multicast))
                : gemm_sm90::operand_map(kFn, a, exact, n, m_total, gemm_sm90::a_box_rows(multicast));
  const CUtensorMap tm_b =  // Xᵀ [block_n, 128 B]
      b_blocked ? gemm_sm90::token_blocked_image_map(kFn, b.image, k, m_total, block_n)
                : gemm_sm90::operand_map(kFn, b, exact, k, m_total, block_n);
  CUtensorMap tm_sa = tm_a, tm_sb = tm_b;  // unused in exact mode
  if (!exact) {
    tm_sa = detail::make_tensor_map_2d_u8(kFn, a.fast_scales, num_tc, n, n, 1, kBlockM,
                                          CU_TENSOR_MAP_SWIZZLE_NONE);  // [1, 128] of [M/128, N]
    if (!block_b)
      tm_sb = detail::make_tensor_map_2d_u8(kFn, b.fast_scales, num_tc, k, k, 1, block_n,
                                            CU_TENSOR_MAP_SWIZZLE_NONE);  // [1, block_n] of [M/128, K]
    else if (!path.block_scales_ldg)  // kTma: [1, 16] boxes of [M/128, pitch(K)]; kLdg reads p.b_block_scales
      tm_sb = gemm_sm90::block_scales_map(kFn, b.fast_scales, 1, num_tc, k);
  }
  gemm_sm90::Params p{};
  p.offsets = offsets;
  p.y = dw;
  p.num_experts = num_experts;
  p.n = int(n);
  p.k = int(k);
  p.kdim = int(m_total);
  p.k_raster_group = gemm_sm90::k_grouped_raster_group(grid, block_n, n, exact);  // tile order within an expert
  p.accumulate = opts.accumulate;
  p.sort_experts = gemm_sm90::k_grouped_sort_experts();
  p.a_blocked = a_blocked;
  p.b_blocked = b_blocked;
  p.b_block_scales = block_b && path.block_scales_ldg ? b.fast_scales : nullptr;
  // the TMA-store epilogue's map of dW [E, N, K] (unused otherwise)
  const CUtensorMap tm_y = path.tma_store ? gemm_sm90::out_tma_map(kFn, dw, out_f32, num_experts, n, k) : tm_a;
  gemm_sm90::dispatch_grouped<true>(kFn, exact, out_f32, path, tm_a, tm_b, tm_sa, tm_sb, p, grid, opts.stream, tm_y);
}

}  // namespace mxmoe
