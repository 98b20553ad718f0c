// Down-projection variants (src/host/decode.cpp selects them from MXMOE_DECODE_DOWN_*, docs/notes/decode.md
// "Session 11"; since run 88 the library's default is one of them: PERSIST = 2, with 8 rows x 1 for MXFP8
// weights and 4 rows x 2 for BF16). Same formula, inputs and outputs as warp_decode_down_sm90.cu (the
// base kernel: one CTA a tile, 4 rows x 2, MXMOE_DECODE_DOWN_PERSIST=0 with BF16 weights):
//   out[b, n] = Σ_{j=0..S-1} w[b, j] · (h[b, j] · W2[e_j][n]),  h FP32 or BF16 [B, S, I],
//   W2 BF16 or MXFP8 [E, H, I] (+ E8M0 scales [E, H, I/32]), shared W2s [H, I], out BF16 [B, H].
// A tile = kR adjacent outputs n0 .. n0+kR-1 of one token; tiles are numbered n-major (every token's
// tile n side by side) or b-major with MXMOE_DECODE_ORDER=tokens (down::tile_of). A CTA of W = min(S, 16)
// warps walks the tiles blockIdx.x, + gridDim.x, ...:
// with grid = B·tiles (PERSIST = 0) that is one tile a CTA, as the base kernel; with PERSIST = N the grid
// is N·SMs CTAs (fewer CTA launches and a shorter wave tail). Per tile: warp w takes slots j = w, w+W, ...
// (down::slot_dots: per lane its chunks in increasing K, the xor butterfly), lane 0 writes the kR sums to
// shared memory (dynamic, sized for the launch: dot_smem_bytes). Since session 19 a CTA
// does that for a group of up to p.down_group tiles (t, t + G, ...) before one __syncthreads, after which
// threads 0..group·kR-1 add each output's slots in order (down::combine): the warps stream their rows of
// consecutive tiles back to back instead of meeting at a barrier after every tile (group 1 is the walk
// before). Two group buffers alternate, so the warps start the next group while its outputs are combined
// (a buffer is rewritten two groups later, after the next group's barrier, which every combining thread
// passes only after its combine). The balanced walk keeps a barrier a tile.
// Variant parameters (none changes the order of any FP operation, so every variant gives the default's
// bits — DecodeGpu.DownSwitchesGiveDefaultBits, which also compares the base kernel):
//   kR        rows a warp streams per slot: 4 | 8 | 16 (h read once for kR rows instead of 4);
//   kUnroll   chunks of each row in flight per lane: 1 | 2 | 4 (kR·kUnroll <= 16 loads in flight);
//   kRowScales  MXFP8: scale bytes loaded warp-wide once per round, handed out by shuffles
//             (down::dot_rows_mx);
//   kMaxRegs  register cap (__maxnreg__): 128 (= the default's __launch_bounds__(512, 1)), 112, 80, 64 —
//             more resident warps a SM against fewer registers (spills: see the notes). Registers admit warps to
//             a SM in multiples of 4 (one a scheduler; cudaOccupancyMaxActiveBlocksPerMultiprocessor, run 156):
//             2 CTAs of 9 warps (DeepSeek-V3's S = 9) need <= 96 registers a thread (1 CTA from 100), 2 of 8
//             warps <= 128. The default MXFP8 8 x 1 kernel holds 95; builds at 100-112 ran DeepSeek-V3 at one
//             CTA a SM (decode.md "Runs 154-155");
//   kBalance  (MXMOE_DECODE_DOWN_BALANCE=1, PERSIST > 0, REGS 112 | 128): the balanced walk (balanced_rows) —
//             equal shares of the B·H outputs a CTA instead of whole tiles a CTA;
//   MXFP8 chunk scales (tile walk): 2^(s-127) from a 256-entry table in shared memory (ScaleTable).
//   p.down_prefetch (run time, PERSIST > 0 only): lane 0 of each warp asks L2 for the next tile's
//             rows of its slots (cp.async.bulk.prefetch.L2, no registers) before computing this one.
// Before griddepcontrol.wait each CTA prefetches its first tile's rows into L2, as the default does
// (a hint: see warp_decode_down_sm90.cu).
#pragma once
#include <cstdint>

#include "device/cp_async_bulk_prefetch.cuh"
#include "device/griddepcontrol.cuh"
#include "host/check.h"
#include "host/pdl_launch.h"
#include "kernels/decode/decode_launch.h"
#include "kernels/decode/warp_decode_down.cuh"

