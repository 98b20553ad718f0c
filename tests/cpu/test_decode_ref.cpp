// Warp decode on the CPU: the FP64 reference (src/ref/decode_ref.h) against naive loops and
// hand-made routing cases (ties, group limit, bias, shared expert), the argument checks of
// include/mxmoe/decode.h (each bad argument throws mxmoe::Error naming it, before any CUDA
// call; pointers here are never dereferenced), and the dispatcher's table.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/scoped_env.h"
#include "mxmoe/decode.h"
#include "ref/decode_ref.h"
#include "ref/mx_ref.h"

using namespace mxmoe;

namespace {

void expect_error_naming(const std::function<void()>& f, const std::string& arg) {
  try {
    f();
    FAIL() << "no error; expected one naming '" << arg << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'" + arg + "'"), std::string::npos) << e.what();
  }
}

template <class T = void>
T* fake(uintptr_t a) { return reinterpret_cast<T*>(a); }

ref::RouterRefParams softmax(int k) {
  ref::RouterRefParams p;
  p.top_k = k;
  return p;
}

}  // namespace

TEST(DecodeRef, SoftmaxTopKTiesGoToLowerId) {
  // Logits of one token: experts 1 and 3 tie at 2.0, expert 5 at 3.0.
  const std::vector<double> l = {0.5, 2.0, -1.0, 2.0, 1.0, 3.0};
  const ref::RouterRefResult r = ref::route_from_logits(l, 1, 6, softmax(3));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{5, 1, 3}));
  const double z = std::exp(0.0) + 2 * std::exp(-1.0);
  EXPECT_NEAR(r.weights[0], 1.0 / z, 1e-15);
  EXPECT_NEAR(r.weights[1], std::exp(-1.0) / z, 1e-15);
  EXPECT_EQ(r.weights[1], r.weights[2]);
  EXPECT_EQ(r.margin[0], 0.0);  // the tie is a decision with no margin
  // Without renormalisation: softmax over all six experts, times the scaling factor.
  ref::RouterRefParams p = softmax(3);
  p.renormalize = false;
  p.scaling_factor = 2.0;
  const ref::RouterRefResult q = ref::route_from_logits(l, 1, 6, p);
  double all = 0;
  for (double v : l) all += std::exp(v - 3.0);
  EXPECT_NEAR(q.weights[0], 2.0 / all, 1e-15);
}

TEST(DecodeRef, SigmoidGroupLimitAndBias) {
  // 8 experts in 4 groups of 2, keep 2 groups, pick 2 experts. Bias steers selection only.
  const std::vector<double> l = {3.0, -3.0, 1.0, 0.9, 2.5, 2.4, -1.0, -2.0};
  std::vector<float> bias(8, 0.0f);
  bias[6] = 10.0f;  // group 3 = {6, 7} wins through expert 6's bias (its top-2 sum is 10.27 + 0.12)
  ref::RouterRefParams p;
  p.sigmoid = true;
  p.top_k = 2;
  p.n_groups = 4;
  p.topk_groups = 2;
  p.scaling_factor = 2.5;
  p.bias = bias.data();
  const ref::RouterRefResult r = ref::route_from_logits(l, 1, 8, p);
  auto sig = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  // Group scores: g0 = s(3)+s(-3) = 1.0, g1 = s(1)+s(.9) = 1.44, g2 = s(2.5)+s(2.4) = 1.84,
  // g3 = s(-1)+10 + s(-2) = 10.39 → keep g3 and g2; experts by score: 6 (10.27), 4 (0.924).
  EXPECT_EQ(r.ids, (std::vector<int32_t>{6, 4}));
  const double s6 = sig(-1.0), s4 = sig(2.5);
  EXPECT_NEAR(r.weights[0], 2.5 * s6 / (s6 + s4), 1e-15);  // weight from s, not s + bias
  EXPECT_NEAR(r.weights[1], 2.5 * s4 / (s6 + s4), 1e-15);
  // Expert 0 has the largest logit but its group is dropped.
  p.n_groups = 1;
  p.topk_groups = 1;
  const ref::RouterRefResult r1 = ref::route_from_logits(l, 1, 8, p);
  EXPECT_EQ(r1.ids, (std::vector<int32_t>{6, 0}));
}

