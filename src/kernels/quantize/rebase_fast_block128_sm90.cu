// The 128x128-block fast form of plain MX copies (include/mxmoe/quantize.h,
// rebase_mxfp8_fast_block128; the form: mx_format.h and gemm.h FastScaleLayout::kBlock128).
//
// Input: data E4M3 [batch, rows, cols] (16-byte aligned), scales E8M0 [batch, rows, cols/32] (any
// alignment), as quantize_mxfp8 writes them. Output: block_data E4M3 [batch, rows, cols] (16-byte
// aligned), block_scales E8M0 [batch, ceil(cols/128), pitch] with pitch = fast_block_scales_pitch(rows)
// (the bytes past ceil(rows/128) in each (matrix, chunk) row written as 0).
//
// One CTA of 256 threads per block (matrix b, row block j, 128-chunk c): thread t owns 16-byte piece
// t % 8 of four rows of the block (see the kernel). It loads its 64 data bytes and their four scale
// bytes first (all loads of the block in flight at once), then the CTA takes the maximum
// scale byte (a warp max, then one shared-memory word per warp): E = max over the block's 32-blocks of
// their scale bytes, where 0xFF (NaN) wins and poisons the block, and an all-zero 32-block (byte 0)
// never raises it — exactly ref::rebase_span's rule. Each code is then rebased against E with the row
// fast form's conversion (rebase_x16: code · 2^(e_b − E) rounded to E4M3, RNE, satfinite; the whole
// block 0x7F when E = 0xFF), so the output is bitwise ref::rebase_fast_block128.
// Rows past the matrix's last row (its last block is shorter when rows % 128 != 0) and 32-blocks past
// cols (the last chunk has fewer than four when cols % 128 != 0) are neither read nor written.
// Roofline: memory-bound; 2 bytes moved per element (+ 1/32 read), one block per CTA, 16 KB in flight
// per CTA. Run 84 (bench/bench_rebase.py): 3.9-4.2 TB/s = 93-98% of copy on the models' weights. A
// persistent variant (grid = resident CTAs, the next block's loads issued before this block's barrier
// and stores) was slower in run 82.
// Tests: tests/gpu/test_rebase_block_gpu.cpp (bitwise against ref::rebase_fast_block128, including NaN
// and all-zero blocks, rows % 128 != 0 and cols = 2880); argument checks in
// tests/cpu/test_quantize_args.cpp. Bench: bench/bench_gemm.py --fast-block makes the GEMM's operand
// with it and checks it bitwise against an independent PyTorch construction.
#include <cstdint>

#include "device/mx_convert.cuh"
#include "kernels/quantize/block128_common.cuh"
#include "host/check.h"
#include "mxmoe/quantize.h"

