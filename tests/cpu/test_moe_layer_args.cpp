// MoeLayer configuration checks: thrown before any CUDA call, naming the field.
#include <gtest/gtest.h>

#include "common/arg_test_util.h"
#include "mxmoe/moe_layer.h"

using namespace mxmoe;
using mxmoe::test::expect_error_naming;

TEST(MoeLayerArgs, RejectsBadConfiguration) {
  MoeLayerConfig good;
  good.hidden = 2048;
  good.inter = 768;
  good.num_experts = 128;
  good.routing.top_k = 8;
  good.max_tokens = 1024;
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
