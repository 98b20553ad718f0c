// MoE element-wise/gather ops on the GPU against host loops: combine and combine backward bit for
// bit (the host replays the same FP32 fma order), SwiGLU within BF16 rounding of the FP64 value.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>

#include "common/gpu_test_util.h"
#include "common/scoped_env.h"
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

// The top-k's warp arg-max on logits full of exact ties: values from {-Inf, -2, -0.0, +0.0, 1, 3} and
// 2% NaN (counted as -Inf), E = 128 / 256 / 384 (4, 8 and 16 scores a lane). Softmax: the ids equal
// the reference's exactly (selection on the exact logits, ties to the lower id; -0.0 and +0.0 tie).
// Both arg-max paths (redux.sync, default; the xor-shuffle butterfly, MXMOE_ROUTER_ARGMAX=shuffle) and
// 16 scores a lane (MXMOE_ROUTER_SLOTS=16) and the serial selection (MXMOE_ROUTER_SELECT=serial) give the
// same ids and weight bits, for softmax and for sigmoid scoring with 4, 8 and 16 groups (top half; group
// sizes 8 to 96: scored by warp reductions for 8, 16 and 32, serially for 24, 48, 64 and 96).
// A bad value of the variable throws before any launch, naming it.
TEST(MoeOpsGpu, TopkTiesAndBothArgmaxPathsAgree) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  const float kValues[] = {-INFINITY, -2.0f, -0.0f, 0.0f, 1.0f, 3.0f};
  std::uniform_int_distribution<int> pick(0, 5);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  const int64_t T = 512;
  for (int E : {128, 256, 384}) {
    for (int groups : {0, 8, 4, 16}) {  // 0: softmax; else sigmoid with this many groups (group sizes
                                        // 8-96: both ways router_select.cuh scores groups)
      const bool sigmoid = groups > 0;
      if (sigmoid && E % groups != 0) continue;
      SCOPED_TRACE("E=" + std::to_string(E) + (sigmoid ? " sigmoid, " + std::to_string(groups) + " groups" : " softmax"));
      std::vector<float> logits(size_t(T * E));
      for (auto& v : logits) v = u01(rng) < 0.02f ? NAN : kValues[pick(rng)];
      for (int64_t t = 0; t < T; ++t)  // at least k finite logits a row, so that softmax weights exist
        for (int j = 0; j < 8; ++j) logits[size_t(t * E + (t + 37 * j) % E)] = float(j % 3);
      RouterParams p;
      p.top_k = 8;
      if (sigmoid) {
        p.scoring = RouterScoring::kSigmoid;
        p.n_groups = groups;
        p.topk_groups = groups / 2;
      }
      DevBuf<float> dl{logits.size()}, dw{size_t(T * p.top_k)};
      DevBuf<int32_t> di{size_t(T * p.top_k)};
      dl.upload(logits);
      std::vector<int32_t> ids[4];
      std::vector<float> w[4];
      for (int path = 0; path < 4; ++path) {  // redux (fewest slots), shuffle, redux with 16 slots a lane,
                                              // the serial selection (MXMOE_ROUTER_SELECT)
        const ScopedEnv env("MXMOE_ROUTER_ARGMAX", path == 1 ? "shuffle" : "redux");
        const ScopedEnv slots("MXMOE_ROUTER_SLOTS", path == 2 ? "16" : "");
        const ScopedEnv sel("MXMOE_ROUTER_SELECT", path == 3 ? "serial" : "");
        moe_topk(dl.p, T, E, p, di.p, dw.p);
        MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
        ids[path] = di.download();
        w[path] = dw.download();
      }
      for (int path = 1; path < 4; ++path) {
        EXPECT_EQ(ids[0], ids[path]) << "path " << path << " chose differently";
        EXPECT_EQ(0, std::memcmp(w[0].data(), w[path].data(), w[0].size() * sizeof(float)))
            << "path " << path << ": weights differ";
      }
      if (sigmoid) continue;
      ref::RouterRefParams rp;
      rp.top_k = p.top_k;
      const ref::RouterRefResult want =
          ref::route_from_logits(std::vector<double>(logits.begin(), logits.end()), int(T), E, rp);
      for (size_t o = 0; o < ids[0].size(); ++o)
        ASSERT_EQ(ids[0][o], want.ids[o]) << "token " << o / size_t(p.top_k) << " slot " << o % size_t(p.top_k);
    }
  }
  const ScopedEnv bad("MXMOE_ROUTER_ARGMAX", "fast");
  DevBuf<float> dl{size_t(128)}, dw{size_t(8)};
  DevBuf<int32_t> di{size_t(8)};
  RouterParams p;
  p.top_k = 8;
  try {
    moe_topk(dl.p, 1, 128, p, di.p, dw.p);
    ADD_FAILURE() << "MXMOE_ROUTER_ARGMAX=fast was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("MXMOE_ROUTER_ARGMAX"), std::string::npos) << e.what();
  }
}

