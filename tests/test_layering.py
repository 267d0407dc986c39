"""The layering the README describes, enforced on the code itself.

Bottom up, each layer imports only from below: ``vocab`` (nothing of ours) -> ``datagen`` ->
``contract`` -> ``pipelines`` and ``trainer``, which never import each other. No import cycles
between modules. Every import counts, at module level or inside a function, ``TYPE_CHECKING`` ones
too: a lazy import is still a dependency. ``tests``, ``benchmarks`` and ``examples`` may import anything.

And the trainer's entry points load no Beam: ``import trainer`` and ``bert-train --help`` leave
neither ``apache_beam`` nor its GCP modules in ``sys.modules``.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LAYERS: dict[str, frozenset[str]] = {
    "vocab": frozenset(),
    "datagen": frozenset({"vocab"}),
    "contract": frozenset({"datagen", "vocab"}),
    "pipelines": frozenset({"contract", "datagen", "vocab"}),
    "trainer": frozenset({"contract", "datagen", "vocab"}),
}


def module_files(root: Path) -> dict[str, Path]:
    """Module name -> file, for every package of ``LAYERS`` present under ``root``."""
    modules = {}
    for package in LAYERS:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Our modules that ``name`` (at ``path``) imports: ``from a import b`` counts as ``a.b`` when
    that is a module, else as ``a``; relative imports are resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            # ``import a.b.c`` depends on a.b.c; keep the longest prefix that is one of ours.
            parts = target.split(".")
            for end in range(len(parts), 0, -1):
                candidate = ".".join(parts[:end])
                if candidate in known:
                    if candidate != name:
                        found.add(candidate)
                    break
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = module_files(root)
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in modules.items()}


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a package its layer may not use, as "importer -> imported"."""
    bad = []
    for importer, targets in sorted(graph.items()):
        layer = importer.split(".")[0]
        for target in sorted(targets):
            other = target.split(".")[0]
            if other != layer and other not in LAYERS[layer]:
                bad.append(f"{importer} -> {target}")
    return bad


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:  # iterative: no recursion limit on a deep chain
        nonlocal counter
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(cycles)


# ---------------------------------------------------------------- the checker itself


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_checker_finds_upward_and_sideways_imports_and_cycles(tmp_path) -> None:
    root = _tree(tmp_path, {
        "vocab/__init__.py": "",
        "vocab/words.py": "def f():\n    from datagen.rng import mix64  # lazy, still upward\n",
        "datagen/__init__.py": "",
        "datagen/rng.py": "from vocab import words\n",
        "datagen/a.py": "from . import b\n",
        "datagen/b.py": "import datagen.c\n",
        "datagen/c.py": "from datagen.a import x\n",
        "contract/__init__.py": "",
        "contract/m.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pipelines import fsio\n",
        "pipelines/__init__.py": "",
        "pipelines/fsio.py": "import apache_beam\nfrom contract.m import y\n",
        "pipelines/run.py": "from trainer import model\n",
        "trainer/__init__.py": "",
        "trainer/model.py": "from ..pipelines.fsio import z\n",
    })
    graph = import_graph(root)
    assert graph["datagen.a"] == {"datagen.b"} and graph["datagen.b"] == {"datagen.c"}
    assert graph["pipelines.fsio"] == {"contract.m"}  # third-party imports are not ours
    assert layer_violations(graph) == ["contract.m -> pipelines.fsio", "pipelines.run -> trainer.model",
                                       "trainer.model -> pipelines.fsio", "vocab.words -> datagen.rng"]
    assert import_cycles(graph) == [["contract.m", "pipelines.fsio"], ["datagen.a", "datagen.b", "datagen.c"],
                                    ["datagen.rng", "vocab.words"]]


def test_checker_passes_a_clean_tree(tmp_path) -> None:
    root = _tree(tmp_path, {
        "vocab/__init__.py": "",
        "vocab/words.py": "import json\n",
        "datagen/__init__.py": "",
        "datagen/rng.py": "from vocab.words import x\nfrom datagen import __version__\n",
        "contract/m.py": "from datagen.rng import mix64\n",
        "pipelines/run.py": "from contract import m\nfrom datagen import rng\n",
        "trainer/train.py": "from contract.m import load\nimport vocab.words\n",
    })
    graph = import_graph(root)
    assert graph["datagen.rng"] == {"vocab.words", "datagen"}
    assert layer_violations(graph) == [] and import_cycles(graph) == []


# ---------------------------------------------------------------- this repository


def test_no_upward_or_sideways_import() -> None:
    assert layer_violations(import_graph(REPO)) == []


def test_no_import_cycle() -> None:
    assert import_cycles(import_graph(REPO)) == []


BEAM_PREFIXES = ("apache_beam", "google.cloud", "apitools")


@pytest.mark.parametrize("code", [
    "import trainer",
    "import runpy\nsys.argv = ['bert-train', '--help']\ntry:\n    runpy.run_module('trainer.cli', run_name='__main__')\n"
    "except SystemExit as e:\n    assert e.code in (0, None), e.code",
], ids=["import trainer", "bert-train --help"])
def test_trainer_entry_points_load_no_beam(code: str) -> None:
    probe = (f"import json, sys\n{code}\n"
             f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({BEAM_PREFIXES!r}))))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
