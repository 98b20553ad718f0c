// Helpers shared by the GPU test suites: skip without a GPU, device buffers, random BF16 data,
// and byte-exact comparison that reports the first mismatching coordinate.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "ref/mx_ref.h"

#define MXMOE_REQUIRE_GPU()                                                                     \
  do {                                                                                          \
    int mxmoe_n_dev_ = 0;                                                                       \
    if (cudaGetDeviceCount(&mxmoe_n_dev_) != cudaSuccess || mxmoe_n_dev_ == 0)                  \
      GTEST_SKIP() << "no CUDA GPU on this machine: GPU tests run on the GPU machine "          \
                      "(scripts/gpu_run.sh); CPU tests cover references and argument checks";   \
  } while (0);                                                                                  \
  SCOPED_TRACE(::testing::Message() << "seed " << ::mxmoe::test::fresh_seed()                   \
                                    << " (rerun with MXMOE_TEST_SEED=" << ::mxmoe::test::fresh_seed() << ")")

#define MXMOE_ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << cudaGetErrorString(cudaGetLastError())

namespace mxmoe::test {

template <class T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  DevBuf() = default;
  explicit DevBuf(size_t count, uint8_t poison = 0xA5) : n(count) {
    if (cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)) != cudaSuccess) {
      p = nullptr;
      ADD_FAILURE() << "cudaMalloc of " << n * sizeof(T) << " bytes failed";
      return;
    }
    cudaMemset(p, poison, n * sizeof(T));
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  void upload(const std::vector<T>& h) { cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

// One seed per process (so --gtest_repeat reuses it: to sample seeds, run the binary again);
// MXMOE_TEST_SEED=<n> fixes it, to reproduce a failure (every GPU test's failure message names the
// seed, through MXMOE_REQUIRE_GPU's trace).
inline uint32_t fresh_seed() {
  static const uint32_t s = [] {
    const char* e = std::getenv("MXMOE_TEST_SEED");
    return e != nullptr && e[0] != '\0' ? uint32_t(std::strtoul(e, nullptr, 10)) : std::random_device{}();
  }();
  return s;
}

enum class Dist { kGaussian, kHeavyTailed, kOutlierChannels, kSpecial };

inline const char* dist_name(Dist d) {
  switch (d) {
    case Dist::kGaussian: return "gaussian";
    case Dist::kHeavyTailed: return "heavy-tailed";
    case Dist::kOutlierChannels: return "outlier-channels";
    default: return "special";
  }
}

// Random BF16 [rows, cols]. kSpecial mixes exact 448·2^k values, ±0, BF16 subnormals, E4M3 ties
// and a wide exponent range.
inline std::vector<uint16_t> random_bf16(int64_t rows, int64_t cols, Dist dist, std::mt19937& rng) {
  std::vector<uint16_t> x(size_t(rows * cols));
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::uniform_int_distribution<int> u(0, 1 << 30);
  std::vector<float> chan(size_t(cols), 1.0f);
  if (dist == Dist::kOutlierChannels)
    for (auto& c : chan) c = (u(rng) % 50 == 0) ? 200.0f : 1.0f;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      float v = g(rng);
      switch (dist) {
        case Dist::kGaussian: break;
        case Dist::kHeavyTailed: {  // Student-t with 2 degrees of freedom
          const float a = g(rng), b = g(rng);
          v = v / std::sqrt(0.5f * (a * a + b * b) + 1e-12f);
          break;
        }
        case Dist::kOutlierChannels: v *= chan[size_t(c)]; break;
        case Dist::kSpecial: {
          const int k = u(rng) % 8;
          if (k == 0) v = std::ldexp(448.0f, u(rng) % 40 - 20) * (u(rng) % 2 ? 1 : -1);
          else if (k == 1) v = (u(rng) % 2) ? 0.0f : -0.0f;
          else if (k == 2) v = ref::bf16_to_float(uint16_t(1 + u(rng) % 0x7F));  // subnormal
          else if (k == 3) v = std::ldexp(1.0f + (2 * (u(rng) % 8) + 1) / 16.0f, u(rng) % 20 - 10);  // E4M3 ties
          else v = std::ldexp(v, u(rng) % 60 - 30);
          break;
        }
      }
      x[size_t(r * cols + c)] = ref::float_to_bf16(v);
    }
  }
  return x;
}

// Byte-exact comparison of a [rows, cols] region that starts at `got_off`/`want_off` with row
// strides got_ld/want_ld. Reports the first mismatch.
inline ::testing::AssertionResult bytes_equal(const char* what, const uint8_t* got, int64_t got_ld,
                                              const uint8_t* want, int64_t want_ld, int64_t rows,
                                              int64_t cols) {
  int64_t bad = 0, fr = -1, fc = -1;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      if (got[r * got_ld + c] != want[r * want_ld + c]) {
        if (bad++ == 0) {
          fr = r;
          fc = c;
        }
      }
  if (bad == 0) return ::testing::AssertionSuccess();
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s: %lld mismatches; first at [%lld, %lld]: got 0x%02x, want 0x%02x (seed %u)",
                what, (long long)bad, (long long)fr, (long long)fc, got[fr * got_ld + fc],
                want[fr * want_ld + fc], fresh_seed());
  return ::testing::AssertionFailure() << buf;
}

}  // namespace mxmoe::test
