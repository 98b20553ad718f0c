// griddepcontrol (sm_90): Programmatic Dependent Launch from inside a kernel. A kernel launched
// with cudaLaunchAttributeProgrammaticStreamSerialization may start before the kernel ahead of it
// in the stream (the primary) has finished; it must execute griddepcontrol.wait before it reads
// anything the primary writes. griddepcontrol.launch_dependents lets the kernel behind this one
// start once every CTA of this grid has executed it (or exited). Both are no-ops when the launch
// had no programmatic dependency, so correctness never depends on PDL being in effect.
// Wrappers named after the instruction.
#pragma once

#include "device/arch.cuh"

namespace mxmoe::dev {

// griddepcontrol.wait: blocks until every prerequisite grid has completed and its memory
// operations are visible to this grid.
__device__ __forceinline__ void griddepcontrol_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// griddepcontrol.launch_dependents: this CTA no longer holds back the dependent grid's launch.
__device__ __forceinline__ void griddepcontrol_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace mxmoe::dev
