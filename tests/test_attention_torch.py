#!/usr/bin/python3
"""test_attention_torch.py - coda's causal grouped-query attention (coda.h
section 11) from PyTorch: the ctypes calls (coda.attention_forward /
attention_backward), the coda::attention operator (coda.attention_ops) and
coda.nn.LlamaBlock(attention="coda"), against PyTorch.

Random bf16 qkv (M, nq + 2 nkv) in the block's layout, odd shapes (seq not
a multiple of 64, batch 2-3, GQA groups 1, 2 and 4, head_dim 64 and 128;
on the CPU also head_dim 24 and 2). The truth is the same attention in
float64 autograd, built from the same qkv (q, k, v split, k and v
repeat_interleave'd for GQA, a causal mask, softmax); the baseline is the
unfused bf16 computation as a PyTorch user writes it (bf16 scores, the
softmax in f32, its probabilities rounded to bf16 for the product with v,
autograd's backward). For o, lse, dqkv through the operator (bf16) and
dqkv from the binding (f32):

    err(coda) <= 2 * err(torch bf16) + 1e-6   (relative Frobenius, vs float64)

Also: views of wider buffers, results independent of the CPU thread count
and the same run to run, nothing written by a refused call, NaN (a NaN or
inf in a key a row attends to gives that row NaN; one in a later key
leaves the row's o, lse and dq as they were: on the CPU always, on CUDA
for rows of earlier 128-key forward tiles, rows of the key's own tile being as
they were or NaN, coda.h's rule), bad input (coda.Error, TypeError, ValueError as the binding's
rules say), LlamaBlock/LlamaModel with attention="coda", and with torch
>= 2.4 torch.library.opcheck, the fake implementations on the meta device
and torch.compile(fullgraph=True). CODA_TEST_DEVICE=cuda runs coda on the
GPU (also a CUDA graph of a forward and backward, and an explicit stream).
Never skips (exit 1 on any failure).
"""
import math
import os
import sys

from pycheck import check, raises, report  # also puts the binding on sys.path

try:
    import torch
    import test_layer_torch as T  # rel(), the project's error measure; the reference layer
    import test_block_torch as TB  # state_dict(), grads_torch()
    import coda
    import coda.nn
    import coda.ops
    import coda.attention_ops as A
except Exception as e:
    print("FAIL: cannot import torch, the coda binding or the test helpers: %s: %s" % (type(e).__name__, e))
    sys.exit(1)

DEVICE = os.environ.get("CODA_TEST_DEVICE", "cpu")
CUDA = DEVICE == "cuda"
FLOOR = 1e-6
BF = torch.bfloat16


