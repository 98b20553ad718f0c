"""Baseline for issue 7 (expert parallelism, R ranks): the EP MoE training layer a user can build
today from mxmoe's single-GPU kernels (the Python ops of python/mxmoe/ops.py) and
torch.distributed all_to_all over NCCL. Issue 7 asks mxmoe's own EP layer (EpMoeLayer, timed by
tests/ep/ep_layer_test.cu) to be >= 1.5x faster than this at R = 2.

Per rank r (T_r tokens x [T_r, H] BF16; router Wr [E, H] replicated; the rank's experts
W1 [E/R, 2I, H], W2 [E/R, H, I], BF16 master weights):

forward
  1. router (torch, FP32 from BF16): logits = x·Wrᵀ, softmax top-k, weights renormalised.
  2. counts: int64 [R, E/R + 1] per destination (slots per expert there, rows sent there);
     all_to_all_single, then ONE .tolist() of what is sent and received: the host sync every
     such baseline has (split sizes must be host ints).
  3. dispatch: each token's BF16 row once per destination rank that owns one of its experts
     (destination-major, token order), plus an int32 record [k ids local to that rank or -1 |
     k routing weights as FP32 bits]: two all_to_all_single. Same bytes as EpMoeLayer's dispatch.
  4. local experts on the received rows, mxmoe ops in fast mode: moe_plan(received ids) ->
     quantize_gather (row- and column-wise, fast form) -> quantize W1, W2 both ways (every step,
     as the C++ layer) -> grouped_gemm (GEMM1) -> SwiGLU (torch) -> quantize -> grouped_gemm (GEMM2).
  5. combine: the expert output row of every received (row, slot) back to the token's rank
     (all_to_all_single), then out[t] = sum_j w[t, j]·Y[t, j] in slot order, FP32, -> BF16.
backward (a torch.autograd.Function around 2-5; the router is differentiated by autograd)
  1. dw[t, j] = dOut[t]·Y[t, j] (FP32, torch) on the token's rank.
  2. dOut rows to the experts' ranks with the forward's split sizes (no new host sync).
  3. dY = bf16(w·dOut) in the padded layout (torch), quantized both ways; dH = dY·W2 (grouped_gemm
     on col(W2)), dW2 = grouped_gemm_wgrad(col(dY), col(Hact)); SwiGLU backward (torch),
     quantize dGU both ways; dXp = dGU·W1 (grouped_gemm on col(W1)),
     dW1 = grouped_gemm_wgrad(col(dGU), col(Xp)).
  4. dXp rows back (reverse of the forward combine) and dx[t] = sum_j dXp[t, j] in slot order (FP32),
     plus the router's dx (autograd, BF16 add).

Not bound in mxmoe.ops, done in plain torch instead (printed in the output): SwiGLU forward and
backward; dY = w·dOut gathering (the C++ layer fuses it into quantize_mxfp8_gather_scaled); the
combine sums and dw. Quantization writes the fast form alone (plain=False), as the C++ layer does.

Correctness (every case unless --no-check): every rank regenerates every rank's tokens and all
experts from the shared seed and runs a plain-PyTorch BF16 reference of the same layer on all
tokens (per-expert loop, autograd); out and dx of its tokens, dW1/dW2 of its experts and dWr
(all-reduced) are compared by relative Frobenius error against bounds derived in BOUNDS below.
A compute-only step (the all_to_alls replaced by what the last real step received, no host sync)
is checked against the real step.

Timing: warm-up, CUDA events, median of --reps, a barrier before each rep: forward, forward +
backward, and the same "compute-only". One line per case per rank:
  [rank r] a2a-baseline <case> H=.. I=.. E=.. k=.. T=.. fast: fwd ms .. fwd+bwd ms .. | compute-only fwd ms .. fwd+bwd ms .. | ...
The matching lines of mxmoe's EP layer (tests/ep/ep_layer_test.cu: its timed fast case = case "small";
its opt-in DSV3-size timed case, MXMOE_EP_LAYER_DSV3=only, = case "dsv3"):
  [rank r] ep-layer small H=1024 I=512 E=16 k=8 T=.. fast: fwd ms .. fwd+bwd ms .. | compute-only fwd+bwd ms ..

Usage (one process per GPU, spawned here; NCCL_NVLS_ENABLE=0 is forced; each rank under a watchdog):
    python3 bench/bench_ep_layer_a2a.py [--world 2] [--cases tiny,small,dsv3] [--reps 20] [--json OUT.json]
    python3 bench/bench_ep_layer_a2a.py --selftest [--world 2]   # CPU + gloo, mxmoe ops MOCKED by
        # mxmoe.reference (plain-torch MX numerics): checks the plumbing only, times nothing real
Needs the PyTorch binding (scripts/python_test.sh or pip install --no-build-isolation -e .).
"""
import argparse
import datetime
import faulthandler
import importlib.util
import json
import os
import sys
import tempfile
import zlib
from collections import namedtuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_ep_a2a import timed  # noqa: E402  (same barrier + CUDA-event median)

