"""One writer of the dataset card (issue #45): `run` and `task` write DIR/README.md through
`write_card`, into their staging directory, naming the directory the dataset is swapped into."""

from __future__ import annotations

import ast
from pathlib import Path

from bert_datagen.contract.fs import LOCAL_FS
from bert_datagen.contract.manifest import CARD_NAME, Manifest
from bert_datagen.pipelines.tools.card import render_card, write_card
from tests.support.synthetic import write_synthetic_dataset

REPO = Path(__file__).resolve().parent.parent.parent


def test_the_card_is_written_into_staging_naming_the_dataset_directory(tmp_path: Path) -> None:
    dataset = write_synthetic_dataset(str(tmp_path / "data"), train_shards=1, records_per_shard=4, eval_records=2)
    manifest = Manifest.load(dataset, LOCAL_FS)
    staging = tmp_path / "staging"
    staging.mkdir()
    path = write_card(dataset, manifest, into=str(staging))
    assert path == str(staging / CARD_NAME)
    assert (staging / CARD_NAME).read_text(encoding="utf-8") == render_card(dataset, manifest)
    assert f"bert-datagen verify {dataset}" in (staging / CARD_NAME).read_text(encoding="utf-8")
    assert not (Path(dataset) / CARD_NAME).exists()
    assert write_card(dataset, manifest) == str(Path(dataset) / CARD_NAME)
    assert (Path(dataset) / CARD_NAME).read_bytes() == (staging / CARD_NAME).read_bytes()


def card_writers() -> set[str]:
    """Modules with a function that writes a file named CARD_NAME itself (calls ``write_atomic`` and
    names CARD_NAME)."""
    found = set()
    for package in ("contract", "pipelines", "trainer"):
        for path in (REPO / package).rglob("*.py"):
            for function in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(function, ast.FunctionDef):
                    continue
                nodes = list(ast.walk(function))
                writes = any(isinstance(n, ast.Call) and "write_atomic" in (getattr(n.func, "attr", None),
                                                                           getattr(n.func, "id", None))
                             for n in nodes)
                if writes and any(isinstance(n, ast.Name) and n.id == "CARD_NAME" for n in nodes):
                    found.add(path.relative_to(REPO).as_posix())
    return found


def test_only_the_card_module_writes_the_card() -> None:
    assert card_writers() == {"pipelines/tools/card.py"}
