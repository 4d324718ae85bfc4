"""coda.nn - coda's LLaMA layer inside PyTorch autograd.

    import coda, coda.nn
    ctx = coda.Context()
    cfg = coda.LlamaConfig(d=256, n_heads=8, n_kv_heads=4, head_dim=32, ffn=688, vocab=1000)
    layer = coda.nn.LlamaLayer.from_torch(ctx, cfg, batch, seq, W, device="cuda")
    y, loss = layer(x, targets, loss_scale=1.0 / n_valid)   # loss: 0-dim f32
    (loss + (y.float() * dy).sum()).backward()              # fills x.grad, layer params' .grad

The parameters are held in coda's layout (`wqkv` with the RoPE pairs made
adjacent, `wgu` with gate and up rows interleaved; include/coda.h section 8),
as bf16 `torch.nn.Parameter`s; `from_torch` converts PyTorch-layout weights
and `grads_torch_layout()` converts the gradients back. The constructor takes
only the coda.PackedWeights of coda.pack_weights: a dict of PyTorch-layout
weights has the same shapes and would give wrong results.

One forward per backward: the layer keeps the activations of its last
forward inside the C handle, so a backward after a second forward on the same
layer raises instead of returning wrong gradients.

For training models: LlamaBlock (the split block of coda.ops around any
attention), RMSNorm, LMHeadLoss (the LM head and the cross-entropy loss,
forward and backward in one coda_lm_loss call, chunked so that the (M, V)
logits never exist at once; coda.ops.lm_loss) and LlamaModel, which chains
them.
"""
import torch

import coda

_ORDER = ("g1", "wqkv", "wo", "g2", "wgu", "wd", "gf", "wlm")


class _LlamaFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, layer, names, targets, loss_scale, x, *params):
        w = coda.PackedWeights(zip(names, params), layer.cfg)  # the parameters are in coda's layout
        y, loss = layer._llama.forward(w, x.to(torch.bfloat16).contiguous(), targets)
        layer._forwards += 1
        ctx.layer, ctx.names, ctx.forward_id = layer, names, layer._forwards
        ctx.loss_scale, ctx.has_loss, ctx.x_dtype = loss_scale, loss is not None, x.dtype
        ctx.save_for_backward(*params)
        if loss is None:
            total = torch.zeros((), dtype=torch.float32, device=y.device)
            ctx.mark_non_differentiable(total)
        else:
            total = loss.sum() * loss_scale
        return y, total

    @staticmethod
    @torch.autograd.function.once_differentiable  # the C call's gradients are constants to autograd
    def backward(ctx, dy, dtotal):
        layer = ctx.layer
        if layer._forwards != ctx.forward_id:
            raise RuntimeError("coda.nn: this backward needs the activations of its own forward, "
                               "but a later forward on the same LlamaLayer replaced them")
        params = ctx.saved_tensors
        w = coda.PackedWeights(zip(ctx.names, params), layer.cfg)
        scale = float(dtotal) * ctx.loss_scale if ctx.has_loss and dtotal is not None else 0.0
        dyb = None if dy is None else dy.to(torch.bfloat16).contiguous()
        dx, g = layer._llama.backward(w, dy=dyb, loss_scale=scale)
        grads = tuple(g[n].to(p.dtype) for n, p in zip(ctx.names, params))
        return (None, None, None, None, dx.to(ctx.x_dtype)) + grads


class LlamaLayer(torch.nn.Module):
    """One LLaMA layer (+ final norm, LM head and cross-entropy if cfg.vocab > 0)
    run by coda. forward(x (M, d), targets (M) int or None, loss_scale) ->
    (y (M, d) bf16, loss_scale * sum of per-token losses, 0-dim f32).
    weights: the coda.PackedWeights of coda.pack_weights (or use from_torch)."""

    def __init__(self, ctx, cfg, batch, seq, weights, device="cpu"):
        super().__init__()
        self._llama = coda.Llama(ctx, cfg, batch, seq, device=device)
        # the layer's own copy of cfg (later changes to the caller's do not reach C)
        self.ctx, self.cfg, self.batch, self.seq = ctx, self._llama.cfg, batch, seq
        # refuses anything but PackedWeights for this cfg, of the right shapes
        # and dtype, wherever they are (they are moved to the layer's device)
        coda._check_packed(weights, self.cfg, None, "weights")
        self._forwards = 0
        self._names = tuple(n for n in _ORDER if n in weights)
        for n in self._names:
            t = weights[n].detach().to(self._llama.device, torch.bfloat16).contiguous()
            self.register_parameter(n, torch.nn.Parameter(t))

    @classmethod
    def from_torch(cls, ctx, cfg, batch, seq, W, device="cpu"):
        """W: PyTorch-layout weights (wq, wk, wv, wo, w_gate, w_up, w_down, g1, g2[, gf, wlm])."""
        w = coda.pack_weights(cfg, W["wq"], W["wk"], W["wv"], W["wo"], W["w_gate"], W["w_up"],
                              W["w_down"], W["g1"], W["g2"], W.get("gf"), W.get("wlm"),
                              device=device)
        return cls(ctx, cfg, batch, seq, w, device=device)

    def forward(self, x, targets=None, loss_scale=1.0):
        params = tuple(getattr(self, n) for n in self._names)
        loss_scale = coda._float(loss_scale, "loss_scale")  # a number, not a tensor or a str
        return _LlamaFunction.apply(self, self._names, targets, loss_scale, x, *params)

    def grads_torch_layout(self):
        """The parameters' gradients in PyTorch's layout (dict, CPU)."""
        g = {n: getattr(self, n).grad for n in self._names}
        if any(v is None for v in g.values()):
            raise RuntimeError("coda.nn: no gradients yet (call backward first)")
        return coda.unpack_grads(self.cfg, g)


