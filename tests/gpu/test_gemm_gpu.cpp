// m-grouped and k-grouped MXFP8 GEMMs (include/mxmoe/gemm.h) on the GPU against the FP64 CPU
// reference. Operands are quantized on the CPU (ref::quantize_rows / rebase_fast) and uploaded;
// exact mode's BF16 images are made on the GPU by dequantize_mxfp8_bf16 (bit-exact against the
// CPU reference in test_dequantize_gpu.cpp). Y is poisoned (0xFF bytes = NaN) before each launch:
// rows inside the segments must all be written, rows at or beyond offsets[E] must stay poisoned,
// pad rows must be exact zeros, reruns must be bitwise identical.
//
// Element-wise tolerances (derivations). Let p_i be the products of the operands' values: the
// fast form's deq values (fast), the BF16 images (exact; equal to the MX deq values whenever every
// scale byte is in [3, 246], dequantize.h). Both are exact products (E4M3×E4M3: 8 significant
// bits; BF16×BF16: 16 bits, within FP32's 24, in FP32's exponent range for these data).
//  Fast mode:
//  * Tensor-core sums. Model of Hopper's FP8 wgmma (DeepSeek-V3 report §3.3.2: "around 14 bits"
//    kept; we assume F = 13): one m64nNk32 instruction aligns its 32 products and the incoming
//    accumulator to the largest exponent among them and truncates each to F bits below it, so its
//    error is at most 33·2^-F·max(|acc_in|, max_i |p_i|). The four k32 steps of a 128-chunk chain
//    (acc_in = the chunk's partial sum); the reference evaluates this sum of per-instruction bounds.
//  * FP32 promotion: tot = fma(acc, s, tot) once per chunk: each rounding is at most 2^-24·|tot|
//    <= 2^-24·S with S = Σ|p_i|, so (K/128 + 1)·2^-24·S in all.
//  Exact mode (FP32 accumulation only): one FP32 accumulator over all of K; each k16 wgmma step
//    computes acc + Σ_{16} p_i. Whatever the tensor core's order and rounding inside a step, as
//    long as it keeps FP32's 24 significant bits: sequential adds with round-to-nearest or
//    truncation err by at most Σ_j 2^-23·|s_j| over the 16 partial sums s_j, <= 2^-23·(16·|acc_in|
//    + 136·m) with m = max_i |p_i|; a block addition that aligns the 17 addends to the largest and
//    keeps 24 bits errs by at most 17·2^-23·max(|acc_in|, m), plus 2^-23·17·max for its rounding.
//    So one step errs by at most 152·2^-23·max(|acc_in|, m); the reference sums this over the K/16
//    steps with acc_in = the exact partial sum (first order). No promotion, no other rounding.
//  * Output: BF16 rounds once more, 2^-8 relative (unit roundoff of its 8-bit significand); FP32 0.
//  tol = (sum of the step bounds) [+ (K/128 + 1)·2^-24·S for fast], then (|y_ref| + tol)·2^-8
//  added for BF16.
// Accuracy (brief): fast mode's error against the FP64 product of the unquantized BF16 inputs is
// within 1.1× of exact mode's on Gaussian, heavy-tailed and outlier-channel data; fast-vs-exact
// deviation (relative Frobenius, max ulps) is printed.
//
// Three kernel paths for fast mode: the default (128 × 128 tiles), the 2-CTA TMA-multicast one
// and the wide-tile one (128 × 192), both off by default (kConfigClusterMulticast,
// kConfigFastBlockN in grouped_gemm_mxfp8_sm90_ws.cuh). The host dispatcher reads
// MXMOE_GEMM_MULTICAST ("1" on, "0" off) and MXMOE_GEMM_TILE ("192" or "128"; 192 ignores
// multicast) on every call, so
//   MXMOE_GEMM_MULTICAST=1 ./build/mxmoe_gpu_tests --gtest_filter='GemmGpu.*'
//   MXMOE_GEMM_TILE=192 ./build/mxmoe_gpu_tests --gtest_filter='GemmGpu.*'
// run every case below on that path (exact mode ignores both). ClusterMulticastBitwiseMatchesDefault
// (only with MXMOE_GEMM_MULTICAST=1) and WideTileBitwiseMatchesDefault (always) compare a path with
// the default one byte for byte. Exact mode has two tile widths, 128 × 256 (default) and 128 × 128
// (MXMOE_GEMM_EXACT_TILE=128): `MXMOE_GEMM_EXACT_TILE=128 ./build/mxmoe_gpu_tests
// --gtest_filter='GemmGpu.*'` runs every case on the narrow one; ExactTileWidthsBitwiseEqual
// (always) compares the two byte for byte. B in 128x128 blocks (FastScaleLayout::kBlock128, its own
// kernels): GemmGpu.BlockScales* at the end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/gpu_test_util.h"
#include "common/scoped_env.h"
#include "kernels/gemm/m_grouped_gemm_rows.h"
#include "mxmoe/dequantize.h"
#include "mxmoe/gemm.h"
#include "ref/gemm_ref.h"
#include "ref/mx_ref.h"

using namespace mxmoe;
using namespace mxmoe::test;

namespace {

#define REQUIRE_GPU()                                                       \
  do {                                                                      \
    int n = 0;                                                              \
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)                    \
      GTEST_SKIP() << "no CUDA GPU: the GEMM tests run on the GPU machine"; \
  } while (0)

constexpr double kTcFracBits = 13;  // F in the fast-mode derivation above

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Per-instruction error model of a mode (derivations at the top): `group` products per wgmma
// k-step, each step bounded by per_step·max(|acc_in|, max |p|); a fresh accumulator every `period`
// of K (0: one accumulator over all of K), promoted into FP32 with one rounding each (`promoted`).
struct AccumModel {
  int group;
  double per_step;
  int period;
  bool promoted;
};
const AccumModel kFastModel{32, 33.0 * std::ldexp(1.0, -int(kTcFracBits)), 128, true};
const AccumModel kExactModel{16, 152.0 * std::ldexp(1.0, -23), 0, false};

__nv_bfloat16* bf16_ptr(uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

// The two quantized operands (each in every form: MX, fast, and exact mode's BF16 image made on
// the GPU by dequantize_mxfp8_bf16) and the expert offsets, on the device.
struct DeviceOperands {
  std::unique_ptr<DevBuf<uint8_t>> a_data, a_scales, a_fdata, a_fscales, b_data, b_scales,
      b_fdata, b_fscales;
  std::unique_ptr<DevBuf<uint16_t>> a_image, b_image;
  std::unique_ptr<DevBuf<int32_t>> d_offsets;

  MxOperand a_op() const { return {a_data->p, a_scales->p, a_fdata->p, a_fscales->p, bf16_ptr(a_image->p)}; }
  MxOperand b_op() const { return {b_data->p, b_scales->p, b_fdata->p, b_fscales->p, bf16_ptr(b_image->p)}; }

  // b_fast_scales: B's fast scales in the layout the GEMM reads (may differ from fb.scales).
  void upload(const ref::MxMatrix& qa, const ref::FastMatrix& fa, const ref::MxMatrix& qb,
              const ref::FastMatrix& fb, const std::vector<uint8_t>& b_fast_scales,
              const std::vector<int32_t>& offsets) {
    auto up = [](std::unique_ptr<DevBuf<uint8_t>>& d, const std::vector<uint8_t>& h) {
      d = std::make_unique<DevBuf<uint8_t>>(h.size());
      d->upload(h);
    };
    up(a_data, qa.data);
    up(a_scales, qa.scales);
    up(a_fdata, fa.data);
    up(a_fscales, fa.scales);
    up(b_data, qb.data);
    up(b_scales, qb.scales);
    up(b_fdata, fb.data);
    up(b_fscales, b_fast_scales);
    d_offsets = std::make_unique<DevBuf<int32_t>>(offsets.size());
    d_offsets->upload(offsets);
    make_image(a_image, *a_data, *a_scales, qa);
    make_image(b_image, *b_data, *b_scales, qb);
  }

  static void make_image(std::unique_ptr<DevBuf<uint16_t>>& img, const DevBuf<uint8_t>& data,
                         const DevBuf<uint8_t>& scales, const ref::MxMatrix& q) {
    img = std::make_unique<DevBuf<uint16_t>>(q.data.size());
    dequantize_mxfp8_bf16(data.p, scales.p, q.rows, q.cols, bf16_ptr(img->p));
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  }
};

// The values exact mode multiplies: the BF16 image of an MX operand, as doubles.
std::vector<double> image_values(const ref::MxMatrix& q) {
  const std::vector<uint16_t> img = ref::dequantize_bf16(q);
  std::vector<double> v(img.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = ref::bf16_to_float(img[i]);
  return v;
}

// One m-grouped problem, quantized on the host, uploaded in both forms.
struct Problem : DeviceOperands {
  int E = 1;
  int64_t n = 0, k = 0, m_total = 0;
  std::vector<int> counts;        // true rows per expert
  std::vector<int32_t> offsets;   // padded, [E+1]
  std::vector<uint16_t> a_bf16, b_bf16;  // the unquantized inputs (pad rows of A are zero)
  ref::MxMatrix qa, qb;           // qb: [E·N, K]
  ref::FastMatrix fa, fb;         // on the device, fb.scales rearranged to [E, ceil(K/128), N]
};

void upload_problem(Problem& P);

void build(Problem& P, int E, int64_t n, int64_t k, const std::vector<int>& counts, Dist dist,
           std::mt19937& rng, int64_t extra_rows = 256) {
  P.E = E;
  P.n = n;
  P.k = k;
  P.counts = counts;
  P.offsets.assign(size_t(E + 1), 0);
  for (int e = 0; e < E; ++e) P.offsets[e + 1] = P.offsets[e] + int32_t(cdiv(counts[e], 128) * 128);
  P.m_total = P.offsets[E] + extra_rows;  // rows past offsets[E]: garbage A, must stay unwritten
  // A: random rows for real tokens and for the tail past offsets[E]; zeros for pad rows.
  std::vector<uint16_t> rnd = random_bf16(P.m_total, k, dist, rng);
  P.a_bf16.assign(size_t(P.m_total * k), 0);
  for (int e = 0; e < E; ++e)
    for (int64_t r = P.offsets[e]; r < P.offsets[e] + counts[e]; ++r)
      std::copy_n(&rnd[size_t(r * k)], k, &P.a_bf16[size_t(r * k)]);
  for (int64_t r = P.offsets[E]; r < P.m_total; ++r)
    std::copy_n(&rnd[size_t(r * k)], k, &P.a_bf16[size_t(r * k)]);
  P.b_bf16 = random_bf16(int64_t(E) * n, k, dist, rng);

  P.qa = ref::quantize_rows(P.a_bf16.data(), P.m_total, k, ScaleMode::kRceil);
  P.qb = ref::quantize_rows(P.b_bf16.data(), int64_t(E) * n, k, ScaleMode::kRceil);
  upload_problem(P);
}

// Derives the fast forms from P.qa, P.qb and uploads every form (again, after a test edits them).
void upload_problem(Problem& P) {
  const int E = P.E;
  const int64_t n = P.n;
  P.fa = ref::rebase_fast(P.qa);
  P.fb = ref::rebase_fast(P.qb);
  // B's fast scales: [ceil(K/128), E·N] -> [E, ceil(K/128), N] (per expert, chunk-major).
  const int64_t kc = cdiv(P.k, 128);
  std::vector<uint8_t> fbs(P.fb.scales.size());
  for (int e = 0; e < E; ++e)
    for (int64_t c = 0; c < kc; ++c)
      for (int64_t j = 0; j < n; ++j)
        fbs[size_t((e * kc + c) * n + j)] = P.fb.scales[size_t(c * E * n + e * n + j)];
  P.upload(P.qa, P.fa, P.qb, P.fb, fbs, P.offsets);
}

// One output element: s = Σ_i x[i]·y[i] in FP64 and the bound of the derivation at the top for
// the mode's model m. Steps and chunks start at i = 0 (callers pass 128-aligned starts; len is a
// multiple of 32, and of 16 for exact mode's steps).
void dot_with_bound(const double* x, const double* y, int64_t len, const AccumModel& m, double& s,
                    double& bound) {
  const int64_t period = m.period > 0 ? m.period : std::max<int64_t>(len, 1);
  double sabs = 0, btc = 0;
  s = 0;
  for (int64_t c0 = 0; c0 < len; c0 += period) {
    double partial = 0;
    for (int64_t g0 = c0; g0 < std::min(len, c0 + period); g0 += m.group) {
      double mx = 0, sg = 0;
      for (int64_t i = g0; i < g0 + m.group; ++i) {
        const double p = x[i] * y[i];
        sg += p;
        sabs += std::fabs(p);
        mx = std::max(mx, std::fabs(p));
      }
      btc += m.per_step * std::max(std::fabs(partial), mx);
      partial += sg;
    }
    s += partial;
  }
  bound = btc + (m.promoted ? double(len / period + 1) * std::ldexp(1.0, -24) * sabs : 0.0);
}

template <class F>
void parallel_rows(int64_t rows, F&& f) {
  const int64_t nt = std::max(1u, std::thread::hardware_concurrency());
  const int64_t chunk = cdiv(rows, nt);
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < nt; ++t)
    if (t * chunk < rows) pool.emplace_back(f, t * chunk, std::min(rows, (t + 1) * chunk));
  for (auto& th : pool) th.join();
}

// FP64 reference of the m-grouped GEMM on dequantized operands plus per-element bounds.
void reference_with_bound(const std::vector<double>& da, const std::vector<double>& db,
                          const Problem& P, const AccumModel& model, std::vector<double>& y,
                          std::vector<double>& bound) {
  const int64_t n = P.n, k = P.k;
  y.assign(size_t(P.m_total * n), 0.0);
  bound.assign(y.size(), 0.0);
  std::vector<int> expert(size_t(P.m_total), -1);
  for (int e = 0; e < P.E; ++e)
    for (int64_t r = P.offsets[e]; r < P.offsets[e + 1]; ++r) expert[size_t(r)] = e;
  parallel_rows(P.m_total, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int e = expert[size_t(r)];
      if (e < 0) continue;
      for (int64_t j = 0; j < n; ++j)
        dot_with_bound(&da[size_t(r * k)], &db[size_t((e * n + j) * k)], k, model,
                       y[size_t(r * n + j)], bound[size_t(r * n + j)]);
    }
  });
}

