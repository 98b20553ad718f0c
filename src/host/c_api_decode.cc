// C ABI of the warp-decode path (include/mxmoe/decode.h) for ctypes (bench/bench_decode.py).
// Each function returns 0 on success and 1 on failure; mxmoe_last_error() then returns the
// message. Pointers are device pointers (null where optional); `stream` is a cudaStream_t.
// Enums as ints: scoring 0 = softmax, 1 = sigmoid; w_dtype 0 = BF16, 1 = MXFP8;
// h_dtype 0 = FP32, 1 = BF16; path 0 = warp decode, 1 = expert-centric.
//
//   int mxmoe_decode_router(const void* x, int batch, int hidden, const void* router_w,
//                           int num_experts, int top_k, int scoring, int renormalize, int n_groups,
//                           int topk_groups, float scaling_factor, const void* bias,
//                           void* topk_ids, void* topk_weights, void* stream);
//   int mxmoe_decode_gate_up(const void* x, int batch, int hidden, int inter, int w_dtype,
//                            const void* w1_data, const void* w1_scales, const void* shared_data,
//                            const void* shared_scales, int num_experts, const void* topk_ids,
//                            int top_k, void* h, int h_dtype, void* stream);
//   int mxmoe_decode_down(const void* h, int h_dtype, int batch, int inter, int hidden,
//                         int w_dtype, const void* w2_data, const void* w2_scales,
//                         const void* shared_data, const void* shared_scales, int num_experts,
//                         const void* topk_ids, const void* topk_weights, int top_k, void* out,
//                         void* stream);
//   int mxmoe_decode_crossover(int hidden, int inter, int num_experts, int top_k, int shared,
//                              int w_dtype, int* max_batch, int* measured);
//   int mxmoe_decode_prepared_weights_bytes(int num_experts, int n, int k, int shared,
//                                           int64_t* bytes);
//   int mxmoe_decode_prepare_weights(const void* data, const void* scales, const void* shared_data,
//                                    const void* shared_scales, int num_experts, int n, int k,
//                                    void* prepared, int64_t prepared_bytes, void* stream);
//   int mxmoe_decode_expert_centric_workspace_bytes(int batch, int hidden, int inter,
//                                                   int num_experts, int top_k, int shared,
//                                                   int w_dtype, int64_t* bytes);
//   int mxmoe_decode_expert_centric(const void* x, int batch, int hidden, int inter, int w_dtype,
//                                   const void* w1_data, const void* w1_scales,
//                                   const void* w1_shared_data, const void* w1_shared_scales,
//                                   const void* w1_prepared, const void* w2_data,
//                                   const void* w2_scales, const void* w2_shared_data,
//                                   const void* w2_shared_scales, const void* w2_prepared,
//                                   int num_experts, const void* topk_ids,
//                                   const void* topk_weights, int top_k, void* out,
//                                   void* workspace, int64_t workspace_bytes, void* stream);
//   int mxmoe_decode_step_workspace_bytes(int hidden, int inter, int num_experts, int top_k,
//                                         int shared, int w_dtype, int batch, int64_t* bytes);
//   int mxmoe_decode_step(const void* x, int batch, int hidden, int inter, int num_experts,
//                         int top_k, int shared, const void* router_w, int scoring,
//                         int renormalize, int n_groups, int topk_groups, float scaling_factor,
//                         const void* bias, int w_dtype, <the ten w1_/w2_ pointers as above>,
//                         void* topk_ids, void* topk_weights, void* out, void* workspace,
//                         int64_t workspace_bytes, int* path, void* stream);
//   (path may be null; otherwise it receives the path taken.)
//   int mxmoe_decode_step_fused_workspace_bytes(int hidden, int inter, int num_experts, int top_k,
//                                               int shared, int batch, int64_t* bytes);
//   int mxmoe_decode_step_fused_init_workspace(void* workspace, int64_t workspace_bytes, void* stream);
//   int mxmoe_decode_step_fused(<mxmoe_decode_step's arguments without w1_prepared, w2_prepared
//                               and path>);
#include <cstdint>

