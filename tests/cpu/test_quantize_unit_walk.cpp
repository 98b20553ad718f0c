// The pipelined quantizer's unit walk (src/kernels/quantize/quantize_unit_walk.h), run on the CPU
// with the functions the kernel runs: every tile converted exactly once, every CTA within one tile
// of the others, and the scale writer's unit stores (simulated byte for byte from the same index
// functions, the way the kernel's writer warp copies its slots and stores its unit buffer) writing
// every scale byte of both layouts exactly once with the right value and nothing else. It also
// counts the L2 sectors and 128-byte requests of the writer's store instructions (32 lanes a
// store, consecutive bytes) for the bench shapes, the sector model of docs/notes/quantize.md
// ("Session 11"), and bounds them.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <set>
#include <vector>

#include "kernels/quantize/quantize_unit_walk.h"

using namespace mxmoe::detail;

namespace {

struct Shape {
  int64_t batch, rows, cols;
  bool row, col;
  int32_t gr, gc;
  uint32_t ctas;
};

// A scale byte as a function of its place (stands for the value the consumer warps computed).
uint8_t row_val(int64_t b, int64_t r, int64_t blk) { return uint8_t(b * 131 + r * 7 + blk * 29 + 1); }
uint8_t col_val(int64_t b, int64_t c, int64_t blk) { return uint8_t(b * 17 + c * 11 + blk * 53 + 3); }

struct Counts {
  int64_t tiles = 0, sectors = 0, requests = 0, stores = 0;
};

// Counts sectors / requests of one 32-lane store instruction (addresses of the active lanes).
void count_instr(const std::vector<int64_t>& addr, Counts* n) {
  std::set<int64_t> sec, line;
  for (int64_t a : addr) {
    sec.insert(a / 32);
    line.insert(a / 128);
  }
  n->sectors += int64_t(sec.size());
  n->requests += int64_t(line.size());
  n->stores += addr.empty() ? 0 : 1;
}

// Simulates the walk and the writer warp over all CTAs. check: verify values and coverage.
Counts simulate(const Shape& s, bool check) {
  const int32_t tiles_r = int32_t((s.rows + 127) / 128), tiles_c = int32_t((s.cols + 127) / 128);
  const UnitWalk u = make_unit_walk(s.batch, tiles_r, tiles_c, s.gr, s.gc);
  const uint32_t n = uint32_t(u.num_tiles), p = std::min<uint32_t>(s.ctas, n);
  const int64_t nbr = s.cols / 32, nbc = s.rows / 32;
  std::vector<uint8_t> rs(s.row ? size_t(s.batch * s.rows * nbr) : 0), cs(s.col ? size_t(s.batch * s.cols * nbc) : 0);
  std::vector<uint8_t> rs_n(rs.size(), 0), cs_n(cs.size(), 0);  // times each byte was written
  std::vector<uint8_t> seen(check ? n : 0, 0);
  std::vector<uint8_t> ubuf(kUnitBufferBytes);
  Counts cnt;
  uint32_t next = 0, min_count = n, max_count = 0;
  for (uint32_t c = 0; c < p; ++c) {
    uint32_t begin = 0, count = 0;
    unit_cta_range(n, p, c, &begin, &count);
    EXPECT_EQ(begin, next) << "CTA ranges are contiguous";
    next = begin + count;
    min_count = std::min(min_count, count);
    max_count = std::max(max_count, count);
    int32_t a = 0;
    for (uint32_t k = 0; k < count; ++k) {
      const UnitTile t = unit_tile_at(u, begin + k);
      if (check) {
        // Same tile as the row-major tile index would give: check the tile is inside the grid, once.
        EXPECT_TRUE(t.b < s.batch && t.tr < tiles_r && t.tc < tiles_c && t.tr >= t.ur0 && t.tr < t.ur0 + t.h &&
                    t.tc >= t.uc0 && t.tc < t.uc0 + t.w && t.i == (t.tc - t.uc0) * t.h + (t.tr - t.ur0))
            << "pos " << begin + k;
        const uint32_t id = uint32_t((t.b * tiles_r + t.tr) * tiles_c + t.tc);
        EXPECT_EQ(seen[id]++, 0) << "tile converted twice, pos " << begin + k;
      }
      if (k == 0 || t.i == 0) a = t.i;
      ++cnt.tiles;
      // The writer's copy of the tile's slot into the unit buffer (words of 4 blocks).
      const int32_t tr_in = t.tr - t.ur0, tc_in = t.tc - t.uc0;
      uint8_t* rpart = ubuf.data();
      uint8_t* cpart = ubuf.data() + (s.row ? unit_row_part_bytes(u, u.gr) : 0);
      for (int32_t x = 0; x < 128; ++x)
        for (int32_t j = 0; j < 4; ++j) {
          if (s.row) rpart[4 * unit_row_word(u, tr_in, tc_in, x) + j] = row_val(t.b, int64_t(t.tr) * 128 + x, 4 * t.tc + j);
          if (s.col) cpart[4 * unit_col_word(u, tr_in, tc_in, x) + j] = col_val(t.b, int64_t(t.tc) * 128 + x, 4 * t.tr + j);
        }
      if (!(k + 1 == count || t.i + 1 == t.h * t.w)) continue;
      // The unit part [a, t.i + 1) is done: the writer's store instructions, 32 bytes each.
      for (int part = 0; part < 2; ++part) {
        if (part == 0 ? !s.row : !s.col) continue;
        const int32_t bytes = part == 0 ? unit_row_part_bytes(u, t.h) : unit_col_part_bytes(u, t.w);
        for (int32_t e0 = 0; e0 < bytes; e0 += 32) {
          std::vector<int64_t> addr;
          for (int32_t e = e0; e < e0 + 32; ++e) {
            const int64_t d = part == 0 ? unit_row_scale_dst(u, t, a, t.i + 1, s.rows, s.cols, e)
                                        : unit_col_scale_dst(u, t, a, t.i + 1, s.rows, s.cols, e);
            if (d < 0) continue;
            addr.push_back(d);
            if (part == 0) {
              rs[size_t(d)] = rpart[e];
              ++rs_n[size_t(d)];
            } else {
              cs[size_t(d)] = cpart[e];
              ++cs_n[size_t(d)];
            }
          }
          count_instr(addr, &cnt);
        }
      }
    }
  }
  EXPECT_EQ(next, n) << "the CTAs cover every position";
  EXPECT_LE(max_count - min_count, 1u) << "balanced to within one tile";
  if (!check) return cnt;
  for (uint32_t id = 0; id < n; ++id) EXPECT_EQ(seen[id], 1) << "tile " << id << " never converted";
  for (int64_t b = 0; b < s.batch; ++b) {
    if (s.row)
      for (int64_t r = 0; r < s.rows; ++r)
        for (int64_t k = 0; k < nbr; ++k) {
          const size_t o = size_t((b * s.rows + r) * nbr + k);
          if (rs_n[o] != 1 || rs[o] != row_val(b, r, k)) {
            ADD_FAILURE() << "row scale b=" << b << " r=" << r << " blk=" << k << " written " << int(rs_n[o])
                          << "x, " << int(rs[o]) << " vs " << int(row_val(b, r, k));
            return cnt;
          }
        }
    if (s.col)
      for (int64_t c = 0; c < s.cols; ++c)
        for (int64_t k = 0; k < nbc; ++k) {
          const size_t o = size_t((b * s.cols + c) * nbc + k);
          if (cs_n[o] != 1 || cs[o] != col_val(b, c, k)) {
            ADD_FAILURE() << "col scale b=" << b << " c=" << c << " blk=" << k << " written " << int(cs_n[o])
                          << "x, " << int(cs[o]) << " vs " << int(col_val(b, c, k));
            return cnt;
          }
        }
  }
  return cnt;
}

}  // namespace

