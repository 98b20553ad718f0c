// cp.async (sm_80+): asynchronous 16- and 4-byte global → shared copies (LDGSTS), tracked per thread in
// commit groups. Wrappers named after the instruction.
#pragma once
#include <cstdint>

namespace mxmoe::dev {

// cp.async.cg.shared.global [dst], [src], 16, src_size: copies 16 bytes, or writes 16 zero bytes
// when `valid` is false (src_size = 0: nothing is read; src must still be a mapped address).
__device__ __forceinline__ void cp_async_cg_shared_global_16_zfill(void* dst_smem, const void* src_gmem, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(dst_smem));
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src_gmem), "r"(src_size)
               : "memory");
}

// cp.async.ca.shared.global [dst], [src], 4, src_size: copies 4 bytes (through L1), or writes 4
// zero bytes when `valid` is false (src_size = 0: nothing is read; src must still be mapped).
__device__ __forceinline__ void cp_async_ca_shared_global_4_zfill(void* dst_smem, const void* src_gmem, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(dst_smem));
  const int src_size = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src_gmem), "r"(src_size)
               : "memory");
}

// cp.async.commit_group: closes the group of this thread's cp.async issued since the last commit.
__device__ __forceinline__ void cp_async_commit_group() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// cp.async.wait_group N: waits until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace mxmoe::dev
