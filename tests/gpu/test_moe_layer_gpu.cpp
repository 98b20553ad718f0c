// The MoE layer's forward on the GPU against the MXFP8 layer reference (same recipe, FP64 GEMMs
// on the same dequantized operands) and the unquantized FP64 layer: routing and plan identical,
// output within FP32-accumulation + BF16-storage tolerance of the MX reference, MXFP8-sized error
// against FP64, reruns bitwise identical, both GEMM modes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/gpu_test_util.h"
#include "common/scoped_env.h"
#include "mxmoe/dequantize.h"
#include "mxmoe/moe_layer.h"
#include "mxmoe/quantize.h"
#include "ref/decode_ref.h"
#include "ref/moe_layer_mx_ref.h"

using namespace mxmoe;
using namespace mxmoe::test;

namespace {

std::vector<uint16_t> rand_bf16(size_t n, double scale, std::mt19937& rng) {
  std::normal_distribution<double> g(0.0, scale);
  std::vector<uint16_t> v(n);
  for (auto& e : v) e = ref::float_to_bf16(float(g(rng)));
  return v;
}

// Relative Frobenius error; where the reference is exactly zero (e.g. the router gradient at k = 1,
// where the renormalised weight is identically 1) it is the absolute norm of got, so 0/0 never
// turns into a NaN that fails every bound.
double rel_norm(double num, double den) { return den > 0 ? std::sqrt(num / den) : std::sqrt(num); }

double rel_err(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = ref::bf16_to_float(got[i]), w = ref::bf16_to_float(want[i]);
    num += (g - w) * (g - w);
    den += w * w;
  }
  return rel_norm(num, den);
}

}  // namespace

