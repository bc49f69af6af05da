"""``kvevict.torch``: every entry point of the binding over ``torch.Tensor``, zero-copy.

Each function and class here is the one of :mod:`kvevict` of the same name, taking torch
tensors wherever that one takes numpy arrays (numpy arrays still work) and returning torch
tensors wherever it returns arrays::

    import kvevict.torch as kt
    scores = kt.score_layer("laprox", q, k, v, gram=kt.compute_gram(o_proj.weight.T, hkv, hq=hq))
    offsets, indices = kt.select_model(kvevict.SelectParams("global", "head", budget), scores[None], n, w)

**CPU tensors** are handed to the library as numpy views of their own memory (any
non-negative strides: a transposed V, a token-major K, a slice of a paged pool): nothing is
copied, and what the library writes in place (``compact_in_place``, ``paged_compact``,
``accumulate_value_links``, ``out=``) lands in the tensor. Results are tensors over the
library's output memory (``torch.from_numpy``); index outputs (offsets, indices, kept
positions, cells) come back as ``int64`` (copied: torch indexes with int64).

**CUDA tensors** (a library built with ``--features cuda``): :func:`score_layer` and
:func:`accumulate_value_links` run on the tensors' device, the same call, through their
``data_ptr()`` and strides, enqueued on ``torch.cuda.current_stream()`` (outputs and
workspaces allocated there with torch; nothing synchronises). The device forms of the
selection and compaction are :data:`cuda` (``kt.cuda.select_model`` → per-unit ``counts``
and ``idx`` on the device, ``kt.cuda.compact_in_place`` / ``compact_varlen`` over them),
as is the device evictor ``kt.cuda.Evictor`` (paged pools included: ``kt.pool_tensor`` of a
CUDA pool, ``score_layer_paged`` / ``compact_paged``).
Everything else runs on the host: a CUDA tensor there is an error naming the argument, as
is a CUDA tensor given to a library without CUDA entry points
(:class:`~kvevict.KvevictError` ``KVE_ERR_NOT_BUILT_WITH_CUDA``).

**Refused, before anything is written** (``TypeError`` / ``ValueError`` naming the
argument): a tensor on another device (meta, mps, ...) or on two devices in one call; K, V,
Q, ``wo`` or a cache of a dtype other than float32 / float16 / bfloat16 (no silent
float64 copy); float32-only inputs (scores, gram, value forms, links, ``out``) of another
dtype; a sparse, quantized or conjugated tensor; an output whose elements overlap (an
``expand``-ed view: the library would write one element twice). Strides the library
cannot express do not exist for torch (they are never negative), and a view with strides
the numpy layer would have to copy is never copied for an output.
"""
import ctypes
import functools
import inspect
from collections import OrderedDict
from types import SimpleNamespace

import numpy as np
import torch

from . import _api, _core, _evictor, _paged, _pipeline, _stream
from . import cuda as _kc
from ._core import STATUS_CODES, KvevictError

try:  # bfloat16 numpy views (torch's bf16 memory read as ml_dtypes.bfloat16, no copy)
    import ml_dtypes as _ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes ships with the test venvs
    _ml_dtypes = None

__all__ = [
    "score_layer", "window_row_lse", "compute_gram", "compute_value_forms", "compute_value_l1",
    "select_model", "select_sharded", "ShardedSearch", "accumulate_value_links", "kept_lists",
    "evicted_positions", "compact_in_place", "compact_varlen", "score_model", "select_kept",
    "GramCache", "gram_cache", "StreamScorer", "Evictor", "pool_tensor", "paged_gather",
    "paged_compact", "cuda", "to_numpy", "from_numpy",
]

