// The column-wise 128x128-block form written by the staged quantizer (MxOut::fast_blocks; the wgrad
// activations of MoeLayerConfig::activation_fast_layout = kBlock128), bit for bit against the CPU
// reference ref::rebase_fast_block128(ref::quantize_cols(...)) (the plain copy, then the block rebase)
// and against the GPU's own plain copy + rebase_mxfp8_fast_block128: dense (batch > 1, rows and cols
// multiples of 32 but not of 128, NaN / Inf, both scale modes, every distribution), grouped (ragged,
// empty and overloaded experts, pad rows) and gather maps (negative and out-of-range row indices,
// rows_used null / a multiple of 128 / cutting a tile / 0, the scaled gather, long walks), with the
// row-wise fast form alone in the same call (the layer's request) and without a row-wise copy.
// Outputs are poisoned first; bytes not to be written (past rows_used, past the buffers) must keep
// the poison. Reruns are bitwise identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/gpu_test_util.h"
#include "common/scoped_env.h"
#include "mxmoe/mx_format.h"
#include "mxmoe/quantize.h"
#include "ref/mx_ref.h"

using namespace mxmoe;
using namespace mxmoe::test;

namespace {

constexpr size_t kGuard = 64;  // bytes after each output that must keep the poison
constexpr uint8_t kPoison = 0xA5;

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool all_poison(const uint8_t* p, size_t n) {
  return std::all_of(p, p + n, [](uint8_t v) { return v == kPoison; });
}

// One call's outputs for x [batch, out_rows, cols] (row space of out_rows): the row-wise fast form
// (data [batch, out_rows, cols], scales [batch, ceil(cols/128), out_rows]) and the column-wise block
// form (data [batch, cols, out_rows], scales [batch, ceil(out_rows/128), pitch(cols)]), poisoned.
struct Outs {
  int64_t batch, out_rows, cols, pitch;
  DevBuf<uint8_t> rfd, rfs, cbd, cbs;
  Outs(int64_t b, int64_t r, int64_t c)
      : batch(b), out_rows(r), cols(c), pitch(fast_block_scales_pitch(c)),
        rfd(size_t(b * r * c) + kGuard, kPoison), rfs(size_t(b * cdiv(c, 128) * r) + kGuard, kPoison),
        cbd(size_t(b * c * r) + kGuard, kPoison), cbs(size_t(b * cdiv(r, 128) * pitch) + kGuard, kPoison) {}
  MxOut row() const {
    MxOut o;
    o.fast_data = rfd.p;
    o.fast_scales = rfs.p;
    return o;
  }
  MxOut col() const {
    MxOut o;
    o.fast_data = cbd.p;
    o.fast_scales = cbs.p;
    o.fast_blocks = true;
    return o;
  }
};

// A launch into given outputs: rowwise may be null.
using Launch = std::function<void(const MxOut* rowwise, const MxOut* colwise)>;

// x_eff: per batch entry the BF16 rows [used, cols] the call quantizes (gathered / padded, rows
// without data zero). Rows [0, used) of each entry against the reference; everything past them, the
// block scales of chunks past ceil(used/128) and the guards keep the poison.
void expect_outs(const std::string& what, const Outs& o, bool row, const std::vector<uint16_t>& x_eff, int64_t used,
                 ScaleMode mode) {
  const int64_t B = o.batch, R = o.out_rows, C = o.cols, P = o.pitch, nck = cdiv(C, 128), nrb = cdiv(R, 128);
  const auto cbd = o.cbd.download(), cbs = o.cbs.download(), rfd = o.rfd.download(), rfs = o.rfs.download();
  for (int64_t b = 0; b < B; ++b) {
    SCOPED_TRACE(what + " batch entry " + std::to_string(b) + " used=" + std::to_string(used));
    const uint8_t* bd = cbd.data() + b * C * R;
    const uint8_t* bs = cbs.data() + b * nrb * P;
    if (used > 0) {
      const uint16_t* xb = x_eff.data() + b * used * C;
      const ref::FastBlockMatrix want = ref::rebase_fast_block128(ref::quantize_cols(xb, used, C, mode), 1);
      ASSERT_EQ(want.pitch, P);
      EXPECT_TRUE(bytes_equal("colwise block data", bd, R, want.data.data(), used, C, used));
      EXPECT_TRUE(bytes_equal("colwise block scales (with the pitch padding)", bs, P, want.scales.data(), P,
                              cdiv(used, 128), P));
      if (row) {
        const ref::FastMatrix rf = ref::rebase_fast(ref::quantize_rows(xb, used, C, mode));
        EXPECT_TRUE(bytes_equal("rowwise fast data", rfd.data() + b * R * C, C, rf.data.data(), C, used, C));
        EXPECT_TRUE(bytes_equal("rowwise fast scales", rfs.data() + b * nck * R, R, rf.scales.data(), used, nck, used));
      }
    }
    for (int64_t c = 0; c < C; ++c)
      ASSERT_TRUE(all_poison(bd + c * R + used, size_t(R - used))) << "colwise [" << c << ", >= " << used << "] written";
    const int64_t used_chunks = cdiv(used, 128);
    ASSERT_TRUE(all_poison(bs + used_chunks * P, size_t((nrb - used_chunks) * P))) << "block scales past the used chunks written";
    if (row) {
      ASSERT_TRUE(all_poison(rfd.data() + (b * R + used) * C, size_t((R - used) * C))) << "rowwise rows past used written";
    }
  }
  EXPECT_TRUE(all_poison(cbd.data() + B * C * R, kGuard)) << "block data guard written";
  EXPECT_TRUE(all_poison(cbs.data() + B * nrb * P, kGuard)) << "block scales guard written";
  if (!row) {
    EXPECT_TRUE(all_poison(rfd.data(), rfd.size())) << "row-wise output not asked for but written";
    EXPECT_TRUE(all_poison(rfs.data(), rfs.size())) << "row-wise output not asked for but written";
  }
}

// The call with the row-wise fast form (the layer's request) and without a row-wise copy, each
// twice into fresh poison (the reruns must be bitwise identical), on the default kernels and with
// MXMOE_QUANT_STAGED=0 (which the block form ignores: only the staged kernel writes it).
void check_call(const std::string& what, int64_t batch, int64_t out_rows, int64_t cols, const Launch& launch,
                const std::vector<uint16_t>& x_eff, int64_t used, ScaleMode mode) {
  for (const char* staged : {"1", "0"}) {
    const ScopedEnv env("MXMOE_QUANT_STAGED", staged);
    for (bool row : {true, false}) {
      const std::string w = what + (row ? " row fast + col blocks" : " col blocks alone") +
                            (staged[0] == '0' ? " [MXMOE_QUANT_STAGED=0]" : "");
      SCOPED_TRACE(w);
      Outs a(batch, out_rows, cols), b(batch, out_rows, cols);
      const MxOut ar = a.row(), ac = a.col(), br = b.row(), bc = b.col();
      launch(row ? &ar : nullptr, &ac);
      launch(row ? &br : nullptr, &bc);
      MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
      expect_outs(w, a, row, x_eff, used, mode);
      EXPECT_EQ(a.cbd.download(), b.cbd.download()) << "reruns differ (block data)";
      EXPECT_EQ(a.cbs.download(), b.cbs.download()) << "reruns differ (block scales)";
      EXPECT_EQ(a.rfd.download(), b.rfd.download()) << "reruns differ (row fast data)";
    }
  }
}

// The session-11 path on the GPU: the plain column-wise copy, then rebase_mxfp8_fast_block128; its
// block data and scales must equal the direct form's, over chunks [0, used / 128) (used a multiple
// of 128, so that the rebase never reads bytes the quantizer did not write).
void expect_same_as_gpu_rebase(const std::string& what, int64_t batch, int64_t out_rows, int64_t cols,
                               const Launch& launch, int64_t used) {
  SCOPED_TRACE(what + " direct vs plain + rebase_mxfp8_fast_block128");
  ASSERT_EQ(used % 128, 0);
  Outs direct(batch, out_rows, cols), rebased(batch, out_rows, cols);
  DevBuf<uint8_t> pd(size_t(batch * cols * out_rows), kPoison), ps(size_t(batch * cols * out_rows / 32), kPoison);
  const MxOut dc = direct.col(), dr = direct.row(), rr = rebased.row();
  MxOut plain;
  plain.data = pd.p;
  plain.scales = ps.p;
  launch(&dr, &dc);
  launch(&rr, &plain);
  rebase_mxfp8_fast_block128(pd.p, ps.p, batch, cols, out_rows, rebased.cbd.p, rebased.cbs.p);
  MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
  const int64_t P = direct.pitch, nrb = cdiv(out_rows, 128);
  const auto a = direct.cbd.download(), b = rebased.cbd.download(), as = direct.cbs.download(),
             bs = rebased.cbs.download();
  for (int64_t e = 0; e < batch; ++e) {
    EXPECT_TRUE(bytes_equal("block data", a.data() + e * cols * out_rows, out_rows, b.data() + e * cols * out_rows,
                            out_rows, cols, used));
    EXPECT_TRUE(bytes_equal("block scales", as.data() + e * nrb * P, P, bs.data() + e * nrb * P, P, used / 128, P));
  }
  EXPECT_EQ(direct.rfd.download(), rebased.rfd.download()) << "the row-wise fast form depends on the column-wise form";
}

// Twenty NaN / Inf values (quiet and signalling NaN, ±Inf) at random positions of x.
void poison_some(std::vector<uint16_t>& x, std::mt19937& rng, int n = 20) {
  const uint16_t bad[] = {0x7FC0, 0xFFC0, 0x7F80, 0xFF80, 0x7F81};
  for (int k = 0; k < n; ++k) x[size_t(rng() % x.size())] = bad[k % 5];
}

void run_dense(int64_t batch, int64_t rows, int64_t cols, Dist dist, ScaleMode mode, bool nan, std::mt19937& rng) {
  SCOPED_TRACE(std::string("dense ") + dist_name(dist) + (nan ? " with NaN/Inf" : "") + " batch=" +
               std::to_string(batch) + " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
               (mode == ScaleMode::kRceil ? " rceil" : " floor"));
  auto x = random_bf16(batch * rows, cols, dist, rng);
  // (on at most half the tiles' worth of positions, so that some blocks stay finite)
  if (nan) poison_some(x, rng, int(std::min<int64_t>(20, std::max<int64_t>(1, batch * cdiv(rows, 128) * cdiv(cols, 128) / 2))));
  DevBuf<uint16_t> dx(x.size());
  dx.upload(x);
  const Launch launch = [&](const MxOut* r, const MxOut* c) {
    quantize_mxfp8(reinterpret_cast<const __nv_bfloat16*>(dx.p), batch, rows, cols, r, c, mode);
  };
  check_call("dense", batch, rows, cols, launch, x, rows, mode);
  if (rows % 128 == 0) expect_same_as_gpu_rebase("dense", batch, rows, cols, launch, rows);
}

}  // namespace