namespace {

// One layer configuration: GPU forward + backward against the MX reference (and forward against
// the unquantized FP64 layer), in the given GEMM modes. skewed: a few hot experts take most tokens
// (some experts stay empty). weights, activations: MoeLayerConfig::weight_fast_layout and
// activation_fast_layout (kBlock128: fast mode only; checked against the per-row fast reference with
// the same bounds, i.e. the block forms must cost no more accuracy than the bounds' margin over the
// per-row form's measured errors).
void run_layer_case(const ref::MoeConfig& c, std::initializer_list<GemmMode> modes, bool skewed, std::mt19937& rng,
                    FastScaleLayout weights = FastScaleLayout::kRow128,
                    FastScaleLayout activations = FastScaleLayout::kRow128) {
  const bool blocks = weights == FastScaleLayout::kBlock128, act_blocks = activations == FastScaleLayout::kBlock128;
  // The printed label: fast-blk = both block forms (bench_layer.py's mode), fast-wblk / fast-ablk one of them.
  const char* fast_label = blocks ? (act_blocks ? "fast-blk" : "fast-wblk") : (act_blocks ? "fast-ablk" : "fast");
  SCOPED_TRACE(std::string(blocks ? "128x128-block weights " : "") + (act_blocks ? "128x128-block wgrad activations " : "") +
               "T=" + std::to_string(c.tokens) + " H=" + std::to_string(c.hidden) + " I=" + std::to_string(c.inter) +
               " E=" + std::to_string(c.experts) + " k=" + std::to_string(c.top_k) +
               (c.routing == ref::Routing::kSigmoidGrouped ? " sigmoid-grouped" : " softmax") +
               (skewed ? " skewed" : " uniform"));
  const int64_t T = c.tokens, H = c.hidden, I = c.inter, E = c.experts;
  const bool sigmoid = c.routing == ref::Routing::kSigmoidGrouped;
  ref::MxLayerInputs in;
  // Router weights large enough that FP32 (GPU) and FP64 (reference) logits pick the same experts:
  // redraw until every token's decision margin is far above FP32 rounding.
  // Margins are in score space: logits for softmax, sigmoid outputs for sigmoid routing. The GPU's
  // FP32 logits differ from FP64 by ~sqrt(H)·2^-24·Σ|x·w| (~1e-6 here), so 1e-3 (softmax) and 2e-5
  // (sigmoid: its slope is at most 1/4, and its top scores crowd together) are far above it. Sigmoid
  // router weights are drawn 10x smaller so that the scores stay off sigmoid's flat ends.
  const double min_margin = sigmoid ? 2e-5 : 1e-3;
  for (int attempt = 0;; ++attempt) {
    ASSERT_LT(attempt, 200) << "could not draw well-separated routing";
    in.x = rand_bf16(size_t(T * H), 1.0, rng);
    in.wr = rand_bf16(size_t(E * H), sigmoid ? 0.05 : 0.5, rng);
    if (skewed) {  // tokens share a direction that 3 hot experts align with
      for (auto& v : in.x) v = ref::float_to_bf16(ref::bf16_to_float(v) + 0.5f);
      for (int64_t e = 0; e < 3; ++e)
        for (int64_t h = 0; h < H; ++h)
          in.wr[size_t(e * H + h)] = ref::float_to_bf16(ref::bf16_to_float(in.wr[size_t(e * H + h)]) + 0.08f);
    }
    std::vector<double> logits(size_t(T * E), 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e)
        for (int64_t h = 0; h < H; ++h)
          logits[size_t(t * E + e)] += double(ref::bf16_to_float(in.x[size_t(t * H + h)])) *
                                       ref::bf16_to_float(in.wr[size_t(e * H + h)]);
    ref::RouterRefParams rp;
    rp.sigmoid = sigmoid;
    rp.top_k = c.top_k;
    rp.n_groups = sigmoid ? c.n_groups : 1;
    rp.topk_groups = sigmoid ? c.topk_groups : 1;
    rp.scaling_factor = sigmoid ? c.route_scale : 1.0;
    const auto r = ref::route_from_logits(logits, int(T), int(E), rp);
    if (*std::min_element(r.margin.begin(), r.margin.end()) > min_margin) break;
  }
  in.w1 = rand_bf16(size_t(E * 2 * I * H), 1.0 / std::sqrt(double(H)), rng);
  in.w2 = rand_bf16(size_t(E * H * I), 1.0 / std::sqrt(double(I)), rng);

  DevBuf<uint16_t> dx{in.x.size()}, dwr{in.wr.size()}, dw1{in.w1.size()}, dw2{in.w2.size()}, dout{size_t(T * H)},
      dout2{size_t(T * H)};
  dx.upload(in.x);
  dwr.upload(in.wr);
  dw1.upload(in.w1);
  dw2.upload(in.w2);
  for (GemmMode mode : modes) {
    SCOPED_TRACE(mode == GemmMode::kFast ? "fast" : "exact");
    MoeLayerConfig cfg;
    cfg.hidden = int(H);
    cfg.inter = int(I);
    cfg.num_experts = int(E);
    cfg.routing.top_k = c.top_k;
    if (sigmoid) {
      cfg.routing.scoring = RouterScoring::kSigmoid;
      cfg.routing.n_groups = c.n_groups;
      cfg.routing.topk_groups = c.topk_groups;
      cfg.routing.scaling_factor = float(c.route_scale);
    }
    cfg.mode = mode;
    cfg.weight_fast_layout = weights;
    cfg.activation_fast_layout = activations;
    cfg.max_tokens = T + 17;  // the workspace may be larger than the step
    MoeLayer layer(cfg);
    auto bf = [](const DevBuf<uint16_t>& b) { return reinterpret_cast<const __nv_bfloat16*>(b.p); };
    layer.forward(bf(dx), T, bf(dwr), bf(dw1), bf(dw2), reinterpret_cast<__nv_bfloat16*>(dout.p));
    layer.forward(bf(dx), T, bf(dwr), bf(dw1), bf(dw2), reinterpret_cast<__nv_bfloat16*>(dout2.p));
    MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
    const auto out = dout.download();
    EXPECT_EQ(out, dout2.download()) << "reruns differ";

    ref::MxLayerOptions o;
    o.fast = mode == GemmMode::kFast;
    const ref::MxLayerForward want = ref::moe_forward_mx(c, in, o);
    std::vector<int32_t> ids(size_t(T * c.top_k)), row_of(size_t(T * c.top_k));
    MXMOE_ASSERT_CUDA(cudaMemcpy(ids.data(), layer.topk_ids(), ids.size() * 4, cudaMemcpyDeviceToHost));
    MXMOE_ASSERT_CUDA(cudaMemcpy(row_of.data(), layer.row_of(), row_of.size() * 4, cudaMemcpyDeviceToHost));
    ASSERT_EQ(ids, want.ids);
    ASSERT_EQ(row_of, want.row_of);
    // Same quantized operands; the GPU sums in FP32 (tensor-core partials) where the reference
    // sums in FP64, and GU, Hact, Y, out are BF16 on both sides. A 1-ulp BF16 flip of GU moves
    // the output by ~2^-8 of that term, but Hact is quantized again: where the flip sits on an
    // E4M3 rounding boundary (~1 BF16 value in 16 between E4M3 neighbours) the element moves by a
    // whole E4M3 step (2^-3..2^-4 relative), and where it changes a block's amax across a power of
    // two all 32 elements of the block are re-scaled. So the GPU-vs-reference difference is a few
    // large jumps, not many small ones: over 16 seeds x 4 cases (session 7, run 49) out, dw, dx,
    // dW1, dW2 had median 0.4% and maximum 1.0% (the old 1% bound failed 2 seeds of 16), the
    // router gradient 1.2%. Bound: 2% (2x the largest measured, 5x the median) for all of them,
    // 3% for the router gradient; a wrong scale, expert or row is >= 5% (see the 0.12 check below
    // for what quantization itself costs: ~6.6%).
    constexpr double kVsMxRef = 2e-2;
    EXPECT_LT(rel_err(out, want.out), kVsMxRef);
    // Against the unquantized layer: MXFP8-sized. E4M3 keeps 3 mantissa bits, so round-to-nearest
    // leaves a relative error uniform in ±2^-4 per element (RMS 2^-4/√3 ≈ 3.6%, in the scaled
    // range; blocks' smaller elements lose more to the shared scale). A GEMM of two such operands
    // with independent errors has relative Frobenius error ≈ √2 · 3.6% ≈ 5.1%; the layer chains two
    // GEMMs (x·W1, then quantized Hact·W2, with SwiGLU between), ≈ √(2 · 5.1%²) ≈ 7%. The benchmark
    // measures 6.6% on the large shapes; the bound allows ~1.7x that model for the small, random
    // test shapes.
    ref::MoeWeights w;
    auto to_d = [](const std::vector<uint16_t>& v) {
      std::vector<double> d(v.size());
      for (size_t i = 0; i < v.size(); ++i) d[i] = ref::bf16_to_float(v[i]);
      return d;
    };
    w.wr = to_d(in.wr);
    w.w1 = to_d(in.w1);
    w.w2 = to_d(in.w2);
    const ref::MoeForward exact = ref::moe_forward(c, w, to_d(in.x));
    std::vector<uint16_t> exact_bf(exact.out.size());
    for (size_t i = 0; i < exact.out.size(); ++i) exact_bf[i] = ref::float_to_bf16(float(exact.out[i]));
    EXPECT_LT(rel_err(out, exact_bf), 0.12);

    // Backward against the MX reference (same operands; FP32 vs FP64 sums, BF16 intermediates).
    const std::vector<uint16_t> dout_h = rand_bf16(size_t(T * H), 1.0, rng);
    DevBuf<uint16_t> ddout{dout_h.size()}, ddx{size_t(T * H)}, ddx2{size_t(T * H)};
    DevBuf<float> ddwr{size_t(E * H)}, ddw1{size_t(E * 2 * I * H)}, ddw2{size_t(E * H * I)}, ddw1b{size_t(E * 2 * I * H)},
        ddw2b{size_t(E * H * I)};
    ddout.upload(dout_h);
    auto bfm = [](DevBuf<uint16_t>& b) { return reinterpret_cast<__nv_bfloat16*>(b.p); };
    layer.backward(bf(ddout), bf(dx), bf(dwr), bfm(ddx), ddwr.p, ddw1.p, ddw2.p);
    layer.backward(bf(ddout), bf(dx), bf(dwr), bfm(ddx2), ddwr.p, ddw1b.p, ddw2b.p);
    MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(ddx.download(), ddx2.download()) << "backward reruns differ";
    EXPECT_EQ(ddw1.download(), ddw1b.download()) << "backward reruns differ";
    EXPECT_EQ(ddw2.download(), ddw2b.download()) << "backward reruns differ";
    const ref::MxLayerGrads g = ref::moe_backward_mx(c, in, want, dout_h, o);
    auto rel_f = [](const std::vector<float>& got, const std::vector<double>& ref_v) {
      double num = 0, den = 0;
      for (size_t i = 0; i < ref_v.size(); ++i) {
        num += (got[i] - ref_v[i]) * (got[i] - ref_v[i]);
        den += ref_v[i] * ref_v[i];
      }
      return rel_norm(num, den);
    };
    std::vector<float> dwt(size_t(T * c.top_k));
    MXMOE_ASSERT_CUDA(cudaMemcpy(dwt.data(), layer.topk_weight_grads(), dwt.size() * 4, cudaMemcpyDeviceToHost));
    const double e_out = rel_err(out, want.out), e_exact = rel_err(out, exact_bf), e_dw = rel_f(dwt, g.dw),
                 e_dx = rel_err(ddx.download(), g.dx), e_dw1 = rel_f(ddw1.download(), g.dw1),
                 e_dw2 = rel_f(ddw2.download(), g.dw2), e_dwr = rel_f(ddwr.download(), g.dwr);
    // Every measured ratio, pass or fail, so that runs over many seeds show how close each bound is
    // (session 6: one of them failed for 1 seed of 5; `grep layer-case-errors`).
    std::printf("layer-case-errors seed %u T=%lld E=%lld k=%d%s%s %s: out %.5f exact %.5f dw %.5f dx %.5f dW1 %.5f "
                "dW2 %.5f dWr %.5f\n",
                fresh_seed(), (long long)T, (long long)E, c.top_k, sigmoid ? " sigmoid" : "", skewed ? " skewed" : "",
                mode == GemmMode::kExact ? "exact" : fast_label, e_out, e_exact, e_dw, e_dx, e_dw1, e_dw2, e_dwr);
    EXPECT_LT(rel_f(dwt, g.dw), kVsMxRef);
    EXPECT_LT(rel_err(ddx.download(), g.dx), kVsMxRef);
    EXPECT_LT(rel_f(ddw1.download(), g.dw1), kVsMxRef);
    EXPECT_LT(rel_f(ddw2.download(), g.dw2), kVsMxRef);
    if (c.top_k == 1 && !sigmoid) {
      // Renormalised top-1 weights are identically 1: the router gradient is zero up to rounding
      // (the FP64 reference leaves ~1e-14), so bound it against the scale it would otherwise have,
      // |dw|·|x|, instead of against itself.
      double got2 = 0, dw2n = 0, x2 = 0;
      for (float v : ddwr.download()) got2 += double(v) * v;
      for (double v : g.dw) dw2n += v * v;
      for (uint16_t v : in.x) x2 += double(ref::bf16_to_float(v)) * ref::bf16_to_float(v);
      EXPECT_LE(std::sqrt(got2), 1e-5 * std::sqrt(dw2n * x2));
    } else {
      // The router gradient goes through the softmax/sigmoid backward, whose subtraction
      // (dw - Σ p·dw) cancels most of each term: the relative error of dw grows there (1.15%
      // measured in run 17, 1.2% in run 49), hence a looser bound than the other gradients.
      EXPECT_LT(rel_f(ddwr.download(), g.dwr), 3e-2);
    }
  }
}

ref::MoeConfig layer_config(int64_t T, int64_t H, int64_t I, int E, int k) {
  ref::MoeConfig c;
  c.tokens = T;
  c.hidden = H;
  c.inter = I;
  c.experts = E;
  c.top_k = k;
  return c;
}

}  // namespace