// A GEMM output (FP32 or BF16 bytes, element size esz) as doubles; the 0xFF poison reads as NaN.
std::vector<double> output_values(const std::vector<uint8_t>& h, size_t esz) {
  std::vector<double> v(h.size() / esz);
  for (size_t i = 0; i < v.size(); ++i) {
    if (esz == 4) {
      float f;
      std::memcpy(&f, &h[4 * i], 4);
      v[i] = f;
    } else {
      uint16_t b;
      std::memcpy(&b, &h[2 * i], 2);
      v[i] = ref::bf16_to_float(b);
    }
  }
  return v;
}

// Runs the GEMM into a poisoned Y and returns it as double (NaN where poisoned); raw bytes too.
// With `init` the output starts from those bytes and the GEMM accumulates into it; otherwise it
// is poisoned.
// `b`: another form of operand B (default P.b_op()).
std::vector<double> run(const Problem& P, GemmMode mode, GemmOutDtype out, std::vector<uint8_t>* raw = nullptr,
                        int num_sms = 0, const std::vector<uint8_t>* init = nullptr, const MxOperand* b = nullptr) {
  const size_t elems = size_t(P.m_total * P.n);
  const size_t esz = out == GemmOutDtype::kFP32 ? 4 : 2;
  DevBuf<uint8_t> y(elems * esz, 0xFF);
  if (init) y.upload(*init);
  GemmOptions o;
  o.mode = mode;
  o.out_dtype = out;
  o.num_sms = num_sms;
  o.accumulate = init != nullptr;
  m_grouped_mxfp8_gemm_nt(P.a_op(), P.m_total, b ? *b : P.b_op(), P.E, P.n, P.k, P.d_offsets->p, y.p, o);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  std::vector<uint8_t> h = y.download();
  std::vector<double> v = output_values(h, esz);
  if (raw) *raw = std::move(h);
  return v;
}

const char* mode_name(GemmMode m) { return m == GemmMode::kFast ? "fast" : "exact"; }
const char* out_name(GemmOutDtype o) { return o == GemmOutDtype::kFP32 ? "fp32" : "bf16"; }

// Checks one output against the reference and the bound, plus the row contracts.
void check_output(const Problem& P, const std::vector<double>& got, const std::vector<double>& want,
                  const std::vector<double>& bound, GemmOutDtype out, const std::string& what) {
  const double out_rel = out == GemmOutDtype::kBF16 ? std::ldexp(1.0, -8) : 0.0;
  int64_t bad = 0;
  double worst_ratio = 0;
  std::ostringstream first;
  std::vector<char> real(size_t(P.m_total), 0), inside(size_t(P.m_total), 0);
  for (int e = 0; e < P.E; ++e)
    for (int64_t r = P.offsets[e]; r < P.offsets[e + 1]; ++r) {
      inside[size_t(r)] = 1;
      real[size_t(r)] = r < P.offsets[e] + P.counts[e];
    }
  for (int64_t r = 0; r < P.m_total; ++r) {
    for (int64_t j = 0; j < P.n; ++j) {
      const size_t i = size_t(r * P.n + j);
      const double g = got[i];
      bool ok;
      double tol = 0;
      if (!inside[size_t(r)]) {
        ok = std::isnan(g);  // poison untouched
      } else if (!real[size_t(r)]) {
        ok = g == 0.0;  // pad row: exact zero
      } else {
        tol = bound[i] + out_rel * (std::fabs(want[i]) + bound[i]);
        const double err = std::fabs(g - want[i]);
        ok = err <= tol;  // NaN fails
        if (tol > 0) worst_ratio = std::max(worst_ratio, err / tol);
      }
      if (!ok && bad++ == 0)
        first << "first mismatch at row " << r << " col " << j << ": got " << g << ", want "
              << (inside[size_t(r)] ? (real[size_t(r)] ? want[i] : 0.0) : NAN) << " (tol " << tol
              << ", " << (!inside[size_t(r)] ? "row past offsets[E], must stay unwritten"
                                             : !real[size_t(r)] ? "pad row" : "token row")
              << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " bad elements; " << first.str();
  std::printf("[ %s ] worst |err|/tol = %.3g\n", what.c_str(), worst_ratio);
}

struct Ref {
  std::vector<double> y_exact, b_exact, y_fast, b_fast;
};

Ref make_ref(const Problem& P) {
  Ref R;
  reference_with_bound(image_values(P.qa), image_values(P.qb), P, kExactModel, R.y_exact, R.b_exact);
  reference_with_bound(ref::dequantize(P.fa), ref::dequantize(P.fb), P, kFastModel, R.y_fast, R.b_fast);
  return R;
}

// Every mode × output dtype against the reference, plus a bitwise rerun of each and an
// accumulating call on top of the first result (out += result: exactly 2x in the segments' rows,
// one rounding of a doubled value being exact; rows past offsets[E] stay poisoned).
void check_all(const Problem& P, const std::string& name) {
  const Ref R = make_ref(P);
  for (GemmMode mode : {GemmMode::kFast, GemmMode::kExact}) {
    for (GemmOutDtype out : {GemmOutDtype::kBF16, GemmOutDtype::kFP32}) {
      const std::string what = name + " " + mode_name(mode) + " " + out_name(out);
      std::vector<uint8_t> raw1, raw2;
      const auto got = run(P, mode, out, &raw1);
      if (mode == GemmMode::kFast) check_output(P, got, R.y_fast, R.b_fast, out, what);
      else check_output(P, got, R.y_exact, R.b_exact, out, what);
      run(P, mode, out, &raw2);
      EXPECT_TRUE(raw1 == raw2) << what << ": rerun is not bitwise identical";
      const auto twice = run(P, mode, out, nullptr, 0, &raw1);
      int64_t bad_acc = 0, first = -1;
      for (int64_t i = 0; i < P.offsets[P.E] * P.n; ++i)
        if (!(twice[size_t(i)] == 2.0 * got[size_t(i)]) && bad_acc++ == 0) first = i;
      for (int64_t i = P.offsets[P.E] * P.n; i < P.m_total * P.n; ++i)
        if (!std::isnan(twice[size_t(i)]) && bad_acc++ == 0) first = i;
      EXPECT_EQ(bad_acc, 0) << what << ": accumulate did not give exactly 2x (rows past offsets[E]: "
                            << "untouched); first at row " << first / std::max<int64_t>(P.n, 1);
    }
  }
}

// ---- B in the 128x128-block fast form (gemm.h FastScaleLayout::kBlock128) ----------------------
// ref::rebase_fast_block128 of P.qb on the device, in buffers of its own (P's 1x128 forms stay).
// With `rng` every block's scale byte is then replaced by a random one in [120, 134]: synthetic
// block scales on the same data (the reference reads the same bytes), so that tiles whose columns
// span two blocks with different scales show a column promoted with the wrong block's scale
// (ordinary data give neighbouring blocks nearly equal scales).
struct BlockB {
  ref::FastBlockMatrix f;
  std::unique_ptr<DevBuf<uint8_t>> data, scales;
  MxOperand op(const DeviceOperands& P) const {
    MxOperand b = P.b_op();
    b.fast_data = data->p;
    b.fast_scales = scales->p;
    b.fast_scale_layout = FastScaleLayout::kBlock128;
    return b;
  }
  uint8_t scale(int64_t e, int64_t c, int64_t n) const {  // the byte of row n of expert e, chunk c
    return f.scales[size_t((e * cdiv(f.cols, 128) + c) * f.pitch + n / 128)];
  }
};

// The block form of q (batch matrices of q.rows / batch rows) on the device; synthetic scales as above.
BlockB make_block_form(const ref::MxMatrix& q, int64_t batch, std::mt19937* rng) {
  BlockB B;
  B.f = ref::rebase_fast_block128(q, batch);
  if (rng) {
    std::uniform_int_distribution<int> u(120, 134);
    const int64_t nrb = cdiv(B.f.rows, 128);
    for (size_t i = 0; i < B.f.scales.size(); ++i)
      if (int64_t(i) % B.f.pitch < nrb) B.f.scales[i] = uint8_t(u(*rng));
  }
  B.data = std::make_unique<DevBuf<uint8_t>>(B.f.data.size());
  B.data->upload(B.f.data);
  B.scales = std::make_unique<DevBuf<uint8_t>>(B.f.scales.size());
  B.scales->upload(B.f.scales);
  return B;
}
BlockB make_block_b(const Problem& P, std::mt19937* rng) { return make_block_form(P.qb, P.E, rng); }

std::vector<int> random_counts(std::mt19937& rng, int E, int lo, int hi) {
  std::uniform_int_distribution<int> u(lo, hi);
  std::vector<int> c(static_cast<size_t>(E));
  for (auto& x : c) x = u(rng);
  return c;
}

class GemmGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = fresh_seed();
    rng_.seed(seed_);
  }
  uint32_t seed_ = 0;
  std::mt19937 rng_;
};

