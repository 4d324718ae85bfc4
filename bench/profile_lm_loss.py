#!/usr/bin/env python3
"""profile_lm_loss.py - where coda.ops.lm_loss's time goes on the GPU: each
kernel's total time over a few forward + backward steps (torch.profiler,
CUPTI), and the host time of one call (no sync inside the timed region), at
the shapes given (MxdxV, default the LLaMA-3 1B and 8B heads at 16384 tokens
and 2048^3).

    python3 bench/profile_lm_loss.py [--shapes 16384x2048x128256,...] [--steps 3]
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import coda.ops  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="16384x2048x128256,16384x4096x128256,2048x2048x2048")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    for shape in args.shapes.split(","):
        m, d, v = (int(s) for s in shape.split("x"))
        g = torch.Generator(device="cuda").manual_seed(0)
        x = (torch.randn(m, d, device="cuda", generator=g) * 0.5).bfloat16().requires_grad_()
        w = (torch.randn(v, d, device="cuda", generator=g) * (4.0 / d ** 0.5)).bfloat16().requires_grad_()
        t = torch.randint(0, v, (m,), device="cuda", generator=g)

        def step():
            x.grad = w.grad = None
            loss, _ = coda.ops.lm_loss(x, w, t)
            loss.backward()

        for _ in range(2):
            step()
        torch.cuda.synchronize()
        # host time of the forward call alone (the GPU runs behind it)
        x.grad = w.grad = None
        h0 = time.perf_counter()
        loss, _ = coda.ops.lm_loss(x, w, t)
        h1 = time.perf_counter()
        loss.backward()
        h2 = time.perf_counter()
        torch.cuda.synchronize()
        print("%s: host time of the forward call %.3f ms, of the backward %.3f ms" % (shape, (h1 - h0) * 1e3,
                                                                                  (h2 - h1) * 1e3))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
        rows = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                name = e.name[:60]
                n, tot = rows.get(name, (0, 0.0))
                rows[name] = (n + 1, tot + e.device_time_total if hasattr(e, "device_time_total")
                              else tot + e.cuda_time_total)
        total = sum(tot for _, tot in rows.values())
        print("%s: GPU time per step %.3f ms" % (shape, total / args.steps / 1e3))
        for name, (n, tot) in sorted(rows.items(), key=lambda r: -r[1][1]):
            print("  %-60s %4d calls %9.3f ms/step %5.1f%%" % (name, n // args.steps, tot / args.steps / 1e3,
                                                              100 * tot / total))


if __name__ == "__main__":
    main()