# name -> H, I, experts (total, from R), top-k, tokens of rank 0, ragged (rank r has tokens0 - 37 r,
# as tests/ep/ep_layer_test.cu), skew (every token to rank 0's experts), last rank empty
Case = namedtuple("Case", "name hidden inter experts top_k tokens0 ragged skew last_empty")
CASES = {
    "tiny": Case("tiny", 256, 128, lambda R: 8 * R, 4, 300, True, False, False),
    # = ep_layer_test's timed fast case: H 1024, I 512, E = 8R, k 8, T_r = 2000 - 37r
    "small": Case("small", 1024, 512, lambda R: 8 * R, 8, 2000, True, False, False),
    # DeepSeek-V3-like: 32 experts in all, top-8, T_r = 4096 - 37r (= ep_layer_test's opt-in timed case,
    # MXMOE_EP_LAYER_DSV3=1 or =only)
    "dsv3": Case("dsv3", 7168, 2048, lambda R: 32, 8, 4096, True, False, False),
}
SELFTEST_CASES = {
    "st-uniform": Case("st-uniform", 64, 32, lambda R: 4 * R, 2, 45, True, False, False),
    "st-k8": Case("st-k8", 96, 64, lambda R: 8 * R, 8, 70, True, False, False),
    "st-skew": Case("st-skew", 64, 64, lambda R: 4 * R, 3, 40, False, True, False),  # ranks > 0 receive nothing
    "st-empty": Case("st-empty", 64, 32, lambda R: 4 * R, 4, 50, False, False, True),  # last rank has T = 0
    "st-k-gt-local": Case("st-k-gt-local", 64, 32, lambda R: max(8, 4 * R), 6, 40, True, False, False),  # k > E/R
}

# Relative Frobenius error bounds of the baseline (MXFP8 fast mode) against the plain BF16
# reference. docs/notes/layer.md: the single-GPU MXFP8 layer (the same recipe and kernels) is
# 0.066 (out) and 0.067-0.068 (dx) from the unquantized FP64 layer; E4M3 alone is ~0.037 per
# quantized operand (DESIGN §2). The BF16 reference is ~0.004 from FP64 (three BF16 roundings of
# 2^-9 relative each, gu, hact, y). So out and dx must sit near 0.07; 0.10 (bench_layer.py's bound)
# leaves 1.4x for the data. The weight gradients multiply two quantized operands, one of which
# (dY or dGU) already carries the forward's and the dgrad's error; the CPU selftest with
# mxmoe.reference's exact MX numerics measured dW1/dW2 at 0.06-0.08 -> bound 0.12. dWr goes through
# dw = dOut·Y and the softmax Jacobian (differences of dw's, cancellation): bound 0.20.
# A plumbing error (wrong row, slot, rank or expert) gives O(1) errors.
BOUNDS = {"out": 0.10, "dx": 0.10, "dW1": 0.12, "dW2": 0.12, "dWr": 0.20}

NOT_BOUND = ("SwiGLU fwd+bwd: torch; dY = w*dOut gather: torch (C++ fuses it into quantize_gather_scaled); "
             "combine sums and dw: torch")

MxT = namedtuple("MxT", "data scales fast_data fast_scales")
Quant = namedtuple("Quant", "rowwise colwise")


def cdiv(a, b):
    return (a + b - 1) // b


def log(rank, msg):
    print(f"[rank {rank}] {msg}", flush=True)


# ---- ops: mxmoe's (GPU) or the selftest's mock ------------------------------------------------

class RealOps:
    """mxmoe's single-GPU ops (python/mxmoe/ops.py), fast mode."""
    name = "mxmoe"

    def __init__(self):
        import mxmoe  # noqa: F401  (registers torch.ops.mxmoe.*)
        self.m = mxmoe

    def quantize(self, x):
        return self.m.quantize(x, rowwise=True, colwise=True, fast=True, plain=False)

    def quantize_gather(self, x, row_index):
        return self.m.quantize_gather(x, row_index, rowwise=True, colwise=True, fast=True, plain=False)

    def moe_plan(self, ids, experts):
        return self.m.moe_plan(ids, experts)

    def grouped_gemm(self, a, b, offsets):
        return self.m.grouped_gemm(a, b, offsets, fast=True, out_dtype=torch.bfloat16)

    def grouped_gemm_wgrad(self, dy_t, x_t, offsets):
        return self.m.grouped_gemm_wgrad(dy_t, x_t, offsets, fast=True, out_dtype=torch.float32)


