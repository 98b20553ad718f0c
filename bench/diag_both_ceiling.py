"""What the byte pattern of a both-directions MX quantization costs by itself (issue 2,
docs/notes/quantize.md "Runs 163-166", "Runs 168-169"): plain Triton kernels that move the same bytes as
the quantizer (read BF16 [R, C]; write one byte per element row-major [R, C] and transposed [C, R];
write one byte per 32-block of each copy, [R, C/32] and [C, R/32]) with no MX arithmetic: each
output byte is the high byte of its BF16 input, each block byte that of the block's first element
(or, for the "*0" patterns, a function of its indices).
Patterns, from the copy-like to the quantizer's (and torch copy_ of the input's size):
  row        read + the row-major byte copy (the row-wise quantizer's mix, 2 : 1)
  row+row    read + two row-major byte copies (3 streams, all linear, read : write 1 : 1)
  row+col    read + the row-major and the transposed byte copy (both directions' data)
  row+col+s  row+col + both block-byte arrays (both directions' whole byte pattern; each block byte is
             its first element's, from a second load that hits L1 / L2)
  row+col+st row+col+s with each tile's block bytes as one contiguous run (a tile-major scratch: the
             same bytes in the fewest sectors; not MX's layout)
  row+col+sv row+col+s by vertical strips of 8 tiles a program: column block bytes in 32-byte runs
  row+s      one direction: read + the row-major byte copy + its block bytes (the row-wise quantizer's bytes)
  col+s      the same for the transposed copy (the column-wise quantizer's bytes)
  *0         (row+col+s0, row+col+st0, row+s0, col+s0) the same, each block byte (index sum mod 256)
             computed from its indices instead of loaded: the store pattern's cost alone
  mx         the real thing: both directions of MXFP8 (RCEIL), bit-exact with bench_quant.py's PyTorch
each with several tile shapes (BR x BC) and tile orders (row-major, column-major, grouped bands).
Timing as bench_quant.py (L2 flushed before every rep, median, the items in alternation) and
"% copy" against the 1 GiB copy_ of the same run; every output is checked against PyTorch.
If a plain kernel cannot move the quantizer's bytes at 85% of copy, no quantizer can.
Usage: python3 bench/diag_both_ceiling.py [--shapes 16384x7168,65536x2048,32768x2880] [--reps 15]
       [--patterns REGEX] [--tiles BRxBC,...] [--num-warps N]
"""
import argparse
import os
import re
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_quant import torch_quant_rows  # noqa: E402
from common import timer_and_copy_bandwidth  # noqa: E402

PATTERNS = ("row", "row+row", "row+col", "row+col+s", "row+col+st", "row+s", "col+s",
            "row+col+s0", "row+col+st0", "row+s0", "col+s0")
PAT_CODE = {"row": 0, "row+row": 1, "row+col": 2, "row+col+s": 3, "row+col+st": 4, "row+s": 5, "col+s": 6}
TILES = ((128, 128), (256, 64), (64, 256), (256, 128))
ORDERS = ("rows", "cols", "band8")  # tile order of the program ids


@triton.jit
def _tile_of(pid, R, C, BR: tl.constexpr, BC: tl.constexpr, ORDER: tl.constexpr):
    nr = tl.cdiv(R, BR)
    nc = tl.cdiv(C, BC)
    if ORDER == 0:  # row-major tiles
        i = pid // nc
        j = pid % nc
    elif ORDER == 1:  # column-major tiles
        i = pid % nr
        j = pid // nr
    else:  # bands of 8 tile rows, column-major inside a band
        band = pid // (8 * nc)
        first = band * 8
        h = tl.minimum(nr - first, 8)
        k = pid - band * 8 * nc
        i = first + k % h
        j = k // h
    return i, j


@triton.jit
def _high_byte(v):
    """The high byte of each BF16 value."""
    return (v.to(tl.int16, bitcast=True) >> 8).to(tl.uint8)


@triton.jit
def _row_bytes(x, r, rk, C, IDX: tl.constexpr):
    """Block bytes [BR, n] of rows r and (global) blocks rk: the first element's high byte (a second load,
    from L1 / L2), or with IDX (r + rk) mod 256 from the indices alone (no load)."""
    if IDX:
        out = ((r[:, None] + rk[None, :]) & 0xFF).to(tl.uint8)
    else:
        out = _high_byte(tl.load(x + r[:, None] * C + rk[None, :] * 32))
    return out


