// cp.reduce.async.bulk.tensor (TMA reduction, sm_90): adds a box from shared memory into the box at
// the given coordinates of a global tensor, element by element in the tensor map's data type (for
// FLOAT32: one IEEE round-to-nearest add per element); parts of the box outside the tensor are
// not touched. Tracked in bulk groups like the TMA stores (cp_async_bulk_tensor.cuh).
#pragma once
#include <cstdint>

#include <cuda.h>

#include "device/arch.cuh"
#include "device/mbarrier.cuh"

namespace mxmoe::device {

// cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group — y[box] += smem box
// (coordinates c0 = innermost, c1, c2, in elements). Commit with cp_async_bulk_commit_group.
__device__ __forceinline__ void cp_reduce_async_bulk_tensor_3d_add_shared_to_global(const CUtensorMap* map,
                                                                                    const void* smem_src, int32_t c0,
                                                                                    int32_t c1, int32_t c2) {
#ifdef MXMOE_SM90A_ENABLED
  asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_addr(smem_src)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
#else
  MXMOE_DEVICE_UNSUPPORTED();
#endif
}

}  // namespace mxmoe::device
