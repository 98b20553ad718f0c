// mma.sync (sm_80+ warp-level MMA; HMMA.16816.F32 in SASS): D = A·B + C for one m16n8k16 tile
// with FP16 A and B and FP32 C/D. Products of FP16 values are exact; the tensor core adds the 16
// products and C with an FP32-width sum. Wrapper named after the instruction.
//
// Fragments, lane l of the warp, g = l/4, t = l%4 (low half of each 32-bit register = lower k):
//   A (16x16, row-major): a0 = A[g][2t, 2t+1]    a1 = A[g+8][2t, 2t+1]
//                         a2 = A[g][2t+8, 2t+9]  a3 = A[g+8][2t+8, 2t+9]
//   B (16x8, "col"):      b0 = B[2t, 2t+1][g]    b1 = B[2t+8, 2t+9][g]
//   C, D (16x8 FP32):     d0 = D[g][2t]  d1 = D[g][2t+1]  d2 = D[g+8][2t]  d3 = D[g+8][2t+1]
#pragma once
#include <cstdint>

namespace mxmoe::dev {

__device__ __forceinline__ void mma_sync_aligned_m16n8k16_row_col_f32_f16_f16_f32(
    float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
}

}  // namespace mxmoe::dev
