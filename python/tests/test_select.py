"""Selection shapes and kept sets, eviction lists, sharded search, compaction, budgets."""
import unittest

import numpy as np

from _util import ref

import kvevict as kve

L, H, N, W = 4, 2, 60, 8
P = N - W


def scores(seed=0):
    return np.random.default_rng(seed).random((L, H, P)).astype(np.float32)


def window():
    return np.arange(N - W, N)


class SelectTests(unittest.TestCase):
    def counts(self, offsets):
        return np.diff(offsets.astype(np.int64)).reshape(L, H) - W

    def test_uniform_head_matches_topk(self):
        s = scores()
        off, idx = kve.select_model(kve.SelectParams("uniform", "head", 10), s, N, W)
        self.assertEqual(off.dtype, np.uint64)
        self.assertEqual(idx.dtype, np.uint32)
        self.assertEqual(off.shape, (L * H + 1,))
        self.assertEqual(int(off[-1]), idx.size)
        kept = kve.kept_lists(off, idx, L, H)
        self.assertEqual((len(kept), len(kept[0])), (L, H))
        for l in range(L):
            for h in range(H):
                self.assertEqual(kept[l][h].dtype, np.int64)
                want = np.concatenate([ref.top_k(s[l, h], 10), window()])
                np.testing.assert_array_equal(kept[l][h], want)

    def test_ties_keep_later_positions(self):
        s = np.zeros((1, 1, P), np.float32)
        off, idx = kve.select_model(kve.SelectParams("uniform", "head", 5), s, N, W)
        np.testing.assert_array_equal(idx[:5], np.arange(P - 5, P))

    def test_counts_per_allocator(self):
        s = scores(1)
        for alloc in ("uniform", "ada", "lava", "global"):
            off, _ = kve.select_model(kve.SelectParams(alloc, "head", 10), s, N, W)
            c = self.counts(off)
            self.assertEqual(c.sum(), L * H * 10, alloc)
            self.assertTrue(np.all(c >= 0) and np.all(c <= P), alloc)
        c = self.counts(kve.select_model(kve.SelectParams("ada", "head", 10), s, N, W)[0])
        self.assertTrue(np.all(c.sum(axis=1) == H * 10))  # ada: budget moves between heads only
        self.assertTrue(np.all(c >= int(0.2 * 10)))  # alpha safeguard
        # pyramid (design §4): min = B//beta, max = 2B - min, B_l = max - l*(max-min)//(L-1)
        c = self.counts(kve.select_model(kve.SelectParams("pyramid", "head", 10), s, N, W)[0])
        lo, hi = 10 // 20, 20 - 10 // 20
        np.testing.assert_array_equal(c[:, 0], [hi - l * (hi - lo) // (L - 1) for l in range(L)])

    def test_shared_granularities(self):
        s = scores(2)
        for alloc in ("uniform", "ada", "global", "lava", "pyramid"):
            off, idx = kve.select_model(kve.SelectParams(alloc, "layer", 10), s, N, W)
            kept = kve.kept_lists(off, idx, L, H)
            for l in range(L):
                np.testing.assert_array_equal(kept[l][0], kept[l][1], alloc)
            off, idx = kve.select_model(kve.SelectParams(alloc, "token", 10), s, N, W)
            kept = kve.kept_lists(off, idx, L, H)
            for l in range(L):
                for h in range(H):
                    np.testing.assert_array_equal(kept[l][h], kept[0][0], alloc)
        # token granularity: top-B of the sum of layer-normalised scores (design §4)
        norm = s / np.abs(s).sum(axis=(1, 2), keepdims=True)
        want = np.concatenate([ref.top_k(norm.astype(np.float64).sum(axis=(0, 1)), 10), window()])
        off, idx = kve.select_model(kve.SelectParams("uniform", "token", 10), s, N, W)
        np.testing.assert_array_equal(kve.kept_lists(off, idx, L, H)[2][1], want)

    def test_global_matches_reference(self):
        s = scores(3)
        norm = (s / np.abs(s).sum(axis=(1, 2), keepdims=True)).reshape(-1)
        top = ref.top_k(norm, L * H * 10)
        mask = np.zeros(L * H * P, bool)
        mask[top] = True
        mask = mask.reshape(L, H, P)
        off, idx = kve.select_model(kve.SelectParams("global", "head", 10), s, N, W)
        kept = kve.kept_lists(off, idx, L, H)
        for l in range(L):
            for h in range(H):
                np.testing.assert_array_equal(kept[l][h], np.concatenate([np.flatnonzero(mask[l, h]), window()]))

    def test_laprox_span_selection(self):
        sp = kve.SelectParams.laprox_span(10)
        self.assertEqual((sp.allocator, sp.granularity, sp.post_pool_kind, sp.post_pool_kernel,
                          sp.post_pool_decay, sp.post_pool_sinks), ("global", "token", "forward", 9, 1.0, 1))
        off, idx = kve.select_model(sp, scores(4), N, W)
        self.assertEqual(int(off[-1]), L * H * (10 + W))

    def test_post_pool_sinks_lend_nothing(self):
        # a token-level selection of layer-normalised sums, pooled past the first `sinks`
        s = scores(9)
        s[:, :, 0] = 50.0  # a sink whose followers would win the pool
        t = (s / s.reshape(L, -1).sum(axis=1)[:, None, None]).sum(axis=(0, 1))
        for sinks in (0, 1, 3):
            sp = kve.SelectParams("global", "token", 10, post_pool_kind="forward", post_pool_kernel=6,
                                  post_pool_decay=0.8, post_pool_sinks=sinks)
            pooled = np.concatenate([t[:sinks], ref.pool(t[sinks:], "forward", 6, 0.8)])
            off, idx = kve.select_model(sp, s, N, W)
            kept = kve.kept_lists(off, idx, L, H)[0][0]
            np.testing.assert_array_equal(kept, np.concatenate([ref.top_k(pooled, 10), window()]))
            self.assertEqual(bool(np.isin(np.arange(1, 6), kept).all()), sinks == 0)

    def test_value_links_and_linked_selection(self):
        # links: sum over layers and heads of cos(v_i, v_{i-1}), V given transposed
        rng = np.random.default_rng(3)
        vs = [rng.standard_normal((H, N, 6)).astype(np.float32) for _ in range(L)]
        vs[1][:, 20] = 0.0  # a zero vector links nothing
        links = np.zeros(N, np.float32)
        for v in vs:
            kve.accumulate_value_links(np.ascontiguousarray(v.transpose(0, 2, 1)).transpose(0, 2, 1), links)
        want = np.zeros(N)
        for v in vs:
            a, b = v[:, 1:].astype(np.float64), v[:, :-1].astype(np.float64)
            den = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
            want[1:] += np.where(den > 0, (a * b).sum(-1) / np.where(den > 0, den, 1), 0).sum(0)
        np.testing.assert_allclose(links, want, atol=1e-5)
        with self.assertRaises(kve.KvevictError):
            kve.accumulate_value_links(np.full((H, N, 6), np.nan, np.float32), links)
        # a cue whose linked run is longer than the kernel: the linked pool keeps all of it
        s = np.full((L, H, P), 0.01, np.float32)
        s[:, :, 5] = 1.0
        run = np.full(N, 0.2 * L * H, np.float32)
        run[9:18] = 0.8 * L * H
        sp = kve.SelectParams.laprox_span(13)
        off, idx = kve.select_model(sp, s, N, W, links=run)
        np.testing.assert_array_equal(kve.kept_lists(off, idx, L, H)[0][0], np.r_[5:18, window()])
        plain = kve.select_model(sp, s, N, W)
        self.assertNotIn(17, kve.kept_lists(*plain, L, H)[0][0])
        quiet = kve.select_model(sp, s, N, W, links=np.zeros(N, np.float32))
        np.testing.assert_array_equal(quiet[1], plain[1])
        with self.assertRaises(kve.KvevictError):
            kve.select_model(sp, s, N, W, links=run[:-1])

    def test_budget_larger_than_prefix(self):
        off, idx = kve.select_model(kve.SelectParams("uniform", "head", 10 ** 12), scores(), N, W)
        self.assertEqual(idx.size, L * H * N)

    def test_evicted_positions(self):
        off, idx = kve.select_model(kve.SelectParams("uniform", "token", 10), scores(5), N, W)
        kept = kve.kept_lists(off, idx, L, H)[0][0]
        ev = kve.evicted_positions(kept, P)
        np.testing.assert_array_equal(ev, np.setdiff1d(np.arange(P), kept))
        self.assertEqual(ev.size, P - 10)
        np.testing.assert_array_equal(kve.evicted_positions([], 3), [0, 1, 2])

    def test_sharded_equals_model(self):
        s = scores(6)
        for gran in ("head", "layer"):
            sp = kve.SelectParams("global", gran, 10)
            want = kve.select_model(sp, s, N, W)
            for cuts in ([1, 3], [2], [1, 2, 3]):
                shards = np.split(s, cuts)
                got = kve.select_sharded(sp, shards, N, W)
                np.testing.assert_array_equal(got[0], want[0])
                np.testing.assert_array_equal(got[1], want[1])
        # the linked selection: each shard's own layers' links, added up by the caller
        rng = np.random.default_rng(8)
        vs = rng.standard_normal((L, H, N, 4)).astype(np.float32)
        vs[:, :, 1:] += 2 * vs[:, :, :-1]  # neighbours alike: runs of links
        sp = kve.SelectParams("global", "head", 6, post_pool_kind="forward", post_pool_kernel=3,
                              post_pool_decay=1.0)
        for cuts in ([], [1, 3], [1, 2]):  # one shard holding every layer, 2, 3
            links = np.zeros(N, np.float32)
            for part in np.split(np.arange(L), cuts):
                own = np.zeros(N, np.float32)
                for layer in part:
                    kve.accumulate_value_links(vs[layer], own)
                links += own
            want = kve.select_model(sp, s, N, W, links=links)
            got = kve.select_sharded(sp, np.split(s, cuts), N, W, links=links)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])
        self.assertFalse(np.array_equal(kve.select_model(sp, s, N, W)[1], want[1]))
        search = kve.ShardedSearch(kve.SelectParams("global", "head", 10), L, H, N, W)
        rounds = 0
        while not search.done:
            h = search.new_histogram()
            search.count(s, 0, h)
            search.step(h)
            rounds += 1
        self.assertLessEqual(rounds, 13)
        self.assertTrue(np.isfinite(search.threshold))
        with self.assertRaises(kve.KvevictError) as cm:
            kve.ShardedSearch(kve.SelectParams("ada", "head", 10), L, H, N, W)
        self.assertEqual(cm.exception.name, "KVE_ERR_INVALID_ARGUMENT")


