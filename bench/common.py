"""Shared benchmark machinery: load libmxmoe_c.so, time with CUDA events (warm-up, L2 flush,
median), measure the copy-bandwidth ceiling in the same run, print tables, write JSON."""
import ctypes
import json
import os
import statistics
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def require_gpu():
    if not torch.cuda.is_available():
        print("mxmoe: this benchmark needs a CUDA GPU and none was found; "
              "run the tests instead: ./scripts/test.sh", file=sys.stderr)
        sys.exit(2)


def load_lib(path=None):
    # MXMOE_BUILD_DIR: the build folder (scripts/bench.sh passes its own); default ROOT/build.
    path = path or os.path.join(ROOT, os.environ.get("MXMOE_BUILD_DIR", "build"), "libmxmoe_c.so")
    lib = ctypes.CDLL(path)
    lib.mxmoe_last_error.restype = ctypes.c_char_p
    # Declare every signature: without argtypes ctypes passes Python ints as 32-bit C ints.
    vp, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.mxmoe_quantize_mxfp8.argtypes = [vp, i64, i64, i64] + [vp] * 8 + [i32, vp]
    lib.mxmoe_quantize_mxfp8_grouped.argtypes = [vp, i64, i64, vp, vp, i32, i64] + [vp] * 8 + [i32, vp]
    lib.mxmoe_quantize_mxfp8_gather.argtypes = [vp, i64, i64, vp, i64, vp] + [vp] * 8 + [i32, vp]
    lib.mxmoe_compute_padded_offsets.argtypes = [vp, vp, i32, i32, vp]
    lib.mxmoe_dequantize_mxfp8_bf16.argtypes = [vp, vp, i64, i64, vp, vp]
    lib.mxmoe_dequantize_mxfp8_bf16_token_blocked.argtypes = [vp, vp, i64, i64, vp, vp]
    lib.mxmoe_rebase_mxfp8_fast_block128.argtypes = [vp, vp, i64, i64, i64, vp, vp, vp]
    lib.mxmoe_quantize_mxfp8_block128.argtypes = [vp, i64, i64, i64, vp, vp, vp, vp, i32, vp]
    lib.mxmoe_fast_block_scales_pitch.argtypes = [i64]
    lib.mxmoe_fast_block_scales_pitch.restype = i64
    for f in (lib.mxmoe_quantize_mxfp8, lib.mxmoe_quantize_mxfp8_grouped, lib.mxmoe_quantize_mxfp8_gather,
              lib.mxmoe_compute_padded_offsets, lib.mxmoe_dequantize_mxfp8_bf16,
              lib.mxmoe_dequantize_mxfp8_bf16_token_blocked, lib.mxmoe_rebase_mxfp8_fast_block128,
              lib.mxmoe_quantize_mxfp8_block128):
        f.restype = ctypes.c_int
    return lib


def check(lib, rc):
    if rc != 0:
        raise RuntimeError(lib.mxmoe_last_error().decode())


def ptr(t):
    return ctypes.c_void_p(t.data_ptr()) if t is not None else ctypes.c_void_p(0)


def rebase_block128(lib, data, scales, batch, rows, cols, block_data, block_scales):
    """rebase_mxfp8_fast_block128 (quantize.h) on the current stream: the 128x128-block form of the
    plain MX copy data/scales [batch, rows, cols] into block_data / block_scales."""
    check(lib, lib.mxmoe_rebase_mxfp8_fast_block128(ptr(data), ptr(scales), batch, rows, cols, ptr(block_data),
                                                    ptr(block_scales),
                                                    ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)))


class Timer:
    """Median of CUDA-event timings; the L2 (60 MB on H200) is flushed before every rep by
    writing a 256 MB buffer, outside the timed region."""

    def __init__(self, warmup=3, reps=15, flush_bytes=256 << 20):
        self.warmup, self.reps = warmup, reps
        self.flush_buf = torch.empty(flush_bytes, dtype=torch.uint8, device="cuda")

    def _once(self, fn):
        self.flush_buf.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3  # us

    def __call__(self, fn):
        return self.many([(None, fn)])[0]

    def many(self, items):
        """Medians of several calls timed in alternation: items = [(env or None, fn)], rep r times
        every item once (each under its kernel_env) before rep r + 1 starts, so that a drift of the
        GPU's clocks over the run affects every item alike. (Run 58 timed the same kernel twice, as
        two blocks of reps one after the other, and got up to 15% apart.) The order within rep r is
        row r of a Williams design (carryover_balanced_orders): every item takes every place, and
        follows every other item, equally often over a whole cycle of rows. Under the H200's 700 W
        cap the clock a kernel starts at depends on what ran just before it (run 94: 1410-1530 MHz
        during the GEMMs, 1980 idle); the rotation used until run 94 kept each item's predecessor
        fixed, and bench_gemm's "mxmoe-fast" line, always timed right after the BF16 baseline, came
        out up to 7% slower than the same kernel timed as another line (runs 92-94)."""
        for env, fn in items:
            with kernel_env(env):
                for _ in range(self.warmup):
                    fn()
        orders = carryover_balanced_orders(len(items))
        times = [[] for _ in items]
        for r in range(self.reps):
            for i in orders[r % len(orders)]:
                env, fn = items[i]
                with kernel_env(env):
                    times[i].append(self._once(fn))
        return [statistics.median(t) for t in times]


def carryover_balanced_orders(n):
    """A Williams design: n orders of range(n) (2n when n is odd) in which every item is at every
    place equally often and every ordered pair (a, b), a != b, occurs as "b right after a" equally
    often (once per cycle for even n, twice for odd n)."""
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:  # 0, 1, n-1, 2, n-2, ...
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[(x + r) % n for x in first] for r in range(n)]
    if n % 2 == 1 and n > 1:
        rows += [row[::-1] for row in rows]
    return rows


def copy_bandwidth(timer, nbytes=1 << 30):
    """Device-to-device copy (torch copy_), bytes read + written per second."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    us = timer(lambda: dst.copy_(src))
    del src, dst
    return 2 * nbytes / (us * 1e-6) / 1e9  # GB/s


def timer_and_copy_bandwidth(reps):
    """The diagnostics' start: a GPU is required, a Timer of `reps` reps and the 1 GiB copy_ bandwidth of this run
    (printed), against which they report "% of copy"."""
    require_gpu()
    timer = Timer(reps=reps)
    copy_bw = copy_bandwidth(timer)
    print(f"copy bandwidth (1 GiB copy_, read + write) {copy_bw:.0f} GB/s")
    return timer, copy_bw


def capture_graph(fn, stream):
    """A CUDA graph of fn() captured on `stream`, after one warm-up call outside the graph
    (allocations, lazy initialisation); replay with .replay()."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=stream):
            fn()
    torch.cuda.synchronize()
    return g


def device_info():
    p = torch.cuda.get_device_properties(0)
    return {"name": p.name, "sms": p.multi_processor_count, "torch": torch.__version__}


def print_table(title, header, rows):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(header)] if rows else [len(h) for h in header]
    line = " | ".join(h.ljust(w) for h, w in zip(header, widths))
    print(f"\n{title}\n{line}\n" + "-+-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    sys.stdout.flush()


def write_json(path, obj):
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(obj, f, indent=1)


class kernel_env:
    """Sets the environment variables in `values` ({name: value}) for a block, then restores them."""

    def __init__(self, values):
        self.values = values or {}

    def __enter__(self):
        self.old = {k: os.environ.get(k) for k in self.values}
        os.environ.update(self.values)

    def __exit__(self, *exc):
        for k, v in self.old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
