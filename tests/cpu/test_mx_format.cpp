// The MX format reference (src/ref/mx_ref.cpp) against independently written formulas:
// brute-force nearest-value search over the 254 finite E4M3 codes, exhaustive over all 65,536
// BF16 bit patterns, plus the named block cases of mx_format.h's policy.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "mxmoe/dequantize.h"
#include "ref/mx_ref.h"

using namespace mxmoe;
using namespace mxmoe::ref;

namespace {

// Independent E4M3 decode: value table built from the bit fields by repeated halving/doubling.
double decode_independent(uint8_t code) {
  int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return NAN;
  double v = (e == 0) ? m / 8.0 : 1.0 + m / 8.0;
  int p = (e == 0) ? -6 : e - 7;
  for (; p > 0; --p) v *= 2;
  for (; p < 0; ++p) v /= 2;
  return s ? -v : v;
}

// Independent conversion: nearest finite E4M3 by exhaustive search; ties go to the code with an
// even mantissa; beyond 448 saturates; NaN maps to 0x7F; the sign of zero is kept.
uint8_t encode_bruteforce(double v) {
  if (std::isnan(v)) return 0x7F;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  const double a = std::fabs(v);
  if (a > 448.0) return sign | 0x7E;
  uint8_t best = 0;
  double best_d = INFINITY;
  for (int c = 0; c <= 0x7E; ++c) {
    double d = std::fabs(decode_independent(uint8_t(c)) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best_d = d;
      best = uint8_t(c);
    }
  }
  return sign | best;
}

std::vector<float> block_of(std::initializer_list<float> head, float fill = 0.0f) {
  std::vector<float> b(32, fill);
  int i = 0;
  for (float v : head) b[i++] = v;
  return b;
}

}  // namespace

TEST(E4M3, DecodeAllCodes) {
  for (int c = 0; c < 256; ++c) {
    double a = e4m3_to_double(uint8_t(c)), b = decode_independent(uint8_t(c));
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(a)) << "code " << c;
    } else {
      EXPECT_EQ(a, b) << "code " << c;
    }
  }
  EXPECT_EQ(e4m3_to_double(0x7E), 448.0);
  EXPECT_EQ(e4m3_to_double(0x01), std::ldexp(1.0, -9));
}

TEST(E4M3, AllBf16PatternsAtUnitScale) {
  for (uint32_t p = 0; p < 65536; ++p) {
    const double v = bf16_to_float(uint16_t(p));
    ASSERT_EQ(e4m3_from_double(v), encode_bruteforce(v)) << "bf16 bits 0x" << std::hex << p;
  }
}

TEST(E4M3, AllBf16PatternsAtScales) {
  // The quantizer converts x·2^-e; check the conversion over all patterns at several exponents.
  for (int e : {-127, -20, -7, -1, 1, 5, 20, 120, 127}) {
    for (uint32_t p = 0; p < 65536; ++p) {
      const double v = std::ldexp(double(bf16_to_float(uint16_t(p))), -e);
      ASSERT_EQ(e4m3_from_double(v), encode_bruteforce(v)) << "bf16 bits 0x" << std::hex << p
                                                           << " e=" << std::dec << e;
    }
  }
}

TEST(E4M3, TiesRoundToEven) {
  // Halfway between 1.0 (0x38) and 1.125 (0x39) → even mantissa 1.0; between 1.125 and 1.25 → 1.25.
  EXPECT_EQ(e4m3_from_double(1.0625), 0x38);
  EXPECT_EQ(e4m3_from_double(1.1875), 0x3A);
  // Subnormal ties: 1.5 · 2^-9 → 2 · 2^-9 (code 2); 0.5 · 2^-9 → 0.
  EXPECT_EQ(e4m3_from_double(1.5 * std::ldexp(1.0, -9)), 0x02);
  EXPECT_EQ(e4m3_from_double(0.5 * std::ldexp(1.0, -9)), 0x00);
  EXPECT_EQ(e4m3_from_double(-0.5 * std::ldexp(1.0, -9)), 0x80);
  // 464 is the tie between 448 and the (NaN) code above: saturates to 448.
  EXPECT_EQ(e4m3_from_double(464.0), 0x7E);
  EXPECT_EQ(e4m3_from_double(-1e30), 0xFE);
  EXPECT_EQ(e4m3_from_double(INFINITY), 0x7E);
}

