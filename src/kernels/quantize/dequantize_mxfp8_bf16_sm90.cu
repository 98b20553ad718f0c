// MXFP8 → BF16 image (include/mxmoe/dequantize.h): the operand form of exact-mode GEMMs.
//
//   image[i] = BF16_rne(E4M3(data[i]) · 2^(scales[i/32] − 127))   over the flat [rows · cols] tensor
//
// (cols % 32 == 0, so element i's block is i / 32 in the flat scale array as well.)
// Inputs: data E4M3 [rows, cols] 16-byte aligned; scales E8M0 [rows, cols/32], any alignment.
// Output: image BF16 [rows, cols] 16-byte aligned.
// Each thread converts vectors of 8 codes: an 8-byte load of codes and its block's scale byte in, one
// 16-byte store out (a warp's accesses are contiguous: 256 B in, 512 B out); kVecsPerThread vectors'
// loads are issued before any conversion. A grid-stride loop over vectors (int64 indices) with at
// most the co-resident CTAs.
// Arithmetic (exact up to the one final rounding): cvt.rn.f16x2.e4m3x2 (exact) → FP32 (exact) →
// × 2^s in FP32 (exact: E4M3 values have their last bit at >= 2^-9 and s >= −127, so products sit
// on FP32's grid down to its subnormals; needs -ftz=false, nvcc's default) → cvt.rn.bf16x2.f32
// (the one IEEE rounding, gradual underflow, Inf on overflow). NaN codes and NaN scales are then
// replaced by kBF16Nan with integer masks, so NaN bits do not depend on the hardware's NaN payload.
// Registers: ~40, no shared memory. Roofline: memory-bound; 3 + 1/32 bytes per element.
// Token-blocked layout (dequantize_mxfp8_bf16_token_blocked, ImageLayout::kTokenBlocked): the same
// kernel with kBlocked = true; only the store address changes. Vector v (codes [8v, 8v + 8) of the
// flat row-major tensor) is the (v % 16)-th vector of 128-column group g = v / 16 = r·(cols/128) + b;
// it goes to vector (b·rows + r)·16 + v % 16 of the image (token_blocked_offset / 8). r = g / (cols/128)
// by FastDivmod (g < 2^31, checked on the host). Stores: 16 consecutive threads write one 256-byte
// block, so a warp writes two full 256-byte runs (rows·256 bytes apart).
// Tests: tests/gpu/test_dequantize_gpu.cpp (bit-exact against ref::dequantize_bf16; the blocked
// layout against ref::token_blocked of it);
// tests/cpu/test_mx_format.cpp (the reference and the exact scale range); argument checks in
// tests/cpu/test_quantize_args.cpp. Bench: bench/bench_gemm.py ("dequant" lines).
#include <algorithm>
#include <cstdint>

#include "device/fast_divmod.cuh"
#include "device/mx_convert.cuh"
#include "host/check.h"
#include "host/kernel_attr.h"
#include "mxmoe/dequantize.h"

