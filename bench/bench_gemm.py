"""m-grouped MXFP8 GEMM benchmark (forward / dgrad shape: Y[M, N] = X[M, K] · W[e][N, K]ᵀ per
expert segment), mxmoe's fast and exact modes against, in the same process and run:
  * torch._grouped_mm            BF16 operands, BF16 out (offs = cumulative int32 segment ends)
  * torch._scaled_grouped_mm     FP8 E4M3 with row-wise FP32 scales (scale_a [M], scale_b [E, N])
  * Triton tl.dot_scaled         MXFP8 (E4M3 + E8M0 per 32), a small grouped kernel below
                                 (emulated on Hopper: upcast to BF16 before the MMA)
All four compute on the same padded layout (segments rounded up to 128 rows, pad rows zero), so
FLOPs = 2 · M_padded · N · K for everyone.

Timing: warm-up, L2 flush (zero a 512 MB buffer) before each rep, CUDA events, median.
Verification: mxmoe's timed output against the BF16 baseline, relative Frobenius norm over the
token rows < 0.08 (MX quantization of both operands alone gives ~3.7% on Gaussian data, DESIGN §2;
fast and exact differ from each other by far less).

Each line: shape | mode | us | TFLOP/s | ×BF16 | ×FP8-rowwise | ×triton | ×default | GB/s
(ratios > 1: mxmoe faster). With --wgrad, also the k-grouped wgrad GEMM (dW[e] = Σ dY[t]ᵀ X[t])
against torch._grouped_mm 2-D × 2-D (BF16, groups along the reduced dimension).
Exact mode reads BF16 images of the MX operands (gemm.h); they are made by mxmoe's
dequantize_mxfp8_bf16 outside the timed region, as a caller that reuses them would. Per case two
more lines make the cost of the images visible:
  "mxmoe-dequant"        time to make both operands' images (A and B, two calls), its GB/s (bytes
                         read + written: 3 + 1/32 per element) and % of the copy bandwidth measured
                         at the start of the run;
  "mxmoe-exact+dequant"  exact GEMM + both images, i.e. exact mode when no image is reused.
Fast mode's kernel path follows MXMOE_GEMM_MULTICAST and MXMOE_GEMM_TILE (read by the library on
every call; unset = the default path). --multicast-both and --tile-both time the alternative paths
beside the default one in the same run, on the same data: "mxmoe-fast" then runs with
MXMOE_GEMM_TILE=128 MXMOE_GEMM_MULTICAST=0, "mxmoe-fast-mc" with MXMOE_GEMM_MULTICAST=1 (2-CTA
clusters sharing the A tile by TMA multicast), "mxmoe-fast-192" with MXMOE_GEMM_TILE=192 (128 × 192
tiles, one accumulator per math warpgroup; m-grouped BF16 output through the TMA-store epilogue) and
"mxmoe-fast-192d" with MXMOE_GEMM_TILE=192 MXMOE_GEMM_TMA_STORE=0 (the same tiles, direct stores).
Exact mode's path follows MXMOE_GEMM_EXACT_TILE (256, the
default, or 128); --exact-multicast adds "mxmoe-exact-mc" (m-grouped exact mode as 2-CTA clusters
sharing B, MXMOE_GEMM_EXACT_MULTICAST=1); --exact-tile-both times "mxmoe-exact" with MXMOE_GEMM_EXACT_TILE=256 and
"mxmoe-exact-128" with 128 and "mxmoe-exact-256d" with 256 and MXMOE_GEMM_TMA_STORE=0 (direct stores).
--k-order-both adds, to each wgrad case, "mxmoe-fast-kidx" and "mxmoe-exact-kidx": the k-grouped
schedule walking the experts in index order (MXMOE_GEMM_K_ORDER=index) instead of the default,
largest token count first. --k-raster-both adds the other tile orders within an expert for each mode
(the defaults: fast mode n-tile-major; exact mode groups of G n-tiles walked k-tile by k-tile for every
expert, gemm.md "Run 87"): "mxmoe-fast-group" (MXMOE_GEMM_K_RASTER=group), "mxmoe-exact-nmajor"
(=nmajor) and "mxmoe-exact-group" (=group, the same order as exact mode's default). --k-raster-groups
G1,G2,... adds "mxmoe-exact-gG" (MXMOE_GEMM_K_RASTER=G: groups of G n-tiles for every expert, 0 =
n-major; exact's default G is round(sqrt(grid * 256 / 128)) = 16 on 132 SMs), --k-raster-groups-fast
the same for fast mode ("mxmoe-fast-gG"). Each alternative's output must be bitwise equal to its
mode's default line; the column xdefault is the default line's time / the alternative's.
Exact wgrad reads token-blocked images ([M/128][rows][128], dequantize_mxfp8_bf16_token_blocked), as
the layer does; its "mxmoe-dequant" line times making those. --wgrad-rowimg adds "mxmoe-exact-rowimg":
the same GEMM on row-major images [rows, M] (bitwise equal output required).
--fast-block adds, to each m-grouped case, "mxmoe-fast-blk": fast mode with the weights (B) in the
128x128-block form (gemm.h FastScaleLayout::kBlock128), made from B's MX copy by the library's
rebase_mxfp8_fast_block128 (outside the GEMM's timed region; its own time and GB/s are printed, and
its output must equal an independent PyTorch construction, torch_block_rebase, bit for bit) and timed in alternation with the others. It is a
different operand from mxmoe-fast's, so its output is not compared bitwise; it must pass the same
verification, and both fast lines then show their relative Frobenius error against the BF16
baseline in the last column (accuracy measured, not assumed), the blk line also its speed-up over
mxmoe-fast. With --wgrad it adds the same line to each wgrad case: Xᵀ [K, M] in 128x128 blocks (128
rows of K x 128 tokens; rebase_mxfp8_fast_block128 with one matrix, made outside the timed region),
checked against the BF16 baseline like the other lines.
--tpe, --experts, --routing and --wgrad-only select cases for diagnostics (--experts replaces every
shape's expert count; the shape lines say E=...).
Usage: python3 bench/bench_gemm.py [--json OUT.json] [--quick] [--wgrad] [--multicast-both]
                                   [--tile-both] [--exact-multicast] [--exact-tile-both] [--k-order-both] [--wgrad-rowimg]
                                   [--fast-block]
                                   [--tpe 512,2048] [--experts E] [--routing uniform] [--wgrad-only]
                                   [--shapes Qwen3-30B] [--reps 15]
"""
import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (Timer, check, copy_bandwidth, device_info, kernel_env, load_lib, print_table, ptr, rebase_block128,  # noqa: E402
                    require_gpu, write_json)