TEST(QuantizeColBlockGpu, DenseShapesDistributionsAndModes) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  for (ScaleMode mode : {ScaleMode::kRceil, ScaleMode::kFloor}) {
    run_dense(1, 256, 256, Dist::kGaussian, mode, false, rng);
    run_dense(1, 4000, 2880, Dist::kHeavyTailed, mode, false, rng);  // rows % 128 = 32, cols % 128 = 64
    run_dense(3, 160, 96, Dist::kSpecial, mode, false, rng);         // batch 3, one short block each way
    run_dense(2, 384, 7168, Dist::kOutlierChannels, mode, false, rng);  // pitch(7168) = 64: 8 padding bytes
    run_dense(1, 32, 32, Dist::kGaussian, mode, false, rng);         // one 32 x 32 corner of a tile
  }
}

// NaN or Inf anywhere in a 128x128 tile poisons its whole column-wise block (scale 0xFF, data 0x7F);
// the other blocks are untouched by it. Also all-zero tiles (byte 0) and tiles whose only non-zero
// values are subnormal.
TEST(QuantizeColBlockGpu, NanInfZeroAndSubnormalBlocks) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  for (ScaleMode mode : {ScaleMode::kRceil, ScaleMode::kFloor}) {
    run_dense(1, 512, 384, Dist::kGaussian, mode, true, rng);
    run_dense(2, 224, 2880, Dist::kSpecial, mode, true, rng);
  }
  const int64_t rows = 384, cols = 384;
  auto x = random_bf16(rows, cols, Dist::kGaussian, rng);
  for (int64_t r = 0; r < 128; ++r)
    for (int64_t c = 128; c < 256; ++c) x[size_t(r * cols + c)] = 0;                  // tile (0, 1) all zero
  for (int64_t r = 128; r < 256; ++r)
    for (int64_t c = 0; c < 128; ++c) x[size_t(r * cols + c)] = uint16_t(r % 3 ? 0x0001 + r % 5 : 0);  // subnormal
  x[size_t(300 * cols + 300)] = 0x7F80;                                                 // +Inf in tile (2, 2)
  x[size_t(200 * cols + 350)] = 0xFFC1;                                                 // NaN in tile (1, 2)
  DevBuf<uint16_t> dx(x.size());
  dx.upload(x);
  for (ScaleMode mode : {ScaleMode::kRceil, ScaleMode::kFloor}) {
    const Launch launch = [&](const MxOut* r, const MxOut* c) {
      quantize_mxfp8(reinterpret_cast<const __nv_bfloat16*>(dx.p), 1, rows, cols, r, c, mode);
    };
    check_call("special tiles", 1, rows, cols, launch, x, rows, mode);
    expect_same_as_gpu_rebase("special tiles", 1, rows, cols, launch, rows);
  }
}

