#!/usr/bin/python3
"""test_lm_loss_torch.py - the LM head and the cross-entropy loss from
PyTorch: coda.lm_loss (the ctypes call), the coda::lm_loss operator
(coda.ops.lm_loss) and coda.nn.LMHeadLoss, against PyTorch autograd.

Random non-zero bf16 x (M, d) and w (V, d), logits of std about 2, odd
shapes. The truth is the same formula in float64 autograd (logits = x w^T,
softcap tanh, F.cross_entropy with ignore_index and label smoothing, plus
z_loss lse^2, mean or sum); the baseline is the unfused bf16 computation
as a PyTorch user writes it (bf16 matmul, F.cross_entropy of the logits
.float(), backward). For the loss, the per-token losses, x.grad and w.grad:

    err(coda) <= 2 * err(torch bf16) + 1e-6   (relative Frobenius, vs float64)

Also: ignored rows (loss 0, zero gradient rows), an all-ignored batch (mean
NaN as torch, zero gradients; sum 0), a target outside [0, V) and one
outside int32 (NaN, never another class), NaN in x (NaN loss and
gradients), chunks of 8 rows against one chunk, the library's accumulate
and autograd's accumulation through the operator, sum against mean,
grad_output != 1, forward only under no_grad, f32 master weights and the
accum_dtype options, the fallback, reduction "none" refused, and, with
torch >= 2.4, torch.library.opcheck and torch.compile(fullgraph=True).
CODA_TEST_DEVICE=cuda runs coda on the GPU (and a CUDA graph of a step).
Never skips (exit 1 on any failure).
"""
import math
import os
import sys

from pycheck import check, raises, report  # also puts the binding on sys.path

try:
    import torch
    import torch.nn.functional as F
    import test_layer_torch as T  # rel(), the project's error measure
    import coda
    import coda.nn
    import coda.ops
except Exception as e:
    print("FAIL: cannot import torch, the coda binding or the test helpers: %s: %s" % (type(e).__name__, e))
    sys.exit(1)

DEVICE = os.environ.get("CODA_TEST_DEVICE", "cpu")
FLOOR = 1e-6
BF = torch.bfloat16


def make(M, d, V, seed, scale=2.0, ignore=()):
    """x (M, d), w (V, d) bf16 (logits of std about `scale`), targets (M) int64."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, d, generator=g).to(BF)
    w = (torch.randn(V, d, generator=g) * scale / math.sqrt(d)).to(BF)
    t = torch.randint(0, V, (M,), generator=g)
    for i in ignore:
        t[i] = -100
    return x, w, t


def torch_loss(x, w, t, dtype, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None, reduction="mean",
               grad_scale=1.0, softcap_f32=False):
    """(total, per-token losses, dx, dw) by PyTorch autograd: dtype float64
    (the truth) or bfloat16 (the unfused baseline: bf16 logits, f32 loss)."""
    if dtype == torch.float64:
        xr, wr = x.double().requires_grad_(True), w.double().requires_grad_(True)
        z = xr @ wr.t()
        if softcap:
            z = softcap * torch.tanh(z / softcap)
    else:
        xr, wr = x.to(BF).clone().requires_grad_(True), w.to(BF).clone().requires_grad_(True)
        z = xr @ wr.t()
        if softcap:  # in the logits' dtype, as Hugging Face's Gemma-2 head (softcap_f32: in f32, as Liger)
            z = softcap * torch.tanh((z.float() if softcap_f32 else z) / softcap)
        z = z.float()
    per = F.cross_entropy(z, t, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction="none")
    keep = t != ignore_index
    if z_loss:
        per = per + z_loss * torch.logsumexp(z, -1).pow(2) * keep
    total = per.sum()
    if reduction == "mean":
        total = total / keep.sum()
    (total * grad_scale).backward()
    return total.detach(), per.detach(), xr.grad, wr.grad


def rule(name, got, t64, t16, floor=FLOOR):
    """The project's rule for each of (total, loss, dx, dw); prints a table."""
    worst = 0.0
    for k, a, b, c in zip(("total", "loss", "dx", "dw"), got, t64, t16):
        e, base = T.rel(a.reshape(-1), b.reshape(-1)), T.rel(c.reshape(-1), b.reshape(-1))
        ok = e <= 2 * base + floor
        check(ok, "%s: %s: coda error %.3e > 2 x torch bf16 error %.3e + %g" % (name, k, e, base, floor))
        print("  %-6s %12.3e %12.3e  %s" % (k, e, base, "ok" if ok else "FAIL"))
        worst = max(worst, e / (2 * base + floor))
    return worst