#include "host/c_api_guard.h"
#include "mxmoe/decode.h"

using mxmoe::detail::c_api_guarded;

namespace {

mxmoe::DecodeWeights weights(int w_dtype, const void* data, const void* scales,
                             const void* shared_data, const void* shared_scales) {
  mxmoe::DecodeWeights w;
  w.dtype = static_cast<mxmoe::DecodeWeightDtype>(w_dtype);
  w.data = data;
  w.scales = static_cast<const uint8_t*>(scales);
  w.shared_data = shared_data;
  w.shared_scales = static_cast<const uint8_t*>(shared_scales);
  return w;
}

mxmoe::DecodeWeights weights(int w_dtype, const void* data, const void* scales,
                             const void* shared_data, const void* shared_scales,
                             const void* prepared) {
  mxmoe::DecodeWeights w = weights(w_dtype, data, scales, shared_data, shared_scales);
  w.prepared = prepared;
  return w;
}

mxmoe::DecodeShape shape(int hidden, int inter, int num_experts, int top_k, int shared) {
  mxmoe::DecodeShape s;
  s.hidden = hidden;
  s.inter = inter;
  s.num_experts = num_experts;
  s.top_k = top_k;
  s.shared_expert = shared != 0;
  return s;
}

mxmoe::RouterParams router_params(int top_k, int scoring, int renormalize, int n_groups,
                                  int topk_groups, float scaling_factor, const void* bias) {
  mxmoe::RouterParams p;
  p.scoring = static_cast<mxmoe::RouterScoring>(scoring);
  p.top_k = top_k;
  p.renormalize = renormalize != 0;
  p.n_groups = n_groups;
  p.topk_groups = topk_groups;
  p.scaling_factor = scaling_factor;
  p.bias = static_cast<const float*>(bias);
  return p;
}

size_t to_size(int64_t bytes) { return bytes < 0 ? 0 : size_t(bytes); }

}  // namespace

