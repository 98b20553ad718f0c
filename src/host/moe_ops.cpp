// Host entries of the MoE element-wise/gather kernels: argument checks, then the launch.
#include "mxmoe/moe_ops.h"

#include "host/check.h"
#include "host/routing.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include "kernels/layer/moe_ops_launch.h"

namespace mxmoe {

using detail::check_aligned;
using detail::check_not_null;
using detail::throw_arg;
using detail::to_str;

void moe_topk(const float* logits, int64_t tokens, int num_experts, const RouterParams& params, int32_t* topk_ids,
              float* topk_weights, cudaStream_t stream) {
  const char* fn = "moe_topk";
  if (tokens < 0 || tokens > (int64_t(1) << 30)) throw_arg(fn, "tokens", to_str(tokens), "must be in [0, 2^30]");
  detail::check_routing(fn, num_experts, params, topk_ids, topk_weights);
  if (tokens == 0) return;
  check_not_null(fn, "logits", logits);
  check_aligned(fn, "logits", logits, 4);
  detail::launch_moe_topk(logits, tokens, detail::routing_launch(num_experts, params, topk_ids, topk_weights), stream);
}

void moe_swiglu(const __nv_bfloat16* gu, int64_t rows, int64_t inter, const int32_t* rows_used,
                __nv_bfloat16* h, cudaStream_t stream) {
  const char* fn = "moe_swiglu";
  if (rows < 0) throw_arg(fn, "rows", to_str(rows), "must be >= 0");
  if (inter <= 0 || inter % 8 != 0) throw_arg(fn, "inter", to_str(inter), "must be a positive multiple of 8");
  check_not_null(fn, "gu", gu);
  check_aligned(fn, "gu", gu, 16);
  check_not_null(fn, "h", h);
  check_aligned(fn, "h", h, 16);
  check_aligned(fn, "rows_used", rows_used, 4);
  if (rows == 0) return;
  detail::launch_moe_swiglu(reinterpret_cast<const uint16_t*>(gu), rows, inter, rows_used,
                            reinterpret_cast<uint16_t*>(h), stream);
}

void moe_combine(const __nv_bfloat16* y, int64_t y_rows, int64_t cols, const int32_t* row_of, const float* w,
                 int64_t tokens, int top_k, const float* addend, __nv_bfloat16* out, cudaStream_t stream) {
  const char* fn = "moe_combine";
  if (y_rows < 0) throw_arg(fn, "y_rows", to_str(y_rows), "must be >= 0");
  if (cols <= 0 || cols % 8 != 0) throw_arg(fn, "cols", to_str(cols), "must be a positive multiple of 8");
  if (tokens < 0) throw_arg(fn, "tokens", to_str(tokens), "must be >= 0");
  if (top_k < 1 || top_k > 32) throw_arg(fn, "top_k", to_str(top_k), "must be in [1, 32]");
  if (tokens == 0) return;
  check_not_null(fn, "y", y);
  check_aligned(fn, "y", y, 16);
  check_not_null(fn, "row_of", row_of);
  check_aligned(fn, "row_of", row_of, 4);
  check_aligned(fn, "w", w, 4);
  check_aligned(fn, "addend", addend, 16);
  check_not_null(fn, "out", out);
  check_aligned(fn, "out", out, 16);
  detail::launch_moe_combine(reinterpret_cast<const uint16_t*>(y), y_rows, cols, row_of, w, tokens, top_k, addend,
                             nullptr, reinterpret_cast<uint16_t*>(out), stream);
}

// The combine kernel with one slot, no weights and no addend: out[r] = 1·x[row_index[r]] in FP32,
// rounded to BF16, i.e. the BF16 row itself (−0 becomes +0: the sum starts from +0).
void moe_gather_rows(const __nv_bfloat16* x, int64_t x_rows, int64_t cols, const int32_t* row_index,
                     int64_t out_rows, const int32_t* rows_used, __nv_bfloat16* out, cudaStream_t stream) {
  const char* fn = "moe_gather_rows";
  if (x_rows < 0) throw_arg(fn, "x_rows", to_str(x_rows), "must be >= 0");
  if (cols <= 0 || cols % 8 != 0) throw_arg(fn, "cols", to_str(cols), "must be a positive multiple of 8");
  if (out_rows < 0) throw_arg(fn, "out_rows", to_str(out_rows), "must be >= 0");
  if (out_rows == 0) return;
  check_not_null(fn, "x", x);
  check_aligned(fn, "x", x, 16);
  check_not_null(fn, "row_index", row_index);
  check_aligned(fn, "row_index", row_index, 4);
  check_aligned(fn, "rows_used", rows_used, 4);
  check_not_null(fn, "out", out);
  check_aligned(fn, "out", out, 16);
  detail::launch_moe_combine(reinterpret_cast<const uint16_t*>(x), x_rows, cols, row_index, nullptr, out_rows, 1,
                             nullptr, rows_used, reinterpret_cast<uint16_t*>(out), stream);
}

}  // namespace mxmoe

