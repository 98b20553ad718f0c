// GPU quantizers against the CPU reference, bit for bit: every BF16 pattern, random shapes and
// distributions (both scale modes, row counts that are not multiples of 128, K = 2880), batched
// weights, expert-grouped inputs with empty and overloaded groups, NaN/Inf policy, determinism.
// Outputs are poisoned before each launch so an unwritten byte fails the comparison.
// Three kernels: the two-group one (both directions; MXMOE_QUANT_TWO_GROUP=0 turns it off) and the
// staged one (one direction, and grouped inputs), both with TMA stores, write the plain MX copies
// alone or the fast form alone; the register-store one writes plain + fast together (and
// everything with MXMOE_QUANT_STAGED=0). Every case that asks for the fast form also runs with the
// fast form alone on the default kernels and on the register-store one, and without its fast form,
// so that every kernel sees every input. The pipelined kernel takes the plain copy of one direction
// of a dense input by default (both with MXMOE_QUANT_TMA=1; the staged kernel with =0): such cases
// run on both; PipelinedKernelOnPlainCopies and PipelinedKernelScaleTmaUnits test it further.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <utility>

#include "common/gpu_test_util.h"
#include "common/scoped_env.h"
#include "mxmoe/quantize.h"
#include "ref/mx_ref.h"

using namespace mxmoe;
using namespace mxmoe::test;

namespace {

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Device outputs of one quantized copy [n_rows, n_cols] x batch.
struct CopyBufs {
  DevBuf<uint8_t> data, scales, fast_data, fast_scales;
  CopyBufs(int64_t batch, int64_t n_rows, int64_t n_cols, bool fast, uint8_t poison = 0xA5)
      : data(size_t(batch * n_rows * n_cols), poison),
        scales(size_t(batch * n_rows * n_cols / 32), poison),
        fast_data(fast ? size_t(batch * n_rows * n_cols) : 0, poison),
        fast_scales(fast ? size_t(batch * cdiv(n_cols, 128) * n_rows) : 0, poison) {}
  MxOut out(bool fast, bool plain = true) const {
    MxOut o;
    if (plain) {
      o.data = data.p;
      o.scales = scales.p;
    }
    if (fast) {
      o.fast_data = fast_data.p;
      o.fast_scales = fast_scales.p;
    }
    return o;
  }
};

// Compare batch entry b of a device copy with the reference MX matrix (and its fast form).
// plain = false: the copy was asked for in its fast form only, so its plain buffers must still hold
// the poison byte (nothing written).
void expect_copy(const std::string& what, const CopyBufs& d, bool fast, int64_t b, const ref::MxMatrix& want,
                 bool plain = true) {
  const int64_t R = want.rows, C = want.cols;
  const auto data = d.data.download(), scales = d.scales.download();
  if (plain) {
    EXPECT_TRUE(bytes_equal((what + " data").c_str(), data.data() + b * R * C, C, want.data.data(), C, R, C));
    EXPECT_TRUE(bytes_equal((what + " scales").c_str(), scales.data() + b * R * (C / 32), C / 32,
                            want.scales.data(), C / 32, R, C / 32));
  } else {
    const bool untouched = std::all_of(data.begin(), data.end(), [](uint8_t v) { return v == 0xA5; }) &&
                           std::all_of(scales.begin(), scales.end(), [](uint8_t v) { return v == 0xA5; });
    EXPECT_TRUE(untouched) << what << ": fast-only quantization wrote the plain copy";
  }
  if (!fast) return;
  const ref::FastMatrix f = ref::rebase_fast(want);
  const auto fd = d.fast_data.download(), fs = d.fast_scales.download();
  EXPECT_TRUE(bytes_equal((what + " fast_data").c_str(), fd.data() + b * R * C, C, f.data.data(), C, R, C));
  const int64_t nck = cdiv(C, 128);
  EXPECT_TRUE(bytes_equal((what + " fast_scales").c_str(), fs.data() + b * nck * R, R, f.scales.data(), R, nck, R));
}

struct DenseCase {
  int64_t batch, rows, cols;
  bool row, col, fast;
  bool plain = true;  // false: fast form only (data and scales null)
};

void run_dense_once(const DenseCase& c, ScaleMode mode, const std::vector<uint16_t>& x, const std::string& label) {
  SCOPED_TRACE(label + (c.fast ? " (with fast form)" : "") + " batch=" + std::to_string(c.batch) + " rows=" + std::to_string(c.rows) +
               " cols=" + std::to_string(c.cols) + " mode=" + (mode == ScaleMode::kRceil ? "rceil" : "floor"));
  DevBuf<uint16_t> dx(x.size());
  dx.upload(x);
  CopyBufs rw(c.batch, c.rows, c.cols, c.fast), cw(c.batch, c.cols, c.rows, c.fast);
  const MxOut ro = rw.out(c.fast, c.plain), co = cw.out(c.fast, c.plain);
  quantize_mxfp8(reinterpret_cast<const __nv_bfloat16*>(dx.p), c.batch, c.rows, c.cols, c.row ? &ro : nullptr,
                 c.col ? &co : nullptr, mode, nullptr);
  MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
  for (int64_t b = 0; b < c.batch; ++b) {
    const uint16_t* xb = x.data() + b * c.rows * c.cols;
    if (c.row) expect_copy("rowwise", rw, c.fast, b, ref::quantize_rows(xb, c.rows, c.cols, mode), c.plain);
    if (c.col) expect_copy("colwise", cw, c.fast, b, ref::quantize_cols(xb, c.rows, c.cols, mode), c.plain);
  }
}

// Runs `f` on the default kernels, then on the register-store kernel (MXMOE_QUANT_STAGED=0), then,
// when both directions are asked for, on the 256-thread staged kernel (MXMOE_QUANT_TWO_GROUP=0),
// else on the staged kernel instead of the pipelined one (MXMOE_QUANT_TMA=0; the pipelined kernel
// takes one direction's plain copy of a dense input by default).
template <class F>
void on_every_kernel(bool both_directions, const std::string& label, F&& f) {
  f(label);
  {
    const ScopedEnv env("MXMOE_QUANT_STAGED", "0");
    f(label + " [MXMOE_QUANT_STAGED=0]");
  }
  if (both_directions) {
    const ScopedEnv env("MXMOE_QUANT_TWO_GROUP", "0");
    f(label + " [MXMOE_QUANT_TWO_GROUP=0]");
  } else {
    const ScopedEnv env("MXMOE_QUANT_TMA", "0");
    f(label + " [MXMOE_QUANT_TMA=0]");
  }
}

// Twenty NaN / Inf values (quiet and signalling NaN, ±Inf) at random positions of x.
void poison_some(std::vector<uint16_t>& x, std::mt19937& rng) {
  const uint16_t bad[] = {0x7FC0, 0xFFC0, 0x7F80, 0xFF80, 0x7F81};
  for (int k = 0; k < 20; ++k) x[size_t(rng() % x.size())] = bad[k % 5];
}

// The plain copies of a case (no fast form) on the default kernels, and for one direction also on
// the staged kernel (MXMOE_QUANT_TMA=0; the default is the pipelined one).
void run_plain(const DenseCase& c, ScaleMode mode, const std::vector<uint16_t>& x, const std::string& label) {
  run_dense_once(c, mode, x, label);
  if (c.row != c.col) {
    const ScopedEnv staged("MXMOE_QUANT_TMA", "0");
    run_dense_once(c, mode, x, label + " [MXMOE_QUANT_TMA=0]");
  }
}

// The case as given; with a fast form also the fast form alone on every kernel (the training
// layer's fast mode) and the plain copies alone.
void run_dense(const DenseCase& c, ScaleMode mode, const std::vector<uint16_t>& x, const std::string& label) {
  if (!c.fast) {
    run_plain(c, mode, x, label);
    return;
  }
  if (c.plain) run_dense_once(c, mode, x, label);
  DenseCase fast_only = c;
  fast_only.plain = false;
  on_every_kernel(c.row && c.col, label + " fast only",
                  [&](const std::string& l) { run_dense_once(fast_only, mode, x, l); });
  if (c.plain) {
    DenseCase plain_only = c;
    plain_only.fast = false;
    run_plain(plain_only, mode, x, label);
  }
}

}  // namespace

TEST(QuantizeGpu, EveryBf16PatternAsElementAndAsAmax) {
  MXMOE_REQUIRE_GPU();
  // (a) [2048, 32]: the 65,536 patterns in order (blocks of 32 neighbours, both directions).
  std::vector<uint16_t> a(65536);
  std::iota(a.begin(), a.end(), 0);
  // (b) [65536, 32]: row i holds pattern i alone at column i % 32, so every pattern is an amax.
  std::vector<uint16_t> b(size_t(65536) * 32, 0);
  for (int i = 0; i < 65536; ++i) b[size_t(i) * 32 + i % 32] = uint16_t(i);
  for (ScaleMode mode : {ScaleMode::kRceil, ScaleMode::kFloor}) {
    run_dense({1, 2048, 32, true, true, true}, mode, a, "patterns in order");
    run_dense({1, 65536, 32, true, true, true}, mode, b, "isolated patterns");
  }
}

