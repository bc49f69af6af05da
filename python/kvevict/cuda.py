"""Device-side API: the C API's CUDA entry points (``kve_cuda_*``, ``src/capi/cuda.rs``)
over arrays that live in GPU memory, with no torch / cupy / numba dependency.

A device array is any object exposing ``__cuda_array_interface__`` (versions 0 to 3:
``data`` = ``(ptr, readonly)``, ``shape``, ``strides`` in bytes or ``None`` for
C-contiguous, ``typestr``, optional ``stream``): ``torch.Tensor`` on a CUDA device
(``.detach()`` it first if it requires grad), ``cupy.ndarray``, numba device arrays.
Only the interface is read; nothing is copied, allocated or synchronised here. Every
call enqueues work on a CUDA stream and returns: results are ready once that stream
reaches them (``torch.cuda.current_stream().synchronize()``, ``stream.synchronize()``, or
any later work on the same stream).

dtypes: ``typestr`` ``'<f4'`` (float32), ``'<f2'`` (float16) and ``'<V2'`` (bfloat16 as
torch >= 2.4 and ml_dtypes export it). A producer that exports bfloat16 under another
2-byte typestr (``'<f2'``, ``'<u2'``) needs ``dtype="bfloat16"``: the interface cannot
tell such an array from float16, so the override is the only safeguard. Index arrays
(``counts``, ``idx``, ``kept``, ``cu_seqlens``) are int32 (``'<i4'``).

Streams (``stream=`` of every call): ``None`` (default) enqueues on the stream the
arrays report through the interface's ``stream`` entry (version 3, cupy) when they agree,
else on the legacy default stream (NULL; torch reports no stream: pass
``torch.cuda.current_stream()`` when working on another one). An ``int`` is a raw
``cudaStream_t`` (0 = legacy default, 1 / 2 = ``cudaStreamLegacy`` /
``cudaStreamPerThread``); objects with ``__cuda_stream__``, ``.cuda_stream``
(``torch.cuda.Stream``), ``.ptr`` (``cupy.cuda.Stream``) or ``.handle`` (numba) are read.

What is checked here: only what the C side cannot know (the interface's structure:
dimensionality, byte strides that are negative or not a multiple of the item size,
read-only outputs, dtypes; and the lengths of buffers the C functions receive without
one). Everything else (shapes against each other, output and workspace sizes,
alignment, aliasing, the kernels' limits) is the library's, raised as
:class:`~kvevict.KvevictError` with the status name. The library's own device checks are
documented in ``include/kvevict.h``.

Not run on a GPU by this package's tests: they run the entry points on the crate's
``cuda-emu`` build (the real kernels on the CPU emulator of cuda/emu), with numpy memory
registered with the emulated runtime as device memory.
"""
import ctypes

import numpy as np

from . import _lib
from ._api import LINK_THRESHOLD, _as_score_params, _as_select_params, _wo, prefix_len
from ._evictor import evictor_config, requirements, stats
from ._core import DTYPES, STATUS_CODES, KvevictError, check
from ._lib import kve_layer_inputs, kve_model_scores, kve_tensor, lib
from ._paged import _table, layout_struct

__all__ = [
    "available", "device_count", "built_with_cuda", "score_workspace_size", "score_layer",
    "select_workspace_size", "select_model", "value_links_workspace_size",
    "accumulate_value_links", "compact_workspace_size", "compact_in_place",
    "compact_varlen", "DeviceArray", "as_device_array", "stream_handle", "Evictor",
]

def _status(name):
    return STATUS_CODES[name]


def _call(name, *args, detail=""):
    if not _lib.has(name):
        raise KvevictError(_status("KVE_ERR_NOT_BUILT_WITH_CUDA"), name,
                           f"{_lib.path} does not export {name} (an older library)")
    st = getattr(lib, name)(*args)
    if st != 0:
        raise KvevictError(st, name, detail)


def _fail(status, function, detail):
    raise KvevictError(_status(status), f"kvevict.cuda.{function}", detail)


# --------------------------------------------------------------------------- devices
def device_count():
    """CUDA devices the library can use (``kve_cuda_get_device_count``); 0 when there is
    no device or driver. Raises :class:`~kvevict.KvevictError`
    (``KVE_ERR_NOT_BUILT_WITH_CUDA``) for a library built without CUDA."""
    c = ctypes.c_int32(0)
    _call("kve_cuda_get_device_count", ctypes.byref(c))
    return int(c.value)


def built_with_cuda():
    """Whether the loaded library has device entry points (feature ``cuda``, its
    emulator build ``cuda-emu``); says nothing about a
    device being present."""
    if not _lib.has("kve_cuda_get_device_count"):
        return False
    c = ctypes.c_int32(0)
    return lib.kve_cuda_get_device_count(ctypes.byref(c)) != _status("KVE_ERR_NOT_BUILT_WITH_CUDA")


def available():
    """True when the library was built with CUDA and sees at least one device. Never
    raises."""
    try:
        return device_count() > 0
    except Exception:  # noqa: BLE001 - a probe
        return False


# ------------------------------------------------------------------- the interface
_TYPESTRS = {"f4": 0, "f2": 1, "V2": 2}
_NAMES = {0: "float32", 1: "float16", 2: "bfloat16"}


def _c_strides(shape, itemsize):
    out, acc = [], itemsize
    for e in reversed(shape):
        out.append(acc)
        acc *= max(int(e), 1)
    return tuple(reversed(out))


