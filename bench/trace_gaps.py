#!/usr/bin/env python3
"""trace_gaps.py - where a step leaves the GPU idle, and what the host was
doing then (torch.profiler with CPU and CUDA activities, read back from its
Chrome trace).

    from trace_gaps import gaps
    gaps(step, "coda", top=12)      # step: a function running one step

For each kernel of one step, the idle time on the GPU before it (from the
previous kernel's end) is split by when the host launched it: launched after
the previous kernel had ended means the GPU waited for the host ("host
gap"); launched before, the gap is the GPU's own (a dependency, a copy, a
sync inside the driver). Printed: the step's time by CUDA events (what
the benchmarks time), how long its first kernel waited for the host
("lead") and how long the host stayed in the step after its last kernel
had ended ("tail"; the benchmarks' end event waits for it), the idle time
summed both ways, the host calls inside the step that can stall a stream
(synchronize, blocking copies, allocations, with their total host time;
gaps()'s own synchronize after the step is left out), the `top` largest
host gaps with the Python/C++ ops on the host stack when the late kernel
was launched, and the kernels' time by the outermost op that launched them (the forward's
autograd Functions and torch ops, the backward's autograd nodes): which
part of a step its kernel time goes to.

With --selftest it checks the analysis on a synthetic trace (no GPU).
"""
import json
import os
import sys
import tempfile

# host calls that can wait for the GPU or stall the stream
_STALLS = ("Synchronize", "cudaMemcpy", "cuMemcpy", "cudaMalloc", "cuMemAlloc", "cudaFree", "cuMemFree",
           "cudaHostAlloc", "cudaStreamWaitEvent", "cudaEventSynchronize")


def analyse(trace, top=12, step_name=None):
    """trace: the Chrome trace dict -> (summary dict, report lines).
    step_name: a user annotation around the step (gaps() makes one), whose
    host span is compared with the kernels': the GPU's wait for the host
    before the first kernel ("lead") and after the last one ("tail": the
    host still inside the step when the GPU has nothing left)."""
    ev = trace["traceEvents"] if isinstance(trace, dict) else trace
    kernels, launches, cpu_ops, runtime = [], {}, [], []
    for e in ev:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat", "")
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            kernels.append(e)
        elif cat == "cuda_runtime" or cat == "cuda_driver":
            runtime.append(e)
            c = e.get("args", {}).get("correlation")
            if c is not None:
                launches[c] = e
        elif cat in ("cpu_op", "python_function", "user_annotation"):
            cpu_ops.append(e)
    kernels.sort(key=lambda e: e["ts"])
    cpu_ops.sort(key=lambda e: (e["ts"], -e.get("dur", 0.0)))  # a parent before a child that starts with it
    st = [o for o in cpu_ops if o["name"] == step_name] if step_name else []
    s0, s1 = (st[0]["ts"], st[0]["ts"] + st[0].get("dur", 0.0)) if st else (float("-inf"), float("inf"))
    host_gap = dev_gap = 0.0
    rows = []
    for prev_end, k in _gaps_before(kernels):
        gap = k["ts"] - prev_end
        if gap <= 0:
            continue
        la = launches.get(k.get("args", {}).get("correlation"))
        if la is not None and la["ts"] > prev_end:
            late = min(gap, la["ts"] - prev_end)
            host_gap += late
            dev_gap += gap - late
            rows.append((late, gap, k, la))
        else:
            dev_gap += gap
    stalls = {}  # inside the step only (gaps()'s own synchronize comes after it)
    for r in runtime:
        if s0 <= r["ts"] <= s1 and any(x in r["name"] for x in _STALLS) and "Async" not in r["name"]:
            n, t = stalls.get(r["name"], (0, 0.0))
            stalls[r["name"]] = (n + 1, t + r.get("dur", 0.0))
    busy = sum(k.get("dur", 0.0) for k in kernels)
    span = (kernels[-1]["ts"] + kernels[-1].get("dur", 0.0) - kernels[0]["ts"]) if kernels else 0.0
    out = ["kernels and copies %d, busy %.1f ms of %.1f ms from the first one's start to the last's end; "
           "idle %.2f ms waiting for the host, %.2f ms otherwise"
           % (len(kernels), busy / 1e3, span / 1e3, host_gap / 1e3, dev_gap / 1e3)]
    lead = tail = None
    if st and kernels:
        k_end = kernels[-1]["ts"] + kernels[-1].get("dur", 0.0)
        lead, tail = kernels[0]["ts"] - s0, s1 - k_end
        out.append("  step on the host %.2f ms: its first kernel starts %.2f ms after the step's start, "
                   "the host leaves the step %.2f ms after the last kernel's end"
                   % ((s1 - s0) / 1e3, lead / 1e3, tail / 1e3))
        if tail > 0:  # what the host did while the GPU had nothing left
            late_ops = sorted((o for o in cpu_ops if o["ts"] >= k_end and o["ts"] < s1 and o is not st[0]),
                              key=lambda o: -o.get("dur", 0.0))
            for o in late_ops[:4]:
                out.append("      after the last kernel: %-50s %9.1f us" % (o["name"][:50], o.get("dur", 0.0)))
    for name, (n, t) in sorted(stalls.items(), key=lambda s: -s[1][1]):
        out.append("  host call %-34s x%-4d %9.1f us" % (name[:34], n, t))
    rows.sort(key=lambda r: -r[0])
    for late, gap, k, la in rows[:top]:
        stack = [o["name"] for o in _stack(cpu_ops, la)]
        out.append("  %8.1f us late (gap %8.1f) before %s" % (late, gap, k["name"][:60]))
        out.append("      launched in: %s" % (" > ".join(s[:40] for s in stack[-4:]) or "?"))
    # kernel time by the outermost op that launched it (besides the step's
    # annotation): the forward's autograd Functions and torch ops, the
    # backward's "autograd::engine::evaluate_function: ..." nodes
    by_op = {}
    for k in kernels:
        la = launches.get(k.get("args", {}).get("correlation"))
        ops = [o["name"] for o in _stack(cpu_ops, la) if o["name"] != step_name] if la is not None else []
        op = ops[0] if ops else "?"
        n, t = by_op.get(op, (0, 0.0))
        by_op[op] = (n + 1, t + k.get("dur", 0.0))
    out.append("  kernel time by the op that launched it:")
    for name, (n, t) in sorted(by_op.items(), key=lambda r: -r[1][1])[:top]:
        out.append("    %9.1f us %4dx  %s" % (t, n, name[:90]))
    return {"kernels": len(kernels), "busy_us": busy, "span_us": span, "host_gap_us": host_gap,
            "dev_gap_us": dev_gap, "stalls": stalls, "lead_us": lead, "tail_us": tail, "by_op": by_op}, out


