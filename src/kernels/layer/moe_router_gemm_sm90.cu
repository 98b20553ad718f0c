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
//
//   wgrad:   dwr[e, h] = Σ_t dl[t, e] · x[t, h]      dl FP32 [T, E], x BF16 [T, H], dwr FP32 [E, H]
//
// router_wgrad_kernel (both router modes): x read as BF16 (no FP32 copy), tokens in chunks of
// router_wgrad_chunk(T), each chunk's partial one thread's fmaf chain in increasing t from +0,
// then the partials added in chunk order (sum_chunks_kernel): the order is a function of T alone,
// so reruns give the same bits. Roofline at T = 16384, H = 7168, E = 32: 3.8 G FMA on CUDA cores
// (~0.12 ms at 67 TFLOP/s FP32) against 235 MB of x (~0.06 ms): FMA-bound; the partials add
// 2 · 32 chunks · E · H · 4 B = 59 MB. Measured 0.24 ms there (+ 0.011 ms for the chunk sum). Layout and numbers: docs/notes/layer.md "Router backward
// without FP32 round trips". Tests: MoeOpsGpu.RouterWgrad* (tests/gpu/test_moe_ops_gpu.cpp).
#include <algorithm>
#include <cstdint>

#include "device/cp_async.cuh"
#include "device/mx_convert.cuh"
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

// ---- dWr = dlᵀ · x in a fixed order -----------------------------------------------------------
//
// A CTA of 128 threads owns kWgE = 32 experts × kWgH = 256 columns of one token chunk: warp w the
// experts 8w..8w+7, lane l the columns 8l..8l+7, 64 FP32 accumulators per thread. Slabs of kWgT =
// 16 tokens (x 8 KB BF16 + dl 2 KB FP32) arrive by cp.async in a kWgStages-deep ring, zero-filled
// past the chunk, E and H (zero dl / x only ever reach accumulators that are not stored; tokens
// past the chunk are not summed). Per token and thread: one 16-byte x read (a warp reads 512
// contiguous bytes), two broadcast 16-byte dl reads, 8 BF16 → FP32 conversions, 64 fmaf. 40 KB of
// shared memory per CTA; grid (E tiles, H tiles, chunks), E tiles fastest so that the tiles that
// share an x block run together (E > 32 reads it from L2).
constexpr int kWgE = 32, kWgH = 256, kWgT = 16, kWgStages = 4, kWgThreads = 128;
// Chunks: at least kWgMinChunk tokens, at most kWgMaxChunks of them (T = 16384: 32 chunks of 512;
// 32 × 7168 / 256 = 896 CTAs at E = 32). Only T decides them (never the grid or the device).
constexpr int64_t kWgMinChunk = 256, kWgMaxChunks = 32;
static_assert(kWgThreads == 32 * (kWgE / 8) && kWgH == 32 * 8, "a warp owns 8 experts, a lane 8 columns");
static_assert((kWgT * kWgH / 8) % kWgThreads == 0 && (kWgT * kWgE) % kWgThreads == 0, "whole slabs per thread");
static_assert(kWgMinChunk % kWgT == 0, "chunks of whole slabs");

struct WgradSmem {
  uint16_t x[kWgStages][kWgT][kWgH];  // [token, column] bf16, rows of 512 B
  float dl[kWgStages][kWgT][kWgE];    // [token, expert] fp32
};

// Slab of cnt tokens from t0 into ring stage `st` (zero-filled past cnt, E, H).
__device__ __forceinline__ void wgrad_load_slab(WgradSmem& sm, int st, const float* dl, const uint16_t* x, int64_t t0,
                                                int cnt, int E, int H, int e0, int h0) {
#pragma unroll
  for (int i = 0; i < kWgT * kWgH / 8 / kWgThreads; ++i) {
    const int v = int(threadIdx.x) + kWgThreads * i, tt = v / (kWgH / 8), col = (v % (kWgH / 8)) * 8;
    const bool ok = tt < cnt && h0 + col < H;
    dev::cp_async_cg_shared_global_16_zfill(&sm.x[st][tt][col], ok ? x + (t0 + tt) * H + h0 + col : x, ok);
  }
#pragma unroll
  for (int i = 0; i < kWgT * kWgE / kWgThreads; ++i) {
    const int v = int(threadIdx.x) + kWgThreads * i, tt = v / kWgE, e = v % kWgE;
    const bool ok = tt < cnt && e0 + e < E;
    dev::cp_async_ca_shared_global_4_zfill(&sm.dl[st][tt][e], ok ? dl + (t0 + tt) * E + e0 + e : dl, ok);
  }
}

