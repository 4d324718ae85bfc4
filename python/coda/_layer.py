"""The LLaMA layer (coda.h section 8) and the block split at attention
(section 9)."""

import ctypes

import torch

from ._lib import (BLOCK_CALLS, BlockActs, DEVICE_CPU, DEVICE_CUDA, LlamaConfig, LlamaWeights, _Handle,
    _VP, _WEIGHT_NAMES, _check, _cuda0, _dense_1d, _device, _float, _int, _opt, _ref, _stream, describe_tensor, lib)
from ._core import gemm


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


class Llama(_Handle):
    """One LLaMA layer: Llama(ctx, cfg, batch, seq, device="cpu").
    forward(w, x, targets=None) -> (y, loss or None); backward(w, dy=None,
    loss_scale=1.0) -> (dx, grads) with grads a dict in coda's layout (f32).
    w is the PackedWeights from pack_weights (anything else raises
    TypeError). device: "cpu", or "cuda" / "cuda:0" (the C layer runs on
    CUDA device 0 of the context; .device is then cuda:0)."""
    _free = "coda_llama_free"

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


class Block(_Handle):
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
    _free = "coda_block_free"

    def __init__(self, ctx, cfg, device="cpu"):
        self.ctx, self.cfg = ctx, _config_copy(cfg)
        dev = _cuda0(_device(device), "device")
        self.device = torch.device("cuda", 0) if dev.type == "cuda" else torch.device("cpu")
        nq = self.cfg.n_heads * self.cfg.head_dim
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

