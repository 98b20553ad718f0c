// Routing plan on the GPU against a host stable counting sort, bit for bit: uniform and skewed
// routing, empty experts, one expert taking everything, invalid ids, k = 1 and 8, T not a
// multiple of anything; reruns identical.
#include <gtest/gtest.h>

#include <algorithm>

#include "common/gpu_test_util.h"
#include "mxmoe/moe_plan.h"

using namespace mxmoe;
using namespace mxmoe::test;

namespace {

struct HostPlan {
  std::vector<int32_t> counts, offsets, padded, row_of, row_index;
};

HostPlan host_plan(const std::vector<int32_t>& ids, int64_t T, int k, int E, int64_t cap) {
  HostPlan h;
  h.counts.assign(size_t(E), 0);
  for (int32_t e : ids)
    if (e >= 0 && e < E) ++h.counts[size_t(e)];
  h.offsets.assign(size_t(E) + 1, 0);
  h.padded.assign(size_t(E) + 1, 0);
  for (int e = 0; e < E; ++e) {
    h.offsets[size_t(e) + 1] = h.offsets[size_t(e)] + h.counts[size_t(e)];
    h.padded[size_t(e) + 1] = h.padded[size_t(e)] + (h.counts[size_t(e)] + 127) / 128 * 128;
  }
  h.row_of.assign(ids.size(), -1);
  h.row_index.assign(size_t(cap), -1);
  std::vector<int32_t> next(h.padded.begin(), h.padded.end() - 1);
  for (int64_t i = 0; i < T * k; ++i) {  // stable: in (token, slot) order
    const int32_t e = ids[size_t(i)];
    if (e < 0 || e >= E) continue;
    const int32_t row = next[size_t(e)]++;
    h.row_of[size_t(i)] = row;
    h.row_index[size_t(row)] = int32_t(i / k);
  }
  return h;
}

void run_case(const char* what, std::vector<int32_t> ids, int64_t T, int k, int E) {
  SCOPED_TRACE(std::string(what) + " T=" + std::to_string(T) + " k=" + std::to_string(k) + " E=" + std::to_string(E));
  const int64_t cap = moe_plan_capacity(T, k, E);
  const HostPlan want = host_plan(ids, T, k, E, cap);
  const size_t n_items = std::max<size_t>(ids.size(), 1), n_e = static_cast<size_t>(E);
  DevBuf<int32_t> dids{n_items}, counts{n_e}, offs{n_e + 1}, pad{n_e + 1}, row_of{n_items},
      row_index{static_cast<size_t>(cap)};
  if (!ids.empty()) dids.upload(ids);
  const size_t wsb = moe_plan_workspace_bytes(T, k, E);
  DevBuf<uint8_t> ws{std::max<size_t>(wsb, 4)};
  MoePlan p{counts.p, offs.p, pad.p, row_of.p, row_index.p};
  for (int rep = 0; rep < 2; ++rep) {
    moe_plan(dids.p, T, k, E, cap, ws.p, wsb, p);
    MXMOE_ASSERT_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(counts.download(), want.counts);
    EXPECT_EQ(offs.download(), want.offsets);
    EXPECT_EQ(pad.download(), want.padded);
    auto ro = row_of.download();
    ro.resize(ids.size());
    EXPECT_EQ(ro, want.row_of);
    EXPECT_EQ(row_index.download(), want.row_index);
  }
}

std::vector<int32_t> topk_ids(int64_t T, int k, int E, bool skewed, std::mt19937& rng) {
  std::vector<int32_t> ids(size_t(T * k));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> pick;
    while (int(pick.size()) < k) {  // k distinct experts per token, as a router would give
      int32_t e = skewed && rng() % 4 != 0 ? int32_t(rng() % std::min(E, 3)) : int32_t(rng() % E);
      if (std::find(pick.begin(), pick.end(), e) == pick.end()) pick.push_back(e);
    }
    std::copy(pick.begin(), pick.end(), ids.begin() + t * k);
  }
  return ids;
}

}  // namespace

TEST(MoePlanGpu, MatchesHostStableSort) {
  MXMOE_REQUIRE_GPU();
  std::mt19937 rng(fresh_seed());
  run_case("uniform", topk_ids(16384 + 3, 8, 128, false, rng), 16384 + 3, 8, 128);
  run_case("skewed", topk_ids(5000, 8, 256, true, rng), 5000, 8, 256);
  run_case("k=1", topk_ids(1000, 1, 8, false, rng), 1000, 1, 8);
  run_case("one expert takes all", std::vector<int32_t>(size_t(777), 5), 777, 1, 8);
  run_case("no tokens", {}, 0, 8, 32);
  std::vector<int32_t> bad = topk_ids(300, 4, 16, false, rng);
  for (size_t i = 0; i < bad.size(); i += 7) bad[i] = (i % 2) ? -1 : 16;  // invalid ids are dropped
  run_case("invalid ids", bad, 300, 4, 16);
  run_case("E=1024", topk_ids(4096, 8, 1024, false, rng), 4096, 8, 1024);
}
