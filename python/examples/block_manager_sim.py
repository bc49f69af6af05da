"""A CPU simulation of a vLLM-style block manager driven by kvevict (issue 30, item 5).

A pool of fixed-size blocks (every layer's K and V of a token in one block slot, vLLM's
"a block holds every KV head"), sequences arriving in a queue, admission while the pool
has room for a prompt, one decode token per running sequence per step (a new block when
the last one is full; preemption by recomputation, the youngest first, when none is
free), blocks released when a sequence finishes. With eviction (keep ratio r < 1), at
the end of each prefill, one-shot (kvpress / TensorRT-LLM ``on_context_step_end``
style), kvevict's stage API scores the prompt through the paged views (``paged_gather``
of every layer's K and V from the pool, ``score_layer`` with LaProx-span, one token
set for the model: ``select_model`` at token granularity), compacts every layer's K and V
in place in the sequence's own blocks (``paged_compact``) and the trailing blocks go
back to the pool. Decode tokens continue at the original positions
(``kept_positions``).

Checked all along: the pool's free list and the sequences' tables partition the blocks
(no block leaked, none owned twice, a release of a block the sequence does not own is a
double free and raises); after compaction the kept cells hold exactly the K/V written for
their original positions (every ``--verify-every``-th admission); after the run drained,
every block is free again.

Reported per keep ratio: admissions, preemptions, the mean number of running sequences
(over the steps where the queue was not empty: the pool is the limit) and that mean
relative to no eviction. The evictor (the simple API, issue 26) was not on a branch with
a C API / Python binding when this was written: the stage API drives it.

    PYTHONPATH=python python3 python/examples/block_manager_sim.py --admissions 10000
"""
import argparse
import collections
import sys
import time

import numpy as np

import kvevict as kve

L, HQ, HKV, D, DM, W = 2, 4, 2, 16, 32, 8


class DoubleFree(AssertionError):
    pass


class BlockPool:
    """The block allocator: a free list and each block's owner (-1: free)."""

    def __init__(self, n):
        self.n = n
        self.free = collections.deque(range(n))
        self.owner = np.full(n, -1, np.int64)

    def alloc(self, seq, k):
        if len(self.free) < k:
            return None
        ids = [self.free.popleft() for _ in range(k)]
        for b in ids:
            if self.owner[b] != -1:
                raise AssertionError(f"block {b} on the free list but owned by {self.owner[b]}")
            self.owner[b] = seq
        return ids

    def release(self, seq, ids):
        for b in ids:
            if self.owner[b] != seq:
                raise DoubleFree(f"sequence {seq} releases block {b} owned by {self.owner[b]}")
            self.owner[b] = -1
            self.free.append(b)

    def check(self, running):
        held = [b for s in running for b in s.blocks]
        if len(held) + len(self.free) != self.n or len(set(held) | set(self.free)) != self.n:
            raise AssertionError(f"blocks leaked or shared: {len(held)} held + {len(self.free)} "
                                 f"free != {self.n}")
        for s in running:
            if np.any(self.owner[s.blocks] != s.id):
                raise AssertionError(f"sequence {s.id} holds a block it does not own")


class Seq:
    def __init__(self, sid, prompt, out):
        self.id, self.prompt, self.out = sid, prompt, out
        self.reset()

    def reset(self):
        self.blocks, self.n, self.generated = [], 0, 0
        self.positions = np.zeros(0, np.uint32)
        self.next_pos = 0


