// MoE element-wise/gather ops on the GPU against host loops: combine bit for bit (the host
// replays the same FP32 fma order), SwiGLU within BF16 rounding of the FP64 value.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/gpu_test_util.h"
#include "kernels/layer/moe_ops_launch.h"
#include "mxmoe/moe_ops.h"
#include "mxmoe/moe_plan.h"
#include "mxmoe/quantize.h"
#include "ref/decode_ref.h"

using namespace mxmoe;
using namespace mxmoe::test;

TEST(MoeOpsGpu, CombineMatchesHostSlotOrder) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  const int64_t T = 333, H = 2048, y_rows = 1536;
  const int k = 8;
  const auto y = random_bf16(y_rows, H, Dist::kGaussian, rng);
  std::vector<int32_t> row_of(size_t(T * k));
  std::vector<float> w(size_t(T * k)), addend(size_t(T * H));
  std::uniform_real_distribution<float> uw(0.0f, 1.0f);
  for (auto& r : row_of) r = (rng() % 20 == 0) ? -1 : int32_t(rng() % y_rows);  // some dropped slots
  for (auto& v : w) v = uw(rng);
  for (auto& v : addend) v = uw(rng) - 0.5f;
  DevBuf<uint16_t> dy{y.size()}, dout{size_t(T * H)};
  DevBuf<int32_t> drow{row_of.size()};
  DevBuf<float> dw{w.size()}, dadd{addend.size()};
  dy.upload(y);
  drow.upload(row_of);
  dw.upload(w);
  dadd.upload(addend);
  for (int variant = 0; variant < 2; ++variant) {  // weighted combine; un-permute with an addend
    const bool weighted = variant == 0;
    moe_combine(reinterpret_cast<const __nv_bfloat16*>(dy.p), y_rows, H, drow.p, weighted ? dw.p : nullptr, T, k,
                weighted ? nullptr : dadd.p, reinterpret_cast<__nv_bfloat16*>(dout.p));
    MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
    const auto got = dout.download();
    int64_t bad = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < H; ++n) {
        float acc = 0.0f;
        for (int j = 0; j < k; ++j) {
          const int32_t r = row_of[size_t(t * k + j)];
          if (r < 0) continue;
          acc = std::fmaf(weighted ? w[size_t(t * k + j)] : 1.0f, ref::bf16_to_float(y[size_t(r * H + n)]), acc);
        }
        if (!weighted) acc += addend[size_t(t * H + n)];
        const uint16_t want = ref::float_to_bf16(acc);
        if (got[size_t(t * H + n)] != want && bad++ == 0)
          ADD_FAILURE() << "variant " << variant << " first mismatch at [" << t << ", " << n << "]: got 0x"
                        << std::hex << got[size_t(t * H + n)] << " want 0x" << want << " (seed " << std::dec
                        << fresh_seed() << ")";
      }
    EXPECT_EQ(bad, 0);
  }
}

TEST(MoeOpsGpu, SwigluWithinBf16RoundingAndRowsUsed) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  const int64_t rows = 1024, I = 768, used = 640;
  const auto gu = random_bf16(rows, 2 * I, Dist::kHeavyTailed, rng);
  DevBuf<uint16_t> dgu{gu.size()}, dh{size_t(rows * I), 0x5A};
  DevBuf<int32_t> dused{1};
  dgu.upload(gu);
  dused.upload(std::vector<int32_t>{int32_t(used)});
  moe_swiglu(reinterpret_cast<const __nv_bfloat16*>(dgu.p), rows, I, dused.p, reinterpret_cast<__nv_bfloat16*>(dh.p));
  MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
  const auto h = dh.download();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < I; ++i) {
      const size_t o = size_t(r * I + i);
      if (r >= used) {
        ASSERT_EQ(h[o], 0x5A5A) << "row " << r << " written past rows_used";
        continue;
      }
      const double g = ref::bf16_to_float(gu[size_t(r * 2 * I + i)]), u = ref::bf16_to_float(gu[size_t(r * 2 * I + I + i)]);
      const double want = g / (1.0 + std::exp(-g)) * u;
      // FP32 math (expf within 2 ulp, a division and a product: < 2^-20 relative) then one BF16
      // rounding (2^-8 relative): |got - want| <= (2^-8 + 2^-19)·|want| + tiny.
      const double got = ref::bf16_to_float(h[o]);
      ASSERT_LE(std::fabs(got - want), (std::ldexp(1.0, -8) + std::ldexp(1.0, -19)) * std::fabs(want) + 1e-30)
          << "[" << r << ", " << i << "] g=" << g << " u=" << u;
    }
}

