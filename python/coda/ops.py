"""coda.ops - the split block's four calls as PyTorch operators.

With torch >= 2.4 they are custom operators (torch.library.custom_op) in the
namespace `coda`, each with a fake (meta) implementation and the autograd
formula registered, so a model built on them runs under torch.compile (no
graph break: the compiler sees four opaque ops), CUDA graphs and activation
checkpointing:

    coda::block_pre(x, pos, g1, wqkv, xg?, r1?, cfg) -> (r1, qkv)
    coda::block_post(x, o, g2, wo, wgu, wd, g_next?, cfg, save_z) -> (y, h, r2, z, y_g, r_next)
    coda::block_pre_backward(...), coda::block_post_backward(...)  (their gradients)
    coda::lm_loss(x, w, targets, ignore_index, label_smoothing, z_loss, softcap,
                  reduction, chunk_rows, grad_x, grad_w, dw_f32) -> (total, loss, dx, dw)

cfg is the list [d, n_heads, n_kv_heads, head_dim, ffn] with eps and
rope_theta as floats; the C block for a configuration and device is made
once and kept (blocks()). pre() and post() call the custom operators only
where something traces (torch.compile, export, fake tensors: _traced);
eagerly, CUDA graph capture included, and on a torch without custom ops,
they call the same functions through torch.autograd.Function classes
(_Pre, _Post), which skip the dispatcher's cost on every step.

Autograd: block_post's gradient with respect to x is dh (the residual path
through h); block_pre's is the RMSNorm path. On the Function path a Link
shared by one block call hands dh from post's backward to pre's, whose C
call adds it in its epilogue; on the custom-op path pre's backward runs
with a zero residual gradient and autograd adds the two.

Memory: without grad (torch.no_grad, or no input requiring it) block_post
does not save z, the (M, 2I) gate/up pre-activation; on the eager path its
backward writes dz over the saved z (SPEND_Z, below), so neither direction
holds a second (M, 2I) tensor.

The norm across blocks: block_post with g_next (the next block's g1) also
returns y_g = y g_next and r_next = rstd(y) from its down projection's
epilogue, and the next block_pre takes them as xg and r1 instead of running
the RMSNorm prologue. Both are non-differentiable: the next block's
backward takes the norm's whole gradient (through its x = y and its g1)
from its own saved x and r1. Without g_next, y_g and r_next are empty.

The LM head and the loss (lm_loss(x, w, targets, ...) -> (loss, per-token
losses)): coda_lm_loss makes the loss and both gradients in one call, as
Liger-Kernel's fused linear cross-entropy does, so coda::lm_loss returns dx
and dw (empty where grad_x / grad_w is False) beside the loss and keeps them
for the backward, which only multiplies them by grad_output, on the device
(coda_scale: its kernel reads grad_output there and stops when it is 1, so
the usual case costs neither a pass over dw nor a stream sync); under
torch.compile or export the multiply is a traced t * g.
Only reductions "mean" and "sum": a per-token gradient weight does not fit
a call that makes the gradients before the backward. The per-token losses
are returned too, not differentiable.
"""
import numbers
import weakref
from typing import List, Optional, Tuple

import torch

import coda

_blocks = {}
_ctx = None


def context():
    """The coda.Context the operators share (made on first use)."""
    global _ctx
    if _ctx is None:
        _ctx = coda.Context()
    return _ctx


def blocks(cfg_list, eps, theta, device):
    """The coda.Block for a configuration on a device (made on first use)."""
    dev = torch.device(device)
    key = (tuple(cfg_list), float(eps), float(theta), dev.type)
    b = _blocks.get(key)
    if b is None:
        context()
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
        return b.forward_pre(w, x.contiguous(), coda._dense_1d(pos))
    # the previous block's norm: a copy of r1 (an operator's outputs do not alias its inputs)
    return b.forward_pre(w, x.contiguous(), coda._dense_1d(pos), xg=xg.contiguous(), r1=r1.clone())


def _post(x, o, g2, wo, wgu, wd, g_next, cfg, eps, theta, save_z=True, keep_c=False):
    """-> (y, h, r2, z, y_g, r_next, c). save_z=False: a forward with no
    backward; z comes back empty (0). keep_c (with save_z): c = silu(gate)
    * up comes back for the backward (coda_block_acts_t.c), else empty."""
    b = blocks(cfg, eps, theta, x.device)
    w = _w(g2=g2, wo=wo, wgu=wgu, wd=wd)
    none = x.new_empty(0)
    c = torch.empty(x.shape[0], cfg[4], dtype=torch.bfloat16, device=x.device) if keep_c and save_z else None
    if g_next is None:
        (y, h, r2, z), yg, rn = b.forward_post(w, x.contiguous(), o.contiguous(), save_z=save_z, c=c), none, \
            none.float()
    else:
        y, h, r2, z, yg, rn = b.forward_post(w, x.contiguous(), o.contiguous(), g_next=g_next.contiguous(),
                                             save_z=save_z, c=c)
    # an op's outputs never alias each other
    return y, h, r2, x.new_empty(0) if z is None else z, yg, rn, x.new_empty(0) if c is None else c


