"""How fast can a decode step's worth of bytes be read at all (issue 6, docs/notes/decode.md)?
A warp-decode step at B = 1 streams the routed experts' weights once: 75 MB on Qwen3-30B (BF16),
302 MB on Qwen3-235B, 792 MB on DeepSeek-V3. The issue's target is 80% of the copy bandwidth of a
1 GiB copy. This measures, at each of those sizes, a plain streaming read by PyTorch
(`torch.amax` over a BF16 buffer: one read, a tiny output) the way bench_decode_split.py times a
step: CUDA graphs of STEPS launches over COPIES rotated buffers (cold L2), L2 flushed before each
rep, median. It also times the 1 GiB copy_ (the issue's reference) and a copy_ of each size.
Prints GB/s and % of the 1 GiB copy: the read ceiling for that size, i.e. what a step could reach
if it were nothing but one perfectly streamed read.
Usage: python3 bench/diag_read_ceiling.py [--sizes-mb 25,50,75,150,302,792] [--reps 15]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import capture_graph, timer_and_copy_bandwidth  # noqa: E402

STEPS = 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mb", default="25,50,75,150,302,792")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    timer, copy_bw = timer_and_copy_bandwidth(args.reps)
    print("size MB | read (amax) GB/s | % of copy | copy_ of that size GB/s | % of copy")
    for mb in (float(s) for s in args.sizes_mb.split(",")):
        n = int(mb * 1e6) // 2
        copies = int(max(2, min(4, 3e9 // (2 * n))))
        bufs = [torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        outs = [torch.empty((), device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        dsts = [torch.empty_like(b) for b in bufs]

        def reads():
            for s in range(STEPS):
                torch.amax(bufs[s % copies], dim=0, out=outs[s % copies])

        def copies_():
            for s in range(STEPS):
                dsts[s % copies].copy_(bufs[s % copies])

        stream = torch.cuda.Stream()
        gr, gc = capture_graph(reads, stream), capture_graph(copies_, stream)
        t_read, t_copy = (t / STEPS for t in timer.many([(None, gr.replay), (None, gc.replay)]))
        # The timed graphs' own results: each buffer's maximum and a byte-equal copy.
        for o, d in zip(outs, dsts):
            o.fill_(float("nan")), d.fill_(float("nan"))
        gr.replay(), gc.replay()
        torch.cuda.synchronize()
        used = range(min(STEPS, copies))
        ok = all(torch.equal(outs[i], bufs[i].max()) and torch.equal(dsts[i], bufs[i]) for i in used)
        read_bw = 2 * n / (t_read * 1e-6) / 1e9
        cp_bw = 4 * n / (t_copy * 1e-6) / 1e9
        print(f"{mb:7.0f} | {read_bw:8.0f} ({t_read:7.1f} us) | {100 * read_bw / copy_bw:5.1f}% | "
              f"{cp_bw:8.0f} ({t_copy:7.1f} us) | {100 * cp_bw / copy_bw:5.1f}%{'' if ok else ' CHECK FAILED'}")


if __name__ == "__main__":
    main()
