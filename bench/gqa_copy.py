#!/usr/bin/env python3
"""gqa_copy.py - what coda.nn.causal_attention (LlamaBlock's default
attention) saves by calling SDPA with enable_gqa instead of copying k and v
once per query head (repeat_interleave), at the LLaMA-3 1B / 8B / 70B
attention shapes, batch 2 x sequence 8192: forward + backward time (CUDA
events, median of --reps, the two forms alternated) and peak memory, and
that the two give the same o and dqkv.

    python3 bench/gqa_copy.py [--shapes 1b,8b,70b] [--reps 10]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import coda.nn as cn  # noqa: E402

SHAPES = {"1b": (32, 8, 64), "8b": (32, 8, 128), "70b": (64, 8, 128)}  # n_heads, n_kv_heads, head_dim


def step(qkv, do, shape, B, S):
    qkv.grad = None
    o = cn.causal_attention(qkv, B, S, *shape)
    o.backward(do)
    return o, qkv.grad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1b,8b,70b")
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    if not cn._SDPA_GQA:
        sys.exit("gqa_copy.py: torch %s has no enable_gqa (2.5 or later needed)" % torch.__version__)
    B, S = 2, 8192
    for name in a.shapes.split(","):
        H, KV, hd = SHAPES[name]
        qkv = torch.randn(B * S, (H + 2 * KV) * hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        do = torch.randn(B * S, H * hd, device="cuda", dtype=torch.bfloat16)
        out, ms, peak = {}, {True: [], False: []}, {}
        for gqa in (True, False):  # warm-up, results, peak memory
            cn._SDPA_GQA = gqa
            step(qkv, do, (H, KV, hd), B, S)
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            o, g = step(qkv, do, (H, KV, hd), B, S)
            torch.cuda.synchronize()
            peak[gqa] = (torch.cuda.max_memory_allocated() - base) / 2**20
            out[gqa] = (o.float(), g.float())
        for _ in range(a.reps):
            for gqa in (True, False):
                cn._SDPA_GQA = gqa
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                step(qkv, do, (H, KV, hd), B, S)
                e1.record()
                e1.synchronize()
                ms[gqa].append(e0.elapsed_time(e1))
        cn._SDPA_GQA = True
        med = {k: sorted(v)[len(v) // 2] for k, v in ms.items()}
        rel = [((x - y).norm() / y.norm()).item() for x, y in zip(out[True], out[False])]
        print("%s: fwd+bwd enable_gqa %.3f ms, copied k/v %.3f ms (%.3fx); peak %.0f / %.0f MiB; "
              "o and dqkv differ by %.1e / %.1e" % (name, med[True], med[False], med[False] / med[True],
                                                   peak[True], peak[False], rel[0], rel[1]), flush=True)


if __name__ == "__main__":
    main()
