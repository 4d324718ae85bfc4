"""The binding's base: loading libcoda, its errors, argument checks, the C
structures of include/coda.h and torch tensors described to coda."""

import ctypes
import math
import numbers
import os

import torch


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


class _Handle:
    """Owns one C handle, self._h: close() frees it with the C function
    named by _free (once; a handle never made is no error), and so does
    the garbage collector."""
    _free = None

    def close(self):
        if getattr(self, "_h", None):
            getattr(lib, self._free)(self._h)
            self._h = None

    def __del__(self):
        self.close()


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


def _dense_1d(t):
    """A 1-D tensor with element stride 1, as C reads it. torch calls a
    one-element tensor contiguous whatever its stride (a batch-1 slice
    t[:, -1] keeps the row's stride), so .contiguous() may keep a stride C
    refuses; such a tensor is copied."""
    t = t.contiguous()
    return t if t.dim() != 1 or t.stride(0) == 1 else t.clone(memory_format=torch.contiguous_format)
