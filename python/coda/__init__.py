"""coda: a ctypes binding of libcoda (GEMMs whose epilogues are small programs).

The library is found at $CODA_LIB, else inside the installed package
(`pip install .`), else at <repo>/build/libcoda.so. Tensors
are torch tensors (CPU, or CUDA when the library was built with CUDA); they
are described to coda by pointer, dtype, device and byte strides, never
copied. Every failing call raises coda.Error carrying the status name and
coda_last_error(). Arguments the C call could not take as given (a wrong
type, an integer outside its C type, a NUL inside a string, an unknown
device, weights not from pack_weights) raise TypeError or ValueError before
any C call: see "What raises what" in python/README.md, and include/coda.h
(the contract).

    import torch, coda
    ctx = coda.Context()
    a = torch.randn(7, 64).bfloat16(); b = torch.randn(24, 64).bfloat16()
    c = torch.empty(7, 24)
    coda.gemm(ctx, "nt", a, b, c)                       # c = a @ b.T
"""

import collections.abc
import ctypes
import math
import numbers
import os

import torch

__all__ = [
    "Error", "Context", "Program", "LlamaConfig", "Llama", "describe_tensor", "gemm",
    "gemm_epilogue", "choose_tiling", "finish_reduce", "finish_rstd", "finish_lse",
    "builtin_program", "builtin_program_names", "PackedWeights", "pack_weights", "unpack_grads",
    "Block", "LMLossOptions", "lm_loss_options", "lm_loss_workspace_size", "lm_loss", "AttentionShape",
    "attention_workspace_size", "attention_forward", "attention_backward", "scale_", "lib",
]

# ---------------------------------------------------------------------------
# Loading and errors
# ---------------------------------------------------------------------------

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load():
    """$CODA_LIB if set; else the copy `pip install` put in the package;
    else the repository's build/libcoda.so (running from a checkout)."""
    path = os.environ.get("CODA_LIB")
    if not path:
        here = os.path.dirname(os.path.abspath(__file__))
        packaged = os.path.join(here, "libcoda.so")
        path = packaged if os.path.exists(packaged) else os.path.join(_REPO, "build", "libcoda.so")
    if not os.path.exists(path):
        raise OSError("coda: library not found at %s (`pip install .` in the repository, `make lib`, "
                      "or set CODA_LIB)" % path)
    return ctypes.CDLL(path)


lib = _load()


class Error(RuntimeError):
    """A coda call failed. .status is the integer status, .name its constant
    name (e.g. "CODA_ERR_SHAPE"), .message coda_last_error()."""

    def __init__(self, status, name, message):
        super().__init__("%s: %s" % (name, message))
        self.status, self.name, self.message = status, name, message


lib.coda_status_name.restype = ctypes.c_char_p
lib.coda_status_name.argtypes = [ctypes.c_int]
lib.coda_last_error.restype = ctypes.c_char_p
lib.coda_last_error.argtypes = []


def _check(status):
    if status != 0:
        name = lib.coda_status_name(status).decode()
        raise Error(status, name, lib.coda_last_error().decode(errors="replace"))


# ---------------------------------------------------------------------------
# Argument checks
#
# ctypes converts quietly: an int too big for a C int keeps its low bits
# (2**40 becomes 0, which coda reads as "the default"), True becomes 1, a
# float beyond float32 becomes inf, and a char* stops at the first NUL. So
# every value that goes into a C int, int32_t, int64_t, float or string is
# checked here first, and the error names the argument.
# ---------------------------------------------------------------------------

_C_INT_BITS = 8 * ctypes.sizeof(ctypes.c_int)


def _int(v, what, bits=64):
    """v as a Python int that fits a signed C integer of `bits` bits.
    bool and non-integers (floats, tensors, strings) -> TypeError; out of
    range -> ValueError."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError("coda: %s must be an int, got %s" % (what, type(v).__name__))
    v = int(v)
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if not lo <= v <= hi:
        raise ValueError("coda: %s = %d is out of range for a %d-bit C integer (%d..%d)"
                         % (what, v, bits, lo, hi))
    return v


def _float(v, what):
    """v as a Python float for a C float. bool and non-numbers (tensors,
    strings) -> TypeError; a finite value that float32 cannot hold (it would
    arrive as inf) -> ValueError. inf and nan pass: the C call refuses them
    (coda.Error, CODA_ERR_INVALID_ARG) wherever it takes a float."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError("coda: %s must be a real number, got %s" % (what, type(v).__name__))
    try:
        f = float(v)
    except OverflowError:  # an int too large for a double
        raise ValueError("coda: %s = %d is too large for a C float" % (what, v)) from None
    if math.isfinite(f) and not math.isfinite(ctypes.c_float(f).value):
        raise ValueError("coda: %s = %r is too large for a C float (it would become inf)" % (what, f))
    return f


def _cstr(s, what):
    """str s as bytes for a C string. Non-str -> TypeError; an embedded NUL
    (C would see only the text before it) -> ValueError."""
    if not isinstance(s, str):
        raise TypeError("coda: %s must be a str, got %s" % (what, type(s).__name__))
    if "\0" in s:
        raise ValueError("coda: %s contains a NUL character (at offset %d); C would read only "
                         "the text before it" % (what, s.index("\0")))
    return s.encode()


def _device(device, what="device"):
    """torch.device for "cpu", "cuda", "cuda:N" (a str or a torch.device).
    Anything else -> ValueError: coda has only these two backends, and
    taking "gpu" or "cuda:x" for the CPU would run on the wrong one."""
    given = device
    if isinstance(device, str):
        try:
            device = torch.device(device)
        except (RuntimeError, ValueError) as e:
            raise ValueError("coda: %s %r is not a device string (%s)" % (what, device, e)) from None
    elif not isinstance(device, torch.device):
        raise TypeError("coda: %s must be a str or torch.device, got %s" % (what, type(device).__name__))
    if device.type not in ("cpu", "cuda"):
        raise ValueError("coda: %s %r is not supported (coda runs on cpu and cuda)" % (what, given))
    return device