def on(t):
    """A copy of t on DEVICE (never t itself: .to("cpu") of a CPU tensor is)."""
    return t.detach().to(DEVICE).clone()


def back(t):
    """A copy of t on the CPU."""
    return t.detach().cpu().clone()


def leaf(x, dtype=BF):
    """A fresh leaf on DEVICE that requires grad (never the caller's tensor)."""
    return x.to(DEVICE, dtype).detach().clone().requires_grad_(True)


def head_for(w, **kw):
    h = coda.nn.LMHeadLoss(w.shape[1], w.shape[0], device=DEVICE, dtype=kw.pop("dtype", BF), **kw)
    with torch.no_grad():
        h.weight.copy_(w)
    return h


def run_head(h, x, t, grad_scale=1.0, x_dtype=BF):
    """Through coda.nn.LMHeadLoss: (total, per-token, x.grad, w.grad) on the CPU."""
    xg = leaf(x, x_dtype)
    h.zero_grad()
    total, per = h(xg, on(t), return_per_token=True)
    if grad_scale != 1.0:
        total = total * grad_scale
    total.backward()
    total = total / grad_scale if grad_scale != 1.0 else total
    return back(total), back(per), back(xg.grad), back(h.weight.grad)


# ---------------------------------------------------------------------------


def accuracy():
    """Each option alone and together, odd shapes, against float64 under the rule."""
    cases = [
        ("plain", 37, 24, 101, {}, {}),
        ("ignored rows, label smoothing 0.1", 37, 24, 101, {"label_smoothing": 0.1}, {"ignore": (0, 5, 36)}),
        ("z-loss 1e-2", 29, 40, 77, {"z_loss": 1e-2}, {}),
        ("softcap 3", 37, 24, 101, {"softcap": 3.0}, {"scale": 4.0}),
        ("all options, sum, grad_output 0.37", 45, 32, 203,
         {"label_smoothing": 0.05, "z_loss": 1e-3, "softcap": 5.0, "reduction": "sum"}, {"ignore": (1, 2)}),
        ("chunks of 16 rows, V 1000", 70, 48, 1000, {"chunk_rows": 16, "label_smoothing": 0.1}, {"ignore": (69,)}),
    ]
    worst = 0.0
    for i, (name, M, d, V, opts, mk) in enumerate(cases):
        x, w, t = make(M, d, V, seed=10 + i, scale=mk.get("scale", 2.0), ignore=mk.get("ignore", ()))
        gs = 0.37 if "grad_output" in name else 1.0
        ref = {k: v for k, v in opts.items() if k != "chunk_rows"}
        t64 = torch_loss(x, w, t, torch.float64, grad_scale=gs, **ref)
        t16 = torch_loss(x, w, t, BF, grad_scale=gs, **ref)
        got = run_head(head_for(w, **opts), x, t, grad_scale=gs)
        print("\n%s: M %d, d %d, V %d (%s)" % (name, M, d, V, DEVICE))
        worst = max(worst, rule(name, got, t64, t16))
        if opts.get("softcap"):  # for information: against the softcap taken in f32 of the bf16 logits
            t16f = torch_loss(x, w, t, BF, grad_scale=gs, softcap_f32=True, **ref)
            print("  (softcap in f32 of the bf16 logits, as Liger: its errors %s; coda's / 2x theirs: %s)"
                  % (" ".join("%.3e" % T.rel(b.reshape(-1), a.reshape(-1)) for a, b in zip(t64, t16f)),
                     " ".join("%.2f" % (T.rel(c.reshape(-1), a.reshape(-1)) / (2 * T.rel(b.reshape(-1), a.reshape(-1))
                                                                               + FLOOR))
                              for a, b, c in zip(t64, t16f, got))))
        check(got[2].dtype == BF and got[3].dtype == BF, "%s: gradient dtypes %s %s" % (name, got[2].dtype,
                                                                                        got[3].dtype))
        ig = list(mk.get("ignore", ()))
        if ig:
            check(bool((got[1][ig] == 0).all()) and bool((got[2][ig] == 0).all()),
                  "%s: ignored rows: loss %s, dx rows not all zero" % (name, got[1][ig].tolist()))
    print("\nworst error / allowed over the cases: %.3f" % worst)


