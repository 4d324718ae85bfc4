#!/usr/bin/env python3
"""bench_attention.py - causal grouped-query attention, forward and backward,
on the GPU: coda (coda_attention_*, coda.h section 11) against torch's SDPA
with the flash and the cuDNN backends, at LLaMA-3 shapes, batch 2 x seq
8192:

  1b    32 query heads, 8 kv heads, head_dim 64
  8b    32 / 8, head_dim 128
  70b   64 / 8, head_dim 128

Variants, all in one process on the same random bf16 data:

  coda           the ctypes calls (coda.attention_forward / _backward) on a
                 packed qkv (M, nq + 2 nkv), outputs and workspace allocated
                 once beforehand: the kernels' time plus one ctypes call
  coda op        the coda::attention operator (coda.attention_ops) through
                 autograd: forward allocates o and lse; backward is
                 torch.autograd.grad of o (coda_attention_backward, dqkv
                 f32 cast to bf16, the workspace allocated per call)
  sdpa flash     F.scaled_dot_product_attention(is_causal=True) inside
                 torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)
  sdpa cudnn     the same with SDPBackend.CUDNN_ATTENTION

SDPA gets q, k, v as (B, H, S, D) contiguous bf16 made from the same qkv;
GQA through enable_gqa=True where torch has it and the backend takes it,
else k and v repeat_interleave'd to H heads beforehand (outside the timed
region; the table says "(k, v repeated)"). A backend torch does not have
or cannot run here prints n/a with the reason, as does any variant that
fails (out of memory included).

Timing: CUDA events around each call, each queued behind a sleep kernel
that outlasts the host's launches (bench/step_timer.py: the GPU's time, not
the host's lead before the first kernel; --host-lead: the plain method of
the tables before stop 49), --warmup calls first (coda's
kernels are compiled by NVRTC on the first), then the median of --reps
(>= 10) calls, the variants interleaved call by call (clocks drift under
load). The backward is timed alone: the forward's outputs (and, for
autograd, its graph, retained) are made once beforehand and the same
upstream gradient do is given each time. TFLOP/s count the causal half:
forward 4 B S^2 H D / 2, backward 2.5 x the forward.

Check: coda's o against each SDPA backend's (max abs and relative
Frobenius difference), and dq, dk, dv (GQA: summed over each group where k
and v were repeated) against theirs; with --device cpu, against torch's
math. Printed, and in the JSON; not a pass/fail (tests/test_attention_torch.py
is the accuracy test).

    python3 bench/bench_attention.py                 # 1b, 8b, 70b at 2 x 8192
    python3 bench/bench_attention.py --sweep         # also seq 1024 .. 8192 at the 8b shape
    python3 bench/bench_attention.py --quick         # seq 1024 (sweep 256 .. 1024): a minute
    python3 bench/bench_attention.py --shapes 8b --reps 30 --json out.json
    python3 bench/bench_attention.py --device cpu    # a smoke run of the script: tiny shapes, coda's CPU
                                                     # oracle, torch's CPU SDPA kernels where they exist
"""
import argparse
import json
import math
import os
import sys
import time
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_timer import StepTimer, add_arguments  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import coda  # noqa: E402
import coda.attention_ops as A  # noqa: E402
import coda.ops  # noqa: E402

HEADS = {"1b": (32, 8, 64), "8b": (32, 8, 128), "70b": (64, 8, 128)}
BATCH, SEQ = 2, 8192
SWEEP = (1024, 2048, 4096, 8192)
QUICK_SEQ, QUICK_SWEEP = 1024, (256, 512, 1024)
CPU_SHAPES = [("cpu-a", 1, 96, 4, 2, 64), ("cpu-b", 2, 70, 4, 1, 128)]


def flops_fwd(B, S, H, D):
    return 4.0 * B * S * S * H * D / 2