from bench_quant import pow2_from_field, torch_quant_rows, torch_rebase  # noqa: E402  (MX quantizer in plain PyTorch)

import ctypes  # noqa: E402

FAST, EXACT = 0, 1
MULTICAST_ENV = "MXMOE_GEMM_MULTICAST"
TILE_ENV = "MXMOE_GEMM_TILE"
EXACT_TILE_ENV = "MXMOE_GEMM_EXACT_TILE"
EXACT_TILE_BOTH = False  # --exact-tile-both (set in main)
EXACT_MULTICAST_ENV = "MXMOE_GEMM_EXACT_MULTICAST"
EXACT_MULTICAST = False  # --exact-multicast (set in main): m-grouped exact also as 2-CTA clusters sharing B
K_ORDER_BOTH = False  # --k-order-both (set in main): wgrad also with MXMOE_GEMM_K_ORDER=index
K_RASTER_BOTH = False  # --k-raster-both (set in main): wgrad also with each mode's other tile order
K_RASTER_GROUPS = []  # --k-raster-groups (set in main): wgrad exact mode also with these raster group sizes
K_RASTER_GROUPS_FAST = []  # --k-raster-groups-fast: the same for fast mode
WGRAD_ROWIMG = False  # --wgrad-rowimg (set in main): exact wgrad also on row-major images
FAST_BLOCK = False  # --fast-block (set in main): m-grouped fast mode also with B in 128x128 blocks
ROW128, BLOCK128 = 0, 1  # B's fast scale layouts (gemm.h FastScaleLayout; the C ABI's b_fast_scale_layout)
ROW_MAJOR, TOKEN_BLOCKED = 0, 1  # image layouts (gemm.h ImageLayout; the C ABI's image_layout)
COPY_GBS = None  # device-to-device copy bandwidth measured in main (GB/s, read + write)
BF16_OUT = 0
VERIFY_TOL = 0.08
MEM_BUDGET = 90e9  # bytes of GPU memory a case may use

# (name, E, N, K): model shapes of DESIGN.md §6. gate-up: N = 2·I, K = H; down: N = H, K = I.
SHAPES = [
    ("Qwen3-30B gate-up", 128, 1536, 2048),
    ("Qwen3-30B down", 128, 2048, 768),
    ("Qwen3-235B gate-up", 128, 3072, 4096),
    ("Qwen3-235B down", 128, 4096, 1536),
    ("DSV3-EP8 gate-up", 32, 4096, 7168),
    ("DSV3-EP8 down", 32, 7168, 2048),
]
TOKENS_PER_EXPERT = [512, 2048, 8192]


def setup_lib(lib):
    f = lib.mxmoe_m_grouped_mxfp8_gemm_nt_layout
    vp, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    # per operand: data, scales, fast_data, fast_scales, image; B's fast scale layout after B's
    f.argtypes = [vp] * 5 + [i64] + [vp] * 5 + [i32, i32, i64, i64, vp, vp, i32, i32, i32, vp]
    f.restype = i32
    g = lib.mxmoe_k_grouped_mxfp8_gemm_nt_layout
    # ..., mode, out_dtype, accumulate, num_sms, image_layout, b_fast_scale_layout, stream
    g.argtypes = [vp] * 10 + [i64, i32, i64, i64, vp, vp, i32, i32, i32, i32, i32, i32, vp]
    g.restype = i32
    lib.mxmoe_gemm_last_error.restype = ctypes.c_char_p


