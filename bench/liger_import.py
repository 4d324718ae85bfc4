"""liger_import.py - Liger-Kernel for the benchmarks, from the first of:

  $LIGER_SRC       a Liger-Kernel checkout's src/ folder
  .liger/src       the same, in the repository (git-ignored; e.g.
                   git clone https://github.com/linkedin/Liger-Kernel .liger)
  the installed    pip install liger-kernel
  package

    kernels, why = import_liger(load)

load() imports what a script needs and returns it; import_liger gives
(load(), None), or (None, why not) when Liger is missing or does not import
(the scripts then skip its rows and say why).
"""
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def liger_source():
    """(a folder to put first on sys.path, or None for the installed package;
    the words naming where Liger comes from)."""
    src = os.environ.get("LIGER_SRC")
    if src:
        return src, src
    local = os.path.join(REPO, ".liger", "src")
    if os.path.isdir(local):
        return local, local
    return None, "the installed liger-kernel"


def import_liger(load):
    src, where = liger_source()
    if src is not None:
        if not os.path.isdir(src):
            return None, "no Liger source at %s" % src
        if src not in sys.path:
            sys.path.insert(0, src)
    try:
        return load(), None
    except Exception as e:  # report, do not hide
        return None, "%s (from %s): %s" % (type(e).__name__, where, e)
