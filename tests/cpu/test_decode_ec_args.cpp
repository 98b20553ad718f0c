// Argument checks of the expert-centric decode step, the dispatcher and moe_gather_rows
// (include/mxmoe/decode.h, moe_ops.h): every bad argument throws, naming it, before any CUDA call
// (fake device pointers are never dereferenced). The shape is Qwen3-30B-like with a shared expert.
#include <gtest/gtest.h>

#include "common/arg_test_util.h"
#include "mxmoe/decode.h"
#include "mxmoe/moe_ops.h"

using namespace mxmoe;
using mxmoe::test::expect_error_naming;
using mxmoe::test::fake;

namespace {

constexpr int kH = 2048, kI = 768, kE = 128, kK = 8, kB = 64;

DecodeWeights bf16_weights(uintptr_t base) {
  DecodeWeights w;
  w.dtype = DecodeWeightDtype::kBF16;
  w.data = fake<const void>(base);
  w.shared_data = fake<const void>(base + 0x100000);
  return w;
}

DecodeWeights mx_weights(uintptr_t base) {
  DecodeWeights w;
  w.dtype = DecodeWeightDtype::kMXFP8;
  w.data = fake<const void>(base);
  w.scales = fake<const uint8_t>(base + 0x100000);
  w.shared_data = fake<const void>(base + 0x200000);
  w.shared_scales = fake<const uint8_t>(base + 0x300000);
  w.prepared = fake<const void>(base + 0x400000);
  return w;
}

struct Args {
  const __nv_bfloat16* x = fake<const __nv_bfloat16>(0x1000000);
  const int32_t* ids = fake<const int32_t>(0x2000000);
  const float* wts = fake<const float>(0x3000000);
  __nv_bfloat16* out = fake<__nv_bfloat16>(0x4000000);
  void* ws = fake<void>(0x5000000);
  size_t ws_bytes = size_t(1) << 40;
  DecodeWeights w1 = bf16_weights(0x10000000), w2 = bf16_weights(0x20000000);

  void run(int batch = kB, int hidden = kH, int inter = kI, int experts = kE, int top_k = kK) const {
    decode_expert_centric(x, batch, hidden, inter, w1, w2, experts, ids, wts, top_k, out, ws, ws_bytes);
  }
};

}  // namespace

TEST(DecodeExpertCentricArgs, RejectsBadArguments) {
  for (bool mx : {false, true}) {
    SCOPED_TRACE(mx ? "mxfp8" : "bf16");
    Args a;
    if (mx) {
      a.w1 = mx_weights(0x10000000);
      a.w2 = mx_weights(0x20000000);
    }
    expect_error_naming([&] { Args b = a; b.x = nullptr; b.run(); }, "x");
    expect_error_naming([&] { Args b = a; b.x = fake<const __nv_bfloat16>(0x1000008); b.run(); }, "x");
    expect_error_naming([&] { a.run(0); }, "batch");
    expect_error_naming([&] { a.run(kDecodeMaxBatch + 1); }, "batch");
    expect_error_naming([&] { a.run(kB, 2056); }, "hidden");  // multiple of 8, not of 32
    expect_error_naming([&] { a.run(kB, kH, 776); }, "inter");
    expect_error_naming([&] { a.run(kB, kH, kI, 0); }, "num_experts");
    expect_error_naming([&] { a.run(kB, kH, kI, kDecodeMaxExperts + 1); }, "num_experts");
    expect_error_naming([&] { a.run(kB, kH, kI, kE, 0); }, "top_k");
    expect_error_naming([&] { a.run(kB, kH, kI, 4, 5); }, "top_k");
    expect_error_naming([&] { Args b = a; b.w1.data = nullptr; b.run(); }, "w1.data");
    expect_error_naming([&] { Args b = a; b.w2.data = fake<const void>(0x20000004); b.run(); }, "w2.data");
    expect_error_naming([&] { Args b = a; b.w2.shared_data = nullptr; b.w2.shared_scales = nullptr; b.run(); },
                        "w2.shared_data");
    expect_error_naming([&] { Args b = a; b.ids = nullptr; b.run(); }, "topk_ids");
    expect_error_naming([&] { Args b = a; b.wts = fake<const float>(0x3000002); b.run(); }, "topk_weights");
    expect_error_naming([&] { Args b = a; b.out = fake<__nv_bfloat16>(0x4000004); b.run(); }, "out");
    expect_error_naming([&] { Args b = a; b.ws = nullptr; b.run(); }, "workspace");
    expect_error_naming([&] { Args b = a; b.ws = fake<void>(0x5000080); b.run(); }, "workspace");
    expect_error_naming([&] { Args b = a; b.ws_bytes = 4096; b.run(); }, "workspace_bytes");
    if (mx) {
      expect_error_naming([&] { Args b = a; b.w1.prepared = nullptr; b.run(); }, "w1.prepared");
      expect_error_naming([&] { Args b = a; b.w2.prepared = fake<const void>(0x20400010); b.run(); }, "w2.prepared");
      expect_error_naming([&] { Args b = a; b.w1.scales = nullptr; b.run(); }, "w1.scales");
      expect_error_naming([&] { Args b = a; b.w2.dtype = DecodeWeightDtype::kBF16; b.w2.scales = nullptr;
                                b.w2.shared_scales = nullptr; b.w2.prepared = nullptr; b.run(); },
                          "w2.dtype");
    } else {
      expect_error_naming([&] { Args b = a; b.w1.prepared = fake<const void>(0x30000000); b.run(); }, "w1.prepared");
    }
  }
}

