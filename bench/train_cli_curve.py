#!/usr/bin/env python3
"""train_cli_curve.py - `coda train` (the C command: the split block, coda's
attention, the LM head as epilogue programs, AdamW in C) against the same
model and recipe in plain PyTorch, on the same text: do their loss curves
agree within the run-to-run noise?

`coda train` draws its initial weights and its batches from its own
generator, so no PyTorch run can repeat it bit for bit. What is compared is
the curve: three plain-PyTorch runs with three seeds (three initialisations
and three batch orders) show how far two runs of one recipe drift apart;
coda's run, with a fourth seed, should stay as close to them.

The recipe, as tools/cli_train.c has it:
- model: byte-level LLaMA (vocabulary 256), RMSNorm eps 1e-5, RoPE theta
  10000, bf16 compute over f32 master weights;
- initialisation: embedding N(0, 1), matrices N(0, 1 / fan_in), norm weights 1;
- AdamW with betas (0.9, 0.95), eps 1e-8, weight decay 0.01 on matrices
  (embedding and LM head included) and 0 on vectors, a constant lr;
- batches: windows of seq + 1 bytes at uniform random offsets; the loss is
  the mean over the batch's tokens;
- the embedding gathered in f32 (its gradient summed in f32) and the logits
  in f32 from bf16 operands, as in C. The weight gradients are bf16-rounded
  here and f32 in C: small against the seeds' noise.

Pass (--check): over the second half of the steps, smoothed over 20 steps,
the mean |coda - torch seed 1| is at most twice the largest mean |torch
seed i - torch seed j|. Twice, because three seeds show little of the
noise's tail. On the CPU defaults (stop 45) the three torch pairs are
0.034-0.045 apart. coda train with seeds 4-7 is 0.031, 0.042, 0.069 and
0.043 from torch seed 1. With a third of the lr coda is 0.27 away (caught);
with twice the lr it is 0.038 away (not caught: at this size both learn
alike). Exit status 1 when it fails.

    python3 bench/train_cli_curve.py [--device cpu|cuda] [--steps 300] [--check] [--png FILE]
"""
import argparse
import math
import os
import re
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from train_curve import plot, smooth, train  # noqa: E402  (the loop, smoothing and plot of coda.nn's curves)

from coda.nn import causal_attention, rms_norm_torch  # noqa: E402  (train_curve put the binding on the path)

CODA = os.path.join(os.path.dirname(HERE), "build", "coda")
EPS = 1e-5  # cli_train.c's RMSNorm eps
DATA = "/usr/share/common-licenses/GPL-3"  # coda train's default corpus (Debian's base-files)


def rope(x, pos, theta=10000.0):
    """Rotate-half RoPE over the last dim of x (B, S, heads, hd), in f32."""
    hd = x.shape[-1]
    f = theta ** (-torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd)
    ang = (pos[:, None].float() * f[None, :])[:, None, :]  # (S, 1, hd/2): the same for every head
    c, s = torch.cos(ang), torch.sin(ang)
    x1, x2 = x[..., : hd // 2].float(), x[..., hd // 2:].float()
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1).to(x.dtype)


class Model(torch.nn.Module):
    """The plain-PyTorch LLaMA of the recipe: f32 parameters, bf16 compute."""

    def __init__(self, d, heads, kv, ffn, layers, gen):
        super().__init__()
        self.d, self.heads, self.kv, self.hd = d, heads, kv, d // heads
        nq, nkv = heads * self.hd, kv * self.hd

        def mat(rows, cols, std):
            return torch.nn.Parameter(torch.randn(rows, cols, generator=gen) * std)
        self.embed = mat(256, d, 1.0)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            b = torch.nn.Module()
            b.g1, b.g2 = torch.nn.Parameter(torch.ones(d)), torch.nn.Parameter(torch.ones(d))
            b.wq, b.wk, b.wv = mat(nq, d, d ** -0.5), mat(nkv, d, d ** -0.5), mat(nkv, d, d ** -0.5)
            b.wo = mat(d, nq, nq ** -0.5)
            b.w_gate, b.w_up, b.w_down = mat(ffn, d, d ** -0.5), mat(ffn, d, d ** -0.5), mat(d, ffn, ffn ** -0.5)
            self.blocks.append(b)
        self.gf = torch.nn.Parameter(torch.ones(d))
        self.wlm = mat(256, d, d ** -0.5)

    def forward(self, tokens, targets):
        B, S = tokens.shape
        bf = torch.bfloat16
        pos = torch.arange(S, device=tokens.device)
        h = self.embed[tokens].to(bf)  # gathered in f32: the rows' gradients add up in f32, as in C
        for b in self.blocks:
            x = rms_norm_torch(h, b.g1.to(bf), EPS)
            q = F.linear(x, b.wq.to(bf)).view(B, S, self.heads, self.hd)
            k = F.linear(x, b.wk.to(bf)).view(B, S, self.kv, self.hd)
            # q and k roped, then coda.nn's causal GQA attention over the (M, nqkv) rows
            qkv = torch.cat((rope(q, pos).reshape(B * S, -1), rope(k, pos).reshape(B * S, -1),
                             F.linear(x, b.wv.to(bf)).reshape(B * S, -1)), -1)
            o = causal_attention(qkv, B, S, self.heads, self.kv, self.hd).view(B, S, -1)
            h = h + F.linear(o, b.wo.to(bf))
            x = rms_norm_torch(h, b.g2.to(bf), EPS)
            c = F.silu(F.linear(x, b.w_gate.to(bf))) * F.linear(x, b.w_up.to(bf))
            h = h + F.linear(c, b.w_down.to(bf))
        # the logits in f32 from bf16 operands, as coda's LM head keeps them
        z = F.linear(rms_norm_torch(h, self.gf.to(bf), EPS).float(), self.wlm.to(bf).float())
        return F.cross_entropy(z.reshape(-1, 256), targets.reshape(-1))