extern "C" {

int mxmoe_decode_router(const void* x, int batch, int hidden, const void* router_w,
                        int num_experts, int top_k, int scoring, int renormalize, int n_groups,
                        int topk_groups, float scaling_factor, const void* bias, void* topk_ids,
                        void* topk_weights, void* stream) {
  return c_api_guarded([&] {
    const mxmoe::RouterParams p =
        router_params(top_k, scoring, renormalize, n_groups, topk_groups, scaling_factor, bias);
    mxmoe::decode_router(static_cast<const __nv_bfloat16*>(x), batch, hidden,
                         static_cast<const __nv_bfloat16*>(router_w), num_experts, p,
                         static_cast<int32_t*>(topk_ids), static_cast<float*>(topk_weights),
                         static_cast<cudaStream_t>(stream));
  });
}

int mxmoe_decode_gate_up(const void* x, int batch, int hidden, int inter, int w_dtype,
                         const void* w1_data, const void* w1_scales, const void* shared_data,
                         const void* shared_scales, int num_experts, const void* topk_ids,
                         int top_k, void* h, int h_dtype, void* stream) {
  return c_api_guarded([&] {
    mxmoe::decode_gate_up(static_cast<const __nv_bfloat16*>(x), batch, hidden, inter,
                          weights(w_dtype, w1_data, w1_scales, shared_data, shared_scales),
                          num_experts, static_cast<const int32_t*>(topk_ids), top_k, h,
                          static_cast<mxmoe::DecodeHDtype>(h_dtype),
                          static_cast<cudaStream_t>(stream));
  });
}

int mxmoe_decode_down(const void* h, int h_dtype, int batch, int inter, int hidden, int w_dtype,
                      const void* w2_data, const void* w2_scales, const void* shared_data,
                      const void* shared_scales, int num_experts, const void* topk_ids,
                      const void* topk_weights, int top_k, void* out, void* stream) {
  return c_api_guarded([&] {
    mxmoe::decode_down(h, static_cast<mxmoe::DecodeHDtype>(h_dtype), batch, inter, hidden,
                       weights(w_dtype, w2_data, w2_scales, shared_data, shared_scales),
                       num_experts, static_cast<const int32_t*>(topk_ids),
                       static_cast<const float*>(topk_weights), top_k,
                       static_cast<__nv_bfloat16*>(out), static_cast<cudaStream_t>(stream));
  });
}

int mxmoe_decode_crossover(int hidden, int inter, int num_experts, int top_k, int shared,
                           int w_dtype, int* max_batch, int* measured) {
  return c_api_guarded([&] {
    const mxmoe::DecodeCrossover c = mxmoe::decode_crossover(
        shape(hidden, inter, num_experts, top_k, shared), static_cast<mxmoe::DecodeWeightDtype>(w_dtype));
    if (max_batch) *max_batch = c.max_batch;
    if (measured) *measured = c.measured ? 1 : 0;
  });
}

int mxmoe_decode_prepared_weights_bytes(int num_experts, int n, int k, int shared, int64_t* bytes) {
  return c_api_guarded([&] {
    const size_t b = mxmoe::decode_prepared_weights_bytes(num_experts, n, k, shared != 0);
    if (bytes) *bytes = int64_t(b);
  });
}

int mxmoe_decode_prepare_weights(const void* data, const void* scales, const void* shared_data,
                                 const void* shared_scales, int num_experts, int n, int k,
                                 void* prepared, int64_t prepared_bytes, void* stream) {
  return c_api_guarded([&] {
    mxmoe::decode_prepare_weights(weights(int(mxmoe::DecodeWeightDtype::kMXFP8), data, scales, shared_data,
                                          shared_scales),
                                  num_experts, n, k, prepared, to_size(prepared_bytes),
                                  static_cast<cudaStream_t>(stream));
  });
}

int mxmoe_decode_expert_centric_workspace_bytes(int batch, int hidden, int inter, int num_experts,
                                                int top_k, int shared, int w_dtype, int64_t* bytes) {
  return c_api_guarded([&] {
    const size_t b = mxmoe::decode_expert_centric_workspace_bytes(
        batch, hidden, inter, num_experts, top_k, shared != 0, static_cast<mxmoe::DecodeWeightDtype>(w_dtype));
    if (bytes) *bytes = int64_t(b);
  });
}

int mxmoe_decode_expert_centric(const void* x, int batch, int hidden, int inter, int w_dtype,
                                const void* w1_data, const void* w1_scales, const void* w1_shared_data,
                                const void* w1_shared_scales, const void* w1_prepared, const void* w2_data,
                                const void* w2_scales, const void* w2_shared_data,
                                const void* w2_shared_scales, const void* w2_prepared, int num_experts,
                                const void* topk_ids, const void* topk_weights, int top_k, void* out,
                                void* workspace, int64_t workspace_bytes, void* stream) {
  return c_api_guarded([&] {
    mxmoe::decode_expert_centric(
        static_cast<const __nv_bfloat16*>(x), batch, hidden, inter,
        weights(w_dtype, w1_data, w1_scales, w1_shared_data, w1_shared_scales, w1_prepared),
        weights(w_dtype, w2_data, w2_scales, w2_shared_data, w2_shared_scales, w2_prepared), num_experts,
        static_cast<const int32_t*>(topk_ids), static_cast<const float*>(topk_weights), top_k,
        static_cast<__nv_bfloat16*>(out), workspace, to_size(workspace_bytes), static_cast<cudaStream_t>(stream));
  });
}

int mxmoe_decode_step_workspace_bytes(int hidden, int inter, int num_experts, int top_k, int shared,
                                      int w_dtype, int batch, int64_t* bytes) {
  return c_api_guarded([&] {
    const size_t b = mxmoe::decode_step_workspace_bytes(shape(hidden, inter, num_experts, top_k, shared),
                                                        static_cast<mxmoe::DecodeWeightDtype>(w_dtype), batch);
    if (bytes) *bytes = int64_t(b);
  });
}

int mxmoe_decode_step(const void* x, int batch, int hidden, int inter, int num_experts, int top_k, int shared,
                      const void* router_w, int scoring, int renormalize, int n_groups, int topk_groups,
                      float scaling_factor, const void* bias, int w_dtype, const void* w1_data,
                      const void* w1_scales, const void* w1_shared_data, const void* w1_shared_scales,
                      const void* w1_prepared, const void* w2_data, const void* w2_scales,
                      const void* w2_shared_data, const void* w2_shared_scales, const void* w2_prepared,
                      void* topk_ids, void* topk_weights, void* out, void* workspace, int64_t workspace_bytes,
                      int* path, void* stream) {
  return c_api_guarded([&] {
    const mxmoe::DecodePath p = mxmoe::decode_step(
        static_cast<const __nv_bfloat16*>(x), batch, shape(hidden, inter, num_experts, top_k, shared),
        static_cast<const __nv_bfloat16*>(router_w),
        router_params(top_k, scoring, renormalize, n_groups, topk_groups, scaling_factor, bias),
        weights(w_dtype, w1_data, w1_scales, w1_shared_data, w1_shared_scales, w1_prepared),
        weights(w_dtype, w2_data, w2_scales, w2_shared_data, w2_shared_scales, w2_prepared),
        static_cast<int32_t*>(topk_ids), static_cast<float*>(topk_weights), static_cast<__nv_bfloat16*>(out),
        workspace, to_size(workspace_bytes), static_cast<cudaStream_t>(stream));
    if (path) *path = int(p);
  });
}

int mxmoe_decode_step_fused_workspace_bytes(int hidden, int inter, int num_experts, int top_k, int shared,
                                            int batch, int64_t* bytes) {
  return c_api_guarded([&] {
    const size_t b = mxmoe::decode_step_fused_workspace_bytes(shape(hidden, inter, num_experts, top_k, shared), batch);
    if (bytes) *bytes = int64_t(b);
  });
}

int mxmoe_decode_step_fused_init_workspace(void* workspace, int64_t workspace_bytes, void* stream) {
  return c_api_guarded([&] {
    mxmoe::decode_step_fused_init_workspace(workspace, to_size(workspace_bytes), static_cast<cudaStream_t>(stream));
  });
}

int mxmoe_decode_step_fused(const void* x, int batch, int hidden, int inter, int num_experts, int top_k, int shared,
                            const void* router_w, int scoring, int renormalize, int n_groups, int topk_groups,
                            float scaling_factor, const void* bias, int w_dtype, const void* w1_data,
                            const void* w1_scales, const void* w1_shared_data, const void* w1_shared_scales,
                            const void* w2_data, const void* w2_scales, const void* w2_shared_data,
                            const void* w2_shared_scales, void* topk_ids, void* topk_weights, void* out,
                            void* workspace, int64_t workspace_bytes, void* stream) {
  return c_api_guarded([&] {
    mxmoe::decode_step_fused(
        static_cast<const __nv_bfloat16*>(x), batch, shape(hidden, inter, num_experts, top_k, shared),
        static_cast<const __nv_bfloat16*>(router_w),
        router_params(top_k, scoring, renormalize, n_groups, topk_groups, scaling_factor, bias),
        weights(w_dtype, w1_data, w1_scales, w1_shared_data, w1_shared_scales),
        weights(w_dtype, w2_data, w2_scales, w2_shared_data, w2_shared_scales), static_cast<int32_t*>(topk_ids),
        static_cast<float*>(topk_weights), static_cast<__nv_bfloat16*>(out), workspace, to_size(workspace_bytes),
        static_cast<cudaStream_t>(stream));
  });
}

}  // extern "C"
