// Top-k expert selection of one token by one warp, from its FP32 logits (shared memory [E]):
// the routing rule of include/mxmoe/decode.h (softmax or sigmoid + bias scoring, group limit,
// renormalisation, scaling; ties to the lower id; NaN counts as -Inf). Used by the decode router
// (warp_decode_router_sm90.cu) and the training layer's top-k (moe_topk_sm90.cu), so both paths
// route identically. kSlots scores a lane (E <= 32·kSlots; default 16: E <= 512; the fused step
// uses 4 or 8 to fit its register budget — entries past E are never valid, so every kSlots with
// 32·kSlots >= E gives the same bits; select_top_k_any picks the smallest); k rounds of a warp
// arg-max with the total order (score desc, id asc) — two redux.sync (max of an order-preserving
// key, then min id among the lanes holding it) instead of a 5-step xor-shuffle butterfly of three
// values (RouterLaunch::argmax_shuffle keeps the butterfly for A/B timing; both pick the same
// winner); group scores (top-2 sums) by one lane per group.
#pragma once
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/decode/decode_launch.h"
#include "kernels/decode/warp_decode_common.cuh"
#include "mxmoe/decode.h"

namespace mxmoe::detail {

constexpr int kPerLane = kDecodeMaxExperts / 32;
static_assert(kDecodeMaxExperts % 32 == 0 && kPerLane <= 32, "availability is a 32-bit mask a lane");
static_assert(kDecodeMaxTopK <= 32, "lane r keeps the r-th selected expert");
static_assert(kDecodeMaxGroups <= 32, "lane g scores group g");

// The selection's form (RouterSelectForm, decode_launch.h): read at run time (kSelectRuntime), or fixed
// at compile time so that a kernel holds only one form's code (the decode router: run 120 found its
// selection slower with both forms compiled in, the same instructions executed — one warp runs this code
// once a launch, from a cold instruction cache).
template <int kForm>
__device__ __forceinline__ bool serial_form(const RouterLaunch& p) {
  return kForm == kSelectSerial || (kForm == kSelectRuntime && p.select_form == kSelectSerial);
}

// One expert's selection score and weight source from its logit (select_top_k's scoring, and the
// decode router's warps that score their own experts): sigmoid + bias or the logit; NaN → -Inf.
__device__ __forceinline__ void score_expert(const RouterLaunch& p, float l, float bias, float& sel, float& src) {
  if (p.sigmoid) {
    const float s = 1.0f / (1.0f + expf(-l));
    src = s;
    sel = p.bias ? s + bias : s;
  } else {
    src = l;
    sel = l;
  }
  if (isnan(sel)) sel = -INFINITY;  // NaN counts as -Inf
}

// Strict total order on (score, id): higher score first, then lower id.
__device__ __forceinline__ bool better(float v, int e, float bv, int be) {
  return v > bv || (v == bv && e < be);
}

// An unsigned key with the order of the floats (v never NaN): key(a) < key(b) exactly when a < b,
// and -0.0, +0.0 get one key (they compare equal, so `better` breaks their tie by id).
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t u = __float_as_uint(v + 0.0f);  // -0.0 + 0.0 = +0.0 (round to nearest)
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Warp-wide arg-max of (v, e) under `better`, carrying a payload s; every lane ends with the
// winner's triple. v is never NaN (callers map NaN to -Inf); e >= 0, each real candidate's e held
// by lane e % 32 (the callers' experts e = lane + 32·i and groups g = lane), INT_MAX for a lane
// without one. shuffle: the xor butterfly (15 dependent shuffles); else max of order_key, then
// min e among the lanes holding that key (redux.sync), and v, s from lane e % 32. Same winner.
__device__ __forceinline__ void warp_argmax(float& v, int& e, float& s, bool shuffle) {
  if (shuffle) {
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) {
      const float ov = __shfl_xor_sync(dev::kFullMask, v, o);
      const int oe = __shfl_xor_sync(dev::kFullMask, e, o);
      const float os = __shfl_xor_sync(dev::kFullMask, s, o);
      if (better(ov, oe, v, e)) {
        v = ov;
        e = oe;
        s = os;
      }
    }
    return;
  }
  const uint32_t key = order_key(v);
  const uint32_t top = __reduce_max_sync(dev::kFullMask, key);
  e = int(__reduce_min_sync(dev::kFullMask, key == top ? uint32_t(e) : 0xFFFFFFFFu));
  const int src = e & 31;
  v = __shfl_sync(dev::kFullMask, v, src);
  s = __shfl_sync(dev::kFullMask, s, src);
}

