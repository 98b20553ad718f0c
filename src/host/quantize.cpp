// Host entry points of the MXFP8 quantizers: argument checks (before any CUDA call, so they are
// testable without a GPU), then the launch.
#include "mxmoe/quantize.h"

#include <string>

#include "host/check.h"
#include "kernels/quantize/quantize_launch.h"

namespace mxmoe {
namespace {

using detail::check_aligned;
using detail::check_not_null;
using detail::throw_arg;
using detail::to_str;

constexpr int64_t kMaxGridY = 65535;
constexpr int64_t kTile = 128;

void check_out(const char* fn, const std::string& name, const MxOut& o) {
  const std::string d = name + ".data", s = name + ".scales", fd = name + ".fast_data",
                    fs = name + ".fast_scales";
  // The plain MX pair (data, scales) and the fast pair are each optional, but each pair comes whole
  // and at least one must be given.
  if (o.data == nullptr && o.scales == nullptr && o.fast_data == nullptr && o.fast_scales == nullptr)
    throw_arg(fn, d.c_str(), "null", "give data + scales, fast_data + fast_scales, or both");
  if ((o.data == nullptr) != (o.scales == nullptr))
    throw_arg(fn, (o.data ? s : d).c_str(), "null", "data and scales must be given together");
  if (o.data) check_aligned(fn, d.c_str(), o.data, 16);
  if ((o.fast_data == nullptr) != (o.fast_scales == nullptr))
    throw_arg(fn, (o.fast_data ? fs : fd).c_str(), "null",
              "fast_data and fast_scales must be given together");
  if (o.fast_data) check_aligned(fn, fd.c_str(), o.fast_data, 16);
}

void check_mode(const char* fn, ScaleMode mode) {
  if (mode != ScaleMode::kRceil && mode != ScaleMode::kFloor)
    throw_arg(fn, "mode", to_str(int(mode)), "must be ScaleMode::kRceil or ScaleMode::kFloor");
}

void check_cols(const char* fn, int64_t cols) {
  if (cols <= 0 || cols % kMxBlock != 0)
    throw_arg(fn, "cols", to_str(cols), "must be a positive multiple of 32 (MX blocks run along it)");
  if (cols > (int64_t(1) << 24)) throw_arg(fn, "cols", to_str(cols), "must be at most 2^24");
}

// The kernels index tiles with 32-bit integers.
void check_tiles(const char* fn, int64_t batch, int64_t rows, int64_t cols) {
  const int64_t tiles = batch * ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
  if (tiles >= (int64_t(1) << 31))
    throw_arg(fn, "batch", to_str(batch), "tensor too large: more than 2^31 tiles of 128x128");
}

void check_outputs(const char* fn, const MxOut* rowwise, const MxOut* colwise) {
  if (!rowwise && !colwise) throw_arg(fn, "rowwise", "null", "at least one of rowwise, colwise must be given");
  if (rowwise) check_out(fn, "rowwise", *rowwise);
  if (colwise) check_out(fn, "colwise", *colwise);
  // The column-wise 128x128-block form: the staged kernel's, beside the row-wise fast form alone or alone.
  if (rowwise && rowwise->fast_blocks)
    throw_arg(fn, "rowwise.fast_blocks", "true",
              "the block form is written for colwise only here (quantize_mxfp8_block128 makes both ways)");
  if (colwise && colwise->fast_blocks) {
    if (colwise->fast_data == nullptr)
      throw_arg(fn, "colwise.fast_data", "null", "colwise.fast_blocks needs the fast pair (the block form)");
    if (colwise->data != nullptr)
      throw_arg(fn, "colwise.data", "non-null",
                "with colwise.fast_blocks the block form is written alone: give data = scales = null");
    if (rowwise && (rowwise->data != nullptr || rowwise->fast_data == nullptr))
      throw_arg(fn, "rowwise.data", rowwise->data ? "non-null" : "null",
                "with colwise.fast_blocks the row-wise copy must be its fast pair alone (or rowwise null)");
  }
}

// Inputs and outputs shared by the grouped and gather quantizers (x rows mapped into a padded
// output row space of out_rows).
void check_gathered(const char* fn, const __nv_bfloat16* x, int64_t x_rows, int64_t cols, int64_t out_rows,
                    ScaleMode mode, const MxOut* rowwise, const MxOut* colwise) {
  if (x_rows < 0) throw_arg(fn, "x_rows", to_str(x_rows), "must be >= 0");
  if (x_rows > 0) check_not_null(fn, "x", x);
  check_aligned(fn, "x", x, 16);
  check_cols(fn, cols);
  if (out_rows < kTile || out_rows % kTile != 0 || out_rows > kMaxGridY * kTile)
    throw_arg(fn, "out_rows", to_str(out_rows),
              "must be a positive multiple of 128 (the padded capacity), at most " + to_str(kMaxGridY * kTile));
  check_mode(fn, mode);
  check_outputs(fn, rowwise, colwise);
  check_tiles(fn, 1, out_rows, cols);
}

void check_group_offsets(const char* fn, const int32_t* offsets, const int32_t* padded_offsets, int num_groups) {
  check_not_null(fn, "offsets", offsets);
  check_aligned(fn, "offsets", offsets, 4);
  check_not_null(fn, "padded_offsets", padded_offsets);
  check_aligned(fn, "padded_offsets", padded_offsets, 4);
  if (num_groups < 1 || num_groups > kMaxGroups)
    throw_arg(fn, "num_groups", to_str(num_groups), "must be in [1, " + to_str(kMaxGroups) + "]");
}

detail::QuantizeParams make_params(const __nv_bfloat16* x, int64_t batch, int64_t rows_out, int64_t x_rows,
                                   int64_t cols, ScaleMode mode, const MxOut* rowwise, const MxOut* colwise) {
  detail::QuantizeParams p;
  p.x = reinterpret_cast<const uint16_t*>(x);
  p.batch = batch;
  p.rows_out = rows_out;
  p.x_rows = x_rows;
  p.cols = cols;
  p.mode = mode;
  if (rowwise) {
    p.row_data = rowwise->data;
    p.row_scales = rowwise->scales;
    p.row_fast_data = rowwise->fast_data;
    p.row_fast_scales = rowwise->fast_scales;
  }
  if (colwise) {
    p.col_data = colwise->data;
    p.col_scales = colwise->scales;
    p.col_fast_data = colwise->fast_data;
    p.col_fast_scales = colwise->fast_scales;
    p.col_fast_blocks = colwise->fast_blocks;
  }
  return p;
}

}  // namespace

void quantize_mxfp8(const __nv_bfloat16* x, int64_t batch, int64_t rows, int64_t cols,
                    const MxOut* rowwise, const MxOut* colwise, ScaleMode mode, cudaStream_t stream) {
  const char* fn = "quantize_mxfp8";
  check_not_null(fn, "x", x);
  check_aligned(fn, "x", x, 16);
  if (batch < 1 || batch > kMaxGridY) throw_arg(fn, "batch", to_str(batch), "must be in [1, 65535]");
  if (rows < 1 || rows > kMaxGridY * kTile)
    throw_arg(fn, "rows", to_str(rows), "must be in [1, " + to_str(kMaxGridY * kTile) + "]");
  check_cols(fn, cols);
  check_mode(fn, mode);
  check_outputs(fn, rowwise, colwise);
  if (colwise) {
    if (rows % kMxBlock != 0)
      throw_arg(fn, "rows", to_str(rows), "must be a multiple of 32 for colwise (blocks run along rows)");
  }
  check_tiles(fn, batch, rows, cols);
  detail::launch_quantize_mxfp8(make_params(x, batch, rows, rows, cols, mode, rowwise, colwise), stream);
}

void quantize_mxfp8_grouped(const __nv_bfloat16* x, int64_t x_rows, int64_t cols,
                            const int32_t* offsets, const int32_t* padded_offsets, int num_groups,
                            int64_t out_rows, const MxOut* rowwise, const MxOut* colwise,
                            ScaleMode mode, cudaStream_t stream) {
  const char* fn = "quantize_mxfp8_grouped";
  check_gathered(fn, x, x_rows, cols, out_rows, mode, rowwise, colwise);
  check_group_offsets(fn, offsets, padded_offsets, num_groups);
  detail::QuantizeParams p = make_params(x, 1, out_rows, x_rows, cols, mode, rowwise, colwise);
  p.offsets = offsets;
  p.padded_offsets = padded_offsets;
  p.num_groups = num_groups;
  detail::launch_quantize_mxfp8(p, stream);
}

namespace {

void gather_impl(const char* fn, const __nv_bfloat16* x, int64_t x_rows, int64_t cols, const int32_t* row_index,
                 const float* row_scale, int64_t out_rows, const int32_t* rows_used, const MxOut* rowwise,
                 const MxOut* colwise, ScaleMode mode, cudaStream_t stream) {
  check_gathered(fn, x, x_rows, cols, out_rows, mode, rowwise, colwise);
  check_not_null(fn, "row_index", row_index);
  check_aligned(fn, "row_index", row_index, 4);
  check_aligned(fn, "rows_used", rows_used, 4);
  detail::QuantizeParams p = make_params(x, 1, out_rows, x_rows, cols, mode, rowwise, colwise);
  p.row_index = row_index;
  p.rows_used = rows_used;
  p.row_scale = row_scale;
  detail::launch_quantize_mxfp8(p, stream);
}

}  // namespace

void quantize_mxfp8_gather(const __nv_bfloat16* x, int64_t x_rows, int64_t cols, const int32_t* row_index,
                           int64_t out_rows, const int32_t* rows_used, const MxOut* rowwise,
                           const MxOut* colwise, ScaleMode mode, cudaStream_t stream) {
  gather_impl("quantize_mxfp8_gather", x, x_rows, cols, row_index, nullptr, out_rows, rows_used, rowwise, colwise,
              mode, stream);
}

void quantize_mxfp8_gather_scaled(const __nv_bfloat16* x, int64_t x_rows, int64_t cols, const int32_t* row_index,
                                  const float* row_scale, int64_t out_rows, const int32_t* rows_used,
                                  const MxOut* rowwise, const MxOut* colwise, ScaleMode mode, cudaStream_t stream) {
  const char* fn = "quantize_mxfp8_gather_scaled";
  check_not_null(fn, "row_scale", row_scale);
  check_aligned(fn, "row_scale", row_scale, 4);
  gather_impl(fn, x, x_rows, cols, row_index, row_scale, out_rows, rows_used, rowwise, colwise, mode, stream);
}

void compute_padded_offsets(const int32_t* offsets, int32_t* padded_offsets, int num_groups,
                            int align, cudaStream_t stream) {
  const char* fn = "compute_padded_offsets";
  check_group_offsets(fn, offsets, padded_offsets, num_groups);
  if (align < 1 || align > (1 << 20)) throw_arg(fn, "align", to_str(align), "must be in [1, 2^20]");
  detail::launch_compute_padded_offsets(offsets, padded_offsets, num_groups, align, stream);
}

}  // namespace mxmoe
