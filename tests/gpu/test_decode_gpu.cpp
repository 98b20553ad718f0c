// Warp decode (include/mxmoe/decode.h) on the GPU against the FP64 reference (src/ref/decode_ref.h).
// Weights are made on the CPU (MXFP8: ref::quantize_rows) and uploaded; only the experts the GPU
// router picks are filled, every other expert stays poisoned with 0xFF bytes (NaN in BF16, E4M3
// and E8M0), so reading a wrong expert shows up as NaN. h and out are poisoned before each launch.
// Each kernel is checked on its own: the router against the reference router; gate/up against the
// reference gate/up on the GPU's ids; down against the reference down fed with the GPU's h and
// routing weights (exact inputs), so no error is propagated from one kernel to the next.
//
// Test data: X = integers in [-16, 16] / 8 and Wr = integers in [-16, 16] / 256 (exact BF16).
// Every router product is a multiple of 2^-11 and every partial sum stays below 2^13 in
// magnitude (H <= 4096 · 2 · 1/16), so it needs at most 24 significant bits: the GPU's FP32
// logits are exact, whatever the summation order. Expert weights: Gaussian / sqrt(K), rounded
// to BF16 (then MX-quantized for MXFP8).
//
// Tolerances (derivation). u = 2^-24 (FP32 unit roundoff), γ_n = n·u / (1 − n·u).
//  * A dot product of n exact products summed in FP32 in any order (with or without FMA) is off
//    by at most γ_n · Σ|p_i|. A kernel's longest addition chain for length K is below K + 64
//    (in-chunk chain, chunks of a lane, MX chunk-scale FMA, 5 butterfly levels), so
//    Δg = γ_{H+64}·Σ|x·w_gate|, Δu likewise.
//  * SwiGLU: |silu'(g)| <= 1.1, so |Δh| <= 1.1·Δg·(|u| + Δu) + |silu(g)|·Δu; evaluating
//    g/(1+expf(−g))·u in FP32 adds at most ~6 roundings (expf is within 2 ulp), bounded by
//    2^-20 relative. BF16 h adds the BF16 unit roundoff 2^-8 relative (8-bit significand).
//  * Down, on the GPU's h and weights: slot dot products γ_{I+64}·Σ|h·w2| each, plus the FP32
//    sum over S slots, γ_{S+1}·Σ_j |w_j·d_j|; both bounded with out_abs = Σ_j |w_j|·Σ_i|h·w2|:
//    Δ = γ_{I+S+66}·out_abs; then BF16 output rounding 2^-8·(|out| + Δ).
//  * Router weights: logits exact; softmax w = expf(l−m)/Σ (l−m exact), sigmoid w = s/Σs with
//    s = 1/(1+expf(−l)): fewer than k + 6 roundings of at most 2 ulp each → 2^-17 relative for
//    k <= 8 (38·2^-24 < 2^-17). Ids: softmax selects on the exact logits, so ids must match the
//    reference exactly (ties → lower id on both sides). Sigmoid scores carry ~4 ulp of error, so
//    ids are compared wherever the reference's decision margin exceeds 1e-5 (at most a few
//    tokens with near-ties are skipped, and the test requires that most are compared).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/gpu_test_util.h"
#include "common/scoped_env.h"
#include "mxmoe/decode.h"
#include "ref/decode_ref.h"
#include "ref/mx_ref.h"

using namespace mxmoe;
using namespace mxmoe::test;

namespace {

constexpr double kU = 1.0 / 16777216.0;  // 2^-24
double gamma_n(double n) { return n * kU / (1.0 - n * kU); }

struct Config {
  const char* name;
  int H, I, E, k;
  bool shared;
  bool sigmoid;
  int n_groups, topk_groups;
  float scaling;
};

const Config kQwenSmall{"qwen-style small", 512, 256, 16, 4, false, false, 1, 1, 1.0f};
const Config kDsSmall{"deepseek-style small", 512, 256, 16, 4, true, true, 4, 2, 2.5f};
const Config kQwen30B{"Qwen3-30B-A3B", 2048, 768, 128, 8, false, false, 1, 1, 1.0f};

const char* dtype_name(DecodeWeightDtype d) { return d == DecodeWeightDtype::kMXFP8 ? "mxfp8" : "bf16"; }

// One projection's weights on the device ([E, N, K] + optional shared [N, K]) and as FP64.
struct ExpertTensor {
  DecodeWeightDtype dtype;
  int E = 0;
  int64_t N = 0, K = 0;
  std::unique_ptr<DevBuf<uint8_t>> data, scales, sdata, sscales;
  ref::ExpertsRef ref;
  std::vector<char> built;

  ExpertTensor(DecodeWeightDtype d, int e, int64_t n, int64_t k, bool shared, std::mt19937& rng)
      : dtype(d), E(e), N(n), K(k) {
    const bool mx = d == DecodeWeightDtype::kMXFP8;
    const size_t elem = mx ? 1 : 2;
    data = std::make_unique<DevBuf<uint8_t>>(size_t(E) * N * K * elem, 0xFF);  // poison: NaN
    if (mx) scales = std::make_unique<DevBuf<uint8_t>>(size_t(E) * N * (K / 32), 0xFF);
    ref.n = N;
    ref.k = K;
    ref.experts.resize(size_t(E));
    built.assign(size_t(E), 0);
    if (shared) {
      sdata = std::make_unique<DevBuf<uint8_t>>(size_t(N * K * elem), 0xFF);
      if (mx) sscales = std::make_unique<DevBuf<uint8_t>>(size_t(N * (K / 32)), 0xFF);
      ref.shared = make(sdata->p, mx ? sscales->p : nullptr, rng);
    }
  }

