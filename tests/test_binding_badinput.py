#!/usr/bin/python3
"""test_binding_badinput.py - the Python binding refuses what it cannot honour (issue #18).

ctypes converts quietly, so each case here used to run with some other
value than the one given. Every case must now raise, before any C call:

  1. kinds      a tensor bound to a scalar program argument (C read the
                unset float, 0.0), a number bound to a tensor argument:
                TypeError naming the argument.
  2. strings    a NUL inside program text, a binding name, a built-in
                program name or cache_dir (C read only the text before it):
                ValueError; program text that is not a str: TypeError.
  3. numbers    ints for C int / int32_t / int64_t (tiling, m/n/k, d,
                ignore_index, cpu_threads, batch/seq, layout and op values,
                LlamaConfig fields): bool or non-int -> TypeError, out of the
                C type's range (ctypes kept the low bits) -> ValueError.
                Floats for C float: non-numbers and bool -> TypeError, finite
                but beyond float32 -> ValueError; inf/nan reach C, which
                refuses them (coda.Error CODA_ERR_INVALID_ARG).
  4. devices    anything but cpu / cuda (e.g. "gpu", "tpu", "cuda:x",
                "meta"; was run as the CPU): ValueError; cuda:N, N != 0, where
                the C call only knows device 0: ValueError.
  5. weights    the layer takes only coda.PackedWeights (from
                coda.pack_weights), packed for its configuration, bf16, on its
                device: a plain dict of PyTorch-layout weights has the same
                shapes and gave wrong results.

Each case also runs its good twin, which must still work. CPU only.
Never skips: a missing torch or library is a failure (exit 1).
"""
import math
import pickle
import sys

from pycheck import check, report  # also puts the binding on sys.path

try:
    import torch
    import coda
    import coda.nn
except Exception as e:  # not a skip
    print("FAIL: cannot import torch and the coda binding: %s: %s" % (type(e).__name__, e))
    sys.exit(1)

torch.manual_seed(0)


def raises(exc, fn, what, match=None):
    """Check that fn() raises exc (a class or tuple) whose message contains
    match. Anything else (no error, or another error) is a failure, never a
    crash of this script."""
    try:
        fn()
    except exc as e:
        check(match is None or match in str(e), "%s: %s raised, but its message %r does not name %r"
              % (what, type(e).__name__, str(e), match))
        return
    except Exception as e:
        check(False, "%s: expected %s, got %s: %s" % (what, _names(exc), type(e).__name__, e))
        return
    check(False, "%s: expected %s, nothing raised" % (what, _names(exc)))


def works(fn, what):
    """Check that fn() runs without an error; returns its result or None."""
    try:
        return fn()
    except Exception as e:
        check(False, "%s: should work, raised %s: %s" % (what, type(e).__name__, e))
        return None


def _names(exc):
    return " or ".join(c.__name__ for c in (exc if isinstance(exc, tuple) else (exc,)))


# a program with one scalar and one tile argument: h = acc * s
SCALE = """program scale
in  s  scalar
out h  tile f32
a = acc
v = load s
r = mul a v
store h r
"""

M, N, K = 5, 8, 16


