// Argument checks of the quantizers: every bad argument throws mxmoe::Error naming it, before any
// CUDA call (so these run on machines without a GPU). Pointers here are never dereferenced.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "common/arg_test_util.h"
#include "mxmoe/c_api.h"
#include "mxmoe/dequantize.h"
#include "mxmoe/quantize.h"

using namespace mxmoe;
using mxmoe::test::expect_error_naming;
using mxmoe::test::fake;

namespace {

const __nv_bfloat16* X = fake<const __nv_bfloat16>(0x10000);

MxOut good_out() {
  MxOut o;
  o.data = fake(0x20000);
  o.scales = fake(0x30000);
  return o;
}

}  // namespace

TEST(QuantizeArgs, DenseRejectsBadArguments) {
  const MxOut o = good_out();
  expect_error_naming([&] { quantize_mxfp8(nullptr, 1, 128, 128, &o, nullptr); }, "x");
  expect_error_naming([&] { quantize_mxfp8(fake<const __nv_bfloat16>(0x10002), 1, 128, 128, &o, nullptr); }, "x");
  expect_error_naming([&] { quantize_mxfp8(X, 1, 128, 100, &o, nullptr); }, "cols");
  expect_error_naming([&] { quantize_mxfp8(X, 1, 128, 2880 + 16, &o, nullptr); }, "cols");
  expect_error_naming([&] { quantize_mxfp8(X, 1, 0, 128, &o, nullptr); }, "rows");
  expect_error_naming([&] { quantize_mxfp8(X, 0, 128, 128, &o, nullptr); }, "batch");
  expect_error_naming([&] { quantize_mxfp8(X, 1, 100, 128, nullptr, &o); }, "rows");  // colwise: rows % 32
  expect_error_naming([&] { quantize_mxfp8(X, 1, 128, 128, nullptr, nullptr); }, "rowwise");
  expect_error_naming([&] { quantize_mxfp8(X, 1, 128, 128, &o, nullptr, ScaleMode(7)); }, "mode");
  MxOut bad = o;
  bad.data = fake(0x20008);
  expect_error_naming([&] { quantize_mxfp8(X, 1, 128, 128, &bad, nullptr); }, "rowwise.data");
  bad = o;
  bad.scales = nullptr;
  expect_error_naming([&] { quantize_mxfp8(X, 1, 128, 128, nullptr, &bad); }, "colwise.scales");
  bad = o;
  bad.fast_data = fake(0x40000);
  expect_error_naming([&] { quantize_mxfp8(X, 1, 128, 128, &bad, nullptr); }, "rowwise.fast_scales");
  bad.fast_data = fake(0x40004);
  bad.fast_scales = fake(0x50000);
  expect_error_naming([&] { quantize_mxfp8(X, 1, 128, 128, &bad, nullptr); }, "rowwise.fast_data");
  // Fast-only copies: the plain pair may be absent, but never half of it, and not both pairs.
  bad = MxOut{};
  expect_error_naming([&] { quantize_mxfp8(X, 1, 128, 128, &bad, nullptr); }, "rowwise.data");
  bad.fast_data = fake(0x40000);
  bad.fast_scales = fake(0x50000);
  bad.scales = fake(0x30000);
  expect_error_naming([&] { quantize_mxfp8(X, 1, 128, 128, nullptr, &bad); }, "colwise.data");
  bad.scales = nullptr;
  bad.data = fake(0x20000);
  expect_error_naming([&] { quantize_mxfp8(X, 1, 128, 128, nullptr, &bad); }, "colwise.scales");
  bad.data = nullptr;
  bad.fast_data = fake(0x40008);
  expect_error_naming([&] { quantize_mxfp8(X, 1, 128, 128, &bad, nullptr); }, "rowwise.fast_data");
}

