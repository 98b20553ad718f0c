// wgmma.* (sm_90a warpgroup MMA): shared-memory matrix descriptors, wgmma.fence,
// wgmma.commit_group, wgmma.wait_group and wgmma.mma_async for FP8 (E4M3 x E4M3 -> F32, k32) and
// BF16 (BF16 x BF16 -> F32, k16). Both read K-major operands of 32 bytes per row per instruction,
// so one 128-byte swizzled row holds four k-steps of either.
//
// Accumulator fragment of an m64nNk32 / m64nNk16 wgmma, thread t of the warpgroup (warp w = t/32,
// lane l):
//   d[4j + 0] = D[16w + l/4,     8j + 2(l%4)    ]   d[4j + 1] = D[16w + l/4,     8j + 2(l%4) + 1]
//   d[4j + 2] = D[16w + l/4 + 8, 8j + 2(l%4)    ]   d[4j + 3] = D[16w + l/4 + 8, 8j + 2(l%4) + 1]
#pragma once
#include <cstdint>
#include <cstdio>

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

// wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3, both operands from shared memory
// (K-major). D = A·Bᵀ (+ D when accumulate), A [64, 32] and B [128, 32] E4M3.
__device__ __forceinline__ void wgmma_mma_async_m64n128k32_f32_e4m3_e4m3_ss(
    float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, "
      "%40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1;\n"
      "}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
        "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),
        "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
        "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(int32_t(accumulate)));
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3, both operands from shared memory
// (K-major). D = A·Bᵀ (+ D when accumulate), A [64, 32] and B [192, 32] E4M3. Same fragment
// layout as above with j = 0..23.
__device__ __forceinline__ void wgmma_mma_async_m64n192k32_f32_e4m3_e4m3_ss(
    float (&d)[96], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %98, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, "
      "%40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, "
      "%72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, "
      "%88, %89, %90, %91, %92, %93, %94, %95"
      "}, %96, %97, p, 1, 1;\n"
      "}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
        "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),
        "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
        "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]),
        "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]),
        "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
        "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),
        "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
      : "l"(desc_a), "l"(desc_b), "r"(int32_t(accumulate)));
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// The m64nNk32 E4M3 wgmma for the tile widths the GEMM instantiates (N = 128, 192).
template <int kN>
__device__ __forceinline__ void wgmma_mma_async_m64nNk32_f32_e4m3_e4m3_ss(
    float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(kN == 128 || kN == 192, "wrappers exist for m64n128k32 and m64n192k32");
  if constexpr (kN == 128) wgmma_mma_async_m64n128k32_f32_e4m3_e4m3_ss(d, desc_a, desc_b, accumulate);
  else wgmma_mma_async_m64n192k32_f32_e4m3_e4m3_ss(d, desc_a, desc_b, accumulate);
}

// ---- BF16 (exact mode's BF16 images) -----------------------------------------------------------
// The operand lists are spelled by macros: 8 accumulator registers per MXMOE_WGMMA_D8, their
// "%i" placeholders 32 at a time. Only the wrappers below use them.
#define MXMOE_WGMMA_D8(i)                                                                     \
  "+f"(d[(i) + 0]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]),  \
      "+f"(d[(i) + 5]), "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define MXMOE_WGMMA_D64(i)                                                                    \
  MXMOE_WGMMA_D8((i) + 0), MXMOE_WGMMA_D8((i) + 8), MXMOE_WGMMA_D8((i) + 16),                 \
      MXMOE_WGMMA_D8((i) + 24), MXMOE_WGMMA_D8((i) + 32), MXMOE_WGMMA_D8((i) + 40),           \
      MXMOE_WGMMA_D8((i) + 48), MXMOE_WGMMA_D8((i) + 56)
#define MXMOE_WGMMA_R0_31                                                                     \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                    \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define MXMOE_WGMMA_R32_63                                                                    \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "          \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define MXMOE_WGMMA_R64_95                                                                    \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "          \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define MXMOE_WGMMA_R96_127                                                                   \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, "    \
  "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, " \
  "%126, %127"
// wgmma.mma_async.sync.aligned.m64n<N>k16.f32.bf16.bf16 {REGS}, desc_a, desc_b, p, 1, 1, 0, 0
// (scale-d = accumulate, A and B not negated, both K-major: no transpose); IA, IB, IP: the operand
// numbers of desc_a, desc_b and accumulate.
#define MXMOE_WGMMA_BF16_SS(N, REGS, IA, IB, IP, ...)                                          \
  asm volatile("{\n"                                                                           \
               ".reg .pred p;\n"                                                               \
               "setp.ne.b32 p, %" #IP ", 0;\n"                                                 \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 "                     \
               "{" REGS "}, %" #IA ", %" #IB ", p, 1, 1, 0, 0;\n"                              \
               "}\n"                                                                           \
               : __VA_ARGS__                                                                   \
               : "l"(desc_a), "l"(desc_b), "r"(int32_t(accumulate)))

// D = A·Bᵀ (+ D when accumulate), A [64, 16] and B [128, 16] BF16, both K-major in shared memory.
__device__ __forceinline__ void wgmma_mma_async_m64n128k16_f32_bf16_bf16_ss(
    float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
#ifdef MXMOE_SM90A_ENABLED
  MXMOE_WGMMA_BF16_SS(128, MXMOE_WGMMA_R0_31 ", " MXMOE_WGMMA_R32_63, 64, 65, 66, MXMOE_WGMMA_D64(0));
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// D = A·Bᵀ (+ D when accumulate), A [64, 16] and B [256, 16] BF16; the fragment as above, j = 0..31.
__device__ __forceinline__ void wgmma_mma_async_m64n256k16_f32_bf16_bf16_ss(
    float (&d)[128], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
#ifdef MXMOE_SM90A_ENABLED
  MXMOE_WGMMA_BF16_SS(256,
                      MXMOE_WGMMA_R0_31 ", " MXMOE_WGMMA_R32_63 ", " MXMOE_WGMMA_R64_95 ", " MXMOE_WGMMA_R96_127,
                      128, 129, 130, MXMOE_WGMMA_D64(0), MXMOE_WGMMA_D64(64));
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

#undef MXMOE_WGMMA_BF16_SS
#undef MXMOE_WGMMA_R96_127
#undef MXMOE_WGMMA_R64_95
#undef MXMOE_WGMMA_R32_63
#undef MXMOE_WGMMA_R0_31
#undef MXMOE_WGMMA_D64
#undef MXMOE_WGMMA_D8

// The m64nNk16 BF16 wgmma for the tile widths exact mode instantiates (N = 128, 256).
template <int kN>
__device__ __forceinline__ void wgmma_mma_async_m64nNk16_f32_bf16_bf16_ss(
    float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(kN == 128 || kN == 256, "wrappers exist for m64n128k16 and m64n256k16");
  if constexpr (kN == 128) wgmma_mma_async_m64n128k16_f32_bf16_bf16_ss(d, desc_a, desc_b, accumulate);
  else wgmma_mma_async_m64n256k16_f32_bf16_bf16_ss(d, desc_a, desc_b, accumulate);
}

}  // namespace mxmoe::device
