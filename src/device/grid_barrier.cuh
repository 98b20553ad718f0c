// A grid-wide barrier for persistent kernels whose CTAs are all co-resident (one arrival word in
// global memory; atom.add.release.gpu / ld.acquire.gpu, sm_70+). Used by the fused decode step
// (src/kernels/decode/warp_decode_fused_sm90.cu).
//
// Protocol (sense flip, no reset between uses): the word's low 31 bits are 0 between barriers.
// At a barrier, thread 0 of every CTA adds 1, except CTA 0, which adds 2^31 − (G − 1) (G = CTAs
// in the grid): the G additions sum to exactly 2^31, so bit 31 flips when, and only when, the last
// CTA arrives, and the low 31 bits are 0 again. (Before the last arrival the low bits are either
// the number of arrivals, below G − 1, or 2^31 − (G − 1) plus them, below 2^31: no carry into bit
// 31.) Each CTA waits until bit 31 differs from the value its own addition returned. A fast CTA
// may arrive at the next barrier before a slow one has seen the flip: its addition only moves the
// low bits, and bit 31 flips again only once all G CTAs, the slow one included, have arrived
// there, so no waiter misses its flip.
// Memory ordering: __syncthreads, then the release add (cumulative over the CTA's writes, which
// bar.sync made visible to thread 0); the acquire load, then __syncthreads, so every thread's
// later loads see every CTA's writes made before the barrier. Those later loads must be coherent
// ones (ld.global, not ld.global.nc) for data written inside the kernel.
//
// State: GridBarrierState in global memory (the fused step keeps it in the caller's workspace).
// It must hold kGridBarrierMagic and arrive == 0 before the first use (grid_barrier_init, once);
// every completed barrier leaves the low bits 0, so nothing resets it between launches or graph
// replays. A kernel finding another magic traps (an uninitialised workspace would otherwise hang
// or pass the barrier early); so does a wait longer than kGridBarrierTimeoutNs (a grid that is not
// co-resident, e.g. two persistent grids sharing the device), instead of hanging.
#pragma once
#include <cstdint>

namespace mxmoe::device {

inline constexpr uint64_t kGridBarrierMagic = 0x316272676d786d6dull;  // "mmxmgrb1"
inline constexpr uint64_t kGridBarrierTimeoutNs = 5000000000ull;      // 5 s

struct alignas(64) GridBarrierState {
  uint64_t magic;
  uint32_t arrive;
  uint32_t pad[13];
};
static_assert(sizeof(GridBarrierState) == 64, "one 64-byte block");

__device__ __forceinline__ uint32_t atom_add_release_gpu_u32(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.add.release.gpu.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

__device__ __forceinline__ uint32_t ld_acquire_gpu_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t ld_relaxed_gpu_u64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Every thread of every CTA of the grid; all CTAs co-resident.
__device__ __forceinline__ void grid_barrier_sync(GridBarrierState* s) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t num_ctas = gridDim.x * gridDim.y * gridDim.z;
    const bool master = blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
    const uint32_t add = master ? 0x80000000u - (num_ctas - 1u) : 1u;
    const uint32_t old = atom_add_release_gpu_u32(&s->arrive, add);
    const uint64_t t0 = globaltimer_ns();
    for (uint32_t spin = 1;; ++spin) {
      if (((ld_acquire_gpu_u32(&s->arrive) ^ old) & 0x80000000u) != 0u) break;
      if ((spin & 1023u) == 0u && globaltimer_ns() - t0 > kGridBarrierTimeoutNs) __trap();
    }
  }
  __syncthreads();
}

// One thread: the state before its first use.
__device__ __forceinline__ void grid_barrier_init(GridBarrierState* s) {
  s->arrive = 0u;
  s->magic = kGridBarrierMagic;
}

}  // namespace mxmoe::device
