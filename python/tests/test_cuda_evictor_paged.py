"""kvevict.cuda.Evictor over paged pools in device memory (``score_layer_paged`` /
``compact_paged``, ``kve_cuda_evictor_*_paged``) against the host paged evictor
(kvevict.Evictor(paged=...)) and the device evictor on contiguous K/V: the same kept lists
round after round, the device pool compacted byte for byte as the host pool, the same
``blocks_freed``, and the compacted pool holding the contiguous path's rows. Hostile
tables and arrays: an exception naming the argument, the pools unchanged and the round
still good afterwards. Runs on the crate's ``cuda-emu`` build (the real kernels on the CPU
emulator, numpy memory registered as device memory: see test_cuda.py)."""
import unittest

import numpy as np

import kvevict as kve
from kvevict import cuda as kc

from test_cuda import Dev, aligned, require_emulator
from test_cuda_evictor import device_ints

L, HQ, HKV, D, DM = 2, 4, 2, 16, 24
N0, GROW, CAP = 60, 24, 96
KINDS = {"nhd": "nhd-kv-outer", "hnd": "hnd-kv-inner"}  # one K+V pool array per layer


def pool_shape(layout, nb, bs):
    return (2, nb, bs, HKV, D) if layout == "nhd" else (nb, 2, HKV, bs, D)


def as_storage(x, dtype):
    """float32 → the pool's storage (bfloat16 as uint16 bits, read with dtype='bfloat16')."""
    if dtype == "bfloat16":
        return kve.to_bfloat16_bits(x)
    return x.astype(dtype)


