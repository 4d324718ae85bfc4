#!/usr/bin/env python3
"""bench_block.py - one LLaMA block, forward and forward+backward, on the GPU:
coda (coda.nn.LlamaBlock: the split block of coda.h section 9 around
PyTorch's SDPA) against the floor and the peers, all in one process, with
the same attention (torch SDPA, causal, GQA):

  floor          the block's own GEMMs at cuBLAS speed (torch.matmul, bf16)
                 + the same SDPA call: what a block costs with every
                 elementwise step free. One copy stays in it: the cat of
                 SDPA's dq, dk, dv into the (M, nqkv) matrix the QKV
                 backward GEMMs read (0.067 ms at LLaMA-3 1B, stop 40's
                 H100 profile), which coda no longer makes
                 (coda_block_backward_pre_split) and unfused peers do
  eager          the block in plain PyTorch (HF-style RMSNorm in f32, RoPE,
                 SwiGLU), bf16
  torch.compile  the same module compiled (default mode)
  liger          the eager block with Liger-Kernel's RMSNorm, fused
                 add+RMSNorm, RoPE and SwiGLU ($LIGER_SRC, .liger/src or
                 the installed package: bench/liger_import.py; skipped
                 with a note if it does not import)
  coda           coda.nn.LlamaBlock, bf16 parameters
  coda+attn      (--coda-attention) the same with coda's own attention
                 (attention="coda", coda.h section 11) instead of SDPA: the
                 whole block coda's, measured against the same floor
  coda+c, coda+attn+c  (--keep-c) coda and coda+attn keeping c = silu(gate) up
                 from the forward for the backward (LlamaBlock.keep_c)

Time: CUDA events, after warm-up, --reps rounds, the variants interleaved
run by run (clocks drift under load), in an order that changes every
round so that each variant's predecessors spread over the others
(step_timer.round_orders: seeded, the same orders in every run); up to and
including stop 60's runs the order was rotated by one a round, which kept
a variant behind the same neighbour in every round it did not start. Each
call is queued behind a sleep kernel that outlasts the host's launches
(step_timer.py), so the times are the GPU's and not the host's lead before
the first kernel (0.6 ms for the floor, 1.0-1.1 for coda and torch.compile
at 1B: stop 45);
--host-lead times as before stop 49. The ratio to the floor is taken round
by round (each variant against the floor of the same round) and printed as
the median with the lowest and highest round. SDPA runs cuDNN's kernels only
(--sdpa; torch's switches, so every variant alike). Memory:
the peak of torch.cuda.max_memory_allocated over one run, minus what was
allocated before it (inputs and weights; the previous run's gradients are
freed first), so it is what the step itself holds, its weight and input
gradients included. (Before stop 48 the previous run's gradients were still
allocated when the base was read, so every module variant's
forward+backward peak read low by its gradients' size: 0.18 / 0.53 / 1.84
GiB at 1B / 8B / 70B; differences between variants were right.)
Shapes: LLaMA-3 1B / 8B / 70B blocks at batch 2 x sequence 8192 (--shapes,
--batch, --seq to change). --check compares coda's y and dx with eager's.
--gaps N profiles one forward+backward of the floor, torch.compile and coda
with the host and prints how long the GPU waited for the host
(trace_gaps.py).

    python3 bench/bench_block.py [--shapes 1b,8b,70b] [--reps 10] [--check] [--gaps N]
                                 [--sdpa cudnn|flash|default] [--host-lead] [--coda-attention] [--keep-c]
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import coda  # noqa: E402
import coda.nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_timer import StepTimer, add_arguments, pin_sdpa, round_orders, spread  # noqa: E402
from trace_gaps import gaps  # noqa: E402
from liger_import import import_liger  # noqa: E402

SHAPES = {  # d, n_heads, n_kv_heads, head_dim, ffn, rope_theta
    "1b": (2048, 32, 8, 64, 8192, 500000.0),
    "8b": (4096, 32, 8, 128, 14336, 500000.0),
    "70b": (8192, 64, 8, 128, 28672, 500000.0),
}
EPS = 1e-5


def load_liger():
    def load():
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.rope import LigerRopeFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
        return (LigerFusedAddRMSNormFunction, LigerRMSNormFunction, LigerRopeFunction, LigerSiLUMulFunction)
    return import_liger(load)


def sdpa(q, k, v):
    """q (B, H, S, hd), k, v (B, KV, S, hd): causal GQA attention."""
    try:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
    except TypeError:  # torch without enable_gqa
        rep = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                              is_causal=True)


def rope_tables(seq, hd, theta, device):
    inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64, device=device) / hd)
    ang = torch.arange(seq, dtype=torch.float64, device=device)[:, None] * inv[None, :]
    ang = torch.cat((ang, ang), -1)
    return ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def rmsnorm(x, g):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * g


class TorchBlock(torch.nn.Module):
    """The block in PyTorch, weights in PyTorch's layout (bf16 parameters)."""

    def __init__(self, W, shape, seq, liger=None):
        super().__init__()
        self.d, self.H, self.KV, self.hd, self.ffn, theta = shape
        for k, v in W.items():
            self.register_parameter(k, torch.nn.Parameter(v.clone()))
        cos, sin = rope_tables(seq, self.hd, theta, W["wq"].device)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)
        self.liger = liger

    def forward(self, x):
        B, S, d = x.shape
        lg = self.liger
        xn = lg[1].apply(x, self.g1, EPS, 0.0, "llama", False) if lg else rmsnorm(x, self.g1)
        q = F.linear(xn, self.wq).view(B, S, self.H, self.hd).transpose(1, 2)
        k = F.linear(xn, self.wk).view(B, S, self.KV, self.hd).transpose(1, 2)
        v = F.linear(xn, self.wv).view(B, S, self.KV, self.hd).transpose(1, 2)
        if lg:
            q, k = lg[2].apply(q, k, self.cos[None], self.sin[None])
        else:
            q, k = rotate(q, self.cos, self.sin), rotate(k, self.cos, self.sin)
        o = sdpa(q, k, v).transpose(1, 2).reshape(B, S, self.H * self.hd)
        a = F.linear(o, self.wo)
        if lg:
            hn, h = lg[0].apply(a, x, self.g2, EPS, 0.0, "llama", False)
            c = lg[3].apply(F.linear(hn, self.w_gate), F.linear(hn, self.w_up))
        else:
            h = x + a
            hn = rmsnorm(h, self.g2)
            c = F.silu(F.linear(hn, self.w_gate)) * F.linear(hn, self.w_up)
        return h + F.linear(c, self.w_down)


