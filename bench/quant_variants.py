"""A/B of the pipelined quantizer's diagnostic switches (MXMOE_QUANT_TMA*) against today's kernels,
under three ways of timing, all in one process (issue 2: why do row-wise, column-wise and both
directions stop at 73-88% of copy whatever the kernel?).

Timing modes (each kernel and each ceiling is measured in every mode; "% copy" divides by the copy_
bandwidth measured in the same mode):
  flush  bench_quant.py's Timer: 256 MB zeroed before every rep. That leaves the L2 full of the
         flush buffer's DIRTY lines, which the timed kernel must write back to DRAM (up to the L2's
         ~50 MB: ~10% of a 476 MB both-directions pass, ~2.5% of the 2 GB copy_).
  clean  as flush, then 128 MB read (a sum): the L2 starts with clean lines.
  loop   the reps back to back between one pair of events (no flush in between; steady state:
         each rep writes back what the previous one left dirty, as in a training step).
Ceilings: torch copy_ of 1 GiB (the bench's ceiling, a driver memcpy); an SM copy kernel of the
16384x7168 input's bytes (bitwise_or with 0 on int32, read 1 : write 1); a 2 : 1 read : write kernel
(c = a | b, the row-wise or column-wise quantizer's mix).
Variants (env of the quantizer; every one's output is checked bit for bit against PyTorch, except
the skeletons, which store stale bytes by design): see VARIANTS. Session 10: the scale-store order
(MXMOE_QUANT_TMA_SCALES=early|late|warp, MXMOE_QUANT_LATE_SCALES=1 for today's kernels) and the
skeleton with scale stores (MXMOE_QUANT_TMA_SKEL_SCALES=1) test whether the fence's MEMBAR waiting
for the scale bytes' global stores is what the conversion costs. Session 11: the unit walk and the
unit scale writer (MXMOE_QUANT_SCALE_UNIT; the pipelined kernel's default): "tma" is now the unit
walk, "tma-rr" the round-robin walk of run 62 ("tma" there); the run-62 variants carry "-rr" or set
MXMOE_QUANT_SCALE_UNIT=0 so that they time what run 62 timed.
Session 12: the session-11 unit walk is opt-in (MXMOE_QUANT_SCALE_UNIT=1; run 64 measured it slower):
"tma" is the pipelined kernel's defaults again, i.e. for one direction the TMA-stored scale units
(MXMOE_QUANT_SCALE_TMA, the unit round robin) where the shape qualifies, and the round-robin walk
with per-tile stores elsewhere (both directions, K = 2880 row-wise); "tma-rr" (and every "-rr"
variant) sets MXMOE_QUANT_SCALE_TMA=0 too, so it still times run 62's / run 68's per-tile path.
"tma-unit*" / "skel-unit*" are session 11's unit walk (now with MXMOE_QUANT_SCALE_UNIT=1).
New: tmas (explicit), tmas-walk (the unit round robin with per-tile stores: the walk's cost alone),
tmas-split (the last partial wave always split into single tiles), tmas-across (unit ids across the
lines first), skel-tmas (skeleton + TMA-stored unit scales, 0x7F), skel-tmas-walk (skeleton on the
unit round robin, no scales).

Usage: python3 bench/quant_variants.py [--json F] [--cases REGEX] [--modes flush,clean,loop]
                                       [--variants REGEX] [--reps N]
       python3 bench/quant_variants.py --profile LABELS_FILE   (one launch of each kernel of
       PROFILE on 16384x7168, for ncu; writes the launch labels in order to LABELS_FILE)
"""
import argparse
import json
import re
import statistics
import sys

import torch

from bench_quant import MxOutputs, RCEIL, compare, torch_quant
from common import check, device_info, kernel_env, load_lib, ptr, require_gpu, write_json

BASE = {"MXMOE_QUANT_STAGED": "1", "MXMOE_QUANT_TWO_GROUP": "1", "MXMOE_QUANT_TMA": "0",
        "MXMOE_QUANT_TMA_GROUP": "", "MXMOE_QUANT_TMA_LOAD_HINT": "", "MXMOE_QUANT_TMA_STORE_HINT": "",
        "MXMOE_QUANT_TMA_SCALES": "", "MXMOE_QUANT_TMA_SKEL_SCALES": "", "MXMOE_QUANT_LATE_SCALES": "",
        "MXMOE_QUANT_SCALE_UNIT": "", "MXMOE_QUANT_SCALE_TMA": "", "MXMOE_QUANT_TMA_SPLIT": "",
        "MXMOE_QUANT_TMA_UNIT_ORDER": "", "MXMOE_QUANT_TMA_GRID": ""}
