// Device-side MX numerics: E8M0 scale exponents from BF16 amax bits, E4M3 conversion in pairs.
// Instructions used: cvt.rn.satfinite.e4m3x2.f32 (FP32 pair → E4M3 pair, RNE, saturating, NaN kept)
// and cvt.rn.f16x2.e4m3x2 (E4M3 pair → FP16 pair, exact) through cuda_fp8.h, sm_89+; BF16 pair
// packing with round-to-nearest-even (cuda_bf16.h).
// The rules are mx_format.h's; src/ref/mx_ref.cpp is the oracle these are tested against.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
#error "mxmoe: E4M3 conversions need sm_89 or newer (build for sm_90a)"
#endif

#include "mxmoe/mx_format.h"

namespace mxmoe::dev {

// Max of |x| over the packed BF16 pairs in `w` as raw bits: for non-negative BF16, the integer
// order of the bits is the order of the values, and Inf/NaN (>= 0x7F80) sort above every finite
// value, so one unsigned max per pair (vmax.u16x2) finds amax and flags Inf/NaN at once.
__device__ __forceinline__ uint32_t abs_max_bf16x2(uint32_t acc, uint32_t w) {
  return __vmaxu2(acc, w & 0x7FFF7FFFu);
}
__device__ __forceinline__ uint32_t halves_max(uint32_t m) { return max(m & 0xFFFFu, m >> 16); }

// The result of abs_max_bf16x2 over many words without the mask per word: accumulate u = the
// unsigned max (vmax.u16x2, from 0) and s = the signed max (vmax.s16x2, from 0) of the raw pairs,
// then combine them here. Per half, u & 0x7FFF is the largest negative magnitude when there are
// negatives (else the largest non-negative value) and s the largest non-negative value (or 0), so
// their max is max |x| as bits, Inf/NaN included. ptxas folds both chains into 3-input VIMNMX3.
__device__ __forceinline__ uint32_t abs_max_bf16x2_from_maxes(uint32_t u, uint32_t s) {
  return __vmaxu2(u & 0x7FFF7FFFu, s);
}

// E8M0 scale byte (e + 127) for a block whose amax has BF16 bits `amax_bits` (sign cleared),
// in integer operations only. Inf/NaN → 0xFF. With amax = 1.m · 2^E (BF16 exponent field f,
// E = f - 127, 7 mantissa bits m7):
//  rceil: amax/448 = (1.m / 1.75) · 2^(E-8), and 1.m/1.75 lies in [0.571, 1.143), so
//         e = ceil(log2(amax/448)) = E - 8 + (1.m > 1.75) = f - 135 + (m7 > 96)   (1.75 = 1 + 96/128).
//  floor: e = floor(log2 amax) - 8 = f - 135.
//  BF16 subnormals (f = 0) are below 2^-126, so both rules give e < -127 there: clamp to -127.
__device__ __forceinline__ uint32_t e8m0_scale_byte(uint32_t amax_bits, ScaleMode mode) {
  // Branch-free (selects only), so that the compiler can interleave independent blocks.
  const int f = int(amax_bits >> 7);
  const int up = int(mode == ScaleMode::kRceil) & int((amax_bits & 0x7Fu) > 96u);
  const int e = max(f - 135 + up, -127);  // f = 0 (zero or subnormal amax) lands below -127 too
  return amax_bits >= 0x7F80u ? kE8M0Nan : uint32_t(e + 127);  // finite BF16 amax: e <= 120
}

// 2^-e for scale byte b = e + 127 (b != 0xFF), as the FP32 whose exponent field is 254 - b;
// b = 254 needs the subnormal 2^-127.
__device__ __forceinline__ float e8m0_reciprocal(uint32_t b) {
  return b <= 253u ? __uint_as_float((254u - b) << 23) : __uint_as_float(0x00400000u);
}

// 2^d for d <= 0 as an FP32 multiplier; below 2^-126 returns 0 (the products it is used for
// are then below half the smallest E4M3 subnormal and round to ±0 either way).
__device__ __forceinline__ float exp2_nonpositive(int d) {
  return d >= -126 ? __uint_as_float(uint32_t(127 + d) << 23) : 0.0f;
}

// Two FP32 → packed E4M3 pair (a in the low byte), RNE, satfinite.
__device__ __forceinline__ uint32_t e4m3x2_from_f32(float a, float b) {
  return uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3));
}
__device__ __forceinline__ uint32_t e4m3x4_from_f32(float a, float b, float c, float d) {
  return e4m3x2_from_f32(a, b) | (e4m3x2_from_f32(c, d) << 16);
}

// Packed E4M3 pair (low byte first) → two FP32, exact.
__device__ __forceinline__ float2 f32x2_from_e4m3x2(uint32_t pair) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(pair & 0xFFFFu), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// The upper pair of four packed E4M3 codes (bytes 2, 3) → two FP32, exact: f32x2_from_e4m3x2(quad >> 16),
// but the conversion reads the register's upper half itself (F2FP ... R.H1), so no shift is issued.
__device__ __forceinline__ float2 f32x2_from_e4m3x2_hi(uint32_t quad) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t r;
  asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}\n" : "=r"(r) : "r"(quad));
  return __half22float2(*reinterpret_cast<const __half2*>(&r));
#else
  return f32x2_from_e4m3x2(quad >> 16);
#endif
}

// Re-express four E4M3 codes against a larger exponent: code · 2^d rounded to E4M3 (d <= 0).
__device__ __forceinline__ uint32_t e4m3x4_rebase(uint32_t codes, float pow2_d) {
  const float2 lo = f32x2_from_e4m3x2(codes), hi = f32x2_from_e4m3x2_hi(codes);
  return e4m3x4_from_f32(lo.x * pow2_d, lo.y * pow2_d, hi.x * pow2_d, hi.y * pow2_d);
}

// BF16 halves of a packed word as FP32 (exact).
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }
// Two FP32 → one BF16x2 word (round to nearest even; a in the low half).
__device__ __forceinline__ uint32_t pack_bf16x2_rn(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}

inline constexpr uint32_t kE4M3NanX4 = 0x7F7F7F7Fu;

// 16 E4M3 codes of a 32-block with scale byte `block`, re-expressed against the larger exponent byte
// `emax` of their span (a row's 128-chunk in the fast form, a 128x128 block in the block form): the
// second rounding of mx_format.h's rule; the whole span is NaN (0x7F) when emax is 0xFF.
__device__ __forceinline__ uint4 rebase_x16(uint4 q, uint32_t block, uint32_t emax) {
  if (emax == kE8M0Nan) return make_uint4(kE4M3NanX4, kE4M3NanX4, kE4M3NanX4, kE4M3NanX4);
  const float pw = exp2_nonpositive(int(block) - int(emax));
  return make_uint4(e4m3x4_rebase(q.x, pw), e4m3x4_rebase(q.y, pw), e4m3x4_rebase(q.z, pw), e4m3x4_rebase(q.w, pw));
}

}  // namespace mxmoe::dev
