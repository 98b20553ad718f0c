"""Decode benchmark (include/mxmoe/decode.h): one MoE decode step with BF16 and MXFP8 weights, by
three mxmoe variants — warp decode (router → gate/up+SwiGLU → down+combine), the expert-centric
step (router → decode_expert_centric: plan, gather, grouped GEMMs, SwiGLU, combine) and
decode_step (the dispatcher: router, then whichever path the crossover table picks) — against a
conventional expert-centric decode step in plain PyTorch, all under CUDA graphs, in the same
process and run.

Baseline (BF16 weights): logits = x·Wrᵀ → softmax/sigmoid top-k (torch) → sort the (token, slot)
pairs by expert → gather x into segments padded to 16 rows (device-side offsets, no host sync) →
torch._grouped_mm (W1) → SwiGLU in BF16 → torch._grouped_mm (W2) → scale by the routing weight →
index_add into FP32 → (+ shared expert) → BF16.

Timing: each CUDA graph holds STEPS decode steps that rotate over COPIES copies of all weights,
so that consecutive steps never find their experts in L2 (60 MB); L2 is also flushed before each
rep (common.Timer). Per shape and batch the baseline's graph and the six mxmoe graphs (3 variants x
2 weight dtypes) are timed in alternation, rep by rep, in balanced orders (common.Timer.many; until
session 13 each graph was timed as its own block of reps). Time per step = median graph time / STEPS.
Effective bandwidth = distinct bytes touched per step (weights of the distinct routed experts +
shared expert + router weights) / time, against the device-to-device copy bandwidth measured in
the same run (common.copy_bandwidth).
Verification: each variant's timed output against the baseline run on the same routing (mxmoe's
ids and weights) — for MXFP8, the baseline runs on the dequantized weights of the routed experts —
relative Frobenius error < VERIFY_TOL (BF16 intermediates in the baseline: ~2^-8 per element), or
< VERIFY_TOL_MX_EC where MXFP8 weights run the expert-centric path (it quantizes x and H to MXFP8:
~5% expected, docs/notes/decode.md "Expert-centric path").
Also the fraction of tokens whose expert set agrees with the baseline's own router is printed.

Each line: shape | B | dtype | variant | path | us | GB/s | % copy | × baseline. At the end,
"crossover data" lines: the largest B at which warp decode beats the expert-centric step, per shape
and dtype — the values for the dispatcher's table in src/host/decode.cpp (kCrossovers) — and
per shape and dtype the worst decode_step ratio against the baseline over the batches run.
Usage: python3 bench/bench_decode.py [--json OUT.json] [--shapes Qwen3-30B,...] [--batches 1,2,4]
       [--reps 15] [--quick]
"""
import argparse
import ctypes
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Timer, capture_graph, check, copy_bandwidth, device_info, load_lib, print_table, ptr, require_gpu, write_json  # noqa: E402

BF16_W, MXFP8_W = 0, 1
H_FP32 = 0
VERIFY_TOL = 0.02
VERIFY_TOL_MX_EC = 0.10
WARP, EC, AUTO = "warp", "expert-centric", "decode_step"
MEM_BUDGET = 80e9   # bytes of weight copies per shape
STEPS = 8           # decode steps per graph
PAD = 16            # baseline segment padding (rows)

# (name, H, I, E, k, shared, sigmoid, n_groups, topk_groups, scaling)
SHAPES = [
    ("Qwen3-30B-A3B", 2048, 768, 128, 8, False, False, 1, 1, 1.0),
    ("Qwen3-235B-A22B", 4096, 1536, 128, 8, False, False, 1, 1, 1.0),
    ("DeepSeek-V3", 7168, 2048, 256, 8, True, True, 8, 4, 2.5),
]
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128]


