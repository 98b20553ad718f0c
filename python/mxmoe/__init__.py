"""mxmoe: MXFP8 Mixture-of-Experts kernels for NVIDIA Hopper (sm_90a) as PyTorch ops.

Importing the package registers the custom ops torch.ops.mxmoe.* (CUDA implementations from the
compiled extension mxmoe._C, fake implementations for torch.compile from mxmoe._fake). The
helpers below (mxmoe.ops) name the layouts; mxmoe.reference holds the plain-PyTorch numerics.
mxmoe.torch holds the autograd-aware MXFP8 MoE layer (mxmoe.torch.MoE) and its plain-PyTorch BF16
reference (mxmoe.torch.ReferenceMoE).
"""
import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C  # noqa: F401  (registers torch.ops.mxmoe.*)
from . import _fake  # noqa: F401  (shape functions for torch.compile)
from . import reference
from .ops import (MoePlan, MxBlockTensor, MxTensor, Quantized, bf16_image, block_weights, compute_padded_offsets, decode_down,
                  decode_fused_workspace, decode_gate_up, decode_router, decode_step_fused, dequantize, dequantize_fast, grouped_gemm, grouped_gemm_wgrad, moe_plan,
                  quantize, quantize_gather, quantize_grouped)

__all__ = ["MoePlan", "MxBlockTensor", "MxTensor", "Quantized", "bf16_image", "block_weights", "compute_padded_offsets", "decode_down",
           "decode_fused_workspace", "decode_gate_up", "decode_router", "decode_step_fused", "dequantize", "dequantize_fast", "grouped_gemm", "grouped_gemm_wgrad",
           "moe_plan", "quantize", "quantize_gather", "quantize_grouped", "reference"]
__version__ = "0.1.0"

# The nn.Module layer, mxmoe.torch. Imported last and through importlib: `from . import torch` would
# return the torch package already bound to that name above; loading the submodule rebinds
# mxmoe.torch to it (nothing in this file uses the torch package afterwards).
import importlib as _importlib  # noqa: E402

_importlib.import_module(__name__ + ".torch")