#define TRACE_SEED() SCOPED_TRACE(::testing::Message() << "seed " << seed_)

TEST_F(GemmGpu, EmptyExperts) {
  REQUIRE_GPU();
  TRACE_SEED();
  Problem P;
  build(P, 8, 256, 512, {0, 300, 0, 0, 128, 1, 0, 500}, Dist::kGaussian, rng_);
  check_all(P, "empty-experts");
}

TEST_F(GemmGpu, AllExpertsEmpty) {
  REQUIRE_GPU();
  TRACE_SEED();
  Problem P;
  build(P, 4, 128, 256, {0, 0, 0, 0}, Dist::kGaussian, rng_);
  check_all(P, "all-empty");  // every row past offsets[E] = 0: nothing may be written
}

TEST_F(GemmGpu, OneExpertTakesEveryRow) {
  REQUIRE_GPU();
  TRACE_SEED();
  std::vector<int> counts(16, 0);
  counts[5] = 1000;
  Problem P;
  build(P, 16, 384, 640, counts, Dist::kGaussian, rng_);
  check_all(P, "one-expert");
}

TEST_F(GemmGpu, RaggedKTail) {
  REQUIRE_GPU();
  TRACE_SEED();
  Problem P;  // K % 128 == 96: partial last chunk
  build(P, 6, 384, 608, random_counts(rng_, 6, 0, 400), Dist::kHeavyTailed, rng_);
  check_all(P, "ragged-ktail");
}

TEST_F(GemmGpu, NTailCrossesExperts) {
  REQUIRE_GPU();
  TRACE_SEED();
  // N = 160: the second N-tile reads B rows of the next expert (and past E·N for the last).
  Problem P;
  build(P, 3, 160, 96, {130, 0, 257}, Dist::kOutlierChannels, rng_);
  check_all(P, "ntail-160");
  Problem Q;  // N smaller than one tile, K = one block
  build(Q, 5, 32, 32, random_counts(rng_, 5, 0, 200), Dist::kGaussian, rng_);
  check_all(Q, "n32-k32");
}

TEST_F(GemmGpu, SingleExpert) {
  REQUIRE_GPU();
  TRACE_SEED();
  Problem P;
  build(P, 1, 512, 1024, {777}, Dist::kGaussian, rng_);
  check_all(P, "E=1");
}

TEST_F(GemmGpu, ManySmallExperts) {
  REQUIRE_GPU();
  TRACE_SEED();
  Problem P;
  build(P, 384, 128, 256, random_counts(rng_, 384, 0, 40), Dist::kGaussian, rng_);
  check_all(P, "E=384");
}

TEST_F(GemmGpu, Gpt_oss_2880) {
  REQUIRE_GPU();
  TRACE_SEED();
  Problem P;  // N = K = 2880 (not multiples of 128)
  build(P, 4, 2880, 2880, {100, 0, 250, 40}, Dist::kGaussian, rng_);
  check_all(P, "N=K=2880");
}

// Fast vs exact against the FP64 product of the unquantized inputs; block_b: fast mode with B in the
// 128x128-block form made from the same MX copy (ref::rebase_fast_block128).
void expect_fast_accuracy_matches_exact(std::mt19937& rng, bool block_b) {
  for (Dist d : {Dist::kGaussian, Dist::kHeavyTailed, Dist::kOutlierChannels}) {
    Problem P;
    build(P, 4, 512, 2048, {512, 384, 0, 300}, d, rng, 0);
    std::vector<double> a(P.a_bf16.size()), b(P.b_bf16.size());
    for (size_t i = 0; i < a.size(); ++i) a[i] = ref::bf16_to_float(P.a_bf16[i]);
    for (size_t i = 0; i < b.size(); ++i) b[i] = ref::bf16_to_float(P.b_bf16[i]);
    std::vector<double> y_true(size_t(P.m_total * P.n), 0.0);
    ref::m_grouped_gemm_nt(a.data(), b.data(), P.m_total, P.E, P.n, P.k, P.offsets, y_true.data());
    BlockB B;
    MxOperand bop = P.b_op();
    if (block_b) {
      B = make_block_b(P, nullptr);
      bop = B.op(P);
    }
    const auto y_fast = run(P, GemmMode::kFast, GemmOutDtype::kFP32, nullptr, 0, nullptr, &bop);
    const auto y_exact = run(P, GemmMode::kExact, GemmOutDtype::kFP32);
    double e_fast = 0, e_exact = 0, ref2 = 0, dev = 0, exact2 = 0;
    int64_t max_ulps = 0;
    for (int e = 0; e < P.E; ++e)
      for (int64_t r = P.offsets[e]; r < P.offsets[e] + P.counts[e]; ++r)
        for (int64_t j = 0; j < P.n; ++j) {
          const size_t i = size_t(r * P.n + j);
          e_fast += (y_fast[i] - y_true[i]) * (y_fast[i] - y_true[i]);
          e_exact += (y_exact[i] - y_true[i]) * (y_exact[i] - y_true[i]);
          ref2 += y_true[i] * y_true[i];
          dev += (y_fast[i] - y_exact[i]) * (y_fast[i] - y_exact[i]);
          exact2 += y_exact[i] * y_exact[i];
          const float f = float(y_fast[i]), x = float(y_exact[i]);
          int32_t fi, xi;
          std::memcpy(&fi, &f, 4);
          std::memcpy(&xi, &x, 4);
          if ((fi < 0) == (xi < 0)) max_ulps = std::max<int64_t>(max_ulps, std::llabs(int64_t(fi) - xi));
        }
    const double rf = std::sqrt(e_fast / ref2), rx = std::sqrt(e_exact / ref2);
    std::printf("[ %s%s ] rel. Frobenius error vs unquantized: fast %.6g, exact %.6g (ratio %.4f); "
                "fast-vs-exact: rel. Frobenius %.3g, max %lld fp32 ulps (same-sign pairs)\n",
                dist_name(d), block_b ? ", B in 128x128 blocks" : "", rf, rx, rf / rx, std::sqrt(dev / exact2), (long long)max_ulps);
    EXPECT_LE(rf, 1.1 * rx) << dist_name(d) << (block_b ? " (B in 128x128 blocks)" : "")
                            << ": fast mode error exceeds 1.1x exact mode error";
  }
}

TEST_F(GemmGpu, FastModeAccuracyMatchesExact) {
  REQUIRE_GPU();
  TRACE_SEED();
  expect_fast_accuracy_matches_exact(rng_, false);
}


// ---- k-grouped (wgrad) -------------------------------------------------------------------------
// dW[e] = Σ_{t in segment e} dY[t]ᵀ X[t]; operands column-wise quantized on the CPU.
struct KProblem : DeviceOperands {
  int E = 1;
  int64_t n = 0, k = 0, m_total = 0;
  std::vector<int> counts;
  std::vector<int32_t> offsets;
  ref::MxMatrix qa, qb;    // dYᵀ [N, M_total], Xᵀ [K, M_total]
  ref::FastMatrix fa, fb;  // scales [M_total/128, N|K]
  std::vector<uint16_t> dy_bf16, x_bf16;  // the unquantized inputs [M_total, N], [M_total, K]
  // exact mode's images token-blocked (dequantize_mxfp8_bf16_token_blocked; M_total % 128 == 0)
  std::unique_ptr<DevBuf<uint16_t>> a_image_blk, b_image_blk;
};

void build_k(KProblem& P, int E, int64_t n, int64_t k, const std::vector<int>& counts, Dist dist,
             std::mt19937& rng) {
  P.E = E;
  P.n = n;
  P.k = k;
  P.counts = counts;
  P.offsets.assign(size_t(E + 1), 0);
  for (int e = 0; e < E; ++e) P.offsets[e + 1] = P.offsets[e] + int32_t(cdiv(counts[e], 128) * 128);
  P.m_total = P.offsets[E] + 128;  // one chunk past offsets[E] of garbage tokens: never read
  std::vector<uint16_t> dy = random_bf16(P.m_total, n, dist, rng), x = random_bf16(P.m_total, k, dist, rng);
  for (int e = 0; e < E; ++e)  // pad tokens are zero in both operands
    for (int64_t t = P.offsets[e] + counts[e]; t < P.offsets[e + 1]; ++t) {
      std::fill_n(&dy[size_t(t * n)], n, uint16_t(0));
      std::fill_n(&x[size_t(t * k)], k, uint16_t(0));
    }
  P.qa = ref::quantize_cols(dy.data(), P.m_total, n, ScaleMode::kRceil);
  P.qb = ref::quantize_cols(x.data(), P.m_total, k, ScaleMode::kRceil);
  P.dy_bf16 = std::move(dy);
  P.x_bf16 = std::move(x);
  P.fa = ref::rebase_fast(P.qa);
  P.fb = ref::rebase_fast(P.qb);
  P.upload(P.qa, P.fa, P.qb, P.fb, P.fb.scales, P.offsets);
  const auto blocked = [](std::unique_ptr<DevBuf<uint16_t>>& img, const DevBuf<uint8_t>& data,
                          const DevBuf<uint8_t>& scales, const ref::MxMatrix& q) {
    img = std::make_unique<DevBuf<uint16_t>>(q.data.size());
    dequantize_mxfp8_bf16_token_blocked(data.p, scales.p, q.rows, q.cols, bf16_ptr(img->p));
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  };
  blocked(P.a_image_blk, *P.a_data, *P.a_scales, P.qa);
  blocked(P.b_image_blk, *P.b_data, *P.b_scales, P.qb);
}

