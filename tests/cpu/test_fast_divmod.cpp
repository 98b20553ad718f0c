// FastDivmod (src/device/fast_divmod.cuh) against integer division.
#include <gtest/gtest.h>

#include <random>

#include "device/fast_divmod.cuh"

TEST(FastDivmod, MatchesDivisionBelow2To31) {
  std::mt19937 rng(std::random_device{}());
  std::vector<uint32_t> ds = {1, 2, 3, 5, 7, 8, 56, 96, 100, 127, 128, 129, 448, 1000, 65535, 65536,
                              (1u << 20) + 1, (1u << 30) - 1, 1u << 30, (1u << 31) - 1};
  for (int i = 0; i < 200; ++i) ds.push_back(1 + rng() % (1u << (1 + rng() % 30)));
  for (uint32_t d : ds) {
    const mxmoe::FastDivmod f(d);
    const uint32_t edges[] = {0u, 1u, d - 1, d, d + 1, 2 * d - 1 < (1u << 31) ? 2 * d - 1 : 0u, (1u << 31) - 1,
                              ((1u << 31) - 1) / d * d, ((1u << 31) - 1) / d * d - 1};
    for (uint32_t n : edges)
      if (n < (1u << 31)) ASSERT_EQ(f.div(n), n / d) << "n=" << n << " d=" << d;
    for (int k = 0; k < 2000; ++k) {
      const uint32_t n = rng() % (1u << 31);
      ASSERT_EQ(f.div(n), n / d) << "n=" << n << " d=" << d;
    }
  }
}