# ------------------------------------------------------------------- argument classes
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
# K, V, Q, wo, caches: the library's three storage dtypes, read in place
_DATA = {"queries", "keys", "values", "kv", "src", "dst", "wo", "cache", "pool"}
# inputs and outputs the library reads / writes as float32
_F32 = {"gram", "value_forms", "value_l1", "row_lse", "scores", "shards", "links", "out"}
# index arrays (the numpy layer converts them to the integer type the C function takes)
_INDEX = {"offsets", "indices", "table", "positions", "kept", "counts", "idx", "cu_seqlens"}
_BYTES = {"workspace", "value"}
# written by the library, per function: an output must not overlap itself
_WRITTEN = {"compact_in_place": {"kv"}, "paged_compact": {"cache"}, "compact_paged": {"cache"},
            "compact_varlen": {"dst"},
            "accumulate_value_links": {"links"}, "score_layer": {"out"},
            "compute_value_forms": {"out"}, "scores": {"out"}, "compact": {"kv"}}


def _kind(name):
    base = name.split("[", 1)[0]
    for kind, names in (("data", _DATA), ("f32", _F32), ("index", _INDEX), ("bytes", _BYTES)):
        if base in names:
            return kind
    return "any"


def _overlaps(t):
    """Whether two index tuples of ``t`` reach one element (strides sorted: each axis must
    step past everything the smaller axes reach)."""
    reach = 0
    for stride, size in sorted((st, s) for s, st in zip(t.shape, t.stride()) if s > 1):
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def _check_tensor(t, what, kind, written):
    if t.layout != torch.strided:
        raise TypeError(f"{what}: a {t.layout} tensor; kvevict reads dense (strided) tensors")
    if t.is_quantized:
        raise TypeError(f"{what}: a quantized tensor ({t.dtype}); dequantize it first")
    if t.is_complex() or t.is_conj() or t.is_neg():
        raise TypeError(f"{what}: complex / conjugated / negated views are not supported")
    if kind == "data" and t.dtype not in _FLOATS:
        raise TypeError(f"{what}: dtype {t.dtype} is not supported: float32, float16 or bfloat16 "
                        "(read in place; convert it yourself if a copy is what you want)")
    if kind == "f32" and t.dtype != torch.float32:
        raise TypeError(f"{what}: dtype {t.dtype}; the library reads and writes float32 here")
    if kind == "index" and (t.dtype.is_floating_point or t.dtype == torch.bool):
        raise TypeError(f"{what}: dtype {t.dtype}; positions and offsets are integers")
    if kind == "bytes" and t.dtype != torch.uint8:
        raise TypeError(f"{what}: dtype {t.dtype}; byte buffers are uint8")
    if written:
        if _overlaps(t):
            raise ValueError(f"{what}: elements overlap (shape {tuple(t.shape)}, strides "
                             f"{tuple(t.stride())}: an expanded view?); the library writes "
                             "every element once, through the view")
        if t.requires_grad and t.is_leaf:
            raise ValueError(f"{what}: a leaf tensor that requires grad cannot be written in place")


def to_numpy(t, what="tensor", kind="any", written=False):
    """A numpy view of a CPU tensor's memory, same shape and strides (bfloat16 as
    ``ml_dtypes.bfloat16``). Never copies."""
    _check_tensor(t, what, kind, written)
    if t.device.type != "cpu":
        raise ValueError(f"{what}: on {t.device}; this entry point reads host memory (a CPU tensor)")
    t = t.detach()
    if t.dtype == torch.bfloat16:
        if _ml_dtypes is None:
            raise TypeError(f"{what}: bfloat16 tensors need the ml_dtypes package (pip install ml_dtypes)")
        return t.view(torch.int16).numpy().view(_ml_dtypes.bfloat16)
    return t.numpy()


def from_numpy(a):
    """A tensor over a numpy array's memory (bfloat16 kept bfloat16; uint32 / uint64 index
    arrays as int64 copies)."""
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if a.dtype in (np.uint32, np.uint64, np.uint16):
        return torch.from_numpy(a.astype(np.int64))
    if not a.flags.writeable:
        a = a.copy()
    return torch.from_numpy(a)


