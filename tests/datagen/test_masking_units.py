"""Masking units are a registry (datagen/masking_units.py), as sentence splitters and word
segmenters are: the config's choices, the CLI's, and what mask_batch asks for groups and choice."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from bert_datagen.datagen import masking_units
from bert_datagen.datagen.config import ConfigError, DatagenConfig
from bert_datagen.datagen.masking import mask_batch
from bert_datagen.datagen.rng import Stream
from tests.support.datagen_fakes import FakeVocab

VOCAB = FakeVocab()


def test_the_registered_units_in_order() -> None:
    assert masking_units.masking_units() == ("token", "word", "span")
    assert [masking_units.get_masking_unit(u).whole_words for u in ("token", "word", "span")] == [False, True, True]
    with pytest.raises(ValueError, match="already registered"):
        masking_units.register_masking_unit("word", True, lambda *a: (None, None))


def _first_candidate(cand, starts, group, keys, counters, target):
    """A unit of this test: each row masks its first candidate only."""
    chosen = np.zeros_like(cand)
    chosen[np.arange(cand.shape[0]), np.argmax(cand, axis=1)] = True
    return chosen & cand, None


def test_a_registered_unit_is_what_the_config_accepts_and_mask_batch_uses(monkeypatch) -> None:
    with pytest.raises(ConfigError, match="--masking-unit 'first' is not one of token, word, span"):
        DatagenConfig(masking_unit="first")
    monkeypatch.setitem(masking_units._UNITS, "first", masking_units.MaskingUnit(False, _first_candidate))
    config = DatagenConfig(masking_unit="first", max_seq_length=32, max_predictions_per_seq=5)
    ids = (5 + Stream(3).u64_array(4 * 32) % np.uint64(90)).astype(np.int32).reshape(4, 32)
    ids[:, 0], ids[:, 31] = VOCAB.cls_id, VOCAB.sep_id
    out = mask_batch(ids, np.full(4, 32), Stream(4).u64_array(4), config, VOCAB)
    assert out.masked_lm_positions[:, 0].tolist() == [1, 1, 1, 1]  # the first candidate, after [CLS]
    assert out.masked_lm_weights.sum(axis=1).tolist() == [1, 1, 1, 1]


def test_the_cli_offers_the_registered_units() -> None:
    from bert_datagen.pipelines.cli import main

    result = CliRunner().invoke(main, ["run", "--help"])
    assert result.exit_code == 0, result.output
    assert "[token|word|span]" in result.output
