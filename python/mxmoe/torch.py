"""mxmoe.torch: an autograd-aware MXFP8 MoE layer for PyTorch, and its plain-PyTorch BF16 reference.

    from mxmoe.torch import MoE, ReferenceMoE
    moe = MoE(hidden=1024, intermediate=512, experts=16, top_k=2, max_tokens=8192).cuda()
    y = moe(x)                 # x [..., hidden] -> y [..., hidden], differentiable
    y.float().sum().backward() # fills moe.router.grad, moe.w1.grad, moe.w2.grad (and x.grad)

The layer (C++ ``mxmoe::MoeLayer``, include/mxmoe/moe_layer.h; recipe in docs/notes/layer.md):

    logits = x · routerᵀ (FP32)  ->  top-k routing  ->  out[t] = Σ_j w[t, j] · W2[e_j] · SwiGLU(W1[e_j] · x[t])

with SwiGLU(g ‖ u) = silu(g) ⊙ u (rows [0, I) of W1[e] are the gate, [I, 2I) the up projection).
Both expert GEMMs and all four of their backward GEMMs run in MXFP8 (blocks of 32, E4M3 data, E8M0
scales; ``mode="fast"``: FP8 tensor cores with FP32 promotion every 128 of K, ``"exact"``: BF16
tensor cores on the operands' BF16 images, made right before each GEMM, one FP32 accumulator over
all of K); the router runs in FP32 from the BF16 inputs. ``weight_blocks=True`` (fast mode only)
gives the four weight operands of those GEMMs the 128x128-block fast form (one scale per 128x128
block instead of per row and 128-chunk; 1.19-1.28x faster GEMMs, measured error the same;
``MoeLayerConfig::weight_fast_layout``, docs/notes/layer.md "Block-form weights").
``activation_blocks=True`` (fast mode only) does the same for the two weight-gradient GEMMs' other
operand, the column-wise copies of x and of the SwiGLU output (one scale per 128 rows x 128 tokens;
those GEMMs 1.26-1.49x faster in isolation; an extra pass over the two copies each step; only the
weight gradients change; ``MoeLayerConfig::activation_fast_layout``). Both depart from the per-row
fast form of DESIGN §2, hence off by default. Routing:

* ``"softmax"`` (Qwen3, Mixtral): top-k of the logits, weights = softmax probabilities of the
  chosen experts renormalised to sum to 1.
* ``"sigmoid"`` (DeepSeek-V3): scores s = sigmoid(logits); with ``n_groups > 1`` the experts are
  split into n_groups equal groups, a group scores the sum of its top-2 s, and only the best
  ``topk_groups`` groups compete; top-k of s among those; weights = s / Σ_chosen s · ``scaling``.

Ties go to the lower expert id. Parameters are the BF16 master weights ``router`` [E, H], ``w1``
[E, 2I, H], ``w2`` [E, H, I] (other float dtypes are accepted and cast to BF16 per call; the
gradients come back in the parameters' dtype; the layer computes them in FP32). The input may have
any leading shape and float dtype; it is cast to BF16 and the output cast back.

Workspace: the layer owns a device workspace sized for ``max_tokens`` tokens per call, allocated by
the first forward on the input's device. A call with more tokens re-creates it for
roundup(T, 1024) tokens (grow on demand): that frees the old workspace, which waits for the device
(one host synchronisation per growth) and is refused during CUDA-graph capture, so pass the
largest token count you will use. Apart from that nothing synchronises with the host; a training
step can be captured in a CUDA graph and ``torch.compile(fullgraph=True)`` traces the module (the
layer is reached through an int handle; see python/csrc/moe_layer_ops.cpp).

Deterministic: the same inputs give bitwise the same outputs and gradients. Backward always
differentiates the forward that made its output, even after other forwards of the same module
(it re-runs that forward first when the workspace holds another one, e.g. under activation
checkpointing).

``ReferenceMoE`` has the same parameters, initialisation and routing rule, computed in plain
PyTorch BF16 (``torch._grouped_mm`` or a per-expert loop) and differentiated by autograd; it is the
baseline of the tests and of examples/train_moe_lm.py.
"""
import math

import torch
from torch import nn
from torch.nn import functional as F

from . import _C  # noqa: F401  (registers torch.ops.mxmoe.moe_layer_*)
from . import _fake  # noqa: F401  (their fake implementations)

__all__ = ["MoE", "ReferenceMoE"]

_ROUTINGS = ("softmax", "sigmoid")
_MODES = ("fast", "exact")


