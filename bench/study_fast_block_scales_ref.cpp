// Cross-check harness for bench/study_fast_block_scales.py (CPU only, not part of the library build).
//
// Reads a BF16 matrix [rows, cols] (raw little-endian uint16), quantizes it row-wise with the CPU
// reference (ref::quantize_rows, RCEIL), builds today's fast form with ref::rebase_fast (1 x 128)
// and the studied 128 x 128 block form with ref::rebase_fast_block128, and writes the three
// dequantized images as raw doubles [3, rows, cols] so that the Python study can check its own
// numpy implementation against the reference bit for bit.
//
// The 128 x 128 block form is the library's ref::rebase_fast_block128 (src/ref/mx_ref.cpp; it
// started as this harness's own copy), called with one expert: for each block of up to 128 rows and
// each 128-chunk of cols, E = the largest block exponent among the block's (row, 32-block) scales;
// every element is re-expressed as E4M3_rne_satfinite(decode(q) · 2^(e_b - E)). A NaN scale
// anywhere in the block poisons it; all-zero 32-blocks never raise E.
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
  const std::vector<double> d_fb = ref::dequantize(ref::rebase_fast_block128(q, 1));  // one matrix
  FILE* fo = std::fopen(argv[4], "wb");
  if (!fo) return 4;
  for (const auto* v : {&d_mx, &d_f1, &d_fb}) std::fwrite(v->data(), 8, v->size(), fo);
  std::fclose(fo);
  return 0;
}