TEST(QuantizeGpu, RandomShapesBitExact) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  const DenseCase cases[] = {
      {1, 1000, 2880, true, false, true},   // rows not a multiple of 32, K = 2880 (partial chunk)
      {1, 4000, 2880, true, true, true},    // rows a multiple of 32 but not of 128
      {1, 33, 32, true, false, false},
      {1, 96, 64, false, true, true},
      {1, 2048, 2048, true, true, false},
      {1, 1024, 7168, true, true, true},
      {1, 160, 160, true, true, true},      // partial tiles both ways
  };
  int i = 0;
  for (const auto& c : cases) {
    const Dist dist = Dist(i % 4);
    const ScaleMode mode = (i % 3 == 2) ? ScaleMode::kFloor : ScaleMode::kRceil;
    run_dense(c, mode, random_bf16(c.batch * c.rows, c.cols, dist, rng), dist_name(dist));
    ++i;
  }
}

TEST(QuantizeGpu, BatchedWeightsBothDirectionsOnePass) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  // Weights [E, N, K]: rowwise [E, N, K] and colwise [E, K, N], plus fast forms, one launch.
  const DenseCase cases[] = {{4, 384, 2880, true, true, true},        {3, 2880, 256, true, true, true},
                             {8, 256, 512, true, true, false},        {4, 384, 2880, true, true, true, false},
                             {2, 160, 96, true, true, true, false},   // fast form only, partial tiles
                             {3, 256, 2880, true, false, true, false}, {2, 160, 96, false, true, true, false}};
  for (const auto& c : cases)
    for (ScaleMode mode : {ScaleMode::kRceil, ScaleMode::kFloor})
      run_dense(c, mode, random_bf16(c.batch * c.rows, c.cols, Dist::kOutlierChannels, rng), "weights");
}

TEST(QuantizeGpu, NanAndInfPoisonBlocksAndChunks) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  const int64_t R = 256, C = 384;
  auto x = random_bf16(R, C, Dist::kGaussian, rng);
  const uint16_t bad[] = {0x7FC0, 0xFFC0, 0x7F80, 0xFF80, 0x7F81};
  for (int k = 0; k < 40; ++k) x[size_t(rng() % (R * C))] = bad[k % 5];
  run_dense({1, R, C, true, true, true}, ScaleMode::kRceil, x, "nan/inf");
  run_dense({1, R, C, true, true, true}, ScaleMode::kFloor, x, "nan/inf");
}

namespace {

// Two launches on the same 1024 x 2880 input (both directions; with its fast form when `fast`) into
// buffers poisoned differently: every output byte identical.
void expect_reruns_identical(bool fast, std::mt19937& rng) {
  const int64_t R = 1024, C = 2880;
  auto x = random_bf16(R, C, Dist::kHeavyTailed, rng);
  DevBuf<uint16_t> dx(x.size());
  dx.upload(x);
  CopyBufs a1(1, R, C, fast, 0x11), b1(1, C, R, fast, 0x11), a2(1, R, C, fast, 0x22), b2(1, C, R, fast, 0x22);
  const MxOut ra1 = a1.out(fast), cb1 = b1.out(fast), ra2 = a2.out(fast), cb2 = b2.out(fast);
  quantize_mxfp8(reinterpret_cast<const __nv_bfloat16*>(dx.p), 1, R, C, &ra1, &cb1);
  quantize_mxfp8(reinterpret_cast<const __nv_bfloat16*>(dx.p), 1, R, C, &ra2, &cb2);
  MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
  for (const auto& [u, v] : {std::pair{&a1, &a2}, std::pair{&b1, &b2}}) {
    EXPECT_EQ(u->data.download(), v->data.download());
    EXPECT_EQ(u->scales.download(), v->scales.download());
    EXPECT_EQ(u->fast_data.download(), v->fast_data.download());
    EXPECT_EQ(u->fast_scales.download(), v->fast_scales.download());
  }
}

}  // namespace

TEST(QuantizeGpu, RerunsAreBitwiseIdentical) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  expect_reruns_identical(true, rng);
}

namespace {

// The reference quantization of x_used [used, cols] both ways (and the fast forms when `fast`).
struct UsedRef {
  ref::MxMatrix rows, cols;
  ref::FastMatrix rows_fast, cols_fast;
};

UsedRef used_ref(const uint16_t* x_used, int64_t used, int64_t cols, bool fast) {
  UsedRef r{ref::quantize_rows(x_used, used, cols, ScaleMode::kRceil),
            ref::quantize_cols(x_used, used, cols, ScaleMode::kRceil), {}, {}};
  if (fast) {
    r.rows_fast = ref::rebase_fast(r.rows);
    r.cols_fast = ref::rebase_fast(r.cols);
  }
  return r;
}

// Rows [0, used) of a row-wise [out_rows, cols] and a column-wise [cols, out_rows] output (both
// with their fast forms when `fast`) against the reference quantization `want` of the used rows.
// col_fast_scales: also the column-wise fast scales (whole 128-row chunks of `used` only).
// plain = false: the fast form alone was asked for; the plain buffers must keep their poison.
// row / col = false: that direction was not asked for; all its buffers must keep their poison.
void expect_used_rows(const std::string& what, const CopyBufs& rw, const CopyBufs& cw, bool fast, const UsedRef& want,
                      int64_t used, int64_t out_rows, int64_t cols, bool col_fast_scales, bool plain = true,
                      bool row = true, bool col = true) {
  const auto poisoned = [](const DevBuf<uint8_t>& b) {
    const auto v = b.download();
    return std::all_of(v.begin(), v.end(), [](uint8_t x) { return x == 0xA5; });
  };
  const auto untouched = [&](const CopyBufs& c) {
    return poisoned(c.data) && poisoned(c.scales) && poisoned(c.fast_data) && poisoned(c.fast_scales);
  };
  EXPECT_TRUE(row || untouched(rw)) << what << ": the row-wise copy was not asked for but written";
  EXPECT_TRUE(col || untouched(cw)) << what << ": the column-wise copy was not asked for but written";
  EXPECT_TRUE(plain || (poisoned(rw.data) && poisoned(rw.scales) && poisoned(cw.data) && poisoned(cw.scales)))
      << what << ": fast-only quantization wrote a plain copy";
  if (row && plain) {
    EXPECT_TRUE(bytes_equal((what + " rowwise data").c_str(), rw.data.download().data(), cols, want.rows.data.data(),
                            cols, used, cols));
    EXPECT_TRUE(bytes_equal((what + " rowwise scales").c_str(), rw.scales.download().data(), cols / 32,
                            want.rows.scales.data(), cols / 32, used, cols / 32));
  }
  if (col && plain) {
    EXPECT_TRUE(bytes_equal((what + " colwise data").c_str(), cw.data.download().data(), out_rows,
                            want.cols.data.data(), used, cols, used));
    EXPECT_TRUE(bytes_equal((what + " colwise scales").c_str(), cw.scales.download().data(), out_rows / 32,
                            want.cols.scales.data(), used / 32, cols, used / 32));
  }
  if (!fast) return;
  if (row) {
    EXPECT_TRUE(bytes_equal((what + " rowwise fast_data").c_str(), rw.fast_data.download().data(), cols,
                            want.rows_fast.data.data(), cols, used, cols));
    EXPECT_TRUE(bytes_equal((what + " rowwise fast_scales").c_str(), rw.fast_scales.download().data(), out_rows,
                            want.rows_fast.scales.data(), used, cdiv(cols, 128), used));
  }
  if (col) {
    EXPECT_TRUE(bytes_equal((what + " colwise fast_data").c_str(), cw.fast_data.download().data(), out_rows,
                            want.cols_fast.data.data(), used, cols, used));
    if (col_fast_scales) {
      EXPECT_TRUE(bytes_equal((what + " colwise fast_scales").c_str(), cw.fast_scales.download().data(), cols,
                              want.cols_fast.scales.data(), cols, used / 128, cols));
    }
  }
}

// The mixed request of MoeLayerConfig::activation_fast_layout = kBlock128 (one call, the row-wise
// fast form alone and the column-wise plain copy alone; by default on the staged kernel with a form
// per direction, with MXMOE_QUANT_STAGED=0 on the register-store kernel's per-pointer stores):
// row-wise fast only and column-wise plain only, against the reference over the used rows; the
// buffers not asked for keep their poison.
void expect_mixed_used_rows(const std::string& what, const CopyBufs& rw, const CopyBufs& cw, const UsedRef& want,
                            int64_t used, int64_t out_rows, int64_t cols) {
  const CopyBufs no_row(1, out_rows, cols, false), no_col(1, cols, out_rows, false);  // poisoned stand-ins
  expect_used_rows(what + " row-wise fast only", rw, no_col, true, want, used, out_rows, cols, false, false, true, false);
  expect_used_rows(what + " column-wise plain only", no_row, cw, false, want, used, out_rows, cols, false, true, false,
                   true);
  for (const DevBuf<uint8_t>* b : {&cw.fast_data, &cw.fast_scales}) {
    const auto v = b->download();
    EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](uint8_t x) { return x == 0xA5; }))
        << what << ": the column-wise fast form was not asked for but written";
  }
}

