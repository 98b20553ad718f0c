"""Diagnostic for issue 4 (wgrad slower with skewed routing): one k-grouped wgrad call per
(routing, mode) between cudaProfilerStart/Stop, so that `ncu --profile-from-start off` sees exactly
those kernels (after one warm-up call each). Shapes and routing are bench_gemm.py's (SHAPES,
routing_counts with the same seed), operands quantized by mxmoe's own column-wise quantizer.

    ncu --profile-from-start off --metrics gpu__time_duration.sum,sm__cycles_active.min,... --csv \
        python3 bench/diag_wgrad_skew.py --shape "Qwen3-235B gate-up" --tpe 2048

Prints, per routing, the token counts per expert (sorted), and per call the time by CUDA events
(common.Timer: L2 flushed, median of 5, outside the profiled region). Needs the binding (pip install -e .).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gemm import SHAPES, padded_offsets, routing_counts, token_row_mask  # noqa: E402
from common import Timer  # noqa: E402

import mxmoe.ops as mo  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="Qwen3-235B gate-up", help="a name of bench_gemm.py's SHAPES")
    ap.add_argument("--tpe", type=int, default=2048, help="tokens per expert (the skewed total is the same)")
    ap.add_argument("--modes", default="exact,fast")
    args = ap.parse_args()
    match = [s for s in SHAPES if s[0] == args.shape]
    if not match:
        sys.exit(f"diag_wgrad_skew: argument '--shape' = {args.shape!r}: not one of {[s[0] for s in SHAPES]}")
    name, E, N, K = match[0]
    timer = Timer(warmup=0, reps=5)  # outside the profiled region
    gen = torch.Generator().manual_seed(1234)  # bench_gemm's seed: the same skewed counts as its first case
    for skewed in (False, True):
        counts = routing_counts(E, args.tpe, skewed, gen)
        offs = padded_offsets(counts)
        M = offs[-1]
        rows = token_row_mask(offs, counts, M)
        dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        dy[~rows] = 0
        x[~rows] = 0
        qd = mo.quantize(dy, rowwise=False, colwise=True, fast=True).colwise
        qx = mo.quantize(x, rowwise=False, colwise=True, fast=True).colwise
        del dy, x
        imgs = (mo.bf16_image(qd), mo.bf16_image(qx))
        offsets = torch.tensor(offs, dtype=torch.int32, device="cuda")
        out = torch.empty(E, N, K, device="cuda", dtype=torch.bfloat16)
        top = sorted(counts, reverse=True)
        print(f"{name} {'skewed' if skewed else 'uniform'}: M = {M}, tokens per expert (sorted) "
              f"{top[:6]} ... {top[-6:]}, empty {sum(c == 0 for c in counts)}")
        for mode in args.modes.split(","):
            fast = mode == "fast"

            def call():
                mo.grouped_gemm_wgrad(qd, qx, offsets, fast=fast, out=out, dy_t_image=imgs[0], x_t_image=imgs[1])
            call()
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            call()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            ms = timer(call) / 1e3
            print(f"  {mode}: {ms:.3f} ms = {2.0 * sum(counts) * N * K / ms / 1e9:.0f} TFLOP/s (tokens only)")
        del qd, qx, imgs, out
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