def master_weights():
    """f32 master weights (dw in f32 over the chunks, straight into the f32
    grad), accum_dtype f32 for bf16 weights, accum_dtype bf16, and f32 x."""
    x, w, t = make(53, 24, 131, seed=3, ignore=(7,))
    t64 = torch_loss(x, w, t, torch.float64)
    t16 = torch_loss(x, w, t, BF)
    for name, kw, x_dtype, wdt in (("f32 master weights, chunks of 8", {"dtype": torch.float32, "chunk_rows": 8},
                                    BF, torch.float32),
                                   ("bf16 weights, accum_dtype f32, chunks of 8",
                                    {"accum_dtype": torch.float32, "chunk_rows": 8}, BF, BF),
                                   ("bf16 weights, accum_dtype bf16, chunks of 8",
                                    {"accum_dtype": BF, "chunk_rows": 8}, BF, BF),
                                   ("f32 x", {}, torch.float32, BF)):
        print("\n%s" % name)
        got = run_head(head_for(w, **kw), x, t, x_dtype=x_dtype)
        rule(name, got, t64, t16)
        check(got[2].dtype == x_dtype and got[3].dtype == wdt,
              "%s: x.grad %s (x %s), w.grad %s (w %s)" % (name, got[2].dtype, x_dtype, got[3].dtype, wdt))


def chunking():
    """chunk_rows 8 against one chunk: on the CPU the per-row results are
    the same arithmetic (equal), dw (f32) differs only in the order the
    chunks add; on the GPU a chunk's GEMMs may be tiled otherwise (the lse
    partials summed in another order), so within rounding."""
    x, w, t = make(61, 32, 157, seed=4, ignore=(2, 60))
    ctx = coda.ops.context()
    out = {}
    for c in (0, 8, 61):
        loss, total = torch.empty(61, device=DEVICE), torch.empty(1, device=DEVICE)
        dx, dw = torch.empty(61, 32, device=DEVICE), torch.empty(157, 32, device=DEVICE)
        coda.lm_loss(ctx, on(x), on(w), on(t), loss=loss, total=total, dx=dx, dw=dw, chunk_rows=c,
                     label_smoothing=0.1)
        out[c] = [v.cpu() for v in (total, loss, dx, dw)]
    cpu = DEVICE == "cpu"
    for c in (8, 61):
        e_l, e_dx = T.rel(out[c][1], out[0][1]), T.rel(out[c][2], out[0][2])
        if cpu:
            check(e_l == 0 and e_dx == 0, "chunks of %d: per-token losses or dx differ from one chunk's (%.3g %.3g)"
                  % (c, e_l, e_dx))
        else:
            check(e_l < 1e-5 and e_dx < 2 ** -8, "chunks of %d: per-token losses or dx differ from one chunk's "
                  "by %.3g %.3g" % (c, e_l, e_dx))
        e = T.rel(out[c][3], out[0][3])
        check(e < (1e-5 if cpu else 2 ** -8), "chunks of %d: dw differs from one chunk's by %.3g" % (c, e))
        e = T.rel(out[c][0], out[0][0])
        check(e < (1e-6 if cpu else 1e-5), "chunks of %d: total differs from one chunk's by %.3g" % (c, e))
    print("\nchunks of 8 and 61 rows vs one chunk: losses %.1e, dx %.1e, dw %.1e apart"
          % (T.rel(out[8][1], out[0][1]), T.rel(out[8][2], out[0][2]), T.rel(out[8][3], out[0][3])))


