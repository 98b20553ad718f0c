// mxmoe_ep_layer_test: the expert-parallel MoE layer (include/mxmoe/ep_moe_layer.h) against the
// single-GPU MoeLayer, multi-process. Start it with scripts/ep_launch.sh NGPU
// build/mxmoe_ep_layer_test (or run it bare for R = 1); environment as mxmoe_ep_test.
//
// Per case, every rank regenerates every rank's inputs from the shared seed: tokens x_s [T_s, H]
// (ragged T_s, not multiples of 128; one case has an empty rank), dOut_s, and the full weights
// Wr [E, H], W1 [E, 2I, H], W2 [E, H, I]. It runs
//   reference: MoeLayer (batch_invariant_router, same GEMM mode) on the concatenation x_0 | x_1 |
//              ... in rank order, forward + backward, on this rank's GPU;
//   EP:        EpMoeLayer on x_r with this rank's experts' slice of W1, W2, forward + backward;
// and checks, bitwise: out and dx of this rank's tokens, dW1 and dW2 of its experts, the top-k ids,
// routing weights, their gradient dw and dlogits. dWr: the ranks' shares are all-gathered and summed
// in rank order (FP32), then compared with the reference within 2·(T + R)·2^-24·Σ_t |dlogits·x|
// per element: the same products summed in another order (the bound of any two summation orders
// of n terms); the summation order, not the value, is what differs (docs/notes/ep.md).
// Then: a rerun is bitwise equal; one case captures forward + backward in a CUDA graph on every rank
// and replays it with new tokens (new routing) against the reference on those; timed cases print
// forward / backward medians, the per-stage split into communication and compute, and the overlap
// efficiency compute / layer time; set-up errors (a missing bf16_rows window, ranks disagreeing on
// cfg.inter, one rank with a bad cfg.inter) must throw on every rank.
// Timed cases also print "[rank r] ep-layer <case> H=.. I=.. E=.. k=.. T=.. fast: fwd ms .. fwd+bwd ms .." in
// the format of bench/bench_ep_layer_a2a.py (the torch.distributed all_to_all baseline, same shapes and T).
// MXMOE_EP_LAYER_DSV3=1 adds (=only: runs just) a DeepSeek-V3-like timed case (H 7168, I 2048, E 32, k 8,
// T_r = 4096 - 37r) with inputs from a fast approximate-normal generator and no reference check.
// MXMOE_EP_LAYER_CASE=<text> runs only the cases whose name contains <text> (no set-up checks), each
// as the first thing the process does (the situation of the DSV3-only run, at any size).
// MXMOE_EP_FUSED_COMBINE=0 makes the copy path (combine kernel) the one every case checks against the
// reference and times (default: the fused combine); each case also runs one step on the other path and,
// with R >= 2, one with even ranks fused and odd ranks copying, each bitwise equal to the first.
// MXMOE_EP_DEBUG_SYNC=1 (or 2) prints and synchronises at each step of a case here, and makes
// EpMoeLayer synchronise after each of its stages, naming the first that failed (ep_moe_layer.cpp).
// Exit: 0 all pass, 1 a check failed, 2 an error.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/scoped_env.h"
#include "ep/ep_test_util.h"
#include "mxmoe/ep.h"
#include "mxmoe/ep_moe_layer.h"
#include "mxmoe/moe_layer.h"

