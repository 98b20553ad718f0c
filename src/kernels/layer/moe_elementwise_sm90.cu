// Element-wise and gather kernels of the MoE layer (include/mxmoe/moe_ops.h).
//   swiglu : h = silu(g)·u per padded row; one thread per 8 outputs (16-byte loads of g and u,
//            16-byte store), grid-stride. Bytes: 4 (read) + 2 (write) per output.
//   combine: out[t] = Σ_j w[t,j]·y[row_of[t,j]] (+ addend); one thread per 8 columns of a token,
//            the k source rows read with 16-byte loads, FP32 sums in slot order, one BF16 store.
//            Bytes: 2·k (read) + 2 (write) per output (+4 with the addend). With k = 1, no
//            weights and an optional device count of used rows it is also moe_gather_rows.
//            The layers' un-permute variant computes the addend (the router's part of dX,
//            Σ_e dlogits·Wr) in place: combine_router_dgrad_kernel.
//   combine backward: dw[t,j] = dout[t]·y[row_of[t,j]] (FP32), and per used padded row r either
//            dy[r] = bf16(w[t,j]·dout[t]) or row_w[r] = w[t,j] (0 for pads). Token-major by
//            default (one warp per token: dout[t] read once for its k rows); the row-major kernel
//            (one warp per row, dout[t] read k times) stays selectable (MXMOE_COMBINE_BWD=rows)
//            and gives the same bits. Bytes (token-major, row_w form): 2·cols per used row (y)
//            + 2·cols per token (dout); +2·cols per used row written in the dy form.
// All are memory-bound; no atomics; every output has one writer and a fixed summation order.
// Tests: tests/gpu/test_moe_ops_gpu.cpp (against plain loops on the host, and token- vs row-major).
#include <algorithm>
#include <cstdint>

#include <cuda_bf16.h>

#include "device/mx_convert.cuh"
#include "host/check.h"
#include "kernels/layer/moe_ops_launch.h"