def edges():
    """Ignored rows, all ignored, bad targets, NaN in x, sum vs mean."""
    V, d = 101, 24
    # all ignored: mean NaN (0/0, as torch), sum 0, zero gradients
    x, w, t = make(16, d, V, seed=5)
    t[:] = -100
    t64 = torch_loss(x, w, t, torch.float64)
    for red in ("mean", "sum"):
        tot, per, dx, dw = run_head(head_for(w, reduction=red), x, t)
        want_nan = red == "mean"
        check(bool(torch.isnan(tot)) == want_nan and (want_nan or float(tot) == 0.0),
              "all ignored, %s: total %s" % (red, float(tot)))
        check(bool((per == 0).all()) and bool((dx == 0).all()) and bool((dw == 0).all()),
              "all ignored, %s: per-token losses or gradients not all zero" % red)
    check(bool(torch.isnan(t64[0])) and bool((t64[2] == 0).all()), "all ignored: torch's own is not NaN / zero")
    # the fallback too, with the z-loss on (a review: inf * 0 made its gradients NaN)
    xf, wf = x.float().requires_grad_(True), w.float().requires_grad_(True)
    lf, _ = coda.nn.lm_loss_torch(xf, wf, t, z_loss=1e-4)
    lf.backward()
    check(bool(torch.isnan(lf)) and bool((xf.grad == 0).all()) and bool((wf.grad == 0).all()),
          "all ignored, the fallback with z_loss: loss %s, gradients not all zero" % float(lf))
    print("\nall rows ignored: mean NaN (torch too), sum 0, gradients zero (the fallback's too)")

    # a target outside [0, V) that is not ignore_index, and one outside int32
    x, w, t = make(24, d, V, seed=6)
    # (2^32 - 100 would wrap to -100, the ignore_index, if cast as it is)
    for bad, where in ((V, 3), (-7, 3), (2 ** 33 + 5, 3), (2 ** 32 - 100, 3), (-2 ** 33, 3)):
        tb = t.clone()
        tb[where] = bad
        tot, per, dx, dw = run_head(head_for(w), x, tb)
        others = torch.ones(24, dtype=torch.bool)
        others[where] = False
        check(bool(torch.isnan(tot)) and bool(torch.isnan(per[where])) and bool(torch.isnan(dx[where]).all()),
              "target %d: total %s, row loss %s, dx row NaN: %s" % (bad, float(tot), float(per[where]),
                                                                    bool(torch.isnan(dx[where]).all())))
        check(bool(torch.isfinite(per[others]).all()), "target %d: other rows' losses not finite" % bad)
        check(bool(torch.isnan(dw).all()), "target %d: dw not all NaN (its dz row is NaN)" % bad)
    print("targets V, -7, 2^33 + 5, 2^32 - 100 and -2^33 (the last three outside int32): NaN loss, dx row and dw; "
          "the other rows finite")
    # int64 targets reach the library as they are (it narrows them on the
    # device): a value that a cast to int32 would turn into ignore_index
    # (ignore_index +- 2^32) still gives NaN, ignore_index itself 0, with
    # ignore_index -100, -2^31 and -1 (the library's stand-in for a bad
    # target is then -2, not -1)
    for ign in (-100, -2 ** 31, -1):
        raw = torch.tensor([5, -100, 2 ** 32 - 100, -2 ** 33, ign])
        got = coda._lm_targets(raw, raw.device, ign)
        check(got.dtype == torch.int64 and torch.equal(got, raw), "_lm_targets changed int64 targets: %s"
              % got.tolist())
        tb = t.clone()
        tb[2], tb[3], tb[4] = ign, ign + 2 ** 32, ign - 2 ** 32
        tot, per, dx, dw = run_head(head_for(w, ignore_index=ign), x, tb)
        rest = torch.ones(24, dtype=torch.bool)
        rest[2:5] = False
        check(float(per[2]) == 0.0 and bool(torch.isnan(per[3])) and bool(torch.isnan(per[4]))
              and bool(torch.isfinite(per[rest]).all()) and bool((dx[2] == 0).all()),
              "ignore_index %d, int64 targets ign, ign + 2^32, ign - 2^32: row losses %s" % (ign, per[2:5].tolist()))
    # other integer dtypes are converted in Python; uint8 and int16 give int64's results
    tot64 = run_head(head_for(w), x, t)
    for dt in (torch.int16, torch.uint8):
        if int(t.max()) <= torch.iinfo(dt).max:
            got = run_head(head_for(w), x, t.to(dt))
            check(all(torch.equal(u, v) for u, v in zip(got, tot64)), "%s targets: results differ from int64's" % dt)
    print("int64 targets narrowed by the library: ignore_index +- 2^32 give NaN rows, ignore_index 0 "
          "(ignore_index -100, -2^31, -1); int16 / uint8 targets as int64's")

    # NaN in x (a row not ignored): NaN loss, total and gradients; other rows' losses finite
    x, w, t = make(24, d, V, seed=7)
    x[5, 3] = float("nan")
    tot, per, dx, dw = run_head(head_for(w), x, t)
    check(bool(torch.isnan(tot)) and bool(torch.isnan(per[5])) and bool(torch.isnan(dx[5]).all())
          and bool(torch.isnan(dw).all()), "NaN in x: total %s, row %s, dx row / dw not NaN" % (float(tot), float(per[5])))
    others = torch.arange(24) != 5
    check(bool(torch.isfinite(per[others]).all()) and bool(torch.isfinite(dx[others]).all()),
          "NaN in x: other rows' losses or dx not finite")
    print("NaN in x: NaN total, row loss, dx row and dw; the other rows finite")

    # sum against mean: 32 rows, none ignored, so the mean's scale 1/32 is exact
    x, w, t = make(32, d, V, seed=8)
    ms = [run_head(head_for(w, reduction=r, accum_dtype=torch.float32), x, t) for r in ("mean", "sum")]
    check(abs(float(ms[1][0]) - 32 * float(ms[0][0])) <= 1e-6 * abs(float(ms[1][0])),
          "sum %.7g vs 32 x mean %.7g" % (float(ms[1][0]), 32 * float(ms[0][0])))
    check(torch.equal(ms[1][1], ms[0][1]), "sum vs mean: per-token losses differ")
    check(torch.equal(ms[1][2], ms[0][2] * 32) and torch.equal(ms[1][3], ms[0][3] * 32),
          "sum vs mean: gradients not 32 x the mean's")
    print("sum = 32 x mean (32 rows): total, per-token losses equal, gradients exactly 32x")

    # int32 and int64 targets, (B, S, d) x and (B, S) targets: the same results
    x, w, t = make(30, d, V, seed=9, ignore=(4,))
    h = head_for(w)
    a = run_head(h, x, t)
    b = run_head(h, x.reshape(5, 6, d), t.to(torch.int32).reshape(5, 6))
    check(all(torch.equal(u.reshape(-1), v.reshape(-1)) for u, v in zip(a, b)),
          "int64 (M) targets vs int32 (B, S) targets with (B, S, d) x: results differ")
    print("int64 vs int32 targets, (M, d) vs (B, S, d): equal")

    # one row whose target tensor is a slice with a stride: torch calls a
    # one-element tensor contiguous whatever its stride, so .contiguous()
    # kept it and coda refused it (a review: CODA_ERR_STRIDE on last-token
    # losses at batch 1)
    x, w, t = make(1, d, V, seed=10)
    wide = torch.randint(0, V, (1, 5))
    wide[0, -1] = t[0]
    for tt in (wide[:, -1], wide[:, -1].to(torch.int32), wide[:, -1].to(torch.int16)):
        check(tt.stride() == (5,), "the strided one-row target is not strided: %s" % (tt.stride(),))
        c = run_head(head_for(w), x, tt)
        r = run_head(head_for(w), x, t)
        check(all(torch.equal(u, v) for u, v in zip(c, r)), "one row, %s target of stride 5: results differ" % tt.dtype)
    print("one row, strided int64 / int32 / int16 target: as the contiguous one")


