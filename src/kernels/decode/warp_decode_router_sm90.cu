// Warp decode, fused router (DESIGN.md §4, decode.h): logits = X·Wrᵀ in FP32, then top-k.
//   X BF16 [B, H], Wr BF16 [E, H] (16-byte aligned, H % 8 == 0), bias FP32 [E] (optional),
//   topk_ids int32 [B, k], topk_weights FP32 [B, k]. Scoring rules: decode.h.
// A cluster of 8 or 16 CTAs (512 threads each; the size is given at launch: router_cluster_size) owns
// kTokens consecutive tokens: 4, or for B < 4 the batch rounded up to 1, 2 or 4 (kTokens is a template
// parameter: at B = 1 a cluster of 4 computed every logit four times, run 74). Each CTA first copies
// the kTokens X rows into shared memory (router_x_smem; run 109: read from global, each warp's X loads
// ran one after another behind the products). The cluster's warps split the experts (warp g takes
// e = g, g + warps, ...); a warp streams Wr[e] with kUnroll = 8 or 16 (router_unroll) independent
// 16-byte loads a lane in flight and uses each chunk for the cluster's tokens, FP32 accumulation per
// token, xor-butterfly warp sum (router::logits_warp, warp_decode_router.cuh; the fused step uses it
// with X from global memory). Lane 0 writes the logits into CTA rank 0's shared memory (DSMEM);
// after the cluster barrier (release/acquire), warp t of rank 0 selects token t's top-k:
// 4, 8 or 16 scores a lane (the fewest with 32·slots >= E: a router kernel per count), k rounds of a
// warp arg-max (redux.sync, router_select.cuh) with the total order
// (score desc, id asc), group scores (top-2 sums) by one lane per group. Ties → lower id.
// A token's arithmetic is the same whatever its position in the cluster, kTokens or B:
// batch-invariant (logits_warp's order does not depend on kTokens).
// Roofline: 2·B·E·H FLOPs; bytes E·H·2 (Wr, read by every cluster: L2 after the first).
// Programmatic Dependent Launch (src/host/pdl_launch.h): griddepcontrol.wait before X is read or
// anything is written (X may come from the kernel ahead of this one, which may still read the ids
// and weights), then launch_dependents, so that decode_gate_up's CTAs launch and wait while the
// router runs.
// Neither the cluster size, nor where X is read, nor the loads in flight changes a bit
// (logits_warp's fixed order; every expert's logit is one warp's): DecodeGpu.RouterSwitchesGiveDefaultBits.
// Registers (cuobjdump -res-usage): 60-104; four kernels keep 16-32 bytes of stack around the
// division's slow-path call in the selection (not in the streaming loop). Shared: 2·kTokens·512·4 B
// static (rank 0 uses it) + kTokens·H·2 B dynamic for the X copy.
// Tests: tests/gpu/test_decode_gpu.cpp. Bench: bench/bench_decode.py.
#include <climits>
#include <cmath>
#include <cstdint>

#include <cooperative_groups.h>

#include "device/barrier_cluster.cuh"
#include "device/griddepcontrol.cuh"
#include "host/check.h"
#include "host/kernel_attr.h"
#include "host/pdl_launch.h"
#include "kernels/decode/decode_launch.h"
#include "kernels/common/router_select.cuh"
#include "kernels/decode/warp_decode_common.cuh"
#include "kernels/decode/warp_decode_router.cuh"
#include "mxmoe/decode.h"

namespace cg = cooperative_groups;

