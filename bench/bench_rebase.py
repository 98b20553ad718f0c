"""rebase_mxfp8_fast_block128 (include/mxmoe/quantize.h): the 128x128-block fast form of the weights
made from their plain MX copy, on the models' expert weights in both directions (the forward GEMM's
W [E, N, K] and the dgrad GEMM's Wᵀ [E, K, N]), against the device-to-device copy bandwidth measured
in the same run.

Each line: shape, time (us, median, L2 flushed before every rep), GB/s (bytes read + written: 1 + 1/32
read and 1 written per element, block scales included) and % of copy. The output must equal an
independent PyTorch construction bit for bit (bench_gemm.torch_block_rebase, itself checked against
the definition by bench_gemm). (Run 84 timed two thread mappings here: the one kept, 93-98% of copy,
and run 81's, 55-60%.)
Then quantize_mxfp8_block128 (BF16 straight to the block form, both directions in one pass) against
the two passes it replaces (quantize_mxfp8 to the plain copy both ways + two rebases), timed in
alternation, outputs bitwise equal; the one pass on both of its kernels (MXMOE_QUANT_BLOCK128_KERNEL=
simple: one CTA per tile; pipelined, the default since session 12: persistent, TMA, warp-specialised),
each checked bitwise against the two passes, with GB/s (BF16 read once, two 1-byte outputs) and % of copy.
Usage: python3 bench/bench_rebase.py [--json out.json] [--reps 15] [--shapes Qwen3-30B,...]
"""
import argparse
import ctypes

import torch

from common import (Timer, check, copy_bandwidth, device_info, kernel_env, load_lib, print_table, ptr, rebase_block128,
                    require_gpu, write_json)
from bench_gemm import quant_rows_chunked, torch_block_rebase