def _cuda0(device, what):
    """device, refusing CUDA ordinals other than 0: the calls taking a bare
    coda_device_t (coda_choose_tiling, coda_llama_create) answer for or run
    on CUDA device 0 of the context."""
    if device.type == "cuda" and device.index not in (None, 0):
        raise ValueError("coda: %s %s: this call works on cuda:0 only (the C API takes no device "
                         "ordinal)" % (what, device))
    return device


# ---------------------------------------------------------------------------
# C structures (mirror include/coda.h)
# ---------------------------------------------------------------------------

MAX_DIMS = 4
BF16, F32, F16, FP8_E4M3, I32, I64 = 0, 1, 2, 3, 4, 5
DEVICE_CPU, DEVICE_CUDA = 0, 1
LAYOUTS = {"nt": 0, "nn": 1, "tn": 2}
# coda_block_call_t: the block's calls and their forms, for the workspace size
BLOCK_CALLS = {"forward_pre": 0, "forward_post": 1, "backward_post": 2, "backward_pre": 3,
               "backward_post_spend_z": 4, "backward_post_kept_c": 5, "backward_post_spend_z_kept_c": 6,
               "forward_post_kept_c": 7}
REDUCE = {"sum": 0, "max": 1, "sumsq": 2}
ARG_KINDS = ["in_tile", "in_row", "in_col", "in_scalar", "out_tile", "out_rowred",
             "out_colred", "out_lse", "in_rowpart"]
SPACES = {-1: "half", 0: "full", 1: "double"}


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("device", ctypes.c_int),
                ("device_index", ctypes.c_int), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * MAX_DIMS), ("stride", ctypes.c_int64 * MAX_DIMS)]


class Binding(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("tensor", Tensor), ("scalar", ctypes.c_float)]


class Tiling(ctypes.Structure):
    _fields_ = [("tile_m", ctypes.c_int), ("tile_n", ctypes.c_int)]


class ContextOptions(ctypes.Structure):
    _fields_ = [("cpu_threads", ctypes.c_int), ("cache_dir", ctypes.c_char_p)]


class LlamaConfig(ctypes.Structure):
    """coda_llama_config_t. LlamaConfig(d=..., n_heads=..., n_kv_heads=...,
    head_dim=..., ffn=..., vocab=0, eps=1e-5, rope_theta=500000.0)."""
    _fields_ = [("d", ctypes.c_int64), ("n_heads", ctypes.c_int64), ("n_kv_heads", ctypes.c_int64),
                ("head_dim", ctypes.c_int64), ("ffn", ctypes.c_int64), ("vocab", ctypes.c_int64),
                ("eps", ctypes.c_float), ("rope_theta", ctypes.c_float)]

    def __init__(self, d, n_heads, n_kv_heads, head_dim, ffn, vocab=0, eps=1e-5,
                 rope_theta=500000.0):
        super().__init__(d, n_heads, n_kv_heads, head_dim, ffn, vocab, eps, rope_theta)

    def __setattr__(self, name, value):
        # ctypes routes both the constructor's values and later assignments
        # through here; checked so that d = 2**64 + 48 cannot become 48.
        if name in _CONFIG_INTS:
            value = _int(value, "LlamaConfig." + name)
        elif name in ("eps", "rope_theta"):
            value = _float(value, "LlamaConfig." + name)
        super().__setattr__(name, value)

    def _layout_key(self):
        """The fields the packed weights' layout depends on."""
        return tuple(getattr(self, n) for n in _CONFIG_INTS)


_CONFIG_INTS = ("d", "n_heads", "n_kv_heads", "head_dim", "ffn", "vocab")


_WEIGHT_NAMES = ["g1", "wqkv", "wo", "g2", "wgu", "wd", "gf", "wlm"]


class LlamaWeights(ctypes.Structure):
    _fields_ = [(n, Tensor) for n in _WEIGHT_NAMES]


LM_MEAN, LM_SUM = 0, 1
LM_REDUCTIONS = {"mean": LM_MEAN, "sum": LM_SUM}


class LMLossOptions(ctypes.Structure):
    """coda_lm_loss_opts_t (coda.h section 10). LMLossOptions(**fields)
    starts from coda_lm_loss_opts_init's defaults (ignore_index -100, no
    smoothing, z-loss or softcap, grad_scale 1, reduction "mean", overwrite,
    chunk_rows 0: the library's choice) and sets the fields given.
    reduction takes "mean" / "sum" (or the enum value), accumulate a bool;
    every value is checked for its C type on assignment (an unknown field
    name raises AttributeError instead of becoming a Python attribute C
    never sees)."""
    _fields_ = [("ignore_index", ctypes.c_int32), ("label_smoothing", ctypes.c_float),
                ("z_loss", ctypes.c_float), ("softcap", ctypes.c_float), ("grad_scale", ctypes.c_float),
                ("reduction", ctypes.c_int), ("accumulate", ctypes.c_int), ("chunk_rows", ctypes.c_int64)]

    def __init__(self, **fields):
        super().__init__()
        lib.coda_lm_loss_opts_init(ctypes.byref(self))
        for k, v in fields.items():
            setattr(self, k, v)

    def __setattr__(self, name, value):
        what = "LMLossOptions." + name
        if name == "ignore_index":
            value = _int(value, what, 32)
        elif name in ("label_smoothing", "z_loss", "softcap", "grad_scale"):
            value = _float(value, what)
        elif name == "reduction":
            if isinstance(value, str):
                if value not in LM_REDUCTIONS:
                    raise ValueError("coda: %s must be \"mean\" or \"sum\" (got %r; \"none\": the per-token "
                                     "losses are always returned, but coda_lm_loss has no per-row gradient "
                                     "weights)" % (what, value))
                value = LM_REDUCTIONS[value]
            else:
                value = _int(value, what, _C_INT_BITS)  # an enum value; C checks which
        elif name == "accumulate":
            value = int(value) if isinstance(value, bool) else _int(value, what, _C_INT_BITS)
        elif name == "chunk_rows":
            value = _int(value, what)
        else:
            raise AttributeError("coda: LMLossOptions has no field %r (fields: %s)"
                                 % (name, ", ".join(f for f, _ in self._fields_)))
        super().__setattr__(name, value)

    def __repr__(self):
        return "LMLossOptions(%s)" % ", ".join("%s=%r" % (f, getattr(self, f)) for f, _ in self._fields_)


