// Shared-memory slices of a 128x128 BF16 tile loaded by TMA as two [128 rows, 128 B] boxes with the
// 128-byte swizzle (chunk c of row r at c ^ (r % 8)), as the persistent pipelined quantizers read them
// (quantize_mxfp8_sm90.cu quantize_mxfp8_pipelined_kernel, quantize_block128_pipelined_sm90.cu): a
// row-wise thread's 64 columns, a column-wise thread's 4 columns x 16 rows and their block maxima, and
// the addressing of a column-wise warp's staging slice. Stages 2048-byte aligned (one XOR per address).
#pragma once
#include <cstdint>

#include "device/ld_st_shared.cuh"
#include "device/mx_convert.cuh"

namespace mxmoe::pipe_slice {

constexpr int kBoxBytes = 128 * 128;  // one [128 rows, 128 B] box

// Row-wise thread (tile row r, half): 8 x 16 bytes from the box of its half, vector j of the row at
// chunk j ^ (r % 8). `stage`: shared address of the stage.
__device__ __forceinline__ void row_load(uint32_t stage, int r, int half, uint4 (&v)[8]) {
  const uint32_t row = stage + uint32_t(half * kBoxBytes + r * 128) + uint32_t((r & 7) << 4);
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = device::ld_shared_v4_u32(row ^ uint32_t(j << 4));
}

// Column-wise warp w (tile columns 16w..16w+15), thread (q, h): x[2i] = columns (16w + 4q, +1) and
// x[2i+1] = (16w + 4q + 2, +3) of tile row 16h + (i ^ h).
__device__ __forceinline__ void col_load(uint32_t stage, int w, int q, int h, uint32_t (&x)[32]) {
  // Row 16h + (i ^ h) of box w / 4 holds the quad in chunk (2 (w % 4) + q / 2) ^ (i % 8) ^ h, at byte
  // 8 (q % 2). With i = 8 i3 + i_lo and a 2048-aligned stage, the address is one XOR of `base`:
  // (i ^ h) << 7 = (i3 << 10) | ((i_lo ^ h) << 7), no carries into or out of bits 4-10.
  const uint32_t chunk = uint32_t((2 * (w % 4) + q / 2) ^ h);
  const uint32_t base = stage + uint32_t((w / 4) * kBoxBytes + h * 2048 + (q % 2) * 8) + (uint32_t(h) << 7) +
                        (chunk << 4);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const uint2 v = device::ld_shared_v2_u32(base ^ uint32_t(((i >> 3) << 10) | ((i & 7) << 7) | ((i & 7) << 4)));
    x[2 * i] = v.x;
    x[2 * i + 1] = v.y;
  }
}

// The MX scale bytes of a column-wise thread's 4 columns over its 32-row block (its 16 rows and lane
// ^ 1's): max |x| per column as BF16 bits without a mask per word (abs_max_bf16x2_from_maxes).
__device__ __forceinline__ void col_scale_bytes(const uint32_t* x, ScaleMode mode, uint32_t (&sc)[4]) {
  uint32_t u01 = 0, u23 = 0, s01 = 0, s23 = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    u01 = __vmaxu2(u01, x[2 * i]);
    s01 = __vmaxs2(s01, x[2 * i]);
    u23 = __vmaxu2(u23, x[2 * i + 1]);
    s23 = __vmaxs2(s23, x[2 * i + 1]);
  }
  uint32_t m01 = dev::abs_max_bf16x2_from_maxes(u01, s01), m23 = dev::abs_max_bf16x2_from_maxes(u23, s23);
  m01 = __vmaxu2(m01, __shfl_xor_sync(0xFFFFFFFFu, m01, 1));  // the other 16 rows of the 32-row block
  m23 = __vmaxu2(m23, __shfl_xor_sync(0xFFFFFFFFu, m23, 1));
  sc[0] = dev::e8m0_scale_byte(m01 & 0xFFFFu, mode);
  sc[1] = dev::e8m0_scale_byte(m01 >> 16, mode);
  sc[2] = dev::e8m0_scale_byte(m23 & 0xFFFFu, mode);
  sc[3] = dev::e8m0_scale_byte(m23 >> 16, mode);
}

// Staging of a column-wise warp (row 4q + c = column c of the thread's quad, chunk h = rows
// 16h..16h+15 at h ^ (row % 8)). Slot s holds row s ^ h, so output byte k of word j (row 4j + k) is
// byte k ^ (h % 4) of the slot-order word j ^ (h / 4): PRMT(word j, word j ^ 1) with selector nibbles
// (k ^ (h % 4)) + 4 (h / 4). col_store(row0, c, nat, sel) writes column c's 4 slot-order words.
__device__ __forceinline__ uint32_t col_selector(int h) {
  return (0x3210u ^ (uint32_t(h & 3) * 0x1111u)) + uint32_t(h >> 2) * 0x4444u;
}
__device__ __forceinline__ uint32_t col_row0(uint32_t slice, int q, int h) {
  return slice + uint32_t(4 * q * 128) + (uint32_t(h ^ (4 * (q & 1))) << 4);
}
__device__ __forceinline__ uint4 col_in_row_order(const uint32_t (&nat)[4], uint32_t sel) {
  return make_uint4(__byte_perm(nat[0], nat[1], sel), __byte_perm(nat[1], nat[0], sel),
                    __byte_perm(nat[2], nat[3], sel), __byte_perm(nat[3], nat[2], sel));
}
// Staging row y = 4q + c, chunk h ^ (y % 8) = (h ^ 4 (q % 2)) ^ c.
__device__ __forceinline__ void col_store(uint32_t row0, int c, uint4 o) {
  device::st_shared_v4_u32(row0 ^ uint32_t((c << 7) | (c << 4)), o);
}

}  // namespace mxmoe::pipe_slice