namespace mxmoe::detail {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr size_t kRouterMaxXSmem = 160 * 1024;  // the largest X copy in shared memory (router_x_smem)
constexpr int kMaxTokens = 4;  // tokens per cluster (fewer when B is smaller: tokens_per_cluster)
static_assert(kMaxTokens <= kWarps, "one warp of rank 0 per token selects its top-k");

// Tokens per cluster for a batch of B: B rounded up to 1, 2 or 4, at most 4.
int tokens_per_cluster(int batch) { return batch >= 3 ? kMaxTokens : batch; }

// kSlots: scores a lane in the top-k (select_top_k: 32·kSlots >= E; the same bits for any such kSlots,
// the fewest scan the fastest). A kernel per (kTokens, kSlots): inlining the three selections into one
// kernel made ptxas spill around the division's call.
// kXShared: the kTokens X rows are first copied into shared memory (dynamic, kTokens·H·2 bytes) and
// every warp reads them there (router_x_smem). kUnroll: 16-byte chunks of Wr in flight per lane
// (router_unroll).
// kForm: the selection's form (RouterSelectForm, a kernel per form). kSelectGroupWarps: the groups' scores
// by rank 0's warps, one (token, group) a warp, before the selecting warps.
template <int kTokens, int kSlots, bool kXShared, int kUnroll, int kForm>
__global__ void __launch_bounds__(kThreads) warp_decode_router_kernel(const RouterLaunch p) {
  constexpr bool kSerial = kForm == kSelectSerial, kGroupWarps = kForm == kSelectGroupWarps;
  __shared__ float s_logits[kTokens][kDecodeMaxExperts];   // filled in rank 0 through DSMEM
  __shared__ float s_scratch[kTokens][kDecodeMaxExperts];  // group scoring (rank 0)
  __shared__ float s_src[kSerial ? 1 : kTokens][kDecodeMaxExperts];  // parallel form: weight sources (rank 0)
  __shared__ float s_gscore[kGroupWarps ? kTokens : 1][kDecodeMaxGroups];  // group warps: groups' scores
  extern __shared__ uint4 s_x[];                           // kXShared: [kTokens][H / 8]
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank()), csize = int(cluster.num_blocks());
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int b0 = int(blockIdx.x / unsigned(csize)) * kTokens;
  const int H = p.hidden, E = p.num_experts, nchunks = H / 8;

  const uint8_t* x[kTokens];  // tokens past B repeat the last one (same code, result dropped)
#pragma unroll
  for (int t = 0; t < kTokens; ++t)
    x[t] = reinterpret_cast<const uint8_t*>(p.x + int64_t(min(b0 + t, p.batch - 1)) * H);
  float* logits0 = cluster.map_shared_rank(&s_logits[0][0], 0);
  device::griddepcontrol_wait();  // X may be the output of the kernel ahead of this one
  device::griddepcontrol_launch_dependents();
  if constexpr (kXShared) {
    for (int i = threadIdx.x; i < kTokens * nchunks; i += kThreads) {
      const int t = i / nchunks, c = i - t * nchunks;  // (x[t] with a run-time t would go to local memory)
      const uint16_t* row = p.x + int64_t(min(b0 + t, p.batch - 1)) * H;
      s_x[i] = dev::ldg_v4(row + int64_t(c) * 8);
    }
#pragma unroll
    for (int t = 0; t < kTokens; ++t) x[t] = reinterpret_cast<const uint8_t*>(s_x + t * nchunks);
  }
  if constexpr (kSerial) {
    cluster.sync();  // every CTA of the cluster runs: DSMEM stores into rank 0 are legal (and s_x is filled)
  } else {
    // The same, without the release's GPU-scope MEMBAR: the CTA barrier orders s_x within the CTA; the
    // cluster barrier only has to say that every CTA runs (nothing crosses CTAs before it).
    __syncthreads();
    device::barrier_cluster_arrive_relaxed();
    device::barrier_cluster_wait_acquire();
  }

