// The fused decode step (decode_step_fused, include/mxmoe/decode.h) against the three warp-decode
// kernels it fuses (decode_router + decode_gate_up with FP32 h + decode_down), bit for bit: ids,
// routing weights and out. The three kernels are themselves checked against the FP64 reference in
// test_decode_gpu.cpp, so bitwise equality here carries that check over.
// Data: every tensor is filled on the device by a hash of (seed, element), so full-size shapes
// (Qwen3-30B-A3B, Qwen3-235B-A22B, a DeepSeek-V3-like layer with I = 512) cost no host time and
// every expert holds different values (reading a wrong expert shows). BF16 weights uniform with
// the variance of N(0, 1/K); E4M3 codes uniform over the finite ones, scale bytes in [118, 123];
// x uniform in [-2, 2); Wr uniform / sqrt(H); bias (sigmoid) uniform in [-0.25, 0.25).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/gpu_test_util.h"
#include "mxmoe/decode.h"

using namespace mxmoe;
using namespace mxmoe::test;

namespace {

__device__ __forceinline__ uint32_t mix(uint64_t v) {
  v ^= v >> 33;
  v *= 0xff51afd7ed558ccdull;
  v ^= v >> 33;
  v *= 0xc4ceb9fe1a85ec53ull;
  v ^= v >> 33;
  return uint32_t(v);
}

// kind 0: BF16 uniform in [-a, a); 1: E4M3 code, finite; 2: E8M0 byte in [118, 123].
__global__ void fill_kernel(void* dst, int64_t n, uint64_t seed, int kind, float a) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t h = mix(seed * 0x9E3779B97F4A7C15ull + uint64_t(i));
    if (kind == 0) {
      const float u = (float(h >> 8) * (1.0f / 16777216.0f)) * 2.0f - 1.0f;
      static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16_rn(u * a);
    } else if (kind == 1) {
      uint8_t b = uint8_t(h);
      if ((b & 0x7F) == 0x7F) b ^= 0x01;  // 0x7F / 0xFF are NaN in E4M3
      static_cast<uint8_t*>(dst)[i] = b;
    } else {
      static_cast<uint8_t*>(dst)[i] = uint8_t(118 + h % 6);
    }
  }
}

void fill(void* dst, int64_t n, uint64_t seed, int kind, float a = 1.0f) {
  fill_kernel<<<1024, 256>>>(dst, n, seed, kind, a);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
}

struct FusedConfig {
  const char* name;
  DecodeShape shape;
  bool sigmoid;
  int n_groups, topk_groups;
  float scaling;
};

// One projection [E, N, K] (+ shared [N, K]) filled on the device.
struct Proj {
  std::unique_ptr<DevBuf<uint8_t>> data, scales, sdata, sscales;
  DecodeWeights w;
  Proj(DecodeWeightDtype d, int E, int64_t N, int64_t K, bool shared, uint64_t seed) {
    const bool mx = d == DecodeWeightDtype::kMXFP8;
    const size_t elem = mx ? 1 : 2;
    const int64_t n = int64_t(E) * N * K, ns = N * K;
    data = std::make_unique<DevBuf<uint8_t>>(size_t(n) * elem);
    fill(data->p, n, seed, mx ? 1 : 0, std::sqrt(3.0f / float(K)));
    if (mx) {
      scales = std::make_unique<DevBuf<uint8_t>>(size_t(n / 32));
      fill(scales->p, n / 32, seed + 1, 2);
    }
    if (shared) {
      sdata = std::make_unique<DevBuf<uint8_t>>(size_t(ns) * elem);
      fill(sdata->p, ns, seed + 2, mx ? 1 : 0, std::sqrt(3.0f / float(K)));
      if (mx) {
        sscales = std::make_unique<DevBuf<uint8_t>>(size_t(ns / 32));
        fill(sscales->p, ns / 32, seed + 3, 2);
      }
    }
    w.dtype = d;
    w.data = data->p;
    w.scales = scales ? scales->p : nullptr;
    w.shared_data = sdata ? sdata->p : nullptr;
    w.shared_scales = sscales ? sscales->p : nullptr;
  }
};

