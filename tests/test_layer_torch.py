#!/usr/bin/python3
"""test_layer_torch.py - coda's LLaMA layer against an independent PyTorch autograd layer.

A plain functional LLaMA block in PyTorch (PyTorch weight layout, RMSNorm as
in LLaMA's reference code, RoPE rotate-half, causal GQA attention with an
explicit softmax, SwiGLU, final norm + LM head + cross_entropy with
ignore_index=-100) runs in float64 (the truth) and in bf16 (the baseline), on
the same bf16 weights and inputs that coda's layer gets through the Python
binding. For y, the loss, dx and every weight gradient (L = loss_scale *
sum(loss) + sum(dy * y)), with relative Frobenius errors against float64:

    err(coda) <= 2 * err(torch bf16) + 1e-6.

Second check: coda's own plain reference (tests/oracle/reference.c, called
through ctypes by tests/oracle/reference.py) in float64 mode agrees with
torch float64 to 1e-9, and its bf16-unfused mode lands within 3x of torch
bf16's error (both directions): the reference that the C tests use is the
same layer as this one.

Never skips: a missing torch or library is a failure (exit 1).
"""

import math
import os
import sys

from pycheck import check, report  # also puts the binding on sys.path

try:
    import torch
    import torch.nn.functional as F
    import coda
    from oracle import reference
    from oracle.reference import run_reference
except Exception as e:  # not a skip: the cross-check is required
    print("FAIL: cannot import torch, the coda binding and the reference layer: %s: %s"
          % (type(e).__name__, e))
    sys.exit(1)

torch.manual_seed(0)

# ---------------------------------------------------------------------------
# The layer in plain PyTorch
# ---------------------------------------------------------------------------


def up(t):
    """What LLaMA code writes as .float(): bf16 -> f32; float64 stays float64."""
    return t.float() if t.dtype == torch.bfloat16 else t


def rmsnorm(x, g, eps):
    xf = up(x)
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * r).type_as(x) * g


def rope_tables(seq, hd, theta, dtype):
    inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat((ang, ang), -1)  # (seq, hd): pair (i, i + hd/2) shares angle i
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rope(x, cos, sin):
    """x (B, S, H, hd), rotate-half."""
    half = x.shape[-1] // 2
    rh = torch.cat((-x[..., half:], x[..., :half]), -1)
    return x * cos[None, :, None, :] + rh * sin[None, :, None, :]