TEST(E8M0, RceilIsSmallestCoveringPowerAllBf16) {
  // Independent: walk e upward from -127 until 448·2^e covers amax.
  for (uint32_t p = 0; p < 0x7F80; ++p) {  // all non-negative finite bf16
    const double amax = bf16_to_float(uint16_t(p));
    int e = -127;
    while (e < 127 && 448.0 * std::pow(2.0, e) < amax) ++e;
    ASSERT_EQ(scale_exponent(amax, ScaleMode::kRceil), e) << "amax bits 0x" << std::hex << p;
  }
}

TEST(E8M0, FloorIsExponentMinusEightAllBf16) {
  for (uint32_t p = 1; p < 0x7F80; ++p) {
    const double amax = bf16_to_float(uint16_t(p));
    int e = int(std::floor(std::log2(amax))) - 8;  // log2 of a bf16 is exact enough: no bf16 lies
                                                   // within 1e-7 (relative) below a power of two
    e = std::max(-127, std::min(127, e));
    ASSERT_EQ(scale_exponent(amax, ScaleMode::kFloor), e) << "amax bits 0x" << std::hex << p;
  }
  EXPECT_EQ(scale_exponent(0.0, ScaleMode::kFloor), -127);
}

TEST(Block, AllZero) {
  auto b = block_of({}, 0.0f);
  b[3] = -0.0f;
  uint8_t codes[32];
  EXPECT_EQ(quantize_block(b.data(), 32, ScaleMode::kRceil, codes), 0x00);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(codes[i], i == 3 ? 0x80 : 0x00) << i;
  EXPECT_EQ(quantize_block(b.data(), 32, ScaleMode::kFloor, codes), 0x00);
}

TEST(Block, AmaxExactly448AndJustAbove) {
  uint8_t codes[32];
  auto b = block_of({448.0f, -1.0f, 3.0f});
  EXPECT_EQ(quantize_block(b.data(), 32, ScaleMode::kRceil, codes), 127);  // scale 1
  EXPECT_EQ(codes[0], 0x7E);
  EXPECT_EQ(codes[1], 0xB8);  // -1.0
  // Next bf16 above 448 is 450: rceil needs scale 2; 450/2 = 225 → nearest E4M3 224 (0x76).
  b[0] = bf16_to_float(float_to_bf16(450.0f));
  ASSERT_EQ(b[0], 450.0f);
  EXPECT_EQ(quantize_block(b.data(), 32, ScaleMode::kRceil, codes), 128);
  EXPECT_EQ(codes[0], 0x76);
  // Floor mode keeps scale 1 up to 511.x and saturates: 450 → 448.
  EXPECT_EQ(quantize_block(b.data(), 32, ScaleMode::kFloor, codes), 127);
  EXPECT_EQ(codes[0], 0x7E);
  b[0] = 512.0f;
  EXPECT_EQ(quantize_block(b.data(), 32, ScaleMode::kFloor, codes), 128);
  EXPECT_EQ(codes[0], 0x78);  // 256
}

TEST(Block, SubnormalInputs) {
  // bf16 subnormals (below 2^-126): the scale clamps at 2^-127 and the elements are x·2^127.
  uint8_t codes[32];
  const float tiny = bf16_to_float(0x0010);  // 2^-129
  auto b = block_of({tiny, -tiny * 2, bf16_to_float(0x0001)});
  EXPECT_EQ(quantize_block(b.data(), 32, ScaleMode::kRceil, codes), 0x00);
  EXPECT_EQ(e4m3_to_double(codes[0]), 0.25);   // 2^-129 · 2^127
  EXPECT_EQ(e4m3_to_double(codes[1]), -0.5);
  EXPECT_EQ(e4m3_to_double(codes[2]), std::ldexp(1.0, -6));  // 2^-133 · 2^127
}

