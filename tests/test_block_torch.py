#!/usr/bin/python3
"""test_block_torch.py - coda.nn.LlamaBlock (the split block of coda.h
section 9 through coda.ops, with PyTorch's attention between its halves).

From PyTorch-layout bf16 weights loaded as a Hugging Face state dict, y and,
by autograd, x.grad and every parameter's gradient (back in PyTorch's
layout) must be within 2 x (torch bf16 error) + 1e-6 of torch float64
autograd (relative Frobenius), for bf16 and float32 master parameters.
Also: two forwards in flight (gradient accumulation) give the sum of the two
backwards' gradients; activation checkpointing gives the same gradients; a
LlamaModel (embedding, blocks, norm, LM head + loss) trains (its loss falls);
with torch >= 2.4 the ops are torch.library custom ops that pass
torch.library.opcheck and run under torch.compile. CODA_TEST_DEVICE=cuda runs
coda on the GPU. Never skips (exit 1 on any failure).
"""
import itertools
import os
import sys

from pycheck import check, report  # also puts the binding on sys.path

try:
    import torch
    import test_layer_torch as T  # the PyTorch reference layer and helpers
    import coda
    import coda.nn
    import coda.ops
except Exception as e:
    print("FAIL: cannot import torch, the coda binding or the reference: %s: %s" % (type(e).__name__, e))
    sys.exit(1)

DEVICE = os.environ.get("CODA_TEST_DEVICE", "cpu")


def state_dict(W, prefix):
    names = {"wq": "self_attn.q_proj.weight", "wk": "self_attn.k_proj.weight", "wv": "self_attn.v_proj.weight",
             "wo": "self_attn.o_proj.weight", "w_gate": "mlp.gate_proj.weight", "w_up": "mlp.up_proj.weight",
             "w_down": "mlp.down_proj.weight", "g1": "input_layernorm.weight",
             "g2": "post_attention_layernorm.weight"}
    return {prefix + v: W[k] for k, v in names.items()}


def grads_torch(cfg, blk):
    g = {n: getattr(blk, n).grad for n in coda.nn._BLOCK_PARAMS}
    return coda.unpack_grads(cfg, g)


def case(name, cfg, B, S, dtype):
    W, x16, _, dy16 = T.make_case(cfg, B, S, False, True)
    t64 = T.run_torch(cfg, B, S, W, x16, None, dy16, 1.0, torch.float64)
    t16 = T.run_torch(cfg, B, S, W, x16, None, dy16, 1.0, torch.bfloat16)
    blk = coda.nn.LlamaBlock.from_state_dict(cfg, state_dict(W, "model.layers.3."), "model.layers.3.",
                                             device=DEVICE, dtype=dtype)
    x = x16.to(DEVICE).reshape(B, S, cfg.d).clone().requires_grad_(True)
    y = blk(x)
    (y.float() * dy16.to(DEVICE).reshape(B, S, cfg.d).float()).sum().backward()
    got = {"y": y.detach().reshape(B * S, cfg.d).cpu(), "dx": x.grad.reshape(B * S, cfg.d).cpu()}
    got.update(grads_torch(cfg, blk))
    print("\n%s: d %d, M %d, %s parameters, custom ops: %s" % (name, cfg.d, B * S, dtype, coda.ops.HAVE_CUSTOM_OPS))
    for k in t64:
        e, base = T.rel(got[k], t64[k]), T.rel(t16[k], t64[k])
        ok = e <= 2 * base + 1e-6
        check(ok, "%s: %s: coda error %.3e > 2 x torch bf16 error %.3e + 1e-6" % (name, k, e, base))
        print("  %-8s %12.3e %12.3e  %s" % (k, e, base, "ok" if ok else "FAIL"))
    check(got["dx"].dtype == x16.dtype and getattr(blk, "wqkv").grad.dtype == dtype,
          "%s: gradient dtypes %s, %s" % (name, got["dx"].dtype, getattr(blk, "wqkv").grad.dtype))
    return blk, W


def loading(cfg):
    """from_state_dict: an f32 checkpoint keeps its bits (f32 masters), the
    layout equals coda.pack_weights' (C) for bf16, a cfg with vocab loads."""
    W, _, _, _ = T.make_case(cfg, 1, 8, False, False)
    W32 = {k: v.float() + 1e-3 * torch.randn(v.shape) for k, v in W.items()}  # values bf16 cannot hold
    blk = coda.nn.LlamaBlock.from_state_dict(cfg, state_dict(W32, ""), "", dtype=torch.float32)
    back = coda.unpack_grads(cfg, {n: getattr(blk, n).detach() for n in coda.nn._BLOCK_PARAMS})
    check(all(torch.equal(back[k], W32[k]) for k in W32), "from_state_dict: f32 weights changed on the way in")
    packed = coda.pack_weights(cfg, W["wq"], W["wk"], W["wv"], W["wo"], W["w_gate"], W["w_up"], W["w_down"],
                               W["g1"], W["g2"])
    b16 = coda.nn.LlamaBlock.from_state_dict(cfg, state_dict(W, ""), "", dtype=torch.bfloat16)
    check(all(torch.equal(getattr(b16, n).detach(), packed[n]) for n in coda.nn._BLOCK_PARAMS),
          "from_state_dict: coda's layout differs from coda.pack_weights'")
    cv = coda.LlamaConfig(cfg.d, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn, vocab=50257)
    coda.nn.LlamaBlock.from_state_dict(cv, state_dict(W, ""), "")
    check(True, "from_state_dict with cfg.vocab > 0")
    # inputs of the wrong rank: a ValueError that says what is expected
    for what, call, want in (("LlamaBlock, 2-D x", lambda: b16(torch.randn(5, cfg.d)), "(batch, seq, d)"),
                             ("LlamaModel, 1-D tokens",
                              lambda: coda.nn.LlamaModel(cv, 1, 50)(torch.zeros(7, dtype=torch.long)),
                              "(batch, seq)")):
        try:
            call()
            check(False, "%s: accepted" % what)
        except ValueError as e:
            check(want in str(e), "%s: %s" % (what, e))
    print("from_state_dict: f32 bits kept, bf16 layout = pack_weights, any vocab: ok")


