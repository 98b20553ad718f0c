// quantize_mxfp8_block128 (include/mxmoe/quantize.h) on the GPU, bit for bit against the CPU
// reference of what it replaces: ref::rebase_fast_block128 of ref::quantize_rows (row-wise) and of
// ref::quantize_cols per matrix (column-wise). Data: the test families (incl. kSpecial: 448·2^k
// values, ±0, BF16 subnormals, E4M3 ties, a wide exponent range) with NaN and ±Inf sprinkled in (a
// block holding one is poisoned whole), whole and partial tiles, both scale modes, one and both
// directions (the same bytes either way). Output buffers are poisoned first, with guards behind them.
// Every case runs on both kernels (MXMOE_QUANT_BLOCK128_KERNEL=pipelined, the default, and simple).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/gpu_test_util.h"
#include "common/scoped_env.h"
#include "mxmoe/mx_format.h"
#include "mxmoe/quantize.h"
#include "ref/mx_ref.h"

using namespace mxmoe;
using namespace mxmoe::test;

namespace {

constexpr size_t kGuard = 64;
constexpr const char* kKernels[] = {"pipelined", "simple"};  // MXMOE_QUANT_BLOCK128_KERNEL

struct Want {
  ref::FastBlockMatrix row, col;
};

// The reference of both directions for x [batch, rows, cols].
Want reference(const std::vector<uint16_t>& x, int64_t batch, int64_t rows, int64_t cols, ScaleMode mode, bool col) {
  Want w;
  w.row = ref::rebase_fast_block128(ref::quantize_rows(x.data(), batch * rows, cols, mode), batch);
  if (col) {
    ref::MxMatrix c;
    c.rows = batch * cols;
    c.cols = rows;
    for (int64_t b = 0; b < batch; ++b) {
      const ref::MxMatrix m = ref::quantize_cols(x.data() + b * rows * cols, rows, cols, mode);
      c.data.insert(c.data.end(), m.data.begin(), m.data.end());
      c.scales.insert(c.scales.end(), m.scales.begin(), m.scales.end());
    }
    w.col = ref::rebase_fast_block128(c, batch);
  }
  return w;
}

void expect_bytes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, const std::string& what) {
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i] && bad++ == 0) first = int64_t(i);
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.size() << " bytes differ; first at " << first
                    << ": got 0x" << std::hex << (first >= 0 ? int(got[size_t(first)]) : 0) << ", want 0x"
                    << (first >= 0 ? int(want[size_t(first)]) : 0) << std::dec << " (seed " << fresh_seed() << ")";
  for (size_t i = want.size(); i < got.size(); ++i) ASSERT_EQ(got[i], 0xEE) << what << ": wrote past the output";
}

// Runs quantize_mxfp8_block128 with the directions asked for on each kernel and compares every output
// byte with the reference; reruns: a second call into re-poisoned buffers must give the same bytes.
void run_and_check(const std::vector<uint16_t>& x, int64_t batch, int64_t rows, int64_t cols, ScaleMode mode,
                   bool row, bool col, const std::string& what, bool reruns = false) {
  const Want w = reference(x, batch, rows, cols, mode, col);
  DevBuf<uint16_t> dx(x.size());
  dx.upload(x);
  for (const char* kernel : kKernels) {
    const ScopedEnv env("MXMOE_QUANT_BLOCK128_KERNEL", kernel);
    const std::string on = what + " [" + kernel + "]";
    DevBuf<uint8_t> rd(w.row.data.size() + kGuard, 0xEE), rs(w.row.scales.size() + kGuard, 0xEE);
    DevBuf<uint8_t> cd(col ? w.col.data.size() + kGuard : 1, 0xEE), cs(col ? w.col.scales.size() + kGuard : 1, 0xEE);
    const MxBlockOut ro{rd.p, rs.p}, co{cd.p, cs.p};
    std::vector<std::vector<uint8_t>> first;
    for (int run = 0; run < (reruns ? 2 : 1); ++run) {
      if (run > 0) {
        for (DevBuf<uint8_t>* b : {&rd, &rs, &cd, &cs}) ASSERT_EQ(cudaMemset(b->p, 0xEE, b->n), cudaSuccess);
      }
      quantize_mxfp8_block128(reinterpret_cast<const __nv_bfloat16*>(dx.p), batch, rows, cols, row ? &ro : nullptr,
                              col ? &co : nullptr, mode);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << on << ": " << cudaGetErrorString(cudaGetLastError());
      std::vector<std::vector<uint8_t>> got = {rd.download(), rs.download(), cd.download(), cs.download()};
      if (run > 0) {
        EXPECT_TRUE(got == first) << on << ": a rerun differs";
        continue;
      }
      if (row) {
        expect_bytes(got[0], w.row.data, on + " row-wise data");
        expect_bytes(got[1], w.row.scales, on + " row-wise scales");
      }
      if (col) {
        expect_bytes(got[2], w.col.data, on + " column-wise data");
        expect_bytes(got[3], w.col.scales, on + " column-wise scales");
      }
      first = std::move(got);
    }
  }
}

