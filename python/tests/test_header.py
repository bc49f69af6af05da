"""The binding's constants and prototypes against include/kvevict.h (skipped when the
header is not beside the tests, e.g. tests copied elsewhere)."""
import ctypes
import os
import re
import unittest

import kvevict as kve
from kvevict import _core, _lib

HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include", "kvevict.h")

SCALARS = {"uint64_t": ctypes.c_uint64, "uint32_t": ctypes.c_uint32, "int32_t": ctypes.c_int32,
           "double": ctypes.c_double, "float": ctypes.c_float}


def read_header():
    if not os.path.isfile(HEADER):
        raise unittest.SkipTest(f"no header at {HEADER}")
    with open(HEADER) as f:
        text = f.read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    defines = {m.group(1): int(m.group(2)) for m in
               re.finditer(r"#define\s+(KVE_\w+)\s+(-?\d+)\w*", text)}
    protos = {}
    for m in re.finditer(r"([\w\s\*]+?)\b(kve_\w+)\s*\(([^)]*)\)\s*;", text):
        ret, name, params = m.group(1).strip(), m.group(2), m.group(3).strip()
        args = [] if params in ("", "void") else [" ".join(p.split()) for p in params.split(",")]
        protos[name] = (ret, args)
    return defines, protos


class HeaderTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.defines, cls.protos = read_header()

    def test_enums_and_statuses(self):
        d = self.defines
        for name, code in kve.STATUS_CODES.items():
            self.assertEqual(d[name], code, name)
        groups = {"DTYPE": _core.DTYPES, "PRESET": _core.PRESETS, "SCORER": _core.SCORERS,
                  "POOL": _core.POOLS, "GQA": _core.GQA, "LAPROX_GQA": _core.LAPROX_GQA,
                  "PLACEMENT": _core.PLACEMENTS, "ALLOCATOR": _core.ALLOCATORS,
                  "GRANULARITY": _core.GRANULARITIES, "NORMALIZE": _core.NORMALIZE}
        for group, enum in groups.items():
            ours = {}
            for k, v in enum.by_name.items():
                ours.setdefault(v, set()).add(k)
            theirs = {n[len(f"KVE_{group}_"):]: v for n, v in d.items()
                      if n.startswith(f"KVE_{group}_")}
            self.assertTrue(theirs, group)
            for cname, v in theirs.items():
                self.assertIn(cname.lower().replace("_", "-"), ours.get(v, ()), f"KVE_{group}_{cname}")
            self.assertEqual(set(theirs.values()), set(ours), group)

    def test_struct_sizes(self):
        d = self.defines
        self.assertEqual(d["KVE_SCORE_PARAMS_V1_SIZE"], 48)
        self.assertEqual(d["KVE_SCORE_PARAMS_V2_SIZE"], ctypes.sizeof(_lib.kve_score_params))
        self.assertEqual(d["KVE_SELECT_PARAMS_V1_SIZE"], ctypes.sizeof(_lib.kve_select_params))
        self.assertEqual(d["KVE_LAYER_INPUTS_V1_SIZE"], 272)
        self.assertEqual(d["KVE_LAYER_INPUTS_V2_SIZE"], ctypes.sizeof(_lib.kve_layer_inputs))
        self.assertEqual(d["KVE_EVICTOR_ROUND_V1_SIZE"], 136)
        self.assertEqual(d["KVE_EVICTOR_ROUND_V2_SIZE"], ctypes.sizeof(_lib.kve_evictor_round))
        self.assertEqual(d["KVE_VERSION_NUMBER"], kve.version_number())

    def test_prototypes(self):
        host = {n: p for n, p in self.protos.items() if not n.startswith("kve_cuda_")}
        self.assertGreater(len(host), 30)
        self.assertEqual(sorted(set(host) - set(_lib._PROTOS)), [], "functions the binding lacks")
        for name, (ret, args) in host.items():
            res, argtypes = _lib._PROTOS[name]
            self.assertEqual(len(argtypes), len(args), name)
            for c, py in zip(args, argtypes):
                ctype = c.replace("const ", "").rsplit(" ", 1)[0] if "*" not in c else "*"
                if ctype == "*":
                    self.assertTrue(py is ctypes.c_void_p or py is ctypes.c_char_p
                                    or issubclass(py, ctypes._Pointer), f"{name}: {c}")
                else:
                    self.assertIs(py, SCALARS[ctype], f"{name}: {c}")
            if "*" in ret:
                self.assertIs(res, ctypes.c_char_p, name)
            else:
                self.assertIs(res, SCALARS[ret.split()[-1]], name)

    def test_mark_share_default(self):
        with open(HEADER) as f:
            m = re.search(r"#define\s+KVE_MARK_SHARE_DEFAULT\s+([\d.]+)f", f.read())
        self.assertIsNotNone(m)
        from kvevict import _evictor
        self.assertEqual(float(m.group(1)), _evictor.MARK_SHARE_DEFAULT)

    def test_mark_split(self):
        from kvevict import _evictor
        self.assertEqual(self.defines["KVE_MARK_SPLIT_SHARE"], _evictor.MARK_SPLIT_SHARE)
        self.assertEqual(self.defines["KVE_MARK_SPLIT_SPANS"], _evictor.MARK_SPLIT_SPANS)


if __name__ == "__main__":
    unittest.main()
