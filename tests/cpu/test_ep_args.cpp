// Argument checks of the expert-parallel config (include/mxmoe/ep.h) and the window layout. Pure
// host code (ep_check_config runs before any CUDA or NCCL call in EpComm's constructors).
#include <gtest/gtest.h>

#include "common/arg_test_util.h"
#include "mxmoe/ep.h"

using namespace mxmoe;
using mxmoe::test::expect_error_naming;

namespace {

EpConfig good() {
  EpConfig c;
  c.hidden = 7168;
  c.top_k = 8;
  c.num_experts = 256;
  c.max_tokens = 4096;
  c.num_ctas = 32;
  c.timeout_s = 10.0;
  return c;
}

}  // namespace

TEST(EpArgs, AcceptsGoodConfigs) {
  EXPECT_NO_THROW(ep_check_config(good(), 0, 1));
  EXPECT_NO_THROW(ep_check_config(good(), 1, 2));
  EXPECT_NO_THROW(ep_check_config(good(), 7, 8));
  EpConfig c = good();
  c.hidden = 32;
  c.top_k = 1;
  c.num_experts = 1;
  c.max_tokens = 1;
  c.num_ctas = 1;
  EXPECT_NO_THROW(ep_check_config(c, 0, 1));
}

TEST(EpArgs, RejectsBadWorldAndRank) {
  expect_error_naming([] { ep_check_config(good(), 0, 0); }, "world_size");
  expect_error_naming([] { ep_check_config(good(), 0, kMaxEpRanks + 1); }, "world_size");
  expect_error_naming([] { ep_check_config(good(), -1, 2); }, "rank");
  expect_error_naming([] { ep_check_config(good(), 2, 2); }, "rank");
}

TEST(EpArgs, RejectsExpertsNotDivisibleByRanks) {
  EpConfig c = good();
  c.num_experts = 250;
  expect_error_naming([&] { ep_check_config(c, 0, 8); }, "cfg.num_experts");
  c.num_experts = 9;
  c.top_k = 2;
  expect_error_naming([&] { ep_check_config(c, 1, 2); }, "cfg.num_experts");
  EXPECT_NO_THROW(ep_check_config(c, 0, 3));
}

TEST(EpArgs, RejectsBadShapes) {
  EpConfig c = good();
  c.hidden = 100;
  expect_error_naming([&] { ep_check_config(c, 0, 2); }, "cfg.hidden");
  c = good();
  c.hidden = 0;
  expect_error_naming([&] { ep_check_config(c, 0, 2); }, "cfg.hidden");
  c = good();
  c.top_k = 0;
  expect_error_naming([&] { ep_check_config(c, 0, 2); }, "cfg.top_k");
  c.top_k = 33;
  expect_error_naming([&] { ep_check_config(c, 0, 2); }, "cfg.top_k");
  c = good();
  c.num_experts = 4;
  c.top_k = 8;  // k > E
  expect_error_naming([&] { ep_check_config(c, 0, 2); }, "cfg.top_k");
  c = good();
  c.num_experts = 0;
  expect_error_naming([&] { ep_check_config(c, 0, 1); }, "cfg.num_experts");
  c.num_experts = kMaxEpExperts + 2;
  expect_error_naming([&] { ep_check_config(c, 0, 2); }, "cfg.num_experts");
  c = good();
  c.max_tokens = 0;
  expect_error_naming([&] { ep_check_config(c, 0, 2); }, "cfg.max_tokens");
  c.max_tokens = int64_t(1) << 29;  // 8 ranks · 2^29 · 8 slots overflows int32
  expect_error_naming([&] { ep_check_config(c, 0, 8); }, "cfg.max_tokens");
  c = good();
  c.num_ctas = -1;
  expect_error_naming([&] { ep_check_config(c, 0, 2); }, "cfg.num_ctas");
  c.num_ctas = 0;  // one per SM, resolved by EpComm
  ep_check_config(c, 0, 2);
  c.num_ctas = kMaxEpCtas + 1;
  expect_error_naming([&] { ep_check_config(c, 0, 2); }, "cfg.num_ctas");
  c = good();
  c.timeout_s = 0.0;
  expect_error_naming([&] { ep_check_config(c, 0, 2); }, "cfg.timeout_s");
  c.timeout_s = -1.0;
  expect_error_naming([&] { ep_check_config(c, 0, 2); }, "cfg.timeout_s");
  expect_error_naming([&] { ep_window_layout(c, 2); }, "cfg.timeout_s");
}

TEST(EpArgs, WindowLayoutIsTheWorstCase) {
  const EpConfig c = good();
  const EpWindowLayout l = ep_window_layout(c, 8);
  EXPECT_EQ(l.data_bytes, 7168);
  EXPECT_EQ(l.scale_bytes, 224);  // 7168/32 = 224, already a multiple of 16
  EXPECT_EQ(l.ids_bytes, 32);     // 8 int32
  EXPECT_EQ(l.record_bytes, 7168 + 224 + 32);
  EXPECT_EQ(l.record_bytes % 16, 0);
  EXPECT_EQ(l.dispatch_bytes, 8 * 4096 * l.record_bytes);  // every token of every rank lands here
  EXPECT_EQ(l.combine_offset % 4096, 0);
  EXPECT_GE(l.combine_offset, l.dispatch_bytes);
  EXPECT_EQ(l.combine_bytes, 4096LL * 8 * 7168 * 2);
  EXPECT_EQ(l.total_bytes % 4096, 0);
  EXPECT_GE(l.total_bytes, l.combine_offset + l.combine_bytes);
  // Odd sizes: H/32 = 3 scale bytes and k = 1 still give 16-byte records.
  EpConfig s = c;
  s.hidden = 96;
  s.top_k = 1;
  s.num_experts = 2;
  const EpWindowLayout m = ep_window_layout(s, 2);
  EXPECT_EQ(m.scale_bytes, 16);
  EXPECT_EQ(m.ids_bytes, 16);
  EXPECT_EQ(m.record_bytes, 96 + 16 + 16);
  // MX rows are about half of BF16 rows.
  EXPECT_LT(double(l.data_bytes + l.scale_bytes) / (2.0 * c.hidden), 0.52);
}

TEST(EpArgs, Bf16RowRegionsComeAfterTheCombineRegion) {
  EpConfig c = good();
  const EpWindowLayout plain = ep_window_layout(c, 8);
  EXPECT_EQ(plain.bf16_bytes, 0);
  EXPECT_EQ(plain.weights_bytes, 0);
  c.bf16_rows = true;
  const EpWindowLayout l = ep_window_layout(c, 8);
  // The MX and combine regions do not move.
  EXPECT_EQ(l.dispatch_offset, plain.dispatch_offset);
  EXPECT_EQ(l.combine_offset, plain.combine_offset);
  EXPECT_EQ(l.combine_bytes, plain.combine_bytes);
  EXPECT_EQ(l.bf16_offset % 4096, 0);
  EXPECT_GE(l.bf16_offset, l.combine_offset + l.combine_bytes);
  EXPECT_EQ(l.bf16_bytes, 8LL * 4096 * 7168 * 2);  // one BF16 row per (source rank, token)
  EXPECT_EQ(l.weights_offset % 4096, 0);
  EXPECT_GE(l.weights_offset, l.bf16_offset + l.bf16_bytes);
  EXPECT_EQ(l.weights_bytes, 8LL * 4096 * 8 * 4);
  EXPECT_EQ(l.total_bytes % 4096, 0);
  EXPECT_GE(l.total_bytes, l.weights_offset + l.weights_bytes);
}