# ---------------------------------------------------------------------------
# The block split at attention (coda.ops): a module for training models
# ---------------------------------------------------------------------------

import math

import coda.attention_ops as _attn_ops
import coda.ops as _ops

_BLOCK_PARAMS = ("g1", "wqkv", "wo", "g2", "wgu", "wd")


def _torch_at_least(major, minor):
    try:
        v = torch.__version__.split("+")[0].split(".")
        return (int(v[0]), int(v[1])) >= (major, minor)
    except (ValueError, IndexError):
        return False


# scaled_dot_product_attention takes enable_gqa (n_heads a multiple of
# n_kv_heads, k and v heads shared by consecutive query heads, as
# repeat_interleave would lay them out) from torch 2.5
_SDPA_GQA = _torch_at_least(2, 5)


def causal_attention(qkv, batch, seq, n_heads, n_kv_heads, head_dim):
    """The default attention of LlamaBlock: causal grouped-query attention
    over qkv (M, nqkv) bf16 as coda's QKV epilogue leaves it (q and k
    columns permuted within each head, the same way, so q.k is unchanged),
    -> o (M, nq). torch's scaled_dot_product_attention where there is one
    (torch >= 2.0; from 2.5 with enable_gqa, so k and v are read as they
    are, not copied once per query head), else the same in plain torch ops."""
    nq, nkv = n_heads * head_dim, n_kv_heads * head_dim
    q, k, v = _ops.split_qkv(qkv, nq, nkv)  # qkv.split, with no cat of the gradients after
    q = q.reshape(batch, seq, n_heads, head_dim).transpose(1, 2)
    k = k.reshape(batch, seq, n_kv_heads, head_dim).transpose(1, 2)
    v = v.reshape(batch, seq, n_kv_heads, head_dim).transpose(1, 2)
    sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
    gqa = n_kv_heads != n_heads and sdpa is not None and _SDPA_GQA
    if n_kv_heads != n_heads and not gqa:
        rep = n_heads // n_kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    if sdpa is not None:
        o = sdpa(q, k, v, is_causal=True, enable_gqa=True) if gqa else sdpa(q, k, v, is_causal=True)
    else:
        s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(head_dim)
        mask = torch.ones(seq, seq, dtype=torch.bool, device=qkv.device).triu(1)
        o = (s.masked_fill(mask, float("-inf")).softmax(-1) @ v.float()).to(qkv.dtype)
    return o.transpose(1, 2).reshape(batch * seq, nq)


def coda_attention(qkv, batch, seq, n_heads, n_kv_heads, head_dim):
    """causal_attention's contract, computed by coda (coda.h section 11,
    through the coda::attention operator of coda.attention_ops): causal
    grouped-query attention over qkv (M, nqkv) bf16 in the block's layout
    -> o (M, nq) bf16; differentiable in qkv. On the CPU coda's f32 oracle
    (any even head_dim); on CUDA coda's kernels (head_dim 64 or 128, else
    coda.Error CODA_ERR_UNSUPPORTED). LlamaBlock(attention="coda")."""
    return _attn_ops.attention(qkv, batch, seq, n_heads, n_kv_heads, head_dim)[0]


ATTENTIONS = {"sdpa": causal_attention, "coda": coda_attention}


def _attention(attention):
    """LlamaBlock's attention argument as a function: None or "sdpa" ->
    causal_attention (torch SDPA), "coda" -> coda_attention, a callable as
    it is; anything else -> ValueError / TypeError."""
    if attention is None:
        return causal_attention
    if isinstance(attention, str):
        if attention not in ATTENTIONS:
            raise ValueError("coda.nn: attention=%r: a function, or one of %s" % (attention, sorted(ATTENTIONS)))
        return ATTENTIONS[attention]
    if not callable(attention):
        raise TypeError("coda.nn: attention must be None, a name (%s) or a function (qkv, batch, seq, n_heads, "
                        "n_kv_heads, head_dim) -> o, got %s" % (sorted(ATTENTIONS), type(attention).__name__))
    return attention


