// PyTorch binding of the MXFP8 MoE training layer (include/mxmoe/moe_layer.h): ops
// torch.ops.mxmoe.moe_layer_*, used by the autograd-aware module mxmoe.torch.MoE.
//
// Why layers live in a registry keyed by an int handle, not in a torch custom class
// (torch::class_<...> holding the MoeLayer): torch.compile(fullgraph=True) must trace the module's
// forward and backward. A custom class object reaching a compiled region has to be faked (a
// Python fake class plus __obj_flatten__ for every method called on it), and dynamo's support for
// script objects is still marked experimental. An int is a plain constant to dynamo, so the
// forward and backward ops below trace with ordinary fake implementations (python/mxmoe/_fake.py)
// and nothing in the compiled graph touches the layer object. The Python module owns its handle
// (mxmoe.torch._LayerHandle: destroys it when collected, makes a new one on deepcopy / unpickle).
//
// Lifetime and state of a handle:
//   * moe_layer_create only records and checks the configuration (no GPU needed, so modules can be
//     built on CPU-only machines and traced on meta tensors). The MoeLayer and its workspace are
//     allocated by the first forward, on the device of x.
//   * Grow on demand: a forward with more tokens than the workspace holds (or on another device)
//     re-creates the MoeLayer for roundup(T, 1024) tokens. Freeing the old workspace (cudaFree)
//     waits for the device: a host synchronisation, once per growth. It is refused while the
//     stream is being captured into a CUDA graph (size max_tokens for the largest batch instead).
//   * MoeLayer::backward differentiates the layer's *last* forward. The registry remembers what
//     that forward was called on (device pointers of x and the three weights, token count); a
//     backward called with other tensors (two forwards before their backwards, activation
//     checkpointing, a re-created workspace) first re-runs the forward on its own inputs, which
//     gives the same state bit for bit (the layer is deterministic). Autograd keeps x and the
//     weights alive between forward and backward, so equal pointers mean equal tensors.
//   * Every call runs on the current CUDA stream of x's device under a per-layer mutex (the
//     autograd engine calls backward from its own thread); nothing else synchronises with the host.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "mxmoe/decode.h"
#include "mxmoe/gemm.h"
#include "mxmoe/moe_layer.h"

#include "binding_util.h"  // Checker, call_api, current_stream, ptr

