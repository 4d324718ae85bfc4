#!/usr/bin/env python3
"""lm_idle_busy.py - the LM head step's GPU time (forward + backward) for
the 3-GEMM floor, torch.compile and coda (int64 and int32 targets), timed
as bench_lm_loss.py times it (GPU idle before each run, so the host's path
to the first kernel counts) and with the GPU kept busy first (a 2 ms sleep
kernel, so the launches are hidden and only the kernels count). Median of 9.
TIMELINE=1 also prints one step's kernels with the gaps between them.

    python3 bench/lm_idle_busy.py 8192x8192x8192 4096x4096x4096 2048x2048x2048
"""
import math, os, sys, time, statistics, json
import torch, torch.nn.functional as F
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import coda.ops

OUT = os.environ.get("OUT", ".")
def eager_loss(x, w, t):
    return F.cross_entropy(F.linear(x, w).float(), t)

def run(M, d, V):
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(M, d, generator=g).cuda().bfloat16()
    w = (torch.randn(V, d, generator=g) * (2.0 / math.sqrt(d))).cuda().bfloat16()
    t = torch.randint(0, V, (M,), generator=g).cuda()
    dz = torch.randn(M, V, device="cuda", dtype=torch.bfloat16) * 1e-3
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    comp = torch.compile(eager_loss, dynamic=False)
    def step(fn):
        def r():
            xg.grad = wg.grad = None
            loss = fn(xg, wg, t)
            loss.backward()
        return r
    def floor():
        x @ w.t(); dz @ w; dz.t() @ x
    V_ = {"floor": floor, "compile": step(comp), "coda": step(lambda a, b, c: coda.ops.lm_loss(a, b, c)[0]),
          "coda_i32": step(lambda a, b, c: coda.ops.lm_loss(a, b, t32)[0])}
    t32 = t.to(torch.int32)
    for fn in V_.values():
        for _ in range(3): fn()
    torch.cuda.synchronize()
    res = {}
    for mode in ("idle", "busy"):
        for name, fn in V_.items():
            ts = []
            for _ in range(9):
                torch.cuda.synchronize()
                if mode == "busy":
                    torch.cuda._sleep(4_000_000)  # ~2 ms: the host runs ahead of the GPU
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                h0 = time.perf_counter()
                e0.record(); fn(); e1.record()
                h1 = time.perf_counter()
                e1.synchronize()
                ts.append((e0.elapsed_time(e1), (h1 - h0) * 1e3))
            ms = statistics.median(a for a, _ in ts); hs = statistics.median(b for _, b in ts)
            res[(mode, name)] = ms
            print("%dx%dx%d %-5s %-9s gpu %.3f ms  host %.3f ms" % (M, d, V, mode, name, ms, hs), flush=True)
    # timeline of one coda step, GPU idle before
    for name in (("coda", "compile") if os.environ.get("TIMELINE") else ()):
        fn = V_[name]
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn(); torch.cuda.synchronize()
        prof.export_chrome_trace(os.path.join(OUT, "trace_%s_%d.json" % (name, M)))
        ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        ev.sort(key=lambda e: e.time_range.start)
        if not ev: continue
        t0 = ev[0].time_range.start; prev = t0
        print("%s timeline (us from the first kernel):" % name)
        for e in ev:
            s, en = e.time_range.start, e.time_range.end
            print("  %9.1f +%8.1f gap %7.1f  %s" % (s - t0, en - s, s - prev, e.name[:70]))
            prev = en
for sh in sys.argv[1:]:
    run(*(int(v) for v in sh.split("x")))
