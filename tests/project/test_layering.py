"""The layering the README describes, enforced on the code itself.

Every package is installed under one namespace, ``bert_datagen.<layer>`` (the folders stay at the
repository root; pyproject maps ``bert_datagen`` to it). Bottom up, each layer imports only from below: ``vocab`` (nothing of ours) -> ``datagen`` ->
``contract`` -> ``cli`` -> ``pipelines`` and ``trainer``, which never import each other. No import cycles
between modules. Every import counts, at module level or inside a function, ``TYPE_CHECKING`` ones
too: a lazy import is still a dependency. ``tests``, ``benchmarks`` and ``examples`` may import anything.

One level down the same holds inside ``trainer`` and ``pipelines``: their sub-packages (and the
modules beside them, by name) in one declared order, ``SUBLAYERS``, bottom up; a module imports only
from its own sub-package or a lower rank, never upward or sideways (a rank's members do not import
each other), and every sub-package and top-level module of the two is placed in the order.

And the trainer's entry points load no Beam: ``import bert_datagen.trainer`` and ``bert-train --help``
leave neither ``apache_beam`` nor its GCP modules in ``sys.modules``.

And the namespace holds: pyproject's package list is the tree's packages (a new sub-package cannot be
forgotten), and nothing imports one of ours by its bare top-level name (``import trainer``,
``"pipelines.cli"``, ...): that would load a second copy of a module.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
NAMESPACE = "bert_datagen"
LAYERS: dict[str, frozenset[str]] = {
    "vocab": frozenset(),
    "datagen": frozenset({"vocab"}),
    "contract": frozenset({"datagen", "vocab"}),
    # The command-line plumbing (click group, error lines, signals, stderr filter) and the output
    # lock both CLIs share: not the data contract, so a layer of its own below the two.
    "cli": frozenset({"contract", "datagen", "vocab"}),
    "pipelines": frozenset({"cli", "contract", "datagen", "vocab"}),
    "trainer": frozenset({"cli", "contract", "datagen", "vocab"}),
}

# Bottom up; each rank a set of sub-packages or top-level modules (by name) of the layer.
# trainer: the error types and TensorFlow's start-up quieting need nothing of ours; the backends (the
# choice of one, and each one's compiled step and placement, given the model's functions as
# arguments) sit at the bottom; the model needs only them (nanoGPT's model beside its config); a run (step, checkpoints, devices, run directories) builds
# on the model; interop (TF1 / Hugging Face weights, exports) on runs' checkpoints; pre-training
# starts from interop's weights; fine-tuning starts from pre-training's runs and data checks; the
# commands that span several (`bert-train` itself, `eval` of any run) on top.
# pipelines: Beam plumbing; the tools that read and describe a dataset of any kind (verify, inspect,
# stats, diff, batches, the card) on the contract alone; `run` and `task` (a pre-training and a task
# dataset) side by side, never importing each other: the driver steps they share live in `beam/`;
# the command groups on top.
SUBLAYERS: dict[str, list[frozenset[str]]] = {
    "trainer": [frozenset({"errors", "quiet"}), frozenset({"backends"}), frozenset({"model"}), frozenset({"runtime"}), frozenset({"interop"}),
                frozenset({"pretrain"}), frozenset({"finetune"}), frozenset({"cli", "eval_cli"})],
    "pipelines": [frozenset({"beam"}), frozenset({"tools"}), frozenset({"pretraining", "tasks"}),
                  frozenset({"cli", "vocab_cli"})],
}

# Upward imports that remain only because the module to change is being rewritten elsewhere at the
# same time; each says what removes it. Nothing else is tolerated, and an entry that no longer
# occurs fails the test, so the list only shrinks.
PENDING_SUBLAYER_IMPORTS: dict[str, str] = {}


def module_files(root: Path) -> dict[str, Path]:
    """Module name (``bert_datagen.<layer>...``) -> file, for every package of ``LAYERS`` under ``root``."""
    modules = {}
    for package in LAYERS:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([NAMESPACE, *parts])] = path
    return modules


def layer_of(module: str) -> str:
    return module.split(".")[1]


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
        layer = layer_of(importer)
        for target in sorted(targets):
            other = layer_of(target)
            if other != layer and other not in LAYERS[layer]:
                bad.append(f"{importer} -> {target}")
    return bad


def sublayer_of(module: str) -> str | None:
    """The sub-package (or top-level module) of ``trainer`` or ``pipelines`` that ``module`` is in;
    None for the other layers and the layer's package itself."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] in SUBLAYERS else None


def sublayer_rank(layer: str, member: str, order: dict[str, list[frozenset[str]]]) -> int | None:
    return next((rank for rank, members in enumerate(order[layer]) if member in members), None)


