"""coda.attention_ops - coda's causal grouped-query attention (coda.h section
11) as a PyTorch operator.

    o, lse = coda.attention_ops.attention(qkv, batch, seq, n_heads, n_kv_heads, head_dim)

qkv (M, nq + 2 nkv) bf16 in the block's layout (M = batch * seq rows, row
r is position r % seq of sequence r // seq; q | k | v column blocks, head
h in columns h * head_dim of its block; nq = n_heads head_dim, nkv =
n_kv_heads head_dim), -> o (M, nq) bf16 and lse (M, n_heads) f32, the
log-sum-exp of each row's scaled scores. Token i attends to tokens j <= i
of its own sequence; query head h reads kv head h // (n_heads /
n_kv_heads). CPU tensors run on coda's CPU oracle (f32, exact softmax, any
even head_dim), CUDA tensors on coda's kernels (head_dim 64 or 128) on the
current torch stream.

With torch >= 2.4 it is the custom operator

    coda::attention(qkv, batch, seq, n_heads, n_kv_heads, head_dim) -> (o, lse)
    coda::attention_backward(qkv, o, lse, do, batch, seq, n_heads, n_kv_heads, head_dim) -> dqkv (f32)

each with a fake (meta) implementation, and autograd registered on the
first (its backward is the second, then cast to qkv's dtype), so it runs
under torch.compile(fullgraph=True), CUDA graphs and activation
checkpointing. With an older torch (Debian's 1.13) the same function is a
torch.autograd.Function (eager only). Either way, where qkv is a coda
block's own output on the eager path (coda.ops.take_link), the call is the
autograd.Function _Linked instead, whose backward hands the f32 dqkv to
the block's backward rather than to autograd.

lse is not differentiable (as FlashAttention's): its gradient would need
D_i = do_i . o_i - dlse_i inside coda_attention_backward, which computes D
itself. lse does not require grad, so a loss of lse alone raises in
backward, and in a loss beside o it is a constant: its term adds nothing
to qkv's gradient (as torch.max's indices; not an error, and so not what
a loss that wants d lse / d qkv may use).

Inputs coda cannot read as they are (columns not contiguous, rows that
overlap as a broadcast tensor's do; on CUDA a base or row stride not
aligned as coda.h asks) are copied first; a wrong dtype,
shape or head_dim is refused by the C call: coda.Error (CODA_ERR_DTYPE,
CODA_ERR_SHAPE, CODA_ERR_UNSUPPORTED), also from the fake implementation
for what it can see (dims, shapes, dtypes). The backward's workspace is a
torch tensor allocated per call (torch's caching allocator makes it cheap,
and under CUDA graph capture it comes from the graph's pool).
"""
from typing import Tuple

import torch

import coda
import coda.ops as _ops

BF = torch.bfloat16


def _ints(batch, seq, n_heads, n_kv_heads, head_dim):
    """The five shape integers as Python ints (bool and non-integers:
    TypeError; outside int64: ValueError), the binding's checks."""
    return tuple(coda._int(v, n) for v, n in ((batch, "batch"), (seq, "seq"), (n_heads, "n_heads"),
                                              (n_kv_heads, "n_kv_heads"), (head_dim, "head_dim")))


_ready = _ops.ready  # t as coda reads it, else a contiguous copy


def _fwd(qkv, batch, seq, n_heads, n_kv_heads, head_dim):
    return coda.attention_forward(_ops.context(), _ready(qkv), None, None, batch, seq, n_heads, n_kv_heads,
                                  head_dim)


def _bwd(qkv, o, lse, do, batch, seq, n_heads, n_kv_heads, head_dim):
    if isinstance(do, torch.Tensor) and do.dtype != BF and do.is_floating_point():
        do = do.to(BF)
    return coda.attention_backward(_ops.context(), _ready(qkv), _ready(o), _ready(lse, 4), _ready(do), None, batch,
                                   seq, n_heads, n_kv_heads, head_dim)


def _refuse(status, name, msg):
    raise coda.Error(status, name, "coda::attention (fake): " + msg)