class MockOps:
    """--selftest only: the same contracts on the CPU, from mxmoe.reference (plain-torch MX
    quantization, fast-form rebasing and exact dequantization; loaded by path, so the compiled
    extension is not needed); GEMMs in FP64 on the dequantized fast forms. Not mxmoe's kernels."""
    name = "MOCK (mxmoe.reference numerics on CPU)"

    def __init__(self):
        spec = importlib.util.spec_from_file_location("mxmoe_reference", os.path.join(REPO, "python", "mxmoe",
                                                                                      "reference.py"))
        self.ref = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.ref)

    def _mx(self, x):
        d, s = self.ref.quantize_rows(x)
        fd, fs = self.ref.rebase_fast(d, s)
        return MxT(d, s, fd, fs)

    def quantize(self, x):
        assert x.dtype == torch.bfloat16 and x.shape[-2] % 32 == 0 and x.shape[-1] % 32 == 0
        return Quant(self._mx(x), self._mx(x.transpose(-1, -2).contiguous()))

    def quantize_gather(self, x, row_index):
        assert row_index.dtype == torch.int32 and row_index.numel() % 128 == 0 and row_index.numel() > 0
        idx = row_index.long()
        ok = (idx >= 0) & (idx < x.shape[0])
        g = x.index_select(0, idx.clamp(0, max(x.shape[0] - 1, 0))) * ok.unsqueeze(1).to(x.dtype)
        return self.quantize(g.contiguous())

    def moe_plan(self, ids, experts):
        assert ids.dtype == torch.int32 and ids.dim() == 2
        T, k = ids.shape
        flat = ids.reshape(-1).long()
        valid = (flat >= 0) & (flat < experts)
        key = torch.where(valid, flat, torch.full_like(flat, experts))
        counts = torch.bincount(key, minlength=experts + 1)[:experts]
        padded = torch.zeros(experts + 1, dtype=torch.int64)
        padded[1:] = torch.cumsum(cdiv(counts, 128) * 128, 0)
        offsets = torch.zeros(experts + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(counts, 0)
        order = torch.argsort(key, stable=True)  # (token, slot) order within each expert
        nv = int(valid.sum())
        e_sorted = key[order[:nv]]
        rows = padded[e_sorted] + torch.arange(nv) - offsets[e_sorted]
        row_of = torch.full((T * k,), -1, dtype=torch.int64)
        row_of[order[:nv]] = rows
        cap = cdiv(T * k + experts * 127, 128) * 128
        row_index = torch.full((cap,), -1, dtype=torch.int64)
        row_index[rows] = order[:nv] // k
        i32 = torch.int32
        return (counts.to(i32), offsets.to(i32), padded.to(i32), row_of.view(T, k).to(i32), row_index.to(i32))

    def _deq(self, t):
        return self.ref.dequantize_fast(t.fast_data, t.fast_scales, torch.float64)

    def grouped_gemm(self, a, b, offsets):
        A, B = self._deq(a), self._deq(b)  # [M, K], [E, N, K]
        o = offsets.tolist()
        assert A.shape[0] % 128 == 0 and o[-1] <= A.shape[0] and all(v % 128 == 0 for v in o)
        y = torch.zeros(A.shape[0], B.shape[1], dtype=torch.float64)
        for e in range(B.shape[0]):
            y[o[e]:o[e + 1]] = A[o[e]:o[e + 1]] @ B[e].t()
        return y.float().to(torch.bfloat16)

    def grouped_gemm_wgrad(self, dy_t, x_t, offsets):
        D, X = self._deq(dy_t), self._deq(x_t)  # [N, M], [K, M]
        o = offsets.tolist()
        dw = torch.zeros(len(o) - 1, D.shape[0], X.shape[0], dtype=torch.float64)
        for e in range(len(o) - 1):
            dw[e] = D[:, o[e]:o[e + 1]] @ X[:, o[e]:o[e + 1]].t()
        return dw.float()


def plan_of(ops, ids, experts):
    """moe_plan as (counts, offsets, padded_offsets, row_of, row_index), whichever ops."""
    p = ops.moe_plan(ids, experts)
    return tuple(p)


# ---- communication: live (all_to_all_single) or replayed (compute-only timing) -------------------

class Exchange:
    """Every collective of the baseline's step goes through here, in one fixed order on every rank.
    mode 'live': torch.distributed; 'record': live, keeping what was received; 'replay': hands back
    the recorded results in the same order with no collective and no host sync (compute-only)."""

    def __init__(self, backend):
        self.backend = backend
        self.mode = "live"
        self.log = []
        self.i = 0
        self.host_syncs = 0

    def begin_step(self, mode):
        self.mode, self.i = mode, 0
        if mode == "record":
            self.log = []

    def _replayed(self):
        r = self.log[self.i]
        self.i += 1
        return r

    def counts(self, send_counts):
        """send_counts int64 [R, C] (row d: what goes to rank d) -> (sent, received) as host lists
        [R][C]: one all_to_all_single and the step's one device->host sync."""
        if self.mode == "replay":
            return self._replayed()
        recv = torch.empty_like(send_counts)
        dist.all_to_all_single(recv, send_counts.contiguous())
        both = torch.stack([send_counts, recv]).tolist()  # host sync
        self.host_syncs += 1
        res = (both[0], both[1])
        if self.mode == "record":
            self.log.append(res)
        return res

    def a2a(self, send, recv_splits, send_splits):
        """Rows of send (split send_splits per destination rank) -> rows received (recv_splits per
        source rank, in rank order)."""
        if self.mode == "replay":
            return self._replayed()
        n = sum(recv_splits)
        out = send.new_empty((max(n, 1),) + tuple(send.shape[1:]))[:n]  # never a null data pointer
        s = send.contiguous()
        if self.backend == "gloo" and s.dtype == torch.bfloat16:  # gloo: no 16-bit alltoall; H is even
            dist.all_to_all_single(out.view(torch.int32), s.view(torch.int32), recv_splits, send_splits)
        else:
            dist.all_to_all_single(out, s, recv_splits, send_splits)
        if self.mode == "record":
            self.log.append(out)
        return out


def take(src, idx):
    """src rows at idx (int64); an empty result still owns memory."""
    if idx.numel() == 0:
        return src.new_empty((1,) + tuple(src.shape[1:]))[:0]
    return src.index_select(0, idx)


def sum_slots(ys3, w=None):
    """sum_j (w[:, j] ·) ys3[:, j] over j = 0..k-1 in that order, FP32 accumulation -> BF16."""
    T, k, H = ys3.shape
    acc = ys3[:, 0].float()
    if w is not None:
        acc = acc * w[:, 0:1]
    for j in range(1, k):
        if w is None:
            acc.add_(ys3[:, j])
        else:
            acc.addcmul_(ys3[:, j], w[:, j:j + 1])
    return acc.to(torch.bfloat16)


def swiglu(gu, inter):
    """bf16(silu(G)·U), computed in FP32 (as moe_swiglu), in few passes."""
    h = torch.empty(gu.shape[0], inter, dtype=torch.bfloat16, device=gu.device)
    return torch.mul(F.silu(gu[:, :inter].float()), gu[:, inter:], out=h)


def swiglu_backward(gu, dh, inter):
    """dG = dH·U·silu'(G), dU = dH·silu(G), FP32, each rounded once to BF16 (as moe_swiglu_backward)."""
    g = gu[:, :inter].float()
    dgu = torch.empty_like(gu)
    torch.mul(dh, F.silu(g), out=dgu[:, inter:])
    dgu[:, :inter].copy_(torch.ops.aten.silu_backward(dh.float().mul_(gu[:, inter:]), g))
    return dgu


def slot_dots(ys3, dout):
    """dw[t, j] = dOut[t]·Y[t, j], FP32 accumulation: a batched GEMV with FP32 output (bmm's out_dtype,
    CUDA only) or, where that is missing, an FP32 product and sum."""
    if ys3.is_cuda:
        try:
            return torch.bmm(ys3, dout.unsqueeze(-1), out_dtype=torch.float32).squeeze(-1)
        except (RuntimeError, TypeError, NotImplementedError):
            pass
    return (ys3.float() * dout.float().unsqueeze(1)).sum(-1)


def route(x, wr, k):
    """Softmax top-k (the ReferenceMoE rule): ids int64 [T, k], weights FP32 [T, k] renormalised,
    differentiable in x and wr."""
    logits = x.float() @ wr.float().t()
    ids = logits.detach().topk(k, dim=-1).indices
    w = logits.softmax(-1).gather(-1, ids)
    return ids, w / w.sum(-1, keepdim=True)


class EpBaseline:
    """The baseline EP layer of one rank (see the module docstring)."""

    def __init__(self, ops, comm, world, rank, hidden, inter, experts, top_k):
        self.ops, self.comm, self.R, self.r = ops, comm, world, rank
        self.H, self.I, self.E, self.k = hidden, inter, experts, top_k
        self.El = experts // world

    def __call__(self, x, wr, w1, w2):
        ids, w = route(x, wr, self.k)
        return _EpFunction.apply(x, w, w1, w2, ids, self)

    # ---- forward (no autograd inside)
    def forward(self, x, w, w1, w2, ids):
        R, El, k, H, I = self.R, self.El, self.k, self.H, self.I
        dev, T = x.device, x.shape[0]
        st = {"T": T}
        owner = ids // El  # [T, k]
        mask = torch.zeros(T, R, dtype=torch.bool, device=dev).scatter_(1, owner, True)
        slots = torch.zeros(R * El, dtype=torch.int64, device=dev).index_add_(
            0, ids.reshape(-1), torch.ones(T * k, dtype=torch.int64, device=dev))
        send_counts = torch.cat([slots.view(R, El), mask.sum(0, dtype=torch.int64).view(R, 1)], 1)
        sent, recvd = self.comm.counts(send_counts)  # the host sync
        n_send = [sent[d][El] for d in range(R)]
        n_recv = [recvd[s][El] for s in range(R)]
        slots_to = [sum(sent[d][:El]) for d in range(R)]  # our (token, slot)s owned by rank d
        slots_from = [sum(recvd[s][:El]) for s in range(R)]  # rank s's slots on our experts
        per_expert = [sum(recvd[s][e] for s in range(R)) for e in range(El)]
        M = sum(cdiv(c, 128) * 128 for c in per_expert)  # padded rows of the local expert layout
        # dispatch: destination-major, token order; once per (token, destination rank)
        p = torch.argsort((~mask.t()).reshape(-1).to(torch.uint8), stable=True)[:sum(n_send)]
        dest, tok = p // max(T, 1), p % max(T, 1)
        o = take(owner, tok)
        lid = torch.where(o == dest.unsqueeze(1), take(ids, tok) - dest.unsqueeze(1) * El,
                          torch.full_like(o, -1)).to(torch.int32)
        meta = torch.cat([lid, take(w.float(), tok).view(torch.int32)], 1)  # [n, 2k] int32
        recv_rows = self.comm.a2a(take(x, tok), n_recv, n_send)  # BF16 [N_recv, H]
        recv_meta = self.comm.a2a(meta, n_recv, n_send)
        st.update(tok=tok, n_send=n_send, n_recv=n_recv, slots_to=slots_to, slots_from=slots_from, M=M)
        # local experts (mxmoe ops)
        if M > 0:
            rid, rw = recv_meta[:, :k], recv_meta[:, k:].contiguous().view(torch.float32)
            kk = min(k, El)  # a token has at most El experts here; moe_plan wants top_k <= experts
            if kk < k:  # the valid slots first, in slot order
                first = torch.argsort((rid < 0).to(torch.uint8), dim=1, stable=True)[:, :kk]
                rid, rw = rid.gather(1, first), rw.gather(1, first)
            recv_ids = rid.contiguous()
            st["recv_w"] = rw.contiguous()
            _, _, padded, row_of, row_index = plan_of(self.ops, recv_ids, El)
            row_index = row_index[:M]
            xq = self.ops.quantize_gather(recv_rows, row_index)
            w1q, w2q = self.ops.quantize(w1.contiguous()), self.ops.quantize(w2.contiguous())
            gu = self.ops.grouped_gemm(xq.rowwise, w1q.rowwise, padded)  # [M, 2I]
            hq = self.ops.quantize(swiglu(gu, I))
            y = self.ops.grouped_gemm(hq.rowwise, w2q.rowwise, padded)  # [M, H]
            flat = row_of.reshape(-1)
            sel = torch.argsort((flat < 0).to(torch.uint8), stable=True)[:sum(slots_from)]
            back_rows = flat.index_select(0, sel).long()  # (source, row, slot) order
            st.update(padded=padded, row_of=row_of, row_index=row_index, back_rows=back_rows, gu=gu,
                      x_col=xq.colwise, h_col=hq.colwise, w1_col=w1q.colwise, w2_col=w2q.colwise)
            yb = take(y, back_rows)
        else:
            yb = x.new_empty((1, H))[:0]
        # combine: one row per (token, slot) back to the token's rank; slot order there
        recv_y = self.comm.a2a(yb, slots_to, slots_from)  # [T k, H], (owner, token, slot) order
        slot_order = torch.argsort(owner.reshape(-1), stable=True)
        ys = torch.empty(T * k, H, dtype=torch.bfloat16, device=dev).index_copy_(0, slot_order, recv_y)
        st.update(slot_order=slot_order, ys=ys)
        return sum_slots(ys.view(T, k, H), w.float()), st

    # ---- backward
    def backward(self, st, dout, w1, w2):
        k, H, I, T, M = self.k, self.H, self.I, st["T"], st["M"]
        dout = dout.to(torch.bfloat16).contiguous()
        dev = dout.device
        dw = slot_dots(st["ys"].view(T, k, H), dout)  # [T, k] FP32
        recv_dout = self.comm.a2a(take(dout, st["tok"]), st["n_recv"], st["n_send"])
        if M > 0:
            flat = st["row_of"].reshape(-1).long()
            idx = torch.where(flat >= 0, flat, torch.full_like(flat, M))
            row_w = torch.zeros(M + 1, dtype=torch.float32, device=dev).scatter_(0, idx, st["recv_w"].reshape(-1))[:M]
            src = st["row_index"].long().clamp(min=0)  # pad rows: weight 0
            dy = torch.mul(recv_dout.index_select(0, src), row_w.unsqueeze(1),
                           out=torch.empty(M, H, dtype=torch.bfloat16, device=dev))  # bf16(w·dOut)
            dyq = self.ops.quantize(dy)
            dh = self.ops.grouped_gemm(dyq.rowwise, st["w2_col"], st["padded"])  # [M, I]
            dw2 = self.ops.grouped_gemm_wgrad(dyq.colwise, st["h_col"], st["padded"])  # [El, H, I]
            dguq = self.ops.quantize(swiglu_backward(st["gu"], dh, I))
            dxp = self.ops.grouped_gemm(dguq.rowwise, st["w1_col"], st["padded"])  # [M, H]
            dw1 = self.ops.grouped_gemm_wgrad(dguq.colwise, st["x_col"], st["padded"])  # [El, 2I, H]
            dxb = take(dxp, st["back_rows"])
        else:
            dw1 = torch.zeros(w1.shape, dtype=torch.float32, device=dev)
            dw2 = torch.zeros(w2.shape, dtype=torch.float32, device=dev)
            dxb = dout.new_empty((1, H))[:0]
        recv_dx = self.comm.a2a(dxb, st["slots_to"], st["slots_from"])
        dxs = torch.empty(T * k, H, dtype=torch.bfloat16, device=dev).index_copy_(0, st["slot_order"], recv_dx)
        return sum_slots(dxs.view(T, k, H)), dw, dw1.to(w1.dtype), dw2.to(w2.dtype)


class _EpFunction(torch.autograd.Function):
    """out = EP experts(x, routing) with the backward above; ids is not differentiable."""

    @staticmethod
    def forward(ctx, x, w, w1, w2, ids, layer):
        out, st = layer.forward(x, w, w1, w2, ids)
        ctx.layer, ctx.st = layer, st
        ctx.save_for_backward(w1, w2)
        return out

    @staticmethod
    def backward(ctx, dout):
        w1, w2 = ctx.saved_tensors
        dx, dw, dw1, dw2 = ctx.layer.backward(ctx.st, dout, w1, w2)
        ctx.st = None
        return dx, dw, dw1, dw2, None, None


# ---- inputs (seeded per tensor: identical on every rank, whichever rank makes them) --------------

def seeded(shape, scale, seed, tag, device):
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1000003 + zlib.crc32(repr(tag).encode())) % (2 ** 63))
    return (torch.randn(shape, generator=g, device=device, dtype=torch.float32) * scale).to(torch.bfloat16)