def grad_output_and_accumulate():
    """grad_output != 1 scales the saved gradients; two steps accumulate in
    w.grad; the library's accumulate adds into given dx, dw."""
    x, w, t = make(40, 24, 97, seed=11, ignore=(3,))
    h = head_for(w, accum_dtype=torch.float32)
    one = run_head(h, x, t)
    for g in (0.37, 2.0, -1.5):
        s = run_head(h, x, t, grad_scale=g)
        # one rounding to bf16 of the exact product
        e_dx, e_dw = T.rel(s[2], one[2].double() * g), T.rel(s[3], one[3].double() * g)
        check(e_dx <= 2 ** -8 and e_dw <= 2 ** -8, "grad_output %g: gradients %.2e %.2e from %g x grad_output 1's"
              % (g, e_dx, e_dw, g))
    # two forwards in flight, one backward of their sum: w.grad = the sum of each alone
    xa, xb = leaf(x), leaf(x.flip(0))
    h.zero_grad()
    (h(xa, on(t)) + 0.5 * h(xb, on(t.flip(0)))).backward()
    both = h.weight.grad.clone()
    h.zero_grad()
    h(xa.detach(), on(t)).backward()
    h(xb.detach(), on(t.flip(0))).mul(0.5).backward()
    e = T.rel(both, h.weight.grad)
    check(e < 1e-6, "two forwards in flight: w.grad differs from the accumulated one by %.3g" % e)
    # the library's accumulate: dx, dw start non-zero
    ctx = coda.ops.context()
    g = torch.Generator().manual_seed(1)
    dx0, dw0 = torch.randn(40, 24, generator=g), torch.randn(97, 24, generator=g)
    base = [torch.empty(40, device=DEVICE), torch.empty(1, device=DEVICE), torch.empty(40, 24, device=DEVICE),
            torch.empty(97, 24, device=DEVICE)]
    coda.lm_loss(ctx, on(x), on(w), on(t), loss=base[0], total=base[1], dx=base[2], dw=base[3])
    dx, dw = on(dx0), on(dw0)
    coda.lm_loss(ctx, on(x), on(w), on(t), total=torch.empty(1, device=DEVICE), dx=dx, dw=dw, accumulate=True)
    check(T.rel(dx.cpu(), dx0 + base[2].cpu()) < 1e-6 and T.rel(dw.cpu(), dw0 + base[3].cpu()) < 1e-6,
          "accumulate=True: dx, dw are not their contents plus the gradients")
    # a second backward through one forward (retain_graph): refused, since
    # the first scaled the saved gradients in place and handed them out (a
    # review found them scaled twice, and the first pass's x.grad changed)
    xr = leaf(x)
    h.zero_grad()
    lr = h(xr, on(t))
    (lr * 2).backward(retain_graph=True)
    first = xr.grad.clone()
    try:
        (lr * 2).backward()
        refused = False
    except RuntimeError as err:
        refused = "second backward" in str(err)
    check(refused, "lm_loss: a second backward through one forward was not refused")
    check(torch.equal(first, xr.grad), "lm_loss: the refused second backward changed x.grad")
    # differentiating the gradients again (create_graph): an error, not a
    # silent 0 for every second-order term (a review: the gradients came
    # back as constants)
    s = torch.tensor(3.7, requires_grad=True)
    calls = [("coda.ops.lm_loss", lambda xx: coda.ops.lm_loss(xx, on(w), on(t))[0])]
    if coda.ops.HAVE_CUSTOM_OPS:
        calls.append(("torch.ops.coda.lm_loss", lambda xx: torch.ops.coda.lm_loss(
            xx, on(w), on(t), -100, 0.0, 0.0, 0.0, "mean", 0, True, False, False)[0]))
    for name, f in calls:
        xr = leaf(x)
        gx, = torch.autograd.grad(f(xr) * s, xr, create_graph=True)
        try:
            (gx.float().pow(2).sum() + s).backward()
            refused = False
        except RuntimeError as err:
            refused = "differentiate twice" in str(err)
        check(refused, "%s: differentiating its gradient again was not refused" % name)
    print("\ngrad_output 0.37, 2, -1.5: the gradients scaled; two forwards in flight and the library's "
          "accumulate add up (in flight %.1e)" % e)