namespace mxmoe::detail {
namespace {

constexpr int kThreads = 256;

// BF16 pairs in a 32-bit word (low half first); packing rounds to nearest even. The quantizer's
// fused dY (quantize_mxfp8_gather_scaled) uses the same helpers, so both give the same bits.
using dev::bf16_hi;
using dev::bf16_lo;
using dev::pack_bf16x2_rn;
// Grid-stride walk over the 8-element vectors of the used rows ([rows, inter], rows at or beyond
// *rows_used skipped) of the SwiGLU kernels.
__device__ __forceinline__ int64_t used_vecs(int64_t rows, int64_t inter, const int32_t* rows_used) {
  const int64_t used = rows_used ? min(rows, int64_t(__ldg(rows_used))) : rows;
  return used * (inter / 8);
}
__device__ __forceinline__ int64_t first_vec() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t vec_stride() { return int64_t(gridDim.x) * blockDim.x; }

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

__global__ void __launch_bounds__(kThreads) swiglu_kernel(const uint16_t* __restrict__ gu, int64_t rows,
                                                          int64_t inter, const int32_t* __restrict__ rows_used,
                                                          uint16_t* __restrict__ h) {
  const int64_t total = used_vecs(rows, inter, rows_used);
  for (int64_t v = first_vec(); v < total; v += vec_stride()) {
    const int64_t r = v / (inter / 8), c = (v - r * (inter / 8)) * 8;
    const uint4 g = __ldg(reinterpret_cast<const uint4*>(gu + r * 2 * inter + c));
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(gu + r * 2 * inter + inter + c));
    const uint32_t gw[4] = {g.x, g.y, g.z, g.w}, uw[4] = {u.x, u.y, u.z, u.w};
    uint32_t o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      o[i] = pack_bf16x2_rn(silu(bf16_lo(gw[i])) * bf16_lo(uw[i]), silu(bf16_hi(gw[i])) * bf16_hi(uw[i]));
    *reinterpret_cast<uint4*>(h + r * inter + c) = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

// The slot sum of token t at columns c..c+7: acc[i] = fmaf(w[t, j], y[row_of[t, j], c + i], acc[i])
// for j = 0, 1, ..., top_k - 1 (weight 1 when w is null), skipping slots whose row is outside
// [0, y_rows). The rows are read kSlotBatch at a time, so that several loads are in flight.
constexpr int kSlotBatch = 4;
__device__ __forceinline__ void add_slots(float (&acc)[8], const uint16_t* __restrict__ y, int64_t y_rows,
                                          int64_t cols, const int32_t* __restrict__ row_of,
                                          const float* __restrict__ w, int64_t t, int top_k, int64_t c) {
  for (int j0 = 0; j0 < top_k; j0 += kSlotBatch) {  // slot order
    uint4 q[kSlotBatch];
    float wq[kSlotBatch];
    bool ok[kSlotBatch];
#pragma unroll
    for (int s = 0; s < kSlotBatch; ++s) {
      const int j = j0 + s;
      const int32_t row = j < top_k ? __ldg(row_of + t * top_k + j) : -1;
      ok[s] = row >= 0 && row < y_rows;
      wq[s] = ok[s] && w ? __ldg(w + t * top_k + j) : 1.0f;
      q[s] = ok[s] ? __ldg(reinterpret_cast<const uint4*>(y + int64_t(row) * cols + c)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int s = 0; s < kSlotBatch; ++s) {
      if (!ok[s]) continue;
      const uint32_t qw[4] = {q[s].x, q[s].y, q[s].z, q[s].w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc[2 * i] = fmaf(wq[s], bf16_lo(qw[i]), acc[2 * i]);
        acc[2 * i + 1] = fmaf(wq[s], bf16_hi(qw[i]), acc[2 * i + 1]);
      }
    }
  }
}

__device__ __forceinline__ void store_bf16x8(uint16_t* p, const float (&v)[8]) {
  *reinterpret_cast<uint4*>(p) = make_uint4(pack_bf16x2_rn(v[0], v[1]), pack_bf16x2_rn(v[2], v[3]),
                                            pack_bf16x2_rn(v[4], v[5]), pack_bf16x2_rn(v[6], v[7]));
}

__global__ void __launch_bounds__(kThreads) combine_kernel(const uint16_t* __restrict__ y, int64_t y_rows,
                                                           int64_t cols, const int32_t* __restrict__ row_of,
                                                           const float* __restrict__ w, int64_t tokens, int top_k,
                                                           const float* __restrict__ addend,
                                                           const int32_t* __restrict__ tokens_used,
                                                           uint16_t* __restrict__ out) {
  const int64_t used = tokens_used ? min(tokens, int64_t(__ldg(tokens_used))) : tokens;
  const int64_t vec_per_row = cols / 8, total = used * vec_per_row;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < total; v += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = v / vec_per_row, c = (v - t * vec_per_row) * 8;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    add_slots(acc, y, y_rows, cols, row_of, w, t, top_k, c);
    if (addend) {
      const float4 a0 = __ldg(reinterpret_cast<const float4*>(addend + t * cols + c));
      const float4 a1 = __ldg(reinterpret_cast<const float4*>(addend + t * cols + c + 4));
      acc[0] += a0.x; acc[1] += a0.y; acc[2] += a0.z; acc[3] += a0.w;
      acc[4] += a1.x; acc[5] += a1.y; acc[6] += a1.z; acc[7] += a1.w;
    }
    store_bf16x8(out + t * cols + c, acc);
  }
}

// ---- un-permute with the router's part of dX computed in place ---------------------------------
//
// out[t, n] = bf16(Σ_j w[t, j]·y[row_of[t, j], n]  +  r[t, n]),  r[t, n] = Σ_e dl[t, e]·wr[e, n]
// with r one fmaf chain over e = 0, 1, ..., E-1 from +0 — launch_router_dgrad_fixed's definition,
// fmaf(dl, wr, acc) with the same operands — and the slot sum add_slots' (combine_kernel's), then
// one FP32 add as combine_kernel's addend: the bits of launch_router_dgrad_fixed + launch_moe_combine
// without the FP32 [T, H] between them. dl FP32 [T, E]; wr BF16 [E, cols], 16-byte aligned rows.
// A CTA of 256 threads owns kCrTokens · 8 tokens × 256 columns: warp w tokens
// kCrTokens·(8·group + w) + r, lane l columns 8l..8l+7 of the slab. Per e a thread reads one 16-byte
// wr vector (L1: the CTA's 8 warps read the same E × 512 B) and kCrTokens broadcast dl values, and
// does 8 conversions + 8·kCrTokens fmaf; then per token the slot sum as combine_kernel. Registers:
// 8·kCrTokens router sums + one batch of kSlotBatch row vectors.
constexpr int kCrTokens = 4, kCrCols = 256;
static_assert(kCrCols == 32 * 8, "a lane owns 8 columns of the slab");

__global__ void __launch_bounds__(kThreads) combine_router_dgrad_kernel(
    const uint16_t* __restrict__ y, int64_t y_rows, int64_t cols, const int32_t* __restrict__ row_of,
    const float* __restrict__ w, int64_t tokens, int top_k, const float* __restrict__ dl,
    const uint16_t* __restrict__ wr, int E, uint16_t* __restrict__ out) {
  const int64_t slabs = (cols + kCrCols - 1) / kCrCols;
  const int64_t group = int64_t(blockIdx.x) / slabs, slab = int64_t(blockIdx.x) - group * slabs;
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int64_t c = slab * kCrCols + lane * 8;
  const int64_t t0 = (group * (kThreads / 32) + warp) * kCrTokens;
  if (c >= cols || t0 >= tokens) return;  // no barriers or shuffles below
  const float* dlr[kCrTokens];  // dl rows (the last token's past the end: read, never stored)
#pragma unroll
  for (int r = 0; r < kCrTokens; ++r) dlr[r] = dl + min(t0 + r, tokens - 1) * E;
  float rt[kCrTokens][8] = {};  // the router's part, [token][column]
#pragma unroll 2
  for (int e = 0; e < E; ++e) {
    const uint4 wv = __ldg(reinterpret_cast<const uint4*>(wr + int64_t(e) * cols + c));  // [8] bf16
    const float wf[8] = {bf16_lo(wv.x), bf16_hi(wv.x), bf16_lo(wv.y), bf16_hi(wv.y),
                         bf16_lo(wv.z), bf16_hi(wv.z), bf16_lo(wv.w), bf16_hi(wv.w)};
#pragma unroll
    for (int r = 0; r < kCrTokens; ++r) {
      const float d = __ldg(dlr[r] + e);
#pragma unroll
      for (int i = 0; i < 8; ++i) rt[r][i] = fmaf(d, wf[i], rt[r][i]);
    }
  }
#pragma unroll
  for (int r = 0; r < kCrTokens; ++r) {
    const int64_t t = t0 + r;
    if (t >= tokens) break;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    add_slots(acc, y, y_rows, cols, row_of, w, t, top_k, c);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] += rt[r][i];
    store_bf16x8(out + t * cols + c, acc);
  }
}

__device__ __forceinline__ float dsilu(float g) {
  const float sg = 1.0f / (1.0f + expf(-g));
  return sg * (1.0f + g * (1.0f - sg));
}

__global__ void __launch_bounds__(kThreads) swiglu_backward_kernel(const uint16_t* __restrict__ gu,
                                                                   const uint16_t* __restrict__ dh, int64_t rows,
                                                                   int64_t inter, const int32_t* __restrict__ rows_used,
                                                                   uint16_t* __restrict__ dgu) {
  const int64_t total = used_vecs(rows, inter, rows_used);
  for (int64_t v = first_vec(); v < total; v += vec_stride()) {
    const int64_t r = v / (inter / 8), c = (v - r * (inter / 8)) * 8;
    const uint4 g = __ldg(reinterpret_cast<const uint4*>(gu + r * 2 * inter + c));
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(gu + r * 2 * inter + inter + c));
    const uint4 d = __ldg(reinterpret_cast<const uint4*>(dh + r * inter + c));
    const uint32_t gw[4] = {g.x, g.y, g.z, g.w}, uw[4] = {u.x, u.y, u.z, u.w}, dw[4] = {d.x, d.y, d.z, d.w};
    uint32_t og[4], ou[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float g0 = bf16_lo(gw[i]), g1 = bf16_hi(gw[i]), u0 = bf16_lo(uw[i]), u1 = bf16_hi(uw[i]);
      const float d0 = bf16_lo(dw[i]), d1 = bf16_hi(dw[i]);
      og[i] = pack_bf16x2_rn(d0 * u0 * dsilu(g0), d1 * u1 * dsilu(g1));
      ou[i] = pack_bf16x2_rn(d0 * silu(g0), d1 * silu(g1));
    }
    *reinterpret_cast<uint4*>(dgu + r * 2 * inter + c) = make_uint4(og[0], og[1], og[2], og[3]);
    *reinterpret_cast<uint4*>(dgu + r * 2 * inter + inter + c) = make_uint4(ou[0], ou[1], ou[2], ou[3]);
  }
}

// Row-major combine backward (MXMOE_COMBINE_BWD=rows), kept for one release for same-process
// A/B: one warp per used padded row: dy = bf16(w · dout[t]) and dw[t, j] = dout[t] · y[r]; dw is
// zeroed by a memset before it. Each lane sums its vectors v = lane, lane + 32, ... in increasing
// order (8 fmaf each, element order), then a fixed xor butterfly; the token-major kernel below
// replays exactly this per (t, j).
__global__ void __launch_bounds__(kThreads) combine_backward_rows_kernel(
    const uint16_t* __restrict__ dout, const uint16_t* __restrict__ y, int64_t rows, int64_t cols,
    const int32_t* __restrict__ rows_used, const int32_t* __restrict__ row_index, const int32_t* __restrict__ row_of,
    const float* __restrict__ w, int top_k, uint16_t* __restrict__ dy, float* __restrict__ row_w,
    float* __restrict__ dw) {
  const int lane = threadIdx.x % 32;
  const int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int64_t used = rows_used ? min(rows, int64_t(__ldg(rows_used))) : rows;
  if (r >= used) return;  // whole warp
  const int64_t vec_per_row = cols / 8;
  uint16_t* dyr = dy + r * cols;
  const int32_t t = __ldg(row_index + r);
  int j = -1;
  if (t >= 0)
    for (int q = 0; q < top_k; ++q)
      if (__ldg(row_of + int64_t(t) * top_k + q) == r) j = q;
  if (j < 0) {  // padding (or a row no slot points at)
    if (dy != nullptr)
      for (int64_t v = lane; v < vec_per_row; v += 32) *reinterpret_cast<uint4*>(dyr + v * 8) = make_uint4(0, 0, 0, 0);
    if (row_w != nullptr && lane == 0) row_w[r] = 0.0f;
    return;
  }
  const float wj = __ldg(w + int64_t(t) * top_k + j);
  if (row_w != nullptr && lane == 0) row_w[r] = wj;  // dY = bf16(row_w · dout) is formed by the quantizer
  const uint16_t* dot = dout + int64_t(t) * cols;
  const uint16_t* yr = y + r * cols;
  float acc = 0.0f;
  for (int64_t v = lane; v < vec_per_row; v += 32) {  // per lane in increasing column order
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(dot + v * 8));
    const uint4 b = __ldg(reinterpret_cast<const uint4*>(yr + v * 8));
    const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
    uint32_t o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc = fmaf(bf16_lo(aw[i]), bf16_lo(bw[i]), acc);
      acc = fmaf(bf16_hi(aw[i]), bf16_hi(bw[i]), acc);
      o[i] = pack_bf16x2_rn(wj * bf16_lo(aw[i]), wj * bf16_hi(aw[i]));
    }
    if (dy != nullptr) *reinterpret_cast<uint4*>(dyr + v * 8) = make_uint4(o[0], o[1], o[2], o[3]);
  }
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, o);  // fixed butterfly
  if (lane == 0) dw[int64_t(t) * top_k + j] = acc;
}