// Warp-wide top two of v over the member lanes (key = order_key(v), 0 for a lane that is not a member:
// below every real key, order_key(-Inf) = 0x007FFFFF): t1 the largest, t2 the largest of the others
// (a repeated maximum counts twice; -Inf when there is one member). Every lane gets both. The sum
// t1 + t2 equals limit_groups' serial scan's bit for bit: equal keys are equal values but
// for the sign of a zero, and a sum of two values does not depend on their order.
__device__ __forceinline__ void warp_top2(float v, uint32_t key, int lane, float& t1, float& t2) {
  const uint32_t m1 = __reduce_max_sync(dev::kFullMask, key);
  const uint32_t e1 = __reduce_min_sync(dev::kFullMask, key == m1 ? uint32_t(lane) : 32u);
  t1 = __shfl_sync(dev::kFullMask, v, int(e1 & 31u));
  const uint32_t k2 = uint32_t(lane) == e1 ? 0u : key;
  const uint32_t m2 = __reduce_max_sync(dev::kFullMask, k2);
  const uint32_t e2 = __reduce_min_sync(dev::kFullMask, k2 == m2 ? uint32_t(lane) : 32u);
  const float v2 = __shfl_sync(dev::kFullMask, v, int(e2 & 31u));
  t2 = m2 == 0u ? -INFINITY : v2;
}

// Whether groups of G experts fill a lane's slots whole (G <= 32, 32 % G == 0), so that group_scores_warp
// applies; other group sizes take limit_groups' serial scan.
__device__ __forceinline__ bool groups_fill_slots(int G) { return G <= 32 && 32 % G == 0; }

// Group scores in registers (no shared memory, no serial scan) when a slot holds whole groups
// (groups_fill_slots(G): slot i holds groups i·32/G + lane/G; G = 32 is DeepSeek-V3's): lane g ends with
// group g's score (t1 + t2, NaN → -Inf), the others with -Inf. Measured (run 124, E = 256, 8 groups): the
// group step costs ~3 us here against ~1.7 us serially — the groups' chains (4 redux.sync + 2 shuffles
// each) run one after another; the group-warps form (group_score_warp) spreads them over warps.
template <int kSlots>
__device__ __forceinline__ void group_scores_warp(const float (&sel)[kSlots], int E, int n_groups, int lane,
                                                  float& gscore) {
  const int G = E / n_groups;  // groups_fill_slots(G) (the caller's test)
  gscore = -INFINITY;
  const int gps = 32 / G;  // groups a slot
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    if (32 * i >= E) break;
    const float v = sel[i];
    const uint32_t key = order_key(v);
#pragma unroll 1
    for (int sub = 0; sub < gps; ++sub) {
      float t1, t2;
      warp_top2(v, lane / G == sub ? key : 0u, lane, t1, t2);
      float g = t1 + t2;
      if (isnan(g)) g = -INFINITY;
      if (lane == i * gps + sub) gscore = g;
    }
  }
}

// One group's score by one warp (the decode router's group-warps form): the sum of the two best of
// scores[0..G) (selection scores, NaN already -Inf), any G: a lane's top two of its entries q = lane,
// lane + 32, ..., then the best of the lanes' firsts and the best of the others' firsts and the
// winner's second. Every lane gets the score (NaN → -Inf); t1 + t2 is the serial scan's bit for bit
// (warp_top2's argument).
__device__ __forceinline__ float group_score_warp(const float* scores, int G, int lane) {
  float l1 = -INFINITY, l2 = -INFINITY;
  for (int q = lane; q < G; q += 32) {
    const float v = scores[q];
    if (order_key(v) > order_key(l1)) {
      l2 = l1;
      l1 = v;
    } else if (order_key(v) > order_key(l2)) {
      l2 = v;
    }
  }
  const uint32_t k1 = order_key(l1);
  const uint32_t m1 = __reduce_max_sync(dev::kFullMask, k1);
  const uint32_t e1 = __reduce_min_sync(dev::kFullMask, k1 == m1 ? uint32_t(lane) : 32u);
  const float t1 = __shfl_sync(dev::kFullMask, l1, int(e1 & 31u));
  const float c = uint32_t(lane) == e1 ? l2 : l1;
  const uint32_t kc = order_key(c);
  const uint32_t m2 = __reduce_max_sync(dev::kFullMask, kc);
  const uint32_t e2 = __reduce_min_sync(dev::kFullMask, kc == m2 ? uint32_t(lane) : 32u);
  const float t2 = __shfl_sync(dev::kFullMask, c, int(e2 & 31u));
  const float g = t1 + t2;
  return isnan(g) ? -INFINITY : g;
}