  // Parallel form: the warp that makes expert e's logit also scores it (score_expert: sigmoid + bias, or
  // the logit) and sends rank 0 the selection score and the weight source; its bias load is issued before
  // the stream. The serial form sends the logit and rank 0's selecting warp scores all E.
  float* src0 = kSerial ? nullptr : cluster.map_shared_rank(&s_src[0][0], 0);
  for (int e = rank * kWarps + warp; e < E; e += csize * kWarps) {
    const uint8_t* w = reinterpret_cast<const uint8_t*>(p.w + int64_t(e) * H);
    const float bias = !kSerial && lane == 0 && p.bias != nullptr ? __ldg(p.bias + e) : 0.0f;
    float acc[kTokens];
    router::logits_warp<kTokens, kUnroll, kXShared>(w, x, nchunks, lane, acc);
    if (lane == 0) {
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        if constexpr (kSerial) {
          logits0[t * kDecodeMaxExperts + e] = acc[t];
        } else {
          float sel, src;
          score_expert(p, acc[t], bias, sel, src);
          logits0[t * kDecodeMaxExperts + e] = sel;
          src0[t * kDecodeMaxExperts + e] = src;
        }
      }
    }
  }
  cluster.sync();  // release/acquire: rank 0 sees every logit (score)
  if (rank != 0) return;
  if constexpr (kGroupWarps) {
    if (p.sigmoid && p.n_groups > 1) {
      const int G = E / p.n_groups;
      for (int item = warp; item < kTokens * p.n_groups; item += kWarps) {
        const int t = item / p.n_groups, g = item - t * p.n_groups;
        const float gs = group_score_warp(&s_logits[t][g * G], G, lane);
        if (lane == 0) s_gscore[t][g] = gs;
      }
    }
    __syncthreads();  // every thread of rank 0 is here (the other ranks have returned)
  }
  if (warp < kTokens && b0 + warp < p.batch) {
    if constexpr (kSerial) {
      select_top_k<kSlots, kForm>(p, s_logits[warp], s_scratch[warp], b0 + warp, lane);
    } else {
      select_top_k<kSlots, kForm, true>(p, s_logits[warp], s_scratch[warp], b0 + warp, lane, s_src[warp],
                                        kGroupWarps ? s_gscore[warp] : nullptr);
    }
  }
}

// CTAs a cluster (run 107, decode.md): 16 halves each SM's share of Wr and took DeepSeek-V3's router
// (3.7 MB of Wr) from 19.9 to 16.2 us at B = 1 (its step 1.02x BF16, 1.03x MXFP8), and changed nothing
// measurable with 0.5-1 MB (the Qwen3 shapes). So 16 where Wr >= 2 MiB or E > 128 (run 124, below) and
// B <= 8 (the batches measured; at most 2 clusters), if the device can place a 16-CTA cluster of this
// kernel (a non-portable size: GPCs with fewer free SMs cannot); else 8. p.cluster (MXMOE_ROUTER_CLUSTER)
// forces either.
struct RouterSetupTag {};
struct ClusterPlaceTag {};

// Once per (kernel, device): the largest X copy allowed (kRouterMaxXSmem) and non-portable cluster
// sizes (harmless for the kernels that use neither). A device that refuses the second places no
// 16-CTA cluster: cluster16_placeable says so, and a forced 16 fails at the launch.
template <auto kernel>
void router_setup_once() {
  once_per_device<kernel, RouterSetupTag>("decode_router", [](int) {
    MXMOE_CUDA_CHECK("decode_router",
                     cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kRouterMaxXSmem)));
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)
      (void)cudaGetLastError();
    return 1;
  });
}

// Whether a 16-CTA cluster of `kernel` (512 threads, kRouterMaxXSmem of dynamic shared memory: the
// most any launch asks for) can be placed on this device; asked once per (kernel, device), after
// router_setup_once.
template <auto kernel>
bool cluster16_placeable() {
  return once_per_device<kernel, ClusterPlaceTag>("decode_router", [](int) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(16);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = kRouterMaxXSmem;
    cudaLaunchAttribute attr = cluster_dim_attr(16);
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    const bool ok = cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) == cudaSuccess && clusters >= 1;
    (void)cudaGetLastError();  // a refusal only means "8"
    return ok ? 1 : 2;
  }) == 1;
}

// Run 124 (router alone at H = 256, B = 1, where Wr is small): with more than 128 experts an 8-CTA
// cluster gives a warp two or more experts in a row, each behind its own memory round trip; 16 CTAs
// took E = 256 from 6.3 to 5.3 us, E = 512 from 9.4 to 7.2, E = 256 with sigmoid groups from 9.3 to 8.3
// (E = 128: 4.7 either way). So 16 also where E > 128.
template <auto kernel>
int router_cluster_size(const RouterLaunch& p) {
  if (p.cluster != 0) return p.cluster;
  const bool big_wr = int64_t(p.num_experts) * p.hidden * 2 >= (int64_t(2) << 20);
  if ((!big_wr && p.num_experts <= 128) || p.batch > 8) return 8;
  return cluster16_placeable<kernel>() ? 16 : 8;
}

