"""step_timer.py - time one call of a GPU step, with or without the host's
lead, for the benchmark scripts.

A call timed as `e0.record(); fn(); e1.record()` on an idle GPU counts the
host's lead: the GPU waits from e0 until the host has run enough Python to
launch the first kernel, and again wherever the host falls behind. In a
training loop the host runs ahead of the GPU, so that wait is not part of a
step's cost; it also differs between variants (a compiled graph, a module
of custom ops and a few torch.matmul calls reach their first kernel after
0.3-1.1 ms: bench/HISTORY.md, stop 45's gap table) and so moves their
ratios: at the 1B block by 2-14% of the floor, and attention against
cuDNN by up to 11% (bench/HISTORY.md, stop 49).

StepTimer(hide_lead=True) queues a sleep kernel before e0, long enough for
the host to launch the whole step behind it (twice the host's measured
launch time plus 0.2 ms), so the events see the GPU's time only. A step
that makes the host wait on the GPU (a .item(), a cudaFree) still pays for
it: the sleep ends, and the GPU idles until the host goes on. Each timed
call reports whether the host was done launching before the sleep ran
out (counted per label); a step that was not covered may have counted
some host time, or only blocked on a full launch queue (which the GPU
drains meanwhile).
hide_lead=False is the plain method (the tables before stop 49).
"""
import random
import time

import torch


