"""coda: a ctypes binding of libcoda (GEMMs whose epilogues are small programs).

The library is found at $CODA_LIB, else at <repo>/build/libcoda.so. Tensors
are torch tensors (CPU, or CUDA when the library was built with CUDA); they
are described to coda by pointer, dtype, device and byte strides, never
copied. Every failing call raises coda.Error carrying the status name and
coda_last_error(). See python/README.md and include/coda.h (the contract).

    import torch, coda
    ctx = coda.Context()
    a = torch.randn(7, 64).bfloat16(); b = torch.randn(24, 64).bfloat16()
    c = torch.empty(7, 24)
    coda.gemm(ctx, "nt", a, b, c)                       # c = a @ b.T
"""

import ctypes
import os

import torch

__all__ = [
    "Error", "Context", "Program", "LlamaConfig", "Llama", "describe_tensor", "gemm",
    "gemm_epilogue", "choose_tiling", "finish_reduce", "finish_rstd", "finish_lse",
    "builtin_program", "builtin_program_names", "pack_weights", "unpack_grads", "lib",
]

# ---------------------------------------------------------------------------
# Loading and errors
# ---------------------------------------------------------------------------

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load():
    path = os.environ.get("CODA_LIB") or os.path.join(_REPO, "build", "libcoda.so")
    if not os.path.exists(path):
        raise OSError("coda: library not found at %s (run `make lib`, or set CODA_LIB)" % path)
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
# C structures (mirror include/coda.h)
# ---------------------------------------------------------------------------

MAX_DIMS = 4
BF16, F32, F16, FP8_E4M3, I32 = 0, 1, 2, 3, 4
DEVICE_CPU, DEVICE_CUDA = 0, 1
LAYOUTS = {"nt": 0, "nn": 1, "tn": 2}
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


_WEIGHT_NAMES = ["g1", "wqkv", "wo", "g2", "wgu", "wd", "gf", "wlm"]


class LlamaWeights(ctypes.Structure):
    _fields_ = [(n, Tensor) for n in _WEIGHT_NAMES]


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
lib.coda_builtin_program.restype = ctypes.c_char_p
lib.coda_builtin_program.argtypes = [ctypes.c_char_p]
lib.coda_builtin_program_names.restype = _P(ctypes.c_char_p)
lib.coda_builtin_program_names.argtypes = []

# ---------------------------------------------------------------------------
# Tensors
# ---------------------------------------------------------------------------

_DTYPES = {torch.bfloat16: BF16, torch.float32: F32, torch.float16: F16, torch.int32: I32}


def describe_tensor(t):
    """A coda_tensor_t describing torch tensor t (no copy). The caller keeps t
    alive while the descriptor is in use."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("coda: expected a torch.Tensor, got %s" % type(t).__name__)
    if t.dtype not in _DTYPES:
        raise TypeError("coda: dtype %s is not supported (bfloat16, float32, int32)" % t.dtype)
    if not 1 <= t.dim() <= MAX_DIMS:
        raise ValueError("coda: tensors have 1..%d dims, got %d" % (MAX_DIMS, t.dim()))
    d = Tensor()
    d.data = t.data_ptr()
    d.dtype = _DTYPES[t.dtype]
    if t.device.type == "cpu":
        d.device, d.device_index = DEVICE_CPU, 0
    elif t.device.type == "cuda":
        d.device, d.device_index = DEVICE_CUDA, t.device.index or 0
    else:
        raise ValueError("coda: device %s is not supported" % t.device)
    d.ndim = t.dim()
    es = t.element_size()
    for i in range(t.dim()):
        d.shape[i] = t.shape[i]
        d.stride[i] = t.stride(i) * es
    return d


def _ref(desc):
    return ctypes.byref(desc) if desc is not None else None


def _opt(t):
    return None if t is None else ctypes.byref(describe_tensor(t))


def _stream(*tensors):
    """The current CUDA stream of the first CUDA tensor, else NULL."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_cuda:
            return ctypes.c_void_p(torch.cuda.current_stream(t.device).cuda_stream)
    return None


def _layout(layout):
    if isinstance(layout, str):
        if layout.lower() not in LAYOUTS:
            raise ValueError("coda: layout must be one of nt, nn, tn (got %r)" % layout)
        return LAYOUTS[layout.lower()]
    return int(layout)


# ---------------------------------------------------------------------------
# Context
# ---------------------------------------------------------------------------

class Context:
    """coda_context_t: the backends. Context(cpu_threads=0, cache_dir=None)."""

    def __init__(self, cpu_threads=0, cache_dir=None):
        opts = ContextOptions(cpu_threads, cache_dir.encode() if cache_dir else None)
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
    _check(lib.coda_gemm(ctx.handle, _layout(layout), _opt(a), _opt(b), _opt(c), alpha, beta,
                         _stream(a, b, c)))
    return c


class Program:
    """An epilogue program. Program(text) parses and verifies it; str(p) is
    its printed text; p.args lists (name, kind, dtype, space, reduce)."""

    def __init__(self, text):
        h = _VP()
        _check(lib.coda_program_parse(text.encode(), ctypes.byref(h)))
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

    def close(self):
        if getattr(self, "_h", None):
            lib.coda_program_free(self._h)
            self._h = None

    def __del__(self):
        self.close()


def choose_tiling(ctx, device, layout, m, n, k, program=None):
    """(tile_m, tile_n) the backend uses by default; device "cpu" or "cuda".
    With a Program, the tiling for it (on CUDA this also picks the GPU
    schedule: coda_choose_program_tiling in coda.h)."""
    dev = DEVICE_CUDA if str(device).startswith("cuda") else DEVICE_CPU
    t = Tiling()
    if program is None:
        _check(lib.coda_choose_tiling(ctx.handle, dev, _layout(layout), m, n, k, ctypes.byref(t)))
    else:
        _check(lib.coda_choose_program_tiling(ctx.handle, dev, _layout(layout), m, n, k, program.handle,
                                              ctypes.byref(t)))
    return t.tile_m, t.tile_n


