// Host-side TMA descriptor encoding; see tensor_map.h.
#include "kernels/gemm/tensor_map.h"

#include <cudaTypedefs.h>

namespace mxmoe::detail {

static PFN_cuTensorMapEncodeTiled_v12000 get_encode_fn(const char* fn) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (encode == nullptr) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    MXMOE_CUDA_CHECK(fn, cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                          cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || p == nullptr)
      throw CudaError(std::string("mxmoe::") + fn + ": cuTensorMapEncodeTiled not found in the driver");
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }
  return encode;
}

static void check_encoded(const char* fn, CUresult r, const std::string& what) {
  if (r != CUDA_SUCCESS)
    throw CudaError(std::string("mxmoe::") + fn + ": cuTensorMapEncodeTiled failed (CUresult " +
                    std::to_string(int(r)) + ") for a " + what);
}

CUtensorMap make_tensor_map_2d_u8(const char* fn, const void* base, uint64_t rows, uint64_t cols,
                                  uint64_t row_stride, uint32_t box_rows, uint32_t box_cols,
                                  CUtensorMapSwizzle swizzle) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {row_stride};  // bytes, dimension 1
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t elem_strides[2] = {1, 1};
  CUresult r = get_encode_fn(fn)(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base),
                                 dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  check_encoded(fn, r, "[" + std::to_string(rows) + ", " + std::to_string(cols) + "] u8 tensor, box [" +
                          std::to_string(box_rows) + ", " + std::to_string(box_cols) + "]");
  return map;
}

// 3-D map of `dtype` (elements of `elem_bytes`): dims and boxes in elements, strides in bytes.
static CUtensorMap make_tensor_map_3d(const char* fn, CUtensorMapDataType dtype, const char* type_name, void* base,
                                      uint64_t d2, uint64_t d1, uint64_t d0, uint64_t stride1, uint64_t stride2,
                                      uint32_t box1, uint32_t box0, CUtensorMapSwizzle swizzle,
                                      CUtensorMapL2promotion promotion = CU_TENSOR_MAP_L2_PROMOTION_NONE) {
  CUtensorMap map{};
  const cuuint64_t dims[3] = {d0, d1, d2};
  const cuuint64_t strides[2] = {stride1, stride2};
  const cuuint32_t box[3] = {box0, box1, 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  CUresult r = get_encode_fn(fn)(&map, dtype, 3, base, dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 swizzle, promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  check_encoded(fn, r, "[" + std::to_string(d2) + ", " + std::to_string(d1) + ", " + std::to_string(d0) + "] " +
                          type_name + " tensor, box [1, " + std::to_string(box1) + ", " + std::to_string(box0) + "]");
  return map;
}

CUtensorMap make_tensor_map_3d_u8(const char* fn, void* base, uint64_t d2, uint64_t d1, uint64_t d0,
                                  uint64_t stride1, uint64_t stride2, uint32_t box1, uint32_t box0,
                                  CUtensorMapSwizzle swizzle) {
  return make_tensor_map_3d(fn, CU_TENSOR_MAP_DATA_TYPE_UINT8, "u8", base, d2, d1, d0, stride1, stride2, box1, box0,
                            swizzle);
}

CUtensorMap make_tensor_map_3d_u8_load(const char* fn, const void* base, uint64_t d2, uint64_t d1, uint64_t d0,
                                       uint64_t stride1, uint64_t stride2, uint32_t box1, uint32_t box0,
                                       CUtensorMapSwizzle swizzle) {
  return make_tensor_map_3d(fn, CU_TENSOR_MAP_DATA_TYPE_UINT8, "u8", const_cast<void*>(base), d2, d1, d0, stride1,
                            stride2, box1, box0, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
}

CUtensorMap make_tensor_map_3d_f32(const char* fn, void* base, uint64_t d2, uint64_t d1, uint64_t d0,
                                   uint64_t stride1, uint64_t stride2, uint32_t box1, uint32_t box0,
                                   CUtensorMapSwizzle swizzle) {
  return make_tensor_map_3d(fn, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, "f32", base, d2, d1, d0, stride1, stride2, box1,
                            box0, swizzle);
}

}  // namespace mxmoe::detail
