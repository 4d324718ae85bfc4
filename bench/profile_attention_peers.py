#!/usr/bin/env python3
"""profile_attention_peers.py - coda's attention and SDPA's cuDNN backend
side by side under Nsight Compute: the same memory and pipe counters for
every kernel of one forward and one backward of each, at a LLaMA-3 shape
(bench_attention.py's data and calls).

The script runs a few warm-up rounds, then one round between
cudaProfilerStart and cudaProfilerStop (process-wide: autograd runs SDPA's
backward on a thread of its own, which an NVTX range would miss):

    ncu --profile-from-start off --metrics $(python3 bench/profile_attention_peers.py --metrics) \\
        --csv python3 bench/profile_attention_peers.py --shape 70b > out.csv
    python3 bench/profile_attention_peers.py --summarise out.csv

Without ncu it runs the rounds and prints nothing (a smoke test of the
calls). Needs a CUDA GPU, torch with SDPA's cuDNN backend, and libcoda.
"""
import argparse
import csv
import os
import sys

METRICS = [
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_sector_hit_rate.pct",
    "lts__t_bytes.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__inst_executed.sum",
    "smsp__issue_active.avg.pct_of_peak_sustained_elapsed",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    "launch__grid_size",
    "launch__block_size",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_dynamic",
]


def summarise(path):
    """ncu's --csv (one row a kernel and metric) -> one line a kernel."""
    rows = {}
    with open(path) as f:
        lines = [ln for ln in f if ln.startswith('"')]
    for r in csv.DictReader(lines):
        key = (r["ID"], r["Kernel Name"][:70])
        rows.setdefault(key, {})[r["Metric Name"]] = (r["Metric Value"], r["Metric Unit"])
    for (kid, name), m in rows.items():
        print("kernel %s %s" % (kid, name))
        for k in METRICS:
            if k in m:
                print("    %-72s %s %s" % (k, m[k][0], m[k][1]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="70b", choices=("1b", "8b", "70b"))
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--metrics", action="store_true", help="print the metric list for ncu and exit")
    ap.add_argument("--summarise", metavar="CSV")
    a = ap.parse_args()
    if a.metrics:
        print(",".join(METRICS))
        return
    if a.summarise:
        summarise(a.summarise)
        return
    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_attention as BA
    import coda.ops
    B, S = BA.BATCH, BA.SEQ
    H, KV, D = BA.HEADS[a.shape]
    shape = (B, S, H, KV, D)
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(B * S, (H + 2 * KV) * D, generator=g).to(dev, torch.bfloat16)
    do = torch.randn(B * S, H * D, generator=g).to(dev, torch.bfloat16)
    cf, cb, _ = BA.make_coda(coda.ops.context(), qkv, do, shape)
    ctxf, why = BA.sdpa_backends()["sdpa cudnn"]
    if ctxf is None:
        sys.exit("no cuDNN backend: %s" % why)
    sf, sb, _, note = BA.make_sdpa(ctxf, qkv, do, shape)
    print("sdpa cudnn %s" % note, file=sys.stderr)
    for i in range(a.warmup + 1):
        if i == a.warmup:
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
        for fn in (cf, cb, sf, sb):
            fn()
        if i == a.warmup:
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
