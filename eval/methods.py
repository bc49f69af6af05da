"""Selection methods: the adapter between the captured tensors and the eviction library.

A method is a function

    select(cap: captures.Captures, keep_ratio: float, window: int) -> kept

where kept[layer][kv_head] is an ascending int64 array of the positions (0 .. cap.n-1) kept
in that head's cache, the observation window (the last `window` positions) included.
Per-head lengths may differ (ragged budgets). Budgets follow kvpress's accounting: the
window counts inside the total, and a uniform method keeps `head_budget(n, keep_ratio,
window)` = floor(n * keep_ratio) positions per (layer, KV head) in all; non-uniform
allocators keep that many on average (`total_budget`).

Adding a method is one entry in METHODS. Every method but `full` goes through the kvevict
binding (`library_method`: score with a design §3 preset, allocate and select with the
library; scores are computed once per capture and scorer and reused by every ratio).
Method names ending in `@token` use the library's token granularity (one kept set for the
whole model, the llama.cpp mode); the others keep a set per (layer, KV head).
"""
import hashlib
import math
import weakref
from dataclasses import dataclass, field
from typing import Callable, Dict

import numpy as np


# ---------------------------------------------------------------- budgets and selection helpers
def head_budget(n, keep_ratio, window):
    """Positions kept per (layer, KV head), window included: floor(n * keep_ratio),
    at least the window, at most n."""
    return int(min(n, max(window, math.floor(n * keep_ratio + 1e-9))))


def total_budget(cap, keep_ratio, window):
    """Positions kept in the whole model (all layers and KV heads), windows included."""
    return cap.n_layers * cap.n_kv_heads * head_budget(cap.n, keep_ratio, window)


def top_k(scores, k):
    """Positions of the k largest scores, ascending. Ties: the later position is kept first
    (design §4), so the result is deterministic."""
    k = int(min(max(k, 0), len(scores)))
    pos = np.arange(len(scores))
    order = np.lexsort((-pos, -np.asarray(scores, dtype=np.float64)))  # score desc, then pos desc
    return np.sort(order[:k]).astype(np.int64)


def add_window(prefix_kept, n, window):
    """Prefix positions kept + the window's positions n-window .. n-1, ascending."""
    return np.concatenate([np.sort(np.asarray(prefix_kept, np.int64)), np.arange(n - window, n, dtype=np.int64)])


def uniform_topk(scores, cap, keep_ratio, window):
    """scores: [L, Hkv, n - window] prefix scores -> kept, same prefix budget for every head."""
    k = head_budget(cap.n, keep_ratio, window) - window
    return [[add_window(top_k(scores[l, h], k), cap.n, window) for h in range(cap.n_kv_heads)]
            for l in range(cap.n_layers)]


def kept_digest(kept):
    """A hash of a selection (to decode identical selections once)."""
    h = hashlib.sha1()
    for row in kept:
        for k in row:
            h.update(np.asarray(k, np.int64).tobytes())
            h.update(b"|")
    return h.hexdigest()


def check_kept(kept, cap):
    """Validate a method's output (shape, ascending, in range); returns the kept count."""
    assert len(kept) == cap.n_layers, "one entry per layer"
    total = 0
    for l in range(cap.n_layers):
        assert len(kept[l]) == cap.n_kv_heads, "one entry per KV head"
        for h in range(cap.n_kv_heads):
            a = np.asarray(kept[l][h])
            assert a.ndim == 1 and (len(a) == 0 or (a[0] >= 0 and a[-1] < cap.n)), "positions in range"
            assert np.all(np.diff(a) > 0), "strictly ascending"
            total += len(a)
    return total


# ---------------------------------------------------------------- numpy baselines
def select_full(cap, keep_ratio, window):
    return [[np.arange(cap.n, dtype=np.int64) for _ in range(cap.n_kv_heads)] for _ in range(cap.n_layers)]


def select_streamingllm_np(cap, keep_ratio, window, sinks=4):
    """StreamingLLM in numpy: the first `sinks` positions plus the most recent ones. Only the
    smoke test uses it (it must equal the library's `streamingllm`)."""
    b = head_budget(cap.n, keep_ratio, window)
    kept = np.union1d(np.arange(min(sinks, b)), np.arange(cap.n - (b - min(sinks, b)), cap.n)).astype(np.int64)
    return [[kept.copy() for _ in range(cap.n_kv_heads)] for _ in range(cap.n_layers)]


# ---------------------------------------------------------------- library (kvevict binding)
_kve = None


