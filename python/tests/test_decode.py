"""Warp-decode ops (router, gate/up, down) against an FP64 torch reference, with the tolerances of
tests/gpu/test_decode_gpu.cpp (ported; u = 2^-24, γ_n = n·u/(1 − n·u)):
  * router: data on exact grids (X = integers in [-16, 16] / 8, Wr = integers / 256), so FP32
    logits are exact; softmax ids must match exactly (ties -> lower id); sigmoid ids are compared
    where the reference's decision margin exceeds 1e-5; weights within 2^-17 relative.
  * gate/up: Δg = γ_{H+64}·Σ|x·w_gate| (likewise Δu); Δh = 1.1·Δg·(|u| + Δu) + |silu(g)|·Δu, plus
    2^-20 relative for the FP32 SwiGLU, plus 2^-8 relative for BF16 h.
  * down (fed the GPU's h and routing weights): γ_{I+S+66}·Σ_j |w_j|·Σ_i |h·w2|, plus 2^-8 relative
    (BF16 output).
Each kernel is checked on its own inputs, so errors do not propagate from one to the next."""
import pytest
import torch

from _util import assert_bytes_equal, assert_within, fresh_seed, gamma, mxmoe

pytestmark = pytest.mark.gpu
DEV = "cuda"


def int_grid(shape, scale):
    return (torch.randint(-16, 17, shape, device=DEV).float() / scale).to(torch.bfloat16)


def route_reference(x, wr, top_k, sigmoid, renormalize, n_groups, topk_groups, scaling, bias):
    """FP64 routing (decode.h): returns ids [B, k], weights [B, k], margin [B]."""
    logits = x.double() @ wr.double().t()  # exact for the grid data
    B, E = logits.shape
    if sigmoid:
        s = torch.sigmoid(logits)
        sel = s + (bias.double() if bias is not None else 0.0)
    else:
        sel = logits
    margin = torch.full((B,), float("inf"), dtype=torch.float64, device=DEV)
    if n_groups > 1:
        gsz = E // n_groups
        gscore = sel.reshape(B, n_groups, gsz).topk(2, dim=-1).values.sum(-1)
        gorder = torch.sort(gscore, dim=1, descending=True, stable=True)
        if topk_groups < n_groups:
            gs = gorder.values
            margin = torch.minimum(margin, gs[:, topk_groups - 1] - gs[:, topk_groups])
        keep = torch.zeros(B, n_groups, dtype=torch.bool, device=DEV)
        keep.scatter_(1, gorder.indices[:, :topk_groups], True)
        sel = torch.where(keep.repeat_interleave(gsz, dim=1), sel, torch.full_like(sel, float("-inf")))
    order = torch.sort(sel, dim=1, descending=True, stable=True)
    ids = order.indices[:, :top_k]
    top = order.values[:, : top_k + 1]
    gaps = top[:, :-1] - top[:, 1:]
    gaps = torch.where(torch.isfinite(gaps), gaps, torch.full_like(gaps, float("inf")))
    margin = torch.minimum(margin, gaps.min(1).values)
    src = torch.sigmoid(logits) if sigmoid else torch.softmax(logits, dim=1)
    w = src.gather(1, ids)
    if renormalize:
        w = w / w.sum(1, keepdim=True)
    return ids.to(torch.int32), w * scaling, margin


ROUTER_CASES = [
    # (B, H, E, k, sigmoid, renormalize, n_groups, topk_groups, scaling, with_bias)
    (1, 256, 16, 4, False, True, 1, 1, 1.0, False),
    (7, 512, 64, 8, False, True, 1, 1, 1.0, False),
    (5, 256, 32, 4, False, False, 1, 1, 2.5, False),
    (9, 256, 64, 8, True, True, 8, 4, 2.5, True),
    (6, 256, 32, 4, True, False, 1, 1, 1.0, False),
]


