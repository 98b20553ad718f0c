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

// A call bound to one GPU (EpComm, EpMoeLayer): the current device and the stream's device must be
// `device`, and each named pointer that is device memory must be that device's. Without this, work
// set up on another device fails late and far away: a test process whose stream and inputs were
// made before EpComm's cudaSetDevice died with an illegal address at an unrelated launch
// (docs/notes/ep.md, "The DeepSeek-V3-size case"). Host, managed and unregistered pointers are not
// judged here.
inline void check_current_device(const char* fn, int device) {
  int current = -1;
  check_cuda(cudaGetDevice(&current), fn, "cudaGetDevice");
  if (current != device)
    throw_arg(fn, "current device", to_str(current),
              "must be the communicator's device " + to_str(device) + " (cudaSetDevice before the call)");
}
inline void check_on_device(const char* fn, int device, cudaStream_t stream, std::initializer_list<NamedPtr> ptrs) {
  check_current_device(fn, device);
  // While capturing, only capture-safe queries: cudaStreamGetDevice (cuStreamGetDevice) is refused
  // during a capture and would invalidate it (NVIDIA/cccl#9119), so the stream and pointer checks
  // run on eager calls only.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &capture), fn, "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) return;
  int of_stream = -1;
  check_cuda(cudaStreamGetDevice(stream, &of_stream), fn, "cudaStreamGetDevice");
  if (of_stream != device)
    throw_arg(fn, "stream", "a stream of device " + to_str(of_stream),
              "must belong to the communicator's device " + to_str(device));
  for (const NamedPtr& q : ptrs) {
    if (q.p == nullptr) continue;
    cudaPointerAttributes at{};
    check_cuda(cudaPointerGetAttributes(&at, q.p), fn, "cudaPointerGetAttributes");
    if (at.type == cudaMemoryTypeDevice && at.device != device)
      throw_arg(fn, q.name, "memory of device " + to_str(at.device),
                "must be on the communicator's device " + to_str(device));
  }
}

}  // namespace mxmoe::detail

// Check the return code of a CUDA runtime call.
#define MXMOE_CUDA_CHECK(fn, call) ::mxmoe::detail::check_cuda((call), fn, #call)
// Check the launch that was just issued (configuration errors surface here).
#define MXMOE_CHECK_LAUNCH(fn) ::mxmoe::detail::check_cuda(cudaGetLastError(), fn, "kernel launch")