// ---- token-major combine backward (the default) ------------------------------------------------
//
// Blocks [0, token_blocks): one warp per token t. Lane q < k reads slot q (row_of[t, q]) and decides
// whether it is live; dout[t] is then streamed once per pass of up to kSlotsPerPass live slots
// (one pass when k <= 8), each lane holding one FP32 accumulator per slot, and the k rows
// y[row_of[t, j]] are read against it. Blocks from token_blocks on: one thread per padded row
// r < used, zeroing the rows no live slot owns (row_w = 0, or the dy row by its warp).
//
// Same bits as the row-major kernel (combine_backward_rows_kernel):
// - dw[t, j]: lane l of the token's warp sums, for slot j, exactly the products the row-major
//   warp's lane l sums — vectors v = l, l + 32, ... in increasing order, inside a vector the 8
//   elements in order, acc = fmaf(dout, y, acc) from +0 — because both kernels give lane l the same
//   v sequence and slot j's chain only ever touches acc[s] of its own slot (other slots' fmas in
//   between change nothing in it). Then the same xor butterfly (16, 8, 4, 2, 1) on the same 32 lane
//   values, and lane 0 stores. A pass boundary (k > 8) only re-reads dout; no chain spans passes.
// - dy[r] = pack_bf16x2_rn(w[t, j] · dout[t, n]) and row_w[r] = w[t, j]: the same float w, the same
//   product and rounding.
// - Which rows and slots are written: the row-major warp of row r < used takes t = row_index[r]
//   and the last slot j with row_of[t, j] == r; without one (t < 0, or no slot names r) it zeroes
//   row r, and dw keeps the memset's +0. Here slot q of token t is live iff r = row_of[t, q]
//   satisfies 0 <= r < used, row_index[r] == t and no later slot of t names r — the same (r, j)
//   pairs; a live slot writes dw[t, q] and row r, every other slot of t < tokens writes dw = +0
//   (the memset's value), and the pad pass zeroes exactly the rows r < used for which no such
//   pair exists (t outside [0, tokens) or no slot of t naming r). Rows >= used: never written.
//   One difference: row_index[r] >= tokens made the row-major kernel read row_of past its end;
//   here such a row is a pad.
// Registers: kSlotsPerPass 16-byte y vectors + 8 accumulators (+ 8 weights in the dy form) per
// lane, checked with -Xptxas -v (no spills).
constexpr int kSlotsPerPass = 8;
constexpr uint32_t kFullWarp = 0xFFFFFFFFu;
static_assert(kThreads % 32 == 0, "whole warps per block");