def kinds(ctx):
    a, b = torch.randn(M, K).bfloat16(), torch.randn(N, K).bfloat16()
    ref = a.double() @ b.double().t()
    p = coda.Program(SCALE)
    h = torch.full((M, N), float("nan"))

    # good twin: a number for the scalar, a tensor for the tile
    works(lambda: coda.gemm_epilogue(ctx, "nt", a, b, p, {"s": 2.0, "h": h}), "kinds: good bindings")
    check(torch.allclose(h.double(), 2 * ref, rtol=1e-5, atol=1e-5), "kinds: h = 2 acc")
    works(lambda: coda.gemm_epilogue(ctx, "nt", a, b, p, {"s": 3, "h": h}), "kinds: an int scalar")
    check(torch.allclose(h.double(), 3 * ref, rtol=1e-5, atol=1e-5), "kinds: h = 3 acc")

    # a tensor for the scalar argument: was read as 0.0 (h = 0, no error)
    h.fill_(float("nan"))
    raises(TypeError, lambda: coda.gemm_epilogue(ctx, "nt", a, b, p, {"s": torch.tensor(2.0), "h": h}),
           "kinds: tensor bound to scalar 's'", "'s'")
    check(bool(torch.isnan(h).all()), "kinds: the refused call wrote h")
    raises(TypeError, lambda: coda.gemm_epilogue(ctx, "nt", a, b, p, {"s": torch.ones(M, N), "h": h}),
           "kinds: (M, N) tensor bound to scalar 's'", "'s'")
    # a number for the tensor argument
    raises(TypeError, lambda: coda.gemm_epilogue(ctx, "nt", a, b, p, {"s": 2.0, "h": 3.0}),
           "kinds: number bound to tile 'h'", "'h'")
    raises(TypeError, lambda: coda.gemm_epilogue(ctx, "nt", a, b, p, {"s": 2.0, "h": None}),
           "kinds: None bound to tile 'h'", "'h'")
    # not numbers for the scalar
    raises(TypeError, lambda: coda.gemm_epilogue(ctx, "nt", a, b, p, {"s": True, "h": h}),
           "kinds: bool bound to scalar 's'", "'s'")
    raises(TypeError, lambda: coda.gemm_epilogue(ctx, "nt", a, b, p, {"s": "2", "h": h}),
           "kinds: str bound to scalar 's'", "'s'")
    # the same rules for a built-in program's scalar-free bindings
    rp = coda.Program.builtin("resid_add")
    res = torch.randn(M, N).bfloat16()
    hb = torch.empty(M, N, dtype=torch.bfloat16)
    raises(TypeError, lambda: coda.gemm_epilogue(ctx, "nt", a, b, rp, {"res": 1.0, "h": hb}),
           "kinds: number bound to resid_add's tile 'res'", "'res'")
    works(lambda: coda.gemm_epilogue(ctx, "nt", a, b, rp, {"res": res, "h": hb}), "kinds: resid_add")
    # a name the program does not have: still C's error, naming it
    raises(coda.Error, lambda: coda.gemm_epilogue(ctx, "nt", a, b, p, {"s": 2.0, "h": h, "zz": 1.0}),
           "kinds: unknown argument 'zz'", "zz")
    # bindings and program of the wrong type
    raises(TypeError, lambda: coda.gemm_epilogue(ctx, "nt", a, b, p, [("s", 2.0), ("h", h)]),
           "kinds: bindings as a list", "bindings")
    raises(TypeError, lambda: coda.gemm_epilogue(ctx, "nt", a, b, 42, {"s": 2.0, "h": h}),
           "kinds: program 42", "program")
    # finite values beyond float32, and non-finite ones (C refuses those)
    raises(ValueError, lambda: coda.gemm_epilogue(ctx, "nt", a, b, p, {"s": 1e39, "h": h}),
           "kinds: scalar 1e39 (beyond float32)", "'s'")
    raises(coda.Error, lambda: coda.gemm_epilogue(ctx, "nt", a, b, p, {"s": float("nan"), "h": h}),
           "kinds: scalar nan (C refuses)", "not finite")


