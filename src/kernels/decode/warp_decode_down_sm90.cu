// Warp decode, down projection with the routing-weighted sum (DESIGN.md §4, decode.h):
//   out[b, n] = Σ_{j=0..S-1} w[b, j] · (h[b, j] · W2[e_j][n]),   w[b, k] = 1 for the shared expert
//   h FP32 or BF16 [B, S, I] (16-byte aligned); W2 [E, H, I] BF16, or MXFP8 data E4M3 [E, H, I]
//   + scales E8M0 [E, H, I/32]; shared W2s [H, I]; ids int32 [B, k]; w FP32 [B, k];
//   out BF16 [B, H].
// One CTA owns kRows = 4 adjacent outputs n of one token b. Its W = min(S, 16) warps split the
// slots (warp w takes j = w, w+W, ...); for each slot a warp streams the kRows rows of length I
// (I = 768 rows are short: several rows give each lane kUnroll·kRows = 8 independent 16-byte loads,
// 4 KB a warp, before any is used), each lane summing its chunks in increasing K, then the fixed
// xor butterfly. The per-slot dot products meet in shared memory and one thread per output adds
// them in slot order j = 0..S-1 (acc = fma(w_j, dot_j, acc), FP32), then rounds to BF16 once.
// No atomics; the order depends on nothing but (b, n), so the result is batch-invariant.
// Registers: ~60-90 a thread (-Xptxas -v, no spills). Shared: (kDecodeMaxTopK+1)·kRows·4 B.
// Roofline: 2·H·I FLOPs per (token, slot); bytes H·I·(2 | 1 + 1/32) per distinct expert.
// Tests: tests/gpu/test_decode_gpu.cpp. Bench: bench/bench_decode.py.
#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "host/check.h"
#include "kernels/decode/decode_launch.h"
#include "kernels/decode/warp_decode_common.cuh"
#include "mxmoe/decode.h"

