"""Paged KV caches (``kve_paged_*``): a layer's K or V in a block pool, reached through a
sequence's block table, as vLLM, SGLang, FlashInfer and TensorRT-LLM keep them.

A cache is a 4-D numpy array (any non-negative element strides, so a slice of a stacked
pool is described in place, never copied): ``layout="nhd"`` reads its axes as
``[blocks, slots, heads, dim]``, ``"hnd"`` as ``[blocks, heads, slots, dim]``.
:func:`pool_tensor` slices the engines' whole pools. Token ``t`` of a sequence is in
block ``table[t // block_size]``, slot ``t % block_size``.

Per layer: :func:`paged_gather` K and V (``[heads, n, dim]`` arrays for :func:`score_layer`
and every other function that reads K or V; scores bit-identical to the contiguous
path), then after the selection :func:`paged_compact` K and V of every layer with the
same lists; the trailing ``blocks_freed`` table entries go back to the engine's pool.
"""
import ctypes

import numpy as np

from ._api import _unit_offsets
from ._core import _lib_dtype, call, element_strides, ptr
from ._lib import kve_paged_layout, kve_tensor

_u64 = ctypes.c_uint64

# kind -> (axis order of the 4-D tensor, how to slice it out of the pool array, pool ndim)
POOL_KINDS = {
    "nhd": ("nhd", lambda p, kv, layer: p, 4),                      # [nb, bs, H, d]
    "nhd-kv-inner": ("nhd", lambda p, kv, layer: p[:, kv], 5),      # [nb, 2, bs, H, d]
    "nhd-kv-outer": ("nhd", lambda p, kv, layer: p[kv], 5),         # [2, nb, bs, H, d]
    "hnd": ("hnd", lambda p, kv, layer: p, 4),                      # [nb, H, bs, d]
    "hnd-kv-inner": ("hnd", lambda p, kv, layer: p[:, kv], 5),      # [nb, 2, H, bs, d]
    "trtllm": ("hnd", lambda p, kv, layer: p[:, layer, kv], 6),     # [nb, L, 2, H, bs, d]
}


def pool_tensor(pool, kind, *, kv=0, layer=0):
    """One K (``kv=0``) or V (``kv=1``) tensor of an engine's pool array, and its layout:
    ``(cache, layout)`` for :func:`paged_gather` / :func:`paged_compact`. Kinds:
    ``nhd`` ``[nb, bs, H, d]`` (vLLM/FlashAttention per K or V, FlashInfer NHD),
    ``nhd-kv-inner`` ``[nb, 2, bs, H, d]`` (FlashInfer, vLLM's FlashInfer backend),
    ``nhd-kv-outer`` ``[2, nb, bs, H, d]`` (vLLM's FlashAttention backend), ``hnd``
    ``[nb, H, bs, d]``, ``hnd-kv-inner`` ``[nb, 2, H, bs, d]``, ``trtllm``
    ``[nb, layers, 2, H, bs, d]`` (TensorRT-LLM, every layer in a block). A view, no copy."""
    pool = np.asarray(pool) if not isinstance(pool, np.ndarray) else pool
    return slice_pool(pool, kind, kv, layer)


def slice_pool(pool, kind, kv, layer):
    """:func:`pool_tensor` on any array with ``ndim``, ``shape`` and numpy-style indexing
    (a numpy array, a torch tensor of any device)."""
    if kind not in POOL_KINDS:
        raise ValueError(f"kind: {kind!r} is not one of {sorted(POOL_KINDS)}")
    layout, take, ndim = POOL_KINDS[kind]
    if pool.ndim != ndim:
        raise ValueError(f"pool: a {kind} pool is {ndim}-D, got shape {tuple(pool.shape)}")
    if kv not in (0, 1):
        raise ValueError(f"kv: 0 (K) or 1 (V), got {kv!r}")
    if kind == "trtllm" and not 0 <= layer < pool.shape[1]:
        raise ValueError(f"layer: {layer} outside the pool's {pool.shape[1]} layers")
    return take(pool, kv, layer), layout


def _layout(cache, layout, dtype, writable, what="cache"):
    """A ``kve_paged_layout`` over a 4-D cache array; returns (struct, array). Errors name
    the argument ``what``."""
    if layout not in ("nhd", "hnd"):
        raise ValueError(f"layout: 'nhd' or 'hnd', got {layout!r}")
    orig = np.asarray(cache) if not isinstance(cache, np.ndarray) else cache
    if orig.ndim != 4:
        raise ValueError(f"{what}: expected a 4-D array [blocks, {'slots, heads' if layout == 'nhd' else 'heads, slots'}, dim], got shape {orig.shape}")
    a, code = _lib_dtype(orig, dtype)
    if a is not orig:
        raise ValueError(f"{what}: dtype {orig.dtype} would need a converted copy of the pool; "
                         "pass float32, float16 or bfloat16 (uint16 bits with dtype='bfloat16')")
    if writable and not a.flags.writeable:
        raise ValueError(f"{what}: array is read-only")
    if a.size == 0:
        raise ValueError(f"{what}: empty array, shape {a.shape}")
    item = a.dtype.itemsize
    if any(s < 0 or s % item for s in a.strides):
        raise ValueError(f"{what}: strides {a.strides} (bytes) are negative or not a multiple of "
                         f"the item size {item}: the pool cannot be described in place")
    _, strides = element_strides(a, False, what)
    return layout_struct(a.ctypes.data, code, a.shape, strides, layout), a


