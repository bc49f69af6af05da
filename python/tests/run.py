"""Run the binding's tests (unittest) and print a closing '<label>: N passed, N failed' line.

Options: ``-v`` (verbose), ``--pattern GLOB`` (test files, default ``test*.py``; repeatable),
``--label NAME`` (of the closing line, default ``python``), ``--no-skips`` (a skipped test
fails the run: for steps that must exercise every selected test). Exits non-zero on any
failure or error, or when no test passed.
"""
import argparse
import os
import sys
import unittest

here = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("-v", "--verbose", action="store_true")
ap.add_argument("--pattern", action="append")
ap.add_argument("--label", default="python")
ap.add_argument("--no-skips", action="store_true")
args = ap.parse_args()

verbosity = 2 if args.verbose else 1
suite = unittest.TestSuite(unittest.defaultTestLoader.discover(here, pattern=p, top_level_dir=here)
                           for p in args.pattern or ["test*.py"])
result = unittest.TextTestRunner(verbosity=verbosity).run(suite)
failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
skipped = len(result.skipped)


def _ids(items):
    """Ids of the tests behind result entries (a subtest counts as its test; a class-level
    skip or error, which testsRun does not count, as none)."""
    return {getattr(t, "test_case", t).id() for t, *_ in items if isinstance(t, unittest.TestCase)}


bad = _ids(result.failures) | _ids(result.errors) | _ids((t,) for t in result.unexpectedSuccesses)
passed = result.testsRun - len(bad) - len(_ids(result.skipped) - bad)
import kvevict  # noqa: E402

print(f"kvevict {kvevict.version()} from {os.path.dirname(kvevict.__file__)}, library {kvevict.library_path()}")
print(f"{args.label}: {passed} passed, {failed} failed, {skipped} skipped")
for test, reason in result.skipped if args.no_skips else ():
    print(f"{args.label}: skipped {test.id()}: {reason}")
ok = failed == 0 and passed > 0 and not (args.no_skips and skipped)
sys.exit(0 if ok else 1)
