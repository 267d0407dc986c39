"""Our batches as Hugging Face inputs (`contract/loading/hf.py`): labels where the masked tokens are,
and packed rows that a Hugging Face BERT reads as if each sequence were alone."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bert_datagen.contract.loading.hf import IGNORE_INDEX, HFMappingError, hf_inputs
from tests.support.packed_rows import pack_instances, unbatch
from tests.support.synthetic import synthetic_batch

L, P, VOCAB = 32, 5, 200


def _unpacked(n: int = 6, seed: int = 3) -> dict[str, np.ndarray]:
    batch = synthetic_batch(n, L, P, VOCAB, seed)
    return {f.name: np.asarray(getattr(batch, f.name)) for f in dataclasses.fields(batch)
            if getattr(batch, f.name) is not None}


def test_unpacked_labels_and_names() -> None:
    batch = _unpacked()
    batch["next_sentence_labels"] = batch["next_sentence_labels"].reshape(-1, 1)
    out = hf_inputs(batch)
    assert sorted(out) == ["attention_mask", "input_ids", "labels", "next_sentence_label", "token_type_ids"]
    assert (out["token_type_ids"] == batch["segment_ids"]).all() and out["next_sentence_label"].shape == (6,)
    for i in range(6):
        live = batch["masked_lm_weights"][i] > 0
        want = np.full(L, IGNORE_INDEX)
        want[batch["masked_lm_positions"][i][live]] = batch["masked_lm_ids"][i][live]
        assert (out["labels"][i] == want).all()
    assert (out["labels"] != IGNORE_INDEX).sum() == (batch["masked_lm_weights"] > 0).sum()


def test_packed_rows_refuse_nsp_naming_why() -> None:
    rows = pack_instances(unbatch(_unpacked()), 64, 4, P)
    with pytest.raises(HFMappingError, match="one NSP label per sequence"):
        hf_inputs(rows)
    assert "next_sentence_label" not in hf_inputs(rows, nsp=False)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_packed_row_reads_like_its_sequences_alone(attention: str) -> None:
    """A tiny BertForMaskedLM: the logits of every token of a packed row equal those of its
    sequence run alone (position ids restart, the mask keeps the sequences apart), and the MLM loss
    of the rows equals the loss of the unpacked batch (the same labelled tokens)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64,
                                     attn_implementation=attention)
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(config).eval()
    unpacked = _unpacked()
    rows = pack_instances(unbatch(unpacked), 64, 4, P)
    assert rows["sequence_ids"].max() > 1  # the rows do hold several sequences

    def run(batch: dict, nsp: bool) -> tuple:
        args = {k: torch.from_numpy(v) for k, v in hf_inputs(batch, nsp=nsp).items()}
        with torch.no_grad():
            result = model(**args)
        return result.logits.numpy(), float(result.loss)

    alone, alone_loss = run(unpacked, nsp=False)
    packed, packed_loss = run(rows, nsp=False)
    k = 0
    for r in range(len(rows["input_ids"])):
        for s in range(1, int(rows["sequence_ids"][r].max()) + 1):
            at = np.flatnonzero(rows["sequence_ids"][r] == s)
            np.testing.assert_allclose(packed[r, at], alone[k, :len(at)], atol=2e-5)
            k += 1
    assert k == len(unpacked["input_ids"])
    assert packed_loss == pytest.approx(alone_loss, abs=1e-5)
