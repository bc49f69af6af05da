"""A CPU simulation of a vLLM-style block manager driven by kvevict (issue 30, item 5).

A pool of fixed-size blocks (every layer's K and V of a token in one block slot, vLLM's
"a block holds every KV head"), sequences arriving in a queue, admission while the pool
has room for a prompt, one decode token per running sequence per step (a new block when
the last one is full; preemption by recomputation, the youngest first, when none is
free), blocks released when a sequence finishes. With eviction (keep ratio r < 1), at
the end of each prefill, one-shot (kvpress / TensorRT-LLM ``on_context_step_end``
style), the evictor (``kvevict.Evictor``, the simple API, over paged views: ``paged=``)
runs a round on the sequence's slot: the prefill's last window queries observed per
layer (``observe_queries``), ``plan`` (keep ratio r of the prompt, the window inside),
``begin``, ``score_layer_paged`` every layer straight from the pool through the
sequence's block table (LaProx-span, token granularity), ``select``,
``compact_paged`` every layer's K and V in place in the sequence's own blocks, whose
answer (``blocks_freed``) the block manager releases to the pool, ``commit``. Decode
tokens continue at the original positions (the kept cells' positions).

Decode-time budgets (``--budget HIGH LOW``, the evictor's cell budget policy ``cells=``):
sequences that grow during decode are evicted whenever they pass ``HIGH`` cells (at the
end of prefill, and after any decode token), down to ``LOW``, by the same round (the last
window's queries observed first); each round's freed blocks go back to the pool at once,
so a sequence never holds more than ``ceil((HIGH + 1) / bs)`` blocks in decode. A sequence holds
an evictor slot while it runs (the evictor's per-sequence state: its counters are
checked against the table), returned when it finishes or is preempted.

Checked all along: the pool's free list and the sequences' tables partition the blocks
(no block leaked, none owned twice, a release of a block the sequence does not own is a
double free and raises); after compaction the kept cells hold exactly the K/V written for
their original positions (every ``--verify-every``-th round); the evictor books as many
evictions as the sequence had rounds; after the run drained, every block is free again.

Reported per keep ratio and budget: admissions, preemptions, the mean number of running
sequences (over the steps where the queue was not empty: the pool is the limit) and that
mean relative to no eviction, rounds (and those in decode), the most cells a sequence held
in decode.

    PYTHONPATH=python python3 python/examples/block_manager_sim.py --admissions 10000
    PYTHONPATH=python python3 python/examples/block_manager_sim.py --admissions 10000 \
        --blocks 1024 --prompt 64 256 --out 64 256 --keep 1.0 0.1 --budget 48 32
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
        self.blocks, self.n, self.generated, self.slot, self.rounds = [], 0, 0, None, 0
        self.positions = np.zeros(0, np.uint32)
        self.next_pos = 0


class Sim:
    def __init__(self, blocks, block_size, keep, seed, verify_every=0, budget=None):
        """``keep < 1``: one round at the end of each prefill, keep ratio ``keep``;
        ``budget=(high, low)``: the evictor's cell budget instead, rounds whenever a
        sequence passes ``high`` cells (at prefill and during decode), down to ``low``."""
        self.bs, self.keep, self.verify_every = block_size, keep, verify_every
        self.budget = None if budget is None else (int(budget[0]), int(budget[1]))
        self.evicting = keep < 1.0 or self.budget is not None
        self.pool = BlockPool(blocks)
        rng = np.random.default_rng(seed)
        self.rng = rng
        # every layer's K and V: [blocks, 2, bs, Hkv, d] (FlashInfer / vLLM FlashInfer layout)
        self.kv = [np.zeros((blocks, 2, block_size, HKV, D), np.float16) for _ in range(L)]
        self.phase = rng.standard_normal((L, 2, HKV, D)).astype(np.float32)
        self.freq = rng.uniform(0.01, 0.5, (L, 2, HKV, D)).astype(np.float32)
        self.wo = [(rng.standard_normal((HQ, D, DM)) / np.sqrt(DM)).astype(np.float32)
                   for _ in range(L)]
        self.ev, self.slots = None, []
        self.stats = collections.Counter({k: 0 for k in (
            "admissions", "finished", "preemptions", "blocks_freed_by_eviction", "tokens_evicted",
            "verified", "rounds", "decode_rounds", "max_cells")})

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

    def start_evictor(self, max_cells, max_seqs):
        """The evictor: LaProx-span at token granularity, keep ratio ``keep`` of what is
        new since the last compression (or the cell budget), one slot per running
        sequence, K/V from f16 pools."""
        policy = (dict(cells=self.budget) if self.budget is not None
                  else dict(keep_ratio=self.keep, min_keep=0))
        self.ev = kve.Evictor("laprox-span", layers=L, hq=HQ, hkv=HKV, dk=D, d_model=DM,
                              max_cells=max_cells, max_seqs=max_seqs, window=W,
                              granularity="token", paged="float16", **policy)
        for l in range(L):
            self.ev.set_output_projection(l, self.wo[l])
        self.slots = list(range(max_seqs))

    def release(self, s):
        """The sequence's blocks and its evictor slot go back."""
        self.pool.release(s.id, s.blocks)
        s.blocks = []
        s.rounds = 0
        if s.slot is not None:
            self.ev.reset(s.slot)
            self.slots.append(s.slot)
            s.slot = None

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
        if self.evicting:
            s.slot = self.slots.pop()
            self.evict(s)
        return True

    def evict(self, s):
        """One evictor round on the sequence if its policy asks for one (``plan``),
        straight from the pool; its trailing blocks go back to the block pool. Returns
        whether a round ran."""
        n, ev, slot = s.n, self.ev, s.slot
        table = np.asarray(s.blocks, np.int32)
        target = ev.plan(slot, n)
        if target >= n:
            return False
        # the queries of the last window (the prefill's, or the last decode steps'): the
        # evictor keeps the last window of them per layer
        for l in range(L):
            q = self.rng.standard_normal((HQ, W, D)).astype(np.float32)
            ev.observe_queries(slot, l, q)
        ev.begin(slot, n, target)
        for l in range(L):
            ev.score_layer_paged(slot, l, self.cache(l, 0), table, self.cache(l, 1))
        ev.select(slot)
        kept = ev.kept_cells(slot)
        freed = None
        for l in range(L):
            for kv in range(2):
                f = ev.compact_paged(slot, l, self.cache(l, kv), table)
                if freed is not None and f != freed:
                    raise AssertionError("layers disagree on the blocks freed")
                freed = f
        ev.commit(slot)
        if freed != len(s.blocks) - -(-len(kept) // self.bs):
            raise AssertionError(f"{freed} blocks freed for {len(kept)} kept cells")
        if freed:
            gone = s.blocks[len(s.blocks) - freed:]
            s.blocks = s.blocks[:len(s.blocks) - freed]
            self.pool.release(s.id, gone)
        s.rounds += 1
        st = ev.stats(slot)
        if (st["cells"], st["evictions"]) != (len(kept), s.rounds):
            raise AssertionError(f"the evictor books {st} for {len(kept)} kept cells, "
                                 f"round {s.rounds}")
        self.stats["blocks_freed_by_eviction"] += freed
        self.stats["tokens_evicted"] += n - len(kept)
        self.stats["rounds"] += 1
        s.positions, s.n = s.positions[kept], len(kept)
        if self.verify_every and self.stats["rounds"] % self.verify_every == 0:
            self.verify(s)
        return True

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
        if self.evicting:
            # a running sequence holds at least one block: at most `blocks` of them; a
            # sequence holds at most its prompt, or one cell past the budget's high mark
            cap = prompt_range[1] if self.budget is None else max(prompt_range[1], self.budget[0] + 1)
            self.start_evictor(cap, self.pool.n)
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
                        self.release(victim)
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
                self.stats["max_cells"] = max(self.stats["max_cells"], s.n)  # in decode
                if s.generated == s.out:
                    running.remove(s)
                    self.release(s)
                    self.stats["finished"] += 1
                elif self.budget is not None and self.evict(s):
                    self.stats["decode_rounds"] += 1
            if steps % 64 == 0:
                self.pool.check(running)
        self.pool.check([])
        if len(self.pool.free) != self.pool.n:
            raise AssertionError("blocks still held after the run drained")
        if self.ev is not None and len(self.slots) != self.pool.n:
            raise AssertionError("evictor slots still held after the run drained")
        return {"steps": steps, "mean_running": busy_running / max(busy_steps, 1), **self.stats}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=2048)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--keep", type=float, nargs="+", default=[1.0, 0.5, 0.25, 0.1],
                    help="keep ratios of the one-shot round after prefill (1: no eviction)")
    ap.add_argument("--budget", type=int, nargs=2, action="append", default=[],
                    metavar=("HIGH", "LOW"), help="a decode-time cell budget run (repeatable): "
                    "past HIGH cells a sequence is evicted down to LOW, at prefill and in decode")
    ap.add_argument("--admissions", type=int, default=2000)
    ap.add_argument("--prompt", type=int, nargs=2, default=[512, 1536], help="uniform range")
    ap.add_argument("--out", type=int, nargs=2, default=[16, 64], help="uniform range")
    ap.add_argument("--verify-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    print(f"pool {a.blocks} blocks x {a.block_size} tokens, L={L} Hkv={HKV} d={D} f16, prompts "
          f"{a.prompt[0]}..{a.prompt[1] - 1}, outputs {a.out[0]}..{a.out[1] - 1}, laprox-span "
          f"(window {W}), token granularity, through kvevict.Evictor (paged); keep ratios: one "
          f"round after prefill; budgets: rounds at prefill and in decode; library "
          f"{kve.library_path()}")
    print(f"{'policy':>12} {'admissions':>10} {'finished':>8} {'preempt':>7} {'steps':>6} "
          f"{'mean running':>12} {'vs no eviction':>14} {'blocks freed':>12} {'rounds':>7} "
          f"{'in decode':>9} {'max decode':>10} {'verified':>8} {'s':>6}")
    base, rows = None, []
    runs = [(f"keep {k:.2f}", k, None) for k in a.keep]
    runs += [(f"cells {h}/{lo}", 1.0, (h, lo)) for h, lo in a.budget]
    for label, keep, budget in runs:
        t = time.time()
        r = Sim(a.blocks, a.block_size, keep, a.seed, a.verify_every, budget).run(
            a.admissions, a.prompt, a.out)
        if base is None and keep >= 1.0 and budget is None:
            base = r["mean_running"]
        rel = r["mean_running"] / base if base else float("nan")
        rows.append((label, r, rel))
        print(f"{label:>12} {r['admissions']:10d} {r['finished']:8d} {r['preemptions']:7d} "
              f"{r['steps']:6d} {r['mean_running']:12.1f} {rel:13.2f}x "
              f"{r['blocks_freed_by_eviction']:12d} {r['rounds']:7d} {r['decode_rounds']:9d} "
              f"{r['max_cells']:10d} {r['verified']:8d} {time.time() - t:6.1f}", flush=True)
    print("no block leaked or released twice; every block free after each run")
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
