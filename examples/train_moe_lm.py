#!/usr/bin/env python3
"""Train a small MoE language model twice from the same seed, once with mxmoe's MXFP8 layer
(mxmoe.torch.MoE) and once with the plain-PyTorch BF16 layer (mxmoe.torch.ReferenceMoE), and plot
both loss curves.

    pip install --no-build-isolation --no-deps -e .
    python3 examples/train_moe_lm.py --steps 300 --out OUT

Writes OUT/train_moe_lm.png (training loss per step and evaluation loss of both runs) and
OUT/train_moe_lm.json (the curves, final losses, mean step times); prints a summary.

Data (generated here, no downloads): a mixture of R random first-order Markov chains ("regimes")
over a vocabulary of V tokens. Every chain lets each token go to 4 successors with probabilities
drawn from a Dirichlet distribution; a sequence follows one regime throughout, so the model has to
infer the regime from the context (attention) and then predict the successor, which is what the
experts can specialise on. The best achievable loss (printed) is the mean entropy of the
successor distributions, reached once the regime is known.

Model: token embedding, L blocks of [RMSNorm, causal multi-head attention, RMSNorm, MoE FFN (SwiGLU
experts, top-k softmax routing)], RMSNorm, LM head tied to the embedding. Attention and the
embedding run in FP32 master weights under BF16 autocast; the MoE layers keep BF16 master weights
(their parameters), so both variants see the same inputs, parameters and data order; they differ
only in the MoE arithmetic (MXFP8 vs BF16).
"""
import argparse
import json
import math
import os
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

try:
    import mxmoe
    from mxmoe.torch import MoE, ReferenceMoE
except ImportError as e:  # pragma: no cover
    sys.exit(f"mxmoe is not importable ({e}); run `pip install --no-build-isolation --no-deps -e .` first")


# ---- data ----------------------------------------------------------------------------------------

def make_markov_mixture(vocab, regimes, branching, seed, device):
    """successors [R, V, b] int64, probs [R, V, b] FP32, entropy floor (nats per token)."""
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    succ = torch.stack([torch.stack([torch.randperm(vocab, generator=g)[:branching] for _ in range(vocab)])
                        for _ in range(regimes)])
    probs = torch.distributions.Dirichlet(torch.ones(branching)).sample((regimes, vocab))
    # torch.distributions draws from the global generator: seeded by the caller
    floor = float(-(probs * probs.clamp_min(1e-12).log()).sum(-1).mean())
    return succ.to(device), probs.to(device), floor


def sample_sequences(succ, probs, n, length, gen):
    """n sequences of `length` tokens, each from one random regime. int64 [n, length]."""
    R, V, _ = succ.shape
    dev = succ.device
    regime = torch.randint(0, R, (n,), device=dev, generator=gen)
    tok = torch.randint(0, V, (n,), device=dev, generator=gen)
    out = torch.empty(n, length, dtype=torch.int64, device=dev)
    out[:, 0] = tok
    for t in range(1, length):
        p = probs[regime, tok]  # [n, b]
        j = torch.multinomial(p, 1, generator=gen).squeeze(1)
        tok = succ[regime, tok, j]
        out[:, t] = tok
    return out


# ---- model ---------------------------------------------------------------------------------------

class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        B, S, D = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, S, D))


class Block(nn.Module):
    def __init__(self, dim, heads, moe):
        super().__init__()
        self.norm1 = nn.RMSNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.RMSNorm(dim)
        self.moe = moe

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.moe(self.norm2(x))


class MoELM(nn.Module):
    def __init__(self, vocab, dim, layers, heads, make_moe):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.blocks = nn.ModuleList([Block(dim, heads, make_moe()) for _ in range(layers)])
        self.norm = nn.RMSNorm(dim)

    def forward(self, tokens):
        x = self.embed(tokens)
        for b in self.blocks:
            x = b(x)
        return self.norm(x) @ self.embed.weight.t()  # tied LM head


# ---- training ------------------------------------------------------------------------------------