class DeviceArray:
    """The parsed ``__cuda_array_interface__`` of one array (kept with the object, so
    the memory stays alive for the call).

    ``ptr``, ``readonly``, ``shape``, ``strides`` (bytes, never ``None``), ``typestr``,
    ``itemsize``, ``kind`` (``'f'``, ``'i'``, ...), ``stream`` (the interface's, or
    ``None``), ``size`` (elements)."""

    __slots__ = ("obj", "what", "ptr", "readonly", "shape", "strides", "typestr", "itemsize",
                 "kind", "stream", "size")

    def element_strides(self):
        """Byte strides → element strides; ``ValueError`` for negative strides or strides
        that are not a multiple of the item size (a view the library cannot describe)."""
        out = []
        for ax, s in enumerate(self.strides):
            if s < 0:
                raise ValueError(f"{self.what}: negative stride {s} (bytes) on axis {ax}; the "
                                 "library reads non-negative element strides only (pass a "
                                 "contiguous copy)")
            if s % self.itemsize:
                raise ValueError(f"{self.what}: stride {s} (bytes) on axis {ax} is not a multiple "
                                 f"of the item size {self.itemsize}")
            out.append(s // self.itemsize)
        return out

    def reach(self):
        """Elements from ``ptr`` up to the highest one the view reaches, plus one (0 when
        empty)."""
        if self.size == 0:
            return 0
        st = self.element_strides()
        return 1 + sum((e - 1) * s for e, s in zip(self.shape, st))

    def is_c_contiguous(self):
        want = _c_strides(self.shape, self.itemsize)
        return all(e <= 1 or s == w for e, s, w in zip(self.shape, self.strides, want))

    def __repr__(self):
        return (f"DeviceArray({self.what}: ptr=0x{self.ptr:x}, shape={self.shape}, "
                f"strides={self.strides}, typestr={self.typestr!r})")


def _int(v, what, field):
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError(f"{what}: __cuda_array_interface__[{field!r}] must hold integers, got {v!r}")
    return int(v.__index__())


def as_device_array(x, what="array"):
    """Parse ``x.__cuda_array_interface__`` into a :class:`DeviceArray` (``TypeError`` /
    ``ValueError`` for an object without one or with a malformed one)."""
    if isinstance(x, DeviceArray):
        return x
    try:
        cai = x.__cuda_array_interface__
    except AttributeError as e:
        raise TypeError(f"{what}: expected a device array exposing __cuda_array_interface__ "
                        f"(torch CUDA tensor, cupy / numba device array), got "
                        f"{type(x).__name__} ({e})") from None
    if not hasattr(cai, "get"):
        raise TypeError(f"{what}: __cuda_array_interface__ is not a dict: {type(cai).__name__}")
    for key in ("data", "shape", "typestr"):
        if key not in cai:
            raise TypeError(f"{what}: __cuda_array_interface__ lacks {key!r}")
    if cai.get("mask") is not None:
        raise ValueError(f"{what}: masked arrays (__cuda_array_interface__['mask']) are not supported")
    data = cai["data"]
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise TypeError(f"{what}: __cuda_array_interface__['data'] must be (ptr, readonly), got {data!r}")
    a = DeviceArray()
    a.obj, a.what = x, what
    a.ptr = 0 if data[0] is None else _int(data[0], what, "data")
    if a.ptr < 0:
        raise ValueError(f"{what}: negative data pointer {a.ptr}")
    a.readonly = bool(data[1])
    shape = cai["shape"]
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"{what}: __cuda_array_interface__['shape'] must be a tuple, got {shape!r}")
    a.shape = tuple(_int(e, what, "shape") for e in shape)
    if any(e < 0 for e in a.shape):
        raise ValueError(f"{what}: negative extent in shape {a.shape}")
    ts = cai["typestr"]
    if not isinstance(ts, str) or len(ts) < 3 or ts[0] not in "<>|=" or not ts[2:].isdigit():
        raise TypeError(f"{what}: bad typestr {ts!r}")
    a.typestr, a.kind, a.itemsize = ts, ts[1], int(ts[2:])
    if ts[0] == ">" and a.itemsize > 1:
        raise TypeError(f"{what}: big-endian typestr {ts!r}")
    if a.itemsize <= 0:
        raise TypeError(f"{what}: bad typestr {ts!r}")
    strides = cai.get("strides")
    if strides is None:
        a.strides = _c_strides(a.shape, a.itemsize)
    else:
        if not isinstance(strides, (tuple, list)):
            raise TypeError(f"{what}: __cuda_array_interface__['strides'] must be a tuple or None, "
                            f"got {strides!r}")
        if len(strides) != len(a.shape):
            raise ValueError(f"{what}: {len(strides)} strides for shape {a.shape}")
        a.strides = tuple(_int(s, what, "strides") for s in strides)
    stream = cai.get("stream")
    a.stream = None if stream is None else _int(stream, what, "stream")
    size = 1
    for e in a.shape:
        size *= e
    a.size = size
    return a


def _writable(a):
    if a.readonly:
        raise ValueError(f"{a.what}: the array is read-only (__cuda_array_interface__['data'][1]); "
                         "the library writes it")


def _dtype_code(a, dtype):
    """Library dtype code of a float tensor (``dtype`` overrides the typestr)."""
    if dtype is not None:
        code = DTYPES.encode(dtype)
        want = {0: 4, 1: 2, 2: 2}.get(code)
        if want is None:
            return code  # the library answers KVE_ERR_BAD_ENUM
        if a.itemsize != want or a.kind not in "fVui":
            raise TypeError(f"{a.what}: dtype={dtype!r} needs {want}-byte elements, got typestr "
                            f"{a.typestr!r}")
        return code
    code = _TYPESTRS.get(a.typestr[1:])
    if code is None:
        hint = ""
        if a.itemsize == 2:
            hint = " (bfloat16 exported under another typestr: pass dtype='bfloat16')"
        raise TypeError(f"{a.what}: unsupported typestr {a.typestr!r}; use float32 ('<f4'), "
                        f"float16 ('<f2') or bfloat16 ('<V2'){hint}")
    return code


