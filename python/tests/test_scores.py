"""Every scorer against a plain numpy recomputation of its design §3 formula."""
import unittest

import numpy as np

from _util import assert_close, layer, ref

import kvevict as kve

W = 8


class ScorerTests(unittest.TestCase):
    def setUp(self):
        self.q, self.k, self.v, self.wo = layer(seed=1)
        self.hkv, self.n = self.k.shape[:2]
        self.p = self.n - W

    def test_snapkv_preset(self):
        params = kve.ScoreParams.preset("snapkv", window=W)
        self.assertEqual((params.pool_kind, params.pool_kernel, params.gqa), ("max", 7, "mean"))
        got = kve.score_layer(params, self.q, self.k)
        self.assertEqual(got.shape, (self.hkv, self.p))
        self.assertEqual(got.dtype, np.float32)
        assert_close(self, got, ref.snapkv(self.q, self.k, W, 7, "max", "mean"), what="snapkv")

    def test_snapkv_options(self):
        for kind, kernel, gqa in [("avg", 5, "mean"), ("max", 3, "max"), ("none", 1, "sum"),
                                  ("avg", 1, "max")]:
            params = kve.ScoreParams("snapkv", window=W, pool_kind=kind, pool_kernel=kernel, gqa=gqa)
            got = kve.score_layer(params, self.q, self.k)
            assert_close(self, got, ref.snapkv(self.q, self.k, W, kernel, kind, gqa),
                         what=f"snapkv {kind} {kernel} {gqa}")

    def test_snapkv_kvpress_preset(self):
        params = kve.ScoreParams.preset("snapkv-kvpress")
        self.assertEqual((params.window, params.pool_kind, params.pool_kernel), (64, "avg", 5))
        q, k, _, _ = layer(seed=2, n=100)
        got = kve.score_layer(params, q, k)
        assert_close(self, got, ref.snapkv(q, k, 64, 5, "avg", "mean"), what="snapkv-kvpress")

    def test_lava(self):
        params = kve.ScoreParams.preset("lava", window=W)
        got = kve.score_layer(params, self.q, self.k, self.v)
        assert_close(self, got, ref.lava(self.q, self.k, self.v, W, 7), what="lava")

    def test_laprox_sum_with_gram(self):
        for placement in ("attention", "product"):
            for kernel in (7, 1):
                params = kve.ScoreParams.preset("laprox", window=W, placement=placement, kernel=kernel)
                self.assertEqual(params.laprox_gqa, "sum")
                g = kve.compute_gram(self.wo, self.hkv)
                got = kve.score_layer(params, self.q, self.k, self.v, gram=g)
                want = ref.laprox_sum(self.q, self.k, self.v, self.wo, W, kernel, "avg", placement)
                assert_close(self, got, want, what=f"laprox {placement} k={kernel}")

    def test_laprox_span_preset_cubes_its_scores(self):
        params = kve.ScoreParams.preset("laprox-span", window=W)
        self.assertEqual((params.power, kve.ScoreParams.preset("laprox").power), (3, 1))
        g = kve.compute_gram(self.wo, self.hkv)
        got = kve.score_layer(params, self.q, self.k, self.v, gram=g)
        want = ref.laprox_sum(self.q, self.k, self.v, self.wo, W, 1, "none") ** 3
        assert_close(self, got, want, what="laprox-span (cubed)")
        # KNorm's negative scores keep their sign under an even power
        got = kve.score_layer(kve.ScoreParams.preset("knorm", window=W, power=2), self.q, self.k)
        assert_close(self, got, -ref.knorm(self.k, W) ** 2, what="knorm squared")
        for bad in (0, 17):
            with self.assertRaises(kve.KvevictError):
                kve.score_layer(kve.ScoreParams.preset("knorm", window=W, power=bad), self.q, self.k)

    def test_laprox_value_forms_equal_values_plus_gram(self):
        params = kve.ScoreParams.preset("laprox", window=W)
        g = kve.compute_gram(self.wo, self.hkv)
        forms = kve.compute_value_forms(self.v, g)
        self.assertEqual(forms.shape, (self.hkv, 3, self.n))
        a = kve.score_layer(params, self.q, self.k, self.v, gram=g)
        b = kve.score_layer(params, self.q, self.k, value_forms=forms)
        assert_close(self, b, a, rtol=1e-6, what="forms vs gram")
        # filled incrementally, column range by column range
        inc = np.zeros_like(forms)
        for t0 in range(0, self.n, 30):
            kve.compute_value_forms(self.v, g, t0=t0, t1=min(t0 + 30, self.n), out=inc)
        np.testing.assert_array_equal(inc, forms)
        # the forms are v G vᵀ = ||v Wo_h||² (reference, f64)
        vw = np.einsum("hnd,hdD->hnD", np.repeat(self.v.astype(np.float64), 3, axis=0), self.wo)
        assert_close(self, forms.reshape(6, self.n), (vw ** 2).sum(-1), rtol=1e-5, what="forms")

    def test_laprox_exact(self):
        params = kve.ScoreParams.preset("laprox", window=W, laprox_gqa="exact", kernel=1)
        self.assertTrue(params.cross)
        g = kve.compute_gram(self.wo, self.hkv, cross=True)
        got = kve.score_layer(params, self.q, self.k, self.v, gram=g)
        # true Frobenius norm of the group's rank-g term
        a = ref.window_attention(self.q, self.k, W)[:, :, : self.p]  # [Hq, w, P]
        out = np.empty((self.hkv, self.p))
        for kh in range(self.hkv):
            for i in range(self.p):
                hs = range(kh * 3, kh * 3 + 3)
                m = sum(np.outer(a[h, :, i], self.v[kh, i].astype(np.float64) @ self.wo[h]) for h in hs)
                out[kh, i] = np.linalg.norm(m)
        assert_close(self, got, out, what="laprox exact")

    def test_gram_matches_reference(self):
        for cross in (False, True):
            g = kve.compute_gram(self.wo, self.hkv, cross)
            want = ref.gram(self.wo, self.hkv, cross)
            self.assertEqual(g.shape, want.shape)
            assert_close(self, g, want, rtol=1e-6, what=f"gram cross={cross}")
            self.assertEqual(g.size, kve.gram_len(6, self.hkv, self.wo.shape[1], cross))

    def test_knorm(self):
        params = kve.ScoreParams.preset("knorm", window=W)
        got = kve.score_layer(params, keys=self.k)
        assert_close(self, got, ref.knorm(self.k, W), rtol=1e-6, what="knorm")

    def test_tova(self):
        params = kve.ScoreParams.preset("tova")
        self.assertEqual(params.window, 1)
        got = kve.score_layer(params, self.q, self.k)
        assert_close(self, got, ref.tova(self.q, self.k), what="tova")

    def test_streamingllm(self):
        params = kve.ScoreParams.preset("streamingllm", window=W)
        got = kve.score_layer(params, keys=self.k)
        want = np.zeros((self.hkv, self.p))
        want[:, :4] = 1
        np.testing.assert_array_equal(got, want)

    def test_criticalkv(self):
        params = kve.ScoreParams.preset("criticalkv", window=W, critical_first_stage=10)
        l1 = kve.compute_value_l1(self.v, self.wo)
        assert_close(self, l1, ref.value_l1(self.v, self.wo, self.hkv), rtol=1e-5, what="value l1")
        got = kve.score_layer(params, self.q, self.k, value_l1=l1)
        base = ref.snapkv(self.q, self.k, W, 5, "avg", "mean")
        for kh in range(self.hkv):
            forced = ref.top_k(base[kh], 10)
            self.assertTrue(np.all(got[kh, forced] == np.finfo(np.float32).max))
            rest = np.setdiff1d(np.arange(self.p), forced)
            assert_close(self, got[kh, rest], (base[kh, rest] + 1e-4) * l1[kh, rest],
                         what="criticalkv second stage")

    def test_presets_roundtrip(self):
        for name in kve.PRESET_NAMES:
            p = kve.ScoreParams.preset(name)
            self.assertEqual(kve.ScoreParams("snapkv", **p.as_dict()), p)
            self.assertEqual(p.replace(window=3).window, 3)
            self.assertIn(p.scorer, ("snapkv", "lava", "laprox", "criticalkv", "streamingllm",
                                     "knorm", "tova", "uniqueness"))
        self.assertEqual(kve.ScoreParams.preset("laprox-span").pool_kernel, 1)
        self.assertEqual(kve.ScoreParams.preset("laprox-span").scorer, "laprox")

    def test_uniqueness(self):
        # a token with 4 planted twins (key and value copied) scores 0 itself and keeps only
        # what the next 10 tokens lend (at most their largest score); the reference checks the rest
        k, v = self.k.copy(), self.v.copy()
        twins = (5, 12, 20, 27, 33)
        for t in twins[1:]:
            k[:, t], v[:, t] = k[:, twins[0]], v[:, twins[0]]
        k[:, 40], v[:, 40] = k[:, 2], v[:, 2]  # one twin: not enough to be redundant
        got = kve.score_layer(kve.ScoreParams.preset("uniqueness", window=W), None, k, values=v)
        assert_close(self, got, ref.uniqueness(k, v, W), what="uniqueness")
        for t in twins:
            self.assertTrue(np.all(got[:, t] <= got[:, t + 1: t + 11].max(axis=1) * (1 + 1e-6)))

    def test_workspace_and_out_reuse(self):
        params = kve.ScoreParams.preset("snapkv", window=W)
        nbytes = kve.score_workspace_size(params, 6, self.hkv, self.n, 16)
        ws = np.empty(nbytes, np.uint8)
        out = np.empty((self.hkv, self.p), np.float32)
        got = kve.score_layer(params, self.q, self.k, out=out, workspace=ws)
        self.assertIs(got, out)
        np.testing.assert_array_equal(got, kve.score_layer(params, self.q, self.k))
        self.assertEqual(kve.score_output_len(params, self.hkv, self.n), self.hkv * self.p)

    def test_window_larger_than_n(self):
        q, k, _, _ = layer(seed=3, n=5)
        got = kve.score_layer(kve.ScoreParams("snapkv", window=W), q, k)
        self.assertEqual(got.shape, (2, 0))


if __name__ == "__main__":
    unittest.main()
