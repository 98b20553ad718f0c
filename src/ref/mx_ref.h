// CPU reference for the MX format, written from the OCP MX v1.0 spec and DESIGN.md §1-2, not from
// the kernels. Exact arithmetic in double; it is the oracle the GPU kernels are checked against
// bit for bit.
#pragma once
#include <cstdint>
#include <vector>

#include "mxmoe/mx_format.h"

namespace mxmoe::ref {

float bf16_to_float(uint16_t bits);
uint16_t float_to_bf16(float v);  // round to nearest even (NaN stays NaN); for making test data

double e4m3_to_double(uint8_t code);          // NaN for 0x7F / 0xFF
uint8_t e4m3_from_double(double v);           // RNE, satfinite (±448), sign of zero kept, NaN → 0x7F
double e8m0_to_double(uint8_t byte);          // 2^(byte-127); NaN for 0xFF
// IEEE round to nearest even into BF16, from the format's definition: 8 significant bits, exponent
// range [-126, 127], subnormals down to 2^-133, ±Inf beyond the largest finite value, sign of zero
// kept, NaN → kBF16Nan (dequantize.h).
uint16_t bf16_from_double(double v);
int scale_exponent(double amax, ScaleMode mode);  // amax finite, >= 0; result in [-127, 127]

// One block of n <= 32 values (n == 32 in MX tensors). Writes n codes and returns the scale byte.
uint8_t quantize_block(const float* x, int n, ScaleMode mode, uint8_t* codes);

// MX tensor with blocks of 32 along cols. data [rows, cols], scales [rows, cols/32].
struct MxMatrix {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> data, scales;
};
// Fast GEMM-ready form: data [rows, cols], scales [ceil(cols/128), rows] (chunk-major).
struct FastMatrix {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> data, scales;
};

MxMatrix quantize_rows(const uint16_t* x_bf16, int64_t rows, int64_t cols, ScaleMode mode);
// Column-wise: the MX tensor of xᵀ, i.e. [cols, rows] with blocks along rows.
MxMatrix quantize_cols(const uint16_t* x_bf16, int64_t rows, int64_t cols, ScaleMode mode);
FastMatrix rebase_fast(const MxMatrix& m);

std::vector<double> dequantize(const MxMatrix& m);
std::vector<double> dequantize(const FastMatrix& m);
// The BF16 image of an MX tensor (dequantize.h): bf16_from_double of each dequantized value.
std::vector<uint16_t> dequantize_bf16(const MxMatrix& m);
// An image [rows, cols] (row-major) rearranged into the token-blocked layout (dequantize.h,
// ImageLayout::kTokenBlocked): for each block of 128 columns, for each row, its 128 elements.
// Written as those three loops (not through token_blocked_offset). cols % 128 == 0.
std::vector<uint16_t> token_blocked(const std::vector<uint16_t>& image, int64_t rows, int64_t cols);

}  // namespace mxmoe::ref
