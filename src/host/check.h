// Host-side argument and CUDA checks shared by every launcher. Checks run before any launch and
// throw mxmoe::Error naming the function and the argument; CUDA failures throw mxmoe::CudaError.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <string>

#include <cuda_runtime.h>

#include "mxmoe/error.h"

namespace mxmoe::detail {

[[noreturn]] inline void throw_arg(const char* fn, const char* arg, const std::string& value,
                                   const std::string& what) {
  std::ostringstream os;
  os << "mxmoe::" << fn << ": argument '" << arg << "'";
  if (!value.empty()) os << " = " << value;
  os << ": " << what;
  throw Error(os.str());
}

template <class T>
std::string to_str(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

inline void check_aligned(const char* fn, const char* arg, const void* p, uintptr_t align) {
  if (reinterpret_cast<uintptr_t>(p) % align != 0)
    throw_arg(fn, arg, to_str(p), "must be " + to_str(align) + "-byte aligned");
}

inline void check_not_null(const char* fn, const char* arg, const void* p) {
  if (p == nullptr) throw_arg(fn, arg, "null", "must be a device pointer");
}

// Each named pointer non-null and `align`-byte aligned, e.g. check_device_ptrs(fn, {{"x", x}, {"out", out}}).
struct NamedPtr {
  const char* name;
  const void* p;
};
inline void check_device_ptrs(const char* fn, std::initializer_list<NamedPtr> ptrs, uintptr_t align = 16) {
  for (const NamedPtr& q : ptrs) {
    check_not_null(fn, q.name, q.p);
    check_aligned(fn, q.name, q.p, align);
  }
}

inline void check_cuda(cudaError_t e, const char* fn, const char* what) {
  if (e != cudaSuccess) {
    std::ostringstream os;
    os << "mxmoe::" << fn << ": " << what << ": " << cudaGetErrorName(e) << " ("
       << cudaGetErrorString(e) << ")";
    throw CudaError(os.str());
  }
}

}  // namespace mxmoe::detail

// Check the return code of a CUDA runtime call.
#define MXMOE_CUDA_CHECK(fn, call) ::mxmoe::detail::check_cuda((call), fn, #call)
// Check the launch that was just issued (configuration errors surface here).
#define MXMOE_CHECK_LAUNCH(fn) ::mxmoe::detail::check_cuda(cudaGetLastError(), fn, "kernel launch")