class _Ref:
    __slots__ = ("c", "arr", "code")


def _tensor(x, what, dtype=None, writable=False):
    """A 3-D device array (head, token, dim) as a ``kve_tensor``: element strides from the
    byte strides, ``len`` = the highest element reached + 1."""
    a = as_device_array(x, what)
    if writable:
        _writable(a)
    if len(a.shape) != 3:
        raise ValueError(f"{what}: expected a 3-D (head, token, dim) array, got shape {a.shape}")
    code = _dtype_code(a, dtype)
    st = a.element_strides()
    c = kve_tensor()
    if a.size:
        c.data = a.ptr or None
        c.len = a.reach()
    c.dtype = code
    for i in range(3):
        c.extent[i] = a.shape[i]
        c.stride[i] = st[i]
    r = _Ref()
    r.c, r.arr, r.code = c, a, code
    return r


def _pool(x, what, layout, dtype=None, writable=False):
    """A 4-D paged pool tensor in device memory (``layout`` "nhd" ``[blocks, slots, heads,
    dim]`` or "hnd" ``[blocks, heads, slots, dim]``, any non-negative strides) as a
    ``kve_paged_layout``; returns ``(struct, array)``."""
    if layout not in ("nhd", "hnd"):
        raise ValueError(f"layout: 'nhd' or 'hnd', got {layout!r}")
    a = as_device_array(x, what)
    if writable:
        _writable(a)
    if len(a.shape) != 4:
        axes = "slots, heads" if layout == "nhd" else "heads, slots"
        raise ValueError(f"{what}: expected a 4-D pool tensor [blocks, {axes}, dim], got shape "
                         f"{a.shape} (kvevict.pool_tensor slices an engine's pool)")
    code = _dtype_code(a, dtype)
    if a.size == 0:
        raise ValueError(f"{what}: empty pool, shape {a.shape}")
    return layout_struct(a.ptr, code, a.shape, a.element_strides(), layout), a


def _host_table(table):
    """The block table: HOST integers (the library checks it on the host, then uploads it)."""
    if hasattr(table, "__cuda_array_interface__"):
        raise TypeError("table: a device array; the block table is read on the host (pass a "
                        "numpy array or a CPU tensor: the library checks it there, then copies "
                        "the used entries to the device)")
    return _table(table)


def _flat(x, what, typestr, writable=False):
    """A C-contiguous device array of ``typestr`` ('<f4', '<i4'; None: any, in bytes) as
    ``(array, ptr or None, length)``: elements, or bytes for ``typestr=None``."""
    a = as_device_array(x, what)
    if writable:
        _writable(a)
    if typestr is not None and (a.typestr[1:] != typestr[1:] or a.typestr[0] == ">"):
        name = {"<f4": "float32", "<i4": "int32"}.get(typestr, typestr)
        raise TypeError(f"{what}: expected {name} (typestr {typestr!r}), got {a.typestr!r}")
    if not a.is_c_contiguous():
        raise ValueError(f"{what}: must be C-contiguous, got shape {a.shape} strides {a.strides} "
                         "(bytes)")
    n = a.size if typestr is not None else a.size * a.itemsize
    return a, (a.ptr or None) if a.size else None, n


def _rows(x, what, writable=False):
    """An int32 array of rows (2-D, or more with leading axes that merge), each row
    contiguous: ``(array, ptr, rows, cols, ld, reach)`` in elements."""
    a = as_device_array(x, what)
    if writable:
        _writable(a)
    if a.typestr[1:] != "i4" or a.typestr[0] == ">":
        raise TypeError(f"{what}: expected int32 (typestr '<i4'), got {a.typestr!r}")
    if len(a.shape) < 2:
        raise ValueError(f"{what}: expected a 2-D [units, ld] array, got shape {a.shape}")
    st = a.element_strides()
    cols = a.shape[-1]
    if cols > 1 and st[-1] != 1:
        raise ValueError(f"{what}: rows must be contiguous (last-axis stride {a.strides[-1]} bytes, "
                         f"item size {a.itemsize})")
    # the row axis: the leading axes merged (size-1 axes carry no stride information)
    dims = [(e, s) for e, s in zip(a.shape[:-1], st[:-1]) if e != 1]
    if not dims or a.size == 0:
        rows, ld = (1 if not dims else 0), cols
    else:
        rows, ld = dims[-1]
        for e, s in reversed(dims[:-1]):
            if s != rows * ld:
                raise ValueError(f"{what}: the leading axes of shape {a.shape} (strides {a.strides} "
                                 "bytes) do not merge into one row axis")
            rows *= e
    return a, (a.ptr or None) if a.size else None, rows, cols, ld, a.reach()


def _lists(x, what):
    """A kept-list array (int32, 1-D: one shared list; 2-D: one row per head):
    ``(array, ptr, inferred kept_ld, reach)``."""
    a = as_device_array(x, what)
    if a.typestr[1:] != "i4" or a.typestr[0] == ">":
        raise TypeError(f"{what}: expected int32 (typestr '<i4'), got {a.typestr!r}")
    if len(a.shape) == 1:
        st = a.element_strides()
        if a.shape[0] > 1 and st[0] != 1:
            raise ValueError(f"{what}: a 1-D list must be contiguous, got stride {a.strides[0]} bytes")
        return a, (a.ptr or None) if a.size else None, 0, a.reach()
    a, ptr, rows, cols, ld, reach = _rows(a, what)
    return a, ptr, ld, reach


