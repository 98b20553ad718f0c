"""torch.compile (fullgraph) and CUDA-graph capture of the ops, and their fake (meta)
implementations. Compiled and captured results must equal eager ones bit for bit (same kernels)."""
import pytest
import torch

from _util import assert_bytes_equal, fresh_seed, mxmoe

DEV = "cuda"


# ---- fake implementations: shapes and dtypes without a GPU -------------------------------------

@pytest.mark.ext
def test_fake_shapes_on_meta_tensors():
    x = torch.empty(256, 384, dtype=torch.bfloat16, device="meta")
    q = mxmoe.quantize(x, rowwise=True, colwise=True, fast=True)
    assert [tuple(t.shape) for t in q.rowwise] == [(256, 384), (256, 12), (256, 384), (3, 256)]
    assert [tuple(t.shape) for t in q.colwise] == [(384, 256), (384, 8), (384, 256), (2, 384)]
    assert q.rowwise.data.dtype == torch.float8_e4m3fn and q.rowwise.scales.dtype == torch.uint8
    w = mxmoe.quantize(torch.empty(4, 160, 384, dtype=torch.bfloat16, device="meta"), fast=True).rowwise
    assert tuple(w.fast_scales.shape) == (4, 3, 160)
    off = torch.empty(5, dtype=torch.int32, device="meta")
    assert tuple(mxmoe.grouped_gemm(q.rowwise, w, off).shape) == (256, 160)
    assert mxmoe.grouped_gemm(q.rowwise, w, off, out_dtype=torch.float32).dtype == torch.float32
    g = mxmoe.quantize_grouped(torch.empty(300, 128, dtype=torch.bfloat16, device="meta"), off, 768,
                               padded_offsets=off, rowwise=False, colwise=True, fast=True).colwise
    assert [tuple(t.shape) for t in g] == [(128, 768), (128, 24), (128, 768), (6, 128)]
    dw = mxmoe.grouped_gemm_wgrad(g, g, off)
    assert tuple(dw.shape) == (4, 128, 128)
    plan = mxmoe.moe_plan(torch.empty(10, 4, dtype=torch.int32, device="meta"), 8)
    assert [tuple(t.shape) for t in plan] == [(8,), (9,), (9,), (10, 4), (1152,)]
    xd = torch.empty(3, 256, dtype=torch.bfloat16, device="meta")
    ids, tw = mxmoe.decode_router(xd, torch.empty(16, 256, dtype=torch.bfloat16, device="meta"), 4)
    assert tuple(ids.shape) == (3, 4) and ids.dtype == torch.int32 and tw.dtype == torch.float32
    h = mxmoe.decode_gate_up(xd, torch.empty(16, 128, 256, dtype=torch.bfloat16, device="meta"), ids,
                             shared_w1=torch.empty(128, 256, dtype=torch.bfloat16, device="meta"))
    assert tuple(h.shape) == (3, 5, 64) and h.dtype == torch.float32
    out = mxmoe.decode_down(h, torch.empty(16, 256, 64, dtype=torch.bfloat16, device="meta"), ids, tw,
                            shared_w2=torch.empty(256, 64, dtype=torch.bfloat16, device="meta"))
    assert tuple(out.shape) == (3, 256) and out.dtype == torch.bfloat16


@pytest.mark.ext
def test_dynamo_traces_fullgraph_on_meta():
    """Dynamo + AOT (functionalization of the out= op) trace the helpers without graph breaks."""
    def f(x, w, offsets, out):
        q = mxmoe.quantize_grouped(x, offsets, 512, fast=True)
        qw = mxmoe.quantize(w, fast=True)
        padded = mxmoe.compute_padded_offsets(offsets)
        y = mxmoe.grouped_gemm(q.rowwise, qw.rowwise, padded)
        mxmoe.grouped_gemm(q.rowwise, qw.rowwise, padded, fast=False, out=out, accumulate=True)
        return y.float() * 2, out

    torch._dynamo.reset()
    cf = torch.compile(f, backend="aot_eager", fullgraph=True)
    y, out = cf(torch.empty(300, 256, dtype=torch.bfloat16, device="meta"),
                torch.empty(4, 128, 256, dtype=torch.bfloat16, device="meta"),
                torch.empty(5, dtype=torch.int32, device="meta"),
                torch.empty(512, 128, dtype=torch.float32, device="meta"))
    assert tuple(y.shape) == (512, 128) and y.dtype == torch.float32


# ---- on the GPU ------------------------------------------------------------------------------

def routed_problem(tokens=200, hidden=256, inter=128, experts=8, top_k=2):
    x = torch.randn(tokens, hidden, device=DEV).to(torch.bfloat16)
    w = (torch.randn(experts, inter, hidden, device=DEV) / hidden ** 0.5).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(experts, device=DEV)[:top_k] for _ in range(tokens)]).to(torch.int32)
    return x, w, ids


def moe_forward(x, w, ids):
    """Plan -> permute + quantize -> m-grouped GEMM (fast), then a torch op on the result."""
    plan = mxmoe.moe_plan(ids, w.shape[0])
    q = mxmoe.quantize_gather(x, plan.row_index, plan.padded_offsets[-1:], fast=True)
    qw = mxmoe.quantize(w, fast=True)
    y = mxmoe.grouped_gemm(q.rowwise, qw.rowwise, plan.padded_offsets)
    return y, plan.padded_offsets, y.float().square().sum(-1)


