"""kvevict.cuda.Evictor (the evictor's device form, ``kve_cuda_evictor_*``) against the host
kvevict.Evictor: the same configuration and inputs keep the same cells, round after round
(prefill observed through the query ring, then new cells appended and evicted again), and
compaction moves the same rows. Runs on the crate's ``cuda-emu`` build (the real kernels on
the CPU emulator, numpy memory registered as device memory: see test_cuda.py)."""
import ctypes
import unittest

import numpy as np

import kvevict as kve
from kvevict import cuda as kc

from test_cuda import Dev, aligned, require_emulator

L, HQ, HKV, D, DM, CAP = 2, 4, 2, 16, 24, 160
N0, GROW = 100, 40  # cells before the first round; cells appended before the second


def device_ints(p, n):
    """``n`` int32 at device pointer ``p`` (host memory under the emulator)."""
    return np.ctypeslib.as_array(ctypes.cast(p, ctypes.POINTER(ctypes.c_int32)), (n,)).copy()


class Model:
    """One model's K/V in two copies (host, fake device) of ``[L][Hkv, CAP, D]`` buffers."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.wo = (self.rng.standard_normal((L, HQ, D, DM)) / np.sqrt(DM)).astype(np.float32)
        self.hk = np.zeros((L, HKV, CAP, D), np.float32)
        self.hv = np.zeros_like(self.hk)
        self.dk, self.dv = self.hk.copy(), self.hv.copy()
        self.n = 0

    def grow(self, c):
        """Append ``c`` cells to both copies; returns each layer's queries ``[Hq, c, D]``."""
        s = slice(self.n, self.n + c)
        for buf_h, buf_d in ((self.hk, self.dk), (self.hv, self.dv)):
            x = self.rng.standard_normal((L, HKV, c, D)).astype(np.float32)
            buf_h[:, :, s], buf_d[:, :, s] = x, x
        self.n += c
        return self.rng.standard_normal((L, HQ, c, D)).astype(np.float32)


def pair(preset, **policy):
    cfg = dict(layers=L, hq=HQ, hkv=HKV, dk=D, d_model=DM, max_cells=CAP, **policy)
    host = kve.Evictor(preset, **cfg)
    _, dev_bytes = kc.Evictor.sizes(preset, **cfg)
    dev = kc.Evictor(preset, device_memory=Dev(aligned(dev_bytes)), **cfg)
    return host, dev


class DeviceEvictorTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        require_emulator()

    def rounds(self, preset, seed=0, **policy):
        host, dev = pair(preset, **policy)
        self.assertEqual(dev.requirements, host.requirements)
        need = host.requirements
        m = Model(seed)
        if need["wo"] == "once":
            for l in range(L):
                host.set_output_projection(l, m.wo[l])
                dev.set_output_projection(l, m.wo[l])
        evicted = 0
        for r, grow in enumerate((N0, GROW, GROW)):
            q = m.grow(grow)
            for l in range(L) if need["queries"] else ():
                host.observe_queries(0, l, q[l])
                dev.observe_queries(0, l, Dev(q[l]))
            n = m.n
            target = host.plan(0, n)
            self.assertEqual(dev.plan(0, n), target, f"{preset} round {r}")
            if target >= n:
                continue
            host.begin(0, n, target)
            dev.begin(0, n, target)
            for l in range(L):
                host.score_layer(0, l, m.hk[l][:, :n], m.hv[l][:, :n] if need["values"] else None)
                dev.score_layer(0, l, Dev(m.dk[l][:, :n]),
                                Dev(m.dv[l][:, :n]) if need["values"] else None)
            host.select(0)
            rect = dev.select(0)
            offsets, idx = host.kept_lists(0)
            counts_p, idx_p, ld = dev.kept_lists(0)
            counts = device_ints(counts_p, L * HKV)
            dev_idx = device_ints(idx_p, L * HKV * ld).reshape(L * HKV, ld)
            for u in range(L * HKV):
                want = idx[offsets[u]:offsets[u + 1]]
                self.assertEqual(counts[u], len(want), f"{preset} round {r} unit {u}")
                np.testing.assert_array_equal(dev_idx[u, :counts[u]], want,
                                              f"{preset} round {r} unit {u}")
                if rect is not None:
                    self.assertEqual(counts[u], rect, f"{preset} round {r}")
            for l in range(L):
                for hb, db in ((m.hk[l][:, :n], m.dk[l][:, :n]), (m.hv[l][:, :n], m.dv[l][:, :n])):
                    host.compact(0, l, hb)
                    dev.compact(0, l, Dev(db))
                    np.testing.assert_array_equal(db, hb, f"{preset} round {r} layer {l}")
            host.commit(0)
            dev.commit(0)
            evicted += 1
            hs, ds = host.stats(0), dev.stats(0)
            if rect is None:
                # a ragged selection: no further round; the device form, which reads no count
                # back, books the round's target as the cells (the host form: the largest list)
                self.assertTrue(ds["ragged"] and hs["ragged"], preset)
                self.assertEqual((ds["cells"], ds["evictions"]), (target, hs["evictions"]), preset)
                return evicted
            self.assertEqual(ds, hs, f"{preset} round {r}")
            m.n = rect
        return evicted

    def test_keeps_the_host_evictors_cells(self):
        for preset in ("snapkv", "lava", "laprox", "laprox-span", "streamingllm", "knorm",
                       "tova", "uniqueness"):
            for policy in ({"keep_ratio": 0.4, "min_keep": 16}, {"cells": (120, 90)}):
                with self.subTest(preset=preset, policy=policy):
                    self.assertGreater(self.rounds(preset, **policy), 0, preset)

    def test_value_links_keep_the_host_evictors_cells(self):
        for preset in ("laprox-span", "uniqueness"):
            with self.subTest(preset=preset):
                self.assertGreater(self.rounds(preset, link_threshold=kve.LINK_THRESHOLD,
                                               keep_ratio=0.4, min_keep=16), 0, preset)

    def test_token_granularity_takes_every_round(self):
        # token granularity is rectangular: three rounds commit, the cells shrink each time
        self.assertEqual(self.rounds("snapkv", granularity="token", keep_ratio=0.5, min_keep=8), 3)

    def test_refuses_what_stays_on_the_host(self):
        cfg = dict(layers=L, hq=HQ, hkv=HKV, dk=D, d_model=DM, max_cells=CAP)
        for preset, extra in (("criticalkv", {}),):
            with self.assertRaises(kve.KvevictError) as e:
                kc.Evictor.sizes(preset, **cfg, **extra)
            self.assertEqual(e.exception.name, "KVE_ERR_INVALID_ARGUMENT", preset)
        _, nbytes = kc.Evictor.sizes("snapkv", **cfg)
        with self.assertRaises(kve.KvevictError):  # a block too small
            kc.Evictor("snapkv", device_memory=Dev(aligned(nbytes - 256)), **cfg)
        with self.assertRaises(ValueError):  # a read-only block
            kc.Evictor("snapkv", device_memory=Dev(aligned(nbytes), readonly=True), **cfg)
        dev = kc.Evictor("snapkv", device_memory=Dev(aligned(nbytes)), **cfg)
        with self.assertRaises(kve.KvevictError) as e:
            dev.select(0)  # no round begun
        self.assertEqual(e.exception.name, "KVE_ERR_INVALID_ARGUMENT")


if __name__ == "__main__":
    unittest.main()
