#!/usr/bin/env python3
"""bench_lm_loss.py - the LM head and the cross-entropy loss, forward +
backward, on the GPU: coda (coda.ops.lm_loss, coda_lm_loss of coda.h section
10) against the floor and the peers, all in one process, on the same bf16
x (M, d), w (V, d) and targets (M):

  floor          the three GEMMs at cuBLAS speed (torch.matmul, bf16):
                 x w^T, dz w, dz^T x (dz made beforehand): what the step
                 costs with the softmax, the loss and the logits' memory free
  eager          F.linear in bf16, F.cross_entropy of the logits .float(),
                 backward (the (M, V) logits in bf16 and f32 in memory)
  torch.compile  the same function compiled (default mode, static shapes)
  liger          Liger-Kernel's LigerFusedLinearCrossEntropyLoss ($LIGER_SRC,
                 .liger/src or the installed package: bench/liger_import.py;
                 skipped with a note if it does not import): chunked, the gradients made in the forward
  coda           coda.ops.lm_loss with the library's chunk (at most 1 GiB of
                 bf16 logits), dw in bf16 as Liger's; "coda c=N" with
                 chunk_rows N (the time / memory trade-off); "coda dw f32"
                 with accum_dtype=torch.float32 (dw summed over chunks in f32)

Every variant's step: .grad of x and w set to None, the loss, backward.
Time: CUDA events, after --warmup runs, the median of --reps runs, the
variants interleaved run by run (clocks drift under load), each call queued
behind a sleep kernel that outlasts the host's launches (step_timer.py: the
GPU's time; --host-lead: on an idle GPU, the host's lead included, as the
tables before stop 49). Memory: one more
run each, torch.cuda.max_memory_allocated over it minus what was allocated
before it (x, w, targets; the floor's dz too), so "step GiB" is what the
step itself holds at its peak (its gradients included), and "abs GiB" the
absolute peak. Check: each variant's loss, x.grad and w.grad against
eager's (relative; max printed). Data: random bf16, w scaled so that the
logits have std about 2; targets uniform.

Shapes (M x d x V): 16384 x 2048 x 128256 and 16384 x 4096 x 128256 (LLaMA-3
1B / 8B heads at 2 x 8192 tokens), and M = d = V = 2048, 4096, 8192.

    python3 bench/bench_lm_loss.py [--shapes 16384x2048x128256,...|1b,8b,sq2048,...]
        [--reps 5] [--warmup 2] [--chunks 1024,2048,8192] [--out results.json]
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import coda  # noqa: E402
import coda.ops  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_timer import StepTimer, add_arguments  # noqa: E402
from liger_import import import_liger  # noqa: E402

HOST_LEAD = False  # --host-lead

SHAPES = {"1b": (16384, 2048, 128256), "8b": (16384, 4096, 128256),
          "sq2048": (2048, 2048, 2048), "sq4096": (4096, 4096, 4096), "sq8192": (8192, 8192, 8192)}
DEFAULT = "1b,8b,sq2048,sq4096,sq8192"


def load_liger():
    def load():
        from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss
        return LigerFusedLinearCrossEntropyLoss
    return import_liger(load)


def parse_shape(s):
    if s in SHAPES:
        return s, SHAPES[s]
    try:
        m, d, v = (int(p) for p in s.lower().split("x"))
    except ValueError:
        raise SystemExit("bench_lm_loss: shape %r is neither one of %s nor MxdxV" % (s, ", ".join(SHAPES)))
    return s, (m, d, v)


def eager_loss(x, w, t):
    return F.cross_entropy(F.linear(x, w).float(), t)


def default_chunk(m, d, v):
    """coda_lm_loss_opts_init's chunk (coda.h section 10): a chunk's bf16
    logits at most max(1 GiB, twice w's bytes), a multiple of 256 rows, at
    most M."""
    vp = (v + 7) // 8 * 8
    cap = max(1 << 30, 2 * vp * d * 2)
    return min(m, max(256, cap // (vp * 2) // 256 * 256))


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def rel(a, b):
    a, b = a.float(), b.float()
    den = b.norm().item()
    return (a - b).norm().item() / den if den > 0 else (a - b).norm().item()


def bench_shape(name, shape, reps, warmup, liger_cls, chunks, compiled, dev):
    M, d, V = shape
    cuda = dev.type == "cuda"
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(M, d, generator=g).to(dev, torch.bfloat16)
    w = (torch.randn(V, d, generator=g) * (2.0 / math.sqrt(d))).to(dev, torch.bfloat16)
    t = torch.randint(0, V, (M,), generator=g).to(dev)
    dz = torch.randn(M, V, device=dev, dtype=torch.bfloat16) * 1e-3  # the floor's logits gradient
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)

    def step(loss_fn):
        def run():
            xg.grad = wg.grad = None
            loss = loss_fn(xg, wg, t)
            loss.backward()
            return loss
        return run

    def floor():
        x @ w.t()
        dz @ w
        dz.t() @ x
        return None

    dc = default_chunk(M, d, V)
    variants = [("floor", floor), ("eager", step(eager_loss))]
    if compiled is not None:
        variants.append(("torch.compile", step(compiled)))
    if liger_cls is not None:
        lg = liger_cls()
        variants.append(("liger", step(lambda a, b, c: (lambda r: r[0] if isinstance(r, tuple) else r)(lg(b, a, c)))))
    variants.append(("coda (c=%d)" % dc, step(lambda a, b, c: coda.ops.lm_loss(a, b, c)[0])))
    for c in chunks:
        if c < M and c != dc:
            variants.append(("coda c=%d" % c, step(lambda a, b, tt, c=c: coda.ops.lm_loss(a, b, tt, chunk_rows=c)[0])))
    variants.append(("coda dw f32", step(lambda a, b, c: coda.ops.lm_loss(a, b, c, accum_dtype=torch.float32)[0])))

    t0 = time.time()
    for _, fn in variants:  # warm-up (and compile: torch.compile, coda's kernels through NVRTC)
        for _ in range(warmup):
            fn()
    sync(dev)
    print("%s: M %d, d %d, V %d (warm-up and compile %.0f s)" % (name, M, d, V, time.time() - t0), flush=True)

    times = {v: [] for v, _ in variants}
    # --device cpu: the host's clock, a smoke run of this script, not a measurement
    timer = StepTimer(cuda, hide_lead=not HOST_LEAD)
    host = {v: timer.host_ms(fn) if timer.hide_lead else None for v, fn in variants}
    for _ in range(reps):
        for v, fn in variants:
            times[v].append(timer(fn, host[v], v))
    if cuda:
        print("  timing: %s" % timer.describe(), flush=True)

    res = {}
    ref = None
    for v, fn in variants:
        xg.grad = wg.grad = None
        sync(dev)
        base = torch.cuda.memory_allocated() if cuda else 0
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        loss = fn()
        sync(dev)
        peak = torch.cuda.max_memory_allocated() if cuda else float("nan")
        r = {"ms": sorted(times[v])[len(times[v]) // 2], "times_ms": times[v],
             "step_peak_gib": (peak - base) / 2 ** 30, "abs_peak_gib": peak / 2 ** 30}
        if loss is not None:
            r["loss"] = float(loss)
            if ref is None:  # eager, the first variant with a loss
                ref = (float(loss), xg.grad.detach().clone(), wg.grad.detach().clone())
            r["loss_rel_diff"] = abs(float(loss) - ref[0]) / abs(ref[0])
            r["dx_rel_diff"], r["dw_rel_diff"] = rel(xg.grad, ref[1]), rel(wg.grad, ref[2])
        res[v] = r
        del loss
    xg.grad = wg.grad = None
    fl = res["floor"]["ms"]
    print("  %-16s %9s %8s %9s %9s %11s %10s %10s" % ("variant", "ms", "/floor", "step GiB", "abs GiB",
                                                      "loss rel", "dx rel", "dw rel"))
    for v, r in res.items():
        r["ratio_to_floor"] = r["ms"] / fl
        extra = ("%11.2e %10.2e %10.2e" % (r["loss_rel_diff"], r["dx_rel_diff"], r["dw_rel_diff"])
                 if "loss" in r else "%11s %10s %10s" % ("-", "-", "-"))
        print("  %-16s %9.3f %8.3f %9.2f %9.2f %s" % (v, r["ms"], r["ratio_to_floor"], r["step_peak_gib"],
                                                     r["abs_peak_gib"], extra))
    worst = max((r["loss_rel_diff"] for r in res.values() if "loss" in r), default=0.0)
    print("  check: max relative difference of a variant's loss from eager's: %.2e" % worst, flush=True)
    return {"name": name, "M": M, "d": d, "V": V, "default_chunk_rows": dc, "variants": res,
            "max_loss_rel_diff": worst}


def markdown(results):
    lines = ["| shape (M x d x V) | variant | ms | / floor | step peak GiB | abs peak GiB | loss rel diff |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for s in results:
        for v, r in s["variants"].items():
            lines.append("| %d x %d x %d | %s | %.3f | %.3f | %.2f | %.2f | %s |"
                         % (s["M"], s["d"], s["V"], v, r["ms"], r["ratio_to_floor"], r["step_peak_gib"],
                            r["abs_peak_gib"], "%.1e" % r["loss_rel_diff"] if "loss" in r else "-"))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=DEFAULT, help="comma list of %s or MxdxV" % ", ".join(SHAPES))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--chunks", default="1024,2048,8192", help="coda chunk_rows to run beside the default")
    ap.add_argument("--no-compile", action="store_true", help="leave torch.compile out (its compile time)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: a smoke run of the script on small --shapes (no timing worth the name, no memory)")
    add_arguments(ap)
    a = ap.parse_args()
    global HOST_LEAD
    HOST_LEAD = a.host_lead
    dev = torch.device(a.device)
    liger_cls, why = load_liger() if dev.type == "cuda" else (None, "--device cpu")
    info = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__,
            "liger": "yes" if liger_cls else "no (%s)" % why, "coda_custom_ops": coda.ops.HAVE_CUSTOM_OPS,
            "reps": a.reps, "warmup": a.warmup}
    print("device: %s; torch %s; Liger-Kernel: %s; coda custom ops: %s"
          % (info["device"], info["torch"], info["liger"], info["coda_custom_ops"]), flush=True)
    chunks = [int(c) for c in a.chunks.split(",") if c]
    t0 = time.time()
    results = []
    for s in a.shapes.split(","):
        name, shape = parse_shape(s)
        compiled = None if a.no_compile or not hasattr(torch, "compile") else torch.compile(eager_loss, dynamic=False)
        results.append(bench_shape(name, shape, a.reps, a.warmup, liger_cls, chunks, compiled, dev))
        if dev.type == "cuda":  # the shape's tensors are gone with bench_shape's frame
            torch.cuda.empty_cache()
    print("\n" + markdown(results))
    print("\ntotal %.0f s" % (time.time() - t0))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"info": info, "shapes": results}, f, indent=1)
        print("wrote %s" % a.out)


if __name__ == "__main__":
    main()
