#!/usr/bin/env python3
"""The quantizer's memory-side ncu diagnostic (scripts/quant_ab.sh step 2): the metric list, and a
one-line-per-kernel summary of the report.

  ncu_quant_diag.py metrics QUERY_TXT [sure]   comma-separated --metrics: the candidates whose base
        name `ncu --query-metrics` (its output in QUERY_TXT) lists, plus every listed counter whose
        name says L2 eviction / write-back / fabric; `sure`: only metrics every recent ncu has on
        sm_90 (the fallback when the first list is refused).
  ncu_quant_diag.py summary RAW_CSV LABELS     RAW_CSV: `ncu -i REP --page raw --csv --print-units
        base`; LABELS: lines "label<TAB>expected read bytes<TAB>expected write bytes<TAB>kind" in launch
        order, and q / t (a quantize_mxfp8 kernel / a torch kernel) (bench/quant_variants.py --profile
        writes them).
  ncu_quant_diag.py sector-metrics             the --metrics of the L2 write-sector table below.
  ncu_quant_diag.py sectors RAW_CSV LABELS     that table (scripts/quant_tmas_ab.sh, quant_unit_ab.sh
        step 2): duration, L2 write sectors and requests, DRAM MB, L2 % per kernel; RAW_CSV from
        `ncu --metrics $(sector-metrics) --csv --page raw --print-units base`, LABELS as above.
"""
import csv
import re
import sys

SURE = [
    "gpu__time_duration.sum",
    "dram__bytes_read.sum", "dram__bytes_write.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_sectors_op_read.sum", "lts__t_sectors_op_write.sum",
    "lts__t_sector_op_read_hit_rate.pct", "lts__t_sector_op_write_hit_rate.pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "smsp__warps_eligible.avg.per_cycle_active",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
]
STALLS = ["long_scoreboard", "barrier", "wait", "short_scoreboard", "mio_throttle", "lg_throttle", "membar",
          "math_pipe_throttle", "not_selected", "selected", "branch_resolving", "dispatch_stall", "no_instruction",
          "sleeping", "drain", "misc", "imc_miss", "tex_throttle"]
STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
MORE = [
    "dram__cycles_active.avg.pct_of_peak_sustained_elapsed",  # DRAM busy vs dram__throughput: busy without bytes
    "dram__sectors_read.sum", "dram__sectors_write.sum",
    "lts__t_sectors_srcunit_ltcfabric.sum",                    # sectors crossing between the two L2 halves
    "lts__t_requests_srcunit_tex_op_write.sum", "lts__t_requests_srcunit_tex_op_read.sum",
    "lts__t_sectors_srcunit_tex_op_write.sum", "lts__t_sectors_srcunit_tex_op_read.sum",
    "lts__d_sectors_fill_device.sum", "lts__d_sectors_fill_sysmem.sum",
    "lts__t_sectors_op_atom.sum", "lts__t_sectors_op_red.sum",
] + [STALL.format(s) for s in STALLS]
AUTO = re.compile(r"^lts__\w*(evict|dirty|wb_|writeback|clean|ltcfabric)\w*$|^dram__\w*(activ|page|row|turn|refresh)\w*$")


def listed(query_txt):
    """{base metric name: the rest of its line} from `ncu --query-metrics` output."""
    names = {}
    for line in open(query_txt, errors="replace"):
        tok = line.split()
        if tok and re.fullmatch(r"[a-z0-9]+__\w+", tok[0]):
            names[tok[0]] = line
    return names


def metrics(query_txt, sure_only):
    if sure_only:
        return ",".join(SURE)
    names = listed(query_txt)
    if len(names) < 50:  # the query failed: no filter to trust
        return ",".join(SURE)
    keep = SURE + [m for m in MORE if m.split(".")[0] in names]
    auto = [n + ".sum" for n, line in sorted(names.items())
            if AUTO.match(n) and re.search(r"\bCounter\b", line) and not any(k.startswith(n + ".") for k in keep)]
    return ",".join(keep + auto)