std::vector<uint16_t> data(int64_t n_rows, int64_t cols, Dist d, std::mt19937& rng, bool specials) {
  std::vector<uint16_t> x = random_bf16(n_rows, cols, d, rng);
  if (specials) {  // a NaN and a -Inf somewhere: their 128x128 blocks are poisoned in both directions
    std::uniform_int_distribution<size_t> pick(0, x.size() - 1);
    x[pick(rng)] = 0x7FC0;
    x[pick(rng)] = 0xFF80;
  }
  return x;
}

class QuantizeBlock128Gpu : public ::testing::Test {
 protected:
  void SetUp() override { rng_.seed(fresh_seed()); }
  std::mt19937 rng_;
};

TEST_F(QuantizeBlock128Gpu, MatchesQuantizeThenRebase) {
  MXMOE_REQUIRE_GPU();
  SCOPED_TRACE(::testing::Message() << "seed " << fresh_seed());
  struct Case { int64_t batch, rows, cols; Dist d; bool specials; };
  const Case cases[] = {
      {3, 320, 384, Dist::kGaussian, true},        // whole and partial tiles (320 = 2.5 tiles)
      {2, 128, 2880, Dist::kHeavyTailed, false},   // K = 2880: the last column tile 64 wide
      {4, 96, 160, Dist::kSpecial, true},          // one partial tile each way
      {1, 256, 256, Dist::kOutlierChannels, false},
      {2, 2048, 1024, Dist::kGaussian, false},     // many tiles, pitch 16
      {1, 2176, 128, Dist::kSpecial, false},       // pitch 32 (17 row blocks)
  };
  for (const Case& c : cases)
    for (ScaleMode mode : {ScaleMode::kRceil, ScaleMode::kFloor}) {
      const std::vector<uint16_t> x = data(c.batch * c.rows, c.cols, c.d, rng_, c.specials);
      const std::string what = std::to_string(c.batch) + " x " + std::to_string(c.rows) + " x " +
                               std::to_string(c.cols) + " " + dist_name(c.d) +
                               (mode == ScaleMode::kRceil ? " rceil" : " floor");
      run_and_check(x, c.batch, c.rows, c.cols, mode, true, true, what + " (both)");
      run_and_check(x, c.batch, c.rows, c.cols, mode, true, false, what + " (row-wise alone)");
      run_and_check(x, c.batch, c.rows, c.cols, mode, false, true, what + " (column-wise alone)");
    }
}

// Row-wise alone needs no rows % 32 == 0.
TEST_F(QuantizeBlock128Gpu, RowWiseAnyRowCount) {
  MXMOE_REQUIRE_GPU();
  SCOPED_TRACE(::testing::Message() << "seed " << fresh_seed());
  const std::vector<uint16_t> x = data(2 * 201, 256, Dist::kGaussian, rng_, true);
  run_and_check(x, 2, 201, 256, ScaleMode::kRceil, true, false, "2 x 201 x 256 row-wise");
}

// Shapes with many tiles per CTA of the persistent pipelined kernel (every ring stage, staging slice
// and max-word parity reused many times; 2 x 4096 x 7168 = 3584 tiles, ~27 a CTA on 132 SMs), K = 2880
// (the last column tile 64 wide: the right load box is skipped) and partial row tiles, NaN/Inf blocks;
// each call twice, bitwise identical.
TEST_F(QuantizeBlock128Gpu, ManyTilesPerCta) {
  MXMOE_REQUIRE_GPU();
  SCOPED_TRACE(::testing::Message() << "seed " << fresh_seed());
  {
    const std::vector<uint16_t> x = data(3 * 992, 2880, Dist::kGaussian, rng_, true);
    run_and_check(x, 3, 992, 2880, ScaleMode::kRceil, true, true, "3 x 992 x 2880 (both)", true);
    run_and_check(x, 3, 992, 2880, ScaleMode::kFloor, false, true, "3 x 992 x 2880 floor (column-wise alone)", true);
  }
  {
    const std::vector<uint16_t> x = data(3 * 1000, 2880, Dist::kHeavyTailed, rng_, true);
    run_and_check(x, 3, 1000, 2880, ScaleMode::kRceil, true, false, "3 x 1000 x 2880 (row-wise alone)", true);
  }
  {
    const std::vector<uint16_t> x = data(2 * 4096, 7168, Dist::kOutlierChannels, rng_, true);
    run_and_check(x, 2, 4096, 7168, ScaleMode::kRceil, true, true, "2 x 4096 x 7168 (both)", true);
  }
}

// MXMOE_QUANT_BLOCK128_KERNEL takes pipelined or simple; anything else throws naming the variable.
TEST_F(QuantizeBlock128Gpu, KernelSwitchRejectsBadValues) {
  MXMOE_REQUIRE_GPU();
  DevBuf<uint16_t> dx(128 * 128);
  DevBuf<uint8_t> rd(128 * 128), rs(16);
  const MxBlockOut ro{rd.p, rs.p};
  const ScopedEnv env("MXMOE_QUANT_BLOCK128_KERNEL", "fast");
  try {
    quantize_mxfp8_block128(reinterpret_cast<const __nv_bfloat16*>(dx.p), 1, 128, 128, &ro, nullptr);
    FAIL() << "no error for MXMOE_QUANT_BLOCK128_KERNEL=fast";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MXMOE_QUANT_BLOCK128_KERNEL"), std::string::npos) << e.what();
  }
}

}  // namespace