TEST(Block, NanAndInfPoisonTheBlock) {
  uint8_t codes[32];
  for (float bad : {NAN, -NAN, INFINITY, -INFINITY}) {
    auto b = block_of({1.0f, 2.0f}, 0.5f);
    b[17] = bad;
    for (ScaleMode mode : {ScaleMode::kRceil, ScaleMode::kFloor}) {
      EXPECT_EQ(quantize_block(b.data(), 32, mode, codes), kE8M0Nan);
      for (int i = 0; i < 32; ++i) EXPECT_EQ(codes[i], kE4M3Nan);
    }
  }
}

TEST(Block, LargestAndSmallestScales) {
  uint8_t codes[32];
  const float big = bf16_to_float(0x7F7F);  // largest finite bf16, ≈ 2^128·(1-2^-8)
  auto b = block_of({big, -big});
  EXPECT_EQ(quantize_block(b.data(), 32, ScaleMode::kRceil, codes), 127 + 120);
  EXPECT_EQ(quantize_block(b.data(), 32, ScaleMode::kFloor, codes), 127 + 119);
  EXPECT_EQ(codes[1], 0xFE);  // -448 after saturation in floor mode (2^128·0.996 / 2^119 = 510)
  auto s = block_of({bf16_to_float(0x0001)});  // smallest bf16 subnormal
  EXPECT_EQ(quantize_block(s.data(), 32, ScaleMode::kRceil, codes), 0);
  EXPECT_EQ(quantize_block(s.data(), 32, ScaleMode::kFloor, codes), 0);
}

TEST(Block, RoundTripErrorBound) {
  // Every element of a finite block dequantizes within half an E4M3 ulp (relative 2^-4) of x,
  // or within 2^-10·scale in the subnormal range; rceil never saturates.
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (int t = 0; t < 2000; ++t) {
    float b[32];
    float mag = std::ldexp(1.0f, int(rng() % 60) - 30);
    for (float& v : b) v = bf16_to_float(float_to_bf16(g(rng) * mag));
    uint8_t codes[32];
    const uint8_t s = quantize_block(b, 32, ScaleMode::kRceil, codes);
    const double scale = e8m0_to_double(s);
    for (int i = 0; i < 32; ++i) {
      const double d = e4m3_to_double(codes[i]) * scale, err = std::fabs(d - b[i]);
      EXPECT_LE(err, std::max(std::fabs(double(b[i])) / 16.0, std::ldexp(scale, -10)))
          << "x=" << b[i] << " deq=" << d;
    }
  }
}

TEST(Fast, RebaseKeepsMaxBlockAndShiftsOthers) {
  // One row, one 128-chunk: block scales 2^3, 2^0, 2^-2, 2^-12 (different magnitudes).
  std::vector<uint16_t> x(128);
  const float mags[4] = {8.0f * 300, 300, 0.25f * 300, std::ldexp(300.0f, -12)};
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int i = 0; i < 128; ++i) x[i] = float_to_bf16(u(rng) * mags[i / 32] * (i % 32 == 0 ? 1.4f : 1));
  MxMatrix m = quantize_rows(x.data(), 1, 128, ScaleMode::kRceil);
  FastMatrix f = rebase_fast(m);
  int emax = -127;
  for (int b = 0; b < 4; ++b) emax = std::max(emax, int(m.scales[b]) - 127);
  ASSERT_EQ(f.scales.size(), 1u);
  EXPECT_EQ(int(f.scales[0]) - 127, emax);
  std::vector<double> dm = dequantize(m), df = dequantize(f);
  for (int i = 0; i < 128; ++i) {
    const int eb = int(m.scales[i / 32]) - 127;
    if (eb == emax) {
      EXPECT_EQ(f.data[i], m.data[i]) << i;
    }
    // A shifted element is exact while it stays in E4M3's normal range, otherwise it is rounded
    // to the subnormal quantum 2^-9 · 2^E.
    const double tol = (std::fabs(dm[i]) >= std::ldexp(1.0, emax - 6)) ? 0.0 : std::ldexp(1.0, emax - 10);
    EXPECT_LE(std::fabs(df[i] - dm[i]), tol) << i;
  }
}