class AttentionShape(ctypes.Structure):
    """coda_attention_shape_t (coda.h section 11): AttentionShape(batch,
    seq, n_heads, n_kv_heads, head_dim). Every field is checked for int64_t
    on assignment (a bool or a non-integer: TypeError; out of range:
    ValueError); the values themselves (>= 1, n_kv_heads dividing n_heads,
    head_dim even on the CPU, 64 or 128 on CUDA) are C's to check."""
    _fields_ = [("batch", ctypes.c_int64), ("seq", ctypes.c_int64), ("n_heads", ctypes.c_int64),
                ("n_kv_heads", ctypes.c_int64), ("head_dim", ctypes.c_int64)]

    def __init__(self, batch, seq, n_heads, n_kv_heads, head_dim):
        super().__init__(batch, seq, n_heads, n_kv_heads, head_dim)

    def __setattr__(self, name, value):
        if name not in _ATTN_FIELDS:
            raise AttributeError("coda: AttentionShape has no field %r (fields: %s)"
                                 % (name, ", ".join(_ATTN_FIELDS)))
        super().__setattr__(name, _int(value, name))

    def __repr__(self):
        return "AttentionShape(%s)" % ", ".join("%s=%d" % (f, getattr(self, f)) for f in _ATTN_FIELDS)


_ATTN_FIELDS = ("batch", "seq", "n_heads", "n_kv_heads", "head_dim")


class BlockActs(ctypes.Structure):
    """coda_block_acts_t: what a block's forward saves for its backward
    (z empty: not saved), spend_z (backward_post may write dz over z) and c
    (empty: not kept from the forward)."""
    _fields_ = [(n, Tensor) for n in ("r1", "qkv", "h", "r2", "z")] + [("spend_z", ctypes.c_int), ("c", Tensor)]


_P = ctypes.POINTER
_VP = ctypes.c_void_p


def _sig(name, *args):
    f = getattr(lib, name)
    f.restype = ctypes.c_int
    f.argtypes = list(args)


_sig("coda_context_create", _P(ContextOptions), _P(_VP))
lib.coda_context_free.argtypes = [_VP]
lib.coda_context_free.restype = None
_sig("coda_context_describe", _VP, ctypes.c_char_p, ctypes.c_size_t)
_sig("coda_context_has_cuda", _VP)
_sig("coda_gemm", _VP, ctypes.c_int, _P(Tensor), _P(Tensor), _P(Tensor), ctypes.c_float,
     ctypes.c_float, _VP)
_sig("coda_program_parse", ctypes.c_char_p, _P(_VP))
_sig("coda_program_print", _VP, ctypes.c_char_p, ctypes.c_size_t, _P(ctypes.c_size_t))
lib.coda_program_free.argtypes = [_VP]
lib.coda_program_free.restype = None
_sig("coda_program_num_args", _VP)
_sig("coda_program_arg_info", _VP, ctypes.c_int, _P(ctypes.c_char_p), _P(ctypes.c_int),
     _P(ctypes.c_int), _P(ctypes.c_int), _P(ctypes.c_int))
_sig("coda_program_find_arg", _VP, ctypes.c_char_p)
_sig("coda_choose_tiling", _VP, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
     ctypes.c_int64, _P(Tiling))
_sig("coda_choose_program_tiling", _VP, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
     ctypes.c_int64, _VP, _P(Tiling))
_sig("coda_gemm_epilogue", _VP, ctypes.c_int, _P(Tensor), _P(Tensor), _VP, _P(Binding),
     ctypes.c_int, _P(Tiling), _VP)
_sig("coda_finish_reduce", _VP, ctypes.c_int, _P(Tensor), _P(Tensor), _VP)
_sig("coda_finish_rstd", _VP, _P(Tensor), ctypes.c_int64, ctypes.c_float, _P(Tensor), _VP)
_sig("coda_finish_lse", _VP, _P(Tensor), _P(Tensor), ctypes.c_int32, _P(Tensor), _P(Tensor), _VP)
_sig("coda_llama_pack_qkv", _P(LlamaConfig), _P(Tensor), _P(Tensor), _P(Tensor), _P(Tensor))
_sig("coda_llama_unpack_qkv", _P(LlamaConfig), _P(Tensor), _P(Tensor), _P(Tensor), _P(Tensor))
_sig("coda_llama_pack_gate_up", _P(LlamaConfig), _P(Tensor), _P(Tensor), _P(Tensor))
_sig("coda_llama_unpack_gate_up", _P(LlamaConfig), _P(Tensor), _P(Tensor), _P(Tensor))
_sig("coda_llama_create", _VP, _P(LlamaConfig), ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
     _P(_VP))
lib.coda_llama_free.argtypes = [_VP]
lib.coda_llama_free.restype = None
_sig("coda_llama_forward", _VP, _P(LlamaWeights), _P(Tensor), _P(Tensor), _P(Tensor),
     _P(Tensor), _VP)
_sig("coda_llama_backward", _VP, _P(LlamaWeights), _P(Tensor), ctypes.c_float, _P(Tensor),
     _P(LlamaWeights), _VP)
_sig("coda_block_create", _VP, _P(LlamaConfig), ctypes.c_int, _P(_VP))
lib.coda_block_free.argtypes = [_VP]
lib.coda_block_free.restype = None
_sig("coda_block_workspace_size", _VP, ctypes.c_int, ctypes.c_int64, _P(ctypes.c_size_t))
_sig("coda_block_forward_pre", _VP, _P(LlamaWeights), _P(Tensor), _P(Tensor), _P(Tensor), _P(BlockActs),
     _VP, ctypes.c_size_t, _VP)
