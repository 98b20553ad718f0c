"""Python helpers over the mxmoe torch ops (torch.ops.mxmoe.*). Thin: they name the layouts,
pick defaults and bundle results; every check and every launch is in the op.

Layouts (row-major everywhere; the C++ contracts are in include/mxmoe/*.h):

* An **MX tensor** of logical shape [R, C] (``MxTensor``): ``data`` float8_e4m3fn [R, C] and
  ``scales`` uint8 (E8M0: value 2^(byte-127), 0xFF = NaN) [R, C/32]; blocks of 32 run along C,
  so C % 32 == 0. Optional **fast form** (the fast GEMM's input): ``fast_data`` float8_e4m3fn
  [R, C] and ``fast_scales`` uint8 [ceil(C/128), R] (chunk-major: one scale per row and 128-chunk
  of C). Batched weights [B, R, C] carry a leading B on every field.
* **Column-wise** quantization of X [R, C] is the MX tensor of Xᵀ: [C, R] with blocks of 32 along
  R (needs R % 32 == 0), quantized from X itself, never from the row-wise copy.
* GEMMs compute Y = X · Wᵀ ("NT": both operands K-major). Exact mode (``fast=False``) multiplies
  the **BF16 images** of the MX operands (bfloat16 [.., R, C] = deq rounded to BF16, exactly deq
  for scale bytes 3..246: include/mxmoe/dequantize.h); pass them (``bf16_image``) to reuse them
  across calls, or let the GEMM op make them before it runs.
* Expert segments: ``offsets`` int32 [E+1] on the device, multiples of 128 for the GEMMs (each
  expert's rows padded to 128 with zero rows); never read by the host.

Nothing here synchronises with the host; all of it can be captured in a CUDA graph and traced by
torch.compile (fullgraph).
"""
from typing import NamedTuple, Optional

import torch

from . import reference

_MODES = {"rceil": 0, "floor": 1}


class MxTensor(NamedTuple):
    """One MX-quantized copy: data float8_e4m3fn [..., R, C], scales uint8 [..., R, C/32]; with the
    fast form also fast_data float8_e4m3fn [..., R, C] and fast_scales uint8 [..., ceil(C/128), R].
    A fast-only copy (quantize(..., fast=True, plain=False)) has data = scales = None."""
    data: Optional[torch.Tensor]
    scales: Optional[torch.Tensor]
    fast_data: Optional[torch.Tensor] = None
    fast_scales: Optional[torch.Tensor] = None


class MxBlockTensor(NamedTuple):
    """Quantized weights with the 128x128-block fast form (block_weights): data float8_e4m3fn
    [..., R, C] and scales uint8 [..., R, C/32] (the plain MX copy), fast_data float8_e4m3fn [..., R, C]
    and fast_scales uint8 [B, ceil(C/128), pitch] (one scale per 128 rows x 128 columns of each
    matrix; pitch = ceil(R/128) rounded up to 16). grouped_gemm's b only, fast mode."""
    data: torch.Tensor
    scales: torch.Tensor
    fast_data: torch.Tensor
    fast_scales: torch.Tensor


class Quantized(NamedTuple):
    """Result of quantize(): the row-wise copy (MX of x) and/or the column-wise copy (MX of xᵀ)."""
    rowwise: Optional[MxTensor]
    colwise: Optional[MxTensor]


class MoePlan(NamedTuple):
    """Routing plan (include/mxmoe/moe_plan.h), all int32 on the device:
    counts [E], offsets [E+1] (unpadded prefix), padded_offsets [E+1] (prefix of counts rounded up
    to 128), row_of [T, k] (padded row of (token, slot); -1 for an invalid expert id),
    row_index [capacity] (token of each padded row; -1 for pad rows and rows past padded_offsets[E])."""
    counts: torch.Tensor
    offsets: torch.Tensor
    padded_offsets: torch.Tensor
    row_of: torch.Tensor
    row_index: torch.Tensor


def _mode(mode):
    if isinstance(mode, str):
        if mode not in _MODES:
            raise ValueError(f"mxmoe: argument 'mode' must be 'rceil' or 'floor', got {mode!r}")
        return _MODES[mode]
    return int(mode)