TEST(DecodeRef, RouterLogitsMatchNaiveLoop) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> u(-16, 16);
  const int B = 3, H = 64, E = 10;
  std::vector<uint16_t> x(B * H), w(E * H);
  for (auto& v : x) v = ref::float_to_bf16(float(u(rng)) / 8);
  for (auto& v : w) v = ref::float_to_bf16(float(u(rng)) / 256);
  const ref::RouterRefResult r = ref::decode_router(x.data(), B, H, w.data(), E, softmax(4));
  for (int b = 0; b < B; ++b)
    for (int e = 0; e < E; ++e) {
      double s = 0;
      for (int h = 0; h < H; ++h) s += ref::bf16_to_float(x[b * H + h]) * ref::bf16_to_float(w[e * H + h]);
      EXPECT_EQ(r.logits[b * E + e], s);
    }
  for (int b = 0; b < B; ++b) {
    double sum = 0;
    for (int j = 0; j < 4; ++j) {
      sum += r.weights[b * 4 + j];
      if (j) {
        EXPECT_GE(r.logits[b * E + r.ids[b * 4 + j - 1]], r.logits[b * E + r.ids[b * 4 + j]]);
      }
    }
    EXPECT_NEAR(sum, 1.0, 1e-14);
  }
}

// Gate/up and down on integer-valued data against a direct loop over the definition.
TEST(DecodeRef, ExpertsMatchNaiveLoopWithSharedExpert) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> u(-3, 3);
  const int B = 2, H = 8, I = 4, E = 3, k = 2;
  auto rnd = [&](size_t n) {
    std::vector<double> v(n);
    for (auto& x : v) x = u(rng);
    return v;
  };
  ref::ExpertsRef w1, w2;
  w1.n = 2 * I;
  w1.k = H;
  w2.n = H;
  w2.k = I;
  for (int e = 0; e < E; ++e) {
    w1.experts.push_back(rnd(2 * I * H));
    w2.experts.push_back(rnd(H * I));
  }
  w1.shared = rnd(2 * I * H);
  w2.shared = rnd(H * I);
  const std::vector<double> x = rnd(B * H);
  const std::vector<int32_t> ids = {2, 0, 1, 2};
  const std::vector<double> wt = {0.75, 0.25, 0.5, 1.5};

  const ref::GateUpRef g = ref::decode_gate_up(x, B, H, I, w1, ids.data(), k);
  ASSERT_EQ(g.slots, 3);
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < 3; ++j) {
      const std::vector<double>& w = j < k ? w1.experts[ids[b * k + j]] : w1.shared;
      for (int i = 0; i < I; ++i) {
        double gg = 0, uu = 0;
        for (int h = 0; h < H; ++h) {
          gg += x[b * H + h] * w[i * H + h];
          uu += x[b * H + h] * w[(I + i) * H + h];
        }
        const size_t o = (b * 3 + j) * I + i;
        EXPECT_EQ(g.g[o], gg);
        EXPECT_EQ(g.u[o], uu);
        EXPECT_DOUBLE_EQ(g.h[o], gg / (1 + std::exp(-gg)) * uu);
      }
    }

  const std::vector<double> h = rnd(B * 3 * I);  // integer h: the down sum is exact
  std::vector<double> out, out_abs;
  ref::decode_down(h, B, I, H, w2, ids.data(), wt.data(), k, &out, &out_abs);
  for (int b = 0; b < B; ++b)
    for (int n = 0; n < H; ++n) {
      double want = 0, wabs = 0;
      for (int j = 0; j < 3; ++j) {
        const std::vector<double>& w = j < k ? w2.experts[ids[b * k + j]] : w2.shared;
        const double wj = j < k ? wt[b * k + j] : 1.0;
        double d = 0, da = 0;
        for (int i = 0; i < I; ++i) {
          d += h[(b * 3 + j) * I + i] * w[n * I + i];
          da += std::fabs(h[(b * 3 + j) * I + i] * w[n * I + i]);
        }
        want += wj * d;
        wabs += std::fabs(wj) * da;
      }
      EXPECT_EQ(out[b * H + n], want);
      EXPECT_EQ(out_abs[b * H + n], wabs);
    }
}

TEST(DecodeRef, MissingExpertIsAnError) {
  ref::ExpertsRef w1;
  w1.n = 8;
  w1.k = 8;
  w1.experts.resize(2);
  const std::vector<double> x(8, 1.0);
  const int32_t ids[1] = {1};
  EXPECT_THROW(ref::decode_gate_up(x, 1, 8, 4, w1, ids, 1), std::invalid_argument);
}

