"""Long natural English text and chat filler for the decode-time benchmarks (issue 28), from
Debian's `python3-doc` (the Python 3.11 documentation's reStructuredText sources, installed
under /usr/share/doc/python3.11/html/_sources): prose paragraphs with code, directives,
tables and markup removed. Nothing is fetched at run time.

- `prose(split)`: one long text. dev = the tutorial, held-out = the HOWTOs.
- `faq(split)`: (question, answer) pairs of the FAQ, for filler turns of a conversation.
  dev = general + programming, held-out = design, library, extending, windows, gui, installed.
"""
import os
import re

ROOT = os.environ.get("KVEVICT_PYDOC", "/usr/share/doc/python3.11/html/_sources")

SPLITS = {
    "prose": {
        "dev": ["tutorial/" + f for f in ("appetite", "interpreter", "introduction", "controlflow",
                                          "datastructures", "modules", "inputoutput", "errors", "classes",
                                          "stdlib", "stdlib2", "venv", "whatnow", "interactive",
                                          "floatingpoint", "appendix")],
        "heldout": ["howto/" + f for f in ("pyporting", "functional", "logging", "regex", "sockets", "sorting",
                                           "unicode", "urllib2", "descriptor", "enum", "ipaddress", "curses")],
    },
    "faq": {
        "dev": ["faq/general", "faq/programming"],
        "heldout": ["faq/design", "faq/library", "faq/extending", "faq/windows", "faq/gui", "faq/installed"],
    },
}


def available():
    return os.path.isdir(os.path.join(ROOT, "tutorial"))


def _inline(s):
    s = re.sub(r":[a-zA-Z:]+:`~?([^`<]*?)\s*(<[^>]*>)?`", lambda m: m.group(1).split(".")[-1]
               if m.group(0).startswith((":func:`~", ":meth:`~", ":class:`~", ":mod:`~", ":attr:`~")) else m.group(1), s)
    s = re.sub(r"``([^`]*)``", r"\1", s)
    s = re.sub(r"`([^`<]*?)\s*<[^>]*>`_+", r"\1", s)
    s = re.sub(r"`([^`]*)`_*", r"\1", s)
    s = re.sub(r"\*\*([^*]+)\*\*", r"\1", s)
    s = re.sub(r"\*([^*\s][^*]*)\*", r"\1", s)
    s = re.sub(r"\s*\[#\]_", "", s)
    s = s.replace("\\", "")
    return " ".join(s.split())


def _blocks(path):
    """(kind, text) blocks of one .rst.txt: ("h", heading) or ("p", paragraph), prose only."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out = []
    para = []
    skip_indented = False

    def flush():
        nonlocal skip_indented
        if para:
            text = " ".join(x.strip() for x in para)
            ends_code = text.endswith("::")
            if ends_code:  # "text::" reads "text:", a lone " ::" nothing
                text = text[:-3] + "." if text.endswith(" ::") else text[:-1]
            out.append(("p", text))
            para.clear()
            return ends_code
        return False

    i = 0
    while i < len(lines):
        ln = lines[i]
        st = ln.strip()
        if skip_indented:
            if st == "" or ln.startswith((" ", "\t")):
                i += 1
                continue
            skip_indented = False
        if st == "":
            if flush():
                skip_indented = True
            i += 1
            continue
        if re.fullmatch(r"([=\-~^\"'*#+])\1{2,}", st):  # heading underline / overline
            if para:
                h = " ".join(x.strip() for x in para)
                para.clear()
                out.append(("h", h))
            i += 1
            continue
        if st.startswith(".. ") or st.startswith(">>>") or st.startswith("+-") or st.startswith(":"):
            flush()
            skip_indented = True
            i += 1
            continue
        if ln.startswith((" ", "\t")) and not para:
            i += 1  # an indented block on its own (code, quote, list continuation)
            continue
        if re.match(r"^([*\-+]|\d+\.|#\.)\s", st):  # list items: kept as their own paragraphs
            flush()
        para.append(ln)
        i += 1
    flush()
    res = []
    for kind, text in out:
        t = _inline(text)
        if kind == "p":
            t = re.sub(r"^([*\-+]|\d+\.|#\.)\s+", "", t)
            words = t.split()
            # prose: a few words at least, mostly letters
            if len(words) < 6 or sum(c.isalpha() for c in t) < 0.7 * len(t.replace(" ", "")):
                continue
        res.append((kind, t))
    return res


def prose(split):
    """The split's long text, paragraphs separated by blank lines."""
    paras = []
    for name in SPLITS["prose"][split]:
        for kind, t in _blocks(os.path.join(ROOT, name + ".rst.txt")):
            if kind == "p":
                paras.append(t)
    return "\n\n".join(paras) + "\n"


def faq(split):
    """(question, answer) pairs: a heading ending in '?' and the paragraphs under it (answers of
    40-160 words, the first paragraphs up to that length)."""
    pairs = []
    for name in SPLITS["faq"][split]:
        q, ans = None, []
        for kind, t in _blocks(os.path.join(ROOT, name + ".rst.txt")) + [("h", "")]:
            if kind == "h":
                if q and ans:
                    words = []
                    for p in ans:
                        if len(words) >= 40:
                            break
                        words += p.split()
                    if len(words) >= 25:
                        pairs.append((q, " ".join(words[:160])))
                q = t if t.endswith("?") else None
                ans = []
            elif q:
                ans.append(t)
    return pairs


if __name__ == "__main__":
    import sys
    for s in ("dev", "heldout"):
        p = prose(s)
        print(s, "prose:", len(p.split()), "words;", "faq:", len(faq(s)), "pairs", file=sys.stderr)
    print(prose(sys.argv[1] if len(sys.argv) > 1 else "dev")[:3000])