def strings(ctx):
    good = coda.Program(SCALE)
    # a NUL cut the text: the valid prefix was parsed and the rest dropped
    raises(ValueError, lambda: coda.Program(SCALE + "\0this is not a program\n"),
           "strings: NUL in program text", "NUL")
    raises(ValueError, lambda: coda.Program("\0"), "strings: program text of one NUL", "NUL")
    raises(TypeError, lambda: coda.Program(SCALE.encode()), "strings: program text as bytes", "str")
    raises(TypeError, lambda: coda.Program(None), "strings: program text None", "str")
    raises(TypeError, lambda: coda.Program(7), "strings: program text 7", "str")
    raises(ValueError, lambda: coda.builtin_program("resid_norm\0junk"),
           "strings: NUL in a built-in program name", "NUL")
    raises(TypeError, lambda: coda.builtin_program(b"resid_norm"), "strings: built-in name as bytes", "str")
    check(works(lambda: coda.builtin_program("resid_norm"), "strings: builtin_program") is not None,
          "strings: builtin_program('resid_norm')")
    a, b = torch.randn(M, K).bfloat16(), torch.randn(N, K).bfloat16()
    h = torch.empty(M, N)
    # "s\0junk" was bound as "s"
    raises(ValueError, lambda: coda.gemm_epilogue(ctx, "nt", a, b, good, {"s\0junk": 2.0, "h": h}),
           "strings: NUL in a binding name", "NUL")
    raises(TypeError, lambda: coda.gemm_epilogue(ctx, "nt", a, b, good, {b"s": 2.0, "h": h}),
           "strings: binding name as bytes", "binding name")
    raises(ValueError, lambda: coda.Context(cache_dir="/tmp/coda-cache\0junk"),
           "strings: NUL in cache_dir", "cache_dir")