// Well-formed (fake, never dereferenced) router arguments: every check passes unless a test spoils one.
struct RouterArgs {
  const __nv_bfloat16* x = fake<const __nv_bfloat16>(0x10000);
  const __nv_bfloat16* wr = fake<const __nv_bfloat16>(0x20000);
  int32_t* ids = fake<int32_t>(0x30000);
  float* w = fake<float>(0x40000);
  RouterParams p = [] {
    RouterParams q;
    q.top_k = 4;
    return q;
  }();
};

TEST(DecodeArgs, RouterRejectsBadArguments) {
  const RouterArgs a;
  const auto* x = a.x;
  const auto* wr = a.wr;
  int32_t* ids = a.ids;
  float* w = a.w;
  const RouterParams& p = a.p;
  auto call = [&](const __nv_bfloat16* xx, int B, int H, int E, const RouterParams& pp) {
    decode_router(xx, B, H, wr, E, pp, ids, w);
  };
  expect_error_naming([&] { call(nullptr, 1, 64, 16, p); }, "x");
  expect_error_naming([&] { call(fake<const __nv_bfloat16>(0x10002), 1, 64, 16, p); }, "x");
  expect_error_naming([&] { call(x, 0, 64, 16, p); }, "batch");
  expect_error_naming([&] { call(x, kDecodeMaxBatch + 1, 64, 16, p); }, "batch");
  expect_error_naming([&] { call(x, 1, 60, 16, p); }, "hidden");
  expect_error_naming([&] { call(x, 1, 64, 0, p); }, "num_experts");
  expect_error_naming([&] { call(x, 1, 64, kDecodeMaxExperts + 1, p); }, "num_experts");
  expect_error_naming([&] { call(x, 1, 64, 3, p); }, "params.top_k");
  RouterParams q = p;
  q.top_k = 0;
  expect_error_naming([&] { call(x, 1, 64, 16, q); }, "params.top_k");
  q = p;
  q.n_groups = 2;
  expect_error_naming([&] { call(x, 1, 64, 16, q); }, "params.n_groups");  // softmax: no groups
  q = p;
  q.bias = fake<const float>(0x50000);
  expect_error_naming([&] { call(x, 1, 64, 16, q); }, "params.bias");
  q = p;
  q.scoring = RouterScoring::kSigmoid;
  q.n_groups = 3;
  expect_error_naming([&] { call(x, 1, 64, 16, q); }, "params.n_groups");  // 16 % 3 != 0
  q.n_groups = 4;
  q.topk_groups = 5;
  expect_error_naming([&] { call(x, 1, 64, 16, q); }, "params.topk_groups");
  q.topk_groups = 1;
  q.top_k = 5;  // one group of 4 experts cannot give 5
  expect_error_naming([&] { call(x, 1, 64, 16, q); }, "params.top_k");
  q = p;
  q.scaling_factor = NAN;
  expect_error_naming([&] { call(x, 1, 64, 16, q); }, "params.scaling_factor");
  expect_error_naming([&] { decode_router(x, 1, 64, nullptr, 16, p, ids, w); }, "router_w");
  expect_error_naming([&] { decode_router(x, 1, 64, wr, 16, p, nullptr, w); }, "topk_ids");
  expect_error_naming([&] { decode_router(x, 1, 64, wr, 16, p, ids, fake<float>(0x40002)); }, "topk_weights");
}

// The router's A/B switches (read per call): a bad value throws before any launch, naming the variable.
TEST(DecodeArgs, RouterSwitchesRejectBadValues) {
  const RouterArgs a;
  const auto route = [&](int E) { decode_router(a.x, 1, 64, a.wr, E, a.p, a.ids, a.w); };
  for (const auto& [var, val] : std::vector<std::pair<const char*, const char*>>{
           {"MXMOE_ROUTER_ARGMAX", "fast"}, {"MXMOE_ROUTER_SLOTS", "2"}, {"MXMOE_ROUTER_CLUSTER", "32"},
           {"MXMOE_ROUTER_XSMEM", "2"}, {"MXMOE_ROUTER_UNROLL", "4"}, {"MXMOE_ROUTER_SELECT", "tree"}}) {
    const mxmoe::test::ScopedEnv env(var, val);
    expect_error_naming([&] { route(16); }, var);
  }
  const mxmoe::test::ScopedEnv env("MXMOE_ROUTER_SLOTS", "4");  // 4 scores a lane hold 128 experts, not 200
  expect_error_naming([&] { route(200); }, "MXMOE_ROUTER_SLOTS");
}

