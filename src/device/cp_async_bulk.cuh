// cp.async.bulk (non-tensor bulk copies, sm_90): contiguous global -> shared copies completing on an
// mbarrier, shared -> global copies tracked in bulk groups, and the global-memory proxy fence that
// orders their writes with the generic proxy. No tensor map: an address and a byte count, both
// 16-byte aligned / a multiple of 16. Commit and wait of bulk groups: cp_async_bulk_tensor.cuh.
//
// The global side may be any address of the .global window that this GPU maps, peer memory
// included: NCCL's LSA pointers (cuMem mappings of a peer's allocation) are plain global addresses,
// and NCCL's own device headers issue cp.async.bulk.global.shared::cta to non-local mapped memory
// (nccl_device/gin/gdaki/.../doca_gpunetio_dev_verbs_qp.cuh); run 50 (branch ep-bulk) moved every
// EP test's rows this way. Used by the grouped GEMM's row epilogue (OutStore::kRows, the EP layer's
// fused combine: grouped_gemm_mxfp8_sm90_ws.cuh); branch ep-bulk's dispatch/combine copies also
// use the global -> shared form.
#pragma once
#include <cstdint>
#include <cstdio>

#include "device/arch.cuh"
#include "device/mbarrier.cuh"

namespace mxmoe::device {

// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes — `bytes` from global `src`
// into this CTA's shared `dst` (a shared::cta address is a valid shared::cluster address of the
// executing CTA); the barrier `bar` receives complete_tx(bytes) when the data has landed.
__device__ __forceinline__ void cp_async_bulk_global_to_shared(void* dst, const void* src, uint32_t bytes,
                                                               uint64_t* bar) {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// cp.async.bulk.global.shared::cta.bulk_group — `bytes` from this CTA's shared `src` to global
// `dst`. Tracked in this thread's bulk groups (cp_async_bulk_commit_group; wait_group.read before
// reusing `src`, wait_group before anything that must see the writes).
__device__ __forceinline__ void cp_async_bulk_shared_to_global(void* dst, const void* src, uint32_t bytes) {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(smem_addr(src)),
               "r"(bytes)
               : "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// fence.proxy.async.global — a bidirectional proxy fence for global memory: orders this thread's
// async-proxy accesses (bulk copies) with its generic-proxy ones, in program order.
__device__ __forceinline__ void fence_proxy_async_global() {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

}  // namespace mxmoe::device