def model_loading(cfg):
    """LlamaModel.from_state_dict: a checkpoint without lm_head.weight is
    tied (one Parameter, equal after a training step, its gradient the sum
    of both uses); with it, the head is its own; wrong shapes, biases,
    unknown keys, a missing layer or key are ValueErrors (a review found
    them loaded silently: a broadcast embedding, dropped biases, an untied
    head); RoPE's inv_freq buffer is checked against cfg.rope_theta, not
    loaded (another theta's is a ValueError: a review found it loaded
    silently); a tied model's state_dict (lm_head.weight the embedding's
    tensor) gives a tied model (a review found it untied)."""
    torch.manual_seed(5)
    vocab, n = 37, 2
    sd = {"model.embed_tokens.weight": torch.randn(vocab, cfg.d), "model.norm.weight": 1 + 0.1 * torch.randn(cfg.d)}
    for i in range(n):
        W, _, _, _ = T.make_case(cfg, 1, 8, False, False)
        sd.update(state_dict({k: v.float() for k, v in W.items()}, "model.layers.%d." % i))
    freq = lambda theta: 1.0 / theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim)
    sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = freq(float(cfg.rope_theta))
    tied = coda.nn.LlamaModel.from_state_dict(cfg, sd, device=DEVICE)
    check(tied.head.weight is tied.embed.weight, "from_state_dict without lm_head: head and embedding not one Parameter")
    tokens = torch.randint(0, vocab, (2, 9), device=DEVICE)
    opt = torch.optim.SGD(tied.parameters(), lr=0.1)
    tied(tokens[:, :-1], tokens[:, 1:]).backward()
    opt.step()
    check(torch.equal(tied.head.weight, tied.embed.weight), "tied: head and embedding differ after a step")
    both = dict(sd, **{"lm_head.weight": sd["model.embed_tokens.weight"]})  # a tied model's state_dict()
    tied2 = coda.nn.LlamaModel.from_state_dict(cfg, both, device=DEVICE)
    check(tied2.head.weight is tied2.embed.weight, "from_state_dict of a tied state_dict: head and embedding not one "
          "Parameter")
    sd2 = dict(sd, **{"lm_head.weight": torch.randn(vocab, cfg.d)})
    own = coda.nn.LlamaModel.from_state_dict(cfg, sd2, device=DEVICE)
    check(own.head.weight is not own.embed.weight and torch.equal(own.head.weight.detach().cpu(), sd2["lm_head.weight"]),
          "from_state_dict with lm_head: not its own weight")
    bad = {"embedding (vocab, 1)": dict(sd, **{"model.embed_tokens.weight": torch.randn(vocab, 1)}),
           "norm (1,)": dict(sd, **{"model.norm.weight": torch.ones(1)}),
           "lm_head (1, d)": dict(sd, **{"lm_head.weight": torch.randn(1, cfg.d)}),
           "a bias": dict(sd, **{"model.layers.1.self_attn.q_proj.bias": torch.zeros(cfg.n_heads * cfg.head_dim)}),
           "an unknown key": dict(sd, **{"model.foo": torch.zeros(1)}),
           "a layer missing": {k: v for k, v in sd.items() if not k.startswith("model.layers.0.")},
           "a key missing": {k: v for k, v in sd.items() if k != "model.layers.1.mlp.up_proj.weight"},
           "no norm": {k: v for k, v in sd.items() if k != "model.norm.weight"},
           "inv_freq of theta 10000": dict(sd, **{"model.layers.1.self_attn.rotary_emb.inv_freq": freq(10000.0)}),
           # shapes a reshape or a stack would have met first (a review: torch's RuntimeError, not a ValueError)
           "k_proj of another GQA": dict(sd, **{"model.layers.1.self_attn.k_proj.weight":
                                                torch.randn(2 * cfg.n_kv_heads * cfg.head_dim, cfg.d)}),
           "q_proj one row long": dict(sd, **{"model.layers.0.self_attn.q_proj.weight":
                                              torch.randn(cfg.n_heads * cfg.head_dim + 1, cfg.d)}),
           "up_proj narrower than gate_proj": dict(sd, **{"model.layers.0.mlp.up_proj.weight":
                                                          torch.randn(cfg.ffn - 1, cfg.d)})}
    for what, b in bad.items():
        try:
            coda.nn.LlamaModel.from_state_dict(cfg, b, device=DEVICE)
            check(False, "from_state_dict with %s: accepted" % what)
        except ValueError as e:
            check("coda: from_state_dict" in str(e) or ("coda: model.layers." in str(e) and "cfg needs" in str(e)),
                  "from_state_dict with %s: %s" % (what, e))
    blk_sd = dict(state_dict({k: v.float() for k, v in W.items()}, "p."), **{"p.mlp.down_proj.bias": torch.zeros(cfg.d)})
    try:
        coda.nn.LlamaBlock.from_state_dict(cfg, blk_sd, "p.")
        check(False, "LlamaBlock.from_state_dict with a bias: accepted")
    except ValueError:
        pass
    print("LlamaModel.from_state_dict: tied and untied heads, %d bad checkpoints refused: ok" % len(bad))