# stable numpy views of output projections, so GramCache hits across calls (keyed by the
# tensor's memory and its version counter: an in-place edit of wo is a new key)
_STABLE = OrderedDict()
_STABLE_MAX = 4096


def _stable_view(t, what):
    try:
        version = t._version
    except RuntimeError:  # an inference tensor: no version counter (and no in-place edits)
        version = -1
    key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(),
           t.dtype, version)
    a = _STABLE.get(key)
    if a is None:
        a = to_numpy(t, what, "data")
        _STABLE[key] = a
        while len(_STABLE) > _STABLE_MAX:
            _STABLE.popitem(last=False)
    else:
        _STABLE.move_to_end(key)
    return a


# -------------------------------------------------------------------- device checks
def _tensors(value, name, out):
    if isinstance(value, torch.Tensor):
        out.append((name, value))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _tensors(v, f"{name}[{i}]", out)


def _device_of(function, bound):
    """The one device of every tensor argument (None when there is none); errors name
    the argument."""
    found = []
    for name, value in bound.items():
        _tensors(value, name, found)
    dev, first = None, None
    for name, t in found:
        if t.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{function}: {name}: device {t.device} is not supported (cpu or cuda)")
        if dev is None:
            dev, first = t.device, name
        elif t.device != dev:
            raise ValueError(f"{function}: {name} is on {t.device} but {first} on {dev}: one call "
                             "reads one device")
    return dev, first


def _no_cuda_build(function, what, dev):
    if not _kc.built_with_cuda():
        raise KvevictError(STATUS_CODES["KVE_ERR_NOT_BUILT_WITH_CUDA"], f"kvevict.torch.{function}",
                           f"{what} is on {dev}, but {_core.library_path()} has no CUDA entry points "
                           "(build it with --features cuda, or pass CPU tensors)")


def _host_only(function, what, dev):
    _no_cuda_build(function, what, dev)
    raise ValueError(f"kvevict.torch.{function}: {what} is on {dev}; this entry point runs on the "
                     "host: pass CPU tensors (device forms: kvevict.torch.cuda)")


