"""kvevict.Evictor: its kept sets equal select_kept's for every preset (the policy's budget
being select_kept's keep ratio), with links and overrides; the policies, the query ring,
compaction and errors."""
import unittest

import numpy as np

import kvevict as kve

L, HQ, HKV, N, D, DM = 3, 4, 2, 120, 16, 32


def model(seed=0, n=N):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((L, HQ, n, D)).astype(np.float32)
    k = rng.standard_normal((L, HKV, n, D)).astype(np.float32)
    v = rng.standard_normal((L, HKV, n, D)).astype(np.float32)
    wo = (rng.standard_normal((L, HQ, D, DM)) / np.sqrt(DM)).astype(np.float32)
    return q, k, v, wo


def evictor(preset, **kw):
    ev = kve.Evictor(preset, layers=L, hq=HQ, hkv=HKV, dk=D, d_model=DM, max_cells=N, **kw)
    return ev


class EvictorTests(unittest.TestCase):
    def setUp(self):
        self.q, self.k, self.v, self.wo = model()

    def assert_same(self, a, b, what):
        self.assertEqual(len(a), len(b), what)
        for l in range(L):
            for h in range(HKV):
                np.testing.assert_array_equal(a[l][h], b[l][h], f"{what} layer {l} head {h}")

    def run_evictor(self, ev):
        if ev.requirements["wo"] == "once":
            for l in range(L):
                ev.set_output_projection(l, self.wo[l])
        return ev.evict(0, self.k, self.v, self.q, wo=self.wo)

    def test_every_preset_equals_select_kept(self):
        self.assertEqual(kve.PRESET_NAMES, ("snapkv", "snapkv-kvpress", "lava", "laprox",
                                            "laprox-span", "criticalkv", "streamingllm", "knorm",
                                            "tova", "uniqueness", "tova-decay", "h2o"))
        for name in kve.PRESET_NAMES:
            for ratio in (0.3, 0.7):
                ev = evictor(name, keep_ratio=ratio, min_keep=0)
                kept = self.run_evictor(ev)
                want = kve.select_kept(name, self.q, self.k, self.v, self.wo, keep_ratio=ratio)
                self.assert_same(kept, want, f"{name} {ratio}")
                ev.commit(0)
                st = ev.stats(0)
                self.assertEqual(st["evictions"], 1)
                self.assertEqual(st["cells"], max(len(a) for row in kept for a in row), name)

    def test_links_granularity_and_params_equal_select_kept(self):
        ev = evictor("laprox-span", keep_ratio=0.2, min_keep=0, link_threshold=kve.LINK_THRESHOLD)
        want = kve.select_kept("laprox-span", self.q, self.k, self.v, self.wo, keep_ratio=0.2,
                               value_links=kve.LINK_THRESHOLD)
        self.assert_same(self.run_evictor(ev), want, "links")
        ev = evictor("snapkv", keep_ratio=0.4, min_keep=0, granularity="layer", window=8)
        want = kve.select_kept("snapkv", self.q, self.k, keep_ratio=0.4, granularity="layer", window=8)
        self.assert_same(self.run_evictor(ev), want, "granularity")
        sp = kve.ScoreParams.preset("lava", pool_kernel=3, window=16)
        sel = kve.SelectParams("ada", "head")
        ev = evictor("snapkv", keep_ratio=0.5, min_keep=0, score_params=sp, select_params=sel)
        want = kve.select_kept(sp, self.q, self.k, self.v, keep_ratio=0.5, select_params=sel)
        self.assert_same(self.run_evictor(ev), want, "params")

    def test_default_selection_comes_from_the_library(self):
        self.assertEqual(kve.DEFAULT_ALLOCATOR["lava"], "lava")
        self.assertEqual(kve.DEFAULT_ALLOCATOR["laprox"], "global")
        self.assertEqual(kve.DEFAULT_ALLOCATOR["snapkv"], "uniform")
        self.assertEqual(kve.SelectParams.preset("uniqueness", 7), kve.SelectParams.laprox_span(7))
        self.assertEqual(evictor("laprox-span").requirements,
                         {"queries": True, "values": True, "wo": "once", "row_lse_helps": True,
                          "window": 8, "granularity": "token"})
        self.assertEqual(evictor("criticalkv").requirements["wo"], "every-round")

    def test_ring_policies_and_compaction(self):
        ev = evictor("snapkv", keep_ratio=0.5, min_keep=8, window=8, granularity="token")
        for l in range(L):  # a prefill observed in two chunks; scoring then reads the ring
            ev.observe_queries(0, l, self.q[l][:, :100])
            ev.observe_queries(0, l, self.q[l][:, 100:])
        kept = ev.evict(0, self.k, self.v)
        want = kve.select_kept("snapkv", self.q, self.k, keep_ratio=0.5, window=8,
                               granularity="token")
        self.assert_same(kept, want, "ring")
        cells = ev.kept_cells(0)
        np.testing.assert_array_equal(cells, want[0][0])
        gone = ev.evicted_cells(0)
        self.assertEqual(len(cells) + len(gone), N)
        k = self.k[1].copy()
        ev.compact(0, 1, k)
        np.testing.assert_array_equal(k[:, :len(cells)], self.k[1][:, cells])
        ev.commit(0)
        # the 60 kept are protected: 20 new cells keep max(10, 8)
        self.assertEqual(ev.plan(0, 80), 70)
        self.assertEqual(ev.stats(0)["protected_cells"], 60)
        cells_ev = evictor("knorm", cells=(100, 90))
        self.assertEqual((cells_ev.plan(0, 100), cells_ev.plan(0, 101)), (100, 90))

    def test_marks(self):
        # a round with the engine's marks: every marked cell fits the share of 1, so each unit
        # keeps all of them; share 0 is the plain selection; a wrong length is refused
        def round_(marks=None, share=None):
            ev = evictor("snapkv", window=8, granularity="token")
            ev.begin(0, N, 40)
            if marks is not None:
                ev.mark_cells(0, marks, share)
            for l in range(L):
                ev.score_layer(0, l, self.k[l], queries=self.q[l][:, -8:])
            ev.select(0)
            return ev.kept(0)

        marks = np.zeros(N, np.uint8)
        marks[10:30] = 1
        plain, marked = round_(), round_(marks, 1.0)
        for l in range(L):
            for h in range(HKV):
                self.assertTrue(set(range(10, 30)) <= set(marked[l][h].tolist()), (l, h))
                self.assertEqual(len(marked[l][h]), len(plain[l][h]))
        self.assert_same(round_(marks, 0.0), plain, "share 0")
        ev = evictor("snapkv", window=8)
        ev.begin(0, N, 40)
        with self.assertRaises(kve.KvevictError) as e:
            ev.mark_cells(0, marks[:-1])
        self.assertEqual(e.exception.name, "KVE_ERR_SHAPE_MISMATCH")

    def test_errors(self):
        ev = evictor("snapkv")
        with self.assertRaises(kve.KvevictError) as e:
            ev.select(0)  # no round
        self.assertEqual(e.exception.name, "KVE_ERR_INVALID_ARGUMENT")
        with self.assertRaises(kve.KvevictError) as e:
            ev.begin(0, N + 1, 10)
        self.assertEqual(e.exception.name, "KVE_ERR_INVALID_ARGUMENT")
        with self.assertRaises(ValueError):
            kve.Evictor("snapkv", layers=1, hq=1, hkv=1, dk=4, max_cells=8, keep_ratio=0.5, cells=4)
        with self.assertRaises(kve.KvevictError) as e:
            kve.Evictor("knorm", layers=1, hq=3, hkv=2, dk=4, max_cells=8)
        self.assertEqual(e.exception.name, "KVE_ERR_SHAPE_MISMATCH")
        with self.assertRaises(ValueError):
            kve.Evictor("no-such-method", layers=1, hq=1, hkv=1, dk=4, max_cells=8)