# --------------------------------------------------------------------------- streams
def stream_handle(stream):
    """A ``cudaStream_t`` as an int (0 = the legacy default stream) from an int, ``None``,
    or a stream object (``__cuda_stream__``, ``.cuda_stream``, ``.ptr``, ``.handle``)."""
    if stream is None:
        return 0
    if isinstance(stream, bool):
        raise TypeError(f"stream: expected an int cudaStream_t or a stream object, got {stream!r}")
    if hasattr(stream, "__cuda_stream__"):  # the CUDA Python stream protocol
        proto = stream.__cuda_stream__()
        v = proto[1] if isinstance(proto, (tuple, list)) else proto
    elif hasattr(stream, "cuda_stream"):  # torch.cuda.Stream / ExternalStream
        v = stream.cuda_stream
    elif hasattr(stream, "ptr"):  # cupy.cuda.Stream
        v = stream.ptr
    elif hasattr(stream, "handle"):  # numba: a ctypes c_void_p (None for the default stream)
        v = getattr(stream.handle, "value", stream.handle) or 0
    elif hasattr(stream, "__index__"):
        v = stream
    else:
        raise TypeError(f"stream: expected an int cudaStream_t or an object with __cuda_stream__, "
                        f".cuda_stream (torch), .ptr (cupy) or .handle (numba); got "
                        f"{type(stream).__name__}")
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError(f"stream: the handle of {type(stream).__name__} is not an int: {v!r}")
    v = int(v.__index__())
    if v < 0:
        raise ValueError(f"stream: negative handle {v}")
    return v


def _stream(stream, arrays, function):
    if stream is not None:
        return stream_handle(stream) or None
    seen = {a.stream for a in arrays if a is not None and a.stream is not None}
    if len(seen) > 1:
        raise ValueError(f"kvevict.cuda.{function}: the arrays report different streams "
                         f"({', '.join(hex(s) for s in sorted(seen))}) in __cuda_array_interface__; "
                         "pass stream= (and order the producers before it)")
    return (seen.pop() or None) if seen else None


# ----------------------------------------------------------------------------- scoring
def score_workspace_size(params, hq, hkv, n, dk, dv=None):
    """Device workspace bytes of :func:`score_layer` (``kve_cuda_score_workspace_size``)."""
    params = _as_score_params(params)
    v = ctypes.c_uint64()
    _call("kve_cuda_score_workspace_size", params._ref, int(hq), int(hkv), int(n), int(dk),
          int(dk if dv is None else dv), ctypes.byref(v))
    return int(v.value)


_EMPTY = ctypes.c_float(0.0)  # a non-NULL address for a given-but-empty row_lse (never read)


def score_layer(params, queries, keys, values=None, gram=None, value_forms=None, value_l1=None,
                row_lse=None, *, out, workspace=None, stream=None, dtype=None):
    """Score one layer on the device (``kve_cuda_score_layer``), enqueued on ``stream``.

    ``queries`` ``[Hq, wq, dk]`` (``None`` for scorers that do not read them: knorm,
    streamingllm), ``keys`` ``[Hkv, N, dk]``, ``values`` ``[Hkv, N, dv]``: 3-D device
    arrays in any non-negative strides (token-major K rows, transposed V, ...), float32 /
    float16 / bfloat16 (``dtype=`` overrides the typestr). ``gram`` (the float32 output of
    :func:`kvevict.compute_gram`, copied to the device), ``value_forms``, ``value_l1``,
    ``row_lse``: C-contiguous float32 device arrays (any shape; their length is their size).
    ``out``: float32 device array (C-contiguous) of at least ``Hkv*P`` elements, written
    ``[Hkv][P]`` (``P = N - min(window, N)``). ``workspace``: a C-contiguous device buffer
    of at least :func:`score_workspace_size` bytes, 256-byte aligned (``None`` when 0
    bytes are needed). Returns ``out``. Nothing synchronises.
    """
    params = _as_score_params(params)
    inp = kve_layer_inputs()
    st = lib.kve_layer_inputs_init(ctypes.byref(inp), ctypes.sizeof(inp))
    if st != 0:
        raise KvevictError(st, "kve_layer_inputs_init")
    arrays = []
    for name, x in (("queries", queries), ("keys", keys), ("values", values)):
        if x is not None:
            t = _tensor(x, name, dtype)
            setattr(inp, name, t.c)
            arrays.append(t.arr)
    for name, x in (("gram", gram), ("value_forms", value_forms), ("value_l1", value_l1),
                    ("row_lse", row_lse)):
        if x is None:
            continue
        a, ptr, n = _flat(x, name, "<f4")
        arrays.append(a)
        if n == 0 and name == "row_lse":
            # given but empty: rejected by the library, not taken as absent (as on the host)
            ptr = ctypes.addressof(_EMPTY)
        setattr(inp, name, ptr)
        setattr(inp, name + "_len", n)
    o, optr, olen = _flat(out, "out", "<f4", writable=True)
    arrays.append(o)
    ws, wptr, wbytes = _workspace(workspace, arrays)
    s = _stream(stream, arrays, "score_layer")
    _call("kve_cuda_score_layer", params._ref, ctypes.byref(inp), optr, olen, wptr, wbytes, s)
    return out


def _workspace(workspace, arrays):
    if workspace is None:
        return None, None, 0
    a, ptr, nbytes = _flat(workspace, "workspace", None, writable=True)
    arrays.append(a)
    return a, ptr, nbytes


