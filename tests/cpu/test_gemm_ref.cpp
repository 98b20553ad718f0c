// CPU-only checks of the grouped GEMM: the FP64 reference against an independent integer
// computation, and the host argument checks of m_grouped_mxfp8_gemm_nt (each bad argument throws
// mxmoe::Error naming it, before any CUDA call — these run on machines without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/scoped_env.h"
#include "kernels/gemm/m_grouped_gemm_rows.h"
#include "mxmoe/gemm.h"
#include "ref/gemm_ref.h"
#include "ref/mx_ref.h"

using namespace mxmoe;
using mxmoe::test::ScopedEnv;

namespace {

uint32_t seed() {
  static const uint32_t s = std::random_device{}();
  return s;
}

// Small integers are exact in every format involved, so the grouped product can be checked
// against an int64 computation done here independently.
TEST(GemmRef, MatchesIntegerProduct) {
  std::mt19937 rng(seed());
  SCOPED_TRACE(::testing::Message() << "seed " << seed());
  std::uniform_int_distribution<int> u(-8, 8);
  const int E = 4;
  const int64_t n = 24, k = 40, m_total = 20;
  const std::vector<int32_t> offsets = {0, 5, 5, 13, 17};  // expert 1 empty, rows 17..19 outside
  std::vector<int64_t> ai(size_t(m_total * k)), bi(size_t(E * n * k));
  for (auto& v : ai) v = u(rng);
  for (auto& v : bi) v = u(rng);
  std::vector<double> a(ai.begin(), ai.end()), b(bi.begin(), bi.end());
  std::vector<double> y(size_t(m_total * n), -1.0), yabs(y.size(), -1.0);
  ref::m_grouped_gemm_nt(a.data(), b.data(), m_total, E, n, k, offsets, y.data(), yabs.data());
  for (int e = 0; e < E; ++e)
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r)
      for (int64_t j = 0; j < n; ++j) {
        int64_t s = 0, sa = 0;
        for (int64_t i = 0; i < k; ++i) {
          s += ai[size_t(r * k + i)] * bi[size_t((e * n + j) * k + i)];
          sa += std::llabs(ai[size_t(r * k + i)] * bi[size_t((e * n + j) * k + i)]);
        }
        ASSERT_EQ(y[size_t(r * n + j)], double(s)) << "row " << r << " col " << j;
        ASSERT_EQ(yabs[size_t(r * n + j)], double(sa)) << "row " << r << " col " << j;
      }
  for (int64_t r = offsets[E]; r < m_total; ++r)
    for (int64_t j = 0; j < n; ++j) ASSERT_EQ(y[size_t(r * n + j)], -1.0) << "row outside segments written";
}

// The MX entry point equals the double GEMM of the dequantized operands; the fast form's result
// stays close to it (rebasing only rounds elements far below their chunk's maximum again).
TEST(GemmRef, MxOperandsDequantizeExactly) {
  std::mt19937 rng(seed());
  SCOPED_TRACE(::testing::Message() << "seed " << seed());
  std::normal_distribution<float> g(0.0f, 1.0f);
  const int E = 3;
  const int64_t n = 32, k = 160, m_total = 384;  // K % 128 == 32: partial chunk
  const std::vector<int32_t> offsets = {0, 128, 128, 256};
  std::vector<uint16_t> a(size_t(m_total * k)), b(size_t(E * n * k));
  for (auto& v : a) v = ref::float_to_bf16(g(rng));
  for (auto& v : b) v = ref::float_to_bf16(g(rng));
  const ref::MxMatrix qa = ref::quantize_rows(a.data(), m_total, k, ScaleMode::kRceil);
  const ref::MxMatrix qb = ref::quantize_rows(b.data(), E * n, k, ScaleMode::kRceil);
  const std::vector<double> y = ref::m_grouped_gemm_nt(qa, qb, E, offsets);
  const std::vector<double> da = ref::dequantize(qa), db = ref::dequantize(qb);
  std::vector<double> y2(y.size(), 0.0);
  ref::m_grouped_gemm_nt(da.data(), db.data(), m_total, E, n, k, offsets, y2.data());
  ASSERT_EQ(y, y2);
  // Fast form: close to the MX result (rebasing only rounds tiny elements again).
  const std::vector<double> yf = ref::m_grouped_gemm_nt(ref::rebase_fast(qa), ref::rebase_fast(qb), E, offsets);
  double num = 0, den = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    num += (yf[i] - y[i]) * (yf[i] - y[i]);
    den += y[i] * y[i];
  }
  EXPECT_LT(std::sqrt(num / den), 1e-2);
}