namespace {

// Routing weights, uniform in [-1, 1) (signed, so that dy's rounding sees both signs).
std::vector<float> random_weights(size_t n, std::mt19937& rng) {
  std::vector<float> w(n);
  std::uniform_real_distribution<float> uw(-1.0f, 1.0f);
  for (auto& v : w) v = uw(rng);
  return w;
}

}  // namespace

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
  const std::vector<float> w = random_weights(size_t(T * k), rng);
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

namespace {

// Host replay of moe_combine_backward's contract, writing only where the GPU writes: every
// dw[t, j] (t < tokens), and rows r < used. dw[t, j] for the slot j that claims row r (the last
// slot of t = row_index[r] with row_of[t, j] == r) is the warp's sum: lane l sums vectors v = l,
// l + 32, ... in increasing order (8 fmaf each, in element order) from +0, then the xor butterfly
// 16, 8, 4, 2, 1 (lane 0's value). Other slots: +0; unclaimed rows: dy = 0 / row_w = 0.
void combine_backward_host(const std::vector<uint16_t>& dout, const std::vector<uint16_t>& y, int64_t cols,
                           int64_t used, const std::vector<int32_t>& row_index, const std::vector<int32_t>& row_of,
                           const std::vector<float>& w, int64_t tokens, int k, std::vector<uint16_t>* dy,
                           std::vector<float>* row_w, std::vector<float>& dw) {
  std::fill(dw.begin(), dw.begin() + tokens * k, 0.0f);
  for (int64_t r = 0; r < used; ++r) {
    const int32_t t = row_index[size_t(r)];
    int j = -1;
    if (t >= 0 && t < tokens)
      for (int q = 0; q < k; ++q)
        if (row_of[size_t(t * k + q)] == r) j = q;
    const float wj = j < 0 ? 0.0f : w[size_t(t * k + j)];
    if (row_w != nullptr) (*row_w)[size_t(r)] = wj;
    if (dy != nullptr)
      for (int64_t n = 0; n < cols; ++n)
        (*dy)[size_t(r * cols + n)] =
            j < 0 ? uint16_t(0) : ref::float_to_bf16(wj * ref::bf16_to_float(dout[size_t(t * cols + n)]));
    if (j < 0) continue;
    float lanes[32];
    for (int l = 0; l < 32; ++l) {
      float acc = 0.0f;
      for (int64_t v = l; v < cols / 8; v += 32)
        for (int64_t e = v * 8; e < v * 8 + 8; ++e)
          acc = std::fmaf(ref::bf16_to_float(dout[size_t(t * cols + e)]), ref::bf16_to_float(y[size_t(r * cols + e)]),
                          acc);
      lanes[l] = acc;
    }
    for (int o = 16; o >= 1; o >>= 1) {
      float next[32];
      for (int l = 0; l < 32; ++l) next[l] = lanes[l] + lanes[l ^ o];
      std::copy(next, next + 32, lanes);
    }
    dw[size_t(t * k + j)] = lanes[0];
  }
}

// First differing element of two same-sized vectors compared as bytes, or -1.
template <class T>
int64_t first_bit_mismatch(const std::vector<T>& a, const std::vector<T>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return int64_t(i);
  return -1;
}

}  // namespace