  // Random BF16 [N, K] (Gaussian / sqrt(K)), MX-quantized when needed; uploads to (d, s) and
  // returns the values the kernels see, in FP64.
  std::vector<double> make(uint8_t* d, uint8_t* s, std::mt19937& rng) {
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<uint16_t> w(size_t(N * K));
    const float sc = 1.0f / std::sqrt(float(K));
    for (auto& v : w) v = ref::float_to_bf16(g(rng) * sc);
    std::vector<double> out(w.size());
    if (dtype == DecodeWeightDtype::kMXFP8) {
      const ref::MxMatrix m = ref::quantize_rows(w.data(), N, K, ScaleMode::kRceil);
      EXPECT_EQ(cudaMemcpy(d, m.data.data(), m.data.size(), cudaMemcpyHostToDevice), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(s, m.scales.data(), m.scales.size(), cudaMemcpyHostToDevice), cudaSuccess);
      out = ref::dequantize(m);
    } else {
      EXPECT_EQ(cudaMemcpy(d, w.data(), w.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
      for (size_t i = 0; i < w.size(); ++i) out[i] = ref::bf16_to_float(w[i]);
    }
    return out;
  }

  void ensure(const std::vector<int32_t>& ids, std::mt19937& rng) {
    const bool mx = dtype == DecodeWeightDtype::kMXFP8;
    const size_t elem = mx ? 1 : 2;
    for (int32_t e : ids) {
      ASSERT_TRUE(e >= 0 && e < E) << "expert id " << e;
      if (built[size_t(e)]) continue;
      built[size_t(e)] = 1;
      ref.experts[size_t(e)] = make(data->p + size_t(e) * N * K * elem,
                                    mx ? scales->p + size_t(e) * N * (K / 32) : nullptr, rng);
    }
  }

  DecodeWeights weights() const {
    DecodeWeights w;
    w.dtype = dtype;
    w.data = data->p;
    w.scales = scales ? scales->p : nullptr;
    w.shared_data = sdata ? sdata->p : nullptr;
    w.shared_scales = sscales ? sscales->p : nullptr;
    return w;
  }
};

std::vector<uint16_t> int_grid_bf16(int64_t n, int denom, std::mt19937& rng) {
  std::uniform_int_distribution<int> u(-16, 16);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = ref::float_to_bf16(float(u(rng)) / float(denom));
  return v;
}

// One layer: router + W1 + W2 for a config and weight dtype.
struct Layer {
  Config c;
  DecodeWeightDtype dtype;
  std::vector<uint16_t> wr;
  std::vector<float> bias;
  std::unique_ptr<DevBuf<uint16_t>> d_wr;
  std::unique_ptr<DevBuf<float>> d_bias;
  std::unique_ptr<ExpertTensor> w1, w2;

  Layer(const Config& cfg, DecodeWeightDtype d, std::mt19937& rng) : c(cfg), dtype(d) {
    wr = int_grid_bf16(int64_t(c.E) * c.H, 256, rng);
    d_wr = std::make_unique<DevBuf<uint16_t>>(wr.size());
    d_wr->upload(wr);
    if (c.sigmoid) {
      std::uniform_int_distribution<int> u(-8, 8);
      bias.resize(size_t(c.E));
      for (auto& b : bias) b = float(u(rng)) / 16.0f;
      d_bias = std::make_unique<DevBuf<float>>(bias.size());
      d_bias->upload(bias);
    }
    w1 = std::make_unique<ExpertTensor>(d, c.E, 2 * int64_t(c.I), c.H, c.shared, rng);
    w2 = std::make_unique<ExpertTensor>(d, c.E, c.H, c.I, c.shared, rng);
  }

  int slots() const { return c.k + (c.shared ? 1 : 0); }

  RouterParams router_params() const {
    RouterParams p;
    p.scoring = c.sigmoid ? RouterScoring::kSigmoid : RouterScoring::kSoftmax;
    p.top_k = c.k;
    p.renormalize = true;
    p.n_groups = c.n_groups;
    p.topk_groups = c.topk_groups;
    p.scaling_factor = c.scaling;
    p.bias = d_bias ? d_bias->p : nullptr;
    return p;
  }
  ref::RouterRefParams router_ref_params() const {
    ref::RouterRefParams p;
    p.sigmoid = c.sigmoid;
    p.top_k = c.k;
    p.renormalize = true;
    p.n_groups = c.n_groups;
    p.topk_groups = c.topk_groups;
    p.scaling_factor = c.scaling;
    p.bias = c.sigmoid ? bias.data() : nullptr;
    return p;
  }
};

// Device buffers of one decode step for B tokens, and the three launches.
struct Step {
  const Layer& L;
  int B;
  DecodeHDtype hd;
  DevBuf<uint16_t> x;
  DevBuf<int32_t> ids;
  DevBuf<float> w;
  DevBuf<uint8_t> h;
  DevBuf<uint16_t> out;

  Step(const Layer& layer, const std::vector<uint16_t>& xs, int b, DecodeHDtype h_dtype)
      : L(layer), B(b), hd(h_dtype), x(size_t(b) * layer.c.H), ids(size_t(b) * layer.c.k),
        w(size_t(b) * layer.c.k),
        h(size_t(b) * layer.slots() * layer.c.I * (h_dtype == DecodeHDtype::kBF16 ? 2 : 4), 0xFF),
        out(size_t(b) * layer.c.H, 0xFF) {
    x.upload(xs);
  }
  void poison() {
    cudaMemset(h.p, 0xFF, h.n);
    cudaMemset(out.p, 0xFF, out.n * 2);
  }
  void router(cudaStream_t s = nullptr) {
    decode_router(reinterpret_cast<const __nv_bfloat16*>(x.p), B, L.c.H,
                  reinterpret_cast<const __nv_bfloat16*>(L.d_wr->p), L.c.E, L.router_params(),
                  ids.p, w.p, s);
  }
  void gate_up(cudaStream_t s = nullptr) {
    decode_gate_up(reinterpret_cast<const __nv_bfloat16*>(x.p), B, L.c.H, L.c.I, L.w1->weights(),
                   L.c.E, ids.p, L.c.k, h.p, hd, s);
  }
  void down(cudaStream_t s = nullptr) {
    decode_down(h.p, hd, B, L.c.I, L.c.H, L.w2->weights(), L.c.E, ids.p, w.p, L.c.k,
                reinterpret_cast<__nv_bfloat16*>(out.p), s);
  }
  std::vector<double> h_values() const {
    const std::vector<uint8_t> raw = h.download();
    const size_t n = size_t(B) * L.slots() * L.c.I;
    std::vector<double> v(n);
    for (size_t i = 0; i < n; ++i) {
      if (hd == DecodeHDtype::kBF16) {
        uint16_t b;
        std::memcpy(&b, &raw[2 * i], 2);
        v[i] = ref::bf16_to_float(b);
      } else {
        float f;
        std::memcpy(&f, &raw[4 * i], 4);
        v[i] = f;
      }
    }
    return v;
  }
};

std::vector<double> to_double_bf16(const std::vector<uint16_t>& v) {
  std::vector<double> d(v.size());
  for (size_t i = 0; i < v.size(); ++i) d[i] = ref::bf16_to_float(v[i]);
  return d;
}

// Element-wise |got - want| <= tol[i] (NaN fails); reports the count and the first mismatch.
::testing::AssertionResult close(const char* what, const std::vector<double>& got,
                                 const std::vector<double>& want, const std::vector<double>& tol,
                                 int64_t cols) {
  int64_t bad = 0, first = -1;
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    if (!(err <= tol[i])) {
      if (bad++ == 0) first = int64_t(i);
    } else if (tol[i] > 0) {
      worst = std::max(worst, err / tol[i]);
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess() << what << ": worst error / tolerance " << worst;
  std::ostringstream os;
  os << what << ": " << bad << " of " << want.size() << " outside tolerance; first at [" << first / cols
     << ", " << first % cols << "]: got " << got[size_t(first)] << ", want " << want[size_t(first)]
     << ", tol " << tol[size_t(first)] << " (seed " << fresh_seed() << ")";
  return ::testing::AssertionFailure() << os.str();
}

// Runs the three kernels for B random tokens and checks each against the reference.
void check_step(Layer& L, int B, DecodeHDtype hd, std::mt19937& rng) {
  SCOPED_TRACE(std::string(L.c.name) + " " + dtype_name(L.dtype) + " B=" + std::to_string(B) +
               (hd == DecodeHDtype::kBF16 ? " h=bf16" : " h=fp32"));
  const Config& c = L.c;
  const std::vector<uint16_t> xs = int_grid_bf16(int64_t(B) * c.H, 8, rng);
  Step s(L, xs, B, hd);

  // Router.
  s.router();
  MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<int32_t> ids = s.ids.download();
  const std::vector<float> wts = s.w.download();
  const ref::RouterRefResult rr = ref::decode_router(xs.data(), B, c.H, L.wr.data(), c.E, L.router_ref_params());
  int compared = 0;
  for (int b = 0; b < B; ++b) {
    std::set<int32_t> distinct;
    for (int j = 0; j < c.k; ++j) {
      const int32_t e = ids[size_t(b) * c.k + j];
      ASSERT_TRUE(e >= 0 && e < c.E) << "token " << b << " slot " << j << ": id " << e;
      distinct.insert(e);
    }
    ASSERT_EQ(int(distinct.size()), c.k) << "token " << b << ": repeated expert id";
    if (c.sigmoid && !(rr.margin[size_t(b)] > 1e-5)) continue;  // near-tie: either choice is right
    ++compared;
    for (int j = 0; j < c.k; ++j) {
      const size_t o = size_t(b) * c.k + j;
      ASSERT_EQ(ids[o], rr.ids[o]) << "token " << b << " slot " << j << " (margin " << rr.margin[size_t(b)] << ")";
      const double tol = std::ldexp(std::fabs(rr.weights[o]), -17) + 1e-30;
      ASSERT_LE(std::fabs(double(wts[o]) - rr.weights[o]), tol)
          << "token " << b << " slot " << j << ": weight " << wts[o] << " vs " << rr.weights[o];
    }
  }
  EXPECT_GE(compared, B - (B / 8 + 1)) << "too many near-tie tokens skipped";

  L.w1->ensure(ids, rng);
  L.w2->ensure(ids, rng);

  // Gate/up on the GPU's ids.
  s.gate_up();
  MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<double> hg = s.h_values();
  const ref::GateUpRef gr = ref::decode_gate_up(to_double_bf16(xs), B, c.H, c.I, L.w1->ref, ids.data(), c.k);
  std::vector<double> htol(gr.h.size());
  const double gh = gamma_n(c.H + 64);
  for (size_t i = 0; i < htol.size(); ++i) {
    const double dg = gh * gr.g_abs[i], du = gh * gr.u_abs[i];
    const double prop = 1.1 * dg * (std::fabs(gr.u[i]) + du) + std::fabs(ref::silu(gr.g[i])) * du;
    double t = prop + std::ldexp(std::fabs(gr.h[i]) + prop, -20);
    if (hd == DecodeHDtype::kBF16) t += std::ldexp(std::fabs(gr.h[i]) + t, -8);
    htol[i] = t;
  }
  EXPECT_TRUE(close("h", hg, gr.h, htol, c.I));

  // Down on the GPU's h and routing weights.
  s.down();
  MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<double> og = to_double_bf16(s.out.download());
  std::vector<double> wd(wts.begin(), wts.end()), oref, oabs;
  ref::decode_down(hg, B, c.I, c.H, L.w2->ref, ids.data(), wd.data(), c.k, &oref, &oabs);
  std::vector<double> otol(oref.size());
  const double go = gamma_n(c.I + L.slots() + 66);
  for (size_t i = 0; i < otol.size(); ++i) {
    const double d = go * oabs[i];
    otol[i] = d + std::ldexp(std::fabs(oref[i]) + d, -8);
  }
  EXPECT_TRUE(close("out", og, oref, otol, c.H));

  // Determinism: a second run gives the same bits.
  const std::vector<uint8_t> h1 = s.h.download();
  const std::vector<uint16_t> o1 = s.out.download();
  s.poison();
  s.router();
  s.gate_up();
  s.down();
  MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_TRUE(s.ids.download() == ids) << "ids differ between runs";
  EXPECT_TRUE(s.w.download() == wts) << "routing weights differ between runs";
  EXPECT_TRUE(s.h.download() == h1) << "h differs between runs";
  EXPECT_TRUE(s.out.download() == o1) << "out differs between runs";
}

}  // namespace

TEST(DecodeGpu, SoftmaxRoutingSmallShapes) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  for (DecodeWeightDtype d : {DecodeWeightDtype::kBF16, DecodeWeightDtype::kMXFP8}) {
    Layer L(kQwenSmall, d, rng);
    for (int B : {1, 2, 8, 64, 128}) check_step(L, B, DecodeHDtype::kFP32, rng);
    check_step(L, 8, DecodeHDtype::kBF16, rng);
  }
}

TEST(DecodeGpu, SigmoidGroupRoutingSharedExpertSmallShapes) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed() + 1);
  for (DecodeWeightDtype d : {DecodeWeightDtype::kBF16, DecodeWeightDtype::kMXFP8}) {
    Layer L(kDsSmall, d, rng);
    for (int B : {1, 2, 8, 64, 128}) check_step(L, B, DecodeHDtype::kFP32, rng);
    check_step(L, 64, DecodeHDtype::kBF16, rng);
  }
}