class _LayerHandle:
    """Owns one registered C++ layer (torch.ops.mxmoe.moe_layer_create / _destroy). A deep copy or
    an unpickled copy registers a layer of its own with the same configuration; the handle is
    destroyed with its owner."""

    def __init__(self, config):
        self.config = dict(config)
        self.layer_id = int(torch.ops.mxmoe.moe_layer_create(**self.config))

    def __del__(self):
        layer_id = getattr(self, "layer_id", None)
        if layer_id is not None:
            try:
                torch.ops.mxmoe.moe_layer_destroy(layer_id)
            except Exception:  # interpreter shutdown: the process exit frees the memory
                pass

    def __deepcopy__(self, memo):
        return _LayerHandle(self.config)

    def __getstate__(self):
        return {"config": self.config}

    def __setstate__(self, state):
        self.__init__(state["config"])

    def info(self):
        """dict: device (-1 before the first forward), max_tokens, capacity (padded rows),
        workspace_bytes, allocations (workspaces allocated so far)."""
        keys = ("device", "max_tokens", "capacity", "workspace_bytes", "allocations")
        return dict(zip(keys, torch.ops.mxmoe.moe_layer_info(self.layer_id)))


def _check_config(hidden, intermediate, experts, top_k, routing, n_groups, topk_groups, scaling, mode):
    """Python-side checks that need names the C++ op does not have (routing, mode); the op checks
    the sizes (ValueError naming the argument)."""
    if routing not in _ROUTINGS:
        raise ValueError(f"mxmoe.torch.MoE: argument 'routing' must be 'softmax' or 'sigmoid', got {routing!r}")
    if mode not in _MODES:
        raise ValueError(f"mxmoe.torch.MoE: argument 'mode' must be 'fast' or 'exact', got {mode!r}")
    for name, v in (("hidden", hidden), ("intermediate", intermediate), ("experts", experts), ("top_k", top_k),
                    ("n_groups", n_groups), ("topk_groups", topk_groups)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"mxmoe.torch.MoE: argument '{name}' must be an int, got {v!r}")
    if hidden % 32 or intermediate % 32:
        bad = "hidden" if hidden % 32 else "intermediate"
        raise ValueError(f"mxmoe.torch.MoE: argument '{bad}' must be a multiple of 32 (MX blocks), got "
                         f"{hidden if bad == 'hidden' else intermediate}")
    if routing == "softmax" and float(scaling) != 1.0:
        raise ValueError(f"mxmoe.torch.MoE: argument 'scaling' must be 1.0 with softmax routing, got {scaling}")


class _MoEBase(nn.Module):
    """Parameters, initialisation and configuration shared by MoE and ReferenceMoE."""

    def __init__(self, hidden, intermediate, experts, top_k, routing="softmax", n_groups=1, topk_groups=1,
                 scaling=1.0, mode="fast", max_tokens=4096, device=None, dtype=torch.bfloat16):
        super().__init__()
        _check_config(hidden, intermediate, experts, top_k, routing, n_groups, topk_groups, scaling, mode)
        self.hidden, self.intermediate, self.experts, self.top_k = hidden, intermediate, experts, top_k
        self.routing, self.n_groups, self.topk_groups, self.scaling = routing, n_groups, topk_groups, float(scaling)
        self.mode, self.max_tokens = mode, int(max_tokens)
        kw = {"device": device, "dtype": dtype}
        self.router = nn.Parameter(torch.empty(experts, hidden, **kw))
        self.w1 = nn.Parameter(torch.empty(experts, 2 * intermediate, hidden, **kw))
        self.w2 = nn.Parameter(torch.empty(experts, hidden, intermediate, **kw))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        """nn.Linear's default for every projection (each expert a Linear of its own):
        U(-1/√fan_in, 1/√fan_in), fan_in = H for the router and W1, I for W2. Drawn in FP32 and
        rounded, so MoE and ReferenceMoE made after the same seed get the same weights."""
        for p, fan_in in ((self.router, self.hidden), (self.w1, self.hidden), (self.w2, self.intermediate)):
            bound = 1.0 / math.sqrt(fan_in)
            if p.device.type == "meta":
                continue
            p.copy_(torch.empty(p.shape, dtype=torch.float32, device=p.device).uniform_(-bound, bound))

    def extra_repr(self):
        s = (f"hidden={self.hidden}, intermediate={self.intermediate}, experts={self.experts}, top_k={self.top_k}, "
             f"routing={self.routing!r}")
        if self.routing == "sigmoid":
            s += f", n_groups={self.n_groups}, topk_groups={self.topk_groups}, scaling={self.scaling}"
        for flag in ("weight_blocks", "activation_blocks"):
            if getattr(self, flag, False):
                s += f", {flag}=True"
        return s

    def _flatten(self, x):
        if x.shape[-1] != self.hidden:
            raise ValueError(f"{type(self).__name__}: argument 'x' must have shape [..., {self.hidden}] "
                             f"(hidden), got {tuple(x.shape)}")
        if not x.is_floating_point():
            raise TypeError(f"{type(self).__name__}: argument 'x' must be a floating-point tensor, got {x.dtype}")
        return x.reshape(-1, self.hidden)


