"""coda.nn - coda's LLaMA layer inside PyTorch autograd.

    import coda, coda.nn
    ctx = coda.Context()
    cfg = coda.LlamaConfig(d=256, n_heads=8, n_kv_heads=4, head_dim=32, ffn=688, vocab=1000)
    layer = coda.nn.LlamaLayer.from_torch(ctx, cfg, batch, seq, W, device="cuda")
    y, loss = layer(x, targets, loss_scale=1.0 / n_valid)   # loss: 0-dim f32
    (loss + (y.float() * dy).sum()).backward()              # fills x.grad, layer params' .grad

The parameters are held in coda's layout (`wqkv` with the RoPE pairs made
adjacent, `wgu` with gate and up rows interleaved; include/coda.h section 8),
as bf16 `torch.nn.Parameter`s; `from_torch` converts PyTorch-layout weights
and `grads_torch_layout()` converts the gradients back. The constructor takes
only the coda.PackedWeights of coda.pack_weights: a dict of PyTorch-layout
weights has the same shapes and would give wrong results.

One forward per backward: the layer keeps the activations of its last
forward inside the C handle, so a backward after a second forward on the same
layer raises instead of returning wrong gradients.
"""
import torch

import coda

_ORDER = ("g1", "wqkv", "wo", "g2", "wgu", "wd", "gf", "wlm")


class _LlamaFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, layer, names, targets, loss_scale, x, *params):
        w = coda.PackedWeights(zip(names, params), layer.cfg)  # the parameters are in coda's layout
        y, loss = layer._llama.forward(w, x.to(torch.bfloat16).contiguous(), targets)
        layer._forwards += 1
        ctx.layer, ctx.names, ctx.forward_id = layer, names, layer._forwards
        ctx.loss_scale, ctx.has_loss, ctx.x_dtype = loss_scale, loss is not None, x.dtype
        ctx.save_for_backward(*params)
        if loss is None:
            total = torch.zeros((), dtype=torch.float32, device=y.device)
            ctx.mark_non_differentiable(total)
        else:
            total = loss.sum() * loss_scale
        return y, total

    @staticmethod
    def backward(ctx, dy, dtotal):
        layer = ctx.layer
        if layer._forwards != ctx.forward_id:
            raise RuntimeError("coda.nn: this backward needs the activations of its own forward, "
                               "but a later forward on the same LlamaLayer replaced them")
        params = ctx.saved_tensors
        w = coda.PackedWeights(zip(ctx.names, params), layer.cfg)
        scale = float(dtotal) * ctx.loss_scale if ctx.has_loss and dtotal is not None else 0.0
        dyb = None if dy is None else dy.to(torch.bfloat16).contiguous()
        dx, g = layer._llama.backward(w, dy=dyb, loss_scale=scale)
        grads = tuple(g[n].to(p.dtype) for n, p in zip(ctx.names, params))
        return (None, None, None, None, dx.to(ctx.x_dtype)) + grads


class LlamaLayer(torch.nn.Module):
    """One LLaMA layer (+ final norm, LM head and cross-entropy if cfg.vocab > 0)
    run by coda. forward(x (M, d), targets (M) int or None, loss_scale) ->
    (y (M, d) bf16, loss_scale * sum of per-token losses, 0-dim f32).
    weights: the coda.PackedWeights of coda.pack_weights (or use from_torch)."""

    def __init__(self, ctx, cfg, batch, seq, weights, device="cpu"):
        super().__init__()
        self._llama = coda.Llama(ctx, cfg, batch, seq, device=device)
        # the layer's own copy of cfg (later changes to the caller's do not reach C)
        self.ctx, self.cfg, self.batch, self.seq = ctx, self._llama.cfg, batch, seq
        # refuses anything but PackedWeights for this cfg, of the right shapes
        # and dtype, wherever they are (they are moved to the layer's device)
        coda._check_packed(weights, self.cfg, None, "weights")
        self._forwards = 0
        self._names = tuple(n for n in _ORDER if n in weights)
        for n in self._names:
            t = weights[n].detach().to(self._llama.device, torch.bfloat16).contiguous()
            self.register_parameter(n, torch.nn.Parameter(t))

    @classmethod
    def from_torch(cls, ctx, cfg, batch, seq, W, device="cpu"):
        """W: PyTorch-layout weights (wq, wk, wv, wo, w_gate, w_up, w_down, g1, g2[, gf, wlm])."""
        w = coda.pack_weights(cfg, W["wq"], W["wk"], W["wv"], W["wo"], W["w_gate"], W["w_up"],
                              W["w_down"], W["g1"], W["g2"], W.get("gf"), W.get("wlm"),
                              device=device)
        return cls(ctx, cfg, batch, seq, w, device=device)

    def forward(self, x, targets=None, loss_scale=1.0):
        params = tuple(getattr(self, n) for n in self._names)
        loss_scale = coda._float(loss_scale, "loss_scale")  # a number, not a tensor or a str
        return _LlamaFunction.apply(self, self._names, targets, loss_scale, x, *params)

    def grads_torch_layout(self):
        """The parameters' gradients in PyTorch's layout (dict, CPU)."""
        g = {n: getattr(self, n).grad for n in self._names}
        if any(v is None for v in g.values()):
            raise RuntimeError("coda.nn: no gradients yet (call backward first)")
        return coda.unpack_grads(self.cfg, g)