def tokens_of(case, world, rank):
    if case.last_empty and world > 1 and rank == world - 1:
        return 0
    return max(1, case.tokens0 - 37 * rank) if case.ragged else case.tokens0


def make_x(case, world, s, seed, dev):
    """Rank s's tokens [T_s, H] and dOut [T_s, H] (scales as ep_layer_test: x N(0,1), dOut N(0, 0.25))."""
    T, H = tokens_of(case, world, s), case.hidden
    x = seeded((T, H), 1.0, seed, ("x", case.name, s), dev)
    if case.skew:
        x = (x.float() + 4.0).to(torch.bfloat16)
    return x, seeded((T, H), 0.5, seed, ("dout", case.name, s), dev)


def make_router(case, world, seed, dev):
    H, E = case.hidden, case.experts(world)
    wr = seeded((E, H), 2.0 / H ** 0.5, seed, ("wr", case.name), dev)
    if case.skew:  # logits of rank 0's experts +40 and every other -40 on x ~ N(4, 1)
        El = E // world
        shift = torch.full((E, 1), -10.0 / H, device=dev)
        shift[:El] = 10.0 / H
        wr = (wr.float() + shift).to(torch.bfloat16)
    return wr


def make_experts(case, world, seed, dev, experts):
    """W1 [n, 2I, H], W2 [n, H, I] of the given global expert ids (N(0, 1/fan_in) as ep_layer_test)."""
    H, I = case.hidden, case.inter
    w1 = torch.stack([seeded((2 * I, H), 1.0 / H ** 0.5, seed, ("w1", case.name, e), dev) for e in experts])
    w2 = torch.stack([seeded((H, I), 1.0 / I ** 0.5, seed, ("w2", case.name, e), dev) for e in experts])
    return w1, w2