def sublayer_violations(graph: dict[str, set[str]],
                        order: dict[str, list[frozenset[str]]] = SUBLAYERS) -> list[str]:
    """Each import inside ``trainer`` or ``pipelines`` from a higher rank of ``order`` or sideways
    (another member of the same rank), as "importer -> imported"; and each sub-package or module
    that ``order`` does not place, as "importer: not in the order"."""
    bad = []
    for importer, targets in sorted(graph.items()):
        member = sublayer_of(importer)
        if member is None:
            continue
        rank = sublayer_rank(layer_of(importer), member, order)
        if rank is None:
            bad.append(f"{importer}: not in the order")
            continue
        for target in sorted(targets):
            other = sublayer_of(target)
            if other is None or other == member or layer_of(target) != layer_of(importer):
                continue
            other_rank = sublayer_rank(layer_of(target), other, order)
            if other_rank is None or other_rank >= rank:
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
        "vocab/words.py": "def f():\n    from bert_datagen.datagen.rng import mix64  # lazy, still upward\n",
        "datagen/__init__.py": "",
        "datagen/rng.py": "from bert_datagen.vocab import words\n",
        "datagen/a.py": "from . import b\n",
        "datagen/b.py": "import bert_datagen.datagen.c as c\n",
        "datagen/c.py": "from bert_datagen.datagen.a import x\n",
        "contract/__init__.py": "",
        "contract/m.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from bert_datagen.pipelines import fsio\n",
        "pipelines/__init__.py": "",
        "pipelines/fsio.py": "import apache_beam\nfrom bert_datagen.contract.m import y\n",
        "pipelines/run.py": "from bert_datagen.trainer import model\n",
        "trainer/__init__.py": "",
        "trainer/model.py": "from ..pipelines.fsio import z\n",
    })
    graph = import_graph(root)
    ns = {name.removeprefix("bert_datagen."): {t.removeprefix("bert_datagen.") for t in targets}
          for name, targets in graph.items()}
    assert ns["datagen.a"] == {"datagen.b"} and ns["datagen.b"] == {"datagen.c"}
    assert ns["pipelines.fsio"] == {"contract.m"}  # third-party imports are not ours
    assert [v.replace("bert_datagen.", "") for v in layer_violations(graph)] == [
        "contract.m -> pipelines.fsio", "pipelines.run -> trainer.model",
        "trainer.model -> pipelines.fsio", "vocab.words -> datagen.rng"]
    assert [[m.removeprefix("bert_datagen.") for m in c] for c in import_cycles(graph)] == [
        ["contract.m", "pipelines.fsio"], ["datagen.a", "datagen.b", "datagen.c"], ["datagen.rng", "vocab.words"]]


def test_checker_passes_a_clean_tree(tmp_path) -> None:
    root = _tree(tmp_path, {
        "vocab/__init__.py": "",
        "vocab/words.py": "import json\n",
        "datagen/__init__.py": "",
        "datagen/rng.py": "from bert_datagen.vocab.words import x\nfrom bert_datagen.datagen import __version__\n",
        "contract/m.py": "from bert_datagen.datagen.rng import mix64\n",
        "pipelines/run.py": "from bert_datagen.contract import m\nfrom bert_datagen.datagen import rng\n",
        "trainer/train.py": "from bert_datagen.contract.m import load\nimport bert_datagen.vocab.words as words\n",
    })
    graph = import_graph(root)
    assert graph["bert_datagen.datagen.rng"] == {"bert_datagen.vocab.words", "bert_datagen.datagen"}
    assert layer_violations(graph) == [] and import_cycles(graph) == []


def test_checker_finds_upward_and_sideways_imports_between_sub_packages(tmp_path) -> None:
    order = {"trainer": [frozenset({"errors"}), frozenset({"model"}), frozenset({"runtime"}),
                         frozenset({"cli", "eval_cli"})],
             "pipelines": [frozenset({"beam"}), frozenset({"tools"})]}
    root = _tree(tmp_path, {
        "trainer/__init__.py": "",
        "trainer/errors.py": "",
        "trainer/cli.py": "from bert_datagen.trainer import eval_cli\n",  # sideways within the top rank
        "trainer/eval_cli.py": "from bert_datagen.trainer.runtime.loop import go\nfrom bert_datagen.trainer import errors\n",
        "trainer/model/__init__.py": "",
        "trainer/model/bert.py": "def f():\n    from ..runtime.config import BertConfig  # lazy, relative: still upward\n",
        "trainer/model/heads.py": "from bert_datagen.trainer.model.bert import f\nfrom bert_datagen.trainer.errors import E\n",
        "trainer/runtime/__init__.py": "",
        "trainer/runtime/config.py": "from bert_datagen.trainer.model import bert\n",
        "trainer/runtime/loop.py": "from bert_datagen.trainer.runtime.config import x\n",
        "trainer/interop/__init__.py": "",
        "trainer/interop/hf.py": "from bert_datagen.trainer.model import bert\n",  # a sub-package not in the order
        "pipelines/__init__.py": "",
        "pipelines/beam/__init__.py": "",
        "pipelines/beam/options.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                     "    from bert_datagen.pipelines.tools import kinds\n",
        "pipelines/tools/__init__.py": "",
        "pipelines/tools/kinds.py": "from bert_datagen.pipelines.beam.options import y\n",
    })
    found = [v.replace("bert_datagen.", "") for v in sublayer_violations(import_graph(root), order)]
    assert found == ["pipelines.beam.options -> pipelines.tools.kinds", "trainer.cli -> trainer.eval_cli",
                     "trainer.interop: not in the order", "trainer.interop.hf: not in the order",
                     "trainer.model.bert -> trainer.runtime.config"]


