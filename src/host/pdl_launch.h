// Kernel launches with Programmatic Dependent Launch (PDL, sm_90): the kernel may start while the
// kernel ahead of it in the stream is still running, and orders itself with griddepcontrol.wait
// (src/device/griddepcontrol.cuh) before it reads that kernel's output. Captured into CUDA graphs
// as programmatic edges. The kernels are correct with or without it: without the attribute their
// griddepcontrol instructions do nothing and the stream serializes as usual.
// MXMOE_DECODE_PDL=0 in the environment launches without the attribute (for A/B timing).
#pragma once
#include <cstdlib>
#include <cstring>
#include <utility>

#include <cuda_runtime.h>

#include "host/check.h"

namespace mxmoe::detail {

inline bool pdl_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MXMOE_DECODE_PDL");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

// A launch attribute for clusters of `cluster` CTAs along x.
inline cudaLaunchAttribute cluster_dim_attr(unsigned cluster) {
  cudaLaunchAttribute a;
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = cluster;
  a.val.clusterDim.y = 1;
  a.val.clusterDim.z = 1;
  return a;
}

// kernel<<<grid, block, smem, stream>>>(args...) with cudaLaunchAttributeProgrammaticStreamSerialization
// (compile-time cluster dimensions of the kernel apply as usual), and with
// cudaLaunchAttributeCooperative when `cooperative` (the driver then guarantees that every CTA is
// co-resident, or fails the launch). The return code is checked.
// cluster > 0: clusters of `cluster` CTAs along x (cudaLaunchAttributeClusterDimension), for kernels
// without compile-time cluster dimensions.
template <class... KernelArgs, class... Args>
void launch_with_pdl_attrs(const char* fn, bool cooperative, unsigned cluster, void (*kernel)(KernelArgs...),
                           dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[3];
  unsigned n = 0;
  if (pdl_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cooperative) {
    attr[n].id = cudaLaunchAttributeCooperative;
    attr[n++].val.cooperative = 1;
  }
  if (cluster > 0) attr[n++] = cluster_dim_attr(cluster);
  cfg.attrs = attr;
  cfg.numAttrs = n;
  MXMOE_CUDA_CHECK(fn, cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

template <class... KernelArgs, class... Args>
void launch_with_pdl(const char* fn, void (*kernel)(KernelArgs...), dim3 grid, dim3 block,
                     size_t smem, cudaStream_t stream, Args&&... args) {
  launch_with_pdl_attrs(fn, false, 0u, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

template <class... KernelArgs, class... Args>
void launch_with_pdl_cluster(const char* fn, void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                             cudaStream_t stream, unsigned cluster, Args&&... args) {
  launch_with_pdl_attrs(fn, false, cluster, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

}  // namespace mxmoe::detail