# ------------------------------------------------------------------------- wrapping
def _convert(value, name, written):
    if isinstance(value, torch.Tensor):
        kind = _kind(name)
        if name == "wo" or name.startswith("wo["):
            _check_tensor(value, name, kind, False)
            return _stable_view(value, name)
        return to_numpy(value, name, kind, name.split("[", 1)[0] in written)
    if isinstance(value, list):
        return [_convert(v, f"{name}[{i}]", written) for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return tuple(_convert(v, f"{name}[{i}]", written) for i, v in enumerate(value))
    return value


def _back(value, views):
    if isinstance(value, np.ndarray):
        orig = views.get(id(value))
        return orig if orig is not None else from_numpy(value)
    if isinstance(value, list):
        return [_back(v, views) for v in value]
    if isinstance(value, tuple):
        return tuple(_back(v, views) for v in value)
    if isinstance(value, dict):
        return {k: _back(v, views) for k, v in value.items()}
    return value


def _wrap(fn, device=None, name=None):
    """``fn`` over numpy → the same over torch: arguments converted (checked first, all of
    them, so nothing is written on a refusal), results converted back. ``device``: the
    CUDA implementation, called with the same arguments when the tensors are on CUDA."""
    sig = inspect.signature(fn)
    name = name or fn.__name__
    written = _WRITTEN.get(name, set())

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        dev, what = _device_of(name, bound.arguments)
        if dev is not None and dev.type == "cuda":
            if device is None:
                _host_only(name, what, dev)
            _no_cuda_build(name, what, dev)
            return device(*args, **kwargs)
        views = {}
        conv = {}
        for k, v in bound.arguments.items():
            p = sig.parameters[k]
            if p.kind == p.VAR_KEYWORD:
                conv[k] = {kk: _convert(vv, kk, written) for kk, vv in v.items()}
            else:
                conv[k] = _convert(v, k, written)
            if isinstance(v, torch.Tensor) and isinstance(conv[k], np.ndarray):
                views[id(conv[k])] = v
        bound.arguments.update(conv)
        return _back(fn(*bound.args, **bound.kwargs), views)

    return wrapper


# ------------------------------------------------------------------ CUDA (data_ptr)
_TYPESTR = {torch.float32: "<f4", torch.float16: "<f2", torch.bfloat16: "<V2", torch.int32: "<i4",
            torch.int64: "<i8", torch.uint8: "|u1"}


class _Dev:
    """``__cuda_array_interface__`` of a tensor from its ``data_ptr()``, sizes and strides
    (torch's own interface refuses tensors that require grad and bfloat16 before 2.4)."""

    __slots__ = ("t", "__cuda_array_interface__")

    def __init__(self, t, what, kind="any", written=False):
        _check_tensor(t, what, kind, written)
        ts = _TYPESTR.get(t.dtype)
        if ts is None:
            raise TypeError(f"{what}: dtype {t.dtype} has no device form here")
        self.t = t
        item = t.element_size()
        self.__cuda_array_interface__ = {
            "data": (t.data_ptr(), False), "shape": tuple(t.shape),
            "strides": tuple(s * item for s in t.stride()), "typestr": ts, "version": 2}


# Test hook: the loaded library's device entry points read HOST memory (the cuda-emu
# build after kve_emu_host_memory_as_device(1)), so CPU tensors may stand in for CUDA ones in kvevict.torch.cuda
# (python/tests/test_cuda_torch.py). Never set it with a real CUDA build.
_HOST_DEVICE = False


def _device(function, **tensors):
    """The one CUDA device of ``tensors`` (None entries skipped); ``ValueError`` naming
    the first tensor elsewhere; ``KvevictError`` for a library without CUDA."""
    dev, first = None, None
    for what, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            continue
        if t.device.type != "cuda" and not _HOST_DEVICE:
            raise ValueError(f"kvevict.torch.{function}: {what} is on {t.device}; the device forms "
                             "take CUDA tensors (host tensors: the functions of kvevict.torch)")
        if dev is None:
            dev, first = t.device, what
        elif t.device != dev:
            raise ValueError(f"kvevict.torch.{function}: {what} is on {t.device} but {first} on {dev}")
    _no_cuda_build(function, first, dev)
    return dev


def _cur_stream(dev):
    if dev.type != "cuda":  # _HOST_DEVICE: the double ignores streams
        return 0
    return int(torch.cuda.current_stream(dev).cuda_stream)


def _workspace_on(dev, nbytes, align=256):
    """A device workspace of ``nbytes``, ``align``-byte aligned as the kernels require
    (None when no bytes are needed)."""
    if not nbytes:
        return None
    buf = torch.empty(nbytes + align, dtype=torch.uint8, device=dev)
    off = (-buf.data_ptr()) % align
    return buf[off: off + nbytes]


def _on(x, dev, what, dtype=torch.float32):
    """A small float32 / int32 input (Gram, value forms, counts, ...) on ``dev`` (copied
    there when given on the host: these are the sizes of a layer's scores, not its cache)."""
    if x is None:
        return None
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    if t.device != dev:
        t = t.to(dev)
    if t.dtype != dtype:
        raise TypeError(f"{what}: dtype {t.dtype}, expected {dtype}")
    return t.contiguous()


def _cuda_score_layer(params, queries=None, keys=None, values=None, gram=None, value_forms=None,
                      value_l1=None, row_lse=None, *, dtype=None, out=None, workspace=None):
    params = _api._as_score_params(params)
    if keys is None:
        raise ValueError("score_layer: keys missing")
    dev = _device("cuda.score_layer", keys=keys, queries=queries, values=values, out=out,
                  workspace=workspace)
    hkv, n, dk = keys.shape
    hq = queries.shape[0] if queries is not None else hkv
    dv = values.shape[2] if values is not None else dk
    p = _api.prefix_len(n, params.window)
    if out is None:
        out = torch.empty((hkv, p), dtype=torch.float32, device=dev)
    if workspace is None:
        nbytes = _kc.score_workspace_size(params, hq, hkv, n, dk, dv)
        workspace = _workspace_on(dev, nbytes)
    _kc.score_layer(
        params, None if queries is None else _Dev(queries, "queries", "data"),
        _Dev(keys, "keys", "data"), None if values is None else _Dev(values, "values", "data"),
        *(None if x is None else _Dev(_on(x, dev, nm), nm, "f32")
          for nm, x in (("gram", gram), ("value_forms", value_forms), ("value_l1", value_l1),
                        ("row_lse", row_lse))),
        out=_Dev(out, "out", "f32", True),
        workspace=None if workspace is None else _Dev(workspace, "workspace", "bytes", True),
        stream=_cur_stream(dev), dtype=dtype)
    return out if out.shape == (hkv, p) else out.reshape(-1)[: hkv * p].reshape(hkv, p)


def _cuda_accumulate_value_links(values, links, *, dtype=None):
    dev = _device("cuda.accumulate_value_links", values=values, links=links)
    nbytes = _kc.value_links_workspace_size(values.shape[0], values.shape[1])
    ws = _workspace_on(dev, nbytes)
    _kc.accumulate_value_links(_Dev(values, "values", "data"), _Dev(links, "links", "f32", True),
                               workspace=None if ws is None else _Dev(ws, "workspace", "bytes", True),
                               stream=_cur_stream(dev), dtype=dtype)
    return links


def _cuda_select_model(params, scores, n, window, *, links=None, link_threshold=_api.LINK_THRESHOLD):
    """Device selection (``kvevict.cuda.select_model``) over ``scores`` ``[L, Hkv, P]`` on a
    CUDA device: returns ``(counts, idx)``, int32 tensors on that device (``counts[u]``
    kept positions of unit ``u = l*Hkv + kh`` in ``idx[u, :counts[u]]``, window included),
    the lists :func:`cuda.compact_in_place` takes."""
    dev = _device("cuda.select_model", scores=scores)
    L, H, _ = scores.shape
    counts = torch.empty(L * H, dtype=torch.int32, device=dev)
    idx = torch.empty((L * H, max(int(n), 1)), dtype=torch.int32, device=dev)
    nbytes = _kc.select_workspace_size(params, L, H, n, window)
    ws = _workspace_on(dev, nbytes)
    _kc.select_model(params, _Dev(scores, "scores", "f32"), n, window,
                     counts=_Dev(counts, "counts", "index", True), idx=_Dev(idx, "idx", "index", True),
                     workspace=None if ws is None else _Dev(ws, "workspace", "bytes", True),
                     stream=_cur_stream(dev),
                     links=None if links is None else _Dev(_on(links, dev, "links"), "links", "f32"),
                     link_threshold=link_threshold)
    return counts, idx


def _cuda_compact_in_place(kv, kept, counts, max_keep, *, kept_ld=None, dtype=None):
    """Device compaction in place (``kvevict.cuda.compact_in_place``) of ``kv`` ``[H, N, d]``
    with int32 device lists ``kept`` (``[H, ld]``, or 1-D shared) and ``counts``."""
    dev = _device("cuda.compact_in_place", kv=kv)
    kvd = _Dev(kv, "kv", "data", True)
    nbytes = _kc.compact_workspace_size(kvd, max_keep, dtype=dtype)
    ws = _workspace_on(dev, nbytes)
    _kc.compact_in_place(kvd, _Dev(_on(kept, dev, "kept", torch.int32), "kept", "index"),
                         _Dev(_on(counts, dev, "counts", torch.int32), "counts", "index"), max_keep,
                         kept_ld=kept_ld, workspace=None if ws is None else _Dev(ws, "workspace", "bytes", True),
                         stream=_cur_stream(dev), dtype=dtype)
    return kv


def _cuda_compact_varlen(src, kept, counts, *, kept_ld=None, dtype=None):
    """Device varlen compaction (``kvevict.cuda.compact_varlen``): ``(dst, cu_seqlens)`` on
    ``src``'s device, ``dst`` ``[H*N, d]`` (rows ``cu_seqlens[h] .. cu_seqlens[h+1]`` are
    head ``h``'s; no host synchronisation to size it)."""
    dev = _device("cuda.compact_varlen", src=src)
    h, n, d = src.shape
    dst = torch.empty((max(h * n, 1), d), dtype=src.dtype, device=dev)
    cu = torch.empty(h + 1, dtype=torch.int32, device=dev)
    _kc.compact_varlen(_Dev(src, "src", "data"), _Dev(_on(kept, dev, "kept", torch.int32), "kept", "index"),
                       _Dev(_on(counts, dev, "counts", torch.int32), "counts", "index"), kept_ld=kept_ld,
                       dst=_Dev(dst, "dst", "data", True), cu_seqlens=_Dev(cu, "cu_seqlens", "index", True),
                       stream=_cur_stream(dev), dtype=dtype)
    return dst, cu


def _torch_pool_tensor(pool, kind, *, kv=0, layer=0):
    """:func:`kvevict.pool_tensor` on a tensor of any device: the same slice, a view."""
    return _paged.slice_pool(pool, kind, kv, layer)


class _DeviceInts:
    """``__cuda_array_interface__`` over int32 device memory the evictor owns."""

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, p, shape):
        self.__cuda_array_interface__ = {"data": (p, False), "shape": shape, "strides": None,
                                         "typestr": "<i4", "version": 2}