namespace {

using mxmoe::test::ScopedEnv;

using ep_test::bf16_bits;
using ep_test::Dev;
using ep_test::median;
using ep_test::World;

struct LayerCase {
  const char* name;
  int hidden, inter, experts_per_rank, top_k;
  int tokens0;           // tokens of rank 0; rank r has max(1, tokens0 - 37·r)
  bool last_rank_empty;  // R >= 2: the last rank has no tokens
  mxmoe::GemmMode mode;
  int num_ctas;
  bool graph = false, timed = false;
  const char* tag = nullptr;  // timed cases: the case name of bench/bench_ep_layer_a2a.py at these shapes
  bool timing_only = false;   // no reference check (opt-in DSV3-size timing, MXMOE_EP_LAYER_DSV3)
};

// MXMOE_EP_FUSED_COMBINE (read by EpMoeLayer on every pass): unset or 1 = the fused combine (the
// expert GEMMs write the rows into the owners' combine slots), 0 = the copy path (combine kernel).
bool fused_combine_env() {
  const char* v = std::getenv("MXMOE_EP_FUSED_COMBINE");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

int64_t tokens_of(const LayerCase& c, int rank, int world) {
  if (c.last_rank_empty && world > 1 && rank == world - 1) return 0;
  return std::max<int64_t>(1, int64_t(c.tokens0) - 37 * rank);
}

// Every rank's inputs, identical on every rank: tokens in rank order.
struct Inputs {
  std::vector<uint16_t> x, dout, wr, w1, w2;
};

Inputs make_inputs(const LayerCase& c, int world, int64_t total_tokens, uint32_t seed, uint32_t salt) {
  const int64_t H = c.hidden, I = c.inter, E = int64_t(c.experts_per_rank) * world;
  std::mt19937 rng(seed * 2654435761u + salt * 97u + uint32_t(c.hidden * 31 + c.top_k));
  std::normal_distribution<float> g(0.f, 1.f);
  std::function<void(std::vector<uint16_t>&, size_t, float)> fill = [&](std::vector<uint16_t>& v, size_t n,
                                                                         float scale) {
    v.resize(n);
    for (auto& e : v) e = bf16_bits(g(rng) * scale);
  };
  if (c.timing_only) {  // ~1.5 G values at DSV3 size: a fast approximate normal (Irwin-Hall of 4 uniforms)
    // The generator state lives in the stored lambda (captured by value, mutable): a reference to a
    // local of this block dangled once the block ended (run 46's inputs were garbage: every token
    // routed to the same experts of rank 0).
    const uint64_t st0 = (uint64_t(seed) << 32) ^ (uint64_t(salt) * 0x9E3779B97F4A7C15ull) ^ 0x2545F4914F6CDD1Dull;
    fill = [st = st0](std::vector<uint16_t>& v, size_t n, float scale) mutable {
      v.resize(n);
      for (auto& e : v) {
        float u = 0.f;
        for (int i = 0; i < 4; ++i) {
          st ^= st << 13;
          st ^= st >> 7;
          st ^= st << 17;
          u += float(st >> 40) * (1.0f / 16777216.0f);
        }
        e = bf16_bits((u - 2.0f) * 1.7320508f * scale);  // mean 0, variance 1 before scale
      }
    };
  }
  Inputs in;
  fill(in.x, size_t(total_tokens * H), 1.0f);
  fill(in.dout, size_t(total_tokens * H), 0.5f);
  fill(in.wr, size_t(E * H), 2.0f / std::sqrt(float(H)));
  fill(in.w1, size_t(E * 2 * I * H), 1.0f / std::sqrt(float(H)));
  fill(in.w2, size_t(E * H * I), 1.0f / std::sqrt(float(I)));
  return in;
}

// What one step produces for this rank's tokens and experts.
struct StepOut {
  std::vector<uint16_t> out, dx;  // [T, H]
  std::vector<float> dw1, dw2;    // local experts
  std::vector<int32_t> ids;       // [T, k]
  std::vector<float> w, dw;       // [T, k]
  std::vector<float> dlogits;     // [T, E]
  std::vector<float> dwr;         // [E, H]: the full gradient (EP: Σ over ranks in rank order)
};

std::string show(uint16_t v) {
  uint32_t u = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  char b[64];
  std::snprintf(b, sizeof b, "%.6g (0x%04x)", f, v);
  return b;
}
std::string show(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  char b[64];
  std::snprintf(b, sizeof b, "%.9g (0x%08x)", v, u);
  return b;
}
std::string show(int32_t v) { return std::to_string(v); }

// Bitwise comparison; prints the first mismatch (row, column) and the count.
template <class T>
bool same_bits(const char* ctx, const char* what, const std::vector<T>& got, const std::vector<T>& want, int64_t cols) {
  if (got.size() != want.size()) {
    std::printf("%s: FAIL %s: %zu elements, single-GPU %zu\n", ctx, what, got.size(), want.size());
    return false;
  }
  int64_t bad = 0;
  size_t first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && bad++ == 0) first = i;
  if (bad == 0) return true;
  std::printf("%s: FAIL %s: %lld of %zu differ; first at [%lld, %lld]: EP %s, single-GPU %s\n", ctx, what,
              (long long)bad, got.size(), (long long)(int64_t(first) / cols), (long long)(int64_t(first) % cols),
              show(got[first]).c_str(), show(want[first]).c_str());
  return false;
}

template <class T>
std::vector<T> slice(const std::vector<T>& v, int64_t begin, int64_t count) {
  return std::vector<T>(v.begin() + begin, v.begin() + begin + count);
}

template <class T>
std::vector<T> down(const T* p, size_t n) {
  std::vector<T> h(n);
  if (n) CK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

class CaseRun {
 public:
  CaseRun(const World& w, const LayerCase& c, int index)
      : w_(w), c_(c), index_(index), R(w.size), r(w.rank), H(c.hidden), I(c.inter), El(c.experts_per_rank),
        E(El * R), k(c.top_k) {
    off_.assign(size_t(R) + 1, 0);
    for (int s = 0; s < R; ++s) off_[size_t(s) + 1] = off_[size_t(s)] + tokens_of(c, s, R);
    T = tokens_of(c, r, R);
    t0 = off_[size_t(r)];
    T_all = off_[size_t(R)];
    maxT = c.tokens0 + 5;
    std::snprintf(ctx_, sizeof ctx_, "[rank %d] %s", r, c.name);
  }

  bool run() {
    int dev = -1;  // everything below must land on this rank's GPU (ep_test::world_from_env sets it)
    CK(cudaGetDevice(&dev));
    if (dev != w_.local_rank) {
      std::printf("%s: FAIL: current device %d at the start of the case, expected LOCAL_RANK %d\n", ctx_, dev,
                  w_.local_rank);
      return false;
    }
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    st_ = st;
    Inputs in = make_inputs(c_, R, T_all, w_.seed, 1);
    x_ = std::make_unique<Dev<uint16_t>>(in.x.size());
    dout_ = std::make_unique<Dev<uint16_t>>(in.dout.size());
    wr_ = std::make_unique<Dev<uint16_t>>(in.wr.size());
    w1_ = std::make_unique<Dev<uint16_t>>(in.w1.size());
    w2_ = std::make_unique<Dev<uint16_t>>(in.w2.size());
    upload(in);
    note("inputs on the GPU");

    // The single-GPU layer on all tokens.
    auto rc = layer_config<mxmoe::MoeLayerConfig>(T_all);
    rc.batch_invariant_router = true;
    ref_ = std::make_unique<mxmoe::MoeLayer>(rc);
    ref_out_ = std::make_unique<Dev<uint16_t>>(size_t(T_all * H));
    ref_dx_ = std::make_unique<Dev<uint16_t>>(size_t(T_all * H));
    ref_dwr_ = std::make_unique<Dev<float>>(size_t(E * H));
    ref_dw1_ = std::make_unique<Dev<float>>(size_t(E) * 2 * I * H);
    ref_dw2_ = std::make_unique<Dev<float>>(size_t(E) * H * I);
    note("single-GPU reference layer built");

    // The EP layer.
    mxmoe::EpConfig ec;
    ec.hidden = H;
    ec.top_k = k;
    ec.num_experts = E;
    ec.max_tokens = maxT;
    ec.num_ctas = c_.num_ctas;
    ec.timeout_s = 20.0;
    ec.bf16_rows = true;
    comm_ = ep_test::make_comm(w_, ec, index_);
    note("EpComm built");
    layer_ = std::make_unique<mxmoe::EpMoeLayer>(layer_config<mxmoe::EpMoeLayerConfig>(maxT), *comm_);
    note("EpMoeLayer built");
    out_ = std::make_unique<Dev<uint16_t>>(size_t(std::max<int64_t>(T, 1) * H));
    dx_ = std::make_unique<Dev<uint16_t>>(size_t(std::max<int64_t>(T, 1) * H));
    dwr_ = std::make_unique<Dev<float>>(size_t(E * H));
    dwr_all_ = std::make_unique<Dev<float>>(size_t(R) * E * H);
    dw1_ = std::make_unique<Dev<float>>(size_t(El) * 2 * I * H);
    dw2_ = std::make_unique<Dev<float>>(size_t(El) * H * I);
    note("output buffers allocated; next: the first EP step");

    bool ok = true;
    if (c_.timing_only) {  // correctness is the other cases' job; one warm step, then timing
      ep_step();
      comm_->check(st_);
      note("warm EP step (forward + backward) done; next: timing");
      timing();
      std::printf("%s: timed only (no reference check)\n", ctx_);
      CK(cudaStreamDestroy(st));
      return true;
    }
    const StepOut want = reference(in);
    ep_step();
    const StepOut got = ep_results();
    ok &= compare(got, want, in, "");
    ep_step();
    const StepOut again = ep_results();
    ok &= identical(got, again, "rerun");
    std::printf("%s: %s (T = %lld of %lld; bitwise vs single-GPU: out, dx, dW1, dW2, ids, weights, dw, dlogits; "
                "dWr |diff| at most %.3g of its bound; rerun bitwise %s)\n",
                ctx_, ok ? "PASS" : "FAIL", (long long)T, (long long)T_all, worst_ratio_,
                identical_last_ ? "equal" : "DIFFERENT");
    ok &= other_combine_paths(got);
    if (c_.graph) ok &= graph_replay();
    if (c_.timed) timing();
    CK(cudaStreamDestroy(st));
    return ok;
  }

 private:
  const World& w_;
  const LayerCase& c_;
  int index_;
  const int R, r, H, I, El, E, k;
  std::vector<int64_t> off_;
  int64_t T = 0, t0 = 0, T_all = 0, maxT = 0;
  char ctx_[160];
  cudaStream_t st_ = nullptr;
  std::unique_ptr<Dev<uint16_t>> x_, dout_, wr_, w1_, w2_, ref_out_, ref_dx_, out_, dx_;
  std::unique_ptr<Dev<float>> ref_dwr_, ref_dw1_, ref_dw2_, dwr_, dwr_all_, dw1_, dw2_;
  std::unique_ptr<mxmoe::MoeLayer> ref_;
  std::unique_ptr<mxmoe::EpComm> comm_;
  std::unique_ptr<mxmoe::EpMoeLayer> layer_;
  double worst_ratio_ = 0;
  bool identical_last_ = true;
  const bool debug_ = ep_test::env_int("MXMOE_EP_DEBUG_SYNC", 0) > 0;

  // MXMOE_EP_DEBUG_SYNC: synchronise and say how far the case got (a fault then names its step).
  void note(const char* reached) {
    if (!debug_) return;
    CK(cudaDeviceSynchronize());
    std::printf("%s: reached: %s\n", ctx_, reached);
  }

  // The fields MoeLayerConfig and EpMoeLayerConfig share.
  template <class Cfg>
  Cfg layer_config(int64_t max_tokens) const {
    Cfg cfg;
    cfg.hidden = H;
    cfg.inter = I;
    cfg.num_experts = E;
    cfg.routing.top_k = k;
    cfg.mode = c_.mode;
    cfg.max_tokens = max_tokens;
    return cfg;
  }

  static const __nv_bfloat16* bf(const Dev<uint16_t>& d, int64_t off = 0) {
    return reinterpret_cast<const __nv_bfloat16*>(d.p + off);
  }
  static __nv_bfloat16* bfm(Dev<uint16_t>& d) { return reinterpret_cast<__nv_bfloat16*>(d.p); }

  void upload(const Inputs& in) {
    x_->up(in.x);
    dout_->up(in.dout);
    wr_->up(in.wr);
    w1_->up(in.w1);
    w2_->up(in.w2);
  }

  void ref_step() {
    ref_->forward(bf(*x_), T_all, bf(*wr_), bf(*w1_), bf(*w2_), bfm(*ref_out_), st_);
    ref_->backward(bf(*dout_), bf(*x_), bf(*wr_), bfm(*ref_dx_), ref_dwr_->p, ref_dw1_->p, ref_dw2_->p, st_);
  }

  void ep_forward() {
    const int64_t w1_off = int64_t(r) * El * 2 * I * H, w2_off = int64_t(r) * El * H * I;
    layer_->forward(bf(*x_, t0 * H), T, bf(*wr_), bf(*w1_, w1_off), bf(*w2_, w2_off), bfm(*out_), st_);
  }
  void ep_backward() {
    layer_->backward(bf(*dout_, t0 * H), bf(*x_, t0 * H), bf(*wr_), bfm(*dx_), dwr_->p, dw1_->p, dw2_->p, st_);
  }
  void ep_step() {
    ep_forward();
    ep_backward();
  }

  // The reference's rows of this rank's tokens and its slice of the experts.
  StepOut reference(const Inputs& in) {
    ref_step();
    CK(cudaStreamSynchronize(st_));
    StepOut o;
    o.out = slice(ref_out_->down(size_t(T_all * H)), t0 * H, T * H);
    o.dx = slice(ref_dx_->down(size_t(T_all * H)), t0 * H, T * H);
    o.dw1 = slice(ref_dw1_->down(ref_dw1_->n), int64_t(r) * El * 2 * I * H, int64_t(El) * 2 * I * H);
    o.dw2 = slice(ref_dw2_->down(ref_dw2_->n), int64_t(r) * El * H * I, int64_t(El) * H * I);
    o.ids = slice(down(ref_->topk_ids(), size_t(T_all * k)), t0 * k, T * k);
    o.w = slice(down(ref_->topk_weights(), size_t(T_all * k)), t0 * k, T * k);
    o.dw = slice(down(ref_->topk_weight_grads(), size_t(T_all * k)), t0 * k, T * k);
    const std::vector<float> dl_all = down(ref_->router_logit_grads(), size_t(T_all * E));
    o.dlogits = slice(dl_all, t0 * E, T * E);
    o.dwr = ref_dwr_->down(ref_dwr_->n);
    // |terms| of dWr = Σ_t dlogits[t, e] · x[t, h], for the summation-order bound
    abs_terms_.assign(size_t(E * H), 0.0);
    for (int64_t t = 0; t < T_all; ++t)
      for (int e = 0; e < E; ++e) {
        const double d = std::fabs(double(dl_all[size_t(t * E + e)]));
        if (d == 0) continue;
        for (int h = 0; h < H; ++h) {
          uint32_t u = uint32_t(in.x[size_t(t * H + h)]) << 16;
          float xv;
          std::memcpy(&xv, &u, 4);
          abs_terms_[size_t(e * H + h)] += d * std::fabs(double(xv));
        }
      }
    return o;
  }
  std::vector<double> abs_terms_;

  StepOut ep_results() {
    comm_->all_gather(dwr_->p, dwr_all_->p, size_t(E * H) * 4, st_);
    comm_->check(st_);  // synchronises; throws if a device barrier timed out
    StepOut o;
    o.out = out_->down(size_t(T * H));
    o.dx = dx_->down(size_t(T * H));
    o.dw1 = dw1_->down(dw1_->n);
    o.dw2 = dw2_->down(dw2_->n);
    o.ids = down(layer_->topk_ids(), size_t(T * k));
    o.w = down(layer_->topk_weights(), size_t(T * k));
    o.dw = down(layer_->topk_weight_grads(), size_t(T * k));
    o.dlogits = down(layer_->router_logit_grads(), size_t(T * E));
    const std::vector<float> all = dwr_all_->down(dwr_all_->n);
    o.dwr.assign(size_t(E * H), 0.0f);
    for (int s = 0; s < R; ++s)  // the sum an all-reduce in rank order would form
      for (size_t i = 0; i < o.dwr.size(); ++i) o.dwr[i] += all[size_t(s) * E * H + i];
    return o;
  }

  bool compare(const StepOut& got, const StepOut& want, const Inputs&, const char* tag) {
    char ctx[200];
    std::snprintf(ctx, sizeof ctx, "%s%s", ctx_, tag);
    bool ok = true;
    ok &= same_bits(ctx, "topk ids", got.ids, want.ids, k);
    ok &= same_bits(ctx, "topk weights", got.w, want.w, k);
    ok &= same_bits(ctx, "out", got.out, want.out, H);
    ok &= same_bits(ctx, "dw (routing-weight grad)", got.dw, want.dw, k);
    ok &= same_bits(ctx, "dlogits", got.dlogits, want.dlogits, E);
    ok &= same_bits(ctx, "dx", got.dx, want.dx, H);
    ok &= same_bits(ctx, "dW1 (local experts)", got.dw1, want.dw1, H);
    ok &= same_bits(ctx, "dW2 (local experts)", got.dw2, want.dw2, I);
    // dWr: the same products summed in another order (per rank, then over ranks).
    const double u = std::ldexp(1.0, -24);
    double worst = 0;
    int64_t bad = 0, first = -1;
    for (size_t i = 0; i < got.dwr.size(); ++i) {
      const double bound = 2.0 * double(T_all + R) * u * abs_terms_[i];
      const double diff = std::fabs(double(got.dwr[i]) - double(want.dwr[i]));
      const bool fine = bound > 0 ? diff <= bound : got.dwr[i] == want.dwr[i];
      if (bound > 0) worst = std::max(worst, diff / bound);
      if (!fine && bad++ == 0) first = int64_t(i);
    }
    worst_ratio_ = worst;
    if (bad) {
      std::printf("%s: FAIL dWr: %lld of %zu outside the summation-order bound; first [%lld, %lld]: EP %s, "
                  "single-GPU %s, bound %.3g\n",
                  ctx, (long long)bad, got.dwr.size(), (long long)(first / H), (long long)(first % H),
                  show(got.dwr[size_t(first)]).c_str(), show(want.dwr[size_t(first)]).c_str(),
                  2.0 * double(T_all + R) * u * abs_terms_[size_t(first)]);
      ok = false;
    }
    return ok;
  }

  bool identical(const StepOut& a, const StepOut& b, const char* what) {
    char ctx[200];
    std::snprintf(ctx, sizeof ctx, "%s %s", ctx_, what);
    bool ok = same_bits(ctx, "out", b.out, a.out, H) && same_bits(ctx, "dx", b.dx, a.dx, H) &&
              same_bits(ctx, "dW1", b.dw1, a.dw1, H) && same_bits(ctx, "dW2", b.dw2, a.dw2, I) &&
              same_bits(ctx, "dWr (sum over ranks)", b.dwr, a.dwr, H) && same_bits(ctx, "dw", b.dw, a.dw, k);
    identical_last_ = ok;
    return ok;
  }

  // The combine path the environment did not pick (MXMOE_EP_FUSED_COMBINE flipped for one step),
  // and, with R >= 2, a step with even ranks fused and odd ranks copying (the two paths run the same
  // barrier sequence, so ranks may differ): both must give `got`'s bits.
  bool other_combine_paths(const StepOut& got) {
    const bool fused = fused_combine_env();
    bool ok;
    {
      ScopedEnv flip("MXMOE_EP_FUSED_COMBINE", fused ? "0" : "1");
      ep_step();
      ok = identical(got, ep_results(), fused ? "copy-path combine" : "fused combine");
    }
    if (R > 1) {
      ScopedEnv mixed("MXMOE_EP_FUSED_COMBINE", r % 2 == 0 ? "1" : "0");
      ep_step();
      ok &= identical(got, ep_results(), "mixed combine paths");
    }
    std::printf("%s: combine paths: %s (default here: %s; the %s path%s bitwise equal)\n", ctx_, ok ? "PASS" : "FAIL",
                fused ? "fused" : "copy", fused ? "copy" : "fused",
                R > 1 ? " and a step with even ranks fused, odd ranks copying," : "");
    return ok;
  }

  // Forward + backward captured once on every rank, replayed on new tokens (new routing).
  bool graph_replay() {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st_, cudaStreamCaptureModeThreadLocal));
    ep_step();
    CK(cudaStreamEndCapture(st_, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    bool ok = true;
    int64_t changed = 0;
    for (uint32_t salt = 2; salt <= 3 && ok; ++salt) {
      const std::vector<int32_t> ids_before = down(layer_->topk_ids(), size_t(T * k));
      Inputs in = make_inputs(c_, R, T_all, w_.seed, salt);
      upload(in);
      CK(cudaGraphLaunch(ge, st_));
      const StepOut got = ep_results();
      CK(cudaGraphLaunch(ge, st_));
      const StepOut again = ep_results();
      const StepOut want = reference(in);
      for (size_t i = 0; i < got.ids.size(); ++i) changed += got.ids[i] != ids_before[i];
      const std::string tag = " graph replay " + std::to_string(salt - 1);
      ok &= compare(got, want, in, tag.c_str());
      ok &= identical(got, again, (tag + " (second launch)").c_str());
    }
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    std::printf("%s: graph (forward + backward, one capture) replayed with new tokens: %s (%lld routing ids changed)\n",
                ctx_, ok ? "PASS" : "FAIL", (long long)changed);
    return ok;
  }

  void timing() {
    cudaEvent_t e0, e1, e2;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventCreate(&e2));
    std::vector<float> tf, tb, tr;
    for (int rep = 0; rep < 12; ++rep) {
      CK(cudaEventRecord(e0, st_));
      ep_forward();
      CK(cudaEventRecord(e1, st_));
      ep_backward();
      CK(cudaEventRecord(e2, st_));
      comm_->check(st_);
      float a = 0, b = 0;
      CK(cudaEventElapsedTime(&a, e0, e1));
      CK(cudaEventElapsedTime(&b, e1, e2));
      if (rep >= 2) {
        tf.push_back(a);
        tb.push_back(b);
      }
    }
    note("timed reps done; next: the per-stage run");
    layer_->set_profiling(true);
    ep_step();
    const auto stages = layer_->stage_times();
    layer_->set_profiling(false);
    comm_->check(st_);
    // NVLink bytes of this rank's tokens (from its routing): a BF16 row per remote owner rank out
    // (dispatch; + k weights in backward), a BF16 row per remote slot in (combine).
    const std::vector<int32_t> ids = down(layer_->topk_ids(), size_t(T * k));
    double rows_out = 0, rows_in = 0;
    for (int64_t t = 0; t < T; ++t) {
      uint64_t owners = 0;
      for (int j = 0; j < k; ++j) {
        const int owner = ids[size_t(t * k + j)] / El;
        if (owner != r) {
          owners |= uint64_t(1) << owner;
          rows_in += 1;
        }
      }
      rows_out += __builtin_popcountll(owners);
    }
    {  // load balance of this rank's tokens: their slots per owner rank (skewed inputs make it obvious)
      std::vector<int64_t> per_owner(size_t(R), 0);
      for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i] >= 0 && ids[i] / El < R) ++per_owner[size_t(ids[i] / El)];
      std::string list;
      for (int q = 0; q < R; ++q) list += (q ? ", " : "") + std::to_string(per_owner[size_t(q)]);
      std::printf("%s: slots of this rank's %lld tokens per owner rank: [%s]\n", ctx_, (long long)T, list.c_str());
    }
    // Communication stages: the dispatches and the combines (fused: only the combine's barriers, the
    // rows having moved inside GEMM2 / the W1 dgrad, which count as compute here).
    const auto is_comm_stage = [](const std::string& name) {
      return name.find("dispatch") != std::string::npos || name.find("combine (") != std::string::npos;
    };
    double comm_ms = 0, compute_ms = 0;
    for (const auto& [name, ms] : stages) {
      const bool is_comm = is_comm_stage(name);
      (is_comm ? comm_ms : compute_ms) += ms;
      double bytes = 0;  // this rank's share of what the stage moves
      if (name.find("dispatch") != std::string::npos) bytes = rows_out * 2.0 * H;
      if (name.find("combine (") != std::string::npos && name.find("barrier") == std::string::npos)
        bytes = rows_in * 2.0 * H;
      if (r == 0)
        std::printf("[rank 0]   stage %-40s %8.3f ms%s\n", name.c_str(), ms,
                    is_comm ? ("  (communication, " + std::to_string(int(bytes / 1e6 + 0.5)) + " MB of this rank: " +
                               std::to_string(ms > 0 ? int(bytes / (ms * 1e6) + 0.5) : 0) + " GB/s)")
                                  .c_str()
                            : "");
    }
    // Compute-only is the copy path's compute stages (with the fused combine, GEMM2 and the W1 dgrad
    // also carry the rows), so the efficiency below compares the layer with the same kernels minus
    // all communication either way.
    const bool fused = fused_combine_env();
    double compute_only = compute_ms;
    if (fused) {
      ScopedEnv copy("MXMOE_EP_FUSED_COMBINE", "0");
      layer_->set_profiling(true);
      ep_step();
      const auto copy_stages = layer_->stage_times();
      layer_->set_profiling(false);
      comm_->check(st_);
      compute_only = 0;
      for (const auto& [name, ms] : copy_stages)
        if (!is_comm_stage(name)) compute_only += ms;
    }
    note("per-stage run done; next: the single-GPU layer's timing");
    for (int rep = 0; rep < 5; ++rep) {  // the single-GPU layer on all R ranks' tokens, for orientation
      CK(cudaEventRecord(e0, st_));
      ref_step();
      CK(cudaEventRecord(e1, st_));
      CK(cudaEventSynchronize(e1));
      float a = 0;
      CK(cudaEventElapsedTime(&a, e0, e1));
      tr.push_back(a);
    }
    const float fwd = median(tf), bwd = median(tb);
    std::printf("%s: timing (combine=%s): forward %.3f ms, backward %.3f ms (median of 10); per-stage run: "
                "communication %.3f ms, compute %.3f ms; compute-only (copy path's compute stages) %.3f ms; overlap "
                "efficiency compute-only / layer = %.3f; single-GPU MoeLayer on all %lld tokens fwd+bwd %.3f ms\n",
                ctx_, fused ? "fused" : "copy", fwd, bwd, comm_ms, compute_ms, compute_only,
                compute_only / double(fwd + bwd), (long long)T_all, median(tr));
  if (c_.tag)  // the format of bench/bench_ep_layer_a2a.py's "a2a-baseline" lines (same shapes and T)
    std::printf("[rank %d] ep-layer %s H=%d I=%d E=%d k=%d T=%lld %s: fwd ms %.3f fwd+bwd ms %.3f | compute-only "
                "fwd+bwd ms %.3f | combine=%s num_ctas=%d\n",
                r, c_.tag, H, I, E, k, (long long)T, c_.mode == mxmoe::GemmMode::kFast ? "fast" : "exact", fwd,
                fwd + bwd, compute_only, fused ? "fused" : "copy", comm_->config().num_ctas);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaEventDestroy(e2));
  }
};