TEST(DecodeGpu, Qwen3_30B_SingleToken) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed() + 2);
  for (DecodeWeightDtype d : {DecodeWeightDtype::kBF16, DecodeWeightDtype::kMXFP8}) {
    Layer L(kQwen30B, d, rng);  // only the routed experts get weights; the rest stay NaN
    check_step(L, 1, DecodeHDtype::kFP32, rng);
    check_step(L, 1, DecodeHDtype::kBF16, rng);
  }
}

// Tokens alone (B = 1) or in small batches (B = 2, 3) and inside a batch of 37 give identical bits
// for ids, weights, h and out.
TEST(DecodeGpu, BatchInvariance) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed() + 3);
  for (const Config& cfg : {kQwenSmall, kDsSmall}) {
    for (DecodeWeightDtype d : {DecodeWeightDtype::kBF16, DecodeWeightDtype::kMXFP8}) {
      SCOPED_TRACE(std::string(cfg.name) + " " + dtype_name(d));
      Layer L(cfg, d, rng);
      std::vector<int32_t> all(size_t(cfg.E));
      for (int e = 0; e < cfg.E; ++e) all[size_t(e)] = e;
      L.w1->ensure(all, rng);
      L.w2->ensure(all, rng);
      const int B = 37;
      const std::vector<uint16_t> xs = int_grid_bf16(int64_t(B) * cfg.H, 8, rng);
      Step big(L, xs, B, DecodeHDtype::kFP32);
      big.router();
      big.gate_up();
      big.down();
      MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
      const auto ids = big.ids.download();
      const auto w = big.w.download();
      const auto h = big.h.download();
      const auto out = big.out.download();
      const size_t S = size_t(L.slots()), I = size_t(cfg.I), H = size_t(cfg.H), k = size_t(cfg.k);
      // Tokens b .. b+n-1 as a batch of n (n = 1, 2, 3: the router's clusters hold 1, 2 and 4 tokens
      // then) against the same tokens inside the batch of 37 (4 tokens a cluster).
      for (const auto& [b, n] : std::vector<std::pair<int, int>>{
               {0, 1}, {1, 1}, {3, 1}, {4, 1}, {5, 1}, {17, 1}, {36, 1}, {6, 2}, {35, 2}, {9, 3}}) {
        SCOPED_TRACE("tokens " + std::to_string(b) + " .. " + std::to_string(b + n - 1));
        const std::vector<uint16_t> xb(xs.begin() + size_t(b) * H, xs.begin() + size_t(b + n) * H);
        Step one(L, xb, n, DecodeHDtype::kFP32);
        one.router();
        one.gate_up();
        one.down();
        MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
        const auto ids1 = one.ids.download();
        const auto w1 = one.w.download();
        const auto h1 = one.h.download();
        const auto out1 = one.out.download();
        const size_t nn = size_t(n);
        EXPECT_TRUE(std::equal(ids1.begin(), ids1.end(), ids.begin() + b * k)) << "ids";
        EXPECT_EQ(std::memcmp(w1.data(), w.data() + b * k, nn * k * 4), 0) << "weights";
        EXPECT_EQ(std::memcmp(h1.data(), h.data() + b * S * I * 4, nn * S * I * 4), 0) << "h";
        EXPECT_EQ(std::memcmp(out1.data(), out.data() + b * H, nn * H * 2), 0) << "out";
      }
    }
  }
}