struct CombineBwdParams {
  const uint16_t* dout;       // [tokens, cols] bf16
  const uint16_t* y;          // [rows, cols] bf16
  int64_t rows, cols, tokens;
  const int32_t* rows_used;   // device scalar or null (all rows)
  const int32_t* row_index;   // [rows]
  const int32_t* row_of;      // [tokens, top_k]
  const float* w;             // [tokens, top_k]
  int top_k;
  uint16_t* dy;               // [rows, cols] bf16 (dy form)
  float* row_w;               // [rows] (row_w form)
  float* dw;                  // [tokens, top_k]
};

// One pass over dout[t] for the live slots in `pending` (lane-uniform), at most kSlotsPerPass of
// them, lowest slot first; returns the slots still pending. r, wq: lane q's slot row and weight.
template <bool kDy>
__device__ __forceinline__ uint32_t token_pass(const CombineBwdParams& p, int64_t t, int lane, uint32_t pending,
                                               int32_t r, float wq) {
  const int64_t vec_per_row = p.cols / 8;
  int64_t off[kSlotsPerPass];  // row · cols of each slot of the pass (y and dy share the layout)
  float wgt[kSlotsPerPass];
  int slot[kSlotsPerPass];
  int n = 0;
#pragma unroll
  for (int s = 0; s < kSlotsPerPass; ++s) {  // compact the pass's slots into registers
    const int q = __ffs(pending) - 1;        // -1 once none is left (then unused)
    off[s] = int64_t(__shfl_sync(kFullWarp, r, q & 31)) * p.cols;
    wgt[s] = __shfl_sync(kFullWarp, wq, q & 31);
    slot[s] = q;
    if (pending != 0) {
      ++n;
      pending &= pending - 1;
    }
  }
  const uint16_t* dot = p.dout + t * p.cols;
  float acc[kSlotsPerPass];
#pragma unroll
  for (int s = 0; s < kSlotsPerPass; ++s) acc[s] = 0.0f;
  for (int64_t v = lane; v < vec_per_row; v += 32) {  // per lane in increasing column order
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(dot + v * 8));
    uint4 b[kSlotsPerPass];
#pragma unroll
    for (int s = 0; s < kSlotsPerPass; ++s)  // all the pass's loads first: k + 1 in flight per lane
      if (s < n) b[s] = __ldg(reinterpret_cast<const uint4*>(p.y + off[s] + v * 8));
    const uint32_t aw[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int s = 0; s < kSlotsPerPass; ++s) {
      if (s >= n) continue;
      const uint32_t bw[4] = {b[s].x, b[s].y, b[s].z, b[s].w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc[s] = fmaf(bf16_lo(aw[i]), bf16_lo(bw[i]), acc[s]);
        acc[s] = fmaf(bf16_hi(aw[i]), bf16_hi(bw[i]), acc[s]);
      }
      if constexpr (kDy) {
        uint32_t o[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) o[i] = pack_bf16x2_rn(wgt[s] * bf16_lo(aw[i]), wgt[s] * bf16_hi(aw[i]));
        *reinterpret_cast<uint4*>(p.dy + off[s] + v * 8) = make_uint4(o[0], o[1], o[2], o[3]);
      }
    }
  }