_sig("coda_block_forward_post", _VP, _P(LlamaWeights), _P(Tensor), _P(Tensor), _P(BlockActs), _P(Tensor),
     _P(Tensor), _P(Tensor), _P(Tensor), _VP, ctypes.c_size_t, _VP)
_sig("coda_block_backward_post", _VP, _P(LlamaWeights), _P(Tensor), _P(BlockActs), _P(Tensor), _P(Tensor),
     _P(Tensor), _P(LlamaWeights), _VP, ctypes.c_size_t, _VP)
_sig("coda_block_backward_pre", _VP, _P(LlamaWeights), _P(Tensor), _P(Tensor), _P(BlockActs), _P(Tensor),
     _P(Tensor), _P(Tensor), _P(LlamaWeights), _VP, ctypes.c_size_t, _VP)
_sig("coda_block_backward_pre_split", _VP, _P(LlamaWeights), _P(Tensor), _P(Tensor), _P(BlockActs), _P(Tensor),
     _P(Tensor), _P(Tensor), _P(Tensor), _P(Tensor), _P(LlamaWeights), _VP, ctypes.c_size_t, _VP)
lib.coda_lm_loss_opts_init.restype = None
lib.coda_lm_loss_opts_init.argtypes = [_P(LMLossOptions)]
_sig("coda_lm_loss_workspace_size", _VP, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
     _P(LMLossOptions),
     _P(ctypes.c_size_t))
_sig("coda_lm_loss", _VP, _P(Tensor), _P(Tensor), _P(Tensor), _P(LMLossOptions), _P(Tensor), _P(Tensor),
     _P(Tensor), _P(Tensor), _VP, ctypes.c_size_t, _VP)
_sig("coda_scale", _VP, _P(Tensor), _P(Tensor), _VP)
_sig("coda_attention_workspace_size", _VP, ctypes.c_int, _P(AttentionShape), _P(ctypes.c_size_t))
_sig("coda_attention_forward", _VP, _P(AttentionShape), _P(Tensor), _P(Tensor), _P(Tensor), _VP)
_sig("coda_attention_backward", _VP, _P(AttentionShape), _P(Tensor), _P(Tensor), _P(Tensor), _P(Tensor),
     _P(Tensor), _VP, ctypes.c_size_t, _VP)
lib.coda_builtin_program.restype = ctypes.c_char_p
lib.coda_builtin_program.argtypes = [ctypes.c_char_p]
lib.coda_builtin_program_names.restype = _P(ctypes.c_char_p)
lib.coda_builtin_program_names.argtypes = []

# ---------------------------------------------------------------------------
# Tensors
# ---------------------------------------------------------------------------

_DTYPES = {torch.bfloat16: BF16, torch.float32: F32, torch.float16: F16, torch.int32: I32, torch.int64: I64}


def describe_tensor(t):
    """A coda_tensor_t describing torch tensor t (no copy). The caller keeps t
    alive while the descriptor is in use. (Every call into coda makes a few
    of these: written for host time, field by field, about 1 us.)"""
    if not isinstance(t, torch.Tensor):
        raise TypeError("coda: expected a torch.Tensor, got %s" % type(t).__name__)
    dt = _DTYPES.get(t.dtype)
    if dt is None:
        raise TypeError("coda: dtype %s is not supported (bfloat16, float32, int32; int64 for targets)" % t.dtype)
    nd = t.dim()
    if not 1 <= nd <= MAX_DIMS:
        raise ValueError("coda: tensors have 1..%d dims, got %d" % (MAX_DIMS, nd))
    d = Tensor()
    if t.is_cuda:
        d.device, d.device_index = DEVICE_CUDA, t.get_device()
    elif t.is_cpu:
        d.device = DEVICE_CPU
    else:
        raise ValueError("coda: device %s is not supported" % t.device)
    d.data = t.data_ptr()
    d.dtype = dt
    d.ndim = nd
    es, shape, stride = t.element_size(), t.shape, t.stride()
    for i in range(nd):
        d.shape[i] = shape[i]
        d.stride[i] = stride[i] * es
    return d


def _ref(desc):
    return ctypes.byref(desc) if desc is not None else None


def _opt(t):
    return None if t is None else ctypes.byref(describe_tensor(t))


# torch's own accessor of the current stream's handle (what its compiled
# code calls), a tenth of torch.cuda.current_stream's host time; the public
# call where a torch lacks it
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(*tensors):
    """The current CUDA stream of the first CUDA tensor, else NULL."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_cuda:
            if _raw_stream is not None:
                return ctypes.c_void_p(_raw_stream(t.device.index or 0))
            return ctypes.c_void_p(torch.cuda.current_stream(t.device).cuda_stream)
    return None


def _layout(layout):
    if isinstance(layout, str):
        if layout.lower() not in LAYOUTS:
            raise ValueError("coda: layout must be one of nt, nn, tn (got %r)" % layout)
        return LAYOUTS[layout.lower()]
    return _int(layout, "layout", _C_INT_BITS)  # an enum value; C checks which


# ---------------------------------------------------------------------------
# Context
# ---------------------------------------------------------------------------

class Context:
    """coda_context_t: the backends. Context(cpu_threads=0, cache_dir=None)."""

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

    def close(self):
        if getattr(self, "_h", None):
            lib.coda_context_free(self._h)
            self._h = None

    def __del__(self):
        self.close()


# ---------------------------------------------------------------------------
# Plain GEMM, programs, fused GEMM, finishing steps
# ---------------------------------------------------------------------------

def gemm(ctx, layout, a, b, c, alpha=1.0, beta=0.0):
    """c = alpha op(a) op(b) + beta c in place; layout "nt" (c = a b^T), "nn"
    (c = a b) or "tn" (c = a^T b)."""
    _check(lib.coda_gemm(ctx.handle, _layout(layout), _opt(a), _opt(b), _opt(c),
                         _float(alpha, "alpha"), _float(beta, "beta"), _stream(a, b, c)))
    return c


class Program:
    """An epilogue program. Program(text) parses and verifies it; str(p) is
    its printed text; p.args lists (name, kind, dtype, space, reduce)."""

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

    def close(self):
        if getattr(self, "_h", None):
            lib.coda_program_free(self._h)
            self._h = None

    def __del__(self):
        self.close()


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


# ---------------------------------------------------------------------------
# The LLaMA layer
# ---------------------------------------------------------------------------

def _weight_shapes(cfg):
    """name -> shape of each weight in coda's layout for cfg (coda.h section 8)."""
    d, ffn = cfg.d, cfg.ffn
    nq, nkv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    shapes = {"g1": (d,), "wqkv": (nq + 2 * nkv, d), "wo": (d, nq), "g2": (d,),
              "wgu": (2 * ffn, d), "wd": (d, ffn)}
    if cfg.vocab > 0:
        shapes["gf"], shapes["wlm"] = (d,), (cfg.vocab, d)
    return shapes


