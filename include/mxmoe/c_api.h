/* C ABI of mxmoe (libmxmoe_c.so), for foreign-function callers such as the Python benchmarks
 * (ctypes). Every function returns 0 on success and non-zero on error; mxmoe_last_error() then
 * returns the message (thread-local, valid until the next call on that thread). Pointers are
 * device pointers; `stream` is a cudaStream_t (NULL: the legacy default stream). An MX copy
 * (row-wise or column-wise) is requested when any of its four pointers (data, scales, fast data,
 * fast scales) is non-null: data + scales for the plain copy, the fast pair for its fast form,
 * the fast pair alone for a fast-only copy. */
#ifndef MXMOE_C_API_H_
#define MXMOE_C_API_H_
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

const char* mxmoe_last_error(void);

int mxmoe_quantize_mxfp8(const void* x, int64_t batch, int64_t rows, int64_t cols,
                         void* row_data, void* row_scales, void* row_fast_data, void* row_fast_scales,
                         void* col_data, void* col_scales, void* col_fast_data, void* col_fast_scales,
                         int mode, void* stream);

int mxmoe_quantize_mxfp8_grouped(const void* x, int64_t x_rows, int64_t cols, const int32_t* offsets,
                                 const int32_t* padded_offsets, int num_groups, int64_t out_rows,
                                 void* row_data, void* row_scales, void* row_fast_data,
                                 void* row_fast_scales, void* col_data, void* col_scales,
                                 void* col_fast_data, void* col_fast_scales, int mode, void* stream);

int mxmoe_quantize_mxfp8_gather(const void* x, int64_t x_rows, int64_t cols, const int32_t* row_index,
                                int64_t out_rows, const int32_t* rows_used, void* row_data, void* row_scales,
                                void* row_fast_data, void* row_fast_scales, void* col_data, void* col_scales,
                                void* col_fast_data, void* col_fast_scales, int mode, void* stream);

int mxmoe_compute_padded_offsets(const int32_t* offsets, int32_t* padded_offsets, int num_groups,
                                 int align, void* stream);

/* BF16 image [rows, cols] of an MX tensor (data E4M3 [rows, cols], scales E8M0 [rows, cols/32]):
 * the operand exact-mode GEMMs read (mxmoe/dequantize.h). */
int mxmoe_dequantize_mxfp8_bf16(const void* data, const void* scales, int64_t rows, int64_t cols,
                                void* image, void* stream);

/* The same image token-blocked, [cols/128][rows][128] (cols % 128 == 0): the layout the k-grouped
 * GEMM reads fastest (mxmoe/dequantize.h, ImageLayout::kTokenBlocked). */
int mxmoe_dequantize_mxfp8_bf16_token_blocked(const void* data, const void* scales, int64_t rows, int64_t cols,
                                              void* image, void* stream);

/* BF16 x [batch, rows, cols] straight to the 128x128-block fast form (mxmoe/quantize.h,
 * quantize_mxfp8_block128): row_data/row_scales the form of x[b], col_data/col_scales that of x[b]ᵀ
 * (a null data pointer skips that direction). mode: 0 rceil, 1 floor. */
int mxmoe_quantize_mxfp8_block128(const void* x, int64_t batch, int64_t rows, int64_t cols, void* row_data,
                                  void* row_scales, void* col_data, void* col_scales, int mode, void* stream);

/* The 128x128-block fast form of plain MX copies [batch, rows, cols] (mxmoe/quantize.h,
 * rebase_mxfp8_fast_block128): block_data E4M3 [batch, rows, cols], block_scales E8M0
 * [batch, ceil(cols/128), mxmoe_fast_block_scales_pitch(rows)]. */
int mxmoe_rebase_mxfp8_fast_block128(const void* data, const void* scales, int64_t batch, int64_t rows,
                                     int64_t cols, void* block_data, void* block_scales, void* stream);

/* The MoE training layer (mxmoe/moe_layer.h; src/host/c_api_layer.cc), an opaque handle.
 * scoring: 0 softmax, 1 sigmoid; mode: 0 fast, 1 exact; bias: FP32 [E] device pointer or null;
 * weight_fast_layout (MoeLayerConfig::weight_fast_layout): 0 = per-row fast weights (kRow128),
 * 1 = 128x128-block fast weights (kBlock128; fast mode only); activation_fast_layout
 * (MoeLayerConfig::activation_fast_layout, the wgrad GEMMs' Xᵀ and Hactᵀ): the same two values.
 * mxmoe_layer_create = _ex with 0, 0. */
int mxmoe_layer_create_ex(int hidden, int inter, int experts, int top_k, int scoring, int n_groups,
                          int topk_groups, float scaling, const float* bias, int mode, int64_t max_tokens,
                          int weight_fast_layout, int activation_fast_layout, void** handle);
int mxmoe_layer_create(int hidden, int inter, int experts, int top_k, int scoring, int n_groups, int topk_groups,
                       float scaling, const float* bias, int mode, int64_t max_tokens, void** handle);
int mxmoe_layer_destroy(void* handle);
int64_t mxmoe_layer_workspace_bytes(void* handle);
int mxmoe_layer_forward(void* handle, const void* x, int64_t tokens, const void* wr, const void* w1, const void* w2,
                        void* out, void* stream);
int mxmoe_layer_backward(void* handle, const void* dout, const void* x, const void* wr, void* dx, void* dwr,
                         void* dw1, void* dw2, void* stream);
int mxmoe_layer_set_profiling(void* handle, int on);
/* Stage times of the last profiled step: up to max_stages; names '\n'-separated into names. */
int mxmoe_layer_stage_times(void* handle, char* names, int names_len, float* ms, int max_stages, int* count);

#ifdef __cplusplus
}
#endif
#endif /* MXMOE_C_API_H_ */
