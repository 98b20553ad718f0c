// cp.async.bulk.prefetch.L2.global (sm_90): asks the memory system to bring `bytes` bytes at a
// global address into L2, with one instruction and no registers; nothing waits for it.
#pragma once
#include <cstdint>

#include "device/arch.cuh"

namespace mxmoe::device {

// addr 16-byte aligned, bytes a multiple of 16 (both unchecked).
__device__ __forceinline__ void cp_async_bulk_prefetch_L2_global(const void* addr, uint32_t bytes) {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(addr), "r"(bytes) : "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

}  // namespace mxmoe::device
