// bar.sync / bar.arrive with a barrier id and a thread count (sm_70+): a barrier among `threads`
// threads of the CTA (a multiple of 32, whole warps) that does not involve the rest of the CTA, as a
// warpgroup's private barrier. Id 0 is __syncthreads'; callers pick ids 1..15. bar.arrive counts the
// calling warp without waiting (a producer's half of a producer/consumer handoff); the memory
// accesses before it are performed for the threads that wait at the barrier (bar.sync) after it
// completes, the ordering bar.sync itself gives.
#pragma once
#include <cstdint>

#include "device/arch.cuh"

namespace mxmoe::device {

__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

}  // namespace mxmoe::device
