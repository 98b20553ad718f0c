"""Plain-PyTorch MXFP8 numerics, written from include/mxmoe/mx_format.h: the oracle of the Python
tests and a fallback for machines without the kernels. Runs on any device (CPU or CUDA); slow.

Layouts (row-major; blocks of 32 run along the last dimension):
  quantize_rows(x [..., R, C])   -> data float8_e4m3fn [..., R, C], scales uint8 [..., R, C/32]
  rebase_fast(data, scales)      -> fast_data float8_e4m3fn [..., R, C],
                                    fast_scales uint8 [..., ceil(C/128), R]  (chunk-major)
  dequantize(data, scales)       -> data · 2^(scale - 127), exact (float64 by default)
  dequantize_fast(fd, fs)        -> fd · 2^(fast_scale - 127) per 128-chunk, exact

Numerics: scale exponent e per block of 32 with amax = max |x|:
  rceil: e = ceil(log2(amax / 448)); floor: e = floor(log2(amax)) - 8; amax = 0 -> e = -127;
  e clamped to [-127, 127], scale byte e + 127. Elements: E4M3 round-to-nearest-even of x · 2^-e,
  saturated to ±448, sign of zero kept. A block holding NaN or ±Inf: scale 0xFF, data 0x7F.
"""
import torch

E4M3_MAX = 448.0
E8M0_NAN = 0xFF
E4M3_NAN = 0x7F
MODES = {"rceil": 0, "floor": 1}


def _pow2_f64(e):
    """2^e as float64 for an integer tensor e in [-1022, 1023], built from the exponent bits (exact)."""
    return ((e.to(torch.int64) + 1023) << 52).view(torch.float64)


def scale_exponent(amax, mode="rceil"):
    """Block exponent (int32) from amax (float tensor, finite, >= 0), per mx_format.h."""
    a = amax.to(torch.float64)
    if mode == "rceil":
        # ceil(log2(amax / 448)). In float64, amax / 448 is a power of two exactly when amax is
        # 448 · 2^k (amax has at most 24 significant bits, so no rounding lands on a power of two).
        man, ex = torch.frexp(a / E4M3_MAX)  # a/448 = man · 2^ex, man in [0.5, 1)
        e = torch.where(man == 0.5, ex - 1, ex)
    elif mode == "floor":
        man, ex = torch.frexp(a)  # floor(log2 a) = ex - 1
        e = ex - 1 - 8
    else:
        raise ValueError(f"mode must be 'rceil' or 'floor', got {mode!r}")
    e = torch.where(a > 0, e, torch.full_like(e, -127))
    return e.clamp(-127, 127).to(torch.int32)


