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