TEST(MoeLayerGpu, ForwardBackwardMatchMxReferenceBothModes) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  run_layer_case(layer_config(200, 256, 128, 8, 2), {GemmMode::kFast, GemmMode::kExact}, false, rng);
}

TEST(MoeLayerGpu, RoutingCases) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  run_layer_case(layer_config(130, 128, 64, 8, 1), {GemmMode::kFast}, false, rng);    // k = 1, T % 128 != 0
  run_layer_case(layer_config(300, 128, 64, 16, 8), {GemmMode::kFast}, true, rng);   // k = 8, skewed: empty experts
  run_layer_case(layer_config(97, 128, 64, 256, 8), {GemmMode::kFast}, false, rng);  // E = 256, mostly empty
  ref::MoeConfig ds = layer_config(160, 128, 64, 64, 8);                              // DeepSeek-V3-style routing
  ds.routing = ref::Routing::kSigmoidGrouped;
  ds.n_groups = 8;
  ds.topk_groups = 4;
  ds.route_scale = 2.5;
  run_layer_case(ds, {GemmMode::kFast}, false, rng);
}

// weight_fast_layout and activation_fast_layout = kBlock128 (moe_layer.h): forward + backward (out, dw,
// dx, dW1, dW2, dWr) against the fast-mode MX reference with the fast-mode bounds, and bitwise reruns
// (run_layer_case). Weights and activations in blocks: partial 128-blocks both ways with I = 96 (W2's
// K = 96, col(W2)'s 96 rows, Hactᵀ's 96 rows: one short block), 2I = 192 (W1's second row block of 64
// rows, col(W1)'s K = 192), and H = 256, I = 128 (whole blocks). Weights alone: DeepSeek-style routing.
// Activations alone: H = 160 (Xᵀ's second block of 32 rows), I = 64, k = 1, T % 128 != 0.
TEST(MoeLayerGpu, BlockWeightsForwardBackwardMatchFastReference) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  constexpr FastScaleLayout kBlock = FastScaleLayout::kBlock128, kRow = FastScaleLayout::kRow128;
  run_layer_case(layer_config(200, 256, 128, 8, 2), {GemmMode::kFast}, false, rng, kBlock, kBlock);
  run_layer_case(layer_config(300, 256, 96, 16, 8), {GemmMode::kFast}, true, rng, kBlock, kBlock);  // skewed: empty experts
  ref::MoeConfig ds = layer_config(160, 128, 64, 64, 8);
  ds.routing = ref::Routing::kSigmoidGrouped;
  ds.n_groups = 8;
  ds.topk_groups = 4;
  ds.route_scale = 2.5;
  run_layer_case(ds, {GemmMode::kFast}, false, rng, kBlock, kRow);
  run_layer_case(layer_config(130, 160, 64, 8, 1), {GemmMode::kFast}, false, rng, kRow, kBlock);
}

