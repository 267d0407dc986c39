"""A default corpus built from text that every CPython install ships.

``write_embedded_corpus(directory)`` writes ``text``-format files (one
paragraph per line, a blank line between documents) made of:

* the pydoc help topics (``pydoc_data.topics.topics``), one document per topic;
* the docstrings of the standard library's pure-Python modules, read from their
  source files with ``ast`` (nothing is imported), one document per module:
  its module, class and function docstrings in source order.

Code is left out (indented blocks, doctest lines, reST underlines), wrapped
lines are joined into paragraphs.  Files and topics are visited in sorted
order, so the corpus is the same bytes for a given Python version (about 2 MB
on CPython 3.11).  A Python whose standard library ships without ``.py``
sources yields the pydoc topics only.
"""

from __future__ import annotations

import ast
import os
import re
import sysconfig
from collections.abc import Iterator

SKIP_DIRS = frozenset(
    {"test", "tests", "idlelib", "lib2to3", "turtledemo", "ensurepip", "site-packages", "dist-packages",
     "__pycache__", "pydoc_data", "venv"}
)
FILE_BYTES = 1 << 20
_UNDERLINE = re.compile(r"^\s*([*=\-~^#+])\1{2,}\s*$")
_DOCTEST = re.compile(r"^\s*(>>>|\.\.\.)( |$)")


def clean_paragraphs(text: str) -> list[str]:
    """Prose paragraphs of a docstring or help topic: code, doctests and underlines dropped."""
    paragraphs = []
    block: list[str] = []
    for line in [*text.expandtabs(8).split("\n"), ""]:
        if line.strip():
            block.append(line)
            continue
        if block:
            prose = [ln for ln in block if not _UNDERLINE.match(ln) and not _DOCTEST.match(ln)]
            indents = [len(ln) - len(ln.lstrip()) for ln in prose]
            # An indented block under a paragraph is code or a grammar rule.
            if prose and min(indents) < 3:
                paragraphs.append(" ".join(ln.strip() for ln in prose))
            block = []
    return [p for p in paragraphs if any(ch.isalpha() for ch in p)]


def topic_documents() -> Iterator[list[str]]:
    from pydoc_data.topics import topics

    for name in sorted(topics):
        yield clean_paragraphs(topics[name])


def _stdlib_sources(root: str) -> Iterator[str]:
    for here, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(here, name)


def module_docstrings(path: str) -> list[str]:
    """Docstrings of a module's source file in source order; [] when it does not parse."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), filename=path)
    except (SyntaxError, ValueError, OSError):
        return []
    nodes = [n for n in ast.walk(tree) if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)]
    nodes.sort(key=lambda n: getattr(n, "lineno", 0))
    return [doc for n in nodes if (doc := ast.get_docstring(n))]


def stdlib_documents(root: str | None = None) -> Iterator[list[str]]:
    root = root or sysconfig.get_paths()["stdlib"]
    for path in _stdlib_sources(root):
        paragraphs = [p for doc in module_docstrings(path) for p in clean_paragraphs(doc)]
        if paragraphs:
            yield paragraphs


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    os.replace(tmp, path)


def write_embedded_corpus(directory: str, stdlib_root: str | None = None) -> list[str]:
    """Write the corpus as ``text``-format files under ``directory``; returns their paths in order."""
    os.makedirs(directory, exist_ok=True)
    paths: list[str] = []
    chunk: list[str] = []
    size = 0

    def flush() -> None:
        nonlocal chunk, size
        if chunk:
            path = os.path.join(directory, f"python_docs_{len(paths):03d}.txt")
            _write_atomic(path, "\n\n".join(chunk) + "\n")
            paths.append(path)
            chunk, size = [], 0

    for paragraphs in (*topic_documents(), *stdlib_documents(stdlib_root)):
        if not paragraphs:
            continue
        doc = "\n".join(paragraphs)
        chunk.append(doc)
        size += len(doc) + 2
        if size >= FILE_BYTES:
            flush()
    flush()
    return paths