class LlamaBlock(torch.nn.Module):
    """One pre-norm LLaMA block (attention + SwiGLU FFN), run by coda around
    an attention: attention=None or "sdpa" (causal_attention, torch's SDPA:
    the default), "coda" (coda_attention, coda's own kernels) or any
    function (qkv, batch, seq, n_heads, n_kv_heads, head_dim) -> o.

        blk = coda.nn.LlamaBlock(cfg)                 # random init, or
        blk = coda.nn.LlamaBlock.from_state_dict(cfg, sd, "model.layers.0.")
        y = blk(x)                                    # x (batch, seq, d) -> y, same shape

    Parameters are in coda's layout (wqkv with the RoPE pairs adjacent, wgu
    with gate and up rows interleaved), of the dtype asked for (float32
    master weights train with bf16 compute: they are cast to bf16 for each
    call, and autograd casts the gradients back). cfg.vocab is ignored.
    Works with torch.compile, CUDA graphs and activation checkpointing where
    torch has custom operators (>= 2.4; coda.ops). Any number of forwards
    may be in flight: activations live in autograd's saved tensors."""

    def __init__(self, cfg, device="cpu", dtype=torch.float32, attention=None):
        super().__init__()
        self.cfg = coda._config_copy(cfg)
        self._cfg_list = [self.cfg.d, self.cfg.n_heads, self.cfg.n_kv_heads, self.cfg.head_dim, self.cfg.ffn]
        # plain Python numbers for forward (torch.compile does not trace ctypes fields)
        self._eps, self._theta = float(self.cfg.eps), float(self.cfg.rope_theta)
        self.attention = _attention(attention)
        # True: the forward keeps c = silu(gate) * up for the backward
        # (coda.ops.post's keep_c): (M, I) bf16 more per block in flight
        # for an (M, I) store fewer in its backward. Eager path only.
        self.keep_c = False
        shapes = coda._weight_shapes(self.cfg)
        for n in _BLOCK_PARAMS:
            shape = shapes[n]
            t = torch.ones(shape) if len(shape) == 1 else torch.randn(shape) / math.sqrt(shape[1])
            self.register_parameter(n, torch.nn.Parameter(t.to(device=device, dtype=dtype)))

    @classmethod
    def from_state_dict(cls, cfg, sd, prefix="", device="cpu", dtype=torch.float32, attention=None):
        """From a LLaMA-style (Hugging Face) state dict: prefix +
        input_layernorm.weight, self_attn.{q,k,v,o}_proj.weight,
        post_attention_layernorm.weight, mlp.{gate,up,down}_proj.weight.
        The weights keep their precision up to `dtype` (an f32 checkpoint
        gives f32 masters exactly); cfg.vocab is not used. Any other key
        under prefix (a bias: this block has none) is a ValueError, as is
        a missing one. RoPE's self_attn.rotary_emb.inv_freq buffer (older
        checkpoints have it) is not loaded: cfg's rope_theta makes the
        frequencies, and a buffer that disagrees with them (another theta,
        a rope_scaling) is a ValueError."""
        _check_block_keys(sd, prefix)
        _check_inv_freq(cfg, sd, prefix)
        g = lambda n: sd[prefix + n].detach().to("cpu", dtype)
        keys = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                "mlp.gate_proj.weight", "mlp.up_proj.weight")
        w = coda_layout(cfg, *(g(k) for k in keys), names=tuple(prefix + k for k in keys))
        w.update(g1=g("input_layernorm.weight"), wo=g("self_attn.o_proj.weight"),
                 g2=g("post_attention_layernorm.weight"), wd=g("mlp.down_proj.weight"))
        shapes = coda._weight_shapes(coda._config_copy(cfg))
        for n in _BLOCK_PARAMS:
            if tuple(w[n].shape) != shapes[n]:
                raise ValueError("coda: from_state_dict: %s has shape %s, cfg needs %s"
                                 % (n, tuple(w[n].shape), shapes[n]))
        blk = cls(cfg, device=device, dtype=dtype, attention=attention)
        with torch.no_grad():
            for n in _BLOCK_PARAMS:
                getattr(blk, n).copy_(w[n])
        return blk

    def forward(self, x):
        if x.dim() != 3:
            raise ValueError("coda: LlamaBlock: x must be (batch, seq, d), got shape %s" % (tuple(x.shape),))
        batch, seq, d = x.shape
        xf, pos, m = _tokens(x)
        y = self.run(xf, pos, batch, seq, m)[0]
        return _real_rows(y, m).reshape(batch, seq, d)

    def run(self, xf, pos, batch, seq, m, xg=None, r1=None, g_next=None):
        """The block on tokens already flattened (and padded: xf (M', d)
        bf16, pos (M') f32, the first m rows real) -> (y, y_g, r_next);
        with g_next (the next block's g1) the down projection's epilogue
        also gives the next block's xg and r1 (else None, None); with xg and
        r1 from the block before, the norm prologue is skipped."""
        _, n_heads, n_kv_heads, head_dim, _ = self._cfg_list
        p = {n: getattr(self, n).to(torch.bfloat16) for n in _BLOCK_PARAMS}
        # one Link per call: post's backward hands its x-gradient to pre's
        # (eager), so that no zero tensor and no add are made for it
        link = _ops.Link()
        qkv = _ops.pre(xf, pos, p["g1"], p["wqkv"], self._cfg_list, self._eps, self._theta, xg=xg, r1=r1,
                       link=link)
        pad = xf.shape[0] - m
        o = self.attention(qkv[:m] if pad else qkv, batch, seq, n_heads, n_kv_heads, head_dim)
        if pad:
            o = torch.nn.functional.pad(o, (0, 0, 0, pad))
        out = _ops.post(xf, o.contiguous(), p["g2"], p["wo"], p["wgu"], p["wd"], self._cfg_list, self._eps,
                        self._theta, g_next=g_next, link=link, keep_c=getattr(self, "keep_c", False))
        return out if g_next is not None else (out, None, None)


