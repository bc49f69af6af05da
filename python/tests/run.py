"""Run the binding's tests (unittest) and print a closing 'python: N passed, N failed' line."""
import os
import sys
import unittest

here = os.path.dirname(os.path.abspath(__file__))
verbosity = 2 if "-v" in sys.argv else 1
suite = unittest.defaultTestLoader.discover(here, top_level_dir=here)
result = unittest.TextTestRunner(verbosity=verbosity).run(suite)
failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
skipped = len(result.skipped)
passed = result.testsRun - failed - skipped
import kvevict  # noqa: E402

print(f"kvevict {kvevict.version()} from {os.path.dirname(kvevict.__file__)}, library {kvevict.library_path()}")
print(f"python: {passed} passed, {failed} failed, {skipped} skipped")
sys.exit(0 if failed == 0 and passed > 0 else 1)
