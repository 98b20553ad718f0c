// Division by a run-time constant without a divide instruction: q = (n · m) >> p, with
// m = ceil(2^p / d), p = 31 + ceil(log2 d). Exact for every n < 2^31 (the error term n·(m - 2^p/d)
// / 2^p stays below 2^-ceil(log2 d) <= 1/d, which never crosses the next integer).
// Built on the host, used on the device; tests/cpu/test_fast_divmod.cpp checks it.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define MXMOE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MXMOE_HOST_DEVICE inline
#endif

namespace mxmoe {

struct FastDivmod {
  uint32_t d = 1;
  uint32_t m = 1u << 31;
  uint32_t p = 31;

  FastDivmod() = default;
  explicit FastDivmod(uint32_t divisor) : d(divisor) {
    uint32_t l = 0;
    while ((uint64_t(1) << l) < divisor) ++l;
    p = 31 + l;
    m = uint32_t(((uint64_t(1) << p) + divisor - 1) / divisor);
  }
  // n < 2^31
  MXMOE_HOST_DEVICE uint32_t div(uint32_t n) const {
    return uint32_t((uint64_t(n) * m) >> p);
  }
};

}  // namespace mxmoe
