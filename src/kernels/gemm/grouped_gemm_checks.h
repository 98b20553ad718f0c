// Host argument checks shared by the grouped GEMM launchers (contract: include/mxmoe/gemm.h).
// They run before any CUDA call and throw mxmoe::Error naming the argument.
#pragma once
#include <cstdint>
#include <string>

#include "host/check.h"
#include "mxmoe/gemm.h"

namespace mxmoe::detail {

// The pointers a mode reads: fast = fast_data (16-byte aligned, TMA) + fast_scales (16-byte
// aligned, TMA); exact = image (BF16, 16-byte aligned, TMA) in a layout the GEMM reads: row-major,
// or token-blocked where `token_blocked_ok` (the k-grouped GEMM).
inline void check_grouped_operand(const char* fn, const char* name, const MxOperand& x,
                                  GemmMode mode, bool token_blocked_ok = false) {
  const std::string s(name);
  if (mode == GemmMode::kFast) {
    check_not_null(fn, (s + ".fast_data").c_str(), x.fast_data);
    check_not_null(fn, (s + ".fast_scales").c_str(), x.fast_scales);
    check_aligned(fn, (s + ".fast_data").c_str(), x.fast_data, 16);
    check_aligned(fn, (s + ".fast_scales").c_str(), x.fast_scales, 16);
  } else {
    if (x.image == nullptr)
      throw_arg(fn, (s + ".image").c_str(), "null",
                "exact mode reads the operand's BF16 image: make it with dequantize_mxfp8_bf16 "
                "(dequantize.h) from data and scales");
    check_aligned(fn, (s + ".image").c_str(), x.image, 16);
    if (x.image_layout != ImageLayout::kRowMajor && x.image_layout != ImageLayout::kTokenBlocked)
      throw_arg(fn, (s + ".image_layout").c_str(), to_str(int(x.image_layout)),
                "must be ImageLayout::kRowMajor or kTokenBlocked");
    if (x.image_layout == ImageLayout::kTokenBlocked && !token_blocked_ok)
      throw_arg(fn, (s + ".image_layout").c_str(), "kTokenBlocked",
                "the m-grouped GEMMs read row-major images [rows, K] (make them with dequantize_mxfp8_bf16); "
                "token-blocked images are for the k-grouped GEMM only");
  }
}

// MxOperand::fast_scale_layout (gemm.h): kRow128 everywhere; kBlock128 only where `block_ok` (operand b
// of the m-grouped GEMM's y entry and of the k-grouped GEMM) and in fast mode. Checked for every operand whatever m_total, so a
// misplaced kBlock128 is named even for an empty problem.
inline void check_fast_scale_layout(const char* fn, const char* name, const MxOperand& x, GemmMode mode,
                                    bool block_ok) {
  const std::string arg = std::string(name) + ".fast_scale_layout";
  if (x.fast_scale_layout == FastScaleLayout::kRow128) return;
  if (x.fast_scale_layout != FastScaleLayout::kBlock128)
    throw_arg(fn, arg.c_str(), to_str(int(x.fast_scale_layout)), "must be FastScaleLayout::kRow128 or kBlock128");
  if (!block_ok)
    throw_arg(fn, arg.c_str(), "kBlock128",
              "128x128-block scales are accepted only for operand b of m_grouped_mxfp8_gemm_nt (the weights) and "
              "of k_grouped_mxfp8_gemm_nt (Xᵀ); use FastScaleLayout::kRow128 (the default)");
  if (mode != GemmMode::kFast)
    throw_arg(fn, arg.c_str(), "kBlock128",
              "exact mode reads the BF16 image, not fast_scales: use FastScaleLayout::kRow128 with GemmMode::kExact");
}

// Scalars and options shared by both groupings.
inline void check_grouped_common(const char* fn, int num_experts, int64_t n, int64_t k,
                                 int64_t m_total, const int32_t* offsets, const GemmOptions& opts) {
  if (opts.mode != GemmMode::kFast && opts.mode != GemmMode::kExact)
    throw_arg(fn, "opts.mode", to_str(int(opts.mode)), "must be GemmMode::kFast or kExact");
  if (opts.out_dtype != GemmOutDtype::kBF16 && opts.out_dtype != GemmOutDtype::kFP32)
    throw_arg(fn, "opts.out_dtype", to_str(int(opts.out_dtype)), "must be kBF16 or kFP32");
  if (opts.num_sms < 0) throw_arg(fn, "opts.num_sms", to_str(opts.num_sms), "must be >= 0");
  if (opts.fast_tile_n != 0 && opts.fast_tile_n != 128 && opts.fast_tile_n != 192)
    throw_arg(fn, "opts.fast_tile_n", to_str(opts.fast_tile_n), "must be 0 (the library's choice), 128 or 192");
  if (num_experts < 1 || num_experts > kMaxGemmExperts)
    throw_arg(fn, "num_experts", to_str(num_experts),
              "must be in [1, " + to_str(kMaxGemmExperts) + "]");
  if (k < 32 || k % 32 != 0) throw_arg(fn, "k", to_str(k), "must be a positive multiple of 32");
  if (n < 32 || n % 32 != 0) throw_arg(fn, "n", to_str(n), "must be a positive multiple of 32");
  if (k > (int64_t(1) << 30)) throw_arg(fn, "k", to_str(k), "must be < 2^30");
  if (int64_t(num_experts) * n > (int64_t(1) << 30))
    throw_arg(fn, "n", to_str(n), "num_experts * n must be < 2^30 (TMA coordinates)");
  if (m_total < 0 || m_total % 128 != 0 || m_total >= (int64_t(1) << 31))
    throw_arg(fn, "m_total", to_str(m_total), "must be a non-negative multiple of 128, < 2^31");
  check_not_null(fn, "offsets", offsets);
  check_aligned(fn, "offsets", offsets, 4);
}

}  // namespace mxmoe::detail
