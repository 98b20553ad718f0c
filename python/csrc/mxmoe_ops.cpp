// PyTorch binding of mxmoe: custom ops in the `mxmoe` namespace (torch.ops.mxmoe.*).
//
// Each op is one function registered for the CUDA and CPU dispatch keys. It validates every tensor
// argument (device, dtype, shape, contiguity, 16-byte alignment) with a message naming the
// argument, allocates its outputs with the caching allocator, and calls the C++ API
// (include/mxmoe/*.h) on the current CUDA stream of the input's device. Nothing here synchronises
// with the host, so every op can be captured in a CUDA graph. The CPU registration exists only to
// reject CPU tensors with a message that names the argument (instead of the dispatcher's "could
// not run ... with arguments from the 'CPU' backend").
//
// Shape functions for torch.compile (fake tensors) are in python/mxmoe/_fake.py: keep the output
// shapes there in step with the allocations here. The training layer's ops (moe_layer_*) are in
// moe_layer_ops.cpp; the argument checks shared by both files are in binding_util.h.
//
// Conventions (the same as the C++ API): row-major; an MX tensor [R, C] is data float8_e4m3fn
// [R, C] and scales uint8 (E8M0) [R, C/32]; the fast GEMM-ready form is fast_data float8_e4m3fn
// [R, C] and fast_scales uint8 [ceil(C/128), R]; exact mode's BF16 image is bfloat16 [R, C]
// (dequantize.h); GEMMs compute Y = X · Wᵀ.
#include <Python.h>

#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "mxmoe/decode.h"
#include "mxmoe/dequantize.h"
#include "mxmoe/error.h"
#include "mxmoe/gemm.h"
#include "mxmoe/moe_plan.h"
#include "mxmoe/mx_format.h"
#include "mxmoe/quantize.h"

#include "binding_util.h"  // Checker, call_api, current_stream, ptr

// The extension is imported as the Python module mxmoe._C; importing it runs the TORCH_LIBRARY
// registrations below. It has no Python functions of its own.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr,
                                          nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&module_def);
}