// plain = false (with fast): the fast form alone. mixed (with fast): row-wise fast only,
// column-wise plain only (expect_mixed_used_rows).
void run_grouped_once(const std::vector<int32_t>& counts, int64_t cols, int64_t extra_rows, bool fast,
                      std::mt19937& rng, bool plain = true, bool mixed = false) {
  const int G = int(counts.size());
  std::vector<int32_t> offs(G + 1, 0), padded(G + 1, 0);
  for (int g = 0; g < G; ++g) {
    offs[g + 1] = offs[g] + counts[g];
    padded[g + 1] = padded[g] + (counts[g] + 127) / 128 * 128;
  }
  const int64_t x_rows = offs[G], used = padded[G];
  const int64_t out_rows = std::max<int64_t>(128, used + extra_rows);
  SCOPED_TRACE(std::string(mixed ? "row fast only + col plain only, " : fast ? (plain ? "with fast form, " : "fast form only, ") : "") + "groups=" + std::to_string(G) + " x_rows=" + std::to_string(x_rows) +
               " padded=" + std::to_string(used) + " cols=" + std::to_string(cols));
  auto x = random_bf16(std::max<int64_t>(x_rows, 1), cols, Dist::kGaussian, rng);
  DevBuf<uint16_t> dx(x.size());
  dx.upload(x);
  DevBuf<int32_t> doffs(offs.size()), dpadded(padded.size(), 0xEE);
  doffs.upload(offs);
  compute_padded_offsets(doffs.p, dpadded.p, G);
  MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_EQ(dpadded.download(), padded);

  CopyBufs rw(1, out_rows, cols, fast), cw(1, cols, out_rows, fast);
  const MxOut ro = rw.out(fast, plain && !mixed), co = mixed ? cw.out(false, true) : cw.out(fast, plain);
  quantize_mxfp8_grouped(reinterpret_cast<const __nv_bfloat16*>(dx.p), x_rows, cols, doffs.p, dpadded.p, G,
                         out_rows, &ro, &co);
  MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());

  // Reference: the padded matrix (pad rows zero), quantized both ways over its used rows.
  std::vector<uint16_t> xp(size_t(std::max<int64_t>(used, 32) * cols), 0);
  for (int g = 0; g < G; ++g)
    for (int32_t j = 0; j < counts[g]; ++j)
      std::copy_n(&x[size_t((offs[g] + j) * cols)], cols, &xp[size_t((padded[g] + j) * cols)]);
  if (used > 0 && mixed)
    expect_mixed_used_rows("grouped", rw, cw, used_ref(xp.data(), used, cols, true), used, out_rows, cols);
  else if (used > 0)
    expect_used_rows("grouped", rw, cw, fast, used_ref(xp.data(), used, cols, fast), used, out_rows, cols, true, plain);
  // Nothing at or beyond padded[G] is written: the poison must survive (in the data asked for).
  const std::vector<uint8_t> poison_row(size_t(cols), 0xA5);
  const auto d = (plain && !mixed ? rw.data : rw.fast_data).download();
  for (int64_t r = used; r < out_rows; ++r)
    ASSERT_TRUE(std::equal(poison_row.begin(), poison_row.end(), d.begin() + r * cols)) << "row " << r << " written";
  const auto cd = (plain || mixed ? cw.data : cw.fast_data).download();
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = used; r < out_rows; ++r)
      ASSERT_EQ(cd[size_t(c * out_rows + r)], 0xA5) << "colwise [" << c << ", " << r << "] written";
}

// Plain + fast, the fast form alone (default kernel and register-store kernel), plain alone.
void run_grouped(const std::vector<int32_t>& counts, int64_t cols, int64_t extra_rows, std::mt19937& rng) {
  run_grouped_once(counts, cols, extra_rows, true, rng);
  on_every_kernel(false, "grouped", [&](const std::string& l) {
    SCOPED_TRACE(l);
    run_grouped_once(counts, cols, extra_rows, true, rng, false);
  });
  run_grouped_once(counts, cols, extra_rows, false, rng);
}

}  // namespace

TEST(QuantizeGpu, GroupedRaggedEmptyAndOverloaded) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  run_grouped({0, 1, 127, 128, 129, 300, 0, 1000}, 2880, 256, rng);  // ragged, empty, K = 2880
  run_grouped({5000}, 512, 0, rng);                                   // one group takes every row
  run_grouped({0, 0, 0, 4096, 0}, 256, 384, rng);                     // one loaded among empties
  run_grouped({0, 0, 0}, 256, 128, rng);                              // nothing routed at all
  std::vector<int32_t> many(384);
  for (auto& c : many) c = int32_t(rng() % 40 == 0 ? 700 : rng() % 90);
  run_grouped(many, 128, 128, rng);                                   // E = 384, skewed
}

namespace {

// The gather's x [x_rows, cols] and output row space [out_rows, cols]. The default: about one tile
// per CTA. A long walk (out_rows in the thousands) gives every CTA many tiles, so that the row
// indices and scales fetched one tile ahead cross many tiles, and tiles past rows_used.
struct GatherShape {
  int64_t x_rows = 1000, cols = 2880, out_rows = 1536;
};

// One gather's fresh random inputs, on the device, and its reference; check() launches it (any
// kernel, directions, forms) into newly poisoned outputs and compares them with the reference.
// scaled: quantize_mxfp8_gather_scaled with a per-row scale (random magnitudes, signs, zeros,
// powers of two, and a few large enough to overflow BF16 to Inf; NaN on one used row, which turns
// its blocks NaN); the reference applies bf16_rn(scale · x) on the host first. Rows without x data
// (pads, out-of-range indices, rows at or past rows_used) get a NaN scale, which must never be
// used. Row 0 reads the last row of x, row 1 the first.
// used: rows at and past it are not written (1248: the last tile is cut, which the staged kernel
// copies out by hand instead of by a TMA store; 0: nothing is written); -1: rows_used is null (every
// row is used).
class GatherProblem {
 public:
  GatherProblem(bool scaled, int64_t used, GatherShape shape, std::mt19937& rng)
      : scaled_(scaled), used_null_(used < 0), used_(used < 0 ? shape.out_rows : used), s_(shape),
        dx_(size_t(shape.x_rows * shape.cols)), didx_(size_t(shape.out_rows)), dused_(1),
        dscale_(size_t(shape.out_rows)) {
    const int64_t x_rows = s_.x_rows, cols = s_.cols, out_rows = s_.out_rows;
    const auto x = random_bf16(x_rows, cols, Dist::kHeavyTailed, rng);
    // Output row r: a random token, a pad (-1), or an out-of-range index (reads as a zero row).
    std::vector<int32_t> idx(static_cast<size_t>(out_rows), 0);
    for (auto& v : idx) {
      const uint32_t k = rng() % 10;
      v = k == 0 ? -1 : (k == 1 ? int32_t(x_rows + rng() % 5) : int32_t(rng() % x_rows));
    }
    idx[0] = int32_t(x_rows - 1);
    idx[1] = 0;
    const auto takes_x = [&](int64_t r) { return r < used_ && idx[size_t(r)] >= 0 && idx[size_t(r)] < x_rows; };
    std::vector<float> scale(static_cast<size_t>(out_rows));
    std::normal_distribution<float> gs(0.0f, 1.0f);
    for (auto& v : scale) {
      const uint32_t k = rng() % 10;
      v = k == 0 ? 0.0f : k == 1 ? -0.5f : k == 2 ? 0x1p100f : k == 3 ? std::ldexp(1.0f, int(rng() % 9) - 4) : gs(rng);
    }
    for (int64_t r = 0; r < out_rows; ++r)
      if (!takes_x(r)) scale[size_t(r)] = std::nanf("");  // never read
    for (int64_t r = used_ / 2; r < used_; ++r)
      if (takes_x(r)) {
        scale[size_t(r)] = std::nanf("");  // a used row: NaN blocks
        break;
      }
    dx_.upload(x);
    didx_.upload(idx);
    dused_.upload(std::vector<int32_t>{int32_t(used_)});
    dscale_.upload(scale);
    std::vector<uint16_t> xg(size_t(used_ * cols), 0);
    for (int64_t r = 0; r < used_; ++r)
      if (takes_x(r))
        for (int64_t c = 0; c < cols; ++c) {
          const uint16_t v = x[size_t(idx[size_t(r)] * cols + c)];
          xg[size_t(r * cols + c)] = scaled ? ref::float_to_bf16(scale[size_t(r)] * ref::bf16_to_float(v)) : v;
        }
    if (used_ > 0) want_ = used_ref(xg.data(), used_, cols, true);
  }