if __name__ == "__main__":
    unittest.main()


class OptionsTests(unittest.TestCase):
    """kvevict.evictor_options / preset_list / hadamard_blocks (kve_evictor_options_apply,
    kve_preset_list, kve_hadamard_blocks): an engine's flags read by the library."""

    def test_preset_lists(self):
        self.assertEqual(kve.preset_list(), list(kve.PRESET_NAMES))
        self.assertEqual(kve.preset_list(no_wo_every_round=True),
                         [n for n in kve.PRESET_NAMES if n != "criticalkv"])

    def test_options(self):
        o = kve.evictor_options(keep_ratio=0.25, max_cells=300, token_cells=True)
        self.assertEqual((o["preset"], o["policy"], o["keep_ratio"], o["high"], o["low"]),
                         ("laprox-span", "keep-ratio", 0.25, 300, 225))
        self.assertEqual(o["granularity"], "token")
        self.assertTrue(o["requirements"]["queries"])
        o = kve.evictor_options("tova-decay", max_cells=100, evict_to=0.5)
        self.assertEqual((o["policy"], o["high"], o["low"], o["granularity"]), ("cells", 100, 50, None))
        o = kve.evictor_options("uniqueness", window=16, link_threshold=0.5)
        self.assertEqual((o["policy"], o["window"], o["requirements"]["window"]), ("explicit", 16, 16))
        self.assertFalse(o["requirements"]["queries"])
        self.assertAlmostEqual(o["link_threshold"], 0.5)
        # an evictor from the options' config makes the same choices
        ev = kve.Evictor(o["preset"], layers=L, hq=HQ, hkv=HKV, dk=D, d_model=DM, max_cells=N,
                         window=o["window"], link_threshold=o["link_threshold"])
        self.assertEqual(ev.requirements["window"], 16)

    def test_refusals_name_what_to_change(self):
        for kw, says in [({"method": "bogus"}, "unknown eviction method (known: snapkv"),
                         ({"method": "criticalkv", "no_wo_every_round": True}, "reads Wo at every round"),
                         ({"link_threshold": float("nan")}, "value-link threshold"),
                         ({"keep_ratio": 1.5}, "keep ratio must be in (0, 1]"),
                         ({"max_cells": 8}, "budget must be larger than the observation window"),
                         ({"max_cells": 256, "evict_to": 1.0}, "evict-to fraction"),
                         ({"method": "snapkv", "link_threshold": 0.5}, "flat forward post-pool")]:
            with self.assertRaises(kve.KvevictError) as e:
                kve.evictor_options(**kw)
            self.assertIn(says, e.exception.detail, kw)
        self.assertEqual(kve.evictor_options("criticalkv")["requirements"]["wo"], "every-round")

    def test_hadamard_blocks(self):
        rng = np.random.default_rng(3)
        x = rng.standard_normal(3 * 64).astype(np.float32)
        h = np.array([[1.0]])
        while h.shape[0] < 64:
            h = np.block([[h, h], [h, -h]])
        want = (x.astype(np.float64).reshape(3, 64) @ (h / 8.0)).ravel()
        y = kve.hadamard_blocks(x.copy(), 64)
        np.testing.assert_allclose(y, want, rtol=0, atol=1e-5)
        np.testing.assert_allclose(kve.hadamard_blocks(y, 64), x, rtol=0, atol=1e-5)
        with self.assertRaises(kve.KvevictError):
            kve.hadamard_blocks(x, 48)

    def test_query_ring_rows(self):
        counts = np.zeros(2, np.uint64)
        # window 2, scratch row 4: seq 0's first of three tokens is overwritten in the ubatch
        rows = kve.query_ring_rows(counts, 2, [0, 1, 0, 0, 5, -1])
        self.assertEqual(rows.tolist(), [4, 2, 1, 0, 4, 4])
        self.assertEqual(counts.tolist(), [3, 1])
        self.assertEqual(kve.query_ring_rows(counts, 2, [1, 0]).tolist(), [3, 1])
        self.assertEqual(counts.tolist(), [4, 2])
        with self.assertRaises(kve.KvevictError):
            kve.query_ring_rows(counts, 0, [0])
