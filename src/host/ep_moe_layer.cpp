// EpMoeLayer (include/mxmoe/ep_moe_layer.h): host orchestration, one stream, no host sync in a
// step. The expert part is MoeLayer's own (host/moe_expert_block.h) on this rank's E/R experts;
// the communication is EpComm's (dispatch_bf16 / combine_send). Workspace: one cudaMalloc arena.
//
// Why the bits equal MoeLayer's on the concatenated tokens (docs/notes/ep.md "The EP layer"):
//   - routing: logits by the batch-invariant router kernel (a token's row does not depend on T),
//     top-k per token: same ids and weights.
//   - rows of expert e: the plan over recv_local_ids (R · max_tokens records, u = s·max_tokens + t)
//     is stable in (s, t, j), i.e. in global token order when the reference concatenates the ranks'
//     tokens in rank order; same counts, so the same padded segments.
//   - X and dY are quantized here from the same BF16 rows (sent as BF16) by the same gather
//     quantizer, so row- and column-wise copies (32-token blocks of each segment) are the same bytes.
//   - the grouped GEMMs' output for a row / an expert depends only on that row's (expert's) operands
//     and the shape-only kernel choice (gemm.h: one thread's fixed-order sum per element).
//   - combine and un-permute: moe_combine (forward) and RouterBlock::unpermute (backward, which
//     also adds the router's part of dX) on the same rows in the same slot order; dw: the same
//     kernel (moe_combine_backward_scales) on the same dOut and Y rows.
#include "mxmoe/ep_moe_layer.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "host/check.h"
#include "host/moe_expert_block.h"
#include "host/routing.h"
#include "mxmoe/moe_ops.h"
#include "mxmoe/moe_plan.h"
#include "mxmoe/quantize.h"

