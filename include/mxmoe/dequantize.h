// MXFP8 → BF16 dequantization: the "BF16 image" of an MX tensor, the operand form exact-mode
// GEMMs read (gemm.h, GemmMode::kExact). Layouts and numerics of MX: include/mxmoe/mx_format.h.
//
//   image[r, c] = BF16_rne( deq(data[r, c], scales[r, c/32]) ),   deq(q, b) = E4M3(q) · 2^(b − 127)
//
// The BF16 rounding is the IEEE one (round to nearest, ties to even; gradual underflow down to
// BF16's smallest subnormal 2^-133; a magnitude that rounds above BF16's largest finite value
// (2 − 2^-7)·2^127 becomes ±Inf). The sign of zero is kept. NaN (scale byte 0xFF, or a NaN code
// 0x7F / 0xFF) gives kBF16Nan.
//
// When is the image exact? Every finite E4M3 value is j·2^t with an integer j < 16 (4 significant
// bits, fewer than BF16's 8) and t >= -9 (the smallest subnormal is 2^-9; so is the last bit of
// the smallest normals); the largest is 448 = 1.75·2^8. So deq = j·2^(t + s) with s = byte − 127:
//   * no overflow for every code  ⇔ 448·2^s < 2^128       ⇔ s <= 119
//   * no bit below 2^-133 for every code ⇔ −9 + s >= −133 ⇔ s >= −124
// Hence for scale bytes in [kBF16ExactScaleMin, kBF16ExactScaleMax] = [3, 246] every code's image
// is exactly its dequantized value. Outside that range:
//   * byte 247..254 (s = 120..127): codes with |deq| >= 2^128 become ±Inf (at s = 120: |q| >= 256),
//     the rest stay exact;
//   * byte 0..2 (s = −127..−125): deq values with bits below 2^-133 are rounded (to nearest even,
//     possibly to ±0); byte 0x00 blocks of zeros (pad rows, all-zero blocks) stay exact zeros.
// The quantizers of quantize.h produce such bytes only for blocks whose amax is above
// 448·2^119 ≈ 3.0e38 (BF16 inputs next to BF16's own maximum) or below 448·2^-125 ≈ 1.1e-35.
//
// Pointers are device pointers. data and image 16-byte aligned; scales need no alignment. Arguments
// are checked on the host before any launch and a bad one throws mxmoe::Error naming it. The call is
// asynchronous on `stream`, makes no host synchronisation and is bitwise deterministic.
// Kernel: src/kernels/quantize/dequantize_mxfp8_bf16_sm90.cu (bandwidth-bound: reads 1 + 1/32
// bytes and writes 2 bytes per element). Oracle: ref::dequantize_bf16 (src/ref/mx_ref.h).
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "mxmoe/error.h"
#include "mxmoe/mx_format.h"

namespace mxmoe {

// kBF16ExactScaleMin, kBF16ExactScaleMax and kBF16Nan are defined in mx_format.h.

// Where an image's elements lie. kRowMajor: image[r, c] at r·cols + c (the plain [rows, cols]).
// kTokenBlocked: the columns (tokens, for the column-wise copies the k-grouped wgrad GEMM reads)
// cut into blocks of kImageBlockCols = 128, each block stored whole for every row before the next:
//   image_blk[c / 128][r][c % 128]   at   token_blocked_offset(r, c, rows) = ((c/128)·rows + r)·128 + c%128
// Same values, permuted. Why (docs/notes/gemm.md, "Token-blocked wgrad images"): a row-major image
// of M_total tokens has rows 2·M_total bytes long, so a 64-token window of every row (what the
// k-grouped GEMM's CTAs read at once) touches one memory page per row; blocked, a 128-token window
// of all rows is one contiguous rows·256-byte range. Only the k-grouped GEMM reads this layout
// (gemm.h: MxOperand::image_layout); it needs cols % 128 == 0 (segments are padded to 128 tokens).
enum class ImageLayout : int {
  kRowMajor = 0,
  kTokenBlocked = 1,
};
inline constexpr int kImageBlockCols = 128;
inline constexpr int64_t token_blocked_offset(int64_t r, int64_t c, int64_t rows) {
  return ((c / kImageBlockCols) * rows + r) * kImageBlockCols + c % kImageBlockCols;
}

// image [rows, cols] BF16 = the BF16 image of the MX tensor (data [rows, cols] E4M3, scales
// [rows, cols/32] E8M0). cols % 32 == 0; rows may be 0 (nothing is done). A batch [E, N, K] is
// rows = E·N. For the column-wise copy of X [M, C] (data [C, M]) pass rows = C, cols = M.
void dequantize_mxfp8_bf16(const uint8_t* data, const uint8_t* scales, int64_t rows, int64_t cols,
                           __nv_bfloat16* image, cudaStream_t stream = nullptr);

// The same image in ImageLayout::kTokenBlocked: image element token_blocked_offset(r, c, rows) =
// the row-major image's [r, c], bit for bit (same kernel arithmetic, only the store address
// differs). cols % 128 == 0 (cols are tokens: M_total of the k-grouped GEMM), rows·cols/128 < 2^31;
// otherwise as dequantize_mxfp8_bf16 (checks, alignment, rows == 0 does nothing). Writes are 256
// contiguous bytes per 16 threads, so it runs at the row-major kernel's bandwidth.
void dequantize_mxfp8_bf16_token_blocked(const uint8_t* data, const uint8_t* scales, int64_t rows, int64_t cols,
                                         __nv_bfloat16* image, cudaStream_t stream = nullptr);

}  // namespace mxmoe