#pragma unroll
  for (int s = 0; s < kSlotsPerPass; ++s) {
    if (s >= n) continue;
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) acc[s] += __shfl_xor_sync(kFullWarp, acc[s], o);  // fixed butterfly
    if (lane == 0) p.dw[t * p.top_k + slot[s]] = acc[s];
  }
  return pending;
}

// The whole warp of token t (t < tokens).
template <bool kDy>
__device__ __forceinline__ void combine_backward_token(const CombineBwdParams& p, int64_t t, int lane,
                                                       int64_t used) {
  int32_t r = -1;  // lanes >= top_k hold -1: never live
  if (lane < p.top_k) r = __ldg(p.row_of + t * p.top_k + lane);
  bool live = r >= 0 && r < used && __ldg(p.row_index + r) == t;
  // The last slot naming a row keeps it (the row-major scan keeps its last match): no higher lane
  // with the same r.
  const uint32_t same = __match_any_sync(kFullWarp, r);
  live = live && (same >> lane) == 1u;
  float wq = 0.0f;
  if (live) {
    wq = __ldg(p.w + t * p.top_k + lane);
    if constexpr (!kDy) p.row_w[r] = wq;  // dY = bf16(row_w · dout) is formed by the quantizer
  } else if (lane < p.top_k) {
    p.dw[t * p.top_k + lane] = 0.0f;  // the row-major path's memset value
  }
  uint32_t pending = __ballot_sync(kFullWarp, live);
  while (pending != 0) pending = token_pass<kDy>(p, t, lane, pending, r, wq);
}

