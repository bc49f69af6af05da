"""``kvevict.Evictor``: one object runs a whole model's eviction (``kve_evictor_*``).

It holds the policy (a keep ratio of what is new since the last compression, or a cell
budget "past ``high``, evict down to ``low``"), per sequence state and, for LaProx, the
Gram blocks of every layer's ``Wo``; its memory is one numpy buffer it owns.
"""
import ctypes

import numpy as np

from ._api import _wo, kept_lists
from ._core import DTYPES, GRANULARITIES, PRESETS, call, floats, make_tensor, ptr
from ._core import KvevictError, lib
from ._lib import (kve_evictor_config, kve_evictor_layer, kve_evictor_options,
                   kve_evictor_paged_layer, kve_evictor_requirements, kve_evictor_stats)
from ._paged import _layout, _table

# KVE_MARK_SHARE_DEFAULT (include/kvevict.h)
MARK_SHARE_DEFAULT = 0.75
# KVE_MARK_SPLIT_SHARE / KVE_MARK_SPLIT_SPANS: kve_evictor_round's mark_split
MARK_SPLIT_SHARE = 0
MARK_SPLIT_SPANS = 1

_POLICY_EXPLICIT, _POLICY_KEEP_RATIO, _POLICY_CELLS = 0, 1, 2
_WO = {0: None, 1: "once", 2: "every-round"}


