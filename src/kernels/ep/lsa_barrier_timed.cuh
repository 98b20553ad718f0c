// A CTA-wide LSA barrier with a timeout, on top of NCCL's ncclLsaBarrierSession (nccl_device.h).
//
// NCCL's session.wait() spins without bound: a peer that never arrives (crashed, or called a
// different sequence of collectives) hangs the GPU. We keep NCCL's arrive() (it publishes
// epoch + 1 into every peer's inbox with a system-scope release store) and replace wait() by a
// loop that polls the same inbox words (session.ucInbox, session.epoch: the public members of
// ncclLsaBarrierSession_internal in NCCL 2.28) with an acquire load and gives up after
// timeout_ns of %globaltimer, OR-ing `error_bit` into *error_flag. Either way the epoch advances
// as NCCL's wait() does, so the session's destructor leaves the state consistent on success; after
// a timeout the barrier state is not trustworthy and the communicator must be destroyed.
//
// This depends on NCCL's internal session layout: re-read impl/lsa_barrier__funcs.h before
// moving past NCCL 2.28 (the static_assert below stops a silent upgrade).
#pragma once
#include <cstdint>

#include <cuda/atomic>
#include <nccl.h>
#include <nccl_device.h>

static_assert(NCCL_VERSION_CODE >= 22800 && NCCL_VERSION_CODE < 22900,
              "lsa_barrier_timed.cuh reads ncclLsaBarrierSession internals of NCCL 2.28: re-check them");

namespace mxmoe::ep {

__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Wait for every other rank of the session's team to arrive at this epoch, bounded in time.
// Returns false (and sets error_bit) on a timeout. Ends with a CTA barrier, like NCCL's wait().
__device__ __forceinline__ bool lsa_wait_timed(ncclLsaBarrierSession<ncclCoopCta>& s, uint64_t timeout_ns,
                                               int* error_flag, int error_bit) {
  __shared__ int timed_out;
  if (threadIdx.x == 0) timed_out = 0;
  __syncthreads();
  const int n = s.team.nRanks, me = s.team.rank;
  const uint32_t target = s.epoch + 1;
  for (int i = threadIdx.x; i < n - 1; i += blockDim.x) {
    const int peer = i < me ? i : i + 1;
    cuda::atomic_ref<uint32_t, cuda::thread_scope_system> inbox(*s.ucInbox(me, peer));
    const uint64_t t0 = globaltimer_ns();
    while (int32_t(inbox.load(cuda::memory_order_acquire) - target) < 0) {
      if (globaltimer_ns() - t0 > timeout_ns) {
        atomicOr(error_flag, error_bit);
        timed_out = 1;
        break;
      }
    }
  }
  s.epoch += 1;
  __syncthreads();
  return timed_out == 0;
}

// arrive (release: our earlier stores, to peers or local, become visible to whoever acquires)
// + timed wait (acquire).
__device__ __forceinline__ bool lsa_sync_timed(ncclLsaBarrierSession<ncclCoopCta>& s, uint64_t timeout_ns,
                                               int* error_flag, int error_bit) {
  s.arrive(ncclCoopCta(), cuda::memory_order_release);
  return lsa_wait_timed(s, timeout_ns, error_flag, error_bit);
}

}  // namespace mxmoe::ep