// ---- host argument checks --------------------------------------------------------------------

// Fake device pointers: never dereferenced because every case fails a check first.
alignas(16) uint8_t g_buf[64];
const uint8_t* P16 = g_buf;
const uint8_t* P_MISALIGNED = g_buf + 1;
const int32_t* OFFS = reinterpret_cast<const int32_t*>(g_buf);
const __nv_bfloat16* IMG16 = reinterpret_cast<const __nv_bfloat16*>(g_buf);
const __nv_bfloat16* IMG_MISALIGNED = reinterpret_cast<const __nv_bfloat16*>(g_buf + 2);

struct Args {
  MxOperand a{P16, P16, P16, P16, IMG16}, b{P16, P16, P16, P16, IMG16};
  int64_t m_total = 256, n = 128, k = 256;
  int E = 4;
  const int32_t* offsets = OFFS;
  void* y = g_buf;
  GemmOptions o;
};

void expect_throw_naming(const Args& x, const std::string& arg) {
  try {
    m_grouped_mxfp8_gemm_nt(x.a, x.m_total, x.b, x.E, x.n, x.k, x.offsets, x.y, x.o);
    ADD_FAILURE() << "no exception for a bad '" << arg << "'";
  } catch (const mxmoe::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'" + arg + "'"), std::string::npos) << "message does not name '" << arg << "': " << msg;
    EXPECT_NE(msg.find("m_grouped_mxfp8_gemm_nt"), std::string::npos) << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type for '" << arg << "': " << e.what();
  }
}