// Arguments of decode_gate_up / decode_down that pass their checks (fake, aligned, never dereferenced:
// every call below throws before any launch).
struct ExpertArgs {
  const __nv_bfloat16* x = fake<const __nv_bfloat16>(0x10000);
  const int32_t* ids = fake<const int32_t>(0x30000);
  const float* wt = fake<const float>(0x40000);
  void* h = fake(0x60000);
  __nv_bfloat16* out = fake<__nv_bfloat16>(0x70000);
  DecodeWeights bf = weights(DecodeWeightDtype::kBF16);
  DecodeWeights mx = weights(DecodeWeightDtype::kMXFP8);
  DecodeHDtype f32 = DecodeHDtype::kFP32;

  static DecodeWeights weights(DecodeWeightDtype d) {
    DecodeWeights w;
    w.dtype = d;
    w.data = fake(0x80000);
    if (d == DecodeWeightDtype::kMXFP8) w.scales = fake<const uint8_t>(0x90000);
    return w;
  }
};

// The gate/up and down kernels' A/B switches (read per call, after the argument checks): a bad value
// throws before any launch, naming the variable.
TEST(DecodeArgs, ExpertKernelSwitchesRejectBadValues) {
  const auto& [x, ids, wt, h, out, bf, mx, f32] = ExpertArgs();
  for (const auto& [var, val] : std::vector<std::pair<const char*, const char*>>{
           {"MXMOE_DECODE_MX_GATE_UP_CTAS", "5"}, {"MXMOE_DECODE_GATE_UP_PERSIST", "5"},
           {"MXMOE_DECODE_ORDER", "columns"}, {"MXMOE_DECODE_SHARED_FIRST", "2"}}) {
    const mxmoe::test::ScopedEnv env(var, val);
    expect_error_naming([&] { decode_gate_up(x, 2, 64, 64, mx, 8, ids, 2, h, f32); }, var);
  }
  for (const auto& [var, val] : std::vector<std::pair<const char*, const char*>>{
           {"MXMOE_DECODE_ORDER", "cols"}, {"MXMOE_DECODE_DOWN_REGS", "96"}, {"MXMOE_DECODE_DOWN_BALANCE", "2"}}) {
    const mxmoe::test::ScopedEnv env(var, val);
    expect_error_naming([&] { decode_down(h, f32, 2, 64, 64, mx, 8, ids, wt, 2, out); }, var);
  }
  const mxmoe::test::ScopedEnv persist("MXMOE_DECODE_DOWN_PERSIST", "0");  // the balanced walk is persistent
  const mxmoe::test::ScopedEnv balance("MXMOE_DECODE_DOWN_BALANCE", "1");
  expect_error_naming([&] { decode_down(h, f32, 2, 64, 64, mx, 8, ids, wt, 2, out); }, "MXMOE_DECODE_DOWN_BALANCE");
}

