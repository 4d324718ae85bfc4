#!/usr/bin/python3
"""check_exports.py LIB HEADER - libcoda.so exports exactly the functions
coda.h declares.

The library is compiled with -fvisibility=hidden and coda.h marks each public
function CODA_API, so its internal coda__* functions, the embedded kernel
sources and anything else are not exported. This fails (exit 1) when the two
lists differ: a function declared in the header but missing from the library
(a declaration without CODA_API, or never defined), or a symbol the library
exports that the header does not declare.

The header is read without a C parser: comments and preprocessor lines are
dropped, and what remains of a header holds no calls, so every `coda_NAME (`
is a function declaration. Needs only python3 and nm (binutils).
"""
import re
import subprocess
import sys

# Defined by the linker in every shared object; older binutils list them
# among the dynamic symbols.
LINKER_SYMBOLS = {"_init", "_fini", "_edata", "_end", "__bss_start"}


def declared(header):
    text = open(header).read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    lines = []
    continued = False
    for line in text.split("\n"):
        # a preprocessor line and its backslash continuations (#define bodies)
        if continued or line.lstrip().startswith("#"):
            continued = line.rstrip().endswith("\\")
            continue
        lines.append(line)
    return set(re.findall(r"\b(coda_\w+)\s*\(", "\n".join(lines)))


def exported(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], check=True,
                         stdout=subprocess.PIPE, universal_newlines=True).stdout
    syms = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 3:
            syms[f[2].split("@")[0]] = f[1]
    return syms


def main():
    if len(sys.argv) != 3:
        print("usage: check_exports.py LIB HEADER", file=sys.stderr)
        return 2
    lib, header = sys.argv[1], sys.argv[2]
    want = declared(header)
    have = {k: v for k, v in exported(lib).items() if k not in LINKER_SYMBOLS}
    missing = sorted(want - have.keys())
    extra = sorted(have.keys() - want)
    not_code = sorted(k for k in want & have.keys() if have[k] not in ("T", "t", "W", "i"))
    for name in missing:
        print("FAIL: %s declares %s, %s does not export it" % (header, name, lib))
    for name in extra:
        print("FAIL: %s exports %s (%s), which %s does not declare" % (lib, name, have[name], header))
    for name in not_code:
        print("FAIL: %s exports %s as %s, not as a function" % (lib, name, have[name]))
    bad = len(missing) + len(extra) + len(not_code)
    print("check_exports: %d functions in %s, %d symbols exported, %d failures"
          % (len(want), header, len(have), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