class CudaEvictor(_kc.Evictor):
    """:class:`kvevict.cuda.Evictor` over CUDA tensors: its device block allocated with
    torch on ``device`` (default the current CUDA device), every call enqueued on that
    device's current stream, K/V / queries / pools handed over through ``data_ptr()`` and
    strides (nothing copied). Paged pools (``paged=`` in the config): ``keys`` /
    ``values`` / ``cache`` 4-D tensors as :func:`pool_tensor` slices them from an engine's
    pool (vLLM ``[num_blocks, block_size, Hkv, d]`` per K or V, ``[2, nb, bs, Hkv, d]``
    stacked; FlashInfer NHD ``[pages, 2, bs, H, d]`` / HND ``[pages, 2, H, bs, d]``;
    TensorRT-LLM), the block table a CPU tensor or numpy array (int32; checked on the host,
    its used entries uploaded on the stream). Refused before anything is enqueued, naming
    the argument: a tensor on another device than the evictor's, an unsupported dtype, an
    output whose elements overlap."""

    def __init__(self, preset, *, device=None, **config):
        dev = torch.device(device if device is not None else "cuda")
        if dev.type == "cuda" and dev.index is None and not _HOST_DEVICE:
            dev = torch.device("cuda", torch.cuda.current_device())
        if dev.type != "cuda" and not _HOST_DEVICE:
            raise ValueError(f"device: {dev}; the device evictor lives on a CUDA device")
        _no_cuda_build("cuda.Evictor", "device", dev)
        _, nbytes = _kc.Evictor.sizes(preset, **config)
        self._block = _workspace_on(dev, max(nbytes, 1))
        self.device = dev
        super().__init__(preset, device_memory=_Dev(self._block, "device_memory", "bytes", True),
                         **config)

    def _on(self, function, **tensors):
        """Every tensor on the evictor's device (else ``ValueError`` naming it); the stream."""
        for what, t in tensors.items():
            if isinstance(t, torch.Tensor) and t.device != self.device:
                raise ValueError(f"kvevict.torch.cuda.Evictor.{function}: {what} is on "
                                 f"{t.device}, the evictor on {self.device}")
        return _cur_stream(self.device)

    def _table(self, function, table):
        if isinstance(table, torch.Tensor):
            _check_tensor(table, "table", "index", False)
            if table.device.type != "cpu":
                raise ValueError(f"kvevict.torch.cuda.Evictor.{function}: table is on "
                                 f"{table.device}; the block table is read on the host (a CPU "
                                 "tensor: the library checks it there, then uploads it)")
            return table.numpy()
        return table

    @staticmethod
    def _as_dev(t, what, kind="data", written=False):
        return None if t is None else _Dev(t, what, kind, written)

    def set_output_projection(self, layer, wo):
        """``wo`` (a tensor of any device, or numpy): read on the host (a CUDA tensor is
        copied there once), its Gram blocks uploaded; synchronises the current stream."""
        if isinstance(wo, torch.Tensor):
            _check_tensor(wo, "wo", "data", False)
            wo = to_numpy(wo.detach().cpu() if wo.device.type != "cpu" else wo, "wo", "data")
        super().set_output_projection(layer, wo, stream=self._on("set_output_projection"))

    def observe_queries(self, seq, layer, queries, dtype=None):
        st = self._on("observe_queries", queries=queries)
        super().observe_queries(seq, layer, _Dev(queries, "queries", "data"), stream=st,
                                dtype=dtype)

    def score_layer(self, seq, layer, keys, values=None, queries=None, row_lse=None, dtype=None):
        st = self._on("score_layer", keys=keys, values=values, queries=queries, row_lse=row_lse)
        super().score_layer(seq, layer, _Dev(keys, "keys", "data"), self._as_dev(values, "values"),
                            self._as_dev(queries, "queries"), self._as_dev(row_lse, "row_lse", "f32"),
                            stream=st, dtype=dtype)

    def score_layer_paged(self, seq, layer, keys, table, values=None, queries=None, row_lse=None,
                          *, layout="nhd", dtype=None):
        st = self._on("score_layer_paged", keys=keys, values=values, queries=queries,
                      row_lse=row_lse)
        super().score_layer_paged(
            seq, layer, _Dev(keys, "keys", "data"), self._table("score_layer_paged", table),
            self._as_dev(values, "values"), self._as_dev(queries, "queries"),
            self._as_dev(row_lse, "row_lse", "f32"), layout=layout, stream=st, dtype=dtype)

    def select(self, seq):
        return super().select(seq, stream=self._on("select"))

    def kept_lists(self, seq):
        """``(counts, idx)``: int32 tensors on the evictor's device over its own memory
        (``counts[L*Hkv]``, ``idx[L*Hkv, ld]``; unit ``l*Hkv + kh`` keeps
        ``idx[u, :counts[u]]``), valid until the sequence's next :meth:`begin`."""
        cp, ip, ld = super().kept_lists(seq)
        units = self.layers * self.hkv
        if self.device.type != "cuda":  # _HOST_DEVICE: host memory
            def host(p, n):
                return torch.from_numpy(np.ctypeslib.as_array(
                    ctypes.cast(p, ctypes.POINTER(ctypes.c_int32)), (n,)))
            return host(cp, units), host(ip, units * ld).view(units, ld)
        return (torch.as_tensor(_DeviceInts(cp, (units,)), device=self.device),
                torch.as_tensor(_DeviceInts(ip, (units, ld)), device=self.device))

    def compact(self, seq, layer, kv, dtype=None):
        st = self._on("compact", kv=kv)
        super().compact(seq, layer, _Dev(kv, "kv", "data", True), stream=st, dtype=dtype)

    def compact_paged(self, seq, layer, cache, table, *, layout="nhd", dtype=None):
        st = self._on("compact_paged", cache=cache)
        return super().compact_paged(seq, layer, _Dev(cache, "cache", "data", True),
                                     self._table("compact_paged", table), layout=layout,
                                     stream=st, dtype=dtype)


