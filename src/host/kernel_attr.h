// Per-kernel, per-device one-time setup shared by the launchers. The kernel is a template
// argument so that each kernel instantiation gets its own cache: all instantiations of a kernel
// template share one function type, so statics keyed on the type would be set for one kernel only
// (the cause of run 15's cudaErrorInvalidValue launches).
#pragma once
#include <algorithm>
#include <atomic>

#include <cuda_runtime.h>

#include "host/check.h"

namespace mxmoe::detail {

// Tags naming what is cached, so that one kernel can have several per-device values.
struct SmemLimitTag {};
struct MaxResidentTag {};

// compute(device) once per (kernel, Tag, device), its result (which must be > 0) cached. Setup done
// on every launch would also run inside CUDA-graph capture, where only stream work belongs.
template <auto kernel, class Tag, class F>
int once_per_device(const char* fn, F&& compute) {
  constexpr int kDevices = 64;  // devices tracked; beyond, compute runs on every launch
  static std::atomic<int> cached[kDevices] = {};  // 0: not yet
  int device = 0;
  MXMOE_CUDA_CHECK(fn, cudaGetDevice(&device));
  if (device < kDevices) {
    const int v = cached[device].load(std::memory_order_acquire);
    if (v > 0) return v;
  }
  const int v = compute(device);
  if (device < kDevices) cached[device].store(v, std::memory_order_release);
  return v;
}

// Raises `kernel`'s dynamic shared-memory limit to `bytes` once per device.
template <auto kernel>
void set_smem_limit_once(const char* fn, int bytes) {
  once_per_device<kernel, SmemLimitTag>(fn, [&](int) {
    MXMOE_CUDA_CHECK(fn, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return 1;
  });
}

// CTAs of `kernel` (threads per CTA, smem bytes of dynamic shared memory) that fit on the device at
// once, cached per device: the grid of a persistent kernel.
template <auto kernel>
int max_resident_ctas(const char* fn, int threads, int smem = 0) {
  return once_per_device<kernel, MaxResidentTag>(fn, [fn, threads, smem](int dev) {
    int sms = 0, per_sm = 0;
    MXMOE_CUDA_CHECK(fn, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    MXMOE_CUDA_CHECK(fn, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
    return sms * std::max(1, per_sm);
  });
}

}  // namespace mxmoe::detail