namespace mxmoe {
namespace {

constexpr int kThreads = 256;
constexpr int kVecsPerThread = 4;  // 8-code vectors per thread per loop pass, all loaded first
constexpr uint32_t kNanPair = uint32_t(kBF16Nan) * 0x10001u;
static_assert(kMxBlock % 8 == 0, "an 8-code vector never straddles a block");

// 2^(b − 127) as FP32 for b in [0, 254] (b = 0: the subnormal 2^-127). b = 0xFF is masked by the
// caller (its value here is +Inf).
__device__ __forceinline__ float e8m0_pow2(uint32_t b) {
  return b == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(b << 23);
}

// Four codes (low byte first) → two BF16x2 words. nan_all: 0xFFFFFFFF when the block's scale is NaN.
__device__ __forceinline__ uint2 image_x4(uint32_t codes, float scale, uint32_t nan_all) {
  const float2 lo = dev::f32x2_from_e4m3x2(codes), hi = dev::f32x2_from_e4m3x2_hi(codes);
  uint32_t w0 = dev::pack_bf16x2_rn(lo.x * scale, lo.y * scale);
  uint32_t w1 = dev::pack_bf16x2_rn(hi.x * scale, hi.y * scale);
  // NaN codes are exactly those with (code & 0x7F) == 0x7F: adding 1 to each 7-bit field carries
  // into bit 7 only there (no field can carry further). 0x01 → 0xFF per byte by the multiply.
  const uint32_t nan_bits = (((codes & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u) >> 7;
  const uint32_t nan = (nan_bits * 0xFFu) | nan_all;
  const uint32_t m0 = __byte_perm(nan, 0, 0x1100), m1 = __byte_perm(nan, 0, 0x3322);  // per BF16 lane
  w0 = (w0 & ~m0) | (kNanPair & m0);
  w1 = (w1 & ~m1) | (kNanPair & m1);
  return make_uint2(w0, w1);
}

// kBlocked: where a vector goes in the token-blocked image (see the top of the file).
struct BlockedMap {
  int64_t rows = 0;        // rows of the tensor
  FastDivmod groups_per_row;  // cols / 128
};

// Output vector of input vector v (8 codes = one 16-byte BF16 store).
template <bool kBlocked>
__device__ __forceinline__ int64_t image_vec(int64_t v, const BlockedMap& m) {
  if constexpr (!kBlocked) {
    return v;
  } else {
    constexpr int kVecsPerGroup = kImageBlockCols / 8;  // 16
    const uint32_t g = uint32_t(v / kVecsPerGroup);     // < 2^31 (host check)
    const uint32_t r = m.groups_per_row.div(g);
    const uint32_t b = g - r * m.groups_per_row.d;
    return (int64_t(b) * m.rows + r) * kVecsPerGroup + (v % kVecsPerGroup);
  }
}

// Vector v = codes [8v, 8v + 8) (block v / 4): one 8-byte load in, one 16-byte store out, so that a
// warp's loads cover 256 and its stores 512 contiguous bytes (blocked: two runs of 256).
template <bool kBlocked>
__global__ void __launch_bounds__(kThreads)
dequantize_mxfp8_bf16_kernel(const uint2* __restrict__ data, const uint8_t* __restrict__ scales,
                             uint4* __restrict__ image, int64_t num_vecs, const BlockedMap m) {
  const int64_t stride = int64_t(gridDim.x) * kThreads * kVecsPerThread;
  for (int64_t v0 = int64_t(blockIdx.x) * kThreads * kVecsPerThread + threadIdx.x; v0 < num_vecs;
       v0 += stride) {
    uint2 codes[kVecsPerThread];
    uint32_t sb[kVecsPerThread];
#pragma unroll
    for (int j = 0; j < kVecsPerThread; ++j) {
      const int64_t v = v0 + int64_t(j) * kThreads;
      if (v < num_vecs) {
        codes[j] = __ldg(data + v);
        sb[j] = __ldg(scales + v / (kMxBlock / 8));
      }
    }
#pragma unroll
    for (int j = 0; j < kVecsPerThread; ++j) {
      const int64_t v = v0 + int64_t(j) * kThreads;
      if (v < num_vecs) {
        const float scale = e8m0_pow2(sb[j]);
        const uint32_t nan_all = sb[j] == kE8M0Nan ? 0xFFFFFFFFu : 0u;
        const uint2 lo = image_x4(codes[j].x, scale, nan_all), hi = image_x4(codes[j].y, scale, nan_all);
        image[image_vec<kBlocked>(v, m)] = make_uint4(lo.x, lo.y, hi.x, hi.y);
      }
    }
  }
}

// Both layouts: checks, then the kernel of the layout.
template <bool kBlocked>
void dequantize_impl(const char* fn, const uint8_t* data, const uint8_t* scales, int64_t rows, int64_t cols,
                     __nv_bfloat16* image, cudaStream_t stream) {
  using detail::throw_arg;
  using detail::to_str;
  if (rows < 0) throw_arg(fn, "rows", to_str(rows), "must be >= 0");
  if (cols <= 0 || cols % kMxBlock != 0)
    throw_arg(fn, "cols", to_str(cols), "must be a positive multiple of 32 (MX blocks run along it)");
  if (kBlocked && cols % kImageBlockCols != 0)
    throw_arg(fn, "cols", to_str(cols),
              "must be a multiple of 128 for the token-blocked layout (blocks of 128 columns)");
  if (rows > 0 && cols > ((int64_t(1) << 62) / rows))
    throw_arg(fn, "rows", to_str(rows), "rows · cols must be below 2^62");
  if (kBlocked && rows * (cols / kImageBlockCols) >= (int64_t(1) << 31))
    throw_arg(fn, "rows", to_str(rows), "rows · cols / 128 must be below 2^31 for the token-blocked layout");
  if (rows == 0) return;
  detail::check_not_null(fn, "data", data);
  detail::check_aligned(fn, "data", data, 16);
  detail::check_not_null(fn, "scales", scales);
  detail::check_not_null(fn, "image", image);
  detail::check_aligned(fn, "image", image, 16);

  const int64_t num_vecs = rows * (cols / 8);
  BlockedMap m;
  if (kBlocked) {
    m.rows = rows;
    m.groups_per_row = FastDivmod(uint32_t(cols / kImageBlockCols));
  }
  constexpr auto kernel = dequantize_mxfp8_bf16_kernel<kBlocked>;
  const int max_ctas = detail::max_resident_ctas<kernel>(fn, kThreads);
  const int64_t per_cta = int64_t(kThreads) * kVecsPerThread;
  const int grid = int(std::min<int64_t>(max_ctas, (num_vecs + per_cta - 1) / per_cta));
  kernel<<<grid, kThreads, 0, stream>>>(reinterpret_cast<const uint2*>(data), scales,
                                        reinterpret_cast<uint4*>(image), num_vecs, m);
  MXMOE_CHECK_LAUNCH(fn);
}

}  // namespace

void dequantize_mxfp8_bf16(const uint8_t* data, const uint8_t* scales, int64_t rows, int64_t cols,
                           __nv_bfloat16* image, cudaStream_t stream) {
  dequantize_impl<false>("dequantize_mxfp8_bf16", data, scales, rows, cols, image, stream);
}

void dequantize_mxfp8_bf16_token_blocked(const uint8_t* data, const uint8_t* scales, int64_t rows, int64_t cols,
                                         __nv_bfloat16* image, cudaStream_t stream) {
  dequantize_impl<true>("dequantize_mxfp8_bf16_token_blocked", data, scales, rows, cols, image, stream);
}

}  // namespace mxmoe