def numeric(ctx):
    a, b = torch.randn(M, K).bfloat16(), torch.randn(N, K).bfloat16()
    p = coda.Program(SCALE)
    h = torch.empty(M, N)
    run = lambda tiling: coda.gemm_epilogue(ctx, "nt", a, b, p, {"s": 1.0, "h": h}, tiling)
    works(lambda: run((4, 4)), "numbers: tiling (4, 4)")
    works(lambda: run([0, 0]), "numbers: tiling [0, 0] (defaults)")
    # 2**40 kept its low 32 bits, 0: the default tiling, unasked
    raises(ValueError, lambda: run((2 ** 40, 2)), "numbers: tile_m 2**40", "tiling[0]")
    raises(ValueError, lambda: run((4, 2 ** 32 + 4)), "numbers: tile_n 2**32 + 4", "tiling[1]")
    raises(ValueError, lambda: run((-2 ** 31 - 1, 4)), "numbers: tile_m below INT_MIN", "tiling[0]")
    raises(TypeError, lambda: run((True, 4)), "numbers: tile_m True", "tiling[0]")
    raises(TypeError, lambda: run((4.0, 4)), "numbers: tile_m 4.0", "tiling[0]")
    raises(ValueError, lambda: run((4,)), "numbers: tiling of one value", "tiling")
    raises(TypeError, lambda: run(4), "numbers: tiling 4", "tiling")

    # choose_tiling: int64 m, n, k; an int layout is an enum value
    t = works(lambda: coda.choose_tiling(ctx, "cpu", "nt", M, N, K), "numbers: choose_tiling")
    raises(ValueError, lambda: coda.choose_tiling(ctx, "cpu", "nt", 2 ** 64 + M, N, K),
           "numbers: m 2**64 + M", "m")
    raises(ValueError, lambda: coda.choose_tiling(ctx, "cpu", "nt", M, 2 ** 63, K), "numbers: n 2**63", "n")
    raises(TypeError, lambda: coda.choose_tiling(ctx, "cpu", "nt", M, N, True), "numbers: k True", "k")
    raises(TypeError, lambda: coda.choose_tiling(ctx, "cpu", "nt", M, N, 16.0), "numbers: k 16.0", "k")
    check(works(lambda: coda.choose_tiling(ctx, "cpu", 0, M, N, K), "numbers: layout 0") == t,
          "numbers: layout 0 is nt")
    raises(ValueError, lambda: coda.choose_tiling(ctx, "cpu", 2 ** 32, M, N, K),
           "numbers: layout 2**32 (was nt)", "layout")
    raises(TypeError, lambda: coda.choose_tiling(ctx, "cpu", 1.0, M, N, K), "numbers: layout 1.0", "layout")

    # plain GEMM's alpha and beta: C floats
    c = torch.empty(M, N)
    works(lambda: coda.gemm(ctx, "nt", a, b, c, alpha=2, beta=0.0), "numbers: gemm alpha 2 (int)")
    raises(TypeError, lambda: coda.gemm(ctx, "nt", a, b, c, alpha="2"), "numbers: alpha '2'", "alpha")
    raises(TypeError, lambda: coda.gemm(ctx, "nt", a, b, c, alpha=torch.tensor(2.0)),
           "numbers: alpha a tensor", "alpha")
    raises(TypeError, lambda: coda.gemm(ctx, "nt", a, b, c, beta=True), "numbers: beta True", "beta")
    raises(ValueError, lambda: coda.gemm(ctx, "nt", a, b, c, alpha=1e39), "numbers: alpha 1e39", "alpha")
    raises(ValueError, lambda: coda.gemm(ctx, "nt", a, b, c, alpha=10 ** 400), "numbers: alpha 10**400",
           "alpha")
    raises(coda.Error, lambda: coda.gemm(ctx, "nt", a, b, c, alpha=math.inf), "numbers: alpha inf (C)",
           "alpha")

    # finishing steps: int64 d, float eps, int32 ignore_index, enum op
    ss = torch.rand(M, 3)
    rstd = torch.empty(M)
    works(lambda: coda.finish_rstd(ctx, ss, N, 1e-5, rstd), "numbers: finish_rstd")
    raises(ValueError, lambda: coda.finish_rstd(ctx, ss, 2 ** 64 + N, 1e-5, rstd), "numbers: d 2**64 + N", "d")
    raises(TypeError, lambda: coda.finish_rstd(ctx, ss, float(N), 1e-5, rstd), "numbers: d float", "d")
    raises(TypeError, lambda: coda.finish_rstd(ctx, ss, N, "1e-5", rstd), "numbers: eps '1e-5'", "eps")
    raises(ValueError, lambda: coda.finish_rstd(ctx, ss, N, 1e39, rstd), "numbers: eps 1e39", "eps")
    raises(coda.Error, lambda: coda.finish_rstd(ctx, ss, N, math.nan, rstd), "numbers: eps nan (C)", "eps")
    out = torch.empty(M)
    works(lambda: coda.finish_reduce(ctx, "sum", ss, out), "numbers: finish_reduce sum")
    works(lambda: coda.finish_reduce(ctx, 1, ss, out), "numbers: finish_reduce op 1 (max)")
    raises(ValueError, lambda: coda.finish_reduce(ctx, 2 ** 32, ss, out), "numbers: op 2**32 (was sum)", "op")
    raises(ValueError, lambda: coda.finish_reduce(ctx, "avg", ss, out), "numbers: op 'avg'", "op")
    part = torch.zeros(M, 2, 3)
    part[:, :, 1] = 1.0  # l = 1 in each tile
    tgt = torch.full((M,), -100, dtype=torch.int32)
    lse, loss = torch.empty(M), torch.empty(M)
    works(lambda: coda.finish_lse(ctx, part, tgt, lse, loss, -100), "numbers: finish_lse")
    check(bool((loss == 0).all()), "numbers: ignored targets give loss 0")
    # 2**32 - 100 wrapped to -100 and ignored every target
    raises(ValueError, lambda: coda.finish_lse(ctx, part, tgt, lse, loss, 2 ** 32 - 100),
           "numbers: ignore_index 2**32 - 100", "ignore_index")
    raises(TypeError, lambda: coda.finish_lse(ctx, part, tgt, lse, loss, -100.0),
           "numbers: ignore_index -100.0", "ignore_index")

    # context, config, layer
    raises(ValueError, lambda: coda.Context(cpu_threads=2 ** 32 + 1), "numbers: cpu_threads 2**32 + 1",
           "cpu_threads")
    raises(TypeError, lambda: coda.Context(cpu_threads=True), "numbers: cpu_threads True", "cpu_threads")
    raises(TypeError, lambda: coda.Context(cpu_threads=1.5), "numbers: cpu_threads 1.5", "cpu_threads")
    works(lambda: coda.Context(cpu_threads=1), "numbers: cpu_threads 1")
    C = coda.LlamaConfig
    raises(ValueError, lambda: C(2 ** 64 + 16, 2, 1, 8, 24), "numbers: LlamaConfig d 2**64 + 16", "d")
    raises(TypeError, lambda: C(16, 2.0, 1, 8, 24), "numbers: LlamaConfig n_heads 2.0", "n_heads")
    raises(TypeError, lambda: C(16, 2, 1, 8, 24, vocab=True), "numbers: LlamaConfig vocab True", "vocab")
    raises(TypeError, lambda: C(16, 2, 1, 8, 24, eps="1e-5"), "numbers: LlamaConfig eps '1e-5'", "eps")
    raises(ValueError, lambda: C(16, 2, 1, 8, 24, rope_theta=1e40), "numbers: LlamaConfig rope_theta 1e40",
           "rope_theta")
    cfg = C(16, 2, 1, 8, 24)

    def set_ffn(v):
        cfg.ffn = v
    raises(ValueError, lambda: set_ffn(2 ** 64 + 24), "numbers: cfg.ffn = 2**64 + 24", "ffn")
    check(cfg.ffn == 24, "numbers: a refused assignment changed cfg.ffn to %d" % cfg.ffn)
    raises(ValueError, lambda: coda.Llama(ctx, cfg, 2 ** 64 + 1, 4), "numbers: batch 2**64 + 1", "batch")
    raises(TypeError, lambda: coda.Llama(ctx, cfg, 1, True), "numbers: seq True", "seq")
    raises(TypeError, lambda: coda.Llama(ctx, cfg, 1.0, 4), "numbers: batch 1.0", "batch")