TEST(DecodeExpertCentricArgs, WorkspaceGrowsWithBatchAndServesSmallerOnes) {
  for (DecodeWeightDtype d : {DecodeWeightDtype::kBF16, DecodeWeightDtype::kMXFP8}) {
    size_t prev = 0;
    for (int b : {1, 7, 64, 200}) {
      const size_t n = decode_expert_centric_workspace_bytes(b, kH, kI, kE, kK, true, d);
      EXPECT_GT(n, prev) << "batch " << b;
      EXPECT_EQ(n % 256, 0u);
      prev = n;
    }
  }
  // One byte less than batch 7 needs is rejected (the GPU tests run with workspaces sized for a
  // larger batch than the call's).
  Args a;
  a.ws_bytes = decode_expert_centric_workspace_bytes(7, kH, kI, kE, kK, true, DecodeWeightDtype::kBF16) - 1;
  expect_error_naming([&] { a.run(7); }, "workspace_bytes");
  expect_error_naming([] { decode_expert_centric_workspace_bytes(0, kH, kI, kE, kK, false, DecodeWeightDtype::kBF16); },
                      "batch");
  expect_error_naming([] { decode_expert_centric_workspace_bytes(8, kH, 100, kE, kK, false, DecodeWeightDtype::kBF16); },
                      "inter");
  expect_error_naming(
      [] { decode_expert_centric_workspace_bytes(8, kH, kI, kE, kK, false, static_cast<DecodeWeightDtype>(2)); },
      "dtype");
}

TEST(DecodeExpertCentricArgs, PrepareRejectsBadArguments) {
  const DecodeWeights w = mx_weights(0x10000000);
  void* prep = fake<void>(0x40000000);
  const size_t need = decode_prepared_weights_bytes(kE, 2 * kI, kH, true);
  EXPECT_GE(need, size_t(kE) * 2 * kI * kH + size_t(kE) * (kH / 128) * 2 * kI);
  EXPECT_GT(need, decode_prepared_weights_bytes(kE, 2 * kI, kH, false));
  expect_error_naming([&] { decode_prepare_weights(bf16_weights(0x10000000), kE, 2 * kI, kH, prep, need); }, "w.dtype");
  expect_error_naming([&] { decode_prepare_weights(w, kE, 2 * kI, kH, nullptr, need); }, "prepared");
  expect_error_naming([&] { decode_prepare_weights(w, kE, 2 * kI, kH, fake<void>(0x40000010), need); }, "prepared");
  expect_error_naming([&] { decode_prepare_weights(w, kE, 2 * kI, kH, prep, need - 1); }, "prepared_bytes");
  expect_error_naming([&] { decode_prepare_weights(w, kE, 2 * kI, 2056, prep, need); }, "k");
  expect_error_naming([&] { decode_prepare_weights(w, kE, 40, kH, prep, need); }, "n");
  expect_error_naming([&] { decode_prepare_weights(w, 0, 2 * kI, kH, prep, need); }, "num_experts");
  DecodeWeights bad = w;
  bad.scales = nullptr;
  expect_error_naming([&] { decode_prepare_weights(bad, kE, 2 * kI, kH, prep, need); }, "w.scales");
}