// The three kernels captured in one CUDA graph and replayed give the eager results, bit for bit.
TEST(DecodeGpu, CudaGraphCaptureAndReplay) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed() + 4);
  for (DecodeWeightDtype d : {DecodeWeightDtype::kBF16, DecodeWeightDtype::kMXFP8}) {
    SCOPED_TRACE(dtype_name(d));
    Layer L(kDsSmall, d, rng);
    std::vector<int32_t> all(size_t(L.c.E));
    for (int e = 0; e < L.c.E; ++e) all[size_t(e)] = e;
    L.w1->ensure(all, rng);
    L.w2->ensure(all, rng);
    const int B = 8;
    Step s(L, int_grid_bf16(int64_t(B) * L.c.H, 8, rng), B, DecodeHDtype::kBF16);
    s.router();
    s.gate_up();
    s.down();
    MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
    const auto ids = s.ids.download();
    const auto w = s.w.download();
    const auto out = s.out.download();

    cudaStream_t stream;
    MXMOE_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph;
    MXMOE_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    s.router(stream);
    s.gate_up(stream);
    s.down(stream);
    MXMOE_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    MXMOE_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 3; ++rep) {
      MXMOE_ASSERT_CUDA(cudaMemset(s.ids.p, 0xFF, s.ids.n * 4));
      MXMOE_ASSERT_CUDA(cudaMemset(s.w.p, 0xFF, s.w.n * 4));
      s.poison();
      MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
      MXMOE_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
      MXMOE_ASSERT_CUDA(cudaStreamSynchronize(stream));
      EXPECT_TRUE(s.ids.download() == ids) << "replay " << rep;
      EXPECT_TRUE(s.w.download() == w) << "replay " << rep;
      EXPECT_TRUE(s.out.download() == out) << "replay " << rep;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// ---- the expert-centric step and the dispatcher (decode_expert_centric, decode_step) ----------
// Data: x Gaussian (σ 1, BF16), so that MXFP8 quantization of x is not exact; weights as above,
// every expert filled (the small shapes have E = 16). Routing is made here (distinct experts per
// token, weights in (0.05, 1)), so empty experts and one expert taking every token are chosen,
// not hoped for. Each output is checked against two CPU oracles fed the same ids and weights:
//  * ref::decode_expert_centric (the recipe: same quantized x, weights and H as the GPU; GU, H, Y
//    stored in BF16; FP64 sums): per token, relative error <= 2e-2. What separates the GPU from
//    it is FP32 (tensor-core) accumulation, ~2^-13 relative per 128-chunk in fast mode, and the
//    rare BF16 (then E4M3) rounding flip of an intermediate that this causes; one flip of an h
//    element moves a token's output by about 2^-3/√(S·I) ≈ 0.4% relative (S·I = 1280 here).
//  * the FP64 decode reference (warp decode's oracle, unquantized x and h):
//    BF16 weights: an element-wise bound derived from the precision (below, ec_bf16_tolerance);
//    MXFP8 weights: relative Frobenius error <= 0.10 and per token <= 0.15. The recipe's own error
//    against FP64 is measured on the CPU at 4.6% for this data model
//    (DecodeRef.ExpertCentricRecipeErrorAgainstFp64: E4M3 keeps 3 mantissa bits, x and H are
//    quantized); 0.10 leaves ~2x.
namespace {

const char* path_name(DecodePath p) { return p == DecodePath::kWarpDecode ? "warp decode" : "expert-centric"; }

std::vector<uint16_t> gaussian_bf16(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (auto& e : v) e = ref::float_to_bf16(g(rng));
  return v;
}

void fill_all_experts(Layer& L, std::mt19937& rng) {
  std::vector<int32_t> all(size_t(L.c.E));
  for (int e = 0; e < L.c.E; ++e) all[size_t(e)] = e;
  L.w1->ensure(all, rng);
  L.w2->ensure(all, rng);
}

// The values the expert-centric GEMMs read: BF16 as given; MXFP8 the prepared fast form of the
// given MX values (their exact BF16 image, re-quantized: decode_prepare_weights).
ref::ExpertsRef gemm_values(const ExpertTensor& t) {
  if (t.dtype == DecodeWeightDtype::kBF16) return t.ref;
  auto conv = [&](const std::vector<double>& v) {
    std::vector<uint16_t> img(v.size());
    for (size_t i = 0; i < v.size(); ++i) img[i] = ref::bf16_from_double(v[i]);
    return ref::fast_form_values(img.data(), t.N, t.K);
  };
  ref::ExpertsRef r;
  r.n = t.ref.n;
  r.k = t.ref.k;
  for (const auto& e : t.ref.experts) r.experts.push_back(e.empty() ? e : conv(e));
  if (!t.ref.shared.empty()) r.shared = conv(t.ref.shared);
  return r;
}

// Weights with the prepared forms (MXFP8) the expert-centric path needs.
struct EcWeights {
  std::unique_ptr<DevBuf<uint8_t>> p1, p2;
  DecodeWeights w1, w2;
  explicit EcWeights(const Layer& L) : w1(L.w1->weights()), w2(L.w2->weights()) {
    if (L.dtype != DecodeWeightDtype::kMXFP8) return;
    const Config& c = L.c;
    const size_t b1 = decode_prepared_weights_bytes(c.E, 2 * c.I, c.H, c.shared);
    const size_t b2 = decode_prepared_weights_bytes(c.E, c.H, c.I, c.shared);
    p1 = std::make_unique<DevBuf<uint8_t>>(b1);
    p2 = std::make_unique<DevBuf<uint8_t>>(b2);
    decode_prepare_weights(w1, c.E, 2 * c.I, c.H, p1->p, b1);
    decode_prepare_weights(w2, c.E, c.H, c.I, p2->p, b2);
    w1.prepared = p1->p;
    w2.prepared = p2->p;
  }
};

// Routing made on the host: token b takes k distinct experts from [first, first + span) (a
// rotating window), weights in (0.05, 1).
void make_routing(int B, int k, int first, int span, std::mt19937& rng, std::vector<int32_t>* ids,
                  std::vector<float>* w) {
  ids->assign(size_t(B) * k, 0);
  w->assign(size_t(B) * k, 0.0f);
  std::uniform_int_distribution<int> start(0, span - 1);
  std::uniform_real_distribution<float> wd(0.05f, 1.0f);
  for (int b = 0; b < B; ++b) {
    const int s = start(rng);
    for (int j = 0; j < k; ++j) {
      (*ids)[size_t(b) * k + j] = first + (s + j) % span;
      (*w)[size_t(b) * k + j] = wd(rng);
    }
  }
}

// Device buffers of one expert-centric call (workspace sized for max_batch >= B).
struct EcCall {
  const Layer& L;
  const EcWeights& W;
  int B;
  DevBuf<uint16_t> x, out;
  DevBuf<int32_t> ids;
  DevBuf<float> w;
  DevBuf<uint8_t> ws;
  EcCall(const Layer& layer, const EcWeights& weights, int b, int max_batch)
      : L(layer), W(weights), B(b), x(size_t(b) * layer.c.H), out(size_t(b) * layer.c.H, 0xFF),
        ids(size_t(b) * layer.c.k), w(size_t(b) * layer.c.k),
        ws(decode_expert_centric_workspace_bytes(max_batch, layer.c.H, layer.c.I, layer.c.E, layer.c.k,
                                                 layer.c.shared, layer.dtype)) {}
  void run(cudaStream_t s = nullptr) {
    decode_expert_centric(reinterpret_cast<const __nv_bfloat16*>(x.p), B, L.c.H, L.c.I, W.w1, W.w2, L.c.E, ids.p,
                          w.p, L.c.k, reinterpret_cast<__nv_bfloat16*>(out.p), ws.p, ws.n, s);
  }
};

// Per-token relative error (L2 over the token's H outputs).
::testing::AssertionResult per_token_close(const char* what, const std::vector<double>& got,
                                           const std::vector<double>& want, int B, int H, double bound) {
  for (int b = 0; b < B; ++b) {
    double num = 0, den = 0;
    for (int n = 0; n < H; ++n) {
      const size_t i = size_t(b) * H + n;
      num += (got[i] - want[i]) * (got[i] - want[i]);
      den += want[i] * want[i];
    }
    const double rel = std::sqrt(num / std::max(den, 1e-300));
    if (!(rel <= bound))
      return ::testing::AssertionFailure() << what << ": token " << b << " relative error " << rel << " > " << bound
                                           << " (seed " << fresh_seed() << ")";
  }
  return ::testing::AssertionSuccess();
}

double rel_frobenius(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

// Element-wise bound of the BF16 expert-centric path against the FP64 reference (derivation):
//  * exact-mode GEMM on BF16 × BF16 (exact products): per k16 wgmma step at most
//    152·2^-23·max(|acc_in|, max|p|) <= 152·2^-23·Σ|p| (tests/gpu/test_gemm_gpu.cpp), so over K
//    at most a_K·Σ|p| with a_K = (K/16)·152·2^-23 = 19·K·2^-24.
//  * GU stored in BF16: Δg = a_H·g_abs + 2^-8·(|g| + a_H·g_abs); Δu likewise.
//  * SwiGLU in FP32 (|silu'| <= 1.1; < 2^-20 relative for its roundings), H stored in BF16:
//    Δh = p + 2^-20·(|h| + p) + 2^-8·(|h| + p), p = 1.1·Δg·(|u| + Δu) + |silu(g)|·Δu.
//  * GEMM2: Δy_j[n] = Σ_i Δh_i·|w2[n, i]| + a_I·Σ_i (|h_i| + Δh_i)·|w2[n, i]|, then BF16 Y for a
//    routed slot: + 2^-8·(|y_j| + Δy_j); the shared slot's Y is FP32 (no rounding).
//  * combine in FP32 (S + 1 additions) and BF16 out:
//    Δ = Σ_j |w_j|·Δy_j + γ_{S+1}·Σ_j |w_j|·(|y_j| + Δy_j), then + 2^-8·(|out| + Δ).
std::vector<double> ec_bf16_tolerance(const Layer& L, const ref::GateUpRef& gr, const std::vector<int32_t>& ids,
                                      const std::vector<float>& w, int B) {
  const Config& c = L.c;
  const int S = L.slots();
  const double aH = 19.0 * c.H * kU, aI = 19.0 * c.I * kU, e8 = std::ldexp(1.0, -8);
  std::vector<double> dh(gr.h.size());
  for (size_t i = 0; i < dh.size(); ++i) {
    const double dg = aH * gr.g_abs[i] + e8 * (std::fabs(gr.g[i]) + aH * gr.g_abs[i]);
    const double du = aH * gr.u_abs[i] + e8 * (std::fabs(gr.u[i]) + aH * gr.u_abs[i]);
    const double p = 1.1 * dg * (std::fabs(gr.u[i]) + du) + std::fabs(ref::silu(gr.g[i])) * du;
    dh[i] = p + std::ldexp(std::fabs(gr.h[i]) + p, -20) + e8 * (std::fabs(gr.h[i]) + p);
  }
  std::vector<double> tol(size_t(B) * c.H);
  for (int b = 0; b < B; ++b)
    for (int n = 0; n < c.H; ++n) {
      double d = 0, mag = 0, out = 0;
      for (int j = 0; j < S; ++j) {
        const std::vector<double>& w2 =
            j < c.k ? L.w2->ref.experts[size_t(ids[size_t(b) * c.k + j])] : L.w2->ref.shared;
        const double wj = j < c.k ? double(w[size_t(b) * c.k + j]) : 1.0;
        const double* h = &gr.h[(size_t(b) * S + j) * c.I];
        const double* eh = &dh[(size_t(b) * S + j) * c.I];
        const double* wr = &w2[size_t(n) * c.I];
        double y = 0, prop = 0, habs = 0;
        for (int i = 0; i < c.I; ++i) {
          y += h[i] * wr[i];
          prop += eh[i] * std::fabs(wr[i]);
          habs += (std::fabs(h[i]) + eh[i]) * std::fabs(wr[i]);
        }
        double dy = prop + aI * habs;
        if (j < c.k) dy += e8 * (std::fabs(y) + dy);
        d += std::fabs(wj) * dy;
        mag += std::fabs(wj) * (std::fabs(y) + dy);
        out += wj * y;
      }
      const double t = d + gamma_n(S + 1) * mag;
      tol[size_t(b) * c.H + n] = t + e8 * (std::fabs(out) + t);
    }
  return tol;
}

// One expert-centric call against both oracles, then a rerun for bitwise determinism.
void check_expert_centric(const Layer& L, const EcWeights& W, int B, const std::vector<int32_t>& ids,
                          const std::vector<float>& w, std::mt19937& rng) {
  const Config& c = L.c;
  SCOPED_TRACE(std::string(c.name) + " " + dtype_name(L.dtype) + " B=" + std::to_string(B));
  const std::vector<uint16_t> xs = gaussian_bf16(int64_t(B) * c.H, rng);
  EcCall call(L, W, B, B + 9);  // a workspace for a larger batch serves this one
  call.x.upload(xs);
  call.ids.upload(ids);
  call.w.upload(w);
  call.run();
  MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<uint16_t> o1 = call.out.download();
  const std::vector<double> got = to_double_bf16(o1);
  const bool mx = L.dtype == DecodeWeightDtype::kMXFP8;
  const std::vector<double> wd(w.begin(), w.end());

  const std::vector<double> recipe = ref::decode_expert_centric(xs, B, c.H, c.I, gemm_values(*L.w1),
                                                                gemm_values(*L.w2), ids.data(), wd.data(), c.k, mx);
  // BF16 weights: the recipe is the same arithmetic up to FP32 summation order, 2e-2 per token.
  // MXFP8: x and H are re-quantized, and H comes from BF16 GU values that the GPU's fast-mode GEMM
  // (tensor-core sums inside each 128-chunk) and the CPU recipe occasionally round differently; a
  // block whose amax then crosses a power of two changes its scale and all 32 codes, which moves a
  // token by a few percent (run 41: 3 of 400 tokens at B = 200 at 2.1-4.6%, the rest below 2%).
  // So per token 0.1 (FP64's own bound below is 0.15) and 2e-2 over the whole batch where the batch is
  // large enough for that to be a batch figure (B >= 16): at B = 1 the "batch" is one token, which may be
  // one of those few (run 140: seed 260245193, 3.1%, the same bits before and after that run's change).
  EXPECT_TRUE(per_token_close("vs recipe reference", got, recipe, B, c.H, mx ? 0.1 : 2e-2));
  if (mx && B >= 16) {
    EXPECT_LE(rel_frobenius(got, recipe), 2e-2) << "vs recipe reference, whole batch";
  }

  const ref::GateUpRef gr = ref::decode_gate_up(to_double_bf16(xs), B, c.H, c.I, L.w1->ref, ids.data(), c.k);
  std::vector<double> exact;
  ref::decode_down(gr.h, B, c.I, c.H, L.w2->ref, ids.data(), wd.data(), c.k, &exact, nullptr);
  const double rel = rel_frobenius(got, exact);
  std::printf("[expert-centric] %s %s B=%d: relative Frobenius error vs FP64 %.4f\n", c.name, dtype_name(L.dtype), B,
              rel);
  if (mx) {
    EXPECT_LT(rel, 0.10);
    EXPECT_TRUE(per_token_close("vs FP64 reference", got, exact, B, c.H, 0.15));
  } else {
    EXPECT_TRUE(close("out vs FP64 reference", got, exact, ec_bf16_tolerance(L, gr, ids, w, B), c.H));
  }

  // Determinism: a second run (output poisoned) gives the same bits.
  MXMOE_ASSERT_CUDA(cudaMemset(call.out.p, 0xFF, call.out.n * 2));
  call.run();
  MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_TRUE(call.out.download() == o1) << "out differs between runs";
}

// Every small config (Qwen3-like, DeepSeek-like) in both weight dtypes: a layer with every expert
// filled and its expert-centric weights, under a SCOPED_TRACE naming them; fn(cfg, d, L, W).
template <class Fn>
void for_each_filled_layer(std::mt19937& rng, Fn&& fn) {
  for (const Config& cfg : {kQwenSmall, kDsSmall}) {
    for (DecodeWeightDtype d : {DecodeWeightDtype::kBF16, DecodeWeightDtype::kMXFP8}) {
      SCOPED_TRACE(std::string(cfg.name) + " " + dtype_name(d));
      Layer L(cfg, d, rng);
      fill_all_experts(L, rng);
      const EcWeights W(L);
      fn(cfg, d, L, W);
    }
  }
}

void expert_centric_shapes(const Config& cfg, uint32_t seed) {
  std::mt19937 rng(seed);
  for (DecodeWeightDtype d : {DecodeWeightDtype::kBF16, DecodeWeightDtype::kMXFP8}) {
    Layer L(cfg, d, rng);
    fill_all_experts(L, rng);
    const EcWeights W(L);
    std::vector<int32_t> ids;
    std::vector<float> w;
    for (int B : {1, 7, 64, 200}) {
      // experts [0, E − 3) only: the last three are always empty (their weights are never read)
      make_routing(B, cfg.k, 0, cfg.E - 3, rng, &ids, &w);
      check_expert_centric(L, W, B, ids, w, rng);
    }
    // One window of k experts for every token: those k experts take all 200 tokens (two 128-row
    // tiles each), the other E − k are empty.
    make_routing(200, cfg.k, 5, cfg.k, rng, &ids, &w);
    check_expert_centric(L, W, 200, ids, w, rng);
  }
}

}  // namespace

TEST(DecodeGpu, ExpertCentricSoftmaxShape) {
  MXMOE_REQUIRE_GPU();
  expert_centric_shapes(kQwenSmall, fresh_seed() + 5);
}

TEST(DecodeGpu, ExpertCentricSharedExpertShape) {
  MXMOE_REQUIRE_GPU();
  expert_centric_shapes(kDsSmall, fresh_seed() + 6);
}

// Token b alone (B = 1) and inside a batch of 37 give identical output bits: the grouped GEMMs'
// rows are independent (row-wise quantization, the same K order in every tile), the combine sums a
// token's slots in a fixed order.
TEST(DecodeGpu, ExpertCentricBatchInvariance) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed() + 7);
  for_each_filled_layer(rng, [&](const Config& cfg, DecodeWeightDtype, Layer& L, const EcWeights& W) {
    const int B = 37;
    std::vector<int32_t> ids;
    std::vector<float> w;
    make_routing(B, cfg.k, 0, cfg.E, rng, &ids, &w);
    const std::vector<uint16_t> xs = gaussian_bf16(int64_t(B) * cfg.H, rng);
    EcCall big(L, W, B, B);
    big.x.upload(xs);
    big.ids.upload(ids);
    big.w.upload(w);
    big.run();
    MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
    const auto out = big.out.download();
    const size_t H = size_t(cfg.H), k = size_t(cfg.k);
    for (int b : {0, 1, 5, 17, 36}) {
      EcCall one(L, W, 1, 1);
      one.x.upload(std::vector<uint16_t>(xs.begin() + b * H, xs.begin() + (b + 1) * H));
      one.ids.upload(std::vector<int32_t>(ids.begin() + b * k, ids.begin() + (b + 1) * k));
      one.w.upload(std::vector<float>(w.begin() + b * k, w.begin() + (b + 1) * k));
      one.run();
      MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
      const auto out1 = one.out.download();
      EXPECT_EQ(std::memcmp(out1.data(), out.data() + b * H, H * 2), 0) << "out, token " << b;
    }
  });
}