void k_reference_with_bound(const std::vector<double>& da, const std::vector<double>& db,
                            const KProblem& P, const AccumModel& model, std::vector<double>& y,
                            std::vector<double>& bound) {
  y.assign(size_t(P.E * P.n * P.k), 0.0);
  bound.assign(y.size(), 0.0);
  parallel_rows(P.n, [&](int64_t j0, int64_t j1) {
    for (int e = 0; e < P.E; ++e)
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t i = 0; i < P.k; ++i) {
          const int64_t t0 = P.offsets[e], len = P.offsets[e + 1] - t0;
          const size_t o = size_t((e * P.n + j) * P.k + i);
          dot_with_bound(&da[size_t(j * P.m_total + t0)], &db[size_t(i * P.m_total + t0)], len,
                         model, y[o], bound[o]);
        }
  });
}

// Runs the k-grouped GEMM. With `init` the output starts from those values (accumulate test);
// otherwise it is poisoned (every element must be written). blocked: bit 0 / bit 1 = A's / B's
// exact-mode image token-blocked (ImageLayout::kTokenBlocked) instead of row-major.
std::vector<double> run_k(const KProblem& P, GemmMode mode, GemmOutDtype out, bool accumulate,
                          const std::vector<uint8_t>* init, std::vector<uint8_t>* raw,
                          int num_sms = 0, int blocked = 0, const MxOperand* b_override = nullptr) {
  const size_t elems = size_t(P.E * P.n * P.k);
  const size_t esz = out == GemmOutDtype::kFP32 ? 4 : 2;
  DevBuf<uint8_t> y(elems * esz, 0xFF);
  if (init) y.upload(*init);
  GemmOptions o;
  o.mode = mode;
  o.out_dtype = out;
  o.num_sms = num_sms;
  o.accumulate = accumulate;
  MxOperand a = P.a_op(), b = b_override ? *b_override : P.b_op();
  if (blocked & 1) {
    a.image = bf16_ptr(P.a_image_blk->p);
    a.image_layout = ImageLayout::kTokenBlocked;
  }
  if (blocked & 2) {
    b.image = bf16_ptr(P.b_image_blk->p);
    b.image_layout = ImageLayout::kTokenBlocked;
  }
  k_grouped_mxfp8_gemm_nt(a, b, P.m_total, P.E, P.n, P.k, P.d_offsets->p, y.p, o);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  std::vector<uint8_t> h = y.download();
  std::vector<double> v = output_values(h, esz);
  if (raw) *raw = std::move(h);
  return v;
}

// One k-grouped configuration (mode, output type, operand b: P's own when null) against (want, bound):
// every element within its tolerance (BF16 output: plus the final rounding), bitwise equal on a rerun
// and at each grid of `grids`, accumulate on top of the first result exactly 2x.
void expect_k_run(const KProblem& P, const std::string& what, GemmMode mode, GemmOutDtype out,
                  const std::vector<double>& want, const std::vector<double>& bound, const MxOperand* b = nullptr,
                  std::initializer_list<int> grids = {}) {
  const double out_rel = out == GemmOutDtype::kBF16 ? std::ldexp(1.0, -8) : 0.0;
  std::vector<uint8_t> raw1, raw2;
  const auto got = run_k(P, mode, out, false, nullptr, &raw1, 0, 0, b);
  int64_t bad = 0;
  double worst = 0;
  std::ostringstream first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = bound[i] + out_rel * (std::fabs(want[i]) + bound[i]);
    const double err = std::fabs(got[i] - want[i]);
    if (tol > 0) worst = std::max(worst, err / tol);
    if (!(err <= tol) && bad++ == 0) {
      const int64_t e = int64_t(i) / (P.n * P.k), j = (int64_t(i) / P.k) % P.n, c = int64_t(i) % P.k;
      first << "first mismatch at expert " << e << " row " << j << " col " << c << ": got " << got[i]
            << ", want " << want[i] << " (tol " << tol << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " bad elements; " << first.str();
  std::printf("[ %s ] worst |err|/tol = %.3g\n", what.c_str(), worst);
  run_k(P, mode, out, false, nullptr, &raw2, 0, 0, b);
  EXPECT_TRUE(raw1 == raw2) << what << ": rerun is not bitwise identical";
  for (int sms : grids) {
    run_k(P, mode, out, false, nullptr, &raw2, sms, 0, b);
    EXPECT_TRUE(raw1 == raw2) << what << ": num_sms=" << sms << " differs from num_sms=0";
  }
  // Accumulate: dW += result, starting from the first result: doubles it (exact in FP32 and BF16
  // arithmetic up to one rounding of the sum).
  const auto twice = run_k(P, mode, out, true, &raw1, nullptr, 0, 0, b);
  int64_t bad_acc = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double want2 = out == GemmOutDtype::kFP32 ? double(float(got[i] + got[i])) : 2.0 * got[i];
    if (!(twice[i] == want2)) ++bad_acc;
  }
  EXPECT_EQ(bad_acc, 0) << what << ": accumulate did not give exactly 2x";
}

void check_k_all(const KProblem& P, const std::string& name) {
  std::vector<double> y_exact, b_exact, y_fast, b_fast;
  k_reference_with_bound(image_values(P.qa), image_values(P.qb), P, kExactModel, y_exact, b_exact);
  k_reference_with_bound(ref::dequantize(P.fa), ref::dequantize(P.fb), P, kFastModel, y_fast, b_fast);
  for (GemmMode mode : {GemmMode::kFast, GemmMode::kExact})
    for (GemmOutDtype out : {GemmOutDtype::kBF16, GemmOutDtype::kFP32}) {
      const bool fast = mode == GemmMode::kFast;
      expect_k_run(P, name + " wgrad " + mode_name(mode) + " " + out_name(out), mode, out, fast ? y_fast : y_exact,
                   fast ? b_fast : b_exact);
    }
}

TEST_F(GemmGpu, WgradEmptyAndRaggedExperts) {
  REQUIRE_GPU();
  TRACE_SEED();
  KProblem P;
  build_k(P, 6, 256, 384, {0, 300, 128, 0, 1, 520}, Dist::kGaussian, rng_);
  check_k_all(P, "ragged");
}

TEST_F(GemmGpu, WgradTailsAndOneExpert) {
  REQUIRE_GPU();
  TRACE_SEED();
  KProblem P;  // N, K not multiples of 128; all tokens in one expert
  build_k(P, 3, 160, 96, {0, 700, 0}, Dist::kHeavyTailed, rng_);
  check_k_all(P, "tails");
}

TEST_F(GemmGpu, WgradManyExperts) {
  REQUIRE_GPU();
  TRACE_SEED();
  KProblem P;
  build_k(P, 64, 128, 128, random_counts(rng_, 64, 0, 200), Dist::kOutlierChannels, rng_);
  check_k_all(P, "E=64");
}

// ---- k-grouped with Xᵀ in 128x128 blocks (FastScaleLayout::kBlock128 for operand b) ------------
// Xᵀ [K, M_total] re-expressed per block of 128 rows of K x 128 tokens (ref::rebase_fast_block128
// with one matrix: scales [M_total/128, fast_block_scales_pitch(K)]), run on the 192-wide block
// kernel. With `synthetic`, every block's byte is replaced by a random one in [120, 134] (the
// reference reads the same bytes), so that a column promoted with its neighbouring block's scale
// shows. Checked against the FP64 reference on (fast dYᵀ, block Xᵀ) values with fast mode's bound,
// BF16 and FP32; num_sms 0 and 7 and a rerun bitwise equal; accumulate on the first result gives 2x.
void check_k_block_form(const KProblem& P, const std::string& name, std::mt19937* synthetic) {
  const BlockB B = make_block_form(P.qb, 1, synthetic);  // Xᵀ [K, M_total]: one matrix
  const MxOperand bop = B.op(P);
  std::vector<double> want, bound;
  k_reference_with_bound(ref::dequantize(P.fa), ref::dequantize(B.f), P, kFastModel, want, bound);
  for (GemmOutDtype out : {GemmOutDtype::kBF16, GemmOutDtype::kFP32})
    expect_k_run(P, name + " wgrad, Xᵀ in 128x128 blocks, " + out_name(out), GemmMode::kFast, out, want, bound, &bop,
                 {7});
}

// Cases: ragged and empty experts with K = 384 (k-tiles at 0 and 192: blocks 0|1 and 1|2); N, K
// not multiples of 128 with one expert holding every token (K = 96: one block, the tile's second
// block past K); K = 2880 (pitch 32, the last block of 64 rows) with heavy-tailed data; 64 experts.
// Each with synthetic block scales and with the real ones (rebased from the MX copy).
TEST_F(GemmGpu, WgradBlockScalesMatchReference) {
  REQUIRE_GPU();
  TRACE_SEED();
  struct Case { int E; int64_t n, k; std::vector<int> counts; };
  const std::vector<Case> cases = {
      {6, 256, 384, {0, 300, 128, 0, 1, 520}},
      {3, 160, 96, {0, 700, 0}},
      {2, 128, 2880, {300, 200}},
      {64, 128, 448, random_counts(rng_, 64, 0, 200)},
  };
  for (const Case& c : cases) {
    KProblem P;
    build_k(P, c.E, c.n, c.k, c.counts, c.k == 2880 ? Dist::kHeavyTailed : Dist::kGaussian, rng_);
    const std::string name = "E=" + std::to_string(c.E) + " N=" + std::to_string(c.n) + " K=" + std::to_string(c.k);
    check_k_block_form(P, name + " synthetic scales", &rng_);
    check_k_block_form(P, name, nullptr);
  }
}

