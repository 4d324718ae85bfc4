"""bench_vs_torch_train.py - the layer's other fused GEMMs against the tools people use today.

    python3 bench/bench_vs_torch_train.py [sizes...]   default 2048 4096 8192 (on the GPU)
    python3 bench/bench_vs_torch_train.py --check [n...]  no timing: every kernel's coda
                                                       output and its eager peer's against
                                                       a float reference (CPU if there is
                                                       no GPU; n default 200, 256, 272)

bench_vs_torch.py has the forward kernels that end in an RMSNorm, SwiGLU or
RoPE; this file has the rest of the layer's programs (docs/layer.md), M = N
= K = n, bf16:

  resid_add      y = x W^T + res                              (down, no loss)
  lm_loss        loss_i = CE(r_i (x W^T)_i, t_i)              (LM head forward)
  lm_loss_grad   the same, and dlogits = scale (softmax - onehot), 0 on
                 ignored rows                                 (what training needs)
  swiglu_bwd     dc = dy W, then the SwiGLU backward into dz  (down dgrad)
  rmsnorm_bwd    db = dz W, then the RMSNorm backward into dx,
                 and dg                                       (every dgrad into a norm)

Peers: the cuBLAS GEMM alone (torch.matmul in the kernel's layout, on the
same rotating inputs; the floor), PyTorch eager,
torch.compile, Liger-Kernel (bench/liger_import.py; Triton, after a cuBLAS GEMM)
where it has the kernel, and for resid_add cuBLAS's own beta = 1 GEMM
(torch.addmm). coda: the fused GEMM plus the finishing kernels the program
needs (rstd, log-sum-exp, the column partials' sum).

What each side computes differs where the layer's algebra differs
(docs/layer.md), and the table says so in favour of the peers:
  * lm_loss_grad: coda runs two GEMMs (lmhead_lse, then lmhead_bwd on the
    recomputed logits) and never stores the (M, V) logits; the peers run one
    GEMM and keep the logits.
  * swiglu_bwd: coda also recomputes c = silu(g) u (for the down weight's
    gradient) and the row sums s that its RMSNorm backward takes; the peers
    have c saved from the forward.
  * rmsnorm_bwd: coda also writes b = r x g (for the weight gradient) and
    takes s from the GEMM downstream; the peers have b saved and compute
    their row sums themselves.
Eager and torch.compile variants start from what their forward would have
saved (x, rstd, the pre-activation halves); Liger's SwiGLU backward reads
(gate | up) halves where coda's z interleaves them. Timing as in
bench_vs_torch.py: CUDA graphs of 10 calls over rotating inputs; each
kernel's variants and the GEMM alone timed round by round (median of 50
rounds, per call), ratios to that GEMM. Liger's cross entropy syncs with
the host (it checks the targets), so it cannot be captured: it is called
10 times between the events instead (marked "no graph").
"""
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)
import coda  # noqa: E402
from bench_vs_torch import (EPS, Rot, bench_start, check_mode, compiled, end_checks, import_liger,  # noqa: E402
                            interleaved_ms, print_results, rel)

IGNORE = -100


def load_liger():
    def load():
        from liger_kernel.ops.cross_entropy import cross_entropy_forward
        from liger_kernel.ops.rms_norm import _str_to_casting_mode, rms_norm_backward
        from liger_kernel.ops.swiglu import swiglu_fused_gate_up_backward
        from liger_kernel.ops.utils import calculate_settings
        # rms_norm_backward takes the casting mode as its number (only the
        # forward converts the name)
        return dict(ce=cross_entropy_forward, rms_bwd=rms_norm_backward, swiglu_bwd=swiglu_fused_gate_up_backward,
                    settings=calculate_settings, llama=_str_to_casting_mode["llama"])
    return import_liger(load)


def tiles(ctx, dev, layout, n, prog):
    tl = coda.choose_tiling(ctx, dev, layout, n, n, n, program=prog)
    return tl, (n + tl[0] - 1) // tl[0], (n + tl[1] - 1) // tl[1]


def gemm_floor(n, dev, layout, a, b):
    """The GEMM alone of a kernel, as its variants run it: the same layout
    and the same rotating inputs (set keys a, b), bf16 out."""
    out = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
    if layout == "nt":
        return lambda s: torch.matmul(s[a], s[b].t(), out=out)
    return lambda s: torch.matmul(s[a], s[b], out=out)