def coda_layout(cfg, wq, wk, wv, w_gate, w_up, names=("wq", "wk", "wv", "w_gate", "w_up")):
    """PyTorch's wq (nq, d), wk, wv (nkv, d), w_gate, w_up (ffn, d) -> coda's
    {"wqkv": (nq + 2 nkv, d), "wgu": (2 ffn, d)} in the same dtype (coda.h
    section 8: in each q and k head, rows i and i + head_dim/2 move to 2i
    and 2i+1; gate row j to 2j, up row j to 2j+1). The same permutation as
    coda.pack_weights, done by torch indexing, so any dtype keeps its bits.
    A weight of another shape than cfg's is a ValueError naming it (names:
    how to call the five in the message)."""
    hd = cfg.head_dim
    nq, nkv = cfg.n_heads * hd, cfg.n_kv_heads * hd
    for t, name, rows in zip((wq, wk, wv, w_gate, w_up), names, (nq, nkv, nkv, cfg.ffn, cfg.ffn)):
        if t.dim() != 2 or tuple(t.shape) != (rows, cfg.d):
            raise ValueError("coda: %s has shape %s, cfg needs (%d, %d)" % (name, tuple(t.shape), rows, cfg.d))
    perm = torch.tensor([j for i in range(hd // 2) for j in (i, i + hd // 2)], device=wq.device)

    def heads(w, n):
        return w.reshape(n, hd, w.shape[-1])[:, perm, :].reshape(n * hd, w.shape[-1])
    wqkv = torch.cat((heads(wq, cfg.n_heads), heads(wk, cfg.n_kv_heads), wv))
    wgu = torch.stack((w_gate, w_up), 1).reshape(2 * w_gate.shape[0], w_gate.shape[1])
    return {"wqkv": wqkv.contiguous(), "wgu": wgu.contiguous()}


def _real_rows(t, m):
    """t's first m rows; t itself when it has no padding rows (a slice,
    even a whole one, costs its backward a zero tensor and a copy)."""
    return t if t.shape[0] == m else t[:m]


def _tokens(x):
    """x (batch, seq, d) -> (xf (M', d) bf16, pos (M') f32, M): the tokens
    in rows, each one's position; on CUDA zero rows pad M to a multiple of 8
    (the weight gradients contract over tokens), which add nothing to any
    gradient (x = 0 gives qkv = 0, o = 0, y = 0)."""
    batch, seq, d = x.shape
    m = batch * seq
    xf = x.reshape(m, d).to(torch.bfloat16)
    pad = (-m) % 8 if x.is_cuda else 0
    if pad:
        xf = torch.nn.functional.pad(xf, (0, 0, 0, pad))
    return xf, _positions(batch, seq, pad, x), m


_pos_cache = {}  # (batch, seq, pad, device) -> pos, for eager calls


def _positions(batch, seq, pad, x):
    """(batch * seq + pad) f32: each token's position, the padding rows 0.
    Made once per shape and device for eager calls (two launches and about
    0.2 ms of host time before the block's first kernel otherwise; nothing
    writes it: the ops only read and save it); made afresh where something
    traces (torch.compile) or a CUDA graph is captured, so no global tensor
    enters a graph, and under inference_mode (an inference tensor cached
    there could not be saved for a later training call's backward)."""
    def make():
        pos = torch.arange(seq, device=x.device, dtype=torch.float32).repeat(batch)
        return torch.nn.functional.pad(pos, (0, pad)) if pad else pos
    if not _ops._value_readable(x):  # first: tracing cannot ask for inference mode
        return make()
    if getattr(torch, "is_inference_mode_enabled", lambda: False)():
        return make()
    key = (batch, seq, pad, x.device)
    pos = _pos_cache.get(key)
    if pos is None:
        if len(_pos_cache) >= 16:
            _pos_cache.clear()
        pos = _pos_cache[key] = make()
    return pos


def _norm_dtype(x):
    return torch.promote_types(x.dtype, torch.float32)  # f32, or f64 for f64 inputs


def rms_norm_torch(x, g, eps):
    """x * rsqrt(mean(x^2) + eps) * g over the last dimension, in f32 (f64
    for f64 x), out in x's dtype: the formula as autograd would
    differentiate it (RMSNorm's reference in the tests)."""
    t = _norm_dtype(x)
    xf = x.to(t)
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * g.to(t)).to(x.dtype)


class _RMSNormFn(torch.autograd.Function):
    """rms_norm_torch with its own backward, which saves x, g and the rows'
    rstd (M f32) instead of the three (M, d) f32 tensors autograd keeps for
    the formula (tests/test_block_torch.py counts them): 12 d bytes a row
    less alive until the backward, and fewer kernels each way. The backward, in f32 (f64):
    xh = x rstd, dxh = dy g, dg = sum over rows of dy xh,
    dx = rstd (dxh - xh mean(dxh xh))."""

    @staticmethod
    def forward(ctx, x, g, eps):
        t = _norm_dtype(x)
        xf = x.to(t)
        r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, g, r)
        ctx.eps = eps
        return (xf * r * g.to(t)).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, g, r = ctx.saved_tensors
        if torch.is_grad_enabled():
            # create_graph=True: the closed form below holds r as a constant,
            # so its own derivatives would be wrong; differentiate the formula
            ins = [t for t, need in zip((x, g), ctx.needs_input_grad[:2]) if need]
            with torch.enable_grad():
                y = rms_norm_torch(x, g, ctx.eps)
            got = iter(torch.autograd.grad(y, ins, dy, create_graph=True))
            return tuple(next(got) if need else None for need in ctx.needs_input_grad[:2]) + (None,)
        xh = x.to(r.dtype) * r
        dyf = dy.to(r.dtype)
        dxh = dyf * g.to(r.dtype)
        dx = dg = None
        if ctx.needs_input_grad[0]:
            dx = (r * (dxh - xh * (dxh * xh).mean(-1, keepdim=True))).to(x.dtype)
        if ctx.needs_input_grad[1]:
            dg = (dyf * xh).reshape(-1, xh.shape[-1]).sum(0).to(g.dtype)
        return dx, dg, None


# torch's fused RMSNorm (aten::_fused_rms_norm, torch >= 2.8): on CUDA one
# kernel forward and two backward, x and the rows' rstd saved. _RMSNormFn
# runs each of its formulas' steps as a torch kernel: with it the small
# elementwise and reduction kernels of a LLaMA-3-1B model step (16384 x 2048
# tokens, H100) came to 1.9 ms, torch.compile's fused norm to 0.13 ms, and
# the fused kernels took 0.2 (bench_model.py --profile, stop 45).
# (torch 2.7 has the op for Apple GPUs only: its CUDA rms_norm is the
# unfused composite, which keeps f32 (M, d) tensors for the backward)
_FUSED_RMS_NORM = (_torch_at_least(2, 8) and hasattr(torch.nn.functional, "rms_norm")
                   and hasattr(torch.ops.aten, "_fused_rms_norm"))


def rms_norm_fused(x, g):
    """Whether RMSNorm(x) with weight g runs torch's fused kernels: x on
    CUDA, x and g bf16 or f32, a torch that has them. g goes in as x's dtype:
    f32 masters with bf16 x are rounded to bf16 for the call, as LlamaBlock
    rounds its norms' weights (bf16 compute); the gradient comes back in
    g's dtype."""
    ok = (torch.bfloat16, torch.float32)
    return _FUSED_RMS_NORM and x.is_cuda and x.dtype in ok and g.dtype in ok


class RMSNorm(torch.nn.Module):
    """The final norm: x * rsqrt(mean(x^2) + eps) * g, in f32 (f64 for f64
    x), out in x's dtype (rms_norm_torch). On CUDA, where torch has a fused
    RMSNorm, torch's with g in x's dtype (rms_norm_fused); else through
    _RMSNormFn's backward, with g as it is."""

    def __init__(self, d, eps=1e-5, device="cpu", dtype=torch.float32):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(d, device=device, dtype=dtype))

    def forward(self, x):
        if rms_norm_fused(x, self.weight):
            return torch.nn.functional.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)
        return _RMSNormFn.apply(x, self.weight, self.eps)


