"""pycheck.py - what the Python tests share.

Importing it puts the repository's python/ (the coda binding) on sys.path.
check(ok, what) counts a check and records and prints a failure;
raises(what, fn, exc, name) checks that fn() raises exc (with that .name,
a coda.Error's status name, when given); report(name) prints the summary
line and returns the exit status. Each test
imports torch and coda itself, and fails (never skips) when it cannot.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

checks = 0
failures = []


def check(ok, what):
    global checks
    checks += 1
    if not ok:
        failures.append(what)
        print("FAIL: " + what)


def raises(what, fn, exc, name=None):
    """Check that fn() raises exc (and, for name, that the error's .name is
    it); True if it did."""
    try:
        fn()
    except exc as e:
        if name is not None:
            check(getattr(e, "name", None) == name, "%s: %s, expected %s" % (what, e, name))
        return True
    except Exception as e:
        check(False, "%s: expected %s, got %s: %s" % (what, getattr(exc, "__name__", exc), type(e).__name__, e))
        return False
    check(False, "%s: no error" % what)
    return False


def report(name, lead=""):
    """The summary line ("NAME: N checks, F failures", after lead); 1 if any failed."""
    print("%s%s: %d checks, %d failures" % (lead, name, checks, len(failures)))
    return 1 if failures else 0