def scale_binding():
    """coda.scale_ (coda_scale) against t.mul_(s.to(t.dtype)) bit for bit,
    on views with padded rows; by 1 nothing is written; refusals."""
    ctx = coda.ops.context()
    g = torch.Generator().manual_seed(5)
    n_same = 0
    for dtype in (BF, torch.float32):
        for rows, cols, ld in ((7, 64, 72), (5, 37, 40), (1, 4099, 4099), (33, 128, 128)):
            base = on((torch.randn(rows, ld, generator=g) * 3).to(dtype))
            for sv in (0.37, -2.0, 1.0, 1.0 + 2 ** -10, 2 ** -14):
                sd = on(torch.tensor(sv, dtype=torch.float32))
                t = base.clone()
                view = t[:, :cols] if rows > 1 else t[0, :cols]
                coda.scale_(ctx, view, sd)
                want = base.clone()
                (want[:, :cols] if rows > 1 else want[0, :cols]).mul_(sd.to(dtype))
                same = torch.equal(t.view(torch.int16 if dtype == BF else torch.int32),
                                   want.view(torch.int16 if dtype == BF else torch.int32))
                n_same += same
                check(same, "scale_ %s (%d, %d) ld %d by %g: not t.mul_(s)'s bits" % (dtype, rows, cols, ld, sv))
    t = on(torch.randn(4, 8))
    before = t.clone()
    raises("scale_ s of two elements", lambda: coda.scale_(ctx, t, on(torch.ones(2))), ValueError)
    raises("scale_ t a list", lambda: coda.scale_(ctx, [1.0], on(torch.ones(()))), TypeError)
    raises("scale_ t int32", lambda: coda.scale_(ctx, on(torch.ones(4, dtype=torch.int32)), on(torch.ones(()))),
           coda.Error, "CODA_ERR_DTYPE")
    raises("scale_ t 3-D", lambda: coda.scale_(ctx, on(torch.ones(2, 2, 2)), on(torch.ones(()))), coda.Error,
           "CODA_ERR_SHAPE")
    if DEVICE == "cuda":
        raises("scale_ s on the CPU", lambda: coda.scale_(ctx, t, torch.ones(())), coda.Error, "CODA_ERR_DEVICE")
    check(torch.equal(t, before), "a refused scale_ wrote t")
    print("scale_: %d cases t.mul_(s.to(t.dtype))'s bits, refusals" % n_same)


