// Warp decode, gate/up projection with SwiGLU (DESIGN.md §4, include/mxmoe/decode.h):
//   h[b, j, i] = silu(g) · u,  g = X[b]·W1[e_j][i],  u = X[b]·W1[e_j][I + i],  silu(g) = g/(1+e^-g)
//   X BF16 [B, H] (16-byte aligned); W1 [E, 2I, H] BF16, or MXFP8 data E4M3 [E, 2I, H] + scales
//   E8M0 [E, 2I, H/32]; shared expert W1s [2I, H] as slot j = k; ids int32 [B, k];
//   h FP32 or BF16 [B, S, I].
// One warp computes one output h[b, j, i] at a time: it streams the gate row and the up row
// (K-contiguous) with 16-byte loads, lane l taking the 16-byte chunks l, l+32, ... (each warp load
// reads 512 contiguous bytes), FP32 accumulation in increasing K per lane, xor-butterfly warp sum,
// SwiGLU in registers, one store. MXFP8 chunks are 16 E4M3 inside one 32-block: one scale byte each.
//
// Persistent and software-pipelined: the grid is what fits on the device at once; warp w takes the
// outputs (tasks) w, w + W, w + 2W, ... (i fastest, so neighbouring warps read neighbouring rows of
// one expert). A task is G = ceil(chunks per row / (32·kUnroll)) steps of kUnroll chunks of both
// rows per lane; the loads of step s+1 (of this task or of the next) are issued before step s is
// computed, so a warp always has one step (2·kUnroll·16 B a lane, 4 KB a warp) in flight, and the
// expert id of the task after next is loaded one task ahead, so the id → address chain never
// stalls the stream. (Before run 31 a warp did one task: load, wait, compute, exit; MXFP8 ran at
// 31-67% of copy bandwidth because nothing was in flight while it converted.)
// The order of every sum is the one of the one-task-per-warp kernel (per lane increasing K, the
// same butterfly), so results are unchanged bit for bit, deterministic and batch-invariant.
// Roofline: 2·2·I·H FLOPs per (token, slot); bytes 2·I·H·(2 | 1 + 1/32) per distinct expert.
// Tests: tests/gpu/test_decode_gpu.cpp. Bench: bench/bench_decode.py.
#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "host/check.h"
#include "host/kernel_attr.h"
#include "kernels/decode/decode_launch.h"
#include "kernels/decode/warp_decode_common.cuh"

namespace mxmoe::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;  // chunks of each row per lane and step
static_assert(kThreads % 32 == 0, "whole warps");

// Weight rows of one task (b, j, i): the routed expert's gate and up rows, or the shared expert's.
struct Task {
  const uint8_t* gate;
  const uint8_t* up;
  const uint8_t* gate_scales;
  const uint8_t* up_scales;
  const uint8_t* x;  // X[b]
  int64_t out;       // index of h[b, j, i]
};

struct TaskIndex {
  int b, j, i;
};

__device__ __forceinline__ TaskIndex task_index(const GateUpLaunch& p, int64_t task) {
  TaskIndex t;
  t.i = int(task % p.inter);
  const int64_t bj = task / p.inter;
  t.j = int(bj % p.slots);
  t.b = int(bj / p.slots);
  return t;
}

// The expert id a task needs (loaded one task ahead); the shared slot needs none.
__device__ __forceinline__ int32_t task_expert(const GateUpLaunch& p, int64_t task, int64_t total) {
  if (task >= total) return 0;
  const TaskIndex t = task_index(p, task);
  return t.j < p.top_k ? __ldg(p.ids + int64_t(t.b) * p.top_k + t.j) : 0;
}

