"""Statuses raised as KvevictError with the library's status name and message."""
import unittest

import numpy as np

from _util import layer

import kvevict as kve

W = 8


class ErrorTests(unittest.TestCase):
    def setUp(self):
        self.q, self.k, self.v, self.wo = layer(seed=7)

    def assertStatus(self, name, fn, *args, **kw):
        with self.assertRaises(kve.KvevictError) as cm:
            fn(*args, **kw)
        e = cm.exception
        self.assertEqual(e.name, name, str(e))
        self.assertEqual(e.status, kve.STATUS_CODES[name])
        self.assertEqual(e.message, kve.status_message(e.status))
        self.assertIn(name, str(e))
        return e

    def test_bad_window(self):
        p = kve.ScoreParams.preset("snapkv", window=0)
        e = self.assertStatus("KVE_ERR_INVALID_ARGUMENT", kve.score_layer, p, self.q, self.k)
        self.assertTrue(e.function.startswith("kve_score"), e.function)
        self.assertIn("out of its valid range", str(e))
        self.assertStatus("KVE_ERR_INVALID_ARGUMENT", kve.score_layer,
                          kve.ScoreParams.preset("tova", window=2), self.q, self.k)

    def test_too_few_queries(self):
        p = kve.ScoreParams.preset("snapkv", window=W)
        self.assertStatus("KVE_ERR_INVALID_ARGUMENT", kve.score_layer, p, self.q[:, -4:], self.k)

    def test_non_finite(self):
        k = self.k.copy()
        k[1, 3, 2] = np.nan
        p = kve.ScoreParams.preset("snapkv", window=W)
        self.assertStatus("KVE_ERR_NON_FINITE", kve.score_layer, p, self.q, k)
        v = self.v.copy()
        v[0, 0, 0] = np.inf
        self.assertStatus("KVE_ERR_NON_FINITE", kve.score_layer,
                          kve.ScoreParams.preset("lava", window=W), self.q, self.k, v)
        wo = self.wo.copy()
        wo[0, 0, 0] = np.nan
        self.assertStatus("KVE_ERR_NON_FINITE", kve.compute_gram, wo, 2)

    def test_shape_mismatch(self):
        p = kve.ScoreParams.preset("lava", window=W)
        self.assertStatus("KVE_ERR_SHAPE_MISMATCH", kve.score_layer, p, self.q, self.k, self.v[:, :-1])
        self.assertStatus("KVE_ERR_SHAPE_MISMATCH", kve.score_layer,
                          kve.ScoreParams("snapkv", window=W), self.q[..., :8], self.k)
        # Hq not a multiple of Hkv
        self.assertStatus("KVE_ERR_SHAPE_MISMATCH", kve.compute_gram, self.wo[:5], 2)
        # scores of the wrong prefix length (checked by the binding, same status)
        s = np.zeros((2, 2, 10), np.float32)
        self.assertStatus("KVE_ERR_SHAPE_MISMATCH", kve.select_model,
                          kve.SelectParams("uniform", "head", 3), s, 20, W)

    def test_missing_inputs(self):
        p = kve.ScoreParams.preset("laprox", window=W)
        self.assertStatus("KVE_ERR_NULL_POINTER", kve.score_layer, p, self.q, self.k, self.v)
        self.assertStatus("KVE_ERR_NULL_POINTER", kve.score_layer, p, self.q, None)
        self.assertStatus("KVE_ERR_NULL_POINTER", kve.score_layer,
                          kve.ScoreParams.preset("snapkv", window=W), None, self.k)

    def test_bad_enum(self):
        p = kve.ScoreParams.preset("snapkv", window=W)
        p.scorer = 99
        self.assertEqual(p.scorer, 99)
        self.assertStatus("KVE_ERR_BAD_ENUM", kve.score_layer, p, self.q, self.k)
        self.assertStatus("KVE_ERR_BAD_ENUM", kve.SelectParams, 17)
        with self.assertRaises(ValueError):
            kve.ScoreParams.preset("nope")
        with self.assertRaises(ValueError):
            kve.SelectParams("uniform", "cells")
        with self.assertRaises(AttributeError):
            kve.ScoreParams().windw = 3

    def test_bad_pool(self):
        p = kve.ScoreParams.preset("snapkv", window=W, pool_kind="avg", pool_kernel=4)
        self.assertStatus("KVE_ERR_INVALID_ARGUMENT", kve.score_layer, p, self.q, self.k)
        sp = kve.SelectParams("uniform", "head", 3, alpha=2.0)
        self.assertStatus("KVE_ERR_INVALID_ARGUMENT", kve.select_model, sp,
                          np.zeros((1, 2, 12), np.float32), 20, W)

    def test_block_quantized_dtypes_are_refused_by_the_binding(self):
        # the C ABI takes ggml's q8_0/q4_0 K/V; the binding says so rather than guess a layout
        blocks = np.zeros((2, 40, 34), np.uint8)
        for name in ("q8_0", "q4_0", 3, 4):
            with self.assertRaises(TypeError) as cm:
                kve.Tensor(blocks, name)
            self.assertIn("C ABI", str(cm.exception))
            p = kve.ScoreParams.preset("knorm", window=W)
            with self.assertRaises(TypeError):
                kve.score_layer(p, self.q, blocks, dtype=name)

    def test_evicted_positions_not_ascending(self):
        self.assertStatus("KVE_ERR_INVALID_ARGUMENT", kve.evicted_positions, [3, 2], 10)

    def test_status_names(self):
        for name, code in kve.STATUS_CODES.items():
            self.assertEqual(kve.status_name(code), name)
            self.assertTrue(kve.status_message(code))
        self.assertEqual(kve.status_name(1000), "KVE_UNKNOWN_STATUS")

    def test_nothing_written_on_error(self):
        p = kve.ScoreParams.preset("snapkv", window=W)
        k = self.k.copy()
        k[0, 0, 0] = np.nan
        out = np.full((2, self.k.shape[1] - W), 7.0, np.float32)
        with self.assertRaises(kve.KvevictError):
            kve.score_layer(p, self.q, k, out=out)
        self.assertTrue(np.all(out == 7.0))


if __name__ == "__main__":
    unittest.main()