class Floor:
    """Only the block's GEMMs (cuBLAS, through torch.matmul) and the same
    SDPA, forward and backward, on inputs made beforehand: every other step
    of the block left out. The values are not a block's; the time is its
    floor. fwd(x), fwd_bwd(x, dy)."""

    def __init__(self, W, shape, B, S):
        self.d, self.H, self.KV, self.hd, self.ffn, _ = shape
        self.B, self.S = B, S
        self.wqkv = torch.cat((W["wq"], W["wk"], W["wv"]))
        self.wo, self.wd = W["wo"], W["w_down"]
        self.wgu = torch.cat((W["w_gate"], W["w_up"]))
        m = B * S
        self.c = torch.randn(m, self.ffn, device=self.wo.device, dtype=torch.bfloat16)
        self.dgu = torch.randn(m, 2 * self.ffn, device=self.wo.device, dtype=torch.bfloat16)

    def _attn(self, qkv, grad):
        B, S, H, KV, hd = self.B, self.S, self.H, self.KV, self.hd
        q, k, v = qkv.split([H * hd, KV * hd, KV * hd], -1)
        q = q.reshape(B, S, H, hd).transpose(1, 2)
        k = k.reshape(B, S, KV, hd).transpose(1, 2)
        v = v.reshape(B, S, KV, hd).transpose(1, 2)
        if grad:
            q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
        return (q, k, v), sdpa(q, k, v).transpose(1, 2).reshape(B * S, H * hd)

    def fwd(self, x):
        x = x.reshape(-1, self.d)
        _, o = self._attn(x @ self.wqkv.t(), False)
        a = o @ self.wo.t()
        a @ self.wgu.t()
        return self.c @ self.wd.t()

    def fwd_bwd(self, x, dy):
        x, dy = x.reshape(-1, self.d), dy.reshape(-1, self.d)
        with torch.enable_grad():
            qkv_in, o = self._attn(x @ self.wqkv.t(), True)
            a = o.detach() @ self.wo.t()
            a @ self.wgu.t()
            self.c @ self.wd.t()
            dy @ self.wd, dy.t() @ self.c                     # down: dgrad, wgrad
            da = self.dgu @ self.wgu                          # gate/up
            self.dgu.t() @ a
            do = da @ self.wo                                 # O
            da.t() @ o.detach()
            dq, dk, dv = torch.autograd.grad(o, qkv_in, do.reshape(o.shape))
            dqkv = torch.cat([t.transpose(1, 2).reshape(x.shape[0], -1) for t in (dq, dk, dv)], -1)
            dqkv @ self.wqkv, dqkv.t() @ x                    # QKV
        return None