def targets(n, dev):
    t = torch.randint(0, n, (n,), device=dev, dtype=torch.int32)
    t[torch.rand(n, device=dev) < 0.1] = IGNORE  # some ignored rows
    return t


# Each kernel: kernel(ctx, dev, n, liger) -> dict: name; sets (rotating
# inputs); variants, (label, fn(set), graph) in table order; floor, the
# GEMM alone as fn(set); check() -> [(what, rel)] of coda's outputs and the
# eager variant's against a float reference on sets[0], and lcheck() the
# same for the Liger variant (None without Liger or a Liger kernel), so
# that every peer is checked to compute the same thing.

def k_resid_add(ctx, dev, n, liger):
    bf = torch.bfloat16
    mk = lambda *s: torch.randn(*s, device=dev, dtype=bf)  # noqa: E731
    sets = [dict(x=mk(n, n), w=mk(n, n) / n ** 0.5, res=mk(n, n)) for _ in range(4 if n <= 2048 else 2)]
    p = coda.Program.builtin("resid_add")
    tl, _, _ = tiles(ctx, dev, "nt", n, p)
    h = torch.empty(n, n, device=dev, dtype=bf)

    def eager(s):
        return s["x"] @ s["w"].t() + s["res"]

    def addmm(s):
        return torch.addmm(s["res"], s["x"], s["w"].t())

    def fused(s):
        coda.gemm_epilogue(ctx, "nt", s["x"], s["w"], p, {"res": s["res"], "h": h}, tl)

    def check():
        s = sets[0]
        fused(s)
        ref = (s["x"].float() @ s["w"].float().t() + s["res"].float())
        return [("h", rel(h, ref)), ("eager h", rel(eager(s), ref)), ("addmm h", rel(addmm(s), ref))]

    return dict(name="resid_add", sets=sets, check=check, lcheck=None, floor=gemm_floor(n, dev, "nt", "x", "w"),
                variants=[("eager", eager, 1), ("torch.compile", compiled(eager), 1), ("cuBLAS addmm", addmm, 1),
                          ("coda", fused, 1)])


def lm_setup(dev, n):
    """x: the LM head's A operand (y gf, as the layer feeds it), w: (V = n, n)."""
    bf = torch.bfloat16
    mk = lambda *s: torch.randn(*s, device=dev, dtype=bf)  # noqa: E731
    sets = [dict(x=mk(n, n), w=mk(n, n) / n ** 0.5, t=targets(n, dev)) for _ in range(4 if n <= 2048 else 2)]
    r = torch.rand(n, device=dev, dtype=torch.float32) + 0.5  # rstd of y, from the previous epilogue
    return sets, r


def lm_logits_ref(s, r):
    return (s["x"].float() @ s["w"].float().t()) * r[:, None]


def lm_loss_ref(s, r):
    lf = lm_logits_ref(s, r)
    t = s["t"].long()
    return F.cross_entropy(lf, t.clamp_min(0), reduction="none") * (t != IGNORE)


def k_lm_loss(ctx, dev, n, liger):
    sets, r = lm_setup(dev, n)
    p = coda.Program.builtin("lmhead_lse")
    tl, _, nt = tiles(ctx, dev, "nt", n, p)
    part = torch.empty(n, nt, 3, device=dev, dtype=torch.float32)
    lse = torch.empty(n, device=dev, dtype=torch.float32)
    loss = torch.empty(n, device=dev, dtype=torch.float32)

    def eager(s):  # the peers' A is their RMSNorm's output: no rstd to apply
        logits = (s["x"] @ s["w"].t()).float()
        return F.cross_entropy(logits, s["t"].long(), ignore_index=IGNORE, reduction="none")

    def fused(s):
        coda.gemm_epilogue(ctx, "nt", s["x"], s["w"], p, {"r": r, "t": s["t"], "part": part}, tl)
        coda.finish_lse(ctx, part, s["t"], lse, loss, IGNORE)

    variants = [("eager", eager, 1), ("torch.compile", compiled(eager), 1)]
    one = torch.ones_like(r)
    lcheck = None
    if liger:
        logits_b = torch.empty(n, n, device=dev, dtype=torch.bfloat16)

        def lig(s):
            torch.matmul(s["x"], s["w"].t(), out=logits_b)
            return liger["ce"](logits_b, s["t"].long(), None, IGNORE, 0.0, 0.0, "none", None, False)[0]
        variants.append(("liger (no graph)", lig, 0))

        def lcheck():
            return [("liger loss", rel(lig(sets[0]), lm_loss_ref(sets[0], one)))]
    variants.append(("coda", fused, 1))

    def check():
        s = sets[0]
        fused(s)
        return [("loss", rel(loss, lm_loss_ref(s, r))), ("eager loss", rel(eager(s), lm_loss_ref(s, one)))]

    return dict(name="lm_loss", sets=sets, variants=variants, check=check, lcheck=lcheck,
                floor=gemm_floor(n, dev, "nt", "x", "w"))


