// Device pieces shared by the two kernels that make the 128x128-block fast form (gemm.h
// FastScaleLayout::kBlock128): rebase_fast_block128_sm90.cu (from the plain MX copy) and
// quantize_block128_sm90.cu (from BF16). One CTA works on one 128x128 block at a time.
#pragma once
#include <cstdint>

#include "mxmoe/mx_format.h"

namespace mxmoe::block128 {

// The block's maximum scale byte from every thread's byte (0 where it owns none: byte 0 never raises
// the maximum, like an all-zero block; 0xFF, NaN, wins): a warp max, then one shared-memory word per
// warp. A CTA that calls it twice must __syncthreads() between the calls (warp_max is reused).
template <int kThreads>
__device__ __forceinline__ uint32_t block_max(uint32_t mine, uint32_t* warp_max) {
  const uint32_t wm = __reduce_max_sync(0xFFFFFFFFu, mine);
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = wm;
  __syncthreads();
  uint32_t emax = warp_max[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) emax = emax > warp_max[w] ? emax : warp_max[w];
  return emax;
}

// The block's scale byte at srow[blk] of its (matrix, chunk) row of nblk blocks, and that row's
// pitch padding bytes (written as 0) by the block that is last along the row.
template <int kThreads>
__device__ __forceinline__ void store_block_scale(uint8_t* srow, int64_t blk, int64_t nblk, int64_t pitch,
                                                  uint32_t emax) {
  if (threadIdx.x == 0) srow[blk] = uint8_t(emax);
  if (blk == nblk - 1)
    for (int64_t p = nblk + threadIdx.x; p < pitch; p += kThreads) srow[p] = 0;
}

}  // namespace mxmoe::block128