def coda_attention(qkv, batch, seq, n_heads, n_kv_heads, head_dim, split=None):
    """coda.nn.causal_attention with the benchmark's sdpa. split: how q, k
    and v come out of qkv (coda.ops.split_qkv: their gradients go to the
    block's backward as they are; --cat-ab times torch's split, whose
    backward concatenates them, beside it)."""
    nq, nkv = n_heads * head_dim, n_kv_heads * head_dim
    q, k, v = (split or coda.ops.split_qkv)(qkv, nq, nkv)
    q = q.reshape(batch, seq, n_heads, head_dim).transpose(1, 2)
    k = k.reshape(batch, seq, n_kv_heads, head_dim).transpose(1, 2)
    v = v.reshape(batch, seq, n_kv_heads, head_dim).transpose(1, 2)
    return sdpa(q, k, v).transpose(1, 2).reshape(batch * seq, nq)


def weights(shape, device):
    d, H, KV, hd, ffn, _ = shape
    g = torch.Generator(device="cpu").manual_seed(0)
    r = lambda *s: (torch.randn(*s, generator=g) / math.sqrt(s[-1])).to(device, torch.bfloat16)
    return {"wq": r(H * hd, d), "wk": r(KV * hd, d), "wv": r(KV * hd, d), "wo": r(d, H * hd),
            "w_gate": r(ffn, d), "w_up": r(ffn, d), "w_down": r(d, ffn),
            "g1": (1 + 0.1 * torch.randn(d, generator=g)).to(device, torch.bfloat16),
            "g2": (1 + 0.1 * torch.randn(d, generator=g)).to(device, torch.bfloat16)}


def torch_split(qkv, nq, nkv):
    return qkv.split([nq, nkv, nkv], dim=1)


def coda_block(W, shape, dev, attention=None):
    """coda.nn.LlamaBlock (bf16 parameters, SDPA attention) from the weights
    W, through a LLaMA-style state_dict as a user would load one."""
    d, H, KV, hd, ffn, theta = shape
    cfg = coda.LlamaConfig(d=d, n_heads=H, n_kv_heads=KV, head_dim=hd, ffn=ffn, vocab=0, eps=EPS, rope_theta=theta)
    sd = {"model.layers.0." + k: v for k, v in {
        "self_attn.q_proj.weight": W["wq"], "self_attn.k_proj.weight": W["wk"], "self_attn.v_proj.weight": W["wv"],
        "self_attn.o_proj.weight": W["wo"], "mlp.gate_proj.weight": W["w_gate"], "mlp.up_proj.weight": W["w_up"],
        "mlp.down_proj.weight": W["w_down"], "input_layernorm.weight": W["g1"],
        "post_attention_layernorm.weight": W["g2"]}.items()}
    return coda.nn.LlamaBlock.from_state_dict(cfg, sd, "model.layers.0.", device=dev, dtype=torch.bfloat16,
                                              attention=attention or coda_attention)