def k_lm_loss_grad(ctx, dev, n, liger):
    sets, r = lm_setup(dev, n)
    p1, p2 = coda.Program.builtin("lmhead_lse"), coda.Program.builtin("lmhead_bwd")
    tl1, _, nt1 = tiles(ctx, dev, "nt", n, p1)
    tl2, _, nt2 = tiles(ctx, dev, "nt", n, p2)
    part = torch.empty(n, nt1, 3, device=dev, dtype=torch.float32)
    lse = torch.empty(n, device=dev, dtype=torch.float32)
    loss = torch.empty(n, device=dev, dtype=torch.float32)
    dl = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
    sp = torch.empty(n, nt2, device=dev, dtype=torch.float32)
    scale = 1.0 / n

    def eager(s):  # as in lm_loss: A is the normalised input
        logits = (s["x"] @ s["w"].t()).float()
        t = s["t"].long()
        ls = F.cross_entropy(logits, t, ignore_index=IGNORE, reduction="none")
        g = torch.softmax(logits, -1)
        idx = t.clamp_min(0)[:, None]
        g.scatter_add_(1, idx, -torch.ones_like(idx, dtype=g.dtype))
        return ls, (g * (scale * (t != IGNORE))[:, None]).to(torch.bfloat16)

    def fused(s):
        coda.gemm_epilogue(ctx, "nt", s["x"], s["w"], p1, {"r": r, "t": s["t"], "part": part}, tl1)
        coda.finish_lse(ctx, part, s["t"], lse, loss, IGNORE)
        coda.gemm_epilogue(ctx, "nt", s["x"], s["w"], p2,
                           {"r": r, "logz": lse, "t": s["t"], "scale": scale, "dl": dl, "s": sp}, tl2)

    variants = [("eager", eager, 1), ("torch.compile", compiled(eager), 1)]
    lcheck = None
    if liger:
        logits_b = torch.empty(n, n, device=dev, dtype=torch.bfloat16, requires_grad=True)

        def lig(s):  # loss, and the gradient (not scaled: reduction "none") written over the logits
            with torch.no_grad():
                torch.matmul(s["x"], s["w"].t(), out=logits_b)
            return liger["ce"](logits_b, s["t"].long(), None, IGNORE, 0.0, 0.0, "none", None, False)[0]
        variants.append(("liger (no graph)", lig, 0))

        def lcheck():
            s, one = sets[0], torch.ones_like(r)
            ls = lig(s)
            t = s["t"].long()
            gref = (torch.softmax(lm_logits_ref(s, one), -1) - F.one_hot(t.clamp_min(0), n)) * (t != IGNORE)[:, None]
            return [("liger loss", rel(ls, lm_loss_ref(s, one))), ("liger dlogits", rel(logits_b.detach(), gref))]
    variants.append(("coda", fused, 1))

    def check():
        s = sets[0]
        fused(s)
        lf = lm_logits_ref(s, r)
        t = s["t"].long()
        keep = (t != IGNORE)[:, None]
        ref = (torch.softmax(lf, -1) - F.one_hot(t.clamp_min(0), n)) * (scale * keep)
        one = torch.ones_like(r)
        el, edl = eager(s)
        eref = (torch.softmax(lm_logits_ref(s, one), -1) - F.one_hot(t.clamp_min(0), n)) * (scale * keep)
        return [("loss", rel(loss, lm_loss_ref(s, r))), ("dlogits", rel(dl, ref)),
                ("s", rel(sp.sum(-1), (lf * dl.float()).sum(-1))),  # of coda's own rounded dl
                ("eager loss", rel(el, lm_loss_ref(s, one))), ("eager dlogits", rel(edl, eref))]

    return dict(name="lm_loss_grad", sets=sets, variants=variants, check=check, lcheck=lcheck,
                floor=gemm_floor(n, dev, "nt", "x", "w"))


