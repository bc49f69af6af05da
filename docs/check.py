#!/usr/bin/env python3
"""Checks of the documentation (no dependencies beyond Python 3).

    python3 docs/check.py                 # every relative link of README.md and docs/**/*.md resolves
    python3 docs/check.py --quickstarts   # also: the README's C, Rust and Python quick starts build and run

Links: a relative target must exist in the repository (a folder or a file); a `#anchor` into a
Markdown file must match one of its headings (GitHub's rule: lower case, punctuation dropped,
spaces to hyphens). The README must stay within 150 lines.
Quick starts (after `cargo build --release`): the ```c block is compiled against
target/release/libkvevict.a and run; the ```rust block is built as a binary depending on this
crate by path (target dir: target/, so the crate's build is reused); the ```python block runs
with PYTHONPATH=python and KVEVICT_LIB (needs numpy: set KVEVICT_DOCS_PYTHON to a Python that
has it). Exit status 1 on any failure.
"""
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading):
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def anchors(path):
    out, fence = set(), False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out


def doc_files():
    files = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "CHANGELOG.md")]
    for d, _, names in os.walk(os.path.join(ROOT, "docs")):
        files += [os.path.join(d, n) for n in names if n.endswith(".md")]
    return [f for f in files if os.path.exists(f)]


def check_links():
    bad = []
    for f in doc_files():
        fence = False
        for no, line in enumerate(open(f, encoding="utf-8"), 1):
            if line.startswith("```"):
                fence = not fence
                continue
            if fence:
                continue
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue  # http(s), mailto
                path, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
                where = f"{os.path.relpath(f, ROOT)}:{no}: {target}"
                if not os.path.exists(dest):
                    bad.append(f"{where}: no such file")
                elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                    bad.append(f"{where}: no heading for #{anchor}")
    return bad


def check_readme():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    bad = []
    if len(text.splitlines()) > 150:
        bad.append(f"README.md: {len(text.splitlines())} lines (at most 150)")
    return bad


def block(lang):
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    m = re.search(r"^```" + lang + r"\n(.*?)^```", text, re.S | re.M)
    if not m:
        raise SystemExit(f"README.md: no ```{lang} block")
    return m.group(1)


def run(cmd, **kw):
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        return [f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout}{r.stderr}"]
    print(r.stdout.strip())
    return []


def check_quickstarts():
    bad, tmp = [], tempfile.mkdtemp(prefix="kvevict-docs-")
    tdir = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    lib = os.path.join(tdir, "release")
    c = os.path.join(tmp, "qs.c")
    open(c, "w").write(block("c"))
    exe = os.path.join(tmp, "qs_c")
    bad += run(["cc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-I", "include", c,
                os.path.join(lib, "libkvevict.a"), "-lpthread", "-ldl", "-lm", "-o", exe])
    if not bad:
        bad += run([exe])
    crate = os.path.join(tmp, "qs_rust")
    os.makedirs(os.path.join(crate, "src"))
    open(os.path.join(crate, "Cargo.toml"), "w").write(
        '[package]\nname = "qs"\nversion = "0.0.0"\nedition = "2021"\n[workspace]\n'
        f'[dependencies]\nkvevict = {{ path = "{ROOT}" }}\n'
        '[profile.release]\npanic = "abort"\ndebug = 1\ncodegen-units = 4\n')
    open(os.path.join(crate, "src", "main.rs"), "w").write(block("rust"))
    env = dict(os.environ, CARGO_TARGET_DIR=tdir)
    bad += run(["cargo", "run", "--quiet", "--release", "--manifest-path",
                os.path.join(crate, "Cargo.toml")], env=env)
    py = os.path.join(tmp, "qs.py")
    open(py, "w").write(block("python"))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"),
               KVEVICT_LIB=os.path.join(lib, "libkvevict.so"))
    bad += run([os.environ.get("KVEVICT_DOCS_PYTHON", sys.executable), py], env=env)
    return bad


def main():
    bad = check_links() + check_readme()
    if "--quickstarts" in sys.argv[1:]:
        bad += check_quickstarts()
    for b in bad:
        print(b, file=sys.stderr)
    print(f"docs check: {len(bad)} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