def _bundle(outs, rowwise, colwise, fast, plain=True):
    n = (2 if plain else 0) + (2 if fast else 0)
    row = col = None
    i = 0

    def copy(t):
        return MxTensor(*t) if plain else MxTensor(None, None, *t)
    if rowwise:
        row = copy(outs[i:i + n])
        i += n
    if colwise:
        col = copy(outs[i:i + n])
    return Quantized(row, col)


def quantize(x, rowwise=True, colwise=False, fast=False, mode="rceil", plain=True):
    """MXFP8-quantize a BF16 tensor in one pass (one read of x for both copies).

    x: bfloat16 [R, C] or [B, R, C] (batched weights [E, N, K]), contiguous, 16-byte aligned, CUDA.
    rowwise: the MX tensor of x, [.., R, C] / scales [.., R, C/32]; needs C % 32 == 0.
    colwise: the MX tensor of xᵀ, [.., C, R] / scales [.., C, R/32]; needs R % 32 == 0.
    fast: also the fast GEMM-ready form of each copy (fast_scales [.., ceil(cols/128), rows]).
    mode: 'rceil' (default; scale 2^ceil(log2(amax/448))) or 'floor' (OCP MX v1.0).
    plain: False (with fast=True) writes the fast form alone (MxTensor with data = scales = None):
      what fast-mode GEMMs read, by the quantizer's faster kernels and half the output bytes.
    Returns Quantized(rowwise=MxTensor | None, colwise=MxTensor | None). Bit-exact against
    mxmoe.reference.
    """
    outs = torch.ops.mxmoe.quantize_mxfp8(x, rowwise, colwise, fast, _mode(mode), plain)
    return _bundle(outs, rowwise, colwise, fast, plain)


def compute_padded_offsets(offsets, align=128):
    """padded[g] = Σ_{j<g} roundup(offsets[j+1] - offsets[j], align): int32 [G+1] -> int32 [G+1]."""
    return torch.ops.mxmoe.compute_padded_offsets(offsets, align)


def quantize_grouped(x, offsets, out_rows, padded_offsets=None, rowwise=True, colwise=False, fast=False,
                     mode="rceil", plain=True):
    """Quantize rows grouped by expert into the padded expert layout of the grouped GEMMs.

    x: bfloat16 [x_rows, C]; group g owns rows [offsets[g], offsets[g+1]) (int32 [G+1], device).
    padded_offsets: int32 [G+1] (compute_padded_offsets(offsets) when None): row j of group g lands
      at padded_offsets[g] + j; each group's pad rows up to the next multiple of 128 are zeros.
    out_rows: capacity of the output row space, a multiple of 128 (e.g. x_rows + 128·G).
    Outputs as quantize() with R = out_rows (colwise: [C, out_rows], blocks of 32 along tokens
    within each group: the wgrad operand). Rows (columns for colwise) at or beyond
    padded_offsets[G] are not written: their content is undefined.
    """
    if padded_offsets is None:
        padded_offsets = compute_padded_offsets(offsets)
    outs = torch.ops.mxmoe.quantize_mxfp8_grouped(x, offsets, padded_offsets, out_rows, rowwise, colwise,
                                                 fast, _mode(mode), plain)
    return _bundle(outs, rowwise, colwise, fast, plain)


def quantize_gather(x, row_index, rows_used=None, rowwise=True, colwise=False, fast=False, mode="rceil",
                    plain=True):
    """Gather rows, then quantize (the MoE layer's fused permute + quantize).

    x: bfloat16 [x_rows, C]; row_index: int32 [out_rows] (out_rows % 128 == 0): output row r is
    x[row_index[r]], or a zero row where row_index[r] < 0 (or >= x_rows).
    rows_used: optional int32 scalar tensor on the device (e.g. plan.padded_offsets[-1:]); rows at
    or beyond it are not written (content undefined). Outputs as quantize() with R = out_rows.
    """
    outs = torch.ops.mxmoe.quantize_mxfp8_gather(x, row_index, rows_used, rowwise, colwise, fast, _mode(mode),
                                                plain)
    return _bundle(outs, rowwise, colwise, fast, plain)


def moe_plan(ids, num_experts, capacity=None):
    """Routing plan from the expert of every (token, slot): ids int32 [T, k] on the device.
    capacity: padded rows (default: the worst case roundup(T·k + E·127, 128)). Returns MoePlan.
    Rows within an expert follow (token, slot) order (a stable counting sort)."""
    return MoePlan(*torch.ops.mxmoe.moe_plan(ids, num_experts, 0 if capacity is None else capacity))