TMA = {"MXMOE_QUANT_TMA": "1"}
RR = {"MXMOE_QUANT_SCALE_UNIT": "0", "MXMOE_QUANT_SCALE_TMA": "0"}  # the round-robin walk of runs 56-68, per-tile stores
UNIT = {"MXMOE_QUANT_SCALE_UNIT": "1"}  # session 11's unit walk (opt-in since session 12)
SKEL = {"MXMOE_QUANT_TMA": "skel", "MXMOE_QUANT_TMA_STORE_HINT": "none"}
# (label, env over BASE, checked bit for bit). Since session 10 the pipelined kernel's defaults are
# late scale stores + evict_last TMA stores; since session 11 the unit walk with the unit scale
# writer ("tma"). "tma-run59" is the kernel as run 59 measured it, "tma-rr" as run 62 did ("tma").
VARIANTS = [
    ("default", {}, True),                                            # today's kernels (staged / two-group)
    ("late", {"MXMOE_QUANT_LATE_SCALES": "1"}, True),                 # today's kernels, scale bytes after the TMA stores
    ("tma-run59", {**TMA, **RR, "MXMOE_QUANT_TMA_SCALES": "early", "MXMOE_QUANT_TMA_STORE_HINT": "none"}, True),
    ("tma-early", {**TMA, **RR, "MXMOE_QUANT_TMA_SCALES": "early"}, True),  # evict_last stores, scales before the fence
    ("tma-nohint", {**TMA, **RR, "MXMOE_QUANT_TMA_STORE_HINT": "none"}, True),  # late scales, no store hint
    ("tma-rr", {**TMA, **RR}, True),                                  # run 62's "tma": late scales + evict_last stores
    ("tma-warp", {**TMA, **RR, "MXMOE_QUANT_TMA_SCALES": "warp"}, True),  # scale bytes by the writer warp, 4 B a run
    ("tma-g1", {**TMA, **RR, "MXMOE_QUANT_TMA_GROUP": "1"}, True),    # row-major raster
    ("tma", TMA, True),                                               # the defaults (session 12: TMA scale units, one direction)
    ("tma-unit", {**TMA, **UNIT}, True),                              # session 11's "tma": unit walk + unit writer
    ("tma-unit-late", {**TMA, **UNIT, "MXMOE_QUANT_TMA_SCALES": "late"}, True),  # unit walk, per-tile late scale stores
    ("tma-u1x1", {**TMA, "MXMOE_QUANT_SCALE_UNIT": "1x1"}, True),     # unit walk + writer, 4-byte runs (control)
    ("tma-u2x2", {**TMA, "MXMOE_QUANT_SCALE_UNIT": "2x2"}, True),     # 8-byte runs
    ("tma-u1x16", {**TMA, "MXMOE_QUANT_SCALE_UNIT": "1x16"}, True),   # row runs 64 B, column runs 4 B
    ("skel", {**SKEL, **RR}, False),                                  # run 59's skeleton
    ("skel-sc-early", {**SKEL, **RR, "MXMOE_QUANT_TMA_SKEL_SCALES": "1", "MXMOE_QUANT_TMA_SCALES": "early"}, False),
    ("skel-sc-late", {**SKEL, **RR, "MXMOE_QUANT_TMA_SKEL_SCALES": "1"}, False),
    ("skel-last", {"MXMOE_QUANT_TMA": "skel", **RR}, False),          # skeleton with the evict_last stores
    ("skel-unit", {**SKEL, **UNIT}, False),                           # the unit walk, no scale stores
    ("skel-sc-unit", {**SKEL, **UNIT, "MXMOE_QUANT_TMA_SKEL_SCALES": "1"}, False),  # the unit walk + unit writer
    # session 12: TMA-stored scale units (one direction; both directions run tma-rr's path)
    ("tmas", {**TMA, "MXMOE_QUANT_SCALE_TMA": "1"}, True),            # unit round robin + one TMA store a unit
    # (both directions since quant-tmas2: tmas / tmas-walk / tmas-split / tmas-across are the 4x4-tile
    # units where rows and K are multiples of 512; skel-tmas* stay on the round robin there)
    ("tmas-walk", {**TMA, "MXMOE_QUANT_SCALE_TMA": "walk"}, True),    # the same walk, per-tile late stores
    ("tmas-split", {**TMA, "MXMOE_QUANT_TMA_SPLIT": "1"}, True),      # the last partial wave as single tiles
    ("tmas-across", {**TMA, "MXMOE_QUANT_TMA_UNIT_ORDER": "across"}, True),  # unit ids across the lines first
    ("skel-tmas", {**SKEL, "MXMOE_QUANT_TMA_SKEL_SCALES": "1"}, False),  # skeleton + TMA-stored unit scales
    ("skel-tmas-walk", {**SKEL, "MXMOE_QUANT_SCALE_TMA": "walk"}, False),  # skeleton on the unit round robin, no scales
]
# (name, batch, rows, cols, row, col)
CASES = [(n, 1, r, c, row, col) for (r, c) in [(16384, 7168), (65536, 2048), (32768, 2880)]
         for (n, row, col) in [("rowwise", True, False), ("colwise", False, True), ("row+col", True, True)]]
