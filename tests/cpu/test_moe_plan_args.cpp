// Argument checks of moe_plan (before any CUDA call) and the capacity rule.
#include <gtest/gtest.h>

#include <string>

#include "common/arg_test_util.h"
#include "mxmoe/moe_plan.h"

using namespace mxmoe;
using mxmoe::test::expect_error_naming;
using mxmoe::test::fake;

namespace {

MoePlan good_plan() {
  MoePlan p;
  p.counts = fake<int32_t>(0x1000);
  p.offsets = fake<int32_t>(0x2000);
  p.padded_offsets = fake<int32_t>(0x3000);
  p.row_of = fake<int32_t>(0x4000);
  p.row_index = fake<int32_t>(0x5000);
  return p;
}

}  // namespace

TEST(MoePlanArgs, CapacityIsTheWorstCase) {
  EXPECT_EQ(moe_plan_capacity(16384, 8, 128), (16384 * 8 + 128 * 127 + 127) / 128 * 128);
  EXPECT_EQ(moe_plan_capacity(0, 8, 4), 512);
  EXPECT_EQ(moe_plan_capacity(1, 1, 1), 128);
}

TEST(MoePlanArgs, RejectsBadArguments) {
  const MoePlan p = good_plan();
  const int32_t* ids = fake<const int32_t>(0x9000);
  void* ws = fake<void>(0xA000);
  const int64_t cap = moe_plan_capacity(100, 4, 16);
  const size_t wsb = moe_plan_workspace_bytes(100, 4, 16);
  expect_error_naming([&] { moe_plan(ids, -1, 4, 16, cap, ws, wsb, p); }, "tokens");
  expect_error_naming([&] { moe_plan(ids, 100, 0, 16, cap, ws, wsb, p); }, "top_k");
  expect_error_naming([&] { moe_plan(ids, 100, 17, 16, cap, ws, wsb, p); }, "top_k");
  expect_error_naming([&] { moe_plan(ids, 100, 4, 0, cap, ws, wsb, p); }, "num_experts");
  expect_error_naming([&] { moe_plan(ids, 100, 4, 2000, cap, ws, wsb, p); }, "num_experts");
  expect_error_naming([&] { moe_plan(nullptr, 100, 4, 16, cap, ws, wsb, p); }, "ids");
  expect_error_naming([&] { moe_plan(fake<const int32_t>(0x9002), 100, 4, 16, cap, ws, wsb, p); }, "ids");
  expect_error_naming([&] { moe_plan(ids, 100, 4, 16, cap - 128, ws, wsb, p); }, "capacity");
  expect_error_naming([&] { moe_plan(ids, 100, 4, 16, cap + 1, ws, wsb, p); }, "capacity");
  expect_error_naming([&] { moe_plan(ids, 100, 4, 16, cap, nullptr, wsb, p); }, "workspace");
  expect_error_naming([&] { moe_plan(ids, 100, 4, 16, cap, ws, wsb - 4, p); }, "workspace_bytes");
  MoePlan bad = p;
  bad.row_index = nullptr;
  expect_error_naming([&] { moe_plan(ids, 100, 4, 16, cap, ws, wsb, bad); }, "plan.row_index");
  bad = p;
  bad.padded_offsets = fake<int32_t>(0x3002);
  expect_error_naming([&] { moe_plan(ids, 100, 4, 16, cap, ws, wsb, bad); }, "plan.padded_offsets");
}