TEST(GemmArgs, EachBadArgumentIsNamed) {
  { Args x; x.k = 100; expect_throw_naming(x, "k"); }
  { Args x; x.k = 0; expect_throw_naming(x, "k"); }
  { Args x; x.n = 48; expect_throw_naming(x, "n"); }
  { Args x; x.n = -32; expect_throw_naming(x, "n"); }
  { Args x; x.E = 0; expect_throw_naming(x, "num_experts"); }
  { Args x; x.E = kMaxGemmExperts + 1; expect_throw_naming(x, "num_experts"); }
  { Args x; x.m_total = 100; expect_throw_naming(x, "m_total"); }
  { Args x; x.m_total = -128; expect_throw_naming(x, "m_total"); }
  { Args x; x.offsets = nullptr; expect_throw_naming(x, "offsets"); }
  { Args x; x.y = nullptr; expect_throw_naming(x, "y"); }
  { Args x; x.y = g_buf + 8; expect_throw_naming(x, "y"); }
  { Args x; x.o.mode = static_cast<GemmMode>(7); expect_throw_naming(x, "opts.mode"); }
  { Args x; x.o.out_dtype = static_cast<GemmOutDtype>(9); expect_throw_naming(x, "opts.out_dtype"); }
  { Args x; x.o.num_sms = -1; expect_throw_naming(x, "opts.num_sms"); }
  { Args x; x.o.fast_tile_n = 256; expect_throw_naming(x, "opts.fast_tile_n"); }
  { Args x; x.o.fast_tile_n = -1; expect_throw_naming(x, "opts.fast_tile_n"); }
  { Args x; x.o.fast_tile_n = 192; x.y = nullptr; expect_throw_naming(x, "y"); }  // 192 is valid
  // Fast mode (default) needs the fast form of both operands.
  { Args x; x.a.fast_data = nullptr; expect_throw_naming(x, "a.fast_data"); }
  { Args x; x.a.fast_scales = nullptr; expect_throw_naming(x, "a.fast_scales"); }
  { Args x; x.b.fast_data = nullptr; expect_throw_naming(x, "b.fast_data"); }
  { Args x; x.b.fast_scales = nullptr; expect_throw_naming(x, "b.fast_scales"); }
  { Args x; x.a.fast_data = P_MISALIGNED; expect_throw_naming(x, "a.fast_data"); }
  { Args x; x.b.fast_scales = P_MISALIGNED; expect_throw_naming(x, "b.fast_scales"); }
  // Exact mode reads the BF16 images: operands carrying only the MX or the fast form are a mismatch.
  { Args x; x.o.mode = GemmMode::kExact; x.a.image = nullptr; expect_throw_naming(x, "a.image"); }
  { Args x; x.o.mode = GemmMode::kExact; x.b.image = nullptr; expect_throw_naming(x, "b.image"); }
  { Args x; x.o.mode = GemmMode::kExact; x.a.image = IMG_MISALIGNED; expect_throw_naming(x, "a.image"); }
  { Args x; x.o.mode = GemmMode::kExact; x.b.image = IMG_MISALIGNED; expect_throw_naming(x, "b.image"); }
  // Exact mode reads neither the fast form nor data/scales; fast mode does not read the image.
  {
    Args x;
    x.o.mode = GemmMode::kExact;
    x.a.fast_data = x.a.fast_scales = x.b.fast_data = x.b.fast_scales = nullptr;
    x.a.data = x.a.scales = x.b.data = x.b.scales = nullptr;
    x.y = nullptr;  // still fails, but on 'y', i.e. the operands passed
    expect_throw_naming(x, "y");
  }
  {
    Args x;
    x.a.image = x.b.image = nullptr;
    x.a.data = x.a.scales = x.b.data = x.b.scales = nullptr;
    x.y = nullptr;
    expect_throw_naming(x, "y");
  }
}

// m_total == 0 is a valid empty problem: checked, then returns without touching CUDA.
TEST(GemmArgs, EmptyProblemNeedsNoGpu) {
  Args x;
  x.m_total = 0;
  x.a = MxOperand{};
  x.y = nullptr;
  EXPECT_NO_THROW(m_grouped_mxfp8_gemm_nt(x.a, x.m_total, x.b, x.E, x.n, x.k, x.offsets, x.y, x.o));
}

// The EP layer's row entry (m_grouped_gemm_rows.h): the same checks, plus its own — a row table,
// 8-byte aligned; BF16 out; no accumulate — each named, before any CUDA call.
void expect_rows_throw_naming(const Args& x, void* const* rows, const std::string& arg) {
  try {
    detail::m_grouped_mxfp8_gemm_nt_to_rows(x.a, x.m_total, x.b, x.E, x.n, x.k, x.offsets, rows, x.o);
    ADD_FAILURE() << "no exception for a bad '" << arg << "'";
  } catch (const mxmoe::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'" + arg + "'"), std::string::npos) << "message does not name '" << arg << "': " << msg;
    EXPECT_NE(msg.find("m_grouped_mxfp8_gemm_nt_to_rows"), std::string::npos) << msg;
  }
}

