// Router GEMMs whose per-token result does not depend on the number of tokens ("batch-invariant"),
// for a layer that must give the same bits on T/R tokens as on T (the EP layer and the single-GPU
// layer it is compared with; MoeLayerConfig::batch_invariant_router). cuBLAS may pick another
// algorithm (tile shape, split-K, stream-K) for another T, and with it another summation order.
//
//   logits:  C[t, e] = Σ_h x[t, h] · wr[e, h]        x BF16 [T, H], wr BF16 [E, H], C FP32 [T, E]
//   dgrad:   C[t, h] = Σ_e dl[t, e] · wr[e, h]       dl FP32 [T, E], wr BF16 [E, H], C FP32 [T, H]
//
// Every output is one thread's FP32 sum, fmaf in increasing k (h, resp. e) order from 0, whatever
// the tile it falls in: the result is a function of its own row and column only. BF16 → FP32 is
// exact. CUDA-core FP32: tiles of 64 × 64 outputs, 256 threads of 4 × 4 outputs, k-slabs of 16
// through shared memory. Roofline: 2·T·E·H FLOPs; this is a plain tiled SGEMM (a few ms at
// DeepSeek-V3 shapes, T = 16384: the price of the guarantee; a tensor-core version whose
// per-element order is also fixed is the follow-up, docs/notes/ep.md).
// Tests: tests/ep/ep_layer_test.cu (EP layer bitwise against MoeLayer with this flag).
#include <cstdint>

#include "host/check.h"
#include "kernels/layer/moe_ops_launch.h"

namespace mxmoe::detail {
namespace {

constexpr int kBM = 64, kBN = 64, kBK = 16, kThreads = 256;
static_assert(kThreads == (kBM / 4) * (kBN / 4), "a thread owns 4 × 4 outputs");
static_assert(kBM * kBK % kThreads == 0 && kBN * kBK % kThreads == 0, "whole slabs per thread");

__device__ __forceinline__ float ld(const float* p, int64_t i) { return __ldg(p + i); }
__device__ __forceinline__ float ld(const uint16_t* p, int64_t i) {
  return __uint_as_float(uint32_t(__ldg(p + i)) << 16);
}

// C[m, n] = Σ_{k < K} A[m, k] · B(n, k), A row-major [M, K]; B(n, k) = b[n·K + k] (kBTransposed =
// false: [N, K], "NT") or b[k·N + n] (true: [K, N], "NN"). C row-major [M, N].
template <class TA, class TB, bool kBTransposed>
__global__ void __launch_bounds__(kThreads) fixed_order_gemm_kernel(const TA* __restrict__ a, const TB* __restrict__ b,
                                                                    int64_t M, int N, int K, float* __restrict__ c) {
  __shared__ float as[kBK][kBM];  // [k, m] slab of A
  __shared__ float bs[kBK][kBN];  // [k, n] slab of B
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t m0 = int64_t(blockIdx.x) * kBM;
  const int n0 = int(blockIdx.y) * kBN;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < K; k0 += kBK) {
#pragma unroll
    for (int i = 0; i < kBM * kBK / kThreads; ++i) {  // A: contiguous along k
      const int idx = threadIdx.x + kThreads * i, mm = idx / kBK, kk = idx % kBK;
      const int64_t m = m0 + mm;
      as[kk][mm] = (m < M && k0 + kk < K) ? ld(a, m * K + k0 + kk) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kBN * kBK / kThreads; ++i) {
      const int idx = threadIdx.x + kThreads * i;
      const int nn = kBTransposed ? idx % kBN : idx / kBK, kk = kBTransposed ? idx / kBN : idx % kBK;
      const int n = n0 + nn, k = k0 + kk;
      float v = 0.0f;
      if (n < N && k < K) v = kBTransposed ? ld(b, int64_t(k) * N + n) : ld(b, int64_t(n) * K + k);
      bs[kk][nn] = v;
    }
    __syncthreads();
    const int kn = min(kBK, K - k0);  // every output runs the same k sequence: 0, 1, ..., K-1
    for (int kk = 0; kk < kn; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = as[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = bs[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t m = m0 + ty + 16 * i;
    if (m >= M) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int n = n0 + tx + 16 * j;
      if (n < N) c[m * N + n] = acc[i][j];
    }
  }
}

template <class TA, class TB, bool kBTransposed>
void launch_fixed_order_gemm(const TA* a, const TB* b, int64_t M, int N, int K, float* c, cudaStream_t stream,
                             const char* fn) {
  if (M == 0 || N == 0) return;
  const dim3 grid(unsigned((M + kBM - 1) / kBM), unsigned((N + kBN - 1) / kBN));
  fixed_order_gemm_kernel<TA, TB, kBTransposed><<<grid, kThreads, 0, stream>>>(a, b, M, N, K, c);
  MXMOE_CHECK_LAUNCH(fn);
}

}  // namespace

void launch_router_logits_fixed(const uint16_t* x, const uint16_t* wr, int64_t tokens, int experts, int hidden,
                                float* logits, cudaStream_t stream) {
  launch_fixed_order_gemm<uint16_t, uint16_t, false>(x, wr, tokens, experts, hidden, logits, stream,
                                                     "router logits (batch-invariant)");
}

void launch_router_dgrad_fixed(const float* dlogits, const uint16_t* wr, int64_t tokens, int experts, int hidden,
                               float* dx, cudaStream_t stream) {
  launch_fixed_order_gemm<float, uint16_t, true>(dlogits, wr, tokens, hidden, experts, dx, stream,
                                                 "router dgrad (batch-invariant)");
}

}  // namespace mxmoe::detail
