"""One name, one thing (issue #45): each name below is defined at the top level of exactly one
module of the installed packages, so that an import of it cannot reach a second, diverging copy
(``OBJECTIVES`` was once defined in both datagen/records.py and datagen/config.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
PACKAGES = ("vocab", "datagen", "contract", "cli", "pipelines", "trainer")

# name -> the one module (relative path) that defines it; None: a retired name that no module defines
HOMES: dict[str, str | None] = {
    "OBJECTIVES": "datagen/record_layout.py",
    "MASKINGS": "datagen/record_layout.py",
    "feature_spec": "datagen/record_layout.py",
    "packed_feature_spec": "datagen/record_layout.py",
    "INSTANCE_KEY": "datagen/record_layout.py",
    "WORD_BITS": "datagen/record_layout.py",
    "frame_columns": "datagen/records.py",
    "encode_framed": None,  # two encoders' name once (records.py and tasks/encode.py): now frame_columns
    # reached only by tests: beside them in tests/support (record_encoding.py, beam_options.py)
    "encode_batch": None,
    "encode_batch_reference": None,
    "beam_option_names": None,
    # a config a dataset cannot be made from; a model or run the trainer cannot make
    "ConfigError": "datagen/config.py",
    "TrainConfigError": "trainer/errors.py",
    "TrainConfig": "trainer/pretrain/config.py",  # pre-training's run config, beside pre-training
    # the span masking unit's choice, named apart from the answer spans of SQuAD tasks
    "choose_mask_spans": "datagen/span_masking.py",
    "choose_spans": None,
    # the driver steps `run` and `task` share, below both drivers
    "local_abspath": "pipelines/beam/driver.py",
    "read_run_vocab": "pipelines/beam/driver.py",
    "staged_dataset": "pipelines/beam/driver.py",
    "manifest_provenance": "pipelines/beam/driver.py",
    "write_dataset_files": "pipelines/tools/card.py",
    "write_card": "pipelines/tools/card.py",
}


def top_level_definitions(path: Path) -> set[str]:
    """Names a module binds at its top level by def, class or assignment (imports do not count)."""
    found: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found |= {t.id for t in targets if isinstance(t, ast.Name)}
    return found


def definers() -> dict[str, list[str]]:
    where: dict[str, list[str]] = {name: [] for name in HOMES}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for name in top_level_definitions(path) & set(HOMES):
                where[name].append(path.relative_to(REPO).as_posix())
    return where


@pytest.mark.parametrize("name", sorted(HOMES))
def test_defined_once_in_its_home(name: str) -> None:
    home = HOMES[name]
    assert definers()[name] == ([] if home is None else [home])


def test_imports_and_wrappers_are_told_apart(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from x import OBJECTIVES\nMASKINGS: tuple = ()\ndef feature_spec(): ...\nclass C: ...\n")
    assert top_level_definitions(module) == {"MASKINGS", "feature_spec", "C"}


def private_reaches(path: Path) -> list[str]:
    """Private names (``_x``) a module takes from another of ours: ``from ... import _x`` or
    ``module._x`` on a module or name it imported from ``bert_datagen``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    ours: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("bert_datagen")):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{node.module}.{alias.name}")
                ours.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            ours |= {a.asname for a in node.names if a.asname and a.name.startswith("bert_datagen")}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ours
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{node.value.id}.{node.attr}")
    return found


# Reaches that remain because the modules are being rewritten elsewhere at the same time; an entry
# that no longer occurs fails the test, so the list only shrinks.
PENDING_PRIVATE_REACHES: dict[str, list[str]] = {}


def test_no_private_helper_is_used_across_modules() -> None:
    reaches = {path.relative_to(REPO).as_posix(): found for package in PACKAGES
               for path in sorted((REPO / package).rglob("*.py")) if (found := private_reaches(path))}
    assert reaches == PENDING_PRIVATE_REACHES


def test_private_reaches_are_found(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from bert_datagen.datagen import records as _slots\nfrom bert_datagen.x import _y, z\n"
                      "from . import _w\nimport numpy as np\n_slots._varint(1)\nz._a\nnp._b\nz.__doc__\n")
    assert sorted(private_reaches(module)) == ["None._w", "_slots._varint", "bert_datagen.x._y", "z._a"]


# `task` takes nothing from `run`'s package: the steps both drivers share live below them
# (pipelines/beam/driver.py, errors.py, progress.py; pipelines/tools/card.py).
PENDING_TASKS_FROM_PRETRAINING: dict[str, list[str]] = {}


def test_task_takes_only_the_pending_steps_from_pretraining() -> None:
    taken = {}
    for path in sorted((REPO / "pipelines" / "tasks").rglob("*.py")):
        names = [f"{node.module}.{alias.name}"
                 for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                 if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bert_datagen.pipelines.pretraining")
                 for alias in node.names]
        if names:
            taken[path.relative_to(REPO).as_posix()] = sorted(names)
    assert taken == PENDING_TASKS_FROM_PRETRAINING