TEST(MoeOpsGpu, TopkMatchesReferenceRouting) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  std::normal_distribution<float> g(0.0f, 2.0f);
  const int64_t T = 1000;
  struct Case {
    int E;
    RouterParams p;
  };
  std::vector<Case> cases(2);
  cases[0].E = 128;
  cases[0].p.top_k = 8;  // Qwen3: softmax, renormalised
  cases[1].E = 256;      // DeepSeek-V3: sigmoid + bias, 8 groups, top-4 groups, scale 2.5
  cases[1].p.scoring = RouterScoring::kSigmoid;
  cases[1].p.top_k = 8;
  cases[1].p.n_groups = 8;
  cases[1].p.topk_groups = 4;
  cases[1].p.scaling_factor = 2.5f;
  for (Case& c : cases) {
    const bool sigmoid = c.p.scoring == RouterScoring::kSigmoid;
    std::vector<float> logits(size_t(T * c.E)), bias(size_t(c.E));
    for (auto& v : logits) v = g(rng);
    for (auto& v : bias) v = 0.05f * g(rng);
    DevBuf<float> dl{logits.size()}, db{bias.size()}, dw{size_t(T * c.p.top_k)};
    DevBuf<int32_t> di{size_t(T * c.p.top_k)};
    dl.upload(logits);
    db.upload(bias);
    RouterParams p = c.p;
    if (sigmoid) p.bias = db.p;
    moe_topk(dl.p, T, c.E, p, di.p, dw.p);
    MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
    const auto ids = di.download();
    const auto w = dw.download();
    ref::RouterRefParams rp;
    rp.sigmoid = sigmoid;
    rp.top_k = c.p.top_k;
    rp.n_groups = c.p.n_groups;
    rp.topk_groups = c.p.topk_groups;
    rp.scaling_factor = c.p.scaling_factor;
    rp.bias = sigmoid ? bias.data() : nullptr;
    const ref::RouterRefResult want =
        ref::route_from_logits(std::vector<double>(logits.begin(), logits.end()), int(T), c.E, rp);
    int checked = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (want.margin[size_t(t)] < 1e-4) continue;  // FP32 scoring may order a near-tie differently
      ++checked;
      for (int j = 0; j < c.p.top_k; ++j) {
        const size_t o = size_t(t * c.p.top_k + j);
        ASSERT_EQ(ids[o], want.ids[o]) << "token " << t << " slot " << j << " E=" << c.E;
        // FP32 exp/sigmoid and a k-term sum: a few ulps of 2^-24.
        ASSERT_NEAR(w[o], want.weights[o], 1e-5 * std::fabs(want.weights[o]) + 1e-7) << "token " << t << " slot " << j;
      }
    }
    EXPECT_GT(checked, int(T * 9 / 10));
    // Rerun: identical bits.
    moe_topk(dl.p, T, c.E, p, di.p, dw.p);
    MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(di.download(), ids);
    EXPECT_EQ(dw.download(), w);
  }
}

