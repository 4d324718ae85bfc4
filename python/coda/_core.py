"""The context, the plain GEMM, epilogue programs, the fused GEMM and the
finishing steps (coda.h sections 1-7)."""

import collections.abc
import ctypes
import os

import torch

from ._lib import (ARG_KINDS, Binding, ContextOptions, DEVICE_CPU, DEVICE_CUDA, REDUCE, SPACES, Tiling,
    _C_INT_BITS, _Handle, _VP, _check, _cstr, _cuda0, _device, _float, _int, _layout, _opt, _ref, _stream,
    describe_tensor, lib)


class Context(_Handle):
    """coda_context_t: the backends. Context(cpu_threads=0, cache_dir=None)."""
    _free = "coda_context_free"

    def __init__(self, cpu_threads=0, cache_dir=None):
        if cache_dir is not None:
            try:
                cache_dir = os.fsdecode(cache_dir)  # a str, bytes or pathlib.Path
            except TypeError:
                raise TypeError("coda: cache_dir must be a str or a path, got %s"
                                % type(cache_dir).__name__) from None
        opts = ContextOptions(_int(cpu_threads, "cpu_threads", _C_INT_BITS),
                              _cstr(cache_dir, "cache_dir") if cache_dir else None)
        h = _VP()
        _check(lib.coda_context_create(ctypes.byref(opts), ctypes.byref(h)))
        self._h = h

    @property
    def handle(self):
        return self._h

    def describe(self):
        buf = ctypes.create_string_buffer(4096)
        _check(lib.coda_context_describe(self._h, buf, len(buf)))
        return buf.value.decode()

    @property
    def has_cuda(self):
        return bool(lib.coda_context_has_cuda(self._h))


# ---------------------------------------------------------------------------
# Plain GEMM, programs, fused GEMM, finishing steps
# ---------------------------------------------------------------------------

def gemm(ctx, layout, a, b, c, alpha=1.0, beta=0.0):
    """c = alpha op(a) op(b) + beta c in place; layout "nt" (c = a b^T), "nn"
    (c = a b) or "tn" (c = a^T b)."""
    _check(lib.coda_gemm(ctx.handle, _layout(layout), _opt(a), _opt(b), _opt(c),
                         _float(alpha, "alpha"), _float(beta, "beta"), _stream(a, b, c)))
    return c


class Program(_Handle):
    """An epilogue program. Program(text) parses and verifies it; str(p) is
    its printed text; p.args lists (name, kind, dtype, space, reduce)."""
    _free = "coda_program_free"

    def __init__(self, text):
        # a NUL would end the C string early and the rest would be dropped
        # unparsed (the C CLI refuses such a file too)
        data = _cstr(text, "Program text")
        h = _VP()
        _check(lib.coda_program_parse(data, ctypes.byref(h)))
        self._h = h

    @classmethod
    def builtin(cls, name):
        return cls(builtin_program(name))

    @property
    def handle(self):
        return self._h

    def __str__(self):
        n = ctypes.c_size_t()
        buf = ctypes.create_string_buffer(4096)
        st = lib.coda_program_print(self._h, buf, len(buf), ctypes.byref(n))
        if st != 0 and n.value >= len(buf):
            buf = ctypes.create_string_buffer(n.value + 1)
            st = lib.coda_program_print(self._h, buf, len(buf), ctypes.byref(n))
        _check(st)
        return buf.value.decode()

    @property
    def args(self):
        out = []
        for i in range(lib.coda_program_num_args(self._h)):
            name = ctypes.c_char_p()
            kind, dtype, space, red = (ctypes.c_int() for _ in range(4))
            _check(lib.coda_program_arg_info(self._h, i, ctypes.byref(name), ctypes.byref(kind),
                                             ctypes.byref(dtype), ctypes.byref(space),
                                             ctypes.byref(red)))
            out.append((name.value.decode(), ARG_KINDS[kind.value], dtype.value,
                        SPACES.get(space.value, space.value), red.value))
        return out

    def _arg_kind(self, cname):
        """The kind ("in_scalar", "in_tile", ...) of the argument called
        cname (bytes), or None if the program has no such argument."""
        i = lib.coda_program_find_arg(self._h, cname)
        if i < 0:
            return None
        name = ctypes.c_char_p()
        kind, dtype, space, red = (ctypes.c_int() for _ in range(4))
        _check(lib.coda_program_arg_info(self._h, i, ctypes.byref(name), ctypes.byref(kind),
                                         ctypes.byref(dtype), ctypes.byref(space), ctypes.byref(red)))
        return ARG_KINDS[kind.value]


