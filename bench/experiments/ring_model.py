#!/usr/bin/env python3
"""ring_model.py - the stage ring of the epilogue-overlap prototype with
ring inputs (stop 61; the library's overlap, src/cuda/kernels/
gemm_overlap.cuh, takes no ring inputs: this is for a ring version), modelled: the producer's fill
order against the consumer's, and whether the consumer ever waits for a
stage whose previous use it has not freed yet (with S stages the producer
fills position p only once p - S is free: a deadlock otherwise).

    python3 bench/experiments/ring_model.py     prints the cases and deadlocks; exit 1 on any

It found the prototype's first schedule deadlocking when 3 or more chunks
fell after one k-block (kiters <= 2); the patch now runs the previous
tile's chunks after the k-loop when kiters < 2 * NCH. Set OVERLAP_MIN = 1
below to see the deadlock again."""
import sys
S, NCH = 4, 4  # stages; 64-column chunks a 128 x 256 tile
OVERLAP_MIN = 2 * NCH  # the patch's exp_overlap(): kiters >= 2 NCH
def slot(q, kiters): return (2 * q + 1) * kiters // (2 * NCH)
def producer(tiles, kiters):
    seq, have_prev, overlap = [], False, kiters >= OVERLAP_MIN
    for i in range(tiles):
        for kb in range(kiters):
            seq.append(('kb', i, kb))
            if have_prev and overlap:
                for q in range(NCH):
                    if kb == slot(q, kiters): seq.append(('ring', i - 1, q))
        if have_prev and not overlap:
            for q in range(NCH): seq.append(('ring', i - 1, q))
        have_prev = True
    if have_prev:
        for q in range(NCH): seq.append(('ring', tiles - 1, q))
    return seq
def consumer(tiles, kiters):
    ev, it, have_prev, overlap = [], 0, False, kiters >= OVERLAP_MIN
    def chunk(tile, q):
        nonlocal it
        ev.append(('acq', it, ('ring', tile, q))); ev.append(('rel', it)); it += 1
    for i in range(tiles):
        held = -1
        for kb in range(kiters):
            mine = it; ev.append(('acq', mine, ('kb', i, kb))); it += 1
            if have_prev and overlap:
                for q in range(NCH):
                    if kb == slot(q, kiters): chunk(i - 1, q)
            if held >= 0: ev.append(('rel', held))
            held = mine
        if held >= 0: ev.append(('rel', held))
        if have_prev and not overlap:
            for q in range(NCH): chunk(i - 1, q)
        have_prev = True
    if have_prev:
        for q in range(NCH): chunk(tiles - 1, q)
    return ev
bad = 0
for tiles in range(1, 7):
    for kiters in range(1, 300):
        p = producer(tiles, kiters)
        ev = consumer(tiles, kiters)
        acq = [e for e in ev if e[0] == 'acq']
        assert [a[2] for a in acq] == p, (tiles, kiters)
        assert [a[1] for a in acq] == list(range(len(p)))
        released = set()
        for e in ev:
            if e[0] == 'rel': released.add(e[1])
            elif e[1] >= S and e[1] - S not in released:
                bad += 1; print('deadlock', tiles, kiters, e); break
        else:
            assert released == set(range(len(p))), (tiles, kiters)
print('cases', 6 * 299, 'deadlocks', bad)
sys.exit(1 if bad else 0)