def kvevict():
    """The binding (python/ of this repo, pip-installed or PYTHONPATH=python)."""
    global _kve
    if _kve is None:
        try:
            import kvevict as k
        except ImportError as e:
            raise NotImplementedError(f"kvevict binding not available: {e}") from e
        _kve = k
    return _kve


# Scores do not depend on the budget: computed once per (capture, score parameters) and
# reused by every ratio and every selection (head / token granularity) of the same scorer.
_SCORES = weakref.WeakKeyDictionary()


def library_scores(cap, preset, window, **score_fields):
    """[L, Hkv, n - window] float32 scores of `preset` (a design §3 preset name, fields
    overridden) from the library; `random`: uniform random scores (seeded per capture)."""
    memo = _SCORES.setdefault(cap, {})
    if preset == "random":
        key = ("random", window, score_fields.get("seed", 0))
        if key not in memo:
            rng = np.random.default_rng([score_fields.get("seed", 0), cap.n, window])
            memo[key] = rng.random((cap.n_layers, cap.n_kv_heads, cap.n - window), dtype=np.float32)
        return memo[key]
    kve = kvevict()
    params = kve.make_score_params(preset, window, **score_fields)
    key = (preset, repr(params))
    if key not in memo:
        q = cap.window_queries(window)
        extra = None
        if params.scorer == "criticalkv":
            # the value L1 norms (||v Wo_h||_1, an [N, D] product per head) do not depend
            # on the budget: computed once per capture, then one library call per layer
            if "value_l1" not in memo:
                memo["value_l1"] = [kve.compute_value_l1(cap.values[l], cap.wo[l], hq=cap.n_heads)
                                    for l in range(cap.n_layers)]
            extra = [{"value_l1": v} for v in memo["value_l1"]]
        elif params.scorer == "laprox":
            # LaProx value forms v G_h v^T (Gram cached by the binding per Wo) are the same
            # for every LaProx variant of a capture: computed once
            fk = ("value_forms", params.cross)
            if fk not in memo:
                memo[fk] = [kve.compute_value_forms(cap.values[l], kve.gram_cache.get(cap.wo, l, cap.n_heads, cap.n_kv_heads, params.cross),
                                                    params.cross, hq=cap.n_heads)
                            for l in range(cap.n_layers)]
            extra = [{"value_forms": v} for v in memo[fk]]
        if extra is not None:
            out = np.empty((cap.n_layers, cap.n_kv_heads, cap.n - window), np.float32)
            for l in range(cap.n_layers):
                kve.score_layer(params, q[l], cap.keys[l], out=out[l], **extra[l])
            memo[key] = out
        else:
            memo[key] = kve.score_model(params, cap.window_queries(window), cap.keys, cap.values, cap.wo)
    return memo[key]


def value_links(cap):
    """The capture's value-link sums over every layer (kvevict.accumulate_value_links), memoised."""
    memo = _SCORES.setdefault(cap, {})
    if "value_links" not in memo:
        kve = kvevict()
        links = np.zeros(cap.n, np.float32)
        for l in range(cap.n_layers):
            kve.accumulate_value_links(cap.values[l], links)
        memo["value_links"] = links
    return memo["value_links"]


def library_select(cap, scores, budget, window, preset, allocator=None, granularity=None,
                   normalize=None, alpha=None, beta=None, post_pool=None, links=None):
    """The library's allocation + selection of `scores` -> kept[layer][kv_head]."""
    kve = kvevict()
    if allocator is None and preset in ("laprox-span", "uniqueness"):
        sp = kve.SelectParams.laprox_span(budget)
    else:
        sp = kve.SelectParams(allocator or kve.DEFAULT_ALLOCATOR.get(preset, "uniform"), "head", budget)
    if granularity is not None:
        sp.granularity = granularity
    for k, v in (("normalize", normalize), ("alpha", alpha), ("beta", beta)):
        if v is not None:
            setattr(sp, k, v)
    if post_pool is not None:  # (kind, kernel, decay[, sinks]): sinks default as the preset
        sp.post_pool_kind, sp.post_pool_kernel, sp.post_pool_decay = post_pool[:3]
        if len(post_pool) > 3:
            sp.post_pool_sinks = post_pool[3]
    if links is None:
        offsets, indices = kve.select_model(sp, scores, cap.n, window)
    else:  # continuation through value runs, at threshold `links`
        offsets, indices = kve.select_model(sp, scores, cap.n, window, links=value_links(cap), link_threshold=links)
    return kve.kept_lists(offsets, indices, cap.n_layers, cap.n_kv_heads)


