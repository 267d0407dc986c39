"""docs/layout.md's module map matches the tree: it names every module of the six packages, and
every module path it names exists."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
LAYOUT = REPO / "docs" / "layout.md"
PACKAGES = ("vocab", "datagen", "contract", "cli", "pipelines", "trainer")
TOP_LEVEL = (*PACKAGES, "examples", "tests", "benchmarks")


def named_modules(text: str) -> set[str]:
    """Module paths the map names, relative to the repository root.

    In the "Modules" list a bullet opens with its folder (`- `trainer/runtime/`: ...`) and names that
    folder's modules by file name (`config.py`); a path with a folder (`datagen/rng.py`), anywhere
    in the file, is read from the repository root.
    """
    names = {ref for ref in re.findall(r"`([\w/]+\.py)`", text) if ref.split("/")[0] in TOP_LEVEL}
    modules = text.split("\n## Modules", 1)[1].split("\n## ", 1)[0]
    for bullet in re.split(r"\n(?=\s*- )", modules):
        folder = re.match(r"\s*- `([\w/]+/)`", bullet)
        if folder:
            names |= {folder.group(1) + ref for ref in re.findall(r"`(\w+\.py)`", bullet)}
    return names


def package_modules() -> set[str]:
    return {p.relative_to(REPO).as_posix() for package in PACKAGES for p in (REPO / package).rglob("*.py")
            if p.name != "__init__.py"}


def test_layout_names_every_module() -> None:
    missing = sorted(package_modules() - named_modules(LAYOUT.read_text()))
    assert missing == [], f"docs/layout.md does not name: {missing}"


def test_every_module_layout_names_exists() -> None:
    gone = sorted(name for name in named_modules(LAYOUT.read_text()) if not (REPO / name).is_file())
    assert gone == [], f"docs/layout.md names modules that do not exist: {gone}"


def test_the_reading_of_the_map() -> None:
    text = ("Intro `datagen/rng.py`.\n\n## Modules\n\n- `vocab/`: `basic.py` (x), `train.py`.\n"
            "  - `pipelines/beam/`: `runners.py`, see `contract/fs.py`.\n\n## Next\n\n`other.py`\n")
    assert named_modules(text) == {"datagen/rng.py", "vocab/basic.py", "vocab/train.py",
                                   "pipelines/beam/runners.py", "contract/fs.py"}