class StepTimer:
    def __init__(self, cuda=True, hide_lead=True):
        self.cuda, self.hide_lead = cuda, hide_lead and cuda
        self.cycles_per_ms = self._calibrate() if self.hide_lead else 0.0
        self.uncovered = {}  # label -> timed calls whose launches outlasted the sleep

    def _calibrate(self):
        """Clock cycles of torch.cuda._sleep per millisecond (the highest of
        a few tries: the clock ramps up under load)."""
        best = 0.0
        for _ in range(5):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            n = 4_000_000
            e0.record()
            torch.cuda._sleep(n)
            e1.record()
            e1.synchronize()
            best = max(best, n / max(e0.elapsed_time(e1), 1e-3))
        return best

    def host_ms(self, fn, n=3):
        """The host's time to launch fn (the median of n calls on an idle GPU)."""
        ts = []
        for _ in range(n):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            ts.append(1e3 * (time.perf_counter() - t0))
            torch.cuda.synchronize()
        return sorted(ts)[len(ts) // 2]

    def __call__(self, fn, host_ms=None, label="?"):
        """Time one call of fn in ms. host_ms: its launch time (host_ms()),
        measured here when not given; label: whose call (describe() counts
        the calls that outlasted their sleep by label)."""
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            return 1e3 * (time.perf_counter() - t0)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if self.hide_lead:
            if host_ms is None:
                host_ms = self.host_ms(fn, 1)
            sleep_ms = min(2.0 * host_ms + 0.2, 200.0)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            torch.cuda._sleep(int(sleep_ms * self.cycles_per_ms))
            e0.record()
            fn()
            e1.record()
            if 1e3 * (time.perf_counter() - t0) > sleep_ms:
                self.uncovered[label] = self.uncovered.get(label, 0) + 1
        else:
            e0.record()
            fn()
            e1.record()
        e1.synchronize()
        return e0.elapsed_time(e1)

    def describe(self):
        if not self.cuda:
            return "host clock (no GPU)"
        if not self.hide_lead:
            return "CUDA events around each call on an idle GPU (the host's lead included)"
        late = ", ".join("%s %d" % kv for kv in sorted(self.uncovered.items())) or "none"
        return ("CUDA events around each call, queued behind a sleep kernel twice the host's launch time "
                "(the host's lead hidden; timed calls whose launches outlasted their sleep: %s)" % late)


def add_arguments(ap, sdpa=False):
    """The timing options of a benchmark's argparse parser: --host-lead, and
    with sdpa --sdpa (pin_sdpa's backend)."""
    ap.add_argument("--host-lead", action="store_true",
                    help="time each call on an idle GPU, the host's lead included (the method before stop 49)")
    if sdpa:
        ap.add_argument("--sdpa", default="cudnn", choices=("cudnn", "flash", "efficient", "default"),
                        help="the one SDPA backend every variant runs (default: cudnn)")


def _switch_sdpa(backend):
    b = torch.backends.cuda
    switches = {"cudnn": "enable_cudnn_sdp", "flash": "enable_flash_sdp",
                "efficient": "enable_mem_efficient_sdp", "math": "enable_math_sdp"}
    if not all(hasattr(b, s) for s in switches.values()):
        return False
    for name, s in switches.items():  # 'all': every switch back on (torch's default)
        getattr(b, s)(backend in (name, "all"))
    return True


def pin_sdpa(backend, sdpa):
    """Let F.scaled_dot_product_attention run only `backend` ('cudnn',
    'flash', 'efficient', 'math'; 'default' leaves torch's choice), for
    every variant alike, through torch's global switches (which compiled
    graphs read too). sdpa(q, k, v): the benchmark's attention call, which
    the pinned backend must take (causal, GQA, head_dim 64 and 128, both
    directions; else torch's default comes back). -> a line saying what
    runs."""
    if backend == "default":
        return "torch's default choice"
    if not _switch_sdpa(backend):
        return "torch's default choice (torch %s cannot pin a backend)" % torch.__version__
    try:
        for hd in (64, 128):
            q, k, v = (torch.randn(1, h, 256, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for h in (4, 2, 2))
            sdpa(q, k, v).sum().backward()
    except RuntimeError as e:
        _switch_sdpa("all")
        return "torch's default choice (%s refused a test call: %s)" % (backend, str(e).splitlines()[0][:100])
    return "%s only (the others switched off)" % backend


def round_orders(items, rounds, tries=256):
    """The variants' order in each of `rounds` rounds, as one list per
    round. The rounds run back to back, so every call but the first has a
    neighbour before it, the previous round's last included; each round
    takes, of `tries` shuffles seeded by the round, the one whose pairs
    (a variant and the one just before it) have come up least so far (the
    largest count first, then the next). So each variant's predecessors
    spread over the others about evenly, and the orders are the same in
    every run (random.Random(seed).shuffle: unchanged since Python 3.2).

    Why: the card's clocks and temperature may carry over from one call to
    the next. bench_block rotated its order by one a round up to and
    including stop 60's runs, which kept a variant behind the same
    neighbour in every round it did not start: at 8 variants and 5 rounds
    coda+c ran right after coda+attn in all five, and read 1-6 points
    behind coda forward+backward in stops 59 and 60, more than its kernels
    explain (bench/HISTORY.md "stop 60"); bench_model ran one fixed order."""
    items = list(items)
    n = len(items)
    seen = {}  # (before, after) -> times run in that order so far
    orders, last = [], None
    for r in range(rounds):
        rng = random.Random(r)
        best = None
        for _ in range(tries):
            perm = list(range(n))
            rng.shuffle(perm)
            pairs = [(p, q) for p, q in zip([last] + perm[:-1], perm) if p is not None]
            cost = sorted((seen.get(pq, 0) for pq in pairs), reverse=True)
            if best is None or cost < best[0]:
                best = (cost, perm, pairs)
        _, perm, pairs = best
        for pq in pairs:
            seen[pq] = seen.get(pq, 0) + 1
        last = perm[-1]
        orders.append([items[i] for i in perm])
    return orders


def spread(xs):
    """(median, min, max) of a list."""
    s = sorted(xs)
    return s[len(s) // 2], s[0], s[-1]


def cuda_events(prof):
    """The CUDA activity (kernels, memsets) a torch.profiler run recorded,
    in the order it started on the device."""
    ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    ev.sort(key=lambda e: e.time_range.start)
    return ev


def _predecessors(orders):
    """{variant: [the variant run just before it, each time]} over the
    rounds run back to back."""
    chain = [v for o in orders for v in o]
    before = {}
    for p, q in zip(chain, chain[1:]):
        before.setdefault(q, []).append(p)
    return before


def _selftest():
    """round_orders on the CPU, at bench_model's and bench_block's 5-8
    variants and 5, 10 and 15 rounds: each round a permutation of the
    variants; no variant behind one neighbour more than ceil(R / (n - 1)) + 1
    times in R rounds (n - 1 neighbours shared evenly, and one more: a
    round's choice cannot undo the rounds before it, so an even share is
    not always reached); round 0 of 8 pinned (the same orders in every
    run). The rotation round_orders replaced, as a control, fails the
    spread. Exit status 0 when all hold."""
    bad = []
    for n in (5, 6, 7, 8):
        items = ["v%d" % i for i in range(n)]
        for rounds in (5, 10, 15):
            orders = round_orders(items, rounds)
            if len(orders) != rounds or any(sorted(o) != items for o in orders):
                bad.append("%d variants, %d rounds: a round is not a permutation" % (n, rounds))
            limit = -(-rounds // (n - 1)) + 1  # an even share, and one more
            for v, ps in _predecessors(orders).items():
                most = max(ps.count(p) for p in set(ps))
                if most > limit:
                    bad.append("%d variants, %d rounds: %s ran %d times after one neighbour (at most %d)"
                               % (n, rounds, v, most, limit))
    pinned = round_orders(range(8), 1)[0]
    if pinned != [4, 1, 5, 2, 0, 3, 7, 6]:
        bad.append("round 0 of 8 variants is %s, not the pinned order: the orders changed" % pinned)
    rotated = [["v%d" % ((k + i) % 8) for i in range(8)] for k in range(5)]  # the old order, as a control
    if max(ps.count(p) for ps in _predecessors(rotated).values() for p in ps) < 5:
        bad.append("the control: the rotation should keep a variant behind one neighbour in all 5 rounds")
    for b in bad:
        print("FAIL: " + b)
    print("bench/step_timer.py --selftest: %d failure(s)" % len(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    import sys
    if sys.argv[1:] != ["--selftest"]:
        sys.exit("usage: python3 bench/step_timer.py --selftest")
    sys.exit(_selftest())
