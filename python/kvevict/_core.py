"""Status codes, enumerations, parameter objects and numpy → ``kve_tensor`` mapping."""
import ctypes

import numpy as np

from . import _lib
from ._lib import kve_score_params, kve_select_params, kve_tensor, lib

# ------------------------------------------------------------------------------ status
OK = 0
STATUS_CODES = {
    "KVE_OK": 0,
    "KVE_ERR_NULL_POINTER": 1,
    "KVE_ERR_INVALID_ARGUMENT": 2,
    "KVE_ERR_OVERFLOW": 3,
    "KVE_ERR_OUT_OF_BOUNDS": 4,
    "KVE_ERR_MISALIGNED": 5,
    "KVE_ERR_BAD_ENUM": 6,
    "KVE_ERR_NON_FINITE": 7,
    "KVE_ERR_OUTPUT_TOO_SMALL": 8,
    "KVE_ERR_WORKSPACE_TOO_SMALL": 9,
    "KVE_ERR_ALIASING": 10,
    "KVE_ERR_SHAPE_MISMATCH": 11,
    "KVE_ERR_NOT_BUILT_WITH_CUDA": 12,
    "KVE_ERR_CUDA": 13,
    "KVE_ERR_PANIC": 14,
    "KVE_ERR_UNSUPPORTED_DTYPE": 15,
    "KVE_ERR_CALLBACK": 16,
}


def status_name(code):
    """The library's name of a status code, e.g. ``"KVE_ERR_ALIASING"``."""
    return lib.kve_status_name(int(code)).decode()


def status_message(code):
    """The library's one-line description of a status code."""
    return lib.kve_status_message(int(code)).decode()


class KvevictError(Exception):
    """A call into ``libkvevict`` returned a status other than ``KVE_OK``, or the binding
    rejected an argument the library would have rejected (same names).

    Attributes: ``status`` (int code), ``name`` (e.g. ``"KVE_ERR_INVALID_ARGUMENT"``),
    ``message`` (the library's description), ``function`` (the C function, or the
    binding's for checks done in Python), ``detail`` (extra context, may be empty).
    """

    def __init__(self, status, function="", detail=""):
        self.status = int(status)
        self.name = status_name(status)
        self.message = status_message(status)
        self.function = function
        self.detail = detail
        text = f"{self.name}: {self.message}"
        if function:
            text = f"{function}: {text}"
        if detail:
            text += f" ({detail})"
        super().__init__(text)


def check(status, function, detail=""):
    if status != OK:
        raise KvevictError(status, function, detail)


def call(name, *args, detail=""):
    """Call a status-returning C function, raising :class:`KvevictError` on failure."""
    check(getattr(lib, name)(*args), name, detail)


def _fail(name, function, detail):
    raise KvevictError(STATUS_CODES[name], function, detail)


# ------------------------------------------------------------------------- enumerations
def _norm(s):
    return str(s).lower().replace("_", "-")


class _Enum:
    def __init__(self, field, names):
        self.field = field
        self.by_name = {_norm(k): v for k, v in names.items()}
        self.by_value = {}
        for k, v in names.items():
            self.by_value.setdefault(v, k)

    def encode(self, v):
        if isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{self.field}: expected a name or an integer, got {v!r}")
        if isinstance(v, (int, np.integer)):
            return int(v)  # the library checks it (KVE_ERR_BAD_ENUM)
        key = _norm(v)
        if key not in self.by_name:
            raise ValueError(f"{self.field}: unknown value {v!r}; known: {', '.join(self.names())}")
        return self.by_name[key]

    def decode(self, v):
        return self.by_value.get(int(v), int(v))

    def names(self):
        return sorted(self.by_name, key=self.by_name.get)


DTYPES = _Enum("dtype", {"f32": 0, "float32": 0, "f16": 1, "float16": 1, "bf16": 2, "bfloat16": 2,
                         "q8_0": 3, "q4_0": 4})
# ggml's block-quantized dtypes: the C ABI takes them (host strided views); this binding does not
BLOCK_DTYPES = (3, 4)
# the library's one preset table (kve_preset_name), not a copy
PRESETS = _Enum("preset", {lib.kve_preset_name(i).decode(): i for i in range(lib.kve_preset_count())})
SCORERS = _Enum("scorer", {
    "snapkv": 0, "lava": 1, "laprox": 2, "criticalkv": 3, "streamingllm": 4, "knorm": 5, "tova": 6, "uniqueness": 7,
})
POOLS = _Enum("pool", {"none": 0, "avg": 1, "max": 2, "forward": 3})
GQA = _Enum("gqa", {"mean": 0, "max": 1, "sum": 2})
LAPROX_GQA = _Enum("laprox_gqa", {"sum": 0, "exact": 1, "mean-attn": 2})
PLACEMENTS = _Enum("placement", {"attention": 0, "product": 1})
ALLOCATORS = _Enum("allocator", {"uniform": 0, "ada": 1, "pyramid": 2, "lava": 3, "global": 4})
GRANULARITIES = _Enum("granularity", {"head": 0, "layer": 1, "token": 2})
NORMALIZE = _Enum("normalize", {"layer-sum": 0, "none": 1})


