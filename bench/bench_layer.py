"""MoE training layer benchmark: mxmoe's MXFP8 layer (forward, forward + backward; fast and exact
GEMM modes, fast with 128x128-block operands) against a plain-PyTorch BF16 layer (torch._grouped_mm, index operations, autograd),
in this process and run, on Qwen3-30B-A3B and DeepSeek-V3 EP8-local shapes at T = 16384 tokens,
uniform and skewed routing.

Each line: shape | routing | impl | fwd ms | fwd+bwd ms | effective TFLOP/s (fwd+bwd) |
x baseline (fwd+bwd) | peak memory GB | output check. The baseline's routing logits are FP32 like
mxmoe's, so both route the same tokens to the same experts up to FP32 ties; mxmoe's output and
dx are checked against the baseline's within MXFP8's error (relative Frobenius < 0.1).
Writes --json and a PNG chart next to it. Usage: python3 bench/bench_layer.py [--json OUT.json] [--quick]
[--shapes NAME,...] [--modes fast,exact,fast-blk,fast-wblk] [--variant ENV=VAL[,ENV=VAL...]]... [--kernels]
The mode fast-blk (in the default list since run 84; opt-in in the library) is the fast mode with both
128x128-block forms: the weights (MoeLayerConfig::weight_fast_layout = kBlock128: quantized to plain MX,
rebased per 128x128 block, the four weight GEMMs on the block form) and the wgrad activations
(activation_fast_layout = kBlock128: the column-wise copies of x and Hact rebased per 128 rows x 128
tokens, the two wgrad GEMMs on the block form); docs/notes/layer.md "Block-form weights". Until
session 11's last commits fast-blk meant the weights alone: that is now fast-wblk (not in the default
list; --modes fast,fast-wblk,fast-blk compares the three in one run). Every mode is timed in the same
alternation and checked against the baseline the same way.
--variant adds, per mode, a row of mxmoe run with those environment variables set (e.g.
MXMOE_GEMM_TILE=192), in the same process, for A/B comparisons against the default row.
--kernels also prints, per mxmoe row, the GPU time of every kernel of one step (torch.profiler's
CUDA activity, which sees the library's launches too): the split behind each profiled stage.
"""
import argparse
import ctypes
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (Timer, check, device_info, kernel_env, load_lib, print_table, ptr, require_gpu,  # noqa: E402
                    write_json)

PAD = 16  # rows per expert segment for torch._grouped_mm's alignment
# (name, H, I, E, k, scoring, scaling): DESIGN.md §6
SHAPES = [("Qwen3-30B-A3B", 2048, 768, 128, 8, 0, 1.0), ("DSV3-EP8-local", 7168, 2048, 32, 8, 1, 2.5)]


def setup(lib):
    vp, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    lib.mxmoe_layer_create.argtypes = [i32, i32, i32, i32, i32, i32, i32, f32, vp, i32, i64, ctypes.POINTER(vp)]
    lib.mxmoe_layer_create_ex.argtypes = [i32, i32, i32, i32, i32, i32, i32, f32, vp, i32, i64, i32, i32,
                                          ctypes.POINTER(vp)]
    lib.mxmoe_layer_destroy.argtypes = [vp]
    lib.mxmoe_layer_workspace_bytes.argtypes = [vp]
    lib.mxmoe_layer_workspace_bytes.restype = i64
    lib.mxmoe_layer_forward.argtypes = [vp, vp, i64, vp, vp, vp, vp, vp]
    lib.mxmoe_layer_backward.argtypes = [vp, vp, vp, vp, vp, vp, vp, vp, vp]
    lib.mxmoe_layer_set_profiling.argtypes = [vp, i32]
    lib.mxmoe_layer_stage_times.argtypes = [vp, ctypes.c_char_p, i32, ctypes.POINTER(f32), i32, ctypes.POINTER(i32)]


def stage_times(lib, h):
    names = ctypes.create_string_buffer(4096)
    ms = (ctypes.c_float * 64)()
    n = ctypes.c_int()
    check(lib, lib.mxmoe_layer_stage_times(h, names, 4096, ms, 64, ctypes.byref(n)))
    return list(zip(names.value.decode().split("\n")[: n.value], list(ms)[: n.value]))