CASES += [("weights row+col", 128, 1536, 2048, True, True)]
MODES = ("flush", "clean", "loop")


class ModeTimer:
    """Median time (us) of fn under a timing mode (module docstring)."""

    def __init__(self, reps, warmup=2):
        self.reps, self.warmup = reps, warmup
        self.dirty = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        self.clean = torch.ones(128 << 20, dtype=torch.uint8, device="cuda").view(torch.int32)

    def __call__(self, fn, mode):
        for _ in range(self.warmup):
            fn()
        ev = lambda: torch.cuda.Event(enable_timing=True)
        if mode == "loop":
            self.dirty.zero_()
            times = []
            for _ in range(3):  # 3 batches of `reps` back-to-back runs
                a, b = ev(), ev()
                a.record()
                for _ in range(self.reps):
                    fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1e3 / self.reps)
            return statistics.median(times)
        times = []
        for _ in range(self.reps):
            self.dirty.zero_()
            if mode == "clean":
                self.clean.sum()
            a, b = ev(), ev()
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3)
        return statistics.median(times)


def ceilings(timer, modes):
    """GB/s (read + write) of the three reference kernels in each mode."""
    n = 16384 * 7168 * 2  # the 16384x7168 BF16 input's bytes
    out = {}
    big = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_(0, 255)
    big_dst = torch.empty_like(big)
    a = torch.randint(0, 1 << 30, (n // 4,), dtype=torch.int32, device="cuda")
    c = torch.empty_like(a)
    h = n // 8  # 2:1 kernel: a | b over two halves' worth: reads 2h words, writes h words
    a2, b2, c2 = a[:h], a[h:2 * h], c[:h]
    for mode in modes:
        out[("copy_ 1GiB", mode)] = 2 * big.numel() / timer(lambda: big_dst.copy_(big), mode) / 1e3
        out[("sm copy", mode)] = 2 * n / timer(lambda: torch.bitwise_or(a, 0, out=c), mode) / 1e3
        out[("2:1 r:w", mode)] = 3 * h * 4 / timer(lambda: torch.bitwise_or(a2, b2, out=c2), mode) / 1e3
    del big, big_dst, a, c
    torch.cuda.empty_cache()
    return out


def run_case(lib, timer, case, modes, variants, results, copy_gbs):
    name, b, r, c, row, col = case
    shape = f"{b}x{r}x{c}" if b > 1 else f"{r}x{c}"
    x = (torch.randn(b, r, c, device="cuda") * torch.rand(b, r, 1, device="cuda") * 10).to(torch.bfloat16)
    mx = MxOutputs(b, r, c, row, col, False, True)
    a = mx.args()
    ref = torch_quant(x, row, col, False)
    nbytes = x.numel() * 2 + mx.nbytes()
    data_bytes = x.numel() * 2 + x.numel() * (int(row) + int(col))  # the skeleton writes no scales (by default)

    def run():
        check(lib, lib.mxmoe_quantize_mxfp8(ptr(x), b, r, c, *a, RCEIL, None))

    line = {}
    for label, env, checked in variants:
        for t in mx.tensors():
            t.fill_(0xA5)
        e = dict(BASE)
        e.update(env)
        with kernel_env(e):
            us = {m: timer(run, m) for m in modes}
        bad = compare(mx, ref) if checked else None
        nb = nbytes if checked or env.get("MXMOE_QUANT_TMA_SKEL_SCALES") == "1" else data_bytes
        pct = {m: 100 * nb / (us[m] * 1e-6) / 1e9 / copy_gbs[m] for m in modes}
        results["rows"].append({"kernel": name, "shape": shape, "variant": label, "env": env, "us": us,
                                "pct_copy": pct, "mismatched_bytes": bad})
        line[label] = (pct, bad)
    del x, mx, ref
    torch.cuda.empty_cache()
    return shape, line


PROFILE = [  # (label, kernel, env) on 16384x7168; kernel: "copy", "2:1", or (row, col)
    ("sm copy 235MB", "copy", {}),
    ("row+col default", (True, True), {}),
    ("row+col late", (True, True), {"MXMOE_QUANT_LATE_SCALES": "1"}),
    ("row+col tma-run59", (True, True), {**TMA, **RR, "MXMOE_QUANT_TMA_SCALES": "early", "MXMOE_QUANT_TMA_STORE_HINT": "none"}),
    ("row+col tma-rr", (True, True), {**TMA, **RR}),
    ("row+col tmas", (True, True), {**TMA, "MXMOE_QUANT_SCALE_TMA": "1"}),  # quant-tmas2: 4x4-tile TMA scale units
    ("row+col tma-warp", (True, True), {**TMA, **RR, "MXMOE_QUANT_TMA_SCALES": "warp"}),
    ("row+col skel-sc-early", (True, True), {**SKEL, **RR, "MXMOE_QUANT_TMA_SKEL_SCALES": "1", "MXMOE_QUANT_TMA_SCALES": "early"}),
    ("colwise late", (False, True), {"MXMOE_QUANT_LATE_SCALES": "1"}),
    ("colwise tma-rr", (False, True), {**TMA, **RR}),
    ("rowwise tma-rr", (True, False), {**TMA, **RR}),
    # session 11: the unit walk (predicted scale write sectors: quantize.md "Session 11")
    ("row+col tma-unit", (True, True), {**TMA, **UNIT}),
    ("row+col tma-u1x1", (True, True), {**TMA, "MXMOE_QUANT_SCALE_UNIT": "1x1"}),
    ("row+col skel-sc-unit", (True, True), {**SKEL, **UNIT, "MXMOE_QUANT_TMA_SKEL_SCALES": "1"}),
    ("colwise tma-unit", (False, True), {**TMA, **UNIT}),
    ("rowwise tma-unit", (True, False), {**TMA, **UNIT}),
    # session 12: TMA-stored scale units (predicted write sectors: quantize.md "Session 12")
    ("rowwise tmas", (True, False), {**TMA, "MXMOE_QUANT_SCALE_TMA": "1"}),
    ("rowwise tmas-walk", (True, False), {**TMA, "MXMOE_QUANT_SCALE_TMA": "walk"}),
    ("rowwise skel-sc-late", (True, False), {**SKEL, **RR, "MXMOE_QUANT_TMA_SKEL_SCALES": "1"}),
    ("rowwise skel-tmas", (True, False), {**SKEL, "MXMOE_QUANT_TMA_SKEL_SCALES": "1"}),
    ("colwise tmas", (False, True), {**TMA, "MXMOE_QUANT_SCALE_TMA": "1"}),
    ("colwise tmas-walk", (False, True), {**TMA, "MXMOE_QUANT_SCALE_TMA": "walk"}),
    ("colwise skel-sc-late", (False, True), {**SKEL, **RR, "MXMOE_QUANT_TMA_SKEL_SCALES": "1"}),
    ("colwise skel-tmas", (False, True), {**SKEL, "MXMOE_QUANT_TMA_SKEL_SCALES": "1"}),
]


def profile(lib, labels_file, skip=None):
    """One launch of each PROFILE kernel (labels matching `skip` left out), nothing else that ncu's
    filter (BitwiseOr | quantize_mxfp8_*kernel) would catch."""
    R, C = 16384, 7168
    x = torch.randn(R, C, device="cuda").to(torch.bfloat16)
    n = R * C * 2
    src = torch.empty(n // 4, dtype=torch.int32, device="cuda")
    dst = torch.empty_like(src)
    h = n // 8
    outs = {rc: MxOutputs(1, R, C, rc[0], rc[1], False, True) for rc in [(True, True), (False, True), (True, False)]}
    torch.cuda.synchronize()
    with open(labels_file, "w") as f:
        for label, kind, env in PROFILE:
            if skip and re.search(skip, label):
                continue
            e = dict(BASE)
            e.update(env)
            with kernel_env(e):
                if kind == "copy":
                    torch.bitwise_or(src, 0, out=dst)
                elif kind == "2:1":
                    torch.bitwise_or(src[:h], src[h:2 * h], out=dst[:h])
                else:
                    check(lib, lib.mxmoe_quantize_mxfp8(ptr(x), 1, R, C, *outs[kind].args(), RCEIL, None))
            torch.cuda.synchronize()
            if kind == "copy":
                rd, wr, k = n, n, "t"
            elif kind == "2:1":
                rd, wr, k = 2 * h * 4, h * 4, "t"
            else:
                dirs = int(kind[0]) + int(kind[1])
                skel_none = e["MXMOE_QUANT_TMA"] == "skel" and e["MXMOE_QUANT_TMA_SKEL_SCALES"] != "1"
                scales = 0 if skel_none else R * C // 32  # (the skeleton writes none by default)
                rd, wr, k = n, dirs * (R * C + scales), "q"
            f.write(f"{label}\t{rd}\t{wr}\t{k}\n")
    print("profiled launches:", ", ".join(p[0] for p in PROFILE if not (skip and re.search(skip, p[0]))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--cases", default=None, help="regex on 'name shape'")
    ap.add_argument("--variants", default=None, help="regex on the variant labels")
    ap.add_argument("--skip", default=None, help="regex: variants and --profile labels left out (e.g. one whose test failed)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--profile", default=None, metavar="LABELS_FILE")
    args = ap.parse_args()
    require_gpu()
    lib = load_lib()
    torch.manual_seed(0)
    if args.profile:
        profile(lib, args.profile, args.skip)
        return
    modes = [m for m in args.modes.split(",") if m]
    variants = [v for v in VARIANTS if (not args.variants or re.search(args.variants, v[0]))
                and not (args.skip and re.search(args.skip, v[0]))]
    timer = ModeTimer(args.reps)
    ceil = ceilings(timer, modes)
    copy_gbs = {m: ceil[("copy_ 1GiB", m)] for m in modes}
    results = {"device": device_info(), "ceilings_GBps": {f"{k} [{m}]": v for (k, m), v in ceil.items()}, "rows": []}
    print(f"ceilings, GB/s read+write ({device_info()['name']}); modes: " + " / ".join(modes))
    for k in ("copy_ 1GiB", "sm copy", "2:1 r:w"):
        vals = " / ".join(f"{ceil[(k, m)]:.0f}" for m in modes)
        pct = " / ".join(f"{100 * ceil[(k, m)] / copy_gbs[m]:.1f}%" for m in modes)
        print(f"  {k:12s} {vals}   ({pct} of copy_)")
    print("% of copy_ in the same mode (" + " / ".join(modes) + "); 'bad' = mismatching bytes of checked variants")
    print(f"{'case':28s} " + " ".join(f"{v[0]:>14s}" for v in variants))
    failed = False
    for case in CASES:
        shape_label = f"{case[0]} {case[2]}x{case[3]}" if case[1] == 1 else f"{case[0]} {case[1]}x{case[2]}x{case[3]}"
        if args.cases and not re.search(args.cases, shape_label):
            continue
        shape, line = run_case(lib, timer, case, modes, variants, results, copy_gbs)
        cells = []
        for v in variants:
            pct, bad = line[v[0]]
            cells.append(f"{'/'.join(f'{pct[m]:.1f}' for m in modes):>14s}")
            failed |= bool(bad)
        print(f"{shape_label:28s} " + " ".join(cells), flush=True)
        bads = {v[0]: line[v[0]][1] for v in variants if line[v[0]][1]}
        if bads:
            print(f"  MISMATCH {bads}")
    write_json(args.json, results)
    if failed:
        print("ERROR: a checked variant's output differs from the PyTorch baseline", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