def _gemm_operand(t, fast, name):
    if fast:
        if t.fast_data is None or t.fast_scales is None:
            raise ValueError(f"mxmoe: argument '{name}' has no fast form; quantize with fast=True "
                             "or pass fast=False (exact mode)")
        return t.fast_data, t.fast_scales
    if t.data is None or t.scales is None:
        raise ValueError(f"mxmoe: argument '{name}' has no plain MX copy (quantized with plain=False); "
                         "exact mode needs it: quantize with plain=True")
    return t.data, t.scales


def block_weights(w):
    """The 128x128-block fast form of quantized weights (include/mxmoe/quantize.h:
    rebase_mxfp8_fast_block128; gemm.h FastScaleLayout::kBlock128), for grouped_gemm's b in fast mode.

    w: MxTensor with its plain MX copy (data [E, N, K] or [N, K], scales [..., K/32]), e.g.
    quantize(w).rowwise, or the column-wise copy for dgrad; also a column-wise activation copy
    [K, M_total] for grouped_gemm_wgrad's x_t (fast_scales then [1, M_total/128, pitch(K)]). Returns an MxBlockTensor with the same
    plain copy, fast_data float8_e4m3fn of data's shape and fast_scales uint8 [E, ceil(K/128), pitch]
    (one E8M0 byte per 128 rows x 128 columns of each matrix; pitch = ceil(N/128) rounded up to 16).
    Every element is re-expressed against its block's largest 32-block
    exponent (E4M3, round to nearest even; a NaN block poisons its whole 128x128 block). Measured
    (docs/notes/gemm.md, run 82): the fast GEMM 1.19-1.28x faster with it, the same error against
    the unquantized product to 4 digits. It departs from DESIGN §2's per-row fast form: opt-in."""
    if w.data is None or w.scales is None:
        raise ValueError("mxmoe.block_weights: argument 'w' has no plain MX copy (quantized with plain=False)")
    bd, bs = torch.ops.mxmoe.rebase_mxfp8_fast_block128(w.data, w.scales)
    return MxBlockTensor(w.data, w.scales, bd, bs)


def bf16_image(t):
    """The BF16 image of an MxTensor (exact mode's GEMM operand), made by mxmoe's kernel:
    bfloat16 of t.data's shape = deq(data, scales) rounded to bfloat16 (round to nearest even,
    gradual underflow, Inf on overflow; NaN for NaN codes or scale 0xFF). Equal to the exact MX
    values for every block whose scale byte is in [3, 246]."""
    if t.data is None or t.scales is None:
        raise ValueError("mxmoe: argument 't' has no plain MX copy (quantized with plain=False)")
    return torch.ops.mxmoe.dequantize_mxfp8_bf16(t.data, t.scales)


def grouped_gemm(a, b, offsets, fast=True, out_dtype=torch.bfloat16, out=None, accumulate=False, num_sms=0,
                 a_image=None, b_image=None):
    """m-grouped MXFP8 GEMM (forward, dgrad): Y[r] = deq(A)[r] · deq(B[e])ᵀ for offsets[e] <= r < offsets[e+1].

    a: MxTensor of A [M_total, K] (rows sorted by expert, segments padded to 128 rows with zeros);
    b: MxTensor of B [E, N, K] (per-expert weights, quantize(w) of a 3-D tensor); in fast mode it may
       carry the 128x128-block form (block_weights(b), an MxBlockTensor);
    offsets: int32 [E+1], device, multiples of 128, offsets[0] = 0, offsets[E] <= M_total.
    fast: True = fast mode (needs the fast forms; FP8 tensor cores, promotion every 128 of K),
          False = exact mode (BF16 tensor cores on the operands' BF16 images, one FP32 accumulator
          over all of K).
    a_image, b_image: exact mode's images (bf16_image(a), bf16_image(b)); each one not given is
          made by the op first (one bandwidth-bound pass). Fast mode ignores them.
    out_dtype: torch.bfloat16 or torch.float32. out: optional [M_total, N] output to write into
    (its dtype decides); accumulate: out += result (needs out).
    Returns Y [M_total, N]; pad rows are zeros, rows at or beyond offsets[E] are not written
    (undefined content in a new tensor).
    """
    ad, as_ = _gemm_operand(a, fast, "a")
    bd, bs = _gemm_operand(b, fast, "b")
    if isinstance(a, MxBlockTensor):
        raise ValueError("mxmoe.grouped_gemm: argument 'a' must be an MxTensor (the per-row fast form); "
                         "only b may be in the 128x128-block form (MxBlockTensor)")
    b_block = fast and isinstance(b, MxBlockTensor)
    if out is None:
        if accumulate:
            raise ValueError("mxmoe.grouped_gemm: argument 'accumulate' needs 'out'")
        return torch.ops.mxmoe.m_grouped_mxfp8_gemm_nt(ad, as_, bd, bs, offsets, fast, out_dtype, num_sms,
                                                      a_image, b_image, b_block)
    torch.ops.mxmoe.m_grouped_mxfp8_gemm_nt_out(ad, as_, bd, bs, offsets, out, fast, accumulate, num_sms,
                                                a_image, b_image, b_block)
    return out


