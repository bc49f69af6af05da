"""score_layer's optional row_lse input and window_row_lse."""
import unittest

import numpy as np

import kvevict as kve
from _util import layer


def lse_f64(q, k, w):
    hq, wq, d = q.shape
    hkv, n, _ = k.shape
    g = hq // hkv
    out = np.empty((hq, w))
    for h in range(hq):
        z = q[h, wq - w:].astype(np.float64) @ k[h // g].astype(np.float64).T / np.sqrt(d)
        z[np.arange(w)[:, None] < np.arange(n)[None, :] - (n - w)] = -np.inf
        m = z.max(axis=1, keepdims=True)
        out[h] = (m + np.log(np.exp(z - m).sum(axis=1, keepdims=True)))[:, 0]
    return out


class RowLseTests(unittest.TestCase):
    def test_window_row_lse(self):
        q, k, _, _ = layer(seed=1, hq=6, hkv=2, n=90, d=16, wq=40)
        lse = kve.window_row_lse(q, k, 32)
        self.assertEqual(lse.shape, (6, 32))
        self.assertEqual(lse.dtype, np.float32)
        np.testing.assert_allclose(lse, lse_f64(q, k, 32), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(kve.window_row_lse(q, k, "snapkv"), lse)

    def test_scores_equal_with_lse(self):
        q, k, v, wo = layer(seed=2, hq=6, hkv=2, n=120, d=16, wq=64)
        for dtype in (np.float32, np.float16):
            qd, kd, vd = q.astype(dtype), k.astype(dtype), v.astype(dtype)
            for preset in ("snapkv", "lava", "laprox"):
                params = kve.ScoreParams.preset(preset)
                extra = {"values": vd}
                if preset == "laprox":
                    extra["gram"] = kve.compute_gram(wo, 2)
                lse = kve.window_row_lse(qd, kd, params)
                base = kve.score_layer(params, qd, kd, **extra)
                with_lse = kve.score_layer(params, qd, kd, row_lse=lse, **extra)
                err = np.abs(with_lse.astype(np.float64) - base) / np.maximum(np.abs(base), 1e-30)
                self.assertLessEqual(err.max(), 1e-6, f"{preset} {dtype.__name__}")

    def test_bad_lse_rejected(self):
        q, k, _, _ = layer(seed=3, hq=6, hkv=2, n=80, d=16, wq=40)
        lse = kve.window_row_lse(q, k, 32)
        out = np.full((2, 48), 7.0, np.float32)
        for bad, status in ((lse[:, :-1], "KVE_ERR_SHAPE_MISMATCH"),
                            (np.zeros(0, np.float32), "KVE_ERR_SHAPE_MISMATCH"),
                            (np.where(np.arange(lse.size).reshape(lse.shape) == 5, np.nan, lse),
                             "KVE_ERR_NON_FINITE")):
            with self.assertRaises(kve.KvevictError) as cm:
                kve.score_layer("snapkv", q, k, row_lse=bad, out=out)
            self.assertEqual(cm.exception.status, kve.STATUS_CODES[status])
            self.assertTrue((out == 7.0).all())


if __name__ == "__main__":
    unittest.main()