def lm_loss_torch(x, w, targets, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None, reduction="mean"):
    """coda_lm_loss's formula in plain PyTorch, unfused: logits = x w^T in
    bf16 (the (M, V) matrix in memory), softcap and the softmax in f32,
    torch's cross_entropy (its label smoothing), plus z_loss lse^2 on the
    rows not ignored; "mean" divides by their number (all ignored: NaN).
    -> (loss 0-dim f32, per-token losses (M) f32). LMHeadLoss's fallback,
    and the eager peer of bench/bench_lm_loss.py."""
    if reduction not in _ops.LM_REDUCTIONS:
        raise ValueError("coda.nn.lm_loss_torch: reduction must be 'mean' or 'sum', got %r" % (reduction,))
    t = targets.reshape(-1)
    z = torch.nn.functional.linear(x.reshape(-1, x.shape[-1]).to(torch.bfloat16), w.to(torch.bfloat16)).float()
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    per = torch.nn.functional.cross_entropy(z, t, ignore_index=ignore_index, label_smoothing=label_smoothing,
                                            reduction="none")
    keep = t != ignore_index
    if z_loss:
        # where, not * keep: an all-ignored mean divides by 0 below, and
        # inf * 0 would make the ignored rows' gradients NaN (a review)
        per = per + z_loss * torch.where(keep, torch.logsumexp(z, -1).pow(2), torch.zeros_like(per))
    total = per.sum()
    return (total / keep.sum() if reduction == "mean" else total), per.detach()


