"""kvevict.torch: every entry point over torch CPU tensors equals the numpy binding's result
on the same memory, bit for bit; the library reads and writes the tensors' own memory (no
copy: in-place writes land in the tensor, views keep their strides); bad tensors raise
naming the argument, with nothing written. Skipped where torch is not installed (the
plain Python step); scripts/test.d/22-torch.sh runs it with torch and fails on a skip."""
import unittest

import numpy as np

import kvevict as kve

try:
    import torch

    import kvevict.torch as kt
except ImportError as e:  # the plain binding venv has no torch
    torch = None
    SKIP = f"torch not installed ({e})"

L, HQ, HKV, N, D, DM = 3, 6, 2, 70, 16, 40


def model(seed=0, n=N):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(L, HQ, 64, D, generator=g)
    k = torch.randn(L, HKV, n, D, generator=g)
    v = torch.randn(L, HKV, n, D, generator=g)
    # o_proj.weight of each layer in PyTorch's layout [D_model, Hq*dv]: wo is its .T (a view)
    w = [torch.randn(DM, HQ * D, generator=g) / DM ** 0.5 for _ in range(L)]  # one per layer
    return q, k, v, w


def np_(t):
    return t.detach().numpy()


@unittest.skipIf(torch is None, "torch not installed")
class TorchTests(unittest.TestCase):
    def setUp(self):
        self.q, self.k, self.v, self.w = model()
        self.wo = [self.w[l].T for l in range(L)]  # [Hq*dv, D] strided views

    def eq(self, got, want, what=""):
        self.assertIsInstance(got, torch.Tensor, what)
        want = np.asarray(want)
        if want.dtype in (np.uint32, np.uint64):
            self.assertEqual(got.dtype, torch.int64, what)
        np.testing.assert_array_equal(got.numpy() if got.dtype != torch.bfloat16 else
                                      got.view(torch.int16).numpy(),
                                      want if want.dtype.name != "bfloat16" else want.view(np.int16), what)

    def test_views_share_memory(self):
        t = torch.randn(4, 10, 8).transpose(1, 2)  # non-contiguous
        a = kt.to_numpy(t)
        self.assertEqual(a.ctypes.data, t.data_ptr())
        self.assertEqual(a.strides, tuple(s * 4 for s in t.stride()))
        b = torch.randn(3, 5).to(torch.bfloat16)
        self.assertEqual(kt.to_numpy(b).ctypes.data, b.data_ptr())
        self.assertEqual(kt.to_numpy(b).dtype.name, "bfloat16")

    def test_score_layer_every_scorer_and_dtype(self):
        l = 1
        for preset in kve.PRESET_NAMES:
            p = kve.ScoreParams.preset(preset)
            kw_t, kw_n = {}, {}
            if p.scorer == "laprox":
                g = kt.compute_gram(self.wo[l], HKV, p.cross, hq=HQ)
                self.eq(g, kve.compute_gram(np_(self.wo[l]), HKV, p.cross, hq=HQ), "gram")
                kw_t["gram"], kw_n["gram"] = g, g.numpy()
            if p.scorer == "criticalkv":
                vl = kt.compute_value_l1(self.v[l], self.wo[l], hq=HQ)
                self.eq(vl, kve.compute_value_l1(np_(self.v[l]), np_(self.wo[l]), hq=HQ), "value_l1")
                kw_t["value_l1"], kw_n["value_l1"] = vl, vl.numpy()
            for dt in (torch.float32, torch.float16, torch.bfloat16):
                q, k, v = (x[l].to(dt) for x in (self.q, self.k, self.v))
                # token-major K and a transposed V: views, as engines hold them
                k = k.transpose(0, 1).contiguous().transpose(0, 1)
                v = v.transpose(1, 2).contiguous().transpose(1, 2)
                got = kt.score_layer(p, q, k, v, **kw_t)
                want = kve.score_layer(p, kt.to_numpy(q), kt.to_numpy(k), kt.to_numpy(v), **kw_n)
                self.eq(got, want, f"{preset} {dt}")

    def test_out_and_row_lse_and_value_forms(self):
        p = kve.ScoreParams.preset("laprox")
        g = kt.compute_gram(self.wo[0], HKV, False, hq=HQ)
        vf = kt.compute_value_forms(self.v[0], g, hq=HQ)
        self.eq(vf, kve.compute_value_forms(np_(self.v[0]), g.numpy(), hq=HQ), "value_forms")
        lse = kt.window_row_lse(self.q[0], self.k[0], p)
        self.eq(lse, kve.window_row_lse(np_(self.q[0]), np_(self.k[0]), p), "row_lse")
        out = torch.full((HKV, N - p.window), -1.0)
        got = kt.score_layer(p, self.q[0], self.k[0], value_forms=vf, row_lse=lse, out=out)
        self.assertIs(got, out)  # written in place, the caller's tensor returned
        self.eq(out, kve.score_layer(p, np_(self.q[0]), np_(self.k[0]), value_forms=vf.numpy(),
                                    row_lse=lse.numpy()), "out")

    def test_select_links_lists_and_sharded(self):
        p = kve.ScoreParams.preset("laprox-span")
        scores = kt.score_model(p, self.q, self.k, self.v, self.wo)
        self.eq(scores, kve.score_model(p, np_(self.q), np_(self.k), np_(self.v), [np_(w) for w in self.wo]))
        links = torch.zeros(N)
        for l in range(L):
            self.assertIs(kt.accumulate_value_links(self.v[l], links), links)
        want_links = np.zeros(N, np.float32)
        for l in range(L):
            kve.accumulate_value_links(np_(self.v[l]), want_links)
        self.eq(links, want_links, "links")
        sp = kve.SelectParams.laprox_span(budget=12)
        o, i = kt.select_model(sp, scores, N, p.window, links=links)
        wo_, wi = kve.select_model(sp, scores.numpy(), N, p.window, links=want_links)
        self.eq(o, wo_, "offsets")
        self.eq(i, wi, "indices")
        kept = kt.kept_lists(o, i, L, HKV)
        self.eq(kept[2][1], kve.kept_lists(wo_, wi, L, HKV)[2][1], "kept_lists")
        self.eq(kt.evicted_positions(kept[0][0][kept[0][0] < N - p.window], N - p.window),
                kve.evicted_positions(kve.kept_lists(wo_, wi, L, HKV)[0][0][:-p.window], N - p.window))
        gp = kve.SelectParams("global", "head", 12)
        so, si = kt.select_sharded(gp, [scores[:1], scores[1:]], N, p.window)
        self.eq(so, kve.select_model(gp, scores.numpy(), N, p.window)[0], "sharded offsets")
        s = kt.ShardedSearch(gp, L, HKV, N, p.window)
        while not s.done:
            h = s.new_histogram()
            s.count(scores, 0, h)
            s.step(h)
        self.eq(s.select(scores, 0)[1], si, "ShardedSearch")

    def test_select_kept_lists_and_gram_cache_hits(self):
        for preset in ("laprox", "lava", "laprox-span", "uniqueness", "criticalkv"):
            got = kt.select_kept(preset, self.q, self.k, self.v, self.wo, keep_ratio=0.3)
            want = kve.select_kept(preset, np_(self.q), np_(self.k), np_(self.v),
                                   [np_(w) for w in self.wo], keep_ratio=0.3)
            for l in range(L):
                for h in range(HKV):
                    self.eq(got[l][h], want[l][h], f"{preset} {l} {h}")
        cache = kt.gram_cache
        hits = cache.hits
        kt.select_kept("laprox", self.q, list(self.k), list(self.v), [self.w[l].T for l in range(L)],
                       keep_ratio=0.2)  # fresh views of the same memory: hits
        self.assertEqual(cache.hits, hits + L)
        self.w[0].mul_(2.0)  # an in-place edit: the version counter changes, a miss
        misses = cache.misses
        kt.select_kept("laprox", self.q, self.k, self.v, [self.w[l].T for l in range(L)], keep_ratio=0.2)
        self.assertEqual(cache.misses, misses + 1)

    def test_compaction_in_place(self):
        sp = kve.SelectParams("global", "head", 20)
        lava = kve.ScoreParams.preset("lava")
        scores = kt.score_model(lava, self.q, self.k, self.v)
        o, i = kt.select_model(sp, scores, N, lava.window)
        for dt in (torch.float32, torch.bfloat16):
            kv = self.k[1].to(dt).transpose(1, 2).contiguous().transpose(1, 2)  # strided view
            ref = kt.to_numpy(kv).copy()
            lens = kt.compact_in_place(kv, o, i, first_unit=HKV)
            want = kve.compact_in_place(ref, o.numpy(), i.numpy(), first_unit=HKV)
            self.eq(lens, want, "lengths")
            self.eq(kv, ref, f"compacted {dt}")  # the tensor itself was written
            dst, cu = kt.compact_varlen(self.v[1].to(dt), o, i, first_unit=HKV)
            wd, wc = kve.compact_varlen(kt.to_numpy(self.v[1].to(dt)), o.numpy(), i.numpy(), first_unit=HKV)
            self.eq(dst, wd, "varlen")
            self.eq(cu, wc, "cu_seqlens")

    def test_paged(self):
        bs, nb = 8, 12
        pool = torch.randn(2, nb, bs, HKV, D)  # vLLM FlashAttention [2, nb, bs, H, d]
        table = torch.randperm(nb, dtype=torch.int32)
        cache, layout = kt.pool_tensor(pool, "nhd-kv-outer", kv=0)
        self.assertEqual(cache.data_ptr(), pool.data_ptr())
        g = kt.paged_gather(cache, table, N, layout=layout)
        self.eq(g, kve.paged_gather(np_(pool)[0], table.numpy(), N, layout=layout))
        sp = kve.SelectParams.laprox_span(budget=20)
        span = kve.ScoreParams.preset("laprox-span")
        scores = kt.score_model(span, self.q, self.k, self.v, self.wo)
        o, i = kt.select_model(sp, scores, N, span.window)
        ref = np_(pool).copy()
        freed, kept, lengths = kt.paged_compact(cache, table, N, o, i, layout=layout, shared=True)
        wf, wk, wl = kve.paged_compact(ref[0], table.numpy(), N, o.numpy(), i.numpy(), layout=layout, shared=True)
        self.assertEqual(freed, wf)
        self.assertGreater(freed, 0)
        self.eq(kept, wk)
        self.eq(lengths, wl)
        self.eq(pool, ref, "pool compacted in place")

    def test_stream_scorer(self):
        s, r = kt.StreamScorer(HQ, HKV, N, D), kve.StreamScorer(HQ, HKV, N, D)
        pos = torch.arange(N - 64, N)
        s.feed(self.q[0], pos, self.k[0])
        r.feed(np_(self.q[0]), pos.numpy(), np_(self.k[0]))
        self.eq(s.scores("mean"), r.scores("mean"))
        snap = s.state.clone()
        self.assertIsInstance(snap, torch.Tensor)
        s.feed(self.q[1][:, -1:], [N], self.k[0])
        s.state = snap
        self.eq(s.scores("max"), r.scores("max"), "state restored from a tensor")

    def test_evictor(self):
        kw = dict(layers=L, hq=HQ, hkv=HKV, dk=D, d_model=DM, max_cells=N, keep_ratio=0.3, min_keep=8)
        a, b = kt.Evictor("laprox", **kw), kve.Evictor("laprox", **kw)
        for l in range(L):
            a.set_output_projection(l, self.wo[l])
            b.set_output_projection(l, np_(self.wo[l]))
        ka = a.evict(0, list(self.k), list(self.v), list(self.q))
        kb = b.evict(0, np_(self.k), np_(self.v), np_(self.q))
        for l in range(L):
            for h in range(HKV):
                self.eq(ka[l][h], kb[l][h], f"evictor {l} {h}")
        kv = self.k[0].clone()
        ref = np_(kv).copy()
        a.compact(0, 0, kv)
        b.compact(0, 0, ref)
        self.eq(kv, ref, "Evictor.compact")
        self.eq(a.evicted_cells(0), b.evicted_cells(0))

    def test_paged_evictor(self):
        """Evictor(paged=...) over a torch vLLM pool: the numpy evictor's kept lists and
        compacted pool (the torch pool written in place)."""
        bs, nb = 8, 2 * (-(-N // 8)) + 1
        pool = torch.randn(2, nb, bs, HKV, D)  # [2, nb, bs, H, d]
        table = torch.randperm(nb, dtype=torch.int32)
        kw = dict(layers=L, hq=HQ, hkv=HKV, dk=D, d_model=DM, max_cells=N, granularity="token",
                  paged=True)
        a, b = kt.Evictor("laprox-span", **kw), kve.Evictor("laprox-span", **kw)
        ref = np_(pool).copy()
        w = a.requirements["window"]
        for ev in (a, b):
            ev.begin(0, N, 40)
        for l in range(L):
            a.set_output_projection(l, self.wo[l])
            b.set_output_projection(l, np_(self.wo[l]))
            q = self.q[l][:, -w:]
            kc, layout = kt.pool_tensor(pool, "nhd-kv-outer", kv=0)
            vc, _ = kt.pool_tensor(pool, "nhd-kv-outer", kv=1)
            a.score_layer_paged(0, l, kc, table, vc, q, layout=layout)
            b.score_layer_paged(0, l, ref[0], table.numpy(), ref[1], np_(q), layout=layout)
        a.select(0)
        b.select(0)
        self.eq(a.kept_cells(0), b.kept_cells(0))
        kc, layout = kt.pool_tensor(pool, "nhd-kv-outer", kv=0)
        freed = a.compact_paged(0, 0, kc, table, layout=layout)
        self.assertEqual(freed, b.compact_paged(0, 0, ref[0], table.numpy(), layout=layout))
        self.assertGreater(freed, 0)
        self.eq(pool, ref, "pool compacted in place")

    # ------------------------------------------------------------------- bad input
    def assert_refused(self, exc, name, fn, *args, watch=None, **kwargs):
        before = None if watch is None else watch.clone()
        with self.assertRaises(exc) as e:
            fn(*args, **kwargs)
        self.assertIn(name, str(e.exception))
        if watch is not None:
            self.assertTrue(torch.equal(watch, before), f"{name}: written despite the error")
        return e.exception

    def test_bad_tensors_named_nothing_written(self):
        q, k, v = self.q[0], self.k[0], self.v[0]
        self.assert_refused(TypeError, "keys", kt.score_layer, "lava", q, k.double(), v)
        self.assert_refused(TypeError, "values", kt.score_layer, "lava", q, k, v.to(torch.int32))
        self.assert_refused(ValueError, "queries", kt.score_layer, "lava", q.to("meta"), k, v)
        self.assert_refused(TypeError, "keys", kt.score_layer, "lava", q, k.to_sparse(), v)
        self.assert_refused(TypeError, "scores", kt.select_model, kve.SelectParams(budget=4),
                            torch.zeros(1, HKV, N - 32, dtype=torch.float16), N, 32)
        sp = kve.SelectParams("global", "head", 20)
        lava = kve.ScoreParams.preset("lava")
        o, i = kt.select_model(sp, kt.score_model(lava, self.q, self.k, self.v), N, lava.window)
        kv = self.k[0].clone()
        # a later argument refused: the cache is untouched
        self.assert_refused(TypeError, "indices", kt.compact_in_place, kv, o, i.float(), watch=kv)
        self.assert_refused(TypeError, "kv", kt.compact_in_place, kv.double(), o, i)
        # an expanded (overlapping) output
        row = torch.randn(1, N, D)
        self.assert_refused(ValueError, "kv", kt.compact_in_place, row.expand(HKV, N, D), o, i,
                            watch=row)
        leaf = torch.randn(HKV, N, D, requires_grad=True)
        self.assert_refused(ValueError, "kv", kt.compact_in_place, leaf, o, i)
        links = torch.zeros(N, dtype=torch.float64)
        self.assert_refused(TypeError, "links", kt.accumulate_value_links, v, links, watch=links)
        pool = torch.randn(4, 8, HKV, D)
        self.assert_refused(TypeError, "cache", kt.paged_gather, pool.double(), [0, 1], 10)
        self.assert_refused(TypeError, "table", kt.paged_gather, pool, torch.tensor([0.0, 1.0]), 10)
        # library checks still apply through the wrapper (nothing written)
        with self.assertRaises(kve.KvevictError) as e:
            kt.paged_gather(pool, torch.tensor([0, 0], dtype=torch.int32), 10)
        self.assertEqual(e.exception.name, "KVE_ERR_ALIASING")

    def test_device_forms_refuse_host_tensors_and_missing_cuda(self):
        sp, scores = kve.SelectParams(budget=4), torch.zeros(1, HKV, N - 32)
        self.assert_refused(ValueError, "scores", kt.cuda.select_model, sp, scores, N, 32)
        kv = self.k[0].clone()
        self.assert_refused(ValueError, "kv", kt.cuda.compact_in_place, kv,
                            torch.zeros(HKV, N, dtype=torch.int32), torch.full((HKV,), 3, dtype=torch.int32),
                            3, watch=kv)
        if kve.cuda.built_with_cuda():
            return
        kt._HOST_DEVICE = True  # past the device check: the library's lack of CUDA is named
        try:
            e = self.assert_refused(kve.KvevictError, "scores", kt.cuda.select_model, sp, scores, N, 32)
            self.assertEqual(e.name, "KVE_ERR_NOT_BUILT_WITH_CUDA")
            e = self.assert_refused(kve.KvevictError, "keys", kt.cuda.score_layer, "lava",
                                    self.q[0], self.k[0], self.v[0])
            self.assertEqual(e.name, "KVE_ERR_NOT_BUILT_WITH_CUDA")
        finally:
            kt._HOST_DEVICE = False

if __name__ == "__main__":
    unittest.main()