  // plain = false (with fast): the fast form alone. row / col: the directions asked for. mixed (with
  // fast, both directions): row-wise fast only, column-wise plain only (expect_mixed_used_rows).
  void check(bool fast, bool plain, bool row = true, bool col = true, bool mixed = false) const {
    SCOPED_TRACE(std::string(scaled_ ? "gather_scaled" : "gather") +
                 (mixed ? " row fast only + col plain only" : fast ? (plain ? " with fast form" : " fast form only") : "") + " used=" +
                 (used_null_ ? "null" : std::to_string(used_)) + " out_rows=" + std::to_string(s_.out_rows) +
                 (row && col ? "" : row ? " rowwise" : " colwise"));
    const int64_t cols = s_.cols, out_rows = s_.out_rows;
    CopyBufs rw(1, out_rows, cols, fast), cw(1, cols, out_rows, fast);
    const MxOut ro = rw.out(fast, plain && !mixed), co = mixed ? cw.out(false, true) : cw.out(fast, plain);
    const auto* xp = reinterpret_cast<const __nv_bfloat16*>(dx_.p);
    const int32_t* rows_used = used_null_ ? nullptr : dused_.p;
    const MxOut *rop = row ? &ro : nullptr, *cop = col ? &co : nullptr;
    if (scaled_)
      quantize_mxfp8_gather_scaled(xp, s_.x_rows, cols, didx_.p, dscale_.p, out_rows, rows_used, rop, cop);
    else
      quantize_mxfp8_gather(xp, s_.x_rows, cols, didx_.p, out_rows, rows_used, rop, cop);
    MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
    if (used_ > 0 && mixed) expect_mixed_used_rows("gather", rw, cw, want_, used_, out_rows, cols);
    else if (used_ > 0) expect_used_rows("gather", rw, cw, fast, want_, used_, out_rows, cols, false, plain, row, col);
    const auto d = (plain && !mixed ? rw.data : rw.fast_data).download(),
               cd = (plain || mixed ? cw.data : cw.fast_data).download();
    for (int64_t r = used_; r < out_rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(d[size_t(r * cols + c)], 0xA5) << "row " << r << " written past rows_used";
    for (int64_t c = 0; c < cols; ++c)  // column-wise: whole 16-row groups, so check from the next multiple of 16
      for (int64_t r = (used_ + 15) / 16 * 16; r < out_rows; ++r)
        ASSERT_EQ(cd[size_t(c * out_rows + r)], 0xA5) << "colwise [" << c << ", " << r << "] written past rows_used";
  }

 private:
  bool scaled_, used_null_;
  int64_t used_;
  GatherShape s_;
  DevBuf<uint16_t> dx_;
  DevBuf<int32_t> didx_, dused_;
  DevBuf<float> dscale_;
  UsedRef want_;
};

// A fresh gather problem, launched once (both directions).
void run_gather(bool scaled, bool fast, int64_t used, std::mt19937& rng, bool plain = true) {
  GatherProblem(scaled, used, GatherShape{}, rng).check(fast, plain);
}

}  // namespace

namespace {

// Plain + fast, plain alone, and the fast form alone on every kernel; rows_used 1280 (whole tiles)
// and 1248 (the last tile cut).
void run_gather_all(bool scaled, std::mt19937& rng) {
  for (int64_t used : {1280, 1248}) {
    run_gather(scaled, true, used, rng);
    run_gather(scaled, false, used, rng);
    on_every_kernel(true, "fast only", [&](const std::string& l) {
      SCOPED_TRACE(l);
      run_gather(scaled, true, used, rng, false);
    });
  }
}

}  // namespace

TEST(QuantizeGpu, GatherPermuteWithPadsAndRowsUsed) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  run_gather_all(false, rng);
}

TEST(QuantizeGpu, GatherScaledMatchesScaleThenQuantize) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  run_gather_all(true, rng);
}

// The two calls MoeLayerConfig::activation_fast_layout = kBlock128 makes: the gather of x and the
// grouped quantize of Hact, each with the row-wise fast form alone and the column-wise plain copy
// alone (dispatch_fast sends fast + plain to the register-store kernel, which stores each form of each
// direction only where its pointer is given). Bit-exact, nothing else written.
TEST(QuantizeGpu, RowFastOnlyWithColPlainOnly) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  // the staged kernel (default: launch_staged<true, true, true, false>) and the register-store one
  on_every_kernel(true, "row fast + col plain", [&](const std::string& l) {
    SCOPED_TRACE(l);
    for (int64_t used : {1280, 1248})
      for (bool scaled : {false, true}) GatherProblem(scaled, used, GatherShape{}, rng).check(true, false, true, true, true);
    run_grouped_once({0, 1, 127, 128, 129, 300, 0, 1000}, 2880, 256, true, rng, false, true);
    run_grouped_once({0, 0, 0, 4096, 0}, 256, 384, true, rng, false, true);
  });
}

// Every CTA walks many tiles (8192 x 2880: 1472 tiles, ~5.6 per CTA, ~11 on the two-group kernel),
// so the row indices and scales fetched one tile ahead cross tiles with data, a tile cut by
// rows_used and then only tiles past it (used = 5024), or every tile (rows_used null): every kernel,
// both directions and each one alone, plain and fast form alone (and plain + fast, on the
// register-store kernel). And rows_used = 0: nothing is written, on every kernel.
TEST(QuantizeGpu, GatherLongWalksAndEdgeRows) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  const GatherShape long_walk{3000, 2880, 8192};
  struct Dirs {
    bool row, col;
    const char* name;
  };
  const Dirs dirs[] = {{true, true, "both directions"}, {true, false, "rowwise"}, {false, true, "colwise"}};
  for (bool scaled : {false, true}) {
    for (int64_t used : {int64_t(5024), int64_t(-1)}) {
      const GatherProblem g(scaled, used, long_walk, rng);
      g.check(true, true);
      for (const Dirs& d : dirs)
        on_every_kernel(d.row && d.col, d.name, [&](const std::string& l) {
          SCOPED_TRACE(l);
          g.check(false, true, d.row, d.col);
          g.check(true, false, d.row, d.col);
        });
    }
    const GatherProblem none(scaled, 0, GatherShape{}, rng);
    on_every_kernel(true, "rows_used = 0", [&](const std::string& l) {
      SCOPED_TRACE(l);
      none.check(false, true);
      none.check(true, false);
    });
  }
}

namespace {

// One non-default quantizer path (switch name=value) on plain copies only: dense cases, a grouped
// and gather inputs (one gather per `useds` entry; 1248 cuts the last tile).
void run_plain_variant(const char* name, const char* value, const std::vector<DenseCase>& cases, Dist dist,
                       const std::vector<int64_t>& useds, std::mt19937& rng) {
  const ScopedEnv env(name, value);
  for (const DenseCase& c : cases)
    run_dense_once(c, ScaleMode::kRceil, random_bf16(c.batch * c.rows, c.cols, dist, rng), std::string(name) + "=" + value);
  run_grouped_once({0, 1, 127, 300, 0, 1000}, 2880, 256, false, rng);
  for (int64_t used : useds) run_gather(true, false, used, rng);
}

}  // namespace

// The register-store kernel on the plain copies (MXMOE_QUANT_STAGED=0), which it otherwise writes
// only beside the fast form: dense partial tiles both ways, batched, grouped and gather.
TEST(QuantizeGpu, RegisterStoreKernelOnPlainCopies) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  run_plain_variant("MXMOE_QUANT_STAGED", "0",
                    {{1, 4000, 2880, true, true, false}, {3, 160, 96, true, true, false}, {1, 33, 32, true, false, false}},
                    Dist::kHeavyTailed, {1280}, rng);
}

// Both plain copies on the 256-thread staged kernel (MXMOE_QUANT_TWO_GROUP=0) instead of the
// two-group kernel that writes them by default: dense partial tiles, batched, grouped and a gather
// whose last tile is cut by rows_used.
TEST(QuantizeGpu, StagedKernelOnBothDirections) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  run_plain_variant("MXMOE_QUANT_TWO_GROUP", "0",
                    {{1, 4000, 2880, true, true, false}, {3, 160, 96, true, true, false}, {1, 1024, 7168, true, true, false}},
                    Dist::kOutlierChannels, {1248, 1536}, rng);
}

