"""StreamScorer (kve_stream_*) against a numpy float64 recomputation of src/math/stream.rs's
contract: every query's full softmax over the keys it sees, statistics accumulated."""
import math
import unittest

import numpy as np

import kvevict as kve
from _util import assert_close, layer, ref


def stream_reference(q, pos, k, v=None, wo=None, stat="max", gqa="max", pool=None,
                     post_pool=None):
    """Scores [Hkv, N] in float64: query j at pos[j] sees keys i <= min(pos[j], N-1)."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    hq, c, d = q.shape
    hkv, n, _ = k.shape
    g = hq // hkv
    kk = np.repeat(k, g, axis=0)
    z = np.einsum("hjd,hid->hji", q, kk) / math.sqrt(d)
    last = np.minimum(np.asarray(pos), n - 1)
    z[:, np.arange(n)[None, :] > last[:, None]] = -np.inf
    z -= z.max(axis=-1, keepdims=True)
    a = np.exp(z)
    a /= a.sum(axis=-1, keepdims=True)  # [Hq, c, N]
    if stat == "max":
        s = a.max(axis=1)
    elif stat == "mean":
        s = a.sum(axis=1) / c
    elif stat == "mean-visible":
        seen = (np.arange(n)[None, :] <= last[:, None]).sum(axis=0)
        s = np.where(seen > 0, a.sum(axis=1) / np.maximum(seen, 1), 0.0)
    else:
        s = np.sqrt((a * a).sum(axis=1))
    if pool is not None:
        s = ref.pool(s, *pool)
    if stat == "laprox":
        vv = np.repeat(np.asarray(v, np.float64), g, axis=0)  # [Hq, N, dv]
        y = np.einsum("hnr,hrD->hnD", vv, np.asarray(wo, np.float64))
        s = s * np.linalg.norm(y, axis=-1)
    s = s.reshape(hkv, g, n)
    s = {"max": s.max(axis=1), "mean": s.mean(axis=1), "sum": s.sum(axis=1)}[gqa]
    if post_pool is not None:
        s = ref.pool(s, *post_pool)
    return s


class StreamTests(unittest.TestCase):
    def setUp(self):
        self.q, self.k, self.v, self.wo = layer(seed=3, hq=6, hkv=2, n=70, d=16, dv=8, wq=20)
        self.pos = np.sort(np.random.default_rng(1).integers(30, 100, 20))

    def fed(self, chunk, q=None, k=None):
        q = self.q if q is None else q
        k = self.k if k is None else k
        s = kve.StreamScorer(6, 2, 70, 16)
        for j in range(0, q.shape[1], chunk):
            s.feed(q[:, j:j + chunk], self.pos[j:j + chunk], k)
        return s

    def test_every_stat_matches_the_reference(self):
        s = self.fed(7)
        self.assertEqual(s.query_count, 20)
        forms = kve.compute_value_forms(self.v, kve.compute_gram(self.wo, 2, cross=False))
        for stat in kve.STREAM_STATS.names():
            for gqa, pool, post in (("max", None, None), ("mean", ("avg", 3), None),
                                    ("sum", None, ("forward", 8, 0.9))):
                ours = s.scores(stat, gqa, pool, post, value_forms=forms)
                want = stream_reference(self.q, self.pos, self.k, self.v, self.wo, stat, gqa,
                                        pool, post)
                assert_close(self, ours, want, what=f"{stat} {gqa} {pool} {post}")

    def test_values_and_gram_path(self):
        s = self.fed(20)
        gm = kve.compute_gram(self.wo, 2, cross=False)
        ours = s.scores("laprox", "sum", values=self.v, gram=gm)
        want = stream_reference(self.q, self.pos, self.k, self.v, self.wo, "laprox", "sum")
        assert_close(self, ours, want, what="laprox values + gram")

    def test_chunks_equal_one_feed_and_token_major_keys(self):
        a = self.fed(20).scores("mean", "mean")
        # llama.cpp token rows [N, Hkv*d] seen as [Hkv, N, d], and float16
        rows = np.ascontiguousarray(self.k.transpose(1, 0, 2)).reshape(70, 32)
        k_tok = rows.reshape(70, 2, 16).transpose(1, 0, 2)
        b = self.fed(1, k=k_tok).scores("mean", "mean")
        assert_close(self, b, a, rtol=1e-5, what="chunks of 1, token-major keys")
        h = self.fed(6, q=self.q.astype(np.float16), k=self.k.astype(np.float16))
        want = stream_reference(self.q.astype(np.float16), self.pos, self.k.astype(np.float16),
                                stat="mean", gqa="mean")
        assert_close(self, h.scores("mean", "mean"), want, what="float16")

    def test_row_lse_path(self):
        q, k, pos = self.q.astype(np.float64), self.k.astype(np.float64), self.pos
        z = np.einsum("hjd,hid->hji", q, np.repeat(k, 3, axis=0)) / math.sqrt(16)
        z[:, np.arange(70)[None, :] > np.minimum(pos, 69)[:, None]] = -np.inf
        m = z.max(axis=-1)
        lse = m + np.log(np.exp(z - m[..., None]).sum(axis=-1))  # [Hq, c]
        s = kve.StreamScorer(6, 2, 70, 16).feed(self.q, pos, self.k, row_lse=lse)
        for stat in ("max", "mean", "laprox"):
            assert_close(self, s.scores(stat, value_forms=np.ones(6 * 70)),
                         self.fed(20).scores(stat, value_forms=np.ones(6 * 70)), rtol=1e-5,
                         what=f"row_lse {stat}")

    def test_select_with_window_zero(self):
        sc = self.fed(20).scores("max", "max")
        kept = kve.kept_lists(*kve.select_model(kve.SelectParams("uniform", "head", 5),
                                                sc[None], 70, 0), layers=1, hkv=2)
        for kh in range(2):
            want = sorted(np.argsort(-sc[kh], kind="stable")[:5].tolist())
            self.assertEqual(sorted(kept[0][kh].tolist()), want)

    def test_bad_input_leaves_the_state_unchanged(self):
        s = self.fed(20)
        before = s.state.copy()
        q1 = self.q[:, :3]
        cases = [
            ("backwards", lambda: s.feed(q1, [200, 199, 201], self.k), "KVE_ERR_INVALID_ARGUMENT"),
            ("before the last", lambda: s.feed(q1, [50, 60, 70], self.k), "KVE_ERR_INVALID_ARGUMENT"),
            ("NaN", lambda: s.feed(np.where(q1 > 2, np.nan, q1), [200] * 3, self.k),
             "KVE_ERR_NON_FINITE"),
            ("keys of another N", lambda: s.feed(q1, [200] * 3, self.k[:, :69]),
             "KVE_ERR_SHAPE_MISMATCH"),
            ("positions count", lambda: s.feed(q1, [200] * 2, self.k), "KVE_ERR_SHAPE_MISMATCH"),
            ("row_lse length", lambda: s.feed(q1, [200] * 3, self.k, row_lse=np.zeros(5)),
             "KVE_ERR_SHAPE_MISMATCH"),
        ]
        for what, f, status in cases:
            with self.assertRaises(kve.KvevictError, msg=what) as e:
                f()
            self.assertEqual(e.exception.name, status, what)
            np.testing.assert_array_equal(s.state, before, err_msg=what)
        other = kve.StreamScorer(3, 1, 70, 16)
        with self.assertRaises(kve.KvevictError) as e:
            other.feed(self.q[:, :1], [80], self.k)
        self.assertEqual(e.exception.name, "KVE_ERR_SHAPE_MISMATCH")
        with self.assertRaises(kve.KvevictError) as e:
            kve.StreamScorer(3, 1, 70, 16).scores("mean")
        self.assertEqual(e.exception.name, "KVE_ERR_INVALID_ARGUMENT")

    def test_raw_stats(self):
        s = self.fed(7)
        st = s.stats()
        self.assertEqual(st["queries"], 20)
        last = np.minimum(self.pos, 69)
        np.testing.assert_array_equal(st["visible"], (np.arange(70)[None, :] <= last[:, None]).sum(0))
        want_max = stream_reference(self.q, self.pos, self.k, stat="max", gqa="max")
        # per query head: the GQA max of the raw maxima is the max score
        assert_close(self, st["max"].reshape(2, 3, 70).max(axis=1), want_max, what="raw max")
        self.assertEqual(st["sum"].shape, (6, 70))
        np.testing.assert_allclose(st["sum"].reshape(2, 3, 70).sum(axis=1) / 20,
                                   s.scores("mean", "sum"), rtol=1e-6)
        np.testing.assert_allclose(np.sqrt(st["sq"]).reshape(2, 3, 70).max(axis=1),
                                   s.scores("laprox", "max", value_forms=np.ones(2 * 3 * 70)),
                                   rtol=1e-6)

    def test_state_snapshot_restores(self):
        s = self.fed(20)
        snap = s.state.copy()
        s.feed(self.q[:, :2], [500, 501], self.k)
        self.assertEqual(s.query_count, 22)
        s.state = snap
        self.assertEqual(s.query_count, 20)
        assert_close(self, s.scores("mean"), self.fed(20).scores("mean"), rtol=0)


if __name__ == "__main__":
    unittest.main()
