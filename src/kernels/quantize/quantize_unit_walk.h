// The pipelined quantizer's unit walk (MXMOE_QUANT_SCALE_UNIT, quantize_mxfp8_sm90.cu): which
// 128x128 tiles a CTA converts, in which order, and where the scale writer warp stores the scale
// bytes of a unit. Host and device code (the CPU test tests/cpu/test_quantize_unit_walk.cpp runs the
// same functions to check coverage, bytes and the sector count).
//
// Units: per batch entry the tile grid [tiles_r, tiles_c] is cut into units of gr x gc tiles (the
// last unit row / column may be shorter). The tile positions 0 .. num_tiles - 1 run batch entry by
// batch entry, unit row by unit row, unit by unit, and inside a unit column-first (the unit's row
// tiles of its first column tile, then the next column tile). CTA c of P converts the contiguous
// positions [begin, begin + count) with count = N / P or N / P + 1 (cta_range): every CTA gets the
// same number of tiles to within one, whatever the unit size, and a unit is split between two CTAs
// only where a CTA's range starts or ends.
//
// The part of a unit one CTA converts is the positions [a, e) of the unit; for any such range the
// tiles of one tile row of the unit form one contiguous run of tile columns, and the tiles of one
// tile column one contiguous run of tile rows, so each scale row (column) of the part is one
// contiguous run of bytes, at most 4 gc (4 gr) long.
//
// Unit buffer (shared memory, filled by the writer warp from the per-tile scale slots):
//   row part: [gr * 128 unit rows][4 gc bytes]: byte 4 tc + j of unit row 128 tr + r = block j of
//             tile row r of the unit's tile (tr, tc);
//   col part: [gc * 128 unit columns][4 gr bytes]: byte 4 tr + j of unit column 128 tc + c =
//             row block j of tile column c of tile (tr, tc).
// Byte e of a part is stored by lane e % 32 of the writer's store instruction e / 32, so the lanes
// of one instruction write consecutive bytes of 32 / (4 gc) rows (or one row's 32 bytes).
#pragma once
#include <cstdint>

#include "device/fast_divmod.cuh"

