#!/usr/bin/env python3
"""block_idle_busy.py - one LLaMA block's forward and forward+backward GPU
time for the floor, torch.compile and coda (bench_block.py's modules),
with the GPU idle before each run (bench_block.py's way: the host's path to
the first kernel counts) and busy (a 3 ms sleep kernel first: only the
kernels count). Median of 7. TIMELINE=1 also prints coda's kernels of one
step with the gaps between them.

    python3 bench/block_idle_busy.py 1b 8b
"""
import os, sys, statistics, time
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_block as bb

def run(name, reps=7):
    shape = bb.SHAPES[name]
    B, S = 2, 8192
    dev = torch.device("cuda")
    d = shape[0]
    W = bb.weights(shape, dev)
    floor = bb.Floor(W, shape, B, S)
    comp = torch.compile(bb.TorchBlock(W, shape, S))
    cm = bb.coda_block(W, shape, dev)
    x = torch.randn(B, S, d, device=dev, dtype=torch.bfloat16)
    dy = torch.randn(B, S, d, device=dev, dtype=torch.bfloat16)
    xg = x.clone().requires_grad_(True)
    def fns(m):
        def f():
            with torch.no_grad():
                return m(x)
        def fb():
            for p in m.parameters(): p.grad = None
            xg.grad = None
            y = m(xg); y.backward(dy); return y
        return f, fb
    V = [("floor", (lambda: floor.fwd(x), lambda: floor.fwd_bwd(x, dy))), ("compile", fns(comp)), ("coda", fns(cm))]
    for _, (f, fb) in V:
        for _ in range(2): f(); fb()
    torch.cuda.synchronize()
    for mi, mode in enumerate(("fwd", "fwd+bwd")):
        for busy in (0, 1):
            for v, fs in V:
                ts, hs = [], []
                for _ in range(reps):
                    torch.cuda.synchronize()
                    if busy: torch.cuda._sleep(6_000_000)
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    h0 = time.perf_counter(); e0.record(); fs[mi](); e1.record(); h1 = time.perf_counter()
                    e1.synchronize()
                    ts.append(e0.elapsed_time(e1)); hs.append((h1 - h0) * 1e3)
                print("%s %-8s %-5s %-8s gpu %8.3f ms  host %7.3f ms" % (name, mode, "busy" if busy else "idle", v,
                      statistics.median(ts), statistics.median(hs)), flush=True)
    if os.environ.get("TIMELINE"):
        for mi, mode in enumerate(("fwd", "fwd+bwd")):
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                V[2][1][mi](); torch.cuda.synchronize()
            ev = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                        key=lambda e: e.time_range.start)
            t0 = ev[0].time_range.start; prev = t0; idle = 0.0
            print("%s coda %s timeline (us):" % (name, mode))
            for e in ev:
                s, en = e.time_range.start, e.time_range.end
                idle += max(0.0, s - prev)
                print("  %9.1f +%8.1f gap %7.1f  %s" % (s - t0, en - s, s - prev, e.name[:80]))
                prev = max(prev, en)
            print("  total idle between kernels %.1f us" % idle)

for n in sys.argv[1:]:
    run(n)