TEST(QuantizeArgs, GroupedRejectsBadArguments) {
  const MxOut o = good_out();
  const int32_t* offs = fake<const int32_t>(0x60000);
  const int32_t* pad = fake<const int32_t>(0x70000);
  expect_error_naming([&] { quantize_mxfp8_grouped(X, 256, 96 + 8, offs, pad, 4, 512, &o, nullptr); }, "cols");
  expect_error_naming([&] { quantize_mxfp8_grouped(X, 256, 128, nullptr, pad, 4, 512, &o, nullptr); }, "offsets");
  expect_error_naming([&] { quantize_mxfp8_grouped(X, 256, 128, offs, nullptr, 4, 512, &o, nullptr); }, "padded_offsets");
  expect_error_naming([&] { quantize_mxfp8_grouped(X, 256, 128, offs, pad, 0, 512, &o, nullptr); }, "num_groups");
  expect_error_naming([&] { quantize_mxfp8_grouped(X, 256, 128, offs, pad, kMaxGroups + 1, 512, &o, nullptr); }, "num_groups");
  expect_error_naming([&] { quantize_mxfp8_grouped(X, 256, 128, offs, pad, 4, 500, &o, nullptr); }, "out_rows");
  expect_error_naming([&] { quantize_mxfp8_grouped(X, -1, 128, offs, pad, 4, 512, &o, nullptr); }, "x_rows");
  expect_error_naming([&] { quantize_mxfp8_grouped(X, 256, 128, offs, pad, 4, 512, nullptr, nullptr); }, "rowwise");
  expect_error_naming([&] { compute_padded_offsets(offs, nullptr, 4); }, "padded_offsets");
  expect_error_naming([&] { compute_padded_offsets(offs, fake<int32_t>(0x70000), 2000); }, "num_groups");
}

TEST(QuantizeArgs, GatherRejectsBadArguments) {
  const MxOut o = good_out();
  const int32_t* idx = fake<const int32_t>(0x60000);
  expect_error_naming([&] { quantize_mxfp8_gather(X, 256, 128, nullptr, 512, nullptr, &o, nullptr); }, "row_index");
  expect_error_naming([&] { quantize_mxfp8_gather(X, 256, 128, fake<const int32_t>(0x60002), 512, nullptr, &o, nullptr); },
                      "row_index");
  expect_error_naming([&] { quantize_mxfp8_gather(X, 256, 100, idx, 512, nullptr, &o, nullptr); }, "cols");
  expect_error_naming([&] { quantize_mxfp8_gather(X, 256, 128, idx, 200, nullptr, &o, nullptr); }, "out_rows");
  expect_error_naming([&] { quantize_mxfp8_gather(X, 256, 128, idx, 512, fake<const int32_t>(0x70001), &o, nullptr); },
                      "rows_used");
  expect_error_naming([&] { quantize_mxfp8_gather(X, 256, 128, idx, 512, nullptr, nullptr, nullptr); }, "rowwise");
  const float* sc = fake<const float>(0x80000);
  expect_error_naming([&] { quantize_mxfp8_gather_scaled(X, 256, 128, idx, nullptr, 512, nullptr, &o, nullptr); },
                      "row_scale");
  expect_error_naming([&] { quantize_mxfp8_gather_scaled(X, 256, 128, idx, fake<const float>(0x80002), 512, nullptr, &o,
                                                         nullptr); }, "row_scale");
  expect_error_naming([&] { quantize_mxfp8_gather_scaled(X, 256, 128, nullptr, sc, 512, nullptr, &o, nullptr); },
                      "row_index");
}

