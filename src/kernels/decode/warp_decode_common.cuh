// Device building blocks shared by the warp-decode kernels (router, gate/up, down): 16-byte
// streaming loads, FP32 dot products of BF16 or E4M3 weight chunks with BF16 / FP32 activations,
// the E8M0 scale as an FP32 power of two, and the fixed-order warp sum.
//
// Fixed orders (determinism, batch invariance): a lane adds the products of a chunk in increasing
// K into its running FP32 sum; an MXFP8 chunk (16 elements, inside one 32-block) is summed from 0
// and then added as fma(chunk_sum, 2^(s-127), acc) — exact scaling by a power of two, so this is
// an FP32 summation of the exact dequantized products. The 32 lanes are combined by a xor
// butterfly (offsets 16, 8, 4, 2, 1), after which every lane holds the same bits.
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "device/mx_convert.cuh"

namespace mxmoe::dev {

constexpr unsigned kFullMask = 0xFFFFFFFFu;

// Weights are read once per use: do not allocate them in L1 (keeps L1 for X, h and the scales).
__device__ __forceinline__ uint4 ldg_stream_v4(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// Activations (X, h): reused by many warps of the SM, cached.
__device__ __forceinline__ uint4 ldg_v4(const void* p) { return __ldg(static_cast<const uint4*>(p)); }

__device__ __forceinline__ uint32_t ldg_u8(const uint8_t* p) { return uint32_t(__ldg(p)); }

// Data written earlier in the same kernel by other CTAs (the fused step's h): an ordinary (weak,
// coherent) load, never the non-coherent path; ordered after those writes by a grid barrier with
// release/acquire semantics (src/device/grid_barrier.cuh); asm volatile keeps it after that
// barrier's asm volatile.
__device__ __forceinline__ uint4 ld_global_v4(const void* p) {
  uint4 r;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// 2^(b-127) for an E8M0 byte: b in [1, 254] is a normal FP32, b = 0 is the subnormal 2^-127,
// b = 255 is NaN (mx_format.h).
__device__ __forceinline__ float e8m0_to_f32(uint32_t b) {
  const float normal = __uint_as_float(b << 23);
  const float v = b == 0u ? __uint_as_float(0x00400000u) : normal;
  return b == 255u ? __uint_as_float(0x7FC00000u) : v;
}

// The 256 values of e8m0_to_f32 (0 and 255 included) into t[256], by all threads of the block; the caller
// synchronises. A chunk's scale is then one indexed shared-memory load instead of a shift, two compares and
// two selects (the same floats).
__device__ __forceinline__ void fill_e8m0_table(float* t) {
  for (int i = int(threadIdx.x); i < 256; i += int(blockDim.x)) t[i] = e8m0_to_f32(uint32_t(i));
}

// acc + Σ_{8 elements} w·x, BF16 × BF16 (both exact in FP32), increasing K.
__device__ __forceinline__ float dot8_bf16_bf16(uint4 w, uint4 x, float acc) {
  acc = fmaf(bf16_lo(w.x), bf16_lo(x.x), acc);
  acc = fmaf(bf16_hi(w.x), bf16_hi(x.x), acc);
  acc = fmaf(bf16_lo(w.y), bf16_lo(x.y), acc);
  acc = fmaf(bf16_hi(w.y), bf16_hi(x.y), acc);
  acc = fmaf(bf16_lo(w.z), bf16_lo(x.z), acc);
  acc = fmaf(bf16_hi(w.z), bf16_hi(x.z), acc);
  acc = fmaf(bf16_lo(w.w), bf16_lo(x.w), acc);
  acc = fmaf(bf16_hi(w.w), bf16_hi(x.w), acc);
  return acc;
}

// acc + Σ_{8 elements} w·h, BF16 weights × FP32 h (h0: elements 0-3, h1: 4-7).
__device__ __forceinline__ float dot8_bf16_f32(uint4 w, float4 h0, float4 h1, float acc) {
  acc = fmaf(bf16_lo(w.x), h0.x, acc);
  acc = fmaf(bf16_hi(w.x), h0.y, acc);
  acc = fmaf(bf16_lo(w.y), h0.z, acc);
  acc = fmaf(bf16_hi(w.y), h0.w, acc);
  acc = fmaf(bf16_lo(w.z), h1.x, acc);
  acc = fmaf(bf16_hi(w.z), h1.y, acc);
  acc = fmaf(bf16_lo(w.w), h1.z, acc);
  acc = fmaf(bf16_hi(w.w), h1.w, acc);
  return acc;
}

// Four E4M3 codes (low byte first) times four FP32 values, added to acc in increasing K.
__device__ __forceinline__ float dot4_e4m3(uint32_t q, float a0, float a1, float a2, float a3,
                                           float acc) {
  const float2 lo = f32x2_from_e4m3x2(q), hi = f32x2_from_e4m3x2_hi(q);
  acc = fmaf(lo.x, a0, acc);
  acc = fmaf(lo.y, a1, acc);
  acc = fmaf(hi.x, a2, acc);
  acc = fmaf(hi.y, a3, acc);
  return acc;
}

// Σ_{16 elements} decode(q)·x from 0, E4M3 codes × BF16 x (x0: elements 0-7, x1: 8-15).
__device__ __forceinline__ float dot16_e4m3_bf16(uint4 q, uint4 x0, uint4 x1) {
  float s = 0.0f;
  s = dot4_e4m3(q.x, bf16_lo(x0.x), bf16_hi(x0.x), bf16_lo(x0.y), bf16_hi(x0.y), s);
  s = dot4_e4m3(q.y, bf16_lo(x0.z), bf16_hi(x0.z), bf16_lo(x0.w), bf16_hi(x0.w), s);
  s = dot4_e4m3(q.z, bf16_lo(x1.x), bf16_hi(x1.x), bf16_lo(x1.y), bf16_hi(x1.y), s);
  s = dot4_e4m3(q.w, bf16_lo(x1.z), bf16_hi(x1.z), bf16_lo(x1.w), bf16_hi(x1.w), s);
  return s;
}

// Σ_{16 elements} decode(q)·h from 0, E4M3 codes × FP32 h (h[0..3]: elements 0-15).
__device__ __forceinline__ float dot16_e4m3_f32(uint4 q, const float4 (&h)[4]) {
  float s = 0.0f;
  s = dot4_e4m3(q.x, h[0].x, h[0].y, h[0].z, h[0].w, s);
  s = dot4_e4m3(q.y, h[1].x, h[1].y, h[1].z, h[1].w, s);
  s = dot4_e4m3(q.z, h[2].x, h[2].y, h[2].z, h[2].w, s);
  s = dot4_e4m3(q.w, h[3].x, h[3].y, h[3].z, h[3].w, s);
  return s;
}

// Eight BF16 (one 16-byte vector) as two float4, exact.
__device__ __forceinline__ void bf16x8_to_f32(uint4 v, float4& a, float4& b) {
  a = make_float4(bf16_lo(v.x), bf16_hi(v.x), bf16_lo(v.y), bf16_hi(v.y));
  b = make_float4(bf16_lo(v.z), bf16_hi(v.z), bf16_lo(v.w), bf16_hi(v.w));
}

__device__ __forceinline__ float4 as_float4(uint4 v) {
  return make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z),
                     __uint_as_float(v.w));
}

// Fixed xor butterfly; every lane ends with the same bits.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// FP32 → BF16 bits, round to nearest even (NaN stays NaN).
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float v) {
  const __nv_bfloat16 b = __float2bfloat16_rn(v);
  return *reinterpret_cast<const uint16_t*>(&b);
}

// Expert id from the routing table, clamped into [0, E) so that a bad id can never read outside
// the weight tensor (the contract says ids are in range; the result is unspecified otherwise).
__device__ __forceinline__ int clamp_expert(int32_t e, int num_experts) {
  return (e < 0 || e >= num_experts) ? 0 : int(e);
}

}  // namespace mxmoe::dev
