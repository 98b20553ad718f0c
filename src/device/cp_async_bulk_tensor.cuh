// cp.async.bulk.tensor (TMA, sm_90): 2-D tiled global -> shared copies completing on an mbarrier,
// plus prefetch.tensormap. The CUtensorMap lives in kernel parameter space (__grid_constant__).
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

}  // namespace mxmoe::device