TEST(MoeLayerGpu, RejectsBadConfiguration) {
  MXMOE_REQUIRE_GPU();
  MoeLayerConfig cfg;
  cfg.hidden = 100;  // not a multiple of 32
  cfg.inter = 128;
  cfg.num_experts = 8;
  cfg.routing.top_k = 2;
  cfg.max_tokens = 64;
  EXPECT_THROW({ MoeLayer l(cfg); }, Error);
}

namespace {

MoeLayerConfig small_layer(int64_t H, int64_t I, int64_t E, int top_k, int64_t max_tokens,
                           GemmMode mode = GemmMode::kFast) {
  MoeLayerConfig cfg;
  cfg.hidden = int(H);
  cfg.inter = int(I);
  cfg.num_experts = int(E);
  cfg.routing.top_k = top_k;
  cfg.mode = mode;
  cfg.max_tokens = max_tokens;
  return cfg;
}

// Weights and dOut of a small layer step on the device, at the scales these tests use, and the
// BF16 views of a buffer.
struct StepInputs {
  DevBuf<uint16_t> wr, w1, w2, dout;
  StepInputs(int64_t T, int64_t H, int64_t I, int64_t E, std::mt19937& rng)
      : wr{size_t(E * H)}, w1{size_t(E * 2 * I * H)}, w2{size_t(E * H * I)}, dout{size_t(T * H)} {
    wr.upload(rand_bf16(wr.n, 0.5, rng));
    w1.upload(rand_bf16(w1.n, 0.06, rng));
    w2.upload(rand_bf16(w2.n, 0.09, rng));
    dout.upload(rand_bf16(dout.n, 1.0, rng));
  }
};
const __nv_bfloat16* c(const DevBuf<uint16_t>& b) { return reinterpret_cast<const __nv_bfloat16*>(b.p); }
__nv_bfloat16* m(DevBuf<uint16_t>& b) { return reinterpret_cast<__nv_bfloat16*>(b.p); }

}  // namespace

