// Warp decode, one step in ONE persistent kernel (include/mxmoe/decode.h, decode_step_fused):
//   router  logits[b, e] = X[b]·Wr[e] (FP32), top-k selection → topk_ids, topk_weights
//   gate/up h[b, j, i] = silu(X[b]·W1[e_j][i]) · (X[b]·W1[e_j][I + i])        (FP32 h, workspace)
//   down    out[b, n] = Σ_j w[b, j] · (h[b, j]·W2[e_j][n])                    (BF16 out)
// for B <= kFusedMaxBatch (8) tokens; inputs and outputs as decode_step's warp path: X BF16 [B, H],
// Wr BF16 [E, H], W1 / W2 BF16 or MXFP8 [E, N, K] (+ shared expert), ids int32 [B, k], weights
// FP32 [B, k], out BF16 [B, H]. Workspace (decode_step_fused_workspace_bytes): the grid barrier's
// state (src/device/grid_barrier.cuh), logits [kDecodeFusedMaxBatch, E] FP32 (a fixed size, so h's
// offset does not depend on B) and h [B, S, I] FP32.
//
// Why (docs/notes/decode.md, runs 56 and 59): at Qwen3-30B B = 1 the three-kernel step spends
// ~15 us of 35.5 on fixed costs — the router on 8 CTAs (8.1 us), two kernel hand-offs and each
// kernel's ramp-up and tail. Here every phase runs on every SM and the hand-offs are grid barriers.
//
// Grid: one CTA per SM (occupancy × SMs, queried on the host; every CTA must be co-resident),
// kThreads = 768 (BF16) or 704 (MXFP8), 80 registers, 0 spills: 24 / 22 warps a SM, against 32 / 24
// for the separate gate/up kernels (FusedConfig records what was tried).
//   0. Before griddepcontrol.wait: each CTA asks L2 for its 1/G slice of Wr (weights, never written
//      by the kernel ahead). Then wait (X may be the previous kernel's output), launch_dependents.
//   1. Router logits: warp items (expert e, pair of tokens), spread warp-major over the grid
//      (item i → CTA i mod G), router::logits_warp — the router kernel's per-lane chain and
//      butterfly, so every logit has the router kernel's bits. Lane 0 stores to the workspace.
//      Grid barrier 1.
//   2. Selection, redundantly in every CTA (cheaper than a second barrier): the B×E logits into
//      shared memory (ld.global.cg), warp b runs select_top_k for token b (router_select.cuh, the
//      router kernel's code) into shared ids / weights; CTA 0 writes the step's topk_ids /
//      topk_weights. No barrier: each CTA goes on with its own copy.
//   3. Gate/up: warp tasks (b, j, i) as decode_gate_up's (gate_up::output, ids from shared
//      memory), task t on global warp t mod (G·kWarps), CTA-major. A CTA done with its tasks asks
//      L2 for the W2 rows of its first down tiles (a per-CTA budget of half the L2 / G) — the
//      overlap the separate kernels could not have. Grid barrier 2.
//   4. Down: rounds of tpr = min(kWarps / S, 8) tiles of kRows = 4 outputs of one token per CTA;
//      a tile's S slots over kWarps / tpr warps (down::slot_dots, h through coherent loads: it was
//      written in this kernel), then down::combine in slot order — decode_down's arithmetic.
// Every reduction order is the three kernels', so ids, weights and out are bitwise those of
// decode_router + decode_gate_up (FP32 h) + decode_down (tests/gpu/test_decode_fused_gpu.cu,
// DecodeGpu.FusedStepMatchesThreeKernels); deterministic and batch-invariant like them.
// kUnroll values (loads in flight) differ from the separate kernels where the register budget
// asks; they never change the order of the arithmetic.
// Roofline: as the three kernels (decode.md: Qwen3-30B B = 1 BF16 75.5 MB + 0.5 MB router).
// Bench: bench/bench_decode_split.py --fused. Registers / spills: cuobjdump -res-usage.
#include <algorithm>
#include <cstdint>

#include "device/cp_async_bulk_prefetch.cuh"
#include "device/griddepcontrol.cuh"
#include "device/grid_barrier.cuh"
#include "host/check.h"
#include "host/kernel_attr.h"
#include "host/pdl_launch.h"
#include "kernels/common/router_select.cuh"
#include "kernels/decode/decode_launch.h"
#include "kernels/decode/warp_decode_down.cuh"
#include "kernels/decode/warp_decode_gate_up.cuh"
#include "kernels/decode/warp_decode_router.cuh"
#include "mxmoe/decode.h"