def devices(ctx):
    t = coda.choose_tiling(ctx, "cpu", "nt", M, N, K)
    check(coda.choose_tiling(ctx, torch.device("cpu"), "nt", M, N, K) == t, "devices: torch.device('cpu')")
    works(lambda: coda.choose_tiling(ctx, "cuda", "nt", M, N, K), "devices: choose_tiling 'cuda'")
    works(lambda: coda.choose_tiling(ctx, "cuda:0", "nt", M, N, K), "devices: choose_tiling 'cuda:0'")
    # each of these was answered with the CPU's tiling
    for bad in ("tpu", "gpu", "cuda:x", "meta", "", "CUDA"):
        raises(ValueError, lambda: coda.choose_tiling(ctx, bad, "nt", M, N, K),
               "devices: choose_tiling %r" % bad, repr(bad))
    raises(ValueError, lambda: coda.choose_tiling(ctx, torch.device("meta"), "nt", M, N, K),
           "devices: choose_tiling torch.device('meta')", "meta")
    raises(ValueError, lambda: coda.choose_tiling(ctx, "cuda:1", "nt", M, N, K),
           "devices: choose_tiling 'cuda:1' (C answers for device 0)", "cuda:1")
    raises(TypeError, lambda: coda.choose_tiling(ctx, 0, "nt", M, N, K), "devices: choose_tiling 0", "device")
    cfg = coda.LlamaConfig(16, 2, 1, 8, 24)
    for bad in ("gpu", "tpu", "cuda:x", "meta", "cuda:1"):
        raises(ValueError, lambda: coda.Llama(ctx, cfg, 1, 4, device=bad), "devices: Llama %r" % bad, bad)
    W = torch_weights(cfg)
    raises(ValueError, lambda: pack(cfg, W, device="tpu"), "devices: pack_weights 'tpu'", "tpu")
    raises(ValueError, lambda: coda.nn.LlamaLayer.from_torch(ctx, cfg, 1, 4, W, device="gpu"),
           "devices: LlamaLayer 'gpu'", "gpu")
    lay = works(lambda: coda.Llama(ctx, cfg, 1, 4, device=torch.device("cpu")), "devices: Llama torch.device")
    check(lay is None or lay.device == torch.device("cpu"), "devices: Llama.device")


