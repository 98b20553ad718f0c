// CPU reference of the MXFP8 MoE training layer, following the recipe of docs/notes/layer.md
// ("Recipe") step by step: the same routing plan (stable by token, segments padded to 128), the
// same MX quantization of every GEMM operand (row() / col(), exact or fast form), the same BF16
// storage points. GEMMs are exact (FP64) sums of the dequantized operands, so the GPU layer is
// compared with it within FP32-accumulation tolerance. With quantize = false every GEMM operand
// is used as stored (BF16), which checks the plumbing against the FP64 moe_layer_ref.
#pragma once
#include <cstdint>
#include <vector>

#include "mxmoe/mx_format.h"
#include "ref/moe_layer_ref.h"

namespace mxmoe::ref {

struct MxLayerOptions {
  bool quantize = true;  // false: operands as stored (no MX), for plumbing checks
  bool fast = true;      // GEMM mode: fast form (128-chunk rebased) or exact MX
  ScaleMode mode = ScaleMode::kRceil;
};

// Weights and activations as BF16 bits, shapes as in moe_layer_ref.h.
struct MxLayerInputs {
  std::vector<uint16_t> x, wr, w1, w2;  // [T, H], [E, H], [E, 2I, H], [E, H, I]
  std::vector<double> bias;             // [E] (sigmoid routing) or empty
};

struct MxLayerForward {
  std::vector<int32_t> ids;      // [T, k]
  std::vector<double> w;         // [T, k]
  std::vector<double> logits;    // [T, E]
  std::vector<int32_t> row_of;   // [T, k] padded row
  std::vector<int32_t> padded;   // [E+1] padded offsets
  std::vector<uint16_t> xp;      // [rows, H]   gathered X (pad rows 0)
  std::vector<uint16_t> gu;      // [rows, 2I]  GEMM1 out, BF16
  std::vector<uint16_t> hact;    // [rows, I]   SwiGLU, BF16
  std::vector<uint16_t> y;       // [rows, H]   GEMM2 out, BF16
  std::vector<uint16_t> out;     // [T, H]      BF16
  int64_t rows = 0;              // padded rows used = padded[E]
};

struct MxLayerGrads {
  std::vector<double> dw;        // [T, k]
  std::vector<uint16_t> dx;      // [T, H] BF16
  std::vector<double> dwr;       // [E, H]
  std::vector<double> dw1, dw2;  // [E, 2I, H], [E, H, I] (FP32 in the GPU layer)
};

MxLayerForward moe_forward_mx(const MoeConfig& c, const MxLayerInputs& in, const MxLayerOptions& o);
MxLayerGrads moe_backward_mx(const MoeConfig& c, const MxLayerInputs& in, const MxLayerForward& f,
                             const std::vector<uint16_t>& dout, const MxLayerOptions& o);

}  // namespace mxmoe::ref
