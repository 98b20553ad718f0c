// Routing plan: a stable counting sort of the (token, slot) list by expert, in three kernels.
//   count : one warp per chunk of 2048 consecutive items counts them per expert → ws[chunk][e]
//   scan  : one CTA, one thread per expert: exclusive prefix over chunks (in place), counts,
//           then block-wide exclusive scans → offsets, padded_offsets (multiples of 128)
//   place : one warp per chunk walks its items in order, 32 at a time; lanes with the same expert
//           (match.any) take consecutive rows: row = padded[e] + ws[chunk][e] + running[e] + rank
// Items are i = t·k + j, so rows inside an expert follow (token, slot) order. Integer atomics are
// used for nothing; shared-memory counters are owned by one warp. Deterministic.
// Bytes: reads ids twice (8·T·k), writes row_of (4·T·k) and row_index (4·capacity, memset + place).
// Tests: tests/gpu/test_moe_plan_gpu.cpp against a host stable sort.
#include <cstdint>

#include "host/check.h"
#include "kernels/layer/moe_plan_launch.h"

namespace mxmoe::detail {
namespace {

constexpr int kWarpsPerCta = 4;
constexpr int kScanThreads = 1024;
static_assert(kMaxExperts <= kScanThreads, "scan: one thread per expert");

// A warp's chunk of the item list and its expert counters ([kWarpsPerCta][num_experts] int32 in
// dynamic shared memory, zeroed here; only the owning warp touches them).
struct WarpChunk {
  int64_t chunk, begin, end;
  int32_t* counters;
  __device__ WarpChunk(int32_t* smem, int64_t items, int num_experts) {
    chunk = int64_t(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32;
    begin = chunk * kPlanChunk;
    end = min(items, begin + kPlanChunk);
    counters = smem + (threadIdx.x / 32) * num_experts;
    for (int e = threadIdx.x % 32; e < num_experts; e += 32) counters[e] = 0;
    __syncwarp();
  }
};

__global__ void plan_count_kernel(const int32_t* __restrict__ ids, int64_t items, int num_experts,
                                  int64_t num_chunks, int32_t* __restrict__ chunk_counts) {
  extern __shared__ int32_t smem[];
  const WarpChunk w(smem, items, num_experts);
  if (w.chunk >= num_chunks) return;  // whole warp
  int32_t* cnt = w.counters;
  const int lane = threadIdx.x % 32;
  const int64_t begin = w.begin, end = w.end;
  for (int64_t base = begin; base < end; base += 32) {
    const int64_t i = base + lane;
    const int32_t e = i < end ? ids[i] : -1;
    const bool ok = e >= 0 && e < num_experts;
    const unsigned same = __match_any_sync(0xFFFFFFFFu, ok ? e : -1);
    if (ok && lane == __ffs(same) - 1) cnt[e] += __popc(same);  // the group's lowest lane
    __syncwarp();
  }
  for (int e = lane; e < num_experts; e += 32) chunk_counts[w.chunk * num_experts + e] = cnt[e];
}

// Exclusive prefix of v over the CTA (one value per thread), fixed order.
__device__ int32_t block_exclusive_scan(int32_t v, int32_t* s) {
  s[threadIdx.x] = v;
  __syncthreads();
  for (int d = 1; d < blockDim.x; d *= 2) {
    const int32_t add = threadIdx.x >= d ? s[threadIdx.x - d] : 0;
    __syncthreads();
    s[threadIdx.x] += add;
    __syncthreads();
  }
  const int32_t incl = s[threadIdx.x];
  __syncthreads();
  return incl - v;
}

__global__ void plan_scan_kernel(int32_t* __restrict__ chunk_counts, int64_t num_chunks, int num_experts,
                                 MoePlan plan) {
  __shared__ int32_t s[kScanThreads];
  const int e = threadIdx.x;
  int32_t total = 0;
  if (e < num_experts) {
    for (int64_t c = 0; c < num_chunks; ++c) {  // chunk counts → exclusive prefix, in place
      const int32_t v = chunk_counts[c * num_experts + e];
      chunk_counts[c * num_experts + e] = total;
      total += v;
    }
    plan.counts[e] = total;
  }
  const int32_t padded = (total + 127) / 128 * 128;
  const int32_t off = block_exclusive_scan(e < num_experts ? total : 0, s);
  const int32_t poff = block_exclusive_scan(e < num_experts ? padded : 0, s);
  if (e < num_experts) {
    plan.offsets[e] = off;
    plan.padded_offsets[e] = poff;
  }
  if (e == num_experts - 1) {
    plan.offsets[num_experts] = off + total;
    plan.padded_offsets[num_experts] = poff + padded;
  }
}

__global__ void plan_place_kernel(const int32_t* __restrict__ ids, int64_t items, int top_k, int num_experts,
                                  int64_t num_chunks, const int32_t* __restrict__ chunk_base, MoePlan plan) {
  extern __shared__ int32_t smem[];
  const WarpChunk w(smem, items, num_experts);
  if (w.chunk >= num_chunks) return;  // whole warp
  int32_t* running = w.counters;
  const int64_t chunk = w.chunk;
  const int lane = threadIdx.x % 32;
  const int64_t begin = w.begin, end = w.end;
  for (int64_t base = begin; base < end; base += 32) {
    const int64_t i = base + lane;
    const int32_t e = i < end ? ids[i] : -1;
    const bool ok = e >= 0 && e < num_experts;
    const unsigned same = __match_any_sync(0xFFFFFFFFu, ok ? e : -1);
    const int rank = __popc(same & ((1u << lane) - 1u));  // earlier lanes with the same expert
    int32_t row = -1;
    if (ok) row = plan.padded_offsets[e] + chunk_base[chunk * num_experts + e] + running[e] + rank;
    __syncwarp();  // every lane has read running[] before the group leader advances it
    if (ok && lane == __ffs(same) - 1) running[e] += __popc(same);
    __syncwarp();
    if (i < end) {
      plan.row_of[i] = row;
      if (ok) plan.row_index[row] = int32_t(i / top_k);
    }
  }
}

}  // namespace

void launch_moe_plan(const int32_t* ids, int64_t tokens, int top_k, int num_experts, int64_t capacity,
                     int32_t* chunk_counts, const MoePlan& plan, cudaStream_t stream) {
  const char* fn = "moe_plan";
  const int64_t items = tokens * top_k;
  const int64_t chunks = plan_chunks(items);
  MXMOE_CUDA_CHECK(fn, cudaMemsetAsync(plan.row_index, 0xFF, size_t(capacity) * sizeof(int32_t), stream));
  const size_t smem = size_t(kWarpsPerCta) * num_experts * sizeof(int32_t);
  const unsigned grid = unsigned((chunks + kWarpsPerCta - 1) / kWarpsPerCta);
  if (chunks > 0) {
    plan_count_kernel<<<grid, 32 * kWarpsPerCta, smem, stream>>>(ids, items, num_experts, chunks, chunk_counts);
    MXMOE_CHECK_LAUNCH(fn);
  }
  plan_scan_kernel<<<1, kScanThreads, 0, stream>>>(chunk_counts, chunks, num_experts, plan);
  MXMOE_CHECK_LAUNCH(fn);
  if (chunks > 0) {
    plan_place_kernel<<<grid, 32 * kWarpsPerCta, smem, stream>>>(ids, items, top_k, num_experts, chunks,
                                                                 chunk_counts, plan);
    MXMOE_CHECK_LAUNCH(fn);
  }
}

}  // namespace mxmoe::detail