# --------------------------------------------------------------------------- selection
def select_workspace_size(params, layers, hkv, n, window):
    """Device workspace bytes of :func:`select_model` (``kve_cuda_select_model_workspace_size``)."""
    params = _as_select_params(params)
    v = ctypes.c_uint64()
    _call("kve_cuda_select_model_workspace_size", params._ref, int(layers), int(hkv), int(n),
          int(window), ctypes.byref(v))
    return int(v.value)


def select_model(params, scores, n, window, *, counts, idx, workspace=None, stream=None,
                 layers=None, hkv=None, links=None, link_threshold=LINK_THRESHOLD):
    """Select on the device (``kve_cuda_select_model``), enqueued on ``stream``.

    ``scores``: C-contiguous float32 device array ``[L, Hkv, P]`` (``P = n - min(window,
    n)``), e.g. the stacked outputs of :func:`score_layer`; any other shape (flat
    ``[L*Hkv*P]``) needs ``layers=`` and ``hkv=``. Outputs, per unit ``u = l*Hkv + kh``:
    ``counts`` (int32, ``>= L*Hkv`` elements, C-contiguous) the number of kept positions,
    and ``idx`` (int32 ``[L*Hkv, idx_ld]``, rows contiguous, ``idx_ld`` = its row stride,
    ``>= n``) those positions, ascending, in ``idx[u, :counts[u]]``: the chosen prefix
    positions, then the whole window (``P .. n-1``), as the host's lists, ready for
    :func:`compact_in_place`. With layer / token granularity
    every head of a layer / of the model gets the same list. ``workspace``: at least
    :func:`select_workspace_size` bytes, 256-byte aligned. Returns ``(counts, idx)``.
    ``links``: float32 device array of ``n`` value-link sums over every layer
    (:func:`accumulate_value_links`): the forward post-pool (decay 1) then carries each
    continuation on while the mean link exceeds ``link_threshold``
    (``kve_cuda_select_model_linked``; NaN links are not detected on the device).
    """
    params = _as_select_params(params)
    s, sptr, slen = _flat(scores, "scores", "<f4")
    if len(s.shape) == 3:
        L, H, p = s.shape
        if (layers is not None and int(layers) != L) or (hkv is not None and int(hkv) != H):
            _fail("KVE_ERR_SHAPE_MISMATCH", "select_model",
                  f"scores shape {s.shape} but layers={layers} hkv={hkv}")
        if p != prefix_len(n, window):
            _fail("KVE_ERR_SHAPE_MISMATCH", "select_model",
                  f"scores have P={p} per head, n={n} window={window} gives {prefix_len(n, window)}")
    else:
        if layers is None or hkv is None:
            raise ValueError("select_model: scores that are not [L, Hkv, P] need layers= and hkv=")
        L, H = int(layers), int(hkv)
    c, cptr, clen = _flat(counts, "counts", "<i4", writable=True)
    i, iptr, _rows_, _cols, ld, ireach = _rows(idx, "idx", writable=True)
    arrays = [s, c, i]
    m = kve_model_scores()
    m.scores, m.len, m.layers, m.hkv, m.n, m.window = sptr, slen, L, H, int(n), int(window)
    ws, wptr, wbytes = _workspace(workspace, arrays)
    if links is not None:
        lk, lptr, llen = _flat(links, "links", "<f4")
        arrays.append(lk)
    st = _stream(stream, arrays, "select_model")
    if links is None:
        _call("kve_cuda_select_model", params._ref, ctypes.byref(m), cptr, clen, iptr, ld, ireach,
              wptr, wbytes, st)
    else:
        _call("kve_cuda_select_model_linked", params._ref, ctypes.byref(m), lptr, llen,
              float(link_threshold), cptr, clen, iptr, ld, ireach, wptr, wbytes, st)
    return counts, idx


# ------------------------------------------------------------------------- value links
def value_links_workspace_size(hkv, n):
    """Device workspace bytes of :func:`accumulate_value_links` for ``hkv`` heads of ``n``
    tokens (``kve_cuda_value_links_workspace_size``)."""
    v = ctypes.c_uint64()
    _call("kve_cuda_value_links_workspace_size", int(hkv), int(n), ctypes.byref(v))
    return int(v.value)


def accumulate_value_links(values, links, *, workspace=None, stream=None, dtype=None):
    """Add one layer's value links on the device (``kve_cuda_accumulate_value_links``):
    ``links[i] += sum_h cos(v[h,i], v[h,i-1])`` for ``values`` ``[Hkv, N, dv]`` (a 3-D
    device array in any strides, transposed V included; float32 / float16 / bfloat16).
    ``links``: C-contiguous float32 device array of at least ``N`` elements, zeroed before
    the first layer. ``workspace``: at least :func:`value_links_workspace_size` bytes,
    256-byte aligned. The host's bits on an AVX2 + FMA host; a NaN/Inf value makes its
    token's and the next token's link NaN (not detected). Returns ``links``."""
    t = _tensor(values, "values", dtype)
    arrays = [t.arr]
    lk, lptr, llen = _flat(links, "links", "<f4", writable=True)
    arrays.append(lk)
    ws, wptr, wbytes = _workspace(workspace, arrays)
    st = _stream(stream, arrays, "accumulate_value_links")
    _call("kve_cuda_accumulate_value_links", ctypes.byref(t.c), lptr, llen, wptr, wbytes, st)
    return links