// Accuracy of wgrad's fast mode, with Xᵀ per row (the default) and in 128x128 blocks made from the
// MX copy: within 1.1x of exact mode's error against the FP64 product of the unquantized inputs, on
// the three data families (outlier channels are rows of Xᵀ, i.e. inside its blocks).
TEST_F(GemmGpu, WgradFastAccuracyMatchesExact) {
  REQUIRE_GPU();
  TRACE_SEED();
  for (Dist d : {Dist::kGaussian, Dist::kHeavyTailed, Dist::kOutlierChannels}) {
    KProblem P;
    build_k(P, 3, 256, 512, {512, 384, 300}, d, rng_);
    std::vector<double> y_true(size_t(P.E * P.n * P.k), 0.0);
    parallel_rows(P.n, [&](int64_t j0, int64_t j1) {
      for (int e = 0; e < P.E; ++e)
        for (int64_t t = P.offsets[e]; t < P.offsets[e + 1]; ++t)
          for (int64_t j = j0; j < j1; ++j) {
            const double g = ref::bf16_to_float(P.dy_bf16[size_t(t * P.n + j)]);
            if (g == 0) continue;
            double* row = &y_true[size_t((e * P.n + j) * P.k)];
            for (int64_t i = 0; i < P.k; ++i) row[i] += g * ref::bf16_to_float(P.x_bf16[size_t(t * P.k + i)]);
          }
    });
    const BlockB B = make_block_form(P.qb, 1, nullptr);
    const MxOperand bop = B.op(P);
    const auto y_fast = run_k(P, GemmMode::kFast, GemmOutDtype::kFP32, false, nullptr, nullptr);
    const auto y_blk = run_k(P, GemmMode::kFast, GemmOutDtype::kFP32, false, nullptr, nullptr, 0, 0, &bop);
    const auto y_exact = run_k(P, GemmMode::kExact, GemmOutDtype::kFP32, false, nullptr, nullptr);
    double e_fast = 0, e_blk = 0, e_exact = 0, ref2 = 0;
    for (size_t i = 0; i < y_true.size(); ++i) {
      e_fast += (y_fast[i] - y_true[i]) * (y_fast[i] - y_true[i]);
      e_blk += (y_blk[i] - y_true[i]) * (y_blk[i] - y_true[i]);
      e_exact += (y_exact[i] - y_true[i]) * (y_exact[i] - y_true[i]);
      ref2 += y_true[i] * y_true[i];
    }
    const double rf = std::sqrt(e_fast / ref2), rb = std::sqrt(e_blk / ref2), rx = std::sqrt(e_exact / ref2);
    std::printf("[ wgrad %s ] rel. Frobenius error vs unquantized: fast %.6g, fast with Xᵀ in blocks %.6g, exact %.6g "
                "(ratios %.4f, %.4f)\n", dist_name(d), rf, rb, rx, rf / rx, rb / rx);
    EXPECT_LE(rf, 1.1 * rx) << dist_name(d) << ": wgrad fast mode error exceeds 1.1x exact mode error";
    EXPECT_LE(rb, 1.1 * rx) << dist_name(d) << ": wgrad fast mode (Xᵀ in blocks) error exceeds 1.1x exact mode error";
  }
}

// ---- other fast-mode kernel paths ---------------------------------------------------------------
// The host dispatcher picks fast mode's kernel from MXMOE_GEMM_TILE (128 or 192) and
// MXMOE_GEMM_MULTICAST (0/1, 128-wide only) on every call. Each alternative path computes the same
// tiles' elements with the same chunk order and promotion, so it must reproduce the default
// kernel's bytes exactly.
bool multicast_requested() {
  const char* v = std::getenv("MXMOE_GEMM_MULTICAST");
  return v != nullptr && v[0] != '\0' && v[0] != '0';
}

// A kernel path as the environment selects it (read by the host dispatcher on every call).
struct PathEnv {
  int tile = 128;          // MXMOE_GEMM_TILE (fast mode)
  bool multicast = false;  // MXMOE_GEMM_MULTICAST (fast mode, 128 wide)
  int exact_tile = 256;    // MXMOE_GEMM_EXACT_TILE (exact mode)
  bool tma_store = true;   // MXMOE_GEMM_TMA_STORE (192 wide, m-grouped, BF16 out, no accumulate)
  bool k_order_tokens = true;  // MXMOE_GEMM_K_ORDER: tokens (largest expert first, default) or index
  std::string k_raster = "auto";  // MXMOE_GEMM_K_RASTER: auto (default: exact groups, fast nmajor),
                                  // auto:N, group, nmajor or a group width
  bool exact_multicast = false;   // MXMOE_GEMM_EXACT_MULTICAST (exact m-grouped 256 wide: clusters sharing B)
};
const PathEnv kDefaultPath{};

// Sets the variables of a PathEnv for one scope and restores what was there.
class ScopedKernelPath {
 public:
  explicit ScopedKernelPath(const PathEnv& e) {
    set("MXMOE_GEMM_TILE", std::to_string(e.tile), 0);
    set("MXMOE_GEMM_MULTICAST", e.multicast ? "1" : "0", 1);
    set("MXMOE_GEMM_EXACT_TILE", std::to_string(e.exact_tile), 2);
    set("MXMOE_GEMM_TMA_STORE", e.tma_store ? "1" : "0", 3);
    set("MXMOE_GEMM_K_ORDER", e.k_order_tokens ? "tokens" : "index", 4);
    set("MXMOE_GEMM_K_RASTER", e.k_raster, 5);
    set("MXMOE_GEMM_EXACT_MULTICAST", e.exact_multicast ? "1" : "0", 6);
  }
  ~ScopedKernelPath() {
    for (int i = 0; i < kVars; ++i) {
      if (had_[i]) setenv(names_[i], old_[i].c_str(), 1);
      else unsetenv(names_[i]);
    }
  }

 private:
  static constexpr int kVars = 7;
  void set(const char* name, const std::string& value, int i) {
    const char* v = std::getenv(name);
    names_[i] = name;
    had_[i] = v != nullptr;
    if (had_[i]) old_[i] = v;
    setenv(name, value.c_str(), 1);
  }
  const char* names_[kVars] = {};
  bool had_[kVars] = {};
  std::string old_[kVars];
};

struct PathCase { int E; int64_t n, k; std::vector<int> counts; };

// One problem on the default path and on `alt`, byte for byte: BF16 and FP32 out, every persistent
// grid in `grids`; with `accumulate` also a second call of each path adding into the same
// default-path result.
// run_one(out, num_sms, init or nullptr, &raw) runs the GEMM once (accumulating when init).
template <class RunOne>
void expect_same_bytes(const std::string& what, const PathEnv& alt, const std::vector<int>& grids,
                       bool accumulate, RunOne&& run_one) {
  for (GemmOutDtype out : {GemmOutDtype::kBF16, GemmOutDtype::kFP32}) {
    for (int sms : grids) {
      for (int acc = 0; acc <= int(accumulate); ++acc) {
        std::vector<uint8_t> base, want, got;
        const std::vector<uint8_t>* init = nullptr;
        if (acc) {
          ScopedKernelPath env(kDefaultPath);
          run_one(out, 0, nullptr, &base);
          init = &base;
        }
        {
          ScopedKernelPath env(kDefaultPath);
          run_one(out, 0, init, &want);
        }
        {
          ScopedKernelPath env(alt);
          run_one(out, sms, init, &got);
        }
        size_t first = 0;
        while (first < want.size() && first < got.size() && want[first] == got[first]) ++first;
        EXPECT_TRUE(want == got) << what << " " << out_name(out) << " num_sms=" << sms
                                 << (acc ? " accumulate" : "")
                                 << ": output differs from the default path, first at byte " << first;
      }
    }
  }
}

// expect_same_bytes over m-grouped problems `mcases` and k-grouped problems `kcases` in `mode`.
void expect_path_matches_default(const char* name, const PathEnv& alt, const std::vector<PathCase>& mcases,
                                 const std::vector<PathCase>& kcases, const std::vector<int>& grids,
                                 bool accumulate, std::mt19937& rng, GemmMode mode = GemmMode::kFast) {
  const auto label = [&](const char* grouping, const PathCase& c) {
    return std::string(name) + ": " + grouping + " E=" + std::to_string(c.E) +
           " N=" + std::to_string(c.n) + " K=" + std::to_string(c.k);
  };
  for (const PathCase& c : mcases) {
    Problem P;
    build(P, c.E, c.n, c.k, c.counts, Dist::kGaussian, rng);
    expect_same_bytes(label("m-grouped", c), alt, grids, accumulate,
                      [&](GemmOutDtype out, int sms, const std::vector<uint8_t>* init,
                          std::vector<uint8_t>* raw) { run(P, mode, out, raw, sms, init); });
  }
  for (const PathCase& c : kcases) {
    KProblem P;
    build_k(P, c.E, c.n, c.k, c.counts, Dist::kHeavyTailed, rng);
    expect_same_bytes(label("k-grouped", c), alt, grids, accumulate,
                      [&](GemmOutDtype out, int sms, const std::vector<uint8_t>* init,
                          std::vector<uint8_t>* raw) {
                        run_k(P, mode, out, init != nullptr, init, raw, sms);
                      });
  }
}

// 2-CTA multicast: odd tile counts (phantom partner tiles), one tile, many small experts, and
// small or odd persistent grids (num_sms 3 launches one cluster of 2).
TEST_F(GemmGpu, ClusterMulticastBitwiseMatchesDefault) {
  REQUIRE_GPU();
  if (!multicast_requested())
    GTEST_SKIP() << "the 2-CTA multicast path is off by default; run with MXMOE_GEMM_MULTICAST=1";
  TRACE_SEED();
  const std::vector<PathCase> mcases = {
      {4, 2880, 2880, {100, 0, 250, 40}},                // 23 n-tiles: a phantom partner, K tail
      {3, 160, 96, {130, 0, 257}},                       // 2 n-tiles, the second past N
      {5, 32, 32, random_counts(rng_, 5, 0, 200)},       // 1 n-tile: every pair half phantom
      {384, 128, 256, random_counts(rng_, 384, 0, 40)},  // many small and empty experts
      {8, 512, 1024, random_counts(rng_, 8, 0, 900)},
  };
  const std::vector<PathCase> kcases = {
      {6, 256, 384, {0, 300, 128, 0, 1, 520}},  // 3 k-tiles: a phantom partner; empty experts
      {3, 160, 96, {0, 700, 0}},                // 1 k-tile, N tail
  };
  expect_path_matches_default("multicast", PathEnv{128, true}, mcases, kcases, {0, 3}, false, rng_);
}

// Exact mode's 2-CTA clusters sharing B (MXMOE_GEMM_EXACT_MULTICAST=1: pairs of m-tiles, m-grouped,
// 256-wide tiles, both epilogues): the plain kernel's bytes, BF16 and FP32, with accumulate (a
// phantom tile that stored would add its partner's tile twice). Pairs whose m-tiles belong to two
// experts (b_shared false: {100, 0, 250, 40} pads to m-tiles 1, 0, 2, 1, so both pairs straddle),
// bands ending in a phantom (5 and 3 m-tiles; 384 experts of 0-300 rows), one m-tile, N = 160 (one
// partial n-tile) and 2880 (a partial 12th), K tails; num_sms 3 launches one cluster, 7 three.
// Runs on every GPU run (it selects the path itself). A bad value of the variable throws before any
// launch, naming it.
TEST_F(GemmGpu, ExactMulticastBitwiseMatchesDefault) {
  REQUIRE_GPU();
  TRACE_SEED();
  const std::vector<PathCase> mcases = {
      {4, 2880, 2880, {100, 0, 250, 40}},
      {3, 160, 96, {130, 0, 257}},
      {1, 512, 256, {100}},
      {2, 4096, 640, {300, 0}},
      {384, 256, 256, random_counts(rng_, 384, 0, 300)},
      {8, 512, 1024, random_counts(rng_, 8, 0, 900)},
  };
  for (bool tma_store : {true, false}) {
    PathEnv alt;
    alt.exact_multicast = true;
    alt.tma_store = tma_store;
    expect_path_matches_default(tma_store ? "exact multicast, TMA stores" : "exact multicast, direct stores", alt,
                                mcases, {}, {0, 3, 7}, true, rng_, GemmMode::kExact);
  }
  Problem P;
  build(P, 2, 256, 128, {128, 128}, Dist::kGaussian, rng_);
  const ScopedEnv bad("MXMOE_GEMM_EXACT_MULTICAST", "yes");
  std::vector<uint8_t> raw;
  try {
    run(P, GemmMode::kExact, GemmOutDtype::kBF16, &raw, 0, nullptr);
    ADD_FAILURE() << "MXMOE_GEMM_EXACT_MULTICAST=yes was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("MXMOE_GEMM_EXACT_MULTICAST"), std::string::npos) << e.what();
  }
}

