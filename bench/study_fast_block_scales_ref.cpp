// Cross-check harness for bench/study_fast_block_scales.py (CPU only, not part of the library build).
//
// Reads a BF16 matrix [rows, cols] (raw little-endian uint16), quantizes it row-wise with the CPU
// reference (ref::quantize_rows, RCEIL), builds today's fast form with ref::rebase_fast (1 x 128)
// and the studied 128 x 128 block form with rebase_fast_block128 below, and writes the three
// dequantized images as raw doubles [3, rows, cols] so that the Python study can check its own
// numpy implementation against the reference bit for bit.
//
// rebase_fast_block128 mirrors ref::rebase_fast (src/ref/mx_ref.cpp) with the chunk widened to
// 128 rows: for each block of up to 128 rows (the last one may be shorter; rows are counted from
// 0, so for a 3-D weight [E, N, K] call it per expert) and each 128-chunk of cols, E = the largest
// block exponent among the block's (row, 32-block) scales; every element is re-expressed as
// E4M3_rne_satfinite(decode(q) · 2^(e_b - E)); scale byte E + 127. A NaN scale anywhere in the
// block poisons the whole block (scale 0xFF, data 0x7F), as a NaN 32-block poisons its 128-chunk
// in rebase_fast. An all-zero 32-block has e_b = -127 and never raises E; an all-zero block gets
// E = -127 (byte 0x00), as in rebase_fast. Scales are stored [ceil(cols/128), ceil(rows/128)].
//
// Build and run (the study does this itself with --check-ref):
//   g++ -O2 -std=c++17 -Iinclude -Isrc bench/study_fast_block_scales_ref.cpp src/ref/mx_ref.cpp \
//       -o /tmp/study_ref && /tmp/study_ref in.bf16 ROWS COLS out.f64
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cmath>

#include "ref/mx_ref.h"

using namespace mxmoe;

namespace {

struct BlockFast {  // 128 x 128 weight-block form
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> data, scales;  // data [rows, cols]; scales [ceil(cols/128), ceil(rows/128)]
};

constexpr int kRowBlock = 128;

BlockFast rebase_fast_block128(const ref::MxMatrix& m) {
  BlockFast f;
  f.rows = m.rows;
  f.cols = m.cols;
  f.data.resize(m.data.size());
  const int64_t nblocks = m.cols / kMxBlock;
  const int64_t nchunks = (m.cols + kFastChunk - 1) / kFastChunk;
  const int64_t nrb = (m.rows + kRowBlock - 1) / kRowBlock;
  const int bpc = kFastChunk / kMxBlock;
  f.scales.resize(size_t(nchunks * nrb));
  for (int64_t rb = 0; rb < nrb; ++rb) {
    const int64_t r0 = rb * kRowBlock, r1 = std::min(m.rows, r0 + kRowBlock);
    for (int64_t c = 0; c < nchunks; ++c) {
      const int64_t b0 = c * bpc, b1 = std::min(nblocks, b0 + bpc);
      bool poisoned = false;
      int emax = -127;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t b = b0; b < b1; ++b) {
          const uint8_t s = m.scales[size_t(r * nblocks + b)];
          if (s == kE8M0Nan) poisoned = true;
          else emax = std::max(emax, int(s) - 127);
        }
      f.scales[size_t(c * nrb + rb)] = poisoned ? kE8M0Nan : uint8_t(emax + 127);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t b = b0; b < b1; ++b) {
          const int eb = int(m.scales[size_t(r * nblocks + b)]) - 127;
          for (int i = 0; i < kMxBlock; ++i) {
            const size_t idx = size_t(r * m.cols + b * kMxBlock + i);
            f.data[idx] = poisoned ? kE4M3Nan
                                   : ref::e4m3_from_double(std::ldexp(ref::e4m3_to_double(m.data[idx]), eb - emax));
          }
        }
    }
  }
  return f;
}

std::vector<double> dequantize(const BlockFast& f) {
  std::vector<double> out(f.data.size());
  const int64_t nrb = (f.rows + kRowBlock - 1) / kRowBlock;
  for (int64_t r = 0; r < f.rows; ++r)
    for (int64_t c = 0; c < f.cols; ++c)
      out[size_t(r * f.cols + c)] =
          ref::e4m3_to_double(f.data[size_t(r * f.cols + c)]) *
          ref::e8m0_to_double(f.scales[size_t((c / kFastChunk) * nrb + r / kRowBlock)]);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s in.bf16 rows cols out.f64\n", argv[0]);
    return 2;
  }
  const int64_t rows = std::atoll(argv[2]), cols = std::atoll(argv[3]);
  std::vector<uint16_t> x(size_t(rows * cols));
  FILE* fi = std::fopen(argv[1], "rb");
  if (!fi || std::fread(x.data(), 2, x.size(), fi) != x.size()) return 3;
  std::fclose(fi);
  const ref::MxMatrix q = ref::quantize_rows(x.data(), rows, cols, ScaleMode::kRceil);
  const std::vector<double> d_mx = ref::dequantize(q);
  const std::vector<double> d_f1 = ref::dequantize(ref::rebase_fast(q));
  const std::vector<double> d_fb = dequantize(rebase_fast_block128(q));
  FILE* fo = std::fopen(argv[4], "wb");
  if (!fo) return 4;
  for (const auto* v : {&d_mx, &d_f1, &d_fb}) std::fwrite(v->data(), 8, v->size(), fo);
  std::fclose(fo);
  return 0;
}