// quantize.h: scale pointers need no alignment. Row-wise scales at an odd address (the staged
// kernel stores 16-bit words there, so such calls take the register-store kernel) or at an even
// one (staged kernel), column-wise scales at an odd address: bit-exact, the byte before untouched.
TEST(QuantizeGpu, UnalignedScalePointers) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  const int64_t R = 384, C = 2880;
  const auto x = random_bf16(R, C, Dist::kHeavyTailed, rng);
  DevBuf<uint16_t> dx(x.size());
  dx.upload(x);
  const auto rref = ref::quantize_rows(x.data(), R, C, ScaleMode::kRceil);
  const auto cref = ref::quantize_cols(x.data(), R, C, ScaleMode::kRceil);
  for (int row_off : {1, 2}) {
    SCOPED_TRACE("row-wise scales at offset " + std::to_string(row_off));
    DevBuf<uint8_t> rdata(size_t(R * C), 0xA5), cdata(size_t(R * C), 0xA5);
    DevBuf<uint8_t> rscales(size_t(R * C / 32 + 2), 0xA5), cscales(size_t(R * C / 32 + 1), 0xA5);
    MxOut ro, co;
    ro.data = rdata.p;
    ro.scales = rscales.p + row_off;
    co.data = cdata.p;
    co.scales = cscales.p + 1;
    quantize_mxfp8(reinterpret_cast<const __nv_bfloat16*>(dx.p), 1, R, C, &ro, &co);
    MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
    const auto rd = rdata.download(), rs = rscales.download(), cd = cdata.download(), cs = cscales.download();
    EXPECT_EQ(rs[size_t(row_off) - 1], 0xA5);
    EXPECT_EQ(cs[0], 0xA5);
    EXPECT_TRUE(bytes_equal("rowwise data", rd.data(), C, rref.data.data(), C, R, C));
    EXPECT_TRUE(bytes_equal("rowwise scales", rs.data() + row_off, C / 32, rref.scales.data(), C / 32, R, C / 32));
    EXPECT_TRUE(bytes_equal("colwise data", cd.data(), R, cref.data.data(), R, C, R));
    EXPECT_TRUE(bytes_equal("colwise scales (odd address)", cs.data() + 1, R / 32, cref.scales.data(), R / 32, C, R / 32));
  }
}

namespace {

// Calls `call(rowwise, colwise)` (either may be null) with the fast form alone on every kernel
// (on_every_kernel) into buffers poisoned alike, and expects every byte of every buffer to agree
// with the default kernels' (the bytes a kernel leaves unwritten included, and the plain buffers,
// which no kernel may touch). Fast out: rowwise [batch, rows, cols], colwise [batch, cols, rows].
template <class Call>
void expect_fast_kernels_agree(const std::string& what, int64_t batch, int64_t rows, int64_t cols, bool row, bool col,
                               Call&& call) {
  static const char* const kNames[] = {"rowwise fast_data", "rowwise fast_scales", "colwise fast_data",
                                       "colwise fast_scales", "rowwise data", "colwise data"};
  std::vector<std::vector<uint8_t>> first;
  std::string first_label;
  on_every_kernel(row && col, what, [&](const std::string& label) {
    CopyBufs rw(batch, rows, cols, true), cw(batch, cols, rows, true);
    const MxOut ro = rw.out(true, false), co = cw.out(true, false);
    call(row ? &ro : nullptr, col ? &co : nullptr);
    MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
    std::vector<std::vector<uint8_t>> got = {rw.fast_data.download(), rw.fast_scales.download(),
                                             cw.fast_data.download(), cw.fast_scales.download(),
                                             rw.data.download(),      cw.data.download()};
    if (first.empty()) {
      first = std::move(got);
      first_label = label;
      return;
    }
    for (size_t i = 0; i < got.size(); ++i) {
      const int64_t n = int64_t(got[i].size());
      EXPECT_TRUE(bytes_equal((label + " vs " + first_label + ": " + kNames[i]).c_str(), got[i].data(), n,
                              first[i].data(), n, 1, n));
    }
  });
}

}  // namespace

// The fast form alone (the training layer's fast mode) from the default kernels (two-group for both
// directions of dense and gather inputs, staged otherwise) against the register-store kernel
// (MXMOE_QUANT_STAGED=0) and the 256-thread staged kernel on both directions
// (MXMOE_QUANT_TWO_GROUP=0), bit for bit on the same fresh random inputs: dense one and both
// directions (partial tiles, K = 2880), batched weights, grouped, gather and gather-scaled.
TEST(QuantizeGpu, FastFormSameBytesOnEveryKernel) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  struct Case {
    int64_t batch, rows, cols;
    bool row, col;
    Dist dist;
  };
  const Case dense[] = {{1, 4000, 2880, true, true, Dist::kHeavyTailed},  {1, 2048, 7168, true, true, Dist::kOutlierChannels},
                        {1, 1000, 2880, true, false, Dist::kSpecial},      {1, 96, 640, false, true, Dist::kSpecial},
                        {3, 384, 2880, true, true, Dist::kOutlierChannels}, {2, 160, 96, true, true, Dist::kSpecial}};
  for (const Case& c : dense) {
    auto x = random_bf16(c.batch * c.rows, c.cols, c.dist, rng);
    const uint16_t bad[] = {0x7FC0, 0xFF80, 0x7F80};  // a few NaN/Inf chunks
    for (int k = 0; k < 6; ++k) x[size_t(rng() % x.size())] = bad[k % 3];
    DevBuf<uint16_t> dx(x.size());
    dx.upload(x);
    const std::string what = std::string("dense ") + dist_name(c.dist) + " " + std::to_string(c.batch) + "x" +
                             std::to_string(c.rows) + "x" + std::to_string(c.cols);
    expect_fast_kernels_agree(what, c.batch, c.rows, c.cols, c.row, c.col, [&](const MxOut* ro, const MxOut* co) {
      quantize_mxfp8(reinterpret_cast<const __nv_bfloat16*>(dx.p), c.batch, c.rows, c.cols, ro, co);
    });
  }

  // Grouped: ragged, empty and one large group, K = 2880.
  const std::vector<int32_t> counts = {0, 1, 127, 300, 0, 1000};
  std::vector<int32_t> offs(counts.size() + 1, 0);
  for (size_t g = 0; g < counts.size(); ++g) offs[g + 1] = offs[g] + counts[g];
  const int G = int(counts.size());
  const int64_t cols = 2880, x_rows = offs[G], out_rows = 2048;
  const auto xg = random_bf16(x_rows, cols, Dist::kHeavyTailed, rng);
  DevBuf<uint16_t> dxg(xg.size());
  dxg.upload(xg);
  DevBuf<int32_t> doffs(offs.size()), dpadded(offs.size());
  doffs.upload(offs);
  compute_padded_offsets(doffs.p, dpadded.p, G);
  expect_fast_kernels_agree("grouped", 1, out_rows, cols, true, true, [&](const MxOut* ro, const MxOut* co) {
    quantize_mxfp8_grouped(reinterpret_cast<const __nv_bfloat16*>(dxg.p), x_rows, cols, doffs.p, dpadded.p, G,
                           out_rows, ro, co);
  });

  // Gather (pads, out-of-range indices) and gather-scaled, with the last tile cut by rows_used.
  std::vector<int32_t> idx(static_cast<size_t>(out_rows));
  for (auto& v : idx) v = rng() % 10 == 0 ? -1 : int32_t(rng() % (x_rows + 3));
  std::vector<float> scale(static_cast<size_t>(out_rows));
  std::normal_distribution<float> gs(0.0f, 4.0f);
  for (auto& v : scale) v = gs(rng);
  DevBuf<int32_t> didx(idx.size()), dused(1);
  didx.upload(idx);
  dused.upload(std::vector<int32_t>{1888});
  DevBuf<float> dscale(scale.size());
  dscale.upload(scale);
  for (bool scaled : {false, true}) {
    expect_fast_kernels_agree(scaled ? "gather_scaled" : "gather", 1, out_rows, cols, true, true,
                              [&](const MxOut* ro, const MxOut* co) {
                                const auto* xp = reinterpret_cast<const __nv_bfloat16*>(dxg.p);
                                if (scaled)
                                  quantize_mxfp8_gather_scaled(xp, x_rows, cols, didx.p, dscale.p, out_rows, dused.p, ro, co);
                                else
                                  quantize_mxfp8_gather(xp, x_rows, cols, didx.p, out_rows, dused.p, ro, co);
                              });
    // One direction each (the staged kernel).
    expect_fast_kernels_agree(std::string(scaled ? "gather_scaled" : "gather") + " rowwise", 1, out_rows, cols, true,
                              false, [&](const MxOut* ro, const MxOut*) {
                                const auto* xp = reinterpret_cast<const __nv_bfloat16*>(dxg.p);
                                if (scaled)
                                  quantize_mxfp8_gather_scaled(xp, x_rows, cols, didx.p, dscale.p, out_rows, dused.p, ro, nullptr);
                                else
                                  quantize_mxfp8_gather(xp, x_rows, cols, didx.p, out_rows, dused.p, ro, nullptr);
                              });
  }
}