namespace mxmoe::detail {

constexpr int kUnitTile = 128;          // tile rows = tile columns
constexpr int kUnitBufferBytes = 16 * 1024;  // the unit buffer: 512 bytes a tile and direction

// Unit buffer bytes of a gr x gc unit (row part, then col part when both directions are on).
constexpr int unit_buffer_bytes(int gr, int gc, int directions) { return 512 * gr * gc * directions; }

struct UnitWalk {
  int32_t gr = 1, gc = 1;               // unit shape in tiles: gr row tiles x gc column tiles (powers of 2)
  int32_t log_rb = 2, log_cb = 2;       // log2 of the run lengths: 4 gc (row part), 4 gr (col part)
  int32_t tiles_r = 0, tiles_c = 0, num_tiles = 0;
  FastDivmod per_batch;                 // tiles_r * tiles_c
  FastDivmod per_unit_row;              // gr * tiles_c (the last unit row, shorter, is last)
  FastDivmod unit_full, unit_last;      // tiles of a unit in a full / the last unit row: gr gc, h_last gc
  FastDivmod h_full, h_last;            // gr, h_last = tiles_r - (unit rows - 1) gr
};

// One tile of the walk and the unit it belongs to.
struct UnitTile {
  int32_t b = 0, tr = 0, tc = 0;        // batch entry, row tile, column tile
  int32_t ur0 = 0, uc0 = 0;             // the unit's first row tile, column tile
  int32_t h = 1, w = 1;                 // the unit's height, width in tiles (edge units are smaller)
  int32_t i = 0;                        // position in the unit: (tc - uc0) h + (tr - ur0)
};

inline int32_t unit_log2(int32_t v) {
  int32_t l = 0;
  while ((1 << l) < v) ++l;
  return l;
}

// Host: the walk over batch x [tiles_r, tiles_c] tiles with units of gr x gc (powers of 2).
inline UnitWalk make_unit_walk(int64_t batch, int32_t tiles_r, int32_t tiles_c, int32_t gr, int32_t gc) {
  UnitWalk u;
  u.gr = gr;
  u.gc = gc;
  u.log_rb = 2 + unit_log2(gc);
  u.log_cb = 2 + unit_log2(gr);
  u.tiles_r = tiles_r;
  u.tiles_c = tiles_c;
  u.num_tiles = int32_t(batch * tiles_r * tiles_c);
  const int32_t h_last = tiles_r - (tiles_r - 1) / gr * gr;
  u.per_batch = FastDivmod(uint32_t(tiles_r * tiles_c));
  u.per_unit_row = FastDivmod(uint32_t(gr * tiles_c));
  u.unit_full = FastDivmod(uint32_t(gr * gc));
  u.unit_last = FastDivmod(uint32_t(h_last * gc));
  u.h_full = FastDivmod(uint32_t(gr));
  u.h_last = FastDivmod(uint32_t(h_last));
  return u;
}

// Tile position (0 .. num_tiles - 1) → tile and unit.
MXMOE_HOST_DEVICE UnitTile unit_tile_at(const UnitWalk& u, uint32_t pos) {
  UnitTile t;
  t.b = int32_t(u.per_batch.div(pos));
  uint32_t rem = pos - uint32_t(t.b) * u.per_batch.d;
  const uint32_t urow = u.per_unit_row.div(rem);
  rem -= urow * u.per_unit_row.d;
  t.ur0 = int32_t(urow) * u.gr;
  const bool full = t.ur0 + u.gr <= u.tiles_r;
  t.h = full ? u.gr : int32_t(u.h_last.d);
  const uint32_t unit = (full ? u.unit_full : u.unit_last).div(rem);
  t.i = int32_t(rem - unit * (full ? u.unit_full : u.unit_last).d);
  t.uc0 = int32_t(unit) * u.gc;
  t.w = u.tiles_c - t.uc0 < u.gc ? u.tiles_c - t.uc0 : u.gc;
  const uint32_t tc_in = (full ? u.h_full : u.h_last).div(uint32_t(t.i));
  t.tc = t.uc0 + int32_t(tc_in);
  t.tr = t.ur0 + (t.i - int32_t(tc_in) * t.h);
  return t;
}

// CTA c of p: tile positions [*begin, *begin + *count) of n.
MXMOE_HOST_DEVICE void unit_cta_range(uint32_t n, uint32_t p, uint32_t c, uint32_t* begin, uint32_t* count) {
  const uint32_t base = n / p, extra = n - base * p;
  *begin = c * base + (c < extra ? c : extra);
  *count = base + (c < extra ? 1u : 0u);
}

// Unit buffer word of a tile's row-wise scale word of tile row r (4 blocks), and of its
// column-wise word of tile column c.
MXMOE_HOST_DEVICE int32_t unit_row_word(const UnitWalk& u, int32_t tr_in, int32_t tc_in, int32_t r) {
  return (tr_in * kUnitTile + r) * u.gc + tc_in;
}
MXMOE_HOST_DEVICE int32_t unit_col_word(const UnitWalk& u, int32_t tr_in, int32_t tc_in, int32_t c) {
  return (tc_in * kUnitTile + c) * u.gr + tr_in;
}

// Bytes in each part of a unit of height h, width w (the store loops run e over [0, bytes)).
MXMOE_HOST_DEVICE int32_t unit_row_part_bytes(const UnitWalk& u, int32_t h) { return (h * kUnitTile) << u.log_rb; }
MXMOE_HOST_DEVICE int32_t unit_col_part_bytes(const UnitWalk& u, int32_t w) { return (w * kUnitTile) << u.log_cb; }

// Where byte e of the row part of unit `t` goes in the row-wise scales [batch, rows, cols / 32]
// when the CTA converted the unit's positions [a, e_end); -1: not stored (a tile of another CTA,
// past the unit, a row past rows_out or a block past cols / 32). The kernels' rule: tile row
// r < out_valid, block t.c0 / 32 + j < cols / 32.
MXMOE_HOST_DEVICE int64_t unit_row_scale_dst(const UnitWalk& u, const UnitTile& t, int32_t a, int32_t e_end,
                                             int64_t rows_out, int64_t cols, int32_t e) {
  const int32_t row = e >> u.log_rb, byte = e & ((1 << u.log_rb) - 1);
  const int32_t tr_in = row >> 7, tc_in = byte >> 2;
  const int32_t pos = tc_in * t.h + tr_in;
  const int64_t grow = int64_t(t.ur0) * kUnitTile + row;
  const int64_t nblk = cols / 32, blk = int64_t(t.uc0) * 4 + byte;
  if (tc_in >= t.w || pos < a || pos >= e_end || grow >= rows_out || blk >= nblk) return -1;
  return (int64_t(t.b) * rows_out + grow) * nblk + blk;
}

// Where byte e of the col part goes in the column-wise scales [batch, cols, rows / 32]; the
// kernels' rule: column t.c0 + c < cols, row block j with 32 j < out_valid.
MXMOE_HOST_DEVICE int64_t unit_col_scale_dst(const UnitWalk& u, const UnitTile& t, int32_t a, int32_t e_end,
                                             int64_t rows_out, int64_t cols, int32_t e) {
  const int32_t col = e >> u.log_cb, byte = e & ((1 << u.log_cb) - 1);
  const int32_t tc_in = col >> 7, tr_in = byte >> 2;
  const int32_t pos = tc_in * t.h + tr_in;
  const int64_t gcol = int64_t(t.uc0) * kUnitTile + col;
  const int64_t nblk = rows_out / 32, blk = int64_t(t.ur0) * 4 + byte;
  if (tr_in >= t.h || pos < a || pos >= e_end || gcol >= cols || 32 * blk >= rows_out) return -1;
  return (int64_t(t.b) * cols + gcol) * nblk + blk;
}

}  // namespace mxmoe::detail
