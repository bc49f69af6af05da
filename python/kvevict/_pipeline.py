"""One-call pipelines for engines and evaluations: score every layer, allocate, select."""
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ._api import (accumulate_value_links, compute_gram, compute_value_l1, kept_lists,
                   prefix_len, score_layer, select_model)
from ._core import (PRESETS, ScoreParams, SelectParams, budget_from_capacity,
                    budget_keep_ratio_prefix, budget_keep_ratio_total)

# The allocator each preset's default selection uses, read from the library's preset table
# (SelectParams.preset); kept for callers that read it.
DEFAULT_ALLOCATOR = {name: SelectParams.preset(name).allocator for name in PRESETS.names()}


class GramCache:
    """LaProx Gram matrices per output projection, computed once.

    Keyed by the memory of the layer's ``wo``: the identity of the numpy array that owns
    it (the root of its ``.base`` chain, so fresh views of one stacked ``[L, Hq*dv, D]``
    array hit), the data pointer, shape, strides and dtype, plus ``hq``, ``hkv`` and
    ``cross``. The cache holds a reference to each ``wo`` it saw, so an owner's id is never
    reused while cached; it cannot see in-place edits of a ``wo`` (call :meth:`clear`).
    LRU, ``max_entries``. Thread-safe.
    """

    def __init__(self, max_entries=1024):
        self.max_entries = max_entries
        self._d = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    @staticmethod
    def _key(m, hq, hkv, cross):
        a = m.array if hasattr(m, "array") and not isinstance(m, np.ndarray) else m
        if not isinstance(a, np.ndarray):
            return None  # not an array (a list?): not cached
        root = a
        while isinstance(root.base, np.ndarray):
            root = root.base
        return (id(root), a.__array_interface__["data"][0], a.shape, a.strides, a.dtype.str,
                getattr(m, "dtype", None) if a is not m else None, hq, hkv, bool(cross))

    def get(self, wo, layer, hq, hkv, cross):
        """The Gram of ``wo[layer]`` (``layer=None``: ``wo`` is that layer's matrix)."""
        m = wo if layer is None else wo[layer]
        key = self._key(m, hq, hkv, cross)
        if key is not None:
            with self._lock:
                hit = self._d.get(key)
                if hit is not None:
                    self._d.move_to_end(key)
                    self.hits += 1
                    return hit[1]
        g = compute_gram(m, hkv, cross, hq=hq if np.ndim(getattr(m, "array", m)) == 2 else None)
        with self._lock:
            self.misses += 1
            if key is not None:
                self._d[key] = (m, g)
                while len(self._d) > self.max_entries:
                    self._d.popitem(last=False)
        return g

    def clear(self):
        with self._lock:
            self._d.clear()

    def __len__(self):
        return len(self._d)


gram_cache = GramCache()


def _layer(x, l):
    return None if x is None else x[l]


def _budget(n, window, keep_ratio, budget, capacity, ratio_of):
    given = [v is not None for v in (keep_ratio, budget, capacity)]
    if sum(given) != 1:
        raise ValueError("give exactly one of keep_ratio, budget, capacity")
    if budget is not None:
        return int(budget)
    if capacity is not None:
        return budget_from_capacity(capacity, window)
    if ratio_of == "total":
        return budget_keep_ratio_total(n, window, keep_ratio)
    if ratio_of == "prefix":
        return budget_keep_ratio_prefix(n, window, keep_ratio)
    raise ValueError(f"ratio_of must be 'total' or 'prefix', got {ratio_of!r}")


def make_score_params(preset, window=None, **fields):
    """``ScoreParams`` from a preset name (or a ``ScoreParams``), window and fields
    overridden (aliases: kernel, pool, decay)."""
    p = preset.copy() if isinstance(preset, ScoreParams) else ScoreParams.preset(preset)
    for k, v in fields.items():
        setattr(p, ScoreParams.ALIASES.get(k, k), v)
    if window is not None:
        p.window = window
    return p


def score_model(params, queries, keys, values=None, wo=None, *, gram_cache=gram_cache,
                threads=1):
    """Score every layer: float32 ``[L, Hkv, P]``.

    ``queries[l]`` ``[Hq, wq, dk]`` (``wq >= window``; the last ``window`` rows are used),
    ``keys[l]`` / ``values[l]`` ``[Hkv, N, d]``: stacked arrays or lists of per-layer
    arrays (any strides). ``wo[l]`` ``[Hq*dv, D]`` or ``[Hq, dv, D]`` for laprox (Gram,
    cached in ``gram_cache``; ``None`` disables caching) and criticalkv (value L1 norms).
    ``threads``: layers scored concurrently (the library releases the GIL).
    """
    L = len(keys)
    hkv, n = keys[0].shape[0], keys[0].shape[1]
    p = prefix_len(n, params.window)
    out = np.empty((L, hkv, p), np.float32)
    scorer = params.scorer
    if scorer in ("laprox", "criticalkv") and wo is None:
        raise ValueError(f"{scorer} needs wo")

    def one(l):
        q = _layer(queries, l) if scorer not in ("knorm", "streamingllm", "uniqueness") else None
        hq = q.shape[0] if q is not None else hkv
        kw = {}
        if scorer in ("lava", "laprox", "uniqueness"):
            kw["values"] = values[l]
        if scorer == "laprox":
            if gram_cache is not None:
                kw["gram"] = gram_cache.get(wo, l, hq, hkv, params.cross)
            else:
                w = wo[l]
                kw["gram"] = compute_gram(w, hkv, params.cross, hq=hq if np.ndim(w) == 2 else None)
        if scorer == "criticalkv":
            w = wo[l]
            kw["value_l1"] = compute_value_l1(values[l], w, hq=hq if np.ndim(w) == 2 else None)
        score_layer(params, q, keys[l], out=out[l], **kw)

    if threads > 1 and L > 1:
        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(one, range(L)))
    else:
        for l in range(L):
            one(l)
    return out