# ---------------------------------------------------------------------------- params
class _Params:
    """Shared machinery: attribute access over a ctypes struct, enum fields by name."""

    _struct = None
    _enums = {}
    _bools = ()

    def __init__(self):
        object.__setattr__(self, "_c", self._struct())

    def __getattr__(self, name):
        c = object.__getattribute__(self, "_c")
        if name in self._fields():
            v = getattr(c, name)
            if name in self._enums:
                return self._enums[name].decode(v)
            if name in self._bools:
                return bool(v) if v in (0, 1) else int(v)
            return v
        raise AttributeError(f"{type(self).__name__} has no field {name!r}")

    def __setattr__(self, name, value):
        if name not in self._fields():
            raise AttributeError(f"{type(self).__name__} has no field {name!r}; fields: {', '.join(self._fields())}")
        if name in self._enums:
            value = self._enums[name].encode(value)
        elif name in self._bools:
            value = int(value)
        setattr(self._c, name, value)

    @classmethod
    def _fields(cls):
        return [f for f, _ in cls._struct._fields_ if f not in ("struct_size", "reserved")]

    def as_dict(self):
        return {f: getattr(self, f) for f in self._fields()}

    def replace(self, **changes):
        """A copy with some fields changed."""
        new = self.copy()
        for k, v in changes.items():
            setattr(new, k, v)
        return new

    def copy(self):
        new = object.__new__(type(self))
        c = self._struct()
        ctypes.memmove(ctypes.byref(c), ctypes.byref(self._c), ctypes.sizeof(c))
        object.__setattr__(new, "_c", c)
        return new

    def __eq__(self, other):
        return type(self) is type(other) and bytes(self._c) == bytes(other._c)

    def __repr__(self):
        body = ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items())
        return f"{type(self).__name__}({body})"

    @property
    def _ref(self):
        return ctypes.byref(self._c)


class ScoreParams(_Params):
    """How to score one layer (``kve_score_params``, design §3).

    Fields: ``scorer`` (snapkv, lava, laprox, criticalkv, streamingllm, knorm, tova, uniqueness),
    ``window``, ``pool_kind`` (none, avg, max, forward), ``pool_kernel``, ``pool_decay``,
    ``gqa`` (mean, max, sum), ``reduce_before_pool`` (bool), ``laprox_gqa`` (sum, exact,
    mean-attn), ``placement`` (attention, product), ``sinks``, ``critical_first_stage``,
    ``power`` (the scores raised to this integer power in [1, 16], sign kept; 1 leaves them
    as computed, the ``laprox-span`` preset cubes them).
    Enumerations read back as names and accept names or integers.

    ``ScoreParams()`` is the ``snapkv`` preset; ``ScoreParams.preset(name, **fields)``
    any other. Aliases accepted by the constructor and :meth:`preset`: ``kernel`` for
    ``pool_kernel``, ``pool`` for ``pool_kind``, ``decay`` for ``pool_decay``.
    """

    _struct = kve_score_params
    _enums = {"scorer": SCORERS, "pool_kind": POOLS, "gqa": GQA, "laprox_gqa": LAPROX_GQA,
              "placement": PLACEMENTS}
    _bools = ("reduce_before_pool",)
    ALIASES = {"kernel": "pool_kernel", "pool": "pool_kind", "decay": "pool_decay"}
    PRESETS = tuple(PRESETS.names())

    def __init__(self, preset="snapkv", **fields):
        super().__init__()
        call("kve_score_params_init", self._ref, ctypes.sizeof(self._c), PRESETS.encode(preset))
        for k, v in fields.items():
            setattr(self, self.ALIASES.get(k, k), v)

    @classmethod
    def preset(cls, name, **fields):
        """The defaults of a named preset (design §3), some fields overridden."""
        return cls(name, **fields)

    @property
    def cross(self):
        """Whether LaProx needs cross-Gram blocks (``laprox_gqa`` other than sum)."""
        return self.scorer == "laprox" and self.laprox_gqa != "sum"