namespace mxmoe {

namespace {

// Which kernel: MXMOE_COMBINE_BWD unset, empty or "tokens" -> token-major (the default); "rows" ->
// the row-major kernel it replaced (same bits; kept one release for same-process A/B runs). Read on
// every call; any other value throws, so that a typo cannot turn an A/B run into A/A.
detail::CombineBackwardKernel combine_backward_kernel_from_env(const char* fn) {
  const char* e = std::getenv("MXMOE_COMBINE_BWD");
  if (e == nullptr || e[0] == '\0' || std::strcmp(e, "tokens") == 0) return detail::CombineBackwardKernel::kTokens;
  if (std::strcmp(e, "rows") == 0) return detail::CombineBackwardKernel::kRows;
  detail::throw_arg(fn, "MXMOE_COMBINE_BWD", std::string("\"") + e + "\"",
                    "environment variable must be unset, \"tokens\" or \"rows\"");
}

// moe_combine_backward and its _scales form: the same kernels, writing dy (to_dy) or row_w.
void combine_backward_impl(const char* fn, const __nv_bfloat16* dout, const __nv_bfloat16* y, int64_t rows,
                           int64_t cols, const int32_t* rows_used, const int32_t* row_index, const int32_t* row_of,
                           const float* w, int64_t tokens, int top_k, bool to_dy, __nv_bfloat16* dy, float* row_w,
                           float* dw, cudaStream_t stream) {
  if (rows < 0) detail::throw_arg(fn, "rows", detail::to_str(rows), "must be >= 0");
  if (cols <= 0 || cols % 8 != 0) detail::throw_arg(fn, "cols", detail::to_str(cols), "must be a positive multiple of 8");
  if (tokens < 0) detail::throw_arg(fn, "tokens", detail::to_str(tokens), "must be >= 0");
  if (top_k < 1 || top_k > 32) detail::throw_arg(fn, "top_k", detail::to_str(top_k), "must be in [1, 32]");
  if (tokens == 0 || rows == 0) return;
  const struct { const char* n; const void* p; uintptr_t a; } ptrs[] = {
      {"dout", dout, 16}, {"y", y, 16}, {"row_index", row_index, 4}, {"row_of", row_of, 4}, {"w", w, 4},
      {to_dy ? "dy" : "row_w", to_dy ? static_cast<const void*>(dy) : row_w, to_dy ? 16u : 4u}, {"dw", dw, 4}};
  for (const auto& q : ptrs) {
    detail::check_not_null(fn, q.n, q.p);
    detail::check_aligned(fn, q.n, q.p, q.a);
  }
  detail::check_aligned(fn, "rows_used", rows_used, 4);
  const detail::CombineBackwardKernel kernel = combine_backward_kernel_from_env(fn);
  detail::launch_moe_combine_backward(reinterpret_cast<const uint16_t*>(dout), reinterpret_cast<const uint16_t*>(y),
                                      rows, cols, rows_used, row_index, row_of, w, tokens, top_k,
                                      reinterpret_cast<uint16_t*>(dy), row_w, dw, kernel, stream);
}

}  // namespace

void moe_combine_backward(const __nv_bfloat16* dout, const __nv_bfloat16* y, int64_t rows, int64_t cols,
                          const int32_t* rows_used, const int32_t* row_index, const int32_t* row_of, const float* w,
                          int64_t tokens, int top_k, __nv_bfloat16* dy, float* dw, cudaStream_t stream) {
  combine_backward_impl("moe_combine_backward", dout, y, rows, cols, rows_used, row_index, row_of, w, tokens, top_k,
                        true, dy, nullptr, dw, stream);
}

void moe_combine_backward_scales(const __nv_bfloat16* dout, const __nv_bfloat16* y, int64_t rows, int64_t cols,
                                 const int32_t* rows_used, const int32_t* row_index, const int32_t* row_of,
                                 const float* w, int64_t tokens, int top_k, float* row_w, float* dw,
                                 cudaStream_t stream) {
  combine_backward_impl("moe_combine_backward_scales", dout, y, rows, cols, rows_used, row_index, row_of, w, tokens,
                        top_k, false, nullptr, row_w, dw, stream);
}

void moe_swiglu_backward(const __nv_bfloat16* gu, const __nv_bfloat16* dh, int64_t rows, int64_t inter,
                         const int32_t* rows_used, __nv_bfloat16* dgu, cudaStream_t stream) {
  const char* fn = "moe_swiglu_backward";
  if (rows < 0) detail::throw_arg(fn, "rows", detail::to_str(rows), "must be >= 0");
  if (inter <= 0 || inter % 8 != 0) detail::throw_arg(fn, "inter", detail::to_str(inter), "must be a positive multiple of 8");
  for (auto [n, p] : {std::pair<const char*, const void*>{"gu", gu}, {"dh", dh}, {"dgu", dgu}}) {
    detail::check_not_null(fn, n, p);
    detail::check_aligned(fn, n, p, 16);
  }
  detail::check_aligned(fn, "rows_used", rows_used, 4);
  if (rows == 0) return;
  detail::launch_moe_swiglu_backward(reinterpret_cast<const uint16_t*>(gu), reinterpret_cast<const uint16_t*>(dh), rows,
                                     inter, rows_used, reinterpret_cast<uint16_t*>(dgu), stream);
}

void moe_router_backward(const float* logits, const int32_t* topk_ids, const float* dw, int64_t tokens,
                         int num_experts, const RouterParams& params, float* dlogits, cudaStream_t stream) {
  const char* fn = "moe_router_backward";
  if (tokens < 0 || tokens > (int64_t(1) << 30)) detail::throw_arg(fn, "tokens", detail::to_str(tokens), "must be in [0, 2^30]");
  if (!params.renormalize)
    detail::throw_arg(fn, "params.renormalize", "false", "only renormalised routing weights have a backward so far");
  // check_routing checks the (ids, weights) pair; here the ids are inputs and dw takes the weights' place.
  detail::check_routing(fn, num_experts, params, topk_ids, dw);
  if (tokens == 0) return;
  detail::check_not_null(fn, "logits", logits);
  detail::check_aligned(fn, "logits", logits, 4);
  detail::check_not_null(fn, "dlogits", dlogits);
  detail::check_aligned(fn, "dlogits", dlogits, 4);
  detail::RouterLaunch p = detail::routing_launch(num_experts, params, const_cast<int32_t*>(topk_ids), nullptr);
  detail::launch_moe_router_backward(logits, dw, tokens, p, dlogits, stream);
}

}  // namespace mxmoe