def select_kept(preset, queries, keys, values=None, wo=None, *, keep_ratio=None, budget=None,
                capacity=None, ratio_of="total", window=None, allocator=None, granularity=None,
                normalize=None, alpha=None, beta=None, post_pool=None, select_params=None,
                first_stage_ratio=0.5, gram_cache=gram_cache, threads=1, details=False,
                value_links=None, **score_fields):
    """Score → allocate → select for a whole model in one call; returns ``kept[l][kh]``,
    ascending int64 positions (window included) per layer and KV head.

    - ``preset``: a design §3 preset name (snapkv, snapkv-kvpress, lava, laprox, laprox-span,
      criticalkv, streamingllm, knorm, tova, uniqueness) or a :class:`ScoreParams`; ``window`` and any
      ``ScoreParams`` field (``pool_kernel=1`` / ``kernel=1``, ``laprox_gqa="exact"``,
      ``placement="product"``, ``gqa``, ...) override it.
    - tensors: as :func:`score_model` (``queries[l]`` may hold more rows than ``window``).
    - budget, exactly one of: ``keep_ratio`` (kvpress convention by default: the window
      counts inside ``floor(n*ratio)``; ``ratio_of="prefix"`` keeps that fraction of the
      prefix with the window on top), ``capacity`` (per KV head, window included) or
      ``budget`` (prefix tokens per (layer, KV head), window excluded).
    - selection: ``select_params`` (a :class:`SelectParams`; its budget is replaced), or
      ``allocator`` (uniform, ada, pyramid, lava, global), ``granularity`` (head, layer,
      token), ``normalize``, ``alpha``, ``beta``, ``post_pool`` (``(kind, kernel, decay)``).
      Default allocator per preset: uniform, but lava → lava, laprox → global, and
      laprox-span and uniqueness → laprox-span's selection (global, token granularity,
      forward pooling 9 / 1.0, the sink left out).
    - ``value_links``: a threshold (LaProx-span: ``LINK_THRESHOLD`` = 0.5) — the values'
      links (:func:`accumulate_value_links` over every layer) carry the forward post-pool
      on through runs of similar values (``kve_select_model_linked``); needs ``values``.
    - criticalkv: ``critical_first_stage`` defaults to kvpress's
      ``max(floor(first_stage_ratio * (budget + window)), 1) - window`` (ratio 0.5).
    - ``details=True`` returns a dict: kept, offsets, indices, scores, budget,
      score_params, select_params.
    """
    if value_links is not None and values is None:
        raise ValueError("select_kept: value_links needs values")
    params = make_score_params(preset, window, **score_fields)
    w = params.window
    L = len(keys)
    hkv, n = keys[0].shape[0], keys[0].shape[1]
    b = _budget(n, w, keep_ratio, budget, capacity, ratio_of)
    if params.scorer == "criticalkv" and "critical_first_stage" not in score_fields:
        total = b + min(w, n)
        params.critical_first_stage = max(max(int(first_stage_ratio * total), 1) - min(w, n), 0)
    name = preset if isinstance(preset, str) else None
    if select_params is not None:
        sp = select_params.replace(budget=b)
    elif allocator is None and name is not None:
        sp = SelectParams.preset(name, b)  # the library's default selection of the preset
    else:
        sp = SelectParams(allocator or "uniform", granularity or "head", b)
    if granularity is not None:
        sp.granularity = granularity
    for k, v in (("normalize", normalize), ("alpha", alpha), ("beta", beta)):
        if v is not None:
            setattr(sp, k, v)
    if post_pool is not None:
        kind, kernel, decay = (tuple(post_pool) + (1.0,))[:3] if not isinstance(post_pool, str) \
            else (post_pool, 1, 1.0)
        sp.post_pool_kind, sp.post_pool_kernel, sp.post_pool_decay = kind, kernel, decay
    scores = score_model(params, queries, keys, values, wo, gram_cache=gram_cache, threads=threads)
    links = None
    if value_links is not None:
        links = np.zeros(n, np.float32)
        for v in values:
            accumulate_value_links(v, links)
    offsets, indices = select_model(sp, scores, n, w, links=links,
                                    link_threshold=0.5 if value_links is None else value_links)
    kept = kept_lists(offsets, indices, L, hkv)
    if details:
        return {"kept": kept, "offsets": offsets, "indices": indices, "scores": scores,
                "budget": b, "score_params": params, "select_params": sp}
    return kept