def setup_lib(lib):
    vp, i32, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    lib.mxmoe_decode_router.argtypes = [vp, i32, i32, vp, i32, i32, i32, i32, i32, i32, f32, vp, vp, vp, vp]
    lib.mxmoe_decode_gate_up.argtypes = [vp, i32, i32, i32, i32, vp, vp, vp, vp, i32, vp, i32, vp, i32, vp]
    lib.mxmoe_decode_down.argtypes = [vp, i32, i32, i32, i32, i32, vp, vp, vp, vp, i32, vp, vp, i32, vp, vp]
    lib.mxmoe_decode_crossover.argtypes = [i32, i32, i32, i32, i32, i32, ctypes.POINTER(i32), ctypes.POINTER(i32)]
    i64, pi64 = ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)
    lib.mxmoe_decode_prepared_weights_bytes.argtypes = [i32, i32, i32, i32, pi64]
    lib.mxmoe_decode_prepare_weights.argtypes = [vp, vp, vp, vp, i32, i32, i32, vp, i64, vp]
    lib.mxmoe_decode_expert_centric.argtypes = [vp, i32, i32, i32, i32] + [vp] * 10 + [i32, vp, vp, i32, vp, vp, i64, vp]
    lib.mxmoe_decode_step_workspace_bytes.argtypes = [i32, i32, i32, i32, i32, i32, i32, pi64]
    lib.mxmoe_decode_step.argtypes = ([vp, i32, i32, i32, i32, i32, i32, vp, i32, i32, i32, i32, f32, vp, i32]
                                      + [vp] * 10 + [vp, vp, vp, vp, i64, ctypes.POINTER(i32), vp])
    for f in (lib.mxmoe_decode_router, lib.mxmoe_decode_gate_up, lib.mxmoe_decode_down, lib.mxmoe_decode_crossover,
              lib.mxmoe_decode_prepared_weights_bytes, lib.mxmoe_decode_prepare_weights,
              lib.mxmoe_decode_expert_centric, lib.mxmoe_decode_step_workspace_bytes, lib.mxmoe_decode_step):
        f.restype = i32


class Shape:
    def __init__(self, name, H, I, E, k, shared, sigmoid, n_groups, topk_groups, scaling):
        self.name, self.H, self.I, self.E, self.k = name, H, I, E, k
        self.shared, self.sigmoid = shared, sigmoid
        self.n_groups, self.topk_groups, self.scaling = n_groups, topk_groups, scaling
        self.S = k + (1 if shared else 0)