def _post_bwd(o, h, r2, z, dy, g2, wo, wgu, wd, cfg, eps, theta, spend_z=False, c=None):
    """spend_z: dz written over z (the caller's last use of z). c: kept
    from the forward (_post's keep_c), or None: recomputed."""
    b = blocks(cfg, eps, theta, dy.device)
    # gradients in the weights' dtype (bf16): no f32 copies of the big ones
    do, dh, g = b.backward_post(_w(g2=g2, wo=wo, wgu=wgu, wd=wd), o.contiguous(), h, r2, z, dy.contiguous(),
                                grad_dtype=wo.dtype, spend_z=spend_z, c=c)
    return do, dh, g["g2"], g["wo"], g["wgu"], g["wd"]


# On the eager path block_post's backward writes dz over its saved z (an
# (M, 2I) bf16 tensor, 0.5-1.75 GiB at LLaMA-3 1B-70B with 2 x 8192 tokens)
# instead of a workspace of that size, as Liger-Kernel's SwiGLU does: a
# second backward through the same forward (retain_graph=True) then raises.
# False: z is only read, and such backwards work.
SPEND_Z = True


def _needs_grad(*ts):
    """Whether a forward on these tensors is recorded for a backward."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in ts)


def ready(t, align=16):
    """t as coda reads it: contiguous columns, rows apart (a broadcast
    tensor's row stride 0 is refused by coda as overlapping rows) and, on
    CUDA, base and row stride `align`-byte aligned (coda.h section 11: qkv,
    o and do 16, lse 4); else a contiguous copy."""
    if not isinstance(t, torch.Tensor) or t.dim() != 2:
        return t  # the C call says what is wrong
    es = t.element_size()
    # coda reads strides as they are, a size-1 dimension's too (torch calls
    # such a tensor contiguous whatever that stride is)
    ok = t.stride(1) == 1 and t.stride(0) >= max(1, t.shape[1])
    if ok and t.is_cuda:
        ok = t.data_ptr() % align == 0 and (t.stride(0) * es) % align == 0
    if ok:
        return t
    return t.clone(memory_format=torch.contiguous_format) if t.is_contiguous() else t.contiguous()


def _grad_ready(t):
    """An attention gradient as coda reads it: f32 or bf16, then as ready()
    (rows apart: a broadcast one is copied) with the block's 4-byte
    alignment."""
    t = t if t.dtype in (torch.float32, torch.bfloat16) else t.float()
    return ready(t, 4)


def _pre_bwd(x, pos, r1, qkv, dqkv, g1, wqkv, cfg, eps, theta, dh=None):
    """dh: block_post's gradient for x (the residual path), added in
    backward_pre's epilogue; None: zeros (autograd then adds post's).
    dqkv: (M, nqkv), or (dq, dk, dv) its column blocks (split_qkv's)."""
    b = blocks(cfg, eps, theta, x.device)
    if dh is None:
        dh = torch.zeros_like(x, dtype=torch.bfloat16)
    if isinstance(dqkv, tuple):
        dt = torch.bfloat16 if all(t.dtype == torch.bfloat16 for t in dqkv) else torch.float32
        dqkv = tuple(_grad_ready(t.to(dt)) for t in dqkv)
    else:
        dqkv = _grad_ready(dqkv)
    dx, g = b.backward_pre(_w(g1=g1, wqkv=wqkv), x.contiguous(), coda._dense_1d(pos), r1, qkv, dqkv,
                           dh.contiguous(), grad_dtype=wqkv.dtype)
    return dx, g["g1"], g["wqkv"]


def _pre_grads(ctx, dqkv, bwd, **kw):
    """block_pre's gradients for (x, pos, g1, wqkv) from ctx's saved
    tensors: bwd is the C call (the custom op, or _pre_bwd with dh=)."""
    x, pos, r1, qkv, g1, wqkv = ctx.saved_tensors
    dx, dg1, dwqkv = bwd(x, pos, r1, qkv, dqkv, g1, wqkv, ctx.cfg, ctx.eps, ctx.theta, **kw)
    return dx, None, dg1.to(g1.dtype), dwqkv.to(wqkv.dtype)


def _post_grads(ctx, dy, bwd, **kw):
    """block_post's gradients for (x, o, g2, wo, wgu, wd) from ctx's saved
    tensors: bwd is the C call (the custom op, or _post_bwd with spend_z=)."""
    o, h, r2, z, g2, wo, wgu, wd, *kept = ctx.saved_tensors
    if kept and kept[0].numel():  # c kept from the forward (the Function path's keep_c)
        kw["c"] = kept[0]
    do, dh, dg2, dwo, dwgu, dwd = bwd(o, h, r2, z, dy.to(torch.bfloat16), g2, wo, wgu, wd, ctx.cfg, ctx.eps,
                                      ctx.theta, **kw)
    return dh, do, dg2.to(g2.dtype), dwo.to(wo.dtype), dwgu.to(wgu.dtype), dwd.to(wd.dtype)


HAVE_CUSTOM_OPS = hasattr(torch, "library") and hasattr(torch.library, "custom_op")

# Every backward here hands out gradients that C computed: nothing autograd
# can differentiate again. Under create_graph=True they would come back as
# constants and every second-order term (a gradient penalty, a learnable
# loss weight) would silently be 0 (a review). So each backward is once
# differentiable: differentiating its results again is an error.
_once_differentiable = torch.autograd.function.once_differentiable


def refuse_second_order(what, *grads):
    """A backward that hands its gradients over through a Link, outside
    autograd: where they require grad (create_graph=True, a second-order
    term on its way) once_differentiable cannot see them arrive at the
    block's other half, so the call refuses here."""
    if any(isinstance(t, torch.Tensor) and t.requires_grad for t in grads):
        raise RuntimeError("coda: %s: differentiating coda's gradients again (create_graph=True) is not "
                           "supported: they are computed by coda, outside autograd" % what)


def once_eager(fn):
    """A custom op's backward fn, once differentiable where it runs eagerly;
    where torch.compile traces the backward graph, fn as it is (the
    compiler differentiates the graph it traced, not these calls)."""
    once = _once_differentiable(fn)

    def backward(ctx, *grads):
        g = next((t for t in grads if isinstance(t, torch.Tensor)), None)
        return fn(ctx, *grads) if g is not None and _traced(g) else once(ctx, *grads)
    return backward


def _fake_bf16(op, name, t):
    """A fake implementation's copy of the C call's dtype check (the real op
    refuses any other dtype; a fake that accepted it traced outputs of the
    wrong dtype)."""
    if t.dtype != torch.bfloat16:
        raise coda.Error(4, "CODA_ERR_DTYPE", "%s (fake): %s must be bf16, got %s" % (op, name, t.dtype))

if HAVE_CUSTOM_OPS:
    @torch.library.custom_op("coda::block_pre", mutates_args=())
    def block_pre(x: torch.Tensor, pos: torch.Tensor, g1: torch.Tensor, wqkv: torch.Tensor,
                  xg: Optional[torch.Tensor], r1: Optional[torch.Tensor], cfg: List[int], eps: float,
                  theta: float) -> Tuple[torch.Tensor, torch.Tensor]:
        return _pre(x, pos, g1, wqkv, xg, r1, cfg, eps, theta)

    @block_pre.register_fake
    def _(x, pos, g1, wqkv, xg, r1, cfg, eps, theta):
        _fake_bf16("coda::block_pre", "x", x)
        return x.new_empty(x.shape[0], dtype=torch.float32), x.new_empty(x.shape[0], wqkv.shape[0])

    @torch.library.custom_op("coda::block_post", mutates_args=())
    def block_post(x: torch.Tensor, o: torch.Tensor, g2: torch.Tensor, wo: torch.Tensor, wgu: torch.Tensor,
                   wd: torch.Tensor, g_next: Optional[torch.Tensor], cfg: List[int], eps: float,
                   theta: float, save_z: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                        torch.Tensor, torch.Tensor]:
        return _post(x, o, g2, wo, wgu, wd, g_next, cfg, eps, theta, save_z)[:6]

    @block_post.register_fake
    def _(x, o, g2, wo, wgu, wd, g_next, cfg, eps, theta, save_z):
        _fake_bf16("coda::block_post", "x", x)
        _fake_bf16("coda::block_post", "o", o)
        m, d = x.shape[0], x.shape[1]
        fused = g_next is not None
        return (x.new_empty(m, d), x.new_empty(m, d), x.new_empty(m, dtype=torch.float32),
                x.new_empty(m, wgu.shape[0]) if save_z else x.new_empty(0),
                x.new_empty(m, d) if fused else x.new_empty(0),
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
        ctx.set_materialize_grads(False)  # no zero (M) tensor for r1's gradient

    def _pre_backward(ctx, dr1, dqkv):
        if dqkv is None:  # qkv unused: no gradient
            return (None,) * 9
        return _pre_grads(ctx, dqkv, block_pre_backward) + (None,) * 5

    def _post_setup(ctx, inputs, output):
        x, o, g2, wo, wgu, wd, g_next, cfg, eps, theta, save_z = inputs
        y, h, r2, z, y_g, r_next = output
        ctx.save_for_backward(o, h, r2, z, g2, wo, wgu, wd)
        ctx.cfg, ctx.eps, ctx.theta = cfg, eps, theta
        ctx.mark_non_differentiable(h, r2, z, y_g, r_next)
        # the non-differentiable outputs get None, not zeros: materialized,
        # z's would be an (M, 2I) tensor (0.9 GiB at LLaMA-3 8B, 2 x 8192)
        ctx.set_materialize_grads(False)

    def _post_backward(ctx, dy, dh_, dr2, dz, dyg, drn):
        if dy is None:  # y unused: no gradient
            return (None,) * 11
        return _post_grads(ctx, dy, block_post_backward) + (None,) * 5

    torch.library.register_autograd("coda::block_pre", once_eager(_pre_backward), setup_context=_pre_setup)
    torch.library.register_autograd("coda::block_post", once_eager(_post_backward), setup_context=_post_setup)


class Link:
    """One block call's hand-over between its two halves' backwards (eager
    path): block_post's backward leaves its gradient for x here instead of
    returning it, and block_pre's backward (which autograd always runs
    after it: it needs dqkv, which needs post's do) takes it as the dh that
    coda_block_backward_pre adds in its epilogue. That saves the zero
    (M, d) tensor and autograd's add of the two gradients of x. Likewise
    the one consumer of qkv that takes the Link (take_link: split_qkv, or
    coda's attention) leaves qkv's gradient here (dparts) in the form it
    has it, instead of what autograd would make of it: split_qkv's dq, dk,
    dv for coda_block_backward_pre_split, not concatenated; coda
    attention's f32 dqkv, not cast to bf16. A Link belongs to one forward
    call (coda.nn makes one per call). pre_node: a weak reference to the
    call's block_pre backward node, so that block_post's backward hands dh
    over only when that node will run in the pass (else x's gradient from
    post would be lost: an attention whose output does not depend on qkv
    through autograd, or autograd.grad of post's inputs alone)."""
    __slots__ = ("dh", "dparts", "dstream", "taken", "pre_node")

    def __init__(self):
        self.dh = None
        self.dparts = None   # qkv's gradient, (dq, dk, dv) or dqkv, for this backward pass only
        self.dstream = None  # the CUDA stream it was made on
        self.taken = False   # a consumer has taken this call's Link (once only)
        self.pre_node = None  # weakref.ref to block_pre's backward node (set by pre())


_will_run = getattr(torch._C, "_will_engine_execute_node", None)


def _pre_will_run(link):
    """In a backward pass: whether the link's block_pre backward node runs
    in it (graph structure: the node lies on a path to what the pass
    differentiates), so that what post leaves on the link is taken."""
    node = link.pre_node() if link.pre_node is not None else None
    return node is not None and _will_run is not None and bool(_will_run(node))


# The eager path on every torch (and the only one on torch < 2.4).
class _Pre(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, pos, g1, wqkv, xg, r1_in, cfg, eps, theta, link):
        r1, qkv = _pre(x, pos, g1, wqkv, xg, r1_in, cfg, eps, theta)
        ctx.save_for_backward(x, pos, r1, qkv, g1, wqkv)
        ctx.cfg, ctx.eps, ctx.theta, ctx.link = cfg, eps, theta, link
        ctx.set_materialize_grads(False)
        return qkv

    @staticmethod
    @_once_differentiable
    def backward(ctx, dqkv):
        dh = parts = None
        if ctx.link is not None:
            dh, ctx.link.dh = ctx.link.dh, None
            parts, ctx.link.dparts = ctx.link.dparts, None
        if parts is not None:  # the Link's consumer's: dq, dk, dv as the attention gave them, or an f32 dqkv
            _on_current_stream(parts if isinstance(parts, tuple) else (parts,), ctx.link.dstream)
            if dqkv is not None:  # qkv had other consumers too: autograd's sum, plus the Link's
                whole = torch.cat([t.to(dqkv.dtype) for t in parts], 1) if isinstance(parts, tuple) else parts
                parts = whole.to(dqkv.dtype) + dqkv
            dqkv = parts
        if dqkv is None:  # qkv unused: x's gradient is post's alone
            return (dh,) + (None,) * 9
        return _pre_grads(ctx, dqkv, _pre_bwd, dh=dh) + (None,) * 6


def _on_current_stream(parts, made_on):
    """Make tensors written on CUDA stream `made_on` safe to read (and their
    memory safe to keep) on the current stream: what autograd's engine does
    between nodes on different streams when a gradient flows between them,
    which the Link's hand-over bypasses."""
    if made_on is None:
        return
    cur = torch.cuda.current_stream(parts[0].device)
    if cur != made_on:
        cur.wait_stream(made_on)
        for t in parts:
            t.record_stream(cur)


def _drop_parts(link):
    """End of a backward pass: what block_pre's backward did not take (a
    pass that did not reach it, such as autograd.grad of a weight of
    block_post alone) must not reach a later pass through the same graph
    (retain_graph)."""
    link.dh = link.dparts = link.dstream = None


def _at_end_of_pass(link):
    torch.autograd.Variable._execution_engine.queue_callback(lambda: _drop_parts(link))


def take_link(qkv):
    """The Link of the block_pre call whose own output qkv is (the eager
    path's autograd.Function), for the one consumer of qkv that will hand
    qkv's gradient over through it (hand_over) instead of returning it to
    autograd; None where there is none: qkv traced, not block_pre's own
    output (a slice, a copy), retaining its gradient, no gradient recorded,
    or the Link taken already."""
    if _traced(qkv) or not torch.is_grad_enabled() or qkv.retains_grad or getattr(qkv, "_backward_hooks", None):
        return None  # a hook or a retained .grad wants qkv's gradient from autograd
    fn = getattr(qkv, "grad_fn", None)
    link = getattr(fn, "link", None) if isinstance(fn, _Pre._backward_cls) else None
    if link is None or link.taken:
        return None
    link.taken = True
    return link


def hand_over(link, grad):
    """In a backward: qkv's gradient grad ((dq, dk, dv), or dqkv) to
    block_pre's backward through link, for this backward pass only."""
    if link.dparts is not None:
        raise RuntimeError("coda.ops.hand_over: qkv's gradient handed over twice in one backward pass")
    ref = grad[0] if isinstance(grad, tuple) else grad
    _at_end_of_pass(link)  # first: outside a backward this raises, with nothing left on the Link
    link.dparts = grad
    link.dstream = torch.cuda.current_stream(ref.device) if ref.is_cuda else None


class _Split(torch.autograd.Function):
    """split_qkv on the eager path: the three column blocks of block_pre's
    qkv as views; their gradients go to the call's Link, not to qkv."""
    @staticmethod
    def forward(ctx, qkv, nq, nkv, link):
        ctx.link, ctx.shapes = link, ((qkv.shape[0], nq), (qkv.shape[0], nkv), (qkv.shape[0], nkv))
        ctx.set_materialize_grads(False)
        return qkv[:, :nq], qkv[:, nq:nq + nkv], qkv[:, nq + nkv:]

    @staticmethod
    @_once_differentiable
    def backward(ctx, dq, dk, dv):
        refuse_second_order("split_qkv's backward", dq, dk, dv)
        if dq is not None or dk is not None or dv is not None:
            ref = next(t for t in (dq, dk, dv) if t is not None)
            hand_over(ctx.link, tuple(t if t is not None else ref.new_zeros(sh)
                                      for t, sh in zip((dq, dk, dv), ctx.shapes)))
        return None, None, None, None


def split_qkv(qkv, nq, nkv):
    """qkv (M, nq + 2 nkv) -> q (M, nq), k, v (M, nkv): column views, as
    qkv.split([nq, nkv, nkv], 1). Where qkv is block_pre's own output on
    the eager path (autograd.Function), their gradients go straight to
    block_pre's backward (coda_block_backward_pre_split reads dq, dk, dv
    where the attention left them) instead of autograd's cat into one
    (M, nqkv) tensor: a copy of the whole gradient saved per block. Then
    autograd sees no gradient of qkv itself (autograd.grad(loss, qkv) finds
    qkv unused): coda.nn's blocks keep qkv to themselves. A second split of the
    same qkv, a slice of it (coda.nn pads M to a multiple of 8 on CUDA and
    passes qkv[:m]), a qkv with a hook or that retains its gradient, under a
    tracer, or any other tensor: the plain split."""
    if not isinstance(qkv, torch.Tensor) or qkv.dim() != 2 or qkv.shape[1] != nq + 2 * nkv:
        raise ValueError("coda.ops.split_qkv: qkv must be (M, nq + 2 nkv) = (M, %d), got %s"
                         % (nq + 2 * nkv, tuple(qkv.shape) if isinstance(qkv, torch.Tensor) else type(qkv).__name__))
    link = take_link(qkv)  # None when traced: the custom ops, and the compiler's own fusion
    if link is None:
        return qkv.split([nq, nkv, nkv], dim=1)
    return _Split.apply(qkv, nq, nkv, link)


class _Post(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, o, g2, wo, wgu, wd, g_next, cfg, eps, theta, keep_c, link):
        y, h, r2, z, yg, rn, c = _post(x, o, g2, wo, wgu, wd, g_next, cfg, eps, theta, keep_c=keep_c)
        ctx.save_for_backward(o, h, r2, z, g2, wo, wgu, wd, c)
        ctx.cfg, ctx.eps, ctx.theta, ctx.link = cfg, eps, theta, link
        ctx.mark_non_differentiable(yg, rn)
        ctx.set_materialize_grads(False)
        return y, yg, rn

    @staticmethod
    @_once_differentiable
    def backward(ctx, dy, dyg, drn):
        if dy is None:
            return (None,) * 12
        if getattr(ctx, "z_spent", False):
            raise RuntimeError("coda: a second backward through a block_post whose first backward wrote its "
                               "gradient over the saved z (coda.ops.SPEND_Z); set coda.ops.SPEND_Z = False "
                               "before the forward to backpropagate through it more than once")
        ctx.z_spent = SPEND_Z
        g = _post_grads(ctx, dy, _post_bwd, spend_z=SPEND_Z)
        if ctx.link is not None and _pre_will_run(ctx.link):  # x's to block_pre's backward, which adds it (Link)
            _at_end_of_pass(ctx.link)
            ctx.link.dh, g = g[0], (None,) + g[1:]
        return g + (None,) * 6


def pre(x, pos, g1, wqkv, cfg, eps, theta, xg=None, r1=None, link=None):
    """-> qkv (M, nqkv) bf16. The custom op where something traces
    (torch.compile, export, fake tensors), the autograd.Function otherwise
    (eager, CUDA graph capture included): the same _pre and _pre_bwd,
    without the dispatcher's cost of a custom op call on every eager step.
    link: a Link shared with the same block call's post (Function path)."""
    if HAVE_CUSTOM_OPS and _traced(x):
        return block_pre(x, pos, g1, wqkv, xg, r1, list(cfg), float(eps), float(theta))[1]
    if not _needs_grad(x, g1, wqkv):  # nothing records a backward: no Function, nothing saved
        return _pre(x, pos, g1, wqkv, xg, r1, tuple(cfg), float(eps), float(theta))[1]
    qkv = _Pre.apply(x, pos, g1, wqkv, xg, r1, tuple(cfg), float(eps), float(theta), link)
    if link is not None:  # weak: the node holds the link (ctx.link), a strong ref back would be a cycle
        link.pre_node = weakref.ref(qkv.grad_fn)
    return qkv


def post(x, o, g2, wo, wgu, wd, cfg, eps, theta, g_next=None, link=None, keep_c=False):
    """-> y, or (y, y_g, r_next) with g_next (the custom op or the
    autograd.Function, as pre; link as pre's). keep_c: the Function saves
    c = silu(gate) * up for the backward (an (M, I) bf16 tensor more per
    block in flight, one (M, I) store fewer in the backward); the custom op
    (traced) always recomputes it."""
    grad = _needs_grad(x, o, g2, wo, wgu, wd)
    if HAVE_CUSTOM_OPS and _traced(x):
        y, h, r2, z, yg, rn = block_post(x, o, g2, wo, wgu, wd, g_next, list(cfg), float(eps), float(theta), grad)
        return y if g_next is None else (y, yg, rn)
    if not grad:  # nothing records a backward: z is not saved
        y, h, r2, z, yg, rn, _ = _post(x, o, g2, wo, wgu, wd, g_next, tuple(cfg), float(eps), float(theta), False)
        return y if g_next is None else (y, yg, rn)
    y, yg, rn = _Post.apply(x, o, g2, wo, wgu, wd, g_next, tuple(cfg), float(eps), float(theta), bool(keep_c),
                            link)
    return y if g_next is None else (y, yg, rn)


# ---------------------------------------------------------------------------
# The LM head and the cross-entropy loss (coda.h section 10): coda::lm_loss
# ---------------------------------------------------------------------------

LM_REDUCTIONS = ("mean", "sum")
_LM_NONE = ("coda.ops.lm_loss: reduction %r is not supported: coda_lm_loss computes the gradients in the "
            "forward call, scaled by one number (the mean's or the sum's), and a per-token gradient weight "
            "(what reduction='none' followed by any weighted sum needs) has no place in it. Use 'mean' or "
            "'sum'; the per-token losses are returned as well (not differentiable)")


def _lm_dtypes(x_dtype, dw_f32):
    """(dx's dtype, dw's dtype) as coda_lm_loss writes them: dx in f32 for
    f32 x, else bf16; dw in f32 (the chunks accumulated in f32) or bf16."""
    return (torch.float32 if x_dtype == torch.float32 else torch.bfloat16,
            torch.float32 if dw_f32 else torch.bfloat16)


_lm_opts = {}  # (the options' values) -> coda.LMLossOptions


def _lm(x, w, targets, ignore_index, label_smoothing, z_loss, softcap, reduction, chunk_rows, grad_x, grad_w,
        dw_f32):
    """coda_lm_loss on fresh outputs -> (total (), loss (M), dx (M, d) or
    (0), dw (V, d) or (0)). x and w of another dtype than bf16 are rounded
    to bf16 for the GEMMs (a copy for the call)."""
    if reduction not in LM_REDUCTIONS:
        raise ValueError(_LM_NONE % (reduction,))
    if x.dim() != 2 or w.dim() != 2:
        raise ValueError("coda.ops.lm_loss: x must be (M, d) and w (V, d), got %s and %s"
                         % (tuple(x.shape), tuple(w.shape)))
    m, d, dev = x.shape[0], x.shape[1], x.device
    dxt, dwt = _lm_dtypes(x.dtype, dw_f32)
    total = torch.empty(1, dtype=torch.float32, device=dev)
    dx = torch.empty(m, d, dtype=dxt, device=dev) if grad_x else None
    dw = torch.empty(w.shape[0], w.shape[1], dtype=dwt, device=dev) if grad_w else None
    key = (ignore_index, label_smoothing, z_loss, softcap, reduction, chunk_rows)
    opts = _lm_opts.get(key)
    if opts is None:  # made (and checked) once per set of options; the binding copies it per call
        opts = coda.lm_loss_options(ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss,
                                    softcap=softcap, reduction=reduction, chunk_rows=chunk_rows)
        if len(_lm_opts) >= 64:
            _lm_opts.clear()
        _lm_opts[key] = opts
    loss, total, dx, dw = coda.lm_loss(context(), x.to(torch.bfloat16).contiguous(), w.to(torch.bfloat16).contiguous(),
                                       targets.reshape(-1), total=total, dx=dx, dw=dw, opts=opts)
    return (total.view(()), loss, dx if grad_x else x.new_empty(0, dtype=dxt),
            dw if grad_w else w.new_empty(0, dtype=dwt))


def _traced(g):
    """Whether g is seen by a tracer rather than run: torch.compile or
    export (fake or functional tensors, the meta device, AOTAutograd's
    modes). CUDA graph capture is not tracing: Python runs as in eager."""
    if g.device.type == "meta" or type(g) not in (torch.Tensor, torch.nn.Parameter):
        return True  # fake, functional and other tensor subclasses: traced
    comp = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    if comp is not None and comp():
        return True
    keys, mode = getattr(torch._C, "_TorchDispatchModeKey", None), getattr(torch._C, "_get_dispatch_mode", None)
    if keys is not None and mode is not None:  # AOTAutograd / make_fx tracing the backward
        for k in ("FAKE", "PROXY", "FUNCTIONAL"):
            if hasattr(keys, k) and mode(getattr(keys, k)) is not None:
                return True
    if getattr(torch._C, "_is_functional_tensor", None) is not None and torch._C._is_functional_tensor(g):
        return True
    return False


def _value_readable(g):
    """Whether g's value may be read on the host here: not while torch.compile
    or export traces (fake or functional tensors), not during CUDA graph
    capture, not on the meta device."""
    if _traced(g):
        return False
    capturing = getattr(torch.cuda, "is_current_stream_capturing", None)
    if g.is_cuda and capturing is not None and capturing():
        return False
    return True


def _scaled(t, g):
    """t * g on t's device, g (0-dim) rounded to t's dtype first (exact for
    1 and powers of two; for a bf16 t the product is taken in f32 and
    rounded once, as PyTorch's bf16 ops do), the value of g never read on
    the host, so the backward never waits for the stream. Eagerly in place
    through coda_scale (t is the forward's gradient, which nothing else
    holds: no second (V, d) buffer at the peak; the write is C's, which
    autograd's version counter does not see, so _lm_backward_common refuses
    a second backward itself): its kernel reads g on the device and stops
    when it is 1, so the usual grad_output costs no pass over dw. Traced,
    out of place, t * g (the compiler's kernel), the same bits."""
    if _value_readable(g):  # t: dx or dw as _lm made them, (M, d) or (V, d), bf16 or f32
        return coda.scale_(context(), t, g)
    return t * g.to(t.dtype)


def _lm_grad(g, t, needed, computed, name, dtype):
    """The gradient for input `name` from grad_output g and the gradient t
    of the forward call: None if not needed, else t * g (on the device; no
    host read of g, so no stream sync)."""
    if not needed or g is None:
        return None
    if not computed:
        raise RuntimeError("coda::lm_loss: a gradient for %s is needed, but the forward call was made with "
                           "grad_%s=False (coda.ops.lm_loss sets it when %s requires grad)" % (name, name, name))
    return _scaled(t, g).to(dtype)


def _lm_backward_common(ctx, dtotal):
    """Both paths' backward: the forward's saved gradients times dtotal.
    Eagerly they are scaled in place and handed out as they are, so they
    serve one backward: a second one (retain_graph) would scale them again
    and change the gradients the first handed out. Refused."""
    if getattr(ctx, "grads_spent", False):
        raise RuntimeError("coda::lm_loss: a second backward through the same forward: its gradients were "
                           "computed in the forward and handed out (scaled in place) by the first backward; "
                           "run the forward again to backpropagate through it once more")
    dx, dw = ctx.saved_tensors
    if dtotal is not None and _value_readable(dtotal):
        ctx.grads_spent = True  # _scaled works in place (traced, t * g leaves the saved ones as they are)
    return ((_lm_grad(dtotal, dx, ctx.needs_input_grad[0], ctx.computed[0], "x", ctx.dtypes[0]),
             _lm_grad(dtotal, dw, ctx.needs_input_grad[1], ctx.computed[1], "w", ctx.dtypes[1]))
            + (None,) * 10)


if HAVE_CUSTOM_OPS:
    @torch.library.custom_op("coda::lm_loss", mutates_args=())
    def lm_loss_op(x: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                   label_smoothing: float, z_loss: float, softcap: float, reduction: str, chunk_rows: int,
                   grad_x: bool, grad_w: bool, dw_f32: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                      torch.Tensor]:
        return _lm(x, w, targets, ignore_index, label_smoothing, z_loss, softcap, reduction, chunk_rows, grad_x,
                   grad_w, dw_f32)

    @lm_loss_op.register_fake
    def _(x, w, targets, ignore_index, label_smoothing, z_loss, softcap, reduction, chunk_rows, grad_x, grad_w,
          dw_f32):
        if reduction not in LM_REDUCTIONS:
            raise ValueError(_LM_NONE % (reduction,))
        m, d = x.shape[0], x.shape[1]
        dxt, dwt = _lm_dtypes(x.dtype, dw_f32)
        return (x.new_empty((), dtype=torch.float32), x.new_empty(m, dtype=torch.float32),
                x.new_empty(m, d, dtype=dxt) if grad_x else x.new_empty(0, dtype=dxt),
                x.new_empty(w.shape[0], w.shape[1], dtype=dwt) if grad_w else x.new_empty(0, dtype=dwt))

    def _lm_setup(ctx, inputs, output):
        x, w = inputs[0], inputs[1]
        ctx.computed, ctx.dtypes = (inputs[9], inputs[10]), (x.dtype, w.dtype)
        total, loss, dx, dw = output
        ctx.save_for_backward(dx, dw)
        ctx.mark_non_differentiable(loss, dx, dw)

    def _lm_backward(ctx, dtotal, dloss, ddx, ddw):
        return _lm_backward_common(ctx, dtotal)

    torch.library.register_autograd("coda::lm_loss", once_eager(_lm_backward), setup_context=_lm_setup)


class _LMLoss(torch.autograd.Function):
    """coda_lm_loss as an autograd.Function: the eager path (on every torch;
    with torch >= 2.4 while nothing traces, as it skips the custom op's
    dispatch, about half the host time of a call), and the only one on
    torch < 2.4."""

    @staticmethod
    def forward(ctx, x, w, targets, ignore_index, label_smoothing, z_loss, softcap, reduction, chunk_rows,
                grad_x, grad_w, dw_f32):
        total, loss, dx, dw = _lm(x, w, targets, ignore_index, label_smoothing, z_loss, softcap, reduction,
                                  chunk_rows, grad_x, grad_w, dw_f32)
        ctx.computed, ctx.dtypes = (grad_x, grad_w), (x.dtype, w.dtype)
        ctx.save_for_backward(dx, dw)
        ctx.mark_non_differentiable(loss)
        return total, loss

    @staticmethod
    @_once_differentiable
    def backward(ctx, dtotal, dloss):
        return _lm_backward_common(ctx, dtotal)


def _lm_call(*args):
    """The custom op where something traces (torch.compile, export, fake
    tensors), the autograd.Function otherwise: the same _lm, _lm_grad."""
    if HAVE_CUSTOM_OPS and not _value_readable(args[0]):
        return lm_loss_op(*args)[:2]
    return _LMLoss.apply(*args)


def lm_loss(x, w, targets, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None, reduction="mean",
            chunk_rows=None, accum_dtype=None):
    """The LM head and the cross-entropy loss through coda_lm_loss ->
    (loss: 0-dim f32, the mean or sum over the rows not ignored;
    per-token losses (M) f32, 0 on ignored rows, not differentiable).

    x (..., d) (rows of hidden states; bf16, or another float dtype,
    rounded to bf16), w (V, d), targets (...) integers, one per row of x.
    logits = x w^T, softcap tanh(. / softcap) if softcap; per row
    loss = lse - (1 - eps) z_t - (eps / V) sum_j z_j + z_loss lse^2
    (eps = label_smoothing, as torch's cross_entropy; coda.h section 10).
    A target outside [0, V) other than ignore_index gives NaN (no error:
    the GPU cannot refuse it without a sync). reduction: "mean" or "sum"
    ("none" raises: the gradients are made in the forward call with one
    scale). chunk_rows: rows per chunk of logits (None: the library's
    choice, at most max(1 GiB, twice w's bytes) of bf16 logits). accum_dtype: dw's dtype in the
    call, torch.float32 (the chunks summed in f32) or torch.bfloat16
    (rounded after each chunk); None: w's dtype (f32 for other dtypes).

    The gradients for x and w (those that require grad, when grad mode is
    on) are computed in the same call and kept until the backward, which
    multiplies them by grad_output on the device (no stream sync)."""
    if reduction not in LM_REDUCTIONS:
        raise ValueError(_LM_NONE % (reduction,))
    if accum_dtype not in (None, torch.float32, torch.bfloat16):
        raise ValueError("coda.ops.lm_loss: accum_dtype must be None, torch.float32 or torch.bfloat16, got %r"
                         % (accum_dtype,))
    acc = accum_dtype or (w.dtype if w.dtype in (torch.float32, torch.bfloat16) else torch.float32)
    nums = {"label_smoothing": label_smoothing, "z_loss": z_loss, "softcap": 0.0 if softcap is None else softcap}
    for k, v in nums.items():
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError("coda.ops.lm_loss: %s must be a number, got %s" % (k, type(v).__name__))
    ints = {"ignore_index": ignore_index, "chunk_rows": 0 if chunk_rows is None else chunk_rows}
    for k, v in ints.items():
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError("coda.ops.lm_loss: %s must be an int, got %s" % (k, type(v).__name__))
    grad = torch.is_grad_enabled()
    x2 = x.reshape(-1, x.shape[-1])
    return _lm_call(x2, w, targets.reshape(-1), int(ints["ignore_index"]), float(nums["label_smoothing"]),
                    float(nums["z_loss"]), float(nums["softcap"]), reduction, int(ints["chunk_rows"]),
                    grad and x.requires_grad, grad and w.requires_grad, acc == torch.float32)