// Set-up errors must stop every rank with a message naming the argument.
bool expect_throw_everywhere(const World& w, const char* what, const mxmoe::EpMoeLayerConfig& lc, mxmoe::EpComm& comm,
                             const char* must_name) {
  std::string msg;
  try {
    mxmoe::EpMoeLayer l(lc, comm);
  } catch (const mxmoe::Error& e) {
    msg = e.what();
  }
  const bool ok = !msg.empty() && msg.find(must_name) != std::string::npos;
  std::printf("[rank %d] bad setup (%s): %s (%s)\n", w.rank, what, ok ? "PASS" : "FAIL",
              msg.empty() ? "no error thrown" : msg.c_str());
  return ok;
}

bool bad_setups(const World& w, int index) {
  mxmoe::EpConfig ec;
  ec.hidden = 128;
  ec.top_k = 2;
  ec.num_experts = 4 * w.size;
  ec.max_tokens = 64;
  ec.num_ctas = 2;
  ec.timeout_s = 20.0;
  mxmoe::EpMoeLayerConfig lc;
  lc.hidden = 128;
  lc.inter = 64;
  lc.num_experts = ec.num_experts;
  lc.routing.top_k = 2;
  lc.max_tokens = 64;
  bool ok = true;
  {
    auto comm = ep_test::make_comm(w, ec, index);  // bf16_rows off
    ok &= expect_throw_everywhere(w, "EpComm without bf16_rows", lc, *comm, "bf16_rows");
  }
  ec.bf16_rows = true;
  auto comm = ep_test::make_comm(w, ec, index + 1);
  mxmoe::EpMoeLayerConfig bad = lc;
  bad.inter = w.rank == w.size - 1 ? 100 : 64;  // the last rank's inter is not a multiple of 32
  ok &= expect_throw_everywhere(w, "the last rank's cfg.inter = 100", bad, *comm,
                                w.rank == w.size - 1 ? "cfg.inter" : "rejected its arguments");
  bad = lc;  // 128x128-block weights: MoeLayer only (moe_expert_block.h check_weight_fast_layout)
  bad.weight_fast_layout = mxmoe::FastScaleLayout::kBlock128;
  ok &= expect_throw_everywhere(w, "cfg.weight_fast_layout = kBlock128", bad, *comm, "cfg.weight_fast_layout");
  if (w.size > 1) {
    bad = lc;
    bad.inter = w.rank == 0 ? 64 : 96;
    ok &= expect_throw_everywhere(w, "cfg.inter differs across ranks", bad, *comm, "differs across ranks");
  }
  {  // and the communicator still works for a good layer afterwards
    mxmoe::EpMoeLayer good(lc, *comm);
  }
  std::printf("[rank %d] bad setups: %s\n", w.rank, ok ? "PASS" : "FAIL");
  return ok;
}