def grouped_gemm_wgrad(dy_t, x_t, offsets, fast=True, out_dtype=torch.bfloat16, out=None, accumulate=False,
                       num_sms=0, dy_t_image=None, x_t_image=None):
    """k-grouped MXFP8 GEMM (wgrad): dW[e] = Σ_{t in segment e} dY[t]ᵀ · X[t] -> [E, N, K].

    dy_t: column-wise MxTensor of dY [M_total, N] (data [N, M_total], blocks of 32 along tokens);
    x_t: column-wise MxTensor of X [M_total, K] (data [K, M_total]); e.g. quantize(...).colwise or
    quantize_grouped(..., colwise=True).colwise; in fast mode also its 128x128-block form,
    block_weights(x_t) (blocks of 128 rows of K x 128 tokens; gemm.h, run 83: 1.26-1.49x faster).
    offsets: int32 [E+1], device, token segment bounds, multiples of 128 (pad tokens zero).
    dy_t_image, x_t_image: exact mode's images of the two (bf16_image, row-major), made by the op when
    not given — then token-blocked (dequantize.h: a 128-token window of every row contiguous; same
    values and bits, faster when M_total is large: docs/notes/gemm.md, run 66).
    Every expert is written (an empty expert gets zeros, or keeps out with accumulate).
    """
    ad, as_ = _gemm_operand(dy_t, fast, "dy_t")
    bd, bs = _gemm_operand(x_t, fast, "x_t")
    if isinstance(dy_t, MxBlockTensor):
        raise ValueError("mxmoe.grouped_gemm_wgrad: argument 'dy_t' must be an MxTensor (the per-row fast form); "
                         "only x_t may be in the 128x128-block form (MxBlockTensor)")
    b_block = fast and isinstance(x_t, MxBlockTensor)
    if out is None:
        if accumulate:
            raise ValueError("mxmoe.grouped_gemm_wgrad: argument 'accumulate' needs 'out'")
        return torch.ops.mxmoe.k_grouped_mxfp8_gemm_nt(ad, as_, bd, bs, offsets, fast, out_dtype, num_sms,
                                                      dy_t_image, x_t_image, b_block)
    torch.ops.mxmoe.k_grouped_mxfp8_gemm_nt_out(ad, as_, bd, bs, offsets, out, fast, accumulate, num_sms,
                                                dy_t_image, x_t_image, b_block)
    return out


def dequantize(data, scales, dtype=torch.float32):
    """Exact dequantization of an MX tensor (pure PyTorch): data float8_e4m3fn [..., R, C],
    scales uint8 [..., R, C/32] -> data · 2^(scale-127) as `dtype` (NaN where the scale is 0xFF).
    float64 is exact for every input; float32 is exact unless a value exceeds float32's range and
    bfloat16 is exact (E4M3 has 4 significant bits) unless a value leaves bfloat16's range."""
    return reference.dequantize(data, scales, dtype)


def dequantize_fast(fast_data, fast_scales, dtype=torch.float32):
    """Exact dequantization of the fast form: fast_data [..., R, C], fast_scales [..., ceil(C/128), R]."""
    return reference.dequantize_fast(fast_data, fast_scales, dtype)


# ---- warp decode (include/mxmoe/decode.h) -------------------------------------------------------

