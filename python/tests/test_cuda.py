"""kvevict.cuda (the device entry points over __cuda_array_interface__) against the host API.

Runs against the crate's ``cuda-emu`` build (``cargo build --release --lib --features
cuda-emu``, loaded through ``KVEVICT_LIB``; scripts/test.d/25-python-cuda-emu.sh): the REAL
kernels of cuda/ on the CPU emulator of cuda/emu. The fake device arrays below expose numpy
memory through ``__cuda_array_interface__``; each array's memory is registered with the
emulated runtime first (``kve_emu_host_register``: ``cudaHostRegister``, mapped, where the
device pointer is the host pointer), so the emulator's pointer checks stay on: a kernel
given memory that no array registered aborts. Skipped against a library built without CUDA
(the normal run of 20-python.sh) and against any other CUDA build (a real GPU build's
kernels cannot read numpy memory).
"""
import ctypes
import os
import struct
import unittest
import weakref

import numpy as np

from _util import layer

import kvevict as kve
from kvevict import cuda as kc

W = 8


# ------------------------------------------------------------------------ fake devices
def _emu_lib():
    """The loaded library's emulator registration (cuda-emu build), or None."""
    lib = ctypes.CDLL(kve.library_path())  # the same handle: one emulated runtime
    try:
        reg, unreg = lib.kve_emu_host_register, lib.kve_emu_host_unregister
    except AttributeError:
        return None
    reg.argtypes, reg.restype = [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_int
    unreg.argtypes, unreg.restype = [ctypes.c_void_p], ctypes.c_int
    return reg, unreg


_EMU = None
_REGISTERED = {}  # start address -> bytes, while the owning array lives


def _unregister(start):
    del _REGISTERED[start]
    st = _EMU[1](start)
    assert st == 0, f"kve_emu_host_unregister({start:#x}): CUDA status {st}"


def register(arr):
    """Registers the memory of ``arr``'s outermost numpy base (whole, once) with the
    emulator, until that base is freed; ``arr`` itself may be any view into it."""
    root = arr
    while True:  # (as_strided arrays hold their source behind a wrapper's .base)
        b = root.base
        if not isinstance(b, np.ndarray):
            b = getattr(b, "base", None)
        if not isinstance(b, np.ndarray):
            break
        root = b
    if root.size == 0:
        return
    lo = hi = root.ctypes.data
    for n, st in zip(root.shape, root.strides):
        lo, hi = lo + min(0, (n - 1) * st), hi + max(0, (n - 1) * st)
    hi += root.itemsize
    if _REGISTERED.get(lo) == hi - lo:
        return
    st = _EMU[0](lo, hi - lo)
    assert st == 0, f"kve_emu_host_register({lo:#x}, {hi - lo}): CUDA status {st}"
    _REGISTERED[lo] = hi - lo
    weakref.finalize(root, _unregister, lo)


class Dev:
    """A fake device array: ``__cuda_array_interface__`` over a numpy array (host memory,
    registered with the emulator when it runs). ``strides`` as torch reports them:
    ``None`` when C-contiguous, else bytes. ``typestr`` overrides the array's (e.g.
    ``'<V2'`` for bfloat16 bits held as uint16); ``cai`` entries override or add keys."""

    def __init__(self, arr, typestr=None, readonly=False, stream=None, **cai):
        if _EMU is not None:
            register(arr)
        self.arr = arr
        self.typestr = typestr
        self.readonly = readonly
        self.stream = stream
        self.cai = cai

    @property
    def __cuda_array_interface__(self):
        a = self.arr
        d = {
            "data": (a.ctypes.data if a.size else 0, self.readonly),
            "shape": tuple(a.shape),
            "strides": None if a.flags.c_contiguous else tuple(a.strides),
            "typestr": self.typestr or a.dtype.str,
            "version": 3 if self.stream is not None else 2,
        }
        if self.stream is not None:
            d["stream"] = self.stream
        d.update(self.cai)
        return d


def aligned(nbytes, align=256, offset=0):
    """A uint8 buffer whose address is ``offset`` past a multiple of ``align``."""
    buf = np.empty(nbytes + 2 * align, np.uint8)
    o = (-buf.ctypes.data) % align + offset
    return buf[o:o + nbytes]


def workspace(nbytes):
    return Dev(aligned(max(int(nbytes), 1)))


def _elf_sections(path):
    """Section names of an ELF file (empty for anything else)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return set()
    if data[:4] != b"\x7fELF" or data[4] != 2:  # ELF64 only
        return set()
    end = "<" if data[5] == 1 else ">"
    shoff, = struct.unpack_from(end + "Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", data, 0x3A)
    if not shoff or shstrndx >= shnum:
        return set()

    def header(i):
        return struct.unpack_from(end + "IIQQQQ", data, shoff + i * shentsize)

    stroff, strsize = header(shstrndx)[4:6]
    strtab = data[stroff:stroff + strsize]
    names = set()
    for i in range(shnum):
        n = header(i)[0]
        names.add(strtab[n:strtab.index(b"\0", n)].decode("ascii", "replace"))
    return names


def has_real_kernels(path):
    """A library with nvcc-compiled kernels carries their fat binary."""
    return bool(_elf_sections(path) & {".nv_fatbin", ".nvFatBinSegment", "__nv_relfatbin"})


def require_emulator():
    global _EMU
    if not kc.built_with_cuda():
        raise unittest.SkipTest(f"{kve.library_path()}: built without CUDA "
                                "(KVE_ERR_NOT_BUILT_WITH_CUDA); the cuda-emu build runs these")
    if has_real_kernels(kve.library_path()):
        raise unittest.SkipTest(f"{kve.library_path()}: real CUDA kernels; these tests pass host "
                                "memory as device memory (cuda-emu build only)")
    _EMU = _emu_lib()
    if _EMU is None:
        raise unittest.SkipTest(f"{kve.library_path()}: no kve_emu_host_register (not the "
                                "cuda-emu build); these tests pass host memory as device memory")


def token_major(x):
    """[H, N, d] → the [H, N, d] view into llama.cpp-style token rows [N, H*d]."""
    h, n, d = x.shape
    rows = np.ascontiguousarray(x.transpose(1, 0, 2)).reshape(n, h * d)
    return rows.reshape(n, h, d).transpose(1, 0, 2)


def transposed_v(x):
    """[H, N, d] → the [H, N, d] view into a transposed V [H*d, N]."""
    h, n, d = x.shape
    vt = np.ascontiguousarray(x.transpose(0, 2, 1)).reshape(h * d, n)
    return vt.reshape(h, d, n).transpose(0, 2, 1)


def rel_err(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)) if b.size else 0.0


def as_dtype(x, dt):
    """float32 array → (host argument, device-held array, typestr) for dtype ``dt``."""
    if dt == "f32":
        return x, x, None
    if dt == "f16":
        h = x.astype(np.float16)
        return h, h, None
    bits = kve.to_bfloat16_bits(x)
    return kve.bfloat16(bits), bits, "<V2"


def dev_view(arr, layout, typestr):
    """The device array of ``arr`` ([H, N, d]) in a layout: head-major, token-major rows,
    or transposed (V)."""
    if layout == "head":
        v = np.ascontiguousarray(arr)
    elif layout == "token":
        v = token_major(arr)
    else:
        v = transposed_v(arr)
    return Dev(v, typestr), v


# the kernels against the host (tests/capi_cuda/'s tolerances): f32 up to summation
# order, f16 / bf16 inputs through tensor-core products
TOL = {"f32": 5e-5, "f16": 5e-4, "bf16": 5e-4}


# ------------------------------------------------------------------------------ tests
class BindingTests(unittest.TestCase):
    """Library-independent parts: prototypes against the header, interface parsing."""

    def test_prototypes_match_header(self):
        from test_header import SCALARS, read_header

        _, protos = read_header()
        dev = {n: p for n, p in protos.items() if n.startswith("kve_cuda_")}
        self.assertEqual(sorted(dev), sorted(kve._lib._CUDA_PROTOS))
        for name, (ret, args) in dev.items():
            res, argtypes = kve._lib._CUDA_PROTOS[name]
            self.assertIs(res, SCALARS[ret.split()[-1]], name)
            self.assertEqual(len(argtypes), len(args), name)
            for c, py in zip(args, argtypes):
                if "*" in c:
                    self.assertTrue(py is ctypes.c_void_p or issubclass(py, ctypes._Pointer),
                                    f"{name}: {c}")
                else:
                    self.assertIs(py, SCALARS[c.replace("const ", "").rsplit(" ", 1)[0]],
                                  f"{name}: {c}")

    def test_available_never_raises(self):
        self.assertIsInstance(kc.available(), bool)
        self.assertIsInstance(kc.built_with_cuda(), bool)
        if not kc.built_with_cuda():
            self.assertFalse(kc.available())
            with self.assertRaises(kve.KvevictError) as cm:
                kc.device_count()
            self.assertEqual(cm.exception.name, "KVE_ERR_NOT_BUILT_WITH_CUDA")

    def test_interface_parsing(self):
        x = np.zeros((2, 5, 4), np.float32)
        a = kc.as_device_array(Dev(x), "x")
        self.assertEqual((a.shape, a.strides, a.itemsize), ((2, 5, 4), (80, 16, 4), 4))
        self.assertEqual(a.element_strides(), [20, 4, 1])
        self.assertEqual(a.reach(), 40)
        t = token_major(x)
        a = kc.as_device_array(Dev(t), "t")
        self.assertEqual(a.element_strides(), [4, 8, 1])
        self.assertEqual(a.reach(), 40)
        b = kc.as_device_array(Dev(x[:, ::2]), "b")  # strided slice: reach ends at its last element
        self.assertEqual(b.element_strides(), [20, 8, 1])
        self.assertEqual(b.reach(), 20 + 2 * 8 + 3 + 1)
        with self.assertRaises(TypeError):
            kc.as_device_array(x, "numpy")  # no __cuda_array_interface__
        with self.assertRaises(TypeError):
            kc.as_device_array(Dev(x, data=None), "x")
        with self.assertRaises(ValueError):
            kc.as_device_array(Dev(x, strides=(80, 16)), "x")
        with self.assertRaises(ValueError):
            kc.as_device_array(Dev(x, mask=object()), "x")

    def test_stream_handles(self):
        class Torch:
            cuda_stream = 0x1234

        class Cupy:
            ptr = 0x5678

        class Numba:
            handle = ctypes.c_void_p(0x9ABC)

        class Proto:
            def __cuda_stream__(self):
                return (0, 0xDEF0)

        self.assertEqual(kc.stream_handle(None), 0)
        self.assertEqual(kc.stream_handle(0), 0)
        self.assertEqual(kc.stream_handle(np.int64(7)), 7)
        self.assertEqual(kc.stream_handle(Torch()), 0x1234)
        self.assertEqual(kc.stream_handle(Cupy()), 0x5678)
        self.assertEqual(kc.stream_handle(Numba()), 0x9ABC)
        self.assertEqual(kc.stream_handle(Proto()), 0xDEF0)
        with self.assertRaises(TypeError):
            kc.stream_handle(True)
        with self.assertRaises(TypeError):
            kc.stream_handle("stream")
        with self.assertRaises(ValueError):
            kc.stream_handle(-1)
        # None: the interface's stream when the arrays agree
        x = np.zeros(4, np.float32)
        arrs = [kc.as_device_array(Dev(x, stream=s), "a") for s in (None, 0x77, 0x77)]
        self.assertEqual(kc._stream(None, arrs, "f"), 0x77)
        self.assertEqual(kc._stream(Torch(), arrs, "f"), 0x1234)
        self.assertIsNone(kc._stream(0, arrs, "f"))
        self.assertIsNone(kc._stream(None, arrs[:1], "f"))
        arrs.append(kc.as_device_array(Dev(x, stream=0x78), "b"))
        with self.assertRaises(ValueError):
            kc._stream(None, arrs, "f")


class _DeviceCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        require_emulator()


class ScoreTests(_DeviceCase):
    def setUp(self):
        self.q, self.k, self.v, self.wo = layer(seed=11, hq=6, hkv=2, n=72, d=16, D=32, wq=12)
        self.hq, self.hkv = self.q.shape[0], self.k.shape[0]
        self.n, self.d = self.k.shape[1], self.k.shape[2]
        self.gram = kve.compute_gram(self.wo, self.hkv)

    def device_score(self, params, q, k, v=None, dtype=None, **floats):
        """kvevict.cuda.score_layer with fake device arrays; returns [Hkv, P]."""
        p = kve.prefix_len(self.n, params.window)
        out = np.full(self.hkv * p, np.nan, np.float32)
        ws = kc.score_workspace_size(params, self.hq, self.hkv, self.n, self.d, self.d)
        extra = {name: Dev(np.ascontiguousarray(a, np.float32)) for name, a in floats.items()}
        r = kc.score_layer(params, q, k, v, out=Dev(out), workspace=workspace(ws), dtype=dtype,
                           **extra)
        self.assertIsInstance(r, Dev)
        return out.reshape(self.hkv, p)

    def configs(self):
        """(name, params, needs values, host extras)."""
        lap = kve.ScoreParams.preset("laprox", window=W)
        return [
            ("snapkv", kve.ScoreParams.preset("snapkv", window=W), False, {}),
            ("lava", kve.ScoreParams.preset("lava", window=W), True, {}),
            ("laprox+gram", lap, True, {"gram": self.gram}),
            ("laprox-exact+gram", lap.replace(laprox_gqa="exact"), True,
             {"gram": kve.compute_gram(self.wo, self.hkv, cross=True)}),
            ("laprox-span+gram", kve.ScoreParams.preset("laprox-span", window=W), True,
             {"gram": self.gram}),
        ]

    def test_scorers_dtypes_layouts(self):
        cases = 0
        for name, params, needs_v, extra in self.configs():
            for dt in ("f32", "f16", "bf16"):
                qh, qd, ts = as_dtype(self.q, dt)
                kh, kd, _ = as_dtype(self.k, dt)
                vh, vd, _ = as_dtype(self.v, dt)
                host = kve.score_layer(params, qh, kh, vh if needs_v else None, **extra)
                for klayout, vlayout in (("head", "head"), ("token", "transposed")):
                    q_dev = Dev(np.ascontiguousarray(qd), ts)
                    k_dev, _ = dev_view(kd, klayout, ts)
                    v_dev = dev_view(vd, vlayout, ts)[0] if needs_v else None
                    got = self.device_score(params, q_dev, k_dev, v_dev, **extra)
                    e = rel_err(got, host)
                    self.assertLessEqual(e, TOL[dt], f"{name} {dt} K {klayout}: {e:.2e}")
                    cases += 1
        self.assertEqual(cases, 5 * 3 * 2)

    def test_other_inputs(self):
        """value_forms instead of values + Gram; CriticalKV's value L1; row_lse; knorm
        without queries."""
        lap = kve.ScoreParams.preset("laprox", window=W)
        forms = kve.compute_value_forms(self.v, self.gram)
        host = kve.score_layer(lap, self.q, self.k, value_forms=forms)
        got = self.device_score(lap, Dev(self.q), Dev(self.k), value_forms=forms)
        self.assertLessEqual(rel_err(got, host), TOL["f32"])

        crit = kve.ScoreParams.preset("criticalkv", window=W, critical_first_stage=10)
        l1 = kve.compute_value_l1(self.v, self.wo)
        host = kve.score_layer(crit, self.q, self.k, value_l1=l1)
        got = self.device_score(crit, Dev(self.q), Dev(self.k), value_l1=l1)
        self.assertLessEqual(rel_err(got, host), TOL["f32"])

        snap = kve.ScoreParams.preset("snapkv", window=W)
        lse = kve.window_row_lse(self.q, self.k, W)
        host = kve.score_layer(snap, self.q, self.k, row_lse=lse)
        got = self.device_score(snap, Dev(self.q), Dev(self.k), row_lse=lse)
        self.assertLessEqual(rel_err(got, host), TOL["f32"])

        knorm = kve.ScoreParams.preset("knorm", window=W)
        host = kve.score_layer(knorm, keys=self.k)
        got = self.device_score(knorm, None, Dev(self.k))
        self.assertLessEqual(rel_err(got, host), TOL["f32"])

    def test_bf16_dtype_override(self):
        """A producer exporting bfloat16 as '<f2' (or bits as '<u2'): dtype='bfloat16'."""
        p = kve.ScoreParams.preset("snapkv", window=W)
        qb, kb = kve.to_bfloat16_bits(self.q), kve.to_bfloat16_bits(self.k)
        host = kve.score_layer(p, kve.bfloat16(qb), kve.bfloat16(kb))
        for ts in ("<f2", "<u2"):
            got = self.device_score(p, Dev(qb, ts), Dev(kb, ts), dtype="bfloat16")
            self.assertLessEqual(rel_err(got, host), TOL["bf16"], ts)
        # the same bits read as float16 are something else entirely
        f16 = self.device_score(p, Dev(qb, "<f2"), Dev(kb, "<f2"))
        self.assertGreater(rel_err(f16, host), 1e-3)
        with self.assertRaises(TypeError):  # ambiguous without the override
            self.device_score(p, Dev(qb), Dev(kb))
        with self.assertRaises(TypeError):  # 4-byte elements are no bfloat16
            self.device_score(p, Dev(self.q), Dev(self.k), dtype="bfloat16")

    def test_errors(self):
        p = kve.ScoreParams.preset("snapkv", window=W)
        P = self.n - W
        need = kc.score_workspace_size(p, self.hq, self.hkv, self.n, self.d)
        self.assertGreater(need, 0)
        q, k = Dev(self.q), Dev(self.k)
        out = np.full(self.hkv * P, -7.0, np.float32)

        def status(name, **kw):
            args = dict(out=Dev(out), workspace=workspace(need))
            args.update(kw)
            with self.assertRaises(kve.KvevictError) as cm:
                kc.score_layer(args.pop("params", p), args.pop("q", q), args.pop("k", k), **args)
            self.assertEqual(cm.exception.name, name, str(cm.exception))
            self.assertIn(name, str(cm.exception))
            np.testing.assert_array_equal(out, -7.0)  # nothing written
            return cm.exception

        e = status("KVE_ERR_WORKSPACE_TOO_SMALL", workspace=workspace(need - 1))
        self.assertEqual(e.function, "kve_cuda_score_layer")
        status("KVE_ERR_WORKSPACE_TOO_SMALL", workspace=None)
        status("KVE_ERR_MISALIGNED", workspace=Dev(aligned(need, offset=64)))
        status("KVE_ERR_OUTPUT_TOO_SMALL", out=Dev(out[:-1]))
        status("KVE_ERR_INVALID_ARGUMENT", params=p.replace(window=0))
        status("KVE_ERR_NULL_POINTER", k=None)
        status("KVE_ERR_ALIASING", out=Dev(self.k.reshape(-1)[: self.hkv * P]))
        # structure the C side cannot see: ValueError / TypeError before any call
        raw = np.zeros(self.k.size * 2 + 8, np.uint8)
        odd = np.lib.stride_tricks.as_strided(raw[1:].view(np.uint8), shape=self.k.shape,
                                              strides=(self.n * self.d * 4, self.d * 4 + 2, 4))
        with self.assertRaises(ValueError):  # a byte stride that is no multiple of 4
            kc.score_layer(p, q, Dev(odd, "<f4"), out=Dev(out), workspace=workspace(need))
        with self.assertRaises(ValueError):  # negative strides
            kc.score_layer(p, q, Dev(self.k[:, ::-1]), out=Dev(out), workspace=workspace(need))
        with self.assertRaises(ValueError):  # not 3-D
            kc.score_layer(p, q, Dev(self.k[0]), out=Dev(out), workspace=workspace(need))
        with self.assertRaises(TypeError):  # float64
            kc.score_layer(p, q, Dev(self.k.astype(np.float64)), out=Dev(out),
                           workspace=workspace(need))
        with self.assertRaises(TypeError):  # a numpy array is no device array
            kc.score_layer(p, q, self.k, out=Dev(out), workspace=workspace(need))
        with self.assertRaises(ValueError):  # read-only output
            kc.score_layer(p, q, k, out=Dev(out, readonly=True), workspace=workspace(need))
        with self.assertRaises(ValueError):  # non-contiguous output
            kc.score_layer(p, q, k, out=Dev(np.zeros(2 * out.size, np.float32)[::2]),
                           workspace=workspace(need))
        with self.assertRaises(TypeError):  # float16 output
            kc.score_layer(p, q, k, out=Dev(out.astype(np.float16)), workspace=workspace(need))
        np.testing.assert_array_equal(out, -7.0)
        # an empty row_lse is given (and refused), not absent
        with self.assertRaises(kve.KvevictError):
            kc.score_layer(p, q, k, row_lse=Dev(np.zeros(0, np.float32)), out=Dev(out),
                           workspace=workspace(need))


    def test_refused_launch(self):
        """A launch the device refuses comes back as KVE_ERR_CUDA with nothing written: f32
        keys with dk 256 and g 128 need 152,832 B of shared memory even split over chunks
        (tests/device/), more than sm_86/89's 99 KiB, the opt-in limit the emulator
        is given here."""
        rng = np.random.default_rng(2)
        hq, n, d = 128, 24, 256
        q = rng.standard_normal((hq, W, d)).astype(np.float32)
        k = rng.standard_normal((1, n, d)).astype(np.float32)
        p = kve.ScoreParams.preset("snapkv", window=W)
        out = np.full(n - W, -7.0, np.float32)
        need = kc.score_workspace_size(p, hq, 1, n, d)
        args = dict(out=Dev(out), workspace=workspace(need))
        kc.score_layer(p, Dev(q), Dev(k), **args)  # fits sm_90's 227 KiB
        self.assertTrue(np.isfinite(out).all())
        out[:] = -7.0
        old = os.environ.get("KVEVICT_EMU_SMEM_OPTIN")
        os.environ["KVEVICT_EMU_SMEM_OPTIN"] = "101376"
        try:
            with self.assertRaises(kve.KvevictError) as cm:
                kc.score_layer(p, Dev(q), Dev(k), **args)
        finally:
            if old is None:
                del os.environ["KVEVICT_EMU_SMEM_OPTIN"]
            else:
                os.environ["KVEVICT_EMU_SMEM_OPTIN"] = old
        self.assertEqual(cm.exception.name, "KVE_ERR_CUDA", str(cm.exception))
        np.testing.assert_array_equal(out, -7.0)


class SelectTests(_DeviceCase):
    L, H, N = 3, 4, 90

    def setUp(self):
        rng = np.random.default_rng(3)
        self.P = self.N - W
        self.s = rng.random((self.L, self.H, self.P)).astype(np.float32)

    def host_lists(self, params, scores=None):
        off, idx = kve.select_model(params, self.s if scores is None else scores, self.N, W)
        o = off.astype(np.int64)
        return [idx[o[u]:o[u + 1]] for u in range(self.L * self.H)]

    def device(self, params, scores=None, ld=None, idx_shape="2d", **kw):
        s = self.s if scores is None else scores
        units = self.L * self.H
        ld = ld or self.N
        counts = np.full(units, -1, np.int32)
        idx = np.full((units, ld), -1, np.int32)
        ws = kc.select_workspace_size(params, self.L, self.H, self.N, W)
        idx_dev = Dev(idx.reshape(self.L, self.H, ld) if idx_shape == "3d" else idx)
        kc.select_model(params, Dev(s), self.N, W, counts=Dev(counts), idx=idx_dev,
                        workspace=workspace(ws), **kw)
        return counts, idx

    def assertSame(self, params, counts, idx, what):
        want = self.host_lists(params)
        for u, w in enumerate(want):
            self.assertEqual(int(counts[u]), len(w), f"{what}: unit {u}")
            np.testing.assert_array_equal(idx[u, : counts[u]], w, err_msg=f"{what}: unit {u}")

    def test_allocators(self):
        budget = 20
        cases = [
            ("uniform/head", kve.SelectParams("uniform", "head", budget)),
            ("global/head", kve.SelectParams("global", "head", budget)),
            ("lava/head", kve.SelectParams("lava", "head", budget)),
            ("ada/head", kve.SelectParams("ada", "head", budget)),
            ("pyramid/head", kve.SelectParams("pyramid", "head", budget)),
            ("uniform/layer", kve.SelectParams("uniform", "layer", budget)),
            ("laprox-span/token", kve.SelectParams.laprox_span(budget)),
        ]
        for what, params in cases:
            counts, idx = self.device(params)
            self.assertSame(params, counts, idx, what)

    def test_layouts_of_outputs(self):
        params = kve.SelectParams.laprox_span(15)
        c1, i1 = self.device(params)
        c2, i2 = self.device(params, ld=self.N + 5)  # padded rows: idx_ld from the strides
        c3, i3 = self.device(params, idx_shape="3d")  # [L, Hkv, ld]
        c4, i4 = self.device(params, scores=self.s.reshape(-1), layers=self.L, hkv=self.H)
        for c, i in ((c2, i2), (c3, i3), (c4, i4)):
            np.testing.assert_array_equal(c, c1)
            for u in range(self.L * self.H):
                np.testing.assert_array_equal(i[u, : c[u]], i1[u, : c1[u]])
        self.assertTrue(np.all(i2[:, self.N:] == -1))  # the padding is not written

    def test_errors(self):
        params = kve.SelectParams("uniform", "head", 10)
        units = self.L * self.H
        need = kc.select_workspace_size(params, self.L, self.H, self.N, W)
        counts = np.zeros(units, np.int32)
        idx = np.zeros((units, self.N), np.int32)

        def call(**kw):
            args = dict(counts=Dev(counts), idx=Dev(idx), workspace=workspace(need))
            args.update(kw)
            scores = args.pop("scores", Dev(self.s))
            return kc.select_model(params, scores, self.N, W, **args)

        def status(name, **kw):
            with self.assertRaises(kve.KvevictError) as cm:
                call(**kw)
            self.assertEqual(cm.exception.name, name, str(cm.exception))

        status("KVE_ERR_WORKSPACE_TOO_SMALL", workspace=workspace(need - 1))
        status("KVE_ERR_OUTPUT_TOO_SMALL", counts=Dev(counts[:-1]))
        status("KVE_ERR_OUTPUT_TOO_SMALL", idx=Dev(idx[:, :-1]))  # idx_ld < n
        status("KVE_ERR_OUTPUT_TOO_SMALL", idx=Dev(idx[:-1]))
        status("KVE_ERR_SHAPE_MISMATCH", scores=Dev(self.s[:, :, :-1].copy()))  # P != n - window
        status("KVE_ERR_SHAPE_MISMATCH", scores=Dev(self.s.reshape(-1)[:-1]), layers=self.L,
               hkv=self.H)
        with self.assertRaises(ValueError):  # flat scores need layers and hkv
            call(scores=Dev(self.s.reshape(-1)))
        with self.assertRaises(TypeError):
            call(idx=Dev(idx.astype(np.int64)))
        with self.assertRaises(TypeError):
            call(counts=Dev(counts.astype(np.uint32)))
        with self.assertRaises(ValueError):  # idx must be [units, ld]
            call(idx=Dev(idx.reshape(-1)))
        with self.assertRaises(ValueError):  # rows not contiguous
            call(idx=Dev(np.zeros((units, 2 * self.N), np.int32)[:, ::2]))
        with self.assertRaises(ValueError):  # scores not contiguous
            call(scores=Dev(self.s.transpose(1, 0, 2)))


class LinkTests(_DeviceCase):
    """Value links and the linked selection on the device against the host's."""
    L, H, N = 3, 2, 70

    def test_links_match_host(self):
        rng = np.random.default_rng(4)
        for dt in (np.float32, np.float16):
            vs = [rng.standard_normal((self.H, self.N, 12)).astype(dt) for _ in range(self.L)]
            host = np.zeros(self.N, np.float32)
            dev = np.zeros(self.N, np.float32)
            ws = kc.value_links_workspace_size(self.H, self.N)
            for v in vs:
                vt = np.ascontiguousarray(v.transpose(0, 2, 1)).transpose(0, 2, 1)  # V transposed
                kve.accumulate_value_links(vt, host)
                kc.accumulate_value_links(Dev(vt), Dev(dev), workspace=workspace(ws))
            # the kernel's operation order is the host's AVX2 path (bits there; tests/capi_cuda_links.rs)
            np.testing.assert_allclose(dev, host, rtol=1e-5, atol=1e-6)
            self.assertGreater(np.abs(host).sum(), 0)
        with self.assertRaises(kve.KvevictError) as cm:  # links shorter than N
            kc.accumulate_value_links(Dev(vs[0]), Dev(np.zeros(self.N - 1, np.float32)),
                                      workspace=workspace(ws))
        self.assertEqual(cm.exception.name, "KVE_ERR_OUTPUT_TOO_SMALL")

    def test_linked_selection_matches_host(self):
        rng = np.random.default_rng(5)
        P = self.N - W
        s = rng.random((self.L, self.H, P)).astype(np.float32)
        links = (self.L * self.H * np.where(rng.random(self.N) < 0.6, 0.8, 0.2)).astype(np.float32)
        units = self.L * self.H
        flat = dict(post_pool_kind="forward", post_pool_kernel=4, post_pool_decay=1.0)
        for params in (kve.SelectParams.laprox_span(9), kve.SelectParams("global", "head", 6, **flat)):
            off, idx = kve.select_model(params, s, self.N, W, links=links)
            o = off.astype(np.int64)
            counts = np.full(units, -1, np.int32)
            lists = np.full((units, self.N), -1, np.int32)
            ws = kc.select_workspace_size(params, self.L, self.H, self.N, W)
            kc.select_model(params, Dev(s), self.N, W, counts=Dev(counts), idx=Dev(lists),
                            workspace=workspace(ws), links=Dev(links))
            for u in range(units):
                np.testing.assert_array_equal(lists[u, : counts[u]], idx[o[u]:o[u + 1]])
            with self.assertRaises(kve.KvevictError) as cm:
                kc.select_model(params, Dev(s), self.N, W, counts=Dev(counts), idx=Dev(lists),
                                workspace=workspace(ws), links=Dev(links[:-1]))
            self.assertEqual(cm.exception.name, "KVE_ERR_SHAPE_MISMATCH")


class CompactTests(_DeviceCase):
    L, H, N, D = 2, 3, 64, 8

    def setUp(self):
        rng = np.random.default_rng(9)
        self.kv = rng.standard_normal((self.H, self.N, self.D)).astype(np.float32)
        s = rng.random((self.L, self.H, self.N - W)).astype(np.float32)
        self.s = s
        self.params = kve.SelectParams("ada", "head", 17)
        self.off, self.idx = kve.select_model(self.params, s, self.N, W)
        self.kept = kve.kept_lists(self.off, self.idx, self.L, self.H)

    def lists(self, l, ld=None):
        """Layer ``l``'s host lists (window included) as int32 [H, ld] + counts."""
        counts = np.array([len(self.kept[l][h]) for h in range(self.H)], np.int32)
        ld = ld or self.N
        kept = np.full((self.H, ld), -1, np.int32)
        for h in range(self.H):
            kept[h, : counts[h]] = self.kept[l][h]
        return kept, counts

    def test_in_place_matches_host(self):
        for dt in ("f32", "f16", "bf16"):
            _, base, ts = as_dtype(self.kv, dt)
            for layout in ("head", "token"):
                for l in range(self.L):
                    kept, counts = self.lists(l, ld=self.N + 3)
                    mk = int(counts.max())
                    _, dview = dev_view(base, layout, ts)
                    host = np.ascontiguousarray(base).copy()
                    hostarg = kve.bfloat16(host) if dt == "bf16" else host
                    lengths = kve.compact_in_place(hostarg, self.off, self.idx, first_unit=l * self.H)
                    np.testing.assert_array_equal(lengths, counts)
                    ws = kc.compact_workspace_size(Dev(dview, ts), mk)
                    kc.compact_in_place(Dev(dview, ts), Dev(kept), Dev(counts), mk,
                                        workspace=workspace(ws))
                    np.testing.assert_array_equal(dview, host, err_msg=f"{dt} {layout} layer {l}")

    def test_select_then_compact_on_device(self):
        """The device pipeline: select, then compact layer 1 with rows of idx (a 2-D view,
        kept_ld from its strides) and a slice of counts; the window follows the prefix."""
        units = self.L * self.H
        counts = np.zeros(units, np.int32)
        idx = np.zeros((units, self.N + 4), np.int32)
        kc.select_model(self.params, Dev(self.s), self.N, W, counts=Dev(counts), idx=Dev(idx),
                        workspace=workspace(kc.select_workspace_size(self.params, self.L, self.H,
                                                                     self.N, W)))
        kv = self.kv.copy()
        rows = slice(self.H, 2 * self.H)
        mk = int(counts[rows].max())
        kc.compact_in_place(Dev(kv), Dev(idx[rows]), Dev(counts[rows]), mk,
                            workspace=workspace(kc.compact_workspace_size(Dev(kv), mk)))
        for h in range(self.H):
            c = counts[self.H + h]
            want = list(self.kept[1][h])
            np.testing.assert_array_equal(idx[self.H + h, :c], want)
            np.testing.assert_array_equal(kv[h, :c], self.kv[h, want])
            np.testing.assert_array_equal(kv[h, c:], self.kv[h, c:])

    def test_shared_list_token_rows(self):
        """Token granularity: one list for every layer and head; llama.cpp K rows [N, H*d]
        move whole as one head (1-D kept: kept_ld = 0)."""
        params = kve.SelectParams.laprox_span(12)
        off, idx = kve.select_model(params, self.s, self.N, W)
        keep = kve.kept_lists(off, idx, self.L, self.H)[0][0]
        rows = self.kv.transpose(1, 0, 2).reshape(self.N, self.H * self.D).copy()
        orig = rows.copy()
        kept = np.asarray(keep, np.int32)
        counts = np.array([len(keep)], np.int32)
        ws = kc.compact_workspace_size(Dev(rows[None]), len(keep))
        kc.compact_in_place(Dev(rows[None]), Dev(kept), Dev(counts), len(keep),
                            workspace=workspace(ws))
        np.testing.assert_array_equal(rows[: len(keep)], orig[keep])
        host = orig.copy()
        kve.compact_in_place(host[None], off, idx)
        np.testing.assert_array_equal(rows, host)

    def test_varlen_matches_host(self):
        for dt in ("f32", "bf16"):
            _, base, ts = as_dtype(self.kv, dt)
            kept, counts = self.lists(1)
            host_src = kve.bfloat16(base) if dt == "bf16" else base
            want, want_cu = kve.compact_varlen(host_src, self.off, self.idx, first_unit=self.H)
            dst = np.zeros((int(counts.sum()), self.D), base.dtype)
            cu = np.full(self.H + 1, -1, np.int32)
            r = kc.compact_varlen(Dev(token_major(base), ts), Dev(kept), Dev(counts),
                                  dst=Dev(dst, ts), cu_seqlens=Dev(cu))
            self.assertEqual(len(r), 2)
            np.testing.assert_array_equal(dst, want, err_msg=dt)
            np.testing.assert_array_equal(cu, want_cu, err_msg=dt)

    def test_errors(self):
        kept, counts = self.lists(0)
        mk = int(counts.max())
        kv = self.kv.copy()
        need = kc.compact_workspace_size(Dev(kv), mk)

        def status(name, fn, *a, **kw):
            with self.assertRaises(kve.KvevictError) as cm:
                fn(*a, **kw)
            self.assertEqual(cm.exception.name, name, str(cm.exception))
            np.testing.assert_array_equal(kv, self.kv)  # nothing moved

        status("KVE_ERR_WORKSPACE_TOO_SMALL", kc.compact_in_place, Dev(kv), Dev(kept), Dev(counts),
               mk, workspace=workspace(need - 1))
        # lengths the C functions do not take: checked here
        status("KVE_ERR_SHAPE_MISMATCH", kc.compact_in_place, Dev(kv), Dev(kept[:-1]),
               Dev(counts), mk, workspace=workspace(need))
        status("KVE_ERR_SHAPE_MISMATCH", kc.compact_in_place, Dev(kv), Dev(kept), Dev(counts[:-1]),
               mk, workspace=workspace(need))
        status("KVE_ERR_SHAPE_MISMATCH", kc.compact_in_place, Dev(kv), Dev(kept[0, :mk - 1]),
               Dev(counts), mk, kept_ld=0, workspace=workspace(need))
        # aliasing: overlapping heads (stride 0 broadcast) as an in-place target
        bc = np.broadcast_to(kv[:1], kv.shape)
        status("KVE_ERR_ALIASING", kc.compact_in_place, Dev(bc), Dev(kept), Dev(counts), mk,
               workspace=workspace(need))
        # (positions out of range in the device lists are the caller's to avoid: the host
        # cannot read them, and the kernels do not check them)
        with self.assertRaises(ValueError):
            kc.compact_in_place(Dev(kv, readonly=True), Dev(kept), Dev(counts), mk,
                                workspace=workspace(need))
        with self.assertRaises(ValueError):
            kc.compact_in_place(Dev(kv[:, ::-1]), Dev(kept), Dev(counts), mk,
                                workspace=workspace(need))
        with self.assertRaises(TypeError):
            kc.compact_in_place(Dev(kv), Dev(kept.astype(np.int64)), Dev(counts), mk,
                                workspace=workspace(need))
        dst = np.zeros((int(counts.sum()), self.D), np.float32)
        cu = np.zeros(self.H + 1, np.int32)
        status("KVE_ERR_OUTPUT_TOO_SMALL", kc.compact_varlen, Dev(kv), Dev(kept), Dev(counts),
               dst=Dev(dst), cu_seqlens=Dev(cu[:-1]))
        status("KVE_ERR_SHAPE_MISMATCH", kc.compact_varlen, Dev(kv), Dev(kept), Dev(counts),
               dst=Dev(np.zeros((4, self.D + 1), np.float32)), cu_seqlens=Dev(cu))
        with self.assertRaises(TypeError):  # dst of another dtype
            kc.compact_varlen(Dev(kv), Dev(kept), Dev(counts), dst=Dev(dst.astype(np.float16)),
                              cu_seqlens=Dev(cu))
        np.testing.assert_array_equal(kv, self.kv)


if __name__ == "__main__":
    unittest.main()
