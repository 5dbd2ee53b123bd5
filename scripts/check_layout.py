#!/usr/bin/env python3
"""Checks the source layout rules of the house style on every crate's `src/`.

1. No import circle between files. A file imports another when it names an
   item through a `crate::`, `super::` or `self::` path (in a `use` or inline)
   that resolves to the other file's module, or through a plain path whose
   first segment is one of its own child modules (`child::f()`,
   `use child::X`, `use child::{a::X, Y}`): a parent that calls its child
   imports it as surely as `self::child::f()` would. A `mod.rs`/`lib.rs` re-exporting a
   child (`pub use child::X`) imports that child, so a child that reaches its
   siblings' items through the parent's re-exports closes a circle: it must
   import from the file that defines them (a type two files need lives in a
   third, lower one). Declaring a module (`mod x;`) is not an import.
2. No file over MAX_FILE_LINES lines outside tests (test files: `tests.rs`,
   `*_tests.rs`, files under `tests/`).
3. No function over MAX_FN_LINES lines (counted from its `fn` line to its
   closing brace), tests included.

Usage: scripts/check_layout.py [CRATE_DIR ...]   (default: every workspace
member that has a src/). Prints each violation and exits 1 if there is any.
The parsing is textual (comments and strings are stripped first), which is
enough for this codebase's style; `--self-test` checks the parser on a small
synthetic crate.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

MAX_FILE_LINES = 500
MAX_FN_LINES = 100

PATH_RE = re.compile(r"\b(crate|super|self)((?:\s*::\s*[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP_RE = re.compile(r"\buse\s+(crate|super|self)((?:\s*::\s*[A-Za-z_][A-Za-z0-9_]*)*)\s*::\s*\{")
# A path that starts with a plain name (no `::` or word character before it):
# checked against the file's declared child modules.
CHILD_PATH_RE = re.compile(r"(?<![\w:])([A-Za-z_][A-Za-z0-9_]*)\s*::\s*([A-Za-z_][A-Za-z0-9_]*(?:\s*::\s*[A-Za-z_][A-Za-z0-9_]*)*)")
CHILD_GROUP_RE = re.compile(r"(?<![\w:])([A-Za-z_][A-Za-z0-9_]*)((?:\s*::\s*[A-Za-z_][A-Za-z0-9_]*)*)\s*::\s*\{")
FN_RE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?(?:extern\s+\"[^\"]*\"\s+)?fn\s+\w+")


def strip_comments_and_strings(text: str) -> str:
    """Blanks out comments, string and char literals, keeping line structure."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            hashes = m.group(1)
            end = text.find('"' + hashes, i + len(m.group(0)))
            j = n if end < 0 else end + 1 + len(hashes)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]) or text.startswith("'\\u{", i):
            j = text.find("'", i + 1) + 1
            out.append(" " * (j - i))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