namespace mxmoe {

using detail::throw_arg;
using detail::to_str;

namespace {
constexpr const char* kFn = "EpMoeLayer";

// Local checks of the config against itself and the communicator; throws mxmoe::Error.
void check_local(const EpMoeLayerConfig& cfg, const EpComm& comm) {
  const EpConfig& ec = comm.config();
  const int R = comm.world_size();
  if (cfg.hidden < 32 || cfg.hidden % 32 != 0 || cfg.hidden > (1 << 16))
    throw_arg(kFn, "cfg.hidden", to_str(cfg.hidden), "must be a multiple of 32 in [32, 65536]");
  if (cfg.inter < 32 || cfg.inter % 32 != 0 || cfg.inter > (1 << 16))
    throw_arg(kFn, "cfg.inter", to_str(cfg.inter), "must be a multiple of 32 in [32, 65536]");
  if (cfg.num_experts < 1 || cfg.num_experts > kDecodeMaxExperts)
    throw_arg(kFn, "cfg.num_experts", to_str(cfg.num_experts),
              "must be in [1, " + to_str(kDecodeMaxExperts) + "] (the top-k kernel)");
  if (cfg.num_experts % R != 0 || cfg.num_experts / R > kMaxGemmExperts)
    throw_arg(kFn, "cfg.num_experts", to_str(cfg.num_experts),
              "must be a multiple of the world size " + to_str(R) + " with at most " + to_str(kMaxGemmExperts) +
                  " experts per rank");
  if (cfg.max_tokens < 1 || cfg.max_tokens > (int64_t(1) << 24))
    throw_arg(kFn, "cfg.max_tokens", to_str(cfg.max_tokens), "must be in [1, 2^24]");
  if (cfg.mode != GemmMode::kFast && cfg.mode != GemmMode::kExact)
    throw_arg(kFn, "cfg.mode", to_str(int(cfg.mode)), "must be GemmMode::kFast or GemmMode::kExact");
  detail::check_weight_fast_layout(kFn, cfg.mode, cfg.weight_fast_layout, true);
  detail::check_activation_fast_layout(kFn, cfg.mode, cfg.activation_fast_layout, true);
  if (!cfg.routing.renormalize)
    throw_arg(kFn, "cfg.routing.renormalize", "false", "only renormalised routing weights have a backward");
  alignas(16) static int32_t probe_ids[4];
  alignas(16) static float probe_w[4];
  detail::check_routing(kFn, cfg.num_experts, cfg.routing, probe_ids, probe_w);
  const std::pair<const char*, std::pair<int64_t, int64_t>> same[] = {
      {"comm.config().hidden", {ec.hidden, cfg.hidden}},
      {"comm.config().top_k", {ec.top_k, cfg.routing.top_k}},
      {"comm.config().num_experts", {ec.num_experts, cfg.num_experts}},
      {"comm.config().max_tokens", {ec.max_tokens, cfg.max_tokens}}};
  for (const auto& [name, v] : same)
    if (v.first != v.second)
      throw_arg(kFn, name, to_str(v.first), "must equal the layer's value " + to_str(v.second));
  if (!ec.bf16_rows)
    throw_arg(kFn, "comm.config().bf16_rows", "false", "must be true (the layer dispatches BF16 rows)");
}

// MXMOE_EP_FUSED_COMBINE, read on every forward/backward: unset or "1" = the fused combine (the
// expert GEMM writes each row into its owner's combine slot: EpComm::combine_targets +
// m_grouped_mxfp8_gemm_nt_to_rows + EpComm::combine_commit), "0" = the copy path (GEMM into the
// local Y, then EpComm::combine_send). Same bits either way; ranks may differ (same barriers).
bool fused_combine(const char* fn) {
  const char* v = std::getenv("MXMOE_EP_FUSED_COMBINE");
  if (v == nullptr || v[0] == '\0' || std::strcmp(v, "1") == 0) return true;
  if (std::strcmp(v, "0") == 0) return false;
  throw_arg(fn, "MXMOE_EP_FUSED_COMBINE (environment)", v, "must be 0 or 1");
}

}  // namespace

struct EpMoeLayer::Impl {
  EpMoeLayerConfig cfg;
  EpComm* comm = nullptr;
  int R = 1, rank = 0, El = 0, k = 0;
  int64_t maxT = 0, recv_rows = 0, cap = 0;  // recv_rows = R · max_tokens
  size_t bytes = 0;
  uint8_t* arena = nullptr;
  // this rank's tokens
  int32_t* ids = nullptr;          // [maxT, k]
  float* weights = nullptr;        // [maxT, k]
  float* dw = nullptr;             // [maxT, k]
  int32_t* home_row = nullptr;     // [maxT, k]: t·k + j or -1 (a copy of comm.home_rows())
  int32_t* home_token = nullptr;   // [maxT · k]: r / k (constant), the row_index of the home layout
  float* home_row_w = nullptr;     // [maxT · k] scratch (moe_combine_backward_scales' row_w)
  __nv_bfloat16* y_home = nullptr; // [maxT · k, H]: the expert rows Y(t, j) of this rank's tokens
  void** row_dst = nullptr;        // [cap]: each padded row's combine slot (EpComm::combine_targets)
  // the local experts
  MoePlan plan;                    // over recv_local_ids: [recv_rows, k], E/R experts
  void* plan_ws = nullptr;
  size_t plan_ws_bytes = 0;
  float* dw_recv = nullptr;        // [recv_rows, k] scratch (the same dw, computed where Y is)
  detail::ExpertBlock blk;
  detail::RouterBlock router;
  detail::StageTimer timer{"EpMoeLayer"};
  int64_t tokens = -1;             // of the last forward
  // MXMOE_EP_DEBUG_SYNC (read at construction; 0 = off, the default): >= 1 synchronises the device
  // after every stage (checkpoint) and throws naming the first stage whose work failed, or whose
  // device barrier timed out; 2 also prints each stage as it completes (stderr), so a hang shows
  // the last stage reached. Skipped while the stream is being captured.
  int debug_sync = 0;

  size_t carve(uint8_t* base) {
    detail::Carver c(base);
    const int64_t H = cfg.hidden;
    ids = c.take_n<int32_t>(size_t(maxT * k));
    weights = c.take_n<float>(size_t(maxT * k));
    dw = c.take_n<float>(size_t(maxT * k));
    home_row = c.take_n<int32_t>(size_t(maxT * k));
    home_token = c.take_n<int32_t>(size_t(maxT * k));
    home_row_w = c.take_n<float>(size_t(maxT * k));
    y_home = c.take_n<__nv_bfloat16>(size_t(maxT * k * H));
    row_dst = c.take_n<void*>(size_t(cap));
    detail::carve_plan(c, recv_rows, k, El, cap, plan, plan_ws, plan_ws_bytes);
    dw_recv = c.take_n<float>(size_t(recv_rows * k));
    blk.cap = cap;
    blk.hidden = H;
    blk.inter = cfg.inter;
    blk.experts = El;
    blk.mode = cfg.mode;
    blk.carve(c);
    router.max_tokens = maxT;
    router.hidden = int(H);
    router.experts = cfg.num_experts;
    router.top_k = k;
    router.batch_invariant = true;
    router.carve(c);
    return c.bytes();
  }

