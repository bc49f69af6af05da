"""select_kept / score_model (the one-call path for eval/), and the library lookup."""
import os
import subprocess
import sys
import unittest

import numpy as np

import kvevict as kve

L, HQ, HKV, N, D, DM = 3, 6, 2, 70, 16, 40
W = 8


def model(seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((L, HQ, 16, D)).astype(np.float32)  # 16 captured window rows
    k = rng.standard_normal((L, HKV, N, D)).astype(np.float32)
    v = rng.standard_normal((L, HKV, N, D)).astype(np.float32)
    wo = (rng.standard_normal((L, HQ * D, DM)) / np.sqrt(DM)).astype(np.float32)  # design x·Wo
    return q, k, v, wo


class PipelineTests(unittest.TestCase):
    def setUp(self):
        self.q, self.k, self.v, self.wo = model()

    def check_shape(self, kept, counts=None):
        self.assertEqual(len(kept), L)
        for l in range(L):
            self.assertEqual(len(kept[l]), HKV)
            for h in range(HKV):
                a = kept[l][h]
                self.assertEqual(a.dtype, np.int64)
                self.assertTrue(np.all(np.diff(a) > 0))
                np.testing.assert_array_equal(a[-W:], np.arange(N - W, N))
                if counts is not None:
                    self.assertEqual(len(a), counts)

    def test_snapkv_equals_manual(self):
        kept = kve.select_kept("snapkv", self.q, self.k, keep_ratio=0.3, window=W)
        b = kve.budget_keep_ratio_total(N, W, 0.3)
        self.check_shape(kept, b + W)
        p = kve.ScoreParams.preset("snapkv", window=W)
        s = np.stack([kve.score_layer(p, self.q[l], self.k[l]) for l in range(L)])
        off, idx = kve.select_model(kve.SelectParams("uniform", "head", b), s, N, W)
        want = kve.kept_lists(off, idx, L, HKV)
        for l in range(L):
            for h in range(HKV):
                np.testing.assert_array_equal(kept[l][h], want[l][h])

    def test_every_preset_runs(self):
        for name in kve.PRESET_NAMES:
            w = 1 if name in ("tova", "tova-decay") else W
            kept = kve.select_kept(name, self.q, self.k, self.v, self.wo, capacity=20 + w, window=w)
            self.assertEqual(len(kept), L)
            total = sum(len(a) for row in kept for a in row)
            self.assertEqual(total, L * HKV * (20 + w), name)

    def test_value_links_option(self):
        # select_kept(value_links=t) = select_model(links=the values' sums, t)
        d = kve.select_kept("laprox-span", self.q, self.k, self.v, self.wo, budget=12, window=W,
                            details=True)
        links = np.zeros(self.k[0].shape[1], np.float32)
        for v in self.v:
            kve.accumulate_value_links(v, links)
        n = self.k[0].shape[1]
        for thr in (0.0, 0.5):
            got = kve.select_kept("laprox-span", self.q, self.k, self.v, self.wo, budget=12,
                                  window=W, value_links=thr)
            want = kve.kept_lists(*kve.select_model(d["select_params"], d["scores"], n, W,
                                                    links=links, link_threshold=thr), L, HKV)
            for l in range(L):
                for h in range(HKV):
                    np.testing.assert_array_equal(got[l][h], want[l][h])
        with self.assertRaises(ValueError):
            kve.select_kept("snapkv", self.q, self.k, budget=12, window=W, value_links=0.5)

    def test_laprox_gram_cache(self):
        cache = kve.GramCache()
        a = kve.select_kept("laprox", self.q, self.k, self.v, self.wo, budget=12, window=W,
                            gram_cache=cache)
        self.assertEqual((cache.misses, cache.hits, len(cache)), (L, 0, L))
        b = kve.select_kept("laprox", self.q, self.k, self.v, self.wo, budget=12, window=W,
                            gram_cache=cache, kernel=1)
        self.assertEqual((cache.misses, cache.hits), (L, L))
        c = kve.select_kept("laprox", self.q, self.k, self.v, self.wo, budget=12, window=W,
                            gram_cache=None)
        for l in range(L):
            for h in range(HKV):
                np.testing.assert_array_equal(a[l][h], c[l][h])
        self.assertNotEqual(sum(len(x) for r in b for x in r), 0)
        # per-layer arrays in a list rebuilt at each call: keyed on the arrays themselves
        cache2 = kve.GramCache()
        for _ in range(2):
            kve.select_kept("laprox", self.q, self.k, self.v, [w for w in self.wo], budget=12,
                            window=W, gram_cache=cache2)
        self.assertEqual((cache2.misses, cache2.hits), (L, L))  # fresh views of one array hit
        wos = [self.wo[l].copy() for l in range(L)]
        for _ in range(2):
            kve.select_kept("laprox", self.q, self.k, self.v, list(wos), budget=12, window=W,
                            gram_cache=cache2)
        self.assertEqual((cache2.misses, cache2.hits), (2 * L, 2 * L))
        # transposed views of PyTorch o_proj.weight arrays, rebuilt at each call, hit too
        o_proj = [np.ascontiguousarray(w.T) for w in wos]
        g = kve.GramCache()
        a = g.get([w.T for w in o_proj], 0, HQ, HKV, False)
        b = g.get([w.T for w in o_proj], 0, HQ, HKV, False)
        self.assertIs(a, b)
        np.testing.assert_array_equal(a, kve.compute_gram(wos[0], HKV, hq=HQ))
        # exact mode needs cross blocks: a separate cache entry
        kve.select_kept("laprox", self.q, self.k, self.v, self.wo, budget=12, window=W,
                        gram_cache=cache, laprox_gqa="exact")
        self.assertEqual(len(cache), 2 * L)

    def test_laprox_span_defaults_to_token_granularity(self):
        d = kve.select_kept("laprox-span", self.q, self.k, self.v, self.wo, keep_ratio=0.25,
                            window=W, details=True)
        self.assertEqual(d["select_params"].granularity, "token")
        self.assertEqual(d["select_params"].post_pool_kind, "forward")
        self.assertEqual(d["score_params"].pool_kernel, 1)
        kept = d["kept"]
        for l in range(L):
            for h in range(HKV):
                np.testing.assert_array_equal(kept[l][h], kept[0][0])
        self.assertEqual(d["scores"].shape, (L, HKV, N - W))
        # granularity override keeps the rest of laprox-span's selection
        d2 = kve.select_kept("laprox-span", self.q, self.k, self.v, self.wo, keep_ratio=0.25,
                             window=W, allocator="global", granularity="head", details=True)
        self.assertEqual(d2["select_params"].post_pool_kind, "none")

    def test_criticalkv_first_stage(self):
        d = kve.select_kept("criticalkv", self.q, self.k, self.v, self.wo, budget=20, window=W,
                            details=True)
        self.assertEqual(d["score_params"].critical_first_stage, max(int(0.5 * (20 + W)), 1) - W)
        d = kve.select_kept("criticalkv", self.q, self.k, self.v, self.wo, budget=20, window=W,
                            critical_first_stage=3, details=True)
        self.assertEqual(d["score_params"].critical_first_stage, 3)

    def test_lists_views_and_threads(self):
        qs = [self.q[l] for l in range(L)]
        ks = [self.k[l].transpose(1, 0, 2).copy().transpose(1, 0, 2) for l in range(L)]  # token-major
        vs = [self.v[l] for l in range(L)]
        wos = [self.wo[l] for l in range(L)]
        a = kve.select_kept("lava", self.q, self.k, self.v, keep_ratio=0.3, window=W)
        b = kve.select_kept("lava", qs, ks, vs, wos, keep_ratio=0.3, window=W, threads=2)
        for l in range(L):
            for h in range(HKV):
                np.testing.assert_array_equal(a[l][h], b[l][h])

    def test_budget_arguments(self):
        with self.assertRaises(ValueError):
            kve.select_kept("knorm", None, self.k, keep_ratio=0.2, budget=3)
        with self.assertRaises(ValueError):
            kve.select_kept("knorm", None, self.k)
        kept = kve.select_kept("knorm", None, self.k, keep_ratio=0.5, ratio_of="prefix", window=W)
        self.check_shape(kept, int((N - W) * 0.5) + W)
        kept = kve.select_kept("snapkv", self.q, self.k, budget=5, window=W, allocator="ada",
                               granularity="layer", alpha=0.5)
        self.check_shape(kept, 5 + W)


class LookupTests(unittest.TestCase):
    def run_py(self, env_lib):
        env = dict(os.environ)
        env["KVEVICT_LIB"] = env_lib
        code = "import kvevict; print(kvevict.library_path())"
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(kve.__file__))))

    def test_env_var_wins(self):
        path = kve.library_path()
        r = self.run_py(path)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), path)
        r = self.run_py(os.path.dirname(path))  # a folder holding the library
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), path)

    def test_env_var_missing_file_is_an_error(self):
        r = self.run_py("/nonexistent/libkvevict.so")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("KVEVICT_LIB", r.stderr)
        self.assertIn("LibraryNotFound", r.stderr)

    def test_candidates_order(self):
        origins = [o for o, _ in kve.candidate_paths()]
        self.assertEqual(origins[origins.index("bundled") + 1:], ["repo"] * (len(origins) - origins.index("bundled") - 1))


if __name__ == "__main__":
    unittest.main()
