// The 128x128-block fast form of plain MX copies (include/mxmoe/quantize.h,
// rebase_mxfp8_fast_block128; the form: mx_format.h and gemm.h FastScaleLayout::kBlock128).
//
// Input: data E4M3 [batch, rows, cols] (16-byte aligned), scales E8M0 [batch, rows, cols/32] (any
// alignment), as quantize_mxfp8 writes them. Output: block_data E4M3 [batch, rows, cols] (16-byte
// aligned), block_scales E8M0 [batch, ceil(cols/128), pitch] with pitch = fast_block_scales_pitch(rows)
// (the bytes past ceil(rows/128) in each (matrix, chunk) row written as 0).
//
// A CTA of 256 threads works on one block (matrix b, row block j, 128-chunk c) at a time (a persistent
// grid walks the blocks, chunk fastest; see the kernel): thread t owns row 128j + t/2
// and the two 32-blocks 2(t%2), 2(t%2) + 1 of the chunk (64 bytes). It loads its 64 data bytes and its
// two scale bytes first (all loads of the block in flight at once), then the CTA takes the maximum
// scale byte (a warp max, then one shared-memory word per warp): E = max over the block's 32-blocks of
// their scale bytes, where 0xFF (NaN) wins and poisons the block, and an all-zero 32-block (byte 0)
// never raises it — exactly ref::rebase_span's rule. Each code is then rebased against E with the row
// fast form's conversion (rebase_x16: code · 2^(e_b − E) rounded to E4M3, RNE, satfinite; the whole
// block 0x7F when E = 0xFF), so the output is bitwise ref::rebase_fast_block128.
// Rows past the matrix's last row (its last block is shorter when rows % 128 != 0) and 32-blocks past
// cols (the last chunk has fewer than four when cols % 128 != 0) are neither read nor written.
// Roofline: memory-bound; 2 bytes moved per element (+ 1/32 read); 32 KB of loads in flight per CTA
// (this block's and the next's). Run 81's first version, one CTA per block and no look-ahead: 2.3-2.5
// TB/s (54-59% of copy). Registers: 60 (4 CTAs an SM), no dynamic shared memory.
// Tests: tests/gpu/test_rebase_block_gpu.cpp (bitwise against ref::rebase_fast_block128, including NaN
// and all-zero blocks, rows % 128 != 0 and cols = 2880); argument checks in
// tests/cpu/test_quantize_args.cpp. Bench: bench/bench_gemm.py --fast-block makes the GEMM's operand
// with it and checks it bitwise against an independent PyTorch construction.
#include <algorithm>
#include <cstdint>

#include "device/fast_divmod.cuh"
#include "device/mx_convert.cuh"
#include "host/check.h"
#include "host/kernel_attr.h"
#include "mxmoe/quantize.h"