cuda = SimpleNamespace(
    score_layer=_cuda_score_layer, accumulate_value_links=_cuda_accumulate_value_links,
    select_model=_cuda_select_model, compact_in_place=_cuda_compact_in_place,
    compact_varlen=_cuda_compact_varlen, Evictor=CudaEvictor, pool_tensor=_torch_pool_tensor,
    available=_kc.available, built_with_cuda=_kc.built_with_cuda)
"""The device forms over CUDA tensors (``kvevict.cuda`` with outputs and workspaces
allocated by torch on the tensors' device, enqueued on its current stream), the device
evictor (:class:`CudaEvictor`) and :func:`pool_tensor` for CUDA pools."""

# -------------------------------------------------------------------- the functions
score_layer = _wrap(_api.score_layer, _cuda_score_layer)
accumulate_value_links = _wrap(_api.accumulate_value_links, _cuda_accumulate_value_links)
_HOST = {_api: ("window_row_lse", "compute_gram", "compute_value_forms", "compute_value_l1",
                "select_model", "select_sharded", "kept_lists", "evicted_positions",
                "compact_in_place", "compact_varlen"),
         _paged: ("paged_gather", "paged_compact")}
for _mod, _names in _HOST.items():
    for _n in _names:
        globals()[_n] = _wrap(getattr(_mod, _n))