namespace mxmoe_torch {
namespace {

mxmoe::ScaleMode scale_mode(Checker& c, int64_t mode) {
  c.value(mode == 0 || mode == 1, "mode", mode, "must be 0 (rceil) or 1 (floor)");
  return static_cast<mxmoe::ScaleMode>(mode);
}

// ---- quantization --------------------------------------------------------------------------

// Allocates one MX copy of logical shape lead + [rows, cols] (blocks of 32 along cols) and
// appends data, scales (and fast_data, fast_scales) to `outs`.
// plain = false: the fast pair alone (fast must be true): what a fast-mode GEMM reads, written by
// the quantizer's faster staged kernels and half the output bytes.
mxmoe::MxOut alloc_mx(std::vector<Tensor>& outs, const at::TensorOptions& opts,
                      std::vector<int64_t> lead, int64_t rows, int64_t cols, bool fast, bool plain) {
  auto with = [&](int64_t a, int64_t b) {
    std::vector<int64_t> s = lead;
    s.push_back(a);
    s.push_back(b);
    return s;
  };
  mxmoe::MxOut o;
  if (plain) {
    Tensor data = at::empty(with(rows, cols), opts.dtype(kFp8));
    Tensor scales = at::empty(with(rows, cols / mxmoe::kMxBlock), opts.dtype(kU8));
    o.data = ptr<uint8_t>(data);
    o.scales = ptr<uint8_t>(scales);
    outs.push_back(data);
    outs.push_back(scales);
  }
  if (fast) {
    Tensor fd = at::empty(with(rows, cols), opts.dtype(kFp8));
    Tensor fs = at::empty(with(cdiv(cols, mxmoe::kFastChunk), rows), opts.dtype(kU8));
    o.fast_data = ptr<uint8_t>(fd);
    o.fast_scales = ptr<uint8_t>(fs);
    outs.push_back(fd);
    outs.push_back(fs);
  }
  return o;
}

void check_forms(const char* op, bool rowwise, bool colwise, bool fast, bool plain) {
  TORCH_CHECK_VALUE(rowwise || colwise, "mxmoe.", op, ": arguments 'rowwise', 'colwise': at least one must be true");
  TORCH_CHECK_VALUE(plain || fast, "mxmoe.", op, ": argument 'plain' = False needs fast = True (a copy must "
                    "have the plain form, the fast form or both)");
}

// x: BF16 [R, C] or [B, R, C]. Returns, in order, for the row-wise copy (if rowwise) and then the
// column-wise copy (if colwise): data, scales (unless plain = false), and with fast also
// fast_data, fast_scales.
//   row-wise: [.., R, C] fp8, [.., R, C/32] u8, [.., R, C] fp8, [.., ceil(C/128), R] u8
//   col-wise: [.., C, R] fp8, [.., C, R/32] u8, [.., C, R] fp8, [.., ceil(R/128), C] u8
std::vector<Tensor> quantize_mxfp8(const Tensor& x, bool rowwise, bool colwise, bool fast,
                                   int64_t mode, bool plain) {
  Checker c{"quantize_mxfp8"};
  c.tensor("x", x, kBf16, 16);
  TORCH_CHECK(x.dim() == 2 || x.dim() == 3, "mxmoe.quantize_mxfp8: argument 'x' must be 2-D [R, C] "
              "or 3-D [B, R, C] (batched weights), got shape ", x.sizes());
  check_forms("quantize_mxfp8", rowwise, colwise, fast, plain);
  const mxmoe::ScaleMode m = scale_mode(c, mode);
  const int64_t batch = x.dim() == 3 ? x.size(0) : 1;
  const int64_t rows = x.size(-2), cols = x.size(-1);
  c.value(cols % 32 == 0 && cols > 0, "x.shape[-1]", cols,
          "must be a positive multiple of 32 (MX blocks run along it)");
  if (colwise)
    c.value(rows % 32 == 0, "x.shape[-2]", rows,
            "must be a multiple of 32 for colwise (blocks run along rows)");
  std::vector<int64_t> lead;
  if (x.dim() == 3) lead.push_back(batch);
  std::vector<Tensor> outs;
  mxmoe::MxOut row, col;
  if (rowwise) row = alloc_mx(outs, x.options(), lead, rows, cols, fast, plain);
  if (colwise) col = alloc_mx(outs, x.options(), lead, cols, rows, fast, plain);
  if (batch == 0 || rows == 0) return outs;  // nothing to quantize
  const c10::cuda::CUDAGuard guard(x.device());
  call_api([&] {
    mxmoe::quantize_mxfp8(bf16_ptr(x), batch, rows, cols, rowwise ? &row : nullptr,
                          colwise ? &col : nullptr, m, current_stream(x.device()));
  });
  return outs;
}

void check_groups(Checker& c, const char* arg, const Tensor& t) {
  c.tensor(arg, t, kI32, 4);
  c.dim(arg, t, 1);
  TORCH_CHECK_VALUE(t.size(0) >= 2 && t.size(0) - 1 <= mxmoe::kMaxGroups, "mxmoe.", c.op,
                    ": argument '", arg, "' must have num_groups + 1 entries with 1 <= num_groups <= ",
                    mxmoe::kMaxGroups, ", got shape ", t.sizes());
}

// Expert-grouped quantization into the padded layout (quantize.h: quantize_mxfp8_grouped).
// x BF16 [x_rows, C]; offsets, padded_offsets int32 [G+1] (device, never read by the host);
// out_rows: a multiple of 128. Outputs as quantize_mxfp8 with R = out_rows. Rows (row-wise) or
// columns (column-wise) at or beyond padded_offsets[G] are not written (their content is
// undefined: torch.empty).
std::vector<Tensor> quantize_mxfp8_grouped(const Tensor& x, const Tensor& offsets,
                                           const Tensor& padded_offsets, int64_t out_rows,
                                           bool rowwise, bool colwise, bool fast, int64_t mode,
                                           bool plain) {
  Checker c{"quantize_mxfp8_grouped"};
  c.tensor("x", x, kBf16, 16);
  c.dim("x", x, 2);
  check_groups(c, "offsets", offsets);
  check_groups(c, "padded_offsets", padded_offsets);
  c.shape("padded_offsets", padded_offsets, offsets.sizes());
  check_forms("quantize_mxfp8_grouped", rowwise, colwise, fast, plain);
  const mxmoe::ScaleMode m = scale_mode(c, mode);
  const int64_t cols = x.size(1);
  c.value(cols % 32 == 0 && cols > 0, "x.shape[1]", cols, "must be a positive multiple of 32");
  c.value(out_rows >= 128 && out_rows % 128 == 0, "out_rows", out_rows,
          "must be a positive multiple of 128 (the padded capacity)");
  std::vector<Tensor> outs;
  mxmoe::MxOut row, col;
  if (rowwise) row = alloc_mx(outs, x.options(), {}, out_rows, cols, fast, plain);
  if (colwise) col = alloc_mx(outs, x.options(), {}, cols, out_rows, fast, plain);
  const c10::cuda::CUDAGuard guard(x.device());
  call_api([&] {
    mxmoe::quantize_mxfp8_grouped(bf16_ptr(x), x.size(0), cols, ptr<const int32_t>(offsets),
                                  ptr<const int32_t>(padded_offsets), int(offsets.size(0) - 1),
                                  out_rows, rowwise ? &row : nullptr, colwise ? &col : nullptr, m,
                                  current_stream(x.device()));
  });
  return outs;
}

// Gather rows by row_index (int32 [out_rows]; negative or >= x_rows: a zero row), then quantize
// (quantize.h: quantize_mxfp8_gather). rows_used: optional int32 scalar tensor (shape [] or [1])
// on the device; rows at or beyond it are not written (content undefined).
std::vector<Tensor> quantize_mxfp8_gather(const Tensor& x, const Tensor& row_index,
                                          const std::optional<Tensor>& rows_used, bool rowwise,
                                          bool colwise, bool fast, int64_t mode, bool plain) {
  Checker c{"quantize_mxfp8_gather"};
  c.tensor("x", x, kBf16, 16);
  c.dim("x", x, 2);
  c.tensor("row_index", row_index, kI32, 4);
  c.dim("row_index", row_index, 1);
  if (rows_used.has_value()) {
    c.tensor("rows_used", *rows_used, kI32, 4);
    TORCH_CHECK(rows_used->numel() == 1, "mxmoe.quantize_mxfp8_gather: argument 'rows_used' must "
                "hold one int32 (shape [] or [1]), got shape ", rows_used->sizes());
  }
  check_forms("quantize_mxfp8_gather", rowwise, colwise, fast, plain);
  const mxmoe::ScaleMode m = scale_mode(c, mode);
  const int64_t cols = x.size(1), out_rows = row_index.size(0);
  c.value(cols % 32 == 0 && cols > 0, "x.shape[1]", cols, "must be a positive multiple of 32");
  c.value(out_rows >= 128 && out_rows % 128 == 0, "row_index.shape[0]", out_rows,
          "must be a positive multiple of 128 (the padded capacity)");
  std::vector<Tensor> outs;
  mxmoe::MxOut row, col;
  if (rowwise) row = alloc_mx(outs, x.options(), {}, out_rows, cols, fast, plain);
  if (colwise) col = alloc_mx(outs, x.options(), {}, cols, out_rows, fast, plain);
  const c10::cuda::CUDAGuard guard(x.device());
  call_api([&] {
    mxmoe::quantize_mxfp8_gather(bf16_ptr(x), x.size(0), cols, ptr<const int32_t>(row_index),
                                 out_rows,
                                 rows_used.has_value() ? ptr<const int32_t>(*rows_used) : nullptr,
                                 rowwise ? &row : nullptr, colwise ? &col : nullptr, m,
                                 current_stream(x.device()));
  });
  return outs;
}

// padded[g] = Σ_{j<g} roundup(offsets[j+1] - offsets[j], align); int32 [G+1] in, out.
Tensor compute_padded_offsets(const Tensor& offsets, int64_t align) {
  Checker c{"compute_padded_offsets"};
  check_groups(c, "offsets", offsets);
  c.value(align >= 1 && align <= (1 << 20), "align", align, "must be in [1, 2^20]");
  Tensor padded = at::empty_like(offsets);
  const c10::cuda::CUDAGuard guard(offsets.device());
  call_api([&] {
    mxmoe::compute_padded_offsets(ptr<const int32_t>(offsets), ptr<int32_t>(padded),
                                  int(offsets.size(0) - 1), int(align),
                                  current_stream(offsets.device()));
  });
  return padded;
}

// ---- routing plan --------------------------------------------------------------------------

// ids int32 [T, k] (experts in [0, E); others are dropped). capacity: 0 = the worst case
// moe_plan_capacity(T, k, E). Returns counts [E], offsets [E+1], padded_offsets [E+1],
// row_of [T, k], row_index [capacity] (all int32).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> moe_plan(const Tensor& ids, int64_t num_experts,
                                                            int64_t capacity) {
  Checker c{"moe_plan"};
  c.tensor("ids", ids, kI32, 4);
  c.dim("ids", ids, 2);
  const int64_t tokens = ids.size(0), top_k = ids.size(1);
  c.value(num_experts >= 1 && num_experts <= mxmoe::kMaxExperts, "num_experts", num_experts,
          "must be in [1, " + std::to_string(mxmoe::kMaxExperts) + "]");
  c.value(top_k >= 1 && top_k <= mxmoe::kMaxTopK && top_k <= num_experts, "ids.shape[1]", top_k,
          "(top_k) must be in [1, min(32, num_experts)]");
  const int64_t need = mxmoe::moe_plan_capacity(tokens, int(top_k), int(num_experts));
  if (capacity == 0) capacity = need;
  c.value(capacity >= need && capacity % 128 == 0, "capacity", capacity,
          "must be 0 (worst case) or a multiple of 128 that is at least roundup(T*k + E*127, 128) = " +
              std::to_string(need));
  const auto opts = ids.options();
  Tensor counts = at::empty({num_experts}, opts);
  Tensor offsets = at::empty({num_experts + 1}, opts);
  Tensor padded = at::empty({num_experts + 1}, opts);
  Tensor row_of = at::empty({tokens, top_k}, opts);
  Tensor row_index = at::empty({capacity}, opts);
  const size_t ws_bytes = mxmoe::moe_plan_workspace_bytes(tokens, int(top_k), int(num_experts));
  Tensor ws = at::empty({int64_t((ws_bytes + 3) / 4)}, opts);
  mxmoe::MoePlan plan;
  plan.counts = ptr<int32_t>(counts);
  plan.offsets = ptr<int32_t>(offsets);
  plan.padded_offsets = ptr<int32_t>(padded);
  plan.row_of = ptr<int32_t>(row_of);
  plan.row_index = ptr<int32_t>(row_index);
  const c10::cuda::CUDAGuard guard(ids.device());
  call_api([&] {
    mxmoe::moe_plan(ptr<const int32_t>(ids), tokens, int(top_k), int(num_experts), capacity,
                    ws_bytes ? ws.data_ptr() : nullptr, ws_bytes, plan, current_stream(ids.device()));
  });
  return {counts, offsets, padded, row_of, row_index};
}

// ---- BF16 images (exact mode's GEMM operands) ---------------------------------------------------

// The BF16 image of an MX tensor (dequantize.h): data fp8 [..., R, C], scales uint8 [..., R, C/32]
// (shapes already checked) -> bfloat16 of data's shape, on the current stream; token_blocked (2-D
// data [R, C], C % 128 == 0: a k-grouped operand) -> bfloat16 [C/128, R, 128]
// (dequantize_mxfp8_bf16_token_blocked).
Tensor make_image(const Tensor& data, const Tensor& scales, bool token_blocked = false) {
  const int64_t cols = data.size(-1), rows = cols ? data.numel() / cols : 0;
  Tensor img = token_blocked ? at::empty({cols / 128, rows, 128}, data.options().dtype(kBf16))
                             : at::empty(data.sizes(), data.options().dtype(kBf16));
  if (rows == 0) return img;
  const c10::cuda::CUDAGuard guard(data.device());
  const auto dequantize = token_blocked ? mxmoe::dequantize_mxfp8_bf16_token_blocked : mxmoe::dequantize_mxfp8_bf16;
  call_api([&] {
    dequantize(ptr<const uint8_t>(data), ptr<const uint8_t>(scales), rows, cols,
               reinterpret_cast<__nv_bfloat16*>(img.data_ptr()), current_stream(data.device()));
  });
  return img;
}

// image = BF16(deq(data, scales)) (dequantize.h: dequantize_mxfp8_bf16): data float8_e4m3fn
// [R, C] or [B, R, C] (C % 32 == 0), scales uint8 [..., R, C/32] -> bfloat16 of data's shape.
Tensor dequantize_mxfp8_bf16(const Tensor& data, const Tensor& scales) {
  Checker c{"dequantize_mxfp8_bf16"};
  c.tensor("data", data, kFp8, 16);
  TORCH_CHECK_VALUE(data.dim() == 2 || data.dim() == 3, "mxmoe.dequantize_mxfp8_bf16: argument 'data' "
                    "must be 2-D or 3-D, got shape ", data.sizes());
  const int64_t cols = data.size(-1);
  c.value(cols > 0 && cols % 32 == 0, "data.shape[-1]", cols, "must be a positive multiple of 32");
  c.tensor("scales", scales, kU8, 1);
  std::vector<int64_t> want(data.sizes().begin(), data.sizes().end());
  want.back() = cols / 32;
  c.shape("scales", scales, want);
  return make_image(data, scales);
}

// The 128x128-block fast form of weights (quantize.h: rebase_mxfp8_fast_block128; gemm.h
// FastScaleLayout::kBlock128) from a plain MX copy: data float8_e4m3fn [R, C] or [B, R, C], scales
// uint8 [..., R, C/32] -> (block_data float8_e4m3fn of data's shape, block_scales uint8
// [B, ceil(C/128), pitch] (B = 1 for 2-D data), pitch = ceil(R/128) rounded up to 16).
std::tuple<Tensor, Tensor> rebase_mxfp8_fast_block128(const Tensor& data, const Tensor& scales) {
  Checker c{"rebase_mxfp8_fast_block128"};
  c.tensor("data", data, kFp8, 16);
  TORCH_CHECK_VALUE(data.dim() == 2 || data.dim() == 3, "mxmoe.rebase_mxfp8_fast_block128: argument 'data' "
                    "must be 2-D or 3-D, got shape ", data.sizes());
  const int64_t cols = data.size(-1), rows = data.size(-2), batch = data.dim() == 3 ? data.size(0) : 1;
  c.value(cols > 0 && cols % 32 == 0, "data.shape[-1]", cols, "must be a positive multiple of 32");
  c.value(batch >= 1, "data.shape[0]", batch, "must be >= 1");
  c.tensor("scales", scales, kU8, 1);
  std::vector<int64_t> want(data.sizes().begin(), data.sizes().end());
  want.back() = cols / 32;
  c.shape("scales", scales, want);
  Tensor bd = at::empty_like(data);
  Tensor bs = at::empty({batch, cdiv(cols, 128), mxmoe::fast_block_scales_pitch(rows)}, data.options().dtype(kU8));
  if (rows == 0) return {bd, bs};
  const c10::cuda::CUDAGuard guard(data.device());
  call_api([&] {
    mxmoe::rebase_mxfp8_fast_block128(ptr<const uint8_t>(data), ptr<const uint8_t>(scales), batch, rows, cols,
                                      ptr<uint8_t>(bd), ptr<uint8_t>(bs), current_stream(data.device()));
  });
  return {bd, bs};
}

// ---- grouped GEMMs ---------------------------------------------------------------------------

mxmoe::GemmOutDtype gemm_out_dtype(const char* op, ScalarType t) {
  TORCH_CHECK_VALUE(t == kBf16 || t == kF32, "mxmoe.", op,
                    ": output dtype must be torch.bfloat16 or torch.float32, got ", c10::toString(t));
  return t == kF32 ? mxmoe::GemmOutDtype::kFP32 : mxmoe::GemmOutDtype::kBF16;
}

// Operand checks shared by both GEMMs. data: fp8 [rows(, ...), kdim] per `data_shape`; scales
// per mode: fast = `fast_scales_shape` (16-byte aligned, TMA), exact = `exact_scales_shape`.
void check_operand(Checker& c, const char* data_arg, const Tensor& data, const char* scales_arg,
                   const Tensor& scales, bool fast, at::IntArrayRef fast_scales_shape,
                   at::IntArrayRef exact_scales_shape) {
  c.tensor(data_arg, data, kFp8, 16);
  c.tensor(scales_arg, scales, kU8, fast ? 16 : 1);
  c.shape(scales_arg, scales, fast ? fast_scales_shape : exact_scales_shape);
}

// Exact mode's operand image: `image` when given (bfloat16 of the data's shape, contiguous,
// 16-byte aligned), else made here from data and scales on the current stream (a temporary: the
// caching allocator keeps its memory for the GEMM queued after it on the same stream). Fast mode
// reads no image (an undefined Tensor; a given one is ignored).
Tensor exact_image(Checker& c, const char* arg, const std::optional<Tensor>& image, const Tensor& data,
                   const Tensor& scales, bool fast) {
  if (fast) return Tensor();
  if (image.has_value()) {
    c.tensor(arg, *image, kBf16, 16);
    c.shape(arg, *image, data.sizes());
    return *image;
  }
  return make_image(data, scales);
}

mxmoe::MxOperand operand(const Tensor& data, const Tensor& scales, const Tensor& image, bool fast,
                         bool block = false) {
  mxmoe::MxOperand o;
  if (fast) {
    o.fast_data = ptr<const uint8_t>(data);
    o.fast_scales = ptr<const uint8_t>(scales);
    if (block) o.fast_scale_layout = mxmoe::FastScaleLayout::kBlock128;
  } else {
    o.data = ptr<const uint8_t>(data);
    o.scales = ptr<const uint8_t>(scales);
    o.image = bf16_ptr(image);
  }
  return o;
}

// The two operands' images (exact mode; undefined in fast mode) and whether each is token-blocked
// (dequantize.h: ImageLayout; only the k-grouped GEMM makes and reads blocked images).
struct Images {
  Tensor a, b;
  bool a_blocked = false, b_blocked = false;
};

struct MGroupedShape {
  int64_t m, n, k, e;
};

// a fp8 [M, K]; b fp8 [E, N, K]; scales per mode (fast: a [ceil(K/128), M], b [E, ceil(K/128), N],
// or with b_block b's 128x128-block form [E, ceil(K/128), fast_block_scales_pitch(N)]; exact: a [M, K/32],
// b [E, N, K/32]); offsets int32 [E+1].
MGroupedShape check_m_grouped(Checker& c, const Tensor& a, const Tensor& a_scales, const Tensor& b,
                              const Tensor& b_scales, const Tensor& offsets, bool fast, bool b_block) {
  c.value(!b_block || fast, "b_block", b_block, "needs fast=True (the block form is a fast-mode operand)");
  c.device_of("a", a);
  c.dim("a", a, 2);
  c.dim("b", b, 3);
  const int64_t m = a.size(0), k = a.size(1), e = b.size(0), n = b.size(1);
  TORCH_CHECK_VALUE(b.size(2) == k, "mxmoe.", c.op, ": argument 'b' must be [E, N, K] with K = ",
                    k, " (a.shape[1]), got shape ", b.sizes());
  c.value(k >= 32 && k % 32 == 0, "a.shape[1]", k, "(K) must be a positive multiple of 32");
  c.value(n >= 32 && n % 32 == 0, "b.shape[1]", n, "(N) must be a positive multiple of 32");
  c.value(m % 128 == 0, "a.shape[0]", m, "(M_total) must be a multiple of 128 (padded segments)");
  c.value(e >= 1 && e <= mxmoe::kMaxGemmExperts, "b.shape[0]", e,
          "(E) must be in [1, " + std::to_string(mxmoe::kMaxGemmExperts) + "]");
  const int64_t kc = cdiv(k, 128);
  check_operand(c, "a", a, "a_scales", a_scales, fast, {kc, m}, {m, k / 32});
  check_operand(c, "b", b, "b_scales", b_scales, fast,
                {e, kc, b_block ? mxmoe::fast_block_scales_pitch(n) : n}, {e, n, k / 32});
  c.tensor("offsets", offsets, kI32, 4);
  c.shape("offsets", offsets, {e + 1});
  return {m, n, k, e};
}

// Options of a grouped GEMM call on a's device and current stream.
mxmoe::GemmOptions gemm_options(const char* op, const Tensor& a, const Tensor& out, bool fast, bool accumulate,
                                int64_t num_sms) {
  mxmoe::GemmOptions opts;
  opts.mode = fast ? mxmoe::GemmMode::kFast : mxmoe::GemmMode::kExact;
  opts.out_dtype = gemm_out_dtype(op, out.scalar_type());
  opts.num_sms = int(num_sms);
  opts.accumulate = accumulate;
  opts.stream = current_stream(a.device());
  return opts;
}

void run_m_grouped(const char* op, const Tensor& a, const Tensor& a_scales, const Tensor& b,
                   const Tensor& b_scales, const Images& img, const Tensor& offsets, const MGroupedShape& s,
                   const Tensor& out, bool fast, bool accumulate, int64_t num_sms, bool b_block) {
  const mxmoe::GemmOptions opts = gemm_options(op, a, out, fast, accumulate, num_sms);
  const c10::cuda::CUDAGuard guard(a.device());
  call_api([&] {
    mxmoe::m_grouped_mxfp8_gemm_nt(operand(a, a_scales, img.a, fast), s.m, operand(b, b_scales, img.b, fast, b_block),
                                   int(s.e), s.n, s.k, ptr<const int32_t>(offsets),
                                   out.numel() ? out.data_ptr() : nullptr, opts);
  });
}

// A new output of a grouped GEMM: BF16 (default) or FP32 on a's device; and the num_sms argument.
Tensor new_gemm_out(Checker& c, const Tensor& a, std::optional<ScalarType> out_dtype,
                    std::initializer_list<int64_t> shape, int64_t num_sms) {
  const ScalarType odt = out_dtype.value_or(kBf16);
  gemm_out_dtype(c.op, odt);
  c.value(num_sms >= 0, "num_sms", num_sms, "must be >= 0 (0 = every SM)");
  return at::empty(shape, a.options().dtype(odt));
}

// The output of a grouped GEMM's `_out` variant: BF16 or FP32, on the operands' device, contiguous,
// 16-byte aligned, of the given shape; and the num_sms argument.
void check_gemm_out(Checker& c, const Tensor& out, std::initializer_list<int64_t> shape, int64_t num_sms) {
  c.device_of("out", out);
  TORCH_CHECK_VALUE(out.scalar_type() == kBf16 || out.scalar_type() == kF32, "mxmoe.", c.op,
                    ": argument 'out' must have dtype torch.bfloat16 or torch.float32, got ",
                    c10::toString(out.scalar_type()));
  c.contiguous("out", out);
  c.aligned("out", out, 16);
  c.shape("out", out, shape);
  c.value(num_sms >= 0, "num_sms", num_sms, "must be >= 0 (0 = every SM)");
}

// Y [M_total, N] = per expert segment A · B[e]ᵀ (gemm.h: m_grouped_mxfp8_gemm_nt). Rows at or
// beyond offsets[E] are not written (content undefined: torch.empty); pad rows are zeros.
// Exact mode (fast = false) reads the BF16 images a_image [M_total, K] and b_image [E, N, K] when
// given, else makes them from the MX tensors first (exact_image).
Tensor m_grouped_mxfp8_gemm_nt(const Tensor& a, const Tensor& a_scales, const Tensor& b,
                               const Tensor& b_scales, const Tensor& offsets, bool fast,
                               std::optional<ScalarType> out_dtype, int64_t num_sms,
                               const std::optional<Tensor>& a_image, const std::optional<Tensor>& b_image,
                               bool b_block) {
  const char* op = "m_grouped_mxfp8_gemm_nt";
  Checker c{op};
  const MGroupedShape s = check_m_grouped(c, a, a_scales, b, b_scales, offsets, fast, b_block);
  Tensor y = new_gemm_out(c, a, out_dtype, {s.m, s.n}, num_sms);
  const Images img{exact_image(c, "a_image", a_image, a, a_scales, fast),
                   exact_image(c, "b_image", b_image, b, b_scales, fast)};
  run_m_grouped(op, a, a_scales, b, b_scales, img, offsets, s, y, fast, false, num_sms, b_block);
  return y;
}

// As above into `out` (BF16 or FP32 [M_total, N]); accumulate: out += result (pad rows and rows
// beyond offsets[E] keep their values).
void m_grouped_mxfp8_gemm_nt_out(const Tensor& a, const Tensor& a_scales, const Tensor& b,
                                 const Tensor& b_scales, const Tensor& offsets, const Tensor& out,
                                 bool fast, bool accumulate, int64_t num_sms,
                                 const std::optional<Tensor>& a_image, const std::optional<Tensor>& b_image,
                                 bool b_block) {
  const char* op = "m_grouped_mxfp8_gemm_nt_out";
  Checker c{op};
  const MGroupedShape s = check_m_grouped(c, a, a_scales, b, b_scales, offsets, fast, b_block);
  check_gemm_out(c, out, {s.m, s.n}, num_sms);
  const Images img{exact_image(c, "a_image", a_image, a, a_scales, fast),
                   exact_image(c, "b_image", b_image, b, b_scales, fast)};
  run_m_grouped(op, a, a_scales, b, b_scales, img, offsets, s, out, fast, accumulate, num_sms, b_block);
}

struct KGroupedShape {
  int64_t m, n, k, e;
};

// a = dYᵀ fp8 [N, M]; b = Xᵀ fp8 [K, M]; scales per mode (fast: a [M/128, N], b [M/128, K];
// exact: a [N, M/32], b [K, M/32]); offsets int32 [E+1].
KGroupedShape check_k_grouped(Checker& c, const Tensor& a, const Tensor& a_scales, const Tensor& b,
                              const Tensor& b_scales, const Tensor& offsets, bool fast, bool b_block) {
  c.value(!b_block || fast, "b_block", b_block, "needs fast=True (the block form is a fast-mode operand)");
  c.device_of("a", a);
  c.dim("a", a, 2);
  c.dim("b", b, 2);
  const int64_t n = a.size(0), m = a.size(1), k = b.size(0);
  TORCH_CHECK_VALUE(b.size(1) == m, "mxmoe.", c.op, ": argument 'b' must be [K, M_total] with ",
                    "M_total = ", m, " (a.shape[1]), got shape ", b.sizes());
  c.value(m % 128 == 0, "a.shape[1]", m, "(M_total, tokens) must be a multiple of 128");
  c.value(n >= 32 && n % 32 == 0, "a.shape[0]", n, "(N) must be a positive multiple of 32");
  c.value(k >= 32 && k % 32 == 0, "b.shape[0]", k, "(K) must be a positive multiple of 32");
  c.tensor("offsets", offsets, kI32, 4);
  c.dim("offsets", offsets, 1);
  const int64_t e = offsets.size(0) - 1;
  c.value(e >= 1 && e <= mxmoe::kMaxGemmExperts, "offsets.shape[0]", offsets.size(0),
          "must be E + 1 with 1 <= E <= " + std::to_string(mxmoe::kMaxGemmExperts));
  check_operand(c, "a", a, "a_scales", a_scales, fast, {m / 128, n}, {n, m / 32});
  if (b_block)  // Xᵀ in 128x128 blocks (rebase_mxfp8_fast_block128 of the [K, M_total] copy): [1, M/128, pitch(K)]
    check_operand(c, "b", b, "b_scales", b_scales, fast, {1, m / 128, mxmoe::fast_block_scales_pitch(k)}, {});
  else
    check_operand(c, "b", b, "b_scales", b_scales, fast, {m / 128, k}, {k, m / 32});
  return {m, n, k, e};
}

// Exact mode's k-grouped operand image: `image` when given (row-major, as exact_image), else the
// token-blocked image [M_total/128, R, 128] made here (dequantize.h:
// dequantize_mxfp8_bf16_token_blocked; same values, a 128-token window of every row contiguous:
// docs/notes/gemm.md, run 66). *blocked says which.
Tensor k_grouped_image(Checker& c, const char* arg, const std::optional<Tensor>& image, const Tensor& data,
                       const Tensor& scales, bool fast, bool* blocked) {
  *blocked = !fast && !image.has_value();
  return *blocked ? make_image(data, scales, true) : exact_image(c, arg, image, data, scales, fast);
}

Images k_grouped_images(Checker& c, const Tensor& a, const Tensor& a_scales, const std::optional<Tensor>& a_image,
                        const Tensor& b, const Tensor& b_scales, const std::optional<Tensor>& b_image, bool fast) {
  Images img;
  img.a = k_grouped_image(c, "a_image", a_image, a, a_scales, fast, &img.a_blocked);
  img.b = k_grouped_image(c, "b_image", b_image, b, b_scales, fast, &img.b_blocked);
  return img;
}

void run_k_grouped(const char* op, const Tensor& a, const Tensor& a_scales, const Tensor& b,
                   const Tensor& b_scales, const Images& img, const Tensor& offsets, const KGroupedShape& s,
                   const Tensor& out, bool fast, bool accumulate, int64_t num_sms, bool b_block) {
  const mxmoe::GemmOptions opts = gemm_options(op, a, out, fast, accumulate, num_sms);
  const c10::cuda::CUDAGuard guard(a.device());
  mxmoe::MxOperand oa = operand(a, a_scales, img.a, fast), ob = operand(b, b_scales, img.b, fast, b_block);
  if (img.a_blocked) oa.image_layout = mxmoe::ImageLayout::kTokenBlocked;
  if (img.b_blocked) ob.image_layout = mxmoe::ImageLayout::kTokenBlocked;
  call_api([&] {
    mxmoe::k_grouped_mxfp8_gemm_nt(oa, ob, s.m, int(s.e), s.n, s.k, ptr<const int32_t>(offsets), out.data_ptr(),
                                   opts);
  });
}

// dW [E, N, K] = per expert segment of tokens dYᵀ · X (gemm.h: k_grouped_mxfp8_gemm_nt). Every
// expert is written (an empty expert gets zeros). Exact mode: images a_image [N, M_total] and
// b_image [K, M_total] (row-major) as for the m-grouped GEMM when given; otherwise made here,
// token-blocked (k_grouped_image).
Tensor k_grouped_mxfp8_gemm_nt(const Tensor& a, const Tensor& a_scales, const Tensor& b,
                               const Tensor& b_scales, const Tensor& offsets, bool fast,
                               std::optional<ScalarType> out_dtype, int64_t num_sms,
                               const std::optional<Tensor>& a_image, const std::optional<Tensor>& b_image,
                               bool b_block) {
  const char* op = "k_grouped_mxfp8_gemm_nt";
  Checker c{op};
  const KGroupedShape s = check_k_grouped(c, a, a_scales, b, b_scales, offsets, fast, b_block);
  Tensor dw = new_gemm_out(c, a, out_dtype, {s.e, s.n, s.k}, num_sms);
  const Images img = k_grouped_images(c, a, a_scales, a_image, b, b_scales, b_image, fast);
  run_k_grouped(op, a, a_scales, b, b_scales, img, offsets, s, dw, fast, false, num_sms, b_block);
  return dw;
}

// As above into `out` (BF16 or FP32 [E, N, K]); accumulate: out += result.
void k_grouped_mxfp8_gemm_nt_out(const Tensor& a, const Tensor& a_scales, const Tensor& b,
                                 const Tensor& b_scales, const Tensor& offsets, const Tensor& out,
                                 bool fast, bool accumulate, int64_t num_sms,
                                 const std::optional<Tensor>& a_image, const std::optional<Tensor>& b_image,
                                 bool b_block) {
  const char* op = "k_grouped_mxfp8_gemm_nt_out";
  Checker c{op};
  const KGroupedShape s = check_k_grouped(c, a, a_scales, b, b_scales, offsets, fast, b_block);
  check_gemm_out(c, out, {s.e, s.n, s.k}, num_sms);
  const Images img = k_grouped_images(c, a, a_scales, a_image, b, b_scales, b_image, fast);
  run_k_grouped(op, a, a_scales, b, b_scales, img, offsets, s, out, fast, accumulate, num_sms, b_block);
}

// ---- warp decode -----------------------------------------------------------------------------

// The router's parameters (decode.h: RouterParams) after checking top_k and bias FP32 [E].
mxmoe::RouterParams router_params(Checker& c, int64_t experts, int64_t top_k, bool sigmoid, bool renormalize,
                                  int64_t n_groups, int64_t topk_groups, double scaling_factor,
                                  const std::optional<Tensor>& bias) {
  if (bias.has_value()) {
    c.tensor("bias", *bias, kF32, 4);
    c.shape("bias", *bias, {experts});
  }
  c.value(top_k >= 1 && top_k <= mxmoe::kDecodeMaxTopK, "top_k", top_k,
          "must be in [1, " + std::to_string(mxmoe::kDecodeMaxTopK) + "]");
  mxmoe::RouterParams p;
  p.scoring = sigmoid ? mxmoe::RouterScoring::kSigmoid : mxmoe::RouterScoring::kSoftmax;
  p.top_k = int(top_k);
  p.renormalize = renormalize;
  p.n_groups = int(n_groups);
  p.topk_groups = int(topk_groups);
  p.scaling_factor = float(scaling_factor);
  p.bias = bias.has_value() ? ptr<const float>(*bias) : nullptr;
  return p;
}

// x BF16 [B, H]; router_w BF16 [E, H]; bias FP32 [E] (sigmoid only). Returns topk_ids int32
// [B, k] and topk_weights FP32 [B, k] (decode.h: decode_router).
std::tuple<Tensor, Tensor> decode_router(const Tensor& x, const Tensor& router_w, int64_t top_k,
                                         bool sigmoid, bool renormalize, int64_t n_groups,
                                         int64_t topk_groups, double scaling_factor,
                                         const std::optional<Tensor>& bias) {
  Checker c{"decode_router"};
  c.tensor("x", x, kBf16, 16);
  c.dim("x", x, 2);
  c.tensor("router_w", router_w, kBf16, 16);
  c.dim("router_w", router_w, 2);
  const int64_t batch = x.size(0), hidden = x.size(1), experts = router_w.size(0);
  TORCH_CHECK_VALUE(router_w.size(1) == hidden, "mxmoe.decode_router: argument 'router_w' must be "
                    "[E, H] with H = ", hidden, " (x.shape[1]), got shape ", router_w.sizes());
  const mxmoe::RouterParams p = router_params(c, experts, top_k, sigmoid, renormalize, n_groups, topk_groups,
                                              scaling_factor, bias);
  Tensor ids = at::empty({batch, top_k}, x.options().dtype(kI32));
  Tensor weights = at::empty({batch, top_k}, x.options().dtype(kF32));
  const c10::cuda::CUDAGuard guard(x.device());
  call_api([&] {
    mxmoe::decode_router(bf16_ptr(x), int(batch), int(hidden), bf16_ptr(router_w), int(experts), p,
                         ptr<int32_t>(ids), ptr<float>(weights), current_stream(x.device()));
  });
  return {ids, weights};
}

// One projection's weights: w BF16 [E, N, K], or float8_e4m3fn [E, N, K] with scales uint8
// [E, N, K/32]; optional shared expert [N, K] (+ scales [N, K/32]) of the same dtype.
mxmoe::DecodeWeights decode_weights(Checker& c, const char* w_arg, const Tensor& w,
                                    const char* s_arg, const std::optional<Tensor>& scales,
                                    const char* sw_arg, const std::optional<Tensor>& shared,
                                    const char* ss_arg, const std::optional<Tensor>& shared_scales,
                                    int64_t n, int64_t k) {
  mxmoe::DecodeWeights dw;
  c.device_of(w_arg, w);
  TORCH_CHECK(w.scalar_type() == kBf16 || w.scalar_type() == kFp8, "mxmoe.", c.op, ": argument '",
              w_arg, "' must have dtype torch.bfloat16 or torch.float8_e4m3fn (MXFP8, with scales), got ",
              c10::toString(w.scalar_type()));
  const bool mx = w.scalar_type() == kFp8;
  c.contiguous(w_arg, w);
  c.aligned(w_arg, w, 16);
  c.dim(w_arg, w, 3);
  const int64_t e = w.size(0);
  c.shape(w_arg, w, {e, n, k});
  dw.dtype = mx ? mxmoe::DecodeWeightDtype::kMXFP8 : mxmoe::DecodeWeightDtype::kBF16;
  dw.data = w.data_ptr();
  if (mx) {
    TORCH_CHECK_VALUE(scales.has_value(), "mxmoe.", c.op, ": argument '", s_arg,
                      "' is required with float8_e4m3fn weights");
    c.value(k % 32 == 0, w_arg, k, "the last dimension must be a multiple of 32 for MXFP8 weights");
    c.tensor(s_arg, *scales, kU8, 1);
    c.shape(s_arg, *scales, {e, n, k / 32});
    dw.scales = ptr<const uint8_t>(*scales);
  } else {
    TORCH_CHECK_VALUE(!scales.has_value(), "mxmoe.", c.op, ": argument '", s_arg,
                      "' must be None for BF16 weights");
  }
  if (shared.has_value()) {
    c.tensor(sw_arg, *shared, w.scalar_type(), 16);
    c.shape(sw_arg, *shared, {n, k});
    dw.shared_data = shared->data_ptr();
    if (mx) {
      TORCH_CHECK_VALUE(shared_scales.has_value(), "mxmoe.", c.op, ": argument '", ss_arg,
                        "' is required with a float8_e4m3fn shared expert");
      c.tensor(ss_arg, *shared_scales, kU8, 1);
      c.shape(ss_arg, *shared_scales, {n, k / 32});
      dw.shared_scales = ptr<const uint8_t>(*shared_scales);
    }
  }
  if (shared_scales.has_value() && (!mx || !shared.has_value()))
    TORCH_CHECK_VALUE(false, "mxmoe.", c.op, ": argument '", ss_arg,
                      "' must be None unless the weights are MXFP8 with a shared expert");
  return dw;
}

// h [B, S, I] (FP32, or BF16 with h_dtype=torch.bfloat16), S = k (+1 with a shared expert):
// h[b, j, i] = silu(x[b]·w1[e_j][i]) · (x[b]·w1[e_j][I + i]) (decode.h: decode_gate_up).
// w1 [E, 2I, H].
Tensor decode_gate_up(const Tensor& x, const Tensor& w1, const std::optional<Tensor>& w1_scales,
                      const Tensor& topk_ids, const std::optional<Tensor>& shared_w1,
                      const std::optional<Tensor>& shared_w1_scales,
                      std::optional<ScalarType> h_dtype) {
  Checker c{"decode_gate_up"};
  c.tensor("x", x, kBf16, 16);
  c.dim("x", x, 2);
  c.dim("w1", w1, 3);
  const int64_t batch = x.size(0), hidden = x.size(1), e = w1.size(0), two_i = w1.size(1);
  c.value(two_i % 2 == 0, "w1.shape[1]", two_i, "must be 2·I (gate rows, then up rows)");
  const int64_t inter = two_i / 2;
  const mxmoe::DecodeWeights dw = decode_weights(c, "w1", w1, "w1_scales", w1_scales, "shared_w1",
                                                 shared_w1, "shared_w1_scales", shared_w1_scales,
                                                 two_i, hidden);
  c.tensor("topk_ids", topk_ids, kI32, 4);
  c.dim("topk_ids", topk_ids, 2);
  TORCH_CHECK_VALUE(topk_ids.size(0) == batch, "mxmoe.decode_gate_up: argument 'topk_ids' must be "
                    "[B, k] with B = ", batch, " (x.shape[0]), got shape ", topk_ids.sizes());
  const int64_t top_k = topk_ids.size(1);
  const ScalarType hdt = h_dtype.value_or(kF32);
  TORCH_CHECK_VALUE(hdt == kF32 || hdt == kBf16, "mxmoe.decode_gate_up: argument 'h_dtype' must "
                    "be torch.float32 or torch.bfloat16, got ", c10::toString(hdt));
  const int64_t slots = top_k + (shared_w1.has_value() ? 1 : 0);
  Tensor h = at::empty({batch, slots, inter}, x.options().dtype(hdt));
  const c10::cuda::CUDAGuard guard(x.device());
  call_api([&] {
    mxmoe::decode_gate_up(bf16_ptr(x), int(batch), int(hidden), int(inter), dw, int(e),
                          ptr<const int32_t>(topk_ids), int(top_k), h.data_ptr(),
                          hdt == kBf16 ? mxmoe::DecodeHDtype::kBF16 : mxmoe::DecodeHDtype::kFP32,
                          current_stream(x.device()));
  });
  return h;
}

// out BF16 [B, H] = Σ_j w[b, j] · (h[b, j] · w2[e_j]ᵀ) (+ the shared slot with weight 1)
// (decode.h: decode_down). h [B, S, I] FP32 or BF16; w2 [E, H, I].
Tensor decode_down(const Tensor& h, const Tensor& w2, const std::optional<Tensor>& w2_scales,
                   const Tensor& topk_ids, const Tensor& topk_weights,
                   const std::optional<Tensor>& shared_w2,
                   const std::optional<Tensor>& shared_w2_scales) {
  Checker c{"decode_down"};
  c.device_of("h", h);
  TORCH_CHECK(h.scalar_type() == kF32 || h.scalar_type() == kBf16, "mxmoe.decode_down: argument "
              "'h' must have dtype torch.float32 or torch.bfloat16, got ", c10::toString(h.scalar_type()));
  c.contiguous("h", h);
  c.aligned("h", h, 16);
  c.dim("h", h, 3);
  c.dim("w2", w2, 3);
  const int64_t batch = h.size(0), slots = h.size(1), inter = h.size(2), hidden = w2.size(1);
  const int64_t e = w2.size(0);
  const mxmoe::DecodeWeights dw = decode_weights(c, "w2", w2, "w2_scales", w2_scales, "shared_w2",
                                                 shared_w2, "shared_w2_scales", shared_w2_scales,
                                                 hidden, inter);
  c.tensor("topk_ids", topk_ids, kI32, 4);
  c.dim("topk_ids", topk_ids, 2);
  const int64_t top_k = topk_ids.size(1);
  c.shape("topk_ids", topk_ids, {batch, top_k});
  c.tensor("topk_weights", topk_weights, kF32, 4);
  c.shape("topk_weights", topk_weights, {batch, top_k});
  const int64_t want_slots = top_k + (shared_w2.has_value() ? 1 : 0);
  TORCH_CHECK_VALUE(slots == want_slots, "mxmoe.decode_down: argument 'h' must be [B, S, I] with "
                    "S = top_k", shared_w2.has_value() ? " + 1 (shared expert)" : "", " = ",
                    want_slots, ", got shape ", h.sizes());
  Tensor out = at::empty({batch, hidden}, h.options().dtype(kBf16));
  const c10::cuda::CUDAGuard guard(h.device());
  call_api([&] {
    mxmoe::decode_down(h.data_ptr(),
                       h.scalar_type() == kBf16 ? mxmoe::DecodeHDtype::kBF16 : mxmoe::DecodeHDtype::kFP32,
                       int(batch), int(inter), int(hidden), dw, int(e), ptr<const int32_t>(topk_ids),
                       ptr<const float>(topk_weights), int(top_k),
                       reinterpret_cast<__nv_bfloat16*>(out.data_ptr()), current_stream(h.device()));
  });
  return out;
}

// The fused step's workspace (decode.h: decode_step_fused_workspace_bytes, _init_workspace) for a
// batch of x.shape[0] tokens (it serves every smaller batch) of the layer whose w1 is [E, 2I, H]:
// uint8 on x's device, initialised. One per stream (decode.h).
Tensor decode_fused_workspace(const Tensor& x, const Tensor& w1, int64_t top_k, bool shared_expert) {
  Checker c{"decode_fused_workspace"};
  c.tensor("x", x, kBf16, 16);
  c.dim("x", x, 2);
  c.device_of("w1", w1);
  c.dim("w1", w1, 3);
  c.value(top_k >= 1 && top_k <= mxmoe::kDecodeMaxTopK, "top_k", top_k,
          "must be in [1, " + std::to_string(mxmoe::kDecodeMaxTopK) + "]");
  c.value(w1.size(1) % 2 == 0, "w1.shape[1]", w1.size(1), "must be 2·I (gate rows, then up rows)");
  c.value(w1.size(2) == x.size(1), "w1.shape[2]", w1.size(2), "must equal H = x.shape[1]");
  mxmoe::DecodeShape shape;
  shape.hidden = int(x.size(1));
  shape.inter = int(w1.size(1) / 2);
  shape.num_experts = int(w1.size(0));
  shape.top_k = int(top_k);
  shape.shared_expert = shared_expert;
  const c10::cuda::CUDAGuard guard(x.device());
  size_t bytes = 0;
  call_api([&] { bytes = mxmoe::decode_step_fused_workspace_bytes(shape, int(x.size(0))); });
  Tensor ws = at::empty({int64_t(bytes)}, x.options().dtype(kU8));  // the caching allocator: 512-byte aligned
  call_api([&] { mxmoe::decode_step_fused_init_workspace(ws.data_ptr(), bytes, current_stream(x.device())); });
  return ws;
}

// One decode step in one persistent kernel (decode.h: decode_step_fused; 1 <= B <= 8): the router
// (as decode_router), gate/up with FP32 h and down. Returns (topk_ids, topk_weights, out), bitwise
// those of decode_router -> decode_gate_up -> decode_down. workspace: from decode_fused_workspace
// for at least this batch and this layer, used by one stream at a time.
std::tuple<Tensor, Tensor, Tensor> decode_step_fused(
    const Tensor& x, const Tensor& router_w, int64_t top_k, bool sigmoid, bool renormalize, int64_t n_groups,
    int64_t topk_groups, double scaling_factor, const std::optional<Tensor>& bias, const Tensor& w1,
    const std::optional<Tensor>& w1_scales, const Tensor& w2, const std::optional<Tensor>& w2_scales,
    const std::optional<Tensor>& shared_w1, const std::optional<Tensor>& shared_w1_scales,
    const std::optional<Tensor>& shared_w2, const std::optional<Tensor>& shared_w2_scales,
    const Tensor& workspace) {
  Checker c{"decode_step_fused"};
  c.tensor("x", x, kBf16, 16);
  c.dim("x", x, 2);
  c.tensor("router_w", router_w, kBf16, 16);
  c.dim("router_w", router_w, 2);
  c.dim("w1", w1, 3);
  c.dim("w2", w2, 3);
  const int64_t batch = x.size(0), hidden = x.size(1), experts = w1.size(0), two_i = w1.size(1);
  c.value(two_i % 2 == 0, "w1.shape[1]", two_i, "must be 2·I (gate rows, then up rows)");
  const int64_t inter = two_i / 2;
  c.shape("router_w", router_w, {experts, hidden});
  const mxmoe::RouterParams p = router_params(c, experts, top_k, sigmoid, renormalize, n_groups, topk_groups,
                                              scaling_factor, bias);
  const mxmoe::DecodeWeights dw1 = decode_weights(c, "w1", w1, "w1_scales", w1_scales, "shared_w1", shared_w1,
                                                  "shared_w1_scales", shared_w1_scales, two_i, hidden);
  const mxmoe::DecodeWeights dw2 = decode_weights(c, "w2", w2, "w2_scales", w2_scales, "shared_w2", shared_w2,
                                                  "shared_w2_scales", shared_w2_scales, hidden, inter);
  c.value(w2.size(0) == experts, "w2.shape[0]", w2.size(0), "must equal E = w1.shape[0]");
  c.tensor("workspace", workspace, kU8, 256);
  c.dim("workspace", workspace, 1);
  mxmoe::DecodeShape shape;
  shape.hidden = int(hidden);
  shape.inter = int(inter);
  shape.num_experts = int(experts);
  shape.top_k = int(top_k);
  shape.shared_expert = shared_w1.has_value();
  Tensor ids = at::empty({batch, top_k}, x.options().dtype(kI32));
  Tensor weights = at::empty({batch, top_k}, x.options().dtype(kF32));
  Tensor out = at::empty({batch, hidden}, x.options().dtype(kBf16));
  const c10::cuda::CUDAGuard guard(x.device());
  call_api([&] {  // the library checks the batch, the dtypes' and shared experts' agreement, the workspace size
    mxmoe::decode_step_fused(bf16_ptr(x), int(batch), shape, bf16_ptr(router_w), p, dw1, dw2, ptr<int32_t>(ids),
                             ptr<float>(weights), reinterpret_cast<__nv_bfloat16*>(out.data_ptr()),
                             workspace.data_ptr(), size_t(workspace.numel()), current_stream(x.device()));
  });
  return {ids, weights, out};
}

}  // namespace
}  // namespace mxmoe_torch