def quantize_rows(x, mode="rceil"):
    """MX quantization along the last dimension: x [..., R, C] (C % 32 == 0, any float dtype whose
    values are exact in float32, e.g. bfloat16) -> (data float8_e4m3fn [..., R, C],
    scales uint8 [..., R, C/32])."""
    *lead, R, C = x.shape
    if C % 32 != 0:
        raise ValueError(f"quantize_rows: argument 'x' must have a last dimension that is a multiple of 32, got {C}")
    xb = x.reshape(*lead, R, C // 32, 32).to(torch.float32)
    bad = (~torch.isfinite(xb)).any(-1)  # NaN or ±Inf in the block
    amax = torch.where(torch.isfinite(xb), xb.abs(), torch.zeros_like(xb)).amax(-1)
    e = scale_exponent(amax, mode)
    # x · 2^-e: exact in float64 (2^-e <= 2^127), then to float32 (exact wherever the result can
    # round to a nonzero E4M3 value), saturate, round to E4M3 (RNE).
    scaled = (xb.to(torch.float64) * _pow2_f64(-e).unsqueeze(-1)).to(torch.float32)
    q = scaled.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    q = torch.where(bad.unsqueeze(-1), torch.full_like(q, E4M3_NAN), q)
    sb = torch.where(bad, torch.full_like(e, E8M0_NAN), e + 127).to(torch.uint8)
    return q.reshape(*lead, R, C).view(torch.float8_e4m3fn), sb


def quantize_cols(x, mode="rceil"):
    """Column-wise MX of x [..., R, C] (R % 32 == 0): the MX tensor of xᵀ, data [..., C, R],
    scales [..., C, R/32]."""
    return quantize_rows(x.transpose(-1, -2).contiguous(), mode)


def rebase_fast(data, scales):
    """Fast GEMM-ready form of an MX tensor (mx_format.h): per row and 128-chunk, chunk exponent
    E = max of its blocks' exponents; q' = E4M3_rne_satfinite(decode(q) · 2^(e_b - E)); a chunk
    with a NaN block gets fast scale 0xFF and data 0x7F. Returns (fast_data [..., R, C],
    fast_scales [..., ceil(C/128), R])."""
    *lead, R, C = data.shape
    nb = C // 32
    nck = (C + 127) // 128
    sb = scales.to(torch.int32)
    pad = nck * 4 - nb
    sbp = torch.nn.functional.pad(sb, (0, pad), value=0) if pad else sb  # byte 0 never wins a max
    nan_block = sbp == E8M0_NAN
    chunk_nan = nan_block.reshape(*lead, R, nck, 4).any(-1)  # [..., R, nck]
    emax_byte = torch.where(nan_block, torch.zeros_like(sbp), sbp).reshape(*lead, R, nck, 4).amax(-1)
    d = sb - emax_byte.repeat_interleave(4, dim=-1)[..., :nb]  # e_b - E, in [-254, 0]
    d = torch.where(sb == E8M0_NAN, torch.zeros_like(d), d)
    q = data.view(torch.uint8).reshape(*lead, R, nb, 32).view(torch.float8_e4m3fn).to(torch.float64)
    shifted = q * _pow2_f64(d).unsqueeze(-1)  # exact in float64
    # The float32 step is exact wherever the value can round to a nonzero E4M3 value.
    fq = shifted.to(torch.float32).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    chunk_nan_b = chunk_nan.repeat_interleave(4, dim=-1)[..., :nb]
    fq = torch.where(chunk_nan_b.unsqueeze(-1), torch.full_like(fq, E4M3_NAN), fq)
    fs = torch.where(chunk_nan, torch.full_like(emax_byte, E8M0_NAN), emax_byte).to(torch.uint8)
    return fq.reshape(*lead, R, C).view(torch.float8_e4m3fn), fs.transpose(-1, -2).contiguous()


def _scale_values(scales):
    """2^(byte - 127) in float64 (exact); NaN for 0xFF."""
    s = scales.to(torch.int32)
    v = _pow2_f64(s - 127)
    return torch.where(s == E8M0_NAN, torch.full_like(v, float("nan")), v)


def dequantize(data, scales, dtype=torch.float64):
    """data float8_e4m3fn (or uint8 bytes) [..., R, C], scales uint8 [..., R, C/32] ->
    data · 2^(scale - 127) (exact in float64; NaN for scale 0xFF)."""
    if data.dtype == torch.uint8:
        data = data.view(torch.float8_e4m3fn)
    *lead, R, C = data.shape
    v = data.to(torch.float64).reshape(*lead, R, C // 32, 32) * _scale_values(scales).unsqueeze(-1)
    return v.reshape(*lead, R, C).to(dtype)


def dequantize_fast(fast_data, fast_scales, dtype=torch.float64, zero_byte_is_zero=False):
    """fast_data [..., R, C], fast_scales [..., ceil(C/128), R] -> values (exact in float64).
    zero_byte_is_zero: read scale byte 0x00 as 0, as the fast GEMM does (gemm.h)."""
    if fast_data.dtype == torch.uint8:
        fast_data = fast_data.view(torch.float8_e4m3fn)
    *lead, R, C = fast_data.shape
    nck = (C + 127) // 128
    s = _scale_values(fast_scales)
    if zero_byte_is_zero:
        s = torch.where(fast_scales == 0, torch.zeros_like(s), s)
    s = s.transpose(-1, -2).repeat_interleave(128, dim=-1)[..., :C]  # [..., R, C]
    assert s.shape[-1] == C and nck * 128 >= C
    return (fast_data.to(torch.float64) * s).to(dtype)


def quantize(x, rowwise=True, colwise=False, fast=False, mode="rceil"):
    """Reference of mxmoe.quantize: same outputs, in the same order, as torch.ops.mxmoe.quantize_mxfp8
    (row-wise data, scales[, fast_data, fast_scales], then column-wise likewise)."""
    outs = []
    for want, f in ((rowwise, quantize_rows), (colwise, quantize_cols)):
        if want:
            d, s = f(x, mode)
            outs += [d, s]
            if fast:
                outs += list(rebase_fast(d, s))
    return outs