def bench_shape(name, shape, B, S, reps, liger, do_check, timer, n_gaps=0, cat_ab=False, own_attention=False,
                keep_c=False):
    dev = torch.device("cuda")
    d, H, KV, hd, ffn, theta = shape
    W = weights(shape, dev)
    floor = Floor(W, shape, B, S)
    mods = [("eager", TorchBlock(W, shape, S))]
    t0 = time.time()
    mods.append(("torch.compile", torch.compile(TorchBlock(W, shape, S))))
    if liger:
        mods.append(("liger", TorchBlock(W, shape, S, liger)))
    mods.append(("coda", coda_block(W, shape, dev)))
    if cat_ab:
        mods.append(("coda-cat", coda_block(W, shape, dev, lambda *a: coda_attention(*a, split=torch_split))))
    if own_attention:
        mods.append(("coda+attn", coda_block(W, shape, dev, coda.nn.coda_attention)))
    if keep_c:  # coda and coda+attn again, each block keeping c
        for v in [v for v, _ in mods if v in ("coda", "coda+attn")]:
            m = coda_block(W, shape, dev, coda.nn.coda_attention if v == "coda+attn" else None)
            m.keep_c = True
            mods.append((v + "+c", m))
    x = torch.randn(B, S, d, device=dev, dtype=torch.bfloat16)
    dy = torch.randn(B, S, d, device=dev, dtype=torch.bfloat16)
    xg = x.clone().requires_grad_(True)

    def module_fns(m):
        def fwd():
            with torch.no_grad():
                return m(x)

        def fwd_bwd():
            for p in m.parameters():
                p.grad = None
            xg.grad = None
            y = m(xg)
            y.backward(dy)
            return y
        return fwd, fwd_bwd

    mod_of = dict(mods)
    variants = [("floor", (lambda: floor.fwd(x), lambda: floor.fwd_bwd(x, dy)))]
    variants += [(v, module_fns(m)) for v, m in mods]
    for _, (f, fb) in variants:  # warm-up (and compile)
        for _ in range(2):
            f(), fb()
    torch.cuda.synchronize()
    print("%s: M = %d x %d, d %d, heads %d/%d x %d, ffn %d (warm-up and compile %.0f s)"
          % (name, B, S, d, H, KV, hd, ffn, time.time() - t0), flush=True)
    res = {}
    for mi, mode in enumerate(("forward", "forward+backward")):
        times = {v: [] for v, _ in variants}
        host = {v: timer.host_ms(fns[mi]) if timer.hide_lead else None for v, fns in variants}
        for order in round_orders(variants, reps):
            for v, fns in order:
                times[v].append(timer(fns[mi], host[v], "%s %s" % (name, v)))
        peaks = {}
        for v, fns in variants:
            if v in mod_of:  # the last run's gradients freed before the base is read
                for p in mod_of[v].parameters():
                    p.grad = None
            xg.grad = None
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            out = fns[mi]()
            torch.cuda.synchronize()
            peaks[v] = (torch.cuda.max_memory_allocated() - base) / 2**30
            del out
        med = {v: spread(t)[0] for v, t in times.items()}
        ratio = {v: spread([a / b for a, b in zip(t, times["floor"])]) for v, t in times.items()}
        print("  %-17s %-14s %9s %8s %15s %10s %9s" % (mode, "variant", "ms", "/floor", "rounds lo-hi",
                                                       "peak GiB", "host ms"))
        for v, _ in variants:
            hm = "%9.2f" % host[v] if host[v] is not None else "%9s" % "-"
            print("  %-17s %-14s %9.3f %8.3f %7.3f-%-7.3f %10.2f %s" % ("", v, med[v], ratio[v][0], ratio[v][1],
                                                                     ratio[v][2], peaks[v], hm))
        res[mode] = (med, peaks)
    for v, fns in variants:
        if n_gaps > 0 and v in ("floor", "torch.compile", "coda"):
            gaps(fns[1], "%s %s forward+backward" % (name, v), n_gaps)
    if do_check:
        eager, cm = mods[0][1], dict(mods)["coda"]
        with torch.no_grad():
            ye, yc = eager(x), cm(x)
        e = ((yc.float() - ye.float()).norm() / ye.float().norm()).item()
        print("  check: coda y vs eager y: relative difference %.2e" % e)
    sys.stdout.flush()
    del variants, mods
    torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1b,8b,70b")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--gaps", type=int, default=0, metavar="N",
                    help="profile one forward+backward of floor, torch.compile and coda with the host: "
                         "GPU idle and the N largest waits for the host (trace_gaps.py)")
    ap.add_argument("--cat-ab", action="store_true",
                    help="also time coda with torch's split of qkv (autograd concatenates dq, dk, dv) as coda-cat")
    ap.add_argument("--coda-attention", action="store_true",
                    help="also time coda with its own attention instead of SDPA, as coda+attn")
    ap.add_argument("--keep-c", action="store_true",
                    help="also time coda (and coda+attn) keeping c from the forward (LlamaBlock.keep_c), as coda+c")
    add_arguments(ap, sdpa=True)
    a = ap.parse_args()
    liger, why = load_liger()
    sdpa_note = pin_sdpa(a.sdpa, sdpa)
    timer = StepTimer(hide_lead=not a.host_lead)
    print("device: %s; torch %s; Liger-Kernel: %s; coda custom ops: %s\nSDPA: %s; timing: %s"
          % (torch.cuda.get_device_name(), torch.__version__, "yes" if liger else "no (%s)" % why,
             coda.ops.HAVE_CUSTOM_OPS, sdpa_note, timer.describe()), flush=True)
    for s in a.shapes.split(","):
        bench_shape(s, SHAPES[s], a.batch, a.seq, a.reps, liger, a.check, timer, a.gaps, a.cat_ab, a.coda_attention,
                    a.keep_c)
    print("timing: %s" % timer.describe())


if __name__ == "__main__":
    main()