template <class T>
::testing::AssertionResult same_bits(const char* what, const std::vector<T>& got, const std::vector<T>& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      std::ostringstream os;
      os << what << ": first difference at flat index " << i << ": fused " << +got[i] << ", three kernels "
         << +want[i];
      return ::testing::AssertionFailure() << os.str();
    }
  }
  return ::testing::AssertionSuccess();
}

// Both paths' buffers for one layer, sized for kDecodeFusedMaxBatch tokens.
struct Both {
  const FusedConfig& c;
  const Proj &w1, &w2;
  const DevBuf<uint16_t>& wr;
  const float* bias;
  DevBuf<uint16_t> x, out_ref, out;
  DevBuf<int32_t> ids_ref, ids;
  DevBuf<float> w_ref, w, h;
  DevBuf<uint8_t> ws;

  Both(const FusedConfig& cfg, const Proj& p1, const Proj& p2, const DevBuf<uint16_t>& router_w, const float* b)
      : c(cfg), w1(p1), w2(p2), wr(router_w), bias(b), x(size_t(kDecodeFusedMaxBatch) * cfg.shape.hidden),
        out_ref(x.n), out(x.n), ids_ref(size_t(kDecodeFusedMaxBatch) * cfg.shape.top_k), ids(ids_ref.n),
        w_ref(ids_ref.n), w(ids_ref.n),
        h(size_t(kDecodeFusedMaxBatch) * (cfg.shape.top_k + cfg.shape.shared_expert) * cfg.shape.inter),
        ws(decode_step_fused_workspace_bytes(cfg.shape, kDecodeFusedMaxBatch), 0xFF) {
    decode_step_fused_init_workspace(ws.p, ws.n);  // once; every step leaves it ready
  }
  RouterParams params() const {
    RouterParams p;
    p.scoring = c.sigmoid ? RouterScoring::kSigmoid : RouterScoring::kSoftmax;
    p.top_k = c.shape.top_k;
    p.n_groups = c.n_groups;
    p.topk_groups = c.topk_groups;
    p.scaling_factor = c.scaling;
    p.bias = bias;
    return p;
  }
  const __nv_bfloat16* xb() const { return reinterpret_cast<const __nv_bfloat16*>(x.p); }
  void three_kernels(int B) {
    const DecodeShape& s = c.shape;
    decode_router(xb(), B, s.hidden, reinterpret_cast<const __nv_bfloat16*>(wr.p), s.num_experts, params(), ids_ref.p,
                  w_ref.p);
    decode_gate_up(xb(), B, s.hidden, s.inter, w1.w, s.num_experts, ids_ref.p, s.top_k, h.p, DecodeHDtype::kFP32);
    decode_down(h.p, DecodeHDtype::kFP32, B, s.inter, s.hidden, w2.w, s.num_experts, ids_ref.p, w_ref.p, s.top_k,
                reinterpret_cast<__nv_bfloat16*>(out_ref.p));
  }
  void fused(int B, cudaStream_t stream = nullptr) {
    decode_step_fused(xb(), B, c.shape, reinterpret_cast<const __nv_bfloat16*>(wr.p), params(), w1.w, w2.w, ids.p,
                      w.p, reinterpret_cast<__nv_bfloat16*>(out.p), ws.p, ws.n, stream);
  }
  void poison() {
    for (auto* b : {&out_ref, &out}) MXMOE_ASSERT_CUDA(cudaMemset(b->p, 0xFF, b->n * 2));
    MXMOE_ASSERT_CUDA(cudaMemset(ids.p, 0xFF, ids.n * 4));
    MXMOE_ASSERT_CUDA(cudaMemset(w.p, 0xFF, w.n * 4));
  }
  // Both paths' first B rows, bit for bit.
  void expect_equal(int B, const std::string& what) {
    const size_t nk = size_t(B) * c.shape.top_k, nh = size_t(B) * c.shape.hidden;
    auto head = [](auto v, size_t n) { v.resize(n); return v; };
    EXPECT_TRUE(same_bits((what + " topk_ids").c_str(), head(ids.download(), nk), head(ids_ref.download(), nk)));
    EXPECT_TRUE(same_bits((what + " topk_weights").c_str(), head(w.download(), nk), head(w_ref.download(), nk)));
    EXPECT_TRUE(same_bits((what + " out").c_str(), head(out.download(), nh), head(out_ref.download(), nh)));
  }
};