class Pools:
    """Each layer's K and V three times: a host pool, a device pool (the same blocks and
    table) and contiguous device ``[Hkv, CAP, D]`` arrays; noise in every unused slot."""

    def __init__(self, layout, dtype, bs, seed):
        self.layout, self.dtype, self.bs = layout, dtype, bs
        self.rng = np.random.default_rng(seed)
        used = -(-CAP // bs)
        nb = 2 * used + 1
        self.table = self.rng.permutation(nb)[:used].astype(np.int32)
        self.host = [as_storage(self.rng.standard_normal(pool_shape(layout, nb, bs)), dtype)
                     for _ in range(L)]
        self.dev = [p.copy() for p in self.host]
        self.flat = [[np.zeros((HKV, CAP, D), self.host[0].dtype) for _ in range(2)]
                     for _ in range(L)]
        self.n = 0

    def cache(self, which, l, kv):
        pool = (self.host if which == "host" else self.dev)[l]
        return kve.pool_tensor(pool, KINDS[self.layout], kv=kv)[0]

    def grow(self, c):
        """Append ``c`` cells everywhere; returns each layer's queries ``[Hq, c, D]``."""
        ts = np.arange(self.n, self.n + c)
        b, s = self.table[ts // self.bs], ts % self.bs
        for l in range(L):
            for kv in range(2):
                x = as_storage(self.rng.standard_normal((HKV, c, D)).astype(np.float32), self.dtype)
                self.flat[l][kv][:, self.n:self.n + c] = x
                for which in ("host", "dev"):
                    cache = self.cache(which, l, kv)
                    if self.layout == "nhd":
                        cache[b, s] = x.transpose(1, 0, 2)
                    else:
                        cache[b, :, s] = x.transpose(1, 0, 2)
        self.n += c
        return self.rng.standard_normal((L, HQ, c, D)).astype(np.float32)


def evictors(preset, dtype, **policy):
    """(host paged, device paged, device contiguous) evictors of one configuration."""
    cfg = dict(layers=L, hq=HQ, hkv=HKV, dk=D, d_model=DM, max_cells=CAP, **policy)
    pd = "float32" if dtype == np.float32 else ("float16" if dtype == np.float16 else dtype)
    host = kve.Evictor(preset, paged=pd, **cfg)
    out = [host]
    for paged in (pd, None):
        _, nbytes = kc.Evictor.sizes(preset, paged=paged, **cfg)
        out.append(kc.Evictor(preset, paged=paged, device_memory=Dev(aligned(nbytes)), **cfg))
    return out


class DevicePagedEvictorTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        require_emulator()

    def rounds(self, preset, layout, dtype, bs, seed=0, **policy):
        """Rounds until a ragged one (or two rounds); returns how many were committed."""
        tag = f"{preset} {layout} {dtype} bs {bs} {policy}"
        host, devp, devc = evictors(preset, dtype, **policy)
        need = host.requirements
        self.assertEqual(devp.requirements, need, tag)
        m = Pools(layout, dtype, bs, seed)
        dt = "bfloat16" if dtype == "bfloat16" else None
        wo = (m.rng.standard_normal((L, HQ, D, DM)) / np.sqrt(DM)).astype(np.float32)
        if need["wo"] == "once":
            for ev in (host, devp, devc):
                for l in range(L):
                    ev.set_output_projection(l, wo[l])
        done = 0
        for r, grow in enumerate((N0, GROW)):
            # queries in the pools' dtype (the device scorers read one dtype)
            q = as_storage(m.grow(grow), dtype)
            for l in range(L) if need["queries"] else ():
                host.observe_queries(0, l, kve.bfloat16(q[l]) if dt else q[l])
                devp.observe_queries(0, l, Dev(q[l]), dtype=dt)
                devc.observe_queries(0, l, Dev(q[l]), dtype=dt)
            n = m.n
            target = host.plan(0, n)
            self.assertEqual((devp.plan(0, n), devc.plan(0, n)), (target, target), tag)
            if target >= n:
                break
            for ev in (host, devp, devc):
                ev.begin(0, n, target)
            vals = need["values"]
            for l in range(L):
                host.score_layer_paged(0, l, m.cache("host", l, 0), m.table,
                                       m.cache("host", l, 1) if vals else None, layout=layout,
                                       dtype=dt)
                devp.score_layer_paged(0, l, Dev(m.cache("dev", l, 0)), m.table,
                                       Dev(m.cache("dev", l, 1)) if vals else None,
                                       layout=layout, dtype=dt)
                devc.score_layer(0, l, Dev(m.flat[l][0][:, :n]),
                                 Dev(m.flat[l][1][:, :n]) if vals else None, dtype=dt)
            host.select(0)
            rect = devp.select(0)
            self.assertEqual(devc.select(0), rect, tag)
            offsets, idx = host.kept_lists(0)
            counts = {}
            for name, ev in (("paged", devp), ("contiguous", devc)):
                cp, ip, ld = ev.kept_lists(0)
                c = device_ints(cp, L * HKV)
                di = device_ints(ip, L * HKV * ld).reshape(L * HKV, ld)
                for u in range(L * HKV):
                    want = idx[offsets[u]:offsets[u + 1]]
                    np.testing.assert_array_equal(di[u, :c[u]], want, f"{tag} {name} round {r} unit {u}")
                counts[name] = c
            for l in range(L):
                for kv in range(2):
                    fh = host.compact_paged(0, l, m.cache("host", l, kv), m.table, layout=layout,
                                            dtype=dt)
                    fd = devp.compact_paged(0, l, Dev(m.cache("dev", l, kv)), m.table,
                                            layout=layout, dtype=dt)
                    devc.compact(0, l, Dev(m.flat[l][kv][:, :n]), dtype=dt)
                    self.assertEqual(fd, fh if rect is not None else None, tag)
                    np.testing.assert_array_equal(m.dev[l].view(np.uint8), m.host[l].view(np.uint8),
                                                  f"{tag} round {r} layer {l} kv {kv}")
                    c = counts["paged"][l * HKV:(l + 1) * HKV]
                    g = kve.paged_gather(m.cache("dev", l, kv), m.table, int(c.max()),
                                         layout=layout, dtype=dt)
                    for h in range(HKV):
                        np.testing.assert_array_equal(
                            g[h, :c[h]].view(np.uint8), m.flat[l][kv][h, :c[h]].view(np.uint8),
                            f"{tag} round {r} layer {l} kv {kv} head {h}")
            for ev in (host, devp, devc):
                ev.commit(0)
            done += 1
            if rect is None:
                return done
            self.assertEqual(devp.stats(0), host.stats(0), tag)
            m.n = rect
        return done

    def test_presets_at_token_granularity(self):
        for preset in ("snapkv", "lava", "laprox", "laprox-span", "knorm", "tova", "uniqueness",
                       "streamingllm"):
            with self.subTest(preset=preset):
                self.assertEqual(self.rounds(preset, "nhd", np.float16, 16, granularity="token",
                                             cells=(50, 32)), 2)

    def test_layouts_dtypes_block_sizes(self):
        # the kernels take any block size (one block per token and head): 1, 4, 7 included
        for layout, dtype, bs in (("hnd", np.float32, 7), ("nhd", "bfloat16", 1),
                                  ("hnd", np.float16, 4), ("nhd", np.float32, 32)):
            with self.subTest(layout=layout, dtype=dtype, bs=bs):
                self.assertEqual(self.rounds("laprox", layout, dtype, bs, seed=bs,
                                             granularity="token", cells=(50, 40)), 2)

    def test_ragged_selection(self):
        # head granularity, the adaptive allocator: the counts stay on the device, compaction
        # still moves the host's rows; blocks_freed is unknown on the host (None)
        self.assertEqual(self.rounds("lava", "nhd", np.float32, 8, cells=(50, 40)), 1)

    def test_hostile_inputs_write_nothing(self):
        m = Pools("nhd", np.float16, 8, seed=5)
        m.grow(N0)
        host, devp, _ = evictors("snapkv", np.float16, granularity="token", cells=(50, 40))
        q = m.rng.standard_normal((L, HQ, N0, D)).astype(np.float16)
        for l in range(L):
            host.observe_queries(0, l, q[l])
            devp.observe_queries(0, l, Dev(q[l]))
        target = host.plan(0, N0)
        host.begin(0, N0, target)
        devp.begin(0, N0, target)
        before = [p.copy() for p in m.dev]
        k, v = Dev(m.cache("dev", 0, 0)), Dev(m.cache("dev", 0, 1))
        used = -(-N0 // 8)
        out_of_range = m.table.copy()
        out_of_range[2] = m.dev[0].shape[1]
        padded = m.table.copy()
        padded[used - 1] = -1  # int32 padding where a block is needed
        repeated = m.table.copy()
        repeated[3] = repeated[1]
        bad_tables = ((out_of_range, "KVE_ERR_OUT_OF_BOUNDS"), (padded, "KVE_ERR_OUT_OF_BOUNDS"),
                      (repeated, "KVE_ERR_ALIASING"), (m.table[:used - 1], "KVE_ERR_SHAPE_MISMATCH"))

        def unchanged(what):
            for l in range(L):
                np.testing.assert_array_equal(m.dev[l].view(np.uint8), before[l].view(np.uint8), what)

        for t, status in bad_tables:
            with self.assertRaises(kve.KvevictError, msg=status) as e:
                devp.score_layer_paged(0, 0, k, t, v)
            self.assertEqual(e.exception.name, status)
        f32 = Dev(np.zeros((4, 8, HKV, D), np.float32))
        with self.assertRaises(kve.KvevictError) as e:  # wider than the context's paged dtype
            devp.score_layer_paged(0, 0, f32, m.table, f32)
        self.assertEqual(e.exception.name, "KVE_ERR_INVALID_ARGUMENT")
        arg_errors = (
            (dict(keys=Dev(m.cache("dev", 0, 0)[0])), ValueError, "keys: expected a 4-D"),
            (dict(keys=Dev(m.dev[0])), ValueError, "keys: expected a 4-D"),  # the unsliced pool
            (dict(values=Dev(m.cache("dev", 0, 1)[::-1])), ValueError, "values: negative stride"),
            (dict(keys=Dev(m.cache("dev", 0, 0).astype(np.float64))), TypeError, "keys: unsupported typestr"),
            (dict(keys=Dev(m.cache("dev", 0, 0), strides=(1, 1, 1, 1))), ValueError, "keys: stride 1"),
            (dict(table=Dev(m.table)), TypeError, "table: a device array"),
            (dict(table=m.table.astype(np.float32)), ValueError, "table"),
            (dict(layout="thd"), ValueError, "layout"),
        )
        for kw, exc, msg in arg_errors:
            args = dict(keys=k, table=m.table, values=v)
            args.update(kw)
            with self.assertRaisesRegex(exc, msg):
                devp.score_layer_paged(0, 0, **args)
        unchanged("score_layer_paged refused")
        # the refusals left the round as it was: it completes as the host's
        for l in range(L):
            host.score_layer_paged(0, l, m.cache("host", l, 0), m.table, m.cache("host", l, 1))
            devp.score_layer_paged(0, l, Dev(m.cache("dev", l, 0)), m.table,
                                   Dev(m.cache("dev", l, 1)))
        host.select(0)
        self.assertIsNotNone(devp.select(0))
        for t, status in bad_tables:
            with self.assertRaises(kve.KvevictError, msg=status) as e:
                devp.compact_paged(0, 0, k, t)
            self.assertEqual(e.exception.name, status)
        ro = Dev(m.cache("dev", 0, 0), readonly=True)
        with self.assertRaisesRegex(ValueError, "cache: the array is read-only"):
            devp.compact_paged(0, 0, ro, m.table)
        with self.assertRaisesRegex(ValueError, "cache: expected a 4-D"):
            devp.compact_paged(0, 0, Dev(m.dev[0]), m.table)
        unchanged("compact_paged refused")
        for l in range(L):
            for kv in range(2):
                self.assertEqual(devp.compact_paged(0, l, Dev(m.cache("dev", l, kv)), m.table),
                                 host.compact_paged(0, l, m.cache("host", l, kv), m.table))
        for l in range(L):
            np.testing.assert_array_equal(m.dev[l], m.host[l])


if __name__ == "__main__":
    unittest.main()
