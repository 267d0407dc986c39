"""One name, one thing (issue #45): each name below is defined at the top level of exactly one
module of the installed packages, so that an import of it cannot reach a second, diverging copy
(``OBJECTIVES`` was once defined in both datagen/records.py and datagen/config.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
PACKAGES = ("vocab", "datagen", "contract", "cli", "pipelines", "trainer")

# name -> the one module (relative path) that defines it
HOMES = {
    "OBJECTIVES": "datagen/record_layout.py",
    "MASKINGS": "datagen/record_layout.py",
    "feature_spec": "datagen/record_layout.py",
    "packed_feature_spec": "datagen/record_layout.py",
    "INSTANCE_KEY": "datagen/record_layout.py",
    "WORD_BITS": "datagen/record_layout.py",
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
    assert definers()[name] == [HOMES[name]]


def test_imports_and_wrappers_are_told_apart(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from x import OBJECTIVES\nMASKINGS: tuple = ()\ndef feature_spec(): ...\nclass C: ...\n")
    assert top_level_definitions(module) == {"MASKINGS", "feature_spec", "C"}
