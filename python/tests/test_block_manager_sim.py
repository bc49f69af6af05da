"""The block-manager simulation (python/examples/block_manager_sim.py) on a small pool:
eviction by kvevict.Evictor over the paged views really returns blocks (more sequences
run at once), every evictor slot is back after the run, decode-time cell budgets evict
growing sequences again and again and return their blocks,
the kept cells hold their positions' K/V after every compaction, no block is leaked or
released twice, and the pool's own checks catch a double free and a leak."""
import importlib.util
import os
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "block_manager_sim", os.path.join(HERE, "..", "examples", "block_manager_sim.py"))
sim = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sim)


class BlockManagerSimTests(unittest.TestCase):
    def test_eviction_returns_blocks(self):
        runs = {}
        for keep in (1.0, 0.1):
            s = sim.Sim(blocks=384, block_size=16, keep=keep, seed=1, verify_every=1)
            r = s.run(400, (256, 768), (8, 32))  # raises on a leak or a double free
            self.assertEqual(r["finished"], 400)
            self.assertEqual(len(s.pool.free), 384)
            self.assertEqual(s.ev is None, keep == 1.0)
            if s.ev is not None:
                self.assertEqual(sorted(s.slots), list(range(384)))
            runs[keep] = r
        self.assertEqual(runs[1.0]["blocks_freed_by_eviction"], 0)
        self.assertGreater(runs[0.1]["blocks_freed_by_eviction"], 0)
        self.assertEqual(runs[0.1]["verified"], runs[0.1]["admissions"])
        self.assertGreater(runs[0.1]["mean_running"], 3 * runs[1.0]["mean_running"])

    def test_decode_time_budget(self):
        # sequences that grow in decode, evicted down to the budget again and again: their
        # blocks go back at each round, the same pool holds more of them, nothing leaks
        runs = {}
        for budget in (None, (48, 32)):
            s = sim.Sim(blocks=160, block_size=16, keep=1.0, seed=2, verify_every=3,
                        budget=budget)
            r = s.run(120, (40, 120), (60, 200))
            self.assertEqual(r["finished"], 120)
            self.assertEqual(len(s.pool.free), 160)
            runs[budget] = r
        r = runs[(48, 32)]
        self.assertGreater(r["decode_rounds"], 120)  # several per sequence
        self.assertLessEqual(r["max_cells"], 49)  # one past HIGH, then evicted
        self.assertGreater(runs[None]["max_cells"], 150)
        self.assertGreater(r["verified"], 0)
        self.assertEqual(sorted(s.slots), list(range(160)))
        self.assertGreater(r["blocks_freed_by_eviction"], 0)
        self.assertGreater(r["mean_running"], 2 * runs[None]["mean_running"])

    def test_pool_catches_double_free_and_leaks(self):
        p = sim.BlockPool(8)
        a = p.alloc(1, 3)
        with self.assertRaises(sim.DoubleFree):
            p.release(2, a[:1])  # not its block
        p.release(1, a[:1])
        with self.assertRaises(sim.DoubleFree):
            p.release(1, a[:1])  # twice
        seq = sim.Seq(1, 10, 1)
        seq.blocks = a[1:2]  # a[2] is held by nobody: leaked
        with self.assertRaises(AssertionError):
            p.check([seq])
        self.assertIsNone(p.alloc(3, 7))  # 6 free


if __name__ == "__main__":
    unittest.main()
