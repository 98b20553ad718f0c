// Warp decode, down projection with the routing-weighted sum (DESIGN.md §4, decode.h):
//   out[b, n] = Σ_{j=0..S-1} w[b, j] · (h[b, j] · W2[e_j][n]),   w[b, k] = 1 for the shared expert
//   h FP32 or BF16 [B, S, I] (16-byte aligned); W2 [E, H, I] BF16, or MXFP8 data E4M3 [E, H, I]
//   + scales E8M0 [E, H, I/32]; shared W2s [H, I]; ids int32 [B, k]; w FP32 [B, k];
//   out BF16 [B, H].
// One CTA owns kRows = 4 adjacent outputs n of one token b. Its W = min(S, 16) warps split the
// slots (warp w takes j = w, w+W, ...; down::slot_dots and down::combine in warp_decode_down.cuh,
// shared with the fused step); for each slot a warp streams the kRows rows of length I
// (I = 768 rows are short: several rows give each lane kUnroll·kRows = 8 independent 16-byte loads,
// 4 KB a warp, before any is used), each lane summing its chunks in increasing K, then the fixed
// xor butterfly. The per-slot dot products meet in shared memory and one thread per output adds
// them in slot order j = 0..S-1 (acc = fma(w_j, dot_j, acc), FP32), then rounds to BF16 once.
// No atomics; the order depends on nothing but (b, n), so the result is batch-invariant.
// Programmatic Dependent Launch (src/host/pdl_launch.h): before griddepcontrol.wait, lane 0 of each
// warp reads its slots' expert ids and asks L2 for the kRows weight rows (cp.async.bulk.prefetch.L2,
// no registers), so that weight streaming overlaps the tail of decode_gate_up. That read is a hint
// only: in the decode step the ids are final by then (the router finished before decode_gate_up
// passed its griddepcontrol.wait, which precedes its launch_dependents), and should they not be, a
// clamped id prefetches other rows of the same tensor. Everything the result depends on (ids, h,
// routing weights) is read, and out written, after the wait.
// Registers: ~60-90 a thread (-Xptxas -v, no spills). Shared: (kDecodeMaxTopK+1)·kRows·4 B.
// Roofline: 2·H·I FLOPs per (token, slot); bytes H·I·(2 | 1 + 1/32) per distinct expert.
// Tests: tests/gpu/test_decode_gpu.cpp. Bench: bench/bench_decode.py. Design-space variants (A/B
// timing, MXMOE_DECODE_DOWN_*): warp_decode_down_sweep_sm90.cuh, bench/bench_decode_split.py --settings down.
#include <cstdint>

#include "device/cp_async_bulk_prefetch.cuh"
#include "device/griddepcontrol.cuh"
#include "host/check.h"
#include "host/pdl_launch.h"
#include "kernels/decode/decode_launch.h"
#include "kernels/decode/warp_decode_down.cuh"
#include "mxmoe/decode.h"

namespace mxmoe::detail {
namespace {

using down::kRows;
using down::kMaxSlots;
constexpr int kUnroll = 2;     // chunks of each row in flight per lane
constexpr int kMaxWarps = 16;  // warps per CTA: min(S, kMaxWarps)

template <bool kMx, bool kHBf16>
__global__ void __launch_bounds__(kMaxWarps * 32, 1) warp_decode_down_kernel(const DownLaunch p) {
  __shared__ float s_dot[kMaxSlots][kRows];  // per-slot dot products of this CTA's outputs
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
  const int tiles = (p.hidden + kRows - 1) / kRows;
  int b, n0;
  down::tile_of(p, int(blockIdx.x), tiles, kRows, b, n0);

  // Before the wait: an L2 prefetch of this warp's weight rows, a hint only (see the header).
  if (lane == 0) {
    for (int j = warp; j < p.slots; j += num_warps) {
      const down::SlotRows rows = down::slot_rows<kMx>(p, b, j, n0);
      device::cp_async_bulk_prefetch_L2_global(rows.row, uint32_t(kRows * rows.row_bytes));
    }
  }
  device::griddepcontrol_wait();  // h comes from decode_gate_up (the kernel ahead of this one)
  device::griddepcontrol_launch_dependents();

  for (int j = warp; j < p.slots; j += num_warps) {
    float acc[kRows];
    down::slot_dots<kMx, kHBf16, false, kUnroll>(p, b, j, n0, lane, acc);
    if (lane == 0) {
#pragma unroll
      for (int q = 0; q < kRows; ++q) s_dot[j][q] = acc[q];
    }
  }
  __syncthreads();
  if (threadIdx.x < kRows) down::combine(p, b, n0, int(threadIdx.x), s_dot);
}

template <bool kMx, bool kHBf16>
void launch(const DownLaunch& p, cudaStream_t stream) {
  const int64_t tiles = (p.hidden + kRows - 1) / kRows;
  const int warps = p.slots < kMaxWarps ? p.slots : kMaxWarps;
  launch_with_pdl("decode_down", warp_decode_down_kernel<kMx, kHBf16>,
                  dim3(unsigned(int64_t(p.batch) * tiles)), dim3(warps * 32), 0, stream, p);
}

}  // namespace

void launch_decode_down(const DownLaunch& p, cudaStream_t stream) {
  if (!p.down_default()) {  // design-space switches (warp_decode_down_sweep_sm90.cuh)
    if (p.w2.mxfp8) {
      if (p.h_bf16) launch_decode_down_sweep<true, true>(p, stream); else launch_decode_down_sweep<true, false>(p, stream);
    } else {
      if (p.h_bf16) launch_decode_down_sweep<false, true>(p, stream); else launch_decode_down_sweep<false, false>(p, stream);
    }
    return;
  }
  if (p.w2.mxfp8) {
    if (p.h_bf16) launch<true, true>(p, stream); else launch<true, false>(p, stream);
  } else {
    if (p.h_bf16) launch<false, true>(p, stream); else launch<false, false>(p, stream);
  }
  MXMOE_CHECK_LAUNCH("decode_down");
}

}  // namespace mxmoe::detail
