"""The plain reference layer (reference.h) from Python, through ctypes.

It is not in libcoda.so: the Makefile builds it, with the part of libcoda it
calls, into its own build/tests/liboracle.so ($CODA_ORACLE_LIB, which `make
test-py` sets). RefWeights and RefLayer restate the leading fields of
coda__ref_weights_t and coda__ref_layer_t; tests/test_binding_layout.py
checks them against the C compiler's layout (tests/print_layouts.c).
"""
import ctypes
import os

import torch

import coda

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

F64, BF16 = 0, 1  # coda__ref_mode_t

_DP = ctypes.POINTER(ctypes.c_double)
WEIGHTS = ["wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "g1", "g2", "gf", "wlm"]


class RefWeights(ctypes.Structure):
    """coda__ref_weights_t: float64 arrays in PyTorch's layout."""
    _fields_ = [(n, _DP) for n in WEIGHTS]


class RefLayer(ctypes.Structure):
    """The leading fields of coda__ref_layer_t (the rest is never touched here)."""
    _fields_ = [("cfg", coda.LlamaConfig), ("batch", ctypes.c_int64), ("seq", ctypes.c_int64),
                ("m", ctypes.c_int64), ("nq", ctypes.c_int64), ("nkv", ctypes.c_int64),
                ("w", RefWeights), ("x", _DP), ("targets", ctypes.POINTER(ctypes.c_int32)),
                ("use_loss", ctypes.c_int), ("loss_scale", ctypes.c_double), ("dy", _DP),
                ("use_dy", ctypes.c_int), ("y", _DP), ("loss", _DP), ("dx", _DP),
                ("grad", RefWeights)]


def _load():
    path = os.environ.get("CODA_ORACLE_LIB") or os.path.join(_REPO, "build", "tests", "liboracle.so")
    if not os.path.exists(path):
        raise OSError("reference: %s not found (run `make`, or set CODA_ORACLE_LIB)" % path)
    lib = ctypes.CDLL(path)
    lib.coda__ref_create.restype = ctypes.c_int
    lib.coda__ref_create.argtypes = [ctypes.POINTER(coda.LlamaConfig), ctypes.c_int64, ctypes.c_int64,
                                     ctypes.POINTER(ctypes.POINTER(RefLayer))]
    lib.coda__ref_free.restype = None
    lib.coda__ref_free.argtypes = [ctypes.POINTER(RefLayer)]
    lib.coda__ref_forward.restype = ctypes.c_int
    lib.coda__ref_forward.argtypes = [ctypes.POINTER(RefLayer), ctypes.c_int]
    lib.coda__ref_backward.restype = ctypes.c_int
    lib.coda__ref_backward.argtypes = [ctypes.POINTER(RefLayer)]
    return lib


lib = _load()


def _check(status, call):
    # The library's message (coda_last_error) stays inside liboracle.so's own
    # copy of libcoda; the status says which kind of failure it was.
    if status != 0:
        raise RuntimeError("reference: %s: %s" % (call, coda.lib.coda_status_name(status).decode()))


def _put(ptr, t):
    t = t.detach().to("cpu", torch.float64).contiguous().view(-1)
    ctypes.memmove(ptr, t.data_ptr(), t.numel() * 8)


def _get(ptr, shape):
    n = 1
    for s in shape:
        n *= s
    out = torch.empty(n, dtype=torch.float64)
    ctypes.memmove(out.data_ptr(), ptr, n * 8)
    return out.view(*shape)


def run_reference(cfg, B, S, W16, x16, targets, dy16, loss_scale, mode):
    """Forward and backward of the reference layer in `mode` (F64 or BF16) on
    torch tensors in PyTorch's layout (W16: a dict named as WEIGHTS; gf and
    wlm only with a vocabulary); returns y, dx, loss (with targets) and every
    weight's gradient as float64 tensors."""
    p = ctypes.POINTER(RefLayer)()
    _check(lib.coda__ref_create(ctypes.byref(cfg), B, S, ctypes.byref(p)), "coda__ref_create")
    try:
        r = p.contents
        for k in WEIGHTS:
            if k in W16:
                _put(getattr(r.w, k), W16[k])
        _put(r.x, x16)
        r.use_dy = 1 if dy16 is not None else 0
        if dy16 is not None:
            _put(r.dy, dy16)
        r.use_loss = 1 if (cfg.vocab > 0 and targets is not None) else 0
        r.loss_scale = loss_scale
        if r.use_loss:
            t = targets.to(torch.int32).contiguous()
            ctypes.memmove(r.targets, t.data_ptr(), t.numel() * 4)
        _check(lib.coda__ref_forward(p, mode), "coda__ref_forward")
        _check(lib.coda__ref_backward(p), "coda__ref_backward")
        M, d = B * S, cfg.d
        res = {"y": _get(r.y, (M, d)), "dx": _get(r.dx, (M, d))}
        if r.use_loss:
            res["loss"] = _get(r.loss, (M,))
        for k in WEIGHTS:
            if k in W16:
                res[k] = _get(getattr(r.grad, k), tuple(W16[k].shape))
        return res
    finally:
        lib.coda__ref_free(p)