// ---- registration ------------------------------------------------------------------------------
// Schemas: keep the argument names in step with python/mxmoe/ops.py and _fake.py.
TORCH_LIBRARY(mxmoe, m) {
  m.def("quantize_mxfp8(Tensor x, bool rowwise=True, bool colwise=False, bool fast=False, "
        "int mode=0, bool plain=True) -> Tensor[]");
  m.def("quantize_mxfp8_grouped(Tensor x, Tensor offsets, Tensor padded_offsets, int out_rows, "
        "bool rowwise=True, bool colwise=False, bool fast=False, int mode=0, bool plain=True) -> Tensor[]");
  m.def("quantize_mxfp8_gather(Tensor x, Tensor row_index, Tensor? rows_used=None, "
        "bool rowwise=True, bool colwise=False, bool fast=False, int mode=0, bool plain=True) -> Tensor[]");
  m.def("compute_padded_offsets(Tensor offsets, int align=128) -> Tensor");
  m.def("moe_plan(Tensor ids, int num_experts, int capacity=0) -> "
        "(Tensor counts, Tensor offsets, Tensor padded_offsets, Tensor row_of, Tensor row_index)");
  m.def("dequantize_mxfp8_bf16(Tensor data, Tensor scales) -> Tensor");
  m.def("rebase_mxfp8_fast_block128(Tensor data, Tensor scales) -> (Tensor block_data, Tensor block_scales)");
  m.def("m_grouped_mxfp8_gemm_nt(Tensor a, Tensor a_scales, Tensor b, Tensor b_scales, "
        "Tensor offsets, bool fast=True, ScalarType? out_dtype=None, int num_sms=0, "
        "Tensor? a_image=None, Tensor? b_image=None, bool b_block=False) -> Tensor");
  m.def("m_grouped_mxfp8_gemm_nt_out(Tensor a, Tensor a_scales, Tensor b, Tensor b_scales, "
        "Tensor offsets, Tensor(a!) out, bool fast=True, bool accumulate=False, int num_sms=0, "
        "Tensor? a_image=None, Tensor? b_image=None, bool b_block=False) -> ()");
  m.def("k_grouped_mxfp8_gemm_nt(Tensor a, Tensor a_scales, Tensor b, Tensor b_scales, "
        "Tensor offsets, bool fast=True, ScalarType? out_dtype=None, int num_sms=0, "
        "Tensor? a_image=None, Tensor? b_image=None, bool b_block=False) -> Tensor");
  m.def("k_grouped_mxfp8_gemm_nt_out(Tensor a, Tensor a_scales, Tensor b, Tensor b_scales, "
        "Tensor offsets, Tensor(a!) out, bool fast=True, bool accumulate=False, int num_sms=0, "
        "Tensor? a_image=None, Tensor? b_image=None, bool b_block=False) -> ()");
  m.def("decode_router(Tensor x, Tensor router_w, int top_k, bool sigmoid=False, "
        "bool renormalize=True, int n_groups=1, int topk_groups=1, float scaling_factor=1.0, "
        "Tensor? bias=None) -> (Tensor topk_ids, Tensor topk_weights)");
  m.def("decode_gate_up(Tensor x, Tensor w1, Tensor? w1_scales, Tensor topk_ids, "
        "Tensor? shared_w1=None, Tensor? shared_w1_scales=None, ScalarType? h_dtype=None) -> Tensor");
  m.def("decode_down(Tensor h, Tensor w2, Tensor? w2_scales, Tensor topk_ids, Tensor topk_weights, "
        "Tensor? shared_w2=None, Tensor? shared_w2_scales=None) -> Tensor");
  m.def("decode_fused_workspace(Tensor x, Tensor w1, int top_k, bool shared_expert=False) -> Tensor");
  m.def("decode_step_fused(Tensor x, Tensor router_w, int top_k, bool sigmoid, bool renormalize, "
        "int n_groups, int topk_groups, float scaling_factor, Tensor? bias, Tensor w1, Tensor? w1_scales, "
        "Tensor w2, Tensor? w2_scales, Tensor? shared_w1, Tensor? shared_w1_scales, Tensor? shared_w2, "
        "Tensor? shared_w2_scales, Tensor(a!) workspace) -> (Tensor topk_ids, Tensor topk_weights, Tensor out)");
}