def _config_copy(cfg, what="cfg"):
    if not isinstance(cfg, LlamaConfig):
        raise TypeError("coda: %s must be a coda.LlamaConfig, got %s" % (what, type(cfg).__name__))
    return LlamaConfig.from_buffer_copy(cfg)


class PackedWeights(dict):
    """The layer's weights in coda's layout: a dict name -> bf16 tensor (g1,
    wqkv, wo, g2, wgu, wd[, gf, wlm]) that also holds the configuration it was
    packed for (.config, a copy of the LlamaConfig).

    coda.pack_weights makes one. It is a type of its own because coda's wqkv
    (RoPE pairs made adjacent) and wgu (gate and up rows interleaved) have
    the shapes of a plain torch.cat of PyTorch's wq, wk, wv and w_gate, w_up:
    by shape alone the layer could not tell PyTorch-layout weights from its
    own, and would give wrong results. Llama.forward/backward and
    coda.nn.LlamaLayer take only PackedWeights. Build one by hand,
    PackedWeights(tensors, cfg), only from tensors already in coda's layout
    (e.g. those of an earlier pack_weights, saved)."""

    def __init__(self, tensors, cfg):
        super().__init__(tensors)
        # a copy: the caller's cfg may change later, the packed layout does not
        self.config = _config_copy(cfg)

    def to(self, device):
        """The same weights on another device, as a new PackedWeights."""
        device = _device(device)
        return PackedWeights({k: v.to(device) for k, v in self.items()}, self.config)

    def __repr__(self):
        c = self.config
        return ("PackedWeights(%s, config=(d=%d, n_heads=%d, n_kv_heads=%d, head_dim=%d, ffn=%d, "
                "vocab=%d))" % (sorted(self), c.d, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn, c.vocab))


def _check_packed(w, cfg, device, what="w"):
    """Refuse what the layer would misread: anything but PackedWeights,
    weights packed for another configuration, tensors of the wrong shape,
    dtype or device (device None: any)."""
    if not isinstance(w, PackedWeights):
        raise TypeError("coda: %s must be the PackedWeights that coda.pack_weights returns, got %s; "
                        "coda's wqkv and wgu have the shapes of PyTorch's concatenated weights but "
                        "another row order, so convert them with coda.pack_weights(cfg, wq, wk, wv, "
                        "wo, w_gate, w_up, w_down, g1, g2, gf, wlm)" % (what, type(w).__name__))
    if w.config._layout_key() != cfg._layout_key():
        raise ValueError("coda: %s was packed for (d, n_heads, n_kv_heads, head_dim, ffn, vocab) = %s, "
                         "but the layer has %s" % (what, w.config._layout_key(), cfg._layout_key()))
    shapes = _weight_shapes(cfg)
    if set(w) != set(shapes):
        raise ValueError("coda: %s holds %s, the layer needs exactly %s"
                         % (what, sorted(w), sorted(shapes)))
    for name, shape in shapes.items():
        t = w[name]
        if not isinstance(t, torch.Tensor):
            raise TypeError("coda: %s[%r] must be a torch.Tensor, got %s" % (what, name, type(t).__name__))
        if t.dtype != torch.bfloat16:
            raise TypeError("coda: %s[%r] is %s, the layer needs torch.bfloat16" % (what, name, t.dtype))
        if tuple(t.shape) != shape:
            raise ValueError("coda: %s[%r] has shape %s, the layer needs %s"
                             % (what, name, tuple(t.shape), shape))
        if device is not None and t.device != device:
            raise ValueError("coda: %s[%r] is on %s, the layer on %s (PackedWeights.to moves them)"
                             % (what, name, t.device, device))


def pack_weights(cfg, wq, wk, wv, wo, w_gate, w_up, w_down, g1, g2, gf=None, wlm=None,
                 device=None):
    """Weights in PyTorch's layout -> PackedWeights: coda-layout bf16 tensors
    (g1, wqkv, wo, g2, wgu, wd[, gf, wlm]) on `device` (default: the device
    of wq), and the configuration they were packed for."""
    cfg = _config_copy(cfg)
    given = {"wq": wq, "wk": wk, "wv": wv, "wo": wo, "w_gate": w_gate, "w_up": w_up,
             "w_down": w_down, "g1": g1, "g2": g2}
    if cfg.vocab > 0:
        if gf is None or wlm is None:
            raise ValueError("coda: cfg.vocab > 0 needs gf and wlm")
        given["gf"], given["wlm"] = gf, wlm
    for name, t in given.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError("coda: pack_weights: %s must be a torch.Tensor, got %s" % (name, type(t).__name__))
    device = _device(wq.device if device is None else device)
    cpu = lambda t: t.detach().to("cpu", torch.bfloat16).contiguous()
    wq, wk, wv, w_gate, w_up = map(cpu, (wq, wk, wv, w_gate, w_up))
    nq, nkv, d = wq.shape[0], wk.shape[0], wq.shape[1]
    wqkv = torch.empty(nq + 2 * nkv, d, dtype=torch.bfloat16)
    wgu = torch.empty(2 * w_gate.shape[0], d, dtype=torch.bfloat16)
    # these check cfg itself and the shapes of wq, wk, wv, w_gate, w_up
    _check(lib.coda_llama_pack_qkv(ctypes.byref(cfg), _opt(wq), _opt(wk), _opt(wv), _opt(wqkv)))
    _check(lib.coda_llama_pack_gate_up(ctypes.byref(cfg), _opt(w_gate), _opt(w_up), _opt(wgu)))
    # the weights that pass through unchanged are checked here, by their own names
    shapes = _weight_shapes(cfg)
    for coda_name, name in (("g1", "g1"), ("wo", "wo"), ("g2", "g2"), ("wd", "w_down"),
                            ("gf", "gf"), ("wlm", "wlm")):
        if coda_name in shapes and tuple(given[name].shape) != shapes[coda_name]:
            raise ValueError("coda: pack_weights: %s has shape %s, cfg needs %s"
                             % (name, tuple(given[name].shape), shapes[coda_name]))
    out = {"g1": g1, "wqkv": wqkv, "wo": wo, "g2": g2, "wgu": wgu, "wd": w_down}
    if cfg.vocab > 0:
        out["gf"], out["wlm"] = gf, wlm
    return PackedWeights({k: v.detach().to(device, torch.bfloat16).contiguous() for k, v in out.items()},
                         cfg)


