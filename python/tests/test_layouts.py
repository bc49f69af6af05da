"""Strided views (llama.cpp / PyTorch layouts) and dtypes."""
import unittest

import numpy as np

from _util import assert_close, layer, ref

import kvevict as kve

W = 8


def token_major(x):
    """[H, N, d] → llama.cpp K rows [N, H*d], returned as the [H, N, d] view into them."""
    h, n, d = x.shape
    rows = np.ascontiguousarray(x.transpose(1, 0, 2)).reshape(n, h * d)
    view = rows.reshape(n, h, d).transpose(1, 0, 2)
    assert view.base is not None and not view.flags.c_contiguous
    return rows, view


def transposed_v(x):
    """[H, N, d] → llama.cpp's transposed V [H*d, N], returned as the [H, N, d] view."""
    h, n, d = x.shape
    vt = np.ascontiguousarray(x.transpose(0, 2, 1)).reshape(h * d, n)
    return vt, vt.reshape(h, d, n).transpose(0, 2, 1)


class LayoutTests(unittest.TestCase):
    def setUp(self):
        self.q, self.k, self.v, self.wo = layer(seed=5)
        self.hkv = self.k.shape[0]

    def test_llama_cpp_layout_same_scores(self):
        _, kv = token_major(self.k)
        _, vv = transposed_v(self.v)
        # queries token-major too: [w, Hq*d]
        _, qv = token_major(self.q)
        g = kve.compute_gram(self.wo, self.hkv)
        for name in ("snapkv", "lava", "laprox", "knorm"):
            p = kve.ScoreParams.preset(name, window=W)
            kw = {"gram": g} if name == "laprox" else {}
            vals = self.v if name in ("lava", "laprox") else None
            vals_t = vv if vals is not None else None
            a = kve.score_layer(p, self.q, self.k, vals, **kw)
            b = kve.score_layer(p, qv, kv, vals_t, **kw)
            np.testing.assert_array_equal(a, b, err_msg=name)

    def test_wo_layouts(self):
        """[Hq, dv, D], the design's [Hq*dv, D] with hq, and PyTorch's o_proj.weight.T (a view)."""
        hq, dv, D = self.wo.shape
        g3 = kve.compute_gram(self.wo, self.hkv)
        flat = self.wo.reshape(hq * dv, D)
        g2 = kve.compute_gram(flat, self.hkv, hq=hq)
        o_proj = np.ascontiguousarray(flat.T)  # PyTorch [D, Hq*dv]
        gt = kve.compute_gram(o_proj.T, self.hkv, hq=hq)
        np.testing.assert_array_equal(g3, g2)
        np.testing.assert_array_equal(g3, gt)
        l1a = kve.compute_value_l1(self.v, self.wo)
        l1b = kve.compute_value_l1(self.v, o_proj.T, hq=hq)
        np.testing.assert_array_equal(l1a, l1b)

    def test_broadcast_and_sliced_views(self):
        # every other token of a bigger buffer, and a broadcast (stride 0) value head
        q, k, v, _ = layer(seed=6, n=160)
        ks = k[:, ::2]
        p = kve.ScoreParams.preset("snapkv", window=W)
        a = kve.score_layer(p, q, ks)
        b = kve.score_layer(p, q, np.ascontiguousarray(ks))
        np.testing.assert_array_equal(a, b)
        vb = np.broadcast_to(v[:1, ::2], ks.shape)
        lava = kve.ScoreParams.preset("lava", window=W)
        assert_close(self, kve.score_layer(lava, q, ks, vb), ref.lava(q, ks, vb, W), what="broadcast")

    def test_negative_and_odd_strides_are_copied(self):
        p = kve.ScoreParams.preset("knorm", window=W)
        rev = self.k[:, ::-1]
        assert_close(self, kve.score_layer(p, keys=rev), ref.knorm(rev, W), rtol=1e-6, what="reversed")
        # a float32 view at a 2-byte offset inside a byte buffer: strides not multiples of 4
        raw = np.zeros(self.k.nbytes + 2, np.uint8)
        odd = np.ndarray(self.k.shape, np.float32, raw, offset=2,
                         strides=tuple(s for s in self.k.strides))
        odd[...] = self.k
        rec = np.ndarray(self.k.shape, np.dtype([("x", np.float32), ("pad", np.uint16)]))
        rec["x"] = self.k
        x = rec["x"]  # strides of 6 bytes: not a multiple of 4
        self.assertTrue(any(s % 4 for s in x.strides))
        assert_close(self, kve.score_layer(p, keys=x), ref.knorm(self.k, W), rtol=1e-6, what="odd")
        # the 2-byte-offset view is misaligned for f32: the library says so
        with self.assertRaises(kve.KvevictError) as cm:
            kve.score_layer(p, keys=odd)
        self.assertEqual(cm.exception.name, "KVE_ERR_MISALIGNED")

    def test_float16(self):
        q, k, v = (x.astype(np.float16) for x in (self.q, self.k, self.v))
        for name in ("snapkv", "lava"):
            p = kve.ScoreParams.preset(name, window=W)
            got = kve.score_layer(p, q, k, v if name == "lava" else None)
            want = ref.snapkv(q, k, W) if name == "snapkv" else ref.lava(q, k, v, W)
            assert_close(self, got, want, what=f"f16 {name}")
        g = kve.compute_gram(self.wo.astype(np.float16), self.hkv)
        assert_close(self, g, ref.gram(self.wo.astype(np.float16), self.hkv), rtol=1e-5, what="f16 gram")
        # mixed dtypes across tensors
        p = kve.ScoreParams.preset("laprox", window=W)
        got = kve.score_layer(p, self.q, k, self.v.astype(np.float16), gram=kve.compute_gram(self.wo, self.hkv))
        want = ref.laprox_sum(self.q, k, self.v.astype(np.float16), self.wo, W)
        assert_close(self, got, want, what="mixed")

    def test_bfloat16_bits(self):
        qb, kb, vb = (kve.to_bfloat16_bits(x) for x in (self.q, self.k, self.v))
        qf, kf, vf = (kve.from_bfloat16_bits(x) for x in (qb, kb, vb))
        self.assertLess(np.abs(kf - self.k).max(), 0.02)
        p = kve.ScoreParams.preset("lava", window=W)
        want = ref.lava(qf, kf, vf, W)
        a = kve.score_layer(p, qb, kb, vb, dtype="bfloat16")
        b = kve.score_layer(p, kve.bfloat16(qb), kve.bfloat16(kb), kve.bfloat16(vb))
        assert_close(self, a, want, what="bf16")
        np.testing.assert_array_equal(a, b)
        # strided bf16 too
        _, kv = token_major(kb)
        np.testing.assert_array_equal(kve.score_layer(p, qb, kv, vb, dtype="bf16"), a)
        with self.assertRaises(TypeError):
            kve.score_layer(p, qb, kb, vb)  # uint16 without dtype is ambiguous

    def test_ml_dtypes_bfloat16(self):
        try:
            import ml_dtypes
        except ImportError:
            self.skipTest("ml_dtypes not installed")
        kb = self.k.astype(ml_dtypes.bfloat16)
        p = kve.ScoreParams.preset("knorm", window=W)
        assert_close(self, kve.score_layer(p, keys=kb), ref.knorm(kb.astype(np.float32), W),
                     rtol=1e-6, what="ml_dtypes")

    def test_float64_is_converted(self):
        p = kve.ScoreParams.preset("snapkv", window=W)
        a = kve.score_layer(p, self.q.astype(np.float64), self.k.astype(np.float64))
        np.testing.assert_array_equal(a, kve.score_layer(p, self.q, self.k))
        with self.assertRaises(TypeError):
            kve.score_layer(p, self.q, self.k.astype(np.int32))


if __name__ == "__main__":
    unittest.main()
