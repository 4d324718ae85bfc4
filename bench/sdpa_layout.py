#!/usr/bin/env python3
"""sdpa_layout.py - does PyTorch's SDPA (cuDNN backend) care how q, k and v
are laid out? coda's block hands attention q, k and v as column views of one
(M, nq + 2 nkv) tensor (the QKV epilogue's output); torch.compile's block
hands it separate tensors. Same values, same shapes, three layouts, timed in
turns (CUDA events, median), forward and backward:

  qkv views     q, k, v = qkv.split(...) of one (B*S, nq + 2 nkv) tensor,
                each .reshape(B, S, H, hd).transpose(1, 2)    (coda's block)
  bshd          three contiguous (B, S, H, hd) tensors, .transpose(1, 2)
  bhsd          three contiguous (B, H, S, hd) tensors

    python3 bench/sdpa_layout.py [--shapes 1b,8b,70b] [--reps 15]
"""
import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_attention import Timer  # noqa: E402  (CUDA events around one call)

SHAPES = {"1b": (32, 8, 64), "8b": (32, 8, 128), "70b": (64, 8, 128)}  # heads, kv heads, head_dim


def layouts(B, S, H, KV, hd, dev):
    g = torch.Generator(device=dev).manual_seed(0)
    qkv = torch.randn(B * S, (H + 2 * KV) * hd, device=dev, dtype=torch.bfloat16, generator=g)
    q, k, v = qkv.split([H * hd, KV * hd, KV * hd], dim=1)
    views = [t.reshape(B, S, n, hd).transpose(1, 2) for t, n in ((q, H), (k, KV), (v, KV))]
    bshd = [t.contiguous().reshape(B, S, n, hd).transpose(1, 2) for t, n in ((q, H), (k, KV), (v, KV))]
    bhsd = [t.contiguous() for t in views]
    return {"qkv views": views, "bshd": bshd, "bhsd": bhsd}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1b,8b,70b")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=15)
    a = ap.parse_args()
    dev = torch.device("cuda")
    print("device: %s; torch %s" % (torch.cuda.get_device_name(), torch.__version__))
    print("| shape | layout | fwd ms | bwd ms | strides of q, the backward's node |")
    print("|---|---|---:|---:|---|")
    for name in a.shapes.split(","):
        H, KV, hd = SHAPES[name]
        lay = layouts(a.batch, a.seq, H, KV, hd, dev)
        do = torch.randn(a.batch, H, a.seq, hd, device=dev, dtype=torch.bfloat16)
        runs = {}
        # the forward whose graph the backward runs is made under the cuDNN
        # backend too (the backward's kernel is fixed by it); its node is printed
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for lname, (q, k, v) in lay.items():
                q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))

                def fwd(q=q, k=k, v=v):
                    with torch.no_grad():
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

                def bwd(o=o, q=q, k=k, v=v):
                    return torch.autograd.grad(o, (q, k, v), do, retain_graph=True)

                runs[lname] = (fwd, bwd, "%s, backward %s" % (tuple(q.stride()), type(o.grad_fn).__name__))
            for f, b, _ in runs.values():  # warm-up
                f(), b()
            t, timed = {n: ([], []) for n in runs}, Timer(True)
            for _ in range(a.reps):
                for n, (f, b, _) in runs.items():
                    t[n][0].append(timed(f))
                    t[n][1].append(timed(b))
        for n, (f, b, st) in runs.items():
            print("| %s | %s | %.3f | %.3f | %s |" % (name, n, statistics.median(t[n][0]), statistics.median(t[n][1]),
                                                     st))
        del runs, lay
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
