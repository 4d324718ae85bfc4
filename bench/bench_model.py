#!/usr/bin/env python3
"""bench_model.py - a LLaMA-3-1B-shaped model's training step (forward +
backward of the whole model; no optimizer step) on the GPU: tokens per
second and peak memory for coda against eager PyTorch, torch.compile and
Liger-Kernel, in one process, the same attention (SDPA) everywhere (coda+attn: coda's own).

  eager          embedding, 16 PyTorch blocks (bench_block.TorchBlock), final
                 RMSNorm, LM head (bf16 GEMM) + cross-entropy in f32
  torch.compile  the same, each block and the head compiled
  liger          PyTorch blocks with Liger's RMSNorm / RoPE / SwiGLU kernels,
                 Liger's fused linear cross-entropy head
  coda           coda.nn.LlamaModel (coda blocks around SDPA); its LM head is
                 coda.nn.LMHeadLoss (coda_lm_loss: logits in bf16 chunks)
  coda-fn        (only when named in --variants) coda with fuse_norms=True:
                 each next block's first RMSNorm from this one's down
                 projection epilogue
  coda+attn      (only when named in --variants) coda with its own
                 attention (coda.nn.coda_attention) instead of SDPA: not the
                 same attention as the others, so a row for what a coda
                 user gets, not for the fusion's share
  coda+attn+c    (only when named in --variants) coda+attn with every
                 block keeping c = silu(gate) up for its backward
                 (LlamaBlock.keep_c: (M, I) bf16 more per block)

bf16 parameters for all; the median of --reps steps after two warm-ups, the
variants interleaved step by step in an order that changes every round
(step_timer.round_orders; up to and including stop 60's runs one fixed
order),
CUDA events, each step queued behind a sleep kernel that outlasts the host's
launches (step_timer.py; --host-lead: on an idle GPU, as before stop 49);
SDPA pinned to cuDNN's kernels (--sdpa); peak = torch.cuda.max_memory_allocated during one step minus
what was allocated before it (weights, inputs).

    python3 bench/bench_model.py [--layers 16] [--batch 2] [--seq 8192] [--vocab 128256]
                                 [--variants eager,torch.compile,liger,coda[,coda+attn,coda+attn+c,coda-fn]]
                                 [--profile 12]

--profile N also runs one step of each variant under torch.profiler (CUPTI)
and prints its GPU busy time (kernels summed) beside the step's time, and
its N costliest kernels: where a variant's step goes when the blocks alone
(bench_block.py) rank differently from the whole model.
--gaps N profiles one step of each variant (--gap-rounds R: R rounds, the
variants interleaved as in the timed steps) with the host's activity too and
prints how long the GPU waited for the host, the host calls that can stall
the stream, and the N largest waits with the ops that launched the late
kernel (trace_gaps.py).
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
sys.path.insert(0, HERE)
import coda  # noqa: E402
import coda.nn  # noqa: E402
import bench_block as bb  # noqa: E402
from profile_block import kernel_table  # noqa: E402
from step_timer import StepTimer, add_arguments, pin_sdpa, round_orders  # noqa: E402
from trace_gaps import gaps  # noqa: E402


class Head(torch.nn.Module):
    def __init__(self, wlm, gf, flce=None):
        super().__init__()
        self.wlm = torch.nn.Parameter(wlm.clone())
        self.gf = torch.nn.Parameter(gf.clone())
        self.flce = flce

    def forward(self, h, targets):
        hn = bb.rmsnorm(h, self.gf).reshape(-1, h.shape[-1])
        if self.flce is not None:
            return self.flce.apply(hn, self.wlm, targets.reshape(-1))[0]
        logits = F.linear(hn, self.wlm)
        return F.cross_entropy(logits.float(), targets.reshape(-1))


class TorchModel(torch.nn.Module):
    def __init__(self, emb, blocks, head):
        super().__init__()
        self.embed = torch.nn.Embedding.from_pretrained(emb.clone(), freeze=False)
        self.layers = torch.nn.ModuleList(blocks)
        self.head = head

    def forward(self, tokens, targets):
        h = self.embed(tokens)
        for b in self.layers:
            h = b(h)
        return self.head(h, targets)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--variants", default="eager,torch.compile,liger,coda")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="one profiled step a variant: GPU busy and the N costliest kernels")
    ap.add_argument("--gaps", type=int, default=0, metavar="N",
                    help="one profiled step a variant with the host: GPU idle and the N largest host waits")
    ap.add_argument("--gap-rounds", type=int, default=1, metavar="R",
                    help="with --gaps: R rounds of one profiled step a variant, interleaved")
    add_arguments(ap, sdpa=True)
    a = ap.parse_args()
    want = a.variants.split(",")
    dev = torch.device("cuda")
    shape = bb.SHAPES["1b"]
    d, H, KV, hd, ffn, theta = shape
    liger, why = bb.load_liger()
    flce = None
    if liger:
        try:
            from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction as flce
        except Exception as e:
            why = "no fused linear cross-entropy (%s)" % e
    timer = StepTimer(hide_lead=not a.host_lead)
    print("device: %s; torch %s; Liger-Kernel: %s\nSDPA: %s; timing: %s"
          % (torch.cuda.get_device_name(), torch.__version__, "yes" if liger else "no (%s)" % why,
             pin_sdpa(a.sdpa, bb.sdpa), timer.describe()), flush=True)
    W = bb.weights(shape, dev)
    g = torch.Generator(device="cpu").manual_seed(1)
    emb = (torch.randn(a.vocab, d, generator=g) * 0.02).to(dev, torch.bfloat16)
    wlm = (torch.randn(a.vocab, d, generator=g) / d ** 0.5).to(dev, torch.bfloat16)
    gf = torch.ones(d, device=dev, dtype=torch.bfloat16)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=dev)
    x, t = tokens[:, :-1], tokens[:, 1:]
    cfg = coda.LlamaConfig(d=d, n_heads=H, n_kv_heads=KV, head_dim=hd, ffn=ffn, vocab=0, eps=bb.EPS, rope_theta=theta)
    sd = {"model.embed_tokens.weight": emb, "model.norm.weight": gf, "lm_head.weight": wlm}
    for i in range(a.layers):
        for k, v in {"self_attn.q_proj.weight": W["wq"], "self_attn.k_proj.weight": W["wk"],
                     "self_attn.v_proj.weight": W["wv"], "self_attn.o_proj.weight": W["wo"],
                     "mlp.gate_proj.weight": W["w_gate"], "mlp.up_proj.weight": W["w_up"],
                     "mlp.down_proj.weight": W["w_down"], "input_layernorm.weight": W["g1"],
                     "post_attention_layernorm.weight": W["g2"]}.items():
            sd["model.layers.%d.%s" % (i, k)] = v
    t0 = time.time()
    models = []
    if "eager" in want:
        models.append(("eager", TorchModel(emb, [bb.TorchBlock(W, shape, a.seq) for _ in range(a.layers)],
                                           Head(wlm, gf))))
    if "torch.compile" in want:
        comp = TorchModel(emb, [torch.compile(bb.TorchBlock(W, shape, a.seq)) for _ in range(a.layers)],
                          Head(wlm, gf))
        comp.head = torch.compile(comp.head)
        models.append(("torch.compile", comp))
    if liger and "liger" in want:
        models.append(("liger", TorchModel(emb, [bb.TorchBlock(W, shape, a.seq, liger) for _ in range(a.layers)],
                                           Head(wlm, gf, flce))))
    def coda_model(attention, keep_c=False, **kw):
        m = coda.nn.LlamaModel.from_state_dict(cfg, sd, device=dev, dtype=torch.bfloat16, attention=attention, **kw)
        for blk in m.layers:
            blk.keep_c = keep_c
        return m

    if "coda" in want:
        models.append(("coda", coda_model(bb.coda_attention)))
    if "coda+attn" in want:  # coda's own attention kernels instead of SDPA
        models.append(("coda+attn", coda_model(coda.nn.coda_attention)))
    if "coda+attn+c" in want:  # and c kept from each block's forward for its backward
        models.append(("coda+attn+c", coda_model(coda.nn.coda_attention, keep_c=True)))
    if "coda-fn" in want:  # fuse_norms: each next block's first norm from the down projection's epilogue
        models.append(("coda-fn", coda_model(bb.coda_attention, fuse_norms=True)))

    def free_grads():
        """Every model's gradients freed before a step (not only the stepping
        one's): with four 1B-shaped models each holding 2.5 GB of gradients,
        eager's step ran out of an H100's 80 GB (stop 49)."""
        for _, mm in models:
            for p in mm.parameters():
                p.grad = None

    def step(m):
        for p in m.parameters():
            p.grad = None
        loss = m(x, t)
        loss.backward()
        return loss

    losses = {}
    for name, m in models:
        for _ in range(2):
            free_grads()
            losses[name] = float(step(m).detach())
    torch.cuda.synchronize()
    print("LLaMA-3-1B shape, %d blocks, vocab %d, batch %d x %d tokens (warm-up and compile %.0f s)"
          % (a.layers, a.vocab, a.batch, a.seq, time.time() - t0), flush=True)
    times = {n: [] for n, _ in models}
    free_grads()
    host = {n: timer.host_ms(lambda: (free_grads(), step(m))) if timer.hide_lead else None for n, m in models}
    # the caching allocator's trips to the driver during each variant's timed
    # steps (a cudaFree synchronises the device; retries free cached blocks)
    allocs = {n: [0, 0, 0] for n, _ in models}
    keys = ("num_device_alloc", "num_device_free", "num_alloc_retries")
    for order in round_orders(models, a.reps):
        for name, m in order:
            free_grads()
            s0 = torch.cuda.memory_stats()
            times[name].append(timer(lambda: step(m), host[name], name))
            s1 = torch.cuda.memory_stats()
            for i, k in enumerate(keys):
                allocs[name][i] += s1.get(k, 0) - s0.get(k, 0)
    print("  timing: %s; host launch ms: %s" % (timer.describe(), ", ".join(
        "%s %.1f" % (n, h) for n, h in host.items() if h is not None)))
    median = {n: sorted(t)[len(t) // 2] for n, t in times.items()}
    for n, ts in times.items():  # not `t`: the targets the step closes over
        print("  %-14s steps %s ms; in them the allocator made %d device allocations, %d frees, %d retries"
              % (n, " ".join("%.1f" % v for v in ts), *allocs[n]))
    print("  %-14s %10s %12s %10s %8s" % ("variant", "ms/step", "tokens/s", "peak GiB", "loss"))
    ntok = a.batch * a.seq
    for name, m in models:
        for p in m.parameters():
            p.grad = None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step(m)
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**30
        ms = median[name]
        print("  %-14s %10.1f %12.0f %10.2f %8.4f" % (name, ms, ntok / (ms * 1e-3), peak, losses[name]), flush=True)

    if a.profile > 0:
        for name, m in models:
            rows = kernel_table(lambda: step(m), 1)
            total = sum(us for _, us in rows.values()) / 1e3
            print("%s: GPU busy %.1f ms of a %.1f ms step (kernels summed), %d launches"
                  % (name, total, median[name], round(sum(n for n, _ in rows.values()))))
            # not `t`: that name is the targets the step closes over
            for k, (n, us) in sorted(rows.items(), key=lambda r: -r[1][1])[:a.profile]:
                print("  %9.3f ms %5.1f%% %5.0fx  %s" % (us / 1e3, 100 * us / 1e3 / total, n, k[:100]))
            sys.stdout.flush()
    for r, order in enumerate(round_orders(models, a.gap_rounds if a.gaps > 0 else 0)):  # as the timed steps
        for name, m in order:
            gaps(lambda: step(m), "%s (round %d)" % (name, r + 1), a.gaps)


if __name__ == "__main__":
    main()