@pytest.mark.gpu
def test_torch_compile_fullgraph_matches_eager():
    seed = fresh_seed()
    x, w, ids = routed_problem()
    y0, pad0, s0 = moe_forward(x, w, ids)
    torch._dynamo.reset()
    cf = torch.compile(moe_forward, fullgraph=True)
    y1, pad1, s1 = cf(x, w, ids)
    used = int(pad0[-1])
    assert_bytes_equal(pad1, pad0, f"compiled padded offsets (seed {seed})")
    assert_bytes_equal(y1[:used], y0[:used], f"compiled GEMM output (seed {seed})")
    torch.testing.assert_close(s1[:used], s0[:used], rtol=1e-6, atol=0)


@pytest.mark.gpu
def test_opcheck():
    """torch.library.opcheck on the ops whose outputs are fully written: schema, fake tensors
    against real outputs, AOT dispatch with dynamic shapes. (The ops have no autograd formula; the
    MoE module will bring one.)"""
    fresh_seed()
    x = torch.randn(128, 256, device=DEV).to(torch.bfloat16)
    w = torch.randn(2, 64, 256, device=DEV).to(torch.bfloat16)
    off = torch.tensor([0, 128, 128], dtype=torch.int32, device=DEV)
    qa = mxmoe.quantize(x, fast=True).rowwise
    qb = mxmoe.quantize(w, fast=True).rowwise
    col = mxmoe.quantize(x, rowwise=False, colwise=True, fast=True).colwise
    ids = torch.randint(0, 8, (50, 2), dtype=torch.int32, device=DEV)
    wr = torch.randn(8, 256, device=DEV).to(torch.bfloat16)
    w1 = torch.randn(8, 128, 256, device=DEV).to(torch.bfloat16)
    w2 = torch.randn(8, 256, 64, device=DEV).to(torch.bfloat16)
    xs = x[:3].clone()
    tid, tw = mxmoe.decode_router(xs, wr, 2)
    h = mxmoe.decode_gate_up(xs, w1, tid)
    cases = [
        (torch.ops.mxmoe.quantize_mxfp8.default, (x, True, True, True, 0)),
        (torch.ops.mxmoe.quantize_mxfp8.default, (w, True, False, True, 1)),
        (torch.ops.mxmoe.compute_padded_offsets.default, (off, 128)),
        (torch.ops.mxmoe.moe_plan.default, (ids, 8, 0)),
        (torch.ops.mxmoe.m_grouped_mxfp8_gemm_nt.default,
         (qa.fast_data, qa.fast_scales, qb.fast_data, qb.fast_scales, off, True, torch.float32, 0)),
        (torch.ops.mxmoe.k_grouped_mxfp8_gemm_nt.default,
         (col.data, col.scales, col.data, col.scales, off, False, None, 0)),
        (torch.ops.mxmoe.dequantize_mxfp8_bf16.default, (qb.data, qb.scales)),
        (torch.ops.mxmoe.m_grouped_mxfp8_gemm_nt.default,  # exact mode with given images
         (qa.data, qa.scales, qb.data, qb.scales, off, False, None, 0, mxmoe.bf16_image(qa),
          mxmoe.bf16_image(qb))),
        (torch.ops.mxmoe.decode_router.default, (xs, wr, 2)),
        (torch.ops.mxmoe.decode_gate_up.default, (xs, w1, None, tid)),
        (torch.ops.mxmoe.decode_down.default, (h, w2, None, tid, tw)),
    ]
    fp8 = (torch.float8_e4m3fn,)
    for op, args in cases:
        # test_schema runs the op under SchemaCheckMode, which compares tensors with arithmetic that
        # torch does not implement for float8_e4m3fn ("mul_cuda not implemented", run 19): ops that
        # take or return FP8 tensors get the other two checks only.
        outs = op(*args)
        outs = outs if isinstance(outs, (list, tuple)) else (outs,)
        has_fp8 = any(isinstance(t, torch.Tensor) and t.dtype in fp8 for t in (*args, *outs))
        utils = ("test_faketensor", "test_aot_dispatch_dynamic")
        torch.library.opcheck(op, args, test_utils=utils if has_fp8 else ("test_schema",) + utils)


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay():
    """Plan, gather-quantize, GEMM and the decode step captured in one CUDA graph; replays on new
    inputs give the eager results bit for bit."""
    seed = fresh_seed()
    x, w, ids = routed_problem()
    wr = torch.randn(8, 256, device=DEV).to(torch.bfloat16)
    w1 = (torch.randn(8, 256, 256, device=DEV) / 16).to(torch.bfloat16)
    w2q = mxmoe.quantize((torch.randn(8, 256, 128, device=DEV) / 16).to(torch.bfloat16)).rowwise
    xd = x[:4].clone()

    def step(x, ids, xd):
        y, padded, _ = moe_forward(x, w, ids)
        tid, tw = mxmoe.decode_router(xd, wr, 2)
        h = mxmoe.decode_gate_up(xd, w1, tid)
        out = mxmoe.decode_down(h, w2q.data, tid, tw, w2_scales=w2q.scales)
        return y, padded, out

    sx, sids, sxd = x.clone(), ids.clone(), xd.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (first-use initialisation)
        for _ in range(2):
            step(sx, sids, sxd)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gy, gpad, gout = step(sx, sids, sxd)

    for trial in range(2):
        nx, nw, nids = routed_problem()
        nxd = torch.randn(4, 256, device=DEV).to(torch.bfloat16)
        sx.copy_(nx)
        sids.copy_(nids)
        sxd.copy_(nxd)
        graph.replay()
        ey, epad, eout = step(nx, nids, nxd)
        torch.cuda.synchronize()
        used = int(epad[-1])
        what = f"graph replay {trial} (seed {seed})"
        assert_bytes_equal(gpad, epad, f"{what}: padded offsets")
        assert_bytes_equal(gy[:used], ey[:used], f"{what}: GEMM output")
        assert_bytes_equal(gout, eout, f"{what}: decode output")