def forward_only_and_refusals():
    x, w, t = make(20, 24, 61, seed=12)
    h = head_for(w)
    with torch.no_grad():
        l0 = h(on(x), on(t))
    l1 = h(leaf(x), on(t))
    check(torch.equal(l0, l1.detach()), "no_grad loss %r vs grad-mode loss %r" % (float(l0), float(l1)))
    check(not l0.requires_grad, "no_grad: the loss requires grad")
    if coda.ops.HAVE_CUSTOM_OPS:
        r = torch.ops.coda.lm_loss(on(x), on(w), on(t), -100, 0.0, 0.0, 0.0, "mean", 0, False, False, False)
        check(r[2].numel() == 0 and r[3].numel() == 0 and torch.equal(r[0], l0),
              "coda::lm_loss forward only: dx/dw not empty or loss differs")
    for bad in ("none", "max"):
        for what, fn in (("coda.nn.LMHeadLoss", lambda: coda.nn.LMHeadLoss(24, 61, reduction=bad)),
                         ("coda.ops.lm_loss", lambda: coda.ops.lm_loss(on(x), on(w), on(t), reduction=bad))):
            try:
                fn()
                check(False, "%s(reduction=%r) did not raise" % (what, bad))
            except ValueError as e:
                check("mean" in str(e) and "sum" in str(e), "%s(reduction=%r): message %r" % (what, bad, str(e)))
    for kw in ({"label_smoothing": 1.5}, {"z_loss": -1.0}, {"softcap": 0.0}, {"chunk_rows": 0},
               {"accum_dtype": torch.float16}):
        try:
            coda.nn.LMHeadLoss(24, 61, **kw)
            check(False, "LMHeadLoss(%s) did not raise" % kw)
        except ValueError:
            check(True, "")
    try:
        coda.lm_loss(coda.ops.context(), on(x), on(w), on(t.float()))
        check(False, "float targets did not raise")
    except TypeError:
        check(True, "")
    # the options structure: coda_lm_loss_opts_init's defaults, checked fields
    o = coda.LMLossOptions()
    check((o.ignore_index, o.label_smoothing, o.z_loss, o.softcap, o.grad_scale, o.reduction, o.accumulate,
           o.chunk_rows) == (-100, 0.0, 0.0, 0.0, 1.0, coda.LM_MEAN, 0, 0), "LMLossOptions defaults: %r" % o)
    for kw, exc in (({"ignore_index": 2 ** 40}, ValueError), ({"reduction": "none"}, ValueError),
                    ({"chunk_rows": 1.5}, TypeError), ({"label_smoothing": "0.1"}, TypeError),
                    ({"grad_scal": 1.0}, AttributeError)):
        try:
            coda.LMLossOptions(**kw)
            check(False, "LMLossOptions(%s) did not raise" % kw)
        except exc:
            check(True, "")
    try:
        coda.lm_loss(coda.ops.context(), on(x), on(w), on(t), label_smoothing=2.0)
        check(False, "label_smoothing 2: coda_lm_loss did not refuse it")
    except coda.Error as e:
        check(e.name == "CODA_ERR_INVALID_ARG", "label_smoothing 2: %s" % e)
    # grad_scale (the C option the operator leaves at 1): exactly scales the gradients by a power of two
    ctx = coda.ops.context()
    outs = []
    for gs in (1.0, 0.5):
        dx, dw = torch.empty(20, 24, device=DEVICE), torch.empty(61, 24, device=DEVICE)
        loss, _, _, _ = coda.lm_loss(ctx, on(x), on(w), on(t), dx=dx, dw=dw,
                                     opts=coda.lm_loss_options(grad_scale=gs, reduction="sum"))
        outs.append((back(loss), back(dx), back(dw)))
    check(torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1] * 0.5, outs[1][1])
          and torch.equal(outs[0][2] * 0.5, outs[1][2]), "grad_scale 0.5: not half the gradients of 1")
    # the fallback (plain PyTorch) is the baseline's arithmetic
    hf = head_for(w, label_smoothing=0.1)
    hf.coda_can_run = lambda x: False
    got = run_head(hf, x, t)
    want = torch_loss(x, w, t, BF, label_smoothing=0.1)
    check(all(T.rel(a, b) < 1e-6 for a, b in zip(got, want)), "fallback: differs from torch's bf16 computation")
    hf.fallback = False
    try:
        hf(on(x), on(t))
        check(False, "fallback=False: no error where coda cannot run")
    except ValueError:
        check(True, "")
    if DEVICE == "cuda":  # d not a multiple of 8: the fallback on the GPU
        x2, w2, t2 = make(16, 20, 61, seed=13)
        got = run_head(head_for(w2), x2, t2)
        want = torch_loss(x2, w2, t2, BF)
        check(all(T.rel(a, b) < 1e-3 for a, b in zip(got, want)), "CUDA, d = 20: the fallback differs from torch")
    print("\nforward only under no_grad, reduction 'none' refused (op and module), bad options refused "
          "(LMLossOptions, LMHeadLoss, C), grad_scale, the fallback = torch's bf16 computation")