// Thread of padded row r (all 32 lanes of the warp arrive): zero row r when r < used and no live
// slot owns it.
template <bool kDy>
__device__ __forceinline__ void combine_backward_pad(const CombineBwdParams& p, int64_t r, int lane, int64_t used) {
  bool pad = false;
  if (r < used) {
    const int32_t t = __ldg(p.row_index + r);
    bool owned = false;
    if (t >= 0 && t < p.tokens)
      for (int q = 0; q < p.top_k; ++q) owned |= __ldg(p.row_of + int64_t(t) * p.top_k + q) == r;
    pad = !owned;
  }
  if constexpr (!kDy) {
    if (pad) p.row_w[r] = 0.0f;
  } else {
    const int64_t vec_per_row = p.cols / 8;
    for (uint32_t pads = __ballot_sync(kFullWarp, pad); pads != 0; pads &= pads - 1) {  // the warp zeroes each
      uint16_t* dyr = p.dy + (r - lane + __ffs(pads) - 1) * p.cols;
      for (int64_t v = lane; v < vec_per_row; v += 32) *reinterpret_cast<uint4*>(dyr + v * 8) = make_uint4(0, 0, 0, 0);
    }
  }
}

template <bool kDy>
__global__ void __launch_bounds__(kThreads, kDy ? 2 : 3) combine_backward_tokens_kernel(const CombineBwdParams p,
                                                                           int64_t token_blocks) {
  const int64_t used = p.rows_used ? min(p.rows, int64_t(__ldg(p.rows_used))) : p.rows;
  const int lane = threadIdx.x % 32;
  if (int64_t(blockIdx.x) < token_blocks) {
    const int64_t t = (int64_t(blockIdx.x) * kThreads + threadIdx.x) / 32;
    if (t < p.tokens) combine_backward_token<kDy>(p, t, lane, used);  // whole warp
  } else {
    combine_backward_pad<kDy>(p, (int64_t(blockIdx.x) - token_blocks) * kThreads + threadIdx.x, lane, used);
  }
}

