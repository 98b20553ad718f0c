// Per-kernel, per-device one-time setup shared by the launchers. The kernel is a template
// argument so that each kernel instantiation gets its own flags: all instantiations of a kernel
// template share one function type, so statics keyed on the type would be set for one kernel only
// (the cause of run 15's cudaErrorInvalidValue launches).
#pragma once
#include <atomic>

#include <cuda_runtime.h>

#include "host/check.h"

namespace mxmoe::detail {

// Raises `kernel`'s dynamic shared-memory limit to `bytes` once per device. Doing it on every
// launch would also run inside CUDA-graph capture, where only stream work belongs.
template <auto kernel>
void set_smem_limit_once(const char* fn, int bytes) {
  constexpr int kDevices = 64;  // devices tracked; beyond, the attribute is set on every launch
  static std::atomic<bool> done[kDevices] = {};
  int device = 0;
  MXMOE_CUDA_CHECK(fn, cudaGetDevice(&device));
  if (device < kDevices && done[device].load(std::memory_order_acquire)) return;
  MXMOE_CUDA_CHECK(fn, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  if (device < kDevices) done[device].store(true, std::memory_order_release);
}

}  // namespace mxmoe::detail
