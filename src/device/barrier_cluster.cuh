// barrier.cluster.* (sm_90): the cluster-wide execution barrier, split into arrive and wait, plus
// the read of %cluster_ctarank it goes with. Every thread of every CTA of the cluster that has not
// exited must arrive before any waiter returns; arrive.release + wait.acquire also order memory
// (shared::cluster included) between the CTAs. Non-.aligned forms: callers may be divergent.
#pragma once
#include <cstdint>
#include <cstdio>

#include "device/arch.cuh"

namespace mxmoe::device {

// barrier.cluster.arrive.release — this thread's arrival; its prior memory accesses (including
// remote mbarrier arrivals and DSMEM stores) happen before the wait of every thread of the cluster.
__device__ __forceinline__ void barrier_cluster_arrive_release() {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// barrier.cluster.arrive.relaxed — this thread's arrival, ordering no memory access (an execution
// barrier only: e.g. "every CTA of the cluster is running" before DSMEM is touched). Cheaper than the
// release form, which compiles to a GPU-scope MEMBAR.
__device__ __forceinline__ void barrier_cluster_arrive_relaxed() {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// barrier.cluster.wait.acquire — returns once every non-exited thread of the cluster has arrived.
__device__ __forceinline__ void barrier_cluster_wait_acquire() {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// mov.u32 %r, %cluster_ctarank — this CTA's rank in its cluster (0 .. cluster size - 1).
__device__ __forceinline__ uint32_t cluster_ctarank() {
#ifdef MXMOE_SM90A_ENABLED
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
#else
  MXMOE_DEVICE_UNSUPPORTED();
  return 0;
#endif
}

}  // namespace mxmoe::device