TEST(MoeLayerGpu, ForwardBackwardCapturedInOneGraphReplaysWithNewRouting) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  const int64_t T = 300, H = 256, I = 128, E = 16;
  const MoeLayerConfig cfg = small_layer(H, I, E, 4, T);
  MoeLayer layer(cfg);
  const StepInputs in(T, H, I, E, rng);
  const DevBuf<uint16_t>&dwr = in.wr, &dw1 = in.w1, &dw2 = in.w2, &ddout = in.dout;
  DevBuf<uint16_t> dx_in{size_t(T * H)}, out_g{size_t(T * H)}, out_e{size_t(T * H)}, gx_g{size_t(T * H)},
      gx_e{size_t(T * H)};
  DevBuf<float> gwr{dwr.n}, gw1{dw1.n}, gw2{dw2.n}, gw1_e{dw1.n}, gwr_e{dwr.n}, gw2_e{dw2.n};
  cudaStream_t s;
  MXMOE_ASSERT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  dx_in.upload(rand_bf16(size_t(T * H), 1.0, rng));
  // Warm-up outside capture (first-call attribute setup), then capture forward + backward.
  layer.forward(c(dx_in), T, c(dwr), c(dw1), c(dw2), m(out_g), s);
  layer.backward(c(ddout), c(dx_in), c(dwr), m(gx_g), gwr.p, gw1.p, gw2.p, s);
  MXMOE_ASSERT_CUDA(cudaStreamSynchronize(s));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MXMOE_ASSERT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  layer.forward(c(dx_in), T, c(dwr), c(dw1), c(dw2), m(out_g), s);
  layer.backward(c(ddout), c(dx_in), c(dwr), m(gx_g), gwr.p, gw1.p, gw2.p, s);
  MXMOE_ASSERT_CUDA(cudaStreamEndCapture(s, &graph));
  MXMOE_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 3; ++rep) {
    // New tokens each replay: a different routing (and different expert loads) every time.
    dx_in.upload(rand_bf16(size_t(T * H), 1.0 + rep, rng));
    MXMOE_ASSERT_CUDA(cudaGraphLaunch(exec, s));
    MXMOE_ASSERT_CUDA(cudaStreamSynchronize(s));
    const auto og = out_g.download(), xg = gx_g.download();
    const auto w1g = gw1.download(), wrg = gwr.download(), w2g = gw2.download();
    // The same step run eagerly must give the same bits.
    layer.forward(c(dx_in), T, c(dwr), c(dw1), c(dw2), m(out_e), s);
    layer.backward(c(ddout), c(dx_in), c(dwr), m(gx_e), gwr_e.p, gw1_e.p, gw2_e.p, s);
    MXMOE_ASSERT_CUDA(cudaStreamSynchronize(s));
    EXPECT_EQ(og, out_e.download()) << "replay " << rep;
    EXPECT_EQ(xg, gx_e.download()) << "replay " << rep;
    EXPECT_EQ(w1g, gw1_e.download()) << "replay " << rep;
    EXPECT_EQ(w2g, gw2_e.download()) << "replay " << rep;
    EXPECT_EQ(wrg, gwr_e.download()) << "replay " << rep;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

// With batch_invariant_router, a token's whole forward and backward depend on no other token:
// the router kernel's rows do not depend on T, quantization is row-wise per row (and column-wise
// only feeds the weight gradients), the grouped GEMMs' rows do not depend on their tile mates.
// So the first T1 tokens of a T-token step give the same bits as a T1-token step. This is what
// the expert-parallel layer's bitwise equality rests on (docs/notes/ep.md).
TEST(MoeLayerGpu, BatchInvariantRouterMakesTokensIndependentOfT) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  const int64_t T = 300, T1 = 137, H = 256, I = 128, E = 16;
  for (GemmMode mode : {GemmMode::kFast, GemmMode::kExact}) {
    SCOPED_TRACE(mode == GemmMode::kFast ? "fast" : "exact");
    MoeLayerConfig cfg = small_layer(H, I, E, 4, T, mode);
    cfg.batch_invariant_router = true;
    MoeLayer big(cfg), small(cfg);
    const StepInputs in(T, H, I, E, rng);
    const DevBuf<uint16_t>&dwr = in.wr, &dw1 = in.w1, &dw2 = in.w2, &ddout = in.dout;
    DevBuf<uint16_t> dx_in{size_t(T * H)}, out_b{size_t(T * H)}, out_s{size_t(T1 * H)}, gx_b{size_t(T * H)},
        gx_s{size_t(T1 * H)};
    DevBuf<float> gwr{dwr.n}, gw1{dw1.n}, gw2{dw2.n};
    dx_in.upload(rand_bf16(dx_in.n, 1.0, rng));
    big.forward(c(dx_in), T, c(dwr), c(dw1), c(dw2), m(out_b), nullptr);
    big.backward(c(ddout), c(dx_in), c(dwr), m(gx_b), gwr.p, gw1.p, gw2.p, nullptr);
    small.forward(c(dx_in), T1, c(dwr), c(dw1), c(dw2), m(out_s), nullptr);
    small.backward(c(ddout), c(dx_in), c(dwr), m(gx_s), gwr.p, gw1.p, gw2.p, nullptr);
    MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
    const auto ob = out_b.download(), os = out_s.download(), xb = gx_b.download(), xs = gx_s.download();
    EXPECT_TRUE(std::equal(os.begin(), os.end(), ob.begin())) << "out of the first " << T1 << " tokens";
    EXPECT_TRUE(std::equal(xs.begin(), xs.end(), xb.begin())) << "dx of the first " << T1 << " tokens";
    std::vector<int32_t> ib(size_t(T1 * 4)), is(size_t(T1 * 4));
    MXMOE_ASSERT_CUDA(cudaMemcpy(ib.data(), big.topk_ids(), ib.size() * 4, cudaMemcpyDeviceToHost));
    MXMOE_ASSERT_CUDA(cudaMemcpy(is.data(), small.topk_ids(), is.size() * 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(ib, is);

    // The router kernels themselves, against the cuBLAS path on the same step: the logits and the
    // router's dX differ only in FP32 summation order (~1e-6 relative), so the tokens whose top-k
    // agree (all but near-ties) have out and dx equal up to rare 1-ulp BF16 flips; a wrong index in
    // either kernel would give O(1) differences.
    MoeLayerConfig cfg_plain = cfg;
    cfg_plain.batch_invariant_router = false;
    MoeLayer plain(cfg_plain);
    DevBuf<uint16_t> out_p{size_t(T * H)}, gx_p{size_t(T * H)};
    plain.forward(c(dx_in), T, c(dwr), c(dw1), c(dw2), m(out_p), nullptr);
    plain.backward(c(ddout), c(dx_in), c(dwr), m(gx_p), gwr.p, gw1.p, gw2.p, nullptr);
    MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
    std::vector<int32_t> ia(size_t(T * 4)), ip(size_t(T * 4));
    MXMOE_ASSERT_CUDA(cudaMemcpy(ia.data(), big.topk_ids(), ia.size() * 4, cudaMemcpyDeviceToHost));
    MXMOE_ASSERT_CUDA(cudaMemcpy(ip.data(), plain.topk_ids(), ip.size() * 4, cudaMemcpyDeviceToHost));
    const auto op = out_p.download(), xp = gx_p.download();
    std::vector<uint16_t> o_inv, o_plain, x_inv, x_plain;  // rows of the tokens routed alike
    int64_t same_route = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (!std::equal(ia.begin() + t * 4, ia.begin() + t * 4 + 4, ip.begin() + t * 4)) continue;
      ++same_route;
      o_inv.insert(o_inv.end(), ob.begin() + t * H, ob.begin() + (t + 1) * H);
      o_plain.insert(o_plain.end(), op.begin() + t * H, op.begin() + (t + 1) * H);
      x_inv.insert(x_inv.end(), xb.begin() + t * H, xb.begin() + (t + 1) * H);
      x_plain.insert(x_plain.end(), xp.begin() + t * H, xp.begin() + (t + 1) * H);
    }
    EXPECT_GE(same_route, T - 3) << "top-k differs from the cuBLAS path on more than near-ties";
    EXPECT_LT(rel_err(o_inv, o_plain), 2e-3);
    EXPECT_LT(rel_err(x_inv, x_plain), 2e-3);
  }
}

TEST(MoeLayerGpu, ProfilingReportsEveryStage) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  const int64_t T = 128, H = 128, I = 64, E = 8;
  const MoeLayerConfig cfg = small_layer(H, I, E, 2, T);
  MoeLayer layer(cfg);
  DevBuf<uint16_t> x{size_t(T * H)}, wr{size_t(E * H)}, w1{size_t(E * 2 * I * H)}, w2{size_t(E * H * I)},
      out{size_t(T * H)}, dx{size_t(T * H)};
  DevBuf<float> dwr{size_t(E * H)}, dw1{size_t(E * 2 * I * H)}, dw2{size_t(E * H * I)};
  x.upload(rand_bf16(x.n, 1.0, rng));
  wr.upload(rand_bf16(wr.n, 0.5, rng));
  w1.upload(rand_bf16(w1.n, 0.1, rng));
  w2.upload(rand_bf16(w2.n, 0.1, rng));
  layer.forward(c(x), T, c(wr), c(w1), c(w2), m(out));
  EXPECT_TRUE(layer.stage_times().empty());  // off by default
  layer.set_profiling(true);
  layer.forward(c(x), T, c(wr), c(w1), c(w2), m(out));
  layer.backward(c(out), c(x), c(wr), m(dx), dwr.p, dw1.p, dw2.p);
  const auto st = layer.stage_times();
  EXPECT_EQ(st.size(), 14u);  // 8 forward + 6 backward stages
  for (const auto& [name, ms] : st) {
    EXPECT_FALSE(name.empty());
    EXPECT_GE(ms, 0.0f) << name;
  }
}

