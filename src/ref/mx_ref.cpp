// CPU reference for MXFP8, from the OCP MX v1.0 spec (E4M3 "fn", E8M0) and DESIGN.md §1-2.
// Everything is computed exactly in double: a bf16 or float times a power of two is exact in
// double, and every rounding decision below is made once, explicitly.
#include "ref/mx_ref.h"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <limits>

namespace mxmoe::ref {

float bf16_to_float(uint16_t bits) {
  uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_bf16(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if (std::isnan(v)) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7FFFu + lsb;  // round to nearest even on the dropped 16 bits
  return uint16_t(u >> 16);
}

double e4m3_to_double(uint8_t code) {
  const int sign = code >> 7, exp = (code >> 3) & 0xF, man = code & 0x7;
  if (exp == 0xF && man == 0x7) return std::numeric_limits<double>::quiet_NaN();
  double mag = (exp == 0) ? std::ldexp(double(man), -9)                 // subnormal: m/8 · 2^-6
                          : std::ldexp(1.0 + man / 8.0, exp - 7);       // normal: 1.m · 2^(e-7)
  return sign ? -mag : mag;
}

// Round a non-negative double to the nearest integer, ties to even.
static double rne(double v) {
  double f = std::floor(v), d = v - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return std::fmod(f, 2.0) == 0.0 ? f : f + 1;
}

uint8_t e4m3_from_double(double v) {
  if (std::isnan(v)) return kE4M3Nan;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  const double a = std::fabs(v);
  if (a >= 448.0) return sign | 0x7E;  // satfinite (also ±Inf)
  if (a < std::ldexp(1.0, -6)) {
    // Subnormal range: quantum 2^-9. n == 8 rounds up into the smallest normal, code 0x08.
    return sign | uint8_t(rne(std::ldexp(a, 9)));
  }
  int e2;
  std::frexp(a, &e2);  // a = f · 2^e2, f in [0.5, 1)
  int e = e2 - 1;      // a in [2^e, 2^(e+1)), e in [-6, 8]
  double m = rne((std::ldexp(a, -e) - 1.0) * 8.0);  // 3 mantissa bits
  if (m == 8.0) {
    m = 0.0;
    ++e;
  }
  // a < 448 guarantees the result is at most 448 (e = 8, m = 6): 464 would be a tie to even → 448.
  return sign | uint8_t(((e + 7) << 3) | int(m));
}

double e8m0_to_double(uint8_t byte) {
  if (byte == kE8M0Nan) return std::numeric_limits<double>::quiet_NaN();
  return std::ldexp(1.0, int(byte) - 127);
}

uint16_t bf16_from_double(double v) {
  if (std::isnan(v)) return kBF16Nan;
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0x0000;
  const double a = std::fabs(v);
  if (a < std::ldexp(1.0, -126)) {
    // Subnormal range: quantum 2^-133; n == 128 rounds up into the smallest normal, bits 0x0080.
    return sign | uint16_t(rne(std::ldexp(a, 133)));
  }
  if (a >= std::ldexp(1.0, 128)) return sign | 0x7F80;  // also ±Inf
  int e2;
  std::frexp(a, &e2);  // a = f · 2^e2, f in [0.5, 1)
  int e = e2 - 1;      // a in [2^e, 2^(e+1)), e in [-126, 127]
  double m = rne((std::ldexp(a, -e) - 1.0) * 128.0);  // 7 mantissa bits
  if (m == 128.0) {
    m = 0.0;
    ++e;  // e = 128: rounded past the largest finite value → Inf (bits 0x7F80)
  }
  return sign | uint16_t(((e + 127) << 7) | int(m));
}

int scale_exponent(double amax, ScaleMode mode) {
  int e;
  if (amax == 0.0) {
    e = -127;
  } else if (mode == ScaleMode::kRceil) {
    // Smallest e with amax <= 448 · 2^e, found by exact comparisons (ldexp is exact in double).
    e = std::ilogb(amax) - 8;
    while (std::ldexp(amax, -e) > 448.0) ++e;
    while (std::ldexp(amax, -(e - 1)) <= 448.0) --e;
  } else {
    e = std::ilogb(amax) - 8;  // floor(log2 amax) - emax(E4M3)
  }
  return std::clamp(e, -127, 127);
}

uint8_t quantize_block(const float* x, int n, ScaleMode mode, uint8_t* codes) {
  double amax = 0.0;
  bool poisoned = false;
  for (int i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) poisoned = true;
    else amax = std::max(amax, std::fabs(double(x[i])));
  }
  if (poisoned) {
    std::fill(codes, codes + n, kE4M3Nan);
    return kE8M0Nan;
  }
  const int e = scale_exponent(amax, mode);
  for (int i = 0; i < n; ++i) codes[i] = e4m3_from_double(std::ldexp(double(x[i]), -e));
  return uint8_t(e + 127);
}

MxMatrix quantize_rows(const uint16_t* x, int64_t rows, int64_t cols, ScaleMode mode) {
  MxMatrix m;
  m.rows = rows;
  m.cols = cols;
  m.data.resize(size_t(rows * cols));
  m.scales.resize(size_t(rows * (cols / kMxBlock)));
  float block[kMxBlock];
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < cols / kMxBlock; ++b) {
      for (int i = 0; i < kMxBlock; ++i) block[i] = bf16_to_float(x[r * cols + b * kMxBlock + i]);
      m.scales[size_t(r * (cols / kMxBlock) + b)] =
          quantize_block(block, kMxBlock, mode, &m.data[size_t(r * cols + b * kMxBlock)]);
    }
  }
  return m;
}