def short_kernel_name(n):
    """A kernel's name without return type, namespaces and parameter list (template arguments kept)."""
    n = n.replace("void ", "").replace("(anonymous namespace)::", "")
    n = n.replace("mxmoe::detail::", "").replace("mxmoe::gemm_sm90::", "")
    depth = 0
    for i, ch in enumerate(n):
        depth += (ch == "<") - (ch == ">")
        if ch == "(" and depth == 0 and i > 0:
            n = n[:i]
            break
    return n if len(n) <= 100 else n[:97] + "..."


def torch_layer(x, wr, w1, w2, k, scoring, scaling, bias):
    """Plain-PyTorch BF16 MoE layer; differentiable in x, wr, w1, w2."""
    T, H = x.shape
    E, I2, _ = w1.shape
    I = I2 // 2
    logits = x.float() @ wr.float().t()
    if scoring == 0:
        p = logits.softmax(-1)
        w, ids = p.topk(k, dim=-1)
    else:
        s = logits.sigmoid()
        ids = (s + bias).topk(k, dim=-1).indices
        w = s.gather(1, ids)
    w = w / w.sum(-1, keepdim=True) * scaling
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    tok = order // k
    counts = torch.zeros(E, dtype=torch.long, device=x.device).index_add_(0, flat, torch.ones_like(flat))
    start = torch.cumsum(counts, 0) - counts
    padded = (counts + PAD - 1) // PAD * PAD
    pend = torch.cumsum(padded, 0)
    pstart = pend - padded
    e_sorted = flat[order]
    rows = pstart[e_sorted] + torch.arange(T * k, device=x.device) - start[e_sorted]
    M = T * k + E * (PAD - 1)
    xs = torch.zeros(M, H, dtype=torch.bfloat16, device=x.device).index_copy(0, rows, x[tok])
    offs = pend.to(torch.int32)
    h13 = torch._grouped_mm(xs, w1.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16)
    h = F.silu(h13[:, :I]) * h13[:, I:]
    y = torch._grouped_mm(h, w2.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16)
    yw = y[rows].float() * w.reshape(-1)[order].unsqueeze(1)
    out = torch.zeros(T, H, dtype=torch.float32, device=x.device).index_add(0, tok, yw)
    return out.to(torch.bfloat16)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="T = 4096, uniform routing only")
    ap.add_argument("--shapes", default=None, help="comma-separated subset of: " + ", ".join(s[0] for s in SHAPES))
    ap.add_argument("--modes", default="fast,exact,fast-blk",
                    help="comma-separated subset of: fast, exact, fast-blk (fast with 128x128-block weights and "
                         "wgrad activations), fast-wblk (fast with 128x128-block weights only)")
    ap.add_argument("--kernels", action="store_true", help="per-kernel GPU times of one step (torch.profiler)")
    ap.add_argument("--variant", action="append", default=[],
                    help="ENV=VAL[,ENV=VAL...]: also run each mode with these environment variables set")
    args = ap.parse_args()
    shapes = SHAPES
    if args.shapes:
        want = args.shapes.split(",")
        unknown = [w for w in want if w not in [s[0] for s in SHAPES]]
        if unknown:
            sys.exit(f"bench_layer: unknown --shapes {unknown}; known: {[s[0] for s in SHAPES]}")
        shapes = [s for s in SHAPES if s[0] in want]
    # (GEMM mode, weight_fast_layout, activation_fast_layout)
    mode_ids = {"fast": (0, 0, 0), "exact": (1, 0, 0), "fast-blk": (0, 1, 1), "fast-wblk": (0, 1, 0)}
    modes = args.modes.split(",")
    if any(m not in mode_ids for m in modes):
        sys.exit(f"bench_layer: --modes takes a subset of {list(mode_ids)}, got {args.modes!r}")
    variants = [None]  # None: the environment as it is
    for v in args.variant:
        pairs = [kv.split("=", 1) for kv in v.split(",")]
        if any(len(kv) != 2 or not kv[0] for kv in pairs):
            sys.exit(f"bench_layer: --variant takes ENV=VAL[,ENV=VAL...], got {v!r}")
        variants.append(dict(pairs))
    if args.kernels:
        from torch.profiler import ProfilerActivity, profile
    require_gpu()
    lib = load_lib()
    setup(lib)
    timer = Timer(warmup=2, reps=5 if args.quick else 10)
    T = 4096 if args.quick else 16384
    results = {"device": device_info(), "tokens": T, "rows": []}
    table = []
    torch.manual_seed(0)
    for name, H, I, E, k, scoring, scaling in shapes:
        for skewed in ([False] if args.quick else [False, True]):
            dev = "cuda"
            x = (torch.randn(T, H, device=dev) + (0.5 if skewed else 0.0)).to(torch.bfloat16)
            wr = (torch.randn(E, H, device=dev) * 0.02)
            if skewed:
                wr[:4] += 0.002  # 4 hot experts: the shifted tokens favour them
            wr = wr.to(torch.bfloat16)
            w1 = (torch.randn(E, 2 * I, H, device=dev) / H ** 0.5).to(torch.bfloat16)
            w2 = (torch.randn(E, H, I, device=dev) / I ** 0.5).to(torch.bfloat16)
            bias = torch.zeros(E, device=dev)
            dout = torch.randn(T, H, device=dev).to(torch.bfloat16)
            routing = "skewed" if skewed else "uniform"
            flops_fwd = 6.0 * T * k * H * I + 2.0 * T * E * H
            flops = 3 * flops_fwd

            # ---- baseline: plain PyTorch BF16 with autograd
            params = [t.clone().requires_grad_(True) for t in (x, wr, w1, w2)]

            def base_fwd():
                return torch_layer(*params, k, scoring, scaling, bias)

            def base_step():
                out = base_fwd()
                out.backward(dout)

            torch.cuda.reset_peak_memory_stats()
            base_out = base_fwd()
            base_out.backward(dout)
            base_dx = params[0].grad.clone()
            base_peak = torch.cuda.max_memory_allocated() / 1e9

            # ---- mxmoe, fast and exact (and fast-blk): every row's layer made and checked first, then the baseline
            # and all rows timed in alternation (Timer.many: rep r of every call before rep r + 1, so
            # a drift of the GPU's clocks over the run affects every row alike)
            def make_impl(mode_layout, mname, env):
                mode, layout, act_layout = mode_layout
                if env:
                    mname += " [" + ",".join(f"{a}={b}" for a, b in env.items()) + "]"
                im = {"name": mname, "env": env}
                with kernel_env(env):  # read by the library per call (getenv)
                    h = ctypes.c_void_p()
                    check(lib, lib.mxmoe_layer_create_ex(H, I, E, k, scoring, 1, 1, scaling,
                                                         ptr(bias) if scoring == 1 else None, mode, T, layout,
                                                         act_layout, ctypes.byref(h)))
                    im["h"] = h
                    out = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
                    dx = torch.empty_like(out)
                    dwr = torch.empty(E, H, device=dev)
                    dw1 = torch.empty(E, 2 * I, H, device=dev)
                    dw2 = torch.empty(E, H, I, device=dev)
                    im["tensors"] = (x, wr, w1, w2, out, dx, dwr, dw1, dw2, dout)
                    stream = torch.cuda.current_stream().cuda_stream

                    def fwd():
                        check(lib, lib.mxmoe_layer_forward(h, ptr(x), T, ptr(wr), ptr(w1), ptr(w2), ptr(out), stream))

                    def step():
                        fwd()
                        check(lib, lib.mxmoe_layer_backward(h, ptr(dout), ptr(x), ptr(wr), ptr(dx), ptr(dwr),
                                                            ptr(dw1), ptr(dw2), stream))
                    im["fwd"], im["step"] = fwd, step
                    step()
                    torch.cuda.synchronize()
                    im["e_out"], im["e_dx"] = rel(out, base_out), rel(dx, base_dx)
                return im

            # Every row's layer (workspace, outputs, FP32 weight gradients) stays alive while the rows are
            # timed in alternation: peak memory is the sum over rows (DSV3-EP8, T = 16384: ~25-29 GB a
            # row, about 5.6 GB of it the FP32 dW1/dW2), so keep --modes / --variant few on big shapes.
            impls = [make_impl(mode_ids[m], f"mxmoe {m}", v) for m in modes for v in variants]
            fwd_times = timer.many([(None, base_fwd)] + [(im["env"], im["fwd"]) for im in impls])
            step_times = timer.many([(None, base_step)] + [(im["env"], im["step"]) for im in impls])
            for p in params:
                p.grad = None
            t_base_f, t_base = fwd_times[0], step_times[0]
            table.append([name, routing, "torch BF16", f"{t_base_f / 1e3:.2f}", f"{t_base / 1e3:.2f}",
                          f"{flops / (t_base * 1e-6) / 1e12:.0f}", "1.00", f"{base_peak:.1f}", "-"])
            results["rows"].append(dict(shape=name, routing=routing, impl="torch-bf16", fwd_us=t_base_f, step_us=t_base,
                                        peak_gb=base_peak))
            for im, t_f, t_s in zip(impls, fwd_times[1:], step_times[1:]):
                mname, h, step = im["name"], im["h"], im["step"]
                e_out, e_dx = im["e_out"], im["e_dx"]
                ok = e_out < 0.1 and e_dx < 0.1
                with kernel_env(im["env"]):
                    check(lib, lib.mxmoe_layer_set_profiling(h, 1))  # one profiled step: per-stage breakdown
                    step()
                    stages = stage_times(lib, h)
                    check(lib, lib.mxmoe_layer_set_profiling(h, 0))
                    if args.kernels:
                        torch.cuda.synchronize()
                        with profile(activities=[ProfilerActivity.CUDA]) as prof:
                            step()
                            torch.cuda.synchronize()
                        kern = sorted((ev.time_range.start, ev.time_range.elapsed_us(), ev.name) for ev in prof.events()
                                      if ev.device_type == torch.autograd.DeviceType.CUDA)
                        print_table(f"{name} {routing} {mname}: GPU kernels of one step in launch order (torch.profiler)",
                                    ["#", "kernel", "ms"],
                                    [[i, short_kernel_name(n), f"{us / 1e3:.3f}"] for i, (_, us, n) in enumerate(kern)])
                ws = lib.mxmoe_layer_workspace_bytes(h)
                peak = (ws + sum(t.numel() * t.element_size() for t in im["tensors"])) / 1e9
                check(lib, lib.mxmoe_layer_destroy(h))
                table.append([name, routing, mname, f"{t_f / 1e3:.2f}", f"{t_s / 1e3:.2f}",
                              f"{flops / (t_s * 1e-6) / 1e12:.0f}", f"{t_base / t_s:.2f}", f"{peak:.1f}",
                              f"out {e_out:.3f} dx {e_dx:.3f}" + ("" if ok else " FAIL")])
                results["rows"].append(dict(shape=name, routing=routing, impl=mname, fwd_us=t_f, step_us=t_s,
                                            speedup=t_base / t_s, peak_gb=peak, rel_err_out=e_out, rel_err_dx=e_dx,
                                            verified=ok, stages_ms=stages))
                print_table(f"{name} {routing} {mname}: stages of one step (CUDA events)", ["stage", "ms"],
                            [[sn, f"{sm:.3f}"] for sn, sm in stages])
            del impls
            del params, base_out, base_dx
            torch.cuda.empty_cache()

    print_table(f"MoE layer, T = {T}: mxmoe MXFP8 vs plain-PyTorch BF16 (same run); peak memory: mxmoe = workspace "
                "+ tensors, torch = max_memory_allocated",
                ["shape", "routing", "impl", "fwd ms", "fwd+bwd ms", "TFLOP/s", "x baseline", "peak GB", "check"], table)
    write_json(args.json, results)
    if args.json:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            labels = [f"{r['shape']}\n{r['routing']}\n{r['impl']}" for r in results["rows"]]
            fig, ax = plt.subplots(figsize=(max(8, len(labels) * 1.2), 4))
            ax.bar(range(len(labels)), [r["step_us"] / 1e3 for r in results["rows"]], label="fwd+bwd")
            ax.bar(range(len(labels)), [r["fwd_us"] / 1e3 for r in results["rows"]], label="fwd")
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels(labels, fontsize=7)
            ax.set_ylabel("ms")
            ax.legend()
            fig.tight_layout()
            fig.savefig(os.path.splitext(args.json)[0] + ".png", dpi=120)
        except Exception as e:  # the chart is a convenience; the table and JSON are the result
            print("chart not written:", e, file=sys.stderr)
    if not all(r.get("verified", True) for r in results["rows"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
