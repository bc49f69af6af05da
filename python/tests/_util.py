import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import reference as ref  # noqa: E402,F401


def layer(seed=0, hq=6, hkv=2, n=80, d=16, dv=None, D=40, wq=None):
    """Random layer tensors: q [Hq, wq, d], k [Hkv, n, d], v [Hkv, n, dv], wo [Hq, dv, D]."""
    rng = np.random.default_rng(seed)
    dv = dv or d
    wq = wq or n
    q = rng.standard_normal((hq, wq, d)).astype(np.float32)
    k = rng.standard_normal((hkv, n, d)).astype(np.float32)
    v = rng.standard_normal((hkv, n, dv)).astype(np.float32)
    wo = (rng.standard_normal((hq, dv, D)) / np.sqrt(D)).astype(np.float32)
    return q, k, v, wo


def assert_close(test, ours, theirs, rtol=2e-4, what=""):
    ours = np.asarray(ours, np.float64)
    theirs = np.asarray(theirs, np.float64)
    test.assertEqual(ours.shape, theirs.shape, what)
    scale = max(np.abs(theirs).max(), 1e-30)
    err = np.abs(ours - theirs).max() / scale
    test.assertLessEqual(err, rtol, f"{what}: max error {err:.2e} relative to max |score|")