def torch_weights(cfg):
    d, nq, nkv = cfg.d, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    bf = lambda *s: (torch.randn(*s) / math.sqrt(s[-1])).bfloat16()
    W = {"wq": bf(nq, d), "wk": bf(nkv, d), "wv": bf(nkv, d), "wo": bf(d, nq), "w_gate": bf(cfg.ffn, d),
         "w_up": bf(cfg.ffn, d), "w_down": bf(d, cfg.ffn), "g1": (1 + 0.1 * torch.randn(d)).bfloat16(),
         "g2": (1 + 0.1 * torch.randn(d)).bfloat16()}
    if cfg.vocab > 0:
        W["gf"], W["wlm"] = (1 + 0.1 * torch.randn(d)).bfloat16(), bf(cfg.vocab, d)
    return W


def pack(cfg, W, device=None):
    return coda.pack_weights(cfg, W["wq"], W["wk"], W["wv"], W["wo"], W["w_gate"], W["w_up"], W["w_down"],
                             W["g1"], W["g2"], W.get("gf"), W.get("wlm"), device=device)


def weights(ctx):
    B, S = 1, 4
    cfg = coda.LlamaConfig(16, 2, 1, 8, 24)
    # same weight shapes, another head split: the RoPE pairs land elsewhere
    cfg_b = coda.LlamaConfig(16, 4, 2, 4, 24)
    W = torch_weights(cfg)
    x = torch.randn(B * S, cfg.d).bfloat16()
    dy = (0.1 * torch.randn(B * S, cfg.d)).bfloat16()
    w = pack(cfg, W)
    # getattr: before the fix there was no such class, and the checks below must still run
    check(isinstance(w, getattr(coda, "PackedWeights", ())), "weights: pack_weights returns %s, not PackedWeights"
          % type(w).__name__)
    check(isinstance(w, dict) and sorted(w) == ["g1", "g2", "wd", "wgu", "wo", "wqkv"],
          "weights: PackedWeights is a dict of the coda-layout names")
    layer = coda.Llama(ctx, cfg, B, S)
    y = works(lambda: layer.forward(w, x)[0], "weights: forward with packed weights")
    dx = works(lambda: layer.backward(w, dy)[0], "weights: backward with packed weights")
    check(y is not None and dx is not None and bool(torch.isfinite(y.float()).all()),
          "weights: the packed layer runs")

    # PyTorch's weights concatenated: coda's shapes, not its row order
    naive = {"g1": W["g1"], "wqkv": torch.cat([W["wq"], W["wk"], W["wv"]]), "wo": W["wo"], "g2": W["g2"],
             "wgu": torch.cat([W["w_gate"], W["w_up"]]), "wd": W["w_down"]}
    check(all(naive[k].shape == w[k].shape for k in w), "weights: the naive dict has coda's shapes")
    raises(TypeError, lambda: layer.forward(naive, x), "weights: forward with PyTorch-layout dict",
           "pack_weights")
    works(lambda: layer.forward(w, x), "weights: forward again")
    raises(TypeError, lambda: layer.backward(naive, dy), "weights: backward with PyTorch-layout dict",
           "pack_weights")
    raises(TypeError, lambda: layer.forward(dict(w), x), "weights: forward with a plain dict copy",
           "pack_weights")
    raises(TypeError, lambda: coda.nn.LlamaLayer(ctx, cfg, B, S, naive), "weights: LlamaLayer with a dict",
           "pack_weights")

    # packed, but for another configuration of the same shapes
    w_b = pack(cfg_b, W)
    check(all(w_b[k].shape == w[k].shape for k in w), "weights: cfg_b packs to the same shapes")
    raises(ValueError, lambda: layer.forward(w_b, x), "weights: packed for another config", "packed for")
    raises(ValueError, lambda: coda.nn.LlamaLayer(ctx, cfg, B, S, w_b),
           "weights: LlamaLayer with weights packed for another config", "packed for")
    # wrong dtype, shape, keys, device inside PackedWeights
    raises(TypeError, lambda: layer.forward(coda.PackedWeights({k: v.float() for k, v in w.items()}, cfg), x),
           "weights: f32 packed weights", "bfloat16")
    bad = dict(w, wo=torch.zeros(cfg.d + 1, cfg.d, dtype=torch.bfloat16))
    raises(ValueError, lambda: layer.forward(coda.PackedWeights(bad, cfg), x), "weights: wo of the wrong shape",
           "'wo'")
    missing = {k: v for k, v in w.items() if k != "wd"}
    raises(ValueError, lambda: layer.forward(coda.PackedWeights(missing, cfg), x), "weights: wd missing", "wd")
    on_meta = {k: v.to("meta") for k, v in w.items()}
    raises(ValueError, lambda: layer.forward(coda.PackedWeights(on_meta, cfg), x),
           "weights: weights on another device", "meta")
    raises(TypeError, lambda: coda.PackedWeights(w, "cfg"), "weights: PackedWeights without a config",
           "LlamaConfig")
    raises(ValueError, lambda: pack(cfg, dict(W, w_down=W["w_down"][:, :-2])),
           "weights: pack_weights with a w_down of the wrong shape", "w_down")

    # the config travels with the weights: a later change to cfg does not move it
    cfg2 = coda.LlamaConfig(16, 2, 1, 8, 24)
    w2 = pack(cfg2, W)
    cfg2.n_heads, cfg2.n_kv_heads, cfg2.head_dim = 4, 2, 4
    raises(ValueError, lambda: coda.Llama(ctx, cfg2, B, S).forward(w2, x),
           "weights: cfg changed after packing", "packed for")
    # a saved PackedWeights stays one (pickle, which torch.save uses)
    w_load = works(lambda: pickle.loads(pickle.dumps(w)), "weights: pickle round trip")
    check(isinstance(w_load, getattr(coda, "PackedWeights", ())), "weights: a loaded PackedWeights is %s" % type(w_load).__name__)
    y2 = works(lambda: layer.forward(w_load, x)[0], "weights: forward with loaded weights")
    check(y is not None and y2 is not None and torch.equal(y, y2), "weights: loaded weights give the same y")

    # loss_scale and targets
    raises(TypeError, lambda: layer.backward(w, dy, loss_scale="0.5"), "weights: loss_scale '0.5'",
           "loss_scale")
    cfg_lm = coda.LlamaConfig(16, 2, 1, 8, 24, vocab=10)
    W_lm = torch_weights(cfg_lm)
    lm = coda.Llama(ctx, cfg_lm, B, S)
    w_lm = pack(cfg_lm, W_lm)
    t = torch.tensor([1, 2, 3, -100])
    works(lambda: lm.forward(w_lm, x, t), "weights: int64 targets")
    raises(TypeError, lambda: lm.forward(w_lm, x, t.float() + 0.5), "weights: float targets", "targets")
    # 2**32 + 3 became class 3
    raises(ValueError, lambda: lm.forward(w_lm, x, torch.tensor([1, 2, 2 ** 32 + 3, -100])),
           "weights: target 2**32 + 3", "targets")

    # coda.nn: from_torch still works; loss_scale must be a number
    mod = works(lambda: coda.nn.LlamaLayer.from_torch(ctx, cfg_lm, B, S, W_lm), "weights: LlamaLayer.from_torch")
    if mod is not None:
        works(lambda: mod(x, t, loss_scale=0.25), "weights: LlamaLayer forward")
        raises(TypeError, lambda: mod(x, t, loss_scale="0.25"), "weights: LlamaLayer loss_scale '0.25'",
               "loss_scale")
    works(lambda: coda.nn.LlamaLayer(ctx, cfg_lm, B, S, w_lm), "weights: LlamaLayer(PackedWeights)")


def main():
    ctx = coda.Context(cpu_threads=2)
    for part in (kinds, strings, numeric, devices, weights):
        try:
            part(ctx)
        except Exception as e:  # a bug in a part stops that part only, as a failure
            check(False, "%s: stopped by %s: %s" % (part.__name__, type(e).__name__, e))
    return report("test_binding_badinput.py")


if __name__ == "__main__":
    sys.exit(main())