def _check_meta(what, t, rows, cols, dtype):
    """The C call's shape and dtype checks, for the fake implementations
    (which see no data): the same coda.Error."""
    if t.dim() != 2 or t.shape[0] != rows or t.shape[1] != cols:
        _refuse(2, "CODA_ERR_SHAPE", "%s must be (%d, %d), got %s" % (what, rows, cols, tuple(t.shape)))
    if t.dtype != dtype:
        _refuse(4, "CODA_ERR_DTYPE", "%s must be %s, got %s" % (what, dtype, t.dtype))


def _meta_shape(batch, seq, n_heads, n_kv_heads, head_dim, device):
    # src/api/attention.c's check_shape: batch * seq at most 2^30, n_heads and head_dim at most 2^16
    if (batch < 1 or seq < 1 or n_heads < 1 or n_kv_heads < 1 or n_heads % n_kv_heads or head_dim < 1
            or batch * seq > 1 << 30 or n_heads > 1 << 16 or head_dim > 1 << 16):
        _refuse(2, "CODA_ERR_SHAPE", "batch %d, seq %d, n_heads %d, n_kv_heads %d, head_dim %d"
                % (batch, seq, n_heads, n_kv_heads, head_dim))
    if device.type == "cuda" and head_dim not in (64, 128):
        _refuse(12, "CODA_ERR_UNSUPPORTED", "head_dim = %d: the CUDA kernels take 64 or 128" % head_dim)
    if device.type != "cuda" and head_dim % 2:
        _refuse(2, "CODA_ERR_SHAPE", "head_dim = %d must be even" % head_dim)
    m, nq = batch * seq, n_heads * head_dim
    return m, nq, nq + 2 * n_kv_heads * head_dim


HAVE_CUSTOM_OPS = _ops.HAVE_CUSTOM_OPS

if HAVE_CUSTOM_OPS:
    @torch.library.custom_op("coda::attention", mutates_args=())
    def attention_op(qkv: torch.Tensor, batch: int, seq: int, n_heads: int, n_kv_heads: int,
                     head_dim: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return _fwd(qkv, batch, seq, n_heads, n_kv_heads, head_dim)

    @attention_op.register_fake
    def _(qkv, batch, seq, n_heads, n_kv_heads, head_dim):
        m, nq, w = _meta_shape(batch, seq, n_heads, n_kv_heads, head_dim, qkv.device)
        _check_meta("qkv", qkv, m, w, BF)
        return qkv.new_empty(m, nq, dtype=BF), qkv.new_empty(m, n_heads, dtype=torch.float32)

    @torch.library.custom_op("coda::attention_backward", mutates_args=())
    def attention_backward_op(qkv: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor, batch: int,
                              seq: int, n_heads: int, n_kv_heads: int, head_dim: int) -> torch.Tensor:
        return _bwd(qkv, o, lse, do, batch, seq, n_heads, n_kv_heads, head_dim)

    @attention_backward_op.register_fake
    def _(qkv, o, lse, do, batch, seq, n_heads, n_kv_heads, head_dim):
        m, nq, w = _meta_shape(batch, seq, n_heads, n_kv_heads, head_dim, qkv.device)
        _check_meta("qkv", qkv, m, w, BF)
        _check_meta("o", o, m, nq, BF)
        _check_meta("lse", lse, m, n_heads, torch.float32)
        if do.dim() != 2 or tuple(do.shape) != (m, nq):
            _refuse(2, "CODA_ERR_SHAPE", "do must be (%d, %d), got %s" % (m, nq, tuple(do.shape)))
        if not do.is_floating_point():  # _bwd casts a floating do to bf16; the C call refuses the rest
            _refuse(4, "CODA_ERR_DTYPE", "do_ must be bf16, got %s" % do.dtype)
        return qkv.new_empty(m, w, dtype=torch.float32)

    def _setup(ctx, inputs, output):
        qkv = inputs[0]
        o, lse = output
        ctx.save_for_backward(qkv, o, lse)
        ctx.shape = tuple(inputs[1:])
        ctx.mark_non_differentiable(lse)

    def _backward(ctx, do, dlse):
        qkv, o, lse = ctx.saved_tensors
        if do is None or not ctx.needs_input_grad[0]:
            return (None,) * 6
        dqkv = attention_backward_op(qkv, o, lse, do.to(BF), *ctx.shape)
        return (dqkv.to(qkv.dtype),) + (None,) * 5

    torch.library.register_autograd("coda::attention", _ops.once_eager(_backward), setup_context=_setup)

    def _call(qkv, shape):
        return attention_op(qkv, *shape)

else:
    class _Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, qkv, batch, seq, n_heads, n_kv_heads, head_dim):
            o, lse = _fwd(qkv, batch, seq, n_heads, n_kv_heads, head_dim)
            ctx.save_for_backward(qkv, o, lse)
            ctx.shape = (batch, seq, n_heads, n_kv_heads, head_dim)
            ctx.mark_non_differentiable(lse)
            return o, lse

        @staticmethod
        @_ops._once_differentiable
        def backward(ctx, do, dlse):
            qkv, o, lse = ctx.saved_tensors
            if do is None or not ctx.needs_input_grad[0]:
                return (None,) * 6
            dqkv = _bwd(qkv, o, lse, do.to(BF), *ctx.shape)
            return (dqkv.to(qkv.dtype),) + (None,) * 5

    def _call(qkv, shape):
        return _Attention.apply(qkv, *shape)

    def attention_op(qkv, batch, seq, n_heads, n_kv_heads, head_dim):
        """Without custom ops: the autograd.Function."""
        return _Attention.apply(qkv, batch, seq, n_heads, n_kv_heads, head_dim)

    def attention_backward_op(qkv, o, lse, do, batch, seq, n_heads, n_kv_heads, head_dim):
        """Without custom ops: the binding's call."""
        return _bwd(qkv, o, lse, do, batch, seq, n_heads, n_kv_heads, head_dim)


