"""bench_vs_torch.py - coda's fused GEMMs against the tools people use today.

    python3 bench/bench_vs_torch.py [sizes...]     default 2048 4096 8192
    python3 bench/bench_vs_torch.py --check [n...] no timing: every coda variant's
                                                   outputs and the eager peer's
                                                   against a float reference (CPU
                                                   if there is no GPU; n default
                                                   200, 256, 272)

Kernel-level, forward, M = N = K, bf16, in one process (docs/benchmarks.md):

  resid_rmsnorm   y = x W^T + res, then RMSNorm of y          (O-proj / down)
  rmsnorm_swiglu  RMSNorm(x) W_gu^T, then silu(gate) * up      (gate/up; "coda train"
                  also stores the pre-activation for the backward)
  rmsnorm_rope    RMSNorm(x) W_qkv^T, then RoPE on q and k     (QKV)

Peers: the cuBLAS GEMM alone (torch.matmul; the floor), PyTorch eager,
torch.compile, Liger-Kernel (Triton; from $LIGER_SRC, .liger/src or the
installed package: bench/liger_import.py; else skipped) for the memory-bound part after a cuBLAS GEMM. coda: the fused GEMM
(and the tiny finishing step that turns partials into rstd where the program
needs one); "coda rowpart": the same programs with the rstd computed in the
consuming GEMM's epilogue from the producer's partials (`in ss rowpart`), so
no finishing step runs at all (resid_rmsnorm is then its GEMM alone: its
partials are finished by the next GEMM, whose rows count that work). Every variant is captured in a CUDA graph of 10 calls over 2-4
rotating input sets and replayed: 5 warm-up rounds, median of 50 timed
rounds, per call. A kernel's variants and the GEMM alone are timed round by
round (each round replays every one of them once), and its ratios are to
the GEMM alone of its own rounds. Before its timing, every kernel's coda
variants and its eager peer are checked against the formula in float on
the first input set (the table's last part; the run fails past CHECK_TOL).
The coda variants' row scale comes from sum-of-squares partials made up
for the benchmark (what the previous epilogue would have left), so their
reference takes that rstd where the peers normalise x themselves.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import coda  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from liger_import import import_liger  # noqa: E402, F401 (bench_vs_torch_train imports it from here)

EPS = 1e-5
CALLS = 10
# Each check must come out below this (bf16 outputs: about 2^-8 of rounding,
# and the GEMM's bf16 inputs summed in another order).
CHECK_TOL = 1e-2
# The peers' own rows ("eager ...", "addmm ..."): a peer rounds every
# intermediate to bf16, and PyTorch 1.13 on the CPU (Debian's, what CI runs)
# also sums its reductions in bf16: eager rmsnorm_bwd dx 1.4e-2, dg 1.7e-2,
# swiglu_bwd dz 2.0e-2 at n = 272 there. These rows only catch a peer with a
# wrong formula (which is off by O(1)), so they get their own bound.
PEER_TOL = 5e-2


def compiled(fn):
    """torch.compile(fn), made lazily (no compile until its first call); the
    checks also run on old PyTorch builds without it (None)."""
    return torch.compile(fn) if hasattr(torch, "compile") else None


def rel(a, b):
    """The relative difference of a from the reference b (float64): the
    norm's, |a - b| / |b|, or a quarter of the worst element's, max |a - b|
    / max |b|, whichever is larger (a wrong block of a few elements hides in
    the norm; single elements of a bf16 chain stray several times further
    than the norm: eager's SwiGLU 9e-3 at n = 272). NaN in a gives NaN,
    which no check passes."""
    a, b = a.double(), b.double()
    d = a - b
    norm = (d.norm() / b.norm().clamp_min(1e-30)).item()
    worst = (d.abs().max() / b.abs().max().clamp_min(1e-30)).item()
    return max(norm, worst / 4) if norm == norm and worst == worst else float("nan")


def capture(fn):
    """A CUDA graph of CALLS calls of fn() (after 3 calls outside it: compiles, loads)."""
    torch.cuda.synchronize()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            for _ in range(CALLS):
                fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    return g


def interleaved_ms(fns, graphs=None, rounds=50):
    """Median per-call times of several variants timed round by round: each
    round replays every variant once in turn, so that the clocks, which fall
    under sustained load, weigh on all of them alike (timed one after the
    other, the 4096 and 8192 ratios moved by 10% between runs, session 9).
    graphs[i] false: variant i cannot be captured (it syncs with the host)
    and is called CALLS times between the events instead."""
    graphs = graphs or [True] * len(fns)
    runs = []
    for fn, gr in zip(fns, graphs):
        if gr:
            g = capture(fn)
            runs.append(g.replay)
        else:
            for _ in range(3):
                fn()
            runs.append(lambda fn=fn: [fn() for _ in range(CALLS)])
    for _ in range(5):
        for r in runs:
            r()
    torch.cuda.synchronize()
    times = [[] for _ in runs]
    for _ in range(rounds):
        for i, r in enumerate(runs):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            r()
            e1.record()
            e1.synchronize()
            times[i].append(e0.elapsed_time(e1) / CALLS)
    for t in times:
        t.sort()
    return [t[len(t) // 2] for t in times]


def time_group(results, n, kernel, floor_fn, sets, variants):
    """Times the GEMM alone (floor_fn) and each (name, fn(set)) of variants
    interleaved; appends (n, kernel, name, ms, ms / floor) to results."""
    variants = [v for v in variants if v[1] is not None]  # torch.compile where this PyTorch has it
    fns = [floor_fn]
    for _, fn in variants:
        r = Rot(sets)
        fns.append(lambda fn=fn, r=r: fn(r.next()))
    ts = interleaved_ms(fns)
    results.append((n, kernel, "cuBLAS GEMM (floor)", ts[0], 1.0))
    for (name, _), t in zip(variants, ts[1:]):
        results.append((n, kernel, name, t, t / ts[0]))


class Rot:
    """Cycles through input sets so that repeated calls do not hit L2."""

    def __init__(self, sets):
        self.sets, self.i = sets, 0

    def next(self):
        s = self.sets[self.i % len(self.sets)]
        self.i += 1
        return s


def rms(x, g):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * g


def bench_start(name, ctx, load):
    """Script NAME's start: a CUDA device, then the device line (GPU, torch,
    and Liger-Kernel as load() gives it: (kernels, why not)).
    (True, Liger's kernels or None), or (False, None) with no device."""
    if not ctx.has_cuda:
        print("%s: no usable CUDA device" % name)
        return False, None
    liger, why = load()
    print("device: %s; torch %s; Liger-Kernel: %s" % (torch.cuda.get_device_name(), torch.__version__,
                                                      "yes" if liger else "no (%s)" % why))
    return True, liger


def load_liger():
    def load():
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.rope import LigerRopeFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
        return (LigerFusedAddRMSNormFunction, LigerRMSNormFunction, LigerRopeFunction, LigerSiLUMulFunction)
    return import_liger(load)


def rowpart_program(name):
    """bench/variants/NAME_rowpart.coda: the built-in program NAME with its
    rstd made from the previous epilogue's sum-of-squares partials."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "variants", name + "_rowpart.coda")
    with open(path) as f:
        return coda.Program(f.read())


def rms_f(x, g):
    """RMSNorm in float: x (M, N), g (N)."""
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * g.float()


def rope_pairs(z, pos, freq):
    """coda's RoPE on adjacent pairs: (z_2i, z_2i+1) turned by pos * freq_i."""
    th = pos[:, None] * freq[None, :]
    c, s = th.cos(), th.sin()
    ze, zo = z[:, 0::2], z[:, 1::2]
    return torch.stack([ze * c - zo * s, zo * c + ze * s], -1).reshape(z.shape)


def bench_size(ctx, n, liger, results, checks, dev="cuda", timing=True):
    """Checks (appended to checks as (n, kernel, what, rel)) and, with
    timing, the timings (appended to results) of the three kernels at n."""
    bf = torch.bfloat16
    nsets = 4 if n <= 2048 else 2
    mk = lambda *s: torch.randn(*s, device=dev, dtype=bf)  # noqa: E731
    sets = [dict(x=mk(n, n), res=mk(n, n), w=mk(n, n) / n ** 0.5) for _ in range(nsets)]
    g = torch.rand(n, device=dev, dtype=bf) + 0.5
    tl = coda.choose_tiling(ctx, dev, "nt", n, n, n)
    n_tiles = (n + tl[1] - 1) // tl[1]
    out = mk(n, n)

    rot = Rot(sets)

    def gemm_alone(s):
        return torch.matmul(s["x"], s["w"].t(), out=out)

    floor_fn = lambda: gemm_alone(rot.next())  # noqa: E731  (timed in every group)

    def group(kernel, variants, check):
        checks.extend((n, kernel, what, e) for what, e in check(sets[0]))
        if timing:
            time_group(results, n, kernel, floor_fn, sets, variants)

    def acc_f(s):  # the GEMM in float: x W^T
        return s["x"].float() @ s["w"].float().t()

    # ---- resid_rmsnorm ----
    def eager_rr(s):
        h = s["x"] @ s["w"].t() + s["res"]
        return rms(h, g), h

    comp_rr = compiled(eager_rr)
    p_rr = coda.Program.builtin("resid_norm")
    tl_rr = coda.choose_tiling(ctx, dev, "nt", n, n, n, program=p_rr)
    h_o, hg_o = mk(n, n), mk(n, n)
    ss = torch.empty(n, (n + tl_rr[1] - 1) // tl_rr[1], device=dev, dtype=torch.float32)
    rstd = torch.empty(n, device=dev, dtype=torch.float32)

    def coda_rr(s):
        coda.gemm_epilogue(ctx, "nt", s["x"], s["w"], p_rr, {"res": s["res"], "g": g, "h": h_o, "hg": hg_o,
                                                            "ss": ss}, tl_rr)
        coda.finish_rstd(ctx, ss, n, EPS, rstd)

    def coda_rr_part(s):  # rstd left to the consumer (rmsnorm_* "coda rowpart")
        coda.gemm_epilogue(ctx, "nt", s["x"], s["w"], p_rr, {"res": s["res"], "g": g, "h": h_o, "hg": hg_o,
                                                            "ss": ss}, tl_rr)

    variants = [("eager", eager_rr), ("torch.compile", comp_rr), ("coda", coda_rr), ("coda rowpart", coda_rr_part)]
    if liger:
        def liger_rr(s):
            y = s["x"] @ s["w"].t()
            return liger[0].apply(y, s["res"], g, EPS, 0.0, "llama", False)
        variants.insert(2, ("liger", liger_rr))

    def check_rr(s):
        hf = acc_f(s) + s["res"].float()
        y = rms_f(hf, g)
        for t in (h_o, hg_o, rstd):
            t.fill_(float("nan"))
        coda_rr(s)
        ey, eh = eager_rr(s)
        return [("h", rel(h_o, hf)), ("hg", rel(hg_o, hf * g.float())),
                ("y = hg rstd", rel(hg_o.float() * rstd[:, None], y)),
                ("eager h", rel(eh, hf)), ("eager y", rel(ey, y))]

    group("resid_rmsnorm", variants, check_rr)

    # ---- rmsnorm_swiglu: gate/up interleaved for coda, split halves for peers ----
    def eager_sw(s):
        z = rms(s["x"], g) @ s["w"].t()
        a, b = z.chunk(2, dim=-1)
        return torch.nn.functional.silu(a) * b

    comp_sw = compiled(eager_sw)
    p_sw = coda.Program.builtin("gateup_swiglu")
    c_o = mk(n, n // 2)
    ss_in = torch.rand(n, n_tiles, device=dev, dtype=torch.float32) * n / n_tiles
    r_in = torch.empty(n, device=dev, dtype=torch.float32)

    def coda_sw(s):
        coda.finish_rstd(ctx, ss_in, n, EPS, r_in)  # the rstd the previous epilogue's partials give
        coda.gemm_epilogue(ctx, "nt", s["x"], s["w"], p_sw, {"r": r_in, "c": c_o},
                           coda.choose_tiling(ctx, dev, "nt", n, n, n, program=p_sw))

    p_sw_part = rowpart_program("gateup_swiglu")
    tl_sw = coda.choose_tiling(ctx, dev, "nt", n, n, n, program=p_sw_part)

    def coda_sw_part(s):
        coda.gemm_epilogue(ctx, "nt", s["x"], s["w"], p_sw_part,
                           {"ssp": ss_in, "invd": 1.0 / n, "eps": EPS, "c": c_o}, tl_sw)

    p_sw_tr = coda.Program.builtin("gateup_swiglu_train")
    z_o = mk(n, n)

    def coda_sw_train(s):  # training: the pre-activation z kept for the backward (the peers keep theirs)
        coda.finish_rstd(ctx, ss_in, n, EPS, r_in)
        coda.gemm_epilogue(ctx, "nt", s["x"], s["w"], p_sw_tr, {"r": r_in, "z": z_o, "c": c_o},
                           coda.choose_tiling(ctx, dev, "nt", n, n, n, program=p_sw_tr))

    variants = [("eager", eager_sw), ("torch.compile", comp_sw), ("coda", coda_sw), ("coda rowpart", coda_sw_part),
                ("coda train", coda_sw_train)]
    if liger:
        def liger_sw(s):
            xn = liger[1].apply(s["x"], g, EPS, 0.0, "llama", False)
            z = xn @ s["w"].t()
            a, b = z.chunk(2, dim=-1)
            return liger[3].apply(a, b)
        variants.insert(2, ("liger", liger_sw))

    def check_sw(s):
        r_ref = torch.rsqrt(ss_in.double().sum(-1) / n + EPS).float()  # finish_rstd's formula
        z = acc_f(s) * r_ref[:, None]  # gate / up interleaved by columns
        c_ref = torch.nn.functional.silu(z[:, 0::2]) * z[:, 1::2]
        out = []
        for what, fn in (("c", coda_sw), ("rowpart c", coda_sw_part)):
            c_o.fill_(float("nan"))
            fn(s)
            out.append((what, rel(c_o, c_ref)))
        z_o.fill_(float("nan"))
        c_o.fill_(float("nan"))
        coda_sw_train(s)
        out += [("train z", rel(z_o, z)), ("train c", rel(c_o, c_ref))]
        ze = rms_f(s["x"], g) @ s["w"].float().t()
        a, b = ze.chunk(2, dim=-1)
        return out + [("eager c", rel(eager_sw(s), torch.nn.functional.silu(a) * b))]

    group("rmsnorm_swiglu", variants, check_sw)

    # ---- rmsnorm_rope: N = q (n/2) | k (n/4) | v (n/4), head_dim 128 ----
    nq, nk, T = n // 2, n // 4, 2048
    hd = max(d for d in range(2, 129, 2) if nq % d == 0 and nk % d == 0)  # 128 at every timed size
    pos = (torch.arange(n, device=dev) % T).float()
    inv = 500000.0 ** (-torch.arange(0, hd, 2, device=dev).float() / hd)  # (hd/2)
    ang = pos[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(bf)  # (M, hd)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(bf)

    def rot_half(t):
        t1, t2 = t.chunk(2, -1)
        return torch.cat([-t2, t1], -1)

    def eager_rope(s):
        z = rms(s["x"], g) @ s["w"].t()
        q = z[:, :nq].view(n, -1, hd)
        k = z[:, nq:nq + nk].view(n, -1, hd)
        v = z[:, nq + nk:]
        q = q * cos[:, None] + rot_half(q) * sin[:, None]
        k = k * cos[:, None] + rot_half(k) * sin[:, None]
        return q, k, v

    comp_rope = compiled(eager_rope)
    p_rope = coda.Program.builtin("qkv_rope")
    tl_rope = coda.choose_tiling(ctx, dev, "nt", n, n, n, program=p_rope)
    freq = torch.zeros(n // 2, device=dev, dtype=torch.float32)
    per_head = inv.repeat((nq + nk) // hd)
    freq[: per_head.numel()] = per_head
    qkv_o = mk(n, n)

    def coda_rope(s):
        coda.finish_rstd(ctx, ss_in, n, EPS, r_in)
        coda.gemm_epilogue(ctx, "nt", s["x"], s["w"], p_rope, {"r": r_in, "pos": pos, "freq": freq, "qkv": qkv_o},
                           tl_rope)

    p_rope_part = rowpart_program("qkv_rope")

    def coda_rope_part(s):
        coda.gemm_epilogue(ctx, "nt", s["x"], s["w"], p_rope_part,
                           {"ssp": ss_in, "invd": 1.0 / n, "eps": EPS, "pos": pos, "freq": freq, "qkv": qkv_o}, tl_rope)

    variants = [("eager", eager_rope), ("torch.compile", comp_rope), ("coda", coda_rope),
                ("coda rowpart", coda_rope_part)]
    if liger:
        def liger_rope(s):
            xn = liger[1].apply(s["x"], g, EPS, 0.0, "llama", False)
            z = xn @ s["w"].t()
            q = z[:, :nq].view(1, n, -1, hd).transpose(1, 2)
            k = z[:, nq:nq + nk].view(1, n, -1, hd).transpose(1, 2)
            return liger[2].apply(q, k, cos[None], sin[None])
        variants.insert(2, ("liger", liger_rope))

    def check_rope(s):
        r_ref = torch.rsqrt(ss_in.double().sum(-1) / n + EPS).float()
        y_ref = rope_pairs(acc_f(s) * r_ref[:, None], pos, freq)
        out = []
        for what, fn in (("qkv", coda_rope), ("rowpart qkv", coda_rope_part)):
            qkv_o.fill_(float("nan"))
            fn(s)
            out.append((what, rel(qkv_o, y_ref)))
        ze = rms_f(s["x"], g) @ s["w"].float().t()  # the peers' rotate-half layout, in float
        q = ze[:, :nq].view(n, -1, hd)
        k = ze[:, nq:nq + nk].view(n, -1, hd)
        cf, sf = cos.float()[:, None], sin.float()[:, None]
        eq, ek, ev = eager_rope(s)
        return out + [("eager q", rel(eq, q * cf + rot_half(q) * sf)), ("eager k", rel(ek, k * cf + rot_half(k) * sf)),
                      ("eager v", rel(ev, ze[:, nq + nk:]))]

    group("rmsnorm_rope", variants, check_rope)


def print_results(results):
    print("\n%-16s %6s %-20s %9s %9s" % ("kernel", "M=N=K", "variant", "ms", "/ GEMM"))
    for n, k, name, t, ratio in results:
        print("%-16s %6d %-20s %9.3f %9.3f" % (k, n, name, t, ratio))


def print_checks(checks, title):
    """The checks as a table; returns how many are past CHECK_TOL (PEER_TOL
    for the peers' rows)."""
    print(title)
    bad = 0
    for n, name, what, e in checks:
        peer = what.startswith("eager") or what.startswith("addmm")
        ok = e <= (PEER_TOL if peer else CHECK_TOL)  # NaN is not
        bad += not ok
        print("  %6d %-16s %-14s rel %.2e%s" % (n, name, what, e, "" if ok else "  FAIL"))
    return bad


def end_checks(script, checks, title, always):
    """print_checks, then the count of failures (always, or when there are
    any); the exit status: 1 if a check failed."""
    bad = print_checks(checks, title)
    if always or bad:
        print("%s.py: %d checks failed" % (script, bad))
    return 1 if bad else 0


def check_mode(script, ctx, args, checks_at):
    """`script --check [n...]`: checks_at(ctx, dev, n) -> [(n, kernel, what,
    rel)] at each n (default 200: the EVEN form; 256 and 272: N16 / ring, whole
    and edge tiles), on the GPU if there is one; the exit status."""
    ns = [int(a) for a in args] or [200, 256, 272]
    dev = "cuda" if ctx.has_cuda and torch.cuda.is_available() else "cpu"
    checks = [c for n in ns for c in checks_at(ctx, dev, n)]
    return end_checks(script, checks, "%s --check: n %s on %s" % (script, ns, dev), True)


def size_checks(ctx, dev, n):
    checks = []
    bench_size(ctx, n, None, [], checks, dev, timing=False)
    return checks


def main():
    args = sys.argv[1:]
    ctx = coda.Context()
    if args and args[0] == "--check":
        return check_mode("bench_vs_torch", ctx, args[1:], size_checks)
    sizes = [int(a) for a in args] or [2048, 4096, 8192]
    ok, liger = bench_start("bench_vs_torch", ctx, load_liger)
    if not ok:
        return 1
    results, checks = [], []
    for n in sizes:
        try:
            bench_size(ctx, n, liger, results, checks)
        except Exception as e:
            print("size %d failed: %s: %s" % (n, type(e).__name__, e))
            raise
    print_results(results)
    return end_checks("bench_vs_torch", checks,
                      "\ncoda and eager against the formula in float (relative difference, rel()):", False)


if __name__ == "__main__":
    sys.exit(main())