TEST(Fast, PartialChunkAndNanChunk) {
  // cols = 160: chunks of 128 and 32 columns; a NaN in the second chunk poisons only that chunk.
  std::vector<uint16_t> x(2 * 160);
  for (int i = 0; i < 320; ++i) x[i] = float_to_bf16(float(i % 7) - 3.0f);
  x[160 + 140] = 0x7FC0;  // NaN in row 1, chunk 1
  MxMatrix m = quantize_rows(x.data(), 2, 160, ScaleMode::kRceil);
  FastMatrix f = rebase_fast(m);
  ASSERT_EQ(f.scales.size(), 4u);              // [2 chunks, 2 rows]
  EXPECT_EQ(f.scales[1 * 2 + 1], kE8M0Nan);    // chunk 1, row 1
  EXPECT_NE(f.scales[1 * 2 + 0], kE8M0Nan);
  EXPECT_NE(f.scales[0 * 2 + 1], kE8M0Nan);
  for (int i = 128; i < 160; ++i) EXPECT_EQ(f.data[160 + i], kE4M3Nan);
}

TEST(Matrix, ColwiseIsRowwiseOfTranspose) {
  const int R = 64, C = 96;
  std::vector<uint16_t> x(R * C), xt(R * C);
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> g(0.0f, 3.0f);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) xt[c * R + r] = x[r * C + c] = float_to_bf16(g(rng));
  MxMatrix a = quantize_cols(x.data(), R, C, ScaleMode::kRceil);
  MxMatrix b = quantize_rows(xt.data(), C, R, ScaleMode::kRceil);
  EXPECT_EQ(a.rows, C);
  EXPECT_EQ(a.data, b.data);
  EXPECT_EQ(a.scales, b.scales);
}

// ---- BF16 images (dequantize.h) --------------------------------------------------------------

namespace {

// Independent BF16 decode from the bit fields: sign, 8 exponent bits, 7 mantissa bits.
double bf16_decode_independent(uint16_t bits) {
  const int s = bits >> 15, e = (bits >> 7) & 0xFF, m = bits & 0x7F;
  if (e == 0xFF) return m ? NAN : (s ? -INFINITY : INFINITY);
  const double v = e == 0 ? std::ldexp(double(m), -133) : std::ldexp(1.0 + m / 128.0, e - 127);
  return s ? -v : v;
}

}  // namespace

TEST(BF16Image, RoundsEveryPatternAndEveryMidpoint) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const double v = bf16_decode_independent(uint16_t(b));
    if (std::isnan(v)) {
      EXPECT_EQ(bf16_from_double(v), kBF16Nan) << "pattern " << b;
      continue;
    }
    ASSERT_EQ(bf16_from_double(v), uint16_t(b)) << "pattern " << b << " does not round-trip";
    // Midpoint to the next larger magnitude: ties go to the even pattern; just above it, up.
    const uint16_t next = uint16_t(b + 1);
    if ((b & 0x7FFF) >= 0x7F80 || (next & 0x7FFF) >= 0x7F80) continue;
    const double w = bf16_decode_independent(next), mid = 0.5 * (v + w);
    const uint16_t even = (b & 1) ? next : uint16_t(b);
    EXPECT_EQ(bf16_from_double(mid), even) << "tie between patterns " << b << " and " << int(next);
    EXPECT_EQ(bf16_from_double(std::nextafter(mid, w)), next) << "above the midpoint of " << b;
    EXPECT_EQ(bf16_from_double(std::nextafter(mid, v)), uint16_t(b)) << "below the midpoint of " << b;
  }
  // Named edges: half the smallest subnormal ties to +0, 1.5 of it to 2·2^-133, the midpoint
  // between the largest finite value and 2^128 ties (to even) to Inf, -0 keeps its sign.
  EXPECT_EQ(bf16_from_double(std::ldexp(1.0, -134)), 0x0000);
  EXPECT_EQ(bf16_from_double(std::ldexp(3.0, -134)), 0x0002);
  EXPECT_EQ(bf16_from_double(std::ldexp(2.0 - 1.0 / 256, 127)), 0x7F80);
  EXPECT_EQ(bf16_from_double(-std::ldexp(2.0 - 1.0 / 128, 127)), 0xFF7F);
  EXPECT_EQ(bf16_from_double(-0.0), 0x8000);
}