def summary(raw_csv, labels_file):
    rows = list(csv.reader(open(raw_csv, errors="replace")))
    start = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if start is None:
        print("no ncu data rows (see the run log)")
        return
    hdr = rows[start]
    id_col = hdr.index("ID") if "ID" in hdr else 0
    data = [r for r in rows[start + 1:] if len(r) == len(hdr) and r[id_col].strip().isdigit()]
    labels = [l.rstrip("\n").split("\t") for l in open(labels_file)] if labels_file else []
    ix = {n: k for k, n in enumerate(hdr)}
    # the units row (when ncu scaled the values: --print-units base was not taken)
    units = rows[start + 1] if len(rows) > start + 1 and len(rows[start + 1]) == len(hdr) else [""] * len(hdr)
    scale = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "nsecond": 1, "usecond": 1e3, "msecond": 1e6,
             "sector": 1, "ksector": 1e3, "msector": 1e6}

    def val(r, name):
        k = ix.get(name)
        if k is None:
            return None
        try:
            return float(r[k].replace(",", "")) * scale.get(units[k].strip().lower(), 1)
        except ValueError:
            return None

    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    auto = [n for n in hdr if n.endswith(".sum") and AUTO.match(n[:-4])]
    # stall reasons: the per-issue ratios asked for, else whatever WarpStateStats brought
    stall_cols = [(n, m.group(1)) for n in hdr for m in [re.fullmatch(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio", n)] if m]
    if not stall_cols:
        stall_cols = [(n, m.group(1)) for n in hdr for m in [re.fullmatch(r"smsp__\w*issue_stalled_(\w+?)(_per\w+)?(\.\w+)*", n)] if m]
    print("label | us | DRAM read/write MB (expected) | DRAM GB/s | dram% | dram-active% | L2% | SM% | L2 hit rd/wr % "
          "| L2 sectors rd/wr M | fabric M | occupancy% | eligible | issue% | top stalls (warps per issue)")
    # labels in launch order, matched by kind (q: a quantize_mxfp8 kernel, t: a torch kernel), so
    # that a kernel the filter missed does not shift the others' labels
    queue = {"q": [l for l in labels if len(l) < 4 or l[3] == "q"], "t": [l for l in labels if len(l) >= 4 and l[3] == "t"]}
    for r in data:
        name = r[ix["Kernel Name"]]
        q = queue["q" if "quantize_mxfp8" in name else "t"]
        lab = q.pop(0) if q else ["?"]
        m = re.search(r"(\w+_kernel)(<[^>]*>)?", name)
        short = m.group(0) if m else name
        ns = val(r, "gpu__time_duration.sum")
        rd, wr = val(r, "dram__bytes_read.sum"), val(r, "dram__bytes_write.sum")
        exp = (f" ({float(lab[1]) / 1e6:.0f}/{float(lab[2]) / 1e6:.0f})" if len(lab) >= 3 else "")
        gbs = (rd + wr) / ns if ns and rd is not None and wr is not None else None
        st = sorted(((val(r, n) or 0.0, s) for n, s in stall_cols), reverse=True)[:4]
        sect = [val(r, "lts__t_sectors_op_read.sum"), val(r, "lts__t_sectors_op_write.sum")]
        fab = val(r, "lts__t_sectors_srcunit_ltcfabric.sum")
        print(f"{lab[0]} [{short[:60]}] | {f(ns and ns / 1e3, '.1f')} | {f(rd and rd / 1e6, '.0f')}/{f(wr and wr / 1e6, '.0f')}{exp}"
              f" | {f(gbs, '.0f')} | {f(val(r, 'dram__throughput.avg.pct_of_peak_sustained_elapsed'), '.1f')}"
              f" | {f(val(r, 'dram__cycles_active.avg.pct_of_peak_sustained_elapsed'), '.1f')}"
              f" | {f(val(r, 'lts__throughput.avg.pct_of_peak_sustained_elapsed'), '.1f')}"
              f" | {f(val(r, 'sm__throughput.avg.pct_of_peak_sustained_elapsed'), '.1f')}"
              f" | {f(val(r, 'lts__t_sector_op_read_hit_rate.pct'), '.1f')}/{f(val(r, 'lts__t_sector_op_write_hit_rate.pct'), '.1f')}"
              f" | {f(sect[0] and sect[0] / 1e6, '.1f')}/{f(sect[1] and sect[1] / 1e6, '.1f')}"
              f" | {f(fab and fab / 1e6, '.1f')}"
              f" | {f(val(r, 'sm__warps_active.avg.pct_of_peak_sustained_active'), '.1f')}"
              f" | {f(val(r, 'smsp__warps_eligible.avg.per_cycle_active'), '.2f')}"
              f" | {f(val(r, 'smsp__issue_active.avg.pct_of_peak_sustained_active'), '.1f')}"
              f" | " + " ".join(f"{s} {v:.2f}" for v, s in st if v))
        if auto:
            print("    " + ", ".join(f"{n[:-4]} {f(val(r, n), '.3g')}" for n in auto)[:600])


SECTORS = ["gpu__time_duration.sum", "lts__t_sectors_srcunit_tex_op_write.sum", "lts__t_requests_srcunit_tex_op_write.sum",
           "dram__bytes_read.sum", "dram__bytes_write.sum", "lts__throughput.avg.pct_of_peak_sustained_elapsed"]


def sectors(raw_csv, labels_file):
    rows = [r for r in csv.reader(l for l in open(raw_csv) if l.startswith('"'))]
    labels = [l.split("\t")[0] for l in open(labels_file) if l.strip()]
    if not rows:
        sys.exit("no ncu rows")
    head, data = rows[0], [r for r in rows[1:] if r and r[0].isdigit()]
    idx = [head.index(w) if w in head else None for w in SECTORS]
    print(f"{'label':26s} {'ns':>10s} {'wr sectors':>12s} {'wr requests':>12s} {'dram rd MB':>10s} {'dram wr MB':>10s} {'L2 %':>6s}")
    for i, r in enumerate(data):
        v = [r[j] if j is not None else "-" for j in idx]
        f = lambda s, d=1.0: f"{float(s.replace(',', '')) / d:.0f}" if s not in ("-", "") else "-"  # noqa: E731
        print(f"{labels[i] if i < len(labels) else '?':26s} {f(v[0]):>10s} {f(v[1]):>12s} {f(v[2]):>12s} "
              f"{f(v[3], 1e6):>10s} {f(v[4], 1e6):>10s} {v[5][:6]:>6s}")


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "sector-metrics":
        print(",".join(SECTORS))
        return
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    if sys.argv[1] == "sectors":
        sectors(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "metrics":
        print(metrics(sys.argv[2], len(sys.argv) > 3 and sys.argv[3] == "sure"))
    elif sys.argv[1] == "summary":
        summary(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