class LMHeadLoss(torch.nn.Module):
    """The LM head and the cross-entropy loss as one module, run by
    coda_lm_loss (coda.h section 10, through the coda::lm_loss operator of
    coda.ops): logits = x W^T (bf16 GEMM), softcapped if asked, the
    cross-entropy of the rows whose target is not ignore_index, with label
    smoothing and z-loss, their mean or sum. The loss and both gradients
    come from one call, the rows in chunks, so the (M, V) logits never
    exist at once; the backward only scales the gradients.

        head = coda.nn.LMHeadLoss(d, vocab)          # weight (vocab, d) in `dtype`
        loss = head(x, targets)                      # x (..., d), targets (...) -> 0-dim f32
        loss, per_token = head(x, targets, return_per_token=True)

    Options: ignore_index (-100); label_smoothing (0, as torch's
    cross_entropy); z_loss (0: the weight of lse^2 added to each row's
    loss); softcap (None; c: logits = c tanh(z / c), Gemma-2's); reduction
    "mean" (over the rows not ignored; all ignored: NaN, as torch) or "sum"
    ("none" raises ValueError: the gradients are made in the forward call
    with one scale, and a per-token gradient weight has no place there; the
    per-token losses come back with return_per_token=True, not
    differentiable); chunk_rows (None: the library's choice, a chunk's bf16
    logits at most max(1 GiB, 2x w's bytes); fewer rows, less memory, more time); accum_dtype
    (None: the weight's dtype, so f32 master weights get their gradient
    summed over the chunks in f32; torch.float32 does that for bf16 weights
    too, then rounds once to bf16; torch.bfloat16 rounds after each chunk).

    x of any float dtype is rounded to bf16 for the GEMMs (x.grad is in
    x's dtype); a target outside [0, vocab) other than ignore_index gives
    NaN loss and gradients, not an error.

    Fallback: where coda cannot take the call (a device other than cpu and
    cuda; on CUDA, d not a multiple of 8) the module computes the same
    formula in plain PyTorch (lm_loss_torch: bf16 logits, f32 softmax,
    unfused, the whole (M, V) logits in memory) when fallback=True (the
    default), and raises ValueError when fallback=False."""

    def __init__(self, d, vocab, ignore_index=-100, device="cpu", dtype=torch.float32, label_smoothing=0.0,
                 z_loss=0.0, softcap=None, reduction="mean", chunk_rows=None, accum_dtype=None, fallback=True):
        super().__init__()
        if reduction not in _ops.LM_REDUCTIONS:
            raise ValueError(_ops._LM_NONE % (reduction,))
        if accum_dtype not in (None, torch.float32, torch.bfloat16):
            raise ValueError("coda.nn.LMHeadLoss: accum_dtype must be None, torch.float32 or torch.bfloat16, "
                             "got %r" % (accum_dtype,))
        # checked for their C types here; kept as plain Python numbers for forward
        # (torch.compile does not trace ctypes)
        o = coda.lm_loss_options(ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss,
                                 softcap=0.0 if softcap is None else softcap, reduction=reduction,
                                 chunk_rows=0 if chunk_rows is None else chunk_rows)
        if not 0.0 <= o.label_smoothing <= 1.0:
            raise ValueError("coda.nn.LMHeadLoss: label_smoothing %r is outside [0, 1]" % (label_smoothing,))
        if not (o.z_loss >= 0.0 and math.isfinite(o.z_loss)):
            raise ValueError("coda.nn.LMHeadLoss: z_loss %r must be finite and >= 0" % (z_loss,))
        if softcap is not None and not (o.softcap > 0.0 and math.isfinite(o.softcap)):
            raise ValueError("coda.nn.LMHeadLoss: softcap %r must be None or finite and > 0" % (softcap,))
        if chunk_rows is not None and o.chunk_rows < 1:
            raise ValueError("coda.nn.LMHeadLoss: chunk_rows %r must be None or >= 1" % (chunk_rows,))
        self.ignore_index, self.reduction = int(ignore_index), reduction
        self.label_smoothing, self.z_loss = float(label_smoothing), float(z_loss)
        self.softcap = None if softcap is None else float(softcap)
        self.chunk_rows, self.accum_dtype, self.fallback = chunk_rows, accum_dtype, fallback
        self.weight = torch.nn.Parameter(torch.randn(vocab, d, device=device, dtype=dtype) / math.sqrt(d))

    def extra_repr(self):
        return ("d=%d, vocab=%d, ignore_index=%d, label_smoothing=%g, z_loss=%g, softcap=%s, reduction=%r, "
                "chunk_rows=%s, accum_dtype=%s" % (self.weight.shape[1], self.weight.shape[0], self.ignore_index,
                                                   self.label_smoothing, self.z_loss, self.softcap, self.reduction,
                                                   self.chunk_rows, self.accum_dtype))

    def coda_can_run(self, x):
        """Whether coda_lm_loss takes x on its device (else the fallback)."""
        dev = x.device.type
        return dev == "cpu" or (dev == "cuda" and x.shape[-1] % 8 == 0)

    def forward(self, x, targets, return_per_token=False):
        if self.coda_can_run(x):
            loss, per = _ops.lm_loss(x, self.weight, targets, ignore_index=self.ignore_index,
                                     label_smoothing=self.label_smoothing, z_loss=self.z_loss, softcap=self.softcap,
                                     reduction=self.reduction, chunk_rows=self.chunk_rows,
                                     accum_dtype=self.accum_dtype)
        elif self.fallback:
            loss, per = lm_loss_torch(x, self.weight, targets, ignore_index=self.ignore_index,
                                      label_smoothing=self.label_smoothing, z_loss=self.z_loss, softcap=self.softcap,
                                      reduction=self.reduction)
        else:
            raise ValueError("coda.nn.LMHeadLoss: coda_lm_loss cannot take x %s on %s (cpu, or cuda with d a "
                             "multiple of 8) and fallback=False" % (tuple(x.shape), x.device))
        return (loss, per) if return_per_token else loss


