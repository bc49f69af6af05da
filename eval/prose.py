"""Real prose for needle prompts (tasks.py `needle-prose`): sentences of the Python standard
library's docstrings (modules below, public classes and functions in name order), plain
sentences of 6-40 words without digits, code or markup, first occurrence only. Depends on
the Python version's docstrings (3.11.7 here, eval/setup.sh's venv: 864 sentences, 11565 words).
"""
import importlib
import inspect
import re

_MEMO = []
MODS = ["argparse", "json", "collections", "logging", "email.message", "http.client", "textwrap",
        "subprocess", "threading", "asyncio.events", "pathlib", "functools", "itertools", "random",
        "statistics", "decimal", "fractions", "datetime", "calendar", "csv", "sqlite3", "zipfile",
        "tarfile", "shutil", "tempfile", "socket", "ssl", "urllib.request", "unittest.case", "doctest",
        "pickle", "copy", "enum", "typing", "dataclasses", "contextlib", "abc", "io", "os", "string"]


def sentences():
    """The corpus, in a fixed order (memoised)."""
    if _MEMO:
        return _MEMO[0]
    out = []
    for m in MODS:
        mod = importlib.import_module(m)
        docs = [inspect.getdoc(mod) or ""]
        for name in sorted(dir(mod)):
            if name.startswith("_"):
                continue
            obj = getattr(mod, name, None)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                docs.append(inspect.getdoc(obj) or "")
        for d in docs:
            for para in re.split(r"\n\s*\n", d):
                if ">>>" in para or "::" in para or para.lstrip().startswith(("-", "*", ":")):
                    continue
                text = " ".join(para.split())
                for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", text):
                    w = s.split()
                    if 6 <= len(w) <= 40 and re.fullmatch(r"[A-Za-z0-9 ,.;:'()\-]+[.!?]", s) and not re.search(r"\d", s):
                        out.append(s)
    seen, res = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            res.append(s)
    _MEMO.append(res)
    return res
if __name__ == "__main__":
    s = sentences()
    print(len(s), "sentences,", sum(len(x.split()) for x in s), "words")