namespace mxmoe {
namespace {

constexpr int kThreads = 256;                         // a 128 x 128 block, 64 bytes a thread
constexpr int kBlocksPerChunk = kFastChunk / kMxBlock;  // 4
static_assert(kThreads == 2 * kFastBlockRows, "64 bytes a thread");

// grid (chunks, row blocks, batch). Thread t owns the 16-byte piece t % 8 of rows t / 8 + 32 i
// (i < 4) of the block, so that each load and store instruction of a warp covers 4 whole 128-byte
// row segments (4 sectors each). Run 84: 93-98% of copy on the models' weights; run 81's mapping
// (thread t owning 64 bytes of row t / 2: each instruction touched 32 sectors, half of each) ran at
// 55-60%.
__global__ void __launch_bounds__(kThreads)
rebase_fast_block128_kernel(const uint8_t* __restrict__ data, const uint8_t* __restrict__ scales, int64_t rows,
                            int64_t cols, int64_t pitch, uint8_t* __restrict__ block_data,
                            uint8_t* __restrict__ block_scales) {
  __shared__ uint32_t warp_max[kThreads / 32];
  const int64_t nblk = cols / kMxBlock;
  const int64_t c = blockIdx.x, j = blockIdx.y, b = blockIdx.z;
  constexpr int kRowsPerThread = kFastBlockRows / (kThreads / 8);  // 4
  const int piece = threadIdx.x % 8, r0 = threadIdx.x / 8;
  const int64_t blk = c * kBlocksPerChunk + piece / 2;  // this piece's 32-block
  uint4 q[kRowsPerThread];
  uint32_t s[kRowsPerThread];
  bool ok[kRowsPerThread];
  uint32_t mine = 0;  // 0 where a thread owns nothing: byte 0 never raises the maximum (an all-zero block)
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int64_t row = j * kFastBlockRows + r0 + 32 * i;  // within the matrix
    ok[i] = row < rows && blk < nblk;
    const int64_t grow = b * rows + row;  // row of the flat [batch · rows, cols] tensor
    s[i] = 0;
    if (ok[i]) {
      q[i] = __ldg(reinterpret_cast<const uint4*>(data + grow * cols + c * kFastChunk + 16 * piece));
      s[i] = __ldg(scales + grow * nblk + blk);
    }
    mine = mine > s[i] ? mine : s[i];
  }
  const uint32_t emax = block128::block_max<kThreads>(mine, warp_max);
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int64_t grow = b * rows + j * kFastBlockRows + r0 + 32 * i;
    if (ok[i])
      *reinterpret_cast<uint4*>(block_data + grow * cols + c * kFastChunk + 16 * piece) = dev::rebase_x16(q[i], s[i], emax);
  }
  block128::store_block_scale<kThreads>(block_scales + (b * gridDim.x + c) * pitch, j, gridDim.y, pitch, emax);
}

}  // namespace

void rebase_mxfp8_fast_block128(const uint8_t* data, const uint8_t* scales, int64_t batch, int64_t rows, int64_t cols,
                                uint8_t* block_data, uint8_t* block_scales, cudaStream_t stream) {
  constexpr const char* fn = "rebase_mxfp8_fast_block128";
  using detail::throw_arg;
  using detail::to_str;
  if (batch < 1 || batch > 65535) throw_arg(fn, "batch", to_str(batch), "must be in [1, 65535]");
  if (rows < 0) throw_arg(fn, "rows", to_str(rows), "must be >= 0");
  if (cols <= 0 || cols % kMxBlock != 0)
    throw_arg(fn, "cols", to_str(cols), "must be a positive multiple of 32 (MX blocks run along it)");
  const int64_t nchunks = (cols + kFastChunk - 1) / kFastChunk, nrb = (rows + kFastBlockRows - 1) / kFastBlockRows;
  if (nchunks > 0x7FFFFFFF) throw_arg(fn, "cols", to_str(cols), "must be below 2^38");
  if (nrb > 65535) throw_arg(fn, "rows", to_str(rows), "must be at most 65535 · 128 (row blocks per matrix)");
  if (rows > 0 && cols > ((int64_t(1) << 62) / (rows * batch)))
    throw_arg(fn, "rows", to_str(rows), "batch · rows · cols must be below 2^62");
  if (rows == 0) return;
  detail::check_device_ptrs(fn, {{"data", data}, {"block_data", block_data}});
  detail::check_not_null(fn, "scales", scales);
  detail::check_not_null(fn, "block_scales", block_scales);
  // In place (block_data == data) is safe: a thread writes only the bytes it has read, after the
  // block's barrier. The block scales must not overlap the scales other CTAs are still reading.
  const int64_t nblk = cols / kMxBlock, pitch = fast_block_scales_pitch(rows);
  const auto* s0 = scales;
  const auto* s1 = scales + batch * rows * nblk;
  const auto* o0 = block_scales;
  const auto* o1 = block_scales + batch * nchunks * pitch;
  if (o0 < s1 && s0 < o1) throw_arg(fn, "block_scales", to_str(static_cast<const void*>(o0)), "must not overlap scales");
  const dim3 grid{unsigned(nchunks), unsigned(nrb), unsigned(batch)};
  rebase_fast_block128_kernel<<<grid, kThreads, 0, stream>>>(data, scales, rows, cols, pitch, block_data, block_scales);
  MXMOE_CHECK_LAUNCH(fn);
}

}  // namespace mxmoe
