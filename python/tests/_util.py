"""Shared helpers of the Python tests: what can run here, fresh seeds, bit-exact comparison with
the first mismatching coordinate, and the GEMM error bound (the derivation of
tests/gpu/test_gemm_gpu.cpp, ported)."""
import os

import torch


def _gpu_skip_reason():
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine (torch.cuda.is_available() is False)"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"mxmoe's kernels are built for sm_90a (Hopper) only; this GPU is sm_{major}{minor}"
    return None


GPU_SKIP = _gpu_skip_reason()

try:
    import mxmoe  # noqa: F401
    EXT_SKIP = None
except ImportError as e:  # not built here
    if torch.cuda.is_available():
        raise  # on a GPU machine a missing extension is a failure, not a skip
    mxmoe = None
    EXT_SKIP = (f"the extension mxmoe._C is not importable ({e}); build it with "
                "`pip install --no-build-isolation --no-deps -e .`")


def fresh_seed():
    """A new seed per test run (STYLE.md: fresh random inputs each run); printed on failure."""
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    return seed


def assert_bytes_equal(got, want, what):
    """Bit-exact comparison (float8 / uint8 / any dtype through its bytes); reports the count and
    the first differing coordinate with both values."""
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    g, w = got.view(ints[got.element_size()]), want.view(ints[want.element_size()])
    ne = g != w
    if bool(ne.any()):
        idx = tuple(ne.nonzero()[0].tolist())
        raise AssertionError(f"{what}: {int(ne.sum())} of {g.numel()} elements differ; first at {list(idx)}: "
                             f"got {g[idx].item():#x}, want {w[idx].item():#x}")


# ---- GEMM reference and bound ----------------------------------------------------------------
# Element-wise tolerance (tests/gpu/test_gemm_gpu.cpp). Products p_i of the values each mode
# multiplies are exact (fast: E4M3 deq values; exact: the BF16 images, = deq for these data).
#  Fast mode:
#  * Tensor-core sums (Hopper FP8 wgmma keeps about 14 bits, F = 13 assumed): one k32 instruction
#    is off by at most 33·2^-F·max(|acc_in|, max_i |p_i|); the four k32 steps of a 128-chunk chain.
#  * FP32 promotion once per chunk: (L/128 + 1)·2^-24·Σ|p_i|.
#  Exact mode (FP32 accumulation only): one accumulator over all of L, each k16 step off by at most
#    152·2^-23·max(|acc_in|, max_i |p_i|) (any FP32 evaluation of acc + 16 products that keeps 24
#    significant bits: sequential adds, round-to-nearest or truncation, or a block addition).
#  * BF16 output: 2^-8 relative (8-bit significand), applied to |y| + bound by the caller.
TC_FRAC_BITS = 13
TC = 33.0 * 2.0 ** -TC_FRAC_BITS
EXACT_STEP = 152.0 * 2.0 ** -23


def dot_with_bound(da, db, fast):
    """da [m, L], db [n, L] float64 (L % 32 == 0) -> (y = da·dbᵀ [m, n], bound [m, n]) for fast mode
    (k32 steps, promotion every 128 of L) or exact mode (k16 steps, no promotion)."""
    m, L = da.shape
    n = db.shape[0]
    group, per_step = (32, TC) if fast else (16, EXACT_STEP)
    period = 128 if fast else max(L, group)
    nb = L // group
    bpc = period // group
    nck = (nb + bpc - 1) // bpc
    pad = nck * bpc - nb
    ys, bounds = [], []
    for r0 in range(0, m, 64):
        p = (da[r0:r0 + 64, None, :] * db[None, :, :]).reshape(-1, n, nb, group)  # [mr, n, nb, group]
        sg = p.sum(-1)
        mx = p.abs().amax(-1)
        sabs = p.abs().sum((-1, -2))
        if pad:
            sg = torch.nn.functional.pad(sg, (0, pad))
            mx = torch.nn.functional.pad(mx, (0, pad))
        sgc = sg.reshape(*sg.shape[:2], nck, bpc)
        partial_before = sgc.cumsum(-1) - sgc
        valid = torch.ones(nck * bpc, dtype=torch.float64, device=da.device)
        if pad:
            valid[nb:] = 0
        btc = per_step * (torch.maximum(partial_before.abs(), mx.reshape(sgc.shape)) * valid.reshape(nck, bpc)).sum((-1, -2))
        ys.append(sgc.sum((-1, -2)))
        bounds.append(btc + ((L // period + 1) * 2.0 ** -24 * sabs if fast else 0.0))
    return torch.cat(ys), torch.cat(bounds)


def assert_within(got, want, tol, what):
    """|got - want| <= tol element-wise (NaN fails); returns the worst |err| / tol."""
    g = got.to(torch.float64)
    err = (g - want).abs()
    bad = ~(err <= tol)
    if bool(bad.any()):
        idx = tuple(bad.nonzero()[0].tolist())
        raise AssertionError(f"{what}: {int(bad.sum())} of {g.numel()} outside tolerance; first at {list(idx)}: "
                             f"got {g[idx].item()!r}, want {want[idx].item()!r} (tol {tol[idx].item():.3g})")
    pos = tol > 0
    return float((err[pos] / tol[pos]).max()) if bool(pos.any()) else 0.0


def gamma(n):
    """γ_n = n·u / (1 - n·u), u = 2^-24 (FP32 unit roundoff)."""
    u = 2.0 ** -24
    return n * u / (1 - n * u)