// MxOut::fast_blocks (the column-wise 128x128-block form): colwise only, the block form alone, and
// beside the row-wise fast form alone or no row-wise copy; every other mix is named, in all three
// row maps, before any CUDA call.
TEST(QuantizeArgs, ColumnBlockFormRejectsOtherMixes) {
  MxOut blk;
  blk.fast_data = fake(0x40000);
  blk.fast_scales = fake(0x50001);  // block scales need no alignment
  blk.fast_blocks = true;
  MxOut row_fast;
  row_fast.fast_data = fake(0x60000);
  row_fast.fast_scales = fake(0x70000);
  const MxOut plain = good_out();
  const int32_t* offs = fake<const int32_t>(0x80000);
  const int32_t* pad = fake<const int32_t>(0x90000);
  const int32_t* idx = fake<const int32_t>(0xA0000);
  const std::function<void(const MxOut*, const MxOut*)> calls[] = {
      [&](const MxOut* r, const MxOut* c) { quantize_mxfp8(X, 1, 256, 128, r, c); },
      [&](const MxOut* r, const MxOut* c) { quantize_mxfp8_grouped(X, 256, 128, offs, pad, 4, 512, r, c); },
      [&](const MxOut* r, const MxOut* c) { quantize_mxfp8_gather(X, 256, 128, idx, 512, nullptr, r, c); },
  };
  for (const auto& call : calls) {
    MxOut rb = row_fast;
    rb.fast_blocks = true;
    expect_error_naming([&] { call(&rb, nullptr); }, "rowwise.fast_blocks");
    expect_error_naming([&] { call(&rb, &blk); }, "rowwise.fast_blocks");
    MxOut both = blk;  // plain + block form in one copy
    both.data = plain.data;
    both.scales = plain.scales;
    expect_error_naming([&] { call(nullptr, &both); }, "colwise.data");
    MxOut only_plain = plain;  // fast_blocks without the fast pair
    only_plain.fast_blocks = true;
    expect_error_naming([&] { call(nullptr, &only_plain); }, "colwise.fast_data");
    expect_error_naming([&] { call(&plain, &blk); }, "rowwise.data");  // row-wise plain copy beside it
    MxOut row_both = row_fast;
    row_both.data = plain.data;
    row_both.scales = plain.scales;
    expect_error_naming([&] { call(&row_both, &blk); }, "rowwise.data");
    MxOut half = blk;
    half.fast_scales = nullptr;
    expect_error_naming([&] { call(&row_fast, &half); }, "colwise.fast_scales");
  }
  expect_error_naming([&] { quantize_mxfp8(X, 1, 100, 128, &row_fast, &blk); }, "rows");  // colwise: rows % 32
}

TEST(QuantizeArgs, MessageNamesFunctionArgumentAndValue) {
  const MxOut o = good_out();
  try {
    quantize_mxfp8(X, 1, 128, 100, &o, nullptr);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "mxmoe::quantize_mxfp8: argument 'cols' = 100: must be a positive multiple of 32 "
                           "(MX blocks run along it)");
  }
}

TEST(QuantizeArgs, DequantizeRejectsBadArguments) {
  const uint8_t* d = fake<const uint8_t>(0x20000);
  const uint8_t* s = fake<const uint8_t>(0x30001);  // scales need no alignment
  __nv_bfloat16* img = fake<__nv_bfloat16>(0x40000);
  expect_error_naming([&] { dequantize_mxfp8_bf16(d, s, 128, 100, img); }, "cols");
  expect_error_naming([&] { dequantize_mxfp8_bf16(d, s, 128, 0, img); }, "cols");
  expect_error_naming([&] { dequantize_mxfp8_bf16(d, s, -1, 128, img); }, "rows");
  expect_error_naming([&] { dequantize_mxfp8_bf16(d, s, int64_t(1) << 40, int64_t(1) << 30, img); }, "rows");
  expect_error_naming([&] { dequantize_mxfp8_bf16(nullptr, s, 128, 128, img); }, "data");
  expect_error_naming([&] { dequantize_mxfp8_bf16(fake<const uint8_t>(0x20008), s, 128, 128, img); }, "data");
  expect_error_naming([&] { dequantize_mxfp8_bf16(d, nullptr, 128, 128, img); }, "scales");
  expect_error_naming([&] { dequantize_mxfp8_bf16(d, s, 128, 128, nullptr); }, "image");
  expect_error_naming([&] { dequantize_mxfp8_bf16(d, s, 128, 128, fake<__nv_bfloat16>(0x40002)); }, "image");
  // rows == 0 is an empty tensor: checked, then nothing to do (no CUDA call, so no GPU needed).
  EXPECT_NO_THROW(dequantize_mxfp8_bf16(nullptr, nullptr, 0, 128, nullptr));
}