  void checkpoint(const char* stage, cudaStream_t stream) {
    if (debug_sync <= 0) return;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) == cudaSuccess && capture != cudaStreamCaptureStatusNone) return;
    const std::string where = "mxmoe::EpMoeLayer: rank " + to_str(rank) + ": MXMOE_EP_DEBUG_SYNC: stage '" + stage +
                              "' (everything before it completed): ";
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess)
      throw CudaError(where + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
    try {
      comm->check(stream);  // the device barriers' timeout flags, NCCL's asynchronous errors
    } catch (const std::exception& x) {
      throw CudaError(where + x.what());
    }
    if (debug_sync >= 2) std::fprintf(stderr, "[EpMoeLayer rank %d] done: %s\n", rank, stage);
  }
  // A profiling mark (the stage `stage` ends here; "" = a start mark) and a debug checkpoint.
  void mark(const char* stage, cudaStream_t stream, const char* checkpoint_name = nullptr) {
    timer.mark(stage, stream);
    checkpoint(checkpoint_name ? checkpoint_name : stage, stream);
  }
  detail::StageMark marker(cudaStream_t stream) {
    return [this, stream](const char* stage) { mark(stage, stream); };
  }
  const int32_t* rows_used() const { return plan.padded_offsets + El; }
  // The fused combine's row addresses for the current plan, made by every pass that uses them (a
  // few microseconds; no host state to go stale between eager and captured passes).
  void* const* combine_targets(cudaStream_t stream) {
    comm->combine_targets(plan.row_index, plan.row_of, cap, rows_used(), row_dst, stream);
    return row_dst;
  }
};

EpMoeLayer::EpMoeLayer(const EpMoeLayerConfig& cfg, EpComm& comm) : impl_(new Impl) {
  Impl& m = *impl_;
  try {
    std::string err;
    try {
      check_local(cfg, comm);
      detail::check_current_device(kFn, comm.device());  // the workspace goes to the current device
    } catch (const std::exception& e) {
      err = e.what();
    }
    // Every rank must use the same layer config; a bad one anywhere stops every rank.
    const RouterParams& rp = cfg.routing;
    uint32_t scaling_bits = 0;
    std::memcpy(&scaling_bits, &rp.scaling_factor, 4);
    const int64_t vals[] = {cfg.hidden, cfg.inter, cfg.num_experts, int64_t(cfg.mode), cfg.max_tokens,
                            rp.top_k, int64_t(rp.scoring), rp.renormalize ? 1 : 0, rp.n_groups, rp.topk_groups,
                            int64_t(scaling_bits), rp.bias != nullptr ? 1 : 0};
    const char* names[] = {"cfg.hidden", "cfg.inter", "cfg.num_experts", "cfg.mode", "cfg.max_tokens",
                           "cfg.routing.top_k", "cfg.routing.scoring", "cfg.routing.renormalize",
                           "cfg.routing.n_groups", "cfg.routing.topk_groups", "cfg.routing.scaling_factor (bits)",
                           "cfg.routing.bias (given)"};
    comm.agree(kFn, vals, names, int(sizeof vals / sizeof vals[0]), err);

    m.cfg = cfg;
    m.comm = &comm;
    m.R = comm.world_size();
    m.rank = comm.rank();
    if (const char* dbg = std::getenv("MXMOE_EP_DEBUG_SYNC")) m.debug_sync = std::atoi(dbg);
    m.El = cfg.num_experts / m.R;
    m.k = cfg.routing.top_k;
    m.maxT = cfg.max_tokens;
    m.recv_rows = int64_t(m.R) * m.maxT;
    m.cap = moe_plan_capacity(m.recv_rows, m.k, m.El);
    std::string alloc_err;
    try {
      m.bytes = m.carve(nullptr);
      MXMOE_CUDA_CHECK(kFn, cudaMalloc(&m.arena, m.bytes));
      m.carve(m.arena);
      m.router.create();
      std::vector<int32_t> tok(size_t(m.maxT * m.k));
      for (size_t r = 0; r < tok.size(); ++r) tok[r] = int32_t(r / size_t(m.k));
      MXMOE_CUDA_CHECK(kFn, cudaMemcpy(m.home_token, tok.data(), tok.size() * 4, cudaMemcpyHostToDevice));
    } catch (const std::exception& e) {
      alloc_err = std::string(e.what()) + " (workspace of " + to_str(m.bytes) + " bytes)";
    }
    comm.agree(kFn, nullptr, nullptr, 0, alloc_err);
  } catch (...) {
    m.router.destroy();
    if (m.arena) cudaFree(m.arena);
    delete impl_;
    throw;
  }
}