def make(B, S, H, KV, D, seed, scale=1.0):
    """qkv (B S, (H + 2 KV) D) bf16 (scores of std about `scale`), do (B S, H D) bf16."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(B * S, (H + 2 * KV) * D, generator=g)
    qkv[:, :H * D] *= scale
    do = torch.randn(B * S, H * D, generator=g)
    return qkv.to(BF), do.to(BF)


def torch_attention(qkv, B, S, H, KV, D, dtype, do=None):
    """(o (M, nq), lse (M, H), dqkv or None) by PyTorch: dtype float64 (the
    truth) or bfloat16 (the unfused baseline: bf16 scores and products, f32
    softmax). dqkv by autograd of sum(o * do)."""
    x = qkv.detach().cpu().to(dtype).clone().requires_grad_(do is not None)
    up = (lambda t: t.float()) if dtype == BF else (lambda t: t)
    nq, nkv, M = H * D, KV * D, B * S
    q, k, v = x.split([nq, nkv, nkv], dim=1)
    q = q.reshape(B, S, H, D).transpose(1, 2)
    k = k.reshape(B, S, KV, D).transpose(1, 2).repeat_interleave(H // KV, dim=1)
    v = v.reshape(B, S, KV, D).transpose(1, 2).repeat_interleave(H // KV, dim=1)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    s = s.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(up(s), -1)
    p = torch.softmax(up(s), -1).to(dtype)
    o = (p @ v).transpose(1, 2).reshape(M, nq)
    dqkv = None
    if do is not None:
        o.backward(do.cpu().to(dtype))
        dqkv = x.grad
    return o.detach(), lse.detach().transpose(1, 2).reshape(M, H), dqkv


def on(t):
    """A copy of t on DEVICE (never t itself)."""
    return t.detach().to(DEVICE).clone()


def coda_op(qkv, do, B, S, H, KV, D):
    """Through coda::attention and autograd: (o, lse, qkv.grad) on the CPU."""
    x = on(qkv).requires_grad_(True)
    o, lse = A.attention(x, B, S, H, KV, D)
    o.backward(on(do))
    return o.detach().cpu(), lse.detach().cpu(), x.grad.cpu()


def coda_raw(ctx, qkv, do, B, S, H, KV, D):
    """Through the binding: (o, lse, dqkv f32) on the CPU."""
    q = on(qkv)
    o, lse = coda.attention_forward(ctx, q, None, None, B, S, H, KV, D)
    dqkv = coda.attention_backward(ctx, q, o, lse, on(do), None, B, S, H, KV, D)
    return o.cpu(), lse.cpu(), dqkv.cpu()


def rule(name, got, t64, t16, keys=("o", "lse", "dqkv")):
    worst = 0.0
    for k, a, b, c in zip(keys, got, t64, t16):
        e, base = T.rel(a.reshape(-1), b.reshape(-1)), T.rel(c.reshape(-1), b.reshape(-1))
        ok = e <= 2 * base + FLOOR
        check(ok, "%s: %s: coda error %.3e > 2 x torch bf16 error %.3e + %g" % (name, k, e, base, FLOOR))
        print("  %-10s %12.3e %12.3e  %s" % (k, e, base, "ok" if ok else "FAIL"))
        worst = max(worst, e / (2 * base + FLOOR))
    return worst


# ---------------------------------------------------------------------------


CASES = [  # name, B, S, H, KV, D, score scale, CPU only
    ("MHA (group 1), hd 64", 2, 37, 4, 4, 64, 1.0, False),
    ("GQA group 2, hd 64, seq 70", 3, 70, 8, 4, 64, 1.0, False),
    ("GQA group 4, hd 128, seq 129", 2, 129, 8, 2, 128, 1.0, False),
    ("MQA (group 4), hd 128, seq 13", 3, 13, 4, 1, 128, 1.0, False),
    ("seq 1", 2, 1, 4, 2, 64, 1.0, False),
    ("seq 200, group 4, sharp softmax (scores x4)", 2, 200, 4, 1, 64, 4.0, False),
    ("hd 24, group 2 (CPU)", 2, 21, 6, 3, 24, 1.0, True),
    ("hd 2, group 2 (CPU)", 3, 9, 2, 1, 2, 1.0, True),
]


def accuracy(ctx):
    worst = 0.0
    for i, (name, B, S, H, KV, D, scale, cpu_only) in enumerate(CASES):
        if cpu_only and CUDA:
            print("\n%s: CPU only (the CUDA kernels take head_dim 64 or 128)" % name)
            continue
        qkv, do = make(B, S, H, KV, D, seed=20 + i, scale=scale)
        t64 = torch_attention(qkv, B, S, H, KV, D, torch.float64, do)
        t16 = torch_attention(qkv, B, S, H, KV, D, BF, do)
        print("\n%s: batch %d, seq %d, heads %d/%d x %d (%s)" % (name, B, S, H, KV, D, DEVICE))
        print("  %-10s %12s %12s" % ("", "coda", "torch bf16"))
        got = coda_op(qkv, do, B, S, H, KV, D)
        check(got[0].dtype == BF and got[1].dtype == torch.float32 and got[2].dtype == BF,
              "%s: op dtypes o %s lse %s dqkv %s" % (name, got[0].dtype, got[1].dtype, got[2].dtype))
        worst = max(worst, rule(name + " (op)", got, t64, t16))
        raw = coda_raw(ctx, qkv, do, B, S, H, KV, D)
        check(torch.equal(raw[0], got[0]) and torch.equal(raw[1], got[1]),
              "%s: the op's o / lse differ from the binding's" % name)
        check(raw[2].dtype == torch.float32 and torch.equal(raw[2].to(BF), got[2]),
              "%s: the op's dqkv is not the binding's f32 dqkv rounded to bf16" % name)
        worst = max(worst, rule(name + " (binding)", (raw[2],), (t64[2],), (t16[2],), keys=("dqkv f32",)))
    print("\nworst error / allowed over the cases: %.3f" % worst)


def layout_and_determinism(ctx):
    """Row strides are free: views of wider buffers give the contiguous
    call's bits; the CPU's results do not depend on its thread count; two
    runs give the same bits (CUDA: no atomics)."""
    B, S, H, KV, D = 2, 45, 4, 2, 64
    qkv, do = make(B, S, H, KV, D, seed=3)
    want = coda_raw(ctx, qkv, do, B, S, H, KV, D)
    w, nq = qkv.shape[1], H * D
    big = torch.zeros(B * S, w + 24, dtype=BF, device=DEVICE)
    big[:, 8:8 + w] = on(qkv)
    qv = big[:, 8:8 + w]  # a view: row stride w + 24, base 16 bytes in
    ob = torch.zeros(B * S, nq + 8, dtype=BF, device=DEVICE)
    lb = torch.zeros(B * S, H + 4, device=DEVICE)
    db = torch.zeros(B * S, w + 4, device=DEVICE)
    dob = torch.zeros(B * S, nq + 16, dtype=BF, device=DEVICE)
    dob[:, :nq] = on(do)
    o, lse = coda.attention_forward(ctx, qv, ob[:, :nq], lb[:, :H], B, S, H, KV, D)
    dq = coda.attention_backward(ctx, qv, o, lse, dob[:, :nq], db[:, :w], B, S, H, KV, D)
    check(torch.equal(o.cpu(), want[0]) and torch.equal(lse.cpu(), want[1]) and torch.equal(dq.cpu(), want[2]),
          "views of wider buffers: results differ from the contiguous call's")
    check(bool((ob[:, nq:] == 0).all()) and bool((lb[:, H:] == 0).all()) and bool((db[:, w:] == 0).all()),
          "views: the calls wrote outside their views")
    again = coda_raw(ctx, qkv, do, B, S, H, KV, D)
    check(all(torch.equal(a, b) for a, b in zip(again, want)), "two runs: results differ")
    if not CUDA:
        for n in (1, 3):
            other = coda_raw(coda.Context(cpu_threads=n), qkv, do, B, S, H, KV, D)
            check(all(torch.equal(a, b) for a, b in zip(other, want)), "cpu_threads %d: results differ" % n)
    # the operator copies what coda cannot read: a qkv with non-contiguous columns
    qt = on(qkv).t().contiguous().t()
    o2, lse2 = A.attention(qt, B, S, H, KV, D)
    check(torch.equal(o2.cpu(), want[0]) and torch.equal(lse2.cpu(), want[1]),
          "the op on a column-strided qkv: results differ")
    print("\nviews of wider buffers, the same run to run%s, a column-strided qkv through the op: same bits"
          % ("" if CUDA else ", 1 and 3 CPU threads"))


def tile_start(j):
    """The first row that a bad key at position j may touch (coda.h section
    11): j on the CPU; on CUDA the start of j's 128-key forward tile."""
    return 128 * (j // 128) if CUDA else j


def same_or_nan(a, b):
    """Each element of a equal to b's, or NaN."""
    return bool(((a == b) | torch.isnan(a)).all())


def nan_cases(ctx):
    """NaN and inf (coda.h section 11's rule): a bad value in a key or value
    row i attends to gives o_i and lse_i NaN in that kv group's heads (dq_i
    too); one in a later key leaves row i's o, lse and dq bit for bit as
    without it on the CPU, and on CUDA where row i is in an earlier 128-key
    tile (in the key's own tile: as without it, or NaN); other sequences
    and kv groups are untouched."""
    B, S, H, KV, D = 2, 200, 4, 2, 64
    qkv, do = make(B, S, H, KV, D, seed=5)
    nq, nkv, g = H * D, KV * D, H // KV
    clean = coda_raw(ctx, qkv, do, B, S, H, KV, D)
    tile_nan = False  # whether a NaN reached a row before the bad key in its tile (CUDA may; the CPU never)
    kvh = 1  # the poisoned kv head; query heads 2, 3 read it
    heads = list(range(kvh * g, (kvh + 1) * g))
    qcols = torch.cat([torch.arange(h * D, (h + 1) * D) for h in heads])
    others = torch.tensor([c for c in range(nq) if c not in set(qcols.tolist())])
    for what, j, col0, val in (("NaN in k", 40, nq, float("nan")), ("NaN in v", 40, nq + nkv, float("nan")),
                               ("NaN in k", 130, nq, float("nan")), ("NaN in v", 141, nq + nkv, float("nan")),
                               ("+inf in k", 50, nq, float("inf")), ("-inf in v", 10, nq + nkv, float("-inf"))):
        bad = qkv.clone()
        bad[j, col0 + kvh * D + 3] = val  # sequence 0, position j
        o, lse, dq = coda_raw(ctx, bad, do, B, S, H, KV, D)
        name = "%s at position %d" % (what, j)
        lo = tile_start(j)
        before, tile, after = slice(0, lo), slice(lo, j), slice(j, S)
        check(torch.equal(o[before], clean[0][before]) and torch.equal(lse[before], clean[1][before]),
              "%s: rows before %s changed (o or lse)" % (name, "its 128-key tile" if CUDA else "it"))
        check(torch.equal(dq[before, :nq], clean[2][before, :nq]),
              "%s: dq of the rows before %s changed" % (name, "its tile" if CUDA else "it"))
        # CUDA: the earlier rows of the key's own tile are as without it, or NaN (0 x NaN in the tile's products)
        check(same_or_nan(o[tile], clean[0][tile]) and same_or_nan(lse[tile], clean[1][tile])
              and same_or_nan(dq[tile, :nq], clean[2][tile, :nq]),
              "%s: rows %d..%d of its tile neither as before nor NaN" % (name, lo, j - 1))
        tile_nan |= bool(torch.isnan(o[tile]).any())
        check(torch.equal(o[S:], clean[0][S:]) and torch.equal(lse[S:], clean[1][S:])
              and torch.equal(dq[S:], clean[2][S:]), "%s: the other sequence changed" % name)
        check(torch.equal(o[:, others], clean[0][:, others]) and torch.equal(lse[:, :kvh * g], clean[1][:, :kvh * g]),
              "%s: the other kv group's heads changed" % name)
        check(torch.equal(dq[:, nq:nq + kvh * D], clean[2][:, nq:nq + kvh * D])
              and torch.equal(dq[:, nq + nkv:nq + nkv + kvh * D], clean[2][:, nq + nkv:nq + nkv + kvh * D]),
              "%s: dk / dv of the other kv head changed" % name)
        # a NaN in k_j: every score of the rows that see it, so all of their o, lse and dq (of the group's
        # heads); in v_j: their o's column 3 only (o_i = sum_j P_ij v_j), but all of dq (through do_i . v_j);
        # an inf: +-inf scores or o (not necessarily NaN): only "not finite"
        vcols = torch.tensor([h * D + 3 for h in heads])
        bad_o = o[after][:, qcols if " k" in what else vcols]
        if "NaN" in what:
            check(bool(torch.isnan(bad_o).all()), "%s: o of the rows that see it not all NaN" % name)
            check(bool(torch.isnan(dq[after][:, qcols]).all()), "%s: dq of the rows that see it not all NaN" % name)
            if " k" in what:
                check(bool(torch.isnan(lse[after][:, heads]).all()), "%s: lse of the rows that see it not NaN" % name)
        if " v" in what:
            check(bool(torch.isfinite(lse).all()), "%s: lse not finite (v does not enter it)" % name)
            check(not bool(torch.isfinite(bad_o).any()), "%s: o's column of the rows that see it finite" % name)
    # NaN in q of one row: only that row and head
    bad = qkv.clone()
    i, h = S + 20, 1
    bad[i, h * D + 7] = float("nan")
    o, lse, dq = coda_raw(ctx, bad, do, B, S, H, KV, D)
    mask = torch.zeros_like(o, dtype=torch.bool)
    mask[i, h * D:(h + 1) * D] = True
    check(bool(torch.isnan(o[mask]).all()) and bool(torch.isnan(lse[i, h])), "NaN in q: its row's o / lse not NaN")
    check(torch.equal(o[~mask], clean[0][~mask]), "NaN in q: other rows or heads of o changed")
    lm = torch.ones_like(lse, dtype=torch.bool)
    lm[i, h] = False
    check(torch.equal(lse[lm], clean[1][lm]), "NaN in q: other lse changed")
    # through the operator too (the same kernels): NaN in a later key
    bad = qkv.clone()
    bad[30, nq + 5] = float("nan")
    og = coda_op(bad, do, B, S, H, KV, D)
    lo = tile_start(30)
    check(torch.equal(og[0][:lo], clean[0][:lo]) and same_or_nan(og[0][lo:30], clean[0][lo:30])
          and bool(torch.isnan(og[0][30:S, :g * D]).all()),
          "through the op: NaN in a key: rows before it changed, or rows after not NaN")
    # torch's own float64 attention: NaN where it has NaN; elsewhere NaN only in the key's tile (CUDA)
    t = torch.isnan(torch_attention(bad, B, S, H, KV, D, torch.float64)[0])
    c = torch.isnan(og[0])
    extra = c & ~t
    extra[lo:30] = False
    check(bool((c | ~t).all()) and not bool(extra.any()), "NaN pattern differs from torch float64's")
    if not CUDA:
        check(not tile_nan, "CPU: a NaN reached a row before the bad key")
    print("\nNaN / inf in k, v (same tile and a later one) and q: NaN where attended; earlier rows (CUDA: of "
          "earlier tiles; %s), other sequences and kv groups bit for bit unchanged; torch float64's NaN pattern"
          % ("NaN reached earlier rows of the key's own tile" if tile_nan else "no NaN in earlier rows at all"))


def bad_input(ctx):
    B, S, H, KV, D = 2, 11, 4, 2, 64
    qkv, do = make(B, S, H, KV, D, seed=7)
    q, dd = on(qkv), on(do)
    M, nq, w = B * S, H * D, qkv.shape[1]
    o, lse = coda.attention_forward(ctx, q, None, None, B, S, H, KV, D)
    sent_o = torch.full((M, nq), 7.0, dtype=BF, device=DEVICE)
    sent_l = torch.full((M, H), 7.0, device=DEVICE)
    fwd = lambda qq, *shape, oo=None, ll=None: coda.attention_forward(ctx, qq, sent_o if oo is None else oo,
                                                                      sent_l if ll is None else ll, *shape)
    shape = (B, S, H, KV, D)
    E = coda.Error
    raises("qkv f32", lambda: fwd(q.float(), *shape), E, "CODA_ERR_DTYPE")
    raises("qkv f16", lambda: fwd(q.half(), *shape), E, "CODA_ERR_DTYPE")
    raises("qkv f64", lambda: fwd(q.double(), *shape), TypeError)
    raises("qkv a list", lambda: fwd(q.tolist(), *shape), TypeError)
    raises("qkv too wide", lambda: fwd(torch.zeros(M, w + 8, dtype=BF, device=DEVICE), *shape), E, "CODA_ERR_SHAPE")
    raises("qkv rows != batch * seq", lambda: fwd(q, 3, S, H, KV, D), E, "CODA_ERR_SHAPE")
    raises("qkv 3-D", lambda: fwd(q.reshape(B, S, w), *shape), E, "CODA_ERR_SHAPE")
    raises("n_kv_heads does not divide n_heads", lambda: fwd(q, B, S, 3, 2, 64), E, "CODA_ERR_SHAPE")
    raises("batch 0", lambda: fwd(q, 0, S, H, KV, D), E, "CODA_ERR_SHAPE")
    raises("seq -1", lambda: fwd(q, B, -1, H, KV, D), E, "CODA_ERR_SHAPE")
    if CUDA:
        raises("head_dim 32 on CUDA", lambda: fwd(q, B, S, 8, 4, 32), E, "CODA_ERR_UNSUPPORTED")
    else:
        raises("head_dim 63 (odd) on the CPU", lambda: coda.attention_forward(
            ctx, torch.zeros(M, 8 * 63, dtype=BF), None, None, B, S, 4, 2, 63), E, "CODA_ERR_SHAPE")
    raises("batch True", lambda: fwd(q, True, S, H, KV, D), TypeError)
    raises("batch 2.0", lambda: fwd(q, 2.0, S, H, KV, D), TypeError)
    raises("batch 2**64 + 2 (wraps to 2 in ctypes)", lambda: fwd(q, 2 ** 64 + 2, S, H, KV, D), ValueError)
    raises("head_dim a tensor", lambda: fwd(q, B, S, H, KV, torch.tensor(64)), TypeError)
    raises("o f32", lambda: fwd(q, *shape, oo=torch.empty(M, nq, device=DEVICE)), E, "CODA_ERR_DTYPE")
    raises("o (M, nq + 1)", lambda: fwd(q, *shape, oo=torch.empty(M, nq + 1, dtype=BF, device=DEVICE)), E,
           "CODA_ERR_SHAPE")
    raises("lse bf16", lambda: fwd(q, *shape, ll=torch.empty(M, H, dtype=BF, device=DEVICE)), E, "CODA_ERR_DTYPE")
    raises("o a view of qkv", lambda: fwd(q, *shape, oo=q[:, :nq]), E, "CODA_ERR_OVERLAP")
    check(bool((sent_o == 7).all()) and bool((sent_l == 7).all()), "a refused forward wrote its outputs")
    sent_d = torch.full((M, w), 7.0, device=DEVICE)
    bwd = lambda **kw: coda.attention_backward(ctx, kw.get("qkv", q), kw.get("o", o), kw.get("lse", lse),
                                               kw.get("do", dd), kw.get("dqkv", sent_d), *shape,
                                               workspace=kw.get("workspace"))
    raises("dqkv bf16", lambda: bwd(dqkv=torch.empty(M, w, dtype=BF, device=DEVICE)), E, "CODA_ERR_DTYPE")
    raises("do f32", lambda: bwd(do=dd.float()), E, "CODA_ERR_DTYPE")
    raises("lse (M, H + 1)", lambda: bwd(lse=torch.zeros(M, H + 1, device=DEVICE)), E, "CODA_ERR_SHAPE")
    raises("o of the wrong rows", lambda: bwd(o=o[:M - 1]), E, "CODA_ERR_SHAPE")
    raises("workspace a bytearray", lambda: bwd(workspace=bytearray(1 << 16)), TypeError)
    # an expanded or strided workspace would claim bytes it does not own (a review)
    one = torch.empty(1, dtype=torch.uint8, device=DEVICE)
    raises("workspace expanded", lambda: bwd(workspace=one.expand(1 << 20)), ValueError)
    raises("workspace strided", lambda: bwd(workspace=torch.empty(1 << 17, dtype=torch.uint8, device=DEVICE)[::2]),
           ValueError)
    buf = torch.full((M, w), 7.0, device=DEVICE)
    buf[:, :H] = lse
    before = buf.clone()
    raises("dqkv overlapping lse", lambda: bwd(lse=buf[:, :H], dqkv=buf), E, "CODA_ERR_OVERLAP")
    check(torch.equal(buf, before), "a refused backward (overlap) wrote dqkv")
    need = coda.attention_workspace_size(ctx, DEVICE, *shape)
    if CUDA:
        # coda.h section 11: D and lse log2(e), (B, H, S rounded up to 128) f32 each, then 2 counters a 64 rows
        plane = B * H * -(-S // 128) * 128
        check(need == -(-(2 * plane + plane // 64 * 2) * 4 // 256) * 256,
              "workspace size %d on CUDA for B %d, S %d, H %d" % (need, B, S, H))
        raises("workspace too small", lambda: bwd(workspace=torch.empty(need - 256, dtype=torch.uint8,
                                                                        device=DEVICE)), E, "CODA_ERR_INVALID_ARG")
        raises("workspace on the CPU", lambda: bwd(workspace=torch.empty(need, dtype=torch.uint8)), ValueError)
        raises("qkv on the CPU, o on CUDA", lambda: coda.attention_forward(ctx, qkv, sent_o, sent_l, *shape), E,
               "CODA_ERR_DEVICE")
        ws = torch.empty(need, dtype=torch.uint8, device=DEVICE)
        d1 = bwd(dqkv=torch.empty(M, w, device=DEVICE), workspace=ws)
        d0 = coda.attention_backward(ctx, q, o, lse, dd, None, *shape)
        check(torch.equal(d0, d1), "a given workspace: dqkv differs from an allocated one's")
    else:
        check(need == 0, "workspace size %d on the CPU (0 expected)" % need)
    check(bool((sent_d == 7).all()), "a refused backward wrote dqkv")
    raises("workspace size, n_heads 0", lambda: coda.attention_workspace_size(ctx, DEVICE, B, S, 0, 1, 64), E,
           "CODA_ERR_SHAPE")
    raises("workspace size, device 'gpu'", lambda: coda.attention_workspace_size(ctx, "gpu", *shape), ValueError)
    raises("AttentionShape field typo", lambda: setattr(coda.AttentionShape(*shape), "heads", 4), AttributeError)
    # the operator: the same refusals
    raises("op: qkv f32", lambda: A.attention(q.float(), *shape), E, "CODA_ERR_DTYPE")
    raises("op: qkv too narrow", lambda: A.attention(q[:, :w - 64], *shape), E, "CODA_ERR_SHAPE")
    raises("op: batch True", lambda: A.attention(q, True, S, H, KV, D), TypeError)
    raises("op: qkv None", lambda: A.attention(None, *shape), TypeError)
    raises("op: lse is not differentiable", lambda: A.attention(q.clone().requires_grad_(True), *shape)[1]
           .sum().backward(), RuntimeError)
    # broadcast operands (rows overlapping, row stride 0) are copied, as any
    # other view coda cannot read (a review found CODA_ERR_STRIDE raised)
    row = q[:1].clone()
    qb = row.expand(M, w)
    ob, lb = A.attention(qb, *shape)
    oc, lc = A.attention(qb.contiguous(), *shape)
    check(torch.equal(ob, oc) and torch.equal(lb, lc), "op: a broadcast qkv gives other results than its copy")
    xq = q.clone().requires_grad_(True)
    og, lg = A.attention(xq, *shape)
    (og.sum(0).float() * dd[0].float()).sum().backward()  # autograd hands a broadcast do (row stride 0)
    gb = xq.grad
    xq.grad = None
    og2, _ = A.attention(xq, *shape)
    og2.backward(dd[:1].expand(M, nq).contiguous())
    check(gb is not None and torch.equal(gb, xq.grad), "op: a broadcast do gives another dqkv than its copy")
    # lse beside o in a loss is a constant (documented): qkv's gradient is o's alone
    xq.grad = None
    og3, lg3 = A.attention(xq, *shape)
    (og3.float().sum() + lg3.sum()).backward()
    g_both = xq.grad
    xq.grad = None
    A.attention(xq, *shape)[0].float().sum().backward()
    check(not lg3.requires_grad and torch.equal(g_both, xq.grad), "op: lse in a loss changed qkv's gradient")
    if A.HAVE_CUSTOM_OPS:  # the fake implementation, on the meta device
        mo, ml = torch.ops.coda.attention(q.to("meta"), *shape)
        check(mo.shape == (M, nq) and mo.dtype == BF and ml.shape == (M, H) and ml.dtype == torch.float32
              and mo.device.type == "meta", "fake: o %s %s, lse %s %s" % (mo.shape, mo.dtype, ml.shape, ml.dtype))
        md = torch.ops.coda.attention_backward(q.to("meta"), mo, ml, dd.to("meta"), *shape)
        check(md.shape == (M, w) and md.dtype == torch.float32, "fake backward: %s %s" % (md.shape, md.dtype))
        raises("fake: qkv f32", lambda: torch.ops.coda.attention(q.float().to("meta"), *shape), E, "CODA_ERR_DTYPE")
        raises("fake: rows", lambda: torch.ops.coda.attention(q.to("meta"), 3, S, H, KV, D), E, "CODA_ERR_SHAPE")
        raises("fake: groups", lambda: torch.ops.coda.attention(q.to("meta"), B, S, 3, 2, D), E, "CODA_ERR_SHAPE")
        # what the C call refuses, the fake refuses too (a review): an integer do, the shape limits
        raises("fake: do i32", lambda: torch.ops.coda.attention_backward(q.to("meta"), mo, ml,
                                                                          dd.to("meta").int(), *shape),
               E, "CODA_ERR_DTYPE")
        raises("fake: head_dim 2^17", lambda: torch.ops.coda.attention(torch.empty(1, 3 << 17, dtype=BF,
                                                                                   device="meta"),
                                                                       1, 1, 1, 1, 1 << 17), E, "CODA_ERR_SHAPE")
        raises("real: do i32", lambda: torch.ops.coda.attention_backward(q, o, lse, dd.int(), *shape), E,
               "CODA_ERR_DTYPE")
    print("\nbad input: dtypes, shapes, groups, head_dim, overlap, workspace, Python types refused; nothing "
          "written; the op and its fake refuse alike")


def block(ctx):
    """LlamaBlock(attention="coda") against float64 autograd under the
    rule; a LlamaModel with it learns; attention names are checked."""
    cfg = coda.LlamaConfig(128, 4, 2, 64, 160, vocab=0)
    B, S = 2, 13  # M = 26: on CUDA padded to 32, the attention gets the 26 real rows
    W, x16, _, dy16 = T.make_case(cfg, B, S, False, True)
    t64 = T.run_torch(cfg, B, S, W, x16, None, dy16, 1.0, torch.float64)
    t16 = T.run_torch(cfg, B, S, W, x16, None, dy16, 1.0, BF)
    for dtype in (BF, torch.float32):
        blk = coda.nn.LlamaBlock.from_state_dict(cfg, TB.state_dict(W, ""), "", device=DEVICE, dtype=dtype,
                                                 attention="coda")
        check(blk.attention is coda.nn.coda_attention, "attention='coda' did not choose coda_attention")
        x = x16.to(DEVICE).reshape(B, S, cfg.d).clone().requires_grad_(True)
        y = blk(x)
        (y.float() * dy16.to(DEVICE).reshape(B, S, cfg.d).float()).sum().backward()
        got = {"y": y.detach().reshape(B * S, cfg.d).cpu(), "dx": x.grad.reshape(B * S, cfg.d).cpu()}
        got.update(TB.grads_torch(cfg, blk))
        print("\nLlamaBlock(attention='coda'), %s parameters, M %d (%s)" % (dtype, B * S, DEVICE))
        for k in t64:
            e, base = T.rel(got[k], t64[k]), T.rel(t16[k], t64[k])
            ok = e <= 2 * base + FLOOR
            check(ok, "block (coda attention, %s): %s: coda error %.3e > 2 x torch bf16 error %.3e + %g"
                  % (dtype, k, e, base, FLOOR))
            print("  %-8s %12.3e %12.3e  %s" % (k, e, base, "ok" if ok else "FAIL"))
    check(coda.nn.LlamaBlock(cfg, attention="sdpa").attention is coda.nn.causal_attention
          and coda.nn.LlamaBlock(cfg).attention is coda.nn.causal_attention, "the default attention is not SDPA")
    raises("attention='flash'", lambda: coda.nn.LlamaBlock(cfg, attention="flash"), ValueError)
    raises("attention=5", lambda: coda.nn.LlamaBlock(cfg, attention=5), TypeError)
    torch.manual_seed(2)
    vocab = 61
    model = coda.nn.LlamaModel(cfg, 2, vocab, device=DEVICE, attention="coda")
    check(all(l.attention is coda.nn.coda_attention for l in model.layers), "LlamaModel: attention not passed on")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, vocab, (2, 17), device=DEVICE)
    losses = []
    for _ in range(15):
        loss = model(tokens[:, :-1], tokens[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    check(losses[-1] < 0.7 * losses[0], "LlamaModel(attention='coda'): loss %.3f -> %.3f" % (losses[0], losses[-1]))
    print("LlamaModel(attention='coda', 2 blocks): loss %.3f -> %.3f in 15 AdamW steps" % (losses[0], losses[-1]))


def block_linked(ctx):
    """LlamaBlock(attention="coda") on M a multiple of 8 (no padding, so
    also on CUDA): coda's f32 dqkv goes to block_pre's backward through the
    Link (coda.ops.take_link), not cast to bf16 by autograd; the gradients
    are within the rule of float64 autograd, and a copy of qkv (which
    takes no Link) gets the cast path."""
    cfg = coda.LlamaConfig(128, 4, 2, 64, 160, vocab=0)
    B, S = 2, 8
    W, x16, _, dy16 = T.make_case(cfg, B, S, False, True)
    t64 = T.run_torch(cfg, B, S, W, x16, None, dy16, 1.0, torch.float64)
    t16 = T.run_torch(cfg, B, S, W, x16, None, dy16, 1.0, BF)
    seen, inner = [], coda.ops._pre_bwd

    def spy(x, pos, r1, qkv, dqkv, *a, **kw):
        seen.append(dqkv.dtype if isinstance(dqkv, torch.Tensor) else type(dqkv).__name__)
        return inner(x, pos, r1, qkv, dqkv, *a, **kw)

    blk = coda.nn.LlamaBlock.from_state_dict(cfg, TB.state_dict(W, ""), "", device=DEVICE, dtype=BF,
                                             attention="coda")
    coda.ops._pre_bwd = spy
    try:
        res = []
        nq = cfg.n_heads * cfg.head_dim
        # with a second consumer of qkv, the Link's f32 dqkv and autograd's are added in _Pre.backward
        both = lambda qkv, *sh: coda.nn.coda_attention(qkv, *sh) + 0.5 * qkv[:, :nq]
        both_plain = lambda qkv, *sh: coda.nn.coda_attention(qkv * 1, *sh) + 0.5 * qkv[:, :nq]
        for attention in (coda.nn.coda_attention, lambda qkv, *sh: coda.nn.coda_attention(qkv * 1, *sh), both,
                          both_plain):
            blk.attention = attention
            blk.zero_grad()
            x = x16.to(DEVICE).reshape(B, S, cfg.d).clone().requires_grad_(True)
            y = blk(x)
            (y.float() * dy16.to(DEVICE).reshape(B, S, cfg.d).float()).sum().backward()
            got = {"y": y.detach().reshape(B * S, cfg.d).cpu(), "dx": x.grad.reshape(B * S, cfg.d).cpu()}
            got.update({k: v.clone() for k, v in TB.grads_torch(cfg, blk).items()})  # zero_grad reuses .grad
            res.append(got)
    finally:
        coda.ops._pre_bwd = inner
    check(seen == [torch.float32, BF, BF, BF], "coda attention's dqkv to block_pre's backward as %s (want f32 "
          "linked, then bf16 through autograd, twice with a second consumer)" % seen)
    for k in res[2]:
        check(torch.equal(res[2][k], res[3][k]), "block: %s with a second consumer of qkv: the Link's dqkv plus "
              "autograd's differs from autograd's sum" % k)
    for k in t64:
        e, base = T.rel(res[0][k], t64[k]), T.rel(t16[k], t64[k])
        check(e <= 2 * base + FLOOR, "block, f32 dqkv through the Link: %s: coda error %.3e > 2 x torch bf16 error "
              "%.3e + %g" % (k, e, base, FLOOR))
        d = T.rel(res[0][k], res[1][k])
        check(d <= base, "block: %s through the Link and through autograd differ by %.3e (torch bf16 error %.3e)"
              % (k, d, base))
    print("LlamaBlock(attention='coda'), M %d: f32 dqkv to the block's backward through the Link, within the rule, "
          "near the bf16 cast's result: ok" % (B * S))


def cuda_only(ctx):
    """A forward and backward captured into a CUDA graph and replayed: eager's
    bits; a call on an explicit stream: the same bits."""
    if not CUDA:
        print("\nCUDA graph capture, explicit stream: run with CODA_TEST_DEVICE=cuda")
        return
    B, S, H, KV, D = 2, 100, 8, 2, 128
    qkv, do = make(B, S, H, KV, D, seed=9)
    x, dg = on(qkv).requires_grad_(True), on(do)

    def step():
        o = coda.nn.coda_attention(x, B, S, H, KV, D)
        o.backward(dg)
        return o
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            x.grad = None
            want = step().detach().clone()
    torch.cuda.current_stream().wait_stream(side)
    want_dx = x.grad.clone()
    try:
        g = torch.cuda.CUDAGraph()
        x.grad.zero_()
        with torch.cuda.graph(g, stream=side):
            o = step()
        for _ in range(2):
            x.grad.zero_()
            g.replay()
        torch.cuda.synchronize()
        check(torch.equal(o, want) and torch.equal(x.grad, want_dx), "CUDA graph: o or dqkv differ from eager's")
        print("\nCUDA graph of coda_attention's forward and backward: replayed, eager's bits")
    except Exception as e:
        check(False, "CUDA graph capture: %s: %s" % (type(e).__name__, str(e)[:300]))
    s = torch.cuda.Stream()
    q = on(qkv)
    ref = coda.attention_forward(ctx, q, None, None, B, S, H, KV, D)
    s.wait_stream(torch.cuda.current_stream())
    o2 = torch.empty_like(ref[0])
    l2 = torch.empty_like(ref[1])
    coda.attention_forward(ctx, q, o2, l2, B, S, H, KV, D, stream=s)
    s.synchronize()
    check(torch.equal(o2, ref[0]) and torch.equal(l2, ref[1]), "explicit stream: results differ")


def custom_op():
    """opcheck of both operators; torch.compile(fullgraph=True) of
    coda_attention (forward and backward) and of a coda-attention block."""
    if not A.HAVE_CUSTOM_OPS:
        print("\ntorch %s: no torch.library.custom_op; coda.attention_ops.attention is an autograd.Function "
              "(eager only)" % torch.__version__)
        return
    B, S, H, KV, D = 2, 19, 4, 2, 64
    qkv, do = make(B, S, H, KV, D, seed=11)
    shape = (B, S, H, KV, D)
    utils = ("test_schema", "test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
    try:
        torch.library.opcheck(torch.ops.coda.attention.default, (on(qkv).requires_grad_(True),) + shape,
                              test_utils=utils)
        torch.library.opcheck(torch.ops.coda.attention.default, (on(qkv),) + shape, test_utils=utils)
        o, lse = torch.ops.coda.attention(on(qkv), *shape)
        torch.library.opcheck(torch.ops.coda.attention_backward.default, (on(qkv), o, lse, on(do)) + shape,
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
        check(True, "opcheck")
        print("\ntorch.library.opcheck of coda::attention and coda::attention_backward (schema, fake tensors, "
              "autograd registration, AOT dispatch): ok")
    except Exception as e:
        check(False, "opcheck: %s: %s" % (type(e).__name__, str(e)[:600]))
    try:
        e = coda_op(qkv, do, *shape)
        f = torch.compile(lambda t: coda.nn.coda_attention(t, *shape), fullgraph=True)
        x = on(qkv).requires_grad_(True)
        oc = f(x)
        oc.backward(on(do))
        check(torch.equal(oc.detach().cpu(), e[0]) and torch.equal(x.grad.cpu(), e[2]),
              "torch.compile: o or dqkv differ from eager")
        cfg = coda.LlamaConfig(128, 4, 2, 64, 160, vocab=0)
        blk = coda.nn.LlamaBlock(cfg, device=DEVICE, attention="coda")
        xb = torch.randn(2, 8, 128, device=DEVICE).bfloat16()
        check(torch.equal(torch.compile(blk, fullgraph=True)(xb), blk(xb)), "torch.compile: the block differs")
        print("torch.compile(fullgraph=True): coda_attention forward and backward, and a block with "
              "attention='coda', equal to eager")
    except Exception as e:
        check(False, "torch.compile: %s: %s" % (type(e).__name__, str(e)[:600]))


def main():
    torch.manual_seed(0)
    print("device %s, torch %s, custom ops: %s" % (DEVICE, torch.__version__, A.HAVE_CUSTOM_OPS))
    ctx = coda.ops.context()
    accuracy(ctx)
    layout_and_determinism(ctx)
    nan_cases(ctx)
    bad_input(ctx)
    block(ctx)
    block_linked(ctx)
    cuda_only(ctx)
    custom_op()
    return report("test_attention_torch.py", "\n")


if __name__ == "__main__":
    sys.exit(main())