class Sim:
    def __init__(self, blocks, block_size, keep, seed, verify_every=0):
        self.bs, self.keep, self.verify_every = block_size, keep, verify_every
        self.pool = BlockPool(blocks)
        rng = np.random.default_rng(seed)
        self.rng = rng
        # every layer's K and V: [blocks, 2, bs, Hkv, d] (FlashInfer / vLLM FlashInfer layout)
        self.kv = [np.zeros((blocks, 2, block_size, HKV, D), np.float16) for _ in range(L)]
        self.phase = rng.standard_normal((L, 2, HKV, D)).astype(np.float32)
        self.freq = rng.uniform(0.01, 0.5, (L, 2, HKV, D)).astype(np.float32)
        self.params = kve.ScoreParams("laprox-span")
        wo = [(rng.standard_normal((HQ, D, DM)) / np.sqrt(DM)).astype(np.float32) for _ in range(L)]
        self.gram = [kve.compute_gram(w, HKV) for w in wo]
        self.stats = collections.Counter({k: 0 for k in (
            "admissions", "finished", "preemptions", "blocks_freed_by_eviction", "tokens_evicted",
            "verified")})

    def values(self, seq, l, kv, pos):
        """The K (kv 0) or V (kv 1) rows of layer l written for positions pos: [len, H, d]."""
        a = pos[:, None, None].astype(np.float32) * self.freq[l, kv] + self.phase[l, kv] + seq * 0.61
        return np.sin(a).astype(np.float16)

    def write(self, s, cells, pos):
        """Write the rows of positions pos into cells (consecutive) of sequence s."""
        for l in range(L):
            for kv in range(2):
                vals = self.values(s.id, l, kv, pos)
                for j, c in enumerate(cells):
                    self.kv[l][s.blocks[c // self.bs], kv, c % self.bs] = vals[j]

    def cache(self, l, kv):
        return kve.pool_tensor(self.kv[l], "nhd-kv-inner", kv=kv)[0]

    def admit(self, s):
        need = -(-s.prompt // self.bs)
        blocks = self.pool.alloc(s.id, need)
        if blocks is None:
            return False
        s.blocks = blocks
        s.n = s.prompt
        s.positions = np.arange(s.prompt, dtype=np.uint32)
        s.next_pos = s.prompt
        # prefill: write the prompt's K/V block by block
        for l in range(L):
            for kv in range(2):
                vals = self.values(s.id, l, kv, s.positions)
                for j, b in enumerate(blocks):
                    chunk = vals[j * self.bs:(j + 1) * self.bs]
                    self.kv[l][b, kv, :len(chunk)] = chunk
        self.stats["admissions"] += 1
        if self.keep < 1.0:
            self.evict(s)
        return True

    def evict(self, s):
        n = s.n
        table = np.asarray(s.blocks, np.int32)
        budget = kve.budget_keep_ratio_total(n, W, self.keep)
        scores = np.empty((L, HKV, n - W), np.float32)
        for l in range(L):
            k = kve.paged_gather(self.cache(l, 0), table, n)
            v = kve.paged_gather(self.cache(l, 1), table, n)
            q = self.rng.standard_normal((HQ, W, D)).astype(np.float32)
            scores[l] = kve.score_layer(self.params, q, k, v, gram=self.gram[l])
        offsets, indices = kve.select_model(kve.SelectParams.laprox_span(budget=budget), scores, n, W)
        freed = None
        for l in range(L):
            for kv in range(2):
                f, kept_pos, lengths = kve.paged_compact(
                    self.cache(l, kv), table, n, offsets, indices, first_unit=l * HKV, shared=True,
                    positions=s.positions)
                if freed is not None and f != freed:
                    raise AssertionError("layers disagree on the blocks freed")
                freed = f
        kept = int(lengths[0])
        if freed:
            gone = s.blocks[len(s.blocks) - freed:]
            s.blocks = s.blocks[:len(s.blocks) - freed]
            self.pool.release(s.id, gone)
        self.stats["blocks_freed_by_eviction"] += freed
        self.stats["tokens_evicted"] += n - kept
        s.positions, s.n = kept_pos.copy(), kept
        if self.verify_every and self.stats["admissions"] % self.verify_every == 0:
            self.verify(s)

    def verify(self, s):
        """The sequence's cells hold exactly the rows written for their positions."""
        table = np.asarray(s.blocks, np.int32)
        for l in range(L):
            for kv in range(2):
                got = kve.paged_gather(self.cache(l, kv), table, s.n)  # [H, n, d]
                want = self.values(s.id, l, kv, s.positions).transpose(1, 0, 2)
                if not np.array_equal(got.view(np.uint16), want.view(np.uint16)):
                    raise AssertionError(f"sequence {s.id}: cells differ from their positions' rows")
        self.stats["verified"] += 1

    def run(self, admissions, prompt_range, out_range):
        rng = np.random.default_rng(12345)  # the same workload for every keep ratio
        waiting = collections.deque()
        running, next_id, steps, busy_steps, busy_running = [], 0, 0, 0, 0
        while True:
            # arrivals: keep the queue non-empty until the admission target is reached
            while len(waiting) < 8 and next_id < admissions:
                waiting.append(Seq(next_id, int(rng.integers(*prompt_range)), int(rng.integers(*out_range))))
                next_id += 1
            while waiting and self.admit(waiting[0]):
                running.append(waiting.popleft())
            if not running and not waiting:
                break
            if not running:
                raise AssertionError("a prompt larger than the whole pool")
            if waiting:
                busy_steps += 1
                busy_running += len(running)
            steps += 1
            # one decode token per running sequence
            for s in list(running):
                if s not in running:
                    continue  # preempted by an older sequence this step
                if s.n % self.bs == 0:
                    got = self.pool.alloc(s.id, 1)
                    while got is None:
                        victim = running.pop()  # the youngest
                        self.pool.release(victim.id, victim.blocks)
                        victim.reset()
                        waiting.appendleft(victim)
                        self.stats["preemptions"] += 1
                        if victim is s:
                            break
                        got = self.pool.alloc(s.id, 1)
                    if got is None:
                        continue
                    s.blocks += got
                self.write(s, [s.n], np.array([s.next_pos], np.uint32))
                s.positions = np.append(s.positions, np.uint32(s.next_pos))
                s.n += 1
                s.next_pos += 1
                s.generated += 1
                if s.generated == s.out:
                    running.remove(s)
                    self.pool.release(s.id, s.blocks)
                    s.blocks = []
                    self.stats["finished"] += 1
            if steps % 64 == 0:
                self.pool.check(running)
        self.pool.check([])
        if len(self.pool.free) != self.pool.n:
            raise AssertionError("blocks still held after the run drained")
        return {"steps": steps, "mean_running": busy_running / max(busy_steps, 1), **self.stats}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=2048)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--keep", type=float, nargs="+", default=[1.0, 0.5, 0.25, 0.1])
    ap.add_argument("--admissions", type=int, default=2000)
    ap.add_argument("--prompt", type=int, nargs=2, default=[512, 1536], help="uniform range")
    ap.add_argument("--out", type=int, nargs=2, default=[16, 64], help="uniform range")
    ap.add_argument("--verify-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    print(f"pool {a.blocks} blocks x {a.block_size} tokens, L={L} Hkv={HKV} d={D} f16, prompts "
          f"{a.prompt[0]}..{a.prompt[1] - 1}, outputs {a.out[0]}..{a.out[1] - 1}, laprox-span "
          f"(window {W}), token granularity, one-shot after prefill; library {kve.library_path()}")
    print(f"{'keep':>5} {'admissions':>10} {'finished':>8} {'preempt':>7} {'steps':>6} "
          f"{'mean running':>12} {'vs no eviction':>14} {'blocks freed':>12} {'verified':>8} {'s':>6}")
    base, rows = None, []
    for keep in a.keep:
        t = time.time()
        r = Sim(a.blocks, a.block_size, keep, a.seed, a.verify_every).run(a.admissions, a.prompt, a.out)
        if base is None and keep >= 1.0:
            base = r["mean_running"]
        rel = r["mean_running"] / base if base else float("nan")
        rows.append((keep, r, rel))
        print(f"{keep:5.2f} {r['admissions']:10d} {r['finished']:8d} {r['preemptions']:7d} "
              f"{r['steps']:6d} {r['mean_running']:12.1f} {rel:13.2f}x "
              f"{r['blocks_freed_by_eviction']:12d} {r['verified']:8d} {time.time() - t:6.1f}",
              flush=True)
    print("no block leaked or released twice; every block free after each run")
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