// moe_combine_backward's token-major kernel (the default) against the row-major one it replaced
// (MXMOE_COMBINE_BWD=rows) bit for bit, and both against the host replay, in both forms (dy and
// row_w), on a hand-made padded layout with every irregular case the contract names: pad rows
// (row_index -1), rows whose token has no slot naming them, row_index >= tokens (row_of is
// allocated 16 tokens longer, filled with -1, so the row-major kernel's read past the end stays
// deterministic), negative and out-of-range slots, slots naming another token's row, two slots
// of a token naming one row (the last one claims it), rows_used null / cutting live rows / above
// rows; k = 1, 8 and 20 (three passes of the token-major kernel's 8 slots), H = 2048, 7168 and
// 1000 (vectors per row not a multiple of 32), T not a multiple of 8 or 32. Outputs start
// poisoned, so a missing or extra write (e.g. a row >= rows_used) shows as a mismatch.
TEST(MoeOpsGpu, CombineBackwardTokenMajorEqualsRowMajorBitwise) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  struct Case { int64_t T; int k; int64_t H; };
  for (const Case c : {Case{333, 8, 2048}, Case{333, 8, 7168}, Case{1237, 1, 2048}, Case{1237, 1, 7168},
                       Case{77, 20, 1000}}) {
    const int64_t T = c.T, H = c.H, n_slots = T * c.k;
    const int k = c.k;
    const int64_t rows = n_slots + n_slots / 8 + 37;
    std::vector<int32_t> perm(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) perm[size_t(i)] = int32_t(i);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> row_of(size_t((T + 16) * k), -1), row_index(size_t(rows), -1);
    for (int64_t i = 0; i < n_slots; ++i) {
      row_of[size_t(i)] = perm[size_t(i)];
      row_index[size_t(perm[size_t(i)])] = int32_t(i / k);
    }
    for (int64_t i = n_slots; i < rows; ++i) {  // pads: most -1, some past the tokens, some a real token
      const uint32_t u = rng() % 8;
      if (u == 0) row_index[size_t(perm[size_t(i)])] = int32_t(T + rng() % 16);
      if (u == 1) row_index[size_t(perm[size_t(i)])] = int32_t(rng() % T);
    }
    for (int64_t i = 0; i < n_slots; ++i) {  // irregular slots, ~2% each
      const uint32_t u = rng() % 50;
      const int64_t t = i / k;
      if (u == 0) row_of[size_t(i)] = -1 - int32_t(rng() % 3);
      if (u == 1) row_of[size_t(i)] = int32_t(rows + rng() % 100);
      if (u == 2) row_of[size_t(i)] = perm[size_t(rng() % n_slots)];  // most likely another token's row
      if (u == 3 && k > 1) row_of[size_t(i)] = row_of[size_t(t * k + int64_t(rng() % k))];  // duplicate
    }
    const auto dout = random_bf16(T, H, Dist::kHeavyTailed, rng);
    const auto y = random_bf16(rows, H, Dist::kGaussian, rng);
    const std::vector<float> w = random_weights(size_t(T * k), rng);
    DevBuf<uint16_t> ddout{dout.size()}, dy_in{y.size()}, ddy{size_t(rows * H)};
    DevBuf<int32_t> drow_of{row_of.size()}, drow_index{row_index.size()}, dused{1};
    DevBuf<float> dwt{w.size()}, ddw{w.size()}, drow_w{size_t(rows)};
    ddout.upload(dout);
    dy_in.upload(y);
    drow_of.upload(row_of);
    drow_index.upload(row_index);
    dwt.upload(w);
    for (int used_case = 0; used_case < 3; ++used_case) {  // null; cutting live rows; above rows
      const int64_t used_val = used_case == 1 ? rows * 4 / 5 : rows + 1000;
      const int64_t used = used_case == 0 ? rows : std::min(rows, used_val);
      dused.upload(std::vector<int32_t>{int32_t(used_val)});
      const int32_t* used_ptr = used_case == 0 ? nullptr : dused.p;
      for (const bool to_dy : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "T " << T << " k " << k << " H " << H << " rows " << rows << " used "
                                          << used << (used_case == 0 ? " (null)" : "") << (to_dy ? " dy" : " row_w"));
        // Poisoned outputs, a kernel's run, the downloads.
        struct Out { std::vector<uint16_t> dy; std::vector<float> row_w, dw; };
        auto run = [&](const std::function<void()>& launch) {
          MXMOE_ASSERT_CUDA(cudaMemset(ddy.p, 0xA5, ddy.n * 2));
          MXMOE_ASSERT_CUDA(cudaMemset(drow_w.p, 0xA5, drow_w.n * 4));
          MXMOE_ASSERT_CUDA(cudaMemset(ddw.p, 0xA5, ddw.n * 4));
          launch();
          MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
        };
        auto fetch = [&] { return Out{ddy.download(), drow_w.download(), ddw.download()}; };
        auto direct = [&](detail::CombineBackwardKernel kernel) {
          return [&, kernel] {
            detail::launch_moe_combine_backward(ddout.p, dy_in.p, rows, H, used_ptr, drow_index.p, drow_of.p, dwt.p, T,
                                                k, to_dy ? ddy.p : nullptr, to_dy ? nullptr : drow_w.p, ddw.p, kernel,
                                                nullptr);
          };
        };
        auto api = [&] {
          const auto* bdout = reinterpret_cast<const __nv_bfloat16*>(ddout.p);
          const auto* by = reinterpret_cast<const __nv_bfloat16*>(dy_in.p);
          if (to_dy)
            moe_combine_backward(bdout, by, rows, H, used_ptr, drow_index.p, drow_of.p, dwt.p, T, k,
                                 reinterpret_cast<__nv_bfloat16*>(ddy.p), ddw.p);
          else
            moe_combine_backward_scales(bdout, by, rows, H, used_ptr, drow_index.p, drow_of.p, dwt.p, T, k, drow_w.p,
                                        ddw.p);
        };
        run(direct(detail::CombineBackwardKernel::kTokens));
        const Out tok = fetch();
        run(direct(detail::CombineBackwardKernel::kTokens));  // rerun: the same bits
        const Out tok2 = fetch();
        run(direct(detail::CombineBackwardKernel::kRows));
        const Out row = fetch();
        Out env_rows, env_default;
        {
          ScopedEnv e("MXMOE_COMBINE_BWD", "rows");
          run(api);
          env_rows = fetch();
        }
        {
          ScopedEnv e("MXMOE_COMBINE_BWD", "tokens");
          run(api);
          env_default = fetch();
        }
        // The host replay, over the same poison.
        Out want{std::vector<uint16_t>(ddy.n, 0xA5A5), {}, {}};
        float poison;
        std::memset(&poison, 0xA5, 4);
        want.row_w.assign(drow_w.n, poison);
        want.dw.assign(ddw.n, poison);
        combine_backward_host(dout, y, H, used, row_index, row_of, w, T, k, to_dy ? &want.dy : nullptr,
                              to_dy ? nullptr : &want.row_w, want.dw);
        const struct { const char* what; const Out* got; } against_host[] = {
            {"token-major", &tok}, {"token-major rerun", &tok2}, {"row-major", &row},
            {"MXMOE_COMBINE_BWD=rows", &env_rows}, {"MXMOE_COMBINE_BWD=tokens", &env_default}};
        for (const auto& g : against_host) {
          int64_t i = first_bit_mismatch(g.got->dw, want.dw);
          EXPECT_LT(i, 0) << g.what << " dw first mismatch at [" << (i / k) << ", " << (i % k) << "]: got "
                          << (i < 0 ? 0.0f : g.got->dw[size_t(i)]) << " want " << (i < 0 ? 0.0f : want.dw[size_t(i)]);
          i = first_bit_mismatch(g.got->row_w, want.row_w);
          EXPECT_LT(i, 0) << g.what << " row_w first mismatch at row " << i << ": got "
                          << (i < 0 ? 0.0f : g.got->row_w[size_t(i)]) << " want "
                          << (i < 0 ? 0.0f : want.row_w[size_t(i)]);
          i = first_bit_mismatch(g.got->dy, want.dy);
          EXPECT_LT(i, 0) << g.what << " dy first mismatch at [" << (i < 0 ? 0 : i / H) << ", "
                          << (i < 0 ? 0 : i % H) << "]: got 0x" << std::hex << (i < 0 ? 0 : g.got->dy[size_t(i)])
                          << " want 0x" << (i < 0 ? 0 : want.dy[size_t(i)]) << std::dec;
        }
        // Token- vs row-major directly (the same as above when both match the host; this names the
        // A/B pair on its own).
        EXPECT_LT(first_bit_mismatch(tok.dw, row.dw), 0);
        EXPECT_LT(first_bit_mismatch(tok.row_w, row.row_w), 0);
        EXPECT_LT(first_bit_mismatch(tok.dy, row.dy), 0);
      }
    }
  }
}

