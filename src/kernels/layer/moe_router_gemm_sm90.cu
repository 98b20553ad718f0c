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
// through shared memory (fixed_order_gemm_kernel: the dgrad, and logits of other shapes); the
// logits with hidden % 32 == 0 take router_logits_kernel (32 × 32 tiles, 16-byte loads), same bits. Roofline: 2·T·E·H FLOPs; this is a plain tiled SGEMM (a few ms at
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

// A thread's R × C outputs at rows m + kRowStep·i, columns n + kColStep·j of C [M, N] (row-major),
// masked at the matrix edges.
template <int kRowStep, int kColStep, int R, int C>
__device__ __forceinline__ void store_tile(const float (&acc)[R][C], int64_t m, int64_t M, int n, int N, float* c) {
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int64_t row = m + kRowStep * i;
    if (row >= M) continue;
#pragma unroll
    for (int j = 0; j < C; ++j) {
      const int col = n + kColStep * j;
      if (col < N) c[row * N + col] = acc[i][j];
    }
  }
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
  store_tile<16, 16>(acc, m0 + ty, M, n0 + tx, N, c);
}

// The logits (NT, BF16 × BF16, K = hidden a multiple of 32) with many more CTAs: run 47 measured
// the 64 × 64 kernel above at 0.93 ms for T = 4096, E = 32, H = 7168 (64 CTAs, half of every tile
// past E = 32, 2-byte loads) against 0.12-0.17 ms for cuBLAS. Here a CTA of 128 threads owns 32
// tokens × 32 experts (T = 4096, E = 32: 128 CTAs), a thread 2 tokens × 4 experts; k-slabs of 32
// arrive as one 16-byte load per operand and thread, prefetched into registers one slab ahead,
// converted to FP32 into shared memory. Each output is still one thread's fmaf chain over
// k = 0, 1, ..., K-1 from 0, so the bits are those of the kernel above (and of any tiling).
constexpr int kLT = 32, kLE = 32, kLK = 32, kLThreads = 128;
static_assert(kLT * kLK / 8 == kLThreads && kLE * kLK / 8 == kLThreads, "one 16-byte load per operand and thread");

__global__ void __launch_bounds__(kLThreads) router_logits_kernel(const uint16_t* __restrict__ x,
                                                                   const uint16_t* __restrict__ wr, int64_t T,
                                                                   int E, int K, float* __restrict__ c) {
  __shared__ float xs[kLK][kLT + 1];  // [k, token]
  __shared__ float ws[kLK][kLE + 1];  // [k, expert]
  const int tid = threadIdx.x;
  const int ty = tid / 8, tx = tid % 8;  // tokens ty, ty + 16; experts tx + 8j
  const int64_t t0 = int64_t(blockIdx.x) * kLT;
  const int e0 = int(blockIdx.y) * kLE;
  // loader: row lr (token or expert) of the tile, 8 consecutive k at lk
  const int lr = tid / 4, lk = (tid % 4) * 8;
  const bool x_ok = t0 + lr < T, w_ok = e0 + lr < E;
  const uint4* xp = reinterpret_cast<const uint4*>(x + (t0 + lr) * K + lk);
  const uint4* wp = reinterpret_cast<const uint4*>(wr + int64_t(e0 + lr) * K + lk);
  const uint4 zero = make_uint4(0, 0, 0, 0);
  uint4 xv = x_ok ? __ldg(xp) : zero, wv = w_ok ? __ldg(wp) : zero;
  float acc[2][4] = {};
  for (int k0 = 0; k0 < K; k0 += kLK) {
    const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w}, ww[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      xs[lk + 2 * i][lr] = __uint_as_float(xw[i] << 16);
      xs[lk + 2 * i + 1][lr] = __uint_as_float(xw[i] & 0xFFFF0000u);
      ws[lk + 2 * i][lr] = __uint_as_float(ww[i] << 16);
      ws[lk + 2 * i + 1][lr] = __uint_as_float(ww[i] & 0xFFFF0000u);
    }
    __syncthreads();
    if (k0 + kLK < K) {  // next slab into registers while this one is used
      xv = x_ok ? __ldg(xp + (k0 + kLK) / 8) : zero;
      wv = w_ok ? __ldg(wp + (k0 + kLK) / 8) : zero;
    }
#pragma unroll 8
    for (int kk = 0; kk < kLK; ++kk) {
      const float a0 = xs[kk][ty], a1 = xs[kk][ty + 16];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float b = ws[kk][tx + 8 * j];
        acc[0][j] = fmaf(a0, b, acc[0][j]);
        acc[1][j] = fmaf(a1, b, acc[1][j]);
      }
    }
    __syncthreads();
  }
  store_tile<16, 8>(acc, t0 + ty, T, e0 + tx, E, c);
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
  // 16-byte loads: rows of 32·n BF16 at 16-byte aligned bases (the layers' x and wr are)
  const bool vec = hidden % kLK == 0 && (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(wr)) % 16 == 0;
  if (!vec) {
    launch_fixed_order_gemm<uint16_t, uint16_t, false>(x, wr, tokens, experts, hidden, logits, stream,
                                                       "router logits (batch-invariant)");
    return;
  }
  if (tokens == 0 || experts == 0) return;
  const dim3 grid(unsigned((tokens + kLT - 1) / kLT), unsigned((experts + kLE - 1) / kLE));
  router_logits_kernel<<<grid, kLThreads, 0, stream>>>(x, wr, tokens, experts, hidden, logits);
  MXMOE_CHECK_LAUNCH("router logits (batch-invariant)");
}

void launch_router_dgrad_fixed(const float* dlogits, const uint16_t* wr, int64_t tokens, int experts, int hidden,
                               float* dx, cudaStream_t stream) {
  launch_fixed_order_gemm<float, uint16_t, true>(dlogits, wr, tokens, hidden, experts, dx, stream,
                                                 "router dgrad (batch-invariant)");
}

}  // namespace mxmoe::detail
