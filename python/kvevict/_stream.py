"""Scoring a layer's keys from any stream of queries (``kve_stream_*``, ``src/math/stream.rs``).

A :class:`StreamScorer` owns the accumulator state of one layer: feed it query chunks with
their positions (reconstruction queries after the context, the prefill's own queries, or
decode-time queries as tokens arrive), then ask for scores ``[Hkv, N]`` for every key.
"""
import ctypes

import numpy as np

from ._core import GQA, POOLS, _Enum, call, floats, make_tensor, ptr
from ._lib import kve_stream_score_params

STREAM_STATS = _Enum("stat", {"max": 0, "mean": 1, "mean-visible": 2, "laprox": 3})

_u64 = ctypes.c_uint64


def _size(name, *args):
    v = _u64()
    call(name, *args, ctypes.byref(v))
    return int(v.value)


def _pool(spec, what):
    """``None`` / ``"none"`` → no pooling; ``(kind, kernel)`` or ``(kind, kernel, decay)``."""
    if spec is None:
        return 0, 1, 1.0
    if isinstance(spec, str):
        spec = (spec, 1)
    if not isinstance(spec, (tuple, list)) or len(spec) not in (2, 3):
        raise TypeError(f"{what}: expected None or (kind, kernel[, decay]), got {spec!r}")
    decay = spec[2] if len(spec) == 3 else (0.9 if POOLS.encode(spec[0]) == 3 else 1.0)
    return POOLS.encode(spec[0]), int(spec[1]), float(decay)