def _union(kept, extra):
    return [[np.union1d(k, extra).astype(np.int64) for k in row] for row in kept]


def library_method(preset, allocator=None, granularity=None, normalize=None, alpha=None, beta=None,
                   post_pool=None, sinks=0, recent=0, layer_floor=0.0, first_stage_ratio=0.5,
                   links=None, **score_fields):
    """A select() backed by the kvevict binding: score (`preset`, design §3, any ScoreParams
    field overridden: kernel=1, pool="forward", laprox_gqa="exact", ...) -> allocate ->
    select (allocator, granularity, normalize, alpha, beta, post_pool=(kind, kernel, decay[, sinks]);
    defaults as kvevict.select_kept: uniform, lava -> lava, laprox -> global, laprox-span
    -> its own global token-level selection with forward post-pooling 9 / 1.0, the sink
    at position 0 left out of the pool); `links`: a value-link threshold (the post-pool
    carried on through runs of similar values, kvevict.select_model(links=...)).

    Budget: `head_budget(n, ratio, w) - w` prefix tokens per (layer, KV head) on average.
    Composed extras (evaluation ideas, not library options; they spend the same budget):
    `sinks` / `recent`: reserve the first `sinks` and the last `recent` prefix positions for
    every head (their scores are zeroed so the selection does not pick them twice);
    `layer_floor` f: every unit first keeps its own top f·budget (one library selection with
    the uniform allocator), the rest of the budget goes through the selection asked for.
    """
    def select(cap, keep_ratio, window):
        b = head_budget(cap.n, keep_ratio, window) - window
        p = cap.n - window
        fields = dict(score_fields)
        if preset == "criticalkv" and "critical_first_stage" not in fields:
            # kvpress CriticalKVPress: the first stage is first_stage_ratio of the head's
            # whole budget (window included), minus the window
            fields["critical_first_stage"] = max(max(int(first_stage_ratio * (b + window)), 1) - window, 0)
        scores = library_scores(cap, preset, window, **fields)
        sel = dict(allocator=allocator, granularity=granularity, normalize=normalize, alpha=alpha,
                   beta=beta, post_pool=post_pool, links=links)
        reserved = np.concatenate([np.arange(min(sinks, p)), np.arange(max(p - recent, 0), p)]).astype(np.int64)
        reserved = np.unique(reserved)
        if len(reserved):
            scores = scores.copy()
            scores[:, :, reserved] = 0.0
            b = max(b - len(reserved), 0)
        if layer_floor > 0:
            bf = int(layer_floor * b)
            floor_kept = library_select(cap, scores, bf, window, preset, allocator="uniform",
                                        granularity=granularity if granularity != "token" else "head")
            s2 = scores.copy()
            for l in range(cap.n_layers):
                for h in range(cap.n_kv_heads):
                    s2[l, h, floor_kept[l][h][floor_kept[l][h] < p]] = 0.0
            kept = library_select(cap, s2, b - bf, window, preset, **sel)
            kept = [[np.union1d(a, c).astype(np.int64) for a, c in zip(ra, rc)] for ra, rc in zip(kept, floor_kept)]
        else:
            kept = library_select(cap, scores, b, window, preset, **sel)
        return _union(kept, reserved) if len(reserved) else kept
    return select


@dataclass
class Method:
    select: Callable
    window: int = 32          # observation window w (the last w prefill tokens, always kept)
    library: bool = False     # needs the kvevict binding
    note: str = ""
    options: dict = field(default_factory=dict)


L = library_method

