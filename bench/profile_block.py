#!/usr/bin/env python3
"""profile_block.py - where one LLaMA block's forward + backward spends its
GPU time, kernel by kernel (torch.profiler, CUPTI), for the floor, torch.compile
and coda as bench_block.py builds them, so the block's distance from the floor
can be read as a list of kernels: which GEMM of coda's is slower than its
cuBLAS twin, and what runs besides the GEMMs.

    python3 bench/profile_block.py [--shapes 8b] [--variants floor,torch.compile,coda,coda+attn] [--steps 3]
                                   [--top 25]
                                   [--sequence] [--each coda_attn,flash_bprop]

--sequence also lists one step's kernels in launch order with their times
(the GEMMs of coda and of the floor side by side, call by call).
--each lists every call's time of the kernels whose names contain one of
the given strings, over the --steps steps (a kernel whose time moves from
step to step, as coda's attention backward did in the 1B block at stop 55).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_block as bb  # noqa: E402  (the same modules and inputs as the benchmark)
from step_timer import cuda_events  # noqa: E402


def kernel_table(fn, steps, each=None):
    """{kernel name: (calls per step, us per step)} over `steps` calls of fn;
    each (a dict): also every call's us, by kernel name, in launch order."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    rows = {}
    for e in cuda_events(prof):
        t = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        n, tot = rows.get(e.name, (0, 0.0))
        rows[e.name] = (n + 1, tot + t)
        if each is not None:
            each.setdefault(e.name, []).append(t)
    return {k: (n / steps, tot / steps) for k, (n, tot) in rows.items()}


def kernel_sequence(fn):
    """[(kernel name, us)] of one call of fn, in the order they ran."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [(e.name, e.time_range.end - e.time_range.start) for e in cuda_events(prof)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8b")
    ap.add_argument("--variants", default="floor,torch.compile,coda")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--sequence", action="store_true")
    ap.add_argument("--each", default="", metavar="S,S",
                    help="also every call's time of the kernels whose names contain one of these strings")
    a = ap.parse_args()
    want = a.variants.split(",")
    dev = torch.device("cuda")
    for name in a.shapes.split(","):
        shape = bb.SHAPES[name]
        d = shape[0]
        B, S = a.batch, a.seq
        W = bb.weights(shape, dev)
        x = torch.randn(B, S, d, device=dev, dtype=torch.bfloat16)
        dy = torch.randn(B, S, d, device=dev, dtype=torch.bfloat16)
        xg = x.clone().requires_grad_(True)

        def module_step(m):
            def step():
                for p in m.parameters():
                    p.grad = None
                xg.grad = None
                m(xg).backward(dy)
            return step

        fns = {}
        if "floor" in want:
            floor = bb.Floor(W, shape, B, S)
            fns["floor"] = lambda: floor.fwd_bwd(x, dy)
        if "eager" in want:
            fns["eager"] = module_step(bb.TorchBlock(W, shape, S))
        if "torch.compile" in want:
            fns["torch.compile"] = module_step(torch.compile(bb.TorchBlock(W, shape, S)))
        if "coda" in want:
            fns["coda"] = module_step(bb.coda_block(W, shape, dev))
        if "coda+attn" in want:  # bench_block's --coda-attention: coda's own attention
            fns["coda+attn"] = module_step(bb.coda_block(W, shape, dev, bb.coda.nn.coda_attention))
        for v, fn in fns.items():
            for _ in range(2):
                fn()
            torch.cuda.synchronize()
            each = {}
            rows = kernel_table(fn, a.steps, each)
            total = sum(t for _, t in rows.values())
            print("%s %s: forward+backward, GPU busy %.3f ms a step (kernels summed), %d kernel launches"
                  % (name, v, total / 1e3, round(sum(n for n, _ in rows.values()))))
            for k, (n, t) in sorted(rows.items(), key=lambda r: -r[1][1])[:a.top]:
                print("  %9.3f ms %5.1f%% %4.0fx  %s" % (t / 1e3, 100 * t / total, n, k[:110]))
            for k, ts in each.items():
                if any(w.strip() and w.strip() in k for w in a.each.split(",")):
                    print("  each call, ms: %s  %s" % (" ".join("%.3f" % (t / 1e3) for t in ts), k[:110]))
            if a.sequence:
                print("  one step in launch order:")
                for i, (k, t) in enumerate(kernel_sequence(fn)):
                    if t >= 20:  # the memsets and tiny kernels left out
                        print("    %3d %9.3f ms  %s" % (i, t / 1e3, k[:100]))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
