"""Build hook: bundle libkvevict into the package and record where the repository is.

At build time (``pip install ./python``) the shared library is copied into
``kvevict/_lib/`` from, first match wins: ``$KVEVICT_BUNDLE_LIB`` (a file), else
``<repo>/target/release/libkvevict.so`` if it exists. ``KVEVICT_NO_BUNDLE=1`` skips the
copy (the installed package then finds the library through ``$KVEVICT_LIB`` or the
repository's ``target/release``, whose path is recorded in ``kvevict/_build_info.py``).
A package with a bundled library is built as a platform wheel.
"""
import os
import runpy
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LIB_NAME = runpy.run_path(os.path.join(HERE, "kvevict", "_libname.py"))["LIB_NAME"]


def library_to_bundle():
    if os.environ.get("KVEVICT_NO_BUNDLE", "") not in ("", "0"):
        return None
    explicit = os.environ.get("KVEVICT_BUNDLE_LIB")
    if explicit:
        if not os.path.isfile(explicit):
            raise SystemExit(f"KVEVICT_BUNDLE_LIB={explicit!r}: no such file")
        return explicit
    p = os.path.join(REPO, "target", "release", LIB_NAME)
    return p if os.path.isfile(p) else None


class BuildPy(build_py):
    def run(self):
        super().run()
        pkg = os.path.join(self.build_lib, "kvevict")
        with open(os.path.join(pkg, "_build_info.py"), "w") as f:
            f.write('"""Written by setup.py at build time."""\n')
            f.write(f"REPO_ROOT = {REPO!r}\n")
        lib_dir = os.path.join(pkg, "_lib")
        shutil.rmtree(lib_dir, ignore_errors=True)
        src = library_to_bundle()
        if src:
            os.makedirs(lib_dir)
            shutil.copy2(src, os.path.join(lib_dir, LIB_NAME))
            print(f"kvevict: bundled {src}")
        else:
            print("kvevict: no library bundled (found at run time via KVEVICT_LIB or the repo)")


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return library_to_bundle() is not None


setup(cmdclass={"build_py": BuildPy}, distclass=BinaryDistribution)