TEST(DecodeArgs, ExpertKernelsRejectBadArguments) {
  const auto& [x, ids, wt, h, out, bf, mx, f32] = ExpertArgs();

  expect_error_naming([&] { decode_gate_up(nullptr, 1, 64, 64, bf, 8, ids, 2, h, f32); }, "x");
  expect_error_naming([&] { decode_gate_up(x, 0, 64, 64, bf, 8, ids, 2, h, f32); }, "batch");
  expect_error_naming([&] { decode_gate_up(x, 1, 68, 64, bf, 8, ids, 2, h, f32); }, "hidden");
  expect_error_naming([&] { decode_gate_up(x, 1, 64, 20, bf, 8, ids, 2, h, f32); }, "inter");
  expect_error_naming([&] { decode_gate_up(x, 1, 64, 40, mx, 8, ids, 2, h, f32); }, "inter");  // MX: % 32
  expect_error_naming([&] { decode_gate_up(x, 1, 48, 64, mx, 8, ids, 2, h, f32); }, "hidden");
  DecodeWeights bad = bf;
  bad.data = fake(0x80008);
  expect_error_naming([&] { decode_gate_up(x, 1, 64, 64, bad, 8, ids, 2, h, f32); }, "w1.data");
  bad = bf;
  bad.scales = fake<const uint8_t>(0x90000);
  expect_error_naming([&] { decode_gate_up(x, 1, 64, 64, bad, 8, ids, 2, h, f32); }, "w1.scales");
  bad = mx;
  bad.scales = nullptr;
  expect_error_naming([&] { decode_gate_up(x, 1, 64, 64, bad, 8, ids, 2, h, f32); }, "w1.scales");
  bad = mx;
  bad.shared_data = fake(0xA0000);
  expect_error_naming([&] { decode_gate_up(x, 1, 64, 64, bad, 8, ids, 2, h, f32); }, "w1.shared_scales");
  bad = bf;
  bad.shared_data = fake(0xA0004);
  expect_error_naming([&] { decode_gate_up(x, 1, 64, 64, bad, 8, ids, 2, h, f32); }, "w1.shared_data");
  bad = bf;
  bad.dtype = DecodeWeightDtype(5);
  expect_error_naming([&] { decode_gate_up(x, 1, 64, 64, bad, 8, ids, 2, h, f32); }, "w1.dtype");
  expect_error_naming([&] { decode_gate_up(x, 1, 64, 64, bf, 8, ids, 9, h, f32); }, "top_k");
  expect_error_naming([&] { decode_gate_up(x, 1, 64, 64, bf, 8, nullptr, 2, h, f32); }, "topk_ids");
  expect_error_naming([&] { decode_gate_up(x, 1, 64, 64, bf, 8, ids, 2, fake(0x60004), f32); }, "h");
  expect_error_naming([&] { decode_gate_up(x, 1, 64, 64, bf, 8, ids, 2, h, DecodeHDtype(3)); }, "h_dtype");

  expect_error_naming([&] { decode_down(nullptr, f32, 1, 64, 64, bf, 8, ids, wt, 2, out); }, "h");
  expect_error_naming([&] { decode_down(h, f32, 5000, 64, 64, bf, 8, ids, wt, 2, out); }, "batch");
  expect_error_naming([&] { decode_down(h, f32, 1, 64, 100, mx, 8, ids, wt, 2, out); }, "hidden");
  expect_error_naming([&] { decode_down(h, f32, 1, 64, 64, bf, 8, ids, nullptr, 2, out); }, "topk_weights");
  expect_error_naming([&] { decode_down(h, f32, 1, 64, 64, bf, 8, ids, wt, 0, out); }, "top_k");
  expect_error_naming([&] { decode_down(h, f32, 1, 64, 64, bf, 8, ids, wt, 2, nullptr); }, "out");
  expect_error_naming([&] { decode_down(h, f32, 1, 64, 64, bf, 0, ids, wt, 2, out); }, "num_experts");
  bad = bf;
  bad.data = nullptr;
  expect_error_naming([&] { decode_down(h, f32, 1, 64, 64, bad, 8, ids, wt, 2, out); }, "w2.data");
}

TEST(DecodeDispatch, TableSplitsByBatch) {
  // The measured table (bench_decode.py): largest batch where warp decode beat the expert-centric
  // step (runs 96 and 131, every graph timed in alternation).
  const struct { DecodeShape shape; DecodeWeightDtype dtype; int max_batch; } want[] = {
      {{2048, 768, 128, 8, false}, DecodeWeightDtype::kBF16, 32},
      {{2048, 768, 128, 8, false}, DecodeWeightDtype::kMXFP8, 16},
      {{4096, 1536, 128, 8, false}, DecodeWeightDtype::kBF16, 16},
      {{4096, 1536, 128, 8, false}, DecodeWeightDtype::kMXFP8, 16},
      {{7168, 2048, 256, 8, true}, DecodeWeightDtype::kBF16, 16},
      {{7168, 2048, 256, 8, true}, DecodeWeightDtype::kMXFP8, 16}};
  for (const auto& w : want) {
    const DecodeCrossover c = decode_crossover(w.shape, w.dtype);
    EXPECT_TRUE(c.measured);
    EXPECT_EQ(c.max_batch, w.max_batch);
    EXPECT_EQ(choose_decode_path(w.shape, w.dtype, 1), DecodePath::kWarpDecode);
    EXPECT_EQ(choose_decode_path(w.shape, w.dtype, c.max_batch), DecodePath::kWarpDecode);
    EXPECT_EQ(choose_decode_path(w.shape, w.dtype, c.max_batch + 1), DecodePath::kExpertCentric);
  }
  // The same dimensions without DeepSeek's shared expert are another shape: not in the table.
  EXPECT_FALSE(decode_crossover({7168, 2048, 256, 8, false}, DecodeWeightDtype::kBF16).measured);
  const DecodeShape other{1024, 512, 64, 6, false};
  EXPECT_FALSE(decode_crossover(other, DecodeWeightDtype::kBF16).measured);
  EXPECT_EQ(choose_decode_path(other, DecodeWeightDtype::kBF16, 1), DecodePath::kWarpDecode);
}