// The winner's id only (the lean rounds of the group-warps form): warp_argmax's redux path without its
// two shuffles of the winner's value and payload, which the rounds do not need on their critical path
// (the value is never used after a round, the payload is fetched once at the end by id).
__device__ __forceinline__ int warp_argmax_id(float v, int e) {
  const uint32_t key = order_key(v);
  const uint32_t top = __reduce_max_sync(dev::kFullMask, key);
  return int(__reduce_min_sync(dev::kFullMask, key == top ? uint32_t(e) : 0xFFFFFFFFu));
}

// Group limit (sigmoid scoring): keep the topk_groups groups with the largest sum of their two
// best selection scores; clear the availability bits of experts outside them. kSelectGroupWarps:
// gscore_given holds the groups' scores ([n_groups], group_score_warp) and the rounds find only the
// winner (warp_argmax_id); else the scores are computed here.
template <int kSlots, int kForm = kSelectRuntime>
__device__ __forceinline__ uint32_t limit_groups(const RouterLaunch& p, const float (&sel)[kSlots],
                                                 uint32_t avail, float* scratch, int lane,
                                                 const float* gscore_given = nullptr) {
  constexpr bool kGiven = kForm == kSelectGroupWarps, kLean = kForm == kSelectGroupWarps;
  const int E = p.num_experts, G = E / p.n_groups;
  const bool has_group = lane < p.n_groups;
  // Serial scan (group sizes that do not fill slots, or MXMOE_ROUTER_SELECT=serial): lane g scans group g in
  // shared memory.
  const bool scan = !kGiven && (serial_form<kForm>(p) || !groups_fill_slots(G));
  float gscore = -INFINITY;
  if constexpr (kGiven) {
    if (has_group) gscore = gscore_given[lane];
  } else if (scan) {
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const int e = lane + 32 * i;
      if (e < E) scratch[e] = sel[i];
    }
    __syncwarp();
  } else {
    group_scores_warp(sel, E, p.n_groups, lane, gscore);
  }
  if (scan && has_group) {
    float t1 = -INFINITY, t2 = -INFINITY;
    for (int q = 0; q < G; ++q) {
      const float v = scratch[lane * G + q];
      if (v > t1) {
        t2 = t1;
        t1 = v;
      } else if (v > t2) {
        t2 = v;
      }
    }
    gscore = t1 + t2;
    if (isnan(gscore)) gscore = -INFINITY;
  }
  uint32_t chosen = 0u;
  for (int r = 0; r < p.topk_groups; ++r) {
    float v = -INFINITY, unused = 0.0f;
    int g = INT_MAX;
    if (has_group && !((chosen >> lane) & 1u)) {
      v = gscore;
      g = lane;
    }
    if constexpr (kLean) {
      g = warp_argmax_id(v, g);
    } else {
      warp_argmax(v, g, unused, p.argmax_shuffle != 0);
    }
    chosen |= 1u << g;  // g < n_groups: topk_groups <= n_groups
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const int e = lane + 32 * i;
    if (e < E && !((chosen >> (e / G)) & 1u)) avail &= ~(1u << i);
  }
  return avail;
}

// One warp: the top-k of token b from its FP32 logits (shared memory [E]); E <= 32·kSlots.
// kPrescored (the decode router): `logits` already holds each expert's selection score (sigmoid + bias, or
// the logit; NaN → -Inf) and src_shared its weight source (the sigmoid, or the logit), computed by the
// warp that made the logit with the very operations below — the same bits, and this warp, which runs
// once a token from a cold instruction cache, skips kSlots unrolled sigmoids (run 121's reading).
// kSelectGroupWarps (the decode router): gscore_given holds the token's group scores, and the rounds find
// only the winner's id (warp_argmax_id); lane r then takes its expert's weight source by id (the same
// value the shuffle gave).
template <int kSlots = kPerLane, int kForm = kSelectRuntime, bool kPrescored = false>
__device__ __forceinline__ void select_top_k(const RouterLaunch& p, const float* logits, float* scratch, int b,
                                             int lane, const float* src_shared = nullptr,
                                             const float* gscore_given = nullptr) {
  static_assert(kSlots >= 1 && kSlots <= kPerLane, "availability is a 32-bit mask a lane");
  constexpr bool kLean = kForm == kSelectGroupWarps;
  const int E = p.num_experts;
  float sel[kSlots];  // selection score
  float src[kSlots];  // softmax: the logit; sigmoid: s = sigmoid(logit)
  uint32_t valid = 0u;
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const int e = lane + 32 * i;
    sel[i] = -INFINITY;
    src[i] = 0.0f;
    if (kPrescored && e < E) {
      sel[i] = logits[e];
      src[i] = src_shared[e];
      valid |= 1u << i;
    } else if (e < E) {
      score_expert(p, logits[e], p.bias ? __ldg(p.bias + e) : 0.0f, sel[i], src[i]);
      valid |= 1u << i;
    }
  }
  uint32_t avail = valid;
  if (p.sigmoid && p.n_groups > 1)
    avail = limit_groups<kSlots, kForm>(p, sel, avail, scratch, lane, gscore_given);

  int my_id = 0;        // lane r: the r-th selected expert
  float my_src = 0.0f;  // and its weight source
  for (int r = 0; r < p.top_k; ++r) {
    float v = -INFINITY, s = 0.0f;
    int e = INT_MAX;
    if (serial_form<kForm>(p)) {  // MXMOE_ROUTER_SELECT=serial: a chain of kSlots comparisons
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        if (((avail >> i) & 1u) && better(sel[i], lane + 32 * i, v, e)) {
          v = sel[i];
          e = lane + 32 * i;
          s = src[i];
        }
      }
    } else {  // a tree of pairwise comparisons (log2 kSlots deep): `better` is a strict total order, so
              // its maximum does not depend on the grouping — the same (v, e, s) as the chain
      float tv[kSlots], ts[kSlots];
      int te[kSlots];
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        const bool a = (avail >> i) & 1u;
        tv[i] = a ? sel[i] : -INFINITY;
        te[i] = a ? lane + 32 * i : INT_MAX;
        ts[i] = src[i];
      }