def lr_at(step, steps, lr, warmup):
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def train(kind, args, data, eval_data, init_state, device):
    moe_cls = MoE if kind == "mxmoe" else ReferenceMoE
    tokens_per_step = args.batch * (args.seq - 1)
    torch.manual_seed(args.seed)
    model = MoELM(args.vocab, args.dim, args.layers, args.heads,
                  lambda: moe_cls(args.dim, args.inter, args.experts, args.top_k, mode=args.mode,
                                  max_tokens=tokens_per_step, device=device)).to(device)
    if init_state is not None:
        model.load_state_dict(init_state)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    def loss_of(batch):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(batch[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, args.vocab), batch[:, 1:].reshape(-1))

    losses, evals, times = [], [], []
    for step in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        batch = data[step * args.batch:(step + 1) * args.batch]
        loss = loss_of(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.detach())
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if step % args.eval_every == 0 or step == args.steps - 1:
            with torch.no_grad():
                ev = torch.stack([loss_of(eval_data[i:i + args.batch]) for i in range(0, len(eval_data), args.batch)])
            evals.append((step, float(ev.mean())))
    losses = [float(v) for v in losses]
    skip = min(10, args.steps // 2)  # first steps: allocations, cuBLAS heuristics
    return {
        "train_loss": losses,
        "eval_loss": evals,
        "final_train_loss": sum(losses[-10:]) / len(losses[-10:]),
        "final_eval_loss": evals[-1][1],
        "mean_step_ms": 1e3 * sum(times[skip:]) / max(1, len(times[skip:])),
    }, state


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default="out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=257, help="tokens per sequence (inputs are seq - 1 long)")
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--regimes", type=int, default=8)
    ap.add_argument("--branching", type=int, default=4)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--inter", type=int, default=512, help="per-expert intermediate size")
    ap.add_argument("--mode", choices=["fast", "exact"], default="fast", help="mxmoe's MXFP8 GEMM mode")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--eval-every", type=int, default=25)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU (Hopper, sm_90a)")
    os.makedirs(args.out, exist_ok=True)
    device = torch.device("cuda")

    torch.manual_seed(args.seed)
    succ, probs, floor = make_markov_mixture(args.vocab, args.regimes, args.branching, args.seed, device)
    gen = torch.Generator(device=device).manual_seed(args.seed + 2)
    data = sample_sequences(succ, probs, args.steps * args.batch, args.seq, gen)
    eval_data = sample_sequences(succ, probs, 4 * args.batch, args.seq, gen)
    print(f"data: {args.regimes} Markov regimes over {args.vocab} tokens, {args.branching} successors each; "
          f"{args.steps} steps x {args.batch} x {args.seq - 1} tokens; loss floor {floor:.3f} nats "
          f"(uniform: {math.log(args.vocab):.3f})")
    print(f"model: {args.layers} layers, dim {args.dim}, {args.experts} experts (top-{args.top_k}, "
          f"intermediate {args.inter}); mxmoe {mxmoe.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}")

    results, init = {}, None
    for kind in ("mxmoe", "reference"):
        t0 = time.perf_counter()
        res, state = train(kind, args, data, eval_data, init, device)
        init = init if init is not None else state  # the reference run starts from the mxmoe run's weights
        res["wall_s"] = time.perf_counter() - t0
        results[kind] = res
        print(f"{kind:>9}: final train loss {res['final_train_loss']:.4f} (mean of the last 10 steps), "
              f"eval loss {res['final_eval_loss']:.4f}, mean step {res['mean_step_ms']:.2f} ms, "
              f"run {res['wall_s']:.1f} s")
    a, b = results["mxmoe"], results["reference"]
    print(f"mxmoe - reference: train {a['final_train_loss'] - b['final_train_loss']:+.4f}, "
          f"eval {a['final_eval_loss'] - b['final_eval_loss']:+.4f} nats; "
          f"step time ratio {b['mean_step_ms'] / a['mean_step_ms']:.2f}x (reference / mxmoe)")

    with open(os.path.join(args.out, "train_moe_lm.json"), "w") as f:
        json.dump({"args": vars(args), "loss_floor": floor, "results": results}, f, indent=1)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for kind, color, label in (("mxmoe", "tab:red", "mxmoe MoE (MXFP8)"),
                               ("reference", "tab:blue", "ReferenceMoE (BF16)")):
        r = results[kind]
        ax.plot(r["train_loss"], color=color, alpha=0.35, lw=1)
        w = 10
        sm = [sum(r["train_loss"][max(0, i - w + 1):i + 1]) / len(r["train_loss"][max(0, i - w + 1):i + 1])
              for i in range(len(r["train_loss"]))]
        ax.plot(sm, color=color, lw=1.8, label=f"{label}: train (10-step mean)")
        ax.plot([s for s, _ in r["eval_loss"]], [v for _, v in r["eval_loss"]], "o--", color=color, ms=3,
                label=f"{label}: eval")
    ax.axhline(floor, color="gray", ls=":", label=f"entropy floor {floor:.2f}")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_title(f"MoE LM, {args.layers} layers, {args.experts} experts top-{args.top_k}, same seed and data")
    ax.set_ylim(bottom=max(0.0, floor - 0.3))
    ax.legend()
    fig.tight_layout()
    png = os.path.join(args.out, "train_moe_lm.png")
    fig.savefig(png, dpi=120)
    print(f"wrote {png} and {os.path.join(args.out, 'train_moe_lm.json')}")


if __name__ == "__main__":
    main()
