"""Causal grouped-query attention (coda.h section 11)."""

import ctypes

import torch

from ._lib import (AttentionShape, DEVICE_CPU, DEVICE_CUDA, _check, _device, _int, _opt, _stream, _workspace,
    _workspace_bytes, lib)


def _attn_shape(batch, seq, n_heads, n_kv_heads, head_dim):
    return AttentionShape(batch, seq, n_heads, n_kv_heads, head_dim)


def _attn_stream(stream, *tensors):
    """The stream argument of an attention call as a void *: None -> the
    current torch stream of the first CUDA tensor (NULL on the CPU); a
    torch.cuda.Stream (or anything with .cuda_stream), a ctypes.c_void_p
    or an int (a cudaStream_t's value) as given."""
    if stream is None:
        return _stream(*tensors)
    if hasattr(stream, "cuda_stream"):
        return ctypes.c_void_p(stream.cuda_stream)
    if isinstance(stream, ctypes.c_void_p):
        return stream
    return ctypes.c_void_p(_int(stream, "stream") or None)


def _attn_out(t, rows, cols, dtype, like):
    """An output given (returned as it is, C checks it) or, for None, a new
    (rows, cols) tensor of dtype on like's device."""
    if t is not None:
        return t
    if not isinstance(like, torch.Tensor):
        raise TypeError("coda: qkv must be a torch.Tensor, got %s" % type(like).__name__)
    return torch.empty(max(rows, 0), max(cols, 0), dtype=dtype, device=like.device)


def attention_workspace_size(ctx, device, batch, seq, n_heads, n_kv_heads, head_dim):
    """Bytes of workspace coda_attention_backward needs for this shape on
    device "cpu" (0) or "cuda" (D and lse log2(e) as two (batch, n_heads,
    seq rounded up to 128) f32 planes, then 2 counters a 64 of those rows,
    rounded up to 256 bytes: coda.h section 11). The shape is checked as the calls check it (coda.Error)."""
    device = _device(device)
    shape = _attn_shape(batch, seq, n_heads, n_kv_heads, head_dim)
    n = ctypes.c_size_t()
    _check(lib.coda_attention_workspace_size(ctx.handle, DEVICE_CUDA if device.type == "cuda" else DEVICE_CPU,
                                             ctypes.byref(shape), ctypes.byref(n)))
    return n.value


def attention_forward(ctx, qkv, o, lse, batch, seq, n_heads, n_kv_heads, head_dim, stream=None):
    """coda_attention_forward: causal grouped-query attention over the
    block's layout (coda.h section 11). M = batch * seq rows (row r is
    position r % seq of sequence r // seq); qkv (M, nq + 2 nkv) bf16 holds
    q | k | v (nq = n_heads head_dim, nkv = n_kv_heads head_dim); query
    head h reads kv head h // (n_heads // n_kv_heads). Outputs, written in
    place: o (M, nq) bf16 and lse (M, n_heads) f32, the log-sum-exp of each
    row's scaled scores (None: allocated). Row strides are free (views of
    wider buffers work); on CUDA head_dim is 64 or 128, columns contiguous,
    and base and row stride 16-byte aligned for qkv, o and do, 8 for dqkv,
    4 for lse. stream: None runs on the current torch
    stream of qkv's device. -> (o, lse). Refusals: coda.Error (dtype,
    shape, stride, overlap, device), nothing written."""
    shape = _attn_shape(batch, seq, n_heads, n_kv_heads, head_dim)
    m, nq = shape.batch * shape.seq, shape.n_heads * shape.head_dim
    o = _attn_out(o, m, nq, torch.bfloat16, qkv)
    lse = _attn_out(lse, m, shape.n_heads, torch.float32, qkv)
    _check(lib.coda_attention_forward(ctx.handle, ctypes.byref(shape), _opt(qkv), _opt(o), _opt(lse),
                                      _attn_stream(stream, qkv, o, lse)))
    return o, lse


def attention_backward(ctx, qkv, o, lse, do, dqkv, batch, seq, n_heads, n_kv_heads, head_dim, workspace=None,
                       stream=None):
    """coda_attention_backward: dqkv (M, nq + 2 nkv) f32 = dL/dqkv (every
    element written, in qkv's column blocks) from the forward's qkv, its o
    (as stored) and lse, and do = dL/do (M, nq) bf16 (coda.h section 11).
    dqkv None: allocated. workspace: a tensor on qkv's device of at least
    attention_workspace_size bytes, 256-byte aligned (None: one is
    allocated from torch for the call; the CPU needs none). stream as in
    attention_forward. -> dqkv."""
    shape = _attn_shape(batch, seq, n_heads, n_kv_heads, head_dim)
    m = shape.batch * shape.seq
    width = (shape.n_heads + 2 * shape.n_kv_heads) * shape.head_dim
    dqkv = _attn_out(dqkv, m, width, torch.float32, qkv)
    if not isinstance(qkv, torch.Tensor):
        raise TypeError("coda: qkv must be a torch.Tensor, got %s" % type(qkv).__name__)
    device = _device(qkv.device, "qkv's device")
    buf = None
    if workspace is None:
        n = attention_workspace_size(ctx, device, shape.batch, shape.seq, shape.n_heads, shape.n_kv_heads,
                                     shape.head_dim)
        ws = None
        if n:
            buf, ws = _workspace(n, device)
    else:
        if not isinstance(workspace, torch.Tensor):
            raise TypeError("coda: attention_backward: workspace must be a torch.Tensor or None, got %s"
                            % type(workspace).__name__)
        if workspace.device != qkv.device:
            # C cannot tell a host pointer from a device one
            raise ValueError("coda: attention_backward: workspace is on %s, qkv on %s"
                             % (workspace.device, qkv.device))
        buf, ws, n = workspace, ctypes.c_void_p(workspace.data_ptr()), _workspace_bytes(workspace,
                                                                                         "attention_backward")
    _check(lib.coda_attention_backward(ctx.handle, ctypes.byref(shape), _opt(qkv), _opt(o), _opt(lse), _opt(do),
                                       _opt(dqkv), ws, n, _attn_stream(stream, qkv, dqkv)))
    del buf  # held until the call is queued (torch's allocator orders its reuse on the stream)
    return dqkv