// The problems on which a tile width is compared with the default one byte for byte: N = 2880 is
// 15 whole 192-tiles (22.5 of 128, 11.25 of 256), N = 4096 and 512 end in a partial 192-tile whose
// B box reads the next expert's rows, N = 160 and 32 are one partial tile; K = 2880 and 96 end in
// a K tail; ragged and empty experts (E up to 384); k-grouped K = 2880 and 992 (whole and partial
// k-tiles).
struct PathCases {
  std::vector<PathCase> m, k;
};
PathCases tile_width_cases(std::mt19937& rng) {
  PathCases c;
  c.m = {
      {4, 2880, 2880, {100, 0, 250, 40}},
      {3, 160, 96, {130, 0, 257}},
      {5, 32, 32, random_counts(rng, 5, 0, 200)},
      {2, 4096, 640, {300, 0}},
      {384, 128, 256, random_counts(rng, 384, 0, 40)},
      {8, 512, 1024, random_counts(rng, 8, 0, 900)},
  };
  c.k = {
      {6, 256, 384, {0, 300, 128, 0, 1, 520}},  // K = 2 × 192; empty experts
      {3, 160, 96, {0, 700, 0}},                // one partial k-tile, N tail
      {3, 2880, 2880, {260, 0, 130}},           // 15 k-tiles of 192
      {4, 128, 992, random_counts(rng, 4, 0, 400)},  // 5 k-tiles and a partial sixth
  };
  return c;
}

// Wide tiles (128 × 192, one accumulator per math warpgroup; MXMOE_GEMM_TILE=192). Runs on every
// GPU run (it selects the path itself); num_sms 1 and 7 make each CTA walk many tiles (stage ring
// phases across tiles, and the TMA-store epilogue's staging reused tile after tile). Every call
// except BF16 with accumulate takes the TMA-store epilogue (4 stages; boxes past the last row or
// column clipped by the map: m-grouped N = 32, 160, 4096 and 512 end in partial tiles, k-grouped
// N = 160 and 2880 end in partial n-tiles of one expert and K = 992 in a partial k-tile; FP32
// with accumulate by TMA reduce-add); the whole output buffer is compared, so a store outside a
// tile's rows (e.g. into the next expert's dW) or past the last column would show too.
TEST_F(GemmGpu, WideTileBitwiseMatchesDefault) {
  REQUIRE_GPU();
  TRACE_SEED();
  const PathCases c = tile_width_cases(rng_);
  expect_path_matches_default("wide tile", PathEnv{192}, c.m, c.k, {0, 1, 7}, true, rng_);
}

// The same with the TMA-store epilogue off (MXMOE_GEMM_TMA_STORE=0): the 5-stage kernel with
// direct stores, for every call.
TEST_F(GemmGpu, WideTileDirectStoresBitwiseMatchDefault) {
  REQUIRE_GPU();
  TRACE_SEED();
  const PathCases c = tile_width_cases(rng_);
  PathEnv direct{192};
  direct.tma_store = false;
  expect_path_matches_default("wide tile, direct stores", direct, c.m, c.k, {0, 7}, true, rng_);
}

// The k-grouped schedule's expert order (k_grouped_expert_order: largest token count first, the
// default) against the index order (MXMOE_GEMM_K_ORDER=index): the same bytes, since only which
// CTA computes a tile and when changes, never a tile's own reduction. Fast (192 wide) and exact
// (256 wide) mode, BF16/FP32 with accumulate, grids 0, 1, 7; the k cases have empty experts, ties
// and ragged counts, and a skewed case (one expert with most tokens, several empty) on top.
TEST_F(GemmGpu, KGroupedExpertOrderBitwiseEqual) {
  REQUIRE_GPU();
  TRACE_SEED();
  PathCases c = tile_width_cases(rng_);
  c.k.push_back({7, 256, 576, {0, 40, 1500, 0, 130, 3, 260}});
  PathEnv index;
  index.k_order_tokens = false;
  for (GemmMode mode : {GemmMode::kFast, GemmMode::kExact})
    expect_path_matches_default(mode == GemmMode::kFast ? "k order, fast" : "k order, exact", index, {}, c.k,
                                {0, 1, 7}, true, rng_, mode);
}

// The k-grouped tile order within an expert (MXMOE_GEMM_K_RASTER: the default by mode — exact
// mode's groups of G n-tiles walked k-tile by k-tile, fast mode's n-major order — against n-major, the computed groups
// for every expert, group widths 3 and 5 and groups for experts of >= 512 tokens only (auto:512), which leave short last groups for the n-tile
// counts of tile_width_cases): only which CTA computes a tile changes, so the bytes must not. Both
// modes, every tile width (fast 128 and 192, exact 256 and 128), BF16/FP32, accumulate (n-major),
// grids 0 and 7 (7 CTAs: many tiles per CTA, the groups' order across CTAs). (Run 70: with grids 0,
// 1 and 7 on every variant this test ran past 40 s.)
TEST_F(GemmGpu, KGroupedRasterBitwiseEqual) {
  REQUIRE_GPU();
  TRACE_SEED();
  PathCases c = tile_width_cases(rng_);
  c.k.push_back({7, 640, 576, {0, 40, 1500, 0, 130, 3, 260}});  // 5 n-tiles: groups of 3 leave 2
  PathEnv nmajor;
  nmajor.k_raster = "nmajor";
  for (GemmMode mode : {GemmMode::kFast, GemmMode::kExact})
    expect_path_matches_default(mode == GemmMode::kFast ? "k raster nmajor, fast" : "k raster nmajor, exact", nmajor,
                                {}, c.k, {0, 7}, true, rng_, mode);
  // "auto:512": groups only for the experts of at least 512 tokens (here 1500 and some of the random
  // ones), n-major for the rest, in one launch.
  for (const char* g : {"group", "3", "5", "auto:512"}) {
    PathEnv alt;
    alt.k_raster = g;
    for (int tile : {128, 192}) {
      alt.tile = tile;
      const std::string name = std::string("k raster ") + g + ", fast " + std::to_string(tile);
      expect_path_matches_default(name.c_str(), alt, {}, c.k, {7}, false, rng_, GemmMode::kFast);
    }
    alt.tile = 128;
    for (int et : {256, 128}) {
      alt.exact_tile = et;
      const std::string name = std::string("k raster ") + g + ", exact " + std::to_string(et);
      expect_path_matches_default(name.c_str(), alt, {}, c.k, {7}, false, rng_, GemmMode::kExact);
    }
  }
}

// ---- exact mode: tile widths and the image's scale range ------------------------------------------

// Exact mode's two tile widths (MXMOE_GEMM_EXACT_TILE = 256, the default, and 128) give the same
// bytes: every output element is one thread's FP32 accumulator fed the same k16 steps in the same
// order (chunks of 64 along K, four k16 steps each); only the instruction's N differs
// (m64n256k16 vs m64n128k16). A mismatch here with the tolerance tests passing would mean the
// tensor core's sum inside a k16 step depends on the instruction's N. The problems of
// tile_width_cases (N = 2880 is 11.25 tiles of 256; partial tiles read the next expert's B rows);
// num_sms 1 and 7 carry the 4-stage ring across many tiles; BF16/FP32, plain and accumulating.
TEST_F(GemmGpu, ExactTileWidthsBitwiseEqual) {
  REQUIRE_GPU();
  TRACE_SEED();
  const PathCases c = tile_width_cases(rng_);
  PathEnv narrow;
  narrow.exact_tile = 128;
  expect_path_matches_default("exact 128-wide vs 256-wide", narrow, c.m, c.k, {0, 1, 7}, true, rng_,
                              GemmMode::kExact);
}

// Exact mode's 256-wide tiles with direct stores (MXMOE_GEMM_TMA_STORE=0: 4 stages) against the
// default (the TMA-store epilogue, 3 stages), both groupings, BF16/FP32, accumulate.
TEST_F(GemmGpu, ExactWideDirectStoresBitwiseMatchDefault) {
  REQUIRE_GPU();
  TRACE_SEED();
  const PathCases c = tile_width_cases(rng_);
  PathEnv direct;
  direct.tma_store = false;
  expect_path_matches_default("exact 256-wide, direct stores", direct, c.m, c.k, {0, 7}, true, rng_,
                              GemmMode::kExact);
}

// ---- exact mode: token-blocked wgrad images ---------------------------------------------------------
//
// The k-grouped exact GEMM on token-blocked images (ImageLayout::kTokenBlocked: 3-D TMA map, loads at
// (2·(t % 128) bytes, row, t / 128)) against row-major images: the same bytes, since the boxes land
// in shared memory identically and everything after the loads is the same kernel. A only, B only
// and both blocked; the k cases of tile_width_cases (N = 2880 and 160: partial n-tiles; K = 2880,
// 992, 96: partial k-tiles whose B boxes read zero fill past row K in the 3-D map too; empty and
// ragged experts), a skewed case, and a segment of 1100 tokens (padded to 1152: pad tokens in its
// last 128-token block); exact tiles 256 (TMA-store epilogue and direct
// stores) and 128; BF16 and FP32 out, plain and accumulating; num_sms 0 and 7 (the ring across
// many tiles).
TEST_F(GemmGpu, WgradTokenBlockedImagesBitwiseEqual) {
  REQUIRE_GPU();
  TRACE_SEED();
  PathCases c = tile_width_cases(rng_);
  c.k.push_back({7, 256, 576, {0, 40, 1500, 0, 130, 3, 260}});
  c.k.push_back({2, 2880, 128, {1100, 0}});
  PathEnv wide, wide_direct, narrow;
  wide_direct.tma_store = false;
  narrow.exact_tile = 128;
  for (const PathCase& pc : c.k) {
    KProblem P;
    build_k(P, pc.E, pc.n, pc.k, pc.counts, Dist::kHeavyTailed, rng_);
    for (const PathEnv* env : {&wide, &wide_direct, &narrow}) {
      ScopedKernelPath scope(*env);
      for (GemmOutDtype out : {GemmOutDtype::kBF16, GemmOutDtype::kFP32}) {
        for (int acc = 0; acc <= 1; ++acc) {
          std::vector<uint8_t> base, want;
          const std::vector<uint8_t>* init = nullptr;
          if (acc) {
            run_k(P, GemmMode::kExact, out, false, nullptr, &base);
            init = &base;
          }
          run_k(P, GemmMode::kExact, out, acc != 0, init, &want);
          for (int sms : {0, 7}) {
            for (int blocked = 1; blocked <= 3; ++blocked) {
              std::vector<uint8_t> got;
              run_k(P, GemmMode::kExact, out, acc != 0, init, &got, sms, blocked);
              size_t first = 0;
              while (first < want.size() && first < got.size() && want[first] == got[first]) ++first;
              EXPECT_TRUE(want == got) << "E=" << pc.E << " N=" << pc.n << " K=" << pc.k << " exact tile "
                                       << env->exact_tile << (env->tma_store ? "" : " direct stores") << " "
                                       << out_name(out) << (acc ? " accumulate" : "") << " num_sms=" << sms
                                       << " blocked " << (blocked == 1 ? "A" : blocked == 2 ? "B" : "A+B")
                                       << ": differs from row-major images, first at byte " << first;
            }
          }
        }
      }
    }
  }
}