# ---- the plain-PyTorch BF16 reference of the same layer (all tokens, all experts) ---------------

def reference(case, world, xs, douts, wr, w1, w2):
    """Each rank's router runs on its own tokens (as in the EP layer: same shapes, same kernels, so
    the same routing); then a per-expert BF16 loop; combine in slot order in FP32; autograd.
    Returns outs per rank, dxs per rank, dW1, dW2, dWr (BF16 grads as float)."""
    k, I = case.top_k, case.inter
    xs = [x.detach().clone().requires_grad_(True) for x in xs]
    wr = wr.detach().clone().requires_grad_(True)
    w1 = w1.detach().clone().requires_grad_(True)
    w2 = w2.detach().clone().requires_grad_(True)
    routed = [route(x, wr, k) for x in xs]
    x = torch.cat(xs)
    ids = torch.cat([r[0] for r in routed])
    w = torch.cat([r[1] for r in routed])
    T, H = x.shape
    flat = ids.reshape(-1)
    y = x.new_zeros(T * k, H)
    for e in range(w1.shape[0]):
        items = (flat == e).nonzero().squeeze(1)
        if items.numel() == 0:
            continue
        gu = x.index_select(0, items // k) @ w1[e].t()
        h = (F.silu(gu[:, :I].float()) * gu[:, I:].float()).to(torch.bfloat16)
        y = y.index_copy(0, items, h @ w2[e].t())
    y = y.view(T, k, H)
    acc = y[:, 0].float() * w[:, 0:1]
    for j in range(1, k):
        acc = acc + y[:, j].float() * w[:, j:j + 1]
    out = acc.to(torch.bfloat16)
    out.backward(torch.cat(douts))
    sizes = [t.shape[0] for t in xs]
    return (list(out.detach().split(sizes)), [t.grad for t in xs], w1.grad.float(), w2.grad.float(), wr.grad.float())


def fingerprint(tensors):
    """Two FP64 sums per tensor (plain and position-weighted): equal iff the same values, in practice."""
    out = []
    for t in tensors:
        v = t.detach().reshape(-1).double()
        out += [v.sum(), (v * (torch.arange(v.numel(), device=v.device) % 13 + 1)).sum()]
    return torch.stack(out)


def rel(a, b):
    a, b = a.double(), b.double()
    nb = b.norm().item()
    if nb == 0:
        return 0.0 if a.norm().item() == 0 else float("inf")
    return (a - b).norm().item() / nb


# ---- one case on one rank ------------------------------------------------------------------------

def run_case(case, args, rank, world, ops, comm, dev):
    H, I, E, k = case.hidden, case.inter, case.experts(world), case.top_k
    if E % world:
        raise ValueError(f"case {case.name}: E = {E} experts do not split over {world} ranks")
    El = E // world
    T = tokens_of(case, world, rank)
    T_all = sum(tokens_of(case, world, s) for s in range(world))
    seed = args.seed
    x, dout = make_x(case, world, rank, seed, dev)
    wr = make_router(case, world, seed, dev)
    w1, w2 = make_experts(case, world, seed, dev, range(rank * El, (rank + 1) * El))
    x.requires_grad_(True)
    wr.requires_grad_(True)
    w1.requires_grad_(True)
    w2.requires_grad_(True)
    layer = EpBaseline(ops, comm, world, rank, H, I, E, k)
    params = (x, wr, w1, w2)

    def step(backward, mode="live"):
        for p in params:
            p.grad = None
        comm.begin_step(mode)
        out = layer(x, wr, w1, w2)
        if backward:
            out.backward(dout)
        return out

    tag = f"{case.name} H={H} I={I} E={E} k={k} T={T}"
    res = dict(case=case.name, rank=rank, world=world, hidden=H, inter=I, experts=E, top_k=k, tokens=T,
               tokens_all=T_all, ops=ops.name, not_bound=NOT_BOUND)
    # one recorded step: the output and gradients checked below, and what compute-only replays
    syncs0 = comm.host_syncs
    out = step(True, "record")
    res["host_syncs_per_step"] = comm.host_syncs - syncs0
    got = dict(out=out.detach().clone(), dx=x.grad.clone(), dW1=w1.grad.float(), dW2=w2.grad.float(),
               dWr=wr.grad.float())
    out_r = step(True, "replay")
    res["replay_vs_live"] = dict(out=rel(out_r.detach(), got["out"]), dx=rel(x.grad, got["dx"]),
                                 dW1=rel(w1.grad.float(), got["dW1"]), bitwise=bool(
                                     torch.equal(out_r.detach(), got["out"]) and torch.equal(x.grad, got["dx"])))
    ok = all(v <= 1e-2 for kk, v in res["replay_vs_live"].items() if kk != "bitwise")
    if not ok:
        log(rank, f"a2a-baseline {tag}: FAIL compute-only replay differs from the live step: {res['replay_vs_live']}")

    if args.check:
        dist.all_reduce(got["dWr"])  # every rank's share of the router gradient
        xs, douts = zip(*[make_x(case, world, s, seed, dev) for s in range(world)])
        w1a, w2a = make_experts(case, world, seed, dev, range(E))
        # every rank's regenerated copy of rank s's inputs must be what rank s used (the seeded
        # generators give the same numbers on every device of one kind): compare fingerprints
        own = fingerprint([x.detach(), dout, wr.detach(), w1.detach(), w2.detach()])
        theirs = [torch.empty_like(own) for _ in range(world)]
        dist.all_gather(theirs, own)
        same = all(torch.equal(theirs[s], fingerprint([xs[s], douts[s], wr.detach(), w1a[s * El:(s + 1) * El],
                                                              w2a[s * El:(s + 1) * El]])) for s in range(world))
        if not same:
            log(rank, f"a2a-baseline {case.name}: FAIL the regenerated inputs differ from the ones the ranks used "
                "(seeded generator not reproducible across devices): the reference check is void")
            ok = False
        ro, rdx, rdw1, rdw2, rdwr = reference(case, world, list(xs), list(douts), wr.detach(), w1a, w2a)
        errs = dict(out=rel(got["out"], ro[rank]), dx=rel(got["dx"], rdx[rank]),
                    dW1=rel(got["dW1"], rdw1[rank * El:(rank + 1) * El]),
                    dW2=rel(got["dW2"], rdw2[rank * El:(rank + 1) * El]), dWr=rel(got["dWr"], rdwr))
        if T == 0:  # no tokens: out and dx are empty
            errs["out"] = errs["dx"] = 0.0
        res["rel_err_vs_bf16_ref"] = errs
        res["bounds"] = BOUNDS
        bad = [n for n, v in errs.items() if not v <= BOUNDS[n]]
        ok &= not bad
        log(rank, f"a2a-baseline {tag} check vs plain-PyTorch BF16 reference (relative Frobenius): "
            + " ".join(f"{n} {v:.4f}" for n, v in errs.items()) + f" (bounds {BOUNDS}): "
            + ("PASS" if not bad else "FAIL " + ",".join(bad)))
        del xs, douts, w1a, w2a, ro, rdx, rdw1, rdw2, rdwr
        if dev == "cuda":
            torch.cuda.empty_cache()
    res["passed"] = bool(ok)

    reps, warm = args.reps, args.warmup
    t_f = timed(lambda: step(False), reps, dev, warm)
    t_fb = timed(lambda: step(True), reps, dev, warm)
    step(True, "record")  # what compute-only replays (same inputs, so the same routing)
    c_f = timed(lambda: step(False, "replay"), reps, dev, warm)
    c_fb = timed(lambda: step(True, "replay"), reps, dev, warm)
    sent, _ = comm.log[0]  # this rank's counts: bytes that cross NVLink per step
    rows_out = sum(sent[d][El] for d in range(world) if d != rank)
    slots_in = sum(sum(sent[d][:El]) for d in range(world) if d != rank)
    res["nvlink_mb_per_step"] = dict(
        fwd_dispatch_out=rows_out * (2 * H + 8 * k) / 1e6, fwd_combine_in=slots_in * 2 * H / 1e6,
        bwd_dispatch_out=rows_out * 2 * H / 1e6, bwd_combine_in=slots_in * 2 * H / 1e6)
    comm.begin_step("live")
    comm.log = []
    res.update(fwd_ms=t_f, fwd_bwd_ms=t_fb, compute_only_fwd_ms=c_f, compute_only_fwd_bwd_ms=c_fb,
               comm_share=(t_fb - c_fb) / t_fb if t_fb > 0 else 0.0, reps=reps)
    log(rank, f"a2a-baseline {tag} fast: fwd ms {t_f:.3f} fwd+bwd ms {t_fb:.3f} | compute-only fwd ms {c_f:.3f} "
        f"fwd+bwd ms {c_fb:.3f} | communication share {res['comm_share']:.2f} | host syncs/step "
        f"{res['host_syncs_per_step']} | NVLink MB/step out {rows_out * (4 * H + 8 * k) / 1e6:.1f} in "
        f"{slots_in * 4 * H / 1e6:.1f} | ops {ops.name} | {'PASS' if ok else 'FAIL'}")
    if rank == 0:
        if case.name in ("small", "dsv3"):
            how = (f"mxmoe's EP layer at these shapes and T: the line '[rank r] ep-layer {case.name} ... fwd+bwd ms' "
                   f"of {'' if case.name == 'small' else 'MXMOE_EP_LAYER_DSV3=only '}scripts/ep_launch.sh {world} "
                   "build/mxmoe_ep_layer_test (inputs from another generator, same distributions)")
        else:
            how = ("no EpMoeLayer case at these shapes in tests/ep/ep_layer_test.cu; compare with the prediction "
                   "in docs/notes/ep.md")
        log(rank, f"compare {case.name}: speedup = a2a-baseline fwd+bwd ms / ep-layer fwd+bwd ms, per rank "
            f"(issue 7 asks >= 1.5 at R = 2); {how}. Not bound in mxmoe.ops, done in torch: {NOT_BOUND}")
    return res


def enough_memory(case, world, dev):
    """Same decision on every rank (MIN over ranks): a rough upper bound of this case's peak (the
    reference on all tokens with all experts and its autograd state dominates)."""
    if dev != "cuda":
        return True
    H, I, E, k = case.hidden, case.inter, case.experts(world), case.top_k
    T_all = sum(tokens_of(case, world, s) for s in range(world))
    need = 12 * 3 * E * H * I + 16 * T_all * k * (H + I)  # weights (+grads, FP32 copies); reference rows
    free, _ = torch.cuda.mem_get_info()
    flag = torch.tensor([1 if free > need else 0], device=dev)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def worker(rank, args, store_path, results_path):
    faulthandler.dump_traceback_later(args.timeout, exit=True)  # watchdog: C thread, needs no GIL
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    dev = args.device
    kw = {}
    if dev == "cuda":
        torch.cuda.set_device(rank)
        kw["device_id"] = torch.device("cuda", rank)
    else:
        torch.set_num_threads(1)
    dist.init_process_group(args.backend, init_method=f"file://{store_path}", rank=rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=args.timeout), **kw)
    ops = MockOps() if args.selftest else RealOps()
    comm = Exchange(args.backend)
    table = SELFTEST_CASES if args.selftest else CASES
    failed = False
    for name in args.cases:
        case = table[name]
        faulthandler.dump_traceback_later(args.timeout, exit=True)  # per case (replaces the last one)
        if not enough_memory(case, args.world, dev):
            log(rank, f"a2a-baseline {name}: SKIP (not enough free GPU memory on some rank)")
            continue
        res = run_case(case, args, rank, args.world, ops, comm, dev)
        failed |= not res["passed"]
        with open(f"{results_path}.{rank}.{name}", "w") as f:
            json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()
    if failed:
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--cases", default=None, help="comma-separated: tiny, small, dsv3 (default all three)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=None, help="default: MXMOE_EP_SEED, else 1234")
    ap.add_argument("--no-check", dest="check", action="store_false")
    ap.add_argument("--timeout", type=int, default=300, help="per-rank watchdog per case, seconds (dumps every "
                    "thread's stack and exits; also the collectives' timeout)")
    ap.add_argument("--selftest", action="store_true",
                    help="CPU + gloo with the mxmoe ops MOCKED (mxmoe.reference numerics): mechanics only")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.seed is None:
        args.seed = int(os.environ.get("MXMOE_EP_SEED", "1234"))
    if args.selftest:
        args.backend, args.device = "gloo", "cpu"
        args.cases = (args.cases or ",".join(SELFTEST_CASES)).split(",")
        args.reps, args.warmup = min(args.reps, 2), 1
        table = SELFTEST_CASES
    else:
        args.backend, args.device = "nccl", "cuda"
        args.cases = (args.cases or "tiny,small,dsv3").split(",")
        table = CASES
        if torch.cuda.device_count() < args.world:
            print(f"bench_ep_layer_a2a: needs {args.world} CUDA GPUs, found {torch.cuda.device_count()}",
                  file=sys.stderr)
            sys.exit(2)
        try:
            import mxmoe  # noqa: F401
        except ImportError:
            sys.path.insert(0, os.path.join(REPO, "python"))  # an in-place build (setup.py build_ext --inplace)
            try:
                import mxmoe  # noqa: F401,F811
                os.environ["PYTHONPATH"] = os.path.join(REPO, "python") + os.pathsep + os.environ.get("PYTHONPATH", "")
            except ImportError as e:
                print(f"bench_ep_layer_a2a: the mxmoe PyTorch binding is not importable ({e}); build it first: "
                      "scripts/python_test.sh (or MXMOE_PYTHON=1 in scripts/gpu_run.sh)", file=sys.stderr)
                sys.exit(2)
    unknown = [c for c in args.cases if c not in table]
    if unknown:
        print(f"bench_ep_layer_a2a: unknown case(s) {unknown}; known: {list(table)}", file=sys.stderr)
        sys.exit(2)
    if os.environ.get("NCCL_NVLS_ENABLE", "0") != "0":
        print("bench_ep_layer_a2a: NCCL_NVLS_ENABLE overridden to 0 (no NVLink multicast)", file=sys.stderr)
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    print(f"bench_ep_layer_a2a: world {args.world}, backend {args.backend}, cases {args.cases}, seed {args.seed}, "
          f"reps {args.reps}{', SELFTEST (ops mocked, CPU)' if args.selftest else ''}", flush=True)
    rc = 0
    with tempfile.TemporaryDirectory() as tmp:
        store, results = os.path.join(tmp, "store"), os.path.join(tmp, "res")
        try:
            mp.spawn(worker, args=(args, store, results), nprocs=args.world, join=True)
        except Exception as e:  # a rank failed or timed out: spawn has ended the others
            print(f"bench_ep_layer_a2a: FAILED: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            rc = 1
        rows = []
        for name in args.cases:
            for r in range(args.world):
                p = f"{results}.{r}.{name}"
                if os.path.exists(p):
                    rows.append(json.load(open(p)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"bench_ep_layer_a2a: {'ALL PASS' if rc == 0 else 'FAILED'} ({len(rows)} case results)", flush=True)
    sys.exit(rc)


if __name__ == "__main__":
    main()
