"""kvevict.torch's device forms (kvevict.torch.cuda, and kvevict.torch.score_layer /
accumulate_value_links on CUDA tensors): tensors handed to the kve_cuda_* entry points
through data_ptr() and strides, outputs and workspaces allocated by torch, against the host
entry points.

No GPU here: run against the cuda-emu build (the real kernels on the CPU emulator), told to
take host memory as device memory (kve_emu_host_memory_as_device(1)), with CPU tensors
standing in for CUDA ones (kvevict.torch._HOST_DEVICE); scripts/test.d/22-torch.sh runs it so
(KVEVICT_LIB=target/release/libkvevict.so built with cuda-emu, KVEVICT_TORCH_HOST_DEVICE=1).
Skipped otherwise: a real CUDA build would get host pointers. What this proves: the plumbing
(pointers, element strides of views, dtypes, output shapes, workspace sizes, the lists'
layout) and the kernels' results through it.
"""
import os
import unittest

import numpy as np

import kvevict as kve

try:
    import torch

    import kvevict.torch as kt
except ImportError:
    torch = None

from kvevict import _lib

# the emulator's switch (feature cuda-emu only; a real CUDA build lacks it)
_AS_DEVICE = getattr(_lib.lib, "kve_emu_host_memory_as_device", None)
ON = (torch is not None and os.environ.get("KVEVICT_TORCH_HOST_DEVICE") == "1"
      and kve.cuda.built_with_cuda() and _AS_DEVICE is not None)
L, HQ, HKV, N, D, DM = 2, 6, 2, 70, 16, 40