// Partial units at every edge (rows not a multiple of 128 gr, K not a multiple of 128 gc, K = 2880,
// shapes smaller than one unit, batches), more units than CTAs and fewer, every unit shape the
// launcher accepts.
TEST(QuantizeUnitWalk, EveryScaleByteOnceAndRight) {
  std::mt19937 rng(std::random_device{}());
  const int64_t shapes[][3] = {{1, 4000, 2880}, {1, 33 * 32, 32},  {1, 96, 64},    {1, 160, 160}, {3, 160, 96},
                               {4, 384, 2880},  {3, 2880, 256},    {1, 2048, 7168}, {2, 512, 2048}, {1, 32, 32},
                               {5, 640, 1184},  {1, 2048, 2880}};
  const int32_t units[][2] = {{1, 1}, {2, 2}, {4, 4}, {1, 8}, {8, 1}, {2, 8}, {8, 2}, {1, 16}, {16, 1}, {4, 2}, {1, 32}, {32, 1}, {2, 16}};
  for (const auto& sh : shapes)
    for (const auto& un : units)
      for (const uint32_t ctas : {1u, 7u, 132u, uint32_t(1 + rng() % 300)}) {
        for (const auto& [row, col] : {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
          if (unit_buffer_bytes(un[0], un[1], int(row) + int(col)) > kUnitBufferBytes) continue;  // the launcher's rule
          const Shape s{sh[0], sh[1], sh[2], row, col, un[0], un[1], ctas};
          SCOPED_TRACE(std::to_string(s.batch) + "x" + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
                       " unit " + std::to_string(s.gr) + "x" + std::to_string(s.gc) + " ctas " + std::to_string(ctas) +
                       (row ? " row" : "") + (col ? " col" : ""));
          simulate(s, true);
          if (HasFailure()) return;
        }
      }
}

// The sector model for the bench shapes on 132 CTAs: scale sectors per tile, today (4-byte runs per
// tile row / column: unit 1x1) and with the default units (4x4 both directions, 1x8 / 8x1 one
// direction). Bounds: the default never spends more than 45% of today's sectors (both directions) or
// 30% (one direction).
TEST(QuantizeUnitWalk, SectorModelOfTheBenchShapes) {
  const int64_t shapes[][3] = {{1, 16384, 7168}, {1, 65536, 2048}, {1, 32768, 2880}, {128, 1536, 2048}};
  for (const auto& sh : shapes)
    for (const auto& [row, col] : {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
      if (sh[0] > 1 && !(row && col)) continue;
      const int32_t gr = row && col ? 4 : (row ? 1 : 8), gc = row && col ? 4 : (row ? 8 : 1);
      const Counts old = simulate({sh[0], sh[1], sh[2], row, col, 1, 1, 132}, false);
      const Counts neu = simulate({sh[0], sh[1], sh[2], row, col, gr, gc, 132}, false);
      std::printf("[sector model] %lldx%lldx%lld %s: tiles %lld, scale sectors/tile 1x1 %.1f (requests %.1f) -> "
                  "%dx%d %.1f (requests %.1f, stores %.1f)\n",
                  (long long)sh[0], (long long)sh[1], (long long)sh[2], row && col ? "row+col" : (row ? "row" : "col"),
                  (long long)neu.tiles, double(old.sectors) / old.tiles, double(old.requests) / old.tiles, gr, gc,
                  double(neu.sectors) / neu.tiles, double(neu.requests) / neu.tiles, double(neu.stores) / neu.tiles);
      EXPECT_LE(double(neu.sectors), (row && col ? 0.45 : 0.30) * double(old.sectors));
    }
}