// decode_expert_centric captured once in a CUDA graph, replayed with new tokens and new routing
// written into the same buffers: each replay equals an eager run on those inputs, bit for bit.
TEST(DecodeGpu, ExpertCentricCudaGraphReplayWithNewTokens) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed() + 8);
  for (DecodeWeightDtype d : {DecodeWeightDtype::kBF16, DecodeWeightDtype::kMXFP8}) {
    SCOPED_TRACE(dtype_name(d));
    Layer L(kDsSmall, d, rng);
    fill_all_experts(L, rng);
    const EcWeights W(L);
    const int B = 64;
    EcCall g(L, W, B, B), eager(L, W, B, B);
    cudaStream_t stream;
    MXMOE_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph;
    MXMOE_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    g.run(stream);
    MXMOE_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    MXMOE_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 3; ++rep) {
      std::vector<int32_t> ids;
      std::vector<float> w;
      make_routing(B, L.c.k, 0, rep == 2 ? L.c.k : L.c.E, rng, &ids, &w);  // replay 2: k experts take all
      const std::vector<uint16_t> xs = gaussian_bf16(int64_t(B) * L.c.H, rng);
      for (EcCall* c : {&g, &eager}) {
        c->x.upload(xs);
        c->ids.upload(ids);
        c->w.upload(w);
        MXMOE_ASSERT_CUDA(cudaMemset(c->out.p, 0xFF, c->out.n * 2));
      }
      MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
      MXMOE_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
      MXMOE_ASSERT_CUDA(cudaStreamSynchronize(stream));
      eager.run();
      MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
      EXPECT_TRUE(g.out.download() == eager.out.download()) << "replay " << rep;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// decode_step on both sides of the crossover: the path it reports is the dispatcher's choice, its
// output is bit-identical to that path run by hand on the routing it wrote, and the other path on
// the same routing agrees (per token: 2e-2 for BF16, whose paths differ by BF16 roundings of GU,
// H, Y; 0.15 for MXFP8, whose expert-centric path quantizes x and H). Both paths' errors against
// the FP64 reference are printed.
TEST(DecodeGpu, DecodeStepPicksThePathAndPathsAgree) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed() + 9);
  for_each_filled_layer(rng, [&](const Config& cfg, DecodeWeightDtype d, Layer& L, const EcWeights& W) {
    const DecodeShape shape{cfg.H, cfg.I, cfg.E, cfg.k, cfg.shared};
    const int cross = decode_crossover(shape, d).max_batch;
    for (int B : {cross, cross + 1}) {
      SCOPED_TRACE(std::string(cfg.name) + " " + dtype_name(d) + " B=" + std::to_string(B));
      const std::vector<uint16_t> xs = int_grid_bf16(int64_t(B) * cfg.H, 8, rng);
      DevBuf<uint16_t> x(xs.size()), out(xs.size(), 0xFF), out_other(xs.size(), 0xFF);
      x.upload(xs);
      DevBuf<int32_t> ids(size_t(B) * cfg.k);
      DevBuf<float> w(size_t(B) * cfg.k);
      DevBuf<uint8_t> ws(decode_step_workspace_bytes(shape, d, B + 3));
      const auto* xb = reinterpret_cast<const __nv_bfloat16*>(x.p);
      const DecodePath p = decode_step(xb, B, shape, reinterpret_cast<const __nv_bfloat16*>(L.d_wr->p),
                                       L.router_params(), W.w1, W.w2, ids.p, w.p,
                                       reinterpret_cast<__nv_bfloat16*>(out.p), ws.p, ws.n);
      MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
      EXPECT_EQ(p, choose_decode_path(shape, d, B));
      EXPECT_EQ(p, B <= cross ? DecodePath::kWarpDecode : DecodePath::kExpertCentric);
      const std::vector<uint16_t> o_step = out.download();

      // Both paths by hand on decode_step's routing.
      Step warp(L, xs, B, DecodeHDtype::kFP32);
      MXMOE_ASSERT_CUDA(cudaMemcpy(warp.ids.p, ids.p, ids.n * 4, cudaMemcpyDeviceToDevice));
      MXMOE_ASSERT_CUDA(cudaMemcpy(warp.w.p, w.p, w.n * 4, cudaMemcpyDeviceToDevice));
      warp.gate_up();
      warp.down();
      EcCall ec(L, W, B, B);
      ec.x.upload(xs);
      MXMOE_ASSERT_CUDA(cudaMemcpy(ec.ids.p, ids.p, ids.n * 4, cudaMemcpyDeviceToDevice));
      MXMOE_ASSERT_CUDA(cudaMemcpy(ec.w.p, w.p, w.n * 4, cudaMemcpyDeviceToDevice));
      ec.run();
      MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
      const std::vector<uint16_t> o_warp = warp.out.download(), o_ec = ec.out.download();
      EXPECT_TRUE(o_step == (p == DecodePath::kWarpDecode ? o_warp : o_ec))
          << "decode_step's output is not that of " << path_name(p);
      const std::vector<double> gw = to_double_bf16(o_warp), ge = to_double_bf16(o_ec);
      EXPECT_TRUE(per_token_close("expert-centric vs warp decode", ge, gw, B, cfg.H,
                                  d == DecodeWeightDtype::kMXFP8 ? 0.15 : 2e-2));
      const std::vector<int32_t> hid = ids.download();
      const std::vector<float> hw = w.download();
      const std::vector<double> wd(hw.begin(), hw.end());
      const ref::GateUpRef gr = ref::decode_gate_up(to_double_bf16(xs), B, cfg.H, cfg.I, L.w1->ref, hid.data(), cfg.k);
      std::vector<double> exact;
      ref::decode_down(gr.h, B, cfg.I, cfg.H, L.w2->ref, hid.data(), wd.data(), cfg.k, &exact, nullptr);
      std::printf("[decode_step] %s %s B=%d (%s): rel. Frobenius error vs FP64: warp decode %.5f, expert-centric %.5f\n",
                  cfg.name, dtype_name(d), B, path_name(p), rel_frobenius(gw, exact), rel_frobenius(ge, exact));
      EXPECT_LT(rel_frobenius(gw, exact), 1e-2);
    }
  });
}