// out[z, e, h] (FP32 [chunks, E, H]) = Σ over the tokens of chunk z = blockIdx.z, in increasing t, of
// dl[t, e] · x[t, h]. 128 registers (4 CTAs of 4 warps per SM), no spills.
__global__ void __launch_bounds__(kWgThreads, 4) router_wgrad_kernel(const float* __restrict__ dl,
                                                                  const uint16_t* __restrict__ x, int64_t T, int E,
                                                                  int H, int64_t chunk, float* __restrict__ out) {
  __shared__ __align__(16) WgradSmem sm;
  const int e0 = int(blockIdx.x) * kWgE, h0 = int(blockIdx.y) * kWgH;
  const int64_t tb = int64_t(blockIdx.z) * chunk, n = min(chunk, T - tb);
  const int slabs = int((n + kWgT - 1) / kWgT);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  auto slab_len = [&](int s) { return int(min(int64_t(kWgT), n - int64_t(s) * kWgT)); };
#pragma unroll
  for (int s = 0; s < kWgStages - 1; ++s) {
    if (s < slabs) wgrad_load_slab(sm, s, dl, x, tb + s * kWgT, slab_len(s), E, H, e0, h0);
    dev::cp_async_commit_group();
  }
  float acc[8][8] = {};  // [expert 8·warp + i][column 8·lane + j]
  for (int s = 0; s < slabs; ++s) {
    dev::cp_async_wait_group<kWgStages - 2>();  // slab s has landed (this thread's part) ...
    __syncthreads();                            // ... everyone's; and slab s - 1's stage is free
    const int next = s + kWgStages - 1;
    if (next < slabs) wgrad_load_slab(sm, next % kWgStages, dl, x, tb + int64_t(next) * kWgT, slab_len(next), E, H, e0, h0);
    dev::cp_async_commit_group();  // (empty groups keep the count)
    const int st = s % kWgStages, cnt = slab_len(s);
#pragma unroll
    for (int tt = 0; tt < kWgT; ++tt) {
      if (tt >= cnt) break;
      const uint4 xv = *reinterpret_cast<const uint4*>(&sm.x[st][tt][lane * 8]);    // [8] bf16
      const float4 d0 = *reinterpret_cast<const float4*>(&sm.dl[st][tt][warp * 8]);  // [4] fp32, broadcast
      const float4 d1 = *reinterpret_cast<const float4*>(&sm.dl[st][tt][warp * 8 + 4]);
      const float xf[8] = {dev::bf16_lo(xv.x), dev::bf16_hi(xv.x), dev::bf16_lo(xv.y), dev::bf16_hi(xv.y),
                           dev::bf16_lo(xv.z), dev::bf16_hi(xv.z), dev::bf16_lo(xv.w), dev::bf16_hi(xv.w)};
      const float df[8] = {d0.x, d0.y, d0.z, d0.w, d1.x, d1.y, d1.z, d1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(df[i], xf[j], acc[i][j]);
    }
  }
  const int h = h0 + lane * 8;
  if (h >= H) return;
  out += int64_t(blockIdx.z) * E * H;  // this chunk's partial
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int e = e0 + warp * 8 + i;
    if (e >= E) break;
    float4* o = reinterpret_cast<float4*>(out + int64_t(e) * H + h);
    o[0] = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    o[1] = make_float4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]);
  }
}

// out[i] = ((p[0][i] + p[1][i]) + p[2][i]) + ... over `chunks` partials of n4 float4 each.
__global__ void __launch_bounds__(256) sum_chunks_kernel(const float4* __restrict__ p, int chunks, int64_t n4,
                                                         float4* __restrict__ out) {
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < n4; v += int64_t(gridDim.x) * blockDim.x) {
    float4 acc = __ldg(p + v);
#pragma unroll 4
    for (int c = 1; c < chunks; ++c) {
      const float4 q = __ldg(p + int64_t(c) * n4 + v);
      acc.x += q.x;
      acc.y += q.y;
      acc.z += q.z;
      acc.w += q.w;
    }
    out[v] = acc;
  }
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

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

int64_t router_wgrad_chunk(int64_t tokens) {
  return std::max(kWgMinChunk, cdiv(cdiv(tokens, kWgMaxChunks), kWgT) * kWgT);
}

size_t router_wgrad_partial_floats(int64_t max_tokens, int experts, int hidden) {
  // chunks(T) <= cdiv(T, kWgMinChunk) (chunks of at least kWgMinChunk) and <= kWgMaxChunks
  // (chunk >= T / kWgMaxChunks), for every T <= max_tokens; one chunk needs no partials.
  const int64_t chunks = std::min(kWgMaxChunks, cdiv(max_tokens, kWgMinChunk));
  return chunks > 1 ? size_t(chunks) * size_t(experts) * size_t(hidden) : 0;
}

void launch_router_wgrad_fixed(const float* dlogits, const uint16_t* x, int64_t tokens, int experts, int hidden,
                               float* partials, float* dwr, cudaStream_t stream) {
  const char* fn = "router wgrad (fixed order)";
  if (hidden % 8 != 0) throw_arg(fn, "hidden", to_str(hidden), "must be a multiple of 8");
  check_aligned(fn, "x", x, 16);
  check_aligned(fn, "dwr", dwr, 16);
  if (experts == 0 || hidden == 0) return;
  if (tokens == 0) {  // an empty sum
    MXMOE_CUDA_CHECK(fn, cudaMemsetAsync(dwr, 0, size_t(experts) * size_t(hidden) * sizeof(float), stream));
    return;
  }
  const int64_t chunk = router_wgrad_chunk(tokens), chunks = cdiv(tokens, chunk);
  if (chunks > 1) {
    check_not_null(fn, "partials", partials);
    check_aligned(fn, "partials", partials, 16);
  }
  const dim3 grid(unsigned(cdiv(experts, kWgE)), unsigned(cdiv(hidden, kWgH)), unsigned(chunks));
  router_wgrad_kernel<<<grid, kWgThreads, 0, stream>>>(dlogits, x, tokens, experts, hidden, chunk,
                                                       chunks > 1 ? partials : dwr);
  MXMOE_CHECK_LAUNCH(fn);
  if (chunks == 1) return;
  const int64_t n4 = int64_t(experts) * hidden / 4;
  sum_chunks_kernel<<<unsigned(std::min<int64_t>(cdiv(n4, 256), 4096)), 256, 0, stream>>>(
      reinterpret_cast<const float4*>(partials), int(chunks), n4, reinterpret_cast<float4*>(dwr));
  MXMOE_CHECK_LAUNCH(fn);
}

}  // namespace mxmoe::detail