class CompactTests(unittest.TestCase):
    def setUp(self):
        rng = np.random.default_rng(9)
        self.s = rng.random((L, H, P)).astype(np.float32)
        self.off, self.idx = kve.select_model(kve.SelectParams("ada", "head", 10), self.s, N, W)
        self.kept = kve.kept_lists(self.off, self.idx, L, H)
        self.kv = rng.standard_normal((H, N, 16)).astype(np.float32)

    def test_in_place_head_major(self):
        for l in range(L):
            kv = self.kv.copy()
            lengths = kve.compact_in_place(kv, self.off, self.idx, first_unit=l * H)
            for h in range(H):
                self.assertEqual(lengths[h], len(self.kept[l][h]))
                np.testing.assert_array_equal(kv[h, : lengths[h]], self.kv[h, self.kept[l][h]])
                np.testing.assert_array_equal(kv[h, lengths[h]:], self.kv[h, lengths[h]:])

    def test_in_place_strided_f16(self):
        rows = np.ascontiguousarray(self.kv.transpose(1, 0, 2)).astype(np.float16)  # [N, H, d]
        view = rows.transpose(1, 0, 2)
        lengths = kve.compact_in_place(view, self.off, self.idx, first_unit=H)
        for h in range(H):
            np.testing.assert_array_equal(view[h, : lengths[h]],
                                          self.kv[h, self.kept[1][h]].astype(np.float16))

    def test_token_rows(self):
        off, idx = kve.select_model(kve.SelectParams("uniform", "token", 10), self.s, N, W)
        keep = kve.kept_lists(off, idx, L, H)[0][0]
        rows = self.kv.transpose(1, 0, 2).reshape(N, H * 16).copy()  # llama.cpp [N, Hkv*d]
        orig = rows.copy()
        n = kve.compact_in_place(rows[None], off, idx)
        self.assertEqual(n.tolist(), [len(keep)])
        np.testing.assert_array_equal(rows[: len(keep)], orig[keep])

    def test_varlen(self):
        out, cu = kve.compact_varlen(self.kv, self.off, self.idx, first_unit=2 * H)
        self.assertEqual(cu.dtype, np.int32)
        want = np.concatenate([self.kv[h, self.kept[2][h]] for h in range(H)])
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(cu, np.cumsum([0] + [len(self.kept[2][h]) for h in range(H)]))
        bits = kve.to_bfloat16_bits(self.kv)
        outb, _ = kve.compact_varlen(kve.bfloat16(bits), self.off, self.idx, first_unit=2 * H)
        np.testing.assert_array_equal(outb, np.concatenate([bits[h, self.kept[2][h]] for h in range(H)]))

    def test_compaction_refuses_copies(self):
        with self.assertRaises(ValueError):
            kve.compact_in_place(self.kv.astype(np.float64), self.off, self.idx)
        with self.assertRaises(ValueError):
            kve.compact_in_place(self.kv[:, ::-1], self.off, self.idx)
        ro = self.kv.copy()
        ro.flags.writeable = False
        with self.assertRaises(ValueError):
            kve.compact_in_place(ro, self.off, self.idx)
        bad = self.idx.copy()
        bad[:2] = bad[1::-1]  # not ascending
        kv = self.kv.copy()
        with self.assertRaises(kve.KvevictError) as cm:
            kve.compact_in_place(kv, self.off, bad)
        self.assertEqual(cm.exception.name, "KVE_ERR_INVALID_ARGUMENT")
        np.testing.assert_array_equal(kv, self.kv)  # nothing moved


class BudgetTests(unittest.TestCase):
    def test_helpers(self):
        self.assertEqual(kve.budget_from_capacity(128, 32), 96)
        self.assertEqual(kve.budget_from_capacity(16, 32), 0)
        self.assertEqual(kve.budget_keep_ratio_total(1000, 32, 0.1), 68)
        self.assertEqual(kve.budget_keep_ratio_total(1000, 32, 0.01), 0)
        self.assertEqual(kve.budget_keep_ratio_prefix(1000, 32, 0.1), 96)
        self.assertEqual(kve.budget_keep_ratio_total(1000, 32, float("nan")), 0)

    def test_version(self):
        v = kve.version()
        self.assertRegex(v, r"^\d+\.\d+\.\d+")
        major, minor, patch = (int(x) for x in v.split(".")[:3])
        self.assertEqual(kve.version_number(), major * 10000 + minor * 100 + patch)
        self.assertTrue(kve.library_path().endswith(("libkvevict.so", ".dylib", ".dll")))


if __name__ == "__main__":
    unittest.main()
