// Warp decode, gate/up projection with SwiGLU (DESIGN.md §4, include/mxmoe/decode.h):
//   h[b, j, i] = silu(g) · u,  g = X[b]·W1[e_j][i],  u = X[b]·W1[e_j][I + i],  silu(g) = g/(1+e^-g)
//   X BF16 [B, H] (16-byte aligned); W1 [E, 2I, H] BF16, or MXFP8 data E4M3 [E, 2I, H] + scales
//   E8M0 [E, 2I, H/32]; shared expert W1s [2I, H] as slot j = k; ids int32 [B, k];
//   h FP32 or BF16 [B, S, I].
// One warp owns one output h[b, j, i] (gate_up::output, warp_decode_gate_up.cuh; the fused step
// uses it too): it streams the gate row and the up row (K-contiguous)
// with 16-byte loads, lane l taking the 16-byte chunks l, l+32, ... (each warp load reads 512
// contiguous bytes), kUnroll chunks of both rows in flight per lane before any is used
// (2·kUnroll·16 B = 128 B a lane, 4 KB a warp), FP32 accumulation, xor-butterfly warp sum, SwiGLU
// in registers, one store. MXFP8 chunks are 16 E4M3 inside one 32-block: one scale byte each.
// Warps are numbered with i fastest, so a CTA's 8 warps read 8 adjacent rows of one expert.
// At B = 1 (Qwen3-30B: k = 8, I = 768) that is 6144 warps = 768 CTAs: every SM holds ~6 CTAs.
// Programmatic Dependent Launch (src/host/pdl_launch.h): griddepcontrol.wait before x and the ids
// are read (they come from the kernels ahead of this one) and before h is written, then the
// dependents (decode_down) may launch. Exception (kSharedFirst, the default with a shared expert since
// run 137): the CTAs that hold only the shared expert's tasks, numbered first, skip the wait and stream
// while the router runs (decode.h states the condition on x).
// Persistent variant (MXMOE_DECODE_GATE_UP_PERSIST = N, src/host/decode.cpp): N·SMs CTAs whose warps
// walk the tasks (warp w of CTA c: tasks c·8 + w, + gridDim·8, ...); the same per-task code, so the
// same bits.
// Registers (cuobjdump -res-usage): BF16 61 (x from global memory) / 66 (x staged, the default); MXFP8 80
// with the default launch bound (3 CTAs a SM; run 56: 1.02-1.08x a step) or 96 / 94 at 2 CTAs a SM (host
// switch MXMOE_DECODE_MX_GATE_UP_CTAS=2); no spills.
// Roofline: 2·2·I·H FLOPs per (token, slot); bytes 2·I·H·(2 | 1 + 1/32) per distinct expert.
// Tests: tests/gpu/test_decode_gpu.cpp. Bench: bench/bench_decode.py.
#include <cstdint>

#include "device/griddepcontrol.cuh"
#include "host/check.h"
#include "host/pdl_launch.h"
#include "kernels/decode/decode_launch.h"
#include "kernels/decode/warp_decode_gate_up.cuh"

namespace mxmoe::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;  // chunks of each row in flight per lane
static_assert(kThreads % 32 == 0, "whole warps");
static_assert(8 % kWarps == 0, "gate_up::task_of's blocks of kWarps rows: I % 8 == 0 (host check)");

// One task a warp with x staged (kXs, p.x_smem): the CTA's 8 tasks are 8 adjacent rows of one (token, slot)
// (task_of's blocks and task_of_shared_first's: I % 8 == 0, B·I % 8 == 0), so one token's x serves the
// whole CTA. Each warp issues its first round of weight loads, the CTA copies x into shared memory as FP32
// (stage_x; MXFP8 also the 256 scale values, dev::fill_e8m0_table), one barrier, then the warps compute from
// there: no BF16 unpack of x and no scale-byte conversion in the chunks' dot products, the same FP32 values
// in the same order (the same bits). Shared memory: H·4 B (+ 1 KB MXFP8). `task` is this warp's task index, `map`
// the walk's numbering; the tail CTA's warps without a task take part in the copy and the barrier.
template <bool kMx, bool kHBf16, class Map>
__device__ __forceinline__ void staged_task(const GateUpLaunch& p, int64_t task, int64_t total, int lane,
                                            float4* s_x, Map map) {
  constexpr int kPer = gate_up::chunk_elems<kMx>() / 4;  // float4 a chunk
  const bool has = task < total;
  // The CTA's first task always exists; its token is every task's of the CTA.
  const gate_up::TaskPos t = gate_up::task_pos(p, map(has ? task : int64_t(blockIdx.x) * kWarps));
  const int nchunks = p.hidden / gate_up::chunk_elems<kMx>();
  gate_up::RowPair rows{};
  gate_up::Round<kMx, kUnroll> first;
  if (has) {
    rows = gate_up::slot_rows<kMx>(p, t.b, t.j, t.i);
    gate_up::load_round<kUnroll>(first, rows, lane, nchunks);
  }
  gate_up::stage_x<kPer>(s_x, p.x + int64_t(t.b) * p.hidden, p.hidden);
  float* s_scale = reinterpret_cast<float*>(s_x + p.hidden / 4);  // MXFP8: 256 floats after x
  if constexpr (kMx) dev::fill_e8m0_table(s_scale);
  __syncthreads();
  if (!has) return;
  float ag = 0.0f, au = 0.0f;
  const gate_up::XShared x{s_x, p.hidden / (4 * kPer), s_scale};
  gate_up::dot_rows<kMx, kUnroll, true>(rows, x, p.hidden, lane, ag, au, &first);
  gate_up::finish<kHBf16>(p, t, ag, au, lane);
}