// The router's weight gradient (launch_router_wgrad_fixed) bit for bit against a host replay of
// its documented order — per chunk of router_wgrad_chunk(T) tokens one fmaf chain in increasing t
// from +0, then the chunk partials added in chunk order — and against an FP64 sum within the FP32
// bound of that order: a chain of n roundings errs by at most γ_n · Σ_t |dl[t, e]·x[t, h]|,
// γ_n = n·u / (1 − n·u), u = 2^-24 (the products are exact inside fmaf); here n = (longest chunk)
// + (chunks − 1) <= T, so γ_T bounds it. Reruns give the same bits. Shapes: 12 chunks of 256 with
// E = 32 (one full expert tile); E = 45 (a partial second tile) with H = 288 (a partial 256-column
// tile); one chunk (T = 77, written without partials) with H = 96; E = 3 over 32 chunks of 288,
// the last one 72 long; T = 0 (dwr = +0 over a poisoned buffer).
TEST(MoeOpsGpu, RouterWgradIsItsFixedOrderWithinFp32BoundAndRerunsBitwise) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  std::normal_distribution<float> g(0.0f, 1.0f);
  struct Shape { int64_t T; int E; int H; };
  for (const Shape s : {Shape{3000, 32, 1024}, Shape{1000, 45, 288}, Shape{77, 8, 96}, Shape{9000, 3, 32},
                        Shape{0, 16, 256}}) {
    SCOPED_TRACE(::testing::Message() << "T " << s.T << " E " << s.E << " H " << s.H);
    const int64_t T = s.T, E = s.E, H = s.H;
    const auto x = random_bf16(T, H, Dist::kGaussian, rng);
    std::vector<float> dl(size_t(T * E));
    for (auto& v : dl) v = std::ldexp(g(rng), int(rng() % 9) - 4);  // mixed magnitudes
    DevBuf<uint16_t> dx{x.size()};
    DevBuf<float> ddl{dl.size()}, dpart{std::max<size_t>(1, detail::router_wgrad_partial_floats(T, s.E, s.H))},
        dwr{size_t(E * H)}, dwr2{size_t(E * H)};
    dx.upload(x);
    ddl.upload(dl);
    detail::launch_router_wgrad_fixed(ddl.p, dx.p, T, s.E, s.H, dpart.p, dwr.p, nullptr);
    detail::launch_router_wgrad_fixed(ddl.p, dx.p, T, s.E, s.H, dpart.p, dwr2.p, nullptr);
    MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
    const auto got = dwr.download(), got2 = dwr2.download();
    EXPECT_LT(first_bit_mismatch(got, got2), 0) << "rerun differs";
    if (T == 0) {
      EXPECT_LT(first_bit_mismatch(got, std::vector<float>(got.size(), 0.0f)), 0) << "T = 0 must give dwr = +0";
      continue;
    }
    // host replay of the order, and the FP64 sum with Σ|terms|
    const int64_t chunk = detail::router_wgrad_chunk(T);
    std::vector<float> want(size_t(E * H)), part(size_t(E * H));
    std::vector<double> exact(size_t(E * H), 0.0), mag(size_t(E * H), 0.0);
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
      std::fill(part.begin(), part.end(), 0.0f);
      for (int64_t t = t0; t < std::min(T, t0 + chunk); ++t)
        for (int64_t e = 0; e < E; ++e) {
          const float d = dl[size_t(t * E + e)];
          for (int64_t h = 0; h < H; ++h) {
            const float xv = ref::bf16_to_float(x[size_t(t * H + h)]);
            const size_t i = size_t(e * H + h);
            part[i] = std::fmaf(d, xv, part[i]);
            exact[i] += double(d) * xv;
            mag[i] += std::fabs(double(d) * xv);
          }
        }
      for (size_t i = 0; i < want.size(); ++i) want[i] = t0 == 0 ? part[i] : want[i] + part[i];
    }
    const int64_t mm = first_bit_mismatch(got, want);
    EXPECT_LT(mm, 0) << "first mismatch against the host replay at [" << mm / H << ", " << mm % H << "]: got "
                     << got[size_t(std::max<int64_t>(mm, 0))] << " want " << want[size_t(std::max<int64_t>(mm, 0))];
    const double u = std::ldexp(1.0, -24), gamma = double(T) * u / (1.0 - double(T) * u);
    int64_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (std::fabs(double(got[i]) - exact[i]) > gamma * mag[i] && bad++ == 0)
        ADD_FAILURE() << "first element outside the FP32 bound at [" << i / size_t(H) << ", " << i % size_t(H)
                      << "]: got " << got[i] << " FP64 " << exact[i] << " bound " << gamma * mag[i];
    EXPECT_EQ(bad, 0);
  }
}