def inference_then_training(cfg):
    """A forward under torch.inference_mode (an evaluation before training),
    then a training step at the same shape: the positions cached for that
    shape must not be an inference tensor (a review: the backward could not
    save it)."""
    blk = coda.nn.LlamaBlock(cfg, device=DEVICE)
    x = torch.randn(3, 11, cfg.d, device=DEVICE)
    coda.nn._pos_cache.clear()  # the shape first seen under inference_mode
    with torch.inference_mode():
        blk(x)
    blk(x).float().sum().backward()
    check(all(p.grad is not None for p in blk.parameters()), "training after inference_mode: no gradients")
    print("inference_mode, then training at the same shape: ok")


def second_order():
    """create_graph=True and a second backward through the gradients: an
    error, with either attention, never gradients that silently drop the
    second-order terms (a review: they came back as constants). head_dim
    64: coda's attention on CUDA takes 64 and 128 only (with main()'s 16
    the forward refused before any backward, and the check failed there)."""
    cfg = coda.LlamaConfig(128, 2, 1, 64, 160, vocab=0)
    for att in ("sdpa", "coda"):
        blk = coda.nn.LlamaBlock(cfg, device=DEVICE, attention=att)
        x = torch.randn(2, 8, cfg.d, device=DEVICE, requires_grad=True)
        s = torch.tensor(1.5, device=DEVICE, requires_grad=True)
        try:
            gx, = torch.autograd.grad(blk(x).float().sum() * s, x, create_graph=True)
            (gx.float().pow(2).sum() + s).backward()
            refused = False
        except RuntimeError as e:
            refused, why = "create_graph" in str(e) or "differentiate twice" in str(e), str(e)[:160]
        else:
            why = "no error"
        check(refused, "attention %s: a second-order backward through the block was not refused (%s)" % (att, why))
    print("second-order backward (create_graph): refused with either attention")


def in_flight(cfg):
    """Two micro-batches forwarded before either backward: the gradients
    are the sum of each alone (gradient accumulation)."""
    blk = coda.nn.LlamaBlock(cfg, device=DEVICE)
    xa, xb = (torch.randn(2, 8, cfg.d, device=DEVICE).bfloat16() for _ in range(2))
    ya, yb = blk(xa), blk(xb)
    (ya.float().sum() + (yb.float() ** 2).sum()).backward()
    both = {n: getattr(blk, n).grad.clone() for n in coda.nn._BLOCK_PARAMS}
    blk.zero_grad()
    blk(xa).float().sum().backward()
    (blk(xb).float() ** 2).sum().backward()
    for n in coda.nn._BLOCK_PARAMS:
        e = T.rel(both[n], getattr(blk, n).grad)
        check(e < 1e-6, "in flight: grad %s differs from the accumulated one by %.3g" % (n, e))
    # activation checkpointing: the block recomputed in the backward
    import torch.utils.checkpoint as ckpt
    blk.zero_grad()
    x = xa.clone().requires_grad_(True)
    y = blk(x)
    y.float().sum().backward()
    want = {n: getattr(blk, n).grad.clone() for n in coda.nn._BLOCK_PARAMS}
    want["x"] = x.grad.clone()
    blk.zero_grad()
    x2 = xa.clone().requires_grad_(True)
    kw = {"use_reentrant": False} if "use_reentrant" in ckpt.checkpoint.__code__.co_varnames else {}
    ckpt.checkpoint(blk, x2, **kw).float().sum().backward()
    for n in coda.nn._BLOCK_PARAMS:
        check(torch.equal(want[n], getattr(blk, n).grad), "checkpointing: grad %s differs" % n)
    check(torch.equal(want["x"], x2.grad), "checkpointing: x.grad differs")
    print("two forwards in flight and activation checkpointing: ok")


def z_memory(cfg):
    """A forward without grad saves no z and gives the same y; the eager
    backward that writes dz over z (coda.ops.SPEND_Z) gives the same
    gradients as the one that only reads it, and a second backward through
    it is refused, not wrong."""
    blk = coda.nn.LlamaBlock(cfg, device=DEVICE)
    x = torch.randn(2, 8, cfg.d, device=DEVICE).bfloat16()
    calls = []
    real = coda.Block.forward_post

    def spy(self, *a, **kw):
        calls.append(kw.get("save_z", True))
        return real(self, *a, **kw)

    coda.Block.forward_post = spy
    try:
        with torch.no_grad():
            y0 = blk(x)
        y1 = blk(x)
    finally:
        coda.Block.forward_post = real
    check(calls == [False, True], "save_z in forward_post: %s, want [False, True] (no_grad, grad)" % calls)
    check(torch.equal(y0, y1.detach()), "a forward without z differs from the training forward")
    # no padding rows (M = 16): the output is the block's own, not a slice of it
    # (a slice's backward would fill an (M, d) zero tensor and copy into it)
    fns, f = [], y1.grad_fn
    while f is not None and len(fns) < 4:
        fns.append(type(f).__name__)
        nxt = [g for g, _ in f.next_functions if g is not None]
        f = nxt[0] if nxt else None
    check(not any("Slice" in n for n in fns), "the block's output passes through a slice: %s" % fns)
    grads = {}
    for spend in (False, True):
        coda.ops.SPEND_Z = spend
        try:
            blk.zero_grad()
            xs = x.clone().requires_grad_(True)
            blk(xs).float().pow(2).sum().backward()
            grads[spend] = {n: getattr(blk, n).grad.clone() for n in coda.nn._BLOCK_PARAMS}
            grads[spend]["x"] = xs.grad.clone()
        finally:
            coda.ops.SPEND_Z = True
    for n in grads[True]:
        check(torch.equal(grads[True][n], grads[False][n]), "SPEND_Z: grad %s differs from z read" % n)
    y = blk(x.clone().requires_grad_(True)).float().sum()
    y.backward(retain_graph=True)
    try:
        y.backward()
        check(False, "a second backward through a spent z ran")
    except RuntimeError as e:
        check("SPEND_Z" in str(e), "the second backward's error does not name SPEND_Z: %s" % e)
    coda.ops.SPEND_Z = False
    try:
        y = blk(x.clone().requires_grad_(True)).float().sum()
        blk.zero_grad()
        y.backward(retain_graph=True)
        once = {n: getattr(blk, n).grad.clone() for n in coda.nn._BLOCK_PARAMS}
        y.backward()
        for n in once:
            check(torch.equal(getattr(blk, n).grad, 2 * once[n]), "SPEND_Z False: twice %s is not 2x once" % n)
    finally:
        coda.ops.SPEND_Z = True
    print("no z saved without grad, z spent by the backward: ok")


