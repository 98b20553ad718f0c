// mbarrier.* (shared-memory transaction barriers, sm_90): init, arrive, expect_tx, try_wait.parity;
// arrive on a barrier of another CTA of the cluster (shared::cluster address) at the end.
// Addresses are 32-bit shared-window addresses (__cvta_generic_to_shared).
#pragma once
#include <cstdint>
#include <cstdio>

#include "device/arch.cuh"

namespace mxmoe::device {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// mbarrier.init.shared::cta.b64 — expected arrivals per phase.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals)
               : "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// fence.mbarrier_init.release.cluster — makes the inits visible (also to the async proxy) before
// the __syncthreads that follows.
__device__ __forceinline__ void fence_mbarrier_init_release_cluster() {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// fence.proxy.async.shared::cta — orders generic-proxy shared accesses with the async proxy.
__device__ __forceinline__ void fence_proxy_async_shared_cta() {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// mbarrier.arrive.release.cta.shared::cta.b64 — one arrival (release: prior writes visible to the
// waiter that observes the phase flip).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar))
               : "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 — one arrival plus tx_bytes to wait for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t tx_bytes) {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                   smem_addr(bar)),
               "r"(tx_bytes)
               : "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// mbarrier.expect_tx.relaxed.cta.shared::cta.b64 — add tx_bytes to wait for, without arriving.
__device__ __forceinline__ void mbarrier_expect_tx(uint64_t* bar, uint32_t tx_bytes) {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(tx_bytes)
               : "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 once (it may suspend the thread for a
// hardware-defined time): whether the phase with the given parity has completed.
__device__ __forceinline__ bool mbarrier_try_wait_parity(uint32_t addr, uint32_t parity) {
#ifdef MXMOE_SM90A_ENABLED
  uint32_t done = 0;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(addr), "r"(parity)
      : "memory");
  return done != 0;
#else
  MXMOE_DEVICE_UNSUPPORTED();
  return true;
#endif
}

// mbarrier.try_wait.parity in a loop: returns once the phase with the given parity has completed.
// A fresh barrier is in phase 0, so waiting for parity 1 returns at once (the "previous phase"
// convention producers use for empty slots).
__device__ __forceinline__ void mbarrier_wait_parity(uint64_t* bar, uint32_t parity) {
#ifdef MXMOE_SM90A_ENABLED
  const uint32_t addr = smem_addr(bar);
  while (!mbarrier_try_wait_parity(addr, parity)) {
  }
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// As mbarrier_wait_parity, but traps once the phase has not completed within timeout_ns of
// %globaltimer (read only after the first 1024 failed tries, so a wait that passes soon costs
// nothing more): a mis-counted barrier fails the launch (an unspecified launch failure at the
// next synchronisation) instead of hanging the process. For new barrier protocols (the
// quantizer's TMA scale units of both directions).
__device__ __forceinline__ void mbarrier_wait_parity_or_trap(uint64_t* bar, uint32_t parity, uint64_t timeout_ns) {
#ifdef MXMOE_SM90A_ENABLED
  const uint32_t addr = smem_addr(bar);
  uint64_t t0 = 0;
  for (uint32_t spin = 1; !mbarrier_try_wait_parity(addr, parity); ++spin) {
    if ((spin & 1023u) != 0u) continue;
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t0 == 0) t0 = t;
    else if (t - t0 > timeout_ns) __trap();
  }
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// ---- across the CTAs of a cluster (2-CTA TMA multicast) ----

// mbarrier.arrive.release.cta.shared::cluster.b64 — one arrival on a barrier in any CTA of the
// cluster; `cluster_addr` is a shared::cluster address (mapa_shared_cluster_u32, mapa.cuh).
// Release at CTA scope, as CUTLASS's ClusterBarrier::arrive(cta_id) does: suited to "slot free"
// signals whose only cross-CTA hazard is a later async-proxy (TMA) write into a slot that this
// thread's warpgroup read through wgmma, retired by wgmma.wait_group before the arrival. (The
// .release.cluster form costs MEMBAR.ALL.GPU per arrival in SASS, which would wait for the
// epilogue's outstanding global stores.)
__device__ __forceinline__ void mbarrier_arrive_release_cta_shared_cluster(uint32_t cluster_addr) {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("mbarrier.arrive.release.cta.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_addr)
               : "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

}  // namespace mxmoe::device