#pragma unroll
      for (int w = 1; w < kSlots; w *= 2) {
#pragma unroll
        for (int i = 0; i + w < kSlots; i += 2 * w) {
          if (better(tv[i + w], te[i + w], tv[i], te[i])) {
            tv[i] = tv[i + w];
            te[i] = te[i + w];
            ts[i] = ts[i + w];
          }
        }
      }
      v = tv[0];
      e = te[0];
      s = te[0] == INT_MAX ? 0.0f : ts[0];
    }
    if constexpr (kLean) {
      e = warp_argmax_id(v, e);  // e < E: top_k <= the number of available experts
    } else {
      warp_argmax(v, e, s, p.argmax_shuffle != 0);  // e < E: top_k <= the number of available experts
    }
    if (lane == (e & 31)) avail &= ~(1u << (e >> 5));
    if (lane == r) {
      my_id = e;
      my_src = s;
    }
  }
  if constexpr (kLean) {  // lane r's weight source: slot my_id / 32 of lane my_id % 32
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const float c = __shfl_sync(dev::kFullMask, src[i], my_id & 31);
      if ((my_id >> 5) == i) my_src = c;
    }
  }

  const bool mine = lane < p.top_k;
  float w;
  if (!p.sigmoid) {
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < kSlots; ++i)
      if ((valid >> i) & 1u) m = fmaxf(m, src[i]);
    m = dev::warp_max(m);
    const float num = mine ? expf(my_src - m) : 0.0f;
    float den;
    if (p.renormalize) {
      den = dev::warp_sum(num);
    } else {
      float part = 0.0f;
#pragma unroll
      for (int i = 0; i < kSlots; ++i)
        if ((valid >> i) & 1u) part += expf(src[i] - m);
      den = dev::warp_sum(part);
    }
    w = num / den;
  } else {
    const float s = mine ? my_src : 0.0f;
    w = p.renormalize ? s / dev::warp_sum(s) : s;
  }
  w *= p.scaling;
  if (mine) {
    p.ids[int64_t(b) * p.top_k + lane] = my_id;
    p.weights[int64_t(b) * p.top_k + lane] = w;
  }
}

// select_top_k with the fewest scores a lane that hold E experts (4 for E <= 128, 8 for <= 256, else
// 16): the same bits (entries past E are never valid), a shorter scan in each of the k rounds.
// RouterLaunch::slots (MXMOE_ROUTER_SLOTS) overrides the choice for A/B timing.
__host__ __device__ __forceinline__ int top_k_slots(const RouterLaunch& p) {
  return p.slots != 0 ? p.slots : p.num_experts <= 128 ? 4 : p.num_experts <= 256 ? 8 : kPerLane;
}
__device__ __forceinline__ void select_top_k_any(const RouterLaunch& p, const float* logits, float* scratch, int b,
                                                 int lane) {
  const int slots = top_k_slots(p);
  if (slots == 4) select_top_k<4>(p, logits, scratch, b, lane);
  else if (slots == 8) select_top_k<8>(p, logits, scratch, b, lane);
  else select_top_k<kPerLane>(p, logits, scratch, b, lane);
}

}  // namespace mxmoe::detail
