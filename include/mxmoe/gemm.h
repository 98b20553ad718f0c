// MXFP8 grouped GEMMs for Mixture-of-Experts (sm_90a). Convention, once: Y = X · Wᵀ
// ("NT": both operands K-major, the weight stored [N, K] per expert, as DeepGEMM names it).
// Formats: include/mxmoe/mx_format.h. Numerics of the two modes: DESIGN.md §2 and below.
//
// m-grouped (forward, dgrad):  Y[r, :] = deq(A)[r, :] · deq(B[e])ᵀ   for offsets[e] <= r < offsets[e+1]
//   A  [M_total, K]  MX row-wise; rows sorted by expert, each segment padded to a multiple of 128
//                    rows (pad rows: zero data, zero scales).
//   B  [E, N, K]     MX row-wise per expert (blocks of 32 along K).
//   offsets int32 [E+1], DEVICE memory, never read by the host: offsets[0] = 0, non-decreasing,
//                    every entry a multiple of 128, offsets[E] <= M_total. Empty experts are legal.
//   Y  [M_total, N]  row-major BF16 (default) or FP32. Rows at or beyond offsets[E] are not
//                    written; pad rows inside a segment come out as exact zeros (for finite B).
//
// Modes (run-time):
//   kFast (default): reads the fast GEMM-ready form (fast_data [rows, K], fast_scales chunk-major
//     [ceil(K/128), rows]; for B per expert, i.e. [E, N, K] and [E, ceil(K/128), N]). FP8 wgmma over
//     one 128-chunk of K into a fresh accumulator, then promoted into FP32 registers times
//     2^ea[m] · 2^eb[n] (DeepSeek's 1×128 recipe with per-row scales on both operands). A fast
//     scale byte 0x00 is read as 0 (exact for zero chunks; it drops chunks whose amax is below
//     448·2^-127) and 0xFF as +Inf (its chunk's data are NaN, so NaN propagates).
//   kExact: reads the operands' BF16 images (MxOperand::image, BF16 [rows, K] made by
//     dequantize_mxfp8_bf16, dequantize.h): image = deq(q, scale) rounded to BF16, which is exactly
//     deq for every E4M3 code when the block's scale byte is in [kBF16ExactScaleMin,
//     kBF16ExactScaleMax] = [3, 246] (2^-124 .. 2^119; outside, the image is rounded or ±Inf, and
//     the GEMM computes with the image). BF16 wgmma accumulates every product straight into one
//     FP32 accumulator over all of K (no promotion): the result is the FP32-accumulated sum of the
//     exact products of the dequantized values (BF16 × BF16 products are exact in FP32), the
//     contract of DESIGN.md §2. Speed ceiling: BF16 tensor-core rate. Making the images is a
//     separate, bandwidth-bound call (3 bytes per element); callers reuse them across GEMMs where
//     they can (a weight's image across steps, an activation's between forward and backward).
//
//   Fast mode, operand B of the m-grouped GEMM (and Xᵀ of the k-grouped one), opt-in (MxOperand::fast_scale_layout =
//     FastScaleLayout::kBlock128; docs/notes/gemm.md "Session 10: 128x128 weight blocks in the
//     kernel" and "Run 80": 1.19-1.28x the per-row form's speed on every model shape, the same
//     error against the unquantized product to 4 digits; it departs from DESIGN §2's per-row form,
//     hence opt-in): B's fast_data is re-expressed per 128x128 block (expert e's rows
//     [128j, 128j + 128) x one 128-chunk of K; made by quantize.h's rebase_mxfp8_fast_block128) and its
//     fast_scales hold one byte per block, E8M0 [E, ceil(K/128), fast_block_scales_pitch(N)]. The
//     promotion is then fma(acc, 2^ea[m] · 2^eb[block of n], tot): the same FP32 operations as
//     kRow128's when every row of a block has the block's scale (bitwise the same output then).
//     Runs on the 128 x 192 tile whatever MXMOE_GEMM_TILE says (opts.fast_tile_n must be 0 or 192).
//
// Both modes can add into the output instead (GemmOptions::accumulate).
//
// Requirements (checked on the host before any CUDA call; a violation throws mxmoe::Error naming
// the argument): K % 32 == 0, N % 32 == 0, K >= 32, N >= 32, M_total % 128 == 0 (M_total may be 0),
// 1 <= E <= kMaxGemmExperts, every pointer the mode reads non-null, fast_data, fast_scales, image
// and y 16-byte aligned (TMA), E·N and K·M_total within int32 TMA limits (exact k-grouped:
// M_total <= 2^30, the image's byte coordinates), image_layout kRowMajor or kTokenBlocked (the
// latter k-grouped only).
// Calls are asynchronous on opts.stream, make no host synchronisation, and are bitwise
// deterministic (no atomics; each output element is written once by one thread).
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "mxmoe/dequantize.h"
#include "mxmoe/error.h"
#include "mxmoe/mx_format.h"