// The pipelined kernel (MXMOE_QUANT_TMA=1: TMA loads into an mbarrier ring, one 16-row or 16-column
// slice per warp, TMA stores per warp) on the plain copies of dense inputs, against the reference:
// every BF16 pattern as an element and as an amax (both directions and each alone), random shapes
// with partial tiles both ways (rows not a multiple of 128 or of 32, K = 2880 whose last tile has
// one 64-column box only, 96 x 64 and 160 x 160), batched weights, NaN/Inf blocks, both scale
// modes, and walks of many tiles per CTA (every ring slot and staging slice reused many times; one
// direction alone: two teams of warps on alternate tiles). Reruns bitwise identical.
// Runs on the defaults (since session 12: both directions on the round-robin walk, one direction on
// the TMA-stored scale units where the shape qualifies; PipelinedKernelScaleUnits and
// PipelinedKernelScaleTmaUnits below run the others).
TEST(QuantizeGpu, PipelinedKernelOnPlainCopies) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  const ScopedEnv env("MXMOE_QUANT_TMA", "1");
  std::vector<uint16_t> a(65536);
  std::iota(a.begin(), a.end(), 0);
  std::vector<uint16_t> b(size_t(65536) * 32, 0);
  for (int i = 0; i < 65536; ++i) b[size_t(i) * 32 + i % 32] = uint16_t(i);
  for (ScaleMode mode : {ScaleMode::kRceil, ScaleMode::kFloor}) {
    for (const auto& [row, col] : {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
      run_dense_once({1, 2048, 32, row, col, false}, mode, a, "pipelined: patterns in order");
      run_dense_once({1, 65536, 32, row, col, false}, mode, b, "pipelined: isolated patterns");
    }
  }
  const DenseCase cases[] = {
      {1, 4000, 2880, true, true, false},   {1, 4000, 2880, true, false, false}, {1, 4000, 2880, false, true, false},
      {1, 1000, 2880, true, false, false},  {1, 33, 32, true, false, false},     {1, 96, 64, false, true, false},
      {1, 160, 160, true, true, false},     {1, 1024, 7168, true, true, false},  {3, 160, 96, true, true, false},
      {4, 384, 2880, true, true, false},    {3, 2880, 256, true, true, false},   {2, 160, 96, false, true, false},
      {1, 4096, 7168, true, true, false},   {1, 8192, 2880, true, false, false}, {1, 8192, 2880, false, true, false},
  };
  int i = 0;
  for (const auto& c : cases) {
    const Dist dist = Dist(i % 4);
    const ScaleMode mode = (i % 3 == 2) ? ScaleMode::kFloor : ScaleMode::kRceil;
    auto x = random_bf16(c.batch * c.rows, c.cols, dist, rng);
    if (i % 2 == 1) poison_some(x, rng);  // NaN/Inf in some blocks
    run_dense_once(c, mode, x, std::string("pipelined: ") + dist_name(dist));
    ++i;
  }
  expect_reruns_identical(false, rng);
}

// The pipelined kernel's unit walk and unit scale writer (MXMOE_QUANT_SCALE_UNIT, session 11; the
// test above runs the default units) against the reference, with the unit walk off (0: the
// round-robin walk of runs 56-62), 1x1 units (the unit writer with 4-byte runs), and units that
// leave partial units at every edge: rows not a multiple of 128 gr, K not a multiple of 128 gc
// (K = 2880: 22.5 tiles, 90-byte scale rows), shapes smaller than one unit, batched weights (units
// never cross a batch entry), CTA ranges that split units (4096x7168: 13-14 tiles a CTA on 132
// SMs) and walks with several whole units a CTA (12288x4096: 3072 tiles, 23 a CTA, 192 4x4 units);
// also the per-tile scale orders (late, early, warp) on the unit walk, reruns bitwise identical,
// and the switch's error on a unit that does not fit.
TEST(QuantizeGpu, PipelinedKernelScaleUnits) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  const ScopedEnv env("MXMOE_QUANT_TMA", "1");
  const DenseCase cases[] = {
      {1, 4000, 2880, true, true, false}, {1, 4000, 2880, true, false, false}, {1, 4000, 2880, false, true, false},
      {1, 33, 32, true, false, false},    {1, 96, 64, false, true, false},     {1, 160, 160, true, true, false},
      {3, 160, 96, true, true, false},    {4, 384, 2880, true, true, false},   {3, 2880, 256, true, true, false},
      {2, 640, 1184, false, true, false}, {1, 1000, 2880, true, false, false},
  };
  const char* units[] = {"1", "0", "1x1", "2x2", "1x16", "16x1", "8x2", "2x8", "4x4"};
  int i = 0;
  for (const char* unit : units) {
    const ScopedEnv u("MXMOE_QUANT_SCALE_UNIT", unit);
    for (const auto& c : cases) {
      const Dist dist = Dist(i % 4);
      const ScaleMode mode = (i % 3 == 2) ? ScaleMode::kFloor : ScaleMode::kRceil;
      auto x = random_bf16(c.batch * c.rows, c.cols, dist, rng);
      if (i % 2 == 1) poison_some(x, rng);  // NaN/Inf in some blocks
      run_dense_once(c, mode, x, std::string("pipelined, MXMOE_QUANT_SCALE_UNIT=") + unit + ", " + dist_name(dist));
      ++i;
    }
  }
  // One direction alone takes units up to 32 tiles.
  for (const char* unit : {"1x32", "32x1"}) {
    const ScopedEnv u("MXMOE_QUANT_SCALE_UNIT", unit);
    for (const DenseCase& c : {DenseCase{1, 4000, 2880, true, false, false}, DenseCase{1, 4000, 2880, false, true, false}})
      run_dense_once(c, ScaleMode::kRceil, random_bf16(c.rows, c.cols, Dist::kHeavyTailed, rng),
                     std::string("pipelined, MXMOE_QUANT_SCALE_UNIT=") + unit);
  }
  // CTA ranges that split units (4096x7168) and several whole units a CTA (12288x4096), default and
  // 2x2 units; the round-robin walk on the first.
  for (const char* unit : {"1", "2x2", "0"}) {
    const ScopedEnv u("MXMOE_QUANT_SCALE_UNIT", unit);
    for (const DenseCase& c : {DenseCase{1, 4096, 7168, true, true, false}, DenseCase{1, 12288, 4096, true, true, false}}) {
      if (std::string(unit) == "0" && c.rows == 12288) continue;
      run_dense_once(c, ScaleMode::kRceil, random_bf16(c.rows, c.cols, Dist::kGaussian, rng),
                     std::string("pipelined, long walk, MXMOE_QUANT_SCALE_UNIT=") + unit);
    }
  }
  // The per-tile scale orders on the unit walk.
  for (const char* order : {"late", "early", "warp"}) {
    const ScopedEnv u("MXMOE_QUANT_SCALE_UNIT", "1");  // (off by default since session 12)
    const ScopedEnv s("MXMOE_QUANT_TMA_SCALES", order);
    for (const DenseCase& c : {DenseCase{1, 4000, 2880, true, true, false}, DenseCase{3, 160, 96, false, true, false}})
      run_dense_once(c, ScaleMode::kRceil, random_bf16(c.batch * c.rows, c.cols, Dist::kHeavyTailed, rng),
                     std::string("pipelined, unit walk, MXMOE_QUANT_TMA_SCALES=") + order);
  }
  for (const char* unit : {"1", "2x2", "0"}) {
    const ScopedEnv u("MXMOE_QUANT_SCALE_UNIT", unit);
    SCOPED_TRACE(std::string("reruns, MXMOE_QUANT_SCALE_UNIT=") + unit);
    expect_reruns_identical(false, rng);
  }
  {  // 8x4 = 32 tiles both ways: 32 KB of scale bytes, more than the 16 KB unit buffer
    const ScopedEnv u("MXMOE_QUANT_SCALE_UNIT", "8x4");
    DevBuf<uint16_t> dx(size_t(256) * 256);
    CopyBufs rw(1, 256, 256, false), cw(1, 256, 256, false);
    const MxOut ro = rw.out(false), co = cw.out(false);
    EXPECT_ANY_THROW(quantize_mxfp8(reinterpret_cast<const __nv_bfloat16*>(dx.p), 1, 256, 256, &ro, &co));
  }
}

