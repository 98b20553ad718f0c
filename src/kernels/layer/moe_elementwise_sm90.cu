// Element-wise and gather kernels of the MoE layer (include/mxmoe/moe_ops.h).
//   swiglu : h = silu(g)·u per padded row; one thread per 8 outputs (16-byte loads of g and u,
//            16-byte store), grid-stride. Bytes: 4 (read) + 2 (write) per output.
//   combine: out[t] = Σ_j w[t,j]·y[row_of[t,j]] (+ addend); one thread per 8 columns of a token,
//            the k source rows read with 16-byte loads, FP32 sums in slot order, one BF16 store.
//            Bytes: 2·k (read) + 2 (write) per output (+4 with the addend).
// Both are memory-bound; no atomics; every output has one writer and a fixed summation order.
// Tests: tests/gpu/test_moe_ops_gpu.cpp (against plain loops on the host).
#include <algorithm>
#include <cstdint>

#include <cuda_bf16.h>

#include "host/check.h"
#include "kernels/layer/moe_ops_launch.h"

namespace mxmoe::detail {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }
__device__ __forceinline__ uint32_t pack_bf16x2(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);  // .x = a (low half)
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

__global__ void __launch_bounds__(kThreads) swiglu_kernel(const uint16_t* __restrict__ gu, int64_t rows,
                                                          int64_t inter, const int32_t* __restrict__ rows_used,
                                                          uint16_t* __restrict__ h) {
  const int64_t used = rows_used ? min(rows, int64_t(__ldg(rows_used))) : rows;
  const int64_t vec_per_row = inter / 8, total = used * vec_per_row;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < total; v += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = v / vec_per_row, c = (v - r * vec_per_row) * 8;
    const uint4 g = __ldg(reinterpret_cast<const uint4*>(gu + r * 2 * inter + c));
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(gu + r * 2 * inter + inter + c));
    const uint32_t gw[4] = {g.x, g.y, g.z, g.w}, uw[4] = {u.x, u.y, u.z, u.w};
    uint32_t o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      o[i] = pack_bf16x2(silu(bf_lo(gw[i])) * bf_lo(uw[i]), silu(bf_hi(gw[i])) * bf_hi(uw[i]));
    *reinterpret_cast<uint4*>(h + r * inter + c) = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

__global__ void __launch_bounds__(kThreads) combine_kernel(const uint16_t* __restrict__ y, int64_t y_rows,
                                                           int64_t cols, const int32_t* __restrict__ row_of,
                                                           const float* __restrict__ w, int64_t tokens, int top_k,
                                                           const float* __restrict__ addend,
                                                           uint16_t* __restrict__ out) {
  const int64_t vec_per_row = cols / 8, total = tokens * vec_per_row;
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
        acc[2 * i] = fmaf(wj, bf_lo(qw[i]), acc[2 * i]);
        acc[2 * i + 1] = fmaf(wj, bf_hi(qw[i]), acc[2 * i + 1]);
      }
    }
    if (addend) {
      const float4 a0 = __ldg(reinterpret_cast<const float4*>(addend + t * cols + c));
      const float4 a1 = __ldg(reinterpret_cast<const float4*>(addend + t * cols + c + 4));
      acc[0] += a0.x; acc[1] += a0.y; acc[2] += a0.z; acc[3] += a0.w;
      acc[4] += a1.x; acc[5] += a1.y; acc[6] += a1.z; acc[7] += a1.w;
    }
    *reinterpret_cast<uint4*>(out + t * cols + c) =
        make_uint4(pack_bf16x2(acc[0], acc[1]), pack_bf16x2(acc[2], acc[3]), pack_bf16x2(acc[4], acc[5]),
                   pack_bf16x2(acc[6], acc[7]));
  }
}

unsigned grid_for(int64_t work) {
  int dev = 0, sms = 132;
  if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return unsigned(std::max<int64_t>(1, std::min<int64_t>(blocks, int64_t(sms) * 8)));
}

}  // namespace

void launch_moe_swiglu(const uint16_t* gu, int64_t rows, int64_t inter, const int32_t* rows_used, uint16_t* h,
                       cudaStream_t stream) {
  swiglu_kernel<<<grid_for(rows * inter / 8), kThreads, 0, stream>>>(gu, rows, inter, rows_used, h);
  MXMOE_CHECK_LAUNCH("moe_swiglu");
}

void launch_moe_combine(const uint16_t* y, int64_t y_rows, int64_t cols, const int32_t* row_of, const float* w,
                        int64_t tokens, int top_k, const float* addend, uint16_t* out, cudaStream_t stream) {
  if (tokens == 0) return;
  combine_kernel<<<grid_for(tokens * cols / 8), kThreads, 0, stream>>>(y, y_rows, cols, row_of, w, tokens, top_k,
                                                                       addend, out);
  MXMOE_CHECK_LAUNCH("moe_combine");
}

}  // namespace mxmoe::detail