// The layer's fused dY path (moe_combine_backward_scales + quantize_mxfp8_gather_scaled) against the
// two-step one (moe_combine_backward's BF16 dY, then quantize_mxfp8_grouped): same quantized bytes
// both ways (plain and fast forms), same dw bits, on a real routing plan with empty experts.
TEST(MoeOpsGpu, FusedDyQuantizeEqualsTwoStep) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  const int64_t T = 301, H = 384;
  const int k = 4, E = 16;
  std::vector<int32_t> ids(size_t(T * k));
  for (int64_t t = 0; t < T; ++t)  // distinct experts per token, 6 experts never chosen
    for (int j = 0; j < k; ++j) ids[size_t(t * k + j)] = int32_t((t + 3 * j) % 10);
  const int64_t cap = moe_plan_capacity(T, k, E);
  DevBuf<int32_t> dids{ids.size()}, counts{size_t(E)}, offs{size_t(E + 1)}, padded{size_t(E + 1)},
      row_of{ids.size()}, row_index{size_t(cap)};
  dids.upload(ids);
  const size_t ws_bytes = moe_plan_workspace_bytes(T, k, E);
  DevBuf<uint8_t> ws{ws_bytes};
  MoePlan plan{counts.p, offs.p, padded.p, row_of.p, row_index.p};
  moe_plan(dids.p, T, k, E, cap, ws.p, ws_bytes, plan);

  const auto dout = random_bf16(T, H, Dist::kHeavyTailed, rng);
  const auto y = random_bf16(cap, H, Dist::kGaussian, rng);
  std::vector<float> w(size_t(T * k));
  std::uniform_real_distribution<float> uw(-1.0f, 1.0f);
  for (auto& v : w) v = uw(rng);
  DevBuf<uint16_t> ddout{dout.size()}, dy_buf{y.size()}, ddy{size_t(cap * H)};
  DevBuf<float> dwt{w.size()}, dw1{w.size()}, dw2{w.size()}, row_w{size_t(cap)};
  ddout.upload(dout);
  dy_buf.upload(y);
  dwt.upload(w);
  const int32_t* used = padded.p + E;
  auto bf = [](const DevBuf<uint16_t>& b) { return reinterpret_cast<const __nv_bfloat16*>(b.p); };
  struct Copy {
    DevBuf<uint8_t> d, s, fd, fs;
    Copy(int64_t r, int64_t c) : d(size_t(r * c), 0x5A), s(size_t(r * c / 32), 0x5A), fd(size_t(r * c), 0x5A),
                                 fs(size_t((c + 127) / 128 * r), 0x5A) {}
    MxOut out() const { return MxOut{d.p, s.p, fd.p, fs.p}; }
  };
  Copy r1(cap, H), c1(H, cap), r2(cap, H), c2(H, cap);
  const MxOut or1 = r1.out(), oc1 = c1.out(), or2 = r2.out(), oc2 = c2.out();
  moe_combine_backward(bf(ddout), bf(dy_buf), cap, H, used, row_index.p, row_of.p, dwt.p, T, k,
                       reinterpret_cast<__nv_bfloat16*>(ddy.p), dw1.p);
  quantize_mxfp8_grouped(bf(ddy), cap, H, padded.p, padded.p, E, cap, &or1, &oc1);
  moe_combine_backward_scales(bf(ddout), bf(dy_buf), cap, H, used, row_index.p, row_of.p, dwt.p, T, k, row_w.p,
                              dw2.p);
  quantize_mxfp8_gather_scaled(bf(ddout), T, H, row_index.p, row_w.p, cap, used, &or2, &oc2);
  MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(dw1.download(), dw2.download());
  EXPECT_EQ(r1.d.download(), r2.d.download());
  EXPECT_EQ(r1.s.download(), r2.s.download());
  EXPECT_EQ(r1.fd.download(), r2.fd.download());
  EXPECT_EQ(r1.fs.download(), r2.fs.download());
  EXPECT_EQ(c1.d.download(), c2.d.download());
  EXPECT_EQ(c1.s.download(), c2.s.download());
  EXPECT_EQ(c1.fd.download(), c2.fd.download());
  EXPECT_EQ(c1.fs.download(), c2.fs.download());
}

// The batch-invariant router logits (MoeLayerConfig::batch_invariant_router, the EP layer): every
// output is one fmaf chain over k = 0..K-1 from 0, so the host's std::fmaf chain in the same order
// gives the same bits. Shapes cover both kernels: the 32 × 32-tile kernel (K % 32 == 0, 16-byte
// aligned rows; partial token and expert tiles, E = 257 over 9 expert tiles) and the generic one
// (K = 1000, and a base pointer off 16-byte alignment).
TEST(MoeOpsGpu, BatchInvariantRouterLogitsAreOneFmaChainPerOutput) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  struct Shape { int64_t T; int E; int K; int x_offset; };
  for (const Shape s : {Shape{333, 32, 1024, 0}, Shape{64, 257, 96, 0}, Shape{7, 8, 7168, 0}, Shape{45, 16, 1000, 0},
                        Shape{40, 32, 256, 1}, Shape{0, 32, 256, 0}}) {
    SCOPED_TRACE(::testing::Message() << "T " << s.T << " E " << s.E << " K " << s.K << " x offset " << s.x_offset);
    const auto x = random_bf16(s.T + 1, s.K, Dist::kGaussian, rng);  // one spare row for the offset
    const auto w = random_bf16(s.E, s.K, Dist::kGaussian, rng);
    DevBuf<uint16_t> dx{x.size()}, dw{w.size()};
    DevBuf<float> dc{size_t(std::max<int64_t>(1, s.T * s.E))};
    dx.upload(x);
    dw.upload(w);
    detail::launch_router_logits_fixed(dx.p + s.x_offset, dw.p, s.T, s.E, s.K, dc.p, nullptr);
    MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
    if (s.T == 0) continue;
    const auto got = dc.download();
    int64_t bad = 0;
    for (int64_t t = 0; t < s.T; ++t)
      for (int e = 0; e < s.E; ++e) {
        float acc = 0.0f;
        for (int k = 0; k < s.K; ++k)
          acc = std::fmaf(ref::bf16_to_float(x[size_t(t * s.K + k + s.x_offset)]),
                          ref::bf16_to_float(w[size_t(int64_t(e) * s.K + k)]), acc);
        uint32_t gb, wb;
        std::memcpy(&gb, &got[size_t(t * s.E + e)], 4);
        std::memcpy(&wb, &acc, 4);
        if (gb != wb && bad++ == 0)
          ADD_FAILURE() << "first mismatch at [" << t << ", " << e << "]: got " << got[size_t(t * s.E + e)]
                        << " want " << acc << " (seed " << fresh_seed() << ")";
      }
    EXPECT_EQ(bad, 0);
  }
}
