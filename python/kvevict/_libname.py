"""The shared library's file name on this platform (read by ``_lib.py`` and by ``setup.py``,
which loads this file alone: it imports nothing from the package)."""
import sys

if sys.platform == "darwin":
    LIB_NAME = "libkvevict.dylib"
elif sys.platform.startswith("win"):
    LIB_NAME = "kvevict.dll"
else:
    LIB_NAME = "libkvevict.so"