// Programmatic Dependent Launch (src/host/pdl_launch.h): chained decode_steps, each reading the
// previous step's output as its x and all sharing one ids / weights / workspace, alternating warp
// decode (B = crossover) and the expert-centric path (B = crossover + 1). Every kernel-to-kernel
// edge of PDL is crossed: the router reads the down kernel's (or moe_combine's) output, and writes
// the ids and weights the kernel ahead of it still reads; gate/up writes the workspace that the
// expert-centric step ahead of it used. The steps captured in one CUDA graph (PDL edges) and
// replayed must give, bit for bit, the steps run one launch at a time with a device sync after
// each (no overlap possible), whatever MXMOE_DECODE_PDL says; also with MXMOE_DECODE_SHARED_FIRST=1, where
// the shared expert's gate/up CTAs read x before their griddepcontrol.wait.
TEST(DecodeGpu, PdlChainedStepsMatchSerializedLaunches) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed() + 10);
  for_each_filled_layer(rng, [&](const Config& cfg, DecodeWeightDtype d, Layer& L, const EcWeights& W) {
    const DecodeShape shape{cfg.H, cfg.I, cfg.E, cfg.k, cfg.shared};
    const int cross = decode_crossover(shape, d).max_batch;
    const int batches[] = {cross, cross + 1, cross, cross + 1, cross};
    constexpr int kSteps = 5;
    const int bmax = cross + 1;
    const size_t act_n = size_t(bmax) * cfg.H;
    // act[0] = x; act[s + 1] = step s's output (rows past its B keep their initial values).
    std::vector<std::vector<uint16_t>> init;
    std::vector<std::unique_ptr<DevBuf<uint16_t>>> act;
    for (int s = 0; s <= kSteps; ++s) {
      init.push_back(gaussian_bf16(int64_t(act_n), rng));
      act.push_back(std::make_unique<DevBuf<uint16_t>>(act_n));
    }
    DevBuf<int32_t> ids(size_t(bmax) * cfg.k);
    DevBuf<float> w(size_t(bmax) * cfg.k);
    DevBuf<uint8_t> ws(decode_step_workspace_bytes(shape, d, bmax));
    auto reset = [&] {
      for (int s = 0; s <= kSteps; ++s) act[size_t(s)]->upload(init[size_t(s)]);
      MXMOE_ASSERT_CUDA(cudaMemset(ids.p, 0xFF, ids.n * 4));
      MXMOE_ASSERT_CUDA(cudaMemset(w.p, 0xFF, w.n * 4));
      MXMOE_ASSERT_CUDA(cudaMemset(ws.p, 0xFF, ws.n));
      MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
    };
    auto x_of = [&](int s) { return reinterpret_cast<const __nv_bfloat16*>(act[size_t(s)]->p); };
    auto out_of = [&](int s) { return reinterpret_cast<__nv_bfloat16*>(act[size_t(s) + 1]->p); };
    const auto* wr = reinterpret_cast<const __nv_bfloat16*>(L.d_wr->p);

    // Serialized: the launches decode_step makes, one at a time.
    reset();
    for (int s = 0; s < kSteps; ++s) {
      const int B = batches[s];
      decode_router(x_of(s), B, cfg.H, wr, cfg.E, L.router_params(), ids.p, w.p);
      MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
      if (choose_decode_path(shape, d, B) == DecodePath::kWarpDecode) {
        decode_gate_up(x_of(s), B, cfg.H, cfg.I, W.w1, cfg.E, ids.p, cfg.k, ws.p, DecodeHDtype::kFP32);
        MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
        decode_down(ws.p, DecodeHDtype::kFP32, B, cfg.I, cfg.H, W.w2, cfg.E, ids.p, w.p, cfg.k, out_of(s));
      } else {
        decode_expert_centric(x_of(s), B, cfg.H, cfg.I, W.w1, W.w2, cfg.E, ids.p, w.p, cfg.k, out_of(s), ws.p,
                              ws.n);
      }
      MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
    }
    std::vector<std::vector<uint16_t>> expect;
    for (int s = 1; s <= kSteps; ++s) expect.push_back(act[size_t(s)]->download());
    const std::vector<int32_t> ids_expect = ids.download();
    const std::vector<float> w_expect = w.download();

    // Also with the shared expert's gate/up tasks started before the router has finished (its x is
    // the previous step's output).
    for (const char* shared_first : {"", "1"}) {
      SCOPED_TRACE(std::string("MXMOE_DECODE_SHARED_FIRST=") + shared_first);
      ScopedEnv sf("MXMOE_DECODE_SHARED_FIRST", shared_first);
      cudaStream_t stream;
      MXMOE_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      cudaGraph_t graph;
      MXMOE_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      for (int s = 0; s < kSteps; ++s) {
        const DecodePath p = decode_step(x_of(s), batches[s], shape, wr, L.router_params(), W.w1, W.w2, ids.p,
                                         w.p, out_of(s), ws.p, ws.n, stream);
        EXPECT_EQ(p, s % 2 == 0 ? DecodePath::kWarpDecode : DecodePath::kExpertCentric) << "step " << s;
      }
      MXMOE_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
      cudaGraphExec_t exec;
      MXMOE_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      for (int rep = 0; rep < 3; ++rep) {
        reset();
        MXMOE_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
        MXMOE_ASSERT_CUDA(cudaStreamSynchronize(stream));
        for (int s = 1; s <= kSteps; ++s)
          EXPECT_TRUE(act[size_t(s)]->download() == expect[size_t(s) - 1]) << "replay " << rep << ", step " << s - 1;
        EXPECT_TRUE(ids.download() == ids_expect) << "replay " << rep;
        EXPECT_TRUE(w.download() == w_expect) << "replay " << rep;
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      cudaStreamDestroy(stream);
    }
  });
}

// ---- down design-space switches (MXMOE_DECODE_DOWN_*, docs/notes/decode.md session 11) ---------
// Every switch changes which rows a warp streams together, how many loads are in flight, how the MX
// scale bytes reach a lane, the register cap or how CTAs walk the tiles; none changes the order of
// any FP operation, so decode_down under each setting must give the default's out bit for bit, on
// the same h, ids and routing weights (from one router + gate/up run). Shapes: the two small ones
// (k = 4; the second with a shared expert), "odd" ones — I = 800 (50 MX chunks a row: a partial
// round; 25 scale bytes a row: rows not 4-byte aligned), BF16 H = 520 (the last 16-row tile reaches
// past H) — and 17 slots (k = 16 + shared: more slots than the 16 warps, a warp takes two); B = 1,
// 3, 8 (B = 8 at 4 rows: more tiles than a persistent grid's CTAs, so CTAs walk several tiles);
// FP32 and BF16 h. The default is 4 rows x 2 for BF16 weights and 8 rows x 1 for MXFP8 (run 77), both
// persistent at 2 CTAs a SM (run 88); "base kernel" selects the 4 x 2 one-CTA-a-tile kernel for both
// (down_default), so both dtypes compare it too, and "persist0" the defaults' rows one CTA a tile.
namespace {

struct DownSetting {
  const char* name;
  std::vector<std::pair<const char*, const char*>> env;  // MXMOE_DECODE_DOWN_<first> = second
};

const std::vector<DownSetting>& down_settings() {
  static const std::vector<DownSetting> s = {
      {"rows8", {{"ROWS", "8"}}},
      {"rows16", {{"ROWS", "16"}}},
      {"unroll1", {{"UNROLL", "1"}}},
      {"unroll4", {{"ROWS", "4"}, {"UNROLL", "4"}}},  // ROWS pinned: MXFP8's default is 8 (8 x 4 > 16)
      {"rows8 unroll1", {{"ROWS", "8"}, {"UNROLL", "1"}}},
      {"persist0", {{"PERSIST", "0"}}},
      {"persist1", {{"PERSIST", "1"}}},
      {"persist2 prefetch", {{"PERSIST", "2"}, {"PREFETCH", "1"}}},
      {"persist8", {{"PERSIST", "8"}}},
      {"scales row", {{"SCALES", "row"}}},
      {"scales row unroll1", {{"SCALES", "row"}, {"UNROLL", "1"}}},
      {"scales row unroll4", {{"SCALES", "row"}, {"ROWS", "4"}, {"UNROLL", "4"}}},
      {"scales row rows16", {{"SCALES", "row"}, {"ROWS", "16"}}},
      {"regs80", {{"REGS", "80"}}},
      {"regs112", {{"REGS", "112"}}},
      {"regs128", {{"REGS", "128"}}},
      {"balance regs112", {{"BALANCE", "1"}, {"REGS", "112"}}},
      {"rows8 unroll1 regs64", {{"ROWS", "8"}, {"UNROLL", "1"}, {"REGS", "64"}}},
      {"regs64 unroll4", {{"REGS", "64"}, {"ROWS", "4"}, {"UNROLL", "4"}}},  // spills: still the same bits
      {"rows8 unroll1 regs80 persist3 prefetch scales row",
       {{"ROWS", "8"}, {"UNROLL", "1"}, {"REGS", "80"}, {"PERSIST", "3"}, {"PREFETCH", "1"}, {"SCALES", "row"}}},
      {"rows16 persist2 prefetch regs64", {{"ROWS", "16"}, {"PERSIST", "2"}, {"PREFETCH", "1"}, {"REGS", "64"}}},
      {"base kernel",
       {{"ROWS", "4"}, {"UNROLL", "2"}, {"PERSIST", "0"}, {"PREFETCH", "0"}, {"SCALES", "chunk"}, {"REGS", "128"}}},
      {"balance", {{"BALANCE", "1"}}},
      {"balance rows4 unroll2", {{"BALANCE", "1"}, {"ROWS", "4"}, {"UNROLL", "2"}}},
      {"balance rows16 scales row", {{"BALANCE", "1"}, {"ROWS", "16"}, {"SCALES", "row"}}},
      {"balance persist1", {{"BALANCE", "1"}, {"PERSIST", "1"}}},
      {"balance persist8", {{"BALANCE", "1"}, {"PERSIST", "8"}}},
      // Session 19: tiles between two CTA barriers (the default 8; 1 = a barrier a tile).
      // PERSIST 1 gives the small shapes several tiles a CTA (kLongRows at B = 8: ~8), so groups fill.
      {"group1", {{"GROUP", "1"}}},
      {"group2 persist1", {{"GROUP", "2"}, {"PERSIST", "1"}}},
      {"group16 rows4 persist1", {{"GROUP", "16"}, {"ROWS", "4"}, {"UNROLL", "2"}, {"PERSIST", "1"}}},
      {"group16 rows16 persist1 (capped at 4)", {{"GROUP", "16"}, {"ROWS", "16"}, {"PERSIST", "1"}}},
      {"group4 persist3 prefetch", {{"GROUP", "4"}, {"PERSIST", "3"}, {"PREFETCH", "1"}}},
  };
  return s;
}

// Sets MXMOE_DECODE_DOWN_* of one setting for a scope (each restored afterwards).
class ScopedDownEnv {
 public:
  explicit ScopedDownEnv(const DownSetting& d) {
    for (const auto& [k, v] : d.env) {
      names_.push_back(std::string("MXMOE_DECODE_DOWN_") + k);
      envs_.push_back(std::make_unique<ScopedEnv>(names_.back().c_str(), v));
    }
  }