// Calls on the wrong GPU must throw mxmoe::Error naming what is wrong, before anything is launched
// (every rank makes the same mistake, so no rank is left waiting in a barrier): the layer built with
// another current device (last rank only: every rank throws), forward on a stream of another GPU,
// with x on another GPU, with another current device, backward on a stream of another GPU; a good
// step still runs between and after. Needs two visible GPUs. Why: the DSV3-only run made its
// stream and inputs on GPU 0 in every process and rank 1 died with an illegal address at an
// unrelated launch (docs/notes/ep.md, "The DeepSeek-V3-size case").
bool wrong_device_setups(const World& w, int index) {
  int ndev = 0;
  CK(cudaGetDeviceCount(&ndev));
  if (ndev < 2) {
    std::printf("[rank %d] wrong device: SKIP (one GPU visible)\n", w.rank);
    return true;
  }
  const int mine = w.local_rank, other = (w.local_rank + 1) % ndev;
  const int H = 128, I = 64, El = 4, E = El * w.size, k = 2;
  const int64_t T = 64;
  mxmoe::EpConfig ec;
  ec.hidden = H;
  ec.top_k = k;
  ec.num_experts = E;
  ec.max_tokens = T;
  ec.num_ctas = 2;
  ec.timeout_s = 20.0;
  ec.bf16_rows = true;
  mxmoe::EpMoeLayerConfig lc;
  lc.hidden = H;
  lc.inter = I;
  lc.num_experts = E;
  lc.routing.top_k = k;
  lc.max_tokens = T;
  auto comm = ep_test::make_comm(w, ec, index);

  std::mt19937 rng(w.seed * 2654435761u + 7u + uint32_t(w.rank));
  std::normal_distribution<float> g(0.f, 1.f);
  auto dev_random = [&](size_t n, float scale) {
    std::vector<uint16_t> h(n);
    for (auto& e : h) e = bf16_bits(g(rng) * scale);
    auto d = std::make_unique<Dev<uint16_t>>(n);
    d->up(h);
    return d;
  };
  auto x = dev_random(size_t(T * H), 1.0f), dout = dev_random(size_t(T * H), 0.5f);
  auto wr = dev_random(size_t(E) * H, 0.2f), w1 = dev_random(size_t(El) * 2 * I * H, 0.1f);
  auto w2 = dev_random(size_t(El) * H * I, 0.1f);
  Dev<uint16_t> out(size_t(T * H)), dx(size_t(T * H));
  Dev<float> dwr(size_t(E) * H), dw1(size_t(El) * 2 * I * H), dw2(size_t(El) * H * I);
  cudaStream_t st = nullptr, st_other = nullptr;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CK(cudaSetDevice(other));
  CK(cudaStreamCreateWithFlags(&st_other, cudaStreamNonBlocking));
  auto x_other = std::make_unique<Dev<uint16_t>>(size_t(T * H));
  CK(cudaSetDevice(mine));

  bool ok = true;
  auto expect = [&](const char* what, const std::function<void()>& call, const char* must_name) {
    std::string msg;
    try {
      call();
    } catch (const mxmoe::Error& e) {
      msg = e.what();
    }
    int dev = -1;
    CK(cudaGetDevice(&dev));
    const bool fine = !msg.empty() && msg.find(must_name) != std::string::npos && dev == mine;
    std::printf("[rank %d] wrong device (%s): %s (%s)\n", w.rank, what, fine ? "PASS" : "FAIL",
                msg.empty() ? "no error thrown" : msg.c_str());
    ok &= fine;
  };
  const bool last = w.rank == w.size - 1;
  expect("layer built with another current device on the last rank",
         [&] {
           if (last) CK(cudaSetDevice(other));
           struct Back {
             int d;
             ~Back() { cudaSetDevice(d); }
           } back{mine};
           mxmoe::EpMoeLayer bad(lc, *comm);
         },
         last ? "argument 'current device'" : "rejected its arguments");

  mxmoe::EpMoeLayer layer(lc, *comm);
  auto bf = [](const Dev<uint16_t>& d) { return reinterpret_cast<const __nv_bfloat16*>(d.p); };
  auto forward = [&](const Dev<uint16_t>& xin, cudaStream_t s) {
    layer.forward(bf(xin), T, bf(*wr), bf(*w1), bf(*w2), reinterpret_cast<__nv_bfloat16*>(out.p), s);
  };
  auto backward = [&](cudaStream_t s) {
    layer.backward(bf(*dout), bf(*x), bf(*wr), reinterpret_cast<__nv_bfloat16*>(dx.p), dwr.p, dw1.p, dw2.p, s);
  };
  expect("forward on a stream of another GPU", [&] { forward(*x, st_other); }, "argument 'stream'");
  expect("forward with x on another GPU", [&] { forward(*x_other, st); }, "argument 'x'");
  expect("forward with another current device",
         [&] {
           CK(cudaSetDevice(other));
           struct Back {
             int d;
             ~Back() { cudaSetDevice(d); }
           } back{mine};
           forward(*x, st);
         },
         "argument 'current device'");
  forward(*x, st);  // a good step: nothing above launched anything
  expect("backward on a stream of another GPU", [&] { backward(st_other); }, "argument 'stream'");
  backward(st);
  comm->check(st);
  const std::vector<uint16_t> got = out.down(size_t(T * H));
  bool finite = true;
  for (uint16_t v : got) finite &= (v & 0x7F80u) != 0x7F80u;
  std::printf("[rank %d] wrong device: a good step afterwards: %s\n", w.rank, finite ? "PASS (out finite)" : "FAIL");
  ok &= finite;

  CK(cudaStreamDestroy(st));
  CK(cudaSetDevice(other));
  x_other.reset();
  CK(cudaStreamDestroy(st_other));
  CK(cudaSetDevice(mine));
  return ok;
}

}  // namespace