// The 128x128-block fast form (rebase_mxfp8_fast_block128): shapes, pointers, and block_scales
// overlapping scales, all before any launch.
TEST(QuantizeArgs, RebaseBlock128RejectsBadArguments) {
  const uint8_t* d = fake<const uint8_t>(0x20000);
  const uint8_t* s = fake<const uint8_t>(0x30001);  // scales need no alignment
  uint8_t* bd = fake<uint8_t>(0x40000);
  uint8_t* bs = fake<uint8_t>(0x50003);
  const auto f = [](auto... args) { rebase_mxfp8_fast_block128(args...); };
  expect_error_naming([&] { f(d, s, 2, 256, 100, bd, bs, nullptr); }, "cols");
  expect_error_naming([&] { f(d, s, 2, 256, 0, bd, bs, nullptr); }, "cols");
  expect_error_naming([&] { f(d, s, 0, 256, 128, bd, bs, nullptr); }, "batch");
  expect_error_naming([&] { f(d, s, 65536, 256, 128, bd, bs, nullptr); }, "batch");
  expect_error_naming([&] { f(d, s, 2, -1, 128, bd, bs, nullptr); }, "rows");
  expect_error_naming([&] { f(d, s, 1, int64_t(65536) * 128, 128, bd, bs, nullptr); }, "rows");
  expect_error_naming([&] { f(d, s, 64, int64_t(1) << 20, int64_t(1) << 37, bd, bs, nullptr); }, "rows");
  expect_error_naming([&] { f(nullptr, s, 2, 256, 128, bd, bs, nullptr); }, "data");
  expect_error_naming([&] { f(fake<const uint8_t>(0x20008), s, 2, 256, 128, bd, bs, nullptr); }, "data");
  expect_error_naming([&] { f(d, nullptr, 2, 256, 128, bd, bs, nullptr); }, "scales");
  expect_error_naming([&] { f(d, s, 2, 256, 128, nullptr, bs, nullptr); }, "block_data");
  expect_error_naming([&] { f(d, s, 2, 256, 128, fake<uint8_t>(0x40004), bs, nullptr); }, "block_data");
  expect_error_naming([&] { f(d, s, 2, 256, 128, bd, nullptr, nullptr); }, "block_scales");
  // scales span [0x30001, 0x30801) (2 · 256 rows · 4 blocks); block scales starting inside overlap them.
  expect_error_naming([&] { f(d, s, 2, 256, 128, bd, fake<uint8_t>(0x30801 - 16), nullptr); }, "block_scales");
  // rows == 0: nothing to do (no CUDA call).
  EXPECT_NO_THROW(f(nullptr, nullptr, 1, 0, 128, nullptr, nullptr, nullptr));
}

// quantize_mxfp8_block128: shapes, pointers, directions, before any launch.
TEST(QuantizeArgs, QuantizeBlock128RejectsBadArguments) {
  const MxBlockOut o{fake<uint8_t>(0x20000), fake<uint8_t>(0x30001)};
  const MxBlockOut bad_data{fake<uint8_t>(0x20008), fake<uint8_t>(0x30001)};
  const MxBlockOut no_scales{fake<uint8_t>(0x20000), nullptr};
  const auto f = [](auto... args) { quantize_mxfp8_block128(args...); };
  expect_error_naming([&] { f(X, 1, 128, 128, nullptr, nullptr, ScaleMode::kRceil, nullptr); }, "rowwise");
  expect_error_naming([&] { f(X, 1, 128, 100, &o, nullptr, ScaleMode::kRceil, nullptr); }, "cols");
  expect_error_naming([&] { f(X, 1, 0, 128, &o, nullptr, ScaleMode::kRceil, nullptr); }, "rows");
  expect_error_naming([&] { f(X, 1, 100, 128, nullptr, &o, ScaleMode::kRceil, nullptr); }, "rows");  // colwise: rows % 32
  expect_error_naming([&] { f(X, 0, 128, 128, &o, nullptr, ScaleMode::kRceil, nullptr); }, "batch");
  expect_error_naming([&] { f(X, 1, 128, 128, &o, nullptr, static_cast<ScaleMode>(7), nullptr); }, "mode");
  expect_error_naming([&] { f(nullptr, 1, 128, 128, &o, nullptr, ScaleMode::kRceil, nullptr); }, "x");
  expect_error_naming([&] { f(fake<const __nv_bfloat16>(0x10002), 1, 128, 128, &o, nullptr, ScaleMode::kRceil, nullptr); },
                      "x");
  expect_error_naming([&] { f(X, 1, 128, 128, &bad_data, nullptr, ScaleMode::kRceil, nullptr); }, "rowwise.data");
  expect_error_naming([&] { f(X, 1, 128, 128, &no_scales, nullptr, ScaleMode::kRceil, nullptr); }, "rowwise.scales");
  expect_error_naming([&] { f(X, 1, 128, 128, &o, &bad_data, ScaleMode::kRceil, nullptr); }, "colwise.data");
  expect_error_naming([&] { f(X, 1, 128, 128, &o, &no_scales, ScaleMode::kRceil, nullptr); }, "colwise.scales");
}