class Evictor:
    """A whole model's eviction for ``max_seqs`` sequences of at most ``max_cells`` cells.

    - ``preset``: a preset name (``kvevict.PRESET_NAMES``); ``score_params`` /
      ``select_params`` (:class:`ScoreParams`, :class:`SelectParams`) override its scoring
      and selection (the selection's budget is the policy's), ``window`` and
      ``granularity`` ("head", "layer", "token") override those.
    - model: ``layers, hq, hkv, dk``, ``dv`` (default ``dk``), ``d_model`` (for methods
      that read ``Wo``: see :attr:`requirements`).
    - policy, at most one: ``keep_ratio`` (keep ``max(floor(new*ratio), min_keep)`` of the
      cells new since the last compression, the window inside), ``cells`` (``high`` or
      ``(high, low)``: past ``high`` cells evict down to ``low``, default ``high - high//8``);
      neither: the engine's own targets (:meth:`begin`).
    - ``link_threshold``: value links (``kvevict.LINK_THRESHOLD``) for the selections with
      a flat forward post-pool (laprox-span, uniqueness).
    - ``paged``: K/V come from paged pools (:meth:`score_layer_paged`,
      :meth:`compact_paged`): ``True`` or the pools' largest dtype (``"float32"``,
      ``"float16"``, ``"bfloat16"``; ``True`` is float32); the context then holds one
      layer's K and V gathered from the pool.

    A round: :meth:`plan` → :meth:`begin` → :meth:`score_layer` per layer → :meth:`select`
    → :meth:`kept` / :meth:`kept_cells` / :meth:`evicted_cells` / :meth:`compact` →
    :meth:`commit`; :meth:`evict` runs one on whole-model tensors.
    """

    def __init__(self, preset, *, layers, hq, hkv, dk, dv=None, d_model=0, max_cells,
                 max_seqs=1, keep_ratio=None, min_keep=64, cells=None, window=None,
                 granularity=None, link_threshold=None, score_params=None, select_params=None,
                 paged=None):
        c = evictor_config(preset, layers=layers, hq=hq, hkv=hkv, dk=dk, dv=dv, d_model=d_model,
                           max_cells=max_cells, max_seqs=max_seqs, keep_ratio=keep_ratio,
                           min_keep=min_keep, cells=cells, window=window,
                           granularity=granularity, link_threshold=link_threshold,
                           score_params=score_params, select_params=select_params, paged=paged)
        size = ctypes.c_uint64()
        call("kve_evictor_size", ctypes.byref(c), ctypes.byref(size))
        self._mem = np.empty(size.value, np.uint8)
        self._ev = ctypes.c_void_p()
        call("kve_evictor_init", ptr(self._mem), self._mem.size, ctypes.byref(c),
             ctypes.byref(self._ev))
        self.layers, self.hq, self.hkv, self.max_cells = layers, hq, hkv, max_cells
        self.requirements = requirements("kve_evictor_get_requirements", self._ev)
        """What to capture: ``queries``, ``values``, ``wo`` (None, "once": give it to
        :meth:`set_output_projection`, "every-round": to :meth:`score_layer`),
        ``row_lse_helps``, ``window``, ``granularity``."""

    def set_output_projection(self, layer, wo):
        """``wo`` ``[Hq, dv, D]`` or ``[Hq*dv, D]`` of ``layer`` (methods with ``wo ==
        "once"``): its Gram blocks are kept, ``wo`` may be dropped."""
        t = _wo(wo, self.hq, None, "Evictor.set_output_projection")
        call("kve_evictor_set_output_projection", self._ev, layer, ctypes.byref(t.c))

    def observe_queries(self, seq, layer, queries):
        """Keep the last ``window`` rows of ``queries`` ``[Hq, c, dk]`` (this ubatch's rows of
        ``seq`` at ``layer``, in position order), for scoring without queries."""
        t = make_tensor(queries, "queries")
        call("kve_evictor_observe_queries", self._ev, seq, layer, ctypes.byref(t.c))

    def plan(self, seq, n_cells):
        """The cells ``seq`` should hold now that it holds ``n_cells`` (``n_cells``: nothing
        to do)."""
        target = ctypes.c_uint64()
        call("kve_evictor_plan", self._ev, seq, n_cells, ctypes.byref(target))
        return int(target.value)

    def begin(self, seq, n_cells, target):
        """Start a round on ``seq``'s ``n_cells`` cells ending at ``target`` cells."""
        call("kve_evictor_begin", self._ev, seq, n_cells, target)

    def mark_cells(self, seq, flags, share=None):
        """Mark cells of ``seq``'s begun round (before :meth:`select`): ``flags`` (one per
        cell of the round, nonzero: marked) hold text the engine was given (user turns, a
        system prompt); ``share`` of each unit's prefix budget is reserved for them
        (None: ``KVE_MARK_SHARE_DEFAULT``). For this round only."""
        f = np.ascontiguousarray(flags, dtype=np.uint8)
        s = MARK_SHARE_DEFAULT if share is None else float(share)
        call("kve_evictor_mark_cells", self._ev, seq, ptr(f), f.size, s)

    def score_layer(self, seq, layer, keys, values=None, queries=None, row_lse=None, wo=None):
        """Score ``layer`` of the round: ``keys`` / ``values`` ``[Hkv, n, d]``, ``queries``
        ``[Hq, wq, dk]`` (None: the observed ones), ``row_lse`` ``[Hq, w]``, ``wo`` (methods
        with ``wo == "every-round"``)."""
        v = kve_evictor_layer()
        call("kve_evictor_layer_init", ctypes.byref(v), ctypes.sizeof(v))
        keep = [make_tensor(keys, "keys")]
        v.keys = keep[0].c
        if values is not None:
            keep.append(make_tensor(values, "values"))
            v.values = keep[-1].c
        self._side_inputs(v, keep, queries, row_lse, wo, "Evictor.score_layer")
        call("kve_evictor_score_layer", self._ev, seq, layer, ctypes.byref(v))

    def _side_inputs(self, v, keep, queries, row_lse, wo, what):
        """``queries``, ``row_lse`` and ``wo`` into a layer struct ``v`` (arrays kept alive
        in ``keep``)."""
        if queries is not None:
            keep.append(make_tensor(queries, "queries"))
            v.queries = keep[-1].c
        if wo is not None:
            keep.append(_wo(wo, self.hq, None, what))
            v.wo = keep[-1].c
        if row_lse is not None:
            keep.append(floats(row_lse, "row_lse"))
            v.row_lse, v.row_lse_len = ptr(keep[-1]), keep[-1].size

    def score_layer_paged(self, seq, layer, keys, table, values=None, queries=None, row_lse=None,
                          wo=None, *, layout="nhd", dtype=None):
        """:meth:`score_layer` with K and V in paged pools (an evictor made with ``paged``):
        ``keys`` / ``values`` 4-D caches as :func:`kvevict.paged_gather` reads them
        (``layout`` "nhd" ``[blocks, slots, Hkv, d]`` or "hnd" ``[blocks, Hkv, slots, d]``,
        any strides: :func:`kvevict.pool_tensor` slices an engine's pool), ``table`` the
        sequence's block ids (K and V share it; the round's ``n_cells`` tokens are read).
        Kept sets are bit-identical to :meth:`score_layer` on the same K/V."""
        v = kve_evictor_paged_layer()
        call("kve_evictor_paged_layer_init", ctypes.byref(v), ctypes.sizeof(v))
        v.keys, ka = _layout(keys, layout, dtype, False, "keys")
        keep = [ka]
        if values is not None:
            v.values, va = _layout(values, layout, dtype, False, "values")
            keep.append(va)
        t = _table(table)
        keep.append(t)
        v.table, v.table_len = t.ctypes.data, t.size
        self._side_inputs(v, keep, queries, row_lse, wo, "Evictor.score_layer_paged")
        call("kve_evictor_score_layer_paged", self._ev, seq, layer, ctypes.byref(v))

    def select(self, seq):
        """Select the round's kept set once every layer is scored; returns the number of
        cells some (layer, KV head) keeps."""
        n = ctypes.c_uint64()
        call("kve_evictor_select", self._ev, seq, ctypes.byref(n))
        return int(n.value)

    def _cells(self, fn, seq):
        out = np.empty(self.max_cells, np.uint32)
        n = ctypes.c_uint64()
        call(fn, self._ev, seq, ptr(out), out.size, ctypes.byref(n))
        return out[: n.value].copy()

    def kept_cells(self, seq):
        """The cells some (layer, KV head) keeps, ascending uint32."""
        return self._cells("kve_evictor_kept_cells", seq)

    def evicted_cells(self, seq):
        """The cells no (layer, KV head) keeps, ascending uint32 (what a shared-cell engine
        removes)."""
        return self._cells("kve_evictor_evicted_cells", seq)

    def kept_lists(self, seq):
        """The selection as ``(offsets, indices)``, as :func:`kvevict.select_model` returns it."""
        offsets = np.empty(self.layers * self.hkv + 1, np.uint64)
        indices = np.empty(self.layers * self.hkv * self.max_cells, np.uint32)
        call("kve_evictor_kept_lists", self._ev, seq, ptr(offsets), offsets.size, ptr(indices),
             indices.size)
        return offsets, indices[: offsets[-1]].copy()

    def kept(self, seq):
        """``kept[l][kh]``: ascending int64 cells per layer and KV head."""
        return kept_lists(*self.kept_lists(seq), self.layers, self.hkv)

    def compact(self, seq, layer, kv):
        """Move ``layer``'s kept rows of ``kv`` (``[Hkv, n, d]``, writable) to the front of
        each head, in place."""
        t = make_tensor(kv, "kv", writable=True)
        call("kve_evictor_compact", self._ev, seq, layer, ctypes.byref(t.c))

    def compact_paged(self, seq, layer, cache, table, *, layout="nhd", dtype=None):
        """Move ``layer``'s kept tokens of ``cache`` (K or V in a paged pool, writable; as
        :meth:`score_layer_paged` reads it) to the front of the sequence's own blocks, in
        place, order kept. Returns ``blocks_freed``: the sequence's trailing table entries
        (of its first ``ceil(n_cells / block_size)``) that hold nothing now, for the
        engine's block manager. Nothing is written on error."""
        c, _ = _layout(cache, layout, dtype, True)
        t = _table(table)
        freed = ctypes.c_uint64()
        call("kve_evictor_compact_paged", self._ev, seq, layer, ctypes.byref(c), ptr(t), t.size,
             ctypes.byref(freed))
        return int(freed.value)

    def commit(self, seq):
        """``seq`` now holds the kept cells of its selected round."""
        call("kve_evictor_commit", self._ev, seq)

    def reset(self, seq):
        """Forget ``seq``: counters, protection, round, observed queries."""
        call("kve_evictor_seq_reset", self._ev, seq)

    def unprotect(self, seq):
        """The engine changed ``seq``'s cells itself: forget its protection and round,
        keep its observed queries and counters."""
        call("kve_evictor_seq_unprotect", self._ev, seq)

    def stats(self, seq):
        """``seq``'s counters: cells, protected_cells, evictions, cells_evicted, ragged."""
        return stats("kve_evictor_get_stats", self._ev, seq)

    def evict(self, seq, keys, values=None, queries=None, *, wo=None, target=None):
        """One round on whole-model tensors (``keys[l]`` ``[Hkv, n, dk]``, ``values[l]``,
        ``queries[l]`` ``[Hq, wq, dk]``, ``wo[l]`` for "every-round" methods) to ``target``
        cells (default: :meth:`plan`'s). Returns ``kept[l][kh]``, or None when there is
        nothing to evict. The caller removes the cells, then calls :meth:`commit`."""
        n = keys[0].shape[1]
        target = self.plan(seq, n) if target is None else target
        if target >= n:
            return None
        self.begin(seq, n, target)
        need = self.requirements
        for l in range(self.layers):
            self.score_layer(seq, l, keys[l], values[l] if need["values"] else None,
                             queries[l] if need["queries"] and queries is not None else None,
                             wo=wo[l] if need["wo"] == "every-round" else None)
        self.select(seq)
        return self.kept(seq)