TEST(MoeLayerGpu, PreQuantizedWeightsGiveTheSameBits) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  const int64_t T = 200, H = 256, I = 96, E = 8;  // I = 96: K = 96 is not a multiple of 128
  for (GemmMode mode : {GemmMode::kFast, GemmMode::kExact}) {
    MoeLayer layer(small_layer(H, I, E, 2, T, mode));
    DevBuf<uint16_t> x{size_t(T * H)}, wr{size_t(E * H)}, w1{size_t(E * 2 * I * H)}, w2{size_t(E * H * I)},
        out_a{size_t(T * H)}, out_b{size_t(T * H)}, dx_a{size_t(T * H)}, dx_b{size_t(T * H)};
    DevBuf<float> dwr{size_t(E * H)}, dw1_a{w1.n}, dw1_b{w1.n}, dw2_a{w2.n}, dw2_b{w2.n};
    x.upload(rand_bf16(x.n, 1.0, rng));
    wr.upload(rand_bf16(wr.n, 0.5, rng));
    w1.upload(rand_bf16(w1.n, 0.06, rng));
    w2.upload(rand_bf16(w2.n, 0.1, rng));
    // Quantize both weights both ways (with fast forms) into caller-owned buffers.
    // (Exact mode: also their BF16 images, which the layer then uses instead of making its own.)
    struct Q {
      int64_t E_, N_, K_;
      DevBuf<uint8_t> rd, rs, rfd, rfs, cd, cs, cfd, cfs;
      DevBuf<uint16_t> ri, ci;
      Q(int64_t E, int64_t N, int64_t K)
          : E_(E), N_(N), K_(K), rd{size_t(E * N * K)}, rs{size_t(E * N * K / 32)}, rfd{size_t(E * N * K)},
            rfs{size_t(E * ((K + 127) / 128) * N)}, cd{size_t(E * N * K)}, cs{size_t(E * N * K / 32)},
            cfd{size_t(E * N * K)}, cfs{size_t(E * ((N + 127) / 128) * K)}, ri{size_t(E * N * K)},
            ci{size_t(E * N * K)} {}
      MxWeights weights() const {
        return MxWeights{MxOperand{rd.p, rs.p, rfd.p, rfs.p}, MxOperand{cd.p, cs.p, cfd.p, cfs.p}};
      }
      MxWeights images_only() {
        dequantize_mxfp8_bf16(rd.p, rs.p, E_ * N_, K_, reinterpret_cast<__nv_bfloat16*>(ri.p));
        dequantize_mxfp8_bf16(cd.p, cs.p, E_ * K_, N_, reinterpret_cast<__nv_bfloat16*>(ci.p));
        MxWeights w;
        w.rowwise.image = reinterpret_cast<const __nv_bfloat16*>(ri.p);
        w.colwise.image = reinterpret_cast<const __nv_bfloat16*>(ci.p);
        return w;
      }
    };
    Q q1(E, 2 * I, H), q2(E, H, I);
    const MxOut r1{q1.rd.p, q1.rs.p, q1.rfd.p, q1.rfs.p}, c1{q1.cd.p, q1.cs.p, q1.cfd.p, q1.cfs.p};
    const MxOut r2{q2.rd.p, q2.rs.p, q2.rfd.p, q2.rfs.p}, c2{q2.cd.p, q2.cs.p, q2.cfd.p, q2.cfs.p};
    quantize_mxfp8(c(w1), E, 2 * I, H, &r1, &c1);
    quantize_mxfp8(c(w2), E, H, I, &r2, &c2);
    layer.forward(c(x), T, c(wr), c(w1), c(w2), m(out_a));
    layer.backward(c(out_a), c(x), c(wr), m(dx_a), dwr.p, dw1_a.p, dw2_a.p);
    layer.forward(c(x), T, c(wr), q1.weights(), q2.weights(), m(out_b));
    layer.backward(c(out_a), c(x), c(wr), m(dx_b), dwr.p, dw1_b.p, dw2_b.p);
    MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(out_a.download(), out_b.download());
    EXPECT_EQ(dx_a.download(), dx_b.download());
    EXPECT_EQ(dw1_a.download(), dw1_b.download());
    EXPECT_EQ(dw2_a.download(), dw2_b.download());
    if (mode == GemmMode::kExact) {  // caller-made images only (no MX data): the same bits again
      layer.forward(c(x), T, c(wr), q1.images_only(), q2.images_only(), m(out_b));
      layer.backward(c(out_a), c(x), c(wr), m(dx_b), dwr.p, dw1_b.p, dw2_b.p);
      MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
      EXPECT_EQ(out_a.download(), out_b.download()) << "exact mode with caller-made weight images";
      EXPECT_EQ(dx_a.download(), dx_b.download()) << "exact mode with caller-made weight images";
      EXPECT_EQ(dw1_a.download(), dw1_b.download()) << "exact mode with caller-made weight images";
      EXPECT_EQ(dw2_a.download(), dw2_b.download()) << "exact mode with caller-made weight images";
    }
    // A missing operand of the mode is rejected by name, before any launch.
    MxWeights bad = q1.weights();
    (mode == GemmMode::kFast ? bad.colwise.fast_scales : bad.colwise.scales) = nullptr;
    try {
      layer.forward(c(x), T, c(wr), bad, q2.weights(), m(out_b));
      ADD_FAILURE() << "no error for a null w1.colwise scale pointer";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("w1.colwise"), std::string::npos) << e.what();
    }
  }
}

