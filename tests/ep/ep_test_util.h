// Helpers shared by the multi-process EP tests (tests/ep/ep_test.cu, tests/ep/ep_layer_test.cu):
// CUDA checks that exit(2), the launcher's environment, device buffers, BF16 rounding, the
// communicator for this process.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "mxmoe/ep.h"

#define CK(call)                                                                                              \
  do {                                                                                                        \
    cudaError_t e_ = (call);                                                                                  \
    if (e_ != cudaSuccess) {                                                                                  \
      std::fprintf(stderr, "ERROR %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));       \
      std::exit(2);                                                                                           \
    }                                                                                                         \
  } while (0)

namespace ep_test {

inline int env_int(const char* name, int dflt) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : dflt;
}

template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    CK(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)));
    CK(cudaMemset(p, 0xA5, std::max<size_t>(1, n) * sizeof(T)));
    CK(cudaDeviceSynchronize());  // the poison must land before any (non-blocking) stream writes
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  // cudaMemcpy from pageable memory may return before the DMA lands, and the tests' streams are
  // non-blocking: wait for it before anything reads the buffer.
  void up(const std::vector<T>& h) {
    CK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
  }
  template <class U = T>
  std::vector<U> down(size_t count) const {
    static_assert(sizeof(U) == sizeof(T), "same element size");
    std::vector<U> h(count);
    CK(cudaMemcpy(h.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

inline uint16_t bf16_bits(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

inline float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.f : v[v.size() / 2];
}

// This process's rank in the launcher's world (scripts/ep_launch.sh).
struct World {
  int rank = 0, size = 1, local_rank = 0;
  uint32_t seed = 12345;
  const char* id_file = nullptr;
};

// Reads the environment; prints SKIP and returns false (exit 0) when there are too few GPUs, and
// exits 2 when a multi-rank run lacks the id file.
inline bool world_from_env(World& w) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach the launcher's pipe as they are printed
  w.rank = env_int("RANK", 0);
  w.size = env_int("WORLD_SIZE", 1);
  w.local_rank = env_int("LOCAL_RANK", w.rank);
  w.seed = uint32_t(env_int("MXMOE_EP_SEED", 12345));
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess) ndev = 0;
  if (ndev < w.size) {
    std::printf("[rank %d] SKIP: %d GPU(s) visible, WORLD_SIZE = %d needs one per rank on this node\n", w.rank, ndev,
                w.size);
    return false;
  }
  // This rank's GPU from the start: anything made before EpComm's own cudaSetDevice (a stream,
  // inputs, a reference layer) would otherwise land on GPU 0 in every process. That is what killed
  // the DSV3-only run on rank 1 with an illegal address (docs/notes/ep.md).
  CK(cudaSetDevice(w.local_rank));
  w.id_file = std::getenv("MXMOE_EP_ID_FILE");
  if (w.size > 1 && w.id_file == nullptr) {
    std::fprintf(stderr, "[rank %d] MXMOE_EP_ID_FILE is not set: start with scripts/ep_launch.sh\n", w.rank);
    std::exit(2);
  }
  std::printf("[rank %d/%d] device %d, seed %u\n", w.rank, w.size, w.local_rank, w.seed);
  return true;
}

// A communicator for case number `index` (each gets its own id file: rank 0 writes it).
inline std::unique_ptr<mxmoe::EpComm> make_comm(const World& w, const mxmoe::EpConfig& cfg, int index) {
  if (w.size == 1)
    return std::make_unique<mxmoe::EpComm>(cfg, w.rank, w.size, mxmoe::EpComm::new_unique_id(), w.local_rank);
  const std::string idf = std::string(w.id_file) + "." + std::to_string(index);
  return std::make_unique<mxmoe::EpComm>(cfg, w.rank, w.size, idf, w.local_rank);
}

}  // namespace ep_test
