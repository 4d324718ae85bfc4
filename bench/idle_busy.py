#!/usr/bin/env python3
"""idle_busy.py - a step's GPU time two ways, to tell host from kernels.

bench_lm_loss.py and bench_block.py synchronise before each timed run, so
the GPU is idle when the first event is recorded and whatever the host does
before the first kernel is measured too ("idle" below). Here each variant
is also timed with a sleep kernel queued first, so that the host's launches
are hidden and only the kernels count ("busy"). Median of --reps runs, with
the host time of the timed call beside it. --timeline prints coda's kernels
of one step with the gaps between them (torch.profiler).

    python3 bench/idle_busy.py lm 8192x8192x8192 4096x4096x4096 2048x2048x2048
    python3 bench/idle_busy.py block 1b 8b
"""
import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
sys.path.insert(0, HERE)
import coda.ops  # noqa: E402

SLEEP_CYCLES = 6_000_000  # about 3 ms at the H200's clock: longer than any launch sequence here


def idle_busy(fn, reps):
    """-> {"idle": ms, "busy": ms, "host": ms}: medians over reps runs each."""
    out = {}
    for mode in ("idle", "busy"):
        gpu, host = [], []
        for _ in range(reps):
            torch.cuda.synchronize()
            if mode == "busy":
                torch.cuda._sleep(SLEEP_CYCLES)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            h0 = time.perf_counter()
            e0.record()
            fn()
            e1.record()
            host.append(1e3 * (time.perf_counter() - h0))
            e1.synchronize()
            gpu.append(e0.elapsed_time(e1))
        out[mode] = statistics.median(gpu)
        out.setdefault("host", statistics.median(host))
    return out


def timeline(fn, label):
    """One call of fn: its kernels in start order, duration and the gap before each (us)."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    ev = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                key=lambda e: e.time_range.start)
    if not ev:
        return
    t0 = prev = ev[0].time_range.start
    idle = 0.0
    print("%s: kernels (us from the first)" % label)
    for e in ev:
        s, end = e.time_range.start, e.time_range.end
        idle += max(0.0, s - prev)
        print("  %9.1f +%8.1f gap %7.1f  %s" % (s - t0, end - s, s - prev, e.name[:80]))
        prev = max(prev, end)
    print("  idle between kernels %.1f us" % idle)


def report(label, variants, reps):
    for name, fn in variants:
        r = idle_busy(fn, reps)
        print("%-24s %-10s idle %8.3f ms  busy %8.3f ms  host %7.3f ms" % (label, name, r["idle"], r["busy"],
                                                                           r["host"]), flush=True)


def lm_variants(m, d, v):
    """The 3-GEMM floor, torch.compile and coda (int64 and int32 targets), as bench_lm_loss.py."""
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(m, d, generator=g).cuda().bfloat16()
    w = (torch.randn(v, d, generator=g) * (2.0 / math.sqrt(d))).cuda().bfloat16()
    t = torch.randint(0, v, (m,), generator=g).cuda()
    t32 = t.to(torch.int32)
    dz = torch.randn(m, v, device="cuda", dtype=torch.bfloat16) * 1e-3
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    compiled = torch.compile(lambda a, b, c: F.cross_entropy(F.linear(a, b).float(), c), dynamic=False)

    def step(loss_fn, targets):
        def run():
            xg.grad = wg.grad = None
            loss_fn(xg, wg, targets).backward()
        return run

    def floor():
        x @ w.t()
        dz @ w
        dz.t() @ x
    coda_loss = lambda a, b, c: coda.ops.lm_loss(a, b, c)[0]
    return [("floor", floor), ("compile", step(compiled, t)), ("coda", step(coda_loss, t)),
            ("coda i32", step(coda_loss, t32))]


def block_variants(name, mode):
    """The floor, torch.compile and coda's block (bench_block.py's modules), fwd or fwd+bwd."""
    import bench_block as bb
    shape = bb.SHAPES[name]
    dev = torch.device("cuda")
    W = bb.weights(shape, dev)
    floor = bb.Floor(W, shape, 2, 8192)
    mods = [("compile", torch.compile(bb.TorchBlock(W, shape, 8192))), ("coda", bb.coda_block(W, shape, dev))]
    x = torch.randn(2, 8192, shape[0], device=dev, dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    xg = x.clone().requires_grad_(True)

    def call(m):
        def fwd():
            with torch.no_grad():
                m(x)

        def fwd_bwd():
            for p in m.parameters():
                p.grad = None
            xg.grad = None
            m(xg).backward(dy)
        return fwd if mode == "fwd" else fwd_bwd
    fl = (lambda: floor.fwd(x)) if mode == "fwd" else (lambda: floor.fwd_bwd(x, dy))
    return [("floor", fl)] + [(n, call(m)) for n, m in mods]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("lm", "block"))
    ap.add_argument("shapes", nargs="+", help="lm: MxdxV; block: 1b, 8b or 70b")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--timeline", action="store_true")
    a = ap.parse_args()
    for s in a.shapes:
        groups = ([(s, lm_variants(*(int(v) for v in s.split("x"))))] if a.what == "lm" else
                  [("%s %s" % (s, mode), block_variants(s, mode)) for mode in ("fwd", "fwd+bwd")])
        for label, variants in groups:
            for _, fn in variants:  # warm-up (and compile)
                for _ in range(3):
                    fn()
            report(label, variants, a.reps)
            if a.timeline:
                timeline(dict(variants)["coda"], label + " coda")


if __name__ == "__main__":
    main()
