// griddepcontrol (sm_90): Programmatic Dependent Launch from inside a kernel. A kernel launched
// with cudaLaunchAttributeProgrammaticStreamSerialization (src/host/pdl_launch.h) may start before
// the kernel ahead of it in the stream (the primary) has finished; it must execute
// griddepcontrol.wait before it reads anything the primary writes, and before it writes anything
// the primary may still read. griddepcontrol.launch_dependents lets the kernel behind this one
// start once every CTA of this grid has executed it (or exited). Both are no-ops when the launch
// had no programmatic dependency, so correctness never depends on PDL being in effect.
#pragma once
#include <cstdio>

#include "device/arch.cuh"

namespace mxmoe::device {

// griddepcontrol.wait — blocks until every prerequisite grid has completed and its memory
// operations are visible to this grid.
__device__ __forceinline__ void griddepcontrol_wait() {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// griddepcontrol.launch_dependents — this CTA no longer holds back the dependent grid's launch.
__device__ __forceinline__ void griddepcontrol_launch_dependents() {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

}  // namespace mxmoe::device