// ---- the EP layer's row epilogue ---------------------------------------------------------------
//
// detail::m_grouped_mxfp8_gemm_nt_to_rows (OutStore::kRows): each output row to its own address
// (in the EP layer, a token owner's combine slot). Destinations: a random permutation of the rows
// of a poisoned buffer with 64 extra rows; pad rows and a random ~1/8 of the token rows get none
// (null). Every destination row must hold the default path's y row byte for byte (192 wide: full
// and partial last n-tiles of 384 / 64..320 bytes), every other row of the buffer stays poisoned.
// Both modes (fast: 192-wide tiles, exact: 256-wide), with the environment asking for other
// kernels (128 wide, no TMA store: the entry must ignore it), num_sms 0, 1, 7 (staging reused
// across many tiles, the store warps' FREE/STAGED handoff over many phases).
TEST_F(GemmGpu, RowEpilogueBitwiseMatchesDefault) {
  REQUIRE_GPU();
  TRACE_SEED();
  const PathCases c = tile_width_cases(rng_);
  PathEnv other{128};
  other.exact_tile = 128;
  other.tma_store = false;
  for (GemmMode mode : {GemmMode::kFast, GemmMode::kExact}) {
    for (const PathCase& pc : c.m) {
      Problem P;
      build(P, pc.E, pc.n, pc.k, pc.counts, Dist::kGaussian, rng_);
      std::vector<uint8_t> want;
      {
        ScopedKernelPath env(kDefaultPath);
        run(P, mode, GemmOutDtype::kBF16, &want);
      }
      const size_t row_bytes = size_t(P.n) * 2;
      const int64_t dst_rows = P.m_total + 64;
      std::vector<int64_t> perm(static_cast<size_t>(dst_rows));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng_);
      DevBuf<uint8_t> dst(size_t(dst_rows) * row_bytes, 0xFF);
      std::vector<uint64_t> table(size_t(P.m_total), 0);
      std::vector<int64_t> src_of(size_t(dst_rows), -1);  // destination row -> output row
      std::bernoulli_distribution drop(0.125);
      for (int e = 0; e < P.E; ++e)
        for (int64_t r = P.offsets[e]; r < P.offsets[e] + P.counts[e]; ++r) {
          if (drop(rng_)) continue;
          table[size_t(r)] = reinterpret_cast<uint64_t>(dst.p + size_t(perm[size_t(r)]) * row_bytes);
          src_of[size_t(perm[size_t(r)])] = r;
        }
      DevBuf<uint64_t> d_table(table.size());
      d_table.upload(table);
      for (int sms : {0, 1, 7}) {
        ASSERT_EQ(cudaMemset(dst.p, 0xFF, dst.n), cudaSuccess);
        GemmOptions o;
        o.mode = mode;
        o.num_sms = sms;
        {
          ScopedKernelPath env(other);
          detail::m_grouped_mxfp8_gemm_nt_to_rows(P.a_op(), P.m_total, P.b_op(), P.E, P.n, P.k, P.d_offsets->p,
                                                  reinterpret_cast<void* const*>(d_table.p), o);
        }
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
        const std::vector<uint8_t> got = dst.download();
        int64_t bad = 0, first = -1;
        for (int64_t d = 0; d < dst_rows; ++d) {
          const uint8_t* g = &got[size_t(d) * row_bytes];
          const int64_t r = src_of[size_t(d)];
          bool ok = true;
          for (size_t b = 0; b < row_bytes && ok; ++b)
            ok = g[b] == (r >= 0 ? want[size_t(r) * row_bytes + b] : uint8_t(0xFF));
          if (!ok && bad++ == 0) first = d;
        }
        EXPECT_EQ(bad, 0) << mode_name(mode) << " E=" << pc.E << " N=" << pc.n << " K=" << pc.k << " num_sms=" << sms
                          << ": " << bad << " destination rows wrong, first " << first << " (output row "
                          << (first >= 0 ? src_of[size_t(first)] : -1) << "; -1: must stay poisoned)";
      }
    }
  }
}

// What exact mode computes when a block's scale is outside the image's exact range (dequantize.h):
// it multiplies the BF16 image, i.e. deq rounded to BF16 (below the range) or ±Inf (above), so
// the result is the FP32 sum of the image products — the GEMM's contract holds for the image,
// and for the MX values exactly when every scale byte is in [3, 246]. Row groups (m-grouped,
// expert 1's B scaled by 2^100 so that products of tiny A values stay normal FP32 numbers):
//  * rows 256..263: random finite codes, scale bytes 3..10 (inside the range; most images are
//    BF16 subnormals). Checked against the image (= deq) reference. A failure here alone means
//    the tensor core flushes subnormal BF16 inputs (then the exact range must exclude them).
//  * rows 264..271: random finite codes, scale bytes 0..2 (below the range): images rounded (the
//    test asserts some differ from deq); checked against the image reference.
//  * row 0: one block with scale byte 247 (2^120) whose first code is 448: image +Inf, so the
//    whole output row is non-finite (±Inf or NaN). Row 1: one block with scale 0xFF (NaN): the
//    output row is NaN.
// All other rows are ordinary Gaussian data checked as usual.
TEST_F(GemmGpu, ExactImageScaleRange) {
  REQUIRE_GPU();
  TRACE_SEED();
  Problem P;
  build(P, 2, 256, 512, {256, 256}, Dist::kGaussian, rng_, 128);
  const int64_t nb = P.k / 32;
  for (int64_t r = P.n; r < 2 * P.n; ++r)  // expert 1's B: scales · 2^100
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t& sc = P.qb.scales[size_t(r * nb + b)];
      ASSERT_LE(int(sc) + 100, int(kBF16ExactScaleMax)) << "B scale out of range for this test";
      sc = uint8_t(sc + 100);
    }
  std::uniform_int_distribution<int> code(0, 0x7E), sign(0, 1), in_range(3, 10), below(0, 2);
  for (int64_t r = 256; r < 272; ++r) {
    for (int64_t i = 0; i < P.k; ++i) P.qa.data[size_t(r * P.k + i)] = uint8_t(code(rng_) | (sign(rng_) << 7));
    for (int64_t b = 0; b < nb; ++b) P.qa.scales[size_t(r * nb + b)] = uint8_t(r < 264 ? in_range(rng_) : below(rng_));
  }
  P.qa.scales[size_t(0 * nb + 3)] = 247;
  P.qa.data[size_t(0 * P.k + 3 * 32)] = 0x7E;  // 448 · 2^120 = 1.75 · 2^128: BF16 overflow
  P.qa.scales[size_t(1 * nb + 5)] = kE8M0Nan;
  upload_problem(P);
  {  // the below-range rows do exercise rounding
    const std::vector<double> img = image_values(P.qa), deq = ref::dequantize(P.qa);
    int64_t rounded = 0;
    for (int64_t i = 264 * P.k; i < 272 * P.k; ++i) rounded += img[size_t(i)] != deq[size_t(i)];
    ASSERT_GT(rounded, 0) << "no below-range image element differs from its MX value";
  }
  const Ref R = make_ref(P);
  for (GemmOutDtype out : {GemmOutDtype::kBF16, GemmOutDtype::kFP32}) {
    const auto got = run(P, GemmMode::kExact, out);
    const double out_rel = out == GemmOutDtype::kBF16 ? std::ldexp(1.0, -8) : 0.0;
    for (int64_t r = 0; r < P.offsets[P.E]; ++r) {
      const char* group = r == 0 ? "image +Inf row" : r == 1 ? "NaN-scale row"
                        : (r >= 256 && r < 264) ? "in-range tiny scales (BF16 subnormal images)"
                        : (r >= 264 && r < 272) ? "below-range scales (rounded images)" : "ordinary row";
      int64_t bad = 0;
      std::ostringstream first;
      for (int64_t j = 0; j < P.n; ++j) {
        const size_t i = size_t(r * P.n + j);
        bool ok;
        if (r == 0) ok = !std::isfinite(got[i]);
        else if (r == 1) ok = std::isnan(got[i]);
        else ok = std::fabs(got[i] - R.y_exact[i]) <= R.b_exact[i] + out_rel * (std::fabs(R.y_exact[i]) + R.b_exact[i]);
        if (!ok && bad++ == 0)
          first << "col " << j << ": got " << got[i] << ", want " << R.y_exact[i] << " (bound " << R.b_exact[i] << ")";
      }
      EXPECT_EQ(bad, 0) << out_name(out) << " row " << r << " (" << group << "): " << bad << " bad; first at "
                        << first.str();
    }
  }
}

