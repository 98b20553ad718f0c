// dequantize_mxfp8_bf16 (include/mxmoe/dequantize.h) on the GPU, bit for bit against the CPU
// reference ref::dequantize_bf16 (src/ref/mx_ref.cpp, written from the format definitions; the
// reference itself is checked exhaustively in tests/cpu/test_mx_format.cpp). The output buffer is
// poisoned first and has a guard region behind the tensor that must stay untouched.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/gpu_test_util.h"
#include "mxmoe/dequantize.h"
#include "ref/mx_ref.h"

using namespace mxmoe;
using namespace mxmoe::test;

namespace {

constexpr size_t kGuard = 64;  // BF16 elements after the image that must keep the poison

// Runs the kernel on m (scales uploaded at byte offset scale_off, to test unaligned scales) and
// compares every image bit with the reference; the guard after the image must be untouched.
void expect_image_matches(const ref::MxMatrix& m, const char* what, size_t scale_off = 0) {
  DevBuf<uint8_t> data(m.data.size()), scales(m.scales.size() + scale_off);
  data.upload(m.data);
  std::vector<uint8_t> sh(scale_off, 0);
  sh.insert(sh.end(), m.scales.begin(), m.scales.end());
  scales.upload(sh);
  DevBuf<uint16_t> img(m.data.size() + kGuard, 0xEE);
  dequantize_mxfp8_bf16(data.p, scales.p + scale_off, m.rows, m.cols,
                        reinterpret_cast<__nv_bfloat16*>(img.p));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  const std::vector<uint16_t> got = img.download(), want = ref::dequantize_bf16(m);
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i] && bad++ == 0) first = int64_t(i);
  if (bad) {
    const int64_t r = first / m.cols, c = first % m.cols;
    ADD_FAILURE() << what << ": " << bad << " of " << want.size() << " image elements differ; first at ["
                  << r << ", " << c << "]: code 0x" << std::hex << int(m.data[size_t(first)]) << " scale 0x"
                  << int(m.scales[size_t(r * (m.cols / 32) + c / 32)]) << ": got 0x" << got[size_t(first)]
                  << ", want 0x" << want[size_t(first)] << std::dec << " (seed " << fresh_seed() << ")";
  }
  for (size_t i = want.size(); i < got.size(); ++i)
    ASSERT_EQ(got[i], 0xEEEE) << what << ": wrote past the image at element " << i;
}

// The token-blocked image (dequantize_mxfp8_bf16_token_blocked) against ref::token_blocked of the
// reference image, bit for bit, with the same guard.
void expect_blocked_image_matches(const ref::MxMatrix& m, const char* what) {
  DevBuf<uint8_t> data(m.data.size()), scales(m.scales.size());
  data.upload(m.data);
  scales.upload(m.scales);
  DevBuf<uint16_t> img(m.data.size() + kGuard, 0xEE);
  dequantize_mxfp8_bf16_token_blocked(data.p, scales.p, m.rows, m.cols, reinterpret_cast<__nv_bfloat16*>(img.p));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  const std::vector<uint16_t> got = img.download();
  const std::vector<uint16_t> want = ref::token_blocked(ref::dequantize_bf16(m), m.rows, m.cols);
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i] && bad++ == 0) first = int64_t(i);
  if (bad) {
    const int64_t b = first / (m.rows * 128), r = (first / 128) % m.rows, c = b * 128 + first % 128;
    ADD_FAILURE() << what << ": " << bad << " of " << want.size() << " blocked image elements differ; first at "
                  << "offset " << first << " = element [" << r << ", " << c << "]: got 0x" << std::hex
                  << got[size_t(first)] << ", want 0x" << want[size_t(first)] << std::dec << " (seed "
                  << fresh_seed() << ")";
  }
  for (size_t i = want.size(); i < got.size(); ++i)
    ASSERT_EQ(got[i], 0xEEEE) << what << ": wrote past the image at element " << i;
}

ref::MxMatrix random_mx(int64_t rows, int64_t cols, std::mt19937& rng, int scale_lo, int scale_hi) {
  ref::MxMatrix m;
  m.rows = rows;
  m.cols = cols;
  m.data.resize(size_t(rows * cols));
  m.scales.resize(size_t(rows * cols / 32));
  std::uniform_int_distribution<int> code(0, 255), sc(scale_lo, scale_hi);
  for (auto& v : m.data) v = uint8_t(code(rng));
  for (auto& v : m.scales) v = uint8_t(sc(rng));
  return m;
}

class DequantizeGpu : public ::testing::Test {
 protected:
  void SetUp() override { rng_.seed(fresh_seed()); }
  std::mt19937 rng_;
};