def torch_layer(cfg, B, S, W, x, targets):
    """Returns (y (M, d), loss (M) or None)."""
    H, KV, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    M = B * S
    n1 = rmsnorm(x, W["g1"], cfg.eps)
    q = (n1 @ W["wq"].t()).view(B, S, H, hd)
    k = (n1 @ W["wk"].t()).view(B, S, KV, hd)
    v = (n1 @ W["wv"].t()).view(B, S, KV, hd)
    cos, sin = rope_tables(S, hd, cfg.rope_theta, x.dtype)
    q, k = rope(q, cos, sin), rope(k, cos, sin)
    g = H // KV  # query head h reads kv head h // g
    k = k[:, :, :, None, :].expand(B, S, KV, g, hd).reshape(B, S, H, hd)
    v = v[:, :, :, None, :].expand(B, S, KV, g, hd).reshape(B, S, H, hd)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, S, hd)
    scores = (q @ k.transpose(2, 3)) / math.sqrt(hd)
    mask = torch.ones(S, S, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    p = F.softmax(up(scores), dim=-1).type_as(q)
    o = (p @ v).transpose(1, 2).reshape(M, H * hd)
    h = x + o @ W["wo"].t()
    n2 = rmsnorm(h, W["g2"], cfg.eps)
    c = F.silu(n2 @ W["w_gate"].t()) * (n2 @ W["w_up"].t())
    y = h + c @ W["w_down"].t()
    loss = None
    if cfg.vocab > 0 and targets is not None:
        logits = rmsnorm(y, W["gf"], cfg.eps) @ W["wlm"].t()
        loss = F.cross_entropy(up(logits), targets.long(), ignore_index=-100, reduction="none")
    return y, loss


def run_torch(cfg, B, S, W16, x16, targets, dy16, loss_scale, dtype):
    W = {k: v.to(dtype).clone().requires_grad_(True) for k, v in W16.items()}
    x = x16.to(dtype).clone().requires_grad_(True)
    y, loss = torch_layer(cfg, B, S, W, x, targets)
    outs, grads = [], []
    if dy16 is not None:
        outs.append(y)
        grads.append(dy16.to(dtype))
    if loss is not None:
        outs.append(loss)
        grads.append(torch.full_like(loss, loss_scale))
    torch.autograd.backward(outs, grads)
    res = {"y": y.detach(), "dx": x.grad}
    if loss is not None:
        res["loss"] = loss.detach()
    for k, v in W.items():
        res[k] = v.grad
    return res


# ---------------------------------------------------------------------------
# coda's fused layer through the binding
# ---------------------------------------------------------------------------


# Where coda's layer runs: CODA_TEST_DEVICE=cuda runs it on the GPU (needs a
# CUDA build of torch); the PyTorch layers always run on the CPU.
DEVICE = os.environ.get("CODA_TEST_DEVICE", "cpu")


def run_coda(ctx, cfg, B, S, W16, x16, targets, dy16, loss_scale):
    w = coda.pack_weights(cfg, W16["wq"], W16["wk"], W16["wv"], W16["wo"], W16["w_gate"],
                          W16["w_up"], W16["w_down"], W16["g1"], W16["g2"], W16.get("gf"),
                          W16.get("wlm"), device=DEVICE)
    layer = coda.Llama(ctx, cfg, B, S, DEVICE)
    dev = lambda t: None if t is None else t.to(DEVICE).contiguous()
    y, loss = layer.forward(w, dev(x16), dev(targets))
    dx, g = layer.backward(w, dev(dy16), loss_scale)
    res = {"y": y.cpu(), "dx": dx.cpu()}
    if loss is not None:
        res["loss"] = loss.cpu()
    res.update(coda.unpack_grads(cfg, g))
    return res


# ---------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------


def rel(a, ref):
    a, ref = a.double(), ref.double()
    if not torch.isfinite(a).all():
        return float("inf")
    den = ref.norm().item()
    num = (a - ref).norm().item()
    return num / den if den > 0 else num


def make_case(cfg, B, S, with_loss, with_dy):
    M, d, nq, nkv = B * S, cfg.d, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    bf = lambda t: t.to(torch.bfloat16)
    W = {
        "wq": bf(torch.randn(nq, d) / math.sqrt(d)),
        "wk": bf(torch.randn(nkv, d) / math.sqrt(d)),
        "wv": bf(torch.randn(nkv, d) / math.sqrt(d)),
        "wo": bf(torch.randn(d, nq) / math.sqrt(nq)),
        "w_gate": bf(torch.randn(cfg.ffn, d) / math.sqrt(d)),
        "w_up": bf(torch.randn(cfg.ffn, d) / math.sqrt(d)),
        "w_down": bf(torch.randn(d, cfg.ffn) / math.sqrt(cfg.ffn)),
        "g1": bf(1 + 0.2 * torch.randn(d)),
        "g2": bf(1 + 0.2 * torch.randn(d)),
    }
    if cfg.vocab > 0:
        W["gf"] = bf(1 + 0.2 * torch.randn(d))
        W["wlm"] = bf(torch.randn(cfg.vocab, d) / math.sqrt(d))
    x = bf(torch.randn(M, d))
    targets = None
    if with_loss:
        targets = torch.randint(0, cfg.vocab, (M,), dtype=torch.int32)
        targets[torch.randperm(M)[: max(1, M // 5)]] = -100  # a few ignored tokens
    dy = bf(0.1 * torch.randn(M, d)) if with_dy else None
    return W, x, targets, dy


def run_case(ctx, name, cfg, B, S, with_loss=True, with_dy=True, loss_scale=0.5):
    W, x, targets, dy = make_case(cfg, B, S, with_loss, with_dy)
    t64 = run_torch(cfg, B, S, W, x, targets, dy, loss_scale, torch.float64)
    t16 = run_torch(cfg, B, S, W, x, targets, dy, loss_scale, torch.bfloat16)
    r64 = run_reference(cfg, B, S, W, x, targets, dy, loss_scale, reference.F64)
    r16 = run_reference(cfg, B, S, W, x, targets, dy, loss_scale, reference.BF16)
    try:
        cd = run_coda(ctx, cfg, B, S, W, x, targets, dy, loss_scale)
    except coda.Error as e:
        cd = None
        check(False, "%s: coda layer failed: %s" % (name, e))
    print("\n%s: d %d, heads %d/%d x %d, ffn %d, vocab %d, batch %d x seq %d (M %d)"
          % (name, cfg.d, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn, cfg.vocab,
             B, S, B * S))
    print("  %-8s %12s %12s %12s %12s  %s" % ("output", "coda", "torch bf16", "ref bf16",
                                             "ref f64", "verdict"))
    for k in t64:
        base = rel(t16[k], t64[k])
        e_r16 = rel(r16[k], t64[k])
        e_r64 = rel(r64[k], t64[k])
        ok_ref = e_r64 <= 1e-9
        ok_r16 = e_r16 <= 3 * base + 1e-6 and base <= 3 * e_r16 + 1e-6
        check(ok_ref, "%s: %s: reference float64 differs from torch float64 by %.3e"
              % (name, k, e_r64))
        check(ok_r16, "%s: %s: reference bf16 error %.3e not within 3x of torch bf16 %.3e"
              % (name, k, e_r16, base))
        if cd is not None:
            e = rel(cd[k], t64[k])
            ok = e <= 2 * base + 1e-6
            check(ok, "%s: %s: coda error %.3e > 2 x torch bf16 error %.3e + 1e-6"
                  % (name, k, e, base))
            ce = "%12.3e" % e
        else:
            ok, ce = False, "%12s" % "-"
        print("  %-8s %s %12.3e %12.3e %12.3e  %s" % (k, ce, base, e_r16, e_r64,
                                                     "ok" if ok and ok_ref and ok_r16 else "FAIL"))


def binding_checks(ctx):
    """The binding itself: plain GEMM layouts, errors, program text, a fused GEMM."""
    M, N, K = 7, 24, 40
    a, w = torch.randn(M, K).bfloat16(), torch.randn(N, K).bfloat16()
    c = torch.empty(M, N)
    coda.gemm(ctx, "nt", a, w, c)
    check(rel(c, a.double() @ w.double().t()) < 1e-6, "binding: gemm nt")
    dy = torch.randn(M, N).bfloat16()
    dx = torch.empty(M, K)
    coda.gemm(ctx, "nn", dy, w, dx)
    check(rel(dx, dy.double() @ w.double()) < 1e-6, "binding: gemm nn")
    dw = torch.empty(N, K)
    coda.gemm(ctx, "tn", dy, a, dw)
    check(rel(dw, dy.double().t() @ a.double()) < 1e-6, "binding: gemm tn")
    before = c.clone()
    try:
        coda.gemm(ctx, "nt", a, w, torch.empty(M + 1, N))
        check(False, "binding: a bad shape did not raise")
    except coda.Error as e:
        check(e.name == "CODA_ERR_SHAPE" and "c" in e.message, "binding: error %s" % e)
    check(torch.equal(before, c), "binding: failing call modified c")
    try:
        coda.Program("in x tile bf16\nv = frobnicate x\n")
        check(False, "binding: a bad program did not raise")
    except coda.Error as e:
        check(e.name == "CODA_ERR_PARSE" and "line 2" in e.message, "binding: parse error %s" % e)
    text = coda.builtin_program("resid_norm")
    p = coda.Program(text)
    check(str(coda.Program(str(p))) == str(p), "binding: print/parse round trip")
    check([x[0] for x in p.args] == ["res", "g", "h", "hg", "ss"], "binding: args %s" % p.args)
    tm, tn = coda.choose_tiling(ctx, "cpu", "nt", M, N, K)
    res, g = torch.randn(M, N).bfloat16(), torch.randn(N).bfloat16()
    h, hg = (torch.full((M, N), float("nan"), dtype=torch.bfloat16) for _ in range(2))
    ss = torch.full((M, -(-N // tn)), float("nan"))
    coda.gemm_epilogue(ctx, "nt", a, w, p, {"res": res, "g": g, "h": h, "hg": hg, "ss": ss})
    href = (a.double() @ w.double().t() + res.double()).bfloat16()
    check(rel(h, href.double()) < 1e-2 and torch.isfinite(h.float()).all(), "binding: epilogue h")
    check(rel(hg, (href * g).double()) < 1e-2, "binding: epilogue hg")
    rstd = coda.finish_rstd(ctx, ss, N, 1e-5, torch.empty(M))
    rref = torch.rsqrt(h.double().pow(2).mean(-1) + 1e-5)
    check(rel(rstd, rref) < 1e-5, "binding: finish_rstd %.3e" % rel(rstd, rref))
    print("binding: gemm (3 layouts), errors, program text, fused GEMM + finish_rstd checked")


def main():
    ctx = coda.Context(cpu_threads=2)
    print("coda layer on: %s" % DEVICE)
    if DEVICE != "cpu" and not ctx.has_cuda:
        check(False, "CODA_TEST_DEVICE=%s but the coda context has no CUDA device" % DEVICE)
        return 1
    binding_checks(ctx)
    C = coda.LlamaConfig
    # GQA with the LM head and both loss terms; M = 26 is no multiple of any tile.
    run_case(ctx, "gqa+lm", C(d=48, n_heads=4, n_kv_heads=2, head_dim=12, ffn=80, vocab=72,
                              eps=1e-5, rope_theta=10000.0), 2, 13)
    # Multi-query, no LM head (dy only), several short sequences.
    run_case(ctx, "mqa", C(d=40, n_heads=5, n_kv_heads=1, head_dim=8, ffn=56, vocab=0,
                           eps=1e-5, rope_theta=500000.0), 3, 7, with_loss=False)
    # Loss only (no dy), multi-head, a longer sequence.
    run_case(ctx, "mha-loss", C(d=32, n_heads=2, n_kv_heads=2, head_dim=16, ffn=48, vocab=40,
                                eps=1e-6, rope_theta=10000.0), 1, 31, with_dy=False,
             loss_scale=1.0 / 31)
    return report(os.path.basename(__file__), "\n")


if __name__ == "__main__":
    sys.exit(main())
