// C ABI wrappers: translate to the C++ API and turn exceptions into status codes + a message.
#include "mxmoe/c_api.h"

#include <string>

#include "host/c_api_guard.h"
#include "mxmoe/dequantize.h"
#include "mxmoe/quantize.h"

std::string& mxmoe::detail::c_api_last_error() {
  thread_local std::string message;
  return message;
}

namespace {

using mxmoe::detail::c_api_guarded;

// A copy is asked for when any of its four pointers is given (a fast-only copy has null data and
// scales); the C++ checks then name whatever is missing.
bool asked(void* d, void* s, void* fd, void* fs) { return d || s || fd || fs; }

mxmoe::MxOut out(void* d, void* s, void* fd, void* fs) {
  mxmoe::MxOut o;
  o.data = static_cast<uint8_t*>(d);
  o.scales = static_cast<uint8_t*>(s);
  o.fast_data = static_cast<uint8_t*>(fd);
  o.fast_scales = static_cast<uint8_t*>(fs);
  return o;
}

}  // namespace

extern "C" const char* mxmoe_last_error(void) { return mxmoe::detail::c_api_last_error().c_str(); }

extern "C" int mxmoe_quantize_mxfp8(const void* x, int64_t batch, int64_t rows, int64_t cols,
                                    void* rd, void* rs, void* rfd, void* rfs, void* cd, void* cs,
                                    void* cfd, void* cfs, int mode, void* stream) {
  return c_api_guarded([&] {
    const mxmoe::MxOut r = out(rd, rs, rfd, rfs), c = out(cd, cs, cfd, cfs);
    mxmoe::quantize_mxfp8(static_cast<const __nv_bfloat16*>(x), batch, rows, cols, asked(rd, rs, rfd, rfs) ? &r : nullptr,
                          asked(cd, cs, cfd, cfs) ? &c : nullptr, static_cast<mxmoe::ScaleMode>(mode),
                          static_cast<cudaStream_t>(stream));
  });
}

extern "C" int mxmoe_quantize_mxfp8_grouped(const void* x, int64_t x_rows, int64_t cols,
                                            const int32_t* offsets, const int32_t* padded_offsets,
                                            int num_groups, int64_t out_rows, void* rd, void* rs,
                                            void* rfd, void* rfs, void* cd, void* cs, void* cfd,
                                            void* cfs, int mode, void* stream) {
  return c_api_guarded([&] {
    const mxmoe::MxOut r = out(rd, rs, rfd, rfs), c = out(cd, cs, cfd, cfs);
    mxmoe::quantize_mxfp8_grouped(static_cast<const __nv_bfloat16*>(x), x_rows, cols, offsets,
                                  padded_offsets, num_groups, out_rows, asked(rd, rs, rfd, rfs) ? &r : nullptr,
                                  asked(cd, cs, cfd, cfs) ? &c : nullptr, static_cast<mxmoe::ScaleMode>(mode),
                                  static_cast<cudaStream_t>(stream));
  });
}

extern "C" int mxmoe_quantize_mxfp8_gather(const void* x, int64_t x_rows, int64_t cols, const int32_t* row_index,
                                           int64_t out_rows, const int32_t* rows_used, void* rd, void* rs,
                                           void* rfd, void* rfs, void* cd, void* cs, void* cfd, void* cfs,
                                           int mode, void* stream) {
  return c_api_guarded([&] {
    const mxmoe::MxOut r = out(rd, rs, rfd, rfs), c = out(cd, cs, cfd, cfs);
    mxmoe::quantize_mxfp8_gather(static_cast<const __nv_bfloat16*>(x), x_rows, cols, row_index, out_rows,
                                 rows_used, asked(rd, rs, rfd, rfs) ? &r : nullptr, asked(cd, cs, cfd, cfs) ? &c : nullptr,
                                 static_cast<mxmoe::ScaleMode>(mode), static_cast<cudaStream_t>(stream));
  });
}

extern "C" int mxmoe_compute_padded_offsets(const int32_t* offsets, int32_t* padded_offsets,
                                            int num_groups, int align, void* stream) {
  return c_api_guarded([&] {
    mxmoe::compute_padded_offsets(offsets, padded_offsets, num_groups, align,
                                  static_cast<cudaStream_t>(stream));
  });
}

extern "C" int mxmoe_dequantize_mxfp8_bf16(const void* data, const void* scales, int64_t rows, int64_t cols,
                                           void* image, void* stream) {
  return c_api_guarded([&] {
    mxmoe::dequantize_mxfp8_bf16(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(scales), rows,
                                 cols, static_cast<__nv_bfloat16*>(image), static_cast<cudaStream_t>(stream));
  });
}

extern "C" int mxmoe_quantize_mxfp8_block128(const void* x, int64_t batch, int64_t rows, int64_t cols, void* row_data,
                                             void* row_scales, void* col_data, void* col_scales, int mode,
                                             void* stream) {
  return c_api_guarded([&] {
    const mxmoe::MxBlockOut r{static_cast<uint8_t*>(row_data), static_cast<uint8_t*>(row_scales)};
    const mxmoe::MxBlockOut c{static_cast<uint8_t*>(col_data), static_cast<uint8_t*>(col_scales)};
    mxmoe::quantize_mxfp8_block128(static_cast<const __nv_bfloat16*>(x), batch, rows, cols,
                                   row_data ? &r : nullptr, col_data ? &c : nullptr,
                                   static_cast<mxmoe::ScaleMode>(mode), static_cast<cudaStream_t>(stream));
  });
}

extern "C" int mxmoe_rebase_mxfp8_fast_block128(const void* data, const void* scales, int64_t batch, int64_t rows,
                                                int64_t cols, void* block_data, void* block_scales, void* stream) {
  return c_api_guarded([&] {
    mxmoe::rebase_mxfp8_fast_block128(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(scales), batch,
                                      rows, cols, static_cast<uint8_t*>(block_data),
                                      static_cast<uint8_t*>(block_scales), static_cast<cudaStream_t>(stream));
  });
}

extern "C" int mxmoe_dequantize_mxfp8_bf16_token_blocked(const void* data, const void* scales, int64_t rows,
                                                         int64_t cols, void* image, void* stream) {
  return c_api_guarded([&] {
    mxmoe::dequantize_mxfp8_bf16_token_blocked(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(scales),
                                               rows, cols, static_cast<__nv_bfloat16*>(image),
                                               static_cast<cudaStream_t>(stream));
  });
}