int main() {
  World w;
  if (!ep_test::world_from_env(w)) return 0;
  using mxmoe::GemmMode;
  // H = 256, I = 128 run in well under a second each; the last two are the timed, bigger cases.
  const LayerCase cases[] = {
      {"E=8R k=1 H=256 I=128 fast", 256, 128, 8, 1, 333, false, GemmMode::kFast, 8},
      {"E=8R k=4 H=256 I=128 exact", 256, 128, 8, 4, 301, false, GemmMode::kExact, 8},
      {"E=8R k=8 H=256 I=128 exact", 256, 128, 8, 8, 290, false, GemmMode::kExact, 8},
      {"E=32R k=8 H=256 I=128 fast", 256, 128, 32, 8, 260, false, GemmMode::kFast, 16},
      {"E=32R k=4 H=256 I=128 exact last-rank-empty", 256, 128, 32, 4, 200, true, GemmMode::kExact, 4},
      {"E=32R k=1 H=256 I=128 fast", 256, 128, 32, 1, 222, false, GemmMode::kFast, 8},
      {"graph E=8R k=4 H=256 I=128 fast", 256, 128, 8, 4, 301, false, GemmMode::kFast, 8, true},
      {"timed E=8R k=8 H=1024 I=512 fast T0=2000", 1024, 512, 8, 8, 2000, false, GemmMode::kFast, 0, false, true,
       "small"},
      {"timed E=8R k=8 H=1024 I=512 exact T0=2000", 1024, 512, 8, 8, 2000, false, GemmMode::kExact, 0, false, true,
       "small"},
  };
  // Opt-in (MXMOE_EP_LAYER_DSV3=1: after the cases above; =only: alone): a DeepSeek-V3-like timed case,
  // E = 32 at R = 2, T_r = 4096 - 37r, timing only: bench/bench_ep_layer_a2a.py's case "dsv3".
  const char* dsv3 = std::getenv("MXMOE_EP_LAYER_DSV3");
  const bool dsv3_only = dsv3 && std::string(dsv3) == "only";
  std::vector<LayerCase> run_cases;
  if (!dsv3_only) run_cases.assign(std::begin(cases), std::end(cases));
  if (dsv3 && std::string(dsv3) != "0")
    run_cases.push_back({"timed E=32 k=8 H=7168 I=2048 fast T0=4096", 7168, 2048, 32 / w.size, 8, 4096, false,
                         GemmMode::kFast, 0, false, true, "dsv3", true});
  const char* only = std::getenv("MXMOE_EP_LAYER_CASE");
  if (only != nullptr) {
    std::vector<LayerCase> picked;
    for (const LayerCase& c : run_cases)
      if (std::string(c.name).find(only) != std::string::npos) picked.push_back(c);
    if (picked.empty()) {
      std::printf("[rank %d] ERROR: MXMOE_EP_LAYER_CASE=\"%s\" matches no case\n", w.rank, only);
      return 2;
    }
    run_cases = picked;
  }
  // MXMOE_EP_TIMED_CTAS=n: the timed cases' EpConfig::num_ctas (dispatch / combine kernel CTAs;
  // default 0 = one per SM).
  if (const char* ctas = std::getenv("MXMOE_EP_TIMED_CTAS"))
    for (LayerCase& c : run_cases)
      if (c.timed) c.num_ctas = std::atoi(ctas);
  const bool setups = !dsv3_only && only == nullptr;
  bool all_ok = true;
  const char* current = "bad setups";
  try {
    if (setups) all_ok &= bad_setups(w, 100);
    current = "wrong device";
    if (setups) all_ok &= wrong_device_setups(w, 102);
    int index = 0;
    for (const LayerCase& c : run_cases) {
      current = c.name;
      CaseRun run(w, c, index++);
      all_ok &= run.run();
    }
  } catch (const std::exception& e) {
    std::printf("[rank %d] ERROR in %s: %s\n", w.rank, current, e.what());
    return 2;
  }
  std::printf("[rank %d] %s\n", w.rank, all_ok ? "ALL PASS" : "SOME FAILED");
  return all_ok ? 0 : 1;
}
