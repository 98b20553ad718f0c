"""Fake (meta) implementations of the mxmoe ops, so that torch.compile and FakeTensor tracing can
run them without a GPU: output shapes and dtypes only, in step with python/csrc/mxmoe_ops.cpp."""
import torch

FP8 = torch.float8_e4m3fn
U8 = torch.uint8
I32 = torch.int32


def _cdiv(a, b):
    return (a + b - 1) // b


def _mx_like(x, lead, rows, cols, fast, plain=True):
    """data, scales (unless not plain) and fast_data, fast_scales (if fast) of one MX copy of logical
    shape lead + [rows, cols]."""
    outs = []
    if plain:
        outs += [x.new_empty((*lead, rows, cols), dtype=FP8), x.new_empty((*lead, rows, cols // 32), dtype=U8)]
    if fast:
        outs += [x.new_empty((*lead, rows, cols), dtype=FP8),
                 x.new_empty((*lead, _cdiv(cols, 128), rows), dtype=U8)]
    return outs


def _quantized(x, lead, rows, cols, rowwise, colwise, fast, plain=True):
    if not (rowwise or colwise):
        raise ValueError("mxmoe: arguments 'rowwise', 'colwise': at least one must be true")
    if not (plain or fast):
        raise ValueError("mxmoe: argument 'plain' = False needs fast = True")
    outs = []
    if rowwise:
        outs += _mx_like(x, lead, rows, cols, fast, plain)
    if colwise:
        outs += _mx_like(x, lead, cols, rows, fast, plain)
    return outs


@torch.library.register_fake("mxmoe::quantize_mxfp8")
def _quantize_mxfp8(x, rowwise=True, colwise=False, fast=False, mode=0, plain=True):
    if x.dim() not in (2, 3):
        raise RuntimeError(f"mxmoe.quantize_mxfp8: argument 'x' must be 2-D or 3-D, got shape {tuple(x.shape)}")
    lead = tuple(x.shape[:-2])
    return _quantized(x, lead, x.shape[-2], x.shape[-1], rowwise, colwise, fast, plain)


@torch.library.register_fake("mxmoe::quantize_mxfp8_grouped")
def _quantize_mxfp8_grouped(x, offsets, padded_offsets, out_rows, rowwise=True, colwise=False, fast=False,
                            mode=0, plain=True):
    return _quantized(x, (), out_rows, x.shape[1], rowwise, colwise, fast, plain)


@torch.library.register_fake("mxmoe::quantize_mxfp8_gather")
def _quantize_mxfp8_gather(x, row_index, rows_used=None, rowwise=True, colwise=False, fast=False, mode=0,
                           plain=True):
    return _quantized(x, (), row_index.shape[0], x.shape[1], rowwise, colwise, fast, plain)


@torch.library.register_fake("mxmoe::compute_padded_offsets")
def _compute_padded_offsets(offsets, align=128):
    return torch.empty_like(offsets)


def _plan_capacity(tokens, top_k, num_experts):
    return (tokens * top_k + num_experts * 127 + 127) // 128 * 128


@torch.library.register_fake("mxmoe::moe_plan")
def _moe_plan(ids, num_experts, capacity=0):
    tokens, top_k = ids.shape
    cap = capacity if capacity else _plan_capacity(tokens, top_k, num_experts)
    return (ids.new_empty((num_experts,), dtype=I32), ids.new_empty((num_experts + 1,), dtype=I32),
            ids.new_empty((num_experts + 1,), dtype=I32), ids.new_empty((tokens, top_k), dtype=I32),
            ids.new_empty((cap,), dtype=I32))


@torch.library.register_fake("mxmoe::dequantize_mxfp8_bf16")
def _dequantize_mxfp8_bf16(data, scales):
    return data.new_empty(data.shape, dtype=torch.bfloat16)


@torch.library.register_fake("mxmoe::rebase_mxfp8_fast_block128")
def _rebase_mxfp8_fast_block128(data, scales):
    batch = data.shape[0] if data.dim() == 3 else 1
    pitch = (_cdiv(data.shape[-2], 128) + 15) // 16 * 16
    return data.new_empty(data.shape), data.new_empty((batch, _cdiv(data.shape[-1], 128), pitch), dtype=torch.uint8)


@torch.library.register_fake("mxmoe::m_grouped_mxfp8_gemm_nt")
def _m_grouped(a, a_scales, b, b_scales, offsets, fast=True, out_dtype=None, num_sms=0, a_image=None,
               b_image=None, b_block=False):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype or torch.bfloat16)


@torch.library.register_fake("mxmoe::m_grouped_mxfp8_gemm_nt_out")
def _m_grouped_out(a, a_scales, b, b_scales, offsets, out, fast=True, accumulate=False, num_sms=0, a_image=None,
                   b_image=None, b_block=False):
    return None


@torch.library.register_fake("mxmoe::k_grouped_mxfp8_gemm_nt")
def _k_grouped(a, a_scales, b, b_scales, offsets, fast=True, out_dtype=None, num_sms=0, a_image=None,
               b_image=None, b_block=False):
    return a.new_empty((offsets.shape[0] - 1, a.shape[0], b.shape[0]), dtype=out_dtype or torch.bfloat16)


@torch.library.register_fake("mxmoe::k_grouped_mxfp8_gemm_nt_out")
def _k_grouped_out(a, a_scales, b, b_scales, offsets, out, fast=True, accumulate=False, num_sms=0, a_image=None,
                   b_image=None, b_block=False):
    return None


@torch.library.register_fake("mxmoe::decode_router")
def _decode_router(x, router_w, top_k, sigmoid=False, renormalize=True, n_groups=1, topk_groups=1,
                   scaling_factor=1.0, bias=None):
    return (x.new_empty((x.shape[0], top_k), dtype=I32), x.new_empty((x.shape[0], top_k), dtype=torch.float32))


@torch.library.register_fake("mxmoe::decode_gate_up")
def _decode_gate_up(x, w1, w1_scales, topk_ids, shared_w1=None, shared_w1_scales=None, h_dtype=None):
    slots = topk_ids.shape[1] + (1 if shared_w1 is not None else 0)
    return x.new_empty((x.shape[0], slots, w1.shape[1] // 2), dtype=h_dtype or torch.float32)


@torch.library.register_fake("mxmoe::decode_down")
def _decode_down(h, w2, w2_scales, topk_ids, topk_weights, shared_w2=None, shared_w2_scales=None):
    return h.new_empty((h.shape[0], w2.shape[1]), dtype=torch.bfloat16)


@torch.library.register_fake("mxmoe::decode_step_fused")
def _decode_step_fused(x, router_w, top_k, sigmoid, renormalize, n_groups, topk_groups, scaling_factor, bias,
                       w1, w1_scales, w2, w2_scales, shared_w1, shared_w1_scales, shared_w2, shared_w2_scales,
                       workspace):
    b = x.shape[0]
    return (x.new_empty((b, top_k), dtype=I32), x.new_empty((b, top_k), dtype=torch.float32),
            x.new_empty((b, x.shape[1]), dtype=torch.bfloat16))


# ---- MoE training layer (python/csrc/moe_layer_ops.cpp) ------------------------------------------

@torch.library.register_fake("mxmoe::moe_layer_forward")
def _moe_layer_forward(layer, x, router, w1, w2):
    return x.new_empty(x.shape)


@torch.library.register_fake("mxmoe::moe_layer_backward")
def _moe_layer_backward(layer, dout, x, router, w1, w2):
    f32 = torch.float32
    return (x.new_empty(x.shape), router.new_empty(router.shape, dtype=f32), w1.new_empty(w1.shape, dtype=f32),
            w2.new_empty(w2.shape, dtype=f32))