// The token-blocked image (ImageLayout::kTokenBlocked): the same checks, plus cols % 128 == 0 and
// rows · cols / 128 < 2^31 (the kernel's 32-bit group index).
TEST(QuantizeArgs, DequantizeTokenBlockedRejectsBadArguments) {
  const uint8_t* d = fake<const uint8_t>(0x20000);
  const uint8_t* s = fake<const uint8_t>(0x30001);
  __nv_bfloat16* img = fake<__nv_bfloat16>(0x40000);
  const auto f = [](auto... args) { dequantize_mxfp8_bf16_token_blocked(args...); };
  expect_error_naming([&] { f(d, s, 128, 100, img, nullptr); }, "cols");
  expect_error_naming([&] { f(d, s, 128, 96, img, nullptr); }, "cols");   // MX-valid, not a whole block
  expect_error_naming([&] { f(d, s, 128, 2880, img, nullptr); }, "cols");  // 2880 = 22.5 blocks
  expect_error_naming([&] { f(d, s, -1, 128, img, nullptr); }, "rows");
  expect_error_naming([&] { f(d, s, int64_t(1) << 24, int64_t(1) << 14, img, nullptr); }, "rows");  // 2^31 groups
  expect_error_naming([&] { f(nullptr, s, 128, 128, img, nullptr); }, "data");
  expect_error_naming([&] { f(fake<const uint8_t>(0x20008), s, 128, 128, img, nullptr); }, "data");
  expect_error_naming([&] { f(d, nullptr, 128, 128, img, nullptr); }, "scales");
  expect_error_naming([&] { f(d, s, 128, 128, nullptr, nullptr); }, "image");
  expect_error_naming([&] { f(d, s, 128, 128, fake<__nv_bfloat16>(0x40002), nullptr); }, "image");
  try {
    f(d, s, 4, 96, img, nullptr);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "mxmoe::dequantize_mxfp8_bf16_token_blocked: argument 'cols' = 96: must be a multiple "
                           "of 128 for the token-blocked layout (blocks of 128 columns)");
  }
  EXPECT_NO_THROW(f(nullptr, nullptr, 0, 128, nullptr, nullptr));
}

// The C ABI (ctypes callers: the benchmarks) asks for a copy when any of its four pointers is
// given, so a fast-only copy reaches the C++ checks: here with a misaligned fast_data, which must
// be named, not reported as a missing copy (before the fix, every fast-only call failed with
// "'rowwise' = null").
TEST(QuantizeArgs, CApiFastOnlyCopyReachesTheChecks) {
  void* fd_bad = fake(0x40004);
  void* fs = fake(0x50000);
  ASSERT_NE(mxmoe_quantize_mxfp8(X, 1, 128, 128, nullptr, nullptr, fd_bad, fs, nullptr, nullptr, nullptr,
                                 nullptr, 0, nullptr), 0);
  EXPECT_NE(std::string(mxmoe_last_error()).find("rowwise.fast_data"), std::string::npos) << mxmoe_last_error();
  ASSERT_NE(mxmoe_quantize_mxfp8(X, 1, 128, 128, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, fd_bad,
                                 fs, 0, nullptr), 0);
  EXPECT_NE(std::string(mxmoe_last_error()).find("colwise.fast_data"), std::string::npos) << mxmoe_last_error();
  ASSERT_NE(mxmoe_quantize_mxfp8_gather(X, 128, 128, fake<const int32_t>(0x60000), 128, nullptr, nullptr, nullptr,
                                        fd_bad, fs, nullptr, nullptr, nullptr, nullptr, 0, nullptr), 0);
  EXPECT_NE(std::string(mxmoe_last_error()).find("rowwise.fast_data"), std::string::npos) << mxmoe_last_error();
}