namespace {

void run_grouped(const std::vector<int32_t>& counts, int64_t cols, int64_t extra_rows, std::mt19937& rng) {
  const int G = int(counts.size());
  std::vector<int32_t> offs(G + 1, 0), padded(G + 1, 0);
  for (int g = 0; g < G; ++g) {
    offs[g + 1] = offs[g] + counts[g];
    padded[g + 1] = padded[g] + (counts[g] + 127) / 128 * 128;
  }
  const int64_t x_rows = offs[G], used = padded[G], out_rows = std::max<int64_t>(128, used + extra_rows);
  SCOPED_TRACE("grouped groups=" + std::to_string(G) + " x_rows=" + std::to_string(x_rows) + " padded=" +
               std::to_string(used) + " out_rows=" + std::to_string(out_rows) + " cols=" + std::to_string(cols));
  const auto x = random_bf16(std::max<int64_t>(x_rows, 1), cols, Dist::kHeavyTailed, rng);
  DevBuf<uint16_t> dx(x.size());
  dx.upload(x);
  DevBuf<int32_t> doffs(offs.size()), dpadded(padded.size());
  doffs.upload(offs);
  dpadded.upload(padded);
  // The padded matrix (pad rows zero) over its used rows.
  std::vector<uint16_t> xp(size_t(used * cols), 0);
  for (int g = 0; g < G; ++g)
    for (int32_t j = 0; j < counts[g]; ++j)
      std::copy_n(&x[size_t((offs[g] + j) * cols)], cols, &xp[size_t((padded[g] + j) * cols)]);
  const Launch launch = [&](const MxOut* r, const MxOut* c) {
    quantize_mxfp8_grouped(reinterpret_cast<const __nv_bfloat16*>(dx.p), x_rows, cols, doffs.p, dpadded.p, G, out_rows,
                           r, c);
  };
  check_call("grouped", 1, out_rows, cols, launch, xp, used, ScaleMode::kRceil);
  if (used > 0) expect_same_as_gpu_rebase("grouped", 1, out_rows, cols, launch, used);
}

}  // namespace

