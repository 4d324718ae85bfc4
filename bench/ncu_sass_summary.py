#!/usr/bin/env python3
"""ncu_sass_summary.py - a summary of an Nsight Compute source page exported
as CSV (`ncu -i R.ncu-rep --page source --csv --print-source sass`): one
row per SASS instruction with "Instructions Executed", "Warp Stall Sampling
(All Samples)" and one stall_* column per reason.

    python3 bench/ncu_sass_summary.py F.csv [--top 25] [--regions 0.5]

Prints the executed instructions and the stall samples by opcode, the
stall reasons over the kernel, the `--top` most sampled instructions with
their two main reasons, and "regions": the samples and instructions
between consecutive markers (products, barriers, fences, mbarrier ops),
each labelled by the marker that closes it, shown where they hold at
least `--regions` percent of the samples. A region's executions divided
by the warps a step and the steps give instructions a warp a step
(bench/profile_attention.sh; docs/attention.md has the reading).
"""
import argparse
import collections
import csv


def num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--regions", type=float, default=0.5)
    a = ap.parse_args()
    rows = list(csv.reader(open(a.csv)))
    hdr = next(i for i, r in enumerate(rows) if "Source" in r and "Instructions Executed" in r)
    ix = {h: i for i, h in enumerate(rows[hdr])}
    data = [r for r in rows[hdr + 1:] if len(r) == len(rows[hdr])]
    stalls = [h for h in rows[hdr] if h.startswith("stall_") and "Not Issued" not in h]
    samp = lambda r: num(r[ix["Warp Stall Sampling (All Samples)"]])
    execd = lambda r: num(r[ix["Instructions Executed"]])
    tot_s = sum(map(samp, data)) or 1.0
    tot_e = sum(map(execd, data)) or 1.0
    print("instructions executed %.0f, stall samples %.0f" % (tot_e, tot_s))

    by_op = collections.defaultdict(lambda: [0.0, 0.0])
    for r in data:
        words = [w for w in r[ix["Source"]].split() if not w.startswith("@")]
        op = words[0].split(".")[0] if words else "?"
        by_op[op][0] += execd(r)
        by_op[op][1] += samp(r)
    print("\nby opcode (executed %, samples %):")
    for op, (e, s) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:25]:
        print("  %-10s %5.1f %5.1f" % (op, 100 * e / tot_e, 100 * s / tot_s))

    reasons = collections.Counter()
    for r in data:
        for h in stalls:
            reasons[h[6:]] += num(r[ix[h]])
    print("\nstall reasons: " + ", ".join("%s %.1f%%" % (k, 100 * v / tot_s) for k, v in reasons.most_common(10)))

    print("\nmost sampled instructions (index, samples %, executed, source, main reasons):")
    for i in sorted(range(len(data)), key=lambda i: -samp(data[i]))[:a.top]:
        r = data[i]
        top = sorted(((num(r[ix[h]]), h[6:]) for h in stalls), reverse=True)[:2]
        print("  %5d %5.2f%% %12s  %-58s %s" % (i, 100 * samp(r) / tot_s, r[ix["Instructions Executed"]],
                                                r[ix["Source"]][:58], " ".join("%s:%.0f" % (n, v) for v, n in top)))

    print("\nregions (first-last index, samples %, executed M, closing marker):")
    marks = ("HGMMA", "BAR.", "SYNCS", "WARPGROUP", "FENCE", "MEMBAR")
    s_acc = e_acc = 0.0
    start = 0
    for i, r in enumerate(data):
        s_acc += samp(r)
        e_acc += execd(r)
        src = r[ix["Source"]]
        if any(m in src for m in marks) or ("BRA" in src and samp(r) / tot_s > 0.002):
            if 100 * s_acc / tot_s >= a.regions:
                print("  %5d-%5d %5.2f%% %8.1fM  %s" % (start, i, 100 * s_acc / tot_s, e_acc / 1e6, src[:64]))
            s_acc = e_acc = 0.0
            start = i + 1


if __name__ == "__main__":
    main()