def sdpa_backends():
    """{name: (context manager factory or None, why not)}."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:
        why = "torch %s has no torch.nn.attention.sdpa_kernel (%s)" % (torch.__version__, type(e).__name__)
        return {"sdpa flash": (None, why), "sdpa cudnn": (None, why)}
    out = {}
    for name, attr in (("sdpa flash", "FLASH_ATTENTION"), ("sdpa cudnn", "CUDNN_ATTENTION")):
        b = getattr(SDPBackend, attr, None)
        out[name] = ((lambda b=b: sdpa_kernel(b)), None) if b is not None else \
            (None, "torch %s has no SDPBackend.%s" % (torch.__version__, attr))
    return out


def rel(a, b):
    a, b = a.double(), b.double()
    den = b.norm().item()
    return (a - b).norm().item() / den if den > 0 else (a - b).norm().item()


HOST_LEAD = False  # --host-lead


class Timer:
    """One call timed (step_timer.StepTimer: on CUDA, behind a sleep kernel
    that hides the host's lead; --host-lead: on an idle GPU), the host's
    launch time measured once a function."""

    def __init__(self, cuda, hide_lead=True):
        self.t = StepTimer(cuda, hide_lead)
        self.host = {}

    def __call__(self, fn, label="?"):
        if self.t.hide_lead and fn not in self.host:
            self.host[fn] = self.t.host_ms(fn)
        return self.t(fn, self.host.get(fn), label)


def short(e):
    s = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0] if str(e).strip() else "")
    return s[:160]


def make_coda(ctx, qkv, do, shape):
    """coda through the binding: (forward fn, backward fn, outputs fn)."""
    B, S, H, KV, D = shape
    M, nq, w = B * S, H * D, qkv.shape[1]
    o = torch.empty(M, nq, dtype=torch.bfloat16, device=qkv.device)
    lse = torch.empty(M, H, dtype=torch.float32, device=qkv.device)
    dqkv = torch.empty(M, w, dtype=torch.float32, device=qkv.device)
    n = coda.attention_workspace_size(ctx, qkv.device, *shape)
    ws = torch.empty(max(n, 1), dtype=torch.uint8, device=qkv.device) if n else None
    fwd = lambda: coda.attention_forward(ctx, qkv, o, lse, *shape)
    fwd()
    bwd = lambda: coda.attention_backward(ctx, qkv, o, lse, do, dqkv, *shape, workspace=ws)
    bwd()

    def outputs():
        fwd()
        bwd()
        return o, dqkv
    return fwd, bwd, outputs


def make_coda_op(qkv, do, shape):
    """coda through coda::attention and autograd."""
    x = qkv.detach().clone().requires_grad_(True)
    fwd = lambda: A.attention(x, *shape)
    o, lse = fwd()
    bwd = lambda: torch.autograd.grad(o, x, do, retain_graph=True)
    bwd()

    def outputs():
        oo, _ = A.attention(x, *shape)
        return oo.detach(), torch.autograd.grad(oo, x, do)[0]
    return fwd, bwd, outputs


def sdpa_inputs(qkv, do, shape, repeat):
    B, S, H, KV, D = shape
    nq, nkv = H * D, KV * D
    q, k, v = qkv.split([nq, nkv, nkv], dim=1)
    q = q.reshape(B, S, H, D).transpose(1, 2).contiguous()
    k = k.reshape(B, S, KV, D).transpose(1, 2)
    v = v.reshape(B, S, KV, D).transpose(1, 2)
    if repeat and KV != H:
        k, v = (t.repeat_interleave(H // KV, dim=1) for t in (k, v))
    k, v = k.contiguous(), v.contiguous()
    dob = do.reshape(B, S, H, D).transpose(1, 2).contiguous()
    return [t.detach().clone().requires_grad_(True) for t in (q, k, v)], dob


def make_sdpa(ctxf, qkv, do, shape):
    """SDPA under the backend's context; GQA natively if it takes it, else
    with k, v repeated. -> (fwd, bwd, outputs, note)."""
    B, S, H, KV, D = shape
    errors = []
    modes = [False] if KV == H else [False, True]
    for repeat in modes:
        gqa = {} if (repeat or KV == H) else {"enable_gqa": True}
        try:
            (q, k, v), dob = sdpa_inputs(qkv, do, shape, repeat)

            def call(q=q, k=k, v=v, gqa=gqa):
                with ctxf():
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
            o = call()
            with ctxf():
                torch.autograd.grad(o, (q, k, v), dob, retain_graph=True)

            def bwd(o=o, q=q, k=k, v=v, dob=dob):
                with ctxf():
                    return torch.autograd.grad(o, (q, k, v), dob, retain_graph=True)

            def outputs(call=call, q=q, k=k, v=v, dob=dob, repeat=repeat):
                oo = call()
                with ctxf():
                    dq, dk, dv = torch.autograd.grad(oo, (q, k, v), dob)
                if repeat and KV != H:  # the gradient of the repeat: each group's sum
                    dk, dv = (t.reshape(B, KV, H // KV, S, D).sum(2) for t in (dk, dv))
                tr = lambda t, n: t.transpose(1, 2).reshape(B * S, n * D)
                return tr(oo.detach(), H), torch.cat((tr(dq, H), tr(dk, KV), tr(dv, KV)), 1)
            note = "(k, v repeated)" if repeat and KV != H else ("enable_gqa" if gqa else "")
            return call, bwd, outputs, note
        except Exception as e:  # no enable_gqa in this torch (TypeError), the backend refused, out of memory
            errors.append(("native GQA: " if gqa else "k, v repeated: " if repeat else "") + short(e)[:110])
            if "out of memory" in str(e):
                break
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    raise RuntimeError("; ".join(errors))


def math_reference(qkv, do, shape):
    """torch's own attention (math, float32) for --device cpu: (o, dqkv)."""
    B, S, H, KV, D = shape
    x = qkv.detach().float().clone().requires_grad_(True)
    nq, nkv = H * D, KV * D
    q, k, v = x.split([nq, nkv, nkv], dim=1)
    q = q.reshape(B, S, H, D).transpose(1, 2)
    k = k.reshape(B, S, KV, D).transpose(1, 2).repeat_interleave(H // KV, dim=1)
    v = v.reshape(B, S, KV, D).transpose(1, 2).repeat_interleave(H // KV, dim=1)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    s = s.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    o = (s.softmax(-1) @ v).transpose(1, 2).reshape(B * S, nq)
    o.backward(do.float())
    return o.detach(), x.grad


def bench_shape(name, shape, reps, warmup, dev, backends):
    B, S, H, KV, D = shape
    cuda = dev.type == "cuda"
    ctx = coda.ops.context()
    g = torch.Generator().manual_seed(0)
    M, w = B * S, (H + 2 * KV) * D
    qkv = torch.randn(M, w, generator=g).to(dev, torch.bfloat16)
    do = torch.randn(M, H * D, generator=g).to(dev, torch.bfloat16)
    ff = flops_fwd(B, S, H, D)
    print("\n%s: batch %d, seq %d, heads %d / %d kv, head_dim %d (forward %.2f TFLOP, causal half)"
          % (name, B, S, H, KV, D, ff / 1e12), flush=True)

    variants, notes, na = [], {}, {}
    t0 = time.time()
    for vname, make in (("coda", lambda: make_coda(ctx, qkv, do, shape) + ("",)),
                        ("coda op", lambda: make_coda_op(qkv, do, shape) + ("",))):
        try:
            f, b, outs, note = make()
            variants.append((vname, f, b, outs))
            notes[vname] = note
        except Exception as e:
            na[vname] = short(e)
    for vname, (ctxf, why) in backends.items():
        if ctxf is None:
            na[vname] = why
            continue
        try:
            with warnings.catch_warnings():  # torch's notes on why a backend does not take the call
                warnings.simplefilter("ignore")
                f, b, outs, note = make_sdpa(ctxf, qkv, do, shape)
            variants.append((vname, f, b, outs))
            notes[vname] = note
        except Exception as e:
            na[vname] = str(e)[:300]
    timer = Timer(cuda, not HOST_LEAD)
    failed = {}
    for v, f, b, _ in variants:  # warm-up
        try:
            for _ in range(warmup):
                f()
                b()
            if cuda:
                torch.cuda.synchronize()
        except Exception as e:
            failed[v] = "warm-up: " + short(e)
    print("  (set-up and warm-up %.0f s)" % (time.time() - t0), flush=True)

    times = {v: {"fwd": [], "bwd": []} for v, _, _, _ in variants}
    for _ in range(reps):
        for v, f, b, _ in variants:
            if v in failed:
                continue
            try:
                times[v]["fwd"].append(timer(f, v + " fwd"))
                times[v]["bwd"].append(timer(b, v + " bwd"))
            except Exception as e:
                failed[v] = short(e)
    for v, why in failed.items():
        na[v] = why if why.startswith("warm-up") else "failed while timed: " + why
    print("  timing: " + timer.t.describe(), flush=True)

    # the check: coda's o and dqkv against each peer's
    ref_outs = {}
    for v, _, _, outs in variants:
        if v in failed:
            continue
        try:
            ref_outs[v] = outs()
        except Exception as e:
            na[v] = "outputs: " + short(e)
    if not cuda:
        ref_outs["torch math (f32)"] = math_reference(qkv, do, shape)
    checks = {}
    if "coda" in ref_outs:
        co, cd = ref_outs["coda"]
        for v, (o2, d2) in ref_outs.items():
            if v == "coda":
                continue
            checks[v] = {"o_max_abs": (co.float() - o2.float()).abs().max().item(), "o_rel": rel(co, o2),
                         "dqkv_max_abs": (cd.float() - d2.float()).abs().max().item(), "dqkv_rel": rel(cd, d2)}
    del ref_outs

    res = {}
    print("  %-12s %10s %10s %10s %10s  %s" % ("variant", "fwd ms", "fwd TF/s", "bwd ms", "bwd TF/s", "note"))
    for v in ("coda", "coda op") + tuple(backends):
        if v in times and v not in na:
            fm = sorted(times[v]["fwd"])[len(times[v]["fwd"]) // 2]
            bm = sorted(times[v]["bwd"])[len(times[v]["bwd"]) // 2]
            r = {"fwd_ms": fm, "bwd_ms": bm, "fwd_tflops": ff / fm / 1e9, "bwd_tflops": 2.5 * ff / bm / 1e9,
                 "fwd_times_ms": times[v]["fwd"], "bwd_times_ms": times[v]["bwd"], "note": notes.get(v, "")}
            res[v] = r
            print("  %-12s %10.3f %10.1f %10.3f %10.1f  %s" % (v, fm, r["fwd_tflops"], bm, r["bwd_tflops"], r["note"]))
        else:
            res[v] = {"na": na.get(v, "not run")}
            print("  %-12s %10s %10s %10s %10s  %s" % (v, "n/a", "n/a", "n/a", "n/a", res[v]["na"]))
    for v, c in checks.items():
        print("  check: coda vs %-16s o max abs %.3e (rel %.2e), dqkv max abs %.3e (rel %.2e)"
              % (v, c["o_max_abs"], c["o_rel"], c["dqkv_max_abs"], c["dqkv_rel"]))
    if not checks:
        print("  check: n/a (no peer ran, or coda did not)")
    sys.stdout.flush()
    return {"name": name, "batch": B, "seq": S, "n_heads": H, "n_kv_heads": KV, "head_dim": D,
            "fwd_flop": ff, "bwd_flop": 2.5 * ff, "variants": res, "checks": checks}


def markdown(results):
    lines = ["| shape | B x S | heads (kv) x hd | variant | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s |",
             "|---|---|---|---|---:|---:|---:|---:|"]
    for s in results:
        for v, r in s["variants"].items():
            head = "| %s | %d x %d | %d (%d) x %d | %s " % (s["name"], s["batch"], s["seq"], s["n_heads"],
                                                          s["n_kv_heads"], s["head_dim"], v)
            if "na" in r:
                lines.append(head + "| n/a | n/a | n/a | n/a |")
            else:
                lines.append(head + "| %.3f | %.1f | %.3f | %.1f |" % (r["fwd_ms"], r["fwd_tflops"], r["bwd_ms"],
                                                                      r["bwd_tflops"]))
    return "\n".join(lines)


def shape_list(a, dev):
    if dev.type == "cpu":
        return [(n, (b, s, h, kv, d)) for n, b, s, h, kv, d in CPU_SHAPES]
    seq = QUICK_SEQ if a.quick else SEQ
    out = []
    for s in [x for x in a.shapes.split(",") if x]:
        if s not in HEADS:
            raise SystemExit("bench_attention: shape %r is not one of %s" % (s, ", ".join(HEADS)))
        h, kv, d = HEADS[s]
        out.append(("%s s%d" % (s, seq), (BATCH, seq, h, kv, d)))
    if a.sweep:
        h, kv, d = HEADS["8b"]
        for s in (QUICK_SWEEP if a.quick else SWEEP):
            out.append(("8b s%d" % s, (BATCH, s, h, kv, d)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="1b,8b,70b", help="comma list of %s (empty: none)" % ", ".join(HEADS))
    ap.add_argument("--sweep", action="store_true", help="also seq 1024, 2048, 4096, 8192 at the 8b shape")
    ap.add_argument("--quick", action="store_true", help="seq %d (sweep %s)" % (QUICK_SEQ, QUICK_SWEEP))
    ap.add_argument("--reps", type=int, default=20, help="timed calls per variant (>= 10; the median)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", default=None, metavar="OUT", help="write the results as JSON here")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: a smoke run of the script on tiny shapes (coda's CPU oracle, torch's CPU SDPA)")
    add_arguments(ap)
    a = ap.parse_args()
    global HOST_LEAD
    HOST_LEAD = a.host_lead
    if a.reps < 10:
        raise SystemExit("bench_attention: --reps %d: at least 10 (the median of them is reported)" % a.reps)
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_attention: no CUDA device for torch (--device cpu for a smoke run)")
    backends = sdpa_backends()
    info = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version() if dev.type == "cuda" else None,
            "coda_custom_ops": A.HAVE_CUSTOM_OPS, "reps": a.reps, "warmup": a.warmup,
            "flops": "causal half: forward 4 B S^2 H D / 2, backward 2.5 x forward"}
    print("device: %s; torch %s; cuDNN %s; coda custom ops: %s"
          % (info["device"], info["torch"], info["cudnn"], info["coda_custom_ops"]), flush=True)
    t0 = time.time()
    results = []
    for name, shape in shape_list(a, dev):
        try:
            results.append(bench_shape(name, shape, a.reps, a.warmup, dev, backends))
        except Exception as e:  # e.g. out of memory making the inputs
            print("  %s: n/a (%s)" % (name, short(e)), flush=True)
            results.append({"name": name, "batch": shape[0], "seq": shape[1], "n_heads": shape[2],
                            "n_kv_heads": shape[3], "head_dim": shape[4], "variants": {}, "error": short(e)})
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    print("\n" + markdown(results))
    print("\ntotal %.0f s" % (time.time() - t0))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"info": info, "shapes": results}, f, indent=1)
        print("wrote %s" % a.json)


if __name__ == "__main__":
    main()