def test_checker_passes_sub_packages_in_order(tmp_path) -> None:
    order = {"trainer": [frozenset({"errors"}), frozenset({"model"}), frozenset({"runtime"})], "pipelines": []}
    root = _tree(tmp_path, {
        "trainer/__init__.py": "",
        "trainer/errors.py": "from bert_datagen.contract.m import x\n",
        "trainer/model/__init__.py": "",
        "trainer/model/config.py": "from bert_datagen.trainer.errors import ConfigError\n",
        "trainer/model/bert.py": "from .config import BertConfig\nfrom bert_datagen.trainer import errors\n",
        "trainer/runtime/__init__.py": "",
        "trainer/runtime/step.py": "from bert_datagen.trainer.model.bert import f\nimport bert_datagen.trainer.errors\n",
        "contract/m.py": "",
    })
    assert sublayer_violations(import_graph(root), order) == []


# ---------------------------------------------------------------- this repository


def test_no_upward_or_sideways_import() -> None:
    assert layer_violations(import_graph(REPO)) == []


def test_sub_packages_import_only_downward() -> None:
    found = sublayer_violations(import_graph(REPO))
    assert [v for v in found if v not in PENDING_SUBLAYER_IMPORTS] == []
    assert sorted(set(PENDING_SUBLAYER_IMPORTS) - set(found)) == []  # gone: delete its entry


def test_no_import_cycle() -> None:
    assert import_cycles(import_graph(REPO)) == []


BEAM_PREFIXES = ("apache_beam", "google.cloud", "apitools")


@pytest.mark.parametrize("code", [
    "import bert_datagen.trainer",
    "import runpy\nsys.argv = ['bert-train', '--help']\ntry:\n"
    "    runpy.run_module('bert_datagen.trainer.cli', run_name='__main__')\n"
    "except SystemExit as e:\n    assert e.code in (0, None), e.code",
], ids=["import bert_datagen.trainer", "bert-train --help"])
def test_trainer_entry_points_load_no_beam(code: str) -> None:
    probe = (f"import json, sys\n{code}\n"
             f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({BEAM_PREFIXES!r}))))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


# ---------------------------------------------------------------- the namespace


def tree_packages(root: Path) -> list[str]:
    """``bert_datagen`` and every package (a folder with ``__init__.py``) of ``LAYERS`` under ``root``."""
    return sorted([NAMESPACE] + [".".join([NAMESPACE, *init.parent.relative_to(root).parts])
                                 for package in LAYERS for init in (root / package).rglob("__init__.py")])


def test_pyproject_installs_every_package_of_the_tree_under_the_namespace() -> None:
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert setuptools["package-dir"] == {NAMESPACE: "."}
    assert sorted(setuptools["packages"]) == tree_packages(REPO)
    assert not (REPO / "__init__.py").exists()  # bert_datagen is a namespace package (PEP 420)
    for package in LAYERS:  # a folder of modules without __init__.py would not be installed
        for path in (REPO / package).rglob("*.py"):
            assert (path.parent / "__init__.py").exists(), path


BARE_LINE = re.compile(r"^\s*(?:from|import)\s+(?:" + "|".join(LAYERS) + r")(?![\w])", re.M)
BARE_DOTTED = re.compile(r"(?<![\w./-])((?:" + "|".join(LAYERS) + r")(?:\.\w+)+)")


def bare_references(path: Path, known: set[str]) -> list[str]:
    """Imports of our packages by their bare top-level names, in code and in code inside strings
    (subprocess scripts, mock.patch and monkeypatch targets, "module:function" tables, ``-m`` lines)."""
    text = path.read_text(encoding="utf-8")
    found = []
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in LAYERS]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in LAYERS:
            found.append(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [m.group(0).strip() for m in BARE_LINE.finditer(node.value)]
            found += [m.group(1) for m in BARE_DOTTED.finditer(node.value)
                      if ".".join([NAMESPACE, *m.group(1).split(".")[:2]]) in known]
    return [f"{path.relative_to(REPO)}: {name}" for name in found]


def test_nothing_imports_our_packages_by_their_bare_names() -> None:
    known = set(module_files(REPO))
    files = [p for top in (*LAYERS, "tests", "benchmarks", "examples") for p in sorted((REPO / top).rglob("*.py"))]
    assert [ref for path in files if path != Path(__file__).resolve() for ref in bare_references(path, known)] == []


def test_every_module_reads_in_one_sitting() -> None:
    """A module that outgrows 500 lines holds more than one concept: split it (as
    trainer/finetune/checks.py was split from run.py)."""
    long = {name: n for name, path in module_files(REPO).items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) >= 500}
    assert not long, long
