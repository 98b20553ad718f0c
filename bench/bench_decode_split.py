"""Where a warp-decode step's time goes, and A/B of the decode switches (docs/notes/decode.md,
session 8). Per (shape, B, weights, switch setting), CUDA graphs of STEPS chained launches
over COPIES weight copies (cold L2, as bench_decode.py), L2 flushed before each rep, median:
  step  router -> gate/up -> down (as decode_step's warp-decode path)
  R     router alone;  R+G  router -> gate/up;  G  gate/up alone;  D  down alone (ids, h fixed)
and per-kernel rates: G's W1 bytes / G, D's W2 bytes / D against the copy bandwidth measured here.
Marginals: +G = (R+G) - R, +D = step - (R+G). Every setting's ids, routing weights and output are
compared bit for bit with the first setting's (the switches must not change results). Shapes with a
shared expert and sigmoid routing (DeepSeek-V3) run with them (bias, groups, scaling).
Settings: NAME:VAR=VAL,VAR=VAL;... (default: "new:" = library defaults, "old:" = the MXFP8 gate/up
at 2 CTAs a SM, as before session 8).
--ncu: one eager step per dtype (Qwen3-30B B = 1 unless --shapes/--batches), for
  ncu -k regex:warp_decode (see scripts/decode_ab.sh).
--fused: per (shape, B <= 8, dtype, setting) also the fused step (decode_step_fused: one persistent
  kernel, docs/notes/decode.md "fused step"), timed the same way, its ids, routing weights and
  output compared bit for bit with the three-kernel step of the same setting ("fused ... bitwise").
  The fused step's switches (MXMOE_DECODE_FUSED_W2_PREFETCH, _WR_PREFETCH, _COOP) go in --settings.
--settings down / down-short: the down kernel's design-space switches (DOWN_SETTINGS, docs/notes/decode.md
  session 11); with --split-kinds D the down kernel alone is timed too ("D ... x" = the first setting's
  D time / this setting's).
Timing: per (shape, weights, B) every setting's graphs are captured first (each under its switches),
then all are timed in alternation (common.Timer.many), so clock drift does not favour one setting.
Usage: python3 bench/bench_decode_split.py [--shapes ...] [--batches 1,2,8] [--split-batches 1]
       [--split-kinds R,R+G,G,D] [--settings ...] [--reps 15] [--ncu] [--fused] [--dtypes bf16,mxfp8]
       [--probe I=64]
"""
import argparse
import ctypes
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_decode import BF16_W, H_FP32, MXFP8_W, SHAPES, STEPS, Shape, quantize_mx, setup_lib  # noqa: E402
from common import Timer, capture_graph, check, copy_bandwidth, kernel_env, load_lib, ptr, require_gpu  # noqa: E402

OLD = {"MXMOE_DECODE_MX_GATE_UP_CTAS": "2"}
DEFAULT_SETTINGS = "new:;old:" + ",".join(f"{k}={v}" for k, v in OLD.items())


# The down kernel's design-space switches (MXMOE_DECODE_DOWN_*, docs/notes/decode.md session 11): every
# setting must give the default's bits (checked below on ids, routing weights and out). Register counts
# (MXFP8 / BF16, FP32 h): default kernel 106 / 89; the sweep kernel at 4 rows x unroll 2 115 / 91.
_D = "MXMOE_DECODE_DOWN_"
DOWN_SETTINGS = ";".join([
    "default:",
    f"u1:{_D}UNROLL=1",                                   # 72 / 56 regs: 3 / 4 CTAs of 8 warps a SM
    f"r8u1:{_D}ROWS=8,{_D}UNROLL=1",                       # h read once for 8 rows; 95 / 72 regs
    f"r8u1-reg80:{_D}ROWS=8,{_D}UNROLL=1,{_D}REGS=80",     # 80 / 72 regs, no spills: 24 warps a SM
    f"r16:{_D}ROWS=16",                                    # 16 loads in flight; MXFP8 spills 80 B
    f"r8u1-reg64:{_D}ROWS=8,{_D}UNROLL=1,{_D}REGS=64",     # 64 / 64 regs, no spills: 32 warps a SM (27 at S = 9)
    f"p2:{_D}PERSIST=2",
    f"p2-pf:{_D}PERSIST=2,{_D}PREFETCH=1",
    f"srow:{_D}SCALES=row",
    f"best-guess:{_D}ROWS=8,{_D}UNROLL=1,{_D}REGS=80,{_D}PERSIST=3,{_D}PREFETCH=1,{_D}SCALES=row",
])
DOWN_SETTINGS_SHORT = ";".join(DOWN_SETTINGS.split(";")[i] for i in (0, 1, 3, 5, 4, 7, 9))  # 7 of the 10
PRESETS = {"down": DOWN_SETTINGS, "down-short": DOWN_SETTINGS_SHORT}
SPLIT_KINDS = {"R": ("router",), "R+G": ("router", "gate_up"), "G": ("gate_up",), "D": ("down",)}