def decode_router(x, router_w, top_k, scoring="softmax", renormalize=True, n_groups=1, topk_groups=1,
                  scaling_factor=1.0, bias=None):
    """Router of the decode step: logits = x · router_wᵀ (FP32), top-k, routing weights.

    x: bfloat16 [B, H]; router_w: bfloat16 [E, H]; scoring: 'softmax' (Qwen3) or 'sigmoid'
    (DeepSeek-V3; bias float32 [E] for selection only, group-limited top-k with n_groups /
    topk_groups). Returns (topk_ids int32 [B, k] in decreasing score order, ties to the lower id;
    topk_weights float32 [B, k])."""
    if scoring not in ("softmax", "sigmoid"):
        raise ValueError(f"mxmoe.decode_router: argument 'scoring' must be 'softmax' or 'sigmoid', got {scoring!r}")
    return torch.ops.mxmoe.decode_router(x, router_w, top_k, scoring == "sigmoid", renormalize, n_groups,
                                         topk_groups, float(scaling_factor), bias)


def decode_gate_up(x, w1, topk_ids, w1_scales=None, shared_w1=None, shared_w1_scales=None,
                   h_dtype=torch.float32):
    """h[b, j, i] = silu(x[b] · w1[e_j][i]) · (x[b] · w1[e_j][I + i]).

    x: bfloat16 [B, H]; w1: [E, 2I, H] (rows [0, I) gate, [I, 2I) up), bfloat16, or float8_e4m3fn
    with w1_scales uint8 [E, 2I, H/32] (MXFP8, e.g. quantize(w1).rowwise); topk_ids int32 [B, k];
    optional shared expert shared_w1 [2I, H] (+ scales) as slot k. Returns h [B, S, I]
    (S = k, +1 with a shared expert) in h_dtype (float32 or bfloat16)."""
    return torch.ops.mxmoe.decode_gate_up(x, w1, w1_scales, topk_ids, shared_w1, shared_w1_scales, h_dtype)


def decode_down(h, w2, topk_ids, topk_weights, w2_scales=None, shared_w2=None, shared_w2_scales=None):
    """out[b] = Σ_j topk_weights[b, j] · (h[b, j] · w2[e_j]ᵀ) (+ shared slot, weight 1), FP32 sum
    in slot order, rounded to bfloat16 once.

    h: float32 or bfloat16 [B, S, I] from decode_gate_up; w2: [E, H, I] bfloat16 or float8_e4m3fn
    with w2_scales [E, H, I/32]; topk_ids int32 [B, k]; topk_weights float32 [B, k].
    Returns out bfloat16 [B, H]."""
    return torch.ops.mxmoe.decode_down(h, w2, w2_scales, topk_ids, topk_weights, shared_w2, shared_w2_scales)


def decode_fused_workspace(x, w1, top_k, shared_expert=False):
    """Workspace of decode_step_fused for batches up to x.shape[0] of the layer whose w1 is
    [E, 2I, H]: an initialised uint8 tensor on x's device. Keep one per stream and reuse it for
    every step (and CUDA graph replay); never share it between steps running at the same time."""
    return torch.ops.mxmoe.decode_fused_workspace(x, w1, top_k, shared_expert)


def decode_step_fused(x, router_w, w1, w2, top_k, workspace, scoring="softmax", renormalize=True, n_groups=1,
                      topk_groups=1, scaling_factor=1.0, bias=None, w1_scales=None, w2_scales=None,
                      shared_w1=None, shared_w1_scales=None, shared_w2=None, shared_w2_scales=None):
    """One decode step (router, gate/up with float32 h, down) in ONE persistent kernel, for
    1 <= B <= 8 (include/mxmoe/decode.h: decode_step_fused). Arguments as decode_router,
    decode_gate_up and decode_down; w1 and w2 of the same dtype (bfloat16, or float8_e4m3fn with
    scales), a shared expert in both or neither. Returns (topk_ids, topk_weights, out), bit for bit
    those of decode_router -> decode_gate_up -> decode_down. The kernel needs every SM of the device
    at once (one fused step per device at a time; decode.h explains)."""
    if scoring not in ("softmax", "sigmoid"):
        raise ValueError(f"mxmoe.decode_step_fused: argument 'scoring' must be 'softmax' or 'sigmoid', got {scoring!r}")
    return torch.ops.mxmoe.decode_step_fused(x, router_w, top_k, scoring == "sigmoid", renormalize, n_groups,
                                             topk_groups, float(scaling_factor), bias, w1, w1_scales, w2,
                                             w2_scales, shared_w1, shared_w1_scales, shared_w2, shared_w2_scales,
                                             workspace)