def choose_tiling(ctx, device, layout, m, n, k, program=None):
    """(tile_m, tile_n) the backend uses by default; device "cpu", "cuda" or
    "cuda:0" (the C call answers for CUDA device 0 only). With a Program,
    the tiling for it (on CUDA this also picks the GPU schedule:
    coda_choose_program_tiling in coda.h)."""
    device = _cuda0(_device(device), "device")
    dev = DEVICE_CUDA if device.type == "cuda" else DEVICE_CPU
    lay = _layout(layout)
    m, n, k = _int(m, "m"), _int(n, "n"), _int(k, "k")
    if program is not None and not isinstance(program, Program):
        raise TypeError("coda: program must be a coda.Program or None, got %s" % type(program).__name__)
    t = Tiling()
    if program is None:
        _check(lib.coda_choose_tiling(ctx.handle, dev, lay, m, n, k, ctypes.byref(t)))
    else:
        _check(lib.coda_choose_program_tiling(ctx.handle, dev, lay, m, n, k, program.handle,
                                              ctypes.byref(t)))
    return t.tile_m, t.tile_n


def _tiling(tiling):
    """A Tiling from None or a pair (tile_m, tile_n) of ints (0: default)."""
    if tiling is None:
        return None
    if not isinstance(tiling, (tuple, list)):
        raise TypeError("coda: tiling must be None or a pair (tile_m, tile_n), got %s"
                        % type(tiling).__name__)
    if len(tiling) != 2:
        # a 1-tuple would otherwise leave tile_n 0, the default, unasked
        raise ValueError("coda: tiling must be a pair (tile_m, tile_n), got %d values" % len(tiling))
    return Tiling(_int(tiling[0], "tiling[0] (tile_m)", _C_INT_BITS),
                  _int(tiling[1], "tiling[1] (tile_n)", _C_INT_BITS))


def gemm_epilogue(ctx, layout, a, b, program, bindings, tiling=None):
    """Run op(a) op(b) with an epilogue program. bindings: dict argument name
    -> torch tensor (tiles, vectors, partials) or number (scalars). The value
    must match the argument's kind (coda_program_arg_info): a tensor for a
    scalar argument, or a number for a tensor argument, raises TypeError (a
    coda_binding_t has both fields, and C would read the unset one)."""
    if isinstance(program, str):
        program = Program(program)
    if not isinstance(program, Program):
        raise TypeError("coda: program must be a coda.Program or its text, got %s" % type(program).__name__)
    if not isinstance(bindings, collections.abc.Mapping):
        raise TypeError("coda: bindings must be a dict name -> tensor or number, got %s"
                        % type(bindings).__name__)
    lay, til = _layout(layout), _tiling(tiling)
    arr = (Binding * max(1, len(bindings)))()
    keep, tensors = [], []
    for i, (name, v) in enumerate(bindings.items()):
        cname = _cstr(name, "binding name")
        arr[i].name = cname
        keep.append(cname)
        kind = program._arg_kind(cname)
        if kind == "in_scalar":
            if isinstance(v, torch.Tensor):
                raise TypeError("coda: program argument %r is a scalar: bind a number, not a "
                                "torch.Tensor" % name)
            arr[i].scalar = _float(v, "scalar argument %r" % name)
        elif kind is not None:
            if not isinstance(v, torch.Tensor):
                raise TypeError("coda: program argument %r (%s) needs a torch.Tensor, got %s"
                                % (name, kind, type(v).__name__))
            arr[i].tensor = describe_tensor(v)
            tensors.append(v)
        # else: no such argument; left empty, coda_gemm_epilogue reports it
        # (CODA_ERR_BINDING, naming it)
    _check(lib.coda_gemm_epilogue(ctx.handle, lay, _opt(a), _opt(b), program.handle,
                                  arr, len(bindings), _ref(til), _stream(a, b, *tensors)))


def finish_reduce(ctx, op, partials, out):
    """out[i] = reduce over t of partials[i][t]; op "sum", "max" or "sumsq"."""
    if isinstance(op, str):
        if op not in REDUCE:
            raise ValueError("coda: op must be one of sum, max, sumsq (got %r)" % op)
        op = REDUCE[op]
    else:
        op = _int(op, "op", _C_INT_BITS)  # an enum value; C checks which
    _check(lib.coda_finish_reduce(ctx.handle, op, _opt(partials), _opt(out), _stream(partials, out)))
    return out


def finish_rstd(ctx, partials, d, eps, rstd):
    """rstd[i] = (sum_t partials[i][t] / d + eps)^(-1/2)."""
    _check(lib.coda_finish_rstd(ctx.handle, _opt(partials), _int(d, "d"), _float(eps, "eps"),
                                _opt(rstd), _stream(partials, rstd)))
    return rstd


def finish_lse(ctx, partials, targets, lse, loss, ignore_index=-100):
    """Cross-entropy from (M, T, 3) lse partials and (M) int32 targets."""
    _check(lib.coda_finish_lse(ctx.handle, _opt(partials), _opt(targets),
                               _int(ignore_index, "ignore_index", 32), _opt(lse), _opt(loss),
                               _stream(partials, lse)))
    return lse, loss


def builtin_program(name):
    """Text of a built-in epilogue program of the layer."""
    s = lib.coda_builtin_program(_cstr(name, "builtin program name"))
    if s is None:
        raise KeyError("coda: no built-in program %r" % name)
    return s.decode()


def builtin_program_names():
    p = lib.coda_builtin_program_names()
    out, i = [], 0
    while p[i] is not None:
        out.append(p[i].decode())
        i += 1
    return out