class StreamScorer:
    """The accumulator of one layer of ``hq`` query heads, ``hkv`` KV heads, ``n`` cached
    keys of dim ``dk`` (``kve_stream_init``). The state is a plain ``uint8`` array
    (:attr:`state`): copy it to save, assign it back to restore."""

    def __init__(self, hq, hkv, n, dk):
        self.shape = (int(hq), int(hkv), int(n), int(dk))
        nbytes = _size("kve_stream_state_size", *self.shape)
        # u64 storage: the library wants the state 8-byte aligned
        self._words = np.zeros((nbytes + 7) // 8, np.uint64)
        self._bytes = nbytes
        call("kve_stream_init", self._words.ctypes.data, nbytes, *self.shape)
        self._ws = np.empty(0, np.uint8)

    @property
    def state(self):
        """The state's bytes (a view: copy it to keep a snapshot)."""
        return self._words.view(np.uint8)[: self._bytes]

    @state.setter
    def state(self, value):
        value = np.asarray(value, np.uint8).reshape(-1)
        if value.size != self._bytes:
            raise ValueError(f"state must be {self._bytes} bytes, got {value.size}")
        self._words.view(np.uint8)[: self._bytes] = value

    @property
    def query_count(self):
        """Queries fed so far (``kve_stream_query_count``)."""
        return _size("kve_stream_query_count", self._words.ctypes.data, self._bytes)

    def stats(self):
        """The raw statistics (``kve_stream_stats``), copies: ``max``, ``sum``, ``sq``
        float32 ``[Hq, N]`` (``max_j A``, ``Σ_j A``, ``Σ_j A²``), ``visible`` int64 ``[N]``
        (how many fed queries saw each key) and ``queries`` (how many were fed)."""
        hq, _, n, _ = self.shape
        arrays = [np.empty((hq, n), np.float32) for _ in range(3)]
        seen = np.empty(n, np.uint64)
        call("kve_stream_stats", self._words.ctypes.data, self._bytes,
             *(ptr(a) for a in arrays), hq * n, ptr(seen), n)
        visible = np.cumsum(seen[::-1].astype(np.int64))[::-1]
        return {"max": arrays[0], "sum": arrays[1], "sq": arrays[2], "visible": visible,
                "queries": self.query_count}

    def feed(self, queries, positions, keys, row_lse=None, *, dtype=None):
        """Feed ``queries`` ``[Hq, c, dk]`` (post-RoPE) at ``positions`` (``c`` ints,
        non-decreasing, after every position fed before) against ``keys`` ``[Hkv, N, dk]``:
        a query at position ``p`` sees keys ``i <= min(p, N-1)``. ``row_lse`` (optional,
        ``[Hq, c]``): each row's log-sum-exp over its visible keys. Tensors: any strides,
        float32 / float16 / bfloat16. Raises :class:`KvevictError` (state unchanged) on
        positions going backwards, NaN/Inf, shapes other than the scorer's."""
        q = make_tensor(queries, "queries", dtype)
        k = make_tensor(keys, "keys", dtype)
        pos = np.ascontiguousarray(np.asarray(positions).reshape(-1), dtype=np.int64)
        c = q.array.shape[1]
        need = _size("kve_stream_feed_workspace_size", *self.shape, max(c, 1))
        if self._ws.size < need:
            self._ws = np.empty(need, np.uint8)
        lse = None if row_lse is None else floats(row_lse, "row_lse").reshape(-1)
        lse_ptr = ptr(lse) if lse is not None and lse.size else None
        if lse is not None and lse.size == 0:
            lse_ptr, lse = self._ws.ctypes.data, np.zeros(0, np.float32)  # given but empty
        call("kve_stream_feed", self._words.ctypes.data, self._bytes, ctypes.byref(q.c),
             ptr(pos), pos.size, ctypes.byref(k.c), lse_ptr,
             0 if lse is None else lse.size, ptr(self._ws), self._ws.size)
        return self

    def scores(self, stat="max", gqa="max", pool=None, post_pool=None, *, value_forms=None,
               values=None, gram=None, dtype=None, out=None):
        """Scores float32 ``[Hkv, N]`` for every key (``kve_stream_scores``): per query head
        ``stat`` (``"max"``, ``"mean"``, ``"mean-visible"``, ``"laprox"``), then ``pool``,
        the GQA reduction ``gqa`` (``"mean"``, ``"max"``, ``"sum"``), then ``post_pool``;
        pools as ``(kind, kernel[, decay])``, e.g. ``("forward", 8, 0.9)``. LaProx's value
        term: ``value_forms`` from :func:`compute_value_forms` (``cross=False``), or
        ``values`` ``[Hkv, N, dv]`` with ``gram`` from :func:`compute_gram` (``cross=False``).
        Select with window 0 (the stream keeps nothing by itself)."""
        p = kve_stream_score_params()
        call("kve_stream_score_params_init", ctypes.byref(p), ctypes.sizeof(p))
        p.stat = STREAM_STATS.encode(stat)
        p.gqa = GQA.encode(gqa)
        p.pool_kind, p.pool_kernel, p.pool_decay = _pool(pool, "pool")
        p.post_pool_kind, p.post_pool_kernel, p.post_pool_decay = _pool(post_pool, "post_pool")
        keep = []
        vt = None
        if values is not None:
            v = make_tensor(values, "values", dtype)
            keep.append(v)
            vt = ctypes.byref(v.c)
        arrays = []
        for name, a in (("gram", gram), ("value_forms", value_forms)):
            a = None if a is None else floats(a, name).reshape(-1)
            arrays.append(a)
        g, f = arrays
        hq, hkv, n, dk = self.shape
        ws = np.empty(_size("kve_stream_scores_workspace_size", hq, hkv, n, dk), np.uint8)
        if out is None:
            out = np.empty((hkv, n), np.float32)
        elif out.dtype != np.float32 or not out.flags.c_contiguous or out.size < hkv * n:
            raise ValueError(f"out must be C-contiguous float32 with >= {hkv * n} elements")
        call("kve_stream_scores", self._words.ctypes.data, self._bytes, ctypes.byref(p), vt,
             ptr(g), 0 if g is None else g.size, ptr(f), 0 if f is None else f.size,
             ptr(out), out.size, ptr(ws), ws.size)
        return out if out.shape == (hkv, n) else out.reshape(-1)[: hkv * n].reshape(hkv, n)