def layout_struct(data, code, shape, strides, layout):
    """A ``kve_paged_layout`` over a 4-D pool tensor at address ``data`` (host or device)
    of ``shape`` and element ``strides``, its axes read as ``layout`` says."""
    nb, x, y, d = shape
    sb, sx, sy, sd = strides
    bs, h, ss, sh = (x, y, sx, sy) if layout == "nhd" else (y, x, sy, sx)
    c = kve_paged_layout()
    c.data = data
    c.len = 1 + sum((e - 1) * s for e, s in zip(shape, strides))
    c.dtype = code
    c.num_blocks, c.block_size, c.heads, c.dim = nb, bs, h, d
    for i, s in enumerate((sb, ss, sh, sd)):
        c.stride[i] = s
    return c


def _table(table):
    t = np.asarray(table)
    if t.ndim != 1 or t.dtype.kind not in "iu":
        raise ValueError(f"table: a 1-D integer array of block ids, got {t.dtype} shape {t.shape}")
    if t.dtype.itemsize == 4:
        return np.ascontiguousarray(t).view(np.uint32)  # int32 -1 padding: refused by the library
    if t.size and (t.max() > 0xFFFFFFFF):
        raise ValueError("table: block ids above 2^32 - 1")
    return np.ascontiguousarray(np.where(t < 0, 0xFFFFFFFF, t).astype(np.uint32))


def paged_gather(cache, table, n, *, layout="nhd", dtype=None):
    """The first ``n`` tokens of a sequence as a head-major ``[heads, n, dim]`` array of the
    cache's dtype (``kve_paged_gather``: raw bits). ``table`` (int32 or uint32 block ids,
    at least ``ceil(n / block_size)`` of them; later entries are not read). Errors
    (:class:`KvevictError`): an entry outside the pool (``KVE_ERR_OUT_OF_BOUNDS``), a
    repeated entry (``KVE_ERR_ALIASING``), a table shorter than ``n`` needs
    (``KVE_ERR_SHAPE_MISMATCH``)."""
    c, a = _layout(cache, layout, dtype, False)
    t = _table(table)
    nbytes = _u64()
    call("kve_paged_gather_size", ctypes.byref(c), int(n), ctypes.byref(nbytes))
    dst = np.empty(max(int(nbytes.value), 1), np.uint8)
    out = kve_tensor()
    call("kve_paged_gather", ctypes.byref(c), ptr(t), t.size, int(n), dst.ctypes.data, dst.size,
         ctypes.byref(out))
    start = out.data - dst.ctypes.data
    count = int(out.extent[0] * out.extent[1] * out.extent[2])
    flat = dst[start: start + count * a.dtype.itemsize].view(a.dtype)
    return flat.reshape(int(out.extent[0]), int(out.extent[1]), int(out.extent[2]))


def paged_compact(cache, table, n, offsets, indices, *, layout="nhd", first_unit=0, shared=False,
                  positions=None, dtype=None):
    """Block-aligned compaction in place (``kve_paged_compact``): the kept tokens of a
    sequence move to the front of its own blocks, order kept. The kept lists are units
    ``first_unit ..`` of ``(offsets, indices)`` as :func:`select_model` gives them: one per
    head, or with ``shared=True`` unit ``first_unit``'s list for every head (token
    granularity: the only one that frees blocks when a block holds every head).
    ``positions`` (``[n]``, optional): the tokens' original positions (token ``i`` is at
    ``i`` when absent). Returns ``(blocks_freed, kept_positions, lengths)``: the sequence's
    table entries ``table[ceil(max(lengths) / block_size):]`` of its first
    ``ceil(n / block_size)`` are free; ``kept_positions`` (uint32, list order) are the kept
    tokens' positions; ``lengths`` (uint32 ``[heads]``). Nothing is written on error."""
    c, a = _layout(cache, layout, dtype, True)
    t = _table(table)
    heads = int(c.heads)
    o = _unit_offsets(offsets, first_unit, 1 if shared else heads)
    i = np.ascontiguousarray(indices, dtype=np.uint32)
    p = None
    if positions is not None:
        p = np.ascontiguousarray(positions, dtype=np.uint32)
    kept = np.empty(int(o[-1] - o[0]), np.uint32)
    lengths = np.empty(heads, np.uint32)
    ws_bytes = _u64()
    call("kve_paged_compact_workspace_size", ctypes.byref(c), ctypes.byref(ws_bytes))
    ws = np.empty(max(int(ws_bytes.value), 1), np.uint8)
    freed = _u64()
    call("kve_paged_compact", ctypes.byref(c), ptr(t), t.size, int(n), ptr(o), o.size, ptr(i),
         i.size, ptr(p), 0 if p is None else p.size, ptr(kept), kept.size, ptr(lengths),
         lengths.size, ctypes.byref(freed), ws.ctypes.data, ws.size)
    return int(freed.value), kept, lengths
