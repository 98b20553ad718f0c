// rebase_mxfp8_fast_block128 (include/mxmoe/quantize.h) on the GPU, bit for bit against the CPU
// reference ref::rebase_fast_block128 (src/ref/mx_ref.cpp; its rule is checked in
// tests/cpu/test_mx_format.cpp), data and scales including the pitch's zero padding. Inputs are
// random MX copies with NaN scales and all-zero blocks sprinkled in, and real quantizer output; the
// output buffers are poisoned first and have guard regions that must stay untouched.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "common/gpu_test_util.h"
#include "mxmoe/mx_format.h"
#include "mxmoe/quantize.h"
#include "ref/mx_ref.h"

using namespace mxmoe;
using namespace mxmoe::test;

namespace {

constexpr size_t kGuard = 64;  // bytes after each output that must keep the poison

// A random MX copy of [batch · rows, cols]: codes over the whole byte range except the NaN codes
// 0x7F / 0xFF (the quantizers write those only into NaN-scaled blocks, which are poisoned whole),
// scales in [lo, hi]; then a few blocks with scale 0 and zero codes (all-zero blocks) and, when
// nan_blocks, a few NaN scales.
ref::MxMatrix random_mx(int64_t rows, int64_t cols, std::mt19937& rng, int lo, int hi, bool nan_blocks) {
  ref::MxMatrix m;
  m.rows = rows;
  m.cols = cols;
  m.data.resize(size_t(rows * cols));
  m.scales.resize(size_t(rows * cols / kMxBlock));
  std::uniform_int_distribution<int> code(0, 255), sc(lo, hi);
  for (auto& v : m.data) {
    v = uint8_t(code(rng));
    if ((v & 0x7F) == 0x7F) v ^= 1;
  }
  for (auto& v : m.scales) v = uint8_t(sc(rng));
  std::uniform_int_distribution<size_t> pick(0, m.scales.size() - 1);
  for (int i = 0; i < 6; ++i) {
    const size_t b = pick(rng);
    m.scales[b] = 0;
    std::fill_n(m.data.begin() + int64_t(b) * kMxBlock, kMxBlock, uint8_t(0));
  }
  if (nan_blocks)
    for (int i = 0; i < 2; ++i) m.scales[pick(rng)] = kE8M0Nan;
  return m;
}

// Runs the kernel on m (batch matrices of m.rows / batch rows) and compares every output byte.
void expect_rebase_matches(const ref::MxMatrix& m, int64_t batch, const std::string& what) {
  const ref::FastBlockMatrix want = ref::rebase_fast_block128(m, batch);
  DevBuf<uint8_t> data(m.data.size()), scales(m.scales.size());
  data.upload(m.data);
  scales.upload(m.scales);
  DevBuf<uint8_t> bdata(want.data.size() + kGuard, 0xEE), bscales(want.scales.size() + kGuard, 0xEE);
  rebase_mxfp8_fast_block128(data.p, scales.p, batch, want.rows, m.cols, bdata.p, bscales.p);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  const std::vector<uint8_t> gd = bdata.download(), gs = bscales.download();
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < want.data.size(); ++i)
    if (gd[i] != want.data[i] && bad++ == 0) first = int64_t(i);
  if (bad)
    ADD_FAILURE() << what << ": " << bad << " of " << want.data.size() << " data bytes differ; first at [" << first / m.cols
                  << ", " << first % m.cols << "]: got 0x" << std::hex << int(gd[size_t(first)]) << ", want 0x"
                  << int(want.data[size_t(first)]) << std::dec << " (seed " << fresh_seed() << ")";
  bad = 0;
  for (size_t i = 0; i < want.scales.size(); ++i)
    if (gs[i] != want.scales[i] && bad++ == 0) first = int64_t(i);
  if (bad)
    ADD_FAILURE() << what << ": " << bad << " of " << want.scales.size() << " block-scale bytes differ; first at "
                  << first << " ([matrix·chunk " << first / want.pitch << "][" << first % want.pitch << "]): got 0x"
                  << std::hex << int(gs[size_t(first)]) << ", want 0x" << int(want.scales[size_t(first)]) << std::dec;
  for (size_t i = want.data.size(); i < gd.size(); ++i) ASSERT_EQ(gd[i], 0xEE) << what << ": wrote past block_data";
  for (size_t i = want.scales.size(); i < gs.size(); ++i) ASSERT_EQ(gs[i], 0xEE) << what << ": wrote past block_scales";
}