@unittest.skipUnless(ON, "needs torch, the cuda-emu library and KVEVICT_TORCH_HOST_DEVICE=1")
class TorchDeviceFormTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        _AS_DEVICE(1)
        kt._HOST_DEVICE = True

    @classmethod
    def tearDownClass(cls):
        kt._HOST_DEVICE = False
        _AS_DEVICE(0)

    def setUp(self):
        g = torch.Generator().manual_seed(3)
        self.q = torch.randn(L, HQ, 64, D, generator=g)
        self.k = torch.randn(L, HKV, N, D, generator=g)
        self.v = torch.randn(L, HKV, N, D, generator=g)
        self.wo = [(torch.randn(DM, HQ * D, generator=g) / DM ** 0.5).T for _ in range(L)]

    def close(self, got, want, what, rtol=1e-5):
        got, want = got.double(), torch.as_tensor(np.asarray(want)).double()
        self.assertEqual(tuple(got.shape), tuple(want.shape), what)
        err = ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
        self.assertLessEqual(err, rtol, f"{what}: {err:.2e}")

    def test_score_layer(self):
        for preset in ("snapkv", "snapkv-kvpress", "lava", "laprox", "laprox-span", "uniqueness",
                       "criticalkv", "knorm"):
            p = kve.ScoreParams.preset(preset)
            kw = {}
            if p.scorer == "laprox":
                kw["gram"] = kt.compute_gram(self.wo[0], HKV, p.cross, hq=HQ)
            if p.scorer == "criticalkv":
                kw["value_l1"] = kt.compute_value_l1(self.v[0], self.wo[0], hq=HQ)
            for dt in (torch.float32, torch.float16, torch.bfloat16):
                q, k, v = (x[0].to(dt) for x in (self.q, self.k, self.v))
                k = k.transpose(0, 1).contiguous().transpose(0, 1)  # token-major K
                v = v.transpose(1, 2).contiguous().transpose(1, 2)  # transposed V
                want = kt.score_layer(p, q, k, v, **kw)
                got = kt.cuda.score_layer(p, q, k, v, **kw)
                self.close(got, want, f"{preset} {dt}")

    def test_select_then_compact(self):
        span = kve.ScoreParams.preset("laprox-span")
        scores = kt.score_model(span, self.q, self.k, self.v, self.wo)
        links = torch.zeros(N)
        dlinks = torch.zeros(N)
        for l in range(L):
            kt.accumulate_value_links(self.v[l], links)
            self.assertIs(kt.cuda.accumulate_value_links(self.v[l], dlinks), dlinks)
        self.close(dlinks, links, "links")
        for sp, lk in ((kve.SelectParams("global", "head", 20), None),
                       (kve.SelectParams.laprox_span(budget=20), links)):
            o, i = kt.select_model(sp, scores, N, span.window, links=lk)
            kept = kt.kept_lists(o, i, L, HKV)
            counts, idx = kt.cuda.select_model(sp, scores, N, span.window, links=lk)
            self.assertEqual((counts.dtype, idx.dtype), (torch.int32, torch.int32))
            for l in range(L):
                for h in range(HKV):
                    u = l * HKV + h
                    self.assertTrue(torch.equal(idx[u, : counts[u]].long(), kept[l][h]), f"unit {u}")
            for l in range(L):
                rows = slice(l * HKV, (l + 1) * HKV)
                mk = int(counts[rows].max())
                for dt in (torch.float32, torch.bfloat16):
                    kv = self.k[l].to(dt).transpose(1, 2).contiguous().transpose(1, 2)
                    ref = kv.clone()
                    kt.compact_in_place(ref, o, i, first_unit=l * HKV)
                    self.assertIs(kt.cuda.compact_in_place(kv, idx[rows], counts[rows], mk), kv)
                    for h in range(HKV):
                        c = int(counts[l * HKV + h])
                        self.assertTrue(torch.equal(kv[h, :c], ref[h, :c]), f"layer {l} head {h} {dt}")
                    dst, cu = kt.cuda.compact_varlen(self.v[l], idx[rows], counts[rows])
                    wd, wc = kt.compact_varlen(self.v[l], o, i, first_unit=l * HKV)
                    self.assertTrue(torch.equal(cu.long(), wc))
                    self.assertTrue(torch.equal(dst[: int(cu[-1])], wd))

    def test_paged_evictor_every_pool_kind(self):
        """kt.cuda.Evictor(paged=...) over vLLM (K and V separate, stacked), FlashInfer NHD
        / HND and TensorRT-LLM pools: the host kt.Evictor's kept lists, blocks freed and
        compacted pool (the torch pool written in place)."""
        bs, nb = 8, 2 * (-(-N // 8)) + 1
        shapes = {"nhd": (nb, bs, HKV, D), "nhd-kv-outer": (2, nb, bs, HKV, D),
                  "nhd-kv-inner": (nb, 2, bs, HKV, D), "hnd-kv-inner": (nb, 2, HKV, bs, D),
                  "trtllm": (nb, L, 2, HKV, bs, D)}
        g = torch.Generator().manual_seed(30)
        for kind, dt in (("nhd", torch.float16), ("nhd-kv-outer", torch.bfloat16),
                         ("nhd-kv-inner", torch.float32), ("hnd-kv-inner", torch.float16),
                         ("trtllm", torch.bfloat16)):
            n_pools = 1 if kind == "trtllm" else L
            pools = [[torch.randn(shapes[kind], generator=g).to(dt)
                      for _ in range(2 if kind == "nhd" else 1)] for _ in range(n_pools)]
            refs = [[p.clone() for p in ps] for ps in pools]
            table = torch.randperm(nb, generator=g).to(torch.int32)

            def caches(ps, l):
                if kind == "nhd":
                    return [kt.pool_tensor(ps[l][kv], "nhd") for kv in (0, 1)]
                if kind == "trtllm":
                    return [kt.pool_tensor(ps[0][0], kind, kv=kv, layer=l) for kv in (0, 1)]
                return [kt.pool_tensor(ps[l][0], kind, kv=kv) for kv in (0, 1)]

            pd = {torch.float32: "float32", torch.float16: "float16",
                  torch.bfloat16: "bfloat16"}[dt]
            kw = dict(layers=L, hq=HQ, hkv=HKV, dk=D, d_model=DM, max_cells=N,
                      granularity="token", paged=pd)
            host = kt.Evictor("laprox-span", **kw)
            dev = kt.cuda.Evictor("laprox-span", device="cpu", **kw)
            w = host.requirements["window"]
            for ev in (host, dev):
                ev.begin(0, N, 30)
            for l in range(L):
                q = self.q[l][:, -w:].to(dt)
                for ev, ps in ((host, refs), (dev, pools)):
                    ev.set_output_projection(l, self.wo[l])
                    (kc, layout), (vc, _) = caches(ps, l)
                    ev.score_layer_paged(0, l, kc, table, vc, q, layout=layout)
            host.select(0)
            self.assertEqual(dev.select(0), 30, kind)
            offsets, indices = host.kept_lists(0)
            counts, idx = dev.kept_lists(0)
            for u in range(L * HKV):
                want = indices[int(offsets[u]):int(offsets[u + 1])]
                self.assertTrue(torch.equal(idx[u, :counts[u]].long(), want), f"{kind} unit {u}")
            for l in range(L):
                for kv in (0, 1):
                    hc, layout = caches(refs, l)[kv]
                    dc, _ = caches(pools, l)[kv]
                    freed = dev.compact_paged(0, l, dc, table, layout=layout)
                    self.assertEqual(freed, host.compact_paged(0, l, hc, table, layout=layout))
                    self.assertEqual(freed, -(-N // bs) - (-(-30 // bs)), kind)
            for ps, rs in zip(pools, refs):
                for p, r in zip(ps, rs):
                    self.assertTrue(torch.equal(p.view(torch.uint8), r.view(torch.uint8)), kind)

    def test_paged_evictor_refusals(self):
        bs, nb = 8, 2 * (-(-N // 8)) + 1
        pool = torch.randn(2, nb, bs, HKV, D, dtype=torch.float16)
        before = pool.clone()
        table = torch.randperm(nb, dtype=torch.int32)
        dev = kt.cuda.Evictor("snapkv", device="cpu", layers=L, hq=HQ, hkv=HKV, dk=D,
                              max_cells=N, granularity="token", paged="float16")
        dev.begin(0, N, 30)
        kc, layout = kt.pool_tensor(pool, "nhd-kv-outer", kv=0)
        vc, _ = kt.pool_tensor(pool, "nhd-kv-outer", kv=1)
        q = self.q[0][:, -32:].half()
        bad = table.clone()
        bad[1] = bad[0]
        cases = ((TypeError, "keys", dict(keys=kc.double())),
                 (TypeError, "values", dict(values=vc.to(torch.int16))),
                 (ValueError, "keys", dict(keys=kc.to("meta"))),
                 (ValueError, "table", dict(table=table.to("meta"))),
                 (TypeError, "table", dict(table=table.float())),
                 (ValueError, "keys: expected a 4-D", dict(keys=pool)),
                 (kve.KvevictError, "KVE_ERR_ALIASING", dict(table=bad)),
                 (kve.KvevictError, "KVE_ERR_SHAPE_MISMATCH", dict(table=table[:3])))
        for exc, name, kw in cases:
            args = dict(keys=kc, table=table, values=vc, queries=q)
            args.update(kw)
            with self.assertRaises(exc, msg=name) as e:
                dev.score_layer_paged(0, 0, **args)
            self.assertIn(name, str(e.exception))
        self.assertTrue(torch.equal(pool, before))
        dev.score_layer_paged(0, 0, kc, table, vc, q)
        dev.score_layer_paged(0, 1, kc, table, vc, q)
        dev.select(0)
        for exc, name, cache, t in ((ValueError, "cache", kc[:1].expand(nb, bs, HKV, D), table),
                                    (kve.KvevictError, "KVE_ERR_OUT_OF_BOUNDS", kc,
                                     torch.full((nb,), nb, dtype=torch.int32))):
            with self.assertRaises(exc) as e:
                dev.compact_paged(0, 0, cache, t)
            self.assertIn(name, str(e.exception))
        self.assertTrue(torch.equal(pool, before))

    def test_refusals(self):
        with self.assertRaises(TypeError) as e:
            kt.cuda.score_layer("lava", self.q[0], self.k[0].double(), self.v[0])
        self.assertIn("keys", str(e.exception))
        with self.assertRaises(ValueError) as e:
            kt.cuda.compact_in_place(self.k[0][:1].expand(HKV, N, D), torch.zeros(HKV, N, dtype=torch.int32),
                                     torch.ones(HKV, dtype=torch.int32), 1)
        self.assertIn("kv", str(e.exception))


if __name__ == "__main__":
    unittest.main()
