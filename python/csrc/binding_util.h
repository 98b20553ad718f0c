// Shared helpers of the binding's op files (python/csrc/*.cpp): argument checks whose messages
// name the argument ("mxmoe.<op>: argument '<arg>' ..."), the C++-API call wrapper that turns
// mxmoe::Error into ValueError and mxmoe::CudaError into RuntimeError, the current stream, and
// typed data pointers. Header-only; everything is inline in namespace mxmoe_torch.
#pragma once
#include <cstdint>
#include <string>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>

#include "mxmoe/error.h"

namespace mxmoe_torch {

using at::Tensor;
using c10::ScalarType;

constexpr ScalarType kFp8 = ScalarType::Float8_e4m3fn;
constexpr ScalarType kU8 = ScalarType::Byte;
constexpr ScalarType kI32 = ScalarType::Int;
constexpr ScalarType kBf16 = ScalarType::BFloat16;
constexpr ScalarType kF32 = ScalarType::Float;

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- argument checks (each message: "mxmoe.<op>: argument '<arg>' ...") ----------------------
struct Checker {
  const char* op;
  c10::Device device{c10::kCPU};  // the device of the first tensor checked (the op's device)
  bool have_device = false;

  void device_of(const char* arg, const Tensor& t) {
    TORCH_CHECK(t.defined(), "mxmoe.", op, ": argument '", arg, "' is undefined");
    TORCH_CHECK(t.is_cuda(), "mxmoe.", op, ": argument '", arg,
                "' must be a CUDA tensor, got a tensor on ", t.device());
    if (!have_device) {
      device = t.device();
      have_device = true;
    }
    TORCH_CHECK(t.device() == device, "mxmoe.", op, ": argument '", arg, "' must be on ", device,
                " (the device of the op's first tensor argument), got ", t.device());
  }
  void dtype(const char* arg, const Tensor& t, ScalarType want) {
    TORCH_CHECK(t.scalar_type() == want, "mxmoe.", op, ": argument '", arg, "' must have dtype ",
                c10::toString(want), ", got ", c10::toString(t.scalar_type()));
  }
  void dim(const char* arg, const Tensor& t, int64_t want) {
    TORCH_CHECK(t.dim() == want, "mxmoe.", op, ": argument '", arg, "' must be ", want,
                "-D, got shape ", t.sizes());
  }
  void shape(const char* arg, const Tensor& t, at::IntArrayRef want) {
    TORCH_CHECK(t.sizes() == want, "mxmoe.", op, ": argument '", arg, "' must have shape ", want,
                ", got ", t.sizes());
  }
  void contiguous(const char* arg, const Tensor& t) {
    TORCH_CHECK(t.is_contiguous(), "mxmoe.", op, ": argument '", arg,
                "' must be contiguous (row-major); call .contiguous() first");
  }
  void aligned(const char* arg, const Tensor& t, uintptr_t align) {
    TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % align == 0, "mxmoe.", op,
                ": argument '", arg, "' must be ", align,
                "-byte aligned (its storage offset breaks the alignment; call .clone() first)");
  }
  // The usual combination: on the op's device, given dtype, contiguous, aligned.
  void tensor(const char* arg, const Tensor& t, ScalarType want, uintptr_t align) {
    device_of(arg, t);
    dtype(arg, t, want);
    contiguous(arg, t);
    aligned(arg, t, align);
  }
  void value(bool ok, const char* arg, int64_t v, const std::string& what) {
    TORCH_CHECK_VALUE(ok, "mxmoe.", op, ": argument '", arg, "' = ", v, ": ", what);
  }
};

// Runs a C++ API call: mxmoe::Error (bad argument) becomes ValueError, mxmoe::CudaError
// RuntimeError; both keep the API's message, which names the argument.
template <class F>
inline void call_api(F&& f) {
  try {
    f();
  } catch (const mxmoe::Error& e) {
    TORCH_CHECK_VALUE(false, e.what());
  } catch (const mxmoe::CudaError& e) {
    TORCH_CHECK(false, e.what());
  }
}

inline cudaStream_t current_stream(const c10::Device& d) {
  return c10::cuda::getCurrentCUDAStream(d.index()).stream();
}

template <class T>
inline T* ptr(const Tensor& t) {
  return t.defined() ? reinterpret_cast<T*>(t.data_ptr()) : nullptr;
}

inline const __nv_bfloat16* bf16_ptr(const Tensor& t) { return ptr<const __nv_bfloat16>(t); }

}  // namespace mxmoe_torch
