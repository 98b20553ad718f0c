// Host-side argument checks of the decode entry points (include/mxmoe/decode.h), shared by the
// warp-decode launchers (src/host/decode.cpp) and the expert-centric step and dispatcher
// (src/host/decode_expert_centric.cpp). They throw mxmoe::Error naming the argument.
#pragma once
#include <cstdlib>
#include <string>

#include "host/check.h"
#include "mxmoe/decode.h"

namespace mxmoe::detail {

inline constexpr int kDecodeMaxDim = 1 << 16;

// An integer from the environment, read at every call (A/B timing in one process); dflt if unset.
inline int env_int(const char* name, int dflt) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : dflt;
}

inline void check_batch(const char* fn, int batch) {
  if (batch < 1 || batch > kDecodeMaxBatch)
    throw_arg(fn, "batch", to_str(batch), "must be in [1, " + to_str(kDecodeMaxBatch) + "]");
}

inline void check_dim(const char* fn, const char* arg, int v, bool mxfp8) {
  if (v < 32 || v > kDecodeMaxDim || v % 8 != 0)
    throw_arg(fn, arg, to_str(v), "must be a multiple of 8 in [32, " + to_str(kDecodeMaxDim) + "]");
  if (mxfp8 && v % kMxBlock != 0)
    throw_arg(fn, arg, to_str(v), "must be a multiple of 32 for MXFP8 weights (MX blocks run along it)");
}

inline void check_experts(const char* fn, int num_experts) {
  if (num_experts < 1 || num_experts > kDecodeMaxExperts)
    throw_arg(fn, "num_experts", to_str(num_experts), "must be in [1, " + to_str(kDecodeMaxExperts) + "]");
}

inline void check_top_k(const char* fn, const char* arg, int top_k, int num_experts) {
  if (top_k < 1 || top_k > kDecodeMaxTopK || top_k > num_experts)
    throw_arg(fn, arg, to_str(top_k),
              "must be in [1, min(" + to_str(kDecodeMaxTopK) + ", num_experts = " + to_str(num_experts) + ")]");
}

inline void check_ptr(const char* fn, const char* arg, const void* p, uintptr_t align) {
  check_not_null(fn, arg, p);
  check_aligned(fn, arg, p, align);
}

inline bool is_mx(const char* fn, const std::string& name, DecodeWeightDtype d) {
  if (d != DecodeWeightDtype::kBF16 && d != DecodeWeightDtype::kMXFP8)
    throw_arg(fn, (name + ".dtype").c_str(), to_str(int(d)), "must be kBF16 or kMXFP8");
  return d == DecodeWeightDtype::kMXFP8;
}

inline void check_weights(const char* fn, const std::string& name, const DecodeWeights& w) {
  const bool mx = is_mx(fn, name, w.dtype);
  const std::string d = name + ".data", s = name + ".scales", sd = name + ".shared_data",
                    ss = name + ".shared_scales";
  check_ptr(fn, d.c_str(), w.data, 16);
  if (mx) {
    check_not_null(fn, s.c_str(), w.scales);
  } else if (w.scales) {
    throw_arg(fn, s.c_str(), to_str(static_cast<const void*>(w.scales)), "must be null for BF16 weights");
  }
  if (w.shared_data) {
    check_aligned(fn, sd.c_str(), w.shared_data, 16);
    if (mx) check_not_null(fn, ss.c_str(), w.shared_scales);
  }
  if (w.shared_scales && (!mx || !w.shared_data))
    throw_arg(fn, ss.c_str(), to_str(static_cast<const void*>(w.shared_scales)),
              "must be null unless the weights are MXFP8 with a shared expert");
}

}  // namespace mxmoe::detail