def quantize_mx(lib, w):
    """w bf16 [E, N, K] → (data uint8 [E, N, K], scales uint8 [E, N, K/32]) by mxmoe's quantizer."""
    E, N, K = w.shape
    data = torch.empty(E, N, K, dtype=torch.uint8, device="cuda")
    scales = torch.empty(E, N, K // 32, dtype=torch.uint8, device="cuda")
    null = ctypes.c_void_p(0)
    check(lib, lib.mxmoe_quantize_mxfp8(ptr(w), E, N, K, ptr(data), ptr(scales), null, null,
                                        null, null, null, null, 0, null))
    return data, scales


def prepare_mx(lib, sh, d, sc, shared, n, k):
    """The expert-centric path's prepared (fast GEMM) form of MX weights [E, n, k] (+ shared)."""
    nb = ctypes.c_int64(0)
    check(lib, lib.mxmoe_decode_prepared_weights_bytes(sh.E, n, k, int(shared is not None), ctypes.byref(nb)))
    buf = torch.empty(nb.value, dtype=torch.uint8, device="cuda")
    null = ctypes.c_void_p(0)
    check(lib, lib.mxmoe_decode_prepare_weights(ptr(d), ptr(sc), ptr(shared[0]) if shared else null,
                                                ptr(shared[1]) if shared else null, sh.E, n, k, ptr(buf),
                                                nb.value, null))
    return buf


def dequantize_mx(data, scales, experts=None):
    """Experts `experts` (default all) of [E, N, K] E4M3 + [E, N, K/32] E8M0 → BF16 [len, N, K]
    (exact: E4M3 × 2^e fits BF16 for these weights), one expert at a time to bound temporaries."""
    experts = list(range(data.shape[0])) if experts is None else experts
    out = torch.empty((len(experts),) + tuple(data.shape[1:]), dtype=torch.bfloat16, device=data.device)
    for i, e in enumerate(experts):
        vals = data[e].view(torch.float8_e4m3fn).float()
        s = torch.exp2(scales[e].float() - 127.0).repeat_interleave(32, dim=-1)
        out[i] = (vals * s).to(torch.bfloat16)
    return out


class Weights:
    """One copy of a layer's weights (BF16, and MX when asked)."""

    def __init__(self, sh, lib, mx, gen_seed):
        g = torch.Generator(device="cuda").manual_seed(gen_seed)
        H, I, E = sh.H, sh.I, sh.E
        self.w1 = (torch.randn(E, 2 * I, H, device="cuda", generator=g, dtype=torch.bfloat16) / math.sqrt(H))
        self.w2 = (torch.randn(E, H, I, device="cuda", generator=g, dtype=torch.bfloat16) / math.sqrt(I))
        self.s1 = self.s2 = None
        if sh.shared:
            self.s1 = torch.randn(1, 2 * I, H, device="cuda", generator=g, dtype=torch.bfloat16) / math.sqrt(H)
            self.s2 = torch.randn(1, H, I, device="cuda", generator=g, dtype=torch.bfloat16) / math.sqrt(I)
        self.mx = None
        if mx:
            d1, sc1 = quantize_mx(lib, self.w1)
            d2, sc2 = quantize_mx(lib, self.w2)
            s = (quantize_mx(lib, self.s1), quantize_mx(lib, self.s2)) if sh.shared else (None, None)
            self.mx = dict(d1=d1, sc1=sc1, d2=d2, sc2=sc2, s1=s[0], s2=s[1],
                           p1=prepare_mx(lib, sh, d1, sc1, s[0], 2 * I, H), p2=prepare_mx(lib, sh, d2, sc2, s[1], H, I))

    def args(self, which, dtype):
        """(data, scales, shared_data, shared_scales) pointers for W1 (which=1) or W2."""
        if dtype == BF16_W:
            w, s = (self.w1, self.s1) if which == 1 else (self.w2, self.s2)
            return ptr(w), ctypes.c_void_p(0), ptr(s), ctypes.c_void_p(0)
        m = self.mx
        d, sc = (m["d1"], m["sc1"]) if which == 1 else (m["d2"], m["sc2"])
        sh = m["s1"] if which == 1 else m["s2"]
        return ptr(d), ptr(sc), ptr(sh[0]) if sh else ctypes.c_void_p(0), ptr(sh[1]) if sh else ctypes.c_void_p(0)

    def args5(self, which, dtype):
        """args() plus the prepared form (null for BF16): a DecodeWeights of the C ABI."""
        p = ctypes.c_void_p(0) if dtype == BF16_W else ptr(self.mx["p1" if which == 1 else "p2"])
        return self.args(which, dtype) + (p,)


class Mxmoe:
    """Buffers and the launches of one mxmoe decode step, by variant (WARP, EC, AUTO)."""

    def __init__(self, lib, sh, B, dtype):
        self.lib, self.sh, self.B = lib, sh, B
        self.ids = torch.empty(B, sh.k, dtype=torch.int32, device="cuda")
        self.w = torch.empty(B, sh.k, dtype=torch.float32, device="cuda")
        self.h = torch.empty(B, sh.S, sh.I, dtype=torch.float32, device="cuda")
        self.out = torch.empty(B, sh.H, dtype=torch.bfloat16, device="cuda")
        nb = ctypes.c_int64(0)  # decode_step's workspace also serves decode_expert_centric
        check(lib, lib.mxmoe_decode_step_workspace_bytes(sh.H, sh.I, sh.E, sh.k, int(sh.shared), dtype, B,
                                                         ctypes.byref(nb)))
        self.ws = torch.empty(nb.value, dtype=torch.uint8, device="cuda")
        self.path = ctypes.c_int(-1)

    def step(self, variant, x, wr, bias, W, dtype, stream):
        if variant == AUTO:
            return self.step_auto(x, wr, bias, W, dtype, stream)
        self.router(x, wr, bias, stream)
        if variant == WARP:
            return self.step_warp(x, W, dtype, stream)
        return self.step_ec(x, W, dtype, stream)

    def router(self, x, wr, bias, stream):
        lib, sh, B = self.lib, self.sh, self.B
        check(lib, lib.mxmoe_decode_router(ptr(x), B, sh.H, ptr(wr), sh.E, sh.k, int(sh.sigmoid), 1,
                                           sh.n_groups, sh.topk_groups, sh.scaling, ptr(bias),
                                           ptr(self.ids), ptr(self.w), ctypes.c_void_p(stream)))

    def step_ec(self, x, W, dtype, stream):
        lib, sh, B = self.lib, self.sh, self.B
        check(lib, lib.mxmoe_decode_expert_centric(ptr(x), B, sh.H, sh.I, dtype, *W.args5(1, dtype),
                                                   *W.args5(2, dtype), sh.E, ptr(self.ids), ptr(self.w), sh.k,
                                                   ptr(self.out), ptr(self.ws), self.ws.numel(),
                                                   ctypes.c_void_p(stream)))

    def step_auto(self, x, wr, bias, W, dtype, stream):
        lib, sh, B = self.lib, self.sh, self.B
        check(lib, lib.mxmoe_decode_step(ptr(x), B, sh.H, sh.I, sh.E, sh.k, int(sh.shared), ptr(wr),
                                         int(sh.sigmoid), 1, sh.n_groups, sh.topk_groups, sh.scaling, ptr(bias),
                                         dtype, *W.args5(1, dtype), *W.args5(2, dtype), ptr(self.ids),
                                         ptr(self.w), ptr(self.out), ptr(self.ws), self.ws.numel(),
                                         ctypes.byref(self.path), ctypes.c_void_p(stream)))

    def step_warp(self, x, W, dtype, stream):
        lib, sh, B = self.lib, self.sh, self.B
        st = ctypes.c_void_p(stream)
        d, s, sd, ss = W.args(1, dtype)
        check(lib, lib.mxmoe_decode_gate_up(ptr(x), B, sh.H, sh.I, dtype, d, s, sd, ss, sh.E, ptr(self.ids),
                                            sh.k, ptr(self.h), H_FP32, st))
        d, s, sd, ss = W.args(2, dtype)
        check(lib, lib.mxmoe_decode_down(ptr(self.h), H_FP32, B, sh.I, sh.H, dtype, d, s, sd, ss, sh.E,
                                         ptr(self.ids), ptr(self.w), sh.k, ptr(self.out), st))


def torch_route(sh, x, wr, bias):
    logits = F.linear(x, wr).float()
    if not sh.sigmoid:
        probs = logits.softmax(-1)
        w, ids = probs.topk(sh.k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
    else:
        s = logits.sigmoid()
        sel = s + bias
        B = x.shape[0]
        gs = sel.view(B, sh.n_groups, -1).topk(2, dim=-1)[0].sum(-1)
        gidx = gs.topk(sh.topk_groups, dim=-1)[1]
        gmask = torch.zeros_like(gs).scatter_(1, gidx, 1.0)
        emask = gmask.unsqueeze(-1).expand(B, sh.n_groups, sh.E // sh.n_groups).reshape(B, sh.E)
        ids = sel.masked_fill(emask == 0, float("-inf")).topk(sh.k, dim=-1)[1]
        w = s.gather(1, ids)
        w = w / w.sum(-1, keepdim=True)
    return ids.to(torch.int32), (w * sh.scaling).float()


def torch_step(sh, x, wr, bias, w1, w2, s1, s2, ids=None, wts=None):
    """Conventional expert-centric decode step (BF16). ids/wts given: use that routing."""
    B, H, I, E, k = x.shape[0], sh.H, sh.I, w1.shape[0], sh.k
    if ids is None:
        ids, wts = torch_route(sh, x, wr, bias)
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    tok = order // k
    counts = torch.zeros(E, dtype=torch.long, device=x.device).index_add_(0, flat, torch.ones_like(flat))  # no host sync
    start = torch.cumsum(counts, 0) - counts
    padded = (counts + PAD - 1) // PAD * PAD
    pend = torch.cumsum(padded, 0)
    pstart = pend - padded
    e_sorted = flat[order]
    rank = torch.arange(B * k, device=x.device) - start[e_sorted]
    rows = pstart[e_sorted] + rank                       # padded row of each sorted pair
    M = B * k + E * (PAD - 1)
    xs = torch.zeros(M, H, dtype=torch.bfloat16, device=x.device)
    xs[rows] = x[tok]
    offs = pend.to(torch.int32)
    h13 = torch._grouped_mm(xs, w1.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16)
    h = F.silu(h13[:, :I]) * h13[:, I:]
    y = torch._grouped_mm(h, w2.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16)
    yw = y[rows].float() * wts.reshape(-1)[order].unsqueeze(1)
    out = torch.zeros(B, H, dtype=torch.float32, device=x.device).index_add_(0, tok, yw)
    if s1 is not None:
        hs = F.linear(x, s1[0])
        out += F.linear(F.silu(hs[:, :I]) * hs[:, I:], s2[0]).float()
    return out.to(torch.bfloat16)


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def expert_bytes(sh, dtype):
    per_elem = 2.0 if dtype == BF16_W else 1.0 + 1.0 / 32
    return 3 * sh.I * sh.H * per_elem


def run_shape(lib, sh, batches, timer, copy_bw, rows, results, crossover, worst_auto):
    H, E = sh.H, sh.E
    per_copy = E * 3 * sh.I * H * (2 + 1 + 1 / 32 + 1 + 1 / 128)  # BF16, MX, prepared fast form
    copies = int(max(2, min(4, MEM_BUDGET // per_copy)))
    Ws = [Weights(sh, lib, True, 1234 + c) for c in range(copies)]
    gr = torch.Generator(device="cuda").manual_seed(4321)  # the same routing in every run
    wr = torch.randn(E, H, device="cuda", dtype=torch.bfloat16, generator=gr) / math.sqrt(H)
    bias = (torch.randn(E, device="cuda", generator=gr) * 0.1) if sh.sigmoid else None
    stream = torch.cuda.Stream()
    gen = torch.Generator(device="cuda").manual_seed(7)
    for B in batches:
        x = torch.randn(B, H, device="cuda", dtype=torch.bfloat16, generator=gen)
        bl_out = [None]

        def baseline_steps():
            for s in range(STEPS):
                W = Ws[s % copies]
                bl_out[0] = torch_step(sh, x, wr, bias, W.w1, W.w2, W.s1, W.s2)

        g_base = capture_graph(baseline_steps, stream)
        base_ids, _ = torch_route(sh, x, wr, bias)
        # Every path's graph first, then the baseline and all of them timed in alternation
        # (Timer.many), then each output verified: a path's graph is replayed once more and its
        # output checked on the routing it computed.
        paths = []
        for dtype, variant in [(d, v) for d in (BF16_W, MXFP8_W) for v in (WARP, EC, AUTO)]:
            M = Mxmoe(lib, sh, B, dtype)

            def mx_steps(M=M, dtype=dtype, variant=variant):
                for s in range(STEPS):
                    M.step(variant, x, wr, bias, Ws[s % copies], dtype, stream.cuda_stream)

            paths.append((dtype, variant, M, capture_graph(mx_steps, stream)))
        all_times = timer.many([(None, g_base.replay)] + [(None, g.replay) for _, _, _, g in paths])
        t_base = all_times[0] / STEPS
        times = {}
        for (dtype, variant, M, g), t in zip(paths, all_times[1:]):
            t /= STEPS
            # Verify the timed output (last step used copy (STEPS-1) % copies) on the same routing.
            W = Ws[(STEPS - 1) % copies]
            g.replay()
            torch.cuda.synchronize()
            ids, wts = M.ids.clone(), M.w.clone()
            if dtype == BF16_W:
                ref = torch_step(sh, x, wr, bias, W.w1, W.w2, W.s1, W.s2, ids, wts)
            else:  # dequantized weights of the routed experts only, ids remapped
                used = torch.unique(ids.long())
                remap = torch.full((E,), -1, dtype=torch.long, device="cuda")
                remap[used] = torch.arange(used.numel(), device="cuda")
                m = W.mx
                ul = used.tolist()
                w1 = dequantize_mx(m["d1"], m["sc1"], ul)
                w2 = dequantize_mx(m["d2"], m["sc2"], ul)
                s1 = dequantize_mx(*m["s1"]) if sh.shared else None
                s2 = dequantize_mx(*m["s2"]) if sh.shared else None
                ref = torch_step(sh, x, wr, bias, w1, w2, s1, s2, remap[ids.long()].to(torch.int32), wts)
            err = rel_err(M.out, ref)
            path = {WARP: 0, EC: 1, AUTO: M.path.value}[variant]
            path_name = "warp" if path == 0 else "expert-centric"
            ok = err < (VERIFY_TOL_MX_EC if dtype == MXFP8_W and path == 1 else VERIFY_TOL)
            agree = (torch.sort(ids, -1)[0] == torch.sort(base_ids, -1)[0]).all(-1).float().mean().item()
            distinct = torch.unique(ids).numel()
            nbytes = distinct * expert_bytes(sh, dtype) + (expert_bytes(sh, dtype) if sh.shared else 0) + E * H * 2
            gbs = nbytes / (t * 1e-6) / 1e9
            name = "bf16" if dtype == BF16_W else "mxfp8"
            rows.append([sh.name, B, name, variant, path_name, f"{t:.1f}", f"{gbs:.0f}", f"{100 * gbs / copy_bw:.1f}",
                         f"{t_base / t:.2f}", f"{t_base:.1f}", f"{err:.4f}" + ("" if ok else " FAIL"), f"{agree:.2f}"])
            results.append(dict(shape=sh.name, batch=B, dtype=name, variant=variant, path=path_name, us=t,
                                baseline_us=t_base, gbs=gbs, pct_copy=100 * gbs / copy_bw, speedup=t_base / t,
                                distinct_experts=distinct, bytes=nbytes, rel_err=err, verified=ok,
                                routing_agreement=agree))
            times[(dtype, variant)] = t
            if variant == AUTO:
                prev = worst_auto.get((sh.name, name))
                if prev is None or t_base / t < prev[0]:
                    worst_auto[(sh.name, name)] = (t_base / t, B, path_name)
            if not ok:
                print(f"VERIFY FAILED: {sh.name} B={B} {name} {variant}: rel err {err:.4f}", file=sys.stderr)
            if variant == AUTO:  # warp decode against the expert-centric step: the dispatcher's choice
                crossover.setdefault((sh.name, name), []).append(
                    (B, times[(dtype, WARP)] < times[(dtype, EC)]))
        del paths
        del g_base
        torch.cuda.synchronize()
    del Ws
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--shapes", default=",".join(s[0] for s in SHAPES))
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="Qwen3-30B only, batches 1, 8, 64")
    args = ap.parse_args()
    require_gpu()
    lib = load_lib()
    setup_lib(lib)
    timer = Timer(reps=args.reps)
    copy_bw = copy_bandwidth(timer)
    shapes = [Shape(*s) for s in SHAPES if s[0] in args.shapes.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    if args.quick:
        shapes, batches = shapes[:1], [1, 8, 64]
    print(f"device: {device_info()}  copy bandwidth: {copy_bw:.0f} GB/s")
    rows, results, crossover, worst_auto = [], [], {}, {}
    for sh in shapes:
        run_shape(lib, sh, batches, timer, copy_bw, rows, results, crossover, worst_auto)
    print_table("mxmoe decode step (warp decode, expert-centric, decode_step) vs conventional PyTorch decode step, "
                "CUDA graphs",
                ["shape", "B", "weights", "variant", "path", "us", "GB/s", "% copy", "x baseline", "baseline us",
                 "rel err", "routing agree"], rows)
    print("\ncrossover data (for kCrossovers in src/host/decode.cpp): largest B with warp decode faster than the "
          "expert-centric step (below the first B where it is slower)")
    table = {}
    for (shape, name), wins in crossover.items():
        faster = [B for B, w in wins if w]
        first_loss = next((B for B, w in sorted(wins) if not w), None)
        best = max([B for B, w in sorted(wins) if first_loss is None or B < first_loss], default=0)
        sh = next(s for s in shapes if s.name == shape)
        mb, ms = ctypes.c_int(0), ctypes.c_int(0)
        check(lib, lib.mxmoe_decode_crossover(sh.H, sh.I, sh.E, sh.k, int(sh.shared), 0 if name == "bf16" else 1,
                                              ctypes.byref(mb), ctypes.byref(ms)))
        print(f"  {shape:16s} {name:6s}: warp decode wins up to B = {best} (wins at {faster}); "
              f"table now: {mb.value} ({'measured' if ms.value else 'not yet measured'})")
        table[f"{shape}/{name}"] = best
    print(f"\ndecode_step against the baseline, worst over B in {batches}:")
    worst = {}
    for (shape, name), (ratio, B, path_name) in worst_auto.items():
        print(f"  {shape:16s} {name:6s}: worst decode_step ratio {ratio:.2f}x the baseline at B = {B} ({path_name})"
              + ("" if ratio >= 1.0 else "  SLOWER than the baseline"))
        worst[f"{shape}/{name}"] = dict(ratio=ratio, batch=B, path=path_name)
    write_json(args.json, dict(device=device_info(), copy_gbs=copy_bw, steps_per_graph=STEPS, results=results,
                               crossover=table, worst_decode_step=worst))
    if not all(r["verified"] for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