def kept_c(cfg):
    """LlamaBlock.keep_c: the forward keeps c = silu(gate) * up (one (M, I)
    tensor more saved), the backward reads it instead of recomputing it;
    the same gradients, with z read or spent, and a forward without grad
    keeps nothing."""
    blk = coda.nn.LlamaBlock(cfg, device=DEVICE)
    x = torch.randn(2, 8, cfg.d, device=DEVICE).bfloat16()
    cs, cb = [], []
    real, real_b = coda.Block.forward_post, coda.Block.backward_post

    def spy(self, *a, **kw):
        cs.append(kw.get("c"))
        return real(self, *a, **kw)

    def spy_b(self, *a, **kw):
        cb.append(kw.get("c"))
        return real_b(self, *a, **kw)

    grads = {}
    coda.Block.forward_post, coda.Block.backward_post = spy, spy_b
    try:
        for keep, spend in ((False, True), (True, True), (True, False)):
            blk.keep_c, coda.ops.SPEND_Z = keep, spend
            blk.zero_grad()
            xs = x.clone().requires_grad_(True)
            blk(xs).float().pow(2).sum().backward()
            grads[keep, spend] = {n: getattr(blk, n).grad.clone() for n in coda.nn._BLOCK_PARAMS}
            grads[keep, spend]["x"] = xs.grad.clone()
        with torch.no_grad():
            blk(x)
    finally:
        coda.Block.forward_post, coda.Block.backward_post = real, real_b
        blk.keep_c, coda.ops.SPEND_Z = False, True
    check([c is not None for c in cs] == [False, True, True, False],
          "forward_post's c: %s, want kept only in the two keep_c forwards with grad" % [c is not None for c in cs])
    check(len(cb) == 3 and cb[0] is None and cb[1] is cs[1] and cb[2] is cs[2],
          "backward_post's c: not the tensor its forward kept (%s)" % [c is not None for c in cb])
    m, ffn = 16, cfg.ffn
    check(cs[1] is not None and tuple(cs[1].shape) == (m, ffn) and cs[1].dtype == torch.bfloat16,
          "the kept c is %s, want (%d, %d) bf16" % (None if cs[1] is None else (tuple(cs[1].shape), cs[1].dtype),
                                                     m, ffn))
    for k in ((True, True), (True, False)):
        for n in grads[False, True]:
            check(torch.equal(grads[k][n], grads[False, True][n]), "keep_c (spend_z %s): grad %s differs" % (k[1], n))
    print("c kept from the forward: ok")