const FusedConfig kFusedConfigs[] = {
    {"qwen-style small", {512, 256, 16, 4, false}, false, 1, 1, 1.0f},
    {"deepseek-style small", {512, 256, 16, 4, true}, true, 4, 2, 2.5f},
    {"Qwen3-30B-A3B", {2048, 768, 128, 8, false}, false, 1, 1, 1.0f},
    {"Qwen3-235B-A22B", {4096, 1536, 128, 8, false}, false, 1, 1, 1.0f},
    {"DeepSeek-V3-like (I = 512)", {7168, 512, 256, 8, true}, true, 8, 4, 2.5f},
};

}  // namespace

// B = 1..8 eager (and a rerun: determinism), then the step captured once per B in {1, 8} in a CUDA
// graph and replayed twice with new tokens written into x between replays; every result equals the
// three kernels' on the same x. Small shapes also get a NaN in one token's x (propagation as today).
TEST(DecodeGpu, FusedStepMatchesThreeKernels) {
  MXMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  for (const FusedConfig& c : kFusedConfigs) {
    for (DecodeWeightDtype d : {DecodeWeightDtype::kBF16, DecodeWeightDtype::kMXFP8}) {
      const std::string tag = std::string(c.name) + (d == DecodeWeightDtype::kMXFP8 ? " mxfp8" : " bf16");
      SCOPED_TRACE(tag);
      const DecodeShape& s = c.shape;
      const Proj w1(d, s.num_experts, 2 * int64_t(s.inter), s.hidden, s.shared_expert, seed + 10);
      const Proj w2(d, s.num_experts, s.hidden, s.inter, s.shared_expert, seed + 20);
      DevBuf<uint16_t> wr(size_t(s.num_experts) * s.hidden);
      fill(wr.p, int64_t(wr.n), seed + 30, 0, 1.0f / std::sqrt(float(s.hidden)));
      std::unique_ptr<DevBuf<float>> bias;
      if (c.sigmoid) {
        std::vector<float> hb(size_t(s.num_experts));
        for (size_t e = 0; e < hb.size(); ++e) hb[e] = float(int((e * 7919 + seed) % 64) - 32) / 128.0f;
        bias = std::make_unique<DevBuf<float>>(hb.size());
        bias->upload(hb);
      }
      Both t(c, w1, w2, wr, bias ? bias->p : nullptr);
      for (int B = 1; B <= kDecodeFusedMaxBatch; ++B) {
        fill(t.x.p, int64_t(B) * s.hidden, seed + 100 + uint64_t(B), 0, 2.0f);
        t.poison();
        t.three_kernels(B);
        t.fused(B);
        MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
        t.expect_equal(B, "B=" + std::to_string(B));
        const std::vector<uint16_t> first = t.out.download();
        t.poison();
        t.fused(B);
        MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
        EXPECT_TRUE(t.out.download() == first) << "B=" << B << ": the fused step's rerun differs";
      }
      if (s.num_experts <= 16) {  // a NaN in token 0's x, B = 3
        fill(t.x.p, 3 * int64_t(s.hidden), seed + 200, 0, 2.0f);
        const uint16_t nan = 0x7FC0;
        MXMOE_ASSERT_CUDA(cudaMemcpy(t.x.p + 5, &nan, 2, cudaMemcpyHostToDevice));
        t.poison();
        t.three_kernels(3);
        t.fused(3);
        MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
        t.expect_equal(3, "NaN in x, B=3");
      }
      for (int B : {1, kDecodeFusedMaxBatch}) {
        cudaStream_t stream;
        MXMOE_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        cudaGraph_t graph;
        MXMOE_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        t.fused(B, stream);
        MXMOE_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
        cudaGraphExec_t exec;
        MXMOE_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        for (int rep = 0; rep < 2; ++rep) {
          fill(t.x.p, int64_t(B) * s.hidden, seed + 300 + uint64_t(10 * B + rep), 0, 2.0f);
          t.poison();
          t.three_kernels(B);
          MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
          MXMOE_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
          MXMOE_ASSERT_CUDA(cudaStreamSynchronize(stream));
          t.expect_equal(B, "graph B=" + std::to_string(B) + " replay " + std::to_string(rep));
        }
        MXMOE_ASSERT_CUDA(cudaGraphExecDestroy(exec));
        MXMOE_ASSERT_CUDA(cudaGraphDestroy(graph));
        MXMOE_ASSERT_CUDA(cudaStreamDestroy(stream));
      }
      std::printf("[fused] %s: B = 1..%d bitwise equal to the three kernels (eager, rerun, graph replays)\n",
                  tag.c_str(), kDecodeFusedMaxBatch);
    }
  }
}

