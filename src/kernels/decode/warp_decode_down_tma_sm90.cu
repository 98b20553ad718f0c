// Warp decode, down projection with MXFP8 weights streamed by bulk copies (MXMOE_DECODE_DOWN_TMA=1;
// docs/notes/decode.md "Session 15"). Same formula, inputs, outputs and bits as the library's MXFP8
// default (warp_decode_down_sweep_sm90.cuh with 8 rows x 1, PERSIST 2):
//   out[b, n] = Σ_{j=0..S-1} w[b, j] · (h[b, j] · W2[e_j][n]),  h FP32 or BF16 [B, S, I],
//   W2 MXFP8 [E, H, I] (E4M3) + E8M0 scales [E, H, I/32], shared W2s [H, I], out BF16 [B, H].
// Why: the register-fed kernels keep at most 8-16 16-byte loads a lane in flight (~72 KB a SM), and
// every register-side knob measured flat (decode.md, runs 75-90: MXFP8 down alone at 45-78% of copy).
// Here one producer lane streams each (tile, slot) item — the 8 rows n0..n0+7 of expert e_j, one
// contiguous block of 8·I bytes, and their 8·I/32 scale bytes, also contiguous — into a ring of
// shared-memory stages with cp.async.bulk (up to ~190 KB a SM in flight, no registers).
// Persistent, one CTA a SM (grid = min(tiles, SMs)), tiles b-major (tile = b·H/8 + n0/8) walked
// blockIdx.x, + gridDim.x, ...; item i of a CTA = (its tile i / S, slot i % S), stage i % stages.
// Warps: C = min(S, 16) consumers (warp w takes slots j = w, w+C, ... of every tile) and one producer
// (the last warp; lane 0 issues the copies). Barriers: full[s] (1 arrival + the bytes), empty[s]
// (1 arrival: the consumer's lane 0 after __syncwarp). Per tile the consumers meet at named barrier 1;
// threads 0..7 then combine (down::combine, slot order), two s_dot buffers alternating by tile (a
// buffer is rewritten two tiles later, after the next tile's barrier). Each consumer lane sums its
// chunks c = lane, lane+32, ... in increasing K exactly as down::dot_rows_mx (kUnroll 1, 8 rows) does,
// from shared memory instead of global, then the same xor butterfly: the default's bits.
// PDL: the producer reads the expert ids and starts the ring before griddepcontrol.wait (the ids are
// final then: see warp_decode_down_sm90.cu); the consumers wait before reading h.
// Eligible (launch_decode_down_tma returns false otherwise, and the caller runs the default): MXFP8
// weights, I % 64 == 0 (so every block and scale block is 16-byte aligned and a multiple of 16 bytes),
// 16-byte aligned data and scale pointers.
// Tests: DecodeGpu.DownSwitchesGiveDefaultBits ("tma"). Bench: bench_decode_split.py --settings.
#include <cstdint>

#include "device/cp_async_bulk.cuh"
#include "device/griddepcontrol.cuh"
#include "device/mbarrier.cuh"
#include "device/named_barrier.cuh"
#include "host/check.h"
#include "host/pdl_launch.h"
#include "kernels/decode/decode_launch.h"
#include "kernels/decode/warp_decode_down.cuh"