namespace mxmoe::detail {
namespace {

constexpr int kRows = 4;       // outputs per CTA (rows of W2 per warp and slot)
constexpr int kUnroll = 2;     // chunks of each row in flight per lane
constexpr int kMaxWarps = 12;  // warps per CTA: min(S, kMaxWarps) (12: the launch bound leaves 170 registers)
constexpr int kMaxSlots = kDecodeMaxTopK + 1;

static_assert(8 % kRows == 0, "H % 8 == 0 (host check), so a CTA's kRows rows all lie below H");

// The kRows rows n0 .. n0+kRows-1 of slot j's W2 block: row q at row + q·row_bytes.
struct SlotRows {
  const uint8_t* row;
  const uint8_t* scales;  // MXFP8: scale row of row n0; row q at scales + q·scale_row
  int64_t row_bytes, scale_row;
};

template <bool kMx>
__device__ __forceinline__ SlotRows slot_rows(const DownLaunch& p, int b, int j, int n0, int32_t expert) {
  SlotRows r;
  r.row_bytes = kMx ? int64_t(p.inter) : 2 * int64_t(p.inter);
  r.scale_row = p.inter / kMxBlock;
  const uint8_t* w;
  const uint8_t* s = nullptr;
  if (j < p.top_k) {
    const int64_t e = dev::clamp_expert(expert, p.num_experts);
    w = static_cast<const uint8_t*>(p.w2.data) + e * p.hidden * r.row_bytes;
    if (kMx) s = p.w2.scales + e * p.hidden * r.scale_row;
  } else {
    w = static_cast<const uint8_t*>(p.w2.shared_data);
    if (kMx) s = p.w2.shared_scales;
  }
  r.row = w + int64_t(n0) * r.row_bytes;
  r.scales = kMx ? s + int64_t(n0) * r.scale_row : nullptr;
  return r;
}

// Eight h values (elements 8c .. 8c+7) as FP32.
template <bool kHBf16>
__device__ __forceinline__ void load_h8(const void* h_row, int c, float4& a, float4& b) {
  if constexpr (kHBf16) {
    dev::bf16x8_to_f32(dev::ldg_v4(static_cast<const uint8_t*>(h_row) + int64_t(c) * 16), a, b);
  } else {
    const uint8_t* p = static_cast<const uint8_t*>(h_row) + int64_t(c) * 32;
    a = dev::as_float4(dev::ldg_v4(p));
    b = dev::as_float4(dev::ldg_v4(p + 16));
  }
}

// One step's loads: kUnroll 16-byte chunks of each of the kRows rows per lane (zeros past the end).
struct Step {
  uint4 w[kUnroll][kRows];
  uint32_t s[kUnroll][kRows];  // MXFP8 scale bytes
};

template <bool kMx>
__device__ __forceinline__ void load_step(Step& st, const SlotRows& r, int c0, int nchunks) {
#pragma unroll
  for (int t = 0; t < kUnroll; ++t) {
    const int c = c0 + 32 * t;
#pragma unroll
    for (int q = 0; q < kRows; ++q) {
      st.w[t][q] = make_uint4(0u, 0u, 0u, 0u);
      st.s[t][q] = 0u;
      if (c < nchunks) {
        st.w[t][q] = dev::ldg_stream_v4(r.row + q * r.row_bytes + int64_t(c) * 16);
        if (kMx) st.s[t][q] = dev::ldg_u8(r.scales + q * r.scale_row + c / 2);
      }
    }
  }
}

// BF16 weights: chunks of 8. MXFP8: chunks of 16 E4M3 (scale byte c/2), chunk sum from 0, then
// exact scaling.
template <bool kMx, bool kHBf16>
__device__ __forceinline__ void compute_step(const Step& st, const void* h_row, int c0, int nchunks,
                                             float (&acc)[kRows]) {
#pragma unroll
  for (int t = 0; t < kUnroll; ++t) {
    const int c = c0 + 32 * t;
    if (c < nchunks) {
      if constexpr (kMx) {
        float4 h[4];
        load_h8<kHBf16>(h_row, 2 * c, h[0], h[1]);
        load_h8<kHBf16>(h_row, 2 * c + 1, h[2], h[3]);
#pragma unroll
        for (int q = 0; q < kRows; ++q)
          acc[q] = fmaf(dev::dot16_e4m3_f32(st.w[t][q], h), dev::e8m0_to_f32(st.s[t][q]), acc[q]);
      } else {
        float4 h0, h1;
        load_h8<kHBf16>(h_row, c, h0, h1);
#pragma unroll
        for (int q = 0; q < kRows; ++q) acc[q] = dev::dot8_bf16_f32(st.w[t][q], h0, h1, acc[q]);
      }
    }
  }
}

// A warp's unit of work: slot j of the tile (b, n0).
struct Unit {
  int b, j, n0;
};

__device__ __forceinline__ Unit unit_of(const DownLaunch& p, int tiles, int tile, int j) {
  return Unit{tile / tiles, j, (tile % tiles) * kRows};
}

__device__ __forceinline__ int32_t unit_expert(const DownLaunch& p, const Unit& u) {
  return u.j < p.top_k ? __ldg(p.ids + int64_t(u.b) * p.top_k + u.j) : 0;
}

template <bool kHBf16>
__device__ __forceinline__ const void* h_row_of(const DownLaunch& p, const Unit& u) {
  const size_t h_elem = kHBf16 ? 2 : 4;
  return static_cast<const uint8_t*>(p.h) + ((int64_t(u.b) * p.slots + u.j) * p.inter) * int64_t(h_elem);
}

// The CTA's threads q < kRows add the per-slot dot products of tile (b, n0) in slot order
// j = 0..S-1 (acc = fma(w_j, dot_j, acc), FP32) and round to BF16 once.
__device__ __forceinline__ void combine_tile(const DownLaunch& p, const float (*s_dot)[kRows], int b,
                                             int n0) {
  if (threadIdx.x < kRows) {
    const int q = threadIdx.x, n = n0 + q;
    if (n < p.hidden) {
      float out = 0.0f;
      for (int j = 0; j < p.slots; ++j) {
        const float wj = j < p.top_k ? p.weights[int64_t(b) * p.top_k + j] : 1.0f;
        out = fmaf(wj, s_dot[j][q], out);
      }
      p.out[int64_t(b) * p.hidden + n] = dev::f32_to_bf16_bits(out);
    }
  }
}

// kPipelined = false: the pre-run-31 kernel (one tile per CTA, each step loaded then computed),
// kept for the A/B timing of MXMOE_DECODE_PIPELINE=0. kPipelined: persistent CTAs take the tiles
// blockIdx.x, + gridDim.x, ...; a warp's steps (its slots of a tile, then of the next tile, each
// in G steps of kUnroll chunks) are loaded one step ahead of the one computed, expert ids one
// unit ahead; the per-slot dot products go to a double-buffered shared array and one barrier per
// tile hands them to the summing threads. Same sums in the same order either way.
template <bool kMx, bool kHBf16, bool kPipelined>
__global__ void __launch_bounds__(kMaxWarps * 32, 1) warp_decode_down_kernel(const DownLaunch p) {
  __shared__ float s_dot[2][kMaxSlots][kRows];  // per-slot dot products, by tile parity
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
  const int tiles = (p.hidden + kRows - 1) / kRows;
  const int num_tiles = p.batch * tiles;
  const int nchunks = p.inter / (kMx ? 16 : 8);
  const int groups = (nchunks + 32 * kUnroll - 1) / (32 * kUnroll);
  float acc[kRows];
#pragma unroll
  for (int q = 0; q < kRows; ++q) acc[q] = 0.0f;
  auto store_dot = [&](float (*dst)[kRows], int j) {
#pragma unroll
    for (int q = 0; q < kRows; ++q) {
      acc[q] = dev::warp_sum(acc[q]);
      if (lane == 0) dst[j][q] = acc[q];
      acc[q] = 0.0f;
    }
  };
  Step a, b;
  if constexpr (!kPipelined) {
    const int tile = int(blockIdx.x);
    const Unit u0 = unit_of(p, tiles, tile, 0);
    for (int j = warp; j < p.slots; j += num_warps) {
      const Unit u{u0.b, j, u0.n0};
      const SlotRows rows = slot_rows<kMx>(p, u.b, j, u.n0, unit_expert(p, u));
      const void* h_row = h_row_of<kHBf16>(p, u);
      for (int g = 0; g < groups; ++g) {
        load_step<kMx>(a, rows, g * 32 * kUnroll + lane, nchunks);
        compute_step<kMx, kHBf16>(a, h_row, g * 32 * kUnroll + lane, nchunks, acc);
      }
      store_dot(s_dot[0], j);
    }
    __syncthreads();
    combine_tile(p, s_dot[0], u0.b, u0.n0);
    return;
  }

  // Units of this warp, in order: tiles tile0, tile0 + gridDim.x, ...; in each, slots warp,
  // warp + num_warps, ... (a warp with no slot in a tile still joins its barrier).
  int tile = int(blockIdx.x), n = 0;  // n: this CTA's tile count so far (buffer parity)
  if (warp >= p.slots) {  // more warps than slots cannot happen (warps = min(S, 16)); be safe
    for (; tile < num_tiles; tile += gridDim.x, ++n) {
      __syncthreads();
      combine_tile(p, s_dot[n & 1], tile / tiles, (tile % tiles) * kRows);
    }
    return;
  }
  Unit cur = unit_of(p, tiles, tile, warp);
  SlotRows rows = slot_rows<kMx>(p, cur.b, cur.j, cur.n0, unit_expert(p, cur));
  // The unit after cur, and its expert id (loaded one unit ahead).
  auto next_unit = [&](const Unit& u, int& t) {
    if (u.j + num_warps < p.slots) return Unit{u.b, u.j + num_warps, u.n0};
    t += gridDim.x;
    return unit_of(p, tiles, t, warp);
  };
  int ahead_tile = tile;
  Unit ahead = next_unit(cur, ahead_tile);
  int32_t ahead_id = ahead_tile < num_tiles ? unit_expert(p, ahead) : 0;
  int g = 0;
  load_step<kMx>(a, rows, lane, nchunks);
  auto stage = [&](Step& from, Step& into) -> bool {
    // The step after (cur, g): same unit, next group; or the first group of `ahead`.
    const bool same_unit = g + 1 < groups;
    SlotRows nrows = rows;
    const bool more = same_unit || ahead_tile < num_tiles;
    if (!same_unit && more) nrows = slot_rows<kMx>(p, ahead.b, ahead.j, ahead.n0, ahead_id);
    if (more) load_step<kMx>(into, nrows, (same_unit ? g + 1 : 0) * 32 * kUnroll + lane, nchunks);
    compute_step<kMx, kHBf16>(from, h_row_of<kHBf16>(p, cur), g * 32 * kUnroll + lane, nchunks, acc);
    if (same_unit) {
      ++g;
      return true;
    }
    store_dot(s_dot[n & 1], cur.j);
    if (ahead_tile != tile) {  // the tile is done: every warp has stored its slots
      __syncthreads();
      combine_tile(p, s_dot[n & 1], cur.b, cur.n0);
      ++n;
      tile = ahead_tile;
    }
    if (!more) return false;
    cur = ahead;
    rows = nrows;
    g = 0;
    ahead = next_unit(cur, ahead_tile);
    ahead_id = ahead_tile < num_tiles ? unit_expert(p, ahead) : 0;
    return true;
  };
  while (stage(a, b) && stage(b, a)) {
  }
}

// MXMOE_DECODE_PIPELINE: "0" selects the one-tile-per-CTA kernel (A/B timing), else pipelined.
bool pipelined_from_env() {
  const char* v = std::getenv("MXMOE_DECODE_PIPELINE");
  return v == nullptr || v[0] != '0';
}

template <bool kMx, bool kHBf16, bool kPipelined>
void launch(const DownLaunch& p, cudaStream_t stream) {
  constexpr auto kernel = warp_decode_down_kernel<kMx, kHBf16, kPipelined>;
  const char* fn = "decode_down";
  const int64_t tiles = (p.hidden + kRows - 1) / kRows;
  const int warps = p.slots < kMaxWarps ? p.slots : kMaxWarps;
  int64_t blocks = int64_t(p.batch) * tiles;
  if (kPipelined) {  // persistent: what fits on the device at once (per CTA size: cache per size)
    int device = 0, sms = 0, per_sm = 0;
    MXMOE_CUDA_CHECK(fn, cudaGetDevice(&device));
    MXMOE_CUDA_CHECK(fn, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    MXMOE_CUDA_CHECK(fn, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, warps * 32, 0));
    blocks = std::min<int64_t>(blocks, int64_t(std::max(per_sm, 1)) * sms);
  }
  kernel<<<dim3(unsigned(blocks)), warps * 32, 0, stream>>>(p);
}

template <bool kMx, bool kHBf16>
void launch(const DownLaunch& p, cudaStream_t stream) {
  if (pipelined_from_env()) launch<kMx, kHBf16, true>(p, stream);
  else launch<kMx, kHBf16, false>(p, stream);
}

}  // namespace

void launch_decode_down(const DownLaunch& p, cudaStream_t stream) {
  if (p.w2.mxfp8) {
    if (p.h_bf16) launch<true, true>(p, stream); else launch<true, false>(p, stream);
  } else {
    if (p.h_bf16) launch<false, true>(p, stream); else launch<false, false>(p, stream);
  }
  MXMOE_CHECK_LAUNCH("decode_down");
}

}  // namespace mxmoe::detail