__global__ void __launch_bounds__(kThreads) bf16_to_f32_kernel(const uint16_t* __restrict__ x, int64_t n,
                                                               float* __restrict__ y) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __uint_as_float(uint32_t(x[i]) << 16);
}

unsigned grid_for(int64_t work) {
  static const int sms = [] {  // looked up once (all H100/H200 parts have the same count per device)
    int dev = 0, n = 132;
    if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    return n;
  }();
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return unsigned(std::max<int64_t>(1, std::min<int64_t>(blocks, int64_t(sms) * 8)));
}

}  // namespace

void launch_bf16_to_f32(const uint16_t* x, int64_t n, float* y, cudaStream_t stream) {
  if (n == 0) return;
  bf16_to_f32_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, n, y);
  MXMOE_CHECK_LAUNCH("bf16_to_f32");
}

void launch_moe_swiglu_backward(const uint16_t* gu, const uint16_t* dh, int64_t rows, int64_t inter,
                                const int32_t* rows_used, uint16_t* dgu, cudaStream_t stream) {
  swiglu_backward_kernel<<<grid_for(rows * inter / 8), kThreads, 0, stream>>>(gu, dh, rows, inter, rows_used, dgu);
  MXMOE_CHECK_LAUNCH("moe_swiglu_backward");
}

void launch_moe_combine_backward(const uint16_t* dout, const uint16_t* y, int64_t rows, int64_t cols,
                                 const int32_t* rows_used, const int32_t* row_index, const int32_t* row_of,
                                 const float* w, int64_t tokens, int top_k, uint16_t* dy, float* row_w, float* dw,
                                 CombineBackwardKernel kernel, cudaStream_t stream) {
  if (kernel == CombineBackwardKernel::kRows) {
    MXMOE_CUDA_CHECK("moe_combine_backward", cudaMemsetAsync(dw, 0, size_t(tokens * top_k) * sizeof(float), stream));
    const int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;  // one warp per row (capacity)
    combine_backward_rows_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(dout, y, rows, cols, rows_used,
                                                                            row_index, row_of, w, top_k, dy, row_w, dw);
    MXMOE_CHECK_LAUNCH("moe_combine_backward");
    return;
  }
  // One warp per token, then one thread per padded row (capacity) for the pads; every dw[t, j] is
  // written, so no memset.
  const CombineBwdParams p{dout, y, rows, cols, tokens, rows_used, row_index, row_of, w, top_k, dy, row_w, dw};
  const int64_t token_blocks = (tokens * 32 + kThreads - 1) / kThreads;
  const int64_t blocks = token_blocks + (rows + kThreads - 1) / kThreads;
  if (dy != nullptr)
    combine_backward_tokens_kernel<true><<<unsigned(blocks), kThreads, 0, stream>>>(p, token_blocks);
  else
    combine_backward_tokens_kernel<false><<<unsigned(blocks), kThreads, 0, stream>>>(p, token_blocks);
  MXMOE_CHECK_LAUNCH("moe_combine_backward");
}