def _stack(cpu_ops, la):
    """The host ops of la's thread that enclose launch la, outermost first."""
    return [o for o in cpu_ops if o.get("tid") == la.get("tid") and o.get("pid") == la.get("pid")
            and o["ts"] <= la["ts"] <= o["ts"] + o.get("dur", 0.0)]


STEP = "trace_gaps.step"  # gaps()'s annotation around the step


def _gaps_before(kernels):
    """(the latest end among the earlier kernels, kernel) for each kernel after the first."""
    end = None
    for k in kernels:
        if end is not None:
            yield end, k
        e = k["ts"] + k.get("dur", 0.0)
        end = e if end is None else max(end, e)


def gaps(step, label, top=12):
    """Profile one call of step() (CPU + CUDA) and print analyse()'s report."""
    import torch
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.profiler.profile(activities=acts) as prof:
        e0.record()
        with torch.profiler.record_function(STEP):
            step()
        e1.record()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    summary, lines = analyse(trace, top, STEP)
    summary["events_ms"] = e0.elapsed_time(e1)
    print("%s: the step %.2f ms by CUDA events; %s" % (label, summary["events_ms"], lines[0]))
    for line in lines[1:]:
        print(line)
    sys.stdout.flush()
    return summary


def _selftest():
    """Three kernels: the second launched late (host gap 40 us), the third
    launched early but started 5 us after the second ended (device gap)."""
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "step", "ts": 0, "dur": 150},
        {"ph": "X", "cat": "cpu_op", "name": "outer", "ts": 0, "dur": 120},
        {"ph": "X", "cat": "cpu_op", "name": "inner", "ts": 90, "dur": 20},
        {"ph": "X", "cat": "cpu_op", "name": "elsewhere", "ts": 0, "dur": 300, "tid": 2},  # another thread
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1, "dur": 2, "args": {"correlation": 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 100, "dur": 2,
         "args": {"correlation": 2}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 101, "dur": 2,
         "args": {"correlation": 3}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 140, "dur": 30},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 130, "dur": 5},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "ts": 160, "dur": 50},  # after
        {"ph": "X", "cat": "kernel", "name": "k1", "ts": 10, "dur": 50, "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "k2", "ts": 105, "dur": 10, "args": {"correlation": 2}},
        {"ph": "X", "cat": "kernel", "name": "k3", "ts": 120, "dur": 10, "args": {"correlation": 3}},
    ]
    for e in ev:
        e.setdefault("tid", 1)
    s, lines = analyse({"traceEvents": ev}, top=5, step_name="step")
    ok = (s["by_op"] == {"outer": (3, 70)} and s["kernels"] == 3 and s["busy_us"] == 70 and s["span_us"] == 120 and abs(s["host_gap_us"] - 40) < 1e-9
          and abs(s["dev_gap_us"] - 10) < 1e-9 and s["stalls"] == {"cudaStreamSynchronize": (1, 30)}
          and any("launched in: step > outer > inner" in line for line in lines) and s["lead_us"] == 10 and s["tail_us"] == 20)
    print("\n".join(lines))
    print("trace_gaps selftest:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(_selftest() if "--selftest" in sys.argv else 0)
