// Host entry points of the warp-decode path (include/mxmoe/decode.h): argument checks (before any
// CUDA call, so they are testable without a GPU), then the launches; and the dispatcher's table.
#include "mxmoe/decode.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

#include "host/check.h"
#include "host/decode_checks.h"
#include "host/routing.h"
#include "kernels/decode/decode_launch.h"

namespace mxmoe {
namespace {

using detail::check_aligned;
using detail::check_batch;
using detail::check_dim;
using detail::check_experts;
using detail::check_not_null;
using detail::check_ptr;
using detail::check_top_k;
using detail::check_weights;
using detail::env_int;
using detail::expert_weights;
using detail::is_mx;
using detail::throw_arg;
using detail::to_str;

// A switch from the environment: unset or empty gives dflt; otherwise it must be one of `allowed`,
// written as a decimal integer, or the call throws naming the variable.
int env_choice(const char* fn, const char* var, int dflt, std::initializer_list<int> allowed) {
  const char* v = std::getenv(var);
  if (v == nullptr || *v == '\0') return dflt;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  for (int a : allowed)
    if (*end == '\0' && x == a) return a;
  std::string list;
  for (int a : allowed) list += (list.empty() ? "" : " | ") + to_str(a);
  throw_arg(fn, var, v, "must be " + list);
}

// A switch spelled as a word: -1 when unset or empty, else the index of its value in `words`; any other
// value throws naming the variable.
int env_word(const char* fn, const char* var, std::initializer_list<const char*> words) {
  const char* v = std::getenv(var);
  if (v == nullptr || *v == '\0') return -1;
  int i = 0;
  for (const char* w : words) {
    if (std::strcmp(v, w) == 0) return i;
    ++i;
  }
  std::string list;
  for (const char* w : words) list += (list.empty() ? "" : " | ") + std::string(w);
  throw_arg(fn, var, v, "must be " + list);
}

// The order of the gate/up tasks and the down tiles (decode.md "Run 128"): rows (every token's rows of
// an expert at once, so tokens that share an expert read it from L2) or tokens (token by token, the
// order before run 128). Default: rows for B >= 2 (steps 1.05-1.26x at B = 4-16 with BF16 weights,
// 1.0-1.1x MXFP8), tokens at B = 1, where nothing is shared and the gate/up's interleaved slots cost
// 1-2%. MXMOE_DECODE_ORDER=rows|tokens forces one. Same bits either way.
int rows_order(const char* fn, int batch) {
  const int w = env_word(fn, "MXMOE_DECODE_ORDER", {"rows", "tokens"});
  return w < 0 ? (batch >= 2 ? 1 : 0) : (w == 0 ? 1 : 0);
}

// The down kernel's design-space switches (docs/notes/decode.md, session 11): each selects a variant
// of warp_decode_down_sweep_sm90.cuh that gives the default's bits; read at every call.
// Defaults by weight dtype (runs 75, 77, docs/notes/decode.md "Run 77"): MXFP8 8 rows a warp with one
// chunk of each in flight (D alone 1.04-1.39x the 4 x 2 kernel on all six MXFP8 cases measured, B = 1
// and 8 on Qwen3-30B, Qwen3-235B, DeepSeek-V3), BF16 the 4 x 2 kernel (8 x 1 lost 5% on DeepSeek-V3).
// Both persistent with 2 CTAs a SM walking the tiles (run 88, "Run 88" in decode.md: the step 1.03-1.09x
// on 11 of the 12 cases — both dtypes, B = 1 and 8, the three models — and 0.999x on the twelfth,
// Qwen3-30B MXFP8 B = 1; D alone 1.01-1.22x); MXMOE_DECODE_DOWN_PERSIST=0 is one CTA a tile.
void read_down_switches(const char* fn, detail::DownLaunch& p) {
  p.rows_order = rows_order(fn, p.batch);
  p.down_rows = env_choice(fn, "MXMOE_DECODE_DOWN_ROWS", p.w2.mxfp8 ? 8 : 4, {4, 8, 16});
  // Unset, UNROLL follows ROWS: 2 for 4 rows, 1 for 8 (MXFP8) or 16 (at most 16 loads in flight a
  // lane; BF16 with 8 rows keeps 2).
  const bool one = p.down_rows == 16 || (p.down_rows == 8 && p.w2.mxfp8);
  p.down_unroll = env_choice(fn, "MXMOE_DECODE_DOWN_UNROLL", one ? 1 : 2, {1, 2, 4});
  if (p.down_rows * p.down_unroll > 16)
    throw_arg(fn, "MXMOE_DECODE_DOWN_UNROLL", to_str(p.down_unroll),
              "MXMOE_DECODE_DOWN_ROWS x MXMOE_DECODE_DOWN_UNROLL must be <= 16 (16-byte loads in flight a lane; "
              "ROWS " + to_str(p.down_rows) + " allows UNROLL <= " + to_str(16 / p.down_rows) + ")");
  p.down_persist = env_choice(fn, "MXMOE_DECODE_DOWN_PERSIST", 2, {0, 1, 2, 3, 4, 6, 8});
  p.down_prefetch = env_choice(fn, "MXMOE_DECODE_DOWN_PREFETCH", 0, {0, 1});
  if (p.down_prefetch && p.down_persist == 0)
    throw_arg(fn, "MXMOE_DECODE_DOWN_PREFETCH", "1", "needs MXMOE_DECODE_DOWN_PERSIST > 0 (it prefetches the next tile)");
  const int scales = env_word(fn, "MXMOE_DECODE_DOWN_SCALES", {"chunk", "row"});
  p.down_row_scales = p.w2.mxfp8 && scales == 1 ? 1 : 0;  // BF16: no scales
  // Register cap (__maxnreg__): 128, or 112 / 80 / 64 for A/B timing. Run 129 tried 112 as the default
  // where only it would fit 2 CTAs of 9 warps a SM: the same times (1.000x), as the default kernels hold
  // 94-101 registers and fit 2 CTAs anyway (decode.md "Runs 129-130").
  p.down_regs = env_choice(fn, "MXMOE_DECODE_DOWN_REGS", 128, {128, 112, 80, 64});
  // Tiles a CTA computes between two CTA barriers (session 19, run 143: D alone 1.02-1.12x the walk with a
  // barrier a tile, steps 1.01-1.05x, every shape, batch and dtype): 1 was the only walk before.
  p.down_group = env_choice(fn, "MXMOE_DECODE_DOWN_GROUP", 8, {8, 1, 2, 4, 16});
  // The balanced walk (decode.md "Run 127"): each persistent CTA takes an equal share of the B·H outputs.
  p.down_balance = env_choice(fn, "MXMOE_DECODE_DOWN_BALANCE", 0, {0, 1});
  if (p.down_balance && (p.down_persist == 0 || p.down_prefetch || p.down_regs < 112))
    throw_arg(fn, "MXMOE_DECODE_DOWN_BALANCE", "1",
              "needs MXMOE_DECODE_DOWN_PERSIST > 0, MXMOE_DECODE_DOWN_PREFETCH 0 and MXMOE_DECODE_DOWN_REGS 112 or 128");
}

void check_h_dtype(const char* fn, DecodeHDtype d) {
  if (d != DecodeHDtype::kFP32 && d != DecodeHDtype::kBF16)
    throw_arg(fn, "h_dtype", to_str(int(d)), "must be kFP32 or kBF16");
}

}  // namespace

void decode_router(const __nv_bfloat16* x, int batch, int hidden, const __nv_bfloat16* router_w,
                   int num_experts, const RouterParams& params, int32_t* topk_ids,
                   float* topk_weights, cudaStream_t stream) {
  const char* fn = "decode_router";
  check_ptr(fn, "x", x, 16);
  check_batch(fn, batch);
  check_dim(fn, "hidden", hidden, false);
  check_ptr(fn, "router_w", router_w, 16);
  detail::check_routing(fn, num_experts, params, topk_ids, topk_weights);
  detail::RouterLaunch p = detail::routing_launch(num_experts, params, topk_ids, topk_weights);
  p.x = reinterpret_cast<const uint16_t*>(x);
  p.w = reinterpret_cast<const uint16_t*>(router_w);
  p.batch = batch;
  p.hidden = hidden;
  detail::launch_decode_router(p, stream);
}

void decode_gate_up(const __nv_bfloat16* x, int batch, int hidden, int inter,
                    const DecodeWeights& w1, int num_experts, const int32_t* topk_ids, int top_k,
                    void* h, DecodeHDtype h_dtype, cudaStream_t stream) {
  const char* fn = "decode_gate_up";
  check_ptr(fn, "x", x, 16);
  check_batch(fn, batch);
  const bool mx = is_mx(fn, "w1", w1.dtype);
  check_dim(fn, "hidden", hidden, mx);
  check_dim(fn, "inter", inter, mx);
  check_weights(fn, "w1", w1);
  check_experts(fn, num_experts);
  check_ptr(fn, "topk_ids", topk_ids, 4);
  check_top_k(fn, "top_k", top_k, num_experts);
  check_ptr(fn, "h", h, 16);
  check_h_dtype(fn, h_dtype);

  detail::GateUpLaunch p;
  p.x = reinterpret_cast<const uint16_t*>(x);
  p.w1 = expert_weights(w1);
  p.ids = topk_ids;
  p.h = h;
  p.h_bf16 = h_dtype == DecodeHDtype::kBF16 ? 1 : 0;
  p.batch = batch;
  p.hidden = hidden;
  p.inter = inter;
  p.num_experts = num_experts;
  p.top_k = top_k;
  p.slots = top_k + (w1.shared_data ? 1 : 0);
  // MXFP8 launch bound: 3 CTAs a SM (80 registers; runs 56, 59: 1.02-1.08x a step), 2 (102 registers) or
  // 4 (64 registers, 64 bytes of spills; run 134), MXMOE_DECODE_MX_GATE_UP_CTAS.
  p.min_ctas_per_sm = env_choice(fn, "MXMOE_DECODE_MX_GATE_UP_CTAS", 3, {2, 3, 4});
  // A/B switch (session 12, not yet a default): N·SMs CTAs walking the tasks (same bits).
  p.persist = env_choice(fn, "MXMOE_DECODE_GATE_UP_PERSIST", 0, {0, 1, 2, 3, 4, 6, 8});
  p.rows_order = rows_order(fn, batch);
  // The shared expert's tasks first, started before the router has finished (x must then be complete when
  // this kernel starts, as it is after decode_router; decode.h). Default since run 137 (DSV3 steps 1.01-1.05x
  // at B = 1-4 with either dtype); same bits.
  const int shared_first = env_choice(fn, "MXMOE_DECODE_SHARED_FIRST", 1, {0, 1});
  // Not with a persistent walk (it mixes the tasks) or a non-default MXFP8 launch bound (the shared-first
  // kernels exist at the default bound only): those switches then select their kernels as before.
  p.shared_first = shared_first && w1.shared_data != nullptr && p.persist == 0 && (!mx || p.min_ctas_per_sm == 3);
  // x staged per CTA in shared memory as FP32 (session 19; decode.md "Runs 143-146"), where H·4 bytes of
  // shared memory fit without an opt-in; one task a warp only (a persistent walk of staged blocks compiled to
  // 103-151 registers, or 120 bytes of spills at the MXFP8 bound: not built). Unset: on, except MXFP8 weights
  // with H > 4096. Measured (steps, staged / not): H = 2048 and 4096 1.00-1.07x with both dtypes at B = 1-8;
  // H = 7168 BF16 1.00-1.02x, MXFP8 0.95-0.99x at B = 2-8 (the kernel then streams at ~90% of copy, and the
  // per-CTA copy of the long x row costs more than the conversions it saves).
  const int x_smem = env_choice(fn, "MXMOE_DECODE_GATE_UP_XSMEM", mx && hidden > 4096 ? 0 : 1, {1, 0});
  p.x_smem = x_smem && p.persist == 0 && int64_t(hidden) * 4 <= detail::kDecodeGateUpMaxXSmem ? 1 : 0;
  detail::launch_decode_gate_up(p, stream);
}

void decode_down(const void* h, DecodeHDtype h_dtype, int batch, int inter, int hidden,
                 const DecodeWeights& w2, int num_experts, const int32_t* topk_ids,
                 const float* topk_weights, int top_k, __nv_bfloat16* out, cudaStream_t stream) {
  const char* fn = "decode_down";
  check_ptr(fn, "h", h, 16);
  check_h_dtype(fn, h_dtype);
  check_batch(fn, batch);
  const bool mx = is_mx(fn, "w2", w2.dtype);
  check_dim(fn, "inter", inter, mx);
  check_dim(fn, "hidden", hidden, mx);
  check_weights(fn, "w2", w2);
  check_experts(fn, num_experts);
  check_ptr(fn, "topk_ids", topk_ids, 4);
  check_ptr(fn, "topk_weights", topk_weights, 4);
  check_top_k(fn, "top_k", top_k, num_experts);
  check_ptr(fn, "out", out, 16);

  detail::DownLaunch p;
  p.h = h;
  p.h_bf16 = h_dtype == DecodeHDtype::kBF16 ? 1 : 0;
  p.w2 = expert_weights(w2);
  p.ids = topk_ids;
  p.weights = topk_weights;
  p.out = reinterpret_cast<uint16_t*>(out);
  p.batch = batch;
  p.hidden = hidden;
  p.inter = inter;
  p.num_experts = num_experts;
  p.top_k = top_k;
  p.slots = top_k + (w2.shared_data ? 1 : 0);
  read_down_switches(fn, p);
  detail::launch_decode_down(p, stream);
}

// ---- dispatcher ----------------------------------------------------------------------------------
namespace {

struct CrossoverEntry {
  DecodeShape shape;
  DecodeWeightDtype dtype;
  DecodeCrossover crossover;
};

// Largest batch for which warp decode beats the conventional expert-centric decode step (route →
// sort → grouped GEMMs → combine; bench_decode.py times PyTorch's, under CUDA graphs, in the same
// run), per model shape and weight dtype. Measured 2026-11-30 on one H200 (run 19,
// `python3 bench/bench_decode.py`, batches 1, 2, 4, ..., 128): the entry is the largest measured
// batch at which warp decode was faster; at the next power of two it was slower. The crossover
// between two measured batches (e.g. 17-31) is not resolved.
constexpr CrossoverEntry kCrossovers[] = {
    // Run 96 (bench_decode.py --reps 7, batches 1..128, every graph timed in alternation): warp decode
    // against the expert-centric step, us, at the largest batch where warp decode wins and the next.
    // Qwen3-30B-A3B: warp wins up to 16 for both dtypes (run 42: BF16 307 vs 347 at 16, 586 vs 486 at
    // 32; MXFP8 230 vs 262 at 16, 439 vs 353 at 32). Run 131 (rows order, decode.md "Run 128"): BF16 up
    // to 32 (408 vs 442 at 32, 801 vs 483 at 64); MXFP8 still 16 (351 vs 346 at 32: a tie).
    {{2048, 768, 128, 8, false}, DecodeWeightDtype::kBF16, {32, true}},
    {{2048, 768, 128, 8, false}, DecodeWeightDtype::kMXFP8, {16, true}},
    // Qwen3-235B-A22B: BF16 up to 8 (run 42: 566 vs 782 at 8, 1098 vs 1083 at 16), up to 16 since the
    // rows order (run 131: 888 vs 1007 at 16, 1560 vs 1383 at 32); MXFP8 up to 16 (run 96: 620 vs 663
    // at 16; run 131: 566 vs 680 at 16, 1121 vs 928 at 32).
    {{4096, 1536, 128, 8, false}, DecodeWeightDtype::kBF16, {16, true}},
    {{4096, 1536, 128, 8, false}, DecodeWeightDtype::kMXFP8, {16, true}},
    // DeepSeek-V3 (shared expert), first measured against the expert-centric step in run 96: BF16
    // 1445 vs 1418 at 8 (a tie then: 8 kept), 2842 vs 2060 at 16; MXFP8 up to 8, 1561 vs 1406 at 16.
    // Runs 108-110: BF16 at 8 followed the routing's overlap (the expert-centric step reads only the
    // distinct experts, warp decode then read every slot from DRAM): 1437 vs 1312, 1468 vs 1587, 1466 vs
    // 1366 us, so 4. Since the rows order (run 128) the tokens that share an expert read it from L2,
    // and run 131 has BF16 at 8 1107 vs 1303 us (2012 vs 1933 at 16): 8 again; MXFP8 694 vs 863 at 8,
    // 1414 vs 1283 at 16.
    // Session 19 (runs 144 and 147, MXFP8 kernels 1.03-1.07x faster at B >= 2): MXFP8 at 16 warp decode
    // 1404 vs 1534 us (run 144), 1321 vs 1477 (run 147, the seeded routing), so 16; at 32 2637 vs 1939. BF16
    // at 16: 2283 vs 2214 (run 144), 2108 vs 2221 (run 147): a tie, 8 kept. Session 20 (run 156, seeded routing as run
    // 147): BF16 at 16 2112 vs 2269 us, at 32 3928 vs 3045, so 16 (warp decode won at 16 in both seeded runs, by 5-7%).
    {{7168, 2048, 256, 8, true}, DecodeWeightDtype::kBF16, {16, true}},
    {{7168, 2048, 256, 8, true}, DecodeWeightDtype::kMXFP8, {16, true}},
};
constexpr DecodeCrossover kDefaultCrossover{8, false};  // unlisted shapes: a guess, not measured

bool same_shape(const DecodeShape& a, const DecodeShape& b) {
  return a.hidden == b.hidden && a.inter == b.inter && a.num_experts == b.num_experts &&
         a.top_k == b.top_k && a.shared_expert == b.shared_expert;
}

}  // namespace

DecodeCrossover decode_crossover(const DecodeShape& shape, DecodeWeightDtype dtype) {
  for (const CrossoverEntry& e : kCrossovers)
    if (e.dtype == dtype && same_shape(e.shape, shape)) return e.crossover;
  return kDefaultCrossover;
}

DecodePath choose_decode_path(const DecodeShape& shape, DecodeWeightDtype dtype, int batch) {
  return batch <= decode_crossover(shape, dtype).max_batch ? DecodePath::kWarpDecode
                                                            : DecodePath::kExpertCentric;
}


namespace detail {

void check_routing(const char* fn, int num_experts, const RouterParams& params, const int32_t* topk_ids,
                   const float* topk_weights) {
  check_experts(fn, num_experts);
  check_top_k(fn, "params.top_k", params.top_k, num_experts);
  const bool sigmoid = params.scoring == RouterScoring::kSigmoid;
  if (!sigmoid && params.scoring != RouterScoring::kSoftmax)
    throw_arg(fn, "params.scoring", to_str(int(params.scoring)), "must be kSoftmax or kSigmoid");
  if (!std::isfinite(params.scaling_factor))
    throw_arg(fn, "params.scaling_factor", to_str(params.scaling_factor), "must be finite");
  if (!sigmoid) {
    if (params.n_groups != 1)
      throw_arg(fn, "params.n_groups", to_str(params.n_groups), "must be 1 with softmax scoring");
    if (params.topk_groups != 1)
      throw_arg(fn, "params.topk_groups", to_str(params.topk_groups), "must be 1 with softmax scoring");
    if (params.bias)
      throw_arg(fn, "params.bias", to_str(static_cast<const void*>(params.bias)),
                "must be null with softmax scoring (the bias is a sigmoid-routing term)");
  } else {
    if (params.n_groups < 1 || params.n_groups > kDecodeMaxGroups || num_experts % params.n_groups != 0)
      throw_arg(fn, "params.n_groups", to_str(params.n_groups),
                "must be in [1, " + to_str(kDecodeMaxGroups) + "] and divide num_experts = " + to_str(num_experts));
    if (params.topk_groups < 1 || params.topk_groups > params.n_groups)
      throw_arg(fn, "params.topk_groups", to_str(params.topk_groups), "must be in [1, n_groups]");
    const int group = num_experts / params.n_groups;
    if (params.n_groups > 1 && group < 2)
      throw_arg(fn, "params.n_groups", to_str(params.n_groups),
                "groups must hold at least 2 experts (a group scores its top-2)");
    if (params.top_k > params.topk_groups * group)
      throw_arg(fn, "params.top_k", to_str(params.top_k),
                "must be at most topk_groups · num_experts / n_groups = " + to_str(params.topk_groups * group));
    if (params.bias) check_aligned(fn, "params.bias", params.bias, 4);
  }
  check_ptr(fn, "topk_ids", topk_ids, 4);
  check_ptr(fn, "topk_weights", topk_weights, 4);
}

RouterLaunch routing_launch(int num_experts, const RouterParams& params, int32_t* topk_ids, float* topk_weights) {
  const bool sigmoid = params.scoring == RouterScoring::kSigmoid;
  RouterLaunch p;
  p.bias = sigmoid ? params.bias : nullptr;
  p.ids = topk_ids;
  p.weights = topk_weights;
  p.num_experts = num_experts;
  p.top_k = params.top_k;
  p.sigmoid = sigmoid ? 1 : 0;
  p.renormalize = params.renormalize ? 1 : 0;
  p.n_groups = params.n_groups;
  p.topk_groups = params.topk_groups;
  p.scaling = params.scaling_factor;
  // The top-k's warp arg-max (router_select.cuh): redux.sync by default, the xor-shuffle butterfly it
  // replaced with MXMOE_ROUTER_ARGMAX=shuffle (read per call, for A/B timing; the same selection).
  p.argmax_shuffle = env_word("routing", "MXMOE_ROUTER_ARGMAX", {"redux", "shuffle"}) == 1 ? 1 : 0;
  // Scores a lane in the top-k (MXMOE_ROUTER_SLOTS, read per call, for A/B timing): unset = the fewest
  // that hold E (4 / 8 / 16); 16 was the only choice before session 14.
  p.slots = env_choice("routing", "MXMOE_ROUTER_SLOTS", 0, {0, 4, 8, 16});
  if (p.slots != 0 && 32 * p.slots < num_experts)
    throw_arg("routing", "MXMOE_ROUTER_SLOTS", to_str(p.slots), "32 x slots must be >= num_experts (" + to_str(num_experts) + ")");
  // The decode router's CTAs a cluster (read per call, for A/B timing; the same ids and weights):
  // unset = by rule (warp_decode_router_sm90.cu router_cluster_size), 8 or 16 forces one.
  p.cluster = env_choice("routing", "MXMOE_ROUTER_CLUSTER", 0, {0, 8, 16});
  // The decode router's chunks of Wr in flight a lane: unset = by rule (router_unroll), or 8 / 16.
  p.unroll = env_choice("routing", "MXMOE_ROUTER_UNROLL", 0, {0, 8, 16});
  // The decode router's X: a copy in shared memory (default, 1) or read from global memory (0).
  p.x_global = env_choice("routing", "MXMOE_ROUTER_XSMEM", 1, {0, 1}) == 0 ? 1 : 0;
  // The selection's forms (router_select.cuh; decode.md "Session 16", "Run 126"): group warps (default;
  // in the fused step and the training layer's top-k the same as parallel), parallel, or the serial forms
  // before session 16 (read per call, for A/B timing; every form the same selection).
  constexpr RouterSelectForm kForms[] = {kSelectParallel, kSelectSerial, kSelectGroupWarps};
  const int form = env_word("routing", "MXMOE_ROUTER_SELECT", {"parallel", "serial", "groupwarps"});
  p.select_form = form < 0 ? kSelectGroupWarps : kForms[form];
  return p;
}

}  // namespace detail

}  // namespace mxmoe
