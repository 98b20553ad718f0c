// cp.async.bulk.tensor (TMA, sm_90): 2-D and 3-D tiled global -> shared copies completing on an mbarrier,
// plus prefetch.tensormap, the cluster multicast form, and 3-D shared -> global stores in bulk
// groups. The CUtensorMap lives in kernel parameter space (__grid_constant__).
#pragma once
#include <cstdint>
#include <cstdio>

#include <cuda.h>

#include "device/arch.cuh"
#include "device/mbarrier.cuh"

namespace mxmoe::device {

// prefetch.tensormap — pull the descriptor into the cache before the first copy.
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// Copies the box at element coordinates (c0 = innermost, c1) into smem_dst; out-of-bounds
// elements are zero-filled and still count toward the barrier's transaction bytes.
__device__ __forceinline__ void cp_async_bulk_tensor_2d_global_to_shared(
    void* smem_dst, const CUtensorMap* map, uint64_t* bar, int32_t c0, int32_t c1) {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(smem_addr(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1)
      : "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// As the 2-D copy, for a 3-D map, at element coordinates (c0 = innermost, c1, c2). A box of
// [1, rows, cols] lands in shared memory exactly as the 2-D box [rows, cols] would (same swizzle).
// Out-of-bounds elements are zero-filled and still count toward the barrier's transaction bytes.
__device__ __forceinline__ void cp_async_bulk_tensor_3d_global_to_shared(
    void* smem_dst, const CUtensorMap* map, uint64_t* bar, int32_t c0, int32_t c1, int32_t c2) {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(smem_addr(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// The 3-D load above with an L2 cache policy (.L2::cache_hint; `policy` from createpolicy_l2).
__device__ __forceinline__ void cp_async_bulk_tensor_3d_global_to_shared_hint(
    void* smem_dst, const CUtensorMap* map, uint64_t* bar, int32_t c0, int32_t c1, int32_t c2, uint64_t policy) {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4, %5}], [%2], %6;\n" ::"r"(smem_addr(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "l"(policy)
      : "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// createpolicy.fractional.L2::<priority>.b64 with fraction 1.0: a cache policy for the
// .L2::cache_hint forms. priority: 0 evict_normal, 1 evict_first, 2 evict_last.
__device__ __forceinline__ uint64_t createpolicy_l2(int priority) {
  uint64_t pol = 0;
#ifdef MXMOE_SM90A_ENABLED
  if (priority == 1) {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
  } else if (priority == 2) {
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(pol));
  } else {
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(pol));
  }
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
  return pol;
}

// cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster
// As above, but the box is written to the same CTA-relative offset (smem_dst's) in the shared
// memory of every CTA whose bit is set in cta_mask (bit i = cluster rank i), and each of those
// CTAs' mbarrier at bar's offset receives complete_tx of the box's bytes. One L2 read feeds all.
__device__ __forceinline__ void cp_async_bulk_tensor_2d_global_to_shared_multicast_cluster(
    void* smem_dst, const CUtensorMap* map, uint64_t* bar, int32_t c0, int32_t c1,
    uint16_t cta_mask) {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(smem_addr(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "h"(cta_mask)
      : "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// cp.async.bulk.tensor.3d.global.shared::cta.bulk_group — TMA store of a box from shared memory
// to the box at element coordinates (c0 = innermost, c1, c2); parts of the box outside the tensor
// are not written. Tracked in bulk groups: commit with cp_async_bulk_commit_group.
__device__ __forceinline__ void cp_async_bulk_tensor_3d_shared_to_global(const CUtensorMap* map, const void* smem_src,
                                                                         int32_t c0, int32_t c1, int32_t c2) {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_addr(smem_src)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// The 3-D store above with an L2 cache policy (.L2::cache_hint; `policy` from createpolicy_l2).
__device__ __forceinline__ void cp_async_bulk_tensor_3d_shared_to_global_hint(const CUtensorMap* map,
                                                                              const void* smem_src, int32_t c0,
                                                                              int32_t c1, int32_t c2, uint64_t policy) {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group.L2::cache_hint [%0, {%2, %3, %4}], [%1], %5;\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_addr(smem_src)), "r"(c0), "r"(c1), "r"(c2), "l"(policy)
               : "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// cp.async.bulk.commit_group — closes this thread's bulk group of the stores issued since the last.
__device__ __forceinline__ void cp_async_bulk_commit_group() {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// cp.async.bulk.wait_group.read N — until at most N of this thread's bulk groups still read their
// shared-memory source (the source may then be overwritten).
template <int N>
__device__ __forceinline__ void cp_async_bulk_wait_group_read() {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

// cp.async.bulk.wait_group N — until at most N of this thread's bulk groups are incomplete
// (their global writes done).
template <int N>
__device__ __forceinline__ void cp_async_bulk_wait_group() {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

}  // namespace mxmoe::device