TEST(GemmArgs, RowEntryEachBadArgumentIsNamed) {
  void* const* rows = reinterpret_cast<void* const*>(g_buf);
  { Args x; expect_rows_throw_naming(x, nullptr, "row_dst"); }
  { Args x; expect_rows_throw_naming(x, reinterpret_cast<void* const*>(g_buf + 4), "row_dst"); }
  { Args x; x.o.out_dtype = GemmOutDtype::kFP32; expect_rows_throw_naming(x, rows, "opts.out_dtype"); }
  { Args x; x.o.accumulate = true; expect_rows_throw_naming(x, rows, "opts.accumulate"); }
  { Args x; x.k = 100; expect_rows_throw_naming(x, rows, "k"); }
  { Args x; x.a.fast_data = nullptr; expect_rows_throw_naming(x, rows, "a.fast_data"); }
  { Args x; x.o.mode = GemmMode::kExact; x.b.image = nullptr; expect_rows_throw_naming(x, rows, "b.image"); }
  // y is not an argument of this entry: a null y is fine, m_total == 0 returns without CUDA.
  Args x;
  x.m_total = 0;
  EXPECT_NO_THROW(detail::m_grouped_mxfp8_gemm_nt_to_rows(x.a, x.m_total, x.b, x.E, x.n, x.k, x.offsets, rows, x.o));
}

// k-grouped reference against an int64 computation (an empty expert gets zeros).
TEST(GemmRef, KGroupedMatchesIntegerProduct) {
  std::mt19937 rng(seed());
  SCOPED_TRACE(::testing::Message() << "seed " << seed());
  std::uniform_int_distribution<int> u(-8, 8);
  const int E = 3;
  const int64_t n = 5, k = 7, m_total = 30;
  const std::vector<int32_t> offsets = {0, 11, 11, 26};
  std::vector<int64_t> ai(size_t(n * m_total)), bi(size_t(k * m_total));
  for (auto& v : ai) v = u(rng);
  for (auto& v : bi) v = u(rng);
  std::vector<double> a(ai.begin(), ai.end()), b(bi.begin(), bi.end());
  std::vector<double> dw(size_t(E * n * k), -1.0);
  ref::k_grouped_gemm_nt(a.data(), b.data(), m_total, E, n, k, offsets, dw.data());
  for (int e = 0; e < E; ++e)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < k; ++i) {
        int64_t s = 0;
        for (int64_t t = offsets[e]; t < offsets[e + 1]; ++t) s += ai[size_t(j * m_total + t)] * bi[size_t(i * m_total + t)];
        ASSERT_EQ(dw[size_t((e * n + j) * k + i)], double(s)) << "expert " << e << " row " << j << " col " << i;
      }
}

void expect_k_throw_naming(const Args& x, const std::string& arg) {
  try {
    k_grouped_mxfp8_gemm_nt(x.a, x.b, x.m_total, x.E, x.n, x.k, x.offsets, x.y, x.o);
    ADD_FAILURE() << "no exception for a bad '" << arg << "'";
  } catch (const mxmoe::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'" + arg + "'"), std::string::npos) << "message does not name '" << arg << "': " << msg;
    EXPECT_NE(msg.find("k_grouped_mxfp8_gemm_nt"), std::string::npos) << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type for '" << arg << "': " << e.what();
  }
}

TEST(GemmArgs, KGroupedEachBadArgumentIsNamed) {
  { Args x; x.k = 48; expect_k_throw_naming(x, "k"); }
  { Args x; x.n = 100; expect_k_throw_naming(x, "n"); }
  { Args x; x.E = 0; expect_k_throw_naming(x, "num_experts"); }
  { Args x; x.m_total = 64; expect_k_throw_naming(x, "m_total"); }
  { Args x; x.offsets = nullptr; expect_k_throw_naming(x, "offsets"); }
  { Args x; x.y = nullptr; expect_k_throw_naming(x, "dw"); }
  { Args x; x.y = g_buf + 4; expect_k_throw_naming(x, "dw"); }
  { Args x; x.o.mode = static_cast<GemmMode>(3); expect_k_throw_naming(x, "opts.mode"); }
  { Args x; x.a.fast_scales = nullptr; expect_k_throw_naming(x, "a.fast_scales"); }
  { Args x; x.b.fast_data = P_MISALIGNED; expect_k_throw_naming(x, "b.fast_data"); }
  { Args x; x.o.mode = GemmMode::kExact; x.b.image = nullptr; expect_k_throw_naming(x, "b.image"); }
  { Args x; x.o.mode = GemmMode::kExact; x.a.image = IMG_MISALIGNED; expect_k_throw_naming(x, "a.image"); }
  // Exact mode's TMA coordinates are bytes of the BF16 image: 2 per token, so m_total <= 2^30.
  {
    Args x;
    x.o.mode = GemmMode::kExact;
    x.m_total = (int64_t(1) << 30) + 128;
    expect_k_throw_naming(x, "m_total");
  }
}