template <bool kMx>
__device__ __forceinline__ Task make_task(const GateUpLaunch& p, int64_t task, int32_t expert) {
  const TaskIndex t = task_index(p, task);
  const int64_t H = p.hidden, I = p.inter;
  const int64_t row_bytes = kMx ? H : 2 * H;
  const int64_t scale_row = H / kMxBlock;
  const uint8_t* w;
  const uint8_t* s = nullptr;
  if (t.j < p.top_k) {
    const int64_t e = dev::clamp_expert(expert, p.num_experts);
    w = static_cast<const uint8_t*>(p.w1.data) + e * 2 * I * row_bytes;
    if (kMx) s = p.w1.scales + e * 2 * I * scale_row;
  } else {
    w = static_cast<const uint8_t*>(p.w1.shared_data);
    if (kMx) s = p.w1.shared_scales;
  }
  Task r;
  r.gate = w + int64_t(t.i) * row_bytes;
  r.up = w + (I + t.i) * row_bytes;
  r.gate_scales = kMx ? s + int64_t(t.i) * scale_row : nullptr;
  r.up_scales = kMx ? s + (I + t.i) * scale_row : nullptr;
  r.x = reinterpret_cast<const uint8_t*>(p.x + int64_t(t.b) * H);
  r.out = (int64_t(t.b) * p.slots + t.j) * I + t.i;
  return r;
}

// One step's loads: kUnroll 16-byte chunks of each row per lane (zeros past the row's end).
struct Step {
  uint4 g[kUnroll], u[kUnroll];
  uint32_t gs[kUnroll], us[kUnroll];  // MXFP8 scale bytes
};

template <bool kMx>
__device__ __forceinline__ void load_step(Step& st, const Task& t, int c0, int nchunks) {
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    const int c = c0 + 32 * k;
    st.g[k] = make_uint4(0u, 0u, 0u, 0u);
    st.u[k] = st.g[k];
    st.gs[k] = 0u;
    st.us[k] = 0u;
    if (c < nchunks) {
      st.g[k] = dev::ldg_stream_v4(t.gate + int64_t(c) * 16);
      st.u[k] = dev::ldg_stream_v4(t.up + int64_t(c) * 16);
      if (kMx) {
        st.gs[k] = dev::ldg_u8(t.gate_scales + c / 2);
        st.us[k] = dev::ldg_u8(t.up_scales + c / 2);
      }
    }
  }
}

// BF16: chunks of 8 elements. MXFP8: chunks of 16 E4M3 (half a 32-block, scale byte c/2), the
// chunk summed from 0 and then added as fma(chunk_sum, 2^(s-127), acc) — exact scaling.
template <bool kMx>
__device__ __forceinline__ void compute_step(const Step& st, const Task& t, int c0, int nchunks,
                                             float& ag, float& au) {
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    const int c = c0 + 32 * k;
    if (c < nchunks) {
      if constexpr (kMx) {
        const uint4 x0 = dev::ldg_v4(t.x + int64_t(c) * 32);
        const uint4 x1 = dev::ldg_v4(t.x + int64_t(c) * 32 + 16);
        ag = fmaf(dev::dot16_e4m3_bf16(st.g[k], x0, x1), dev::e8m0_to_f32(st.gs[k]), ag);
        au = fmaf(dev::dot16_e4m3_bf16(st.u[k], x0, x1), dev::e8m0_to_f32(st.us[k]), au);
      } else {
        const uint4 xv = dev::ldg_v4(t.x + int64_t(c) * 16);
        ag = dev::dot8_bf16_bf16(st.g[k], xv, ag);
        au = dev::dot8_bf16_bf16(st.u[k], xv, au);
      }
    }
  }
}

// Warp sums, SwiGLU, one store (lane 0) of the task's output.
template <bool kHBf16>
__device__ __forceinline__ void finish_task(const GateUpLaunch& p, const Task& t, int lane, float ag,
                                            float au) {
  const float sg = dev::warp_sum(ag), su = dev::warp_sum(au);
  if (lane == 0) {
    const float hv = (sg / (1.0f + expf(-sg))) * su;
    if constexpr (kHBf16) {
      static_cast<uint16_t*>(p.h)[t.out] = dev::f32_to_bf16_bits(hv);
    } else {
      static_cast<float*>(p.h)[t.out] = hv;
    }
  }
}

