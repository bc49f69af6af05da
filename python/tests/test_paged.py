"""Paged caches (paged_gather / paged_compact / pool_tensor): every engine pool kind,
f32 and f16; kept sets of every preset through gathered K/V equal the contiguous ones;
block-aligned compaction equals compact_in_place and frees the trailing blocks; hostile
tables and arrays raise naming the argument, with nothing written."""
import unittest

import numpy as np

import kvevict as kve

L, HQ, HKV, N, D, DM, BS, NB = 2, 6, 2, 70, 16, 40, 8, 13


def pool_shape(kind, nb=NB, bs=BS, h=HKV, d=D, layers=L):
    return {"nhd": (nb, bs, h, d), "nhd-kv-inner": (nb, 2, bs, h, d),
            "nhd-kv-outer": (2, nb, bs, h, d), "hnd": (nb, h, bs, d),
            "hnd-kv-inner": (nb, 2, h, bs, d), "trtllm": (nb, layers, 2, h, bs, d)}[kind]


def scatter(cache, layout, table, x):
    """Write x [H, n, d] into a 4-D cache through the table (numpy, the test's own path)."""
    n = x.shape[1]
    for t in range(n):
        b, s = table[t // BS], t % BS
        if layout == "nhd":
            cache[b, s] = x[:, t]
        else:
            cache[b, :, s] = x[:, t]


class Model:
    """K/V of L layers in an engine pool of `kind` (one pool per layer unless trtllm,
    whose pool holds every layer), noise everywhere else."""

    def __init__(self, kind, dtype, seed=0):
        rng = np.random.default_rng(seed)
        self.kind, self.dtype = kind, dtype
        self.q = rng.standard_normal((L, HQ, 64, D)).astype(np.float32)
        self.k = rng.standard_normal((L, HKV, N, D)).astype(dtype)
        self.v = rng.standard_normal((L, HKV, N, D)).astype(dtype)
        self.wo = (rng.standard_normal((L, HQ * D, DM)) / np.sqrt(DM)).astype(np.float32)
        self.table = rng.permutation(NB).astype(np.int32)
        n_pools = 1 if kind == "trtllm" else L
        self.pools = [rng.standard_normal(pool_shape(kind)).astype(dtype) for _ in range(n_pools)]
        if kind in ("nhd", "hnd"):  # K and V in separate tensors
            self.pools = [(p, p.copy()) for p in self.pools]
        for l in range(L):
            for kv, x in ((0, self.k[l]), (1, self.v[l])):
                cache, layout = self.cache(l, kv)
                scatter(cache, layout, self.table, x)

    def cache(self, l, kv):
        if self.kind in ("nhd", "hnd"):
            return kve.pool_tensor(self.pools[l][kv], self.kind)
        if self.kind == "trtllm":
            return kve.pool_tensor(self.pools[0], self.kind, kv=kv, layer=l)
        return kve.pool_tensor(self.pools[l], self.kind, kv=kv)


class PagedTests(unittest.TestCase):
    def test_gather_every_kind(self):
        for kind in kve.POOL_KINDS:
            for dtype in (np.float32, np.float16):
                m = Model(kind, dtype)
                for l in range(L):
                    for kv, x in ((0, m.k[l]), (1, m.v[l])):
                        cache, layout = m.cache(l, kv)
                        g = kve.paged_gather(cache, m.table, N, layout=layout)
                        self.assertEqual(g.dtype, np.dtype(dtype))
                        np.testing.assert_array_equal(g.view(np.uint8), x.view(np.uint8))
                        # a shorter sequence reads only its blocks
                        np.testing.assert_array_equal(
                            kve.paged_gather(cache, m.table[:2], 2 * BS, layout=layout), x[:, :2 * BS])

    def test_kept_sets_equal_contiguous_for_every_preset(self):
        for kind in ("nhd-kv-outer", "trtllm"):
            for dtype in (np.float32, np.float16):
                m = Model(kind, dtype, seed=1)
                keys = [_gather(m, l, 0) for l in range(L)]
                values = [_gather(m, l, 1) for l in range(L)]
                for preset in kve.PRESET_NAMES:
                    want = kve.select_kept(preset, m.q, m.k, m.v, m.wo, keep_ratio=0.3)
                    got = kve.select_kept(preset, m.q, keys, values, m.wo, keep_ratio=0.3)
                    for l in range(L):
                        for h in range(HKV):
                            np.testing.assert_array_equal(got[l][h], want[l][h], f"{kind} {preset}")

    def test_token_granular_compaction_frees_blocks(self):
        for kind in ("nhd", "nhd-kv-inner", "hnd-kv-inner", "trtllm"):
            m = Model(kind, np.float16, seed=2)
            sel = kve.SelectParams.laprox_span(budget=kve.budget_keep_ratio_total(N, 8, 0.25))
            scores = kve.score_model(kve.ScoreParams("laprox-span"), m.q, m.k, m.v, m.wo)
            offsets, indices = kve.select_model(sel, scores, N, 8)
            positions = np.arange(N, dtype=np.uint32) + 500
            for l in range(L):
                unit = l * HKV
                kept = indices[offsets[unit]:offsets[unit + 1]]
                for kv, x in ((0, m.k[l]), (1, m.v[l])):
                    ref = np.ascontiguousarray(x)
                    lens = kve.compact_in_place(ref, offsets, indices, first_unit=unit)
                    cache, layout = m.cache(l, kv)
                    freed, kept_pos, lengths = kve.paged_compact(
                        cache, m.table, N, offsets, indices, layout=layout, first_unit=unit,
                        shared=True, positions=positions)
                    np.testing.assert_array_equal(lengths, lens)
                    np.testing.assert_array_equal(kept_pos, kept + 500)
                    k = len(kept)
                    self.assertEqual(freed, -(-N // BS) - (-(-k // BS)))
                    self.assertGreater(freed, 0)
                    g = kve.paged_gather(cache, m.table, k, layout=layout)
                    np.testing.assert_array_equal(g, ref[:, :k])

    def test_hostile(self):
        m = Model("nhd", np.float32)
        cache, layout = m.cache(0, 0)
        before = cache.copy()
        t = m.table.copy()
        t[3] = -1  # int32 padding
        with self.assertRaises(kve.KvevictError) as e:
            kve.paged_gather(cache, t, N)
        self.assertEqual(e.exception.status, kve.STATUS_CODES["KVE_ERR_OUT_OF_BOUNDS"])
        t[3] = t[0]
        with self.assertRaises(kve.KvevictError) as e:
            kve.paged_compact(cache, t, N, [0, 2], [1, 5], shared=True)
        self.assertEqual(e.exception.status, kve.STATUS_CODES["KVE_ERR_ALIASING"])
        with self.assertRaises(kve.KvevictError) as e:
            kve.paged_gather(cache, m.table[:3], N)
        self.assertEqual(e.exception.status, kve.STATUS_CODES["KVE_ERR_SHAPE_MISMATCH"])
        with self.assertRaises(kve.KvevictError) as e:
            kve.paged_compact(cache, m.table, N, [0, 2], [5, 1], shared=True)
        self.assertEqual(e.exception.status, kve.STATUS_CODES["KVE_ERR_INVALID_ARGUMENT"])
        np.testing.assert_array_equal(cache, before)
        for bad, word in ((cache[..., 0], "cache"), (cache.astype(np.float64), "cache")):
            with self.assertRaisesRegex(ValueError, word):
                kve.paged_gather(bad, m.table, N)
        ro = cache.copy()
        ro.flags.writeable = False
        with self.assertRaisesRegex(ValueError, "cache: array is read-only"):
            kve.paged_compact(ro, m.table, N, [0, 1], [0], shared=True)
        with self.assertRaisesRegex(ValueError, "table"):
            kve.paged_gather(cache, m.table.astype(np.float32), N)
        with self.assertRaisesRegex(ValueError, "kind"):
            kve.pool_tensor(m.pools[0][0], "vllm")
        with self.assertRaisesRegex(ValueError, "pool"):
            kve.pool_tensor(m.pools[0][0], "trtllm")
        with self.assertRaisesRegex(ValueError, "kv"):
            kve.pool_tensor(np.zeros(pool_shape("nhd-kv-inner"), np.float32), "nhd-kv-inner", kv=2)
        with self.assertRaisesRegex(ValueError, "layout"):
            kve.paged_gather(cache, m.table, N, layout="thd")


class PagedEvictorTests(unittest.TestCase):
    """kvevict.Evictor(paged=...): score_layer_paged / compact_paged against the same
    evictor on contiguous K/V."""

    def evictors(self, preset, dtype, **kw):
        args = dict(layers=L, hq=HQ, hkv=HKV, dk=D, d_model=DM, max_cells=N, **kw)
        return kve.Evictor(preset, **args), kve.Evictor(preset, paged=dtype, **args)

    def test_rounds_and_compaction_equal_contiguous(self):
        cases = [("laprox-span", "nhd-kv-outer", np.float16, "token"),
                 ("snapkv", "trtllm", np.float32, None),
                 ("lava", "hnd", np.float32, "head"),
                 ("knorm", "nhd-kv-inner", np.float16, "token")]
        for preset, kind, dtype, gran in cases:
            m = Model(kind, dtype, seed=4)
            a, b = self.evictors(preset, np.dtype(dtype).name, keep_ratio=0.25, min_keep=0,
                                 granularity=gran)
            for ev in (a, b):
                if ev.requirements["wo"] == "once":
                    for l in range(L):
                        ev.set_output_projection(l, m.wo[l])
            want = a.evict(0, m.k, m.v, m.q[:, :, -a.requirements["window"]:])
            target = b.plan(0, N)
            self.assertLess(target, N)
            b.begin(0, N, target)
            w = b.requirements["window"]
            for l in range(L):
                (kc, layout), (vc, _) = m.cache(l, 0), m.cache(l, 1)
                b.score_layer_paged(0, l, kc, m.table, vc, m.q[l][:, -w:], layout=layout)
            b.select(0)
            got = b.kept(0)
            for l in range(L):
                for h in range(HKV):
                    np.testing.assert_array_equal(got[l][h], want[l][h], f"{preset} {kind}")
            for l in range(L):
                most = max(len(got[l][h]) for h in range(HKV))
                for kv, x in ((0, m.k[l]), (1, m.v[l])):
                    ref = np.ascontiguousarray(x)
                    a.compact(0, l, ref)
                    cache, layout = m.cache(l, kv)
                    freed = b.compact_paged(0, l, cache, m.table, layout=layout)
                    self.assertEqual(freed, -(-N // BS) - (-(-most // BS)), preset)
                    g = kve.paged_gather(cache, m.table, most, layout=layout)
                    for h in range(HKV):
                        k = len(got[l][h])
                        np.testing.assert_array_equal(g[h, :k].view(np.uint8),
                                                      ref[h, :k].view(np.uint8))
            a.commit(0)
            b.commit(0)
            self.assertEqual(a.stats(0), b.stats(0))

    def test_bad_tables_raise_and_write_nothing(self):
        m = Model("nhd-kv-outer", np.float32, seed=5)
        a, b = self.evictors("snapkv", True, granularity="token")
        b.begin(0, N, 30)
        (kc, layout), (vc, _) = m.cache(0, 0), m.cache(0, 1)
        q = m.q[0][:, -b.requirements["window"]:]
        with self.assertRaises(kve.KvevictError) as e:  # a strided evictor
            a.begin(0, N, 30)
            a.score_layer_paged(0, 0, kc, m.table, vc, q)
        self.assertEqual(e.exception.status, kve.STATUS_CODES["KVE_ERR_INVALID_ARGUMENT"])
        for fault, status in (("oob", "KVE_ERR_OUT_OF_BOUNDS"), ("pad", "KVE_ERR_OUT_OF_BOUNDS"),
                              ("repeat", "KVE_ERR_ALIASING"), ("short", "KVE_ERR_SHAPE_MISMATCH")):
            t = m.table.copy()
            if fault == "oob":
                t[2] = NB
            elif fault == "pad":
                t[1] = -1
            elif fault == "repeat":
                t[4] = t[0]
            else:
                t = t[:2]
            with self.assertRaises(kve.KvevictError) as e:
                b.score_layer_paged(0, 0, kc, t, vc, q)
            self.assertEqual(e.exception.status, kve.STATUS_CODES[status], fault)
        for l in range(L):
            b.score_layer_paged(0, l, m.cache(l, 0)[0], m.table, m.cache(l, 1)[0],
                                m.q[l][:, -b.requirements["window"]:])
        b.select(0)
        before = kc.copy()
        t = m.table.copy()
        t[4] = t[0]
        with self.assertRaises(kve.KvevictError) as e:
            b.compact_paged(0, 0, kc, t)
        self.assertEqual(e.exception.status, kve.STATUS_CODES["KVE_ERR_ALIASING"])
        np.testing.assert_array_equal(kc, before)
        with self.assertRaisesRegex(ValueError, "table"):
            b.compact_paged(0, 0, kc, m.table.astype(np.float32))


def _gather(m, l, kv):
    cache, layout = m.cache(l, kv)
    return kve.paged_gather(cache, m.table, N, layout=layout)


if __name__ == "__main__":
    unittest.main()
