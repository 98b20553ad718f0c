// prefetch.global.L2: asks L2 for the line that holds one global address, per thread, with no destination
// register and nothing that waits for it (sm_90 SASS: CCTL.E.PF2).
#pragma once

#include "device/arch.cuh"

namespace mxmoe::device {

__device__ __forceinline__ void prefetch_global_L2(const void* addr) {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(addr) : "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

}  // namespace mxmoe::device
