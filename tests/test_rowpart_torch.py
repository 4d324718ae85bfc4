#!/usr/bin/python3
"""test_rowpart_torch.py - an RMSNorm finished by the next GEMM (in NAME rowpart),
through the Python binding on the CPU backend.

Two GEMMs: resid_norm (h = x W1^T + res; hg = h g; sum-of-squares partials
of h per column tile), then the gate/up GEMM with SwiGLU on hg. Chain A
makes rstd with coda.finish_rstd and runs the built-in gateup_swiglu; chain
B runs gateup_swiglu with its `in r row` replaced by the partials
(`in ssp rowpart`) and the rstd computed in the epilogue with the
arithmetic of coda_finish_rstd (div, add, rsqrt). On the CPU backend the two
must agree bit for bit, and both must be within the rule (docs/testing.md) of a
float64 PyTorch reference: err <= 2 * err(plain bf16 PyTorch) + 1e-6.

Never skips: a missing torch or library is a failure (exit 1).
"""

import sys

from pycheck import check, report  # also puts the binding on sys.path

try:
    import torch
    import coda
except Exception as e:  # not a skip: the cross-check is required
    print("FAIL: cannot import torch and the coda binding: %s: %s" % (type(e).__name__, e))
    sys.exit(1)

EPS = 1e-5


def rowpart_program():
    """gateup_swiglu reading the sum-of-squares partials instead of rstd."""
    out = []
    for ln in coda.builtin_program("gateup_swiglu").split("\n"):
        w = ln.split()
        if w[:3] == ["in", "r", "row"]:
            out += ["in ssp rowpart", "in d scalar", "in eps scalar"]
        elif w[:4] == ["rv", "=", "load", "r"]:
            out += ["sq = load ssp", "dd = load d", "ms = div sq dd", "ep = load eps", "va = add ms ep",
                    "rv = rsqrt va"]
        else:
            out.append(ln)
    return coda.Program("\n".join(out))


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def run(m, d, inter, tiling1, seed):
    g_ = torch.Generator().manual_seed(seed)
    bf = torch.bfloat16
    x = torch.randn(m, d, generator=g_).to(bf)
    res = torch.randn(m, d, generator=g_).to(bf)
    w1 = (torch.randn(d, d, generator=g_) / d ** 0.5).to(bf)
    g = (torch.rand(d, generator=g_) + 0.5).to(bf)
    wgu = (torch.randn(2 * inter, d, generator=g_) / d ** 0.5).to(bf)  # gate/up interleaved rows
    ctx = coda.Context()

    # GEMM 1: resid_norm
    p1 = coda.Program.builtin("resid_norm")
    n_t = (d + tiling1[1] - 1) // tiling1[1]
    h = torch.full((m, d), float("nan"), dtype=bf)
    hg = torch.full((m, d), float("nan"), dtype=bf)
    ss = torch.full((m, n_t), float("nan"), dtype=torch.float32)
    coda.gemm_epilogue(ctx, "nt", x, w1, p1, {"res": res, "g": g, "h": h, "hg": hg, "ss": ss}, tiling1)

    # chain A: finish_rstd, then the built-in gate/up program
    rstd = torch.full((m,), float("nan"), dtype=torch.float32)
    coda.finish_rstd(ctx, ss, d, EPS, rstd)
    c_a = torch.full((m, inter), float("nan"), dtype=bf)
    coda.gemm_epilogue(ctx, "nt", hg, wgu, coda.Program.builtin("gateup_swiglu"), {"r": rstd, "c": c_a})
    # chain B: the partials read by the gate/up GEMM itself
    c_b = torch.full((m, inter), float("nan"), dtype=bf)
    coda.gemm_epilogue(ctx, "nt", hg, wgu, rowpart_program(), {"ssp": ss, "d": float(d), "eps": EPS, "c": c_b})

    tag = "M %d d %d I %d T %d" % (m, d, inter, n_t)
    check(not torch.isnan(c_b.float()).any().item(), "%s: every element of chain B written" % tag)
    check(torch.equal(c_a.view(torch.int16), c_b.view(torch.int16)),
          "%s: rowpart chain equals the finish_rstd chain bit for bit" % tag)

    # references: float64 (the truth) and plain bf16 PyTorch (the baseline)
    def layer(dt):
        hh = (x.to(dt) @ w1.to(dt).t() + res.to(dt))
        if dt == bf:
            hh = hh.to(bf)
        hf = hh.double() if dt == torch.float64 else hh.float()
        r = torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + EPS)
        hgv = (hh * g.to(hh.dtype))
        z = (r.to(hgv.dtype) * (hgv @ wgu.to(hgv.dtype).t()))
        if dt == bf:
            z = z.to(bf)
        gate, up = z[:, 0::2], z[:, 1::2]
        return torch.nn.functional.silu(gate) * up

    truth = layer(torch.float64)
    base = rel(layer(bf), truth)
    for name, c in (("chain A", c_a), ("chain B", c_b)):
        e = rel(c, truth)
        check(e <= 2 * base + 1e-6, "%s: %s err %.2e, bf16 baseline %.2e" % (tag, name, e, base))
    print("  %-28s rowpart = finish_rstd bits: %s; err vs float64 %.2e (bf16 baseline %.2e)"
          % (tag, torch.equal(c_a.view(torch.int16), c_b.view(torch.int16)), rel(c_b, truth), base))


run(37, 72, 24, (16, 16), 1)     # T = 5
run(128, 136, 40, (32, 32), 2)   # T = 5, a padded last tile
run(1, 40, 8, (16, 8), 3)        # one row, T = 5
run(200, 64, 16, (64, 64), 4)    # T = 1
sys.exit(report("test_rowpart_torch.py"))
