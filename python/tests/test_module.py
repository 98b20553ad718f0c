"""mxmoe.torch.MoE (the MXFP8 layer as an autograd-aware nn.Module) against mxmoe.torch.ReferenceMoE
(plain PyTorch BF16), determinism, argument errors, torch.compile(fullgraph=True).

Tolerance (forward and every gradient): relative Frobenius error ||got - ref|| / ||ref|| < 0.15.
Derivation: MX quantization rounds each element to E4M3 (3 mantissa bits) after a power-of-two
block scale; a GEMM whose two operands are both MX-quantized was measured at ~3.7% relative
Frobenius error against the unquantized product on Gaussian, heavy-tailed and SwiGLU-like data
(DESIGN.md §2), i.e. ~2.6% per quantized operand (3.7/√2). Independent errors add in quadrature
along a chain: the forward carries x, W1 (through G, U: 3.7%), Hact and W2, ≈ √(2·2.6² + 3.7²)
≈ 5%; the CPU test tests/cpu/test_moe_layer_mx_ref.cpp measured ~7% on the layer output against
FP64 with Gaussian data. The longest backward chain (dx: dY, W2ᵀ, G/U from GEMM1, dGU, W1ᵀ) is
≈ √(4·2.6² + 3.7²) ≈ 6.4%; the weight gradients have shorter chains. The BF16 reference adds
≈ 0.4% (8-bit significand). 0.15 is about twice the largest of these; a wrong formula, wrong
layout or wrong routing gives O(1) errors. Routing itself is not quantized (FP32 logits from the
BF16 inputs in both), so the chosen experts must agree exactly wherever the scores are separated
by more than the FP32 summation-order noise (margin > 1e-3 here).
"""
import copy
import pickle

import pytest
import torch

from _util import fresh_seed, mxmoe

DEV = "cuda"
BAD = (RuntimeError, ValueError, TypeError)
TOL = 0.15

CONFIGS = {
    # name: constructor arguments (tokens are chosen per test)
    "softmax": dict(hidden=256, intermediate=128, experts=8, top_k=2),
    "sigmoid_grouped": dict(hidden=384, intermediate=192, experts=16, top_k=4, routing="sigmoid", n_groups=4,
                            topk_groups=2, scaling=2.5),
}


def rel_err(got, want):
    g, w = got.double(), want.double()
    return float((g - w).norm() / w.norm().clamp_min(1e-30))


def make_pair(cfg, mode="fast", **kw):
    """MoE and ReferenceMoE with the same weights, on the GPU. mode "fast-blk": fast mode with
    128x128-block weights and wgrad activations (weight_blocks=True, activation_blocks=True), as
    bench_layer.py's mode of that name; "fast-wblk": the block weights alone."""
    if mode == "fast-blk":
        mode, kw = "fast", dict(kw, weight_blocks=True, activation_blocks=True)
    elif mode == "fast-wblk":
        mode, kw = "fast", dict(kw, weight_blocks=True)
    moe = mxmoe.torch.MoE(**cfg, mode=mode, device=DEV, **kw)
    ref = mxmoe.torch.ReferenceMoE(**cfg, device=DEV)
    ref.load_state_dict(moe.state_dict())
    return moe, ref


def fwd_bwd(module, x, dout):
    """out, dx, drouter, dw1, dw2 (all FP32 copies) for loss = Σ out ⊙ dout."""
    module.zero_grad(set_to_none=True)
    xg = x.detach().clone().requires_grad_(True)
    out = module(xg)
    out.backward(dout)
    return [t.detach().float() for t in (out, xg.grad, module.router.grad, module.w1.grad, module.w2.grad)]