class SelectParams(_Params):
    """How to allocate budgets and select (``kve_select_params``, design §4).

    Fields: ``allocator`` (uniform, ada, pyramid, lava, global), ``granularity`` (head,
    layer, token), ``normalize`` (layer-sum, none), ``budget`` (average prefix tokens kept
    per (layer, KV head), window excluded: see :func:`budget_from_capacity` and
    :func:`budget_keep_ratio_total`), ``alpha``, ``beta``, ``post_pool_kind``,
    ``post_pool_kernel``, ``post_pool_decay``, ``post_pool_sinks`` (the first that many
    prefix positions keep their own score and lend none in the post-pool).
    """

    _struct = kve_select_params
    _enums = {"allocator": ALLOCATORS, "granularity": GRANULARITIES, "normalize": NORMALIZE,
              "post_pool_kind": POOLS}

    def __init__(self, allocator="uniform", granularity="head", budget=0, **fields):
        super().__init__()
        call("kve_select_params_init", self._ref, ctypes.sizeof(self._c),
             ALLOCATORS.encode(allocator), GRANULARITIES.encode(granularity), int(budget))
        for k, v in fields.items():
            setattr(self, k, v)

    @classmethod
    def laprox_span(cls, budget=0, **fields):
        """LaProx-span's selection: global allocator, token granularity, forward post
        pooling (k = 9, decay 1.0), position 0 (the attention sink) left out of the pool
        (``post_pool_sinks = 1``). Use with ``ScoreParams.preset("laprox-span")``."""
        self = cls.__new__(cls)
        _Params.__init__(self)
        call("kve_select_params_init_laprox_span", self._ref, ctypes.sizeof(self._c), int(budget))
        for k, v in fields.items():
            setattr(self, k, v)
        return self

    @classmethod
    def preset(cls, name, budget=0, **fields):
        """The selection the library gives preset ``name`` by default
        (``kve_select_params_init_preset``): lava → LAVa's allocator, laprox → global,
        laprox-span and uniqueness → :meth:`laprox_span`, uniform per head otherwise."""
        self = cls.__new__(cls)
        _Params.__init__(self)
        call("kve_select_params_init_preset", self._ref, ctypes.sizeof(self._c),
             PRESETS.encode(name), int(budget))
        for k, v in fields.items():
            setattr(self, k, v)
        return self


# ---------------------------------------------------------------------------- budgets
def budget_from_capacity(capacity, window):
    """Prefix budget for a capacity ``C`` per KV head with the window inside it
    (SnapKV / AdaKV / PyramidKV): ``max(C - window, 0)``."""
    return int(lib.kve_budget_from_capacity(int(capacity), int(window)))


def budget_keep_ratio_total(n, window, ratio):
    """Prefix budget keeping ``floor(n * ratio)`` tokens per head with the window counted
    inside that total (kvpress): ``max(floor(n*ratio) - min(window, n), 0)``."""
    return int(lib.kve_budget_keep_ratio_total(int(n), int(window), float(ratio)))


def budget_keep_ratio_prefix(n, window, ratio):
    """Prefix budget keeping ``floor((n - window) * ratio)`` prefix tokens, the window on top."""
    return int(lib.kve_budget_keep_ratio_prefix(int(n), int(window), float(ratio)))


def version():
    """The library's version string, e.g. ``"0.1.0"``."""
    return lib.kve_version_string().decode()


def version_number():
    """The library's version as ``MAJOR*10000 + MINOR*100 + PATCH``."""
    return int(lib.kve_version())


def library_path():
    """The path of the loaded shared library."""
    return _lib.path


# ---------------------------------------------------------------------------- tensors
class Tensor:
    """A numpy array with an explicit library dtype. Needed only for bfloat16 stored as
    ``uint16`` bit patterns: ``Tensor(bits, "bf16")`` (or :func:`bfloat16`). Any
    function that takes a tensor accepts a plain array or a ``Tensor``."""

    __slots__ = ("array", "dtype")

    def __init__(self, array, dtype):
        self.array = np.asarray(array)
        self.dtype = DTYPES.encode(dtype)
        if self.dtype in BLOCK_DTYPES:
            raise TypeError(f"dtype {dtype!r}: ggml's block-quantized K/V (q8_0, q4_0) are taken by "
                            "the C ABI (kve_tensor of KVE_DTYPE_Q8_0/Q4_0), not by this binding; "
                            "dequantize to float32 or float16 here")
        want = {0: np.dtype(np.float32).itemsize, 1: 2, 2: 2}.get(self.dtype)
        if want is None:
            raise ValueError(f"dtype {dtype!r}: unknown library dtype")
        if self.array.dtype.itemsize != want:
            raise TypeError(f"dtype {dtype!r} needs {want}-byte elements, got {self.array.dtype}")

    @property
    def shape(self):
        return self.array.shape


