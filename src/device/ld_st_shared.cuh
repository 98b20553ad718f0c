// ld.shared / st.shared with 32-bit shared-window addresses (smem_addr(), mbarrier.cuh), for kernels
// that compute their shared-memory addresses as integers (XOR swizzles folded into one LOP3 per
// access). Vector forms of 8 and 16 bytes; the address must be aligned to the access size.
#pragma once
#include <cstdint>

namespace mxmoe::device {

// ld.shared.v4.u32 — 16 bytes.
__device__ __forceinline__ uint4 ld_shared_v4_u32(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// ld.shared.v2.u32 — 8 bytes.
__device__ __forceinline__ uint2 ld_shared_v2_u32(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr) : "memory");
  return v;
}

// st.shared.v4.u32 — 16 bytes.
__device__ __forceinline__ void st_shared_v4_u32(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

}  // namespace mxmoe::device
