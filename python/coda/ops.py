"""coda.ops - the split block's four calls as PyTorch operators.

With torch >= 2.4 they are custom operators (torch.library.custom_op) in the
namespace `coda`, each with a fake (meta) implementation and the autograd
formula registered, so a model built on them runs under torch.compile (no
graph break: the compiler sees four opaque ops), CUDA graphs and activation
checkpointing:

    coda::block_pre(x, pos, g1, wqkv, xg?, r1?, cfg) -> (r1, qkv)
    coda::block_post(x, o, g2, wo, wgu, wd, g_next?, cfg) -> (y, h, r2, z, y_g, r_next)
    coda::block_pre_backward(...), coda::block_post_backward(...)  (their gradients)

cfg is the list [d, n_heads, n_kv_heads, head_dim, ffn] with eps and
rope_theta as floats; the C block for a configuration and device is made
once and kept (blocks()). With an older torch the same functions are
torch.autograd.Function classes (eager only).

Autograd: block_post's gradient with respect to x is dh (the residual path
through h); block_pre's is the RMSNorm path alone (its backward runs with a
zero residual gradient), and autograd adds the two.

The norm across blocks: block_post with g_next (the next block's g1) also
returns y_g = y g_next and r_next = rstd(y) from its down projection's
epilogue, and the next block_pre takes them as xg and r1 instead of running
the RMSNorm prologue. Both are non-differentiable: the next block's
backward takes the norm's whole gradient (through its x = y and its g1)
from its own saved x and r1. Without g_next, y_g and r_next are empty.
"""
from typing import List, Optional, Tuple

import torch

import coda

_blocks = {}
_ctx = None


def blocks(cfg_list, eps, theta, device):
    """The coda.Block for a configuration on a device (made on first use)."""
    global _ctx
    dev = torch.device(device)
    key = (tuple(cfg_list), float(eps), float(theta), dev.type)
    b = _blocks.get(key)
    if b is None:
        if _ctx is None:
            _ctx = coda.Context()
        d, nh, nkv, hd, ffn = cfg_list
        cfg = coda.LlamaConfig(d=d, n_heads=nh, n_kv_heads=nkv, head_dim=hd, ffn=ffn, vocab=0, eps=eps,
                               rope_theta=theta)
        b = _blocks[key] = coda.Block(_ctx, cfg, device=dev.type)
    return b


def _w(**t):
    return {k: v.contiguous() for k, v in t.items()}


# ---- the implementations (plain functions of tensors) ----

def _pre(x, pos, g1, wqkv, xg, r1, cfg, eps, theta):
    b = blocks(cfg, eps, theta, x.device)
    w = _w(g1=g1, wqkv=wqkv)
    if xg is None:
        return b.forward_pre(w, x.contiguous(), pos.contiguous())
    # the previous block's norm: a copy of r1 (an operator's outputs do not alias its inputs)
    return b.forward_pre(w, x.contiguous(), pos.contiguous(), xg=xg.contiguous(), r1=r1.clone())


def _post(x, o, g2, wo, wgu, wd, g_next, cfg, eps, theta):
    b = blocks(cfg, eps, theta, x.device)
    w = _w(g2=g2, wo=wo, wgu=wgu, wd=wd)
    if g_next is None:
        none = x.new_empty(0)
        return b.forward_post(w, x.contiguous(), o.contiguous()) + (none, none.float())
    return b.forward_post(w, x.contiguous(), o.contiguous(), g_next=g_next.contiguous())


def _post_bwd(o, h, r2, z, dy, g2, wo, wgu, wd, cfg, eps, theta):
    b = blocks(cfg, eps, theta, dy.device)
    # gradients in the weights' dtype (bf16): no f32 copies of the big ones
    do, dh, g = b.backward_post(_w(g2=g2, wo=wo, wgu=wgu, wd=wd), o.contiguous(), h, r2, z, dy.contiguous(),
                                grad_dtype=wo.dtype)
    return do, dh, g["g2"], g["wo"], g["wgu"], g["wd"]


def _pre_bwd(x, pos, r1, qkv, dqkv, g1, wqkv, cfg, eps, theta):
    b = blocks(cfg, eps, theta, x.device)
    zero = torch.zeros_like(x, dtype=torch.bfloat16)  # the residual path is block_post's (autograd adds it)
    dqkv = dqkv if dqkv.dtype in (torch.float32, torch.bfloat16) else dqkv.float()
    dx, g = b.backward_pre(_w(g1=g1, wqkv=wqkv), x.contiguous(), pos.contiguous(), r1, qkv, dqkv.contiguous(), zero,
                           grad_dtype=wqkv.dtype)
    return dx, g["g1"], g["wqkv"]