def evictor_config(preset, *, layers, hq, hkv, dk, dv=None, d_model=0, max_cells, max_seqs=1,
                   keep_ratio=None, min_keep=64, cells=None, window=None, granularity=None,
                   link_threshold=None, score_params=None, select_params=None, paged=None):
    """The ``kve_evictor_config`` of :class:`Evictor`'s arguments (the host and device forms
    take the same ones). ``score_params`` / ``select_params`` are referenced by address:
    keep them alive until the evictor is initialised."""
    if keep_ratio is not None and cells is not None:
        raise ValueError("Evictor: give keep_ratio or cells, not both")
    c = kve_evictor_config()
    call("kve_evictor_config_init", ctypes.byref(c), ctypes.sizeof(c), PRESETS.encode(preset))
    c.layers, c.hq, c.hkv, c.dk = layers, hq, hkv, dk
    c.dv, c.d_model = dk if dv is None else dv, d_model
    c.max_cells, c.max_seqs = max_cells, max_seqs
    if keep_ratio is not None:
        c.policy, c.keep_ratio, c.min_keep = _POLICY_KEEP_RATIO, keep_ratio, min_keep
    elif cells is not None:
        high, low = (cells, 0) if np.ndim(cells) == 0 else cells
        c.policy, c.high, c.low = _POLICY_CELLS, high, low
    if window is not None:
        c.window = window
    if granularity is not None:
        c.granularity = GRANULARITIES.encode(granularity)
    if link_threshold is not None:
        c.link_threshold = link_threshold
    if paged is not None and paged is not False:
        c.paged, c.paged_dtype = 1, DTYPES.encode("float32" if paged is True else paged)
    # the library decodes both structs in kve_evictor_init and keeps no pointer
    if score_params is not None:
        c.score = ctypes.addressof(score_params._c)
    if select_params is not None:
        c.select = ctypes.addressof(select_params._c)
    return c