def swiglu_ref(s):
    """Float reference of swiglu_bwd on set s: dz as (gate | up) halves and
    interleaved, c, and s_i = sum_k z_ik dz_ik (of the bf16-rounded dz)."""
    dc = s["dy"].float() @ s["w"].float()
    g, u = s["halves"].float().chunk(2, -1)
    sig = torch.sigmoid(g)
    dgr, dur = dc * u * sig * (1 + g * (1 - sig)), dc * g * sig
    inter = torch.stack([dgr, dur], -1).reshape(g.shape[0], -1)
    return torch.cat([dgr, dur], -1), inter, g * sig * u, (s["inter"].float() * inter.to(torch.bfloat16).float()).sum(-1)


def k_swiglu_bwd(ctx, dev, n, liger):
    bf = torch.bfloat16
    mk = lambda *s: torch.randn(*s, device=dev, dtype=bf)  # noqa: E731
    nsets = 4 if n <= 2048 else 2
    sets = []
    for _ in range(nsets):
        gate, up = mk(n, n), mk(n, n)
        sets.append(dict(dy=mk(n, n), w=mk(n, n) / n ** 0.5, halves=torch.cat([gate, up], -1),
                         inter=torch.stack([gate, up], -1).reshape(n, 2 * n)))
    p = coda.Program.builtin("swiglu_bwd")
    tl, _, nt = tiles(ctx, dev, "nn", n, p)
    dz = torch.empty(n, 2 * n, device=dev, dtype=bf)
    c = torch.empty(n, n, device=dev, dtype=bf)
    sp = torch.empty(n, nt, device=dev, dtype=torch.float32)

    def eager(s):
        dc = (s["dy"] @ s["w"]).float()
        g, u = s["halves"].float().chunk(2, -1)
        sig = torch.sigmoid(g)
        dg = dc * u * sig * (1 + g * (1 - sig))
        du = dc * g * sig
        return torch.cat([dg, du], -1).to(bf)

    def fused(s):
        coda.gemm_epilogue(ctx, "nn", s["dy"], s["w"], p, {"z": s["inter"], "dz": dz, "c": c, "s": sp}, tl)

    variants = [("eager", eager, 1), ("torch.compile", compiled(eager), 1)]
    lcheck = None
    if liger:
        def lig(s):
            return liger["swiglu_bwd"](s["halves"], s["dy"] @ s["w"])
        variants.append(("liger", lig, 1))

        def lcheck():
            return [("liger dz", rel(lig(sets[0]), swiglu_ref(sets[0])[0]))]
    variants.append(("coda", fused, 1))

    def check():
        s = sets[0]
        fused(s)
        halves, inter, cref, sref = swiglu_ref(s)
        return [("dz", rel(dz, inter)), ("c", rel(c, cref)), ("s", rel(sp.sum(-1), sref)),
                ("eager dz", rel(eager(s), halves))]

    return dict(name="swiglu_bwd", sets=sets, variants=variants, check=check, lcheck=lcheck,
                floor=gemm_floor(n, dev, "nn", "dy", "w"))


def rmsnorm_ref(s, g):
    """Float reference of rmsnorm_bwd on set s: dx, b = r x g, dg."""
    db = s["dz"].float() @ s["w"].float()
    r = s["rstd"][:, None]
    xh = s["x"].float() * r
    dxh = db * g.float()
    return s["dres"].float() + r * (dxh - xh * (dxh * xh).mean(-1, keepdim=True)), xh * g.float(), (db * xh).sum(0)