// Argument checks (before any CUDA call): batch above the bound, too many experts, a workspace
// too small, out overlapping x or the workspace.
TEST(DecodeGpu, FusedStepRejectsBadArguments) {
  MXMOE_REQUIRE_GPU();
  const DecodeShape s{512, 256, 16, 4, false};
  EXPECT_THROW(decode_step_fused_workspace_bytes(s, kDecodeFusedMaxBatch + 1), Error);
  DecodeShape big = s;
  big.num_experts = kDecodeFusedMaxExperts + 32;
  EXPECT_THROW(decode_step_fused_workspace_bytes(big, 1), Error);
  const Proj w1(DecodeWeightDtype::kBF16, 16, 512, 512, false, 1), w2(DecodeWeightDtype::kBF16, 16, 512, 256, false, 2);
  DevBuf<uint16_t> wr(16 * 512), x(4 * 512), out(4 * 512);
  DevBuf<int32_t> ids(16);
  DevBuf<float> w(16);
  const size_t need = decode_step_fused_workspace_bytes(s, 4);
  DevBuf<uint8_t> ws(need);
  RouterParams p;
  p.top_k = 4;
  // One call's arguments, valid by default; each case below changes one or two of them.
  struct Args {
    const void* x;
    int batch;
    RouterParams params;
    DecodeWeights w1, w2;
    void* ids;
    void* weights;
    void* out;
    size_t ws_bytes;
  };
  const Args ok{x.p, 4, p, w1.w, w2.w, ids.p, w.p, out.p, need};
  auto call = [&](const Args& a) {
    decode_step_fused(static_cast<const __nv_bfloat16*>(a.x), a.batch, s, reinterpret_cast<const __nv_bfloat16*>(wr.p),
                      a.params, a.w1, a.w2, static_cast<int32_t*>(a.ids), static_cast<float*>(a.weights),
                      static_cast<__nv_bfloat16*>(a.out), ws.p, a.ws_bytes);
  };
  auto with = [&](auto change) {
    Args a = ok;
    change(a);
    return a;
  };
  EXPECT_THROW(call(with([&](Args& a) { a.out = x.p; })), Error);                        // out == x
  EXPECT_THROW(call(with([&](Args& a) { a.out = ws.p; })), Error);                       // out inside the workspace
  EXPECT_THROW(call(with([&](Args& a) { a.ws_bytes = need - 1; })), Error);              // workspace too small
  EXPECT_THROW(call(with([&](Args& a) { a.batch = 9; })), Error);  // batch above kDecodeFusedMaxBatch
  EXPECT_THROW(call(with([&](Args& a) { a.batch = 0; })), Error);                        // batch 0
  // x inside the workspace; ids or weights overlapping out, x or the workspace.
  EXPECT_THROW(call(with([&](Args& a) { a.x = ws.p; })), Error);
  EXPECT_THROW(call(with([&](Args& a) { a.ids = out.p; })), Error);
  EXPECT_THROW(call(with([&](Args& a) { a.weights = ws.p; })), Error);
  // params.top_k != shape.top_k; w1 and w2 of different dtypes; a shared expert in w1 only.
  EXPECT_THROW(call(with([&](Args& a) { a.params.top_k = 3; })), Error);
  const Proj w2mx(DecodeWeightDtype::kMXFP8, 16, 512, 256, false, 3), w1sh(DecodeWeightDtype::kBF16, 16, 512, 512, true, 4);
  EXPECT_THROW(call(with([&](Args& a) { a.w2 = w2mx.w; })), Error);
  EXPECT_THROW(call(with([&](Args& a) { a.w1 = w1sh.w; })), Error);
}
