"""Grouped GEMM ops against an FP64 torch reference on the dequantized MX inputs, with the
element-wise bound of tests/gpu/test_gemm_gpu.cpp (see _util.py: fast mode's tensor-core block
sums and FP32 promotion; exact mode's FP32 accumulation; BF16 output rounding 2^-8). Operands come
from the quantization ops (tested bit-exact in test_quantize.py); exact mode's BF16 images are made
by the GEMM op itself or given (bf16_image, checked bit for bit against the reference here). Also:
pad rows exact zeros, rows past offsets[E] untouched, accumulate, empty experts, bitwise reruns."""
import pytest
import torch

from _util import assert_bytes_equal, assert_within, dot_with_bound, fresh_seed, mxmoe

pytestmark = pytest.mark.gpu
DEV = "cuda"


def make_counts(experts):
    """Rows per expert: an empty expert, counts that are not multiples of 128, one larger one."""
    counts = torch.randint(1, 200, (experts,))
    counts[1] = 0
    counts[-1] += 150
    return counts


def prefix(counts, align=1):
    c = (counts + align - 1) // align * align
    return torch.cat([torch.zeros(1, dtype=torch.int64), c.cumsum(0)]).to(torch.int32)


def deq(t, fast):
    """Exact float64 values of an MxTensor as the GEMM mode reads them (exact mode: the BF16 image,
    equal to these MX values since every scale byte of these data is in [3, 246])."""
    if fast:
        return mxmoe.reference.dequantize_fast(t.fast_data, t.fast_scales, torch.float64, zero_byte_is_zero=True)
    return mxmoe.reference.dequantize(t.data, t.scales, torch.float64)


class MProblem:
    def __init__(self, experts, n, k):
        self.counts = make_counts(experts)
        self.offsets = prefix(self.counts)
        self.padded = prefix(self.counts, 128)
        self.used = int(self.padded[-1])
        self.m_total = self.used + 256  # rows past offsets[E]: never written
        x = torch.randn(int(self.offsets[-1]), k, device=DEV).to(torch.bfloat16)
        w = (torch.randn(experts, n, k, device=DEV) / k ** 0.5).to(torch.bfloat16)
        self.a = mxmoe.quantize_grouped(x, self.offsets.to(DEV), self.m_total, fast=True).rowwise
        self.b = mxmoe.quantize(w, fast=True).rowwise
        self.d_padded = self.padded.to(DEV)
        self.experts, self.n, self.k = experts, n, k

    def reference(self, fast):
        """y [used, N] and bound [used, N] in float64."""
        da = deq(self.a, fast)[: self.used]
        db = deq(self.b, fast)
        y = torch.zeros(self.used, self.n, dtype=torch.float64, device=DEV)
        bound = torch.zeros_like(y)
        for e in range(self.experts):
            r0, r1 = int(self.padded[e]), int(self.padded[e + 1])
            if r1 > r0:
                y[r0:r1], bound[r0:r1] = dot_with_bound(da[r0:r1], db[e], fast)
        return y, bound


@pytest.mark.parametrize("n,k", [(256, 384), (160, 288)])
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_m_grouped(n, k, fast, out_dtype):
    seed = fresh_seed()
    P = MProblem(4, n, k)
    what = f"m_grouped n={n} k={k} fast={fast} out={out_dtype} counts={P.counts.tolist()} seed={seed}"
    want, bound = P.reference(fast)
    out_rel = 2.0 ** -8 if out_dtype == torch.bfloat16 else 0.0
    y = mxmoe.grouped_gemm(P.a, P.b, P.d_padded, fast=fast, out_dtype=out_dtype)
    assert y.shape == (P.m_total, n) and y.dtype == out_dtype
    worst = assert_within(y[: P.used], want, bound + out_rel * (want.abs() + bound), what)
    print(f"{what}: worst |err|/tol = {worst:.3g}")
    # Pad rows (zero A rows) come out as exact zeros; reference and bound are 0 there, so the check
    # above already requires it. Rows past offsets[E] are not written: poison and check via out=.
    poisoned = torch.full((P.m_total, n), float("nan"), dtype=out_dtype, device=DEV)
    mxmoe.grouped_gemm(P.a, P.b, P.d_padded, fast=fast, out=poisoned)
    assert bool(poisoned[P.used:].isnan().all()), f"{what}: rows past offsets[E] were written"
    assert_bytes_equal(poisoned[: P.used], y[: P.used], f"{what}: out= vs functional (bitwise)")
    # Rerun: bitwise identical.
    y2 = mxmoe.grouped_gemm(P.a, P.b, P.d_padded, fast=fast, out_dtype=out_dtype)
    assert_bytes_equal(y2[: P.used], y[: P.used], f"{what}: rerun")


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_m_grouped_accumulate(out_dtype):
    seed = fresh_seed()
    P = MProblem(3, 128, 256)
    want, bound = P.reference(True)
    init = torch.randn(P.m_total, P.n, device=DEV).to(out_dtype)
    out = init.clone()
    mxmoe.grouped_gemm(P.a, P.b, P.d_padded, fast=True, out=out, accumulate=True)
    total = init[: P.used].double() + want
    # one FP32 addition (2^-24) and, for BF16, one final rounding (2^-8)
    add = 2.0 ** -24 * (init[: P.used].double().abs() + want.abs() + bound)
    out_rel = 2.0 ** -8 if out_dtype == torch.bfloat16 else 0.0
    tol = bound + add + out_rel * (total.abs() + bound + add)
    assert_within(out[: P.used], total, tol, f"accumulate {out_dtype} seed={seed}")
    assert_bytes_equal(out[P.used:], init[P.used:], "accumulate: rows past offsets[E] keep their values")