_HF_BLOCK_KEYS = ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                  "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                  "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")
_HF_SKIPPED = ("self_attn.rotary_emb.inv_freq",)  # made from cfg.rope_theta


def _check_block_keys(sd, prefix):
    """The Hugging Face keys of one block under prefix: all there, nothing
    else (a bias, a key of another architecture) but RoPE's buffer."""
    missing = [prefix + k for k in _HF_BLOCK_KEYS if prefix + k not in sd]
    if missing:
        raise ValueError("coda: from_state_dict: missing %s" % ", ".join(missing))
    other = sorted(k for k in sd if k.startswith(prefix) and k[len(prefix):] not in _HF_BLOCK_KEYS + _HF_SKIPPED)
    if other:
        raise ValueError("coda: from_state_dict: keys a coda block does not have under '%s' (biases and other "
                         "architectures are not supported): %s" % (prefix, ", ".join(other[:6])))


def _check_inv_freq(cfg, sd, prefix):
    """A checkpoint's RoPE frequencies, where it has them, against the ones
    cfg makes (theta^(-2i / head_dim)): loading a model with the wrong
    theta would run without an error and give other outputs (a review:
    LLaMA-2's 10000 under coda's default of LLaMA-3's 500000)."""
    f = sd.get(prefix + "self_attn.rotary_emb.inv_freq")
    if f is None:
        return
    hd = cfg.head_dim
    want = 1.0 / float(cfg.rope_theta) ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    got = f.detach().to("cpu", torch.float64).reshape(-1)
    if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-3, atol=0.0):
        raise ValueError("coda: from_state_dict: %srotary_emb.inv_freq is not cfg.rope_theta = %g's frequencies "
                         "(another theta, or a rope_scaling coda does not do): set cfg.rope_theta to the "
                         "checkpoint's" % (prefix + "self_attn.", cfg.rope_theta))


def _same_tensor(a, b):
    """Whether a and b are one tensor (a tied state_dict gives the same
    storage under two keys)."""
    return a is b or (a.device == b.device and a.shape == b.shape and a.stride() == b.stride()
                      and a.dtype == b.dtype and a.data_ptr() == b.data_ptr() and a.data_ptr() != 0)


