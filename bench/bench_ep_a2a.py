"""Baseline for issue 7: torch.distributed all_to_all (NCCL) on the bytes of mxmoe's EP dispatch and
combine, in the same shapes as mxmoe_ep_test's timed case (H = 7168, top-8, E = 32 experts per rank,
T = 4096 tokens per rank, uniform routing).

Dispatch moves, for every (token, destination rank) pair with at least one of the token's experts
there, one MX row (H bytes of E4M3 + H/32 scale bytes); combine moves back one BF16 row per remote
(token, slot). Both are timed as `all_to_all_single` with the split sizes known on the host (which
favours the baseline: mxmoe's kernels never read counts on the host). Self-traffic is included in
the call but not in the GB/s figure, as in mxmoe_ep_test ("out of this rank" / "into this rank").

Usage (one process per GPU, spawned here; NCCL_NVLS_ENABLE=0 is forced):
    python3 bench/bench_ep_a2a.py [--world 2] [--reps 20] [--json OUT.json]
    python3 bench/bench_ep_a2a.py --world 2 --backend gloo --device cpu   # mechanics check, no GPU
Compare its lines with `scripts/ep_launch.sh 2 build/mxmoe_ep_test` (same H, k, E, T).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def routing(seed, rank, tokens, top_k, experts):
    """Uniform top-k: k distinct experts per token, from a generator shared by all ranks."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    scores = torch.rand(tokens, experts, generator=g)
    return scores.topk(top_k, dim=1).indices  # [T, k] int64


def splits(ids, world, experts_per_rank):
    """Rows sent to each rank: dispatch (one per (token, destination)), combine (one per slot)."""
    owner = ids // experts_per_rank                                   # [T, k]
    onehot = torch.zeros(ids.shape[0], world, dtype=torch.bool)
    onehot.scatter_(1, owner, True)
    dispatch = onehot.sum(0)                                          # rows per destination
    combine = torch.bincount(owner.flatten(), minlength=world)        # slots per owner
    return dispatch.tolist(), combine.tolist()


def timed(fn, reps, device, warmup=3):
    """Median ms of fn over reps, after warmup calls; every rank starts each rep together (barrier)
    with its device idle (also used by bench_ep_layer_a2a.py)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
            dist.barrier()
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def worker(rank, args, store_path, results_path):
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    dev = args.device
    if dev == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(args.backend, init_method=f"file://{store_path}", rank=rank, world_size=args.world)
    world, H, k, e_local, T = args.world, args.hidden, args.top_k, args.experts_per_rank, args.tokens
    E = e_local * world
    ids = routing(args.seed, rank, T, k, E)
    d_send, c_back = splits(ids, world, e_local)
    # what each rank receives = what every other rank sends to it (exchange the split tables)
    table = torch.tensor([d_send, c_back], dtype=torch.int64, device=dev)
    tables = [torch.empty_like(table) for _ in range(world)]
    dist.all_gather(tables, table)
    d_recv = [int(t[0, rank]) for t in tables]
    c_recv = [int(t[1, rank]) for t in tables]  # combine: slots of our experts come back to their tokens

    row_mx = H + H // 32                       # E4M3 data + E8M0 scales
    row_bf16 = 2 * H
    send_d = torch.empty(sum(d_send) * row_mx, dtype=torch.uint8, device=dev).random_(0, 255)
    recv_d = torch.empty(sum(d_recv) * row_mx, dtype=torch.uint8, device=dev)
    # combine goes the other way: we send back one BF16 row per slot we computed (c_recv from each
    # source rank) and receive one per slot of our own tokens (c_back to each owner)
    send_c = torch.empty(sum(c_recv) * row_bf16, dtype=torch.uint8, device=dev).random_(0, 255)
    recv_c = torch.empty(sum(c_back) * row_bf16, dtype=torch.uint8, device=dev)

    def dispatch():
        dist.all_to_all_single(recv_d, send_d, [n * row_mx for n in d_recv], [n * row_mx for n in d_send])

    def combine():
        dist.all_to_all_single(recv_c, send_c, [n * row_bf16 for n in c_back], [n * row_bf16 for n in c_recv])

    t_d = timed(dispatch, args.reps, dev)
    t_c = timed(combine, args.reps, dev)
    out_bytes = (sum(d_send) - d_send[rank]) * row_mx
    in_bytes = (sum(c_back) - c_back[rank]) * row_bf16
    res = dict(rank=rank, world=world, backend=args.backend, hidden=H, top_k=k, experts_per_rank=e_local, tokens=T,
               dispatch_ms=t_d, dispatch_gbs=out_bytes / (t_d * 1e6), combine_ms=t_c, combine_gbs=in_bytes / (t_c * 1e6))
    print(f"[rank {rank}] torch.distributed all_to_all ({args.backend}): dispatch {t_d:.3f} ms = "
          f"{res['dispatch_gbs']:.1f} GB/s out of this rank; combine {t_c:.3f} ms = {res['combine_gbs']:.1f} GB/s "
          f"into this rank", flush=True)
    with open(f"{results_path}.{rank}", "w") as f:
        json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--experts-per-rank", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.device == "cuda" and torch.cuda.device_count() < args.world:
        print(f"mxmoe: bench_ep_a2a needs {args.world} CUDA GPUs, found {torch.cuda.device_count()}", file=sys.stderr)
        sys.exit(2)
    if os.environ.get("NCCL_NVLS_ENABLE", "0") != "0":
        print("bench_ep_a2a: NCCL_NVLS_ENABLE overridden to 0 (no NVLink multicast)", file=sys.stderr)
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    with tempfile.TemporaryDirectory() as tmp:
        store, results = os.path.join(tmp, "store"), os.path.join(tmp, "res")
        mp.spawn(worker, args=(args, store, results), nprocs=args.world, join=True)
        rows = [json.load(open(f"{results}.{r}")) for r in range(args.world)]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