def _bf16(t):
    return t.to(torch.bfloat16).contiguous()


class _MoEFunction(torch.autograd.Function):
    """out = layer(x, router, w1, w2) through torch.ops.mxmoe.moe_layer_forward / _backward.
    Inputs of any float dtype are cast to BF16 here; gradients come back in the inputs' dtypes."""

    @staticmethod
    def forward(ctx, x, router, w1, w2, layer_id):
        xb, rb, w1b, w2b = _bf16(x), _bf16(router), _bf16(w1), _bf16(w2)
        out = torch.ops.mxmoe.moe_layer_forward(layer_id, xb, rb, w1b, w2b)
        # The BF16 copies are what backward hands to the layer: the same device pointers as this
        # forward, which is how the layer knows its workspace still holds this forward's state.
        ctx.save_for_backward(xb, rb, w1b, w2b)
        ctx.layer_id = layer_id
        ctx.dtypes = (x.dtype, router.dtype, w1.dtype, w2.dtype)
        return out

    @staticmethod
    def backward(ctx, dout):
        xb, rb, w1b, w2b = ctx.saved_tensors
        # dout may be an expanded view (e.g. the gradient of .sum()): the layer wants it dense.
        dx, dr, dw1, dw2 = torch.ops.mxmoe.moe_layer_backward(ctx.layer_id, _bf16(dout), xb, rb, w1b, w2b)
        tx, tr, t1, t2 = ctx.dtypes
        return dx.to(tx), dr.to(tr), dw1.to(t1), dw2.to(t2), None


class MoE(_MoEBase):
    """MXFP8 MoE layer (SwiGLU experts, top-k routing) on mxmoe's Hopper kernels; see the module
    docstring. Arguments: hidden H, intermediate I (per expert), experts E, top_k; routing
    'softmax' | 'sigmoid' (with n_groups, topk_groups, scaling); mode 'fast' | 'exact' (the MXFP8
    GEMM mode); max_tokens: the workspace's size in tokens per call (grows on demand); device, dtype
    of the parameters (BF16 by default); weight_blocks: 128x128-block fast weights; activation_blocks:
    128x128-block fast wgrad activations (both mode 'fast' only; see the module docstring). H and I
    multiples of 32; 1 <= E <= 512; 1 <= top_k <= min(32, E)."""

    def __init__(self, hidden, intermediate, experts, top_k, routing="softmax", n_groups=1, topk_groups=1,
                 scaling=1.0, mode="fast", max_tokens=4096, device=None, dtype=torch.bfloat16, weight_blocks=False,
                 activation_blocks=False):
        super().__init__(hidden, intermediate, experts, top_k, routing, n_groups, topk_groups, scaling, mode,
                         max_tokens, device, dtype)
        for name, v, what in (("weight_blocks", weight_blocks, "weights"),
                              ("activation_blocks", activation_blocks, "wgrad activations")):
            if not isinstance(v, bool):
                raise TypeError(f"mxmoe.torch.MoE: argument '{name}' must be a bool, got {v!r}")
            if v and mode != "fast":
                raise ValueError(f"mxmoe.torch.MoE: argument '{name}' = True needs mode='fast' (128x128-block "
                                 f"{what} are a fast-mode form), got mode={mode!r}")
        self.weight_blocks, self.activation_blocks = weight_blocks, activation_blocks
        self._handle = _LayerHandle({
            "hidden": hidden, "inter": intermediate, "experts": experts, "top_k": top_k,
            "sigmoid": routing == "sigmoid", "n_groups": n_groups, "topk_groups": topk_groups,
            "scaling": float(scaling), "fast": mode == "fast", "max_tokens": int(max_tokens),
            "weight_blocks": weight_blocks, "activation_blocks": activation_blocks})

    def forward(self, x):
        x2 = self._flatten(x)
        out = _MoEFunction.apply(x2, self.router, self.w1, self.w2, self._handle.layer_id)
        return out.to(x.dtype).reshape(x.shape)

    def last_routing(self):
        """(topk_ids int32 [T, k], topk_weights float32 [T, k]) of the last forward, copied from the
        layer's workspace (for tests and diagnostics)."""
        return torch.ops.mxmoe.moe_layer_last_routing(self._handle.layer_id)

    def workspace_info(self):
        """The layer's workspace: device, max_tokens, capacity, workspace_bytes, allocations."""
        return self._handle.info()


