// setmaxnreg (sm_90a): warpgroup-wide register re-allocation for warp-specialised kernels.
// Every thread of the warpgroup must execute the same instruction (it is .sync.aligned).
#pragma once
#include <cstdio>

#include "device/arch.cuh"

namespace mxmoe::device {

template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc_sync_aligned_u32() {
  static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg: 24..256, step 8");
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec_sync_aligned_u32() {
  static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg: 24..256, step 8");
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

}  // namespace mxmoe::device