class RebaseBlockGpu : public ::testing::Test {
 protected:
  void SetUp() override { rng_.seed(fresh_seed()); }
  std::mt19937 rng_;
};

// Random codes under random scales over the whole byte range (so exponent gaps beyond 2^-126 flush
// to zero; scale 0xFF included), NaN-poisoned and all-zero blocks, in shapes whose last row block is short (rows % 128
// != 0), whose last chunk is short (cols = 2880, 96), a single row, a pitch above 16, and many blocks.
TEST_F(RebaseBlockGpu, RandomCodesAndScales) {
  MXMOE_REQUIRE_GPU();
  SCOPED_TRACE(::testing::Message() << "seed " << fresh_seed());
  expect_rebase_matches(random_mx(3 * 200, 2880, rng_, 0, 255, true), 3, "3 x 200 x 2880, all scales");
  expect_rebase_matches(random_mx(2 * 128, 128, rng_, 0, 255, true), 2, "2 x 128 x 128");
  expect_rebase_matches(random_mx(1, 96, rng_, 0, 255, false), 1, "1 x 1 x 96");
  expect_rebase_matches(random_mx(5 * 33, 64, rng_, 100, 140, true), 5, "5 x 33 x 64");
  expect_rebase_matches(random_mx(2 * 2100, 256, rng_, 110, 135, false), 2, "2 x 2100 x 256 (pitch 32)");
  // Many blocks (1024: more than the SMs hold at once).
  expect_rebase_matches(random_mx(8 * 1000, 2048, rng_, 100, 150, true), 8, "8 x 1000 x 2048 (1024 blocks)");
}

// Real weights: the reference quantizer's MX copy of heavy-tailed and outlier-channel data at a
// model-like shape (typical scales), both directions, in place (block_data = data) too.
TEST_F(RebaseBlockGpu, QuantizedWeightsBothDirectionsAndInPlace) {
  MXMOE_REQUIRE_GPU();
  SCOPED_TRACE(::testing::Message() << "seed " << fresh_seed());
  const int64_t E = 3, N = 384, K = 640;
  for (Dist d : {Dist::kHeavyTailed, Dist::kOutlierChannels}) {
    const std::vector<uint16_t> x = random_bf16(E * N, K, d, rng_);
    ref::MxMatrix row, col;  // [E·N, K] and [E·K, N] (per expert the transpose)
    row.rows = E * N;
    row.cols = K;
    col.rows = E * K;
    col.cols = N;
    for (int64_t e = 0; e < E; ++e) {
      const ref::MxMatrix r = ref::quantize_rows(x.data() + e * N * K, N, K, ScaleMode::kRceil);
      const ref::MxMatrix c = ref::quantize_cols(x.data() + e * N * K, N, K, ScaleMode::kRceil);
      row.data.insert(row.data.end(), r.data.begin(), r.data.end());
      row.scales.insert(row.scales.end(), r.scales.begin(), r.scales.end());
      col.data.insert(col.data.end(), c.data.begin(), c.data.end());
      col.scales.insert(col.scales.end(), c.scales.begin(), c.scales.end());
    }
    expect_rebase_matches(row, E, std::string(dist_name(d)) + " row-wise");
    expect_rebase_matches(col, E, std::string(dist_name(d)) + " column-wise");
    // In place: the output over the input's own data buffer.
    const ref::FastBlockMatrix want = ref::rebase_fast_block128(row, E);
    DevBuf<uint8_t> data(row.data.size()), scales(row.scales.size()), bs(want.scales.size());
    data.upload(row.data);
    scales.upload(row.scales);
    rebase_mxfp8_fast_block128(data.p, scales.p, E, N, K, data.p, bs.p);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(data.download() == want.data) << dist_name(d) << ": in place differs";
    EXPECT_TRUE(bs.download() == want.scales) << dist_name(d) << ": in place scales differ";
  }
}

}  // namespace
