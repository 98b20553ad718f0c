// Down-projection design-space variants (warp_decode_down_sweep_sm90.cuh), MXFP8 weights × FP32 h: every
// (rows, unroll) with rows·unroll <= 16 × register cap 128 | 80 | 64 × scales per chunk | per row.
// One TU per (weights, h) so that the four compile in parallel. Selected by src/host/decode.cpp from
// MXMOE_DECODE_DOWN_* (A/B timing; the default is warp_decode_down_sm90.cu).
// Tests: DecodeGpu.DownSwitchesGiveDefaultBits.
#include "kernels/decode/warp_decode_down_sweep_sm90.cuh"

namespace mxmoe::detail {

template void launch_decode_down_sweep<true, false>(const DownLaunch& p, cudaStream_t stream);

}  // namespace mxmoe::detail