class ReferenceMoE(_MoEBase):
    """The same layer in plain PyTorch, BF16 GEMMs (FP32 accumulation), FP32 routing; autograd
    differentiates it. Same constructor as MoE (mode and max_tokens are accepted and ignored) plus
    impl: 'grouped_mm' (torch._grouped_mm over expert-sorted rows; no host synchronisation),
    'loop' (one matmul per expert; synchronises), or 'auto' (grouped_mm where torch has it)."""

    def __init__(self, hidden, intermediate, experts, top_k, routing="softmax", n_groups=1, topk_groups=1,
                 scaling=1.0, mode="fast", max_tokens=4096, device=None, dtype=torch.bfloat16, impl="auto"):
        super().__init__(hidden, intermediate, experts, top_k, routing, n_groups, topk_groups, scaling, mode,
                         max_tokens, device, dtype)
        if impl == "auto":
            impl = "grouped_mm" if hasattr(torch, "_grouped_mm") else "loop"
        if impl not in ("grouped_mm", "loop"):
            raise ValueError(f"mxmoe.torch.ReferenceMoE: argument 'impl' must be 'auto', 'grouped_mm' or 'loop', "
                             f"got {impl!r}")
        self.impl = impl

    def route(self, x):
        """x BF16 [T, H] -> (topk_ids int64 [T, k] in decreasing score order, weights FP32 [T, k]).
        The weights are differentiable with respect to the router (and x); the choice is not."""
        logits = x.float() @ _bf16(self.router).float().t()  # the layer's cuBLAS GEMM: BF16 in, FP32 out
        k = self.top_k
        if self.routing == "softmax":
            ids = logits.detach().topk(k, dim=-1).indices
            w = logits.softmax(-1).gather(-1, ids)
            return ids, w / w.sum(-1, keepdim=True)
        s = logits.sigmoid()
        sel = s.detach()
        if self.n_groups > 1:
            T, E, G = sel.shape[0], self.experts, self.n_groups
            group_score = sel.view(T, G, E // G).topk(2, dim=-1).values.sum(-1)  # [T, G]
            keep = group_score.topk(self.topk_groups, dim=-1).indices
            allowed = torch.zeros(T, G, dtype=torch.bool, device=sel.device).scatter_(1, keep, True)
            sel = sel.masked_fill(~allowed.repeat_interleave(E // G, dim=1), float("-inf"))
        ids = sel.topk(k, dim=-1).indices
        w = s.gather(-1, ids)
        return ids, w / w.sum(-1, keepdim=True) * self.scaling

    def forward(self, x):
        # The layer's precisions are fixed (BF16 GEMMs, FP32 routing): autocast must not change them.
        with torch.autocast(device_type=x.device.type, enabled=False):
            x2 = _bf16(self._flatten(x))
            ids, w = self.route(x2)
            w1, w2 = _bf16(self.w1), _bf16(self.w2)
            if self.impl == "grouped_mm":
                y = self._experts_grouped(x2, ids, w1, w2)
            else:
                y = self._experts_loop(x2, ids, w1, w2)
            out = (y.float() * w.unsqueeze(-1)).sum(1)  # FP32, slot order
            return out.to(torch.bfloat16).to(x.dtype).reshape(x.shape)

    def _swiglu(self, gu):
        g, u = gu.split(self.intermediate, dim=-1)
        return (F.silu(g.float()) * u.float()).to(torch.bfloat16)

    def _experts_grouped(self, x, ids, w1, w2):
        """y [T, k, H]: expert ids[t, j] applied to x[t], through rows sorted by expert."""
        T, k, E = x.shape[0], self.top_k, self.experts
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)  # (token, slot) items sorted by expert
        counts = torch.zeros(E, dtype=torch.int64, device=x.device).index_add_(0, flat, torch.ones_like(flat))
        offs = counts.cumsum(0).to(torch.int32)  # end of each expert's rows
        xs = x.index_select(0, order // k)
        gu = torch._grouped_mm(xs, w1.transpose(1, 2), offs=offs)  # [T·k, 2I]
        ys = torch._grouped_mm(self._swiglu(gu), w2.transpose(1, 2), offs=offs)  # [T·k, H]
        return ys.index_select(0, torch.argsort(order)).view(T, k, self.hidden)

    def _experts_loop(self, x, ids, w1, w2):
        T, k = ids.shape
        y = x.new_zeros(T * k, self.hidden)
        flat = ids.reshape(-1)
        for e in range(self.experts):
            items = (flat == e).nonzero().squeeze(1)
            if items.numel() == 0:
                continue
            ye = self._swiglu(x.index_select(0, items // k) @ w1[e].t()) @ w2[e].t()
            y = y.index_copy(0, items, ye)
        return y.view(T, k, self.hidden)