def selection_margin(ref, x):
    """Per token, the smallest gap between consecutive selection scores among the top k + 1
    (and, for group-limited routing, between the kept groups and the best dropped group)."""
    logits = x.float() @ ref.router.float().t()
    k = ref.top_k
    if ref.routing == "softmax":
        sel = logits
    else:
        sel = logits.sigmoid()
    margin = torch.full((x.shape[0],), float("inf"), device=x.device)
    if ref.routing == "sigmoid" and ref.n_groups > 1:
        T, G = sel.shape[0], ref.n_groups
        gs = sel.view(T, G, -1).topk(2, dim=-1).values.sum(-1).sort(dim=-1, descending=True).values
        margin = torch.minimum(margin, gs[:, ref.topk_groups - 1] - gs[:, ref.topk_groups])
        keep = sel.view(T, G, -1).topk(2, dim=-1).values.sum(-1).topk(ref.topk_groups, dim=-1).indices
        allowed = torch.zeros(T, G, dtype=torch.bool, device=x.device).scatter_(1, keep, True)
        sel = sel.masked_fill(~allowed.repeat_interleave(sel.shape[1] // G, dim=1), float("-inf"))
    v = sel.sort(dim=-1, descending=True).values[:, :k + 1]
    gaps = v[:, :-1] - v[:, 1:]
    return torch.minimum(margin, gaps.min(-1).values)


# ---- without a GPU ---------------------------------------------------------------------------

@pytest.mark.ext
def test_config_errors_name_the_argument():
    MoE = mxmoe.torch.MoE
    with pytest.raises(BAD, match=r"argument 'routing'"):
        MoE(256, 128, 8, 2, routing="relu", device="meta")
    with pytest.raises(BAD, match=r"argument 'mode'"):
        MoE(256, 128, 8, 2, mode="fp4", device="meta")
    with pytest.raises(BAD, match=r"argument 'hidden'"):
        MoE(100, 128, 8, 2, device="meta")
    with pytest.raises(BAD, match=r"argument 'intermediate'"):
        MoE(256, 100, 8, 2, device="meta")
    with pytest.raises(BAD, match=r"argument 'scaling'"):
        MoE(256, 128, 8, 2, scaling=2.0, device="meta")
    with pytest.raises(BAD, match=r"argument 'top_k'"):
        MoE(256, 128, 8, 9, device="meta")
    with pytest.raises(BAD, match=r"argument 'experts'"):
        MoE(256, 128, 1000, 2, device="meta")
    with pytest.raises(BAD, match=r"argument 'n_groups'"):
        MoE(256, 128, 8, 2, routing="sigmoid", n_groups=3, device="meta")
    with pytest.raises(BAD, match=r"argument 'topk_groups'"):
        MoE(256, 128, 8, 2, routing="sigmoid", n_groups=4, topk_groups=5, device="meta")
    with pytest.raises(BAD, match=r"argument 'top_k'"):
        MoE(256, 128, 8, 5, routing="sigmoid", n_groups=4, topk_groups=2, device="meta")
    with pytest.raises(BAD, match=r"argument 'max_tokens'"):
        MoE(256, 128, 8, 2, max_tokens=0, device="meta")
    with pytest.raises(BAD, match=r"argument 'layer'"):
        torch.ops.mxmoe.moe_layer_info(-5)
    with pytest.raises(BAD, match=r"argument 'weight_blocks'"):
        MoE(256, 128, 8, 2, mode="exact", weight_blocks=True, device="meta")
    with pytest.raises(BAD, match=r"argument 'weight_blocks'"):
        MoE(256, 128, 8, 2, weight_blocks=1, device="meta")
    with pytest.raises(BAD, match=r"argument 'weight_blocks'"):
        torch.ops.mxmoe.moe_layer_create(256, 128, 8, 2, fast=False, weight_blocks=True)
    with pytest.raises(BAD, match=r"argument 'activation_blocks'"):
        MoE(256, 128, 8, 2, mode="exact", activation_blocks=True, device="meta")
    with pytest.raises(BAD, match=r"argument 'activation_blocks'"):
        MoE(256, 128, 8, 2, activation_blocks="yes", device="meta")
    with pytest.raises(BAD, match=r"argument 'activation_blocks'"):
        torch.ops.mxmoe.moe_layer_create(256, 128, 8, 2, fast=False, activation_blocks=True)


@pytest.mark.ext
def test_weight_blocks_survive_copies():
    """weight_blocks=True and activation_blocks=True reach the layer's config and the copies'
    (deepcopy, pickle), each on its own; the old create signature (without them) still works."""
    for flags in ({"weight_blocks": True}, {"activation_blocks": True},
                  {"weight_blocks": True, "activation_blocks": True}):
        m = mxmoe.torch.MoE(256, 128, 8, 2, device="meta", **flags)
        for k in ("weight_blocks", "activation_blocks"):
            assert m._handle.config[k] is flags.get(k, False) and (f"{k}=True" in repr(m)) == (k in flags), flags
        for c in (copy.deepcopy(m), pickle.loads(pickle.dumps(mxmoe.torch.MoE(256, 128, 8, 2, **flags)))):
            assert c._handle.config == m._handle.config and c._handle.layer_id != m._handle.layer_id, flags
            assert (c.weight_blocks, c.activation_blocks) == (m.weight_blocks, m.activation_blocks), flags
    old = torch.ops.mxmoe.moe_layer_create(256, 128, 8, 2)
    torch.ops.mxmoe.moe_layer_destroy(old)
    old = torch.ops.mxmoe.moe_layer_create(256, 128, 8, 2, weight_blocks=True)  # session 11's signature
    torch.ops.mxmoe.moe_layer_destroy(old)


@pytest.mark.ext
def test_handles_are_owned():
    m = mxmoe.torch.MoE(256, 128, 8, 2, device="meta")
    info = m.workspace_info()
    assert info["device"] == -1 and info["max_tokens"] == 4096 and info["allocations"] == 0  # lazy
    m2 = copy.deepcopy(m)
    m3 = pickle.loads(pickle.dumps(mxmoe.torch.MoE(256, 128, 8, 2)))
    ids = {m._handle.layer_id, m2._handle.layer_id, m3._handle.layer_id}
    assert len(ids) == 3
    old = m2._handle.layer_id
    del m2
    with pytest.raises(BAD, match=r"argument 'layer'"):
        torch.ops.mxmoe.moe_layer_info(old)


@pytest.mark.ext
def test_cpu_input_is_rejected_naming_the_argument():
    m = mxmoe.torch.MoE(256, 128, 8, 2)  # parameters on the CPU
    with pytest.raises(BAD, match=r"argument 'x' must be a CUDA tensor"):
        m(torch.randn(4, 256))
    with pytest.raises(BAD, match=r"argument 'x' must have shape \[\.\.\., 256\]"):
        m(torch.randn(4, 128))


@pytest.mark.ext
def test_meta_forward_backward_and_fullgraph_compile():
    """Fake implementations: shapes and dtypes of forward and gradients, eager and under
    torch.compile(fullgraph=True) with the aot_eager backend, on meta tensors."""
    moe = mxmoe.torch.MoE(256, 128, 8, 2, device="meta")

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.RMSNorm(256, device="meta")
            self.moe = moe

        def forward(self, x):
            return x + self.moe(self.norm(x))

    block = Block()
    x = torch.empty(2, 50, 256, device="meta", requires_grad=True)
    for fn in (block, torch.compile(block, backend="aot_eager", fullgraph=True)):
        torch._dynamo.reset()
        moe.zero_grad(set_to_none=True)
        y = fn(x)
        assert y.shape == x.shape and y.dtype == torch.float32
        y.sum().backward()
        assert moe.w1.grad.shape == moe.w1.shape and moe.w1.grad.dtype == torch.bfloat16
        assert moe.router.grad.shape == (8, 256) and moe.w2.grad.shape == (8, 256, 128)


@pytest.mark.parametrize("routing", ["softmax", "sigmoid_grouped"])
def test_reference_grouped_mm_equals_loop_on_cpu(routing):
    """The reference's two expert paths agree (CPU, no extension needed for the math)."""
    if mxmoe is None:
        pytest.skip("the extension is not built")
    fresh_seed()
    cfg = CONFIGS[routing]
    a = mxmoe.torch.ReferenceMoE(**cfg, impl="grouped_mm")
    b = mxmoe.torch.ReferenceMoE(**cfg, impl="loop")
    b.load_state_dict(a.state_dict())
    x = torch.randn(37, cfg["hidden"]).to(torch.bfloat16)
    dout = torch.randn(37, cfg["hidden"]).to(torch.bfloat16)
    ra, rb = fwd_bwd(a, x, dout), fwd_bwd(b, x, dout)
    for name, ga, gb in zip(("out", "dx", "drouter", "dw1", "dw2"), ra, rb):
        assert rel_err(ga, gb) < 1e-2, f"{name}: grouped_mm vs loop {rel_err(ga, gb):.3g}"
    ids, w = a.route(x)
    assert ids.shape == (37, cfg["top_k"])
    torch.testing.assert_close(w.sum(-1), torch.full((37,), cfg.get("scaling", 1.0)), rtol=1e-5, atol=1e-5)
    if routing == "sigmoid_grouped":  # every token's experts lie in at most topk_groups groups
        groups = ids // (cfg["experts"] // cfg["n_groups"])
        assert all(len(set(g.tolist())) <= cfg["topk_groups"] for g in groups)


# ---- on the GPU ------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fast", "exact", "fast-blk", "fast-wblk"])
@pytest.mark.parametrize("routing", ["softmax", "sigmoid_grouped"])
def test_matches_reference(routing, mode):
    seed = fresh_seed()
    cfg = CONFIGS[routing]
    T = 1000  # not a multiple of 32 or 128: the layer pads per expert
    moe, ref = make_pair(cfg, mode)
    with torch.no_grad():  # spread the logits (std ~2) so routing has clear winners
        moe.router.mul_(4.0)
        ref.router.copy_(moe.router)
    x = torch.randn(T, cfg["hidden"], device=DEV).to(torch.bfloat16)
    dout = torch.randn(T, cfg["hidden"], device=DEV).to(torch.bfloat16)
    got = fwd_bwd(moe, x, dout)
    ids, w = moe.last_routing()
    want = fwd_bwd(ref, x, dout)
    what = f"{routing}, {mode} (seed {seed})"
    for name, g, r in zip(("out", "dx", "drouter", "dw1", "dw2"), got, want):
        assert torch.isfinite(g).all(), f"{what}: {name} has non-finite values"
        e = rel_err(g, r)
        assert e < TOL, f"{what}: {name} relative Frobenius error {e:.4f} >= {TOL}"
    # routing: identical wherever the selection is well separated
    rids, rw = ref.route(x)
    ok = selection_margin(ref, x) > 1e-3
    assert int(ok.sum()) >= 0.8 * T, f"{what}: only {int(ok.sum())} of {T} tokens well separated"
    bad = (ids.long() != rids).any(-1) & ok
    if bool(bad.any()):
        t = int(bad.nonzero()[0])
        raise AssertionError(f"{what}: routing differs on {int(bad.sum())} separated tokens; first token {t}: "
                             f"got {ids[t].tolist()}, want {rids[t].tolist()}")
    torch.testing.assert_close(w[ok], rw.detach()[ok], rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_deterministic_and_backward_of_an_older_forward():
    """Bitwise equal reruns; two backwards of one graph; backward of a forward that is not the
    layer's last (the layer re-runs it) equals the direct result."""
    fresh_seed()
    cfg = CONFIGS["softmax"]
    moe = mxmoe.torch.MoE(**cfg, device=DEV)
    x1, x2, d1, d2 = (torch.randn(700, cfg["hidden"], device=DEV).to(torch.bfloat16) for _ in range(4))
    a = fwd_bwd(moe, x1, d1)
    b = fwd_bwd(moe, x1, d1)
    for name, u, v in zip(("out", "dx", "drouter", "dw1", "dw2"), a, b):
        assert torch.equal(u, v), f"rerun: {name} differs"
    # two backwards of the same graph
    moe.zero_grad(set_to_none=True)
    out = moe(x1)
    out.backward(d1, retain_graph=True)
    g1 = moe.w1.grad.clone()
    moe.zero_grad(set_to_none=True)
    out.backward(d1)
    assert torch.equal(moe.w1.grad, g1) and torch.equal(g1.float(), a[3]), "second backward differs"
    # forward x1, forward x2, then backward of the first
    moe.zero_grad(set_to_none=True)
    xa = x1.clone().requires_grad_(True)
    ya = moe(xa)
    yb = moe(x2.clone().requires_grad_(True))
    ya.backward(d1)
    assert torch.equal(ya.detach().float(), a[0])
    assert torch.equal(xa.grad.float(), a[1]), "dx of an older forward differs"
    assert torch.equal(moe.w2.grad.float(), a[4]), "dw2 of an older forward differs"
    yb.backward(d2)  # and the newer one still works afterwards


@pytest.mark.gpu
def test_weight_blocks_deterministic():
    """128x128-block weights, alone and with 128x128-block wgrad activations: bitwise equal reruns
    of forward and backward (and a result that is the block forms' own: close to the per-row fast
    layer's, within the module tolerance). The activation blocks change dw1 and dw2 only: out, dx
    and drouter are bitwise those of the weights-only layer."""
    fresh_seed()
    cfg = CONFIGS["sigmoid_grouped"]  # I = 192: W1's 2I = 384 rows, col(W2)'s 192 rows, K = 192
    blk = mxmoe.torch.MoE(**cfg, device=DEV, weight_blocks=True)
    both = mxmoe.torch.MoE(**cfg, device=DEV, weight_blocks=True, activation_blocks=True)
    row = mxmoe.torch.MoE(**cfg, device=DEV)
    row.load_state_dict(blk.state_dict())
    both.load_state_dict(blk.state_dict())
    x, d = (torch.randn(700, cfg["hidden"], device=DEV).to(torch.bfloat16) for _ in range(2))
    r = fwd_bwd(row, x, d)
    a = fwd_bwd(blk, x, d)
    for label, m in (("weight blocks", blk), ("weight + activation blocks", both)):
        g = fwd_bwd(m, x, d)
        h = fwd_bwd(m, x, d)
        for name, u, v, w in zip(("out", "dx", "drouter", "dw1", "dw2"), g, h, r):
            assert torch.equal(u, v), f"{label}, rerun: {name} differs"
            e = rel_err(u, w)
            assert e < TOL, f"{label}, {name}: block vs per-row fast relative Frobenius error {e:.4f} >= {TOL}"
        if m is both:
            for name, u, v in zip(("out", "dx", "drouter"), g, a):
                assert torch.equal(u, v), f"activation blocks changed {name}"


@pytest.mark.gpu
def test_workspace_grows_on_demand():
    fresh_seed()
    cfg = CONFIGS["softmax"]
    small = mxmoe.torch.MoE(**cfg, max_tokens=64, device=DEV)
    big = mxmoe.torch.MoE(**cfg, max_tokens=2048, device=DEV)
    big.load_state_dict(small.state_dict())
    x = torch.randn(3, 100, cfg["hidden"], device=DEV).to(torch.bfloat16)  # 300 tokens, leading dims kept
    d = torch.randn_like(x)
    a, b = fwd_bwd(small, x, d), fwd_bwd(big, x, d)
    info = small.workspace_info()
    assert info["max_tokens"] == 1024 and info["allocations"] == 1 and info["device"] == x.device.index
    for name, u, v in zip(("out", "dx", "drouter", "dw1", "dw2"), a, b):
        assert torch.equal(u, v), f"grown workspace: {name} differs from a large one"
    assert a[0].shape == x.shape


@pytest.mark.gpu
def test_fp32_parameters_and_input():
    """FP32 master weights and FP32 activations: cast to BF16 for the layer, gradients in FP32."""
    fresh_seed()
    cfg = CONFIGS["softmax"]
    m16, _ = make_pair(cfg)
    m32 = mxmoe.torch.MoE(**cfg, device=DEV, dtype=torch.float32)
    m32.load_state_dict(m16.state_dict())
    x = torch.randn(300, cfg["hidden"], device=DEV).to(torch.bfloat16)
    d = torch.randn_like(x)
    a = fwd_bwd(m16, x, d)
    m32.zero_grad(set_to_none=True)
    x32 = x.float().requires_grad_(True)
    out = m32(x32)
    out.backward(d.float())
    assert out.dtype == torch.float32 and m32.w1.grad.dtype == torch.float32 and x32.grad.dtype == torch.float32
    assert torch.equal(out.to(torch.bfloat16).float(), a[0])
    assert rel_err(m32.w1.grad, a[3]) < 1e-2  # FP32 vs BF16-rounded copies of the same FP32 gradient


@pytest.mark.gpu
def test_errors_name_the_argument():
    cfg = CONFIGS["softmax"]
    moe = mxmoe.torch.MoE(**cfg, device=DEV)
    lid = moe._handle.layer_id
    H, I, E = cfg["hidden"], cfg["intermediate"], cfg["experts"]
    x = torch.randn(64, H, device=DEV).to(torch.bfloat16)
    r, w1, w2 = moe.router.detach(), moe.w1.detach(), moe.w2.detach()
    fwd = torch.ops.mxmoe.moe_layer_forward
    bwd = torch.ops.mxmoe.moe_layer_backward
    with pytest.raises(BAD, match=r"argument 'x' must have dtype BFloat16"):
        fwd(lid, x.float(), r, w1, w2)
    with pytest.raises(BAD, match=r"argument 'x' must have shape \[T, 256\]"):
        fwd(lid, x[:, :128].contiguous(), r, w1, w2)
    with pytest.raises(BAD, match=r"argument 'x' must be a CUDA tensor"):
        fwd(lid, x.cpu(), r, w1, w2)
    with pytest.raises(BAD, match=r"argument 'x' must be contiguous"):
        fwd(lid, torch.randn(H, 64, device=DEV).to(torch.bfloat16).t(), r, w1, w2)
    with pytest.raises(BAD, match=r"argument 'router' must have shape"):
        fwd(lid, x, r[:4].contiguous(), w1, w2)
    with pytest.raises(BAD, match=r"argument 'router' must have dtype BFloat16"):
        fwd(lid, x, r.float(), w1, w2)
    with pytest.raises(BAD, match=r"argument 'w1' must have shape"):
        fwd(lid, x, r, w1[:, :I].contiguous(), w2)
    with pytest.raises(BAD, match=r"argument 'w2' must be contiguous"):
        fwd(lid, x, r, w1, torch.empty(E, I, H, device=DEV, dtype=torch.bfloat16).transpose(1, 2))
    with pytest.raises(BAD, match=r"argument 'w2' must be a CUDA tensor"):
        fwd(lid, x, r, w1, w2.cpu())
    with pytest.raises(BAD, match=r"argument 'layer'"):
        fwd(-1, x, r, w1, w2)
    with pytest.raises(BAD, match=r"argument 'dout' must have shape"):
        bwd(lid, x[:32].contiguous(), x, r, w1, w2)
    with pytest.raises(BAD, match=r"argument 'dout' must have dtype BFloat16"):
        bwd(lid, x.float(), x, r, w1, w2)
    with pytest.raises(BAD, match=r"argument 'x' must have shape \[\.\.\., 256\]"):
        moe(torch.randn(8, 128, device=DEV))
    with pytest.raises(BAD, match=r"argument 'x' must be a floating-point tensor"):
        moe(torch.ones(8, H, device=DEV, dtype=torch.int32))


@pytest.mark.gpu
def test_opcheck():
    fresh_seed()
    cfg = CONFIGS["softmax"]
    moe = mxmoe.torch.MoE(**cfg, device=DEV)
    lid = moe._handle.layer_id
    x = torch.randn(200, cfg["hidden"], device=DEV).to(torch.bfloat16)
    w = (moe.router.detach(), moe.w1.detach(), moe.w2.detach())
    for op, args in ((torch.ops.mxmoe.moe_layer_forward.default, (lid, x, *w)),
                     (torch.ops.mxmoe.moe_layer_backward.default, (lid, torch.randn_like(x), x, *w))):
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.gpu
@pytest.mark.parametrize("routing", ["softmax", "sigmoid_grouped"])
def test_torch_compile_fullgraph_matches_eager(routing):
    """A block (MoE, residual, output projection) compiled with fullgraph=True (inductor): forward
    and gradients match the eager block's. The MoE sees bitwise the same input in both (nothing
    before it), so routing cannot flip; inductor may round the projection's neighbourhood
    differently, hence a BF16-level tolerance rather than bitwise."""
    seed = fresh_seed()
    cfg = CONFIGS[routing]
    H = cfg["hidden"]

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.moe = mxmoe.torch.MoE(**cfg, device=DEV)
            self.proj = torch.nn.Linear(H, H, device=DEV, dtype=torch.bfloat16)

        def forward(self, x):
            return self.proj(x + self.moe(x))

    block = Block()
    x = torch.randn(4, 128, H, device=DEV).to(torch.bfloat16)
    d = torch.randn_like(x)

    def run(fn):
        block.zero_grad(set_to_none=True)
        xg = x.clone().requires_grad_(True)
        y = fn(xg)
        y.backward(d)
        return [t.detach().float() for t in (y, xg.grad, block.moe.router.grad, block.moe.w1.grad,
                                             block.moe.w2.grad, block.proj.weight.grad)]

    eager = run(block)
    torch._dynamo.reset()
    compiled = run(torch.compile(block, fullgraph=True))
    for name, c, e in zip(("out", "dx", "drouter", "dw1", "dw2", "dproj"), compiled, eager):
        err = rel_err(c, e)
        assert err < 2e-2, f"compiled vs eager ({routing}, seed {seed}): {name} relative error {err:.3g}"