namespace {

// One setting of the unit round robin's switches ("" = unset): MXMOE_QUANT_TMA_GRID,
// MXMOE_QUANT_TMA_SPLIT, MXMOE_QUANT_TMA_UNIT_ORDER, MXMOE_QUANT_SCALE_TMA.
struct TmaSetting {
  const char* grid;
  const char* split;
  const char* order;
  const char* tma;
};
// The switches of a TmaSetting for one scope (tma overrides its MXMOE_QUANT_SCALE_TMA).
struct TmaSettingEnv {
  ScopedEnv g, sp, o, t;
  std::string label;
  TmaSettingEnv(const TmaSetting& s, const char* tma)
      : g("MXMOE_QUANT_TMA_GRID", s.grid), sp("MXMOE_QUANT_TMA_SPLIT", s.split),
        o("MXMOE_QUANT_TMA_UNIT_ORDER", s.order), t("MXMOE_QUANT_SCALE_TMA", tma),
        label(std::string("grid=") + s.grid + " split=" + s.split + " order=" + s.order +
              " MXMOE_QUANT_SCALE_TMA=" + tma) {}
};
// The references (RCEIL) of each batch entry of x [batch, rows, cols]: row-wise and / or column-wise.
void batch_references(const std::vector<uint16_t>& x, int64_t batch, int64_t rows, int64_t cols, bool row, bool col,
                      std::vector<ref::MxMatrix>* rref, std::vector<ref::MxMatrix>* cref) {
  for (int64_t b = 0; b < batch; ++b) {
    const uint16_t* xb = x.data() + b * rows * cols;
    if (row) rref->push_back(ref::quantize_rows(xb, rows, cols, ScaleMode::kRceil));
    if (col) cref->push_back(ref::quantize_cols(xb, rows, cols, ScaleMode::kRceil));
  }
}

// One quantized copy [batch, R, C] (its data, and its scales `scale_off` bytes into their buffer)
// against the reference of each batch entry; the bytes before the scales must keep `poison`.
// Returns data then scales.
std::vector<uint8_t> expect_copy_bytes(const char* dir, const DevBuf<uint8_t>& data, const DevBuf<uint8_t>& scales,
                                       int64_t batch, int64_t R, int64_t C, const std::vector<ref::MxMatrix>& want,
                                       int scale_off, uint8_t poison) {
  auto d = data.download();
  const auto s = scales.download();
  for (int i = 0; i < scale_off; ++i) EXPECT_EQ(s[size_t(i)], poison) << dir << " byte " << i << " before the scales";
  for (int64_t b = 0; b < batch; ++b) {
    EXPECT_TRUE(bytes_equal((std::string(dir) + " data").c_str(), d.data() + b * R * C, C, want[size_t(b)].data.data(),
                            C, R, C));
    EXPECT_TRUE(bytes_equal((std::string(dir) + " scales").c_str(), s.data() + scale_off + b * R * (C / 32), C / 32,
                            want[size_t(b)].scales.data(), C / 32, R, C / 32));
  }
  d.insert(d.end(), s.begin() + scale_off, s.end());
  return d;
}

// One direction of x [batch, rows, cols] on the current switches against the reference of each batch
// entry (`want`, computed once per input), into buffers poisoned with `poison`; the scales start
// `scale_off` bytes into their buffer (those bytes must keep the poison). Returns data then scales.
std::vector<uint8_t> expect_one_direction(const std::string& what, const DevBuf<uint16_t>& dx, int64_t batch,
                                          int64_t rows, int64_t cols, bool row, const std::vector<ref::MxMatrix>& want,
                                          int scale_off = 0, uint8_t poison = 0xA5) {
  SCOPED_TRACE(what + (row ? " rowwise" : " colwise") + " batch=" + std::to_string(batch) +
               " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) + " scale offset " +
               std::to_string(scale_off));
  const int64_t R = row ? rows : cols, C = row ? cols : rows;  // the output's shape
  DevBuf<uint8_t> data(size_t(batch * R * C), poison), scales(size_t(batch * R * C / 32 + scale_off), poison);
  MxOut o;
  o.data = data.p;
  o.scales = scales.p + scale_off;
  quantize_mxfp8(reinterpret_cast<const __nv_bfloat16*>(dx.p), batch, rows, cols, row ? &o : nullptr,
                 row ? nullptr : &o);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return expect_copy_bytes(row ? "rowwise" : "colwise", data, scales, batch, R, C, want, scale_off, poison);
}

}  // namespace

// The one-direction pipelined kernels with TMA-stored scale units (MXMOE_QUANT_SCALE_TMA, session 12:
// the unit round robin over units of 8 tiles along the scales' contiguous dimension, one TMA store of
// [128][32 B] per unit) against the reference, bit for bit. Shapes with partial units at every edge
// (row-wise: K = 2560 / 1536 = 20 / 12 tiles, rows 1000 / 2560; column-wise: rows 2560 = 20 tiles,
// columns 992 / 416 cut the last 128-column band), fewer tiles than a unit (512 x 96, 96 x 512),
// batched inputs (units never cross a batch entry), the fallbacks (K = 2880: 90 scale bytes a row;
// nblk % 16 != 0; scale pointers not 16-byte aligned, the bytes before them untouched), grids of 1, 3,
// 7 CTAs and the default (every unit buffer reused many times; idle CTAs), the tail split forced on
// and off, the other unit order, the walk with per-tile stores (=walk) and the switch off (=0), the
// skeleton with unit scales (every scale byte 0x7F: it must not hang either) and reruns bitwise
// identical. The CPU reference runs once per input.
TEST(QuantizeGpu, PipelinedKernelScaleTmaUnits) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  const ScopedEnv env("MXMOE_QUANT_TMA", "1");
  struct Case {
    int64_t batch, rows, cols;
    bool row, col;
  };
  const Case cases[] = {
      {1, 2560, 2560, true, true},   // both qualify: 20 tiles along K and along the rows (8 + 8 + 4)
      {1, 1000, 2560, true, false},  // row-wise, partial row band
      {1, 2560, 992, true, true},    // column-wise, partial column band; row-wise falls back (nblk 31)
      {1, 96, 512, true, false},     // 4 tiles: less than one unit
      {1, 512, 96, false, true},
      {1, 1024, 2880, true, true},   // K = 2880: row-wise falls back (nblk 90), column-wise qualifies
      {3, 640, 1536, true, true},    // batched: row-wise 12 tiles a band (8 + 4); column-wise falls back (nblk 20)
      {2, 1536, 416, true, true},    // batched: column-wise 12 tiles a column band, 416 columns; row-wise nblk 13
      {1, 4096, 7168, true, true},   // long walks: 224 units each way, a split tail on 132 SMs
  };
  const TmaSetting settings[] = {
      {"", "", "", ""},           {"1", "", "", ""},         {"3", "0", "", ""},     {"7", "1", "", ""},
      {"", "0", "", ""},          {"", "1", "across", ""},   {"5", "", "", "walk"},  {"", "", "", "0"},
  };
  int i = 0;
  for (const Case& c : cases) {
    auto x = random_bf16(c.batch * c.rows, c.cols, Dist(i % 4), rng);
    if (i % 2 == 1) poison_some(x, rng);  // NaN/Inf in some blocks
    ++i;
    DevBuf<uint16_t> dx(x.size());
    dx.upload(x);
    std::vector<ref::MxMatrix> rref, cref;
    batch_references(x, c.batch, c.rows, c.cols, c.row, c.col, &rref, &cref);
    const bool big = c.rows * c.cols > (int64_t(1) << 22);
    for (const TmaSetting& st : settings) {
      if (big && *st.grid != 0 && std::string(st.grid) != "7") continue;  // long walks: 132 SMs and 7 CTAs
      const TmaSettingEnv env_st(st, st.tma);
      if (c.row) expect_one_direction(env_st.label, dx, c.batch, c.rows, c.cols, true, rref);
      if (c.col) expect_one_direction(env_st.label, dx, c.batch, c.rows, c.cols, false, cref);
    }
    if (c.batch == 1 && c.rows == 2560 && c.cols == 2560) {
      // Scale pointers off 16-byte alignment fall back to the per-tile stores; 16 bytes off still qualify
      // (3 CTAs: 50 units, whole; on 132 CTAs the tail split would store every tile's bytes itself).
      const ScopedEnv g3("MXMOE_QUANT_TMA_GRID", "3");
      for (int off : {2, 16}) {
        expect_one_direction("offset", dx, 1, c.rows, c.cols, true, rref, off);
        expect_one_direction("offset", dx, 1, c.rows, c.cols, false, cref, off == 2 ? 1 : off);
      }
      // Reruns bitwise identical (different poison: every byte is written), default grid and 3 CTAs.
      for (const char* grid : {"", "3"}) {
        const ScopedEnv g("MXMOE_QUANT_TMA_GRID", grid);
        for (bool row : {true, false}) {
          const auto& want = row ? rref : cref;
          const auto a = expect_one_direction("rerun 1", dx, 1, c.rows, c.cols, row, want, 0, 0x11);
          const auto b = expect_one_direction("rerun 2", dx, 1, c.rows, c.cols, row, want, 0, 0x22);
          EXPECT_TRUE(a == b) << "reruns differ, grid=" << grid << (row ? " rowwise" : " colwise");
        }
      }
      // The skeleton with TMA-stored unit scales writes 0x7F to every scale byte (and no more); without
      // scale stores it must finish too.
      const ScopedEnv sk("MXMOE_QUANT_TMA", "skel");
      for (const char* grid : {"", "3"}) {
        const ScopedEnv g("MXMOE_QUANT_TMA_GRID", grid);
        for (bool row : {true, false}) {
          SCOPED_TRACE(std::string("skeleton, grid=") + grid + (row ? " rowwise" : " colwise"));
          const int64_t n = c.rows * c.cols;
          DevBuf<uint8_t> data(size_t(n), 0xA5), scales(size_t(n / 32 + 16), 0xA5);
          MxOut o;
          o.data = data.p;
          o.scales = scales.p;
          {
            const ScopedEnv ss("MXMOE_QUANT_TMA_SKEL_SCALES", "1");
            quantize_mxfp8(reinterpret_cast<const __nv_bfloat16*>(dx.p), 1, c.rows, c.cols, row ? &o : nullptr,
                           row ? nullptr : &o);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            const auto s = scales.download();
            EXPECT_TRUE(std::all_of(s.begin(), s.begin() + n / 32, [](uint8_t v) { return v == 0x7F; }));
            EXPECT_TRUE(std::all_of(s.begin() + n / 32, s.end(), [](uint8_t v) { return v == 0xA5; }));
          }
          quantize_mxfp8(reinterpret_cast<const __nv_bfloat16*>(dx.p), 1, c.rows, c.cols, row ? &o : nullptr,
                         row ? nullptr : &o);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        }
      }
    }
  }
  // The switches' errors.
  {
    const ScopedEnv t("MXMOE_QUANT_SCALE_TMA", "2");
    DevBuf<uint16_t> dx(size_t(512) * 512);
    CopyBufs rw(1, 512, 512, false);
    const MxOut ro = rw.out(false);
    EXPECT_ANY_THROW(quantize_mxfp8(reinterpret_cast<const __nv_bfloat16*>(dx.p), 1, 512, 512, &ro, nullptr));
  }
}

