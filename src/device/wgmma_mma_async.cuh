// wgmma.* (sm_90a warpgroup MMA): shared-memory matrix descriptors, wgmma.fence,
// wgmma.commit_group, wgmma.wait_group, and wgmma.mma_async for FP8 (E4M3 x E4M3 -> F32, k32) and
// BF16 (BF16 x BF16 -> F32, k16) through CuTe's GMMA atoms. Both read K-major operands of 32 bytes per row per instruction,
// so one 128-byte swizzled row holds four k-steps of either.
//
// Accumulator fragment of an m64nNk32 / m64nNk16 wgmma, thread t of the warpgroup (warp w = t/32,
// lane l):
//   d[4j + 0] = D[16w + l/4,     8j + 2(l%4)    ]   d[4j + 1] = D[16w + l/4,     8j + 2(l%4) + 1]
//   d[4j + 2] = D[16w + l/4 + 8, 8j + 2(l%4)    ]   d[4j + 3] = D[16w + l/4 + 8, 8j + 2(l%4) + 1]
#pragma once
#include <cstdint>
#include <cstdio>
#include <type_traits>
#include <utility>

#include <cute/arch/mma_sm90_gmma.hpp>

#include "device/arch.cuh"

namespace mxmoe::device {

// Matrix descriptor of a K-major tile stored with the 128-byte swizzle (what TMA writes with
// CU_TENSOR_MAP_SWIZZLE_128B): rows of 128 bytes, 8-row core groups 1024 bytes apart.
//   bits  0-13 start address >> 4     bits 16-29 leading byte offset >> 4 (unused when swizzled
//   K-major; set to 1)                bits 32-45 stride byte offset >> 4 (1024 B)
//   bits 49-51 base offset (0: tiles are 1024-byte aligned)   bits 62-63 swizzle (1 = 128 B)
// Advancing along K inside the 128-byte row is done by adding bytes to the start address.
__device__ __forceinline__ uint64_t make_wgmma_desc_kmajor_sw128(uint32_t smem_byte_addr) {
  uint64_t desc = 0;
  desc |= uint64_t((smem_byte_addr & 0x3FFFFu) >> 4);
  desc |= uint64_t(1) << 16;
  desc |= uint64_t(1024 >> 4) << 32;
  desc |= uint64_t(1) << 62;
  return desc;
}

// wgmma.fence.sync.aligned — before the first wgmma of a batch, once the accumulator registers
// have been touched by ordinary instructions.
__device__ __forceinline__ void wgmma_fence_sync_aligned() {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

__device__ __forceinline__ void wgmma_commit_group_sync_aligned() {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

template <int kPending>
__device__ __forceinline__ void wgmma_wait_group_sync_aligned() {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// Keeps the compiler from moving accumulator reads/writes across an in-flight wgmma.
template <int kN>
__device__ __forceinline__ void wgmma_fence_operand(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// wgmma.mma_async by CuTe's SM90 GMMA atoms (cute/arch/mma_sm90_gmma.hpp): D = A·Bᵀ (+ D when
// accumulate), both operands K-major in shared memory (descriptors above), A [64, k] and B [N, k].
// The atoms take the accumulator as kRegs separate references; gmma_fma spreads the array.
template <class Atom, int kRegs, size_t... kI>
__device__ __forceinline__ void gmma_fma(float (&d)[kRegs], uint64_t desc_a, uint64_t desc_b, bool accumulate,
                                         std::index_sequence<kI...>) {
  static_assert(sizeof...(kI) == kRegs, "one reference per accumulator register");
  Atom::fma(desc_a, desc_b, d[kI]..., accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}

// FP8: m64nNk32.f32.e4m3.e4m3 for the tile widths the GEMM instantiates (N = 128, 192).
template <int kN>
__device__ __forceinline__ void wgmma_mma_async_m64nNk32_f32_e4m3_e4m3_ss(
    float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(kN == 128 || kN == 192, "instantiated for m64n128k32 and m64n192k32");
  using Atom = std::conditional_t<kN == 128, cute::SM90::GMMA::MMA_64x128x32_F32E4M3E4M3_SS_TN<>,
                                  cute::SM90::GMMA::MMA_64x192x32_F32E4M3E4M3_SS_TN<>>;
  gmma_fma<Atom>(d, desc_a, desc_b, accumulate, std::make_index_sequence<kN / 2>{});
}

// BF16 (exact mode's BF16 images): m64nNk16.f32.bf16.bf16, N = 128 or 256, A and B not transposed
// (both K-major).
template <int kN>
__device__ __forceinline__ void wgmma_mma_async_m64nNk16_f32_bf16_bf16_ss(
    float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(kN == 128 || kN == 256, "instantiated for m64n128k16 and m64n256k16");
  constexpr auto kK = cute::SM90::GMMA::Major::K;
  using Atom = std::conditional_t<kN == 128, cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<kK, kK>,
                                  cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_SS<kK, kK>>;
  gmma_fma<Atom>(d, desc_a, desc_b, accumulate, std::make_index_sequence<kN / 2>{});
}

}  // namespace mxmoe::device