// X in shared memory (run 108's ncu: each warp's loop stalled on its X loads, one after another
// behind the products; decode.md "Run 109"): when the copies fit next to the static 16 KB
// (kTokens·H·2 bytes <= kRouterMaxXSmem), unless MXMOE_ROUTER_XSMEM=0 (p.x_global).
template <int kTokens>
size_t router_x_smem(const RouterLaunch& p) {
  const size_t bytes = size_t(kTokens) * size_t(p.hidden) * 2;
  return p.x_global || bytes > kRouterMaxXSmem ? 0 : bytes;
}

template <int kTokens, int kSlots, bool kXShared, int kUnroll, int kForm>
void launch_router_form(const RouterLaunch& p, int clusters, size_t smem, cudaStream_t stream) {
  constexpr auto kernel = warp_decode_router_kernel<kTokens, kSlots, kXShared, kUnroll, kForm>;
  const char* fn = "decode_router";
  router_setup_once<kernel>();
  const int cs = router_cluster_size<kernel>(p);
  launch_with_pdl_cluster(fn, kernel, dim3(unsigned(clusters * cs)), dim3(kThreads), smem, stream, unsigned(cs), p);
}

// The selection's form is a template parameter (a kernel holds one form's code: router_select.cuh).
template <int kTokens, int kSlots, bool kXShared, int kUnroll>
void launch_router_kernel(const RouterLaunch& p, int clusters, size_t smem, cudaStream_t stream) {
  switch (p.select_form) {
    case kSelectSerial: return launch_router_form<kTokens, kSlots, kXShared, kUnroll, kSelectSerial>(p, clusters, smem, stream);
    case kSelectGroupWarps: return launch_router_form<kTokens, kSlots, kXShared, kUnroll, kSelectGroupWarps>(p, clusters, smem, stream);
    default: return launch_router_form<kTokens, kSlots, kXShared, kUnroll, kSelectParallel>(p, clusters, smem, stream);
  }
}

// Chunks of Wr in flight per lane: 8, or 16 for 1 or 2 tokens a cluster with X in shared memory (with
// X read from global memory, each warp's X loads ran one after another behind the products and 16
// gained nothing, run 107; decode.md "Run 110"). p.unroll (MXMOE_ROUTER_UNROLL) forces 8 or 16 there.
template <int kTokens>
int router_unroll(const RouterLaunch& p) {
  return p.unroll != 0 ? p.unroll : kTokens <= 2 ? 16 : 8;
}

template <int kTokens, int kSlots>
void launch_router_x(const RouterLaunch& p, int clusters, cudaStream_t stream) {
  const size_t smem = router_x_smem<kTokens>(p);
  if (smem == 0) {
    launch_router_kernel<kTokens, kSlots, false, 8>(p, clusters, 0, stream);
  } else if constexpr (kTokens <= 2) {
    if (router_unroll<kTokens>(p) == 16) launch_router_kernel<kTokens, kSlots, true, 16>(p, clusters, smem, stream);
    else launch_router_kernel<kTokens, kSlots, true, 8>(p, clusters, smem, stream);
  } else {
    launch_router_kernel<kTokens, kSlots, true, 8>(p, clusters, smem, stream);
  }
}

template <int kTokens>
void launch_router_tokens(const RouterLaunch& p, int clusters, cudaStream_t stream) {
  const int slots = top_k_slots(p);
  if (slots == 4) launch_router_x<kTokens, 4>(p, clusters, stream);
  else if (slots == 8) launch_router_x<kTokens, 8>(p, clusters, stream);
  else launch_router_x<kTokens, kPerLane>(p, clusters, stream);
}

}  // namespace

void launch_decode_router(const RouterLaunch& p, cudaStream_t stream) {
  const int tokens = tokens_per_cluster(p.batch);
  const int clusters = int((int64_t(p.batch) + tokens - 1) / tokens);
  if (tokens == 1) launch_router_tokens<1>(p, clusters, stream);
  else if (tokens == 2) launch_router_tokens<2>(p, clusters, stream);
  else launch_router_tokens<kMaxTokens>(p, clusters, stream);
  MXMOE_CHECK_LAUNCH("decode_router");
}

}  // namespace mxmoe::detail