// ---- fast mode with B's scales per 128x128 block (FastScaleLayout::kBlock128) -------------------
//
// The block form runs on its own kernels (BlockScalesB kLdg / kTma: 128 x 192 tiles,
// math_fast_single_block; the TMA-store epilogue or, for BF16 with accumulate and with
// MXMOE_GEMM_TMA_STORE=0, direct stores), whatever MXMOE_GEMM_TILE says. Its tiles at n0 = 192·q
// promote columns [0, 128) (q even) or [0, 64) (q odd) with block n0/128's scale and the rest with
// the next block's. The first three tests run on the block-byte load the process's
// MXMOE_GEMM_BLOCK_SCALES_LOAD selects ("ldg", the default, or "tma": run the suite once with each);
// BlockScalesLoadPathsBitwiseEqual (last) runs both in one process and compares their bytes.
//
// Against the FP64 reference of Σ_chunks (Σ_k a·b)·2^ea·2^eb_block on the operands' values (fast A,
// block-form B with random block scales, make_block_b), with fast mode's tolerance derivation (top
// of the file: the tensor core's in-chunk sums and the FP32 promotions are those of the 1x128 form;
// powers of two common to a (row, column, chunk) scale the bound with the products). Cases: N = 2880
// (15 whole tiles, 23 blocks, the last of 64 rows) with K = 2880 (K tail); N = 320 (a second,
// partial tile at n0 = 192: block 1's last 64 rows and block 2 of 64 rows) with K = 608 (tail of
// 96) and ragged/empty experts; E = 1; 64 small experts with N = 160 (one partial tile reading the
// next expert's rows); N = K = 32. BF16 and FP32, num_sms 0, 1, 7; a rerun bitwise; accumulate on
// top of the first result gives exactly 2x.
void check_block_form(const Problem& P, const BlockB& B, const std::string& name) {
  std::vector<double> want, bound;
  reference_with_bound(ref::dequantize(P.fa), ref::dequantize(B.f), P, kFastModel, want, bound);
  const MxOperand bop = B.op(P);
  for (GemmOutDtype out : {GemmOutDtype::kBF16, GemmOutDtype::kFP32}) {
    std::vector<uint8_t> raw0;
    for (int sms : {0, 1, 7}) {
      const std::string what = name + " B 128x128 blocks " + out_name(out) + " num_sms=" + std::to_string(sms);
      std::vector<uint8_t> raw;
      const auto got = run(P, GemmMode::kFast, out, &raw, sms, nullptr, &bop);
      check_output(P, got, want, bound, out, what);
      if (sms == 0) raw0 = raw;
      else EXPECT_TRUE(raw == raw0) << what << ": differs from num_sms=0 (the tiles' arithmetic must not depend on the grid)";
    }
    std::vector<uint8_t> again;
    run(P, GemmMode::kFast, out, &again, 0, nullptr, &bop);
    EXPECT_TRUE(again == raw0) << name << " " << out_name(out) << ": rerun is not bitwise identical";
    const auto first = output_values(raw0, out == GemmOutDtype::kFP32 ? 4 : 2);
    const auto twice = run(P, GemmMode::kFast, out, nullptr, 0, &raw0, &bop);
    int64_t bad_acc = 0, at = -1;
    for (int64_t i = 0; i < P.offsets[P.E] * P.n; ++i)
      if (!(twice[size_t(i)] == 2.0 * first[size_t(i)]) && bad_acc++ == 0) at = i;
    for (int64_t i = P.offsets[P.E] * P.n; i < P.m_total * P.n; ++i)
      if (!std::isnan(twice[size_t(i)]) && bad_acc++ == 0) at = i;
    EXPECT_EQ(bad_acc, 0) << name << " " << out_name(out) << ": accumulate did not give exactly 2x; first at row "
                          << at / std::max<int64_t>(P.n, 1);
  }
}

TEST_F(GemmGpu, BlockScalesMatchReference) {
  REQUIRE_GPU();
  TRACE_SEED();
  ScopedKernelPath env(kDefaultPath);  // asks for 128-wide tiles: the block form must ignore it
  const std::vector<PathCase> cases = {
      {4, 2880, 2880, {100, 0, 250, 40}},
      {3, 320, 608, random_counts(rng_, 3, 0, 400)},
      {1, 512, 1024, {777}},
      {64, 160, 256, random_counts(rng_, 64, 0, 200)},
      {5, 32, 32, random_counts(rng_, 5, 0, 200)},
  };
  for (const PathCase& c : cases) {
    Problem P;
    build(P, c.E, c.n, c.k, c.counts, c.n == 320 ? Dist::kHeavyTailed : Dist::kGaussian, rng_);
    const BlockB B = make_block_b(P, &rng_);
    check_block_form(P, B, "E=" + std::to_string(c.E) + " N=" + std::to_string(c.n) + " K=" + std::to_string(c.k));
  }
}

// When every row of a 128-row block carries the block's scale in the 1x128 form, the two forms are
// the same operand: same fast data, each row's 1x128 byte its block's. The block kernels form the
// same products sa·sb in FP32 and the same fmaf(acc, sa·sb, tot) per element in the same chunk order
// as the 1x128 kernels, on the same wgmma sums, so the outputs must be bitwise equal. The 1x128 form
// runs on its default path (the 192-wide kernel, MXMOE_GEMM_TILE=192); the block form with the
// TMA-store epilogue and with direct stores (MXMOE_GEMM_TMA_STORE=0), BF16 and FP32, plain and
// accumulating, num_sms 0, 1, 7. Random block scales (make_block_b) so that a wrong block shows.
TEST_F(GemmGpu, BlockScalesBitwiseMatchRowScales) {
  REQUIRE_GPU();
  TRACE_SEED();
  const std::vector<PathCase> cases = {
      {4, 2880, 2880, {100, 0, 250, 40}},
      {3, 320, 608, random_counts(rng_, 3, 0, 400)},
      {2, 4096, 640, {300, 0}},
      {64, 160, 256, random_counts(rng_, 64, 0, 200)},
  };
  PathEnv row_path{192}, block_tma{128}, block_direct{128};
  block_direct.tma_store = false;
  for (const PathCase& c : cases) {
    Problem P;
    build(P, c.E, c.n, c.k, c.counts, Dist::kGaussian, rng_);
    const BlockB B = make_block_b(P, &rng_);
    // The equivalent 1x128 operand: B's block data, every row's scale its block's, [E, ceil(K/128), N].
    const int64_t kc = cdiv(P.k, 128);
    std::vector<uint8_t> row_scales(size_t(P.E * kc * P.n));
    for (int e = 0; e < P.E; ++e)
      for (int64_t ch = 0; ch < kc; ++ch)
        for (int64_t j = 0; j < P.n; ++j) row_scales[size_t((e * kc + ch) * P.n + j)] = B.scale(e, ch, j);
    DevBuf<uint8_t> d_row_scales(row_scales.size());
    d_row_scales.upload(row_scales);
    MxOperand row_op = P.b_op();
    row_op.fast_data = B.data->p;
    row_op.fast_scales = d_row_scales.p;
    const MxOperand block_op = B.op(P);
    const std::string what = "E=" + std::to_string(c.E) + " N=" + std::to_string(c.n) + " K=" + std::to_string(c.k);
    for (GemmOutDtype out : {GemmOutDtype::kBF16, GemmOutDtype::kFP32}) {
      for (int acc = 0; acc <= 1; ++acc) {
        std::vector<uint8_t> base, want;
        const std::vector<uint8_t>* init = nullptr;
        {
          ScopedKernelPath env(row_path);
          if (acc) {
            run(P, GemmMode::kFast, out, &base, 0, nullptr, &row_op);
            init = &base;
          }
          run(P, GemmMode::kFast, out, &want, 0, init, &row_op);
        }
        for (const PathEnv* env : {&block_tma, &block_direct}) {
          ScopedKernelPath scope(*env);
          for (int sms : {0, 1, 7}) {
            std::vector<uint8_t> got;
            run(P, GemmMode::kFast, out, &got, sms, init, &block_op);
            size_t first = 0;
            while (first < want.size() && first < got.size() && want[first] == got[first]) ++first;
            EXPECT_TRUE(want == got) << what << " " << out_name(out) << (acc ? " accumulate" : "")
                                     << (env->tma_store ? "" : " direct stores") << " num_sms=" << sms
                                     << ": block form differs from the equivalent 1x128 form, first at byte "
                                     << first << " (row " << first / ((out == GemmOutDtype::kFP32 ? 4 : 2) * P.n)
                                     << ")";
          }
        }
      }
    }
  }
}

// Accuracy of the block form made from the MX copy (ref::rebase_fast_block128, no synthetic scales):
// within 1.1x of exact mode's error on the three families (docs/notes/gemm.md, "Session 9 study").
TEST_F(GemmGpu, BlockScalesAccuracyMatchesExact) {
  REQUIRE_GPU();
  TRACE_SEED();
  expect_fast_accuracy_matches_exact(rng_, true);
}

// The two ways the block kernels get B's block bytes (MXMOE_GEMM_BLOCK_SCALES_LOAD; BlockScalesB in
// grouped_gemm_mxfp8_sm90_ws.cuh): "ldg" (decoder lanes read them from global memory) and "tma" (the
// producer's [1, 16] boxes at 16-byte aligned block coordinates, a second box when the tile's two
// blocks straddle a multiple of 16) hand the decoder the same bytes, so the outputs must be
// byte-equal: TMA-store and direct epilogues, BF16 and FP32, plain and accumulating, num_sms 0 and 7.
// Cases: N = 2880 (pitch 32; the tile at n0 = 1920 has blocks 15 | 16: two boxes); N = 2048 (pitch
// 16 = ceil(N/128): that tile's block 16 is past N, one box, scale 0); N = 4224 (pitch 48; blocks
// 31 | 32 at n0 = 4032); 64 experts of N = 160 (2 blocks in a pitch of 16). The scale rows' padding
// bytes are 0xFF: neither path may use them. Last in the file, so that when the TMA path faults
// (the context is lost) the tests above have already run on the process's load.
TEST_F(GemmGpu, BlockScalesLoadPathsBitwiseEqual) {
  REQUIRE_GPU();
  TRACE_SEED();
  const std::vector<PathCase> cases = {
      {4, 2880, 640, {100, 0, 250, 40}},
      {2, 2048, 384, {300, 130}},
      {2, 4224, 256, {200, 0}},
      {64, 160, 256, random_counts(rng_, 64, 0, 200)},
  };
  PathEnv tma_store{128}, direct{128};
  direct.tma_store = false;
  for (const PathCase& c : cases) {
    Problem P;
    build(P, c.E, c.n, c.k, c.counts, Dist::kGaussian, rng_);
    BlockB B = make_block_b(P, &rng_);
    const int64_t nrb = cdiv(P.n, 128);
    for (size_t i = 0; i < B.f.scales.size(); ++i)
      if (int64_t(i) % B.f.pitch >= nrb) B.f.scales[i] = 0xFF;
    B.scales->upload(B.f.scales);
    const MxOperand bop = B.op(P);
    const std::string what = "E=" + std::to_string(c.E) + " N=" + std::to_string(c.n) + " K=" + std::to_string(c.k);
    const auto run_load = [&](const char* load, GemmOutDtype out, int sms, const std::vector<uint8_t>* init,
                              std::vector<uint8_t>* raw) {
      const ScopedEnv env("MXMOE_GEMM_BLOCK_SCALES_LOAD", load);
      run(P, GemmMode::kFast, out, raw, sms, init, &bop);
    };
    for (GemmOutDtype out : {GemmOutDtype::kBF16, GemmOutDtype::kFP32}) {
      for (const PathEnv* path : {&tma_store, &direct}) {
        ScopedKernelPath scope(*path);
        for (int acc = 0; acc <= 1; ++acc) {
          std::vector<uint8_t> base;
          if (acc) run_load("ldg", out, 0, nullptr, &base);
          for (int sms : {0, 7}) {
            std::vector<uint8_t> want, got;
            run_load("ldg", out, sms, acc ? &base : nullptr, &want);
            run_load("tma", out, sms, acc ? &base : nullptr, &got);
            size_t first = 0;
            while (first < want.size() && first < got.size() && want[first] == got[first]) ++first;
            EXPECT_TRUE(want == got) << what << " " << out_name(out) << (acc ? " accumulate" : "")
                                     << (path->tma_store ? "" : " direct stores") << " num_sms=" << sms
                                     << ": MXMOE_GEMM_BLOCK_SCALES_LOAD=tma differs from ldg, first at byte "
                                     << first;
          }
        }
      }
    }
  }
}

}  // namespace