pool_tensor = _wrap(_paged.pool_tensor, _torch_pool_tensor)

def _wrap_class(base, methods, doc):
    ns = {"__doc__": doc, "__module__": __name__}
    for m in methods:
        ns[m] = _wrap(getattr(base, m), name=m)
    return type(base.__name__, (base,), ns)


ShardedSearch = _wrap_class(_api.ShardedSearch, ("__init__", "count", "select"),
                            "kvevict.ShardedSearch over torch score shards.")
Evictor = _wrap_class(
    _evictor.Evictor,
    ("set_output_projection", "observe_queries", "score_layer", "score_layer_paged", "kept_cells",
     "evicted_cells", "kept_lists", "kept", "compact", "compact_paged", "evict"),
    "kvevict.Evictor over torch tensors (CPU): keys / values / queries / wo in, kept lists out.")


class StreamScorer(_wrap_class(_stream.StreamScorer, ("feed", "scores", "stats"), "")):
    """kvevict.StreamScorer over torch tensors; :attr:`state` is a uint8 tensor over the
    scorer's own state (a view: ``.clone()`` it to keep a snapshot)."""

    @property
    def state(self):
        return torch.from_numpy(_stream.StreamScorer.state.fget(self))

    @state.setter
    def state(self, value):
        if isinstance(value, torch.Tensor):
            value = to_numpy(value, "state", "bytes")
        _stream.StreamScorer.state.fset(self, value)


class GramCache(_pipeline.GramCache):
    """kvevict.GramCache that also takes torch ``wo`` (the same memory, unchanged since,
    hits: an in-place edit of the tensor bumps its version and misses)."""

    get = _wrap(_pipeline.GramCache.get, name="get")


class GramCache(_pipeline.GramCache):
    """kvevict.GramCache that also takes torch ``wo`` (read as a stable view of the same
    memory: hits across calls; an in-place edit of the tensor bumps its version: a miss)."""

    get = _wrap(_pipeline.GramCache.get, name="get")


gram_cache = GramCache()


def _cached(fn):
    inner = _wrap(fn)

    @functools.wraps(fn)
    def call(*args, gram_cache=gram_cache, **kwargs):
        return inner(*args, gram_cache=gram_cache, **kwargs)

    return call


score_model = _cached(_pipeline.score_model)
select_kept = _cached(_pipeline.select_kept)