class Crate:
    """The module tree of one crate's `src/` (every target root under it)."""

    def __init__(self, src: Path):
        self.src = src
        # module path (tuple of names, root = ()) per file, per target root
        self.files: dict[Path, tuple[str, ...]] = {}
        self.roots: dict[Path, Path] = {}
        roots = [p for p in (src / "lib.rs", src / "main.rs") if p.exists()]
        bin_dir = src / "bin"
        if bin_dir.is_dir():
            roots += sorted(p for p in bin_dir.glob("*.rs"))
            roots += sorted(p / "main.rs" for p in bin_dir.iterdir() if (p / "main.rs").exists())
        for root in roots:
            self._walk(root, (), root)

    def _walk(self, file: Path, modpath: tuple[str, ...], root: Path):
        if file in self.files:
            return
        self.files[file] = modpath
        self.roots[file] = root
        text = strip_comments_and_strings(file.read_text())
        for m in re.finditer(r"^\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text, re.M):
            name = m.group(1)
            # `#[path = "..."]` is not used in this codebase.
            child = self._child_file(file, name)
            if child is not None:
                self._walk(child, modpath + (name,), root)

    def _child_file(self, file: Path, name: str) -> Path | None:
        base = file.parent if file.name in ("mod.rs", "lib.rs", "main.rs") or self.files.get(file) == () else file.parent / file.stem
        for cand in (base / f"{name}.rs", base / name / "mod.rs"):
            if cand.exists():
                return cand
        return None

    def module_file(self, root: Path, modpath: tuple[str, ...]) -> Path | None:
        for f, p in self.files.items():
            if p == modpath and self.roots[f] == root:
                return f
        return None

    def resolve(self, file: Path, kind: str, segs: list[str]) -> Path | None:
        """The file of the deepest module a `kind::segs` path names."""
        here = self.files[file]
        root = self.roots[file]
        if kind == "crate":
            base: tuple[str, ...] = ()
        elif kind == "self":
            base = here
        else:  # super (possibly repeated)
            base = here[:-1]
            while segs and segs[0] == "super":
                base = base[:-1]
                segs = segs[1:]
        best = self.module_file(root, base)
        path = base
        for s in segs:
            path = path + (s,)
            f = self.module_file(root, path)
            if f is None:
                break
            best = f
        return best


def imports(crate: Crate, file: Path) -> set[Path]:
    text = strip_comments_and_strings(file.read_text())
    found: set[Path] = set()

    def add(kind: str, tail: str):
        segs = [s for s in re.split(r"\s*::\s*", tail.strip()) if s]
        target = crate.resolve(file, kind, segs)
        if target is not None and target != file:
            found.add(target)

    for m in PATH_RE.finditer(text):
        add(m.group(1), m.group(2))
    # `use super::{a::X, b}`: every group member is a path of its own.
    for m in USE_GROUP_RE.finditer(text):
        start = m.end()
        depth, j = 1, start
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        prefix = m.group(2)
        for member in re.split(r",", text[start:j - 1]):
            member = member.strip().split("{")[0].strip().rstrip(":").strip()
            if member and member not in ("*", "self"):
                add(m.group(1), prefix + "::" + member.split(" as ")[0])
    # A child module named by a plain path in its parent (`use child::X;`,
    # `pub use child::{X, Y}`, `child::f()`, `child::grand::T`): every path
    # whose first segment is a declared child module of this file, not
    # itself following `::` (that would be a segment of another path).
    here = crate.files[file]
    root = crate.roots[file]
    for m in CHILD_PATH_RE.finditer(text):
        head = m.group(1)
        if head in ("crate", "super", "self", "std", "core", "alloc"):
            continue
        if crate.module_file(root, here + (head,)) is None:
            continue
        add("self", head + "::" + m.group(2))
    for m in CHILD_GROUP_RE.finditer(text):
        head = m.group(1)
        if crate.module_file(root, here + (head,)) is None:
            continue
        start = m.end()
        depth, j = 1, start
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        prefix = head + m.group(2)
        for member in re.split(r",", text[start:j - 1]):
            member = member.strip().split("{")[0].strip().rstrip(":").strip()
            if member and member not in ("*", "self"):
                add("self", prefix + "::" + member.split(" as ")[0])
    return found


def cycles(graph: dict[Path, set[Path]]) -> list[list[Path]]:
    """Strongly connected components of more than one file (Tarjan)."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on: set[Path] = set()
    out: list[list[Path]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v: Path):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def is_test_file(path: Path) -> bool:
    return path.name == "tests.rs" or path.stem.endswith("_tests") or "tests" in path.parts


def long_functions(path: Path) -> list[tuple[int, str, int]]:
    lines = strip_comments_and_strings(path.read_text()).split("\n")
    found = []
    for i, line in enumerate(lines):
        if not FN_RE.match(line):
            continue
        # Find the body's opening brace (signatures may span lines) or a `;`
        # that ends a bodiless declaration: one outside brackets and
        # parentheses (`[f32; 4]` in a signature is not).
        depth, nest, started, j = 0, 0, False, i
        while j < len(lines):
            for ch in lines[j]:
                if ch in "([":
                    nest += 1
                elif ch in ")]":
                    nest -= 1
                elif ch == "{":
                    depth += 1
                    started = True
                elif ch == "}":
                    depth -= 1
                elif ch == ";" and not started and depth == 0 and nest == 0:
                    break
            else:
                if started and depth == 0:
                    break
                j += 1
                continue
            break
        if started and j - i + 1 > MAX_FN_LINES:
            name = re.search(r"fn\s+(\w+)", line).group(1)
            found.append((i + 1, name, j - i + 1))
    return found


def check(crate_dirs: list[Path]) -> list[str]:
    problems = []
    for d in crate_dirs:
        src = d / "src"
        if not src.is_dir():
            continue
        crate = Crate(src)
        graph = {f: imports(crate, f) for f in crate.files}
        for comp in cycles(graph):
            names = ", ".join(str(p) for p in comp)
            problems.append(f"import circle: {names}")
        for f in sorted(src.rglob("*.rs")):
            n = len(f.read_text().splitlines())
            if n > MAX_FILE_LINES and not is_test_file(f):
                problems.append(f"{f}: {n} lines (over {MAX_FILE_LINES})")
            for line, name, length in long_functions(f):
                problems.append(f"{f}:{line}: fn {name} is {length} lines (over {MAX_FN_LINES})")
    return problems


def workspace_members(root: Path) -> list[Path]:
    text = (root / "Cargo.toml").read_text()
    m = re.search(r"^members\s*=\s*\[(.*?)\]", text, re.M | re.S)
    return [root / s for s in re.findall(r'"([^"]+)"', m.group(1))] if m else []


def self_test():
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "c" / "src"
        (src / "a").mkdir(parents=True)
        (src / "lib.rs").write_text("pub mod a;\npub mod b;\n")
        (src / "a" / "mod.rs").write_text("mod x;\nmod y;\npub use x::X;\npub use y::Y;\n")
        (src / "a" / "x.rs").write_text("pub struct X;\n// use super::y::Y;\n")
        (src / "a" / "y.rs").write_text('use super::X;\npub struct Y;\nconst S: &str = "crate::b";\n')
        (src / "b.rs").write_text("use crate::a::{x::X, y};\nfn f() {\n" + "    let _ = 1;\n" * 120 + "}\n")
        problems = check([Path(tmp) / "c"])
        circles = [p for p in problems if p.startswith("import circle")]
        assert len(circles) == 1 and "a/mod.rs" in circles[0] and "a/y.rs" in circles[0], problems
        assert any("fn f is 122 lines" in p for p in problems), problems
        # A `;` inside the signature's brackets does not end it: the body
        # after it is still counted.
        (src / "b.rs").write_text("fn g(x: [u8; 4],\n     y: Array<[f32; 2]>) {\n" + "    let _ = 1;\n" * 120 + "}\n"
                                  + "fn h(x: [u8; 4]);\n")
        problems = check([Path(tmp) / "c"])
        assert any("fn g is 123 lines" in p for p in problems), problems
        assert not any("fn h " in p for p in problems), problems
        (src / "a" / "y.rs").write_text("use super::x::X;\npub struct Y;\n")
        problems = check([Path(tmp) / "c"])
        assert not any(p.startswith("import circle") for p in problems), problems
        # A parent that calls its child by a plain path, inline or in a use
        # group, while the child imports an item back from the parent.
        for parent_text in ("mod x;\nmod y;\npub struct P;\nfn g() { x::f(); }\n",
                            "mod x;\nmod y;\npub struct P;\nuse x::{f as h};\n"):
            (src / "a" / "mod.rs").write_text(parent_text)
            (src / "a" / "x.rs").write_text("use super::P;\npub fn f() {}\n")
            problems = check([Path(tmp) / "c"])
            circles = [p for p in problems if p.startswith("import circle")]
            assert len(circles) == 1 and "a/mod.rs" in circles[0] and "a/x.rs" in circles[0], (parent_text, problems)
        # Not a child: `other::f()` and `std::x::y` name nothing of this crate,
        # and `crate::a::x` after `::` is a segment, not a path head.
        (src / "a" / "mod.rs").write_text("mod x;\nmod y;\npub struct P;\nfn g() { other::x::f(); std::x::f(); }\n")
        problems = check([Path(tmp) / "c"])
        assert not any(p.startswith("import circle") for p in problems), problems
    print("check_layout self-test: ok")


def main(argv: list[str]) -> int:
    if argv[1:2] == ["--self-test"]:
        self_test()
        return 0
    root = Path(__file__).resolve().parent.parent
    dirs = [Path(a) for a in argv[1:]] or workspace_members(root)
    problems = check(dirs)
    for p in problems:
        print(os.path.relpath(p) if os.path.exists(p) else p)
    if problems:
        print(f"check_layout: {len(problems)} problem(s)")
        return 1
    print(f"check_layout: ok ({', '.join(d.name for d in dirs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