namespace {

// Both directions of x [batch, rows, cols] on the current switches against the references of each
// batch entry (computed once per input), into buffers poisoned with `poison`; the scales start
// row_off / col_off bytes into their buffers (those bytes must keep the poison). Returns every
// output byte (row-wise data and scales, then column-wise).
std::vector<uint8_t> expect_both_directions(const std::string& what, const DevBuf<uint16_t>& dx, int64_t batch,
                                            int64_t rows, int64_t cols, const std::vector<ref::MxMatrix>& rref,
                                            const std::vector<ref::MxMatrix>& cref, int row_off = 0, int col_off = 0,
                                            uint8_t poison = 0xA5) {
  SCOPED_TRACE(what + " both directions batch=" + std::to_string(batch) + " rows=" + std::to_string(rows) +
               " cols=" + std::to_string(cols) + " scale offsets " + std::to_string(row_off) + "/" +
               std::to_string(col_off));
  const int64_t n = batch * rows * cols;
  DevBuf<uint8_t> rd(size_t(n), poison), rs(size_t(n / 32 + row_off), poison), cd(size_t(n), poison),
      cs(size_t(n / 32 + col_off), poison);
  MxOut ro, co;
  ro.data = rd.p;
  ro.scales = rs.p + row_off;
  co.data = cd.p;
  co.scales = cs.p + col_off;
  quantize_mxfp8(reinterpret_cast<const __nv_bfloat16*>(dx.p), batch, rows, cols, &ro, &co);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto all = expect_copy_bytes("rowwise", rd, rs, batch, rows, cols, rref, row_off, poison);
  const auto col = expect_copy_bytes("colwise", cd, cs, batch, cols, rows, cref, col_off, poison);
  all.insert(all.end(), col.begin(), col.end());
  return all;
}

}  // namespace

// The both-directions pipelined kernel with TMA-stored scale units (session 12, branch quant-tmas2:
// the unit round robin over units of 4x4 tiles, each unit's row-wise and column-wise scale bytes
// stored as [512][16 B] by TMA) against the reference, bit for bit. Qualifying shapes (rows and K
// multiples of 512) run with MXMOE_QUANT_SCALE_TMA=force (a launch that would not take the units
// throws, so the units did run): one unit (512x512), 16 units (2048x2048), 3x5 units (1536x2560),
// batched 2 x 1024 x 1536 (units never cross a batch entry), 4096x7168 (112 units: wholly split into
// single tiles on 132 SMs, 16 units a CTA on 7, 110 whole + a split tail on 10, 90 + 22 split on
// 30), 6144x6144 (144 units: 132 whole units + 12 split on 132 SMs, whole units on every CTA of the
// default grid); the fallbacks (1056x2560, 2560x992, 3 x 640 x 1536: rows or K not multiples of 512); grids
// of 1, 3, 5, 7 CTAs and the default; the split forced on and off, the other unit order, the walk
// with per-tile stores (=walk) and the switch off (=0); NaN/Inf blocks in every other input; scale
// pointers 16 bytes off (qualify) and 1, 2 or 8 bytes off (fall back; the bytes before untouched);
// reruns bitwise identical. The CPU reference runs once per input.
TEST(QuantizeGpu, PipelinedKernelBothDirectionsTmaUnits) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  const ScopedEnv env("MXMOE_QUANT_TMA", "1");
  struct Case {
    int64_t batch, rows, cols;
    bool qualifies;
  };
  const Case cases[] = {
      {1, 2048, 2048, true}, {1, 512, 512, true},   {1, 1536, 2560, true},  {2, 1024, 1536, true},
      {1, 4096, 7168, true}, {1, 6144, 6144, true},  {1, 1056, 2560, false}, {1, 2560, 992, false},
      {3, 640, 1536, false},
  };
  // (tma "" = the default (1): "force" where the shape qualifies)
  const TmaSetting settings[] = {
      {"", "", "", ""},         {"1", "", "", ""},        {"3", "0", "", ""},      {"7", "1", "", ""},
      {"", "0", "", ""},        {"", "1", "across", ""},  {"5", "", "", "walk"},   {"", "", "", "0"},
      {"10", "", "", ""},       {"30", "", "across", ""},
  };
  int i = 0;
  for (const Case& c : cases) {
    auto x = random_bf16(c.batch * c.rows, c.cols, Dist(i % 4), rng);
    if (i % 2 == 1) poison_some(x, rng);  // NaN/Inf in some blocks
    ++i;
    DevBuf<uint16_t> dx(x.size());
    dx.upload(x);
    std::vector<ref::MxMatrix> rref, cref;
    batch_references(x, c.batch, c.rows, c.cols, true, true, &rref, &cref);
    const bool big = c.rows * c.cols > (int64_t(1) << 22);
    for (const TmaSetting& st : settings) {
      const std::string grid = st.grid;
      if (big && !(grid.empty() || grid == "7" || grid == "10" || grid == "30")) continue;  // long walks
      if (!big && (grid == "10" || grid == "30")) continue;
      const TmaSettingEnv env_st(st, *st.tma == 0 && c.qualifies ? "force" : st.tma);
      expect_both_directions(env_st.label, dx, c.batch, c.rows, c.cols, rref, cref);
    }
    if (c.batch == 1 && c.rows == 2048 && c.cols == 2048) {
      // Scale pointers 16 bytes off still qualify; 2 / 1 and 16 / 8 bytes off fall back (an odd row-wise
      // pointer takes the register-store kernel).
      const ScopedEnv g3("MXMOE_QUANT_TMA_GRID", "3");
      {
        const ScopedEnv t("MXMOE_QUANT_SCALE_TMA", "force");
        expect_both_directions("offset", dx, 1, c.rows, c.cols, rref, cref, 16, 16);
      }
      for (const auto& [ro, co] : {std::pair{2, 1}, std::pair{16, 8}, std::pair{1, 16}})
        expect_both_directions("offset", dx, 1, c.rows, c.cols, rref, cref, ro, co);
      {
        const ScopedEnv t("MXMOE_QUANT_SCALE_TMA", "force");
        DevBuf<uint8_t> rd(size_t(c.rows * c.cols)), rs(size_t(c.rows * c.cols / 32 + 16)), cd(size_t(c.rows * c.cols)),
            cs(size_t(c.rows * c.cols / 32 + 16));
        MxOut ro, co;
        ro.data = rd.p;
        ro.scales = rs.p;
        co.data = cd.p;
        co.scales = cs.p + 8;
        EXPECT_ANY_THROW(quantize_mxfp8(reinterpret_cast<const __nv_bfloat16*>(dx.p), 1, c.rows, c.cols, &ro, &co))
            << "force on a scale pointer that does not qualify";
      }
      // Reruns bitwise identical (different poison: every byte is written), default grid and 3 CTAs.
      for (const char* grid : {"", "3"}) {
        const ScopedEnv g("MXMOE_QUANT_TMA_GRID", grid);
        const ScopedEnv t("MXMOE_QUANT_SCALE_TMA", "force");
        const auto a = expect_both_directions("rerun 1", dx, 1, c.rows, c.cols, rref, cref, 0, 0, 0x11);
        const auto b = expect_both_directions("rerun 2", dx, 1, c.rows, c.cols, rref, cref, 0, 0, 0x22);
        EXPECT_TRUE(a == b) << "reruns differ, grid=" << grid;
      }
    }
  }
  {  // force on a shape that does not qualify throws
    const ScopedEnv t("MXMOE_QUANT_SCALE_TMA", "force");
    DevBuf<uint16_t> dx(size_t(640) * 512);
    CopyBufs rw(1, 640, 512, false), cw(1, 512, 640, false);
    const MxOut ro = rw.out(false), co = cw.out(false);
    EXPECT_ANY_THROW(quantize_mxfp8(reinterpret_cast<const __nv_bfloat16*>(dx.p), 1, 640, 512, &ro, &co));
  }
}