class KProblem:
    """dW[e] = Σ_t dY[t]ᵀ X[t] over expert e's token segment; operands column-wise quantized by the
    grouped quantizer (blocks of 32 along tokens, pad tokens zero)."""

    def __init__(self, experts, n, k):
        self.counts = make_counts(experts)
        self.offsets = prefix(self.counts)
        self.padded = prefix(self.counts, 128)
        self.used = int(self.padded[-1])
        self.m_total = self.used + 128
        t = int(self.offsets[-1])
        dy = torch.randn(t, n, device=DEV).to(torch.bfloat16)
        x = torch.randn(t, k, device=DEV).to(torch.bfloat16)
        d_off = self.offsets.to(DEV)
        self.a = mxmoe.quantize_grouped(dy, d_off, self.m_total, rowwise=False, colwise=True, fast=True).colwise
        self.b = mxmoe.quantize_grouped(x, d_off, self.m_total, rowwise=False, colwise=True, fast=True).colwise
        self.d_padded = self.padded.to(DEV)
        self.experts, self.n, self.k = experts, n, k

    def reference(self, fast):
        da = deq(self.a, fast)  # [N, M_total]
        db = deq(self.b, fast)  # [K, M_total]
        y = torch.zeros(self.experts, self.n, self.k, dtype=torch.float64, device=DEV)
        bound = torch.zeros_like(y)
        for e in range(self.experts):
            t0, t1 = int(self.padded[e]), int(self.padded[e + 1])
            if t1 > t0:
                y[e], bound[e] = dot_with_bound(da[:, t0:t1], db[:, t0:t1], fast)
        return y, bound


@pytest.mark.parametrize("n,k", [(256, 384), (96, 160)])
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_k_grouped(n, k, fast, out_dtype):
    seed = fresh_seed()
    P = KProblem(4, n, k)
    what = f"k_grouped n={n} k={k} fast={fast} out={out_dtype} counts={P.counts.tolist()} seed={seed}"
    want, bound = P.reference(fast)
    out_rel = 2.0 ** -8 if out_dtype == torch.bfloat16 else 0.0
    dw = mxmoe.grouped_gemm_wgrad(P.a, P.b, P.d_padded, fast=fast, out_dtype=out_dtype)
    assert dw.shape == (4, n, k) and dw.dtype == out_dtype
    worst = assert_within(dw, want, bound + out_rel * (want.abs() + bound), what)
    print(f"{what}: worst |err|/tol = {worst:.3g}")
    assert bool((dw[1] == 0).all()), f"{what}: the empty expert's dW must be zeros"
    dw2 = mxmoe.grouped_gemm_wgrad(P.a, P.b, P.d_padded, fast=fast, out_dtype=out_dtype)
    assert_bytes_equal(dw2, dw, f"{what}: rerun")
    # accumulate into an existing dW
    init = torch.randn(4, n, k, device=DEV).to(out_dtype)
    out = init.clone()
    mxmoe.grouped_gemm_wgrad(P.a, P.b, P.d_padded, fast=fast, out=out, accumulate=True)
    total = init.double() + want
    add = 2.0 ** -24 * (init.double().abs() + want.abs() + bound)
    tol = bound + add + out_rel * (total.abs() + bound + add)
    assert_within(out, total, tol, f"{what}: accumulate")


def test_fast_and_exact_agree_closely():
    """Fast mode's extra error (rebasing, longer tensor-core chains) stays small against exact mode."""
    fresh_seed()
    P = MProblem(4, 256, 512)
    yf = mxmoe.grouped_gemm(P.a, P.b, P.d_padded, fast=True, out_dtype=torch.float32)[: P.used].double()
    ye = mxmoe.grouped_gemm(P.a, P.b, P.d_padded, fast=False, out_dtype=torch.float32)[: P.used].double()
    rel = (yf - ye).norm() / ye.norm()
    assert float(rel) < 1e-2, f"fast vs exact relative Frobenius difference {float(rel):.3g}"