// The un-permute with the router's part of dX computed in place (launch_moe_combine_router_dgrad)
// bit for bit against the two-step path it replaces in the layers — launch_router_dgrad_fixed into
// an FP32 [T, H] buffer, then launch_moe_combine with it as the addend — and against a host replay
// (slot sum in slot order with fmaf, plus one fmaf chain over e from +0, one FP32 add, BF16 RNE).
// Unweighted (the layers' call) and weighted. Shapes: T not a multiple of the kernel's 4 tokens
// per warp or 32 per CTA; H = 96 and 288 (a partial 256-column slab); E = 5, 33, 72; k = 1, 3, 8
// with dropped (-1) and out-of-range slots; T = 0 (nothing written over a poisoned buffer).
TEST(MoeOpsGpu, CombineWithRouterDgradEqualsDgradThenCombineBitwise) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::uniform_real_distribution<float> uw(0.0f, 1.0f);
  struct Shape { int64_t T; int64_t H; int E; int k; };
  for (const Shape s : {Shape{333, 2048, 32, 8}, Shape{45, 96, 5, 3}, Shape{2, 7168, 72, 8}, Shape{130, 288, 33, 1},
                        Shape{0, 256, 8, 2}}) {
    SCOPED_TRACE(::testing::Message() << "T " << s.T << " H " << s.H << " E " << s.E << " k " << s.k);
    const int64_t T = s.T, H = s.H, E = s.E, k = s.k, y_rows = T * k + 64;
    const auto y = random_bf16(y_rows, H, Dist::kGaussian, rng);
    const auto wr = random_bf16(E, H, Dist::kGaussian, rng);
    std::vector<int32_t> row_of(size_t(T * k));
    std::vector<float> w(size_t(T * k)), dl(size_t(T * E));
    for (auto& r : row_of) {
      const uint32_t c = rng() % 40;
      r = c == 0 ? -1 : c == 1 ? int32_t(y_rows + rng() % 5) : int32_t(rng() % y_rows);  // dropped, out of range
    }
    for (auto& v : w) v = uw(rng);
    for (auto& v : dl) v = std::ldexp(g(rng), int(rng() % 7) - 6);
    const size_t out_n = size_t(std::max<int64_t>(T * H, 8));  // T = 0: one poisoned vector that must stay
    DevBuf<uint16_t> dy{y.size()}, dwr{wr.size()}, two_step{out_n}, fused{out_n};
    DevBuf<int32_t> drow{row_of.size()};
    DevBuf<float> dw{w.size()}, ddl{dl.size()}, dxr{size_t(T * H)};
    dy.upload(y);
    dwr.upload(wr);
    drow.upload(row_of);
    dw.upload(w);
    ddl.upload(dl);
    for (const bool weighted : {false, true}) {
      SCOPED_TRACE(weighted ? "weighted" : "unweighted (the un-permute)");
      const float* wp = weighted ? dw.p : nullptr;
      detail::launch_router_dgrad_fixed(ddl.p, dwr.p, T, s.E, int(H), dxr.p, nullptr);
      detail::launch_moe_combine(dy.p, y_rows, H, drow.p, wp, T, s.k, dxr.p, nullptr, two_step.p, nullptr);
      detail::launch_moe_combine_router_dgrad(dy.p, y_rows, H, drow.p, wp, T, s.k, ddl.p, dwr.p, s.E, fused.p,
                                              nullptr);
      MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
      const auto a = two_step.download(), b = fused.download();
      const int64_t mm = first_bit_mismatch(b, a);
      EXPECT_LT(mm, 0) << "first mismatch at [" << mm / std::max<int64_t>(H, 1) << ", " << mm % H << "]: fused 0x"
                       << std::hex << b[size_t(std::max<int64_t>(mm, 0))] << " two-step 0x"
                       << a[size_t(std::max<int64_t>(mm, 0))];
      if (T == 0) {
        EXPECT_LT(first_bit_mismatch(b, std::vector<uint16_t>(b.size(), 0xA5A5)), 0) << "T = 0 wrote";
        continue;
      }
      int64_t bad = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t n = 0; n < H; ++n) {
          float acc = 0.0f, r = 0.0f;
          for (int64_t j = 0; j < k; ++j) {
            const int32_t row = row_of[size_t(t * k + j)];
            if (row < 0 || row >= y_rows) continue;
            acc = std::fmaf(weighted ? w[size_t(t * k + j)] : 1.0f, ref::bf16_to_float(y[size_t(row * H + n)]), acc);
          }
          for (int64_t e = 0; e < E; ++e)
            r = std::fmaf(dl[size_t(t * E + e)], ref::bf16_to_float(wr[size_t(e * H + n)]), r);
          const uint16_t want = ref::float_to_bf16(acc + r);
          if (b[size_t(t * H + n)] != want && bad++ == 0)
            ADD_FAILURE() << "first mismatch against the host replay at [" << t << ", " << n << "]: got 0x" << std::hex
                          << b[size_t(t * H + n)] << " want 0x" << want;
        }
      EXPECT_EQ(bad, 0);
    }
  }
}