EpMoeLayer::~EpMoeLayer() {
  impl_->router.destroy();
  if (impl_->arena) cudaFree(impl_->arena);
  delete impl_;
}

void EpMoeLayer::forward(const __nv_bfloat16* x, int64_t tokens, const __nv_bfloat16* wr, const __nv_bfloat16* w1,
                         const __nv_bfloat16* w2, __nv_bfloat16* out, cudaStream_t stream) {
  const char* fn = "EpMoeLayer::forward";
  Impl& m = *impl_;
  const EpMoeLayerConfig& c = m.cfg;
  const int64_t H = c.hidden, E = c.num_experts, T = tokens;
  const int k = m.k;
  if (T < 0 || T > m.maxT) throw_arg(fn, "tokens", to_str(T), "must be in [0, max_tokens = " + to_str(m.maxT) + "]");
  detail::check_device_ptrs(fn, {{"wr", wr}, {"w1", w1}, {"w2", w2}});
  if (T > 0)
    detail::check_device_ptrs(fn, {{"x", x}, {"out", out}});
  detail::check_on_device(fn, m.comm->device(), stream, {{"x", x}, {"wr", wr}, {"w1", w1}, {"w2", w2}, {"out", out}});
  const bool fused = fused_combine(fn);
  m.timer.restart(stream);
  m.checkpoint("forward entry (the caller's work before it)", stream);
  // 1-2. routing of this rank's tokens
  if (T > 0) {
    m.router.forward(x, T, wr, stream);
    m.checkpoint("router logits (batch-invariant GEMM)", stream);
    moe_topk(m.router.logits, T, int(E), c.routing, m.ids, m.weights, stream);
  }
  m.mark("router GEMM (batch-invariant) + top-k", stream);
  // 3. BF16 rows to the ranks of their experts (every rank takes part, also with T = 0)
  m.comm->dispatch_bf16(x, m.ids, nullptr, T, stream);
  m.mark("dispatch (BF16 rows)", stream);
  // 4. plan over the received records, gather + quantize both ways (col: the W1 wgrad operand)
  moe_plan(m.comm->recv_local_ids(), m.recv_rows, k, m.El, m.cap, m.plan_ws, m.plan_ws_bytes, m.plan, stream);
  m.checkpoint("local plan (moe_plan)", stream);
  const MxOut xr = m.blk.x_row.out(), xc = m.blk.x_col.out();
  quantize_mxfp8_gather(m.comm->recv_bf16_rows(), m.recv_rows, H, m.plan.row_index, m.cap, m.rows_used(), &xr, &xc,
                        ScaleMode::kRceil, stream);
  m.mark("local plan + gather-quantize x", stream);
  // 5. local experts' weights, both ways
  m.blk.quantize_weights(w1, w2, stream);
  m.mark("quantize W1, W2 (both ways)", stream);
  // 6-8. GEMM1, SwiGLU + quantize, GEMM2 (MoeLayer's launches; fused: GEMM2 writes each row into
  //      its owner's combine slot, docs/notes/ep.md "Fused combine")
  m.blk.forward(m.plan.padded_offsets, stream, m.marker(stream), fused ? m.combine_targets(stream) : nullptr);
  // 9. rows back to the tokens' ranks (fused: only the barriers that publish them); keep them (dw in
  //    backward) and sum in slot order
  if (fused) m.comm->combine_commit(T, stream);
  else m.comm->combine_send(m.blk.y, m.cap, m.plan.row_of, T, stream);
  m.mark(fused ? "combine (barrier; rows written by GEMM2)" : "combine (rows to owners)", stream);
  if (T > 0) {
    MXMOE_CUDA_CHECK(fn, cudaMemcpyAsync(m.y_home, m.comm->combine_rows(), size_t(T * k * H) * 2,
                                         cudaMemcpyDeviceToDevice, stream));
    MXMOE_CUDA_CHECK(fn, cudaMemcpyAsync(m.home_row, m.comm->home_rows(), size_t(T * k) * 4,
                                         cudaMemcpyDeviceToDevice, stream));
    moe_combine(m.y_home, T * k, H, m.home_row, m.weights, T, k, nullptr, out, stream);
  }
  m.mark("combine sum", stream);
  m.tokens = T;
}

