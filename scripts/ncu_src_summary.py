#!/usr/bin/env python3
"""Summarise Nsight Compute's per-SASS-instruction export (`ncu -i REP --page source --csv
--print-source sass`, gzipped; scripts/gpu_run.sh writes it as OUT/ncu_*_src.csv.gz).

For each profiled launch: warp-stall samples by reason, executed instructions and samples by
opcode, and the instructions holding the most samples with their top three stall reasons.
Usage: scripts/ncu_src_summary.py FILE.csv.gz [LAUNCHES, e.g. 0,2] [TOP, default 15]
"""
import collections
import csv
import gzip
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def launches(path):
    """[(kernel name, header, rows)] in the order ncu wrote them."""
    out = []
    for r in csv.reader(gzip.open(path, "rt")):
        if r and r[0] == "Kernel Name":
            out.append([r[1], None, []])
        elif r and r[0] == "Address" and out:
            out[-1][1] = r
        elif r and r[0].startswith("0x") and out:
            out[-1][2].append(r)
    return out


def opcode(source):
    return re.sub(r"^@!?U?P\w+\s+", "", source.strip()).split(" ")[0]


def summarise(i, name, hdr, rows, top):
    ix = {n: k for k, n in enumerate(hdr)}
    samples = lambda r: int(r[ix[SAMPLES]])
    total_s = sum(samples(r) for r in rows) or 1
    total_i = sum(int(r[ix[EXECUTED]]) for r in rows) or 1
    m = re.search(r"kernel<(.*)>\(", name)
    print(f"== launch {i}: {m.group(1) if m else name[:100]}  samples={total_s} warp-instructions={total_i}")
    reasons = [c for c in hdr if c.startswith("stall_") and "Not Issued" not in c]
    by_reason = collections.Counter({c: sum(int(r[ix[c]]) for r in rows) for c in reasons})
    print("  by reason:", ", ".join(f"{c[6:]} {100 * v / total_s:.1f}%" for c, v in by_reason.most_common(10)))
    op_i, op_s = collections.Counter(), collections.Counter()
    for r in rows:
        op_i[opcode(r[ix["Source"]])] += int(r[ix[EXECUTED]])
        op_s[opcode(r[ix["Source"]])] += samples(r)
    print("  executed by opcode (%):", ", ".join(f"{o} {100 * v / total_i:.1f}" for o, v in op_i.most_common(20)))
    print("  samples by opcode (%):", ", ".join(f"{o} {100 * v / total_s:.1f}" for o, v in op_s.most_common(12)))
    for r in sorted(rows, key=lambda r: -samples(r))[:top]:
        why = sorted(((int(r[ix[c]]), c[6:]) for c in reasons), reverse=True)[:3]
        print(f"  {100 * samples(r) / total_s:5.1f}% {r[0][-5:]} {r[ix['Source']].strip()[:60]:60s}"
              f" exec={r[ix[EXECUTED]]} {why}")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    all_launches = launches(sys.argv[1])
    which = [int(a) for a in sys.argv[2].split(",")] if len(sys.argv) > 2 else range(len(all_launches))
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    for i in which:
        summarise(i, *all_launches[i], top)


if __name__ == "__main__":
    main()