@pytest.mark.parametrize("case", ROUTER_CASES)
def test_decode_router(case):
    seed = fresh_seed()
    B, H, E, k, sigmoid, renorm, ng, tg, scaling, with_bias = case
    x = int_grid((B, H), 8)
    wr = int_grid((E, H), 256)
    bias = (torch.randn(E, device=DEV) * 0.01) if with_bias else None
    ids, w = mxmoe.decode_router(x, wr, k, "sigmoid" if sigmoid else "softmax", renorm, ng, tg, scaling, bias)
    assert ids.shape == (B, k) and ids.dtype == torch.int32 and w.dtype == torch.float32
    rid, rw, margin = route_reference(x, wr, k, sigmoid, renorm, ng, tg, scaling, bias)
    compared = 0
    for b in range(B):
        if sigmoid and not float(margin[b]) > 1e-5:
            continue  # near-tie: either choice is right
        compared += 1
        assert ids[b].tolist() == rid[b].tolist(), f"{case} token {b}: ids {ids[b].tolist()} vs {rid[b].tolist()} (seed {seed})"
        tol = rw[b].abs() * 2.0 ** -17 + 1e-30
        assert_within(w[b], rw[b], tol, f"{case} token {b} weights (seed {seed})")
    assert compared >= B - (B // 8 + 1), "too many near-tie tokens skipped"


def make_weights(E, N, K, mx):
    """Expert weights [E, N, K]: Gaussian / sqrt(K) in BF16, or their MX quantization.
    Returns (weights for the op, scales or None, exact float64 values)."""
    w = (torch.randn(E, N, K, device=DEV) / K ** 0.5).to(torch.bfloat16)
    if not mx:
        return w, None, w.double()
    q = mxmoe.quantize(w).rowwise
    return q.data, q.scales, mxmoe.dequantize(q.data, q.scales, torch.float64)


def make_shared_expert(I, H, mx):
    """A shared expert's w1 [2I, H] and w2 [H, I], each as (weights, scales or None, float64 values)."""
    out = []
    for n, k in ((2 * I, H), (H, I)):
        w, s, v = make_weights(1, n, k, mx)
        out.append((w[0], s[0] if mx else None, v[0]))
    return out


def silu(g):
    return g / (1 + torch.exp(-g))


@pytest.mark.parametrize("mx", [False, True])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("h_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B", [1, 5])
def test_decode_gate_up_down(mx, shared, h_dtype, B):
    seed = fresh_seed()
    H, I, E, k = 256, 128, 16, 4
    what = f"decode B={B} mx={mx} shared={shared} h={h_dtype} seed={seed}"
    x = int_grid((B, H), 8)
    ids = torch.stack([torch.randperm(E, device=DEV)[:k] for _ in range(B)]).to(torch.int32)
    w1, s1, w1v = make_weights(E, 2 * I, H, mx)
    w2, s2, w2v = make_weights(E, H, I, mx)
    sw1 = ss1 = sw2 = ss2 = None
    if shared:
        (sw1, ss1, av), (sw2, ss2, cv) = make_shared_expert(I, H, mx)
        w1v = torch.cat([w1v, av.unsqueeze(0)])  # the shared expert as id E
        w2v = torch.cat([w2v, cv.unsqueeze(0)])
    slot_ids = torch.cat([ids, torch.full((B, 1), E, dtype=torch.int32, device=DEV)], 1) if shared else ids

    # gate/up
    h = mxmoe.decode_gate_up(x, w1, ids, w1_scales=s1, shared_w1=sw1, shared_w1_scales=ss1, h_dtype=h_dtype)
    S = k + int(shared)
    assert h.shape == (B, S, I) and h.dtype == h_dtype
    W = w1v[slot_ids.long()]  # [B, S, 2I, H]
    xd = x.double()
    gu = torch.einsum("bsnh,bh->bsn", W, xd)
    gu_abs = torch.einsum("bsnh,bh->bsn", W.abs(), xd.abs())
    g, u = gu[..., :I], gu[..., I:]
    h_ref = silu(g) * u
    gh = gamma(H + 64)
    dg, du = gh * gu_abs[..., :I], gh * gu_abs[..., I:]
    prop = 1.1 * dg * (u.abs() + du) + silu(g).abs() * du
    tol = prop + 2.0 ** -20 * (h_ref.abs() + prop)
    if h_dtype == torch.bfloat16:
        tol = tol + 2.0 ** -8 * (h_ref.abs() + tol)
    worst = assert_within(h, h_ref, tol, f"{what}: h")
    print(f"{what}: h worst |err|/tol = {worst:.3g}")

    # down, on the GPU's h and fresh routing weights
    tw = torch.rand(B, k, device=DEV)
    out = mxmoe.decode_down(h, w2, ids, tw, w2_scales=s2, shared_w2=sw2, shared_w2_scales=ss2)
    assert out.shape == (B, H) and out.dtype == torch.bfloat16
    slot_w = torch.cat([tw.double(), torch.ones(B, 1, dtype=torch.float64, device=DEV)], 1) if shared else tw.double()
    W2 = w2v[slot_ids.long()]  # [B, S, H, I]
    hd = h.double()
    per_slot = torch.einsum("bsni,bsi->bsn", W2, hd)
    per_slot_abs = torch.einsum("bsni,bsi->bsn", W2.abs(), hd.abs())
    o_ref = (slot_w.unsqueeze(-1) * per_slot).sum(1)
    o_abs = (slot_w.abs().unsqueeze(-1) * per_slot_abs).sum(1)
    d = gamma(I + S + 66) * o_abs
    worst = assert_within(out, o_ref, d + 2.0 ** -8 * (o_ref.abs() + d), f"{what}: out")
    print(f"{what}: out worst |err|/tol = {worst:.3g}")

    # determinism
    h2 = mxmoe.decode_gate_up(x, w1, ids, w1_scales=s1, shared_w1=sw1, shared_w1_scales=ss1, h_dtype=h_dtype)
    out2 = mxmoe.decode_down(h2, w2, ids, tw, w2_scales=s2, shared_w2=sw2, shared_w2_scales=ss2)
    assert_bytes_equal(h2, h, f"{what}: h rerun")
    assert_bytes_equal(out2, out, f"{what}: out rerun")


def test_decode_batch_invariance():
    """A token's outputs do not depend on the other tokens of the batch (decode.h)."""
    fresh_seed()
    H, I, E, k, B = 256, 64, 8, 2, 6
    x = int_grid((B, H), 8)
    wr = int_grid((E, H), 256)
    w1, _, _ = make_weights(E, 2 * I, H, False)
    w2, _, _ = make_weights(E, H, I, False)
    ids, tw = mxmoe.decode_router(x, wr, k)
    out = mxmoe.decode_down(mxmoe.decode_gate_up(x, w1, ids), w2, ids, tw)
    ids1, tw1 = mxmoe.decode_router(x[3:4].clone(), wr, k)
    out1 = mxmoe.decode_down(mxmoe.decode_gate_up(x[3:4].clone(), w1, ids1), w2, ids1, tw1)
    assert_bytes_equal(ids1, ids[3:4], "ids of token 3 alone")
    assert_bytes_equal(out1, out[3:4], "out of token 3 alone")


@pytest.mark.parametrize("mx", [False, True])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("B", [1, 3, 8])
def test_decode_step_fused_matches_three_ops(mx, shared, B):
    """decode_step_fused (one persistent kernel) gives the bits of decode_router -> decode_gate_up
    (float32 h) -> decode_down, DeepSeek-V3-like sigmoid routing with groups and bias when there is a
    shared expert, softmax otherwise; the workspace is made for 8 tokens and reused (and rerun)."""
    seed = fresh_seed()
    H, I, E, k = 256, 128, 32, 4
    what = f"fused B={B} mx={mx} shared={shared} seed={seed}"
    x8 = int_grid((8, H), 8)
    x = x8[:B].clone()
    wr = int_grid((E, H), 256)
    w1, s1, _ = make_weights(E, 2 * I, H, mx)
    w2, s2, _ = make_weights(E, H, I, mx)
    sw1 = ss1 = sw2 = ss2 = None
    if shared:
        (sw1, ss1, _), (sw2, ss2, _) = make_shared_expert(I, H, mx)
    route = dict(scoring="sigmoid", n_groups=8, topk_groups=4, scaling_factor=2.5,
                 bias=torch.rand(E, device=DEV) * 0.1) if shared else dict(scoring="softmax")
    ids, tw = mxmoe.decode_router(x, wr, k, **route)
    h = mxmoe.decode_gate_up(x, w1, ids, w1_scales=s1, shared_w1=sw1, shared_w1_scales=ss1)
    out = mxmoe.decode_down(h, w2, ids, tw, w2_scales=s2, shared_w2=sw2, shared_w2_scales=ss2)
    ws = mxmoe.decode_fused_workspace(x8, w1, k, shared_expert=shared)
    for rep in range(2):
        fids, ftw, fout = mxmoe.decode_step_fused(x, wr, w1, w2, k, ws, w1_scales=s1, w2_scales=s2,
                                                  shared_w1=sw1, shared_w1_scales=ss1, shared_w2=sw2,
                                                  shared_w2_scales=ss2, **route)
        assert_bytes_equal(fids, ids, f"{what}: ids (rep {rep})")
        assert_bytes_equal(ftw, tw, f"{what}: weights (rep {rep})")
        assert_bytes_equal(fout, out, f"{what}: out (rep {rep})")


def test_decode_step_fused_rejects_bad_arguments():
    fresh_seed()
    H, I, E, k = 256, 64, 8, 2
    x = int_grid((2, H), 8)
    wr = int_grid((E, H), 256)
    w1, _, _ = make_weights(E, 2 * I, H, False)
    w2, _, _ = make_weights(E, H, I, False)
    ws = mxmoe.decode_fused_workspace(x, w1, k)
    with pytest.raises(ValueError, match="top_k"):
        mxmoe.decode_fused_workspace(x, w1, 0)
    with pytest.raises(ValueError, match="scoring"):
        mxmoe.decode_step_fused(x, wr, w1, w2, k, ws, scoring="relu")
    with pytest.raises((ValueError, RuntimeError), match="router_w"):  # run 75: shape checks raise RuntimeError
        mxmoe.decode_step_fused(x, wr[:, :128].contiguous(), w1, w2, k, ws)
    with pytest.raises(ValueError, match="w2"):
        mxmoe.decode_step_fused(x, wr, w1, w2[:4].contiguous(), k, ws)
    with pytest.raises((ValueError, RuntimeError), match="workspace"):
        mxmoe.decode_step_fused(x, wr, w1, w2, k, ws[:64])  # too small for this layer
    with pytest.raises((ValueError, RuntimeError), match="workspace"):  # sized for 2 tokens, asked for 8
        mxmoe.decode_step_fused(int_grid((8, H), 8), wr, w1, w2, k, ws)
    with pytest.raises((ValueError, RuntimeError), match="batch"):
        mxmoe.decode_step_fused(int_grid((9, H), 8), wr, w1, w2, k, mxmoe.decode_fused_workspace(int_grid((9, H), 8), w1, k))