namespace mxmoe_torch {
namespace {

constexpr int64_t kMaxLayerTokens = int64_t(1) << 24;  // MoeLayerConfig::max_tokens limit
constexpr int64_t kGrowAlign = 1024;                   // grown workspaces hold roundup(T, 1024) tokens

// What a forward was called on: enough to tell whether the workspace holds its state.
struct ForwardKey {
  const void *x = nullptr, *wr = nullptr, *w1 = nullptr, *w2 = nullptr;
  int64_t tokens = 0;
  bool operator==(const ForwardKey& o) const {
    return x == o.x && wr == o.wr && w1 == o.w1 && w2 == o.w2 && tokens == o.tokens;
  }
};

struct Slot {
  std::mutex mu;                            // one call at a time on this layer
  mxmoe::MoeLayerConfig cfg;                // cfg.max_tokens: what the (next) workspace holds
  std::unique_ptr<mxmoe::MoeLayer> layer;   // null until the first forward
  int device = -1;                          // CUDA device index of `layer`
  int64_t allocations = 0;                  // how many times a workspace was allocated
  bool have_last = false;                   // the workspace holds the state of `last`
  ForwardKey last;
};

struct Registry {
  std::mutex mu;
  std::unordered_map<int64_t, std::shared_ptr<Slot>> slots;
  int64_t next_id = 1;
};

// Never destroyed: layers still registered at process exit are left to the driver, so no cudaFree
// runs after the CUDA runtime has shut down.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

std::shared_ptr<Slot> find_slot(const char* op, int64_t id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.slots.find(id);
  TORCH_CHECK_VALUE(it != r.slots.end(), "mxmoe.", op, ": argument 'layer' = ", id,
                    " is not a live MoE layer handle (moe_layer_create returns them; destroyed or never made)");
  return it->second;
}

// ---- create / destroy ----------------------------------------------------------------------

int64_t moe_layer_create(int64_t hidden, int64_t inter, int64_t experts, int64_t top_k, bool sigmoid,
                         int64_t n_groups, int64_t topk_groups, double scaling, bool fast,
                         int64_t max_tokens, bool weight_blocks, bool activation_blocks) {
  Checker c{"moe_layer_create"};
  c.value(hidden >= 32 && hidden % 32 == 0 && hidden <= 65536, "hidden", hidden,
          "must be a multiple of 32 in [32, 65536] (MX blocks of 32 run along it)");
  c.value(inter >= 32 && inter % 32 == 0 && inter <= 65536, "inter", inter,
          "must be a multiple of 32 in [32, 65536]");
  c.value(experts >= 1 && experts <= mxmoe::kMaxGemmExperts && experts <= mxmoe::kDecodeMaxExperts,
          "experts", experts, "must be in [1, " + std::to_string(mxmoe::kMaxGemmExperts) + "]");
  c.value(top_k >= 1 && top_k <= mxmoe::kDecodeMaxTopK && top_k <= experts, "top_k", top_k,
          "must be in [1, min(32, experts)]");
  c.value(max_tokens >= 1 && max_tokens <= kMaxLayerTokens, "max_tokens", max_tokens, "must be in [1, 2^24]");
  // MoeLayerConfig::weight_fast_layout = kBlock128 (128x128-block fast weights) is a fast-mode form.
  TORCH_CHECK_VALUE(!weight_blocks || fast, "mxmoe.moe_layer_create: argument 'weight_blocks' = True: "
                    "128x128-block weights are a fast-mode form (fast=False reads BF16 images)");
  // MoeLayerConfig::activation_fast_layout = kBlock128 (the wgrad GEMMs' Xᵀ, Hactᵀ in 128x128 blocks) likewise.
  TORCH_CHECK_VALUE(!activation_blocks || fast, "mxmoe.moe_layer_create: argument 'activation_blocks' = True: "
                    "128x128-block wgrad activations are a fast-mode form (fast=False reads BF16 images)");
  TORCH_CHECK_VALUE(std::isfinite(scaling), "mxmoe.moe_layer_create: argument 'scaling' = ", scaling,
                    ": must be finite");
  if (!sigmoid) {
    c.value(n_groups == 1, "n_groups", n_groups, "must be 1 with softmax routing");
    c.value(topk_groups == 1, "topk_groups", topk_groups, "must be 1 with softmax routing");
    // The layer's softmax router backward (moe_router_backward) has no scaling term.
    TORCH_CHECK_VALUE(scaling == 1.0, "mxmoe.moe_layer_create: argument 'scaling' = ", scaling,
                      ": must be 1.0 with softmax routing (scaling is a sigmoid-routing term)");
  } else {
    c.value(n_groups >= 1 && n_groups <= mxmoe::kDecodeMaxGroups && experts % n_groups == 0, "n_groups",
            n_groups, "must be in [1, " + std::to_string(mxmoe::kDecodeMaxGroups) + "] and divide experts = " +
                          std::to_string(experts));
    c.value(n_groups == 1 || experts / n_groups >= 2, "n_groups", n_groups,
            "groups must hold at least 2 experts (a group scores its top-2)");
    c.value(topk_groups >= 1 && topk_groups <= n_groups, "topk_groups", topk_groups, "must be in [1, n_groups]");
    c.value(top_k <= topk_groups * (experts / n_groups), "top_k", top_k,
            "must be at most topk_groups · experts / n_groups = " +
                std::to_string(topk_groups * (experts / n_groups)));
  }
  auto slot = std::make_shared<Slot>();
  mxmoe::MoeLayerConfig& cfg = slot->cfg;
  cfg.hidden = int(hidden);
  cfg.inter = int(inter);
  cfg.num_experts = int(experts);
  cfg.routing.scoring = sigmoid ? mxmoe::RouterScoring::kSigmoid : mxmoe::RouterScoring::kSoftmax;
  cfg.routing.top_k = int(top_k);
  cfg.routing.renormalize = true;  // the layer's backward needs renormalised weights
  cfg.routing.n_groups = int(n_groups);
  cfg.routing.topk_groups = int(topk_groups);
  cfg.routing.scaling_factor = float(scaling);
  cfg.routing.bias = nullptr;
  cfg.mode = fast ? mxmoe::GemmMode::kFast : mxmoe::GemmMode::kExact;
  cfg.weight_fast_layout = weight_blocks ? mxmoe::FastScaleLayout::kBlock128 : mxmoe::FastScaleLayout::kRow128;
  cfg.activation_fast_layout =
      activation_blocks ? mxmoe::FastScaleLayout::kBlock128 : mxmoe::FastScaleLayout::kRow128;
  cfg.max_tokens = max_tokens;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const int64_t id = r.next_id++;
  r.slots.emplace(id, std::move(slot));
  return id;
}

// Frees the layer's workspace (if any) and forgets the handle. Unknown handles are ignored, so a
// finaliser may run after an explicit destroy.
void moe_layer_destroy(int64_t layer) {
  std::shared_ptr<Slot> slot;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.slots.find(layer);
    if (it == r.slots.end()) return;
    slot = std::move(it->second);
    r.slots.erase(it);
  }
  std::lock_guard<std::mutex> lock(slot->mu);
  slot->layer.reset();  // ~MoeLayer: cudaFree waits for work still using the workspace
}

// ---- forward / backward --------------------------------------------------------------------

struct LayerArgs {
  int64_t tokens = 0;
};

// x BF16 [T, H]; router BF16 [E, H]; w1 BF16 [E, 2I, H]; w2 BF16 [E, H, I]; all on one CUDA
// device, contiguous, 16-byte aligned.
LayerArgs check_layer_args(Checker& c, const Slot& s, const Tensor& x, const Tensor& router,
                           const Tensor& w1, const Tensor& w2) {
  const int64_t H = s.cfg.hidden, I = s.cfg.inter, E = s.cfg.num_experts;
  c.tensor("x", x, kBf16, 16);
  TORCH_CHECK_VALUE(x.dim() == 2 && x.size(1) == H, "mxmoe.", c.op, ": argument 'x' must have shape [T, ", H,
                    "] (tokens, hidden), got ", x.sizes());
  c.tensor("router", router, kBf16, 16);
  c.shape("router", router, {E, H});
  c.tensor("w1", w1, kBf16, 16);
  c.shape("w1", w1, {E, 2 * I, H});
  c.tensor("w2", w2, kBf16, 16);
  c.shape("w2", w2, {E, H, I});
  return LayerArgs{x.size(0)};
}

// Makes sure the slot has a layer on `device` whose workspace holds `tokens` tokens.
void ensure_layer(const char* op, int64_t id, Slot& s, const c10::Device& device, int64_t tokens,
                  cudaStream_t stream) {
  const bool grow = tokens > s.cfg.max_tokens;
  if (s.layer && s.device == device.index() && !grow) return;
  TORCH_CHECK_VALUE(tokens <= kMaxLayerTokens, "mxmoe.", op, ": argument 'x' has ", tokens,
                    " tokens; the layer holds at most 2^24 per call");
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t err = cudaStreamIsCapturing(stream, &capture);
  TORCH_CHECK(err == cudaSuccess, "mxmoe.", op, ": cudaStreamIsCapturing: ", cudaGetErrorString(err));
  TORCH_CHECK(capture == cudaStreamCaptureStatusNone, "mxmoe.", op, ": layer ", id,
              " has to allocate its workspace (", !s.layer ? "first call" : grow ? "more tokens than max_tokens" :
              "new device", ": ", tokens, " tokens on ", device,
              ") while the stream is being captured into a CUDA graph; run one eager step first, or make the "
              "module with max_tokens >= the largest token count");
  if (grow) s.cfg.max_tokens = std::min(kMaxLayerTokens, cdiv(tokens, kGrowAlign) * kGrowAlign);
  s.have_last = false;
  s.layer.reset();  // frees the old workspace first (cudaFree waits for the device)
  call_api([&] { s.layer = std::make_unique<mxmoe::MoeLayer>(s.cfg); });
  s.device = device.index();
  ++s.allocations;
}

void run_forward(Slot& s, const Tensor& x, int64_t tokens, const Tensor& router, const Tensor& w1,
                 const Tensor& w2, const Tensor& out, cudaStream_t stream) {
  s.have_last = false;  // a throwing forward leaves the workspace in an unknown state
  call_api([&] {
    s.layer->forward(bf16_ptr(x), tokens, bf16_ptr(router), bf16_ptr(w1), bf16_ptr(w2),
                     ptr<__nv_bfloat16>(out), stream);
  });
  s.last = ForwardKey{x.data_ptr(), router.data_ptr(), w1.data_ptr(), w2.data_ptr(), tokens};
  s.have_last = true;
}

// out BF16 [T, H] = Σ_j w[t, j] · W2[e_j] · SwiGLU(W1[e_j] · x[t]) (moe_layer.h).
Tensor moe_layer_forward(int64_t layer, const Tensor& x, const Tensor& router, const Tensor& w1,
                         const Tensor& w2) {
  Checker c{"moe_layer_forward"};
  std::shared_ptr<Slot> slot = find_slot(c.op, layer);
  std::lock_guard<std::mutex> lock(slot->mu);
  const LayerArgs a = check_layer_args(c, *slot, x, router, w1, w2);
  Tensor out = at::empty({a.tokens, int64_t(slot->cfg.hidden)}, x.options());
  if (a.tokens == 0) return out;
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = current_stream(x.device());
  ensure_layer(c.op, layer, *slot, x.device(), a.tokens, stream);
  run_forward(*slot, x, a.tokens, router, w1, w2, out, stream);
  return out;
}

// Gradients of the forward on (x, router, w1, w2) for the upstream gradient dout BF16 [T, H]:
// dx BF16 [T, H]; drouter FP32 [E, H]; dw1 FP32 [E, 2I, H]; dw2 FP32 [E, H, I].
std::tuple<Tensor, Tensor, Tensor, Tensor> moe_layer_backward(int64_t layer, const Tensor& dout,
                                                              const Tensor& x, const Tensor& router,
                                                              const Tensor& w1, const Tensor& w2) {
  Checker c{"moe_layer_backward"};
  std::shared_ptr<Slot> slot = find_slot(c.op, layer);
  std::lock_guard<std::mutex> lock(slot->mu);
  c.tensor("dout", dout, kBf16, 16);
  const LayerArgs a = check_layer_args(c, *slot, x, router, w1, w2);
  c.shape("dout", dout, x.sizes());
  const at::TensorOptions f32 = x.options().dtype(kF32);
  Tensor dx = at::empty_like(x);
  if (a.tokens == 0)
    return {dx, at::zeros(router.sizes(), f32), at::zeros(w1.sizes(), f32), at::zeros(w2.sizes(), f32)};
  Tensor dwr = at::empty(router.sizes(), f32), dw1 = at::empty(w1.sizes(), f32), dw2 = at::empty(w2.sizes(), f32);
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = current_stream(x.device());
  ensure_layer(c.op, layer, *slot, x.device(), a.tokens, stream);
  const ForwardKey key{x.data_ptr(), router.data_ptr(), w1.data_ptr(), w2.data_ptr(), a.tokens};
  if (!slot->have_last || !(slot->last == key)) {  // the workspace holds another forward: redo ours
    Tensor scratch = at::empty_like(x);
    run_forward(*slot, x, a.tokens, router, w1, w2, scratch, stream);
  }
  call_api([&] {
    slot->layer->backward(bf16_ptr(dout), bf16_ptr(x), bf16_ptr(router), ptr<__nv_bfloat16>(dx), ptr<float>(dwr),
                          ptr<float>(dw1), ptr<float>(dw2), stream);
  });
  return {dx, dwr, dw1, dw2};
}

// ---- introspection (tests, benchmarks) -----------------------------------------------------

// Copies of the last forward's routing: topk_ids int32 [T, k] (decreasing score, ties to the lower
// id) and topk_weights FP32 [T, k], on the layer's device and its current stream.
std::tuple<Tensor, Tensor> moe_layer_last_routing(int64_t layer) {
  const char* op = "moe_layer_last_routing";
  std::shared_ptr<Slot> slot = find_slot(op, layer);
  std::lock_guard<std::mutex> lock(slot->mu);
  TORCH_CHECK(slot->layer && slot->have_last, "mxmoe.", op, ": layer ", layer, " has no forward to report");
  const c10::Device device(c10::kCUDA, c10::DeviceIndex(slot->device));
  const int64_t T = slot->last.tokens, k = slot->cfg.routing.top_k;
  const at::TensorOptions opts = at::TensorOptions().device(device);
  Tensor ids = at::empty({T, k}, opts.dtype(kI32));
  Tensor weights = at::empty({T, k}, opts.dtype(kF32));
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  for (auto [dst, src] : {std::pair<void*, const void*>{ids.data_ptr(), slot->layer->topk_ids()},
                          {weights.data_ptr(), slot->layer->topk_weights()}}) {
    const cudaError_t err = cudaMemcpyAsync(dst, src, size_t(T * k) * 4, cudaMemcpyDeviceToDevice, stream);
    TORCH_CHECK(err == cudaSuccess, "mxmoe.", op, ": cudaMemcpyAsync: ", cudaGetErrorString(err));
  }
  return {ids, weights};
}

// [device (-1 before the first forward), max_tokens, capacity (padded rows; 0 before the first
//  forward), workspace_bytes, allocations (workspaces allocated so far)].
std::vector<int64_t> moe_layer_info(int64_t layer) {
  std::shared_ptr<Slot> slot = find_slot("moe_layer_info", layer);
  std::lock_guard<std::mutex> lock(slot->mu);
  const bool have = slot->layer != nullptr;
  return {have ? int64_t(slot->device) : -1, slot->cfg.max_tokens, have ? slot->layer->capacity() : 0,
          have ? int64_t(slot->layer->workspace_bytes()) : 0, slot->allocations};
}

}  // namespace
}  // namespace mxmoe_torch