def unpack_grads(cfg, grads):
    """Gradients in coda's layout (dict from Llama.backward) -> PyTorch layout
    dict (wq, wk, wv, wo, w_gate, w_up, w_down, g1, g2[, gf, wlm]), CPU, same dtype."""
    g = {k: v.detach().cpu().contiguous() for k, v in grads.items()}
    dt, d = g["wqkv"].dtype, cfg.d
    nq, nkv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    wq, wk, wv = (torch.empty(n, d, dtype=dt) for n in (nq, nkv, nkv))
    wg, wu = (torch.empty(cfg.ffn, d, dtype=dt) for _ in range(2))
    _check(lib.coda_llama_unpack_qkv(ctypes.byref(cfg), _opt(g["wqkv"]), _opt(wq), _opt(wk),
                                     _opt(wv)))
    _check(lib.coda_llama_unpack_gate_up(ctypes.byref(cfg), _opt(g["wgu"]), _opt(wg), _opt(wu)))
    out = {"wq": wq, "wk": wk, "wv": wv, "wo": g["wo"], "w_gate": wg, "w_up": wu,
           "w_down": g["wd"], "g1": g["g1"], "g2": g["g2"]}
    if "gf" in g:
        out["gf"], out["wlm"] = g["gf"], g["wlm"]
    return out


def _weights_struct(w):
    s = LlamaWeights()
    for name in _WEIGHT_NAMES:
        if name in w and w[name] is not None:
            setattr(s, name, describe_tensor(w[name]))
    return s


def _dense_1d(t):
    """A 1-D tensor with element stride 1, as C reads it. torch calls a
    one-element tensor contiguous whatever its stride (a batch-1 slice
    t[:, -1] keeps the row's stride), so .contiguous() may keep a stride C
    refuses; such a tensor is copied."""
    t = t.contiguous()
    return t if t.dim() != 1 or t.stride(0) == 1 else t.clone(memory_format=torch.contiguous_format)


def _targets(targets, device):
    """Cross-entropy targets as the int32 tensor C reads. Floats and bools
    -> TypeError (a class index is an integer); values outside int32 ->
    ValueError (the conversion would wrap them to other, valid-looking classes)."""
    if not isinstance(targets, torch.Tensor):
        raise TypeError("coda: targets must be a torch.Tensor, got %s" % type(targets).__name__)
    if targets.dtype == torch.bool or targets.is_floating_point() or targets.is_complex():
        raise TypeError("coda: targets must be an integer tensor (class indices), got %s" % targets.dtype)
    if targets.dtype != torch.int32 and targets.numel() > 0:
        lo, hi = int(targets.min()), int(targets.max())
        if lo < -2 ** 31 or hi > 2 ** 31 - 1:
            raise ValueError("coda: targets hold values in %d..%d, outside int32" % (lo, hi))
    return _dense_1d(targets.to(device, torch.int32))


class Llama:
    """One LLaMA layer: Llama(ctx, cfg, batch, seq, device="cpu").
    forward(w, x, targets=None) -> (y, loss or None); backward(w, dy=None,
    loss_scale=1.0) -> (dx, grads) with grads a dict in coda's layout (f32).
    w is the PackedWeights from pack_weights (anything else raises
    TypeError). device: "cpu", or "cuda" / "cuda:0" (the C layer runs on
    CUDA device 0 of the context; .device is then cuda:0)."""

    def __init__(self, ctx, cfg, batch, seq, device="cpu"):
        # a copy: C keeps its own, and a later change to the caller's cfg
        # must not make the binding's checks disagree with it
        self.ctx, self.cfg = ctx, _config_copy(cfg)
        self.batch, self.seq = _int(batch, "batch"), _int(seq, "seq")
        dev = _cuda0(_device(device), "device")
        self.device = torch.device("cuda", 0) if dev.type == "cuda" else torch.device("cpu")
        h = _VP()
        _check(lib.coda_llama_create(ctx.handle, ctypes.byref(self.cfg), self.batch, self.seq,
                                     DEVICE_CUDA if dev.type == "cuda" else DEVICE_CPU,
                                     ctypes.byref(h)))
        self._h = h

    def forward(self, w, x, targets=None):
        _check_packed(w, self.cfg, self.device)
        m, d = self.batch * self.seq, self.cfg.d
        y = torch.empty(m, d, dtype=torch.bfloat16, device=self.device)
        loss = None
        if targets is not None:
            targets = _targets(targets, self.device)
            loss = torch.empty(m, dtype=torch.float32, device=self.device)
        ws = _weights_struct(w)
        _check(lib.coda_llama_forward(self._h, ctypes.byref(ws), _opt(x), _opt(targets), _opt(y),
                                      _opt(loss), _stream(x, y)))
        return y, loss

    def backward(self, w, dy=None, loss_scale=1.0, grads=True, grad_dtype=torch.float32):
        _check_packed(w, self.cfg, self.device)
        loss_scale = _float(loss_scale, "loss_scale")
        m, d = self.batch * self.seq, self.cfg.d
        dx = torch.empty(m, d, dtype=torch.bfloat16, device=self.device)
        ws = _weights_struct(w)
        g, gs = None, None
        if grads:
            g = {k: torch.empty(v.shape, dtype=grad_dtype, device=self.device) for k, v in w.items()}
            gs = _weights_struct(g)
        _check(lib.coda_llama_backward(self._h, ctypes.byref(ws), _opt(dy), loss_scale, _opt(dx),
                                       _ref(gs), _stream(dx)))
        return dx, g

    def close(self):
        if getattr(self, "_h", None):
            lib.coda_llama_free(self._h)
            self._h = None

    def __del__(self):
        self.close()


