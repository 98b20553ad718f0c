// The MX (OCP Microscaling v1.0) MXFP8 format as mxmoe uses it. Contracts only; the kernels
// implement them and src/ref/ checks them bit for bit.
//
// MX tensor of logical shape [R, C] (row-major):
//   data   : FP8 E4M3 ("fn": bias 7, max 448, no Inf, NaN = S.1111.111) [R, C], one byte each
//   scales : E8M0 (uint8, value 2^(byte-127), byte 0xFF = NaN)           [R, C/32]
//   Blocks of 32 run along C (the contiguous dimension). C % 32 == 0 is required.
// Column-wise quantization of X [R, C] is the MX tensor of Xᵀ: data [C, R], scales [C, R/32],
// quantized from the high-precision source (never from the row-wise copy); it needs R % 32 == 0.
//
// Element rule: q = E4M3_rne_satfinite(x · 2^-e) — round to nearest, ties to even; magnitudes
// beyond 448 saturate to ±448; the sign of zero is kept (-tiny → 0x80).
//
// Scale exponent e for a block with amax = max|x| (all finite):
//   ScaleMode::kRceil (default): e = ceil(log2(amax / 448)), the smallest e with amax <= 448·2^e
//                                 (the rule of cuBLAS, TransformerEngine and torchao training).
//                                 No element saturates.
//   ScaleMode::kFloor (OCP §6.3): e = floor(log2(amax)) - 8; scaled values above 448 saturate.
//   e is clamped to [-127, 127]; the scale byte is e + 127.
//
// Special blocks (policy, tested in tests/cpu/test_mx_format.cpp and on the GPU):
//   * all-zero block        : amax = 0 → e = -127 (byte 0x00); data are ±0 (sign kept).
//   * subnormal inputs      : handled exactly; when amax < 448·2^-127 the scale clamps to 2^-127
//                             (byte 0x00) and elements are x·2^127 rounded (no flush to zero).
//   * NaN anywhere in block : scale byte 0xFF (NaN) and every data byte of the block 0x7F (NaN),
//                             so the whole block dequantizes to NaN. NaN propagates; it is never
//                             dropped or saturated.
//   * ±Inf anywhere in block: treated like NaN (E4M3 has no Inf, and no finite scale can carry it):
//                             scale 0xFF, data 0x7F. Dequantization gives NaN for the block.
//
// Fast GEMM-ready form (DESIGN.md §2, "fast" GEMM mode), emitted on request by the quantizers:
//   For each row and each 128-chunk of C (four 32-blocks; the last chunk may hold fewer blocks
//   when C % 128 != 0), with block exponents e_b and chunk exponent E = max_b e_b:
//     fast_data   [R, C]            : q'_i = E4M3_rne_satfinite(decode(q_i) · 2^(e_b - E))
//     fast_scales [ceil(C/128), R]  : byte E + 127   (chunk-major: the 128-chunks of one K range
//                                     for consecutive rows are contiguous, as a GEMM tile reads them)
//   q' equals q in the chunk's largest block; in other blocks it is exact unless the shifted value
//   drops below E4M3's normal range (2^-6), where it is rounded again. A chunk that contains a NaN
//   block gets fast scale 0xFF and fast data 0x7F for the whole chunk.
//   3-D tensors [B, R, C] use [B, R, C], [B, R, C/32], and [B, ceil(C/128), R] for the fast scales.
// 128x128-block variant (weights only, opt-in: gemm.h FastScaleLayout::kBlock128; made on the GPU
// from the plain MX copy by quantize.h's rebase_mxfp8_fast_block128, on the CPU by
// ref::rebase_fast_block128): the same rule with E taken over a block
// of up to 128 rows of one [R, C] matrix (rows [128j, 128j + 128), the last block shorter when R %
// 128 != 0) x one 128-chunk; scales [B, ceil(C/128), fast_block_scales_pitch(R)], one byte per
// block, pitch = ceil(R/128) rounded up to a multiple of 16 (TMA strides), padding bytes not read.
#pragma once
#include <cstdint>

namespace mxmoe {

inline constexpr int kMxBlock = 32;        // elements per E8M0 scale
inline constexpr int kFastChunk = 128;     // K elements per fast-mode scale
inline constexpr float kE4M3Max = 448.0f;
inline constexpr uint8_t kE8M0Nan = 0xFF;
inline constexpr uint8_t kE4M3Nan = 0x7F;
inline constexpr int kFastBlockRows = 128;  // rows per scale of the 128x128-block fast form

// Bytes per (matrix, 128-chunk) row of 128x128-block fast scales for r rows per matrix:
// ceil(r/128) rounded up to a multiple of 16.
constexpr int64_t fast_block_scales_pitch(int64_t r) {
  return ((r + kFastBlockRows - 1) / kFastBlockRows + 15) / 16 * 16;
}

// BF16 images (dequantize.h): scale bytes whose blocks dequantize to BF16 exactly, for every E4M3
// code (2^-124 .. 2^119; derivation in dequantize.h), and the image of NaN.
inline constexpr uint8_t kBF16ExactScaleMin = 3;
inline constexpr uint8_t kBF16ExactScaleMax = 246;
inline constexpr uint16_t kBF16Nan = 0x7FC0;  // quiet, positive

enum class ScaleMode : int {
  kRceil = 0,  // scale = 2^ceil(log2(amax/448))   (default)
  kFloor = 1,  // scale = 2^(floor(log2 amax) - 8) (OCP MX v1.0 §6.3)
};

}  // namespace mxmoe
