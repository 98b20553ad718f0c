// Argument checks of the MoE element-wise/gather ops (before any CUDA call).
#include <gtest/gtest.h>

#include <cstdlib>

#include "common/arg_test_util.h"
#include "common/scoped_env.h"
#include "mxmoe/moe_ops.h"

using namespace mxmoe;
using mxmoe::test::expect_error_naming;
using mxmoe::test::fake;
using mxmoe::test::ScopedEnv;

TEST(MoeOpsArgs, SwigluRejectsBadArguments) {
  auto* gu = fake<const __nv_bfloat16>(0x10000);
  auto* h = fake<__nv_bfloat16>(0x20000);
  expect_error_naming([&] { moe_swiglu(gu, -1, 64, nullptr, h); }, "rows");
  expect_error_naming([&] { moe_swiglu(gu, 128, 60, nullptr, h); }, "inter");
  expect_error_naming([&] { moe_swiglu(nullptr, 128, 64, nullptr, h); }, "gu");
  expect_error_naming([&] { moe_swiglu(fake<const __nv_bfloat16>(0x10002), 128, 64, nullptr, h); }, "gu");
  expect_error_naming([&] { moe_swiglu(gu, 128, 64, nullptr, fake<__nv_bfloat16>(0x20008)); }, "h");
  expect_error_naming([&] { moe_swiglu(gu, 128, 64, fake<const int32_t>(0x30002), h); }, "rows_used");
}

TEST(MoeOpsArgs, CombineRejectsBadArguments) {
  auto* y = fake<const __nv_bfloat16>(0x10000);
  auto* rows = fake<const int32_t>(0x40000);
  auto* out = fake<__nv_bfloat16>(0x20000);
  expect_error_naming([&] { moe_combine(y, 256, 100, rows, nullptr, 10, 2, nullptr, out); }, "cols");
  expect_error_naming([&] { moe_combine(y, 256, 128, rows, nullptr, 10, 0, nullptr, out); }, "top_k");
  expect_error_naming([&] { moe_combine(y, 256, 128, rows, nullptr, -1, 2, nullptr, out); }, "tokens");
  expect_error_naming([&] { moe_combine(nullptr, 256, 128, rows, nullptr, 10, 2, nullptr, out); }, "y");
  expect_error_naming([&] { moe_combine(y, 256, 128, nullptr, nullptr, 10, 2, nullptr, out); }, "row_of");
  expect_error_naming([&] { moe_combine(y, 256, 128, rows, fake<const float>(0x50002), 10, 2, nullptr, out); }, "w");
  expect_error_naming([&] { moe_combine(y, 256, 128, rows, nullptr, 10, 2, fake<const float>(0x60004), out); },
                      "addend");
  expect_error_naming([&] { moe_combine(y, 256, 128, rows, nullptr, 10, 2, nullptr, nullptr); }, "out");
}

TEST(MoeOpsArgs, TopkRejectsBadArguments) {
  auto* logits = fake<const float>(0x10000);
  auto* ids = fake<int32_t>(0x20000);
  auto* w = fake<float>(0x30000);
  RouterParams rp;
  rp.top_k = 4;
  expect_error_naming([&] { moe_topk(logits, -1, 64, rp, ids, w); }, "tokens");
  expect_error_naming([&] { moe_topk(logits, 16, 0, rp, ids, w); }, "num_experts");
  expect_error_naming([&] { moe_topk(logits, 16, 1024, rp, ids, w); }, "num_experts");
  expect_error_naming([&] { moe_topk(nullptr, 16, 64, rp, ids, w); }, "logits");
  expect_error_naming([&] { moe_topk(logits, 16, 64, rp, nullptr, w); }, "topk_ids");
  expect_error_naming([&] { moe_topk(logits, 16, 64, rp, ids, fake<float>(0x30002)); }, "topk_weights");
  RouterParams bad = rp;
  bad.top_k = 65;
  expect_error_naming([&] { moe_topk(logits, 16, 64, bad, ids, w); }, "params.top_k");
  bad = rp;
  bad.n_groups = 8;  // softmax scoring has no groups
  expect_error_naming([&] { moe_topk(logits, 16, 64, bad, ids, w); }, "params.n_groups");
  bad.scoring = RouterScoring::kSigmoid;
  bad.n_groups = 7;  // does not divide 64
  expect_error_naming([&] { moe_topk(logits, 16, 64, bad, ids, w); }, "params.n_groups");
}

TEST(MoeOpsArgs, CombineBackwardRejectsBadArguments) {
  auto* dout = fake<const __nv_bfloat16>(0x10000);
  auto* y = fake<const __nv_bfloat16>(0x20000);
  auto* ri = fake<const int32_t>(0x30000);
  auto* ro = fake<const int32_t>(0x40000);
  auto* w = fake<const float>(0x50000);
  auto* dy = fake<__nv_bfloat16>(0x60000);
  auto* row_w = fake<float>(0x70000);
  auto* dw = fake<float>(0x80000);
  expect_error_naming([&] { moe_combine_backward(dout, y, -1, 128, nullptr, ri, ro, w, 10, 2, dy, dw); }, "rows");
  expect_error_naming([&] { moe_combine_backward(dout, y, 64, 100, nullptr, ri, ro, w, 10, 2, dy, dw); }, "cols");
  expect_error_naming([&] { moe_combine_backward(dout, y, 64, 128, nullptr, ri, ro, w, -1, 2, dy, dw); }, "tokens");
  expect_error_naming([&] { moe_combine_backward(dout, y, 64, 128, nullptr, ri, ro, w, 10, 33, dy, dw); }, "top_k");
  expect_error_naming([&] { moe_combine_backward(fake<const __nv_bfloat16>(0x10008), y, 64, 128, nullptr, ri, ro, w,
                                                 10, 2, dy, dw); }, "dout");
  expect_error_naming([&] { moe_combine_backward(dout, nullptr, 64, 128, nullptr, ri, ro, w, 10, 2, dy, dw); }, "y");
  expect_error_naming([&] { moe_combine_backward(dout, y, 64, 128, nullptr, nullptr, ro, w, 10, 2, dy, dw); },
                      "row_index");
  expect_error_naming([&] { moe_combine_backward(dout, y, 64, 128, nullptr, ri, ro, w, 10, 2, nullptr, dw); }, "dy");
  expect_error_naming([&] { moe_combine_backward_scales(dout, y, 64, 128, nullptr, ri, ro, w, 10, 2,
                                                        fake<float>(0x70002), dw); }, "row_w");
  expect_error_naming([&] { moe_combine_backward_scales(dout, y, 64, 128, fake<const int32_t>(0x90001), ri, ro, w, 10,
                                                        2, row_w, dw); }, "rows_used");
  // The kernel switch (read on every call): only unset, "tokens" or "rows"; a typo throws instead
  // of silently running the default.
  const ScopedEnv typo("MXMOE_COMBINE_BWD", "row");
  expect_error_naming([&] { moe_combine_backward(dout, y, 64, 128, nullptr, ri, ro, w, 10, 2, dy, dw); },
                      "MXMOE_COMBINE_BWD");
  expect_error_naming([&] { moe_combine_backward_scales(dout, y, 64, 128, nullptr, ri, ro, w, 10, 2, row_w, dw); },
                      "MXMOE_COMBINE_BWD");
}