// ---- registration ------------------------------------------------------------------------------
// Schemas: keep the argument names in step with python/mxmoe/torch.py and _fake.py. The ops without
// tensor inputs are registered with their kernel (CompositeImplicitAutograd: they dispatch without
// a tensor); forward and backward get CUDA kernels, and CPU ones that reject CPU tensors naming the
// argument, as the other ops do.
TORCH_LIBRARY_FRAGMENT(mxmoe, m) {
  m.def("moe_layer_create(int hidden, int inter, int experts, int top_k, bool sigmoid=False, int n_groups=1, "
        "int topk_groups=1, float scaling=1.0, bool fast=True, int max_tokens=4096, bool weight_blocks=False, "
        "bool activation_blocks=False) -> int",
        &mxmoe_torch::moe_layer_create);
  m.def("moe_layer_destroy(int layer) -> ()", &mxmoe_torch::moe_layer_destroy);
  m.def("moe_layer_last_routing(int layer) -> (Tensor topk_ids, Tensor topk_weights)",
        &mxmoe_torch::moe_layer_last_routing);
  m.def("moe_layer_info(int layer) -> int[]", &mxmoe_torch::moe_layer_info);
  // needs_fixed_stride_order: inductor must hand these ops the row-major inputs eager mode gives them.
  m.def("moe_layer_forward(int layer, Tensor x, Tensor router, Tensor w1, Tensor w2) -> Tensor",
        {at::Tag::needs_fixed_stride_order});
  m.def("moe_layer_backward(int layer, Tensor dout, Tensor x, Tensor router, Tensor w1, Tensor w2) -> "
        "(Tensor dx, Tensor drouter, Tensor dw1, Tensor dw2)",
        {at::Tag::needs_fixed_stride_order});
}

TORCH_LIBRARY_IMPL(mxmoe, CUDA, m) {
  m.impl("moe_layer_forward", &mxmoe_torch::moe_layer_forward);
  m.impl("moe_layer_backward", &mxmoe_torch::moe_layer_backward);
}
TORCH_LIBRARY_IMPL(mxmoe, CPU, m) {
  m.impl("moe_layer_forward", &mxmoe_torch::moe_layer_forward);
  m.impl("moe_layer_backward", &mxmoe_torch::moe_layer_backward);
}