namespace mxmoe {
namespace {

constexpr int kThreads = 256;                         // 128 rows x 2 halves of a chunk
constexpr int kBlocksPerChunk = kFastChunk / kMxBlock;  // 4
static_assert(kThreads == 2 * kFastBlockRows, "one thread per (row, half chunk)");

__device__ __forceinline__ uint4 rebase_x16(uint4 q, uint32_t block, uint32_t emax) {
  if (emax == kE8M0Nan) return make_uint4(dev::kE4M3NanX4, dev::kE4M3NanX4, dev::kE4M3NanX4, dev::kE4M3NanX4);
  const float pw = dev::exp2_nonpositive(int(block) - int(emax));
  return make_uint4(dev::e4m3x4_rebase(q.x, pw), dev::e4m3x4_rebase(q.y, pw), dev::e4m3x4_rebase(q.z, pw),
                    dev::e4m3x4_rebase(q.w, pw));
}

// One block (matrix b, row block j, chunk c) as one thread holds it: its 64 bytes and two scale bytes.
struct Piece {
  uint4 q[4];
  uint32_t s0 = 0, s1 = 0;  // 0 for blocks it does not own: byte 0 never raises the maximum
  int64_t off = 0;          // byte offset of the 64 bytes in data / block_data
  uint32_t b = 0, j = 0, c = 0;
  bool ok0 = false, ok1 = false;
};

struct RebaseArgs {
  const uint8_t* data;
  const uint8_t* scales;
  uint8_t* block_data;
  uint8_t* block_scales;
  int64_t rows, cols, nblk, pitch;
  FastDivmod chunks, row_blocks;  // ceil(cols/128), ceil(rows/128)
  uint32_t num_items;             // batch · row blocks · chunks; item id = (b · nrb + j) · nchunks + c
};

__device__ __forceinline__ Piece load_piece(const RebaseArgs& a, uint32_t id) {
  Piece p;
  const uint32_t t = a.chunks.div(id), c = id - t * a.chunks.d;
  const uint32_t b = a.row_blocks.div(t), j = t - b * a.row_blocks.d;
  p.b = b;
  p.j = j;
  p.c = c;
  const int row = threadIdx.x / 2, half = threadIdx.x % 2;
  const int64_t r = int64_t(j) * kFastBlockRows + row;  // within the matrix
  const int64_t blk0 = int64_t(c) * kBlocksPerChunk + 2 * half;
  const bool row_ok = r < a.rows;
  p.ok0 = row_ok && blk0 < a.nblk;
  p.ok1 = row_ok && blk0 + 1 < a.nblk;
  const int64_t grow = int64_t(b) * a.rows + r;  // row of the flat [batch · rows, cols] tensor
  p.off = grow * a.cols + blk0 * kMxBlock;
  const uint4* src = reinterpret_cast<const uint4*>(a.data + p.off);
  if (p.ok0) {
    p.q[0] = __ldg(src);
    p.q[1] = __ldg(src + 1);
    p.s0 = __ldg(a.scales + grow * a.nblk + blk0);
  }
  if (p.ok1) {
    p.q[2] = __ldg(src + 2);
    p.q[3] = __ldg(src + 3);
    p.s1 = __ldg(a.scales + grow * a.nblk + blk0 + 1);
  }
  return p;
}

// Persistent: CTA k takes items k, k + grid, ...; the next item's loads are issued before this
// item's barrier and stores, so a thread keeps 128 bytes in flight. One barrier per item: the warp
// maxima are double-buffered (a warp writes buffer i % 2 only after every warp has passed item
// i - 1's barrier, i.e. finished reading item i - 2's buffer, the same one).
__global__ void __launch_bounds__(kThreads) rebase_fast_block128_kernel(const RebaseArgs a) {
  __shared__ uint32_t warp_max[2][kThreads / 32];
  uint32_t id = blockIdx.x;
  Piece cur = load_piece(a, id);
  for (int i = 0;; ++i) {
    const uint32_t next_id = id + gridDim.x;
    const bool more = next_id < a.num_items;
    Piece next;
    if (more) next = load_piece(a, next_id);
    const uint32_t wm = __reduce_max_sync(0xFFFFFFFFu, cur.s0 > cur.s1 ? cur.s0 : cur.s1);
    uint32_t* buf = warp_max[i & 1];
    if (threadIdx.x % 32 == 0) buf[threadIdx.x / 32] = wm;
    __syncthreads();
    uint32_t emax = buf[0];
#pragma unroll
    for (int w = 1; w < kThreads / 32; ++w) emax = emax > buf[w] ? emax : buf[w];
    uint4* dst = reinterpret_cast<uint4*>(a.block_data + cur.off);
    if (cur.ok0) {
      dst[0] = rebase_x16(cur.q[0], cur.s0, emax);
      dst[1] = rebase_x16(cur.q[1], cur.s0, emax);
    }
    if (cur.ok1) {
      dst[2] = rebase_x16(cur.q[2], cur.s1, emax);
      dst[3] = rebase_x16(cur.q[3], cur.s1, emax);
    }
    uint8_t* srow = a.block_scales + (int64_t(cur.b) * a.chunks.d + cur.c) * a.pitch;
    if (threadIdx.x == 0) srow[cur.j] = uint8_t(emax);
    // The pitch's padding bytes, once per (matrix, chunk) row: by the item of the last row block.
    if (cur.j == a.row_blocks.d - 1)
      for (int64_t p = a.row_blocks.d + threadIdx.x; p < a.pitch; p += kThreads) srow[p] = 0;
    if (!more) break;
    id = next_id;
    cur = next;
  }
}

}  // namespace

void rebase_mxfp8_fast_block128(const uint8_t* data, const uint8_t* scales, int64_t batch, int64_t rows, int64_t cols,
                                uint8_t* block_data, uint8_t* block_scales, cudaStream_t stream) {
  constexpr const char* fn = "rebase_mxfp8_fast_block128";
  using detail::throw_arg;
  using detail::to_str;
  if (batch < 1) throw_arg(fn, "batch", to_str(batch), "must be >= 1");
  if (rows < 0) throw_arg(fn, "rows", to_str(rows), "must be >= 0");
  if (cols <= 0 || cols % kMxBlock != 0)
    throw_arg(fn, "cols", to_str(cols), "must be a positive multiple of 32 (MX blocks run along it)");
  const int64_t nchunks = (cols + kFastChunk - 1) / kFastChunk, nrb = (rows + kFastBlockRows - 1) / kFastBlockRows;
  if (batch * nrb * nchunks >= (int64_t(1) << 31))
    throw_arg(fn, "rows", to_str(rows), "batch · ceil(rows/128) · ceil(cols/128) must be below 2^31 (blocks)");
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
  RebaseArgs a{data, scales, block_data, block_scales, rows, cols, nblk, pitch,
               FastDivmod(uint32_t(nchunks)), FastDivmod(uint32_t(nrb)), uint32_t(batch * nrb * nchunks)};
  constexpr auto kernel = rebase_fast_block128_kernel;
  const int grid = int(std::min<int64_t>(a.num_items, detail::max_resident_ctas<kernel>(fn, kThreads)));
  kernel<<<grid, kThreads, 0, stream>>>(a);
  MXMOE_CHECK_LAUNCH(fn);
}

}  // namespace mxmoe