 private:
  std::deque<std::string> names_;  // ScopedEnv keeps the name's pointer: a deque never moves them
  std::vector<std::unique_ptr<ScopedEnv>> envs_;
};

// h after one more gate/up launch under the current switches, h poisoned first (a launch that writes nothing
// cannot pass).
void rerun_gate_up(Step& s, std::vector<uint8_t>& h) {
  s.poison();
  s.gate_up();
  MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
  h = s.h.download();
}

void down_switches_bitwise(const Config& cfg, std::initializer_list<DecodeWeightDtype> dtypes, std::mt19937& rng) {
  for (DecodeWeightDtype d : dtypes) {
    Layer L(cfg, d, rng);
    for (DecodeHDtype hd : {DecodeHDtype::kFP32, DecodeHDtype::kBF16}) {
      for (int B : {1, 3, 8}) {
        SCOPED_TRACE(std::string(cfg.name) + " " + dtype_name(d) + " B=" + std::to_string(B) +
                     (hd == DecodeHDtype::kBF16 ? " h=bf16" : " h=fp32"));
        Step s(L, int_grid_bf16(int64_t(B) * cfg.H, 8, rng), B, hd);
        s.router();
        MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
        const std::vector<int32_t> ids = s.ids.download();
        L.w1->ensure(ids, rng);
        L.w2->ensure(ids, rng);
        s.gate_up();
        s.down();
        MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
        const std::vector<uint16_t> o0 = s.out.download();
        int finite = 0;
        for (uint16_t v : o0) finite += std::isfinite(ref::bf16_to_float(v)) ? 1 : 0;
        ASSERT_EQ(finite, int(o0.size())) << "default out has NaN/Inf (wrong expert read?)";
        for (const DownSetting& g : down_settings()) {
          SCOPED_TRACE(g.name);
          ScopedDownEnv env(g);
          MXMOE_ASSERT_CUDA(cudaMemset(s.out.p, 0xFF, s.out.n * 2));
          s.down();
          MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
          const std::vector<uint16_t> o1 = s.out.download();
          size_t i = 0;
          while (i < o0.size() && o1[i] == o0[i]) ++i;
          if (i < o0.size())
            ADD_FAILURE() << "out differs first at [" << i / size_t(cfg.H) << ", " << i % size_t(cfg.H)
                          << "]: " << ref::bf16_to_float(o1[i]) << " (bits " << o1[i] << ") vs default "
                          << ref::bf16_to_float(o0[i]) << " (bits " << o0[i] << ")";
        }
        // Both orders (MXMOE_DECODE_ORDER; the default is tokens at B = 1, rows above) with the down
        // kernel's walks: the same out.
        const std::pair<const char*, const char*> down_walks[] = {
            {"", "tokens"}, {"0", "tokens"}, {"1", "tokens"}, {"0", "rows"}, {"2", "rows"}};
        for (const auto& [persist, ord] : down_walks) {
          SCOPED_TRACE(std::string("MXMOE_DECODE_ORDER=") + ord + ", MXMOE_DECODE_DOWN_PERSIST=" + persist);
          ScopedEnv order("MXMOE_DECODE_ORDER", ord);
          ScopedEnv pe("MXMOE_DECODE_DOWN_PERSIST", persist);
          MXMOE_ASSERT_CUDA(cudaMemset(s.out.p, 0xFF, s.out.n * 2));
          s.down();
          MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
          EXPECT_TRUE(s.out.download() == o0) << "out differs";
        }
        // The gate/up kernel's persistent walk (MXMOE_DECODE_GATE_UP_PERSIST) and both orders: the
        // same h bytes.
        // With the shared expert's tasks first (MXMOE_DECODE_SHARED_FIRST; ignored without one or with a
        // persistent walk) too.
        const std::vector<uint8_t> h0 = s.h.download();
        const std::tuple<const char*, const char*, const char*> walks[] = {
            {"1", "", ""},       {"2", "", ""},     {"3", "", ""},      {"8", "", ""},
            {"0", "tokens", ""}, {"2", "tokens", ""}, {"0", "rows", ""}, {"", "", "1"},
            {"", "tokens", "1"}, {"", "rows", "1"},  {"2", "", "1"}};
        for (const auto& [persist, ord, shared_first] : walks) {
          SCOPED_TRACE(std::string("MXMOE_DECODE_GATE_UP_PERSIST=") + persist + ", MXMOE_DECODE_ORDER=" + ord +
                       ", MXMOE_DECODE_SHARED_FIRST=" + shared_first);
          ScopedEnv env("MXMOE_DECODE_GATE_UP_PERSIST", persist);
          ScopedEnv order("MXMOE_DECODE_ORDER", ord);
          ScopedEnv sf("MXMOE_DECODE_SHARED_FIRST", shared_first);
          std::vector<uint8_t> h1;
          ASSERT_NO_FATAL_FAILURE(rerun_gate_up(s, h1));
          size_t i = 0;
          while (i < h0.size() && h1[i] == h0[i]) ++i;
          if (i < h0.size()) ADD_FAILURE() << "h differs first at byte " << i;
        }
        // x read from global memory in every chunk instead of staged per CTA in shared memory
        // (MXMOE_DECODE_GATE_UP_XSMEM=0; the default stages it), with both orders and shared-expert numberings,
        // and the launch bounds that have their own staged kernels.
        const std::tuple<const char*, const char*, const char*> xs_walks[] = {
            {"", "", ""}, {"tokens", "", ""}, {"", "0", ""}, {"tokens", "0", ""}, {"", "", "2"}, {"", "", "4"}};
        for (const auto& [ord, shared_first, ctas] : xs_walks) {
          for (const char* xs : {"0", "1"}) {
            SCOPED_TRACE(std::string("MXMOE_DECODE_GATE_UP_XSMEM=") + xs + ", MXMOE_DECODE_ORDER=" + ord +
                         ", MXMOE_DECODE_SHARED_FIRST=" + shared_first + ", MXMOE_DECODE_MX_GATE_UP_CTAS=" + ctas);
            ScopedEnv e1("MXMOE_DECODE_GATE_UP_XSMEM", xs);
            ScopedEnv e2("MXMOE_DECODE_ORDER", ord);
            ScopedEnv e3("MXMOE_DECODE_SHARED_FIRST", shared_first);
            ScopedEnv e4("MXMOE_DECODE_MX_GATE_UP_CTAS", ctas);
            std::vector<uint8_t> h1;
            ASSERT_NO_FATAL_FAILURE(rerun_gate_up(s, h1));
            EXPECT_TRUE(h1 == h0) << "h differs";
          }
        }
        // The MXFP8 gate/up kernel's launch bounds (MXMOE_DECODE_MX_GATE_UP_CTAS; BF16 ignores it).
        for (const char* ctas : {"2", "4"}) {
          SCOPED_TRACE(std::string("MXMOE_DECODE_MX_GATE_UP_CTAS=") + ctas);
          ScopedEnv env("MXMOE_DECODE_MX_GATE_UP_CTAS", ctas);
          std::vector<uint8_t> h1;
          ASSERT_NO_FATAL_FAILURE(rerun_gate_up(s, h1));
          EXPECT_TRUE(h1 == h0) << "h differs";
        }
      }
    }
  }
}

const Config kOddMx{"odd (H 544, I 800, shared)", 544, 800, 16, 4, true, false, 1, 1, 1.0f};
const Config kOddBf16{"odd (H 520, I 776)", 520, 776, 16, 4, false, false, 1, 1, 1.0f};
const Config kManySlots{"17 slots (k 16 + shared)", 512, 256, 32, 16, true, false, 1, 1, 1.0f};
// DeepSeek-V3's I (2048: four chunks a lane per row), B = 8 gives the persistent walk several tiles a CTA.
const Config kLongRows{"I 2048, H 1024, shared", 1024, 2048, 16, 8, true, false, 1, 1, 1.0f};

}  // namespace