def train_torch(a, data, seed, device):
    gen = torch.Generator().manual_seed(seed)
    model = Model(a.d, a.heads, a.kv_heads, a.ffn, a.layers, gen).to(device)
    mats = [p for p in model.parameters() if p.dim() == 2]
    vecs = [p for p in model.parameters() if p.dim() == 1]
    opt = torch.optim.AdamW([{"params": mats, "weight_decay": 0.01}, {"params": vecs, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    return train(model, opt, data, gen, a.steps, a.batch, a.seq, device)


def train_coda(a, seed):
    cmd = [a.coda, "train", "--data", a.data, "--steps", str(a.steps), "--every", "1", "--d", str(a.d),
           "--heads", str(a.heads), "--kv-heads", str(a.kv_heads), "--ffn", str(a.ffn), "--layers", str(a.layers),
           "--batch", str(a.batch), "--seq", str(a.seq), "--lr", repr(a.lr), "--seed", str(seed),
           "--device", a.device]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    losses = [float(m.group(2)) for m in re.finditer(r"^step\s+(\d+)\s+loss\s+([0-9.naif]+)", out.stdout, re.M)]
    if out.returncode != 0 or len(losses) != a.steps:
        sys.exit("train_cli_curve: %s exited %d with %d losses of %d:\n%s"
                 % (" ".join(cmd), out.returncode, len(losses), a.steps, out.stdout[-2000:]))
    return losses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=176)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--coda", default=CODA, help="the coda command (default build/coda)")
    ap.add_argument("--check", action="store_true", help="exit 1 when coda's curve is outside the noise")
    ap.add_argument("--png", default=None, help="plot the smoothed curves (needs matplotlib)")
    a = ap.parse_args()
    if a.device == "cuda" and a.d // a.heads not in (64, 128):
        ap.error("--device cuda: coda train's attention kernels take head_dim 64 or 128, and d / heads is %d "
                 "(try --d 256 --heads 4)" % (a.d // a.heads))
    with open(a.data, "rb") as f:
        data = torch.tensor(list(f.read()), dtype=torch.long)
    torch.set_num_threads(min(8, torch.get_num_threads()))
    print("corpus %s (%d bytes); d %d, %d blocks, heads %d/%d, ffn %d; %d steps of %d x %d bytes, lr %g, on %s"
          % (a.data, data.numel(), a.d, a.layers, a.heads, a.kv_heads, a.ffn, a.steps, a.batch, a.seq, a.lr,
             a.device), flush=True)
    runs = {}
    t0 = time.time()
    runs["coda train"] = train_coda(a, 4)
    print("  %-12s loss %.3f -> %.3f (%.1f s)" % ("coda train", runs["coda train"][0], runs["coda train"][-1],
                                                 time.time() - t0), flush=True)
    for seed in (1, 2, 3):
        t0 = time.time()
        name = "torch %d" % seed
        runs[name] = train_torch(a, data, seed, a.device)
        print("  %-12s loss %.3f -> %.3f (%.1f s)" % (name, runs[name][0], runs[name][-1], time.time() - t0),
              flush=True)
    s = {k: smooth(v) for k, v in runs.items()}
    half = a.steps // 2

    def dist(x, y):
        return sum(abs(p - q) for p, q in zip(s[x][half:], s[y][half:])) / (a.steps - half)
    diff = dist("coda train", "torch 1")
    pairs = [("torch 1", "torch 2"), ("torch 1", "torch 3"), ("torch 2", "torch 3")]
    noise = max(dist(x, y) for x, y in pairs)
    ok = diff <= 2 * noise and all(math.isfinite(v) for v in runs["coda train"])
    print("second half, smoothed over 20 steps: mean |coda train - torch 1| %.4f; between torch seeds %s "
          "(noise: the largest): %s" % (diff, " ".join("%.4f" % dist(x, y) for x, y in pairs),
                                        "within twice the noise" if ok else "OUTSIDE twice the noise"))
    print("final smoothed loss: %s" % ", ".join("%s %.3f" % (k, v[-1]) for k, v in s.items()))
    if a.png:
        plot(s, {k: "-" if k == "coda train" else ":" for k in s}, "coda train against plain PyTorch (%s)" % a.device,
             a.png)
    return 0 if ok or not a.check else 1


if __name__ == "__main__":
    sys.exit(main())
