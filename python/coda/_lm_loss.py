"""The LM head and the cross-entropy loss (coda.h section 10), and scale_."""

import ctypes

import torch

from ._lib import (DEVICE_CPU, DEVICE_CUDA, LMLossOptions, _check, _dense_1d, _device, _int, _opt, _stream,
    _workspace, _workspace_bytes, lib)


def lm_loss_options(opts=None, **fields):
    """An LMLossOptions: a copy of opts (None: coda_lm_loss_opts_init's
    defaults) with the given fields set (ignore_index, label_smoothing,
    z_loss, softcap, grad_scale, reduction "mean"/"sum", accumulate,
    chunk_rows)."""
    if opts is None:
        return LMLossOptions(**fields)
    if not isinstance(opts, LMLossOptions):
        raise TypeError("coda: opts must be a coda.LMLossOptions or None, got %s" % type(opts).__name__)
    o = LMLossOptions.from_buffer_copy(opts)
    for k, v in fields.items():
        setattr(o, k, v)
    return o


# (context, device, m, d, vocab, the options' bytes) -> bytes: the size is a
# function of these alone (coda.h section 10), and the C call through ctypes
# costs more than the lookup
_lm_ws_sizes = {}


def lm_loss_workspace_size(ctx, device, m, d, vocab, opts=None, **fields):
    """Bytes of workspace coda_lm_loss needs for m rows, hidden size d and
    vocabulary `vocab` with these options, on device "cpu" or "cuda"."""
    device = _device(device)
    o = lm_loss_options(opts, **fields)
    kind = DEVICE_CUDA if device.type == "cuda" else DEVICE_CPU
    m, d, vocab = _int(m, "m"), _int(d, "d"), _int(vocab, "vocab")
    key = (ctx.handle.value, kind, m, d, vocab, bytes(o))
    n = _lm_ws_sizes.get(key)
    if n is None:
        c = ctypes.c_size_t()
        _check(lib.coda_lm_loss_workspace_size(ctx.handle, kind, m, d, vocab, ctypes.byref(o), ctypes.byref(c)))
        n = c.value
        if len(_lm_ws_sizes) >= 256:  # a bounded memo: the sizes a training run asks for are few
            _lm_ws_sizes.clear()
        _lm_ws_sizes[key] = n
    return n


def _lm_targets(targets, device, ignore_index):
    """Cross-entropy targets as the (M) int32 or int64 tensor coda_lm_loss
    reads, without reading them on the host (no stream sync): int32 and
    int64 pass as they are (the library narrows int64 on the device, a
    value outside [0, V) that is not ignore_index giving its row NaN); other
    integer dtypes are converted to int32 on `device`, a value outside int32
    (which the conversion would wrap to another, valid-looking class) first
    replaced by a negative value that is not ignore_index. Floats and bools
    -> TypeError (a class index is an integer)."""
    if not isinstance(targets, torch.Tensor):
        raise TypeError("coda: targets must be a torch.Tensor, got %s" % type(targets).__name__)
    if targets.dtype == torch.bool or targets.is_floating_point() or targets.is_complex():
        raise TypeError("coda: targets must be an integer tensor (class indices), got %s" % targets.dtype)
    t = targets.to(device)
    if t.dtype not in (torch.int32, torch.int64):
        info = torch.iinfo(t.dtype)
        lo, hi = -2 ** 31, 2 ** 31 - 1
        if ignore_index != lo and (info.max > hi or info.min < lo):
            # one pass: a value above int32 becomes 2^31 - 1 (>= V: NaN),
            # one below becomes -2^31 (negative, not ignore_index: NaN)
            t = t.clamp(min=lo if info.min < lo else None, max=hi if info.max > hi else None)
        elif info.max > hi or info.min < lo:  # ignore_index is -2^31 itself
            bad = t > hi
            if info.min < 0:
                bad = bad | (t < lo)
            t = t.masked_fill(bad, -1)
        t = t.to(torch.int32)
    return _dense_1d(t)


def lm_loss(ctx, x, w, targets, loss=None, total=None, dx=None, dw=None, opts=None, workspace=None, **fields):
    """coda_lm_loss: the LM head (logits = x w^T, softcapped if asked) and
    the cross-entropy loss, forward and, for the outputs dx and dw given,
    backward, in one call, the rows in chunks so that the (M, V) logits
    never exist at once (coda.h section 10, docs/lm_loss.md).

    x (M, d) bf16; w (V, d) bf16; targets (M) integers (int32 and int64 as they are,
    other integer dtypes converted on x's device without a sync; see
    _lm_targets). Options: opts (an LMLossOptions) and/or its fields as
    keywords. Outputs, written in place: loss (M) f32, each row's loss
    (allocated when None); total (1) f32; dx (M, d) bf16 or f32; dw (V, d)
    f32 or bf16: the gradients of grad_scale * total (added to their
    contents with accumulate=True). workspace: a uint8 tensor on x's
    device of at least lm_loss_workspace_size bytes, 256-byte aligned
    (None: one is allocated for the call). Runs on the current CUDA
    stream. -> (loss, total, dx, dw)."""
    o = lm_loss_options(opts, **fields)
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise TypeError("coda: lm_loss: x and w must be torch.Tensors, got %s and %s"
                        % (type(x).__name__, type(w).__name__))
    device = _device(x.device, "x's device")
    m = x.shape[0] if x.dim() > 0 else 0
    targets = _lm_targets(targets, device, o.ignore_index)
    if loss is None:
        loss = torch.empty(m, dtype=torch.float32, device=device)
    if workspace is None:
        n = lm_loss_workspace_size(ctx, device, m, x.shape[1] if x.dim() > 1 else 0,
                                   w.shape[0] if w.dim() > 0 else 0, o)
        buf, ws = _workspace(n, device)
    else:
        if not isinstance(workspace, torch.Tensor):
            raise TypeError("coda: lm_loss: workspace must be a torch.Tensor or None, got %s"
                            % type(workspace).__name__)
        buf, ws, n = workspace, ctypes.c_void_p(workspace.data_ptr()), _workspace_bytes(workspace, "lm_loss")
    _check(lib.coda_lm_loss(ctx.handle, _opt(x), _opt(w), _opt(targets), ctypes.byref(o), _opt(loss), _opt(total),
                            _opt(dx), _opt(dw), ws, n, _stream(x, w, loss)))
    del buf  # held until the call is queued (torch's allocator orders its reuse on the stream)
    return loss, total, dx, dw


def scale_(ctx, t, s):
    """coda_scale: t *= s in place, on t's device and its current stream;
    s a one-element tensor on t's device (0-dim is fine; taken as f32 on
    the device, no host read). t (R, C) or (C) bf16 or f32, rows
    contiguous. s is rounded to t's dtype and each product rounded once,
    as t.mul_(s.to(t.dtype)); when the rounded s is exactly 1 the kernel
    stops without touching t, so a grad_output of 1 costs no pass over t
    and no stream sync. -> t."""
    if not isinstance(t, torch.Tensor) or not isinstance(s, torch.Tensor):
        raise TypeError("coda: scale_: t and s must be torch.Tensors, got %s and %s"
                        % (type(t).__name__, type(s).__name__))
    if s.numel() != 1:
        raise ValueError("coda: scale_: s must have one element, got shape %s" % (tuple(s.shape),))
    s1 = s.reshape(1) if s.dtype == torch.float32 else s.reshape(1).to(torch.float32)
    _check(lib.coda_scale(ctx.handle, _opt(t), _opt(s1), _stream(t, s1)))
    return t
