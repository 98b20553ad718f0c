// Example: quantize a BF16 activation matrix to MXFP8 both ways in one pass (plus the fast
// GEMM-ready form), then check a few blocks against the CPU reference.
//   build: cmake --build build --target mxmoe_example_quantize
//   run:   ./build/mxmoe_example_quantize [rows] [cols]        (needs a CUDA GPU)
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "mxmoe/quantize.h"
#include "ref/mx_ref.h"

#define CHECK_CUDA(call)                                                                  \
  do {                                                                                    \
    cudaError_t e_ = (call);                                                              \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));             \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

int main(int argc, char** argv) {
  const int64_t T = argc > 1 ? std::atoll(argv[1]) : 4096;  // tokens (multiple of 32 for colwise)
  const int64_t H = argc > 2 ? std::atoll(argv[2]) : 2880;  // hidden size (multiple of 32)
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "this example needs a CUDA GPU\n");
    return 1;
  }
  // Random BF16 input on the host.
  std::mt19937 rng(42);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<uint16_t> x(size_t(T * H));
  for (auto& v : x) v = mxmoe::ref::float_to_bf16(g(rng));

  // Device buffers: x, and the two MX copies with their fast forms (layouts: mx_format.h).
  void *dx, *rd, *rs, *rfd, *rfs, *cd, *cs, *cfd, *cfs;
  const int64_t nck_r = (H + 127) / 128, nck_c = (T + 127) / 128;
  CHECK_CUDA(cudaMalloc(&dx, x.size() * 2));
  CHECK_CUDA(cudaMalloc(&rd, T * H));
  CHECK_CUDA(cudaMalloc(&rs, T * H / 32));
  CHECK_CUDA(cudaMalloc(&rfd, T * H));
  CHECK_CUDA(cudaMalloc(&rfs, nck_r * T));
  CHECK_CUDA(cudaMalloc(&cd, T * H));
  CHECK_CUDA(cudaMalloc(&cs, T * H / 32));
  CHECK_CUDA(cudaMalloc(&cfd, T * H));
  CHECK_CUDA(cudaMalloc(&cfs, nck_c * H));
  CHECK_CUDA(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));

  mxmoe::MxOut row{static_cast<uint8_t*>(rd), static_cast<uint8_t*>(rs), static_cast<uint8_t*>(rfd),
                   static_cast<uint8_t*>(rfs)};  // [T, H], [T, H/32], [T, H], [ceil(H/128), T]
  mxmoe::MxOut col{static_cast<uint8_t*>(cd), static_cast<uint8_t*>(cs), static_cast<uint8_t*>(cfd),
                   static_cast<uint8_t*>(cfs)};  // [H, T], [H, T/32], [H, T], [ceil(T/128), H]
  try {
    mxmoe::quantize_mxfp8(static_cast<const __nv_bfloat16*>(dx), 1, T, H, &row, &col);
  } catch (const mxmoe::Error& e) {  // bad arguments are reported before any launch
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  CHECK_CUDA(cudaDeviceSynchronize());

  // Compare the row-wise copy with the CPU reference, byte for byte.
  std::vector<uint8_t> data(size_t(T * H)), scales(size_t(T * H / 32));
  CHECK_CUDA(cudaMemcpy(data.data(), rd, data.size(), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(scales.data(), rs, scales.size(), cudaMemcpyDeviceToHost));
  const mxmoe::ref::MxMatrix want = mxmoe::ref::quantize_rows(x.data(), T, H, mxmoe::ScaleMode::kRceil);
  int64_t bad = 0;
  for (size_t i = 0; i < data.size(); ++i) bad += data[i] != want.data[i];
  for (size_t i = 0; i < scales.size(); ++i) bad += scales[i] != want.scales[i];
  std::printf("quantized %lld x %lld BF16 both ways (+ fast form) in one pass; row-wise copy vs CPU reference: %s\n",
              (long long)T, (long long)H, bad == 0 ? "bit-exact" : "MISMATCH");
  std::printf("x[0][0] = %g -> E4M3 0x%02x x 2^(%d)\n", mxmoe::ref::bf16_to_float(x[0]), data[0], int(scales[0]) - 127);
  for (void* p : {dx, rd, rs, rfd, rfs, cd, cs, cfd, cfs}) cudaFree(p);
  return bad == 0 ? 0 : 1;
}