# -------------------------------------------------------------------------- compaction
def compact_workspace_size(kv, max_keep, *, dtype=None):
    """Device workspace bytes of :func:`compact_in_place` for ``kv`` and the largest count
    of any list (``kve_cuda_compact_in_place_workspace_size``)."""
    t = _tensor(kv, "kv", dtype)
    v = ctypes.c_uint64()
    _call("kve_cuda_compact_in_place_workspace_size", ctypes.byref(t.c), int(max_keep),
          ctypes.byref(v))
    return int(v.value)


def _check_lists(function, heads, need, kept_ld, kreach, creach):
    """The lengths the C functions take without a length: ``counts`` must hold one entry
    per head (one with a shared list), ``kept`` reach ``(heads-1)*kept_ld + need``."""
    if heads <= 0 or need <= 0:
        return
    nc = heads if kept_ld else 1
    if creach < nc:
        _fail("KVE_ERR_SHAPE_MISMATCH", function, f"counts has {creach} entries, needs {nc}")
    nk = (heads - 1) * kept_ld + need if kept_ld else need
    if kreach < nk:
        _fail("KVE_ERR_SHAPE_MISMATCH", function,
              f"kept reaches {kreach} elements; {heads} heads at kept_ld={kept_ld} with up to "
              f"{need} entries each need {nk}")


def _kept_counts(kept, counts, kept_ld):
    k, kptr, ld, kreach = _lists(kept, "kept")
    if kept_ld is not None:
        if isinstance(kept_ld, bool) or int(kept_ld) < 0:
            raise ValueError(f"kept_ld must be a non-negative int, got {kept_ld!r}")
        ld = int(kept_ld)
    c, cptr, creach = _flat(counts, "counts", "<i4")
    return k, kptr, ld, kreach, c, cptr, creach


def compact_in_place(kv, kept, counts, max_keep, *, kept_ld=None, workspace=None, stream=None,
                     dtype=None):
    """In-place compaction on the device (``kve_cuda_compact_in_place``): for each head
    ``h`` of ``kv`` (``[H, N, d]`` device array, any non-negative strides, written through
    the view) rows ``kept[h*kept_ld + t]`` (``t < counts[h]``, ascending) move to token
    ``t``. ``kept``: int32 device array, 2-D ``[H, ld]`` (``kept_ld`` = its row stride,
    e.g. rows ``l*Hkv .. (l+1)*Hkv`` of :func:`select_model`'s ``idx``) or 1-D (one list
    shared by every head, ``kept_ld = 0``); ``kept_ld=`` overrides. ``counts``: int32,
    one per head (``counts[0]`` when shared), each ``<= max_keep``. ``workspace``: at least
    :func:`compact_workspace_size` bytes. The lists hold whatever positions are to be
    kept (:func:`select_model`'s include the window). Returns ``kv``.
    """
    t = _tensor(kv, "kv", dtype, writable=True)
    k, kptr, ld, kreach, c, cptr, creach = _kept_counts(kept, counts, kept_ld)
    mk = int(max_keep)
    if mk < 0:
        raise ValueError(f"max_keep must be non-negative, got {max_keep!r}")
    h, ntok, d = t.arr.shape
    if d > 0:
        _check_lists("compact_in_place", h, min(mk, ntok), ld, kreach, creach)
    arrays = [t.arr, k, c]
    ws, wptr, wbytes = _workspace(workspace, arrays)
    st = _stream(stream, arrays, "compact_in_place")
    _call("kve_cuda_compact_in_place", ctypes.byref(t.c), kptr, ld, cptr, mk, wptr, wbytes, st)
    return kv


def compact_varlen(src, kept, counts, *, kept_ld=None, dst, cu_seqlens, stream=None, dtype=None):
    """Varlen compaction on the device (``kve_cuda_compact_to_varlen``): the kept rows of
    every head of ``src`` (``[H, N, d]``) head after head into ``dst`` (a C-contiguous
    device array of ``src``'s dtype, ``[rows, d]`` or flat, holding at least
    ``Σ_h min(counts[h], N)`` rows: the library cannot check it, the counts being on the
    device) and ``cu_seqlens`` (int32, ``>= H+1`` elements; head ``h`` owns rows
    ``cu_seqlens[h] .. cu_seqlens[h+1]``). ``kept`` / ``counts`` / ``kept_ld`` as in
    :func:`compact_in_place`, with ``kept_ld = 0`` or ``>= N``. Returns ``(dst, cu_seqlens)``.
    """
    s = _tensor(src, "src", dtype)
    k, kptr, ld, kreach, c, cptr, creach = _kept_counts(kept, counts, kept_ld)
    h, ntok, d = s.arr.shape
    dsta = as_device_array(dst, "dst")
    _writable(dsta)
    code = _dtype_code(dsta, dtype)
    if code != s.code:
        raise TypeError(f"dst: {_NAMES.get(code, code)} (typestr {dsta.typestr!r}) differs from "
                        f"src's {_NAMES.get(s.code, s.code)}")
    if not dsta.is_c_contiguous():
        raise ValueError(f"dst: must be C-contiguous rows, got shape {dsta.shape} strides "
                         f"{dsta.strides} (bytes)")
    if d and dsta.shape and len(dsta.shape) > 1 and dsta.shape[-1] != d:
        _fail("KVE_ERR_SHAPE_MISMATCH", "compact_varlen",
              f"dst rows have {dsta.shape[-1]} elements, src has d={d}")
    if d and dsta.size % d:
        _fail("KVE_ERR_SHAPE_MISMATCH", "compact_varlen",
              f"dst has {dsta.size} elements, not whole rows of d={d}")
    cu, cuptr, culen = _flat(cu_seqlens, "cu_seqlens", "<i4", writable=True)
    if h > 0 and culen < h + 1:
        _fail("KVE_ERR_OUTPUT_TOO_SMALL", "compact_varlen",
              f"cu_seqlens has {culen} entries, needs {h + 1}")
    if h > 0:
        _check_lists("compact_varlen", h, ntok, ld, kreach, creach)
    arrays = [s.arr, k, c, dsta, cu]
    st = _stream(stream, arrays, "compact_varlen")
    _call("kve_cuda_compact_to_varlen", ctypes.byref(s.c), kptr, ld, cptr,
          (dsta.ptr or None) if dsta.size else None, cuptr, st)
    return dst, cu_seqlens