def k_rmsnorm_bwd(ctx, dev, n, liger):
    bf = torch.bfloat16
    mk = lambda *s: torch.randn(*s, device=dev, dtype=bf)  # noqa: E731
    g = torch.rand(n, device=dev, dtype=bf) + 0.5
    sets = []
    for _ in range(4 if n <= 2048 else 2):
        x = mk(n, n)
        rstd = torch.rsqrt(x.float().pow(2).mean(-1) + EPS)
        s = dict(dz=mk(n, n), w=mk(n, n) / n ** 0.5, x=x, dres=mk(n, n), rstd=rstd)
        # s_i = sum_j g_j db_ij x_ij r_i: what the GEMM downstream hands coda
        db = s["dz"].float() @ s["w"].float()
        s["s"] = (db * g.float() * x.float() * rstd[:, None]).sum(-1)
        sets.append(s)
    p = coda.Program.builtin("rmsnorm_bwd")
    tl, mt, _ = tiles(ctx, dev, "nn", n, p)
    dx = torch.empty(n, n, device=dev, dtype=bf)
    b = torch.empty(n, n, device=dev, dtype=bf)
    dgp = torch.empty(n, mt, device=dev, dtype=torch.float32)
    dg = torch.empty(n, device=dev, dtype=torch.float32)

    def eager(s):
        db = (s["dz"] @ s["w"]).float()
        r = s["rstd"][:, None]
        xh = s["x"].float() * r
        dxh = db * g.float()
        dxv = s["dres"].float() + r * (dxh - xh * (dxh * xh).mean(-1, keepdim=True))
        return dxv.to(bf), (db * xh).sum(0)

    def fused(s):
        coda.gemm_epilogue(ctx, "nn", s["dz"], s["w"], p,
                           {"dres": s["dres"], "x": s["x"], "g": g, "r": s["rstd"], "s": s["s"], "invd": 1.0 / n,
                            "dx": dx, "b": b, "dg": dgp}, tl)
        coda.finish_reduce(ctx, "sum", dgp, dg)

    variants = [("eager", eager, 1), ("torch.compile", compiled(eager), 1)]
    lcheck = None
    if liger:
        bs, nw = liger["settings"](n)

        def lig(s):
            dxl, dgl = liger["rms_bwd"](s["dz"] @ s["w"], s["x"], g, s["rstd"], 0.0, liger["llama"], bs, nw, False,
                                        False)
            return dxl + s["dres"], dgl
        variants.append(("liger", lig, 1))

        def lcheck():
            dxr, _, dgr = rmsnorm_ref(sets[0], g)
            dxl, dgl = lig(sets[0])
            return [("liger dx", rel(dxl, dxr)), ("liger dg", rel(dgl, dgr))]
    variants.append(("coda", fused, 1))

    def check():
        s = sets[0]
        fused(s)
        dxr, br, dgr = rmsnorm_ref(s, g)
        edx, edg = eager(s)
        return [("dx", rel(dx, dxr)), ("b", rel(b, br)), ("dg", rel(dg, dgr)), ("eager dx", rel(edx, dxr)),
                ("eager dg", rel(edg, dgr))]

    return dict(name="rmsnorm_bwd", sets=sets, variants=variants, check=check, lcheck=lcheck,
                floor=gemm_floor(n, dev, "nn", "dz", "w"))


KERNELS = [k_resid_add, k_lm_loss, k_lm_loss_grad, k_swiglu_bwd, k_rmsnorm_bwd]

def run_checks(ctx, dev, n):
    """Every kernel's checks at n (no timing): [(n, kernel, what, rel)]."""
    out = []
    for kern in KERNELS:
        k = kern(ctx, dev, n, None)
        out += [(n, k["name"], what, e) for what, e in k["check"]()]
    return out


def main():
    args = sys.argv[1:]
    ctx = coda.Context()
    if args and args[0] == "--check":
        return check_mode("bench_vs_torch_train", ctx, args[1:], run_checks)
    sizes = [int(a) for a in args] or [2048, 4096, 8192]
    ok, liger = bench_start("bench_vs_torch_train", ctx, load_liger)
    if not ok:
        return 1
    results, checks = [], []
    for n in sizes:
        for kern in KERNELS:
            k = kern(ctx, "cuda", n, liger)
            name, sets = k["name"], k["sets"]
            checks += [(n, name, what, e) for what, e in k["check"]()]
            if k["lcheck"]:
                checks += [(n, name, what, e) for what, e in k["lcheck"]()]
            variants = [v for v in k["variants"] if v[1] is not None]
            frot = Rot(sets)
            fns, graphs = [lambda: k["floor"](frot.next())], [True]
            for label, fn, graph in variants:
                rot = Rot(sets)
                fns.append(lambda fn=fn, rot=rot: fn(rot.next()))
                graphs.append(bool(graph))
            try:
                ts = interleaved_ms(fns, graphs)
            except Exception as e:  # reported; the other kernels still run
                print("%s %d failed: %s: %s" % (name, n, type(e).__name__, str(e)[:300]))
                torch.cuda.synchronize()
                continue
            results.append((n, name, "cuBLAS GEMM (floor)", ts[0], 1.0))
            for (label, _, _), t in zip(variants, ts[1:]):
                results.append((n, name, label, t, t / ts[0]))
            del k, sets, variants, fns
            torch.cuda.empty_cache()
    print_results(results)
    return end_checks("bench_vs_torch_train", checks,
                      "\ncoda against the eager formula (relative difference, rel()):", False)


if __name__ == "__main__":
    sys.exit(main())