def fused_norms(cfg):
    """LlamaModel with the norm across blocks (each down projection gives the
    next block's x g1 and rstd) against the same model without: the loss
    and every gradient agree up to the order of rstd's sums."""
    torch.manual_seed(3)
    vocab, B, S = 61, 2, 12
    a = coda.nn.LlamaModel(cfg, 3, vocab, device=DEVICE, fuse_norms=True)
    b = coda.nn.LlamaModel(cfg, 3, vocab, device=DEVICE, fuse_norms=False)
    b.load_state_dict(a.state_dict())
    tokens = torch.randint(0, vocab, (B, S + 1), device=DEVICE)
    seen = []  # which forward_pre calls got the previous block's xg
    orig = coda.Block.forward_pre

    def spy(self, w, x, pos, xg=None, r1=None):
        seen.append(xg is not None)
        return orig(self, w, x, pos, xg=xg, r1=r1)
    coda.Block.forward_pre = spy
    try:
        la = a(tokens[:, :-1], tokens[:, 1:])
        fused_calls, seen[:] = list(seen), []
        lb = b(tokens[:, :-1], tokens[:, 1:])
    finally:
        coda.Block.forward_pre = orig
    check(fused_calls == [False, True, True] and seen == [False, False, False],
          "fused norms: blocks given xg %s (fused), %s (not)" % (fused_calls, seen))
    la.backward()
    lb.backward()
    check(abs(float(la) - float(lb)) <= 1e-3 * abs(float(lb)), "fused norms: loss %.6f vs %.6f" % (float(la), float(lb)))
    worst = 0.0
    for (n, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        e = T.rel(pa.grad, pb.grad)
        worst = max(worst, e)
        check(e < 2e-2, "fused norms: grad %s differs by %.3g" % (n, e))
    print("LlamaModel, norms across blocks fused vs not: loss %.6f vs %.6f, worst gradient difference %.2e"
          % (float(la), float(lb), worst))


def final_norm():
    """coda.nn._RMSNormFn (the norm's own backward) against autograd through
    the formula (rms_norm_torch): float64 to 1e-12, bf16 input within bf16's
    rounding of the f32 result; and it keeps fewer bytes for the backward.
    On a device, the coda.nn.RMSNorm module too: torch's fused kernels where
    rms_norm_fused says so (checked by its backward node), against the
    formula, with x at two scales (eps matters at the small one) and f32 or
    bf16 weights."""
    g64 = torch.Generator().manual_seed(7)
    M, d = 37, 48
    x = torch.randn(3, M, d, generator=g64, dtype=torch.float64) * 3
    w = 1 + 0.2 * torch.randn(d, generator=g64, dtype=torch.float64)
    dy = torch.randn(3, M, d, generator=g64, dtype=torch.float64)
    worst = 0.0
    for dt, tol in ((torch.float64, 1e-12), (torch.bfloat16, 1e-2)):
        outs = []
        for fn in (lambda a, b: coda.nn._RMSNormFn.apply(a, b, 1e-5), lambda a, b: coda.nn.rms_norm_torch(a, b, 1e-5)):
            a = x.to(dt).detach().clone().requires_grad_()
            b = w.to(dt).detach().clone().requires_grad_()
            y = fn(a, b)
            y.backward(dy.to(dt))
            outs.append((y.double(), a.grad.double(), b.grad.double()))
        for name, u, v in zip(("y", "dx", "dg"), outs[0], outs[1]):
            err = ((u - v).norm() / v.norm()).item()
            worst = max(worst, err) if dt == torch.float64 else worst
            check(err <= tol, "RMSNorm %s %s: relative error %.2e against the formula's autograd (tolerance %.0e)"
                  % (dt, name, err, tol))
    if DEVICE != "cpu":  # the module on the device: torch's fused kernels where rms_norm_fused says so
        # (x's dtype, g's dtype, tolerance): bf16 x with f32 g is a model's
        # f32 master weight, which the fused call takes rounded to bf16; x
        # at scale 1e-3 makes mean(x^2) ~ 1e-6 against eps 1e-5, so a wrong
        # eps shows
        for (dt, gt, tol), scale in itertools.product(((torch.float32, torch.float32, 1e-5),
                                                       (torch.bfloat16, torch.bfloat16, 1e-2),
                                                       (torch.bfloat16, torch.float32, 1e-2)), (1.0, 1e-3)):
            norm = coda.nn.RMSNorm(d, 1e-5, device=DEVICE, dtype=gt)
            with torch.no_grad():
                norm.weight.copy_(w.to(DEVICE, gt))
            outs, node = [], None
            for fn in (norm, lambda a: coda.nn.rms_norm_torch(a, norm.weight, 1e-5)):
                norm.weight.grad = None
                a = (x * scale).to(DEVICE, dt).detach().clone().requires_grad_()
                y = fn(a)
                node = node or type(y.grad_fn).__name__  # the module's output's node
                y.backward(dy.to(DEVICE, dt))
                outs.append((y.double(), a.grad.double(), norm.weight.grad.double()))
            fused = coda.nn.rms_norm_fused(a, norm.weight)
            what = "RMSNorm on %s, x %s at scale %g, g %s (%s)" % (DEVICE, dt, scale, gt, node)
            for name, u, v in zip(("y", "dx", "dg"), outs[0], outs[1]):
                err = ((u - v).norm() / v.norm()).item()
                check(err <= tol, "%s %s: relative error %.2e against the formula's autograd (tolerance %.0e)"
                      % (what, name, err, tol))
            # the fused path really ran torch's fused op (its backward node),
            # not a composite of elementwise kernels
            check(not fused or ("rmsnorm" in node.lower() and not node.startswith("_RMSNormFn")),
                  "%s: torch's fused RMSNorm was expected" % what)
            print("%s: %s" % (what, "torch's fused kernels" if fused else "_RMSNormFn"))
    check(torch.autograd.gradcheck(lambda a, b: coda.nn._RMSNormFn.apply(a, b, 1e-5),
                                   (x[:, :5].clone().requires_grad_(), w.clone().requires_grad_())),
          "RMSNorm: gradcheck")
    # second order (create_graph=True: a gradient penalty): the closed-form
    # backward holds rstd as a constant, so its own derivative was wrong (a
    # review: 80 off on a small case, silently)
    check(torch.autograd.gradgradcheck(lambda a, b: coda.nn._RMSNormFn.apply(a, b, 1e-5),
                                       (x[:, :5].clone().requires_grad_(), w.clone().requires_grad_()),
                                       raise_exception=False),
          "RMSNorm: gradgradcheck")
    check(torch.autograd.gradgradcheck(lambda a: coda.nn._RMSNormFn.apply(a, w, 1e-5),
                                       (x[:, :5].clone().requires_grad_(),), raise_exception=False),
          "RMSNorm: gradgradcheck, g not requiring grad")

    def saved_bytes(fn):
        seen = {}

        def pack(t):
            seen[t.data_ptr()] = max(seen.get(t.data_ptr(), 0), t.numel() * t.element_size())
            return t
        a = torch.randn(4, 64, 256, dtype=torch.bfloat16).requires_grad_()
        b = torch.ones(256, dtype=torch.bfloat16, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn(a, b)
        return sum(n for p, n in seen.items() if p not in (a.data_ptr(), b.data_ptr()))
    if hasattr(torch.autograd.graph, "saved_tensors_hooks"):
        mine = saved_bytes(lambda a, b: coda.nn._RMSNormFn.apply(a, b, 1e-5))
        formula = saved_bytes(lambda a, b: coda.nn.rms_norm_torch(a, b, 1e-5))
        check(mine < formula // 8, "RMSNorm saves %d bytes beside x and g for the backward, the formula %d"
              % (mine, formula))
        print("RMSNorm: float64 worst error %.1e; saved for the backward beside x and g: %d bytes (formula's "
              "autograd %d) at (256 rows, 256) bf16" % (worst, mine, formula))


def model_trains(cfg):
    torch.manual_seed(1)
    vocab, B, S = 97, 2, 16
    model = coda.nn.LlamaModel(cfg, 2, vocab, device=DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, vocab, (B, S + 1), device=DEVICE)
    losses = []
    for step in range(30):
        loss = model(tokens[:, :-1], tokens[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    check(losses[-1] < 0.5 * losses[0], "LlamaModel: loss %.3f -> %.3f in 30 steps on one batch" % (losses[0], losses[-1]))
    print("LlamaModel (2 blocks, vocab %d): loss %.3f -> %.3f in 30 AdamW steps on one batch" % (vocab, losses[0], losses[-1]))


def cuda_graph(cfg):
    """On CUDA: a block's forward and backward captured into one
    torch.cuda.CUDAGraph and replayed give eager's output and gradients
    (coda's calls copy nothing to the host and allocate from torch)."""
    if DEVICE != "cuda":
        print("CUDA graph capture: runs with CODA_TEST_DEVICE=cuda")
        return
    blk = coda.nn.LlamaBlock(cfg, device=DEVICE, dtype=torch.bfloat16)
    x = torch.randn(2, 8, cfg.d, device=DEVICE).bfloat16().requires_grad_(True)
    dy = torch.randn(2, 8, cfg.d, device=DEVICE).bfloat16()

    def step():
        y = blk(x)
        y.backward(dy)
        return y
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: blocks made, kernels compiled
        for _ in range(2):
            blk.zero_grad(set_to_none=False)
            x.grad = None
            want = step().detach().clone()
    torch.cuda.current_stream().wait_stream(side)
    want_g = {n: getattr(blk, n).grad.clone() for n in coda.nn._BLOCK_PARAMS}
    want_dx = x.grad.clone()
    g = torch.cuda.CUDAGraph()
    blk.zero_grad(set_to_none=False)
    x.grad.zero_()
    try:
        with torch.cuda.graph(g):
            y = step()
        for _ in range(2):
            blk.zero_grad(set_to_none=False)
            x.grad.zero_()
            g.replay()
        torch.cuda.synchronize()
        check(torch.equal(y, want), "CUDA graph: y differs from eager's")
        check(torch.equal(x.grad, want_dx), "CUDA graph: x.grad differs from eager's")
        for n in coda.nn._BLOCK_PARAMS:
            check(torch.equal(getattr(blk, n).grad, want_g[n]), "CUDA graph: grad %s differs from eager's" % n)
        print("CUDA graph (torch.cuda.graph) of a block's forward and backward: replayed, eager's bits")
    except Exception as e:
        check(False, "CUDA graph capture: %s: %s" % (type(e).__name__, str(e)[:300]))


def custom_ops(cfg):
    """opcheck (schema, fake, autograd registration) and torch.compile."""
    if not coda.ops.HAVE_CUSTOM_OPS:
        print("torch %s: no torch.library.custom_op; the ops are autograd.Functions (eager only)" % torch.__version__)
        return
    blk = coda.nn.LlamaBlock(cfg, device=DEVICE)
    m = 16
    x = torch.randn(m, cfg.d, device=DEVICE).bfloat16().requires_grad_(True)
    pos = torch.arange(8, device=DEVICE, dtype=torch.float32).repeat(2)
    p = {n: getattr(blk, n).detach().bfloat16().requires_grad_(True) for n in coda.nn._BLOCK_PARAMS}
    c = blk._cfg_list
    utils = ("test_schema", "test_faketensor", "test_autograd_registration")
    try:
        torch.library.opcheck(torch.ops.coda.block_pre.default,
                              (x, pos, p["g1"], p["wqkv"], None, None, c, cfg.eps, cfg.rope_theta), test_utils=utils)
        o = torch.randn(m, cfg.n_heads * cfg.head_dim, device=DEVICE).bfloat16().requires_grad_(True)
        args = (x, o, p["g2"], p["wo"], p["wgu"], p["wd"], None, c, cfg.eps, cfg.rope_theta, True)
        torch.library.opcheck(torch.ops.coda.block_post.default, args, test_utils=utils)
        with torch.no_grad():  # a forward that does not save z
            torch.library.opcheck(torch.ops.coda.block_post.default, args[:-1] + (False,),
                                  test_utils=("test_schema", "test_faketensor"))
        # the norm across blocks: post with g_next, pre with xg and r1
        g_next = p["g1"].detach().clone()
        y, h, r2, z, yg, rn = torch.ops.coda.block_post(x, o, p["g2"], p["wo"], p["wgu"], p["wd"], g_next, c,
                                                        cfg.eps, cfg.rope_theta, True)
        torch.library.opcheck(torch.ops.coda.block_post.default,
                              (x, o, p["g2"], p["wo"], p["wgu"], p["wd"], g_next, c, cfg.eps, cfg.rope_theta, True),
                              test_utils=utils)
        torch.library.opcheck(torch.ops.coda.block_pre.default,
                              (y.detach().requires_grad_(True), pos, p["g1"], p["wqkv"], yg, rn, c, cfg.eps,
                               cfg.rope_theta), test_utils=utils)
        check(True, "opcheck")
        print("torch.library.opcheck (schema, fake tensors, autograd registration): ok")
    except Exception as e:
        check(False, "opcheck: %s: %s" % (type(e).__name__, str(e)[:400]))
    # the fakes refuse what the real ops refuse (a review found an f32 x
    # traced to f32 outputs by the fakes, refused by the C call)
    from torch._subclasses.fake_tensor import FakeTensorMode
    xf, of = x.detach().float(), torch.randn(m, cfg.n_heads * cfg.head_dim, device=DEVICE)
    for name, op, args in (
            ("pre", torch.ops.coda.block_pre, (xf, pos, p["g1"], p["wqkv"], None, None, c, cfg.eps, cfg.rope_theta)),
            ("post x", torch.ops.coda.block_post, (xf, of.bfloat16(), p["g2"], p["wo"], p["wgu"], p["wd"], None, c,
                                                   cfg.eps, cfg.rope_theta, False)),
            ("post o", torch.ops.coda.block_post, (x.detach(), of, p["g2"], p["wo"], p["wgu"], p["wd"], None, c,
                                                   cfg.eps, cfg.rope_theta, False))):
        for mode in ("real", "fake"):
            try:
                if mode == "real":
                    op(*args)
                else:
                    with FakeTensorMode(allow_non_fake_inputs=True):
                        op(*args)
                check(False, "block_%s with an f32 tensor: the %s op accepted it" % (name, mode))
            except coda.Error as e:
                check(e.name == "CODA_ERR_DTYPE", "block_%s, %s op: %s" % (name, mode, e))
    try:
        xb = torch.randn(2, 8, cfg.d, device=DEVICE).bfloat16()
        eager = blk(xb)
        compiled = torch.compile(blk, fullgraph=True)
        y = compiled(xb)
        check(torch.equal(y, eager), "torch.compile: output differs from eager")
        y.float().sum().backward()
        check(all(getattr(blk, n).grad is not None for n in coda.nn._BLOCK_PARAMS), "torch.compile: no grads")
        print("torch.compile(fullgraph=True): forward equal to eager, backward ran")
    except Exception as e:
        check(False, "torch.compile: %s: %s" % (type(e).__name__, str(e)[:400]))


def split_grads(cfg):
    """The default attention takes q, k, v by coda.ops.split_qkv: their
    gradients reach block_pre's backward as three tensors
    (coda_block_backward_pre_split), with no cat, and every gradient has
    the bits of the concatenated form (the same attention on a copy of qkv,
    which split_qkv splits the plain way)."""
    blk = coda.nn.LlamaBlock(cfg, device=DEVICE)
    # M = 16 tokens: on CUDA coda.nn pads M to a multiple of 8 and then
    # passes qkv[:m], which split_qkv splits the plain way
    x0 = torch.randn(2, 8, cfg.d, device=DEVICE).bfloat16()
    dy = torch.randn(2, 8, cfg.d, device=DEVICE)
    seen = []
    inner = coda.ops._pre_bwd

    def spy(x, pos, r1, qkv, dqkv, *a, **kw):
        seen.append(isinstance(dqkv, tuple))
        return inner(x, pos, r1, qkv, dqkv, *a, **kw)

    def run(attention):
        blk.attention = attention
        blk.zero_grad()
        x = x0.clone().requires_grad_(True)
        (blk(x).float() * dy).sum().backward()
        return {n: getattr(blk, n).grad.clone() for n in coda.nn._BLOCK_PARAMS}, x.grad.clone()

    coda.ops._pre_bwd = spy
    try:
        g_split, dx_split = run(coda.nn.causal_attention)
        g_cat, dx_cat = run(lambda qkv, *shape: coda.nn.causal_attention(qkv * 1, *shape))
    finally:
        coda.ops._pre_bwd = inner
        blk.attention = coda.nn.causal_attention
    check(seen == [True, False], "split_qkv: block_pre's backward got parts %s (want [True, False])" % seen)
    for n in coda.nn._BLOCK_PARAMS:
        check(torch.equal(g_split[n], g_cat[n]), "split_qkv: grad %s differs from the concatenated form's" % n)
    check(torch.equal(dx_split, dx_cat), "split_qkv: x.grad differs from the concatenated form's")
    # a second split of the same qkv is a plain one (the Link takes one);
    # both gradients, the Link's parts and autograd's dqkv, are added
    nq, nkv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    pos = torch.arange(16, device=DEVICE).float()

    def x_grad(plain):
        x = x0.reshape(-1, cfg.d).clone().requires_grad_(True)
        qkv = coda.ops.pre(x, pos, blk.g1.bfloat16(), blk.wqkv.bfloat16(), blk._cfg_list, blk._eps, blk._theta,
                           link=coda.ops.Link())
        a = coda.ops.split_qkv(qkv * 1 if plain else qkv, nq, nkv)
        b = coda.ops.split_qkv(qkv * 1 if plain else qkv, nq, nkv)
        nodes = (type(a[0].grad_fn).__name__, type(b[0].grad_fn).__name__)
        (a[0].float().sum() + (b[1].float() ** 2).sum() + 3 * a[2].float().sum()).backward()
        return x.grad, nodes

    (g_mix, nodes), (g_plain, _) = x_grad(False), x_grad(True)
    check(nodes[0] == "_SplitBackward" and nodes[1] != "_SplitBackward",
          "split_qkv: first and second split's nodes %s" % (nodes,))
    check(not torch.equal(g_mix, torch.zeros_like(g_mix)), "split_qkv: x.grad is all zeros")
    # a gradient taken at qkv runs _Split's backward but not block_pre's:
    # the parts it left must not reach the next backward through the same
    # graph, here one that reaches block_pre through another consumer of
    # qkv (and not through _Split, which would overwrite them)
    def stale(keep_callback):
        x = x0.reshape(-1, cfg.d).clone().requires_grad_(True)
        qkv = coda.ops.pre(x, pos, blk.g1.bfloat16(), blk.wqkv.bfloat16(), blk._cfg_list, blk._eps, blk._theta,
                           link=coda.ops.Link())
        q, k, v = coda.ops.split_qkv(qkv, nq, nkv)
        loss = (q * 2).float().sum() + 3 * v.float().sum()
        other = (qkv.float() ** 2).sum()  # qkv's second consumer: autograd's dqkv
        end = coda.ops._at_end_of_pass
        if not keep_callback:
            coda.ops._at_end_of_pass = lambda link: None
        try:
            gq = torch.autograd.grad(loss, [qkv], retain_graph=True, allow_unused=True)[0]
        finally:
            coda.ops._at_end_of_pass = end
        left = qkv.grad_fn.link.dparts is not None
        other.backward()
        return gq, left, x.grad.clone()

    gq, left, g_other = stale(True)
    check(gq is None and not left, "split_qkv: gradient at qkv %s, parts left on the Link %s" % (gq, left))
    x2 = x0.reshape(-1, cfg.d).clone().requires_grad_(True)
    qkv2 = coda.ops.pre(x2, pos, blk.g1.bfloat16(), blk.wqkv.bfloat16(), blk._cfg_list, blk._eps, blk._theta,
                        link=coda.ops.Link())
    (qkv2.float() ** 2).sum().backward()
    check(torch.equal(g_other, x2.grad), "split_qkv: x.grad after a stopped-short backward differs")
    check(not torch.equal(stale(False)[2], x2.grad), "split_qkv: the stale-parts check cannot fail")
    # a hook on qkv wants its gradient from autograd: the plain split
    x4 = x0.reshape(-1, cfg.d).clone().requires_grad_(True)
    qkv4 = coda.ops.pre(x4, pos, blk.g1.bfloat16(), blk.wqkv.bfloat16(), blk._cfg_list, blk._eps, blk._theta,
                        link=coda.ops.Link())
    seen_hook = []
    qkv4.register_hook(lambda g: seen_hook.append(tuple(g.shape)))
    q4 = coda.ops.split_qkv(qkv4, nq, nkv)[0]
    q4.float().sum().backward()
    check(type(q4.grad_fn).__name__ != "_SplitBackward" and seen_hook == [tuple(qkv4.shape)],
          "split_qkv with a hook on qkv: node %s, hook saw %s" % (type(q4.grad_fn).__name__, seen_hook))
    # a broadcast gradient (row stride 0, from a sum over rows) is copied
    # before coda reads it: the x.grad of a contiguous one
    xs = []
    for copy in (False, True):
        x3 = x0.reshape(-1, cfg.d).clone().requires_grad_(True)
        qkv3 = coda.ops.pre(x3, pos, blk.g1.bfloat16(), blk.wqkv.bfloat16(), blk._cfg_list, blk._eps, blk._theta)
        (qkv3 * 1 if copy else qkv3).sum(0).float().sum().backward()
        xs.append(x3.grad)
    check(torch.equal(xs[0], xs[1]), "a broadcast dqkv: another x.grad than a contiguous one")
    # shapes are checked where the split is made
    try:
        coda.ops.split_qkv(qkv2, nq, nkv + 2)
        check(False, "split_qkv with the wrong widths did not raise")
    except ValueError as e:
        check("nq + 2 nkv" in str(e), "split_qkv with the wrong widths: %s" % e)
    check(torch.equal(g_mix, g_plain), "split_qkv: parts + dqkv give another x.grad than dqkv alone")
    b = coda.ops.blocks(tuple(blk._cfg_list), blk._eps, blk._theta, torch.device(DEVICE))
    for parts in ((), (g_mix,) * 2, (g_mix,) * 4):
        try:
            b.backward_pre({}, g_mix, None, None, None, parts, None)
            check(False, "Block.backward_pre with %d parts did not raise" % len(parts))
        except ValueError as e:
            check("(dq, dk, dv)" in str(e), "Block.backward_pre with %d parts: %s" % (len(parts), e))
    print("split_qkv: dq, dk, dv to block_pre's backward as they are, same bits as the cat: ok")


def no_qkv_path(cfg):
    """An attention whose output does not depend on qkv through autograd
    (zeros, a detached qkv): block_pre's backward never runs, so
    block_post's gradient of x must reach x through autograd, not the Link
    (a review found x.grad None, and in a model every earlier parameter's
    gradient lost). Against the same math with a path to qkv (qkv * 0)."""
    blk = coda.nn.LlamaBlock(cfg, device=DEVICE)
    x0 = torch.randn(2, 8, cfg.d, device=DEVICE).bfloat16()
    dy = torch.randn(2, 8, cfg.d, device=DEVICE)
    nq = cfg.n_heads * cfg.head_dim

    def run(attention):
        blk.attention = attention
        blk.zero_grad()
        x = x0.clone().requires_grad_(True)
        (blk(x).float() * dy).sum().backward()
        return x.grad

    try:
        via = run(lambda qkv, *shape: qkv[:, :nq] * 0)
        cut = run(lambda qkv, b, s, h, kv, hd: torch.zeros(b * s, h * hd, dtype=qkv.dtype, device=qkv.device))
    finally:
        blk.attention = coda.nn.causal_attention
    check(cut is not None and torch.equal(cut, via),
          "an attention without a path to qkv: x.grad %s, want that of qkv * 0" % (None if cut is None else "differs"))
    check(not torch.equal(via, torch.zeros_like(via)), "no_qkv_path: x.grad is all zeros: it tests nothing")


def main():
    cfg = coda.LlamaConfig(64, 4, 2, 16, 160, vocab=0)
    case("gqa, bf16 params", cfg, 2, 13, torch.bfloat16)
    case("gqa, f32 master params", cfg, 2, 13, torch.float32)
    case("mqa", coda.LlamaConfig(48, 2, 1, 24, 96, vocab=0), 3, 8, torch.float32)
    loading(cfg)
    model_loading(cfg)
    in_flight(cfg)
    inference_then_training(cfg)
    second_order()
    split_grads(cfg)
    no_qkv_path(cfg)
    fused_norms(cfg)
    final_norm()
    z_memory(cfg)
    kept_c(cfg)
    model_trains(cfg)
    cuda_graph(cfg)
    custom_ops(cfg)
    return report("test_block_torch.py", "\n")


if __name__ == "__main__":
    sys.exit(main())
