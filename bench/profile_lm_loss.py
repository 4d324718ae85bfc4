#!/usr/bin/env python3
"""profile_lm_loss.py - where coda.ops.lm_loss's time goes on the GPU: each
kernel's total time over a few forward + backward steps (torch.profiler,
CUPTI), and the host time of one call (no sync inside the timed region), at
the shapes given (MxdxV, default the LLaMA-3 1B and 8B heads at 16384 tokens
and 2048^3). With --host N: the host time of a call layer by layer (median
of N calls, the stream drained before each, so no call waits for a full
launch queue): coda.ops.lm_loss's forward and backward, the binding
coda.lm_loss on outputs made beforehand, the C call alone through ctypes
with its arguments built beforehand; then the forward's Python profile.

    python3 bench/profile_lm_loss.py [--shapes 16384x2048x128256,...] [--steps 3] [--host 50]
"""
import argparse
import cProfile
import ctypes
import os
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import coda.ops  # noqa: E402


def host_median(fn, n):
    """Median host time (ms) of fn() over n calls, the stream drained
    before each."""
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        h0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - h0)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e3


def host_layers(shape, x, w, t, n):
    lib, ctx = coda.lib, coda.ops.context()
    m, d, v = x.shape[0], x.shape[1], w.shape[0]
    t32 = t.to(torch.int32)
    loss = torch.empty(m, dtype=torch.float32, device="cuda")
    total = torch.empty(1, dtype=torch.float32, device="cuda")
    dx = torch.empty(m, d, dtype=torch.bfloat16, device="cuda")
    dw = torch.empty(v, d, dtype=torch.float32, device="cuda")
    o = coda.lm_loss_options()
    nws = coda.lm_loss_workspace_size(ctx, "cuda", m, d, v, o)
    buf = torch.empty(nws + 256, dtype=torch.uint8, device="cuda")
    ws = buf[(-buf.data_ptr()) % 256:][:nws]  # 256-byte aligned
    wsp = ctypes.c_void_p(ws.data_ptr())
    xd, wd = x.detach(), w.detach()
    descs = [coda.describe_tensor(a) for a in (xd, wd, t32, loss, total, dx, dw)]
    refs = [ctypes.byref(a) for a in descs]
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def c_call():
        coda._check(lib.coda_lm_loss(ctx.handle, refs[0], refs[1], refs[2], ctypes.byref(o), refs[3], refs[4],
                                     refs[5], refs[6], wsp, nws, stream))

    def binding():
        coda.lm_loss(ctx, xd, wd, t32, loss=loss, total=total, dx=dx, dw=dw, opts=o, workspace=ws)

    held = []

    def forward():
        x.grad = w.grad = None
        held.append(coda.ops.lm_loss(x, w, t)[0])

    def backward():
        held.pop().backward()

    rows = [("C call (ctypes, arguments built before)", host_median(c_call, n)),
            ("binding coda.lm_loss (outputs given)", host_median(binding, n))]
    fwd = host_median(forward, n)
    held.clear()
    bw = []
    for _ in range(n):
        forward()
        torch.cuda.synchronize()
        h0 = time.perf_counter()
        backward()
        bw.append(time.perf_counter() - h0)
    torch.cuda.synchronize()
    rows += [("coda.ops.lm_loss forward (autograd)", fwd), ("its backward", statistics.median(bw) * 1e3)]
    print("%s: host time a call, median of %d" % (shape, n))
    for name, ms in rows:
        print("  %-45s %8.3f ms" % (name, ms))
    prof = cProfile.Profile()
    for _ in range(n):
        torch.cuda.synchronize()
        prof.enable()
        forward()
        prof.disable()
        held.clear()
    torch.cuda.synchronize()
    print("%s: the forward's Python profile (%d calls, by own time)" % (shape, n))
    pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(40)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="16384x2048x128256,16384x4096x128256,2048x2048x2048")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--host", type=int, default=0, help="calls per layer for the host-time breakdown (0: none)")
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
        if args.host:
            host_layers(shape, x, w, t, args.host)
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