// The expert-centric recipe's error against the FP64 decode reference (the oracle of both paths),
// measured on the CPU with the GPU test's data model: Gaussian x (σ 1) and weights (σ 1/√K),
// BF16, MX-quantized weights for MXFP8. It justifies the GPU test's bounds
// (tests/gpu/test_decode_gpu.cpp, ExpertCentric*): BF16 recipe (GU, H, Y stored in BF16, each
// 2^-8 relative at most, RMS ≈ 2^-8/√3·… per rounding) well below 1%; MXFP8 recipe (x and H
// quantized to E4M3, 3 mantissa bits: RMS relative error ≈ 2^-4/√3 ≈ 3.6% per element, about
// 5% on h through SwiGLU, ≈ 6% on out) between 2% and 10%.
TEST(DecodeRef, ExpertCentricRecipeErrorAgainstFp64) {
  using namespace mxmoe::ref;
  std::mt19937 rng(1234);
  const int B = 24, H = 256, I = 128, E = 8, k = 3;
  std::normal_distribution<float> g(0.0f, 1.0f);
  auto rand_bf16 = [&](int64_t n, float sc) {
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (auto& e : v) e = float_to_bf16(g(rng) * sc);
    return v;
  };
  std::vector<int32_t> ids(size_t(B) * k);
  std::vector<double> wts(ids.size());
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < k; ++j) {
      ids[size_t(b) * k + j] = (b + 3 * j) % E;  // distinct for k = 3 < E / 2
      wts[size_t(b) * k + j] = 0.2 + 0.1 * j;
    }
  for (bool mx : {false, true}) {
    SCOPED_TRACE(mx ? "mxfp8" : "bf16");
    // weights: the FP64 reference sees the given values (BF16 or MX deq), the recipe the GEMMs' values
    ExpertsRef w1, w2, w1g, w2g;
    auto fill = [&](ExpertsRef& given, ExpertsRef& gemm, int64_t n, int64_t kk) {
      given.n = gemm.n = n;
      given.k = gemm.k = kk;
      auto make = [&](std::vector<double>& gv, std::vector<double>& mv) {
        const std::vector<uint16_t> w = rand_bf16(n * kk, 1.0f / std::sqrt(float(kk)));
        if (mx) {
          const MxMatrix m = quantize_rows(w.data(), n, kk, ScaleMode::kRceil);
          gv = dequantize(m);
          const std::vector<uint16_t> img = dequantize_bf16(m);
          mv = fast_form_values(img.data(), n, kk);
        } else {
          gv.resize(w.size());
          for (size_t i = 0; i < w.size(); ++i) gv[i] = bf16_to_float(w[i]);
          mv = gv;
        }
      };
      given.experts.resize(size_t(E));
      gemm.experts.resize(size_t(E));
      for (int e = 0; e < E; ++e) make(given.experts[size_t(e)], gemm.experts[size_t(e)]);
      make(given.shared, gemm.shared);
    };
    fill(w1, w1g, 2 * I, H);
    fill(w2, w2g, H, I);
    const std::vector<uint16_t> xb = rand_bf16(int64_t(B) * H, 1.0f);
    std::vector<double> x(xb.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_float(xb[i]);
    const GateUpRef gu = decode_gate_up(x, B, H, I, w1, ids.data(), k);
    std::vector<double> want;
    decode_down(gu.h, B, I, H, w2, ids.data(), wts.data(), k, &want, nullptr);
    const std::vector<double> got = decode_expert_centric(xb, B, H, I, w1g, w2g, ids.data(), wts.data(), k, mx);
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      num += (got[i] - want[i]) * (got[i] - want[i]);
      den += want[i] * want[i];
    }
    const double rel = std::sqrt(num / den);
    std::printf("expert-centric recipe (%s) vs FP64: relative Frobenius error %.4f\n", mx ? "mxfp8" : "bf16", rel);
    if (mx) {
      EXPECT_GT(rel, 0.02);
      EXPECT_LT(rel, 0.10);
    } else {
      EXPECT_LT(rel, 0.01);
    }
  }
}