# ---------------------------------------------------------------------------
# The block split at attention (coda.h section 9)
# ---------------------------------------------------------------------------

def _acts_struct(acts, spend_z=False):
    s = BlockActs()
    for name in ("r1", "qkv", "h", "r2", "z", "c"):
        t = acts.get(name)
        if t is not None:
            setattr(s, name, describe_tensor(t))
    s.spend_z = 1 if spend_z else 0
    return s


class Block:
    """One LLaMA block without the LM head, split at attention, its
    activations in tensors the caller holds: Block(ctx, cfg, device="cpu").
    cfg.vocab is ignored. Weights: a dict g1, wqkv, wo, g2, wgu, wd of bf16
    tensors in coda's layout (coda.pack_weights). Each call allocates its own
    workspace (torch's allocator caches it) and runs on the current stream.

        r1, qkv = blk.forward_pre(w, x, pos)
        o = attention(qkv)                             # any: q, k, v as they are
        y, h, r2, z = blk.forward_post(w, x, o)
        do, dh, g = blk.backward_post(w, o, h, r2, z, dy)
        dqkv = attention_backward(do)
        dx, g2 = blk.backward_pre(w, x, pos, r1, qkv, dqkv, dh)

    forward_post(..., save_z=False) is a forward for inference (z is None,
    no (M, 2I) tensor); backward_post(..., spend_z=True) writes dz over z
    (no (M, 2I) workspace; z is spent: a second backward from it is wrong).
    forward_post(..., c=t) writes c = silu(gate) * up into t ((M, I) bf16,
    coda_block_acts_t.c) and backward_post(..., c=t) reads it instead of
    recomputing it: an (M, I) store fewer in the backward, t kept between.
    """

    def __init__(self, ctx, cfg, device="cpu"):
        self.ctx, self.cfg = ctx, _config_copy(cfg)
        dev = _cuda0(_device(device), "device")
        self.device = torch.device("cuda", 0) if dev.type == "cuda" else torch.device("cpu")
        d, nq = self.cfg.d, self.cfg.n_heads * self.cfg.head_dim
        self.nq, self.nqkv = nq, nq + 2 * self.cfg.n_kv_heads * self.cfg.head_dim
        h = _VP()
        _check(lib.coda_block_create(ctx.handle, ctypes.byref(self.cfg),
                                     DEVICE_CUDA if dev.type == "cuda" else DEVICE_CPU, ctypes.byref(h)))
        self._h = h

    def _workspace(self, call, m):
        """The workspace of one call (a BLOCK_CALLS name: forward_pre,
        forward_post, backward_post, backward_pre, and the forms spending z
        or keeping c), each its own size."""
        n = ctypes.c_size_t()
        _check(lib.coda_block_workspace_size(self._h, BLOCK_CALLS[call], _int(m, "m"), ctypes.byref(n)))
        # 256 more bytes, so that a 256-byte aligned start exists in it
        buf = torch.empty(n.value + 256, dtype=torch.uint8, device=self.device)
        off = (-buf.data_ptr()) % 256
        return buf, ctypes.c_void_p(buf.data_ptr() + off), n.value

    def forward_pre(self, w, x, pos, xg=None, r1=None):
        """-> (r1 (M) f32, qkv (M, nqkv) bf16). With xg (and r1 = rstd(x))
        from the previous block's forward_post, the norm prologue is skipped."""
        m = x.shape[0]
        if xg is not None and r1 is None:
            raise ValueError("coda: Block.forward_pre: xg needs r1 = rstd(x) (the previous block's r_next)")
        r1 = torch.empty(m, dtype=torch.float32, device=self.device) if r1 is None else r1
        qkv = torch.empty(m, self.nqkv, dtype=torch.bfloat16, device=self.device)
        acts = _acts_struct({"r1": r1, "qkv": qkv})
        buf, ws, n = self._workspace("forward_pre", m)
        _check(lib.coda_block_forward_pre(self._h, ctypes.byref(_weights_struct(w)), _opt(x), _opt(xg), _opt(pos),
                                          ctypes.byref(acts), ws, n, _stream(x)))
        return r1, qkv

    def forward_post(self, w, x, o, g_next=None, save_z=True, c=None):
        """-> (y, h, r2, z), and with g_next (the next norm's weight) also
        y_g = y * g_next and r_next = rstd(y): (y, h, r2, z, y_g, r_next).
        save_z=False: z is not saved (None), a forward with no backward.
        c: an (M, I) bf16 tensor that gets silu(gate) * up, kept for
        backward_post(..., c=c)."""
        m, d = x.shape[0], self.cfg.d
        h = torch.empty(m, d, dtype=torch.bfloat16, device=self.device)
        r2 = torch.empty(m, dtype=torch.float32, device=self.device)
        z = torch.empty(m, 2 * self.cfg.ffn, dtype=torch.bfloat16, device=self.device) if save_z else None
        y = torch.empty(m, d, dtype=torch.bfloat16, device=self.device)
        yg = rn = None
        if g_next is not None:
            yg = torch.empty(m, d, dtype=torch.bfloat16, device=self.device)
            rn = torch.empty(m, dtype=torch.float32, device=self.device)
        acts = _acts_struct({"h": h, "r2": r2, "z": z, "c": c})
        buf, ws, n = self._workspace("forward_post" if c is None else "forward_post_kept_c", m)
        _check(lib.coda_block_forward_post(self._h, ctypes.byref(_weights_struct(w)), _opt(x), _opt(o),
                                           ctypes.byref(acts), _opt(y), _opt(g_next), _opt(yg), _opt(rn), ws, n,
                                           _stream(x)))
        return (y, h, r2, z) if g_next is None else (y, h, r2, z, yg, rn)

    def backward_post(self, w, o, h, r2, z, dy, grad_dtype=torch.float32, spend_z=False, c=None):
        """-> (do (M, nq) bf16, dh (M, d) bf16, grads dict wo, g2, wgu, wd).
        spend_z=True: dz is written over z (in place; z is spent).
        c: the tensor forward_post(..., c=) filled (read, not recomputed)."""
        m, d = dy.shape[0], self.cfg.d
        if z is None:
            raise ValueError("coda: Block.backward_post: z is None: its forward_post ran with save_z=False "
                             "(a forward for inference has no backward)")
        # o is read only after the call (below): checked first, so that a
        # bad o is refused before z is spent
        if not isinstance(o, torch.Tensor) or tuple(o.shape) != (m, self.nq) or o.dtype != torch.bfloat16 \
                or o.device.type != self.device.type:
            raise ValueError("coda: Block.backward_post: o must be a (%d, %d) bfloat16 tensor on the block's device, "
                             "got %s" % (m, self.nq, "%s %s on %s" % (tuple(o.shape), o.dtype, o.device)
                                         if isinstance(o, torch.Tensor) else type(o).__name__))
        dh = torch.empty(m, d, dtype=torch.bfloat16, device=self.device)
        g = {k: torch.empty(w[k].shape, dtype=grad_dtype, device=self.device) for k in ("g2", "wgu", "wd")}
        acts = _acts_struct({"h": h, "r2": r2, "z": z, "c": c}, spend_z)
        buf, ws, n = self._workspace("backward_post" + ("_spend_z" if spend_z else "") +
                                     ("_kept_c" if c is not None else ""), m)
        # do NULL: the O projection's backward is left out of the call and
        # run below, once the workspace is freed, so that do and dwo never
        # exist beside it (the same bits as the call's own, coda.h)
        _check(lib.coda_block_backward_post(self._h, ctypes.byref(_weights_struct(w)), None, ctypes.byref(acts),
                                            _opt(dy), None, _opt(dh), ctypes.byref(_weights_struct(g)), ws, n,
                                            _stream(dy)))
        del buf, ws  # back to torch's allocator, stream-ordered: the GEMMs below may reuse it
        do = torch.empty(m, self.nq, dtype=torch.bfloat16, device=self.device)
        g["wo"] = torch.empty(w["wo"].shape, dtype=grad_dtype, device=self.device)
        gemm(self.ctx, "nn", dh, w["wo"], do)
        gemm(self.ctx, "tn", dh, o, g["wo"])
        return do, dh, g

    def backward_pre(self, w, x, pos, r1, qkv, dqkv, dh, grad_dtype=torch.float32):
        """-> (dx (M, d) bf16 = dh + the norm path's gradient, grads dict g1, wqkv).
        dqkv: (M, nqkv), or a tuple (dq, dk, dv) of its three column blocks,
        each its own tensor (coda_block_backward_pre_split: no concatenation)."""
        split = isinstance(dqkv, (tuple, list))
        if split and len(dqkv) != 3:
            raise ValueError("coda: dqkv as parts must be (dq, dk, dv), got %d tensors" % len(dqkv))
        m, d = x.shape[0], self.cfg.d
        dx = torch.empty(m, d, dtype=torch.bfloat16, device=self.device)
        g = {k: torch.empty(w[k].shape, dtype=grad_dtype, device=self.device) for k in ("g1", "wqkv")}
        acts = _acts_struct({"r1": r1, "qkv": qkv})
        buf, ws, n = self._workspace("backward_pre", m)
        if split:
            _check(lib.coda_block_backward_pre_split(self._h, ctypes.byref(_weights_struct(w)), _opt(x), _opt(pos),
                                                     ctypes.byref(acts), *(_opt(t) for t in dqkv), _opt(dh), _opt(dx),
                                                     ctypes.byref(_weights_struct(g)), ws, n, _stream(x)))
            return dx, g
        _check(lib.coda_block_backward_pre(self._h, ctypes.byref(_weights_struct(w)), _opt(x), _opt(pos),
                                           ctypes.byref(acts), _opt(dqkv), _opt(dh), _opt(dx),
                                           ctypes.byref(_weights_struct(g)), ws, n, _stream(x)))
        return dx, g

    def close(self):
        if getattr(self, "_h", None):
            lib.coda_block_free(self._h)
            self._h = None

    def __del__(self):
        self.close()


# ---------------------------------------------------------------------------
# The LM head and the cross-entropy loss (coda.h section 10)
# ---------------------------------------------------------------------------

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


def _workspace(nbytes, device):
    """(buffer, 256-byte aligned pointer) of nbytes on device. torch's CUDA
    allocator gives 512-byte aligned blocks; its CPU one 64: then 256 more
    bytes are taken and the pointer moved."""
    buf = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
    if buf.data_ptr() % 256:
        buf = torch.empty(nbytes + 256, dtype=torch.uint8, device=device)
    return buf, ctypes.c_void_p(buf.data_ptr() + (-buf.data_ptr()) % 256)


def _workspace_bytes(workspace, fn):
    """The bytes a caller's workspace tensor holds, as the C call is told:
    only a contiguous tensor's numel x element size are its own (an expanded
    or strided view would claim memory past or between its elements)."""
    if not workspace.is_contiguous():
        raise ValueError("coda: %s: workspace must be contiguous (shape %s, strides %s)"
                         % (fn, tuple(workspace.shape), workspace.stride()))
    return workspace.numel() * workspace.element_size()


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


# ---------------------------------------------------------------------------
# Causal grouped-query attention (coda.h section 11)
# ---------------------------------------------------------------------------

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