// Pre-quantized weights in the 128x128-block form (MxWeights, fast_scale_layout = kBlock128): made by the
// caller with quantize_mxfp8 (plain MX) + rebase_mxfp8_fast_block128 into separate buffers, they give the
// bits of the layer's own block-form quantization (weight_fast_layout = kBlock128), also through a layer
// configured kRow128 (the operands carry their layout) and through one with the wgrad activations in
// blocks too (activation_fast_layout = kBlock128, against that layer's own step). The activation blocks
// change dW1 and dW2 only: out and dx are bitwise those of the weights-only layer. Exact mode and a
// misaligned block-scale pointer are rejected by name.
TEST(MoeLayerGpu, PreQuantizedBlockWeightsGiveTheSameBits) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  const int64_t T = 200, H = 256, I = 96, E = 8;
  MoeLayerConfig cfg_blk = small_layer(H, I, E, 2, T);
  cfg_blk.weight_fast_layout = FastScaleLayout::kBlock128;
  MoeLayerConfig cfg_both = cfg_blk;
  cfg_both.activation_fast_layout = FastScaleLayout::kBlock128;
  MoeLayer blk(cfg_blk), both(cfg_both), row(small_layer(H, I, E, 2, T)),
      exact(small_layer(H, I, E, 2, T, GemmMode::kExact));
  const StepInputs in(T, H, I, E, rng);
  DevBuf<uint16_t> x{size_t(T * H)}, out_a{size_t(T * H)}, out_b{size_t(T * H)}, dx_a{size_t(T * H)},
      dx_b{size_t(T * H)};
  DevBuf<float> dwr{in.wr.n}, dw1_a{in.w1.n}, dw1_b{in.w1.n}, dw2_a{in.w2.n}, dw2_b{in.w2.n}, dw1_c{in.w1.n},
      dw2_c{in.w2.n};
  x.upload(rand_bf16(x.n, 1.0, rng));
  // One weight [E, N, K] both ways: plain MX, then each copy's block form (rows x cols of the copy).
  struct Q {
    DevBuf<uint8_t> rd, rs, rbd, rbs, cd, cs, cbd, cbs;
    Q(const DevBuf<uint16_t>& w, int64_t E, int64_t N, int64_t K)
        : rd{size_t(E * N * K)}, rs{size_t(E * N * K / 32)}, rbd{size_t(E * N * K)},
          rbs{size_t(E * ((K + 127) / 128) * fast_block_scales_pitch(N))}, cd{size_t(E * N * K)},
          cs{size_t(E * N * K / 32)}, cbd{size_t(E * N * K)},
          cbs{size_t(E * ((N + 127) / 128) * fast_block_scales_pitch(K))} {
      const MxOut r{rd.p, rs.p, nullptr, nullptr}, col{cd.p, cs.p, nullptr, nullptr};
      quantize_mxfp8(c(w), E, N, K, &r, &col);
      rebase_mxfp8_fast_block128(rd.p, rs.p, E, N, K, rbd.p, rbs.p);
      rebase_mxfp8_fast_block128(cd.p, cs.p, E, K, N, cbd.p, cbs.p);
    }
    MxWeights weights() const {
      MxWeights w{MxOperand{rd.p, rs.p, rbd.p, rbs.p}, MxOperand{cd.p, cs.p, cbd.p, cbs.p}};
      w.rowwise.fast_scale_layout = w.colwise.fast_scale_layout = FastScaleLayout::kBlock128;
      return w;
    }
  };
  const Q q1(in.w1, E, 2 * I, H), q2(in.w2, E, H, I);
  blk.forward(c(x), T, c(in.wr), c(in.w1), c(in.w2), m(out_a));
  blk.backward(c(in.dout), c(x), c(in.wr), m(dx_a), dwr.p, dw1_a.p, dw2_a.p);
  // The layer with both block forms, its own quantization: out and dx as blk's, its own dW1, dW2.
  both.forward(c(x), T, c(in.wr), c(in.w1), c(in.w2), m(out_b));
  both.backward(c(in.dout), c(x), c(in.wr), m(dx_b), dwr.p, dw1_c.p, dw2_c.p);
  MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(out_a.download(), out_b.download()) << "activation blocks changed the forward output";
  EXPECT_EQ(dx_a.download(), dx_b.download()) << "activation blocks changed dx";
  for (MoeLayer* l : {&blk, &row, &both}) {
    SCOPED_TRACE(l == &blk ? "layer with weight_fast_layout = kBlock128"
                 : l == &row ? "layer with weight_fast_layout = kRow128"
                             : "layer with weight_fast_layout = activation_fast_layout = kBlock128");
    l->forward(c(x), T, c(in.wr), q1.weights(), q2.weights(), m(out_b));
    l->backward(c(in.dout), c(x), c(in.wr), m(dx_b), dwr.p, dw1_b.p, dw2_b.p);
    MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(out_a.download(), out_b.download());
    EXPECT_EQ(dx_a.download(), dx_b.download());
    EXPECT_EQ((l == &both ? dw1_c : dw1_a).download(), dw1_b.download());
    EXPECT_EQ((l == &both ? dw2_c : dw2_a).download(), dw2_b.download());
  }
  auto expect_rejects = [&](MoeLayer& l, const MxWeights& w1, const char* what) {
    try {
      l.forward(c(x), T, c(in.wr), w1, q2.weights(), m(out_b));
      ADD_FAILURE() << "no error naming " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_rejects(exact, q1.weights(), "w1.rowwise.fast_scale_layout");
  MxWeights bad = q1.weights();
  bad.colwise.fast_scales += 8;
  expect_rejects(row, bad, "w1.colwise.fast_scales");
}

// MXMOE_QUANT_COL_BLOCK (activation_fast_layout = kBlock128): the quantizers writing Xᵀ's and Hactᵀ's
// block form directly (direct, the default) and the plain copies rebased after (rebase) give the same
// bits in every output of a forward + backward step (out, dw, dx, dWr, dW1, dW2), with and without
// block weights, including partial blocks (H = 160: Xᵀ's second block of 32 rows; I = 96: Hactᵀ's
// one short block), empty experts (skewed routing, E = 16, k = 8) and T % 128 != 0. A bad value
// throws naming the variable.
TEST(MoeLayerGpu, ColumnBlocksDirectAndRebaseGiveTheSameBits) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  struct Case {
    int64_t T, H, I, E;
    int k;
    bool weight_blocks;
  };
  for (const Case& k : {Case{200, 256, 96, 8, 2, true}, Case{300, 256, 128, 16, 8, false},
                        Case{130, 160, 64, 8, 1, false}}) {
    SCOPED_TRACE("T=" + std::to_string(k.T) + " H=" + std::to_string(k.H) + " I=" + std::to_string(k.I) +
                 " E=" + std::to_string(k.E) + " k=" + std::to_string(k.k) + (k.weight_blocks ? " block weights" : ""));
    MoeLayerConfig cfg = small_layer(k.H, k.I, k.E, k.k, k.T);
    cfg.activation_fast_layout = FastScaleLayout::kBlock128;
    if (k.weight_blocks) cfg.weight_fast_layout = FastScaleLayout::kBlock128;
    MoeLayer layer(cfg);
    const StepInputs in(k.T, k.H, k.I, k.E, rng);
    DevBuf<uint16_t> x{size_t(k.T * k.H)};
    auto xs = rand_bf16(x.n, 1.0, rng);
    if (k.E == 16)  // skewed: a shared direction, so that some experts stay empty
      for (auto& v : xs) v = ref::float_to_bf16(ref::bf16_to_float(v) + 0.5f);
    x.upload(xs);
    struct Step {
      std::vector<uint16_t> out, dx;
      std::vector<float> dw, dwr, dw1, dw2;
    };
    auto step = [&](const char* value) {
      const ScopedEnv env("MXMOE_QUANT_COL_BLOCK", value);
      DevBuf<uint16_t> out{size_t(k.T * k.H)}, dx{size_t(k.T * k.H)};
      DevBuf<float> dwr{in.wr.n}, dw1{in.w1.n}, dw2{in.w2.n};
      layer.forward(c(x), k.T, c(in.wr), c(in.w1), c(in.w2), m(out));
      layer.backward(c(in.dout), c(x), c(in.wr), m(dx), dwr.p, dw1.p, dw2.p);
      Step s;
      std::vector<float> dw(size_t(k.T * k.k));
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(dw.data(), layer.topk_weight_grads(), dw.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      s.out = out.download();
      s.dx = dx.download();
      s.dw = dw;
      s.dwr = dwr.download();
      s.dw1 = dw1.download();
      s.dw2 = dw2.download();
      return s;
    };
    const Step a = step("direct"), b = step("rebase"), d = step("");
    for (const Step* s : {&b, &d}) {
      SCOPED_TRACE(s == &b ? "direct vs rebase" : "direct vs unset (the default)");
      EXPECT_EQ(a.out, s->out);
      EXPECT_EQ(a.dx, s->dx);
      EXPECT_EQ(a.dw, s->dw);
      EXPECT_EQ(a.dwr, s->dwr);
      EXPECT_EQ(a.dw1, s->dw1);
      EXPECT_EQ(a.dw2, s->dw2);
    }
    const ScopedEnv env("MXMOE_QUANT_COL_BLOCK", "fused");
    DevBuf<uint16_t> out{size_t(k.T * k.H)};
    try {
      layer.forward(c(x), k.T, c(in.wr), c(in.w1), c(in.w2), m(out));
      ADD_FAILURE() << "MXMOE_QUANT_COL_BLOCK=fused accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("MXMOE_QUANT_COL_BLOCK"), std::string::npos) << e.what();
    }
  }
}