namespace mxmoe {

inline constexpr int kMaxGemmExperts = 512;

enum class GemmMode : int {
  kFast = 0,   // fast_data + fast_scales: FP8 wgmma, promotion every 128 of K (default)
  kExact = 1,  // image: BF16 wgmma into one FP32 accumulator over all of K (no promotion)
};

enum class GemmOutDtype : int {
  kBF16 = 0,
  kFP32 = 1,
};

// How a fast-mode operand's fast_scales are laid out.
//   kRow128 (default): one byte per (row, 128-chunk of K), chunk-major, as described per GEMM below.
//   kBlock128: one byte per (expert, 128-chunk of K, 128-row block of N): E8M0 [E, ceil(K/128),
//     pitch] with pitch = fast_block_scales_pitch(N) bytes per (expert, chunk) row (ceil(N/128)
//     rounded up to a multiple of 16: TMA's global strides are multiples of 16 bytes); byte
//     [e][c][j] scales rows [128j, min(128j + 128, N)) of expert e over K columns [128c, 128c + 128)
//     (blocks never cross experts; the last one is shorter when N % 128 != 0; the pitch's padding
//     bytes may be loaded but are never used). fast_data is then the block-rebased form (ref::rebase_fast_block128).
//     Accepted in fast mode for operand b of m_grouped_mxfp8_gemm_nt (the weights) and for operand b
//     of k_grouped_mxfp8_gemm_nt (Xᵀ [K, M_total]: blocks of 128 rows of K x 128 tokens, scales
//     [M_total/128, fast_block_scales_pitch(K)], i.e. the layout above with one "expert" and the
//     token chunks as its chunks; rebase_mxfp8_fast_block128 with batch 1, rows K, cols M_total makes
//     it); operand a, exact mode and the EP row entry reject it (mxmoe::Error naming
//     "<operand>.fast_scale_layout"), as does opts.fast_tile_n = 128 (the form runs 192 wide only).
enum class FastScaleLayout : int {
  kRow128 = 0,
  kBlock128 = 1,
};

// (fast_block_scales_pitch(n): mx_format.h.)

// One MX-quantized GEMM operand in its forms. A mode reads only its own: kFast the fast pair,
// kExact the BF16 image; the others may be null. data/scales (the plain MX tensor) are what the
// image is made from (dequantize_mxfp8_bf16, dequantize.h); the GEMMs do not read them. Shapes per
// the call (A: rows = M_total; B: rows = E·N, laid out [E, N, K]; k-grouped: see below).
struct MxOperand {
  const uint8_t* data = nullptr;         // E4M3 [rows, K]        (not read by the GEMMs)
  const uint8_t* scales = nullptr;       // E8M0 [rows, K/32]     (not read by the GEMMs)
  const uint8_t* fast_data = nullptr;    // kFast:  E4M3 [rows, K]
  const uint8_t* fast_scales = nullptr;  // kFast:  E8M0 [ceil(K/128), M_total] for A,
                                         //         [E, ceil(K/128), N] for B
  const __nv_bfloat16* image = nullptr;  // kExact: BF16 [rows, K] = dequantize_mxfp8_bf16(data, scales)
  // How `image` is laid out (dequantize.h). kRowMajor (default): [rows, K]. kTokenBlocked: only
  // for the k-grouped GEMM's operands (dequantize_mxfp8_bf16_token_blocked of the column-wise copy,
  // [M_total/128][rows][128]; the faster form for it at large M_total, docs/notes/gemm.md
  // "Token-blocked wgrad images"); the m-grouped GEMMs reject it. Read in exact mode only.
  ImageLayout image_layout = ImageLayout::kRowMajor;
  // How fast_scales (and with it fast_data) is formed (FastScaleLayout above). Read in fast mode;
  // kBlock128 only for operand b of m_grouped_mxfp8_gemm_nt and of k_grouped_mxfp8_gemm_nt.
  FastScaleLayout fast_scale_layout = FastScaleLayout::kRow128;
};

struct GemmOptions {
  GemmMode mode = GemmMode::kFast;
  GemmOutDtype out_dtype = GemmOutDtype::kBF16;
  int num_sms = 0;                // persistent CTAs to launch; 0 = every SM of the device
  int fast_tile_n = 0;            // fast mode's output tile width, 128 or 192 (same bytes either
                                  // way); 0 = the library's choice: m-grouped 192, k-grouped 192
                                  // when the reduced-over weight dim k >= 1024, else 128
                                  // (docs/notes/gemm.md). MXMOE_GEMM_TILE overrides it. Wide
                                  // tiles (fast 192, exact 256) write their output through shared
                                  // memory and TMA stores overlapped with the next tile (FP32 with
                                  // accumulate: TMA reduce-add, one FP32 add per element); the
                                  // bytes are the direct stores', which MXMOE_GEMM_TMA_STORE=0 picks.
  bool accumulate = false;        // out += result (read, add in FP32, round once, write) instead
                                  // of out = result; pad rows then stay as they were
  cudaStream_t stream = nullptr;
};

// Y = A · Bᵀ per expert segment (see above). y is __nv_bfloat16* or float* per opts.out_dtype.
void m_grouped_mxfp8_gemm_nt(const MxOperand& a, int64_t m_total, const MxOperand& b,
                             int num_experts, int64_t n, int64_t k, const int32_t* offsets,
                             void* y, const GemmOptions& opts = {});

// k-grouped (wgrad): dW[e] = Σ_{t in segment e} dY[t, :]ᵀ · X[t, :]   i.e. dW[e][n, k] =
// Σ_t deq(dYᵀ)[n, t] · deq(Xᵀ)[k, t] — the same "NT" form with tokens as the reduced dimension.
//   a = dYᵀ, column-wise MX of dY [M_total, N]: data [N, M_total] (blocks of 32 along tokens),
//       scales [N, M_total/32]; fast: fast_data [N, M_total], fast_scales [M_total/128, N];
//       exact: image BF16 [N, M_total] (dequantize_mxfp8_bf16 of the column-wise copy), or the
//       same values token-blocked, [M_total/128][N][128] (image_layout = kTokenBlocked, made by
//       dequantize_mxfp8_bf16_token_blocked).
//   b = Xᵀ,  column-wise MX of X [M_total, K]:  data [K, M_total], scales [K, M_total/32];
//       fast: fast_data [K, M_total], fast_scales [M_total/128, K]; exact: image BF16 [K, M_total]
//       or token-blocked [M_total/128][K][128].
//   The two layouts give bitwise the same dW (the same products summed in the same order; only the
//   TMA map and coordinates differ: a 64-token chunk never crosses a 128-token block because the
//   segments start at multiples of 128). The layer makes its wgrad images token-blocked: with
//   row-major images the rows are 2·M_total bytes long and at M_total = 1M (Qwen3-30B at 8192
//   tokens per expert) the GEMM ran at 0.63x torch BF16 (run 64).
//   offsets int32 [E+1], DEVICE memory, token segment bounds as for the m-grouped GEMM (multiples
//       of 128, offsets[0] = 0, offsets[E] <= M_total; pad tokens are zero in both operands).
//   dw [E, N, K] row-major BF16 or FP32. Every expert's dW is written: an empty expert gets zeros
//       (or is left as it was with opts.accumulate).
// Same requirements as above (N, K multiples of 32; M_total a multiple of 128).
void k_grouped_mxfp8_gemm_nt(const MxOperand& a, const MxOperand& b, int64_t m_total,
                             int num_experts, int64_t n, int64_t k, const int32_t* offsets,
                             void* dw, const GemmOptions& opts = {});

}  // namespace mxmoe