TEST(QuantizeColBlockGpu, GroupedRaggedEmptyAndOverloaded) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  run_grouped({0, 1, 127, 128, 129, 300, 0, 1000}, 2880, 256, rng);  // ragged, empty, pad rows, K = 2880
  run_grouped({5000}, 512, 0, rng);                                   // one expert takes every row
  run_grouped({0, 0, 0, 4096, 0}, 224, 384, rng);                     // one loaded among empties, cols % 128 = 96
  run_grouped({0, 0, 0}, 256, 128, rng);                              // nothing routed: nothing written
  std::vector<int32_t> many(384);
  for (auto& c : many) c = int32_t(rng() % 40 == 0 ? 700 : rng() % 90);
  run_grouped(many, 128, 128, rng);                                   // E = 384, skewed
}

namespace {

// A gather of x [x_rows, cols] into out_rows rows: row indices random tokens, pads (-1) and indices
// past x (zero rows); used < 0: rows_used null. scaled: quantize_mxfp8_gather_scaled with random
// row scales (zeros, negatives, powers of two, a few overflowing BF16 to Inf).
void run_gather(int64_t x_rows, int64_t cols, int64_t out_rows, int64_t used_in, bool scaled, std::mt19937& rng) {
  const bool used_null = used_in < 0;
  const int64_t used = used_null ? out_rows : used_in;
  SCOPED_TRACE(std::string(scaled ? "gather_scaled" : "gather") + " x_rows=" + std::to_string(x_rows) + " cols=" +
               std::to_string(cols) + " out_rows=" + std::to_string(out_rows) + " used=" +
               (used_null ? "null" : std::to_string(used)));
  const auto x = random_bf16(x_rows, cols, Dist::kHeavyTailed, rng);
  std::vector<int32_t> idx(static_cast<size_t>(out_rows));
  for (auto& v : idx) {
    const uint32_t k = rng() % 10;
    v = k == 0 ? -1 - int32_t(rng() % 3) : (k == 1 ? int32_t(x_rows + rng() % 5) : int32_t(rng() % x_rows));
  }
  std::vector<float> scale(static_cast<size_t>(out_rows));
  std::normal_distribution<float> gs(0.0f, 1.0f);
  for (auto& v : scale) {
    const uint32_t k = rng() % 12;
    v = k == 0 ? 0.0f : k == 1 ? -0.5f : k == 2 ? 0x1p100f : k == 3 ? std::ldexp(1.0f, int(rng() % 9) - 4) : gs(rng);
  }
  std::vector<uint16_t> xg(size_t(used * cols), 0);
  for (int64_t r = 0; r < used; ++r) {
    const int32_t i = idx[size_t(r)];
    if (i < 0 || i >= x_rows) continue;
    for (int64_t c = 0; c < cols; ++c) {
      const uint16_t v = x[size_t(i * cols + c)];
      xg[size_t(r * cols + c)] = scaled ? ref::float_to_bf16(scale[size_t(r)] * ref::bf16_to_float(v)) : v;
    }
  }
  DevBuf<uint16_t> dx(x.size());
  DevBuf<int32_t> didx(idx.size()), dused(1);
  DevBuf<float> dscale(scale.size());
  dx.upload(x);
  didx.upload(idx);
  dused.upload(std::vector<int32_t>{int32_t(used)});
  dscale.upload(scale);
  const Launch launch = [&](const MxOut* r, const MxOut* c) {
    const auto* xp = reinterpret_cast<const __nv_bfloat16*>(dx.p);
    const int32_t* ru = used_null ? nullptr : dused.p;
    if (scaled) quantize_mxfp8_gather_scaled(xp, x_rows, cols, didx.p, dscale.p, out_rows, ru, r, c);
    else quantize_mxfp8_gather(xp, x_rows, cols, didx.p, out_rows, ru, r, c);
  };
  check_call(scaled ? "gather_scaled" : "gather", 1, out_rows, cols, launch, xg, used, ScaleMode::kRceil);
  if (used > 0 && used % 128 == 0) expect_same_as_gpu_rebase("gather", 1, out_rows, cols, launch, used);
}

}  // namespace

// rows_used 1280 (whole tiles), 1248 (the last tile cut: copied out by hand, the rows past used are
// zeros in the block's maximum), null (every row) and 0 (nothing written); a long walk (8192 rows,
// many tiles per CTA, the indices fetched one tile ahead crossing a cut tile and tiles past it).
TEST(QuantizeColBlockGpu, GatherPadsNegativeIndicesAndRowsUsed) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  for (bool scaled : {false, true}) {
    for (int64_t used : {int64_t(1280), int64_t(1248), int64_t(-1), int64_t(0)})
      run_gather(1000, 2880, 1536, used, scaled, rng);
    run_gather(3000, 2880, 8192, 5024, scaled, rng);
  }
  run_gather(700, 7168, 1024, 896, false, rng);  // DeepSeek-V3's H
}