void EpMoeLayer::backward(const __nv_bfloat16* dout, const __nv_bfloat16* x, const __nv_bfloat16* wr,
                          __nv_bfloat16* dx, float* dwr, float* dw1, float* dw2, cudaStream_t stream) {
  const char* fn = "EpMoeLayer::backward";
  Impl& m = *impl_;
  const EpMoeLayerConfig& c = m.cfg;
  const int64_t H = c.hidden, E = c.num_experts, T = m.tokens;
  const int k = m.k;
  if (T < 0) throw Error("mxmoe::EpMoeLayer::backward: no forward to differentiate (call forward first)");
  detail::check_device_ptrs(fn, {{"wr", wr}, {"dwr", dwr}, {"dw1", dw1}, {"dw2", dw2}});
  if (T > 0)
    detail::check_device_ptrs(fn, {{"dout", dout}, {"x", x}, {"dx", dx}});
  detail::check_on_device(fn, m.comm->device(), stream,
                          {{"dout", dout}, {"x", x}, {"wr", wr}, {"dx", dx}, {"dwr", dwr}, {"dw1", dw1}, {"dw2", dw2}});
  const bool fused = fused_combine(fn);
  m.mark("", stream, "backward entry (the caller's work since forward)");
  // 1. at the owner: dw = dOut · Y(t, j) on the kept rows, then the router's backward
  if (T > 0) {
    moe_combine_backward_scales(dout, m.y_home, T * k, H, nullptr, m.home_token, m.home_row, m.weights, T, k,
                                m.home_row_w, m.dw, stream);
    m.checkpoint("bwd: dw (routing-weight grad)", stream);
    m.router.backward(x, T, wr, m.ids, m.dw, c.routing, dwr, stream);
  } else {
    MXMOE_CUDA_CHECK(fn, cudaMemsetAsync(dwr, 0, size_t(E * H) * 4, stream));
  }
  m.mark("bwd: dw + router backward", stream);
  // 2. dOut rows and routing weights to the experts' ranks
  m.comm->dispatch_bf16(dout, m.ids, m.weights, T, stream);
  m.mark("bwd: dispatch (BF16 dOut + weights)", stream);
  // 3. each padded row's weight (and the same dw again, unused; from blk.y, which the fused forward
  //    leaves stale: only row_w is used), then dY = bf16(w · dOut) gathered
  //    into the local layout and quantized both ways in one pass
  moe_combine_backward_scales(m.comm->recv_bf16_rows(), m.blk.y, m.cap, H, m.rows_used(), m.plan.row_index,
                              m.plan.row_of, m.comm->recv_weights(), m.recv_rows, k, m.blk.row_w, m.dw_recv, stream);
  const MxOut dyr = m.blk.dy_row.out(), dyc = m.blk.dy_col.out();
  quantize_mxfp8_gather_scaled(m.comm->recv_bf16_rows(), m.recv_rows, H, m.plan.row_index, m.blk.row_w, m.cap,
                               m.rows_used(), &dyr, &dyc, ScaleMode::kRceil, stream);
  m.mark("bwd: row weights + gather-quantize dY", stream);
  // 4. W2 dgrad + wgrad, SwiGLU backward + quantize, W1 dgrad + wgrad (MoeLayer's launches)
  //    (fused: the W1 dgrad writes each dX row into its owner's combine slot)
  m.blk.backward(m.plan.padded_offsets, dw1, dw2, stream, m.marker(stream), fused ? m.combine_targets(stream) : nullptr);
  // 5. dX rows back to the owners (fused: the barriers), summed in slot order plus the router's part
  if (fused) m.comm->combine_commit(T, stream);
  else m.comm->combine_send(m.blk.dxp, m.cap, m.plan.row_of, T, stream);
  m.mark(fused ? "bwd: combine (barrier; rows written by W1 dgrad)" : "bwd: combine (dX rows to owners)", stream);
  if (T > 0)
    m.router.unpermute(m.comm->combine_rows(), m.maxT * k, m.home_row, T, wr, dx, stream);
  m.mark("bwd: un-permute dX", stream);
}

void EpMoeLayer::set_profiling(bool on) { impl_->timer.on = on; }
std::vector<std::pair<std::string, float>> EpMoeLayer::stage_times() const { return impl_->timer.times(); }

const int32_t* EpMoeLayer::topk_ids() const { return impl_->ids; }
const float* EpMoeLayer::topk_weights() const { return impl_->weights; }
const float* EpMoeLayer::topk_weight_grads() const { return impl_->dw; }
const float* EpMoeLayer::router_logit_grads() const { return impl_->router.dlogits; }
const int32_t* EpMoeLayer::local_padded_offsets() const { return impl_->plan.padded_offsets; }
int64_t EpMoeLayer::local_capacity() const { return impl_->cap; }
size_t EpMoeLayer::workspace_bytes() const { return impl_->bytes; }

}  // namespace mxmoe