#define MXMOE_IMPL_ALL(m)                                                        \
  m.impl("quantize_mxfp8", &mxmoe_torch::quantize_mxfp8);                        \
  m.impl("quantize_mxfp8_grouped", &mxmoe_torch::quantize_mxfp8_grouped);        \
  m.impl("quantize_mxfp8_gather", &mxmoe_torch::quantize_mxfp8_gather);          \
  m.impl("compute_padded_offsets", &mxmoe_torch::compute_padded_offsets);        \
  m.impl("moe_plan", &mxmoe_torch::moe_plan);                                    \
  m.impl("dequantize_mxfp8_bf16", &mxmoe_torch::dequantize_mxfp8_bf16);          \
  m.impl("rebase_mxfp8_fast_block128", &mxmoe_torch::rebase_mxfp8_fast_block128); \
  m.impl("m_grouped_mxfp8_gemm_nt", &mxmoe_torch::m_grouped_mxfp8_gemm_nt);      \
  m.impl("m_grouped_mxfp8_gemm_nt_out", &mxmoe_torch::m_grouped_mxfp8_gemm_nt_out); \
  m.impl("k_grouped_mxfp8_gemm_nt", &mxmoe_torch::k_grouped_mxfp8_gemm_nt);      \
  m.impl("k_grouped_mxfp8_gemm_nt_out", &mxmoe_torch::k_grouped_mxfp8_gemm_nt_out); \
  m.impl("decode_router", &mxmoe_torch::decode_router);                          \
  m.impl("decode_gate_up", &mxmoe_torch::decode_gate_up);                        \
  m.impl("decode_down", &mxmoe_torch::decode_down);                              \
  m.impl("decode_fused_workspace", &mxmoe_torch::decode_fused_workspace);        \
  m.impl("decode_step_fused", &mxmoe_torch::decode_step_fused)

TORCH_LIBRARY_IMPL(mxmoe, CUDA, m) { MXMOE_IMPL_ALL(m); }
// CPU tensors reach the same functions, whose first check rejects them naming the argument.
TORCH_LIBRARY_IMPL(mxmoe, CPU, m) { MXMOE_IMPL_ALL(m); }
