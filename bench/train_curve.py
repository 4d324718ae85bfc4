#!/usr/bin/env python3
"""train_curve.py - coda's LLaMA model and the same model in plain PyTorch,
trained side by side on a real text corpus; their loss curves, and the
run-to-run noise they are judged against, in a PNG.

Corpus: the license texts of Debian's base-files package
(/usr/share/common-licenses, on every Debian system), concatenated in name
order, as bytes (vocabulary 256); the last 10% held out. Model: a small
LLaMA (coda.nn.LlamaModel: embedding, coda blocks with torch's attention,
final RMSNorm, LM head + cross-entropy), f32 master parameters, AdamW.

Three runs of --steps steps, each from the same initial weights:
  coda      coda.nn.LlamaModel, batches in order A
  torch     the same weights in a plain PyTorch model (bench_block's
            TorchBlock), batches in order A
  torch B   the plain model again, batches in order B: how far two runs
            that should learn the same thing drift apart (the noise)
Pass: the mean |coda - torch| of the smoothed curves over the second half
is at most the mean |torch - torch B| (within run-to-run noise).

    python3 bench/train_curve.py [--device cpu|cuda] [--steps 300] [--png bench/train_curve.png]
"""
import argparse
import copy
import glob
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
sys.path.insert(0, HERE)
import coda  # noqa: E402
import coda.nn  # noqa: E402
import bench_block  # noqa: E402  (the PyTorch block)


def corpus():
    files = sorted(f for f in glob.glob("/usr/share/common-licenses/*") if os.path.isfile(f))
    if not files:
        raise SystemExit("train_curve: no /usr/share/common-licenses (Debian's base-files package)")
    data = b"".join(open(f, "rb").read() for f in files)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long(), len(files)


class TorchModel(torch.nn.Module):
    """The coda model's weights in a plain PyTorch LLaMA (PyTorch layout)."""

    def __init__(self, cm, seq):
        super().__init__()
        c = cm.cfg
        shape = (c.d, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn, c.rope_theta)
        self.embed = copy.deepcopy(cm.embed)
        blocks = []
        for blk in cm.layers:
            w = coda.unpack_grads(c, {n: getattr(blk, n).detach() for n in coda.nn._BLOCK_PARAMS})
            blocks.append(bench_block.TorchBlock({k: v.to(torch.float32) for k, v in w.items()}, shape, seq))
        self.layers = torch.nn.ModuleList(blocks)
        self.norm = copy.deepcopy(cm.norm)
        self.head = copy.deepcopy(cm.head)

    def forward(self, tokens, targets):
        h = self.embed(tokens).to(torch.bfloat16)
        for layer in self.layers:
            h = layer_bf16(layer, h)
        return self.head(self.norm(h), targets)


def layer_bf16(layer, h):
    """The PyTorch block with bf16 compute over f32 master weights, as coda's."""
    params = {n: p.to(torch.bfloat16) for n, p in layer.named_parameters()}
    params.update(dict(layer.named_buffers()))
    return torch.func.functional_call(layer, params, (h,))


def train(model, opt, data, g, steps, batch, seq, device):
    """steps of opt on windows of seq + 1 bytes at offsets drawn from
    generator g -> the losses."""
    n = data.numel() - seq - 1
    losses = []
    for step in range(steps):
        idx = torch.randint(0, n, (batch,), generator=g)
        chunk = torch.stack([data[i: i + seq + 1] for i in idx.tolist()]).to(device)
        loss = model(chunk[:, :-1], chunk[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def smooth(v, k=20):
    out, acc = [], 0.0
    for i, x in enumerate(v):
        acc += x
        if i >= k:
            acc -= v[i - k]
        out.append(acc / min(i + 1, k))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--png", default=os.path.join(HERE, "train_curve.png"))
    a = ap.parse_args()
    data, nfiles = corpus()
    hold = int(0.9 * data.numel())
    train_data = data[:hold]
    cfg = coda.LlamaConfig(d=128, n_heads=4, n_kv_heads=2, head_dim=32, ffn=352, vocab=0, rope_theta=10000.0)
    torch.manual_seed(0)
    cm = coda.nn.LlamaModel(cfg, 2, 256, device=a.device)
    tm = TorchModel(cm, a.seq).to(a.device)
    tm_b = copy.deepcopy(tm)
    print("corpus: %d bytes of %d license texts (base-files); model d %d, 2 blocks, %d parameters; "
          "%d steps of %d x %d bytes on %s" % (data.numel(), nfiles, cfg.d, sum(p.numel() for p in cm.parameters()),
                                              a.steps, a.batch, a.seq, a.device), flush=True)
    runs = {}
    for name, model, order in (("coda", cm, 1), ("torch", tm, 1), ("torch B", tm_b, 2)):
        t0 = time.time()
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
        runs[name] = train(model, opt, train_data, torch.Generator().manual_seed(order), a.steps, a.batch, a.seq,
                           a.device)
        print("  %-8s loss %.3f -> %.3f (%.1f s)" % (name, runs[name][0], runs[name][-1], time.time() - t0),
              flush=True)
    s = {k: smooth(v) for k, v in runs.items()}
    half = a.steps // 2
    diff = sum(abs(x - y) for x, y in zip(s["coda"][half:], s["torch"][half:])) / (a.steps - half)
    noise = sum(abs(x - y) for x, y in zip(s["torch B"][half:], s["torch"][half:])) / (a.steps - half)
    ok = diff <= noise
    print("second half, smoothed (20 steps): mean |coda - torch| %.4f, mean |torch - torch B| (noise) %.4f: %s"
          % (diff, noise, "within noise" if ok else "OUTSIDE noise"))
    plot(s, {"coda": "-", "torch": "--", "torch B": ":"},
         "byte-level LLaMA on base-files' license texts (%s)" % a.device, a.png)
    return 0 if ok else 1


def plot(curves, styles, title, png):
    """The smoothed curves ({name: losses}, line style by name) in a PNG,
    where matplotlib is installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print("no plot (%s)" % e)
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for k, v in curves.items():
        ax.plot(v, styles.get(k, "-"), label="%s (smoothed)" % k)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/byte)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    print("plot: %s" % png)


if __name__ == "__main__":
    sys.exit(main())