# (model, E, hidden, intermediate): W1 [E, 2I, H], W2 [E, H, I]
MODELS = [("Qwen3-30B", 128, 2048, 768), ("Qwen3-235B", 128, 4096, 1536), ("DSV3-EP8", 32, 7168, 2048)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--shapes", default=None, help="comma-separated model names")
    args = ap.parse_args()
    require_gpu()
    lib = load_lib()
    timer = Timer(reps=args.reps)
    copy = copy_bandwidth(timer)
    print(f"{device_info()}; device-to-device copy {copy:.0f} GB/s (read + write)", flush=True)
    keep = set(args.shapes.split(",")) if args.shapes else None
    table, results = [], {"copy_gbs": copy, "rows": []}
    gen = torch.Generator(device="cuda").manual_seed(1)
    for model, E, H, I in MODELS:
        if keep and model not in keep:
            continue
        for what, N, K in [("W1", 2 * I, H), ("W1ᵀ", H, 2 * I), ("W2", H, I), ("W2ᵀ", I, H)]:
            w = (torch.randn(E * N, K, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
            d, s, _, _ = quant_rows_chunked(w)
            del w
            pitch = lib.mxmoe_fast_block_scales_pitch(N)
            bd = torch.empty_like(d)
            bs = torch.empty(E, (K + 127) // 128, pitch, dtype=torch.uint8, device="cuda")

            def call():
                rebase_block128(lib, d, s, E, N, K, bd, bs)
            call()
            want_d, want_s = torch_block_rebase(d, s, E, N, K, pitch)
            ok = torch.equal(bd, want_d) and torch.equal(bs, want_s)
            t = timer(call)
            nbytes = E * N * K * (2 + 1 / 32) + E * ((K + 127) // 128) * pitch
            gbs = nbytes / (t * 1e-6) / 1e9
            shape = f"{model} {what} [{E}, {N}, {K}]"
            results["rows"].append({"shape": shape, "ok": ok, "us": t, "gbs": gbs})
            table.append([shape, f"{t:.1f}", f"{gbs:.0f} ({100 * gbs / copy:.1f}%)", "yes" if ok else "NO"])
    print_table("rebase_mxfp8_fast_block128 (128x128-block fast form of the weights)",
                ["shape", "us", "GB/s (% copy)", "bitwise = torch"],
                table)
    # The weights' block form straight from BF16, both directions in one pass
    # (quantize_mxfp8_block128), against the two passes it replaces (quantize_mxfp8 to the plain copy
    # both ways, then two rebases), in alternation; outputs bitwise equal.
    table2 = []
    for model, E, H, I in MODELS:
        if keep and model not in keep:
            continue
        for what, N, K in [("W1", 2 * I, H), ("W2", H, I)]:
            w = (torch.randn(E, N, K, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
            u8 = dict(dtype=torch.uint8, device="cuda")
            plain = [torch.empty(E * N * K, **u8), torch.empty(E * N * K // 32, **u8),
                     torch.empty(E * N * K, **u8), torch.empty(E * N * K // 32, **u8)]  # row d, s; col d, s
            two = [torch.empty(E * N * K, **u8), torch.empty(E, (K + 127) // 128, lib.mxmoe_fast_block_scales_pitch(N), **u8),
                   torch.empty(E * N * K, **u8), torch.empty(E, (N + 127) // 128, lib.mxmoe_fast_block_scales_pitch(K), **u8)]
            one = [torch.empty_like(t) for t in two]
            stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

            def two_pass():
                check(lib, lib.mxmoe_quantize_mxfp8(ptr(w), E, N, K, ptr(plain[0]), ptr(plain[1]), None, None,
                                                    ptr(plain[2]), ptr(plain[3]), None, None, 0, stream))
                rebase_block128(lib, plain[0], plain[1], E, N, K, two[0], two[1])
                rebase_block128(lib, plain[2], plain[3], E, K, N, two[2], two[3])

            def one_pass():
                check(lib, lib.mxmoe_quantize_mxfp8_block128(ptr(w), E, N, K, ptr(one[0]), ptr(one[1]), ptr(one[2]),
                                                             ptr(one[3]), 0, stream))
            two_pass()
            simple, pipelined = {"MXMOE_QUANT_BLOCK128_KERNEL": "simple"}, {"MXMOE_QUANT_BLOCK128_KERNEL": "pipelined"}
            oks = []
            for env in (simple, pipelined):  # each kernel's output, bitwise against the two passes
                for t in one:
                    t.fill_(0xEE)
                with kernel_env(env):
                    one_pass()
                oks.append(all(torch.equal(a, b) for a, b in zip(one, two)))
            t2, ts, tp = timer.many([(None, two_pass), (simple, one_pass), (pipelined, one_pass)])
            nbytes = E * N * K * (2 + 2)  # BF16 read once, two 1-byte outputs

            def rate(t):
                gbs = nbytes / (t * 1e-6) / 1e9
                return f"{gbs:.0f} ({100 * gbs / copy:.1f}%)"
            shape = f"{model} {what} [{E}, {N}, {K}] both ways"
            results["rows"].append({"shape": shape, "ok": all(oks), "ok_simple": oks[0], "ok_pipelined": oks[1],
                                    "two_pass_us": t2, "simple_us": ts, "pipelined_us": tp,
                                    "simple_pct_copy": 100 * nbytes / (ts * 1e-6) / 1e9 / copy,
                                    "pipelined_pct_copy": 100 * nbytes / (tp * 1e-6) / 1e9 / copy})
            table2.append([shape, f"{t2:.1f}", f"{ts:.1f}", f"{tp:.1f}", f"{t2 / tp:.2f}", f"{ts / tp:.2f}", rate(ts),
                           rate(tp), "/".join("yes" if ok else "NO" for ok in oks)])

    print_table("quantize_mxfp8_block128 (one pass: simple and pipelined kernels) vs quantize_mxfp8 + 2 x rebase "
                "(two passes), in alternation",
                ["shape", "two passes us", "simple us", "pipelined us", "two / pipelined", "simple / pipelined",
                 "simple GB/s (% copy)", "pipelined GB/s (% copy)", "bitwise = two passes (simple/pipelined)"],
                table2)
    if args.json:
        write_json(args.json, results)
    if not all(r["ok"] for r in results["rows"]):
        raise SystemExit("bench_rebase: an output differs from the PyTorch block form")


if __name__ == "__main__":
    main()
