"""Selection methods: the adapter between the captured tensors and the eviction library.

A method is a function

    select(cap: captures.Captures, keep_ratio: float, window: int) -> kept

where kept[layer][kv_head] is an ascending int64 array of the positions (0 .. cap.n-1) kept
in that head's cache, the observation window (the last `window` positions) included.
Per-head lengths may differ (ragged budgets). Budgets follow kvpress's accounting: the
window counts inside the total, and a uniform method keeps `head_budget(n, keep_ratio,
window)` = floor(n * keep_ratio) positions per (layer, KV head) in all; non-uniform
allocators keep that many on average (`total_budget`).

Adding a method is one entry in METHODS. The library-backed methods (LaProx global and
per-layer, laprox-span, lava, both snapkv presets, ada-snapkv, pyramidkv, criticalkv, knorm,
tova, each also at token granularity) go through `library_method`, which is the plug point
for the `kvevict` Python binding (python/, not ready yet).
"""
import math
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
    (SPEC §4), so the result is deterministic."""
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


# ---------------------------------------------------------------- TEMPORARY numpy scaffolding
# The methods below exist only so the pipeline runs end to end before the kvevict binding
# lands. Scoring methods (snapkv) are to be replaced by the library; full / streamingllm /
# random are simple baselines that may stay.

def window_attention(q_window, keys):
    """SPEC §2. q_window: [Hq, w, hd], keys: [Hkv, n, hd] -> A [Hq, w, n], softmax in f32 over
    all keys with causal masking inside the window."""
    Hq, w, hd = q_window.shape
    Hkv, n, _ = keys.shape
    g = Hq // Hkv
    z = np.matmul(q_window.reshape(Hkv, g * w, hd), keys.transpose(0, 2, 1)).reshape(Hq, w, n)
    z *= np.float32(1.0 / math.sqrt(hd))
    future = np.arange(n)[None, :] > (n - w + np.arange(w))[:, None]  # [w, n]
    z[:, future] = -np.inf
    z -= z.max(axis=-1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z


def pool1d(s, kernel, mode):
    """Pool along the last axis, stride 1, padding kernel//2. `max` pads with -inf, `avg`
    counts pads as zeros (PyTorch avg_pool1d default)."""
    if kernel <= 1:
        return s
    p = kernel // 2
    pad_value = -np.inf if mode == "max" else 0.0
    padded = np.pad(s, [(0, 0)] * (s.ndim - 1) + [(p, p)], constant_values=pad_value)
    win = np.lib.stride_tricks.sliding_window_view(padded, kernel, axis=-1)
    return win.max(axis=-1) if mode == "max" else win.mean(axis=-1)


def select_full(cap, keep_ratio, window):
    return [[np.arange(cap.n, dtype=np.int64) for _ in range(cap.n_kv_heads)] for _ in range(cap.n_layers)]


def select_streamingllm(cap, keep_ratio, window, sinks=4):
    """StreamingLLM: the first `sinks` positions plus the most recent ones."""
    b = head_budget(cap.n, keep_ratio, window)
    kept = np.union1d(np.arange(min(sinks, b)), np.arange(cap.n - (b - min(sinks, b)), cap.n)).astype(np.int64)
    return [[kept.copy() for _ in range(cap.n_kv_heads)] for _ in range(cap.n_layers)]


def select_random(cap, keep_ratio, window, seed=0):
    """Uniformly random prefix positions per (layer, head), plus the window. Deterministic."""
    k = head_budget(cap.n, keep_ratio, window) - window
    out = []
    for l in range(cap.n_layers):
        row = []
        for h in range(cap.n_kv_heads):
            rng = np.random.default_rng([seed, l, h, cap.n, int(round(keep_ratio * 1e6))])
            row.append(add_window(rng.choice(cap.n - window, size=k, replace=False), cap.n, window))
        out.append(row)
    return out


def snapkv_scores(cap, window, kernel=7, pool="max", gqa="mean"):
    """TEMPORARY. SnapKV (SPEC §3, `snapkv` preset): mean window attention per query head,
    pooled over prefix positions, reduced over the query-head group -> [L, Hkv, n - window]."""
    qw = cap.window_queries(window)
    n, g = cap.n, cap.n_heads // cap.n_kv_heads
    out = np.empty((cap.n_layers, cap.n_kv_heads, n - window), np.float32)
    for l in range(cap.n_layers):
        a = window_attention(qw[l], cap.keys[l])[:, :, : n - window].mean(axis=1)  # [Hq, n-w]
        a = pool1d(a, kernel, pool).reshape(cap.n_kv_heads, g, n - window)
        out[l] = {"mean": np.mean, "max": np.max, "sum": np.sum}[gqa](a, axis=1)
    return out


def select_snapkv(cap, keep_ratio, window):
    """TEMPORARY. SnapKV original preset (w=32, max-pool 7, GQA mean), uniform budget."""
    return uniform_topk(snapkv_scores(cap, window), cap, keep_ratio, window)


# ---------------------------------------------------------------- library plug point
def library_method(preset, **options):
    """A select() backed by the kvevict binding. PLUG POINT: wire it to the binding's API
    once python/kvevict lands (score -> budget -> select for `preset` with `options`, e.g.
    budget="global", granularity="token"), returning kept[layer][kv_head] as above."""
    def select(cap, keep_ratio, window):
        try:
            import kvevict  # noqa: F401  (python/ of this repo)
        except ImportError as e:
            raise NotImplementedError(f"kvevict binding not available: {e}") from e
        raise NotImplementedError(f"library method {preset} {options}: binding not wired yet")
    return select


@dataclass
class Method:
    select: Callable
    window: int = 32          # observation window w (the last w prefill tokens, always kept)
    temporary: bool = False   # numpy scaffolding to be replaced by the library
    library: bool = False     # needs the kvevict binding
    note: str = ""
    options: dict = field(default_factory=dict)


METHODS: Dict[str, Method] = {
    "full": Method(select_full, note="no eviction"),
    "streamingllm": Method(select_streamingllm, note="4 sinks + recent"),
    "random": Method(select_random, note="random prefix + window"),
    "snapkv-np": Method(select_snapkv, temporary=True, note="TEMPORARY numpy SnapKV (w=32, max-pool 7, GQA mean)"),
    # Library-backed methods: uncomment / extend once library_method is wired.
    # "laprox":          Method(library_method("laprox", budget="global")),
    # "laprox-layer":    Method(library_method("laprox", budget="per-layer")),
    # "laprox-k1":       Method(library_method("laprox", kernel=1, budget="global")),
    # "laprox-span":     Method(library_method("laprox-span")),
    # "lava":            Method(library_method("lava", budget="lava")),
    # "snapkv":          Method(library_method("snapkv", budget="uniform")),
    # "snapkv-kvpress":  Method(library_method("snapkv-kvpress", budget="uniform"), window=64),
    # "ada-snapkv":      Method(library_method("snapkv", budget="ada")),
    # "pyramidkv":       Method(library_method("snapkv", budget="pyramid")),
    # "criticalkv":      Method(library_method("criticalkv", budget="uniform")),
    # "knorm":           Method(library_method("knorm", budget="uniform")),
    # "tova":            Method(library_method("tova", budget="uniform"), window=1),
    # and "<name>@token": the same with granularity="token".
}


def get(name):
    if name not in METHODS:
        raise SystemExit(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    return METHODS[name]