void launch_moe_swiglu(const uint16_t* gu, int64_t rows, int64_t inter, const int32_t* rows_used, uint16_t* h,
                       cudaStream_t stream) {
  swiglu_kernel<<<grid_for(rows * inter / 8), kThreads, 0, stream>>>(gu, rows, inter, rows_used, h);
  MXMOE_CHECK_LAUNCH("moe_swiglu");
}

// Where the router's part of dX is made (docs/notes/layer.md "Router backward without FP32 round
// trips"). In the un-permute it costs E fmaf per output element and saves the separate kernel's
// 4-byte store and the combine's 4-byte load (8 B per element) — but the separate dgrad does the
// same E fmaf (CUDA-core SGEMM or the fixed-order kernel), so folding is never worse in bytes;
// what can go wrong is the un-permute turning from memory-bound into issue-bound. Per warp and
// expert the fused kernel issues ~45 instructions (1 wr load, kCrTokens = 4 dl loads, 8
// conversions, 32 FMA) for 1024 element-FMAs: at 4 issues / clock / SM, 132 SMs, 1.98 GHz that is
// E · 4.2e-14 s per element, against (2k + 2) B · 2.5e-13 s/B (4 TB/s) of the combine's own
// traffic (k BF16 rows in, one BF16 row out). Hidden entirely while E <= 5.9 · (2k + 2); with a
// 1.5x margin for latency the rule is E <= 4 · (2k + 2): DSV3-EP8-local (E = 32, k = 8) and
// Qwen3 at k = 8 up to E = 72 fold; E = 128 (Qwen3) and 256 (DeepSeek-V3) keep the separate kernel.
bool router_dgrad_in_combine(int experts, int top_k) { return experts <= 4 * (2 * top_k + 2); }

void launch_moe_combine_router_dgrad(const uint16_t* y, int64_t y_rows, int64_t cols, const int32_t* row_of,
                                     const float* w, int64_t tokens, int top_k, const float* dlogits,
                                     const uint16_t* wr, int experts, uint16_t* out, cudaStream_t stream) {
  if (tokens == 0) return;
  const int64_t slabs = (cols + kCrCols - 1) / kCrCols, tokens_per_cta = int64_t(kThreads / 32) * kCrTokens;
  const int64_t blocks = (tokens + tokens_per_cta - 1) / tokens_per_cta * slabs;
  combine_router_dgrad_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(y, y_rows, cols, row_of, w, tokens, top_k,
                                                                         dlogits, wr, experts, out);
  MXMOE_CHECK_LAUNCH("moe_combine (router dgrad in place)");
}

void launch_moe_combine(const uint16_t* y, int64_t y_rows, int64_t cols, const int32_t* row_of, const float* w,
                        int64_t tokens, int top_k, const float* addend, const int32_t* tokens_used, uint16_t* out,
                        cudaStream_t stream) {
  if (tokens == 0) return;
  combine_kernel<<<grid_for(tokens * cols / 8), kThreads, 0, stream>>>(y, y_rows, cols, row_of, w, tokens, top_k,
                                                                       addend, tokens_used, out);
  MXMOE_CHECK_LAUNCH("moe_combine");
}

}  // namespace mxmoe::detail