// kSharedFirst (p.shared_first, one task a warp): the shared expert's tasks first, and their CTAs start
// before griddepcontrol.wait, so that they stream while the router still runs (gate_up::task_of_shared_first).
template <bool kMx, bool kHBf16, int kMinCtas, bool kSharedFirst = false, bool kXs = false>
__global__ void __launch_bounds__(kThreads, kMinCtas) warp_decode_gate_up_kernel(const GateUpLaunch p) {
  extern __shared__ float4 s_x[];  // kXs: the CTA's token's x, FP32 (stage_x's layout)
  const int lane = threadIdx.x & 31;
  const int64_t total = int64_t(p.batch) * p.slots * p.inter;
  const int64_t task = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if constexpr (kSharedFirst) {
    if (!gate_up::shared_first_cta<kWarps>(p, blockIdx.x))
      device::griddepcontrol_wait();  // ids come from the router (the kernel ahead of this one)
    device::griddepcontrol_launch_dependents();
    const auto map = [&](int64_t t) { return gate_up::task_of_shared_first<kWarps>(p, t); };
    if constexpr (kXs) {
      staged_task<kMx, kHBf16>(p, task, total, lane, s_x, map);
    } else {
      if (task < total) gate_up::output<kMx, kHBf16, kUnroll>(p, map(task), lane);
    }
    return;
  }
  device::griddepcontrol_wait();  // ids come from the router (the kernel ahead of this one)
  device::griddepcontrol_launch_dependents();
  if constexpr (kXs) {
    staged_task<kMx, kHBf16>(p, task, total, lane, s_x, [&](int64_t t) { return gate_up::task_of<kWarps>(p, t); });
  } else {
    // One task a warp (grid = all tasks), or a grid-stride walk (persistent grid); whole warps.
    for (int64_t t = task; t < total; t += int64_t(gridDim.x) * kWarps)
      gate_up::output<kMx, kHBf16, kUnroll>(p, gate_up::task_of<kWarps>(p, t), lane);
  }
}

template <bool kMx, bool kHBf16, int kMinCtas = 1, bool kSharedFirst = false>
void launch(const GateUpLaunch& p, cudaStream_t stream) {
  const int64_t total = int64_t(p.batch) * p.slots * p.inter;
  int64_t blocks = (total + kWarps - 1) / kWarps;
  if (p.x_smem) {  // (host: one task a warp, H·4 <= kDecodeGateUpMaxXSmem)
    launch_with_pdl("decode_gate_up", warp_decode_gate_up_kernel<kMx, kHBf16, kMinCtas, kSharedFirst, true>,
                    dim3(unsigned(blocks)), dim3(kThreads), size_t(p.hidden) * 4 + (kMx ? 1024 : 0), stream, p);
    return;
  }
  if (p.persist > 0) {
    int device = 0, sms = 0;
    MXMOE_CUDA_CHECK("decode_gate_up", cudaGetDevice(&device));
    MXMOE_CUDA_CHECK("decode_gate_up", cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    blocks = int64_t(p.persist) * sms < blocks ? int64_t(p.persist) * sms : blocks;
  }
  launch_with_pdl("decode_gate_up", warp_decode_gate_up_kernel<kMx, kHBf16, kMinCtas, kSharedFirst>,
                  dim3(unsigned(blocks)), dim3(kThreads), 0, stream, p);
}

}  // namespace

void launch_decode_gate_up(const GateUpLaunch& p, cudaStream_t stream) {
  if (p.shared_first) {  // (host: a shared expert, one task a warp; MXFP8 at the default launch bound)
    if (p.w1.mxfp8) {
      if (p.h_bf16) launch<true, true, 3, true>(p, stream); else launch<true, false, 3, true>(p, stream);
    } else {
      if (p.h_bf16) launch<false, true, 1, true>(p, stream); else launch<false, false, 1, true>(p, stream);
    }
  } else if (p.w1.mxfp8 && p.min_ctas_per_sm >= 4) {  // launch bound: 64 registers, 4 CTAs a SM
    if (p.h_bf16) launch<true, true, 4>(p, stream); else launch<true, false, 4>(p, stream);
  } else if (p.w1.mxfp8 && p.min_ctas_per_sm >= 3) {  // launch bound: 80 registers, 3 CTAs a SM (default)
    if (p.h_bf16) launch<true, true, 3>(p, stream); else launch<true, false, 3>(p, stream);
  } else if (p.w1.mxfp8) {                        // 102 registers, 2 CTAs a SM
    if (p.h_bf16) launch<true, true>(p, stream); else launch<true, false>(p, stream);
  } else {
    if (p.h_bf16) launch<false, true>(p, stream); else launch<false, false>(p, stream);
  }
  MXMOE_CHECK_LAUNCH("decode_gate_up");
}

}  // namespace mxmoe::detail
