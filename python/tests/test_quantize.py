"""Quantization ops against the plain-PyTorch reference (mxmoe.reference, written from
include/mxmoe/mx_format.h), bit for bit: dense 2-D and batched 3-D, row/column-wise, fast form,
both scale modes, named edge cases; expert-grouped and gather variants; padded offsets; routing
plan against a host stable sort."""
import pytest
import torch

from _util import assert_bytes_equal, fresh_seed, mxmoe

pytestmark = pytest.mark.gpu
DEV = "cuda"


def ref():
    return mxmoe.reference


def rand_bf16(*shape):
    """Gaussian rows with per-row magnitudes spread over 2^-20 .. 2^20, so blocks get many
    different scales (and fast-form chunks rebase blocks against larger neighbours)."""
    rows_shape = (*shape[:-1], 1)
    mag = torch.exp2(torch.randint(-20, 21, rows_shape, device=DEV).float())
    col_mag = torch.exp2(torch.randint(-6, 7, (shape[-1] // 32, 1), device=DEV).float()).repeat(1, 32).reshape(-1)
    return (torch.randn(*shape, device=DEV) * mag * col_mag).to(torch.bfloat16)


def check_quantize(x, rowwise, colwise, fast, mode, what):
    got = torch.ops.mxmoe.quantize_mxfp8(x, rowwise, colwise, fast, {"rceil": 0, "floor": 1}[mode])
    want = ref().quantize(x, rowwise, colwise, fast, mode)
    assert len(got) == len(want), what
    names = []
    for side, on in (("row", rowwise), ("col", colwise)):
        if on:
            names += [f"{side}.data", f"{side}.scales"] + ([f"{side}.fast_data", f"{side}.fast_scales"] if fast else [])
    for g, w, n in zip(got, want, names):
        assert_bytes_equal(g, w, f"{what} {n}")
    return got


@pytest.mark.parametrize("shape", [(256, 512), (96, 2880), (384, 160), (4, 256, 384), (3, 64, 2080)])
@pytest.mark.parametrize("mode", ["rceil", "floor"])
@pytest.mark.parametrize("sides", ["row", "col", "both"])
@pytest.mark.parametrize("fast", [False, True])
def test_quantize_matches_reference(shape, mode, sides, fast):
    seed = fresh_seed()
    x = rand_bf16(*shape)
    rowwise, colwise = sides in ("row", "both"), sides in ("col", "both")
    got = check_quantize(x, rowwise, colwise, fast, mode, f"shape={shape} {mode} {sides} fast={fast} seed={seed}")
    # Rerun: bitwise identical.
    again = torch.ops.mxmoe.quantize_mxfp8(x, rowwise, colwise, fast, {"rceil": 0, "floor": 1}[mode])
    for a, b in zip(got, again):
        assert_bytes_equal(a, b, "rerun")


def test_quantize_helper_layouts():
    fresh_seed()
    x = rand_bf16(256, 384)
    q = mxmoe.quantize(x, rowwise=True, colwise=True, fast=True)
    assert q.rowwise.data.shape == (256, 384) and q.rowwise.data.dtype == torch.float8_e4m3fn
    assert q.rowwise.scales.shape == (256, 12) and q.rowwise.scales.dtype == torch.uint8
    assert q.rowwise.fast_scales.shape == (3, 256)
    assert q.colwise.data.shape == (384, 256) and q.colwise.scales.shape == (384, 8)
    assert q.colwise.fast_scales.shape == (2, 384)
    only_row = mxmoe.quantize(x)
    assert only_row.colwise is None and only_row.rowwise.fast_data is None
    # dequantize is exact: E4M3 x E8M0 values, compared with the float64 reference.
    d32 = mxmoe.dequantize(q.rowwise.data, q.rowwise.scales)
    d64 = mxmoe.reference.dequantize(q.rowwise.data, q.rowwise.scales)
    assert torch.equal(d32.double(), d64)
    # The fast form represents the same values in each chunk's largest block (mx_format.h).
    f64 = mxmoe.dequantize_fast(q.rowwise.fast_data, q.rowwise.fast_scales, torch.float64)
    block_scale = q.rowwise.scales.repeat_interleave(32, dim=1)
    chunk_scale = q.rowwise.fast_scales.t().repeat_interleave(128, dim=1)[:, :384]
    same = block_scale == chunk_scale
    assert bool(same.any())
    assert torch.equal(f64[same], d64[same]), "fast form differs in a chunk's largest block"


def special_rows(cols):
    """Named edge cases, one per row (block 0 of each row holds the case, the rest is random)."""
    rows = []

    def row(block0):
        r = torch.randn(cols, device=DEV)
        r[:32] = block0
        return r

    z = torch.zeros(32, device=DEV)
    rows.append(row(z))                                               # all-zero block
    rows.append(row(-z))                                              # negative zeros: sign kept
    b = torch.randn(32, device=DEV); b[5] = 448.0; rows.append(row(b.clamp(-448, 448)))  # amax exactly 448
    b = torch.randn(32, device=DEV); b[7] = -448.0 * 2 ** 10; rows.append(row(b))        # amax 448·2^k
    rows.append(row(torch.randn(32, device=DEV) * 2.0 ** -130))       # BF16 subnormals, scale clamps to 2^-127
    rows.append(row(torch.randn(32, device=DEV) * 2.0 ** -120))       # tiny normals
    rows.append(row(torch.randn(32, device=DEV) * 2.0 ** 120))        # huge
    b = torch.randn(32, device=DEV); b[3] = float("nan"); rows.append(row(b))   # NaN block
    b = torch.randn(32, device=DEV); b[9] = float("inf"); rows.append(row(b))   # +Inf block
    b = torch.randn(32, device=DEV); b[0] = float("-inf"); rows.append(row(b))  # -Inf block
    # ties: values exactly halfway between E4M3 neighbours after scaling (amax 448 -> scale 1)
    b = torch.tensor([448.0, 1.0625, 1.1875, 17.0, 19.0, -1.0625, 0.0078125 * 1.5] + [0.5] * 25, device=DEV)
    rows.append(row(b))
    b = torch.full((32,), 2.0 ** -10, device=DEV); b[0] = 448.0; rows.append(row(b))  # far below the max
    while len(rows) % 32:
        rows.append(torch.randn(cols, device=DEV))
    return torch.stack(rows).to(torch.bfloat16)


@pytest.mark.parametrize("mode", ["rceil", "floor"])
def test_quantize_edge_cases(mode):
    seed = fresh_seed()
    x = special_rows(384)
    check_quantize(x, True, True, True, mode, f"edge cases {mode} seed={seed}")
    q = torch.ops.mxmoe.quantize_mxfp8(x, True, False, False, {"rceil": 0, "floor": 1}[mode])
    scales = q[1]
    assert int(scales[0, 0]) == 0x00, "all-zero block: scale byte 0"
    assert int(scales[7, 0]) == 0xFF and int(scales[8, 0]) == 0xFF, "NaN / Inf block: scale 0xFF"
    assert bool((q[0][7, :32].view(torch.uint8) == 0x7F).all()), "NaN block: data 0x7F"
    assert bool((q[0][1, :32].view(torch.uint8) == 0x80).all()), "negative zeros keep their sign"


def test_quantize_empty_rows():
    x = torch.empty(0, 64, dtype=torch.bfloat16, device=DEV)
    outs = torch.ops.mxmoe.quantize_mxfp8(x, True, False, True, 0)
    assert [tuple(t.shape) for t in outs] == [(0, 64), (0, 2), (0, 64), (1, 0)]


# ---- grouped / gather ----------------------------------------------------------------------------

def random_counts(groups, total_max):
    """Per-group row counts with empty groups, a hot group and counts that are not multiples of 128."""
    counts = torch.randint(0, total_max // groups + 1, (groups,))
    counts[torch.randperm(groups)[: max(1, groups // 4)]] = 0
    counts[int(torch.randint(0, groups, (1,)))] += 300
    return counts


def prefix(counts, align=1):
    c = (counts + align - 1) // align * align
    return torch.cat([torch.zeros(1, dtype=torch.int64), c.cumsum(0)]).to(torch.int32)


def check_padded_layout(outs, xp, used, rowwise, colwise, fast, mode, what):
    """outs (op order) against the reference of xp [used, C] (the padded layout, zero pad rows):
    only rows (columns for column-wise) below `used` are defined."""
    want = ref().quantize(xp, rowwise, colwise, fast, mode)
    i = 0
    for side, on in (("row", rowwise), ("col", colwise)):
        if not on:
            continue
        n = 4 if fast else 2
        g, w = outs[i:i + n], want[i:i + n]
        i += n
        if side == "row":
            cuts = [g[0][:used], g[1][:used]] + ([g[2][:used], g[3][:, :used]] if fast else [])
        else:
            cuts = [g[0][:, :used], g[1][:, :used // 32]] + ([g[2][:, :used], g[3][:used // 128]] if fast else [])
        for k, (a, b) in enumerate(zip(cuts, w)):
            assert_bytes_equal(a, b, f"{what} {side}[{k}]")


@pytest.mark.parametrize("mode", ["rceil", "floor"])
@pytest.mark.parametrize("sides", ["row", "col", "both"])
def test_quantize_grouped(mode, sides):
    seed = fresh_seed()
    groups, cols = 8, 384
    counts = random_counts(groups, 900)
    offsets, padded = prefix(counts), prefix(counts, 128)
    x_rows, used = int(offsets[-1]), int(padded[-1])
    out_rows = (used // 128 + 2) * 128  # capacity beyond what is used
    x = rand_bf16(x_rows, cols)
    d_off = offsets.to(DEV)
    d_pad = mxmoe.compute_padded_offsets(d_off)
    assert torch.equal(d_pad.cpu(), padded), "compute_padded_offsets disagrees with the host prefix sum"
    xp = torch.zeros(used, cols, dtype=torch.bfloat16, device=DEV)
    for g in range(groups):
        xp[int(padded[g]):int(padded[g]) + int(counts[g])] = x[int(offsets[g]):int(offsets[g + 1])]
    rowwise, colwise = sides in ("row", "both"), sides in ("col", "both")
    outs = torch.ops.mxmoe.quantize_mxfp8_grouped(x, d_off, d_pad, out_rows, rowwise, colwise, True,
                                                  {"rceil": 0, "floor": 1}[mode])
    check_padded_layout(outs, xp, used, rowwise, colwise, True, mode, f"grouped {mode} {sides} seed={seed}")
    # The helper computes the padded offsets itself.
    q = mxmoe.quantize_grouped(x, d_off, out_rows, rowwise=rowwise, colwise=colwise, fast=True, mode=mode)
    first = q.rowwise if rowwise else q.colwise
    assert_bytes_equal(first.data[:used] if rowwise else first.data[:, :used],
                       outs[0][:used] if rowwise else outs[0][:, :used], "helper vs op")


@pytest.mark.parametrize("with_rows_used", [False, True])
def test_quantize_gather(with_rows_used):
    seed = fresh_seed()
    x_rows, cols, out_rows = 300, 256, 640
    x = rand_bf16(x_rows, cols)
    idx = torch.randint(-1, x_rows + 5, (out_rows,), dtype=torch.int32)  # -1 and >= x_rows: zero rows
    used = 512 if with_rows_used else out_rows
    d_idx = idx.to(DEV)
    rows_used = torch.tensor([used], dtype=torch.int32, device=DEV) if with_rows_used else None
    outs = torch.ops.mxmoe.quantize_mxfp8_gather(x, d_idx, rows_used, True, True, True, 0)
    valid = (idx >= 0) & (idx < x_rows)
    xg = torch.zeros(out_rows, cols, dtype=torch.bfloat16, device=DEV)
    xg[valid.to(DEV)] = x[idx[valid].long().to(DEV)]
    check_padded_layout(outs, xg[:used], used, True, True, True, "rceil", f"gather seed={seed}")


def host_plan(ids, num_experts, capacity):
    """Stable counting sort of the flattened (token, slot) list by expert (moe_plan.h)."""
    flat = ids.reshape(-1).long()
    ok = (flat >= 0) & (flat < num_experts)
    counts = torch.bincount(flat[ok], minlength=num_experts).to(torch.int32)
    offsets = prefix(counts)
    padded = prefix(counts, 128)
    row_of = torch.full_like(flat, -1)
    row_index = torch.full((capacity,), -1, dtype=torch.int64)
    fill = padded[:-1].clone().long()
    for i in range(flat.numel()):
        e = int(flat[i])
        if 0 <= e < num_experts:
            row_of[i] = fill[e]
            row_index[fill[e]] = i // ids.shape[1]
            fill[e] += 1
    return counts, offsets, padded, row_of.reshape(ids.shape).to(torch.int32), row_index.to(torch.int32)


@pytest.mark.parametrize("tokens,top_k,experts", [(1, 1, 1), (37, 4, 8), (700, 8, 64), (0, 2, 4)])
def test_moe_plan(tokens, top_k, experts):
    seed = fresh_seed()
    ids = torch.stack([torch.randperm(experts)[:top_k] for _ in range(tokens)]).to(torch.int32) \
        if tokens else torch.empty(0, top_k, dtype=torch.int32)
    if tokens > 4:
        ids[0, 0] = -1          # invalid ids are dropped
        ids[1, 0] = experts     # also out of range
        ids[2:tokens // 2, 0] = 0  # a hot expert
    plan = mxmoe.moe_plan(ids.to(DEV), experts)
    cap = plan.row_index.shape[0]
    assert cap == (tokens * top_k + experts * 127 + 127) // 128 * 128
    want = host_plan(ids, experts, cap)
    for name, g, w in zip(plan._fields, plan, want):
        assert_bytes_equal(g.cpu(), w, f"plan.{name} T={tokens} k={top_k} E={experts} seed={seed}")


def _fast_pairs(q, rowwise, colwise):
    return [t for c, on in ((q.rowwise, rowwise), (q.colwise, colwise)) if on for t in (c.fast_data, c.fast_scales)]


@pytest.mark.parametrize("sides", ["row", "col", "both"])
def test_quantize_fast_only(sides):
    """plain=False writes the fast pair alone (on the staged kernels); its bytes equal the fast pair of
    plain + fast (the register-store kernel), for dense 2-D and 3-D, grouped and gathered inputs."""
    seed = fresh_seed()
    rowwise, colwise = sides in ("row", "both"), sides in ("col", "both")
    what = f"{sides} seed={seed}"
    for shape in [(384, 2880), (4, 256, 384), (160, 256)]:
        x = rand_bf16(*shape)
        both = mxmoe.quantize(x, rowwise=rowwise, colwise=colwise, fast=True)
        only = mxmoe.quantize(x, rowwise=rowwise, colwise=colwise, fast=True, plain=False)
        for c in (only.rowwise, only.colwise):
            assert c is None or (c.data is None and c.scales is None), what
        for g, w in zip(_fast_pairs(only, rowwise, colwise), _fast_pairs(both, rowwise, colwise)):
            assert_bytes_equal(g, w, f"dense {shape} {what}")
    counts = random_counts(6, 700)
    d_off = prefix(counts).to(DEV)
    used = int(prefix(counts, 128)[-1])
    x = rand_bf16(int(counts.sum()), 256)
    out_rows = used + 256
    kw = dict(rowwise=rowwise, colwise=colwise, fast=True)
    g_both = mxmoe.quantize_grouped(x, d_off, out_rows, **kw)
    g_only = mxmoe.quantize_grouped(x, d_off, out_rows, plain=False, **kw)
    idx = torch.randint(-1, x.shape[0], (out_rows,), dtype=torch.int32, device=DEV)
    a_both = mxmoe.quantize_gather(x, idx, **kw)
    a_only = mxmoe.quantize_gather(x, idx, plain=False, **kw)
    for name, only, both in (("grouped", g_only, g_both), ("gather", a_only, a_both)):
        for i, (g, w) in enumerate(zip(_fast_pairs(only, rowwise, colwise), _fast_pairs(both, rowwise, colwise))):
            if name == "grouped":  # rows (columns) past the used padded rows are not written
                g, w = _used(g, w, i, rowwise, colwise, used)
            assert_bytes_equal(g, w, f"{name} {what} buffer {i}")


def _used(g, w, i, rowwise, colwise, used):
    """The written part of fast buffer i of a grouped quantization: row-wise data [R, C] and fast
    scales [nck, R] (R = padded rows); column-wise data [C, R] and fast scales [R/128, C]."""
    row_copy = rowwise and i < 2
    if row_copy:
        return (g[:used], w[:used]) if i % 2 == 0 else (g[:, :used], w[:, :used])
    return (g[:, :used], w[:, :used]) if i % 2 == 0 else (g[:used // 128], w[:used // 128])


def test_quantize_fast_only_needs_fast():
    x = rand_bf16(128, 128)
    with pytest.raises(ValueError, match="plain"):
        mxmoe.quantize(x, fast=False, plain=False)
    q = mxmoe.quantize(x, fast=True, plain=False)
    with pytest.raises(ValueError, match="plain"):
        mxmoe.bf16_image(q.rowwise)