class LlamaModel(torch.nn.Module):
    """A LLaMA model: embedding, n_layers coda LlamaBlocks, final RMSNorm,
    LM head + loss. forward(tokens (batch, seq) int64, targets or None) ->
    loss (targets given) or the final hidden states (batch, seq, d).
    attention: each block's (LlamaBlock's argument: None / "sdpa", "coda"
    or a function).
    fuse_norms: each block's down projection also gives the next block's
    x g1 and rstd (its epilogue's row sums), so the blocks after the first
    run no RMSNorm prologue; the result differs from fuse_norms=False only
    in the order rstd's squares are summed. Off by default until it is
    measured on a GPU (tests/test_block_torch.py checks it on the CPU)."""

    def __init__(self, cfg, n_layers, vocab, device="cpu", dtype=torch.float32, attention=None, fuse_norms=False):
        super().__init__()
        self.cfg = coda._config_copy(cfg)
        self.fuse_norms = fuse_norms
        self.embed = torch.nn.Embedding(vocab, cfg.d, device=device, dtype=dtype)
        self.layers = torch.nn.ModuleList(
            [LlamaBlock(cfg, device=device, dtype=dtype, attention=attention) for _ in range(n_layers)])
        self.norm = RMSNorm(cfg.d, cfg.eps, device=device, dtype=dtype)
        self.head = LMHeadLoss(cfg.d, vocab, device=device, dtype=dtype)

    @classmethod
    def from_state_dict(cls, cfg, sd, device="cpu", dtype=torch.float32, attention=None, fuse_norms=False):
        """From a Hugging Face LlamaForCausalLM state dict (model.embed_tokens,
        model.layers.N..., model.norm, lm_head). Without lm_head.weight, or
        with one that is the embedding's tensor (a tied model's state_dict()
        gives both keys), the checkpoint's head is its embedding
        (tie_word_embeddings): the model then shares one Parameter between
        them, as the tied model does, so training updates both alike. Shapes are checked against cfg and the
        embedding's vocabulary; a key the model does not have (a bias, a
        layer past a missing one, another architecture's) is a ValueError."""
        parts = [k.split(".") for k in sd if k.startswith("model.layers.")]
        idx = sorted({int(p[2]) for p in parts if len(p) > 3 and p[2].isdigit()})
        if not idx:
            raise ValueError("coda: from_state_dict: no model.layers.N keys")
        n = idx[-1] + 1
        if idx != list(range(n)):
            raise ValueError("coda: from_state_dict: layers %s are missing" % sorted(set(range(n)) - set(idx)))
        for k in ("model.embed_tokens.weight", "model.norm.weight"):
            if k not in sd:
                raise ValueError("coda: from_state_dict: missing %s" % k)
        vocab = sd["model.embed_tokens.weight"].shape[0]
        want = {"model.embed_tokens.weight": (vocab, cfg.d), "model.norm.weight": (cfg.d,),
                "lm_head.weight": (vocab, cfg.d)}
        for k, shape in want.items():
            if k in sd and tuple(sd[k].shape) != shape:
                raise ValueError("coda: from_state_dict: %s has shape %s, cfg and the embedding need %s"
                                 % (k, tuple(sd[k].shape), shape))
        known = set(want) | {"model.layers.%d.%s" % (i, b) for i in range(n) for b in _HF_BLOCK_KEYS + _HF_SKIPPED}
        other = sorted(k for k in sd if k not in known)
        if other:
            raise ValueError("coda: from_state_dict: keys this model does not have (biases and other "
                             "architectures are not supported): %s" % ", ".join(other[:6]))
        m = cls(cfg, n, vocab, device=device, dtype=dtype, attention=attention, fuse_norms=fuse_norms)
        with torch.no_grad():
            m.embed.weight.copy_(sd["model.embed_tokens.weight"])
            m.norm.weight.copy_(sd["model.norm.weight"])
            head = sd.get("lm_head.weight")
            if head is not None and not _same_tensor(head, sd["model.embed_tokens.weight"]):
                m.head.weight.copy_(head)
            else:
                m.head.weight = m.embed.weight
            for i in range(n):
                m.layers[i] = LlamaBlock.from_state_dict(cfg, sd, "model.layers.%d." % i, device=device,
                                                         dtype=dtype, attention=attention)
        return m

    def forward(self, tokens, targets=None):
        if tokens.dim() != 2:
            raise ValueError("coda: LlamaModel: tokens must be (batch, seq), got shape %s" % (tuple(tokens.shape),))
        h = self.embed(tokens).to(torch.bfloat16)
        batch, seq, d = h.shape
        xf, pos, m = _tokens(h)
        xg = r1 = None
        n = len(self.layers)
        for i, layer in enumerate(self.layers):
            # the next block's first RMSNorm from this block's down projection
            g_next = self.layers[i + 1].g1.to(torch.bfloat16) if self.fuse_norms and i + 1 < n else None
            xf, xg, r1 = layer.run(xf, pos, batch, seq, m, xg=xg, r1=r1, g_next=g_next)
        h = self.norm(_real_rows(xf, m).reshape(batch, seq, d))
        return h if targets is None else self.head(h, targets)