@triton.jit
def _col_bytes(x, ck, c, C, IDX: tl.constexpr):
    """Block bytes [n, BC] of (global) blocks of 32 rows ck and columns c, as _row_bytes: (ck + c) mod 256
    with IDX."""
    if IDX:
        out = ((ck[:, None] + c[None, :]) & 0xFF).to(tl.uint8)
    else:
        out = _high_byte(tl.load(x + ck[:, None] * 32 * C + c[None, :]))
    return out


@triton.jit
def _pattern_kernel(x, o1, o2, s1, s2, R, C, BR: tl.constexpr, BC: tl.constexpr, PAT: tl.constexpr,
                    ORDER: tl.constexpr, IDX: tl.constexpr):
    i, j = _tile_of(tl.program_id(0), R, C, BR, BC, ORDER)
    r = i * BR + tl.arange(0, BR)
    c = j * BC + tl.arange(0, BC)
    rk = j * (BC // 32) + tl.arange(0, BC // 32)  # the tile's row-wise blocks (global)
    ck = i * (BR // 32) + tl.arange(0, BR // 32)  # its column-wise blocks (global)
    b = _high_byte(tl.load(x + r[:, None] * C + c[None, :]))  # [BR, BC]
    if PAT == 5:  # one direction with its block bytes
        tl.store(o1 + r[:, None] * C + c[None, :], b)
        tl.store(s1 + r[:, None] * (C // 32) + rk[None, :], _row_bytes(x, r, rk, C, IDX))
    elif PAT == 6:
        tl.store(o2 + c[None, :] * R + r[:, None], b)
        tl.store(s2 + c[None, :] * (R // 32) + ck[:, None], _col_bytes(x, ck, c, C, IDX))
    else:
        tl.store(o1 + r[:, None] * C + c[None, :], b)
        if PAT == 1:
            tl.store(o2 + r[:, None] * C + c[None, :], b)
        if PAT >= 2:
            tl.store(o2 + c[None, :] * R + r[:, None], b)  # transposed: Triton's coalescing converts the layout
            if PAT == 3:  # both block-byte arrays in MX's layout
                tl.store(s1 + r[:, None] * (C // 32) + rk[None, :], _row_bytes(x, r, rk, C, IDX))
                tl.store(s2 + c[None, :] * (R // 32) + ck[:, None], _col_bytes(x, ck, c, C, IDX))
            if PAT == 4:  # the same bytes, each tile's stored as one contiguous run (tile-major scratch)
                nb = BR * BC // 32
                tile = i * tl.cdiv(C, BC) + j
                rl = tl.arange(0, BR)
                cl = tl.arange(0, BC)
                tl.store(s1 + tile * nb + rl[:, None] * (BC // 32) + tl.arange(0, BC // 32)[None, :],
                         _row_bytes(x, r, rk, C, IDX))
                tl.store(s2 + tile * nb + cl[None, :] * (BR // 32) + tl.arange(0, BR // 32)[:, None],
                         _col_bytes(x, ck, c, C, IDX))


@triton.jit
def _strip_kernel(x, o1, o2, s1, s2, R, C, BR: tl.constexpr, BC: tl.constexpr):
    """row+col+s with one program a vertical strip of 8 tiles (strips row-major, so the programs in flight
    sit side by side as with row-major tiles): row block bytes per tile (4-byte runs for BC = 128), the
    strip's column block bytes at its end as 8 * BR / 32 = 32-byte runs (whole sectors for BR = 128)."""
    nc = tl.cdiv(C, BC)
    si = tl.program_id(0) // nc
    j = tl.program_id(0) % nc
    c = j * BC + tl.arange(0, BC)
    rk = j * (BC // 32) + tl.arange(0, BC // 32)
    for t in range(8):
        r = (si * 8 + t) * BR + tl.arange(0, BR)
        b = _high_byte(tl.load(x + r[:, None] * C + c[None, :]))
        tl.store(o1 + r[:, None] * C + c[None, :], b)
        tl.store(o2 + c[None, :] * R + r[:, None], b)
        tl.store(s1 + r[:, None] * (C // 32) + rk[None, :], _row_bytes(x, r, rk, C, False))
    kk = si * (8 * BR // 32) + tl.arange(0, 8 * BR // 32)
    tl.store(s2 + c[None, :] * (R // 32) + kk[:, None], _col_bytes(x, kk, c, C, False))  # [8 BR / 32, BC]


@triton.jit
def _rceil(amax):
    """E8M0 field of 2^ceil(log2(amax / 448)) for a normal FP32 amax holding a BF16 value (exact:
    448 = 1.75 * 2^8), and the FP32 multiplier 2^-(that exponent)."""
    bits = amax.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127 - 8 + ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)
    return (e + 127).to(tl.uint8), ((127 - e) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _mx_kernel(x, o1, o2, s1, s2, R, C, BC: tl.constexpr, ORDER: tl.constexpr):
    """Both directions of MXFP8 (RCEIL) for a 128 x BC tile, as 4-D [4, 32, BC/32, 32] = (row group g, row i
    in the group, column block q, column e in the block): row blocks reduce over e, column blocks over i."""
    ti, tj = _tile_of(tl.program_id(0), R, C, 128, BC, ORDER)
    g = tl.arange(0, 4)[:, None, None, None]
    i = tl.arange(0, 32)[None, :, None, None]
    q = tl.arange(0, BC // 32)[None, None, :, None]
    e = tl.arange(0, 32)[None, None, None, :]
    row = ti * 128 + g * 32 + i
    col = tj * BC + q * 32 + e
    f = tl.load(x + row * C + col).to(tl.float32)
    a = tl.abs(f)
    sr, mr = _rceil(tl.max(a, axis=3))  # [4, 32, BC/32]
    sc, mc = _rceil(tl.max(a, axis=1))  # [4, BC/32, 32]
    qr = tl.clamp(f * mr[:, :, :, None], -448.0, 448.0).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    qc = tl.clamp(f * mc[:, None, :, :], -448.0, 448.0).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    tl.store(o1 + row * C + col, qr)
    tl.store(o2 + col * R + row, qc)
    g3 = tl.arange(0, 4)[:, None, None]
    tl.store(s1 + (ti * 128 + g3 * 32 + tl.arange(0, 32)[None, :, None]) * (C // 32)
             + tj * (BC // 32) + tl.arange(0, BC // 32)[None, None, :], sr)
    tl.store(s2 + (tj * BC + tl.arange(0, BC // 32)[None, :, None] * 32 + tl.arange(0, 32)[None, None, :]) * (R // 32)
             + ti * 4 + g3, sc)


def pattern_bytes(pat, R, C):
    n = R * C
    pat = pat.rstrip("0")
    return {"copy_": 4 * n, "row": 3 * n, "row+row": 4 * n, "row+col": 4 * n, "row+s": 3 * n + n // 32,
            "col+s": 3 * n + n // 32}.get(pat, 4 * n + 2 * (n // 32))


def reference(x, pat, tile):
    """What each pattern must write, from PyTorch (mx: bench_quant.py's plain-PyTorch MXFP8, RCEIL)."""
    if pat == "mx":
        (q1, s1), (q2, s2) = torch_quant_rows(x), torch_quant_rows(x.t().contiguous())
        return {"o1": q1.view(torch.uint8), "o2": q2.view(torch.uint8), "s1": s1, "s2": s2}
    b = (x.view(torch.int16) >> 8).to(torch.uint8)
    R, C = x.shape
    idx = pat.endswith("0")
    pat = pat.rstrip("0")
    if idx:  # block bytes from the indices: (row + block) mod 256, (column + block) mod 256
        dev = x.device
        rb = ((torch.arange(R, device=dev)[:, None] + torch.arange(C // 32, device=dev)[None, :]) & 0xFF).to(torch.uint8)
        cbt = ((torch.arange(R // 32, device=dev)[:, None] + torch.arange(C, device=dev)[None, :]) & 0xFF).to(torch.uint8)
    else:  # the first element's byte of each block; cbt is [R/32, C]
        rb, cbt = b[:, ::32].contiguous(), b[::32, :].contiguous()
    if pat == "row+s":
        return {"o1": b, "s1": rb}
    if pat == "col+s":
        return {"o2": b.t().contiguous(), "s2": cbt.t().contiguous()}
    out = {"o1": b}
    if pat == "row+row":
        out["o2"] = b
    if pat.startswith("row+col"):
        out["o2"] = b.t().contiguous()
    if pat in ("row+col+s", "row+col+sv"):
        out["s1"], out["s2"] = rb, cbt.t().contiguous()
    if pat == "row+col+st":  # tile-major, tiles row-major: tile (i, j) = [BR rows x BC/32] then [BC cols x BR/32]
        br, bc = tile
        out["s1"] = rb.reshape(R // br, br, C // bc, bc // 32).permute(0, 2, 1, 3).reshape(-1)
        out["s2"] = cbt.reshape(R // br, br // 32, C // bc, bc).permute(0, 2, 3, 1).reshape(-1)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="16384x7168,65536x2048,32768x2880")
    ap.add_argument("--patterns", default=None, help="regex on the pattern names")
    ap.add_argument("--tiles", default=None, help="BRxBC,... instead of the default tile shapes")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--num-warps", type=int, default=8)
    args = ap.parse_args()
    timer, copy_bw = timer_and_copy_bandwidth(args.reps)
    for shape in args.shapes.split(","):
        R, C = (int(v) for v in shape.split("x"))
        x = torch.randn(R, C, device="cuda", dtype=torch.bfloat16)
        bufs = {"o1": torch.empty(R * C, device="cuda", dtype=torch.uint8),
                "o2": torch.empty(R * C, device="cuda", dtype=torch.uint8),
                "s1": torch.empty(R * C // 32, device="cuda", dtype=torch.uint8),
                "s2": torch.empty(R * C // 32, device="cuda", dtype=torch.uint8)}
        o = [bufs[k] for k in ("o1", "o2", "s1", "s2")]
        dst = torch.empty_like(x)
        items, labels = [(None, lambda: dst.copy_(x))], [("copy_", "-", "rows")]  # copy_ of this input's size
        tiles = (tuple(tuple(int(v) for v in t.split("x")) for t in args.tiles.split(",")) if args.tiles
                 else TILES + ((128, 64),))
        cases = [(pat, br, bc, order) for pat in PATTERNS for br, bc in tiles for order in ORDERS
                 if R % br == 0 and C % bc == 0 and (args.tiles or (br, bc) != (128, 64) or C % 128)]
        cases += [] if args.patterns else [("row+col+sv", br, bc, "rows") for br, bc in ((128, 128), (128, 64))
                                           if R % (8 * br) == 0 and C % bc == 0]
        cases += [] if args.patterns else [("mx", 128, bc, order) for bc in (64, 128) for order in ORDERS[::2]
                                           if C % bc == 0]
        if args.patterns:
            cases = [cs for cs in cases if re.search(args.patterns, cs[0])]
        refs = {}
        for pat, br, bc, order in cases:
            grid = ((R // br) * (C // bc),)
            if pat == "row+col+sv":
                grid = ((R // (8 * br)) * (C // bc),)

                def run(br=br, bc=bc, grid=grid):
                    _strip_kernel[grid](x, *o, R, C, BR=br, BC=bc, num_warps=args.num_warps)
            elif pat == "mx":
                def run(bc=bc, order=order, grid=grid):
                    _mx_kernel[grid](x, *o, R, C, BC=bc, ORDER=ORDERS.index(order), num_warps=args.num_warps)
            else:
                def run(pat=pat, br=br, bc=bc, order=order, grid=grid):
                    _pattern_kernel[grid](x, *o, R, C, BR=br, BC=bc, PAT=PAT_CODE[pat.rstrip("0")],
                                          ORDER=ORDERS.index(order), IDX=pat.endswith("0"), num_warps=args.num_warps)
            for t in o:
                t.fill_(0xAB)
            run()
            torch.cuda.synchronize()
            if (pat, br, bc) not in refs:
                refs = {(pat, br, bc): reference(x, pat, (br, bc))}  # one pattern's reference at a time (memory)
            for name, want in refs[(pat, br, bc)].items():
                got = bufs[name][: want.numel()].view(want.shape)
                if not torch.equal(got, want):
                    bad = (got != want).sum().item()
                    sys.exit(f"{shape} {pat} {br}x{bc} {order}: {bad} bytes of {name} differ from PyTorch")
            items.append((None, run))
            labels.append((pat, f"{br}x{bc}", order))
        refs = None
        times = timer.many(items)
        print(f"\n{shape}: % of copy (us), every output checked")
        print("pattern    | tile    | rows           | cols           | band8")
        rows = {}
        for (pat, tile, order), t in zip(labels, times):
            pct = 100 * pattern_bytes(pat, R, C) / (t * 1e-6) / 1e9 / copy_bw
            rows.setdefault((pat, tile), {})[order] = f"{pct:5.1f}% ({t:6.1f})"
        for (pat, tile), d in rows.items():
            print(f"{pat:10s} | {tile:7s} | " + " | ".join(f"{d.get(o, '-'):14s}" for o in ORDERS))


if __name__ == "__main__":
    main()