# KVE_OPTIONS_* (include/kvevict.h)
_NO_WO_EVERY_ROUND, _TOKEN_CELLS = 1, 2


def preset_list(no_wo_every_round=False):
    """The preset names (``kve_preset_list``): all, or those an engine that cannot give
    ``Wo`` with every round may run (criticalkv left out)."""
    return lib.kve_preset_list(_NO_WO_EVERY_ROUND if no_wo_every_round else 0).decode().split(", ")


def evictor_options(method=None, *, window=0, keep_ratio=0.0, max_cells=0, evict_to=0.75,
                    link_threshold=0.0, no_wo_every_round=False, token_cells=False):
    """An engine's eviction flags read and checked by the library
    (``kve_evictor_options_apply``): a dict of the config it gives (``preset``, ``window``,
    ``granularity``, ``policy`` ("explicit", "keep-ratio", "cells"), ``keep_ratio``,
    ``high``, ``low``, ``link_threshold``) and the method's ``requirements``. A refusal
    raises :class:`KvevictError` whose ``detail`` is the library's sentence naming what
    to change. ``method`` None: laprox-span."""
    o = kve_evictor_options()
    o.struct_size = ctypes.sizeof(o)
    o.flags = (_NO_WO_EVERY_ROUND if no_wo_every_round else 0) | (_TOKEN_CELLS if token_cells else 0)
    o.method = None if method is None else str(method).encode()
    o.max_cells, o.window, o.link_threshold = max_cells, window, link_threshold
    o.keep_ratio, o.evict_to = keep_ratio, evict_to
    c, r, msg = kve_evictor_config(), kve_evictor_requirements(), ctypes.c_char_p()
    st = lib.kve_evictor_options_apply(ctypes.byref(o), ctypes.byref(c), ctypes.sizeof(c),
                                       ctypes.byref(r), ctypes.sizeof(r), ctypes.byref(msg))
    if st != 0:
        raise KvevictError(st, "kve_evictor_options_apply", (msg.value or b"").decode())
    return {
        "preset": PRESETS.decode(c.preset), "window": c.window,
        "granularity": None if c.granularity == 0xFFFFFFFF else GRANULARITIES.decode(c.granularity),
        "policy": {_POLICY_EXPLICIT: "explicit", _POLICY_KEEP_RATIO: "keep-ratio",
                   _POLICY_CELLS: "cells"}[c.policy],
        "keep_ratio": c.keep_ratio, "high": c.high, "low": c.low,
        "link_threshold": c.link_threshold,
        "requirements": {"queries": bool(r.queries), "values": bool(r.values), "wo": _WO[r.wo],
                         "window": r.window, "granularity": GRANULARITIES.decode(r.granularity)},
    }


def requirements(fn, ev):
    """What an evictor needs captured (``fn``: the host or device ``get_requirements``)."""
    r = kve_evictor_requirements()
    call(fn, ev, ctypes.byref(r), ctypes.sizeof(r))
    return {
        "queries": bool(r.queries), "values": bool(r.values), "wo": _WO[r.wo],
        "row_lse_helps": bool(r.row_lse_helps), "window": r.window,
        "granularity": GRANULARITIES.decode(r.granularity),
    }


def stats(fn, ev, seq):
    """A sequence's counters (``fn``: the host or device ``get_stats``)."""
    s = kve_evictor_stats()
    call(fn, ev, seq, ctypes.byref(s), ctypes.sizeof(s))
    return {"cells": s.cells, "protected_cells": s.protected_cells, "evictions": s.evictions,
            "cells_evicted": s.cells_evicted, "ragged": bool(s.ragged)}