def routing_counts(E, tokens_per_expert, skewed, gen):
    """Tokens per expert. Uniform: all equal. Skewed: the same total, 3 hot experts take 40%,
    ~15% of experts empty, the rest drawn from a long-tailed distribution."""
    total = E * tokens_per_expert
    if not skewed:
        return [tokens_per_expert] * E
    perm = torch.randperm(E, generator=gen).tolist()
    hot, empty = perm[:3], set(perm[3:3 + max(1, (15 * E) // 100)])
    counts = [0] * E
    for h in hot:
        counts[h] = int(0.4 * total / 3)
    rest = [e for e in range(E) if e not in empty and e not in hot]
    w = torch.rand(len(rest), generator=gen) ** 3 + 0.01
    left = total - sum(counts)
    share = (w / w.sum() * left).floor().long().tolist()
    for e, s in zip(rest, share):
        counts[e] = s
    counts[rest[0]] += total - sum(counts)
    return counts


def padded_offsets(counts):
    offs = [0]
    for c in counts:
        offs.append(offs[-1] + (c + 127) // 128 * 128)
    return offs


def quant_rows_chunked(x, rows_per_chunk=16384):
    """MX row-wise quantization of x [R, K] bf16 in row chunks (bounded temporaries):
    data u8 [R, K], scales u8 [R, K/32], fast data u8 [R, K], fast scales u8 [ceil(K/128), R]."""
    R, K = x.shape
    nck = (K + 127) // 128
    data = torch.empty(R, K, dtype=torch.uint8, device="cuda")
    scales = torch.empty(R, K // 32, dtype=torch.uint8, device="cuda")
    fdata = torch.empty(R, K, dtype=torch.uint8, device="cuda")
    fscales = torch.empty(nck, R, dtype=torch.uint8, device="cuda")
    for r0 in range(0, R, rows_per_chunk):
        r1 = min(R, r0 + rows_per_chunk)
        q, sb = torch_quant_rows(x[r0:r1])
        fq, fs = torch_rebase(q, sb)
        data[r0:r1] = q.view(torch.uint8)
        scales[r0:r1] = sb
        fdata[r0:r1] = fq.view(torch.uint8)
        fscales[:, r0:r1] = fs
    return data, scales, fdata, fscales


def torch_block_rebase(data, scales, E, N, K, pitch):
    """The 128x128-block fast form of B [E, N, K] from its MX copy (data u8 [E·N, K] E4M3, scales u8
    [E·N, K/32] E8M0), as ref::rebase_fast_block128 defines it: per (expert, 128-row block, 128-chunk)
    E = the largest 32-block exponent of the block, every element E4M3_rne(decode(q) · 2^(e_b - E)),
    a NaN scale poisons the block (scale 0xFF, data 0x7F). Returns (fast data u8 [E·N, K], scales u8
    [E, ceil(K/128), pitch], padding bytes 0). Expert by expert (bounded temporaries).
    The cast: q · 2^(e_b - E) with e_b <= E is at most 448 in magnitude and exact in FP32 (a power of two
    times an E4M3 value; shifts below 2^-126 give exact 0, which E4M3 would round to 0 anyway), and
    PyTorch's float -> float8_e4m3fn conversion rounds to nearest even (overflow to NaN only above 464,
    not reachable here), so this is the reference's rounding; check_block_form verifies it."""
    nck, nrb, nb = (K + 127) // 128, (N + 127) // 128, K // 32
    fdata = torch.empty(E * N, K, dtype=torch.uint8, device="cuda")
    fscales = torch.zeros(E, nck, pitch, dtype=torch.uint8, device="cuda")
    for e in range(E):
        sb = scales[e * N:(e + 1) * N].to(torch.int32)  # [N, nb]
        # pad to whole blocks with byte 0 (e = -127: never raises a maximum)
        sbp = torch.nn.functional.pad(sb, (0, 4 * nck - nb, 0, 128 * nrb - N))
        bmax = sbp.view(nrb, 128, nck, 4).amax(dim=(1, 3))  # [nrb, nck]; 255 (NaN) wins: poisoned
        emax_el = bmax.repeat_interleave(128, 0)[:N].repeat_interleave(4, 1)[:, :nb]  # [N, nb]
        d = sb - emax_el
        mult = torch.where(d >= -126, pow2_from_field((d + 127).clamp(min=1)), torch.zeros_like(d, dtype=torch.float32))
        q = data[e * N:(e + 1) * N].view(torch.float8_e4m3fn).float().view(N, nb, 32)
        fq = (q * mult.unsqueeze(-1)).to(torch.float8_e4m3fn).view(torch.uint8).view(N, K)
        poisoned = (emax_el == 255).repeat_interleave(32, 1)
        fdata[e * N:(e + 1) * N] = torch.where(poisoned, torch.full_like(fq, 0x7F), fq)
        fscales[e, :, :nrb] = bmax.t().to(torch.uint8)
    return fdata, fscales


def pow2_f64(e):
    """FP64 2^e, exact, for an integer tensor e in [-1022, 1023] (built from the exponent field:
    torch.pow(2.0, x) on the GPU is not exact to the last bit in float64)."""
    return ((e.to(torch.int64) + 1023) << 52).view(torch.float64)


def check_block_form(b_d, b_s, fdata, fscales, E, N, K):
    """The block form against its definition (ref::rebase_fast_block128), evaluated here independently of
    the torch cast: per block of exponent E_b (the stored scale byte), every element must be
    E4M3_rne_satfinite(v / 2^(E_b-127)) · 2^(E_b-127) with v = decode(q)·2^(e-127) its MX value, rounded
    here in float64 with torch.round (half to even) at E4M3's quantum (2^(x-3) for a normal of exponent x,
    2^-9 below 2^-6: subnormals); NaN exactly in the blocks whose scale is 0xFF. Elements far below
    their block's maximum are legitimately re-rounded or flushed to 0: counted, not errors. Raises on a
    mismatch with the definition; returns (changed, flushed, total) over finite blocks."""
    nb = K // 32
    changed = flushed = total = 0
    for e in range(E):
        sb = b_s[e * N:(e + 1) * N].to(torch.int32)
        mx = b_d[e * N:(e + 1) * N].view(torch.float8_e4m3fn).double().view(N, nb, 32) * pow2_f64(
            sb - 127).unsqueeze(-1)
        bs = fscales[e, :, :(N + 127) // 128].t().to(torch.int32)  # [nrb, nck]
        emax = bs.repeat_interleave(128, 0)[:N].repeat_interleave(4, 1)[:, :nb]  # [N, nb]
        unit = pow2_f64(emax - 127).unsqueeze(-1)
        blk = fdata[e * N:(e + 1) * N].view(torch.float8_e4m3fn).double().view(N, nb, 32) * unit
        v = mx / unit  # exact (power of two); |v| <= 448 where the block scale is the block's maximum
        _, ex = torch.frexp(v)  # |v| = m·2^ex, m in [0.5, 1): E4M3 exponent ex - 1, at least -6
        quantum = pow2_f64(torch.clamp(ex - 1, min=-6) - 3)
        want = (torch.round(v / quantum) * quantum).clamp(-448.0, 448.0) * unit
        poisoned = (emax == 255).unsqueeze(-1).expand_as(blk)  # a NaN block of the MX copy: the whole block NaN
        bad = torch.where(poisoned, ~torch.isnan(blk), torch.isnan(blk) | (blk != want))
        if bool(bad.any()):
            idx = bad.nonzero()[0].tolist()
            raise RuntimeError(f"block form of B, expert {e}, row {idx[0]}, col {32 * idx[1] + idx[2]}: "
                               f"{float(blk[tuple(idx)])}, definition {float(want[tuple(idx)])} "
                               f"(MX {float(mx[tuple(idx)])}, block scale byte {int(emax[idx[0], idx[1]])})")
        ok = ~poisoned
        changed += int(((blk != mx) & ok).sum())
        flushed += int(((blk == 0) & (mx != 0) & ok).sum())
        total += int(ok.sum())
    return changed, flushed, total


def rowwise_fp8(x):
    """Per-row FP8 E4M3 with FP32 scale = amax/448 (1 for zero rows): (fp8 [R, K], scale [R])."""
    R = x.shape[0]
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device="cuda")
    s = torch.empty(R, dtype=torch.float32, device="cuda")
    for r0 in range(0, R, 16384):
        xs = x[r0:r0 + 16384].float()
        amax = xs.abs().amax(-1)
        sc = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
        q[r0:r0 + 16384] = (xs / sc[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
        s[r0:r0 + 16384] = sc
    return q, s


# ---- Triton MXFP8 baseline -----------------------------------------------------------------------
_triton_kernel = None
_triton_error = None


def get_triton_kernel():
    global _triton_kernel, _triton_error
    if _triton_kernel is not None or _triton_error is not None:
        return _triton_kernel
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def mx_grouped_kernel(a_ptr, as_ptr, b_ptr, bs_ptr, y_ptr, tile_expert_ptr, N, K,
                              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
            pid_m = tl.program_id(0)
            pid_n = tl.program_id(1)
            e = tl.load(tile_expert_ptr + pid_m)
            rm = pid_m * BM + tl.arange(0, BM)
            rn = pid_n * BN + tl.arange(0, BN)
            rk = tl.arange(0, BK)
            rs = tl.arange(0, BK // 32)
            K32 = K // 32
            brow = e * N + rn
            nmask = rn < N
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for k0 in range(0, K, BK):
                kmask = (k0 + rk) < K
                smask = (k0 // 32 + rs) < K32
                a = tl.load(a_ptr + rm[:, None].to(tl.int64) * K + (k0 + rk)[None, :], mask=kmask[None, :], other=0.0)
                a_s = tl.load(as_ptr + rm[:, None].to(tl.int64) * K32 + (k0 // 32 + rs)[None, :], mask=smask[None, :], other=0)
                b = tl.load(b_ptr + brow[None, :].to(tl.int64) * K + (k0 + rk)[:, None],
                            mask=nmask[None, :] & kmask[:, None], other=0.0)
                b_s = tl.load(bs_ptr + brow[:, None].to(tl.int64) * K32 + (k0 // 32 + rs)[None, :],
                              mask=nmask[:, None] & smask[None, :], other=0)
                acc = tl.dot_scaled(a, a_s, "e4m3", b, b_s, "e4m3", acc)
            y = acc.to(tl.bfloat16)
            tl.store(y_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], y, mask=nmask[None, :])

        _triton_kernel = mx_grouped_kernel
    except Exception as ex:  # noqa: BLE001
        _triton_error = f"{type(ex).__name__}: {ex}"
    return _triton_kernel


def triton_mx(a_data, a_scales, b_data, b_scales, y, offsets_dev, E, N, K):
    kern = get_triton_kernel()
    M = a_data.shape[0]
    mt = torch.arange(0, M, 128, device="cuda", dtype=torch.int32)
    tile_expert = (torch.searchsorted(offsets_dev[1:].contiguous(), mt, right=True)).to(torch.int32)
    a8, b8 = a_data.view(torch.float8_e4m3fn), b_data.view(torch.float8_e4m3fn)
    grid = (M // 128, (N + 127) // 128)

    def run():
        kern[grid](a8, a_scales, b8, b_scales, y, tile_expert, N, K, BM=128, BN=128, BK=128,
                   num_warps=8, num_stages=3)
    return run


# ---- one case ------------------------------------------------------------------------------------
def rel_frob(x, ref, rows, chunk=65536):
    """||x - ref|| / ||ref|| over the rows where the mask `rows` is True, in row chunks (an FP32 copy
    of a whole 1M-row output is 16 GB: run 81's out-of-memory), summed in FP64."""
    num = den = 0.0
    for r0 in range(0, x.shape[0], chunk):
        m = rows[r0:r0 + chunk]
        xs, rs = x[r0:r0 + chunk][m].float(), ref[r0:r0 + chunk][m].float()
        num += float((xs - rs).double().pow(2).sum())
        den += float(rs.double().pow(2).sum())
    return math.sqrt(num) / max(math.sqrt(den), 1e-30)


def case_bytes(M, E, N, K):
    # per operand element: BF16 source, MX data, fast data, FP8 row-wise copy, BF16 image, scales
    return (M * K * (2 + 1 + 1 + 1 + 2 + 1 / 16) + E * N * K * (2 + 1 + 1 + 1 + 2 + 1 / 16 + (1 if FAST_BLOCK else 0))
            + M * N * 2 * 5 + 2 * M * K * 4 / 8)


def make_images(lib, parts, layout=ROW_MAJOR):
    """BF16 images of MX tensors with mxmoe's dequantize_mxfp8_bf16 (or, layout TOKEN_BLOCKED,
    dequantize_mxfp8_bf16_token_blocked: [C/128][R][128], held in a tensor of the same shape):
    parts = [(data, scales)], data u8 [R, C]. Returns (images, run) where run() remakes all of them
    (what is timed)."""
    imgs = [torch.empty(d.shape, dtype=torch.bfloat16, device="cuda") for d, _ in parts]
    fn = lib.mxmoe_dequantize_mxfp8_bf16_token_blocked if layout == TOKEN_BLOCKED else lib.mxmoe_dequantize_mxfp8_bf16

    def run():
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        for (d, sc), img in zip(parts, imgs):
            check(lib, fn(ptr(d), ptr(sc), d.shape[0], d.shape[1], ptr(img), stream))
    run()
    return imgs, run


def dequant_lines(timer, run_images, parts, shape, row, table):
    """Times making the images (both operands) and adds the "mxmoe-dequant" line; returns its time."""
    t = timer(run_images)
    elems = sum(d.numel() for d, _ in parts)
    gbs = elems * (3 + 1 / 32) / (t * 1e-6) / 1e9
    row["dequant_us"], row["dequant_GBps"], row["dequant_pct_copy"] = t, gbs, 100 * gbs / COPY_GBS
    table.append([shape, "mxmoe-dequant", f"{t:.1f}", "", "", "", "", "",
                  f"{gbs:.0f} ({100 * gbs / COPY_GBS:.0f}% copy)"])
    return t


def exact_plus_dequant_line(t_exact, t_deq, shape, flops, t_bf16, row, table):
    t = t_exact + t_deq
    row["mxmoe-exact+dequant_us"] = t
    table.append([shape, "mxmoe-exact+dequant", f"{t:.1f}", f"{flops / t / 1e6:.0f}", f"{t_bf16 / t:.2f}",
                  "", "", "", ""])


def token_row_mask(offs, counts, M):
    """True for the rows [offs[e], offs[e] + counts[e]) that hold tokens (the rest are padding)."""
    mask = torch.zeros(M, dtype=torch.bool, device="cuda")
    for e, c in enumerate(counts):
        mask[offs[e]:offs[e] + c] = True
    return mask


def mxmoe_variants(multicast_both, tile_both, m_grouped=True):
    """(mode, name, environment for the call or None, default line it is compared with or None) for
    each timed mxmoe line; the alternative paths ("mxmoe-fast-*", "mxmoe-exact-128") follow their
    mode's default line, which then runs pinned to the default path."""
    alts = []
    if multicast_both:
        alts.append((FAST, "mxmoe-fast-mc", {MULTICAST_ENV: "1", TILE_ENV: "128"}, "mxmoe-fast"))
    if tile_both:
        alts.append((FAST, "mxmoe-fast-192", {MULTICAST_ENV: "0", TILE_ENV: "192"}, "mxmoe-fast"))
        # the 192-wide kernel with direct stores instead of the TMA-store epilogue (5 stages, not 4)
        alts.append((FAST, "mxmoe-fast-192d", {MULTICAST_ENV: "0", TILE_ENV: "192", "MXMOE_GEMM_TMA_STORE": "0"},
                     "mxmoe-fast"))
    fast_env = {MULTICAST_ENV: "0", TILE_ENV: "128"} if alts else None
    exact_env = None
    if EXACT_TILE_BOTH or EXACT_MULTICAST:  # the default line pinned to the default path
        exact_env = {EXACT_TILE_ENV: "256", EXACT_MULTICAST_ENV: "0"}
    exact = [(EXACT, "mxmoe-exact", exact_env, None)]
    if EXACT_MULTICAST and m_grouped:  # 2-CTA clusters sharing B (pairs of m-tiles; m-grouped only)
        exact.append((EXACT, "mxmoe-exact-mc", {EXACT_TILE_ENV: "256", EXACT_MULTICAST_ENV: "1"}, "mxmoe-exact"))
    if EXACT_TILE_BOTH:
        exact.append((EXACT, "mxmoe-exact-128", {EXACT_TILE_ENV: "128"}, "mxmoe-exact"))
        # the 256-wide kernel with direct stores instead of the TMA-store epilogue (4 stages, not 3)
        exact.append((EXACT, "mxmoe-exact-256d", {EXACT_TILE_ENV: "256", "MXMOE_GEMM_TMA_STORE": "0"},
                      "mxmoe-exact"))
    return [(FAST, "mxmoe-fast", fast_env, None)] + alts + exact


def annotate_fast_blk(table, shape, row):
    """--fast-block: both fast lines of `shape` show their relative Frobenius error against the BF16
    baseline (accuracy measured, not assumed), the blk line also its speed-up over mxmoe-fast."""
    for line in table:
        if line[0] == shape and line[1] in ("mxmoe-fast", "mxmoe-fast-blk"):
            line[-1] = f"relfrob vs BF16 {row[line[1] + '_vs_bf16_relfrob']:.5f}" + (
                f", x fast {row['mxmoe-fast_us'] / row['mxmoe-fast-blk_us']:.3f}" if line[1] == "mxmoe-fast-blk"
                else "") + line[-1]


def time_all(timer, timed):
    """{name: median us} of timed = [(name, env or None, fn)], timed in alternation (Timer.many)."""
    return dict(zip([name for name, _, _ in timed], timer.many([(env, fn) for _, env, fn in timed])))


def record_variant(row, table, outs, y, mname, base, t, flops, err, ok, shape, ratios):
    """Records one timed mxmoe line: an alternative path (base = its mode's default line) must be
    bitwise equal to that line's output (same elements, same arithmetic); a default line keeps its
    output for the comparisons."""
    same = True
    if base:
        same = bool(torch.equal(y.view(torch.int16), outs[base].view(torch.int16)))
        row[f"{mname}_bitwise_equal"] = same
        ok = ok and same
    else:
        outs[mname] = y.clone()
    row[f"{mname}_us"] = t
    row[f"{mname}_TFLOPs"] = flops / t / 1e6
    row[f"{mname}_vs_bf16_relfrob"] = err
    row[f"{mname}_ok"] = ok
    table.append([shape, mname, f"{t:.1f}", f"{flops / t / 1e6:.0f}", *ratios,
                  f"{row[f'{base}_us'] / t:.2f}" if base else "", ""])
    if not ok:
        table[-1][-1] += (f"  VERIFY FAILED relfrob={err:.3g}"
                          + ("" if same else " (not bitwise equal to the default path's output)"))


def run_case(lib, timer, name, E, N, K, tpe, skewed, gen, results, table, multicast_both=False,
             tile_both=False):
    counts = routing_counts(E, tpe, skewed, gen)
    offs = padded_offsets(counts)
    M = offs[-1]
    note = ""
    while case_bytes(M, E, N, K) > MEM_BUDGET and E > 8:  # shrink E for the largest cases
        E //= 2
        counts = routing_counts(E, tpe, skewed, gen)
        offs = padded_offsets(counts)
        M = offs[-1]
        note = f" (E reduced to {E} to fit {MEM_BUDGET / 1e9:.0f} GB)"
    shape = f"{name} E={E} N={N} K={K} T/e={tpe} {'skewed' if skewed else 'uniform'}{note}"
    flops = 2.0 * M * N * K
    token_rows = token_row_mask(offs, counts, M)

    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    x[~token_rows] = 0
    w = (torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) * (1.0 / math.sqrt(K))).to(torch.bfloat16)
    offsets_dev = torch.tensor(offs, dtype=torch.int32, device="cuda")
    ends = offsets_dev[1:].contiguous()

    # MX operands (both forms) for mxmoe and Triton.
    a_d, a_s, a_fd, a_fs = quant_rows_chunked(x)
    b_d, b_s, b_fd, b_fs_rows = quant_rows_chunked(w.view(E * N, K))
    nck = (K + 127) // 128
    b_fs = b_fs_rows.view(nck, E, N).permute(1, 0, 2).contiguous()  # [E, nck, N]
    del b_fs_rows
    # Exact mode's operands: the BF16 images, made here (outside every timed region).
    img_parts = [(a_d, a_s), (b_d, b_s)]
    (a_img, b_img), remake_images = make_images(lib, img_parts)

    row = {"shape": shape, "name": name, "E": E, "N": N, "K": K, "tokens_per_expert": tpe,
           "skewed": skewed, "M_padded": M, "tokens": sum(counts), "flops": flops}

    # Baselines (each run once here: its output, and whether it runs at all).
    def bf16_call():
        return torch._grouped_mm(x, w.transpose(-2, -1), offs=ends, out_dtype=torch.bfloat16)
    y_bf16 = bf16_call()
    timed = [("torch-bf16", None, bf16_call)]
    xq, xs = rowwise_fp8(x)
    wq, ws = rowwise_fp8(w.view(E * N, K))
    wq, ws = wq.view(E, N, K), ws.view(E, N)

    def fp8_call():
        return torch._scaled_grouped_mm(xq, wq.transpose(-2, -1), xs, ws, offs=ends, out_dtype=torch.bfloat16)
    try:
        fp8_call()
        timed.append(("torch-fp8-rowwise", None, fp8_call))
    except Exception as ex:  # noqa: BLE001
        row["fp8_rowwise_error"] = f"{type(ex).__name__}: {ex}"
    y_tri = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    if get_triton_kernel() is not None:
        try:
            tri = triton_mx(a_d, a_s, b_d, b_s, y_tri, offsets_dev, E, N, K)
            tri()
            torch.cuda.synchronize()
            row["triton_vs_bf16_relfrob"] = rel_frob(y_tri, y_bf16, token_rows)
            timed.append(("triton-mxfp8", None, tri))
        except Exception as ex:  # noqa: BLE001
            row["triton_error"] = f"{type(ex).__name__}: {str(ex)[:300]}"
    else:
        row["triton_error"] = _triton_error

    # mxmoe: every path once, its output checked (kept for the bitwise comparisons); then all the
    # baselines and paths timed together, in alternation (Timer.many).
    y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    variants = mxmoe_variants(multicast_both, tile_both)
    b_forms = {ROW128: (b_fd, b_fs)}
    if FAST_BLOCK:  # B's 128x128-block form from its MX copy, checked against it (not timed)
        pitch = lib.mxmoe_fast_block_scales_pitch(N)
        want_d, want_s = torch_block_rebase(b_d, b_s, E, N, K, pitch)
        changed, flushed, total = check_block_form(b_d, b_s, want_d, want_s, E, N, K)
        # The library's kernel makes the operand; it must equal the PyTorch construction bit for bit.
        blk_d, blk_s = torch.empty_like(want_d), torch.full_like(want_s, 0xEE)

        def rebase():
            rebase_block128(lib, b_d, b_s, E, N, K, blk_d, blk_s)
        rebase()
        if not (torch.equal(blk_d, want_d) and torch.equal(blk_s, want_s)):
            raise RuntimeError("rebase_mxfp8_fast_block128 differs from the PyTorch block form of B")
        b_forms[BLOCK128] = (blk_d, blk_s)
        # Its time (a weight transform, not part of the GEMM's) and bandwidth: 2 + 1/32 bytes per element.
        row["blk_rebase_us"] = timer(rebase)
        row["blk_rebase_gbs"] = (2 + 1 / 32) * E * N * K / (row["blk_rebase_us"] * 1e-6) / 1e9
        print(f"  rebase_mxfp8_fast_block128 of B [{E}, {N}, {K}]: {row['blk_rebase_us']:.1f} us, "
              f"{row['blk_rebase_gbs']:.0f} GB/s (bitwise the PyTorch block form)", flush=True)
        row["blk_changed_frac"] = changed / max(total, 1)  # re-rounded by the block form (incl. flushed)
        row["blk_flushed_frac"] = flushed / max(total, 1)
        variants.insert(1, (FAST, "mxmoe-fast-blk", None, None))
    checked = {}
    for mode, mname, env, base in variants:
        layout = BLOCK128 if mname == "mxmoe-fast-blk" else ROW128

        def call(mode=mode, layout=layout):
            bfd, bfs = b_forms[layout]
            rc = lib.mxmoe_m_grouped_mxfp8_gemm_nt_layout(
                ptr(a_d), ptr(a_s), ptr(a_fd), ptr(a_fs), ptr(a_img), M, ptr(b_d), ptr(b_s), ptr(bfd),
                ptr(bfs), ptr(b_img), layout, E, N, K, ptr(offsets_dev), ptr(y), mode, BF16_OUT, 0,
                ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
            if rc != 0:
                raise RuntimeError(lib.mxmoe_gemm_last_error().decode())
        y.fill_(float("nan"))
        with kernel_env(env):
            call()
        err = rel_frob(y, y_bf16, token_rows)
        checked[mname] = (y.clone(), err, err < VERIFY_TOL and not bool(torch.isnan(y[:M]).any()))
        timed.append((mname, env, call))
    times = time_all(timer, timed)
    del y_tri
    t_bf16, t_fp8, t_tri = times["torch-bf16"], times.get("torch-fp8-rowwise"), times.get("triton-mxfp8")
    row["bf16_us"], row["fp8_rowwise_us"], row["triton_us"] = t_bf16, t_fp8, t_tri

    def ratio(t_base, t):
        return f"{t_base / t:.2f}" if t_base else "n/a"

    for base_name, t in (("torch-bf16", t_bf16), ("torch-fp8-rowwise", t_fp8), ("triton-mxfp8", t_tri)):
        if t:
            table.append([shape, base_name, f"{t:.1f}", f"{flops / t / 1e6:.0f}", "", "", "", "", ""])
    outs = {}
    for mode, mname, env, base in variants:
        yv, err, ok = checked.pop(mname)
        t = times[mname]
        record_variant(row, table, outs, yv, mname, base, t, flops, err, ok, shape,
                       [ratio(t_bf16, t), ratio(t_fp8, t), ratio(t_tri, t)])
        del yv
    row["fast_vs_exact_relfrob"] = rel_frob(outs["mxmoe-fast"], outs["mxmoe-exact"], token_rows)
    if FAST_BLOCK:
        row["fast_blk_vs_fast_relfrob"] = rel_frob(outs["mxmoe-fast-blk"], outs["mxmoe-fast"], token_rows)
        annotate_fast_blk(table, shape, row)
    t_deq = dequant_lines(timer, remake_images, img_parts, shape, row, table)
    exact_plus_dequant_line(row["mxmoe-exact_us"], t_deq, shape, flops, t_bf16, row, table)
    results["rows"].append(row)
    print(f"  done: {shape}", file=sys.stderr, flush=True)


def run_wgrad_case(lib, timer, name, E, N, K, tpe, skewed, gen, results, table, multicast_both=False,
                   tile_both=False):
    """k-grouped wgrad: dW[e] [N, K] = Σ_{t in e} dY[t]ᵀ X[t]; baseline torch._grouped_mm 2-D × 2-D
    (dYᵀ [N, M] with groups along M, X [M, K]); mxmoe reads the column-wise MX copies."""
    counts = routing_counts(E, tpe, skewed, gen)
    offs = padded_offsets(counts)
    M = offs[-1]
    shape = f"wgrad {name} E={E} N={N} K={K} T/e={tpe} {'skewed' if skewed else 'uniform'}"
    flops = 2.0 * M * N * K
    token_rows = token_row_mask(offs, counts, M)
    dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    dy[~token_rows] = 0
    x[~token_rows] = 0
    offsets_dev = torch.tensor(offs, dtype=torch.int32, device="cuda")
    ends = offsets_dev[1:].contiguous()
    dyt = dy.t().contiguous()  # [N, M]
    xt = x.t().contiguous()    # [K, M]
    a_d, a_s, a_fd, a_fs = quant_rows_chunked(dyt)  # column-wise MX of dY: fast scales [M/128, N]
    b_d, b_s, b_fd, b_fs = quant_rows_chunked(xt)
    img_parts = [(a_d, a_s), (b_d, b_s)]  # exact mode: images of dYᵀ [N, M] and Xᵀ [K, M]
    # token-blocked ([M/128][N|K][128]), as the layer makes them; row-major for --wgrad-rowimg
    (a_img, b_img), remake_images = make_images(lib, img_parts, TOKEN_BLOCKED)
    a_rimg = b_rimg = None
    if WGRAD_ROWIMG:
        (a_rimg, b_rimg), _ = make_images(lib, img_parts, ROW_MAJOR)
    row = {"shape": shape, "kind": "wgrad", "name": name, "E": E, "N": N, "K": K,
           "tokens_per_expert": tpe, "skewed": skewed, "M_padded": M, "flops": flops}
    def bf16_call():
        return torch._grouped_mm(dy.t(), x, offs=ends, out_dtype=torch.bfloat16)
    ref = bf16_call()
    timed = [("torch-bf16", None, bf16_call)]
    dw = torch.empty(E, N, K, device="cuda", dtype=torch.bfloat16)
    variants = mxmoe_variants(multicast_both, tile_both, m_grouped=False)
    if K_ORDER_BOTH:  # the k-grouped schedule in expert index order instead of largest expert first
        variants += [(FAST, "mxmoe-fast-kidx", {"MXMOE_GEMM_K_ORDER": "index"}, "mxmoe-fast"),
                     (EXACT, "mxmoe-exact-kidx", {"MXMOE_GEMM_K_ORDER": "index"}, "mxmoe-exact")]
    if K_RASTER_BOTH:  # each mode's other tile orders within an expert (defaults: fast n-major, exact groups)
        variants += [(FAST, "mxmoe-fast-group", {"MXMOE_GEMM_K_RASTER": "group"}, "mxmoe-fast"),
                     (EXACT, "mxmoe-exact-nmajor", {"MXMOE_GEMM_K_RASTER": "nmajor"}, "mxmoe-exact"),
                     (EXACT, "mxmoe-exact-group", {"MXMOE_GEMM_K_RASTER": "group"}, "mxmoe-exact")]
    for mode, mname, groups in ((EXACT, "exact", K_RASTER_GROUPS), (FAST, "fast", K_RASTER_GROUPS_FAST)):
        for g in groups:  # G n-tiles a raster group (exact's default G: ~sqrt(grid · 256 / 128); fast: n-major)
            variants.append((mode, f"mxmoe-{mname}-g{g}", {"MXMOE_GEMM_K_RASTER": str(g)}, f"mxmoe-{mname}"))
    if WGRAD_ROWIMG:  # the same exact GEMM on row-major images (the layout before run 65)
        variants += [(EXACT, "mxmoe-exact-rowimg", None, "mxmoe-exact")]
    b_forms = {ROW128: (b_fd, b_fs)}
    if FAST_BLOCK:  # Xᵀ [K, M] in 128x128 blocks (128 rows of K x 128 tokens), by the library's rebase
        blk_d = torch.empty_like(b_fd)
        blk_s = torch.empty(M // 128, lib.mxmoe_fast_block_scales_pitch(K), dtype=torch.uint8, device="cuda")
        rebase_block128(lib, b_d, b_s, 1, K, M, blk_d, blk_s)
        b_forms[BLOCK128] = (blk_d, blk_s)
        variants.insert(1, (FAST, "mxmoe-fast-blk", None, None))
    # Every path once, its output checked; then the baseline and the paths timed in alternation.
    checked = {}
    for mode, mname, env, base in variants:
        rowimg = mname == "mxmoe-exact-rowimg"
        ai, bi, layout = (a_rimg, b_rimg, ROW_MAJOR) if rowimg else (a_img, b_img, TOKEN_BLOCKED)
        blayout = BLOCK128 if mname == "mxmoe-fast-blk" else ROW128

        def call(mode=mode, ai=ai, bi=bi, layout=layout, blayout=blayout):
            bfd, bfs = b_forms[blayout]
            rc = lib.mxmoe_k_grouped_mxfp8_gemm_nt_layout(
                ptr(a_d), ptr(a_s), ptr(a_fd), ptr(a_fs), ptr(ai), ptr(b_d), ptr(b_s), ptr(bfd),
                ptr(bfs), ptr(bi), M, E, N, K, ptr(offsets_dev), ptr(dw), mode, BF16_OUT, 0, 0, layout, blayout,
                ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
            if rc != 0:
                raise RuntimeError(lib.mxmoe_gemm_last_error().decode())
        dw.fill_(float("nan"))
        with kernel_env(env):
            call()
        err = float((dw.float() - ref.float()).norm() / ref.float().norm().clamp(min=1e-30))
        checked[mname] = (dw.clone(), err, err < VERIFY_TOL and not bool(torch.isnan(dw).any()))
        timed.append((mname, env, call))
    times = time_all(timer, timed)
    t_bf16 = times["torch-bf16"]
    row["bf16_us"] = t_bf16
    table.append([shape, "torch-bf16", f"{t_bf16:.1f}", f"{flops / t_bf16 / 1e6:.0f}", "", "", "", "", ""])
    outs = {}
    for mode, mname, env, base in variants:
        dwv, err, ok = checked.pop(mname)
        t = times[mname]
        record_variant(row, table, outs, dwv, mname, base, t, flops, err, ok, shape,
                       [f"{t_bf16 / t:.2f}", "n/a", "n/a"])
        del dwv
    if FAST_BLOCK:
        annotate_fast_blk(table, shape, row)
    t_deq = dequant_lines(timer, remake_images, img_parts, shape, row, table)
    exact_plus_dequant_line(row["mxmoe-exact_us"], t_deq, shape, flops, t_bf16, row, table)
    results["rows"].append(row)
    print(f"  done: {shape}", file=sys.stderr, flush=True)


def parse_groups(flag, text):
    """'G1,G2,...' -> [G1, G2, ...] (raster group sizes, 0..65535, 0 = n-major); exits naming the flag otherwise."""
    try:
        groups = [int(g) for g in text.split(",") if g.strip()]
    except ValueError:
        sys.exit(f"bench_gemm: argument '{flag}' = {text!r}: must be comma-separated integers")
    if any(not 0 <= g < 65536 for g in groups):
        sys.exit(f"bench_gemm: argument '{flag}' = {text!r}: each G must be in 0..65535 (0: n-major)")
    return groups


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None)
    ap.add_argument("--lib", default=None, help="path of libmxmoe_c.so (default build/libmxmoe_c.so)")
    ap.add_argument("--quick", action="store_true", help="one tokens-per-expert value (2048), uniform + skewed")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--shapes", default=None, help="comma-separated substrings of shape names to run")
    ap.add_argument("--wgrad", action="store_true", help="also run the k-grouped wgrad GEMM (issue 4)")
    ap.add_argument("--multicast-both", action="store_true",
                    help="time fast mode on the default and the 2-CTA multicast path (MXMOE_GEMM_MULTICAST=0/1)")
    ap.add_argument("--tile-both", action="store_true",
                    help="time fast mode on the default and the 128x192-tile path (MXMOE_GEMM_TILE=128/192)")
    ap.add_argument("--exact-multicast", action="store_true",
                    help="m-grouped: also time exact mode as 2-CTA clusters sharing B (mxmoe-exact-mc, "
                         "MXMOE_GEMM_EXACT_MULTICAST=1; bitwise equal to mxmoe-exact required)")
    ap.add_argument("--exact-tile-both", action="store_true",
                    help="time exact mode on 128x256 (default) and 128x128 tiles (MXMOE_GEMM_EXACT_TILE=256/128)")
    ap.add_argument("--k-order-both", action="store_true",
                    help="wgrad also with the experts walked in index order (MXMOE_GEMM_K_ORDER=index)")
    ap.add_argument("--k-raster-both", action="store_true",
                    help="wgrad also with each mode's other tile order within an expert (fast: MXMOE_GEMM_K_RASTER=group, exact: nmajor and group)")
    ap.add_argument("--k-raster-groups", default="",
                    help="comma-separated n-tile counts G: wgrad also in exact mode with MXMOE_GEMM_K_RASTER=G (mxmoe-exact-gG)")
    ap.add_argument("--k-raster-groups-fast", default="",
                    help="the same for fast mode (mxmoe-fast-gG; fast mode's default is n-major)")
    ap.add_argument("--wgrad-rowimg", action="store_true",
                    help="wgrad: also time exact mode on row-major images (mxmoe-exact-rowimg; default: token-blocked)")
    ap.add_argument("--fast-block", action="store_true",
                    help="also time fast mode with B in 128x128 blocks (mxmoe-fast-blk, FastScaleLayout::kBlock128): the weights (m-grouped), Xᵀ (wgrad)")
    ap.add_argument("--tpe", default=None, help="comma-separated tokens-per-expert values (default 512,2048,8192)")
    ap.add_argument("--experts", type=int, default=None,
                    help="diagnostic: every shape with this many experts instead of its own (E in the shape name)")
    ap.add_argument("--wgrad-only", action="store_true", help="only the wgrad cases (implies --wgrad)")
    ap.add_argument("--routing", default="uniform,skewed", help="uniform, skewed or uniform,skewed")
    args = ap.parse_args()
    global EXACT_TILE_BOTH, K_ORDER_BOTH, K_RASTER_BOTH, K_RASTER_GROUPS, K_RASTER_GROUPS_FAST
    global COPY_GBS, WGRAD_ROWIMG, FAST_BLOCK, EXACT_MULTICAST
    EXACT_TILE_BOTH = args.exact_tile_both
    EXACT_MULTICAST = args.exact_multicast
    FAST_BLOCK = args.fast_block
    WGRAD_ROWIMG = args.wgrad_rowimg
    K_ORDER_BOTH = args.k_order_both
    K_RASTER_BOTH = args.k_raster_both
    K_RASTER_GROUPS = parse_groups("--k-raster-groups", args.k_raster_groups)
    K_RASTER_GROUPS_FAST = parse_groups("--k-raster-groups-fast", args.k_raster_groups_fast)
    require_gpu()
    lib = load_lib(args.lib)
    setup_lib(lib)
    timer = Timer(warmup=3, reps=args.reps, flush_bytes=512 << 20)
    COPY_GBS = copy_bandwidth(timer)
    print(f"device-to-device copy: {COPY_GBS:.0f} GB/s (read + write): the ceiling of the mxmoe-dequant lines",
          file=sys.stderr)
    gen = torch.Generator().manual_seed(1234)
    torch.manual_seed(1234)
    results = {"device": device_info(), "verify_tol_relfrob_vs_bf16": VERIFY_TOL, "copy_GBps": COPY_GBS,
               "rows": []}
    table = []
    tpes = [2048] if args.quick else TOKENS_PER_EXPERT
    if args.tpe:
        tpes = [int(t) for t in args.tpe.split(",")]
    routing_names = args.routing.split(",")
    if not routing_names or any(r not in ("uniform", "skewed") for r in routing_names):
        sys.exit(f"bench_gemm: argument '--routing' = {args.routing!r}: must be uniform, skewed or uniform,skewed")
    routings = [r == "skewed" for r in routing_names]
    if args.wgrad_only:
        args.wgrad = True  # --wgrad-only asks for the wgrad cases
    for name, E, N, K in SHAPES:
        if args.shapes and not any(s.strip() in name for s in args.shapes.split(",")):
            continue
        E = args.experts or E
        for tpe in tpes:
            for skewed in routings:
                if not (args.wgrad and args.wgrad_only):
                    run_case(lib, timer, name, E, N, K, tpe, skewed, gen, results, table, args.multicast_both,
                             args.tile_both)
                    torch.cuda.empty_cache()  # the case's tensors died with its frame
                if args.wgrad:
                    run_wgrad_case(lib, timer, name, E, N, K, tpe, skewed, gen, results, table,
                                   args.multicast_both, args.tile_both)
                    torch.cuda.empty_cache()
    if _triton_error:
        results["triton_error"] = _triton_error
        print(f"triton baseline unavailable: {_triton_error}", file=sys.stderr)
    print_table("m-grouped MXFP8 GEMM (Y = X·Wᵀ per expert, BF16 out); ratios = baseline time / mxmoe time; "
                f"GB/s: mxmoe-dequant lines (copy ceiling {COPY_GBS:.0f} GB/s)",
                ["shape", "mode", "us", "TFLOP/s", "xBF16", "xFP8-rowwise", "xtriton", "xdefault", "GB/s"], table)
    results["multicast_env"] = os.environ.get(MULTICAST_ENV)
    results["tile_env"] = os.environ.get(TILE_ENV)
    results["exact_tile_env"] = os.environ.get(EXACT_TILE_ENV)
    write_json(args.json, results)
    if not all(r.get("mxmoe-fast_ok") and r.get("mxmoe-exact_ok") and r.get("mxmoe-fast-mc_ok", True)
               and r.get("mxmoe-fast-192_ok", True) and r.get("mxmoe-fast-192d_ok", True) and r.get("mxmoe-fast-pre_ok", True)
               and r.get("mxmoe-exact-128_ok", True) and r.get("mxmoe-exact-256d_ok", True)
               and r.get("mxmoe-exact-rowimg_ok", True) and r.get("mxmoe-fast-blk_ok", True) for r in results["rows"]):
        print("ERROR: an mxmoe output failed verification against the BF16 baseline", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
