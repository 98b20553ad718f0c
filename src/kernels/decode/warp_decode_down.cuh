// The down projection's pieces (warp_decode_down_sm90.cu, the fused step warp_decode_fused_sm90.cu,
// and the design-space variants warp_decode_down_sweep_sm90.cuh): one warp's dot products of slot j's
// h row with the kR W2 rows n0 .. n0+kR-1 (kR = kRows = 4 unless a variant says otherwise), and the
// routing-weighted sum of the per-slot results in slot order.
// Fixed order: per lane, its 16-byte chunks l, l+32, ... in increasing K, then the xor butterfly;
// out = Σ_j fma(w_j, dot_j, out) for j = 0..S-1 in FP32, one BF16 rounding. kUnroll, kR and
// kRowScales change only when and how loads are issued, never that order. kHCoherent: h is read with
// ordinary (coherent) loads instead of the non-coherent path — required when h was written earlier
// in the same kernel (the fused step). p.ids and p.weights may point to global or shared memory
// (generic loads).
#pragma once
#include <cstdint>

#include "kernels/decode/decode_launch.h"
#include "kernels/decode/warp_decode_common.cuh"
#include "mxmoe/decode.h"
#include "mxmoe/mx_format.h"

namespace mxmoe::detail::down {

constexpr int kRows = 4;  // outputs per tile (rows of W2 per warp and slot)
constexpr int kMaxSlots = kDecodeMaxTopK + 1;
static_assert(8 % kRows == 0, "H % 8 == 0 (host check), so a tile's kRows rows all lie below H");
// Tiles of more than 8 rows can reach past H (H % 8 == 0 only): rows n0 + q >= H are neither loaded
// nor written (`rows` = the tile's rows below H). kChecked (the balanced walk, warp_decode_down_sweep_sm90.cuh):
// any tile may hold fewer than kR rows, so `rows` is checked whatever kR.
template <int kR, bool kChecked = false>
__device__ __forceinline__ bool row_ok(int q, int rows) {
  return (kR <= 8 && !kChecked) || q < rows;
}

// Tile `tile` of the B·T tiles (T = tiles a token, kR outputs each): token b and first output n0.
// Rows order (p.rows_order, default since run 128): n-major, every token's tile n side by side, so the
// tokens that share an expert (and the shared expert) read its rows at the same time and all but the
// first find them in L2; token order (0): b-major. The same per-tile arithmetic, so the same bits.
__device__ __forceinline__ void tile_of(const DownLaunch& p, int tile, int tiles, int kR, int& b, int& n0) {
  const int d = p.rows_order ? p.batch : tiles;  // one division for both orders
  const int q = tile / d, r = tile - q * d;
  b = p.rows_order ? r : q;
  n0 = (p.rows_order ? q : r) * kR;
}

// The kRows rows n0 .. n0+kRows-1 of slot j's W2 block: row q at row + q·row_bytes.
struct SlotRows {
  const uint8_t* row;
  const uint8_t* scales;  // MXFP8: scale row of row n0; row q at scales + q·scale_row
  int64_t row_bytes, scale_row;
};

template <bool kMx>
__device__ __forceinline__ SlotRows slot_rows(const DownLaunch& p, int b, int j, int n0) {
  SlotRows r;
  r.row_bytes = kMx ? int64_t(p.inter) : 2 * int64_t(p.inter);
  r.scale_row = p.inter / kMxBlock;
  const uint8_t* w;
  const uint8_t* s = nullptr;
  if (j < p.top_k) {
    const int64_t e = dev::clamp_expert(p.ids[int64_t(b) * p.top_k + j], p.num_experts);
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

template <bool kHCoherent>
__device__ __forceinline__ uint4 load_h16(const uint8_t* p) {
  if constexpr (kHCoherent) {
    return dev::ld_global_v4(p);
  } else {
    return dev::ldg_v4(p);
  }
}

// Eight h values (elements 8c .. 8c+7) as FP32.
template <bool kHBf16, bool kHCoherent>
__device__ __forceinline__ void load_h8(const void* h_row, int c, float4& a, float4& b) {
  if constexpr (kHBf16) {
    dev::bf16x8_to_f32(load_h16<kHCoherent>(static_cast<const uint8_t*>(h_row) + int64_t(c) * 16), a, b);
  } else {
    const uint8_t* p = static_cast<const uint8_t*>(h_row) + int64_t(c) * 32;
    a = dev::as_float4(load_h16<kHCoherent>(p));
    b = dev::as_float4(load_h16<kHCoherent>(p + 16));
  }
}

// BF16 weights: chunks of 8.
template <bool kHBf16, bool kHCoherent, int kUnroll, int kR = kRows, bool kChecked = false>
__device__ __forceinline__ void dot_rows_bf16(const SlotRows& r, const void* h_row, int inter, int lane,
                                              float (&acc)[kR], int rows = kR) {
  const int nchunks = inter / 8;
  for (int c0 = lane; c0 < nchunks; c0 += 32 * kUnroll) {
    uint4 w[kUnroll][kR];  // 16 B of each row per chunk
#pragma unroll
    for (int t = 0; t < kUnroll; ++t) {
      const int c = c0 + 32 * t;
#pragma unroll
      for (int q = 0; q < kR; ++q) {
        w[t][q] = make_uint4(0u, 0u, 0u, 0u);
        if (c < nchunks && row_ok<kR, kChecked>(q, rows))
          w[t][q] = dev::ldg_stream_v4(r.row + q * r.row_bytes + int64_t(c) * 16);
      }
    }
#pragma unroll
    for (int t = 0; t < kUnroll; ++t) {
      const int c = c0 + 32 * t;
      if (c < nchunks) {
        float4 h0, h1;
        load_h8<kHBf16, kHCoherent>(h_row, c, h0, h1);
#pragma unroll
        for (int q = 0; q < kR; ++q) acc[q] = dev::dot8_bf16_f32(w[t][q], h0, h1, acc[q]);
      }
    }
  }
}

// MXFP8 weights: chunks of 16 E4M3 (scale byte c/2); chunk sum from 0, then exact scaling.
// kRowScales: instead of one byte load per chunk and row, each round (32·kUnroll chunks = 16·kUnroll
// scale bytes of a row) loads the row's scale bytes warp-wide, one byte a lane per 64 chunks, and
// chunk c = base + lane + 32t takes its byte from lane lane/2 + 16·(t mod 2) of load t/2 by a shuffle.
// The shuffles need every lane, so then all lanes run the same rounds (base from 0): a lane past the
// end loads and adds nothing, so its sum is the one the lane-strided loop gives.
// kScaleTable: chunk scales read from `scale_table` (256 floats, 2^(s-127) for each byte s, in shared
// memory) instead of converted by dev::e8m0_to_f32: the same values, fewer instructions.
template <bool kHBf16, bool kHCoherent, int kUnroll, int kR = kRows, bool kRowScales = false,
          bool kChecked = false, bool kScaleTable = false>
__device__ __forceinline__ void dot_rows_mx(const SlotRows& r, const void* h_row, int inter, int lane,
                                            float (&acc)[kR], int rows = kR, const float* scale_table = nullptr) {
  const int nchunks = inter / 16;
  constexpr int kScaleLoads = kRowScales ? (kUnroll + 1) / 2 : kUnroll;  // scale registers per row
  for (int base = kRowScales ? 0 : lane; base < nchunks; base += 32 * kUnroll) {
    const int c0 = kRowScales ? base + lane : base;
    uint4 w[kUnroll][kR];  // 16 E4M3 of each row per chunk
    uint32_t s[kScaleLoads][kR];
#pragma unroll
    for (int t = 0; t < kUnroll; ++t) {
      const int c = c0 + 32 * t;
#pragma unroll
      for (int q = 0; q < kR; ++q) {
        w[t][q] = make_uint4(0u, 0u, 0u, 0u);
        if constexpr (!kRowScales) s[t][q] = 0u;
        if (c < nchunks && row_ok<kR, kChecked>(q, rows)) {
          w[t][q] = dev::ldg_stream_v4(r.row + q * r.row_bytes + int64_t(c) * 16);
          if constexpr (!kRowScales) s[t][q] = dev::ldg_u8(r.scales + q * r.scale_row + c / 2);
        }
      }
    }
    if constexpr (kRowScales) {
#pragma unroll
      for (int m = 0; m < kScaleLoads; ++m) {
        const int sb = base / 2 + 32 * m + lane;  // scale byte of chunks 2·sb, 2·sb + 1
#pragma unroll
        for (int q = 0; q < kR; ++q) {
          s[m][q] = 0u;
          if (sb < r.scale_row && row_ok<kR, kChecked>(q, rows)) s[m][q] = dev::ldg_u8(r.scales + q * r.scale_row + sb);
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kUnroll; ++t) {
      const int c = c0 + 32 * t;
      uint32_t sc[kR];  // chunk c's scale byte per row
#pragma unroll
      for (int q = 0; q < kR; ++q) {
        if constexpr (kRowScales) {
          sc[q] = __shfl_sync(dev::kFullMask, s[t / 2][q], (lane >> 1) + 16 * (t & 1));
        } else {
          sc[q] = s[t][q];
        }
      }
      if (c < nchunks) {
        float4 h[4];
        load_h8<kHBf16, kHCoherent>(h_row, 2 * c, h[0], h[1]);
        load_h8<kHBf16, kHCoherent>(h_row, 2 * c + 1, h[2], h[3]);
#pragma unroll
        for (int q = 0; q < kR; ++q)
          acc[q] = fmaf(dev::dot16_e4m3_f32(w[t][q], h), kScaleTable ? scale_table[sc[q]] : dev::e8m0_to_f32(sc[q]),
                        acc[q]);
      }
    }
  }
}

// Slot j's dot products for the outputs n0 .. n0+kR-1 of token b, on every lane (rows n0 + q >= H,
// possible only for kR > 8, are not loaded; their acc is meaningless and never written). kChecked: only
// the first `rows` rows are loaded (the balanced walk's tiles; rows <= H - n0).
template <bool kMx, bool kHBf16, bool kHCoherent, int kUnroll, int kR = kRows, bool kRowScales = false,
          bool kChecked = false, bool kScaleTable = false>
__device__ __forceinline__ void slot_dots(const DownLaunch& p, int b, int j, int n0, int lane, float (&acc)[kR],
                                          int rows = kR, const float* scale_table = nullptr) {
  const SlotRows w_rows = slot_rows<kMx>(p, b, j, n0);
  const size_t h_elem = kHBf16 ? 2 : 4;
  const void* h_row =
      static_cast<const uint8_t*>(p.h) + ((int64_t(b) * p.slots + j) * p.inter) * int64_t(h_elem);
  const int valid = kChecked ? rows : kR <= 8 ? kR : p.hidden - n0;
#pragma unroll
  for (int q = 0; q < kR; ++q) acc[q] = 0.0f;
  if constexpr (kMx) {
    dot_rows_mx<kHBf16, kHCoherent, kUnroll, kR, kRowScales, kChecked, kScaleTable>(w_rows, h_row, p.inter, lane, acc,
                                                                                   valid, scale_table);
  } else {
    dot_rows_bf16<kHBf16, kHCoherent, kUnroll, kR, kChecked>(w_rows, h_row, p.inter, lane, acc, valid);
  }
#pragma unroll
  for (int q = 0; q < kR; ++q) acc[q] = dev::warp_sum(acc[q]);
}

// out[b, n0 + q] from the per-slot dot products dots[j][q] (j = 0..S-1), summed in slot order with
// the routing weights (1 for the shared expert), rounded to BF16 once.
template <int kR = kRows>
__device__ __forceinline__ void combine(const DownLaunch& p, int b, int n0, int q, const float (*dots)[kR]) {
  const int n = n0 + q;
  if (n >= p.hidden) return;
  float out = 0.0f;
  for (int j = 0; j < p.slots; ++j) {
    const float wj = j < p.top_k ? p.weights[int64_t(b) * p.top_k + j] : 1.0f;
    out = fmaf(wj, dots[j][q], out);
  }
  p.out[int64_t(b) * p.hidden + n] = dev::f32_to_bf16_bits(out);
}

}  // namespace mxmoe::detail::down