// Image layouts (gemm.h, MxOperand::image_layout): the k-grouped GEMM takes row-major and
// token-blocked images (either operand, in any mix), the m-grouped ones only row-major; a value
// outside the enum is named. Fast mode does not read the image, so its layout is not checked.
TEST(GemmArgs, ImageLayoutChecks) {
  const ImageLayout blk = ImageLayout::kTokenBlocked, bad = static_cast<ImageLayout>(5);
  // m-grouped (both entries), exact: a token-blocked image is refused, naming the operand's field.
  { Args x; x.o.mode = GemmMode::kExact; x.a.image_layout = blk; expect_throw_naming(x, "a.image_layout"); }
  { Args x; x.o.mode = GemmMode::kExact; x.b.image_layout = blk; expect_throw_naming(x, "b.image_layout"); }
  { Args x; x.o.mode = GemmMode::kExact; x.a.image_layout = bad; expect_throw_naming(x, "a.image_layout"); }
  {
    Args x;
    x.o.mode = GemmMode::kExact;
    x.a.image_layout = blk;
    expect_rows_throw_naming(x, reinterpret_cast<void* const*>(g_buf), "a.image_layout");
  }
  try {
    Args x;
    x.o.mode = GemmMode::kExact;
    x.b.image_layout = blk;
    m_grouped_mxfp8_gemm_nt(x.a, x.m_total, x.b, x.E, x.n, x.k, x.offsets, x.y, x.o);
    ADD_FAILURE() << "no exception for a token-blocked m-grouped operand";
  } catch (const mxmoe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("token-blocked images are for the k-grouped GEMM only"), std::string::npos)
        << e.what();
  }
  // m-grouped fast mode: the layout is not read; the call gets as far as y.
  { Args x; x.a.image_layout = blk; x.b.image_layout = bad; x.y = nullptr; expect_throw_naming(x, "y"); }
  // k-grouped, exact: a bad value is named; token-blocked (either or both) passes the operand
  // checks and fails only on the m_total limit placed after them.
  { Args x; x.o.mode = GemmMode::kExact; x.b.image_layout = bad; expect_k_throw_naming(x, "b.image_layout"); }
  for (int mask = 1; mask <= 3; ++mask) {
    Args x;
    x.o.mode = GemmMode::kExact;
    if (mask & 1) x.a.image_layout = blk;
    if (mask & 2) x.b.image_layout = blk;
    x.m_total = (int64_t(1) << 30) + 128;
    expect_k_throw_naming(x, "m_total");
  }
}