def cuda_graph():
    """On CUDA: a loss step captured into a torch.cuda.CUDAGraph and replayed
    gives eager's loss and gradients (nothing reads the device from the host
    inside: the grad_output check is skipped while capturing)."""
    if DEVICE != "cuda":
        print("CUDA graph capture: runs with CODA_TEST_DEVICE=cuda")
        return
    x, w, t = make(64, 32, 1000, seed=14, ignore=(1,))
    h = head_for(w)
    xg, tg = leaf(x), on(t)

    def step():
        loss = h(xg, tg)
        loss.backward()
        return loss
    side = torch.cuda.Stream()  # warm-up and capture on one stream
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            h.weight.grad = xg.grad = None
            want = step().detach().clone()
    torch.cuda.current_stream().wait_stream(side)
    want_dx, want_dw = xg.grad.clone(), h.weight.grad.clone()
    try:
        g = torch.cuda.CUDAGraph()
        h.weight.grad.zero_()
        xg.grad.zero_()
        with torch.cuda.graph(g, stream=side):
            loss = step()
        for _ in range(2):
            h.weight.grad.zero_()
            xg.grad.zero_()
            g.replay()
        torch.cuda.synchronize()
        check(torch.equal(loss, want) and torch.equal(xg.grad, want_dx) and torch.equal(h.weight.grad, want_dw),
              "CUDA graph: loss or gradients differ from eager's")
        print("CUDA graph of a loss step: replayed, eager's bits")
    except Exception as e:
        check(False, "CUDA graph capture: %s: %s" % (type(e).__name__, str(e)[:300]))


def custom_op():
    """opcheck (schema, fake tensors, autograd registration, AOT dispatch)
    and torch.compile(fullgraph=True) of the module, against eager."""
    if not coda.ops.HAVE_CUSTOM_OPS:
        print("\ntorch %s: no torch.library.custom_op; coda.ops.lm_loss is an autograd.Function (eager only)"
              % torch.__version__)
        return
    x, w, t = make(24, 16, 67, seed=15, ignore=(2,))
    xg, wg = leaf(x), leaf(w)
    utils = ("test_schema", "test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
    try:
        for args in ((xg, wg, on(t), -100, 0.1, 1e-3, 0.0, "mean", 0, True, True, False),
                     (xg, wg, on(t), -100, 0.0, 0.0, 4.0, "sum", 8, True, True, True),
                     (xg, on(w), on(t), -100, 0.0, 0.0, 0.0, "mean", 0, True, False, False)):
            torch.library.opcheck(torch.ops.coda.lm_loss.default, args, test_utils=utils)
        check(True, "opcheck")
        print("\ntorch.library.opcheck (schema, fake tensors, autograd registration, AOT dispatch): ok")
    except Exception as e:
        check(False, "opcheck: %s: %s" % (type(e).__name__, str(e)[:600]))
    try:
        h = head_for(w, label_smoothing=0.1, z_loss=1e-3)
        e = run_head(h, x, t)
        compiled = torch.compile(h, fullgraph=True)
        xc = leaf(x)
        h.zero_grad()
        loss = compiled(xc, on(t))
        loss.backward()
        c = (back(loss), back(xc.grad), back(h.weight.grad))
        check(torch.equal(c[0], e[0]) and torch.equal(c[1], e[2]) and torch.equal(c[2], e[3]),
              "torch.compile: loss or gradients differ from eager (%.3g %.3g %.3g)"
              % (T.rel(c[0], e[0]), T.rel(c[1], e[2]), T.rel(c[2], e[3])))
        print("torch.compile(fullgraph=True): loss and gradients equal to eager")
    except Exception as e:
        check(False, "torch.compile: %s: %s" % (type(e).__name__, str(e)[:600]))


def main():
    print("device %s, torch %s, custom ops: %s" % (DEVICE, torch.__version__, coda.ops.HAVE_CUSTOM_OPS))
    accuracy()
    master_weights()
    chunking()
    edges()
    grad_output_and_accumulate()
    scale_binding()
    forward_only_and_refusals()
    cuda_graph()
    custom_op()
    return report("test_lm_loss_torch.py", "\n")


if __name__ == "__main__":
    sys.exit(main())