MxMatrix quantize_cols(const uint16_t* x, int64_t rows, int64_t cols, ScaleMode mode) {
  std::vector<uint16_t> t(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = x[r * cols + c];
  return quantize_rows(t.data(), cols, rows, mode);
}

FastMatrix rebase_fast(const MxMatrix& m) {
  FastMatrix f;
  f.rows = m.rows;
  f.cols = m.cols;
  f.data.resize(m.data.size());
  const int64_t nblocks = m.cols / kMxBlock;
  const int64_t nchunks = (m.cols + kFastChunk - 1) / kFastChunk;
  const int bpc = kFastChunk / kMxBlock;
  f.scales.resize(size_t(nchunks * m.rows));
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < nchunks; ++c) {
      const int64_t b0 = c * bpc, b1 = std::min(nblocks, b0 + bpc);
      bool poisoned = false;
      int emax = -127;
      for (int64_t b = b0; b < b1; ++b) {
        const uint8_t s = m.scales[size_t(r * nblocks + b)];
        if (s == kE8M0Nan) poisoned = true;
        else emax = std::max(emax, int(s) - 127);
      }
      f.scales[size_t(c * m.rows + r)] = poisoned ? kE8M0Nan : uint8_t(emax + 127);
      for (int64_t b = b0; b < b1; ++b) {
        const int eb = int(m.scales[size_t(r * nblocks + b)]) - 127;
        for (int i = 0; i < kMxBlock; ++i) {
          const size_t idx = size_t(r * m.cols + b * kMxBlock + i);
          f.data[idx] = poisoned ? kE4M3Nan
                                 : e4m3_from_double(std::ldexp(e4m3_to_double(m.data[idx]), eb - emax));
        }
      }
    }
  }
  return f;
}

std::vector<double> dequantize(const MxMatrix& m) {
  std::vector<double> out(m.data.size());
  const int64_t nblocks = m.cols / kMxBlock;
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t c = 0; c < m.cols; ++c)
      out[size_t(r * m.cols + c)] = e4m3_to_double(m.data[size_t(r * m.cols + c)]) *
                                    e8m0_to_double(m.scales[size_t(r * nblocks + c / kMxBlock)]);
  return out;
}

std::vector<double> dequantize(const FastMatrix& m) {
  std::vector<double> out(m.data.size());
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t c = 0; c < m.cols; ++c)
      out[size_t(r * m.cols + c)] = e4m3_to_double(m.data[size_t(r * m.cols + c)]) *
                                    e8m0_to_double(m.scales[size_t((c / kFastChunk) * m.rows + r)]);
  return out;
}

std::vector<uint16_t> dequantize_bf16(const MxMatrix& m) {
  const std::vector<double> v = dequantize(m);
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_from_double(v[i]);
  return out;
}

std::vector<uint16_t> token_blocked(const std::vector<uint16_t>& image, int64_t rows, int64_t cols) {
  std::vector<uint16_t> out;
  out.reserve(image.size());
  for (int64_t b = 0; b < cols / 128; ++b)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < 128; ++j) out.push_back(image[size_t(r * cols + b * 128 + j)]);
  return out;
}

}  // namespace mxmoe::ref