def deq_block(t):
    """Exact float64 values of a 128x128-block fast form (block_weights): fast_data [E, N, K] times
    2^(byte - 127) of its block's byte in fast_scales [E, ceil(K/128), pitch]."""
    E, N, K = t.fast_data.shape
    s = t.fast_scales[:, :, : (N + 127) // 128].to(torch.int32) - 127  # [E, kc, nrb]
    per = s.transpose(1, 2).repeat_interleave(128, 1)[:, :N].repeat_interleave(128, 2)[:, :, :K]  # [E, N, K]
    return t.fast_data.to(torch.float64) * torch.pow(2.0, per.to(torch.float64))


@pytest.mark.parametrize("n,k", [(256, 384), (160, 288)])
def test_m_grouped_block_weights(n, k):
    """grouped_gemm with b in the 128x128-block form (block_weights): the form re-rounds each MX value
    at most to E4M3's precision at its block's exponent, and the GEMM on it is within fast mode's bound
    of the FP64 product of the values it reads; bitwise on a rerun; the wrong uses are rejected."""
    seed = fresh_seed()
    P = MProblem(4, n, k)
    what = f"m_grouped block n={n} k={k} counts={P.counts.tolist()} seed={seed}"
    bb = mxmoe.block_weights(P.b)
    assert isinstance(bb, mxmoe.MxBlockTensor) and bb.fast_data.shape == P.b.data.shape
    assert tuple(bb.fast_scales.shape) == (4, (k + 127) // 128, ((n + 127) // 128 + 15) // 16 * 16)
    mx, blk = mxmoe.reference.dequantize(P.b.data, P.b.scales, torch.float64), deq_block(bb)
    unit = torch.pow(2.0, (bb.fast_scales[:, :, : (n + 127) // 128].to(torch.float64) - 127))
    unit = unit.transpose(1, 2).repeat_interleave(128, 1)[:, :n].repeat_interleave(128, 2)[:, :, :k]
    # one E4M3 rounding at the block's exponent: half an ulp (2^-4 relative) or half the subnormal step
    assert bool(((blk - mx).abs() <= torch.maximum(mx.abs() * 2.0 ** -4, unit * 2.0 ** -10)).all()), what
    da = deq(P.a, True)[: P.used]
    want = torch.zeros(P.used, n, dtype=torch.float64, device=DEV)
    bound = torch.zeros_like(want)
    for e in range(P.experts):
        r0, r1 = int(P.padded[e]), int(P.padded[e + 1])
        if r1 > r0:
            want[r0:r1], bound[r0:r1] = dot_with_bound(da[r0:r1], blk[e], True)
    y = mxmoe.grouped_gemm(P.a, bb, P.d_padded, fast=True, out_dtype=torch.float32)
    worst = assert_within(y[: P.used], want, bound, what)
    print(f"{what}: worst |err|/tol = {worst:.3g}")
    assert_bytes_equal(mxmoe.grouped_gemm(P.a, bb, P.d_padded, fast=True, out_dtype=torch.float32)[: P.used],
                       y[: P.used], f"{what}: rerun")
    with pytest.raises(ValueError, match="b_block"):  # exact mode has no block form
        torch.ops.mxmoe.m_grouped_mxfp8_gemm_nt(P.a.data, P.a.scales, bb.fast_data, bb.fast_scales, P.d_padded,
                                                False, None, 0, None, None, True)
    with pytest.raises(RuntimeError, match="b_scales"):  # per-row scales passed as block ones (a shape error)
        torch.ops.mxmoe.m_grouped_mxfp8_gemm_nt(P.a.fast_data, P.a.fast_scales, P.b.fast_data, P.b.fast_scales,
                                                P.d_padded, True, None, 0, None, None, True)
    with pytest.raises(ValueError, match="'a'"):
        mxmoe.grouped_gemm(mxmoe.MxBlockTensor(P.a.data, P.a.scales, P.a.fast_data, P.a.fast_scales), bb,
                           P.d_padded)


@pytest.mark.parametrize("n,k", [(256, 384), (96, 160)])
def test_k_grouped_block_x(n, k):
    """grouped_gemm_wgrad with x_t in the 128x128-block form (block_weights of the column-wise copy:
    blocks of 128 rows of K x 128 tokens): within fast mode's bound of the FP64 product of the values
    it reads; bitwise on a rerun; dy_t in the block form is rejected."""
    seed = fresh_seed()
    P = KProblem(4, n, k)
    what = f"k_grouped block x n={n} k={k} counts={P.counts.tolist()} seed={seed}"
    xb = mxmoe.block_weights(P.b)
    assert tuple(xb.fast_scales.shape) == (1, P.m_total // 128, ((k + 127) // 128 + 15) // 16 * 16)
    db = deq_block(mxmoe.MxBlockTensor(xb.data[None], xb.scales[None], xb.fast_data[None], xb.fast_scales))[0]
    da = deq(P.a, True)
    want = torch.zeros(P.experts, n, k, dtype=torch.float64, device=DEV)
    bound = torch.zeros_like(want)
    for e in range(P.experts):
        t0, t1 = int(P.padded[e]), int(P.padded[e + 1])
        if t1 > t0:
            want[e], bound[e] = dot_with_bound(da[:, t0:t1], db[:, t0:t1], True)
    dw = mxmoe.grouped_gemm_wgrad(P.a, xb, P.d_padded, fast=True, out_dtype=torch.float32)
    worst = assert_within(dw, want, bound, what)
    print(f"{what}: worst |err|/tol = {worst:.3g}")
    assert_bytes_equal(mxmoe.grouped_gemm_wgrad(P.a, xb, P.d_padded, fast=True, out_dtype=torch.float32), dw,
                       f"{what}: rerun")
    with pytest.raises(ValueError, match="'dy_t'"):
        mxmoe.grouped_gemm_wgrad(mxmoe.block_weights(P.a), xb, P.d_padded)


def test_bf16_image_is_the_reference_rounding():
    """bf16_image = the MX values rounded to bfloat16 (reference.dequantize in float64, then torch's
    round to nearest even), bit for bit: quantized data, and random codes under every finite scale
    byte (subnormal images, rounding below 2^-124, Inf above 2^119); NaN codes and scale 0xFF -> NaN."""
    fresh_seed()
    t = mxmoe.quantize(torch.randn(3, 96, 256, device=DEV).to(torch.bfloat16)).rowwise
    want = mxmoe.reference.dequantize(t.data, t.scales, torch.float64).to(torch.bfloat16)
    assert_bytes_equal(mxmoe.bf16_image(t), want, "bf16_image of quantized data")
    codes = torch.randint(0, 256, (255, 256), dtype=torch.uint8, device=DEV)
    scales = torch.arange(255, dtype=torch.uint8, device=DEV)[:, None].expand(255, 8).contiguous()
    img = mxmoe.bf16_image(mxmoe.MxTensor(codes.view(torch.float8_e4m3fn), scales))
    want = mxmoe.reference.dequantize(codes.view(torch.float8_e4m3fn), scales, torch.float64).to(torch.bfloat16)
    nan = want.isnan()
    assert bool((img.isnan() == nan).all()), "bf16_image: NaN where the reference has none (or not where it has)"
    assert_bytes_equal(img[~nan], want[~nan], "bf16_image of random codes x scale bytes 0..254")
    t255 = mxmoe.MxTensor(codes[:1].view(torch.float8_e4m3fn), torch.full((1, 8), 255, dtype=torch.uint8, device=DEV))
    assert bool(mxmoe.bf16_image(t255).isnan().all()), "scale byte 0xFF must give NaN images"


def test_exact_mode_with_given_images_is_bitwise_the_same():
    """Images passed to the exact-mode GEMMs give the bits of the images the ops make themselves
    (the k-grouped op makes token-blocked ones, the given ones are row-major)."""
    fresh_seed()
    P = MProblem(4, 256, 384)
    y = mxmoe.grouped_gemm(P.a, P.b, P.d_padded, fast=False, out_dtype=torch.float32)
    y2 = mxmoe.grouped_gemm(P.a, P.b, P.d_padded, fast=False, out_dtype=torch.float32,
                            a_image=mxmoe.bf16_image(P.a), b_image=mxmoe.bf16_image(P.b))
    assert_bytes_equal(y2[: P.used], y[: P.used], "m_grouped exact with given images")
    K = KProblem(3, 128, 160)
    dw = mxmoe.grouped_gemm_wgrad(K.a, K.b, K.d_padded, fast=False)
    dw2 = mxmoe.grouped_gemm_wgrad(K.a, K.b, K.d_padded, fast=False, dy_t_image=mxmoe.bf16_image(K.a),
                                   x_t_image=mxmoe.bf16_image(K.b))
    assert_bytes_equal(dw2, dw, "k_grouped exact with given images")
    # The op makes its own wgrad images token-blocked; one given (row-major) and one made: same bits.
    dw3 = mxmoe.grouped_gemm_wgrad(K.a, K.b, K.d_padded, fast=False, dy_t_image=mxmoe.bf16_image(K.a))
    assert_bytes_equal(dw3, dw, "k_grouped exact with dy_t_image given, x_t_image made (token-blocked)")
