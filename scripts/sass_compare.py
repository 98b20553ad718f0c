#!/usr/bin/env python3
"""Compare two `cuobjdump -sass` listings of the same kernels (before / after a change that must
leave the arithmetic alone, e.g. adding griddepcontrol or a prefetch).

Per kernel (matched by mangled name, the anonymous-namespace hash cut): instruction counts; the
opcodes added and removed (multiset, predicates and operands ignored); and the basic blocks'
arithmetic/memory opcode multisets (FP, conversions, shuffles, loads, stores, barriers; integer
address arithmetic, moves and HFMA2.MMA constant moves ignored) in block order: "same" when the
after-listing's blocks are the before-listing's plus new ones (listed). Register counts: compare
`cuobjdump -res-usage`.
Usage: scripts/sass_compare.py BEFORE.sass AFTER.sass
"""
import collections
import re
import sys

MATH = re.compile(r"^(F[A-Z0-9]|H[A-Z]|MUFU|SHFL|LDG|STG|LDS|STS|LD\.|ST\.|BAR|F2F|I2F|F2I|RED|ATOM|UBLKPF|ACQBULK|PREEXIT)")
BRANCH = re.compile(r"^(@!?U?P\w+\s+)?(BRA|EXIT|RET|CALL|JMP)")


def parse(path):
    """{kernel: [(address, instruction)]}, NOPs dropped."""
    out, name = {}, None
    for line in open(path):
        m = re.search(r"Function : (\S+)", line)
        if m:
            name = re.sub(r"_GLOBAL__N__\w+?_cu_[0-9a-f]+", "ANON", m.group(1))
            out[name] = []
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\*", line)
        if m and name and not m.group(2).startswith("NOP"):
            out[name].append((int(m.group(1), 16), m.group(2)))
    return out


def opcode(ins):
    return re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0]


def math_blocks(ins):
    """Per basic block (split at branch targets and after branches), its arithmetic multiset."""
    targets = {int(t, 16) for _, i in ins
               for t in re.findall(r"(?:BRA|CALL\.\S+|BSSY\s+B\d+,|JMP)\s+.*?0x([0-9a-f]+)", i)}
    blocks, cur = [], []
    for addr, i in ins:
        if addr in targets and cur:
            blocks.append(cur)
            cur = []
        cur.append(i)
        if BRANCH.match(i):
            blocks.append(cur)
            cur = []
    if cur:
        blocks.append(cur)
    ms = [collections.Counter(opcode(i) for i in b if MATH.match(opcode(i)) and not i.startswith("HFMA2.MMA"))
          for b in blocks]
    return [m for m in ms if m]


def main(before, after):
    b, a = parse(before), parse(after)
    for k in b:
        if k not in a:
            print(k, "missing after")
            continue
        cb = collections.Counter(opcode(i) for _, i in b[k])
        ca = collections.Counter(opcode(i) for _, i in a[k])
        mb, ma = math_blocks(b[k]), math_blocks(a[k])
        new = [dict(m) for m in ma if m not in mb]
        same = [m for m in ma if m in mb] == mb
        print(f"{k}\n  instructions {len(b[k])} -> {len(a[k])}; added {dict(ca - cb)}; removed {dict(cb - ca)}")
        print(f"  arithmetic per block: {'same' if same else 'DIFFERENT'}; blocks only after: {new}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
