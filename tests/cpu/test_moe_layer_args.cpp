// MoeLayer configuration checks: thrown before any CUDA call, naming the field.
#include <gtest/gtest.h>

#include <string>

#include "common/arg_test_util.h"
#include "host/moe_expert_block.h"
#include "mxmoe/c_api.h"
#include "mxmoe/moe_layer.h"

using namespace mxmoe;
using mxmoe::test::expect_error_naming;

namespace {
MoeLayerConfig good_config() {  // Qwen3-30B-A3B's expert shape
  MoeLayerConfig c;
  c.hidden = 2048;
  c.inter = 768;
  c.num_experts = 128;
  c.routing.top_k = 8;
  c.max_tokens = 1024;
  return c;
}
}  // namespace

TEST(MoeLayerArgs, RejectsBadConfiguration) {
  const MoeLayerConfig good = good_config();
  auto with = [&](auto f) {
    MoeLayerConfig c = good;
    f(c);
    return c;
  };
  expect_error_naming([&] { MoeLayer l(with([](MoeLayerConfig& c) { c.hidden = 100; })); }, "cfg.hidden");
  expect_error_naming([&] { MoeLayer l(with([](MoeLayerConfig& c) { c.inter = 0; })); }, "cfg.inter");
  expect_error_naming([&] { MoeLayer l(with([](MoeLayerConfig& c) { c.num_experts = 1000; })); }, "cfg.num_experts");
  expect_error_naming([&] { MoeLayer l(with([](MoeLayerConfig& c) { c.routing.top_k = 0; })); }, "cfg.routing.top_k");
  expect_error_naming([&] { MoeLayer l(with([](MoeLayerConfig& c) { c.max_tokens = 0; })); }, "cfg.max_tokens");
  expect_error_naming([&] { MoeLayer l(with([](MoeLayerConfig& c) { c.mode = GemmMode(5); })); }, "cfg.mode");
}

// weight_fast_layout (moe_layer.h): kBlock128 is a fast-mode form; a value outside the enum is named.
TEST(MoeLayerArgs, RejectsBlockWeightsInExactModeAndBadLayouts) {
  MoeLayerConfig c = good_config();
  c.mode = GemmMode::kExact;
  c.weight_fast_layout = FastScaleLayout::kBlock128;
  expect_error_naming([&] { MoeLayer l(c); }, "cfg.weight_fast_layout");
  c.mode = GemmMode::kFast;
  c.weight_fast_layout = FastScaleLayout(7);
  expect_error_naming([&] { MoeLayer l(c); }, "cfg.weight_fast_layout");
  // The check the constructors run (before any CUDA call): legal combinations pass.
  EXPECT_NO_THROW(detail::check_weight_fast_layout("MoeLayer", GemmMode::kFast, FastScaleLayout::kBlock128, false));
  EXPECT_NO_THROW(detail::check_weight_fast_layout("MoeLayer", GemmMode::kExact, FastScaleLayout::kRow128, false));
}

// EpMoeLayer's check_local runs the same check with ep = true (its constructor needs an EpComm, so
// the check itself is tested here): kBlock128 is rejected in either mode, kRow128 passes.
TEST(MoeLayerArgs, EpLayerRejectsBlockWeights) {
  expect_error_naming(
      [] { detail::check_weight_fast_layout("EpMoeLayer", GemmMode::kFast, FastScaleLayout::kBlock128, true); },
      "cfg.weight_fast_layout");
  expect_error_naming(
      [] { detail::check_weight_fast_layout("EpMoeLayer", GemmMode::kExact, FastScaleLayout::kBlock128, true); },
      "cfg.weight_fast_layout");
  EXPECT_NO_THROW(detail::check_weight_fast_layout("EpMoeLayer", GemmMode::kFast, FastScaleLayout::kRow128, true));
}

// The C ABI's weight_fast_layout argument reaches the config (mxmoe_layer_create_ex).
TEST(MoeLayerArgs, CApiBlockWeightsInExactModeFails) {
  void* h = nullptr;
  EXPECT_NE(mxmoe_layer_create_ex(2048, 768, 128, 8, 0, 1, 1, 1.0f, nullptr, 1, 1024, 1, &h), 0);
  EXPECT_EQ(h, nullptr);
  EXPECT_NE(std::string(mxmoe_last_error()).find("cfg.weight_fast_layout"), std::string::npos) << mxmoe_last_error();
  EXPECT_NE(mxmoe_layer_create_ex(2048, 768, 128, 8, 0, 1, 1, 1.0f, nullptr, 0, 1024, 3, &h), 0);
  EXPECT_NE(std::string(mxmoe_last_error()).find("cfg.weight_fast_layout"), std::string::npos) << mxmoe_last_error();
}