TEST(DecodeStepArgs, RejectsBadArgumentsBeforeAnyLaunch) {
  DecodeShape s{kH, kI, kE, kK, true};
  RouterParams rp;
  rp.top_k = kK;
  const auto* x = fake<const __nv_bfloat16>(0x1000000);
  const auto* wr = fake<const __nv_bfloat16>(0x6000000);
  auto* ids = fake<int32_t>(0x2000000);
  auto* wts = fake<float>(0x3000000);
  auto* out = fake<__nv_bfloat16>(0x4000000);
  void* ws = fake<void>(0x5000000);
  const DecodeWeights w1 = bf16_weights(0x10000000), w2 = bf16_weights(0x20000000);
  const size_t big = size_t(1) << 40;
  // The router's and both paths' checks run first, at a warp-decode batch (1) and an
  // expert-centric one (100), so nothing is launched with a bad argument on either side.
  for (int b : {1, 100}) {
    SCOPED_TRACE(b);
    expect_error_naming([&] { decode_step(x, b, s, nullptr, rp, w1, w2, ids, wts, out, ws, big); }, "router_w");
    expect_error_naming([&] { decode_step(x, b, s, wr, rp, w1, w2, ids, wts, out, ws, 1024); }, "workspace_bytes");
    expect_error_naming([&] { decode_step(x, b, s, wr, rp, w1, w2, ids, wts, out, fake<void>(0x5000010), big); },
                        "workspace");
    RouterParams bad = rp;
    bad.top_k = 4;
    expect_error_naming([&] { decode_step(x, b, s, wr, bad, w1, w2, ids, wts, out, ws, big); }, "params.top_k");
    bad = rp;
    bad.n_groups = 4;  // softmax: no groups
    expect_error_naming([&] { decode_step(x, b, s, wr, bad, w1, w2, ids, wts, out, ws, big); }, "params.n_groups");
    DecodeShape no_shared = s;
    no_shared.shared_expert = false;
    expect_error_naming([&] { decode_step(x, b, no_shared, wr, rp, w1, w2, ids, wts, out, ws, big); },
                        "shape.shared_expert");
    DecodeShape odd = s;
    odd.inter = 776;  // fine for BF16 warp decode, not for the GEMMs: rejected at every batch
    expect_error_naming([&] { decode_step(x, b, odd, wr, rp, w1, w2, ids, wts, out, ws, big); }, "inter");
    DecodeWeights mx1 = mx_weights(0x10000000), mx2 = mx_weights(0x20000000);
    mx2.prepared = nullptr;  // MXFP8 needs the prepared form even where warp decode would run
    expect_error_naming([&] { decode_step(x, b, s, wr, rp, mx1, mx2, ids, wts, out, ws, big); }, "w2.prepared");
  }
  EXPECT_GE(decode_step_workspace_bytes(s, DecodeWeightDtype::kBF16, 8),
            size_t(8) * (kK + 1) * kI * sizeof(float));  // warp decode's FP32 h fits too
}

TEST(MoeOpsArgs, GatherRowsRejectsBadArguments) {
  auto* x = fake<const __nv_bfloat16>(0x10000);
  auto* idx = fake<const int32_t>(0x40000);
  auto* out = fake<__nv_bfloat16>(0x20000);
  expect_error_naming([&] { moe_gather_rows(x, -1, 128, idx, 256, nullptr, out); }, "x_rows");
  expect_error_naming([&] { moe_gather_rows(x, 8, 100, idx, 256, nullptr, out); }, "cols");
  expect_error_naming([&] { moe_gather_rows(x, 8, 128, idx, -128, nullptr, out); }, "out_rows");
  expect_error_naming([&] { moe_gather_rows(nullptr, 8, 128, idx, 256, nullptr, out); }, "x");
  expect_error_naming([&] { moe_gather_rows(x, 8, 128, nullptr, 256, nullptr, out); }, "row_index");
  expect_error_naming([&] { moe_gather_rows(x, 8, 128, idx, 256, fake<const int32_t>(0x30002), out); }, "rows_used");
  expect_error_naming([&] { moe_gather_rows(x, 8, 128, idx, 256, nullptr, fake<__nv_bfloat16>(0x20008)); }, "out");
}
