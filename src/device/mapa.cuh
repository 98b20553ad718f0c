// mapa (sm_90): the shared::cluster address of a variable in another CTA of the cluster.
#pragma once
#include <cstdint>
#include <cstdio>

#include "device/arch.cuh"

namespace mxmoe::device {

// mapa.shared::cluster.u32 — `local` is a shared::cta address in this CTA (smem_addr()); returns
// the shared::cluster address of the same offset in the shared memory of CTA `cta_rank` (which
// may be this CTA). Only shared::cluster instructions may use the result.
__device__ __forceinline__ uint32_t mapa_shared_cluster_u32(uint32_t local, uint32_t cta_rank) {
#ifdef MXMOE_SM90A_ENABLED
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(cta_rank));
  return remote;
#else
  MXMOE_DEVICE_UNSUPPORTED();
  return 0;
#endif
}

}  // namespace mxmoe::device
