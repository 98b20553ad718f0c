// C ABI of the MoE layer (bench/bench_layer.py loads it through ctypes). A layer is an opaque
// handle; every call returns 0 on success, else non-zero with mxmoe_last_error() set.
#include <algorithm>
#include <cstdint>
#include <string>

#include "host/c_api_guard.h"
#include "mxmoe/c_api.h"
#include "mxmoe/moe_layer.h"

using mxmoe::detail::c_api_guarded;

extern "C" {

int mxmoe_layer_create_ex(int hidden, int inter, int experts, int top_k, int scoring, int n_groups,
                          int topk_groups, float scaling, const float* bias, int mode, int64_t max_tokens,
                          int weight_fast_layout, int activation_fast_layout, void** handle) {
  return c_api_guarded([&] {
    mxmoe::MoeLayerConfig c;
    c.hidden = hidden;
    c.inter = inter;
    c.num_experts = experts;
    c.routing.scoring = static_cast<mxmoe::RouterScoring>(scoring);
    c.routing.top_k = top_k;
    c.routing.n_groups = n_groups;
    c.routing.topk_groups = topk_groups;
    c.routing.scaling_factor = scaling;
    c.routing.bias = bias;
    c.mode = static_cast<mxmoe::GemmMode>(mode);
    c.max_tokens = max_tokens;
    c.weight_fast_layout = static_cast<mxmoe::FastScaleLayout>(weight_fast_layout);
    c.activation_fast_layout = static_cast<mxmoe::FastScaleLayout>(activation_fast_layout);
    *handle = new mxmoe::MoeLayer(c);
  });
}

int mxmoe_layer_create(int hidden, int inter, int experts, int top_k, int scoring, int n_groups, int topk_groups,
                       float scaling, const float* bias, int mode, int64_t max_tokens, void** handle) {
  return mxmoe_layer_create_ex(hidden, inter, experts, top_k, scoring, n_groups, topk_groups, scaling, bias, mode,
                               max_tokens, 0, 0, handle);
}

int mxmoe_layer_destroy(void* handle) {
  return c_api_guarded([&] { delete static_cast<mxmoe::MoeLayer*>(handle); });
}

int64_t mxmoe_layer_workspace_bytes(void* handle) {
  return int64_t(static_cast<mxmoe::MoeLayer*>(handle)->workspace_bytes());
}

int mxmoe_layer_forward(void* handle, const void* x, int64_t tokens, const void* wr, const void* w1, const void* w2,
                        void* out, void* stream) {
  return c_api_guarded([&] {
    static_cast<mxmoe::MoeLayer*>(handle)->forward(
        static_cast<const __nv_bfloat16*>(x), tokens, static_cast<const __nv_bfloat16*>(wr),
        static_cast<const __nv_bfloat16*>(w1), static_cast<const __nv_bfloat16*>(w2), static_cast<__nv_bfloat16*>(out),
        static_cast<cudaStream_t>(stream));
  });
}

int mxmoe_layer_backward(void* handle, const void* dout, const void* x, const void* wr, void* dx, void* dwr,
                         void* dw1, void* dw2, void* stream) {
  return c_api_guarded([&] {
    static_cast<mxmoe::MoeLayer*>(handle)->backward(
        static_cast<const __nv_bfloat16*>(dout), static_cast<const __nv_bfloat16*>(x),
        static_cast<const __nv_bfloat16*>(wr), static_cast<__nv_bfloat16*>(dx), static_cast<float*>(dwr),
        static_cast<float*>(dw1), static_cast<float*>(dw2), static_cast<cudaStream_t>(stream));
  });
}

int mxmoe_layer_set_profiling(void* handle, int on) {
  return c_api_guarded([&] { static_cast<mxmoe::MoeLayer*>(handle)->set_profiling(on != 0); });
}

// Stage times of the last profiled forward/backward: up to max_stages entries; names are written
// '\n'-separated into names (buffer of names_len bytes, NUL-terminated), *count gets the number.
int mxmoe_layer_stage_times(void* handle, char* names, int names_len, float* ms, int max_stages, int* count) {
  return c_api_guarded([&] {
    const auto st = static_cast<mxmoe::MoeLayer*>(handle)->stage_times();
    std::string joined;
    int n = 0;
    for (const auto& [name, t] : st) {
      if (n == max_stages) break;
      ms[n++] = t;
      joined += name + "\n";
    }
    *count = n;
    const size_t len = std::min(joined.size(), size_t(names_len > 0 ? names_len - 1 : 0));
    std::copy_n(joined.data(), len, names);
    if (names_len > 0) names[len] = '\0';
  });
}

}  // extern "C"