TEST(DecodeGpu, DownSwitchesGiveDefaultBits) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed() + 21);
  const auto both = {DecodeWeightDtype::kBF16, DecodeWeightDtype::kMXFP8};
  down_switches_bitwise(kQwenSmall, both, rng);
  down_switches_bitwise(kDsSmall, both, rng);
  down_switches_bitwise(kOddMx, both, rng);
  down_switches_bitwise(kOddBf16, {DecodeWeightDtype::kBF16}, rng);
  down_switches_bitwise(kManySlots, both, rng);
  down_switches_bitwise(kLongRows, {DecodeWeightDtype::kMXFP8}, rng);
}

// The decode router's cluster size (MXMOE_ROUTER_CLUSTER; the default picks 16 where Wr >= 2 MiB or
// E > 128 at B <= 8, 8 for the others) where it reads X (MXMOE_ROUTER_XSMEM: a shared-memory copy
// by default, global memory with 0), its loads in flight (MXMOE_ROUTER_UNROLL) and the selection's
// forms (default groupwarps: every group size scored by a warp of its own; =parallel: group sizes 32 and 8
// by warp reductions, 96 and 20 serially; =serial) give the same ids and weights bit for bit:
// logits_warp's order does not depend on them. Shapes with several
// rounds of loads a warp (DeepSeek-V3's H and E, Kimi-K2's E = 384), an H that leaves the last round
// ragged, B = 1..8 (1, 2 and 4 tokens a cluster, and a partial last cluster). A cluster size that
// cannot be placed fails the launch here.
TEST(DecodeGpu, RouterSwitchesGiveDefaultBits) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed() + 23);
  const Config cfgs[] = {
      {"DSV3 router (H 7168, E 256, groups)", 7168, 32, 256, 8, false, true, 8, 4, 2.5f},
      {"E 384 (H 7168)", 7168, 32, 384, 8, false, false, 1, 1, 1.0f},
      {"ragged H 2056, E 128", 2056, 32, 128, 8, false, false, 1, 1, 1.0f},
      {"qwen-style small", 512, 256, 16, 4, false, false, 1, 1, 1.0f},
      {"E 384, 4 groups of 96 (serial group scores)", 1024, 32, 384, 8, false, true, 4, 2, 1.0f},
      {"E 128, 16 groups of 8 (4 groups a slot)", 1024, 32, 128, 8, false, true, 16, 5, 1.0f},
      {"E 160, 8 groups of 20 (serial group scores)", 1024, 32, 160, 6, false, true, 8, 3, 1.0f},
  };
  const std::vector<std::pair<const char*, std::vector<std::pair<const char*, const char*>>>> settings = {
      {"serial select", {{"MXMOE_ROUTER_SELECT", "serial"}}},
      {"parallel select", {{"MXMOE_ROUTER_SELECT", "parallel"}}},
      {"parallel select, cluster 8", {{"MXMOE_ROUTER_SELECT", "parallel"}, {"MXMOE_ROUTER_CLUSTER", "8"}}},
      {"parallel select, shuffle arg-max", {{"MXMOE_ROUTER_SELECT", "parallel"}, {"MXMOE_ROUTER_ARGMAX", "shuffle"}}},
      {"serial select, shuffle arg-max, cluster 8",
       {{"MXMOE_ROUTER_SELECT", "serial"}, {"MXMOE_ROUTER_ARGMAX", "shuffle"}, {"MXMOE_ROUTER_CLUSTER", "8"}}},
      {"cluster 8", {{"MXMOE_ROUTER_CLUSTER", "8"}}},
      {"cluster 16", {{"MXMOE_ROUTER_CLUSTER", "16"}}},
      {"cluster 16, shuffle arg-max, 16 slots",
       {{"MXMOE_ROUTER_CLUSTER", "16"}, {"MXMOE_ROUTER_ARGMAX", "shuffle"}, {"MXMOE_ROUTER_SLOTS", "16"}}},
      {"X from global memory", {{"MXMOE_ROUTER_XSMEM", "0"}}},
      {"unroll 8", {{"MXMOE_ROUTER_UNROLL", "8"}}},
      {"unroll 16, cluster 8", {{"MXMOE_ROUTER_UNROLL", "16"}, {"MXMOE_ROUTER_CLUSTER", "8"}}},
      {"X from global memory, cluster 8", {{"MXMOE_ROUTER_XSMEM", "0"}, {"MXMOE_ROUTER_CLUSTER", "8"}}},
  };
  // Gaussian Wr and X, not the integer grids of the other tests: with those every logit is exact in
  // FP32 whatever the order of its sums, and a reordering would go unseen.
  std::normal_distribution<float> g(0.0f, 1.0f);
  const auto gaussian_bf16 = [&](int64_t n) {
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = ref::float_to_bf16(g(rng));
    return v;
  };
  for (const Config& cfg : cfgs) {
    Layer L(cfg, DecodeWeightDtype::kBF16, rng);
    L.wr = gaussian_bf16(int64_t(cfg.E) * cfg.H);
    L.d_wr->upload(L.wr);
    for (int B : {1, 2, 3, 5, 8}) {
      SCOPED_TRACE(std::string(cfg.name) + " B=" + std::to_string(B));
      Step s(L, gaussian_bf16(int64_t(B) * cfg.H), B, DecodeHDtype::kFP32);
      s.router();
      MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
      const std::vector<int32_t> ids0 = s.ids.download();
      const std::vector<float> w0 = s.w.download();
      for (const auto& [name, env] : settings) {
        SCOPED_TRACE(name);
        std::vector<std::unique_ptr<ScopedEnv>> envs;
        for (const auto& [k, v] : env) envs.push_back(std::make_unique<ScopedEnv>(k, v));
        MXMOE_ASSERT_CUDA(cudaMemset(s.ids.p, 0xFF, s.ids.n * 4));
        MXMOE_ASSERT_CUDA(cudaMemset(s.w.p, 0xFF, s.w.n * 4));
        s.router();
        MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
        EXPECT_EQ(s.ids.download(), ids0);
        const std::vector<float> w1 = s.w.download();
        EXPECT_EQ(0, std::memcmp(w1.data(), w0.data(), w0.size() * 4)) << "routing weights differ";
      }
    }
  }
}

// Values outside the allowed sets, and combinations that are not built, are refused before any
// launch with an error naming the variable.
TEST(DecodeGpu, DownSwitchesRejectBadValues) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed() + 22);
  Layer L(kQwenSmall, DecodeWeightDtype::kMXFP8, rng);
  Step s(L, int_grid_bf16(L.c.H, 8, rng), 1, DecodeHDtype::kFP32);
  const DownSetting bad[] = {
      {"ROWS 5", {{"ROWS", "5"}}},
      {"ROWS 8x", {{"ROWS", "8x"}}},
      {"UNROLL 3", {{"UNROLL", "3"}}},
      {"ROWS 8 UNROLL 4", {{"ROWS", "8"}, {"UNROLL", "4"}}},
      {"ROWS 16 UNROLL 2", {{"ROWS", "16"}, {"UNROLL", "2"}}},
      {"PERSIST 5", {{"PERSIST", "5"}}},
      {"PERSIST -1", {{"PERSIST", "-1"}}},
      {"PREFETCH 1 with PERSIST 0", {{"PERSIST", "0"}, {"PREFETCH", "1"}}},  // (the default PERSIST is 2)
      {"PREFETCH 2", {{"PERSIST", "1"}, {"PREFETCH", "2"}}},
      {"SCALES block", {{"SCALES", "block"}}},
      {"REGS 96", {{"REGS", "96"}}},
      {"BALANCE 2", {{"BALANCE", "2"}}},
      {"BALANCE 1 with PERSIST 0", {{"PERSIST", "0"}, {"BALANCE", "1"}}},
      {"BALANCE 1 with REGS 80", {{"REGS", "80"}, {"BALANCE", "1"}}},
      {"GROUP 3", {{"GROUP", "3"}}},
  };
  for (const auto& [var, val] : {std::pair<const char*, const char*>{"MXMOE_DECODE_GATE_UP_PERSIST", "5"},
                                  {"MXMOE_DECODE_ORDER", "columns"}, {"MXMOE_DECODE_SHARED_FIRST", "2"},
                                  {"MXMOE_DECODE_GATE_UP_XSMEM", "2"}}) {
    ScopedEnv env(var, val);
    try {
      s.gate_up();
      ADD_FAILURE() << var << "=" << val << ": accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(var), std::string::npos) << e.what();
    }
  }
  {
    ScopedEnv env("MXMOE_DECODE_ORDER", "tokens2");
    try {
      s.down();
      ADD_FAILURE() << "decode_down with MXMOE_DECODE_ORDER=tokens2: accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("MXMOE_DECODE_ORDER"), std::string::npos) << e.what();
    }
  }
  for (const DownSetting& g : bad) {
    ScopedDownEnv env(g);
    // The variable the message must name: the last one set (UNROLL for the two combinations, PREFETCH
    // for PREFETCH with PERSIST 0).
    const std::string var = std::string("MXMOE_DECODE_DOWN_") + g.env.back().first;
    try {
      s.down();
      ADD_FAILURE() << g.name << ": accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(var), std::string::npos) << g.name << ": " << e.what();
    }
  }
  MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
}