HAVE_CUSTOM_OPS = hasattr(torch, "library") and hasattr(torch.library, "custom_op")

if HAVE_CUSTOM_OPS:
    @torch.library.custom_op("coda::block_pre", mutates_args=())
    def block_pre(x: torch.Tensor, pos: torch.Tensor, g1: torch.Tensor, wqkv: torch.Tensor,
                  xg: Optional[torch.Tensor], r1: Optional[torch.Tensor], cfg: List[int], eps: float,
                  theta: float) -> Tuple[torch.Tensor, torch.Tensor]:
        return _pre(x, pos, g1, wqkv, xg, r1, cfg, eps, theta)

    @block_pre.register_fake
    def _(x, pos, g1, wqkv, xg, r1, cfg, eps, theta):
        return x.new_empty(x.shape[0], dtype=torch.float32), x.new_empty(x.shape[0], wqkv.shape[0])

    @torch.library.custom_op("coda::block_post", mutates_args=())
    def block_post(x: torch.Tensor, o: torch.Tensor, g2: torch.Tensor, wo: torch.Tensor, wgu: torch.Tensor,
                   wd: torch.Tensor, g_next: Optional[torch.Tensor], cfg: List[int], eps: float,
                   theta: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                          torch.Tensor]:
        return _post(x, o, g2, wo, wgu, wd, g_next, cfg, eps, theta)

    @block_post.register_fake
    def _(x, o, g2, wo, wgu, wd, g_next, cfg, eps, theta):
        m, d = x.shape[0], x.shape[1]
        fused = g_next is not None
        return (x.new_empty(m, d), x.new_empty(m, d), x.new_empty(m, dtype=torch.float32),
                x.new_empty(m, wgu.shape[0]), x.new_empty(m, d) if fused else x.new_empty(0),
                x.new_empty(m if fused else 0, dtype=torch.float32))

    @torch.library.custom_op("coda::block_post_backward", mutates_args=())
    def block_post_backward(o: torch.Tensor, h: torch.Tensor, r2: torch.Tensor, z: torch.Tensor, dy: torch.Tensor,
                            g2: torch.Tensor, wo: torch.Tensor, wgu: torch.Tensor, wd: torch.Tensor, cfg: List[int],
                            eps: float, theta: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                               torch.Tensor, torch.Tensor, torch.Tensor]:
        return _post_bwd(o, h, r2, z, dy, g2, wo, wgu, wd, cfg, eps, theta)

    @block_post_backward.register_fake
    def _(o, h, r2, z, dy, g2, wo, wgu, wd, cfg, eps, theta):
        # the real op returns fresh contiguous tensors (dy cast to bf16, grads in wo's dtype)
        e = lambda t, dt: t.new_empty(t.shape, dtype=dt)
        return (e(o, torch.bfloat16), e(dy, torch.bfloat16), e(g2, wo.dtype), e(wo, wo.dtype), e(wgu, wo.dtype),
                e(wd, wo.dtype))

    @torch.library.custom_op("coda::block_pre_backward", mutates_args=())
    def block_pre_backward(x: torch.Tensor, pos: torch.Tensor, r1: torch.Tensor, qkv: torch.Tensor,
                           dqkv: torch.Tensor, g1: torch.Tensor, wqkv: torch.Tensor, cfg: List[int], eps: float,
                           theta: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return _pre_bwd(x, pos, r1, qkv, dqkv, g1, wqkv, cfg, eps, theta)

    @block_pre_backward.register_fake
    def _(x, pos, r1, qkv, dqkv, g1, wqkv, cfg, eps, theta):
        e = lambda t, dt: t.new_empty(t.shape, dtype=dt)
        return e(x, torch.bfloat16), e(g1, wqkv.dtype), e(wqkv, wqkv.dtype)

    def _pre_setup(ctx, inputs, output):
        x, pos, g1, wqkv, xg, r1_in, cfg, eps, theta = inputs
        r1, qkv = output
        ctx.save_for_backward(x, pos, r1, qkv, g1, wqkv)
        ctx.cfg, ctx.eps, ctx.theta = cfg, eps, theta
        ctx.mark_non_differentiable(r1)

    def _pre_backward(ctx, dr1, dqkv):
        x, pos, r1, qkv, g1, wqkv = ctx.saved_tensors
        dx, dg1, dwqkv = block_pre_backward(x, pos, r1, qkv, dqkv, g1, wqkv, ctx.cfg, ctx.eps, ctx.theta)
        return dx, None, dg1.to(g1.dtype), dwqkv.to(wqkv.dtype), None, None, None, None, None

    def _post_setup(ctx, inputs, output):
        x, o, g2, wo, wgu, wd, g_next, cfg, eps, theta = inputs
        y, h, r2, z, y_g, r_next = output
        ctx.save_for_backward(o, h, r2, z, g2, wo, wgu, wd)
        ctx.cfg, ctx.eps, ctx.theta = cfg, eps, theta
        ctx.mark_non_differentiable(h, r2, z, y_g, r_next)

    def _post_backward(ctx, dy, dh_, dr2, dz, dyg, drn):
        o, h, r2, z, g2, wo, wgu, wd = ctx.saved_tensors
        do, dh, dg2, dwo, dwgu, dwd = block_post_backward(o, h, r2, z, dy.to(torch.bfloat16), g2, wo, wgu, wd,
                                                          ctx.cfg, ctx.eps, ctx.theta)
        return dh, do, dg2.to(g2.dtype), dwo.to(wo.dtype), dwgu.to(wgu.dtype), dwd.to(wd.dtype), None, None, None, None

    torch.library.register_autograd("coda::block_pre", _pre_backward, setup_context=_pre_setup)
    torch.library.register_autograd("coda::block_post", _post_backward, setup_context=_post_setup)

    def pre(x, pos, g1, wqkv, cfg, eps, theta, xg=None, r1=None):
        """-> qkv (M, nqkv) bf16."""
        return block_pre(x, pos, g1, wqkv, xg, r1, list(cfg), float(eps), float(theta))[1]

    def post(x, o, g2, wo, wgu, wd, cfg, eps, theta, g_next=None):
        """-> y, or (y, y_g, r_next) with g_next."""
        y, h, r2, z, yg, rn = block_post(x, o, g2, wo, wgu, wd, g_next, list(cfg), float(eps), float(theta))
        return y if g_next is None else (y, yg, rn)

else:
    class _Pre(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, pos, g1, wqkv, xg, r1_in, cfg, eps, theta):
            r1, qkv = _pre(x, pos, g1, wqkv, xg, r1_in, cfg, eps, theta)
            ctx.save_for_backward(x, pos, r1, qkv, g1, wqkv)
            ctx.cfg, ctx.eps, ctx.theta = cfg, eps, theta
            return qkv

        @staticmethod
        def backward(ctx, dqkv):
            x, pos, r1, qkv, g1, wqkv = ctx.saved_tensors
            dx, dg1, dwqkv = _pre_bwd(x, pos, r1, qkv, dqkv, g1, wqkv, ctx.cfg, ctx.eps, ctx.theta)
            return dx, None, dg1.to(g1.dtype), dwqkv.to(wqkv.dtype), None, None, None, None, None

    class _Post(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, o, g2, wo, wgu, wd, g_next, cfg, eps, theta):
            y, h, r2, z, yg, rn = _post(x, o, g2, wo, wgu, wd, g_next, cfg, eps, theta)
            ctx.save_for_backward(o, h, r2, z, g2, wo, wgu, wd)
            ctx.cfg, ctx.eps, ctx.theta = cfg, eps, theta
            ctx.mark_non_differentiable(yg, rn)
            return y, yg, rn

        @staticmethod
        def backward(ctx, dy, dyg, drn):
            o, h, r2, z, g2, wo, wgu, wd = ctx.saved_tensors
            do, dh, dg2, dwo, dwgu, dwd = _post_bwd(o, h, r2, z, dy.to(torch.bfloat16), g2, wo, wgu, wd,
                                                    ctx.cfg, ctx.eps, ctx.theta)
            return (dh, do, dg2.to(g2.dtype), dwo.to(wo.dtype), dwgu.to(wgu.dtype), dwd.to(wd.dtype), None, None,
                    None, None)

    def pre(x, pos, g1, wqkv, cfg, eps, theta, xg=None, r1=None):
        """-> qkv (M, nqkv) bf16."""
        return _Pre.apply(x, pos, g1, wqkv, xg, r1, tuple(cfg), float(eps), float(theta))

    def post(x, o, g2, wo, wgu, wd, cfg, eps, theta, g_next=None):
        """-> y, or (y, y_g, r_next) with g_next."""
        y, yg, rn = _Post.apply(x, o, g2, wo, wgu, wd, g_next, tuple(cfg), float(eps), float(theta))
        return y if g_next is None else (y, yg, rn)