namespace mxmoe::detail::down_sweep {

using down::kMaxSlots;
constexpr int kMaxWarps = 16;  // warps per CTA: min(S, kMaxWarps), as the default

// L2 prefetch of rows n0 .. n0+rows-1 of token b for this warp's slots (lane 0 only; a hint, no registers).
template <bool kMx>
__device__ __forceinline__ void prefetch_rows(const DownLaunch& p, int b, int n0, int rows, int warp, int num_warps) {
  for (int j = warp; j < p.slots; j += num_warps) {
    const down::SlotRows r = down::slot_rows<kMx>(p, b, j, n0);
    device::cp_async_bulk_prefetch_L2_global(r.row, uint32_t(rows * r.row_bytes));
  }
}

// The same for tile `tile` (kR rows; down::tile_of's order).
template <bool kMx, int kR>
__device__ __forceinline__ void prefetch_tile(const DownLaunch& p, int tile, int tiles, int warp, int num_warps) {
  int b, n0;
  down::tile_of(p, tile, tiles, kR, b, n0);
  prefetch_rows<kMx>(p, b, n0, p.hidden - n0 < kR ? p.hidden - n0 : kR, warp, num_warps);
}

// The balanced walk (kBalance, MXMOE_DECODE_DOWN_BALANCE=1): CTA c owns the rows [c·R/G, (c+1)·R/G) of
// the R = B·H outputs (b-major), so every CTA has R/G rounded up or down, where the tile walk gives some
// CTAs one tile more than others (DeepSeek-V3 MXFP8 at B = 1: 896 tiles of 8 over 264 CTAs, 3 or 4 each);
// it walks them in tiles of at most kR rows that end at its range's end or at a token's last output.
// Rows of a tile from output n0 of a token, `left` rows left in the range.
__device__ __forceinline__ int balanced_rows(int hidden, int n0, int left, int kR) {
  const int lim = left < hidden - n0 ? left : hidden - n0;
  return lim < kR ? lim : kR;
}

// One tile of either walk: each warp's slots' dot products into s_dot (lane 0), the CTA barrier, then
// threads 0..rows-1 sum the slots (down::combine). kChecked: the tile may hold fewer than kR rows.
template <bool kMx, bool kHBf16, int kR, int kUnroll, bool kRowScales, bool kChecked>
__device__ __forceinline__ void run_tile(const DownLaunch& p, int b, int n0, int rows, float (*s_dot)[kR],
                                         int lane, int warp, int num_warps) {
  for (int j = warp; j < p.slots; j += num_warps) {
    float acc[kR];
    down::slot_dots<kMx, kHBf16, false, kUnroll, kR, kRowScales, kChecked>(p, b, j, n0, lane, acc, rows);
    if (lane == 0) {
#pragma unroll
      for (int q = 0; q < kR; ++q) s_dot[j][q] = acc[q];
    }
  }
  __syncthreads();
  if (int(threadIdx.x) < rows) down::combine<kR>(p, b, n0, int(threadIdx.x), s_dot);
}

// Tiles a CTA of the tile walk computes between two CTA barriers (p.down_group, at most max_group): each warp
// streams its slots of tiles t, t + G, ... (G = gridDim.x) back to back, writing the per-slot dot products
// into the group's slice of shared memory; one barrier; then threads 0 .. group·kR - 1 combine the group's
// outputs. Two group buffers alternate, so one barrier a group suffices (a buffer is rewritten two groups
// later, after the next group's barrier, which every combining thread passes only after its combine).
// Group 1 is the walk before session 19 (a barrier a tile). At most 64 / kR tiles (dot_smem_bytes <= 16.5 KB).
template <int kR>
constexpr int max_group() { return 64 / kR; }

// MXFP8: the scale bytes' values 2^(s-127) in shared memory (dev::fill_e8m0_table).
template <bool kMx>
struct ScaleTable {
  float v[kMx ? 256 : 1];
};

// The tile walk's group: p.down_group, at most max_group (the kernel and dot_smem_bytes agree on it).
template <int kR>
__host__ __device__ __forceinline__ int tile_group(const DownLaunch& p) {
  return p.down_group < max_group<kR>() ? p.down_group : max_group<kR>();
}

template <bool kMx, bool kHBf16, int kR, int kUnroll, bool kRowScales, int kMaxRegs, bool kBalance>
__global__ void __launch_bounds__(kMaxWarps * 32) __maxnreg__(kMaxRegs)
    warp_decode_down_sweep_kernel(const DownLaunch p) {
  static_assert(kR == 4 || kR == 8 || kR == 16, "tile rows");
  static_assert(kR * kUnroll <= 16, "at most 16 16-byte loads in flight a lane");
  static_assert(kMx || !kRowScales, "row scales are an MXFP8 variant");
  // Per-slot dot products, dynamic (dot_smem_bytes: sized for the launch's slots and group, so that the L1
  // cache, which holds h, keeps its room): [2][group][S][kR] floats (two groups; the balanced walk: group 1).
  extern __shared__ float s_dot_all[];
  __shared__ ScaleTable<kMx> s_scale;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
  if constexpr (kBalance) {
    const int total_rows = p.batch * p.hidden;  // <= 2^12 · 2^16 (decode_checks.h): an int
    const int begin = int(int64_t(total_rows) * blockIdx.x / gridDim.x);
    int left = int(int64_t(total_rows) * (blockIdx.x + 1) / gridDim.x) - begin;
    int b = begin / p.hidden, n0 = begin - b * p.hidden;
    if (lane == 0 && left > 0) prefetch_rows<kMx>(p, b, n0, balanced_rows(p.hidden, n0, left, kR), warp, num_warps);
    device::griddepcontrol_wait();  // h comes from decode_gate_up (the kernel ahead of this one)
    device::griddepcontrol_launch_dependents();
    for (int buf = 0; left > 0; buf ^= 1) {
      const int rows = balanced_rows(p.hidden, n0, left, kR);
      float(*s_dot)[kR] = reinterpret_cast<float(*)[kR]>(s_dot_all + buf * p.slots * kR);
      run_tile<kMx, kHBf16, kR, kUnroll, kRowScales, true>(p, b, n0, rows, s_dot, lane, warp, num_warps);
      left -= rows;
      n0 += rows;
      if (n0 == p.hidden) {
        n0 = 0;
        ++b;
      }
    }
    return;
  }
  const int tiles = (p.hidden + kR - 1) / kR;
  const int total = p.batch * tiles;
  const int stride = int(gridDim.x);
  const int group = tile_group<kR>(p);  // >= 1 (host check)
  if (lane == 0 && int(blockIdx.x) < total) prefetch_tile<kMx, kR>(p, int(blockIdx.x), tiles, warp, num_warps);
  if constexpr (kMx) {
    dev::fill_e8m0_table(s_scale.v);
    __syncthreads();  // the scale table (before the wait: it depends on nothing the kernel ahead writes)
  }
  device::griddepcontrol_wait();  // h comes from decode_gate_up (the kernel ahead of this one)
  device::griddepcontrol_launch_dependents();

  const int tile_floats = p.slots * kR;  // one tile's [S][kR]
  int buf = 0;
  for (int first = int(blockIdx.x); first < total; first += group * stride, buf ^= 1) {
    int in_group = 0;  // tiles of this group
    for (int tile = first; in_group < group && tile < total; ++in_group, tile += stride) {
      int b, n0;
      down::tile_of(p, tile, tiles, kR, b, n0);
      const int next = tile + stride;
      if (p.down_prefetch && lane == 0 && next < total) prefetch_tile<kMx, kR>(p, next, tiles, warp, num_warps);
      for (int j = warp; j < p.slots; j += num_warps) {
        float acc[kR];
        down::slot_dots<kMx, kHBf16, false, kUnroll, kR, kRowScales, false, true>(p, b, j, n0, lane, acc, kR,
                                                                                 s_scale.v);
        if (lane == 0) {
#pragma unroll
          for (int q = 0; q < kR; ++q) s_dot_all[(buf * group + in_group) * tile_floats + j * kR + q] = acc[q];
        }
      }
    }
    __syncthreads();
    for (int i = int(threadIdx.x); i < in_group * kR; i += int(blockDim.x)) {
      const int g = i / kR, q = i - g * kR;
      int b, n0;
      down::tile_of(p, first + g * stride, tiles, kR, b, n0);
      down::combine<kR>(p, b, n0, q, reinterpret_cast<const float(*)[kR]>(s_dot_all + (buf * group + g) * tile_floats));
    }
  }
}

// Bytes of the per-slot dot products: two groups (the balanced walk: two rounds) of S x kR floats a tile;
// at most 2 · 16 · 33 · 4 · 4 B (kR 4, group 16, S 33) = 16.5 KB.
template <int kR>
size_t dot_smem_bytes(const DownLaunch& p, bool balance) {
  const int group = balance ? 1 : tile_group<kR>(p);
  return size_t(2) * group * p.slots * kR * sizeof(float);
}

template <bool kMx, bool kHBf16, int kR, int kUnroll, bool kRowScales, int kMaxRegs, bool kBalance = false>
void launch(const DownLaunch& p, cudaStream_t stream) {
  // The balanced walk splits the B·H outputs (a CTA may hold a single row), the tile walk its tiles.
  const int64_t total = kBalance ? int64_t(p.batch) * p.hidden : int64_t(p.batch) * ((p.hidden + kR - 1) / kR);
  int64_t grid = total;
  if (p.down_persist > 0) {
    int device = 0, sms = 0;
    MXMOE_CUDA_CHECK("decode_down_sweep", cudaGetDevice(&device));
    MXMOE_CUDA_CHECK("decode_down_sweep", cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    grid = int64_t(p.down_persist) * sms < total ? int64_t(p.down_persist) * sms : total;
  }
  const int warps = p.slots < kMaxWarps ? p.slots : kMaxWarps;
  launch_with_pdl("decode_down_sweep", warp_decode_down_sweep_kernel<kMx, kHBf16, kR, kUnroll, kRowScales, kMaxRegs, kBalance>,
                  dim3(unsigned(grid)), dim3(warps * 32), dot_smem_bytes<kR>(p, kBalance), stream, p);
}

template <bool kMx, bool kHBf16, int kR, int kUnroll, bool kRowScales>
void by_regs(const DownLaunch& p, cudaStream_t s) {
  // The balanced walk only at the caps 112 and 128 (src/host/decode.cpp refuses it with the others),
  // both compiled at 112: its row checks took MXFP8 8 x 1 from 95 to 124 registers, where 2 CTAs of 9
  // warps (DeepSeek-V3's slots) fit a SM only up to 112.
  if (p.down_balance) return launch<kMx, kHBf16, kR, kUnroll, kRowScales, 112, true>(p, s);
  switch (p.down_regs) {
    case 64: launch<kMx, kHBf16, kR, kUnroll, kRowScales, 64>(p, s); break;
    case 80: launch<kMx, kHBf16, kR, kUnroll, kRowScales, 80>(p, s); break;
    case 112: launch<kMx, kHBf16, kR, kUnroll, kRowScales, 112>(p, s); break;
    default: launch<kMx, kHBf16, kR, kUnroll, kRowScales, 128>(p, s); break;
  }
}

template <bool kMx, bool kHBf16, int kR, int kUnroll>
void by_scales(const DownLaunch& p, cudaStream_t s) {
  if constexpr (kMx) {
    if (p.down_row_scales) return by_regs<kMx, kHBf16, kR, kUnroll, true>(p, s);
  }
  by_regs<kMx, kHBf16, kR, kUnroll, false>(p, s);
}

// (rows, unroll) with rows·unroll <= 16 (src/host/decode.cpp refuses the others).
template <bool kMx, bool kHBf16>
void launch_any(const DownLaunch& p, cudaStream_t s) {
  if (p.down_rows == 16) {
    by_scales<kMx, kHBf16, 16, 1>(p, s);
  } else if (p.down_rows == 8) {
    if (p.down_unroll == 1) by_scales<kMx, kHBf16, 8, 1>(p, s); else by_scales<kMx, kHBf16, 8, 2>(p, s);
  } else {
    switch (p.down_unroll) {
      case 1: by_scales<kMx, kHBf16, 4, 1>(p, s); break;
      case 4: by_scales<kMx, kHBf16, 4, 4>(p, s); break;
      default: by_scales<kMx, kHBf16, 4, 2>(p, s); break;
    }
  }
}

}  // namespace mxmoe::detail::down_sweep

namespace mxmoe::detail {

template <bool kMx, bool kHBf16>
void launch_decode_down_sweep(const DownLaunch& p, cudaStream_t stream) {
  down_sweep::launch_any<kMx, kHBf16>(p, stream);
  MXMOE_CHECK_LAUNCH("decode_down_sweep");
}

}  // namespace mxmoe::detail