// MxOperand::fast_scale_layout (gemm.h): kBlock128 only for operand b of the m-grouped y entry and
// of the k-grouped GEMM in fast mode, and not with opts.fast_tile_n = 128; everything else is named, before any CUDA call
// (also for an empty problem, m_total = 0).
TEST(GemmArgs, FastScaleLayoutChecks) {
  const FastScaleLayout blk = FastScaleLayout::kBlock128, bad = static_cast<FastScaleLayout>(3);
  { Args x; x.a.fast_scale_layout = blk; expect_throw_naming(x, "a.fast_scale_layout"); }
  { Args x; x.a.fast_scale_layout = blk; x.m_total = 0; expect_throw_naming(x, "a.fast_scale_layout"); }
  { Args x; x.b.fast_scale_layout = bad; expect_throw_naming(x, "b.fast_scale_layout"); }
  { Args x; x.a.fast_scale_layout = bad; expect_throw_naming(x, "a.fast_scale_layout"); }
  { Args x; x.o.mode = GemmMode::kExact; x.b.fast_scale_layout = blk; expect_throw_naming(x, "b.fast_scale_layout"); }
  { Args x; x.b.fast_scale_layout = blk; x.o.fast_tile_n = 128; expect_throw_naming(x, "opts.fast_tile_n"); }
  // valid: the call gets as far as y (fast_tile_n 0 or 192)
  { Args x; x.b.fast_scale_layout = blk; x.y = nullptr; expect_throw_naming(x, "y"); }
  { Args x; x.b.fast_scale_layout = blk; x.o.fast_tile_n = 192; x.y = nullptr; expect_throw_naming(x, "y"); }
  {  // ... and the FP32 / accumulate forms too
    Args x;
    x.b.fast_scale_layout = blk;
    x.o.out_dtype = GemmOutDtype::kFP32;
    x.o.accumulate = true;
    x.y = nullptr;
    expect_throw_naming(x, "y");
  }
  {
    Args x;
    x.b.fast_scale_layout = blk;
    x.m_total = 0;
    EXPECT_NO_THROW(m_grouped_mxfp8_gemm_nt(x.a, x.m_total, x.b, x.E, x.n, x.k, x.offsets, x.y, x.o));
  }
  // how the block kernels read B's block bytes (read per call): "ldg" (default) or "tma"; a typo throws
  for (const char* load : {"ldg", "tma"}) {
    const ScopedEnv env("MXMOE_GEMM_BLOCK_SCALES_LOAD", load);
    Args x;
    x.b.fast_scale_layout = blk;
    x.y = nullptr;
    expect_throw_naming(x, "y");
  }
  {
    const ScopedEnv env("MXMOE_GEMM_BLOCK_SCALES_LOAD", "TMA");
    { Args x; x.b.fast_scale_layout = blk; expect_throw_naming(x, "MXMOE_GEMM_BLOCK_SCALES_LOAD"); }
    Args x;  // the 1x128 form does not read it
    EXPECT_NO_THROW(m_grouped_mxfp8_gemm_nt(x.a, 0, x.b, x.E, x.n, x.k, x.offsets, x.y, x.o));
  }
  // the EP row entry and the k-grouped GEMM: 1x128 scales only
  { Args x; x.b.fast_scale_layout = blk; expect_rows_throw_naming(x, reinterpret_cast<void* const*>(g_buf), "b.fast_scale_layout"); }
  { Args x; x.a.fast_scale_layout = blk; expect_k_throw_naming(x, "a.fast_scale_layout"); }
  { Args x; x.a.fast_scale_layout = blk; x.m_total = 0; expect_k_throw_naming(x, "a.fast_scale_layout"); }
  // the k-grouped GEMM's b (Xᵀ) may be in blocks: fast mode, not 128 wide; a valid call gets as far as dw
  { Args x; x.b.fast_scale_layout = blk; x.o.mode = GemmMode::kExact; expect_k_throw_naming(x, "b.fast_scale_layout"); }
  { Args x; x.b.fast_scale_layout = blk; x.o.fast_tile_n = 128; x.y = g_buf; expect_k_throw_naming(x, "opts.fast_tile_n"); }
  { Args x; x.b.fast_scale_layout = blk; x.y = nullptr; expect_k_throw_naming(x, "dw"); }
  try {  // the message says where the form is accepted
    Args x;
    x.a.fast_scale_layout = blk;
    m_grouped_mxfp8_gemm_nt(x.a, x.m_total, x.b, x.E, x.n, x.k, x.offsets, x.y, x.o);
    ADD_FAILURE() << "no exception for a kBlock128 operand a";
  } catch (const mxmoe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("accepted only for operand b"), std::string::npos) << e.what();
  }
}

}  // namespace