def bfloat16(bits):
    """Mark a ``uint16`` array of bfloat16 bit patterns as bf16 for the library."""
    bits = np.asarray(bits)
    if bits.dtype not in (np.uint16, np.int16):
        raise TypeError(f"bfloat16 bits must be uint16, got {bits.dtype}")
    return Tensor(bits, "bf16")


def to_bfloat16_bits(x):
    """float32 values → bfloat16 bit patterns (``uint16``), round to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def from_bfloat16_bits(bits):
    """bfloat16 bit patterns (``uint16``) → float32."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _lib_dtype(a, dtype):
    """Library dtype code of array ``a`` (``dtype`` overrides: for uint16 bf16 bits)."""
    if dtype is not None:
        code = DTYPES.encode(dtype)
        if code in BLOCK_DTYPES:
            Tensor(a, code)  # raises: the binding takes no block-quantized arrays
        if code == 2:
            if a.dtype.name == "bfloat16" or a.dtype in (np.uint16, np.int16):
                return a, 2
            raise TypeError(f"dtype='bfloat16' needs a uint16 (bit pattern) array, got {a.dtype}")
        if code in (0, 1):
            return a.astype(np.float32 if code == 0 else np.float16, copy=False), code
    if a.dtype == np.float32:
        return a, 0
    if a.dtype == np.float16:
        return a, 1
    if a.dtype.name == "bfloat16":  # ml_dtypes.bfloat16, without importing it
        return a, 2
    if a.dtype.kind == "f":  # float64 and friends: converted (a copy)
        return a.astype(np.float32), 0
    if a.dtype == np.uint16:
        raise TypeError("uint16 array: pass dtype='bfloat16' (or kvevict.bfloat16(arr)) "
                        "to read it as bfloat16 bits")
    raise TypeError(f"unsupported dtype {a.dtype}: use float32, float16 or bfloat16")


def element_strides(a, writable=False, what="tensor"):
    """numpy byte strides → element strides. Negative strides or strides that are not a
    multiple of the item size cannot be described: for inputs the array is copied
    (C-contiguous); for an output (``writable``) a ``ValueError`` is raised."""
    item = a.dtype.itemsize
    if all(s >= 0 and s % item == 0 for s in a.strides):
        return a, [s // item for s in a.strides]
    if writable:
        raise ValueError(f"{what}: strides {a.strides} (bytes) are negative or not a multiple of "
                         f"the item size {item}; the library cannot write through this view")
    a = np.ascontiguousarray(a)
    return a, [s // item for s in a.strides]


class _TensorRef:
    """A ``kve_tensor`` plus the array it points into (kept alive with it)."""

    __slots__ = ("c", "array", "code")


def make_tensor(x, what, dtype=None, writable=False, ndim=3):
    """Describe a 3-D array (head, token, dim) as a ``kve_tensor``; returns a holder whose
    ``.c`` is the struct and ``.array`` the (possibly converted) array it points into."""
    if isinstance(x, Tensor):
        a, code = x.array, x.dtype
    else:
        orig = np.asarray(x)
        a, code = _lib_dtype(orig, dtype)
        if writable and a is not orig:
            raise ValueError(f"{what}: dtype {orig.dtype} would need a converted copy; the "
                             "library writes float32, float16 or bfloat16 in place")
    if writable and not a.flags.writeable:
        raise ValueError(f"{what}: array is read-only")
    if a.ndim != ndim:
        raise ValueError(f"{what}: expected a {ndim}-D array, got shape {a.shape}")
    a, strides = element_strides(a, writable, what)
    t = _TensorRef()
    t.array, t.code = a, code
    c = kve_tensor()
    if a.size:
        c.data = a.ctypes.data
        c.len = 1 + sum((e - 1) * s for e, s in zip(a.shape, strides))
    c.dtype = code
    for i in range(3):
        c.extent[i] = a.shape[i]
        c.stride[i] = strides[i]
    t.c = c
    return t


def floats(x, what):
    """A C-contiguous float32 array (copied when needed) for a ``const float*`` input."""
    a = np.ascontiguousarray(np.asarray(x), dtype=np.float32)
    return a


def ptr(a):
    return a.ctypes.data if a is not None and a.size else None