class _Linked(torch.autograd.Function):
    """attention() on a coda block's own qkv on the eager path (coda.ops.
    take_link): the f32 dqkv coda_attention_backward makes goes to the
    block's backward through the call's Link as it is, instead of being
    cast to bf16 for autograd (a pass over (M, nqkv) saved, and the RoPE
    backward reads the f32 values). qkv's own gradient is then None."""
    @staticmethod
    def forward(ctx, qkv, link, batch, seq, n_heads, n_kv_heads, head_dim):
        o, lse = _fwd(qkv, batch, seq, n_heads, n_kv_heads, head_dim)
        ctx.save_for_backward(qkv, o, lse)
        ctx.shape, ctx.link = (batch, seq, n_heads, n_kv_heads, head_dim), link
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    @_ops._once_differentiable
    def backward(ctx, do, dlse):
        _ops.refuse_second_order("attention's backward", do)
        if do is not None:
            qkv, o, lse = ctx.saved_tensors
            _ops.hand_over(ctx.link, _bwd(qkv, o, lse, do.to(BF), *ctx.shape))
        return (None,) * 7


def attention(qkv, batch, seq, n_heads, n_kv_heads, head_dim):
    """Causal grouped-query attention through coda -> (o (M, nq) bf16,
    lse (M, n_heads) f32, not differentiable). qkv (M, nq + 2 nkv) bf16,
    M = batch * seq. Differentiable in qkv (dqkv from
    coda_attention_backward, in f32, cast to qkv's dtype; where qkv is a
    coda block's own output on the eager path, handed to the block's
    backward in f32 instead, and qkv's own gradient is None)."""
    if not isinstance(qkv, torch.Tensor):
        raise TypeError("coda.attention_ops.attention: qkv must be a torch.Tensor, got %s" % type(qkv).__name__)
    shape = _ints(batch, seq, n_heads, n_kv_heads, head_dim)
    link = _ops.take_link(qkv)
    if link is not None:
        try:
            return _Linked.apply(qkv, link, *shape)
        except BaseException:
            link.taken = False  # refused: nothing recorded, the Link free for another consumer
            raise
    # (Activation checkpointing of this call alone recomputes it here, the
    # Link taken by the original: the recompute must save what _Linked saved,
    # (qkv, o, lse), which _call's paths do.)
    return _call(qkv, shape)