namespace mxmoe::detail {
namespace {

template <bool kMx>
struct FusedConfig {
  // One CTA a SM. ptxas (-res-usage): 80 registers both, 0 spills. Tried: BF16 1024 threads
  // (64 registers) spilled 8 bytes; MXFP8 768 threads spilled 24-48 bytes, 640 threads with a
  // gate/up unroll of 4 spilled 4 bytes.
  static constexpr int kThreads = kMx ? 704 : 768;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kRouterTokens = 2;            // tokens per router warp item (4: spills)
  static constexpr int kRouterUnroll = 4;            // Wr chunks in flight per lane
  static constexpr int kGateUpUnroll = kMx ? 3 : 4;  // chunks of each W1 row in flight per lane
  static constexpr int kDownUnroll = kMx ? 1 : 2;    // chunks of each W2 row in flight per lane
};
constexpr int kMaxTilesPerRound = 8;
constexpr int64_t kWrPrefetchChunk = 1 << 16;  // bytes per cp.async.bulk.prefetch.L2
using down::kMaxSlots;
using down::kRows;
static_assert(kFusedMaxBatch <= FusedConfig<true>::kWarps, "warp b of each CTA selects token b");
static_assert(kFusedMaxExperts == 8 * 32, "selection with at most 8 scores a lane");

// Phase 0: this CTA's 1/G slice of Wr into L2 (16-byte granules; a hint only).
__device__ __forceinline__ void prefetch_wr_slice(const FusedLaunch& p) {
  const int64_t bytes = int64_t(p.router.num_experts) * p.router.hidden * 2;  // H % 8 == 0
  const int64_t granules = bytes / 16, per = (granules + gridDim.x - 1) / gridDim.x;
  const int64_t lo = int64_t(blockIdx.x) * per * 16, hi = min(bytes, lo + per * 16);
  const uint8_t* w = reinterpret_cast<const uint8_t*>(p.router.w);
  for (int64_t a = lo; a < hi; a += kWrPrefetchChunk) {
    const int64_t n = hi - a < kWrPrefetchChunk ? hi - a : kWrPrefetchChunk;
    device::cp_async_bulk_prefetch_L2_global(w + a, uint32_t(n));
  }
}

// Phase 1: logits of warp items (e, token group), warp-major over the grid.
template <int kTokens, int kUnroll, int kWarps>
__device__ __forceinline__ void router_logits(const FusedLaunch& p, int warp, int lane) {
  const RouterLaunch& r = p.router;
  const int B = r.batch, H = r.hidden, E = r.num_experts;
  const int items = E * ((B + kTokens - 1) / kTokens);
  for (int item = warp * int(gridDim.x) + int(blockIdx.x); item < items; item += kWarps * int(gridDim.x)) {
    const int e = item % E, b0 = (item / E) * kTokens;
    const uint8_t* x[kTokens];  // tokens past B repeat the last one (result dropped)
#pragma unroll
    for (int t = 0; t < kTokens; ++t)
      x[t] = reinterpret_cast<const uint8_t*>(r.x + int64_t(min(b0 + t, B - 1)) * H);
    float acc[kTokens];
    router::logits_warp<kTokens, kUnroll>(reinterpret_cast<const uint8_t*>(r.w + int64_t(e) * H), x, H / 8, lane,
                                          acc);
    if (lane == 0) {
#pragma unroll
      for (int t = 0; t < kTokens; ++t)
        if (b0 + t < B) p.logits[int64_t(b0 + t) * E + e] = acc[t];
    }
  }
}

// The down tiles of this CTA: round r covers tiles (blockIdx.x + r·G)·tpr + [0, tpr); warp w works
// on tile w / wpt of the round, slots j = w mod wpt, + wpt, ...
struct DownTiling {
  int tiles, tiles_per_token, tpr, wpt;
  __device__ DownTiling(int batch, int hidden, int slots, int warps) {
    tiles_per_token = hidden / kRows;  // H % 8 == 0
    tiles = batch * tiles_per_token;
    const int fit = warps / slots;
    tpr = fit < 1 ? 1 : (fit > kMaxTilesPerRound ? kMaxTilesPerRound : fit);
    wpt = warps / tpr;
  }
};

// Before barrier 2: lane 0 of each warp asks L2 for the W2 rows of the (tile, slot) units it will
// compute, in compute order, until its share of the CTA's budget is spent.
template <bool kMx>
__device__ __forceinline__ void prefetch_w2(const DownLaunch& dp, const DownTiling& tl, int warp, int lane,
                                            int64_t budget) {
  const int my_tile = warp / tl.wpt;
  if (lane != 0 || my_tile >= tl.tpr || budget <= 0) return;
  int64_t spent = 0;
  for (int r0 = int(blockIdx.x) * tl.tpr; r0 < tl.tiles; r0 += int(gridDim.x) * tl.tpr) {
    const int t = r0 + my_tile;
    if (t >= tl.tiles) return;
    const int b = t / tl.tiles_per_token, n0 = (t % tl.tiles_per_token) * kRows;
    for (int j = warp % tl.wpt; j < dp.slots; j += tl.wpt) {
      const down::SlotRows rows = down::slot_rows<kMx>(dp, b, j, n0);
      const int64_t bytes = kRows * rows.row_bytes;
      if (spent + bytes > budget) return;
      device::cp_async_bulk_prefetch_L2_global(rows.row, uint32_t(bytes));
      spent += bytes;
    }
  }
}

template <bool kMx>
__global__ void __launch_bounds__(FusedConfig<kMx>::kThreads, 1) warp_decode_fused_kernel(const FusedLaunch p,
                                                                                         int64_t w2_budget) {
  using Cfg = FusedConfig<kMx>;
  constexpr int kWarps = Cfg::kWarps;
  __shared__ float s_logits[kFusedMaxBatch][kFusedMaxExperts];   // [B][E]
  __shared__ float s_scratch[kFusedMaxBatch][kFusedMaxExperts];  // group scoring
  __shared__ int32_t s_ids[kFusedMaxBatch * kDecodeMaxTopK];      // [B][k]
  __shared__ float s_w[kFusedMaxBatch * kDecodeMaxTopK];          // [B][k]
  __shared__ float s_dot[kMaxTilesPerRound][kMaxSlots][kRows];    // per-slot dot products
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int B = p.router.batch, E = p.router.num_experts, k = p.router.top_k;
  auto* barrier = static_cast<device::GridBarrierState*>(p.barrier);

  // 0. Wr into L2, then wait for the kernel ahead (X may be its output; the workspace its input).
  if (p.wr_prefetch && threadIdx.x == 0) prefetch_wr_slice(p);
  device::griddepcontrol_wait();
  device::griddepcontrol_launch_dependents();
  uint64_t magic = device::kGridBarrierMagic;  // loaded now, checked at barrier 1 (latency hidden)
  if (threadIdx.x == 0) magic = device::ld_relaxed_gpu_u64(&barrier->magic);

  // 1. Router logits → workspace; barrier 1.
  router_logits<Cfg::kRouterTokens, Cfg::kRouterUnroll, kWarps>(p, warp, lane);
  if (magic != device::kGridBarrierMagic) __trap();  // workspace not initialised (decode.h)
  device::grid_barrier_sync(barrier);

  // 2. Selection of all B tokens in this CTA.
  for (int i = threadIdx.x; i < B * E; i += Cfg::kThreads) s_logits[i / E][i % E] = __ldcg(p.logits + i);
  __syncthreads();
  if (warp < B) {
    RouterLaunch r = p.router;
    r.ids = s_ids;
    r.weights = s_w;
    if (E <= 128) {  // 4 or 8 scores a lane (E <= kFusedMaxExperts): same bits, fewer registers
      select_top_k<4>(r, s_logits[warp], s_scratch[warp], warp, lane);
    } else {
      select_top_k<8>(r, s_logits[warp], s_scratch[warp], warp, lane);
    }
  }
  __syncthreads();
  if (blockIdx.x == 0) {
    for (int i = threadIdx.x; i < B * k; i += Cfg::kThreads) {
      p.router.ids[i] = s_ids[i];
      p.router.weights[i] = s_w[i];
    }
  }

  // 3. Gate/up, then the W2 prefetch; barrier 2.
  GateUpLaunch gp;
  gp.x = p.router.x;
  gp.w1 = p.w1;
  gp.ids = s_ids;
  gp.h = p.h;
  gp.batch = B;
  gp.hidden = p.router.hidden;
  gp.inter = p.inter;
  gp.num_experts = E;
  gp.top_k = k;
  gp.slots = p.slots;
  const int64_t total = int64_t(B) * p.slots * p.inter;
  for (int64_t task = int64_t(blockIdx.x) * kWarps + warp; task < total; task += int64_t(gridDim.x) * kWarps)
    gate_up::output<kMx, false, Cfg::kGateUpUnroll>(gp, task, lane);

  DownLaunch dp;
  dp.h = p.h;
  dp.w2 = p.w2;
  dp.ids = s_ids;
  dp.weights = s_w;
  dp.out = p.out;
  dp.batch = B;
  dp.hidden = p.router.hidden;
  dp.inter = p.inter;
  dp.num_experts = E;
  dp.top_k = k;
  dp.slots = p.slots;
  const DownTiling tl(B, dp.hidden, dp.slots, kWarps);
  prefetch_w2<kMx>(dp, tl, warp, lane, w2_budget / (tl.tpr * tl.wpt));
  device::grid_barrier_sync(barrier);

  // 4. Down, in rounds of tl.tpr tiles (the loop is uniform over the CTA).
  const int my_tile = warp / tl.wpt;
  for (int r0 = int(blockIdx.x) * tl.tpr; r0 < tl.tiles; r0 += int(gridDim.x) * tl.tpr) {
    const int t = r0 + my_tile;
    if (my_tile < tl.tpr && t < tl.tiles) {
      const int b = t / tl.tiles_per_token, n0 = (t % tl.tiles_per_token) * kRows;
      for (int j = warp % tl.wpt; j < dp.slots; j += tl.wpt) {
        float acc[kRows];
        down::slot_dots<kMx, false, true, Cfg::kDownUnroll>(dp, b, j, n0, lane, acc);
        if (lane == 0) {
#pragma unroll
          for (int q = 0; q < kRows; ++q) s_dot[my_tile][j][q] = acc[q];
        }
      }
    }
    __syncthreads();
    if (int(threadIdx.x) < tl.tpr * kRows) {
      const int tt = threadIdx.x / kRows, t2 = r0 + tt;
      if (t2 < tl.tiles)
        down::combine(dp, t2 / tl.tiles_per_token, (t2 % tl.tiles_per_token) * kRows, threadIdx.x % kRows, s_dot[tt]);
    }
    __syncthreads();
  }
}

__global__ void warp_decode_fused_init_kernel(void* barrier) {
  device::grid_barrier_init(static_cast<device::GridBarrierState*>(barrier));
}

struct L2BytesTag {};

template <bool kMx>
void launch(const FusedLaunch& p, cudaStream_t stream) {
  const char* fn = "decode_step_fused";
  constexpr auto kernel = warp_decode_fused_kernel<kMx>;
  constexpr int kThreads = FusedConfig<kMx>::kThreads;
  // Every CTA must be co-resident (grid barriers): the grid is exactly what the device holds.
  const int grid = once_per_device<kernel, MaxResidentTag>(fn, [&](int dev) {
    int sms = 0, per_sm = 0;
    MXMOE_CUDA_CHECK(fn, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    MXMOE_CUDA_CHECK(fn, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
    if (per_sm < 1)
      throw_arg(fn, "(kernel)", "warp_decode_fused_kernel",
                "cannot hold one CTA of " + to_str(kThreads) + " threads on a SM (registers / shared memory)");
    return sms * per_sm;
  });
  const int l2 = once_per_device<kernel, L2BytesTag>(fn, [&](int dev) {
    int bytes = 0;
    MXMOE_CUDA_CHECK(fn, cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, dev));
    return std::max(bytes, 1);
  });
  const int64_t w2_budget = p.w2_prefetch ? int64_t(l2) / 2 / grid : 0;  // half the L2 over the grid
  launch_with_pdl_attrs(fn, p.cooperative != 0, 0u, kernel, dim3(unsigned(grid)), dim3(kThreads), 0, stream, p,
                        w2_budget);
}

}  // namespace

void launch_decode_fused(const FusedLaunch& p, cudaStream_t stream) {
  if (p.w1.mxfp8) launch<true>(p, stream); else launch<false>(p, stream);
  MXMOE_CHECK_LAUNCH("decode_step_fused");
}

void launch_decode_fused_init(void* barrier, cudaStream_t stream) {
  warp_decode_fused_init_kernel<<<1, 1, 0, stream>>>(barrier);
  MXMOE_CHECK_LAUNCH("decode_step_fused_init_workspace");
}

}  // namespace mxmoe::detail
