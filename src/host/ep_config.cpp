// EP configuration checks and window layout (include/mxmoe/ep.h). Pure host code: no CUDA or NCCL
// call, so it lives in the main library and the CPU tests cover it (tests/cpu/test_ep_args.cpp).
#include <cmath>
#include <cstdint>
#include <limits>

#include "host/check.h"
#include "mxmoe/ep.h"

namespace mxmoe {

namespace {
constexpr const char* kFn = "EpComm";
int64_t roundup(int64_t v, int64_t a) { return (v + a - 1) / a * a; }
}  // namespace

void ep_check_config(const EpConfig& cfg, int rank, int world_size) {
  using detail::throw_arg;
  using detail::to_str;
  if (world_size < 1 || world_size > kMaxEpRanks)
    throw_arg(kFn, "world_size", to_str(world_size), "must be in [1, " + to_str(kMaxEpRanks) + "]");
  if (rank < 0 || rank >= world_size)
    throw_arg(kFn, "rank", to_str(rank), "must be in [0, world_size = " + to_str(world_size) + ")");
  if (cfg.hidden <= 0 || cfg.hidden % 32 != 0)
    throw_arg(kFn, "cfg.hidden", to_str(cfg.hidden), "must be a positive multiple of 32");
  if (cfg.num_experts < 1 || cfg.num_experts > kMaxEpExperts)
    throw_arg(kFn, "cfg.num_experts", to_str(cfg.num_experts), "must be in [1, " + to_str(kMaxEpExperts) + "]");
  if (cfg.num_experts % world_size != 0)
    throw_arg(kFn, "cfg.num_experts", to_str(cfg.num_experts),
              "must be divisible by world_size = " + to_str(world_size) + " (experts are sharded evenly)");
  if (cfg.top_k < 1 || cfg.top_k > kMaxEpTopK || cfg.top_k > cfg.num_experts)
    throw_arg(kFn, "cfg.top_k", to_str(cfg.top_k), "must be in [1, min(32, num_experts)]");
  if (cfg.max_tokens < 1 || cfg.max_tokens > (int64_t(1) << 30))
    throw_arg(kFn, "cfg.max_tokens", to_str(cfg.max_tokens), "must be in [1, 2^30]");
  if (cfg.num_ctas < 0 || cfg.num_ctas > kMaxEpCtas)
    throw_arg(kFn, "cfg.num_ctas", to_str(cfg.num_ctas),
              "must be 0 (one per SM) or in [1, " + to_str(kMaxEpCtas) + "]");
  if (!(cfg.timeout_s > 0.0) || !std::isfinite(cfg.timeout_s) || cfg.timeout_s > 3600.0)
    throw_arg(kFn, "cfg.timeout_s", to_str(cfg.timeout_s), "must be in (0, 3600] seconds");
  // Window size: R · max_tokens records + max_tokens · k BF16 rows; keep it below 2^40 bytes and
  // every row index within int32 (the kernels index rows with 32-bit integers).
  const int64_t rows = int64_t(world_size) * cfg.max_tokens;
  if (rows * cfg.top_k > std::numeric_limits<int32_t>::max())
    throw_arg(kFn, "cfg.max_tokens", to_str(cfg.max_tokens),
              "world_size · max_tokens · top_k must fit in int32");
  const int64_t rec = cfg.hidden + roundup(cfg.hidden / 32, 16) + roundup(4 * cfg.top_k, 16);
  double bytes = double(rows) * rec + double(cfg.max_tokens) * cfg.top_k * cfg.hidden * 2.0;
  if (cfg.bf16_rows) bytes += double(rows) * (2.0 * cfg.hidden + 4.0 * cfg.top_k);
  if (bytes > double(int64_t(1) << 40))
    throw_arg(kFn, "cfg.max_tokens", to_str(cfg.max_tokens), "window would exceed 1 TiB");
}

EpWindowLayout ep_window_layout(const EpConfig& cfg, int world_size) {
  ep_check_config(cfg, 0, world_size);
  EpWindowLayout l;
  l.data_bytes = cfg.hidden;
  l.scale_bytes = roundup(cfg.hidden / 32, 16);
  l.ids_bytes = roundup(int64_t(4) * cfg.top_k, 16);
  l.record_bytes = l.data_bytes + l.scale_bytes + l.ids_bytes;
  l.dispatch_offset = 0;
  l.dispatch_bytes = int64_t(world_size) * cfg.max_tokens * l.record_bytes;
  l.combine_offset = roundup(l.dispatch_offset + l.dispatch_bytes, 4096);
  l.combine_bytes = cfg.max_tokens * cfg.top_k * int64_t(cfg.hidden) * 2;
  int64_t end = l.combine_offset + l.combine_bytes;
  if (cfg.bf16_rows) {  // after the combine region, so the other offsets do not depend on it
    const int64_t rows = int64_t(world_size) * cfg.max_tokens;
    l.bf16_offset = roundup(end, 4096);
    l.bf16_bytes = rows * cfg.hidden * 2;
    l.weights_offset = roundup(l.bf16_offset + l.bf16_bytes, 4096);
    l.weights_bytes = rows * cfg.top_k * 4;
    end = l.weights_offset + l.weights_bytes;
  }
  l.total_bytes = roundup(end, 4096);
  return l;
}

}  // namespace mxmoe