METHODS: Dict[str, Method] = {
    "full": Method(select_full, note="no eviction"),
    # floors and recency baselines
    "random": Method(L("random"), library=True, note="random scores, uniform per head (library selection)"),
    "random@token": Method(L("random", granularity="token"), library=True, note="random scores, one token set"),
    "streamingllm": Method(L("streamingllm"), library=True, note="4 sinks + most recent"),
    # SnapKV family
    "snapkv": Method(L("snapkv"), library=True, note="w=32, max-pool 7, GQA mean; uniform"),
    "snapkv@token": Method(L("snapkv", granularity="token"), library=True),
    "snapkv-kvpress": Method(L("snapkv-kvpress"), window=64, library=True, note="w=64, avg-pool 5; uniform"),
    "snapkv-kvpress@token": Method(L("snapkv-kvpress", granularity="token"), window=64, library=True),
    "ada-snapkv": Method(L("snapkv", allocator="ada"), library=True, note="snapkv + AdaKV allocator (alpha 0.2)"),
    "pyramidkv": Method(L("snapkv", allocator="pyramid"), library=True, note="snapkv + PyramidKV budgets (beta 20)"),
    "snapkv-fwd": Method(L("snapkv", pool="forward", kernel=8, decay=0.9), library=True,
                         note="snapkv with forward pooling 8/0.9 instead of max 7; uniform"),
    "criticalkv": Method(L("criticalkv"), window=64, library=True,
                         note="snapkv-kvpress base (w=64); first stage: half the head's kvpress budget "
                              "(window inside), rest by score x ||v Wo||_1; uniform"),
    "criticalkv@token": Method(L("criticalkv", granularity="token"), window=64, library=True),
    # query-free / single-query baselines
    "knorm": Method(L("knorm"), library=True, note="-||k||; uniform"),
    "knorm@token": Method(L("knorm", granularity="token"), library=True),
    "tova": Method(L("tova"), window=1, library=True, note="w=1, mean over the layer's heads; uniform"),
    "tova@token": Method(L("tova", granularity="token"), window=1, library=True),
    # LAVa
    "lava": Method(L("lava"), library=True, note="lava scorer + lava allocator (entropy layer budgets, ada in layer)"),
    "lava@token": Method(L("lava", granularity="token"), library=True),
    # LaProx
    "laprox": Method(L("laprox"), library=True, note="w=32, avg-pool 7 on attention, GQA sum; global (layer-sum normalized)"),
    "laprox@token": Method(L("laprox", granularity="token"), library=True),
    "laprox-layer": Method(L("laprox", allocator="ada", alpha=0.0), library=True,
                           note="ablation 'per-layer only': equal layer budgets, heads compete inside a layer"),
    "laprox-nonorm": Method(L("laprox", normalize="none"), library=True, note="ablation: global without layer normalization"),
    "laprox-k1": Method(L("laprox", kernel=1), library=True, note="laprox without pooling; global"),
    "laprox-k1@token": Method(L("laprox", kernel=1, granularity="token"), library=True),
    "laprox-fwd": Method(L("laprox", pool="forward", kernel=8, decay=0.9), library=True,
                         note="laprox with forward pooling 8/0.9 (per head); global"),
    "laprox-span": Method(L("laprox-span"), library=True,
                          note="laprox k=1 -> token granularity (layer-sum normalized) -> forward pool 9/1.0, the sink "
                               "lending nothing -> global top-K"),
    "laprox-span-w8": Method(L("laprox-span"), window=8, library=True,
                             note="laprox-span with an 8-token window: more of the budget left to the prefix (best preset)"),
    "laprox-k1-fwdpost-w8": Method(L("laprox", kernel=1, post_pool=("forward", 8, 0.9)), window=8, library=True,
                                   note="laprox k=1, w=8, forward post-pool 8/0.9 per head, global: the per-head "
                                        "counterpart of laprox-span-w8 (ragged cache)"),
    "laprox-span-w8-runs": Method(L("laprox-span", links=0.5), window=8, library=True,
                                  note="laprox-span-w8 whose continuation is carried on through runs of similar "
                                       "values (mean adjacent value cosine > 0.5): kve_select_model_linked"),
    "snapkv-w8": Method(L("snapkv"), window=8, library=True, note="snapkv with an 8-token window (control for laprox-span-w8)"),
    # question-agnostic (design §3b)
    "uniqueness": Method(L("uniqueness"), window=8, library=True,
                         note="question-agnostic: (1 - r)^24, r the 4th largest min(cos k, cos v) over the other tokens, 0 "
                              "where r >= 0.5, the whole score lent to the 6 tokens before, 0.729^(j-6) to the "
                              "j <= 10th; no queries; laprox-span's "
                              "selection (token granularity, global, forward post-pool 9/1.0, sink left out)"),
    "uniqueness-runs": Method(L("uniqueness", links=0.5), window=8, library=True,
                              note="uniqueness with laprox-span-w8-runs' selection (value links)"),
}

BEST_PRESET = "laprox-span-w8"  # eval/demo.py's default; see eval/README.md
BEST_AGNOSTIC = "uniqueness"  # question-agnostic (context compressed before the question); eval/agnostic.py


def get(name):
    if name not in METHODS:
        raise SystemExit(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    return METHODS[name]
