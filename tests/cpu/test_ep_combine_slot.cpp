// The fused combine's row -> slot inverse (src/kernels/ep/combine_slot.h) against the rule of the
// EP combine kernel it replaces: for every (s, t, j) with a valid local id, row row_of[(s, t, j)]
// of the local layout goes to slot t·k + j of rank s. Host replay of moe_plan's layout (stable
// counting sort by local expert, segments padded to 128 rows) on random routing; pure host code.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "kernels/ep/combine_slot.h"
#include "mxmoe/moe_plan.h"

namespace {

struct HostPlan {
  std::vector<int32_t> row_of, row_index;  // [records·k], [capacity]
  int64_t rows_used = 0;                   // padded_offsets[E]
};

// moe_plan's layout: rows of expert e in (record, slot) order, each segment padded to 128 rows.
HostPlan plan(const std::vector<int32_t>& local_ids, int64_t records, int k, int experts) {
  HostPlan p;
  std::vector<int64_t> counts(size_t(experts), 0), start(size_t(experts) + 1, 0);
  for (int32_t e : local_ids)
    if (e >= 0) ++counts[size_t(e)];
  for (int e = 0; e < experts; ++e) start[size_t(e) + 1] = start[size_t(e)] + (counts[size_t(e)] + 127) / 128 * 128;
  p.rows_used = start[size_t(experts)];
  p.row_index.assign(size_t(mxmoe::moe_plan_capacity(records, k, experts)), -1);
  p.row_of.assign(local_ids.size(), -1);
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < records * k; ++i) {
    const int32_t e = local_ids[size_t(i)];
    if (e < 0) continue;
    const int64_t row = next[size_t(e)]++;
    p.row_of[size_t(i)] = int32_t(row);
    p.row_index[size_t(row)] = int32_t(i / k);
  }
  return p;
}

// Random routing of every source's tokens; ids of experts elsewhere (or invalid) are -1 here. With
// `stale`, row_of of a slot without a local expert points at some row (the combine kernel never
// reads it: the inverse must not either).
void check_inverse(int world, int max_tokens, int k, int local_experts, double p_here, bool stale, std::mt19937& rng) {
  const int64_t records = int64_t(world) * max_tokens;
  std::vector<int32_t> local_ids(size_t(records * k), -1);
  std::bernoulli_distribution here(p_here);
  std::uniform_int_distribution<int> expert(0, local_experts - 1);
  for (auto& id : local_ids)
    if (here(rng)) id = expert(rng);
  HostPlan p = plan(local_ids, records, k, local_experts);
  const int64_t cap = int64_t(p.row_index.size());
  if (stale) {
    std::uniform_int_distribution<int64_t> any_row(0, cap - 1);
    for (size_t i = 0; i < local_ids.size(); ++i)
      if (local_ids[i] < 0) p.row_of[i] = int32_t(any_row(rng));
  }
  // Rows past rows_used: moe_plan leaves -1 there, but the limit alone must keep them out.
  for (int64_t r = p.rows_used; r < cap; ++r) p.row_index[size_t(r)] = int32_t(r % records);

  // What the combine kernel sends: row -> (rank, slot).
  std::map<int64_t, std::pair<int, int64_t>> sent;
  for (int64_t u = 0; u < records; ++u)
    for (int j = 0; j < k; ++j) {
      const int64_t i = u * k + j;
      if (local_ids[size_t(i)] < 0) continue;
      const int64_t row = p.row_of[size_t(i)];
      ASSERT_TRUE(sent.emplace(row, std::make_pair(int(u / max_tokens), (u % max_tokens) * k + j)).second)
          << "two slots on row " << row;
    }
  int64_t n_sent = 0;
  for (int64_t r = 0; r < cap; ++r) {
    const mxmoe::ep::CombineSlot c = mxmoe::ep::combine_slot_of_row(
        r, p.rows_used, p.row_index.data(), p.row_of.data(), local_ids.data(), k, max_tokens, world);
    const auto it = sent.find(r);
    if (it == sent.end()) {
      ASSERT_EQ(c.rank, -1) << "row " << r << " (pad row or past rows_used " << p.rows_used << ") gets a slot";
      continue;
    }
    ++n_sent;
    ASSERT_EQ(c.rank, it->second.first) << "row " << r;
    ASSERT_EQ(c.slot, it->second.second) << "row " << r;
  }
  EXPECT_EQ(n_sent, int64_t(sent.size()));
}

}  // namespace

TEST(EpCombineSlot, InverseOfTheCombineKernelsRule) {
  std::mt19937 rng(20261130u);
  for (int world : {1, 2, 8})
    for (int k : {1, 4, 8})
      for (bool stale : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "world " << world << " k " << k << " stale " << stale);
        check_inverse(world, 300, k, 4, 0.3, stale, rng);
      }
}

TEST(EpCombineSlot, EdgeCases) {
  std::mt19937 rng(7u);
  check_inverse(2, 130, 8, 16, 0.0, true, rng);   // nothing routed here: every row is padding or unused
  check_inverse(2, 130, 8, 1, 1.0, false, rng);   // every slot of every source to one local expert
  check_inverse(4, 1, 32, 3, 0.5, true, rng);     // one token per source, k = 32
}