// kPipelined = false: the pre-run-31 kernel (one task per warp, each step loaded then computed),
// kept for the A/B timing of MXMOE_DECODE_PIPELINE=0; same sums in the same order.
template <bool kMx, bool kHBf16, bool kPipelined>
__global__ void __launch_bounds__(kThreads) warp_decode_gate_up_kernel(const GateUpLaunch p) {
  const int lane = threadIdx.x & 31;
  const int64_t total = int64_t(p.batch) * p.slots * p.inter;
  const int64_t stride = int64_t(gridDim.x) * kWarps;
  int64_t task = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (task >= total) return;  // the whole warp leaves together
  const int nchunks = p.hidden / (kMx ? 16 : 8);
  const int groups = (nchunks + 32 * kUnroll - 1) / (32 * kUnroll);
  float ag = 0.0f, au = 0.0f;
  Step a, b;
  if constexpr (!kPipelined) {
    const Task t = make_task<kMx>(p, task, task_expert(p, task, total));
    for (int g = 0; g < groups; ++g) {
      load_step<kMx>(a, t, g * 32 * kUnroll + lane, nchunks);
      compute_step<kMx>(a, t, g * 32 * kUnroll + lane, nchunks, ag, au);
    }
    finish_task<kHBf16>(p, t, lane, ag, au);
    return;
  }

  // Pipeline state: the step being computed is (task, g) with rows `cur`; `ahead` is the expert
  // id of the task after the next one.
  Task cur = make_task<kMx>(p, task, task_expert(p, task, total));
  int32_t ahead = task_expert(p, task + stride, total);
  int g = 0;
  load_step<kMx>(a, cur, lane, nchunks);

  // Loads the step after (task, g) into `into` (if there is one), then computes `from` = (task, g);
  // false when this warp has no further step.
  auto stage = [&](Step& from, Step& into) -> bool {
    int64_t ntask = task;
    int ng = g + 1;
    Task nxt = cur;
    if (ng == groups) {
      ntask = task + stride;
      ng = 0;
      if (ntask < total) {
        nxt = make_task<kMx>(p, ntask, ahead);
        ahead = task_expert(p, ntask + stride, total);
      }
    }
    const bool more = ntask < total;
    if (more) load_step<kMx>(into, nxt, ng * 32 * kUnroll + lane, nchunks);
    compute_step<kMx>(from, cur, g * 32 * kUnroll + lane, nchunks, ag, au);
    if (g + 1 == groups) {
      finish_task<kHBf16>(p, cur, lane, ag, au);
      ag = 0.0f;
      au = 0.0f;
    }
    task = ntask;
    g = ng;
    cur = nxt;
    return more;
  };
  while (stage(a, b) && stage(b, a)) {
  }
}

// MXMOE_DECODE_PIPELINE: "0" selects the one-task-per-warp kernel (A/B timing), else pipelined.
bool pipelined_from_env() {
  const char* v = std::getenv("MXMOE_DECODE_PIPELINE");
  return v == nullptr || v[0] != '0';
}

template <bool kMx, bool kHBf16, bool kPipelined>
void launch(const GateUpLaunch& p, cudaStream_t stream) {
  constexpr auto kernel = warp_decode_gate_up_kernel<kMx, kHBf16, kPipelined>;
  const char* fn = "decode_gate_up";
  const int64_t total = int64_t(p.batch) * p.slots * p.inter;
  int64_t blocks = (total + kWarps - 1) / kWarps;
  if (kPipelined) {  // persistent: what fits on the device at once
    const int per_sm = once_per_device<kernel, MaxResidentTag>(fn, [fn](int) {
      int n = 0;
      MXMOE_CUDA_CHECK(fn, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, 0));
      return std::max(n, 1);
    });
    int device = 0, sms = 0;
    MXMOE_CUDA_CHECK(fn, cudaGetDevice(&device));
    MXMOE_CUDA_CHECK(fn, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    blocks = std::min<int64_t>(blocks, int64_t(per_sm) * sms);
  }
  kernel<<<dim3(unsigned(blocks)), kThreads, 0, stream>>>(p);
}

template <bool kMx, bool kHBf16>
void launch(const GateUpLaunch& p, cudaStream_t stream) {
  if (pipelined_from_env()) launch<kMx, kHBf16, true>(p, stream);
  else launch<kMx, kHBf16, false>(p, stream);
}

}  // namespace

void launch_decode_gate_up(const GateUpLaunch& p, cudaStream_t stream) {
  if (p.w1.mxfp8) {
    if (p.h_bf16) launch<true, true>(p, stream); else launch<true, false>(p, stream);
  } else {
    if (p.h_bf16) launch<false, true>(p, stream); else launch<false, false>(p, stream);
  }
  MXMOE_CHECK_LAUNCH("decode_gate_up");
}

}  // namespace mxmoe::detail
