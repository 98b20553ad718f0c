// Element-wise and gather kernels of the MoE layer (include/mxmoe/moe_ops.h).
//   swiglu : h = silu(g)·u per padded row; one thread per 8 outputs (16-byte loads of g and u,
//            16-byte store), grid-stride. Bytes: 4 (read) + 2 (write) per output.
//   combine: out[t] = Σ_j w[t,j]·y[row_of[t,j]] (+ addend); one thread per 8 columns of a token,
//            the k source rows read with 16-byte loads, FP32 sums in slot order, one BF16 store.
//            Bytes: 2·k (read) + 2 (write) per output (+4 with the addend). With k = 1, no
//            weights and an optional device count of used rows it is also moe_gather_rows.
// Both are memory-bound; no atomics; every output has one writer and a fixed summation order.
// Tests: tests/gpu/test_moe_ops_gpu.cpp (against plain loops on the host).
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
    for (int j = 0; j < top_k; ++j) {  // slot order
      const int32_t row = __ldg(row_of + t * top_k + j);
      if (row < 0 || row >= y_rows) continue;
      const float wj = w ? __ldg(w + t * top_k + j) : 1.0f;
      const uint4 q = __ldg(reinterpret_cast<const uint4*>(y + int64_t(row) * cols + c));
      const uint32_t qw[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc[2 * i] = fmaf(wj, bf16_lo(qw[i]), acc[2 * i]);
        acc[2 * i + 1] = fmaf(wj, bf16_hi(qw[i]), acc[2 * i + 1]);
      }
    }
    if (addend) {
      const float4 a0 = __ldg(reinterpret_cast<const float4*>(addend + t * cols + c));
      const float4 a1 = __ldg(reinterpret_cast<const float4*>(addend + t * cols + c + 4));
      acc[0] += a0.x; acc[1] += a0.y; acc[2] += a0.z; acc[3] += a0.w;
      acc[4] += a1.x; acc[5] += a1.y; acc[6] += a1.z; acc[7] += a1.w;
    }
    *reinterpret_cast<uint4*>(out + t * cols + c) =
        make_uint4(pack_bf16x2_rn(acc[0], acc[1]), pack_bf16x2_rn(acc[2], acc[3]), pack_bf16x2_rn(acc[4], acc[5]),
                   pack_bf16x2_rn(acc[6], acc[7]));
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

// One warp per used padded row: dy = bf16(w · dout[t]) and dw[t, j] = dout[t] · y[r].
__global__ void __launch_bounds__(kThreads) combine_backward_kernel(
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
                                 cudaStream_t stream) {
  MXMOE_CUDA_CHECK("moe_combine_backward", cudaMemsetAsync(dw, 0, size_t(tokens * top_k) * sizeof(float), stream));
  const int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;  // one warp per row (capacity)
  combine_backward_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(dout, y, rows, cols, rows_used, row_index,
                                                                     row_of, w, top_k, dy, row_w, dw);
  MXMOE_CHECK_LAUNCH("moe_combine_backward");
}

void launch_moe_swiglu(const uint16_t* gu, int64_t rows, int64_t inter, const int32_t* rows_used, uint16_t* h,
                       cudaStream_t stream) {
  swiglu_kernel<<<grid_for(rows * inter / 8), kThreads, 0, stream>>>(gu, rows, inter, rows_used, h);
  MXMOE_CHECK_LAUNCH("moe_swiglu");
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