def gemm_epilogue(ctx, layout, a, b, program, bindings, tiling=None):
    """Run op(a) op(b) with an epilogue program. bindings: dict argument name
    -> torch tensor (tiles, vectors, partials) or number (scalars)."""
    if isinstance(program, str):
        program = Program(program)
    arr = (Binding * max(1, len(bindings)))()
    keep = []
    for i, (name, v) in enumerate(bindings.items()):
        arr[i].name = name.encode()
        keep.append(arr[i].name)
        if isinstance(v, torch.Tensor):
            arr[i].tensor = describe_tensor(v)
        else:
            arr[i].scalar = float(v)
    til = None if tiling is None else ctypes.byref(Tiling(*tiling))
    tensors = [v for v in bindings.values() if isinstance(v, torch.Tensor)]
    _check(lib.coda_gemm_epilogue(ctx.handle, _layout(layout), _opt(a), _opt(b), program.handle,
                                  arr, len(bindings), til, _stream(a, b, *tensors)))


def finish_reduce(ctx, op, partials, out):
    """out[i] = reduce over t of partials[i][t]; op "sum", "max" or "sumsq"."""
    _check(lib.coda_finish_reduce(ctx.handle, REDUCE[op] if isinstance(op, str) else int(op),
                                  _opt(partials), _opt(out), _stream(partials, out)))
    return out


def finish_rstd(ctx, partials, d, eps, rstd):
    """rstd[i] = (sum_t partials[i][t] / d + eps)^(-1/2)."""
    _check(lib.coda_finish_rstd(ctx.handle, _opt(partials), d, eps, _opt(rstd),
                                _stream(partials, rstd)))
    return rstd


def finish_lse(ctx, partials, targets, lse, loss, ignore_index=-100):
    """Cross-entropy from (M, T, 3) lse partials and (M) int32 targets."""
    _check(lib.coda_finish_lse(ctx.handle, _opt(partials), _opt(targets), ignore_index, _opt(lse),
                               _opt(loss), _stream(partials, lse)))
    return lse, loss


def builtin_program(name):
    """Text of a built-in epilogue program of the layer."""
    s = lib.coda_builtin_program(name.encode())
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

def pack_weights(cfg, wq, wk, wv, wo, w_gate, w_up, w_down, g1, g2, gf=None, wlm=None,
                 device=None):
    """Weights in PyTorch's layout -> dict of coda-layout bf16 tensors (g1, wqkv,
    wo, g2, wgu, wd, gf, wlm) on `device` (default: the device of wq)."""
    device = device or wq.device
    cpu = lambda t: t.detach().to("cpu", torch.bfloat16).contiguous()
    wq, wk, wv, w_gate, w_up = map(cpu, (wq, wk, wv, w_gate, w_up))
    nq, nkv, d = wq.shape[0], wk.shape[0], wq.shape[1]
    wqkv = torch.empty(nq + 2 * nkv, d, dtype=torch.bfloat16)
    wgu = torch.empty(2 * w_gate.shape[0], d, dtype=torch.bfloat16)
    _check(lib.coda_llama_pack_qkv(ctypes.byref(cfg), _opt(wq), _opt(wk), _opt(wv), _opt(wqkv)))
    _check(lib.coda_llama_pack_gate_up(ctypes.byref(cfg), _opt(w_gate), _opt(w_up), _opt(wgu)))
    out = {"g1": g1, "wqkv": wqkv, "wo": wo, "g2": g2, "wgu": wgu, "wd": w_down}
    if cfg.vocab > 0:
        if gf is None or wlm is None:
            raise ValueError("coda: cfg.vocab > 0 needs gf and wlm")
        out["gf"], out["wlm"] = gf, wlm
    return {k: v.detach().to(device, torch.bfloat16).contiguous() for k, v in out.items()}


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


class Llama:
    """One LLaMA layer: Llama(ctx, cfg, batch, seq, device="cpu").
    forward(w, x, targets=None) -> (y, loss or None); backward(w, dy=None,
    loss_scale=1.0) -> (dx, grads) with grads a dict in coda's layout (f32).
    w is a dict from pack_weights."""

    def __init__(self, ctx, cfg, batch, seq, device="cpu"):
        self.ctx, self.cfg, self.batch, self.seq = ctx, cfg, batch, seq
        self.device = torch.device(device)
        dev = DEVICE_CUDA if self.device.type == "cuda" else DEVICE_CPU
        h = _VP()
        _check(lib.coda_llama_create(ctx.handle, ctypes.byref(cfg), batch, seq, dev,
                                     ctypes.byref(h)))
        self._h = h

    def forward(self, w, x, targets=None):
        m, d = self.batch * self.seq, self.cfg.d
        y = torch.empty(m, d, dtype=torch.bfloat16, device=self.device)
        loss = None
        if targets is not None:
            targets = targets.to(self.device, torch.int32).contiguous()
            loss = torch.empty(m, dtype=torch.float32, device=self.device)
        ws = _weights_struct(w)
        _check(lib.coda_llama_forward(self._h, ctypes.byref(ws), _opt(x), _opt(targets), _opt(y),
                                      _opt(loss), _stream(x, y)))
        return y, loss

    def backward(self, w, dy=None, loss_scale=1.0, grads=True, grad_dtype=torch.float32):
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