// Every E4M3 code (incl. ±0 and both NaNs) under the edge scales: 2^-127 (0x00, zero blocks and
// pads), 0x01, 0x02 (rounded: below the exact range), the exact range's limits 0x03 and 0xF6, 2^0,
// 0xF7 (overflows 256..448), 0xFE (2^127) and NaN (0xFF).
TEST_F(DequantizeGpu, AllCodesAtEdgeScales) {
  MXMOE_REQUIRE_GPU();
  SCOPED_TRACE(::testing::Message() << "seed " << fresh_seed());
  const uint8_t edges[] = {0x00, 0x01, 0x02, kBF16ExactScaleMin, 0x7F, kBF16ExactScaleMax, 0xF7, 0xFE, 0xFF};
  ref::MxMatrix m;  // one row per edge scale: the 256 codes (8 blocks), all blocks at that scale
  m.rows = int64_t(sizeof(edges));
  m.cols = 256;
  for (uint8_t s : edges) {
    for (int c = 0; c < 256; ++c) m.data.push_back(uint8_t(c));
    for (int b = 0; b < 8; ++b) m.scales.push_back(s);
  }
  expect_image_matches(m, "all codes x edge scales");
}

// Random codes (NaNs included) under random scales over the whole byte range, in shapes with odd
// row counts, one block per row, K = 2880 and a tensor large enough for the grid-stride loop to wrap.
TEST_F(DequantizeGpu, RandomCodesAndScales) {
  MXMOE_REQUIRE_GPU();
  SCOPED_TRACE(::testing::Message() << "seed " << fresh_seed());
  expect_image_matches(random_mx(7, 32, rng_, 0, 255), "7 x 32");
  expect_image_matches(random_mx(33, 2880, rng_, 0, 255), "33 x 2880");
  expect_image_matches(random_mx(1, 96, rng_, 0, 255), "1 x 96");
  expect_image_matches(random_mx(4099, 4096, rng_, 100, 150), "4099 x 4096 (typical scales)");
}

// Scales need no alignment (the GEMM's callers pass slices of scale arrays).
TEST_F(DequantizeGpu, UnalignedScales) {
  MXMOE_REQUIRE_GPU();
  SCOPED_TRACE(::testing::Message() << "seed " << fresh_seed());
  expect_image_matches(random_mx(64, 640, rng_, 0, 255), "scales at +1 byte", 1);
  expect_image_matches(random_mx(5, 160, rng_, 0, 255), "scales at +7 bytes", 7);
}

// The image of real quantizer output (reference quantizer, RCEIL, heavy-tailed and special data):
// every scale byte it produces for these is inside the exact range, so the image equals deq exactly.
TEST_F(DequantizeGpu, QuantizedDataIsExact) {
  MXMOE_REQUIRE_GPU();
  SCOPED_TRACE(::testing::Message() << "seed " << fresh_seed());
  for (Dist d : {Dist::kHeavyTailed, Dist::kSpecial}) {
    const std::vector<uint16_t> x = random_bf16(96, 512, d, rng_);
    const ref::MxMatrix m = ref::quantize_rows(x.data(), 96, 512, ScaleMode::kRceil);
    expect_image_matches(m, dist_name(d));
    const std::vector<uint16_t> img = ref::dequantize_bf16(m);
    const std::vector<double> deq = ref::dequantize(m);
    for (size_t i = 0; i < deq.size(); ++i) {
      const uint8_t s = m.scales[i / 32];
      if (s < kBF16ExactScaleMin || s > kBF16ExactScaleMax) continue;
      ASSERT_EQ(double(ref::bf16_to_float(img[i])), deq[i]) << dist_name(d) << " element " << i;
    }
  }
}

// Token-blocked layout: every code at the edge scales (9 rows, 2 blocks of 128), random codes and
// scales in shapes with one block per row, odd row counts, N = 2880 rows, and one large enough for
// the grid-stride loop to wrap (4099 x 4096: 32 blocks per row); rows == 0 does nothing.
TEST_F(DequantizeGpu, TokenBlockedMatchesReference) {
  MXMOE_REQUIRE_GPU();
  SCOPED_TRACE(::testing::Message() << "seed " << fresh_seed());
  {
    const uint8_t edges[] = {0x00, 0x01, 0x02, kBF16ExactScaleMin, 0x7F, kBF16ExactScaleMax, 0xF7, 0xFE, 0xFF};
    ref::MxMatrix m;
    m.rows = int64_t(sizeof(edges));
    m.cols = 256;
    for (uint8_t s : edges) {
      for (int c = 0; c < 256; ++c) m.data.push_back(uint8_t(c));
      for (int b = 0; b < 8; ++b) m.scales.push_back(s);
    }
    expect_blocked_image_matches(m, "all codes x edge scales, blocked");
  }
  expect_blocked_image_matches(random_mx(7, 128, rng_, 0, 255), "7 x 128 blocked");
  expect_blocked_image_matches(random_mx(1, 384, rng_, 0, 255), "1 x 384 blocked");
  expect_blocked_image_matches(random_mx(2880, 640, rng_, 100, 150), "2880 x 640 blocked");
  expect_blocked_image_matches(random_mx(33, 2944, rng_, 0, 255), "33 x 2944 blocked");
  expect_blocked_image_matches(random_mx(4099, 4096, rng_, 100, 150), "4099 x 4096 blocked");
  EXPECT_NO_THROW(dequantize_mxfp8_bf16_token_blocked(nullptr, nullptr, 0, 128, nullptr));
}

}  // namespace
