#!/usr/bin/python3
"""test_layer_autograd.py - coda's layer as a torch.nn.Module (python/coda/nn.py).

The same check as test_layer_torch.py, through PyTorch autograd: build
coda.nn.LlamaLayer from PyTorch-layout bf16 weights, compute
L = loss_scale * sum(loss) + sum(dy * y) and call L.backward(); x.grad and
every parameter's .grad (back in PyTorch's layout) must be within
2 x (torch bf16 error) + 1e-6 of torch float64 autograd (relative Frobenius).
Also: a backward after a second forward on the same layer raises, and the
layer without an LM head gives y only. Never skips (exit 1 on any failure).
"""
import sys

from pycheck import check, report  # also puts the binding on sys.path

try:
    import torch
    import test_layer_torch as T  # the PyTorch reference layer and helpers
    import coda
    import coda.nn
except Exception as e:
    print("FAIL: cannot import torch, the coda binding or the reference: %s: %s" % (type(e).__name__, e))
    sys.exit(1)


def case(ctx, name, cfg, B, S, with_loss, loss_scale=0.5):
    W, x16, targets, dy16 = T.make_case(cfg, B, S, with_loss, True)
    t64 = T.run_torch(cfg, B, S, W, x16, targets, dy16, loss_scale, torch.float64)
    t16 = T.run_torch(cfg, B, S, W, x16, targets, dy16, loss_scale, torch.bfloat16)
    layer = coda.nn.LlamaLayer.from_torch(ctx, cfg, B, S, W)
    x = x16.clone().requires_grad_(True)
    y, total = layer(x, targets, loss_scale=loss_scale)
    L = (y.float() * dy16.float()).sum()
    if with_loss:
        L = L + total
        ref_total = float((t64["loss"] * loss_scale).sum())
        check(abs(float(total) - ref_total) <= 1e-2 * abs(ref_total) + 1e-4,
              "%s: loss total %.6f vs float64 %.6f" % (name, float(total), ref_total))
    L.backward()
    got = {"y": y.detach(), "dx": x.grad}
    got.update(layer.grads_torch_layout())
    print("\n%s (autograd): d %d, M %d" % (name, cfg.d, B * S))
    for k in t64:
        if k == "loss":
            continue
        e, base = T.rel(got[k], t64[k]), T.rel(t16[k], t64[k])
        ok = e <= 2 * base + 1e-6
        check(ok, "%s: %s: coda error %.3e > 2 x torch bf16 error %.3e + 1e-6" % (name, k, e, base))
        print("  %-8s %12.3e %12.3e  %s" % (k, e, base, "ok" if ok else "FAIL"))
    # a second forward replaces the saved activations: the first backward must refuse
    y1, t1 = layer(x16, targets, loss_scale=loss_scale)
    layer(x16, targets, loss_scale=loss_scale)
    try:
        ((y1.float()).sum() + t1).backward()
        check(False, "%s: backward after a newer forward did not raise" % name)
    except RuntimeError as e:
        check("later forward" in str(e), "%s: unexpected error: %s" % (name, e))
    # create_graph=True and a second backward: refused, never gradients whose
    # second-order terms silently vanish (a review: s.grad came back 1.0)
    x = x16.clone().requires_grad_(True)
    s = torch.tensor(1.5, requires_grad=True)
    y, _ = layer(x, targets, loss_scale=loss_scale)
    try:
        gx, = torch.autograd.grad(y.float().sum() * s, x, create_graph=True)
        (gx.float().pow(2).sum() + s).backward()
        check(False, "%s: a second-order backward through LlamaLayer was not refused" % name)
    except RuntimeError as e:
        check("differentiate" in str(e), "%s: second order: unexpected error: %s" % (name, e))


def main():
    ctx = coda.Context()
    case(ctx, "gqa+lm", coda.LlamaConfig(64, 4, 2, 16, 160, vocab=200), 2, 13, True)
    case(ctx, "no-lm", coda.LlamaConfig(48, 2, 1, 24, 96, vocab=0), 3, 7, False)
    return report("test_layer_autograd.py", "\n")


if __name__ == "__main__":
    sys.exit(main())
