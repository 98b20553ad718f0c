// MoeLayer configuration checks: thrown before any CUDA call, naming the field.
#include <gtest/gtest.h>

#include <string>

#include "common/arg_test_util.h"
#include "common/scoped_env.h"
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

// weight_fast_layout and activation_fast_layout (moe_layer.h): kBlock128 is a fast-mode form; a value
// outside the enum is named; each field by its own name, whatever the other one holds. EpMoeLayer's
// check_local runs the same checks with ep = true (its constructor needs an EpComm, so the checks
// themselves are tested here): kBlock128 is rejected in either mode, kRow128 passes.
TEST(MoeLayerArgs, RejectsBlockFormsInExactModeAndBadLayouts) {
  using Check = void (*)(const char*, GemmMode, FastScaleLayout, bool);
  const struct {
    FastScaleLayout MoeLayerConfig::*field;
    FastScaleLayout MoeLayerConfig::*other;
    const char* name;
    Check check;
  } fields[] = {
      {&MoeLayerConfig::weight_fast_layout, &MoeLayerConfig::activation_fast_layout, "cfg.weight_fast_layout",
       detail::check_weight_fast_layout},
      {&MoeLayerConfig::activation_fast_layout, &MoeLayerConfig::weight_fast_layout, "cfg.activation_fast_layout",
       detail::check_activation_fast_layout},
  };
  for (const auto& f : fields) {
    SCOPED_TRACE(f.name);
    MoeLayerConfig c = good_config();
    c.mode = GemmMode::kExact;
    c.*f.field = FastScaleLayout::kBlock128;
    expect_error_naming([&] { MoeLayer l(c); }, f.name);
    c.mode = GemmMode::kFast;
    c.*f.field = FastScaleLayout(7);
    expect_error_naming([&] { MoeLayer l(c); }, f.name);
    c.*f.other = FastScaleLayout::kBlock128;  // a legal other layout neither hides nor takes the blame
    expect_error_naming([&] { MoeLayer l(c); }, f.name);
    // The checks the constructors run (before any CUDA call): legal combinations pass.
    EXPECT_NO_THROW(f.check("MoeLayer", GemmMode::kFast, FastScaleLayout::kBlock128, false));
    EXPECT_NO_THROW(f.check("MoeLayer", GemmMode::kExact, FastScaleLayout::kRow128, false));
    for (GemmMode mode : {GemmMode::kFast, GemmMode::kExact})
      expect_error_naming([&] { f.check("EpMoeLayer", mode, FastScaleLayout::kBlock128, true); }, f.name);
    EXPECT_NO_THROW(f.check("EpMoeLayer", GemmMode::kFast, FastScaleLayout::kRow128, true));
  }
}

// The C ABI's weight_fast_layout and activation_fast_layout arguments reach the config
// (mxmoe_layer_create_ex), each to its own field.
TEST(MoeLayerArgs, CApiBlockFormsInExactModeFail) {
  void* h = nullptr;
  auto expect_fails_naming = [&](int mode, int weights, int activations, const char* field) {
    EXPECT_NE(mxmoe_layer_create_ex(2048, 768, 128, 8, 0, 1, 1, 1.0f, nullptr, mode, 1024, weights, activations, &h), 0);
    EXPECT_EQ(h, nullptr);
    EXPECT_NE(std::string(mxmoe_last_error()).find(field), std::string::npos) << mxmoe_last_error();
  };
  expect_fails_naming(1, 1, 0, "cfg.weight_fast_layout");
  expect_fails_naming(0, 3, 0, "cfg.weight_fast_layout");
  expect_fails_naming(1, 0, 1, "cfg.activation_fast_layout");
  expect_fails_naming(0, 0, 3, "cfg.activation_fast_layout");
}

// MXMOE_QUANT_COL_BLOCK (read on every call by ExpertBlock::direct_col_blocks): how a layer with
// activation blocks makes x_col and h_col's block form. Unset, empty or "direct": the quantizer
// writes it (act_col_out gives the block-form fast pair, MxOut::fast_blocks); "rebase": the plain
// pair, which rebase_in_place turns into it; anything else throws naming the variable. Without
// activation blocks the variable is not read (a bad value does not throw) and the plain/fast
// output is as before.
TEST(MoeLayerArgs, ColumnBlockSwitchIsReadPerCallAndChecked) {
  using mxmoe::test::ScopedEnv;
  detail::ExpertBlock blk;
  detail::MxBuf b;
  b.data = b.fast = mxmoe::test::fake(0x1000);
  b.scales = mxmoe::test::fake(0x2000);
  b.fast_scales = mxmoe::test::fake(0x3000);
  b.fast_layout = FastScaleLayout::kBlock128;
  {
    const ScopedEnv env("MXMOE_QUANT_COL_BLOCK", "bogus");
    EXPECT_FALSE(blk.direct_col_blocks());  // kRow128 activations: not read
  }
  blk.activation_layout = FastScaleLayout::kBlock128;
  for (const char* v : {"", "direct"}) {
    const ScopedEnv env("MXMOE_QUANT_COL_BLOCK", v);
    EXPECT_TRUE(blk.direct_col_blocks()) << "'" << v << "'";
  }
  {
    const ScopedEnv env("MXMOE_QUANT_COL_BLOCK", "rebase");
    EXPECT_FALSE(blk.direct_col_blocks());
  }
  for (const char* v : {"bogus", "Direct", "1"}) {
    const ScopedEnv env("MXMOE_QUANT_COL_BLOCK", v);
    expect_error_naming([&] { (void)blk.direct_col_blocks(); }, "MXMOE_QUANT_COL_BLOCK");
  }
  const MxOut direct = detail::ExpertBlock::act_col_out(b, true), plain = detail::ExpertBlock::act_col_out(b, false);
  EXPECT_TRUE(direct.fast_blocks);
  EXPECT_EQ(direct.data, nullptr);
  EXPECT_EQ(direct.scales, nullptr);
  EXPECT_EQ(direct.fast_data, b.fast);
  EXPECT_EQ(direct.fast_scales, b.fast_scales);
  EXPECT_FALSE(plain.fast_blocks);
  EXPECT_EQ(plain.data, b.data);
  EXPECT_EQ(plain.scales, b.scales);
  EXPECT_EQ(plain.fast_data, nullptr);
}
