#!/usr/bin/python3
"""test_binding_layout.py - the ctypes mirrors of C structures match C.

The binding (python/coda/_lib.py) restates coda.h's structures and enum
values by hand, and tests/oracle/reference.py the leading fields of the
reference layer. A mismatch would not fail loudly: a call would read the
wrong bytes. tests/print_layouts.c ($CODA_PRINT_LAYOUTS, which `make
test-py` sets; else build/tests/print_layouts) prints what the C compiler
made of each structure; this compares every ctypes class with it field by
field (name, offset, size, order, count), the structure's size and
alignment, and the binding's enum values with coda.h's.

Never skips: a missing torch, library or layout printer is a failure.
"""
import ctypes
import json
import os
import subprocess
import sys

from pycheck import check, report  # also puts the binding on sys.path

try:
    import coda
    from oracle import reference
except Exception as e:  # not a skip
    print("FAIL: cannot import the coda binding and the reference layer: %s: %s" % (type(e).__name__, e))
    sys.exit(1)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRINTER = os.environ.get("CODA_PRINT_LAYOUTS") or os.path.join(REPO, "build", "tests", "print_layouts")

# C name -> the ctypes class that mirrors it (for coda__ref_layer_t, its
# leading fields: the C side prints only those).
MIRRORS = {
    "coda_tensor_t": coda.Tensor,
    "coda_binding_t": coda.Binding,
    "coda_tiling_t": coda.Tiling,
    "coda_context_options_t": coda.ContextOptions,
    "coda_llama_config_t": coda.LlamaConfig,
    "coda_llama_weights_t": coda.LlamaWeights,
    "coda_lm_loss_opts_t": coda.LMLossOptions,
    "coda_attention_shape_t": coda.AttentionShape,
    "coda_block_acts_t": coda.BlockActs,
    "coda__ref_weights_t": reference.RefWeights,
    "coda__ref_layer_t": reference.RefLayer,
}
PREFIX_ONLY = {"coda__ref_layer_t"}

# C constant -> the binding's value for it
CONSTANTS = {
    "CODA_MAX_DIMS": coda.MAX_DIMS,
    "CODA_BF16": coda.BF16, "CODA_F32": coda.F32, "CODA_F16": coda.F16,
    "CODA_FP8_E4M3": coda.FP8_E4M3, "CODA_I32": coda.I32, "CODA_I64": coda.I64,
    "CODA_DEVICE_CPU": coda.DEVICE_CPU, "CODA_DEVICE_CUDA": coda.DEVICE_CUDA,
    "CODA_LAYOUT_NT": coda.LAYOUTS["nt"], "CODA_LAYOUT_NN": coda.LAYOUTS["nn"],
    "CODA_LAYOUT_TN": coda.LAYOUTS["tn"],
    "CODA_REDUCE_SUM": coda.REDUCE["sum"], "CODA_REDUCE_MAX": coda.REDUCE["max"],
    "CODA_REDUCE_SUMSQ": coda.REDUCE["sumsq"],
    "CODA_LM_MEAN": coda.LM_MEAN, "CODA_LM_SUM": coda.LM_SUM,
    "CODA__REF_F64": reference.F64, "CODA__REF_BF16": reference.BF16,
}
for name, value in coda.BLOCK_CALLS.items():
    CONSTANTS["CODA_BLOCK_" + name.upper()] = value
# coda.SPACES maps value -> name, coda.ARG_KINDS lists the kinds by value
for value, space in coda.SPACES.items():
    CONSTANTS["CODA_SPACE_" + space.upper()] = value
for value, kind in enumerate(coda.ARG_KINDS):
    CONSTANTS["CODA_" + kind.upper()] = value


def c_layouts():
    try:
        out = subprocess.run([PRINTER], check=True, stdout=subprocess.PIPE,
                             universal_newlines=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        print("FAIL: cannot run %s (run `make`, or set CODA_PRINT_LAYOUTS): %s" % (PRINTER, e))
        sys.exit(1)
    return json.loads(out)


def compare_struct(cname, c, cls):
    fields = cls._fields_
    if cname in PREFIX_ONLY:
        check(len(fields) == len(c["fields"]),
              "%s: %s declares %d fields, C's leading fields are %d"
              % (cname, cls.__name__, len(fields), len(c["fields"])))
    else:
        check(ctypes.sizeof(cls) == c["size"],
              "%s: sizeof %d in C, %d in ctypes (%s)" % (cname, c["size"], ctypes.sizeof(cls), cls.__name__))
        check(len(fields) == len(c["fields"]),
              "%s: %d fields in C, %d in ctypes (%s)" % (cname, len(c["fields"]), len(fields), cls.__name__))
    check(ctypes.alignment(cls) == c["align"],
          "%s: alignment %d in C, %d in ctypes" % (cname, c["align"], ctypes.alignment(cls)))
    for i, (name, off, size) in enumerate(c["fields"]):
        if i >= len(fields):
            check(False, "%s: C field %s (offset %d) has no ctypes field" % (cname, name, off))
            continue
        pname = fields[i][0]
        f = getattr(cls, pname)
        check(pname == name, "%s: field %d is %s in C, %s in ctypes" % (cname, i, name, pname))
        check(f.offset == off and f.size == size,
              "%s.%s: offset %d size %d in C, offset %d size %d in ctypes"
              % (cname, name, off, size, f.offset, f.size))


def main():
    lay = c_layouts()
    structs, consts = lay["structs"], lay["constants"]
    for cname, cls in MIRRORS.items():
        if cname not in structs:
            check(False, "%s: not printed by %s" % (cname, PRINTER))
            continue
        compare_struct(cname, structs[cname], cls)
    check(set(structs) == set(MIRRORS),
          "structures printed by C %s, mirrored here %s" % (sorted(structs), sorted(MIRRORS)))
    for name, value in sorted(consts.items()):
        check(name in CONSTANTS, "%s: C constant without a binding value" % name)
        if name in CONSTANTS:
            check(CONSTANTS[name] == value, "%s = %d in C, %r in the binding" % (name, value, CONSTANTS[name]))
    for name in sorted(set(CONSTANTS) - set(consts)):
        check(False, "%s: binding value the C side does not print" % name)
    print("%d structures, %d constants compared" % (len(MIRRORS), len(consts)))
    return report("test_binding_layout")


if __name__ == "__main__":
    sys.exit(main())