FUSED_MAX_BATCH = 8


def setup_fused(lib):
    vp, i32, i64, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
    lib.mxmoe_decode_step_fused_workspace_bytes.argtypes = [i32] * 6 + [ctypes.POINTER(i64)]
    lib.mxmoe_decode_step_fused_init_workspace.argtypes = [vp, i64, vp]
    lib.mxmoe_decode_step_fused.argtypes = ([vp, i32, i32, i32, i32, i32, i32, vp, i32, i32, i32, i32, f32, vp, i32]
                                            + [vp] * 8 + [vp, vp, vp, vp, i64, vp])
    for f in (lib.mxmoe_decode_step_fused_workspace_bytes, lib.mxmoe_decode_step_fused_init_workspace,
              lib.mxmoe_decode_step_fused):
        f.restype = i32


def parse_settings(s):
    out = []
    for item in s.split(";"):
        name, _, kv = item.partition(":")
        env = dict(p.split("=", 1) for p in kv.split(",") if p)
        out.append((name, env))
    return out


class W:  # one weight copy: BF16 or MX (not both, to fit more copies); + the shared expert
    def __init__(self, lib, sh, dtype, seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        null = ctypes.c_void_p(0)
        self.keep, args = [], []
        for n, k, e in ((2 * sh.I, sh.H, sh.E), (sh.H, sh.I, sh.E), (2 * sh.I, sh.H, 1), (sh.H, sh.I, 1)):
            if e == 1 and not sh.shared:
                args.append((null, null))
                continue
            w = torch.randn(e, n, k, device="cuda", generator=g, dtype=torch.bfloat16) / math.sqrt(k)
            if dtype == BF16_W:
                self.keep.append(w)
                args.append((ptr(w), null))
            else:
                d, sc = quantize_mx(lib, w)
                del w
                self.keep += [d, sc]
                args.append((ptr(d), ptr(sc)))
        self.a1 = args[0] + args[2]  # (data, scales, shared_data, shared_scales)
        self.a2 = args[1] + args[3]


class Step:
    def __init__(self, lib, sh, B, dtype, x, wr, bias):
        self.lib, self.sh, self.B, self.dtype, self.x, self.wr, self.bias = lib, sh, B, dtype, x, wr, bias
        self.ids = torch.zeros(B, sh.k, dtype=torch.int32, device="cuda")
        self.w = torch.zeros(B, sh.k, dtype=torch.float32, device="cuda")
        self.h = torch.zeros(B, sh.S, sh.I, dtype=torch.float32, device="cuda")
        self.out = torch.zeros(B, sh.H, dtype=torch.bfloat16, device="cuda")
        self.ws = None

    def fused(self, Wc, st):
        sh, lib = self.sh, self.lib
        if self.ws is None:  # workspace for this batch, initialised once (eager, before any capture)
            n = ctypes.c_int64(0)
            check(lib, lib.mxmoe_decode_step_fused_workspace_bytes(sh.H, sh.I, sh.E, sh.k, int(sh.shared), self.B,
                                                                  ctypes.byref(n)))
            self.ws = torch.empty(n.value, dtype=torch.uint8, device="cuda")
            check(lib, lib.mxmoe_decode_step_fused_init_workspace(ptr(self.ws), n.value, st))
        check(lib, lib.mxmoe_decode_step_fused(
            ptr(self.x), self.B, sh.H, sh.I, sh.E, sh.k, int(sh.shared), ptr(self.wr), int(sh.sigmoid), 1,
            sh.n_groups, sh.topk_groups, sh.scaling, ptr(self.bias), self.dtype, *Wc.a1, *Wc.a2, ptr(self.ids),
            ptr(self.w), ptr(self.out), ptr(self.ws), self.ws.numel(), st))

    def router(self, Wc, st):
        sh = self.sh
        check(self.lib, self.lib.mxmoe_decode_router(
            ptr(self.x), self.B, sh.H, ptr(self.wr), sh.E, sh.k, int(sh.sigmoid), 1, sh.n_groups, sh.topk_groups,
            sh.scaling, ptr(self.bias), ptr(self.ids), ptr(self.w), st))

    def gate_up(self, Wc, st):
        sh = self.sh
        check(self.lib, self.lib.mxmoe_decode_gate_up(ptr(self.x), self.B, sh.H, sh.I, self.dtype, *Wc.a1, sh.E,
                                                      ptr(self.ids), sh.k, ptr(self.h), H_FP32, st))

    def down(self, Wc, st):
        sh = self.sh
        check(self.lib, self.lib.mxmoe_decode_down(ptr(self.h), H_FP32, self.B, sh.I, sh.H, self.dtype, *Wc.a2,
                                                   sh.E, ptr(self.ids), ptr(self.w), sh.k, ptr(self.out), st))


def same(a, b):  # tuples of tensors, bit for bit
    return all(torch.equal(x.view(torch.uint8) if x.dtype != torch.int32 else x,
                           y.view(torch.uint8) if y.dtype != torch.int32 else y) for x, y in zip(a, b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="Qwen3-30B-A3B,Qwen3-235B-A22B")
    ap.add_argument("--batches", default="1,2,8")
    ap.add_argument("--split-batches", default="1", help="batches that also get the per-kernel split")
    ap.add_argument("--split-kinds", default="R,R+G,G,D",
                    help="kernels timed alone at --split-batches (subset of R,R+G,G,D; e.g. D for the down sweep)")
    ap.add_argument("--settings", default=DEFAULT_SETTINGS,
                    help="NAME:VAR=VAL,...;... or a preset: " + ", ".join(PRESETS))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--fused", action="store_true", help="also time the fused step (B <= 8), bitwise vs step")
    ap.add_argument("--dtypes", default="bf16,mxfp8", help="weight dtypes (bf16, mxfp8)")
    ap.add_argument("--probe", default="",
                    help="fixed-cost probe: H=..,I=.. replaces each shape's hidden and/or intermediate size "
                         "(e.g. I=64: gate/up and down stream almost nothing, so their times are fixed costs; "
                         "H=256: the router's Wr stream shrinks likewise); also E=, sigmoid=0|1, groups=, "
                         "tgroups=, shared=0|1 (routing); the name gets the suffix")
    args = ap.parse_args()
    require_gpu()
    lib = load_lib()
    setup_lib(lib)
    setup_fused(lib)
    shapes = [Shape(*s) for s in SHAPES if s[0] in args.shapes.split(",")]
    for sh in shapes if args.probe else []:
        for kv in args.probe.split(","):
            key, val = kv.split("=")
            attr = {"H": "H", "I": "I", "E": "E", "sigmoid": "sigmoid", "groups": "n_groups",
                    "tgroups": "topk_groups", "shared": "shared"}.get(key)
            if attr is None or int(val) < 0 or (key in ("H", "I", "E") and (int(val) % 32 or int(val) == 0)):
                sys.exit("--probe: H=N, I=N, E=N (positive multiples of 32), sigmoid=0|1, groups=N, tgroups=N, shared=0|1")
            setattr(sh, attr, bool(int(val)) if key in ("sigmoid", "shared") else int(val))
        sh.S = sh.k + (1 if sh.shared else 0)
        sh.name += f"[{args.probe}]"
    batches = [int(b) for b in args.batches.split(",")]
    split_b = {int(b) for b in args.split_batches.split(",") if b}
    settings = parse_settings(PRESETS.get(args.settings, args.settings))
    split_kinds = [k for k in args.split_kinds.split(",") if k]
    if any(k not in SPLIT_KINDS for k in split_kinds):
        sys.exit(f"--split-kinds: each of {','.join(SPLIT_KINDS)}")
    timer = Timer(reps=args.reps)
    if args.ncu:  # one eager step per dtype and setting: 3 kernels each for ncu
        for sh in shapes[:1]:
            x = torch.randn(batches[0], sh.H, device="cuda", dtype=torch.bfloat16)
            wr = torch.randn(sh.E, sh.H, device="cuda", dtype=torch.bfloat16) / math.sqrt(sh.H)
            bias = (torch.randn(sh.E, device="cuda") * 0.1) if sh.sigmoid else None
            for dtype in (BF16_W, MXFP8_W):
                Wc = W(lib, sh, dtype, 99)
                for name, env in settings:
                    with kernel_env(env):
                        S = Step(lib, sh, batches[0], dtype, x, wr, bias)
                        st = torch.cuda.current_stream().cuda_stream
                        S.router(Wc, st); S.gate_up(Wc, st); S.down(Wc, st)
                        torch.cuda.synchronize()
                        print(f"ncu step: {sh.name} B={batches[0]} {'bf16' if dtype == BF16_W else 'mxfp8'} {name}")
                del Wc
        return
    copy_bw = copy_bandwidth(timer)
    print(f"copy bandwidth {copy_bw:.0f} GB/s; settings: " + "; ".join(f"{n}={e or 'defaults'}" for n, e in settings))
    stream = torch.cuda.Stream()
    fails = 0
    for sh in shapes:
        # Seeded, so that two processes (e.g. two builds timed against each other) route the same tokens alike.
        gr = torch.Generator(device="cuda").manual_seed(4321)
        wr = torch.randn(sh.E, sh.H, device="cuda", dtype=torch.bfloat16, generator=gr) / math.sqrt(sh.H)
        bias = (torch.randn(sh.E, device="cuda", generator=gr) * 0.1) if sh.sigmoid else None
        for dtype in [d for n, d in (("bf16", BF16_W), ("mxfp8", MXFP8_W)) if n in args.dtypes.split(",")]:
            per = sh.E * 3 * sh.I * sh.H * (2 if dtype == BF16_W else 1.04)
            copies = int(max(2, min(4, 40e9 // per)))
            Ws = [W(lib, sh, dtype, 1234 + c) for c in range(copies)]
            name_d = "bf16" if dtype == BF16_W else "mxfp8"
            elem = 2.0 if dtype == BF16_W else 1 + 1 / 32
            for B in batches:
                x = torch.randn(B, sh.H, device="cuda", dtype=torch.bfloat16, generator=torch.Generator(device="cuda").manual_seed(B))
                runs = []  # per setting: (name, Step, {kind: graph}, step outputs, fused bitwise or None)
                for sname, env in settings:
                    with kernel_env(env):  # the graphs keep the kernels (and switches) chosen at capture
                        S = Step(lib, sh, B, dtype, x, wr, bias)
                        st = stream.cuda_stream

                        def chain(parts, S=S, st=st):
                            def f():
                                for s in range(STEPS):
                                    Wc = Ws[s % copies]
                                    for p in parts:
                                        getattr(S, p)(Wc, st)
                            return f

                        kinds = [("step", ("router", "gate_up", "down"))]
                        if B in split_b:
                            kinds += [(k, SPLIT_KINDS[k]) for k in split_kinds]
                        if args.fused and B <= FUSED_MAX_BATCH:
                            kinds += [("fused", ("fused",))]
                        graphs, out, fused_eq = {}, None, None
                        for kname, parts in kinds:
                            if kname == "fused":  # the step's outputs, then poison: the fused step rewrites them
                                S.ids.fill_(-1), S.w.fill_(float("nan")), S.out.fill_(float("nan"))
                            g = capture_graph(chain(parts), stream)
                            if kname in ("step", "fused"):  # verify: bitwise against the first setting / the step
                                g.replay()
                                torch.cuda.synchronize()
                                res = (S.ids.clone(), S.w.clone(), S.out.clone())
                                if kname == "step":
                                    out = res
                                else:
                                    fused_eq = same(res, out)
                            graphs[kname] = g
                        runs.append((sname, S, graphs, out, fused_eq))
                # Every setting's graphs timed in alternation (Timer.many: clock drift hits all alike;
                # a replay reads no switch, so no environment is needed here).
                items = [(sname, kname, g) for sname, _, graphs, _, _ in runs for kname, g in graphs.items()]
                times = timer.many([(None, g.replay) for _, _, g in items])
                ts = {(sname, kname): us / STEPS for (sname, kname, _), us in zip(items, times)}
                ref_out, base, kbase = None, None, {}
                for sname, S, graphs, out, fused_eq in runs:
                    t = {kname: ts[(sname, kname)] for kname in graphs}
                    distinct = torch.unique(S.ids).numel() + (1 if sh.shared else 0)  # + the shared expert
                    wb = distinct * 3 * sh.I * sh.H * elem
                    eq = ref_out is None or same(out, ref_out)
                    bit_note = "" if ref_out is None else (" bitwise=" + ("yes" if eq else "NO"))
                    if not eq:
                        fails += 1
                    if ref_out is None:
                        ref_out, base = out, t["step"]
                    line = (f"{sh.name} B={B} {name_d} {sname}: step {t['step']:.1f} us = {100 * wb / (t['step'] * 1e-6) / 1e9 / copy_bw:.1f}% copy"
                            f" ({base / t['step']:.3f}x {settings[0][0]}){bit_note}")
                    g1 = distinct * 2 * sh.I * sh.H * elem
                    g2 = distinct * sh.I * sh.H * elem
                    if all(k in t for k in ("R", "R+G", "G", "D")):
                        line += (f" | R {t['R']:.1f} +G {t['R+G'] - t['R']:.1f} +D {t['step'] - t['R+G']:.1f}"
                                 f" | alone: G {t['G']:.1f} ({100 * g1 / (t['G'] * 1e-6) / 1e9 / copy_bw:.0f}% copy)"
                                 f" D {t['D']:.1f} ({100 * g2 / (t['D'] * 1e-6) / 1e9 / copy_bw:.0f}% copy)"
                                 f" R+G+D-step {t['R'] + t['G'] + t['D'] - t['step']:.1f}")
                    elif any(k in t for k in SPLIT_KINDS):  # a --split-kinds subset: kernels alone, x the first setting
                        bits = []
                        for k in split_kinds:
                            nb = {"G": g1, "D": g2}.get(k)
                            kbase.setdefault(k, t[k])
                            bits.append(f"{k} {t[k]:.1f}" + (f" ({100 * nb / (t[k] * 1e-6) / 1e9 / copy_bw:.0f}% copy)" if nb else "")
                                        + f" {kbase[k] / t[k]:.3f}x")
                        line += " | alone: " + " ".join(bits)
                    if "fused" in t:
                        line += (f" | fused {t['fused']:.1f} us = {100 * wb / (t['fused'] * 1e-6) / 1e9 / copy_bw:.1f}%"
                                 f" copy ({t['step'] / t['fused']:.3f}x step) fused-bitwise={'yes' if fused_eq else 'NO'}")
                        if not fused_eq:
                            fails += 1
                    print(line, flush=True)
                del runs, items
            del Ws
            torch.cuda.empty_cache()
    if fails:
        print(f"BITWISE MISMATCH between settings: {fails}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