# ----------------------------------------------------------------------- the evictor
def _side_inputs(v, arrays, queries, row_lse, dtype):
    """Device ``queries`` and ``row_lse`` into a layer struct ``v`` (their arrays appended
    to ``arrays``)."""
    if queries is not None:
        q = _tensor(queries, "queries", dtype)
        v.queries = q.c
        arrays.append(q.arr)
    if row_lse is not None:
        a, p, n = _flat(row_lse, "row_lse", "<f4")
        arrays.append(a)
        v.row_lse, v.row_lse_len = p, n


class Evictor:
    """The evictor's device form (``kve_cuda_evictor_*``): :class:`kvevict.Evictor`'s
    rounds with the K/V, queries and kept lists in device memory, enqueued on a stream
    (nothing read back but what :meth:`select` returns; a round can be captured in a CUDA
    graph). Same arguments as :class:`kvevict.Evictor`, plus ``device_memory``: a writable
    device array of at least ``Evictor.sizes(...)[1]`` bytes, 256-byte aligned (e.g.
    ``torch.empty(n, dtype=torch.uint8, device="cuda")``), kept alive by this object;
    the host context is a numpy buffer it owns. ``paged=`` (as the host form's): K/V in
    device paged pools (:meth:`score_layer_paged`, :meth:`compact_paged`). Methods that read
    ``Wo`` every round (CriticalKV) are refused (``KVE_ERR_INVALID_ARGUMENT``): use the host
    form.
    """

    @staticmethod
    def sizes(preset, **config):
        """``(host_bytes, device_bytes)`` of an evictor of ``preset`` and ``config`` (the
        constructor's keywords but ``device_memory``)."""
        c = evictor_config(preset, **config)
        host, dev = ctypes.c_uint64(), ctypes.c_uint64()
        _call("kve_cuda_evictor_size", ctypes.byref(c), ctypes.byref(host), ctypes.byref(dev))
        return int(host.value), int(dev.value)

    def __init__(self, preset, *, device_memory, **config):
        c = evictor_config(preset, **config)
        host, need = ctypes.c_uint64(), ctypes.c_uint64()
        _call("kve_cuda_evictor_size", ctypes.byref(c), ctypes.byref(host), ctypes.byref(need))
        self._dev, dptr, dbytes = _flat(device_memory, "device_memory", None, writable=True)
        self._mem = np.empty(host.value, np.uint8)
        self._ev = ctypes.c_void_p()
        _call("kve_cuda_evictor_init", self._mem.ctypes.data, self._mem.size, dptr, dbytes,
              ctypes.byref(c), ctypes.byref(self._ev))
        self.layers, self.hkv = config["layers"], config["hkv"]
        self.hq, self.max_cells = config["hq"], config["max_cells"]
        self.requirements = requirements("kve_cuda_evictor_get_requirements", self._ev)
        """As :attr:`kvevict.Evictor.requirements`."""

    def set_output_projection(self, layer, wo, stream=None):
        """``wo`` of ``layer`` as a HOST numpy array (``[Hq, dv, D]`` or ``[Hq*dv, D]``): its
        Gram blocks are computed on the host and uploaded on ``stream``, which is
        synchronised (setup, not capturable)."""
        t = _wo(wo, self.hq, None, "cuda.Evictor.set_output_projection")
        _call("kve_cuda_evictor_set_output_projection", self._ev, layer, ctypes.byref(t.c),
              stream_handle(stream) or None)

    def observe_queries(self, seq, layer, queries, stream=None, dtype=None):
        """Keep the last ``window`` rows of ``queries`` (device ``[Hq, c, dk]``) in the
        sequence's ring, on ``stream``."""
        q = _tensor(queries, "queries", dtype)
        _call("kve_cuda_evictor_observe_queries", self._ev, seq, layer, ctypes.byref(q.c),
              _stream(stream, [q.arr], "Evictor.observe_queries"))

    def plan(self, seq, n_cells):
        """As :meth:`kvevict.Evictor.plan` (host)."""
        t = ctypes.c_uint64()
        _call("kve_cuda_evictor_plan", self._ev, seq, n_cells, ctypes.byref(t))
        return int(t.value)

    def begin(self, seq, n_cells, target):
        """As :meth:`kvevict.Evictor.begin` (host bookkeeping, nothing enqueued)."""
        _call("kve_cuda_evictor_begin", self._ev, seq, n_cells, target)

    def score_layer(self, seq, layer, keys, values=None, queries=None, row_lse=None,
                    stream=None, dtype=None):
        """As :meth:`kvevict.Evictor.score_layer` with device arrays (``row_lse``: float32
        ``[Hq, w]``, C-contiguous), enqueued on ``stream``."""
        v = _lib.kve_evictor_layer()
        check(lib.kve_evictor_layer_init(ctypes.byref(v), ctypes.sizeof(v)), "kve_evictor_layer_init")
        refs = [_tensor(keys, "keys", dtype)]
        v.keys = refs[0].c
        if values is not None:
            refs.append(_tensor(values, "values", dtype))
            v.values = refs[-1].c
        arrays = [r.arr for r in refs]
        _side_inputs(v, arrays, queries, row_lse, dtype)
        _call("kve_cuda_evictor_score_layer", self._ev, seq, layer, ctypes.byref(v),
              _stream(stream, arrays, "Evictor.score_layer"))

    def score_layer_paged(self, seq, layer, keys, table, values=None, queries=None, row_lse=None,
                          *, layout="nhd", stream=None, dtype=None):
        """As :meth:`kvevict.Evictor.score_layer_paged` with the pools in device memory
        (an evictor made with ``paged=``): ``keys`` / ``values`` 4-D device arrays (``layout``
        "nhd" ``[blocks, slots, Hkv, d]`` or "hnd" ``[blocks, Hkv, slots, d]``, any
        non-negative strides: an engine's pool sliced as :func:`kvevict.pool_tensor` slices
        a host one), ``table`` the sequence's block ids in HOST memory (int32 or
        uint32; checked on the host, its used entries then copied to the device on
        ``stream``: keep it unchanged until the stream passes the call), ``queries`` /
        ``row_lse`` device arrays as in :meth:`score_layer`. Kept lists bit-identical to
        :meth:`score_layer` on the gathered K/V. A table entry past the pool
        (``KVE_ERR_OUT_OF_BOUNDS``), repeated (``KVE_ERR_ALIASING``) or too few entries
        (``KVE_ERR_SHAPE_MISMATCH``): nothing enqueued."""
        v = _lib.kve_evictor_paged_layer()
        check(lib.kve_evictor_paged_layer_init(ctypes.byref(v), ctypes.sizeof(v)),
              "kve_evictor_paged_layer_init")
        v.keys, ka = _pool(keys, "keys", layout, dtype)
        arrays = [ka]
        if values is not None:
            v.values, va = _pool(values, "values", layout, dtype)
            arrays.append(va)
        t = _host_table(table)
        v.table, v.table_len = t.ctypes.data, t.size
        _side_inputs(v, arrays, queries, row_lse, dtype)
        _call("kve_cuda_evictor_score_layer_paged", self._ev, seq, layer, ctypes.byref(v),
              _stream(stream, arrays, "Evictor.score_layer_paged"))

    def compact_paged(self, seq, layer, cache, table, *, layout="nhd", stream=None, dtype=None):
        """As :meth:`kvevict.Evictor.compact_paged` with the pool in device memory (written
        in place on ``stream``; ``table`` host memory as in :meth:`score_layer_paged`).
        Returns ``blocks_freed`` when the selection is rectangular (token granularity, the
        uniform allocator), else None (the counts stay on the device; nothing is read
        back). Nothing is enqueued on error."""
        c, a = _pool(cache, "cache", layout, dtype, writable=True)
        t = _host_table(table)
        freed = ctypes.c_uint64()
        _call("kve_cuda_evictor_compact_paged", self._ev, seq, layer, ctypes.byref(c),
              t.ctypes.data if t.size else None, t.size, ctypes.byref(freed),
              _stream(stream, [a], "Evictor.compact_paged"))
        return None if freed.value == 2**64 - 1 else int(freed.value)

    def select(self, seq, stream=None):
        """Select the round on ``stream``. Returns the cells every (layer, KV head) keeps
        when the selection is rectangular (token granularity, the uniform allocator), else
        None (the counts stay on the device: :meth:`kept_lists`)."""
        n = ctypes.c_uint64()
        _call("kve_cuda_evictor_select", self._ev, seq, ctypes.byref(n),
              stream_handle(stream) or None)
        return None if n.value == 2**64 - 1 else int(n.value)

    def kept_lists(self, seq):
        """``(counts, idx, idx_ld)``: DEVICE pointers (ints) to int32 ``counts[L*Hkv]`` and
        ``idx[L*Hkv, idx_ld]`` (unit ``l*Hkv + kh`` keeps ``idx[u, :counts[u]]``, ascending),
        in the evictor's device block, valid until the sequence's next :meth:`begin`."""
        counts, idx, ld = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_uint64()
        _call("kve_cuda_evictor_kept_lists", self._ev, seq, ctypes.byref(counts),
              ctypes.byref(idx), ctypes.byref(ld))
        return counts.value or 0, idx.value or 0, int(ld.value)

    def compact(self, seq, layer, kv, stream=None, dtype=None):
        """Move ``layer``'s kept rows of ``kv`` (device ``[Hkv, n, d]``, writable) to the
        front of each head, in place, on ``stream``."""
        t = _tensor(kv, "kv", dtype, writable=True)
        _call("kve_cuda_evictor_compact", self._ev, seq, layer, ctypes.byref(t.c),
              _stream(stream, [t.arr], "Evictor.compact"))

    def commit(self, seq):
        """As :meth:`kvevict.Evictor.commit`; a selection that is not rectangular leaves
        the sequence ragged until :meth:`reset`."""
        _call("kve_cuda_evictor_commit", self._ev, seq)

    def reset(self, seq):
        """As :meth:`kvevict.Evictor.reset`."""
        _call("kve_cuda_evictor_seq_reset", self._ev, seq)

    def unprotect(self, seq):
        """As :meth:`kvevict.Evictor.unprotect`."""
        _call("kve_cuda_evictor_seq_unprotect", self._ev, seq)

    def stats(self, seq):
        """As :meth:`kvevict.Evictor.stats`, but after a ragged commit ``cells`` is the
        round's target (the kept counts stay on the device; the host form books the largest)."""
        return stats("kve_cuda_evictor_get_stats", self._ev, seq)