// The exact scale range of dequantize.h: for bytes [3, 246] every E4M3 code's image decodes to its
// dequantized value; byte 2 rounds some code, byte 247 overflows some code to Inf; NaN in, kBF16Nan out.
TEST(BF16Image, ExactScaleRangeAndNan) {
  EXPECT_EQ(kBF16ExactScaleMin, 3);
  EXPECT_EQ(kBF16ExactScaleMax, 246);
  for (int s = 0; s < 256; ++s) {
    MxMatrix m;  // one row: the 256 codes in 8 blocks, every block with scale byte s
    m.rows = 1;
    m.cols = 256;
    m.data.resize(256);
    for (int c = 0; c < 256; ++c) m.data[size_t(c)] = uint8_t(c);
    m.scales.assign(8, uint8_t(s));
    const std::vector<uint16_t> img = dequantize_bf16(m);
    const std::vector<double> deq = dequantize(m);
    int inexact = 0, inf = 0;
    for (int c = 0; c < 256; ++c) {
      const double got = bf16_decode_independent(img[size_t(c)]);
      if (std::isnan(deq[size_t(c)])) {
        EXPECT_EQ(img[size_t(c)], kBF16Nan) << "code " << c << " scale " << s;
        continue;
      }
      if (std::isinf(got)) ++inf;
      else if (got != deq[size_t(c)] || std::signbit(got) != std::signbit(deq[size_t(c)])) ++inexact;
    }
    const bool in_range = s >= kBF16ExactScaleMin && s <= kBF16ExactScaleMax;
    if (in_range) {
      EXPECT_EQ(inexact + inf, 0) << "scale byte " << s << " is in the exact range";
    } else if (s < kBF16ExactScaleMin) {
      EXPECT_EQ(inf, 0) << "no overflow at small scales (byte " << s << ")";
      if (s == kBF16ExactScaleMin - 1) {
        EXPECT_GT(inexact, 0) << "byte 2 should round some code";
      }
    } else if (s != kE8M0Nan) {
      EXPECT_EQ(inexact, 0) << "large scales only overflow (byte " << s << ")";
      if (s == kBF16ExactScaleMax + 1) {
        EXPECT_GT(inf, 0) << "byte 247 should overflow some code";
      }
    }
  }
}

// The token-blocked index map (dequantize.h): token_blocked_offset against ref::token_blocked (three
// plain loops), a bijection onto [0, rows·cols), and the property the layout exists for: the
// elements of every row in one 128-column block form one contiguous range of rows·128 elements
// (the k-grouped GEMM's 64-token chunks stay inside one block because segments are 128-aligned).
TEST(TokenBlockedImage, IndexMapMatchesReferenceLayout) {
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1, 128}, {3, 256}, {7, 640}, {130, 384}}) {
    std::vector<uint16_t> img(size_t(rows * cols));
    for (size_t i = 0; i < img.size(); ++i) img[i] = uint16_t(i * 2654435761u >> 7);  // distinct-ish tags
    const std::vector<uint16_t> blk = token_blocked(img, rows, cols);
    ASSERT_EQ(blk.size(), img.size());
    std::vector<int> hits(img.size(), 0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t o = token_blocked_offset(r, c, rows);
        ASSERT_GE(o, 0);
        ASSERT_LT(o, rows * cols);
        ++hits[size_t(o)];
        ASSERT_EQ(blk[size_t(o)], img[size_t(r * cols + c)]) << rows << " x " << cols << " at [" << r << ", " << c << "]";
        // block c/128 occupies [b·rows·128, (b+1)·rows·128); row r's piece of it is 128 contiguous elements
        const int64_t b = c / 128;
        ASSERT_GE(o, b * rows * 128);
        ASSERT_LT(o, (b + 1) * rows * 128);
        ASSERT_EQ(o - token_blocked_offset(r, b * 128, rows), c % 128);
      }
    for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << "offset " << i << " hit " << hits[i] << " times";
  }
  static_assert(token_blocked_offset(5, 300, 7) == (2 * 7 + 5) * 128 + 44, "constexpr, as documented");
  EXPECT_EQ(kImageBlockCols, 128);
}
