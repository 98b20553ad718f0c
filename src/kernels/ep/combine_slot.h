// Which combine slot a padded row of the local expert layout goes to: the inverse of the plan's
// row_of that the EP combine kernel reads. Shared by the fused combine's targets kernel
// (ep_dispatch_combine_sm90.cu) and its CPU test (tests/cpu/test_ep_combine_slot.cpp).
#pragma once
#include <cstdint>

#include "device/fast_divmod.cuh"  // MXMOE_HOST_DEVICE

namespace mxmoe::ep {

struct CombineSlot {
  int rank = -1;      // the token's rank (the owner of the slot); -1: the row is not sent
  int64_t slot = -1;  // row t·k + j of that rank's combine region
};

// Padded row r of the layout planned over records u = s·max_tokens + t (moe_plan over
// recv_local_ids: row_index [rows], row_of [world·max_tokens, k]): with u = row_index[r], the slot
// j of u with local_ids[u·k + j] >= 0 and row_of[u·k + j] == r — exactly the (s, t, j) for which
// the combine kernel copies this row (it sends row_of[(s, t, j)] for every valid local id) — goes
// to slot t·k + j of rank s. Rows at or beyond `limit` (*rows_used), pad rows (u < 0) and rows no
// valid slot names get rank -1.
MXMOE_HOST_DEVICE CombineSlot combine_slot_of_row(int64_t r, int64_t limit, const int32_t* row_index,
                                                  const int32_t* row_of, const int32_t* local_ids, int top_k,
                                                  int max_tokens, int world) {
  CombineSlot c;
  const int64_t u = r < limit ? row_index[r] : -1;
  if (u < 0 || u >= int64_t(world) * max_tokens) return c;
  for (int j = 0; j < top_k; ++j) {
    const int64_t i = u * top_k + j;
    if (local_ids[i] >= 0 && row_of[i] == r) {
      c.rank = int(u / max_tokens);
      c.slot = (u % max_tokens) * top_k + j;
      return c;
    }
  }
  return c;
}

}  // namespace mxmoe::ep
