"""The masking unit is one notion: ``whole_word_mask`` (the original's option, a manifest key) is a
spelling of ``masking_unit="word"``, read where it is spelled and nowhere else."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bert_datagen.contract.dataset import record_shape
from bert_datagen.datagen.config import DatagenConfig, masking_unit_of
from bert_datagen.vocab.vocab_file import Vocab

REPO = Path(__file__).resolve().parent.parent.parent
VOCAB = Vocab.from_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "##b"])


@pytest.mark.parametrize("recorded, unit", [
    ({}, "token"),  # a manifest of the original's token masking
    ({"whole_word_mask": True}, "word"),  # written before masking units: only the original's flag
    ({"whole_word_mask": False, "masking_unit": "token"}, "token"),
    ({"whole_word_mask": True, "masking_unit": "word"}, "word"),
    ({"whole_word_mask": True, "masking_unit": "span"}, "span"),
])
def test_a_manifest_config_reads_as_its_masking_unit(recorded: dict, unit: str) -> None:
    assert record_shape(VOCAB, 16, 3, recorded).masking_unit == unit
    assert masking_unit_of(recorded.get("masking_unit", "token"), recorded.get("whole_word_mask", False)) == unit


def test_the_config_reads_either_spelling_as_one_unit() -> None:
    assert DatagenConfig(whole_word_mask=True).masking_unit == "word"
    assert DatagenConfig(masking_unit="span").masking_unit == "span"
    assert DatagenConfig().masking_unit == "token"


def test_whole_word_mask_is_read_only_where_it_is_spelled() -> None:
    """The option's spelling (CLI), the config that records it, and the contract's reading of
    manifests; every other module asks for the masking unit."""
    readers = set()
    for package in ("vocab", "datagen", "contract", "cli", "pipelines", "trainer"):
        for path in (REPO / package).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
            names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
            names |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
            names |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
            names |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.keyword)}
            if "whole_word_mask" in names:
                readers.add(path.relative_to(REPO).as_posix())
    assert readers == {"datagen/config.py", "contract/dataset.py", "pipelines/pretraining/cli.py"}