namespace mxmoe::detail {
namespace {

constexpr int kR = 8;              // rows (outputs) of a tile
constexpr int kMaxConsumers = 16;  // consumer warps: min(S, 16)
constexpr int kMaxStages = 16;
constexpr uint32_t kSmemBudget = 190 * 1024;  // dynamic shared memory for the stages
constexpr uint64_t kWaitTrapNs = 2000000000ull;  // a barrier wait longer than 2 s traps (a protocol bug, not a hang)

struct TmaGeom {
  uint32_t w_bytes, stage_bytes;  // a stage: [8·I E4M3 | 8·I/32 scale bytes], 128-byte aligned
  int stages;
};

TmaGeom tma_geom(int inter) {
  TmaGeom g;
  g.w_bytes = uint32_t(kR) * uint32_t(inter);
  const uint32_t sc = uint32_t(kR) * uint32_t(inter / kMxBlock);
  g.stage_bytes = (g.w_bytes + sc + 127u) & ~127u;
  const uint32_t n = kSmemBudget / g.stage_bytes;
  g.stages = int(n < uint32_t(kMaxStages) ? n : uint32_t(kMaxStages));
  return g;
}

// One item's 8 dot products from a stage: per lane its chunks c = lane, lane+32, ... (16 E4M3 of each
// row), chunk sums from 0 and exact scaling, as down::dot_rows_mx with kUnroll = 1 and kR = 8.
template <bool kHBf16>
__device__ __forceinline__ void stage_dots(const uint8_t* stage, uint32_t w_bytes, const void* h_row, int inter,
                                           int lane, float (&acc)[kR]) {
  const int nchunks = inter / 16, scale_row = inter / kMxBlock;
  const uint8_t* sc = stage + w_bytes;
#pragma unroll
  for (int q = 0; q < kR; ++q) acc[q] = 0.0f;
  for (int c = lane; c < nchunks; c += 32) {
    uint4 w[kR];
    uint32_t s[kR];
#pragma unroll
    for (int q = 0; q < kR; ++q) {
      w[q] = *reinterpret_cast<const uint4*>(stage + q * inter + c * 16);
      s[q] = sc[q * scale_row + c / 2];
    }
    float4 h[4];
    down::load_h8<kHBf16, false>(h_row, 2 * c, h[0], h[1]);
    down::load_h8<kHBf16, false>(h_row, 2 * c + 1, h[2], h[3]);
#pragma unroll
    for (int q = 0; q < kR; ++q) acc[q] = fmaf(dev::dot16_e4m3_f32(w[q], h), dev::e8m0_to_f32(s[q]), acc[q]);
  }
#pragma unroll
  for (int q = 0; q < kR; ++q) acc[q] = dev::warp_sum(acc[q]);
}

template <bool kHBf16>
__global__ void __launch_bounds__((kMaxConsumers + 1) * 32, 1)
    warp_decode_down_tma_kernel(const DownLaunch p, const TmaGeom g) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ float s_dot[2][down::kMaxSlots][kR];
  __shared__ uint64_t full[kMaxStages], empty[kMaxStages];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int consumers = int(blockDim.x >> 5) - 1;
  const int S = p.slots, tiles_b = p.hidden / kR, total = p.batch * tiles_b;
  const int my_tiles = int(blockIdx.x) < total ? (total - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x) : 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < g.stages; ++s) {
      device::mbarrier_init(&full[s], 1);
      device::mbarrier_init(&empty[s], 1);
    }
    device::fence_mbarrier_init_release_cluster();
  }
  __syncthreads();

  if (warp == consumers) {  // producer
    if (lane != 0) return;
    const int items = my_tiles * S;
    for (int i = 0; i < items; ++i) {
      const int s = i % g.stages;
      const uint32_t use = uint32_t(i / g.stages);
      device::mbarrier_wait_parity_or_trap(&empty[s], (use & 1u) ^ 1u, kWaitTrapNs);
      const int tile = int(blockIdx.x) + (i / S) * int(gridDim.x), j = i % S;
      const down::SlotRows r = down::slot_rows<true>(p, tile / tiles_b, j, (tile % tiles_b) * kR);
      const uint32_t sc_bytes = uint32_t(kR) * uint32_t(r.scale_row);
      uint8_t* st = smem + size_t(s) * g.stage_bytes;
      device::mbarrier_arrive_expect_tx(&full[s], g.w_bytes + sc_bytes);
      device::cp_async_bulk_global_to_shared(st, r.row, g.w_bytes, &full[s]);
      device::cp_async_bulk_global_to_shared(st + g.w_bytes, r.scales, sc_bytes, &full[s]);
    }
    return;
  }

  device::griddepcontrol_wait();  // h comes from decode_gate_up (the kernel ahead of this one)
  device::griddepcontrol_launch_dependents();
  for (int k = 0; k < my_tiles; ++k) {
    const int tile = int(blockIdx.x) + k * int(gridDim.x);
    const int b = tile / tiles_b, n0 = (tile % tiles_b) * kR, buf = k & 1;
    for (int j = warp; j < S; j += consumers) {
      const int i = k * S + j, s = i % g.stages;
      device::mbarrier_wait_parity_or_trap(&full[s], uint32_t(i / g.stages) & 1u, kWaitTrapNs);
      const size_t h_elem = kHBf16 ? 2 : 4;
      const void* h_row = static_cast<const uint8_t*>(p.h) + ((int64_t(b) * S + j) * p.inter) * int64_t(h_elem);
      float acc[kR];
      stage_dots<kHBf16>(smem + size_t(s) * g.stage_bytes, g.w_bytes, h_row, p.inter, lane, acc);
      __syncwarp();  // every lane's reads of the stage are done
      if (lane == 0) {
        device::mbarrier_arrive(&empty[s]);
#pragma unroll
        for (int q = 0; q < kR; ++q) s_dot[buf][j][q] = acc[q];
      }
    }
    device::named_barrier_sync(1, uint32_t(consumers) * 32u);
    if (int(threadIdx.x) < kR) down::combine<kR>(p, b, n0, int(threadIdx.x), s_dot[buf]);
  }
}

template <bool kHBf16>
void launch(const DownLaunch& p, const TmaGeom& g, cudaStream_t stream) {
  auto* kernel = warp_decode_down_tma_kernel<kHBf16>;
  static const bool sized = [&] {
    MXMOE_CUDA_CHECK("decode_down_tma",
                     cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBudget)));
    return true;
  }();
  (void)sized;
  int device = 0, sms = 0;
  MXMOE_CUDA_CHECK("decode_down_tma", cudaGetDevice(&device));
  MXMOE_CUDA_CHECK("decode_down_tma", cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t total = int64_t(p.batch) * (p.hidden / kR);
  const int grid = int(total < sms ? total : sms);
  const int consumers = p.slots < kMaxConsumers ? p.slots : kMaxConsumers;
  launch_with_pdl("decode_down_tma", kernel, dim3(unsigned(grid)), dim3(unsigned(consumers + 1) * 32u),
                  size_t(g.stages) * g.stage_bytes, stream, p, g);
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

}  // namespace

bool launch_decode_down_tma(const DownLaunch& p, cudaStream_t stream) {
  if (!p.w2.mxfp8 || p.inter % 64 != 0 || p.hidden % kR != 0) return false;
  if (!aligned16(p.w2.data) || !aligned16(p.w2.scales)) return false;
  if (p.w2.shared_data != nullptr && (!aligned16(p.w2.shared_data) || !aligned16(p.w2.shared_scales))) return false;
  const TmaGeom g = tma_geom(p.inter);
  if (g.stages < 2) return false;
  if (p.h_bf16) launch<true>(p, g, stream); else launch<false>(p, g, stream);
  MXMOE_CHECK_LAUNCH("decode_down_tma");
  return true;
}

}  // namespace mxmoe::detail
