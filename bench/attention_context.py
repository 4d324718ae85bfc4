#!/usr/bin/env python3
"""attention_context.py - an attention backward's kernels timed in the
settings a benchmark and a training step give it, coda beside cuDNN.

Why: at the 1B block (bench/HISTORY.md, stop 55) coda's backward kernel
took 3.25-3.35 ms inside the block's step but 3.07 ms alone, while
cuDNN's took 3.08 in both. This script times the same calls (the
bench_attention.py variants, the same random data) behind four preludes:

  idle    a 3 ms sleep kernel (the GPU nearly idle, as behind the sleep
          bench_attention's timer puts before each call)
  train   the call repeated back to back (its own previous call before it)
  gemm    four bf16 GEMMs of the 1B block's MLP shapes (M x 2048 x 8192
          and back, about 3 ms on an H100; the same at every --shapes), as
          the block's GEMMs run before its attention
  gemm+   the same GEMMs, then a 1 ms sleep (power and clocks recover,
          the L2 keeps what the GEMMs left)

Each call is fenced by two tiny f64 multiplies (markers); the kernels
between them are the call's. Printed per variant and prelude: the main
kernel's median time, the median of all the call's kernels summed, and
of the span from its first kernel's start to its last one's end (host
gaps inside the call show as span > sum).

    python3 bench/attention_context.py [--shapes 1b] [--reps 5] [--sequence]

--sequence also lists one call's kernels (name, start offset, duration)
per variant: where a PyTorch operator's time goes beside the C call.
"""
import argparse
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_attention as ba  # noqa: E402  (the variants, the shapes, the data)
from step_timer import cuda_events, spread  # noqa: E402

MARK = "MulFunctor"  # the marker's kernel: an f64 multiply


def _calls(kernels):
    """The kernels between marker pairs: [[(name, start, end), ...], ...]."""
    out, cur = [], None
    for k in kernels:
        if MARK in k[0] and "double" in k[0]:
            if cur is None:
                cur = []
            else:
                out.append(cur)
                cur = None
        elif cur is not None:
            cur.append(k)
    return out


def run(fn, prelude, reps, mark, main_key, lead_cycles):
    """Time fn behind prelude reps times, all queued behind a sleep of
    lead_cycles. -> (main ms, sum ms, span ms, one call's kernels)."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.cuda._sleep(lead_cycles)  # a host lead for the whole run
        for _ in range(reps):
            prelude()
            mark.mul_(1.0)
            fn()
            mark.mul_(1.0)
        torch.cuda.synchronize()
    calls = _calls([(e.name, e.time_range.start, e.time_range.end) for e in cuda_events(prof)])
    mains, sums, spans = [], [], []
    for c in calls:
        if not c:
            continue
        mains.append(sum(e - s for n, s, e in c if main_key(n)) / 1e3)
        sums.append(sum(e - s for n, s, e in c) / 1e3)
        spans.append((max(e for _, _, e in c) - c[0][1]) / 1e3)
    if not mains:
        return float("nan"), float("nan"), float("nan"), []
    return spread(mains)[0], spread(sums)[0], spread(spans)[0], calls[len(calls) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1b")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sequence", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("attention_context.py: needs a CUDA GPU (torch.cuda.is_available() is False)")
    dev = torch.device("cuda")
    backends = ba.sdpa_backends()
    mark = torch.ones(1, dtype=torch.float64, device=dev)
    cycles_per_ms = ba.StepTimer(True, True).cycles_per_ms
    for name in a.shapes.split(","):
        H, KV, D = ba.HEADS[name]
        shape = (ba.BATCH, ba.SEQ, H, KV, D)
        B, S = ba.BATCH, ba.SEQ
        M, w = B * S, (H + 2 * KV) * D
        g = torch.Generator().manual_seed(0)
        qkv = torch.randn(M, w, generator=g).to(dev, torch.bfloat16)
        do = torch.randn(M, H * D, generator=g).to(dev, torch.bfloat16)
        ctx = ba.coda.ops.context()
        variants = []
        _, bwd, _ = ba.make_coda(ctx, qkv, do, shape)
        variants.append(("coda", bwd, lambda n: n.startswith("coda_attn_bwd") and "prep" not in n))
        _, bwd, _ = ba.make_coda_op(qkv, do, shape)
        variants.append(("coda op", bwd, lambda n: n.startswith("coda_attn_bwd") and "prep" not in n))
        ctxf, why = backends["sdpa cudnn"]
        if ctxf is None:
            print("sdpa cudnn: n/a (%s)" % why)
        else:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    _, bwd, _, _ = ba.make_sdpa(ctxf, qkv, do, shape)
                variants.append(("sdpa cudnn", bwd, lambda n: "bprop" in n))
            except Exception as e:  # the backend refused the call, out of memory
                print("sdpa cudnn: n/a (%s)" % ba.short(e))
        # the block's GEMM neighbours: (M, 2048) x (2048, 8192) and (M, 8192) x (8192, 2048)
        x1 = torch.randn(M, 2048, device=dev, dtype=torch.bfloat16)
        w1 = torch.randn(2048, 8192, device=dev, dtype=torch.bfloat16)
        x2 = torch.randn(M, 8192, device=dev, dtype=torch.bfloat16)
        w2 = torch.randn(8192, 2048, device=dev, dtype=torch.bfloat16)

        def gemms():
            for _ in range(2):
                torch.matmul(x1, w1)
                torch.matmul(x2, w2)

        def gemms_gap():
            gemms()
            torch.cuda._sleep(int(1.0 * cycles_per_ms))

        preludes = (("idle", lambda: torch.cuda._sleep(int(3.0 * cycles_per_ms))), ("train", lambda: None),
                    ("gemm", gemms), ("gemm+", gemms_gap))
        for _, fn, _ in variants:  # warm-up (NVRTC, cuDNN plans)
            for _ in range(2):
                fn()
        torch.cuda.synchronize()
        print("\n%s: backward, batch %d x seq %d, heads %d / %d, head_dim %d; median of %d calls, ms"
              % (name, B, S, H, KV, D, a.reps))
        print("  %-11s %-7s %9s %9s %9s" % ("variant", "prelude", "main", "kernels", "span"))
        seqs = {}
        for pname, pre in preludes:
            for vname, fn, key in variants:
                m, s, sp, one = run(fn, pre, a.reps, mark, key, int(25.0 * cycles_per_ms))
                print("  %-11s %-7s %9.3f %9.3f %9.3f" % (vname, pname, m, s, sp), flush=True)
                if pname == "idle":
                    seqs[vname] = one
        if a.sequence:
            for vname, one in seqs.items():
                print("\n  %s, one call behind the idle prelude (start offset, duration, kernel):" % vname)
                t0 = one[0][1] if one else 0
                for n, s, e in one:
                    print("    %8.3f %8.3f  %s" % ((s - t0) / 1e3, (e - s) / 1e3, n[:100]))


if __name__ == "__main__":
    main()
