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


# ---------------------------------------------------------------- task batches


def _task(labels: dict[str, np.ndarray], n: int = 4, width: int = 12, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = (np.arange(width)[None, :] < rng.integers(5, width + 1, n)[:, None]).astype(np.int64)
    return {"input_ids": rng.integers(5, VOCAB, (n, width)) * mask, "input_mask": mask,
            "segment_ids": np.zeros((n, width), np.int64), **labels}


def test_task_labels_of_the_four_types() -> None:
    cls = hf_inputs(_task({"label_ids": np.array([[1], [0], [2], [1]]), "is_real_example": np.ones((4, 1), np.int64)}))
    assert sorted(cls) == ["attention_mask", "input_ids", "labels", "token_type_ids"]
    assert cls["labels"].dtype == np.int64 and cls["labels"].tolist() == [1, 0, 2, 1]
    reg = hf_inputs(_task({"label_ids": np.array([[0.5], [2.5], [1.0], [4.0]], np.float32),
                           "is_real_example": np.ones((4, 1), np.int64)}))
    assert reg["labels"].dtype == np.float32 and reg["labels"].tolist() == [0.5, 2.5, 1.0, 4.0]
    span = hf_inputs(_task({"start_positions": np.array([[3], [0], [5], [7]]), "end_positions": np.array([[4], [0], [5], [9]]),
                            "is_impossible": np.array([[0], [1], [0], [0]]), "unique_ids": np.arange(4).reshape(4, 1)}))
    assert sorted(span) == ["attention_mask", "end_positions", "input_ids", "start_positions", "token_type_ids"]
    assert span["start_positions"].tolist() == [3, 0, 5, 7] and span["end_positions"].tolist() == [4, 0, 5, 9]
    tags = np.full((4, 12), -1, np.int64)
    tags[:, 1:4] = [[0, 2, 1], [3, 0, 0], [1, 1, 2], [0, 0, 3]]
    tagging = hf_inputs(_task({"label_ids": tags}))
    assert (tagging["labels"] == np.where(tags == -1, IGNORE_INDEX, tags)).all()
    assert (tagging["labels"] != IGNORE_INDEX).sum() == 12


@pytest.mark.parametrize(("labels", "why"), [
    ({"start_positions": np.zeros((4, 1), np.int64)}, "needs start_positions and end_positions"),
    ({"label_ids": np.zeros((4, 3), np.int64)}, "neither one label a record"),
    ({"label_ids": np.zeros((4, 12), np.float32)}, "neither one label a record"),
    ({"label_ids": np.full((4, 12), -2, np.int64)}, "tagging label_ids hold -2"),
    ({"start_positions": np.zeros((4, 1), np.float32), "end_positions": np.zeros((4, 1), np.float32)},
     "one integer a record"),
])
def test_task_labels_without_a_faithful_form_are_refused(labels, why) -> None:
    with pytest.raises(HFMappingError, match=why):
        hf_inputs(_task(labels))


def test_task_losses_are_finetunings() -> None:
    """The mapped labels give Hugging Face's heads the loss `trainer/model/heads.py` computes: tagging
    averages over the labelled tokens only, span is the mean of the start and end cross-entropies."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    def config(num_labels: int):  # noqa: ANN202
        return transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=32, max_position_embeddings=32, num_labels=num_labels)

    torch.manual_seed(0)
    tags = np.full((4, 12), -1, np.int64)
    tags[:, 1:4] = [[0, 2, 1], [3, 0, 0], [1, 1, 2], [0, 0, 3]]
    tags[2, 6] = 2
    batch = {k: torch.from_numpy(v) for k, v in hf_inputs(_task({"label_ids": tags})).items()}
    with torch.no_grad():
        out = transformers.BertForTokenClassification(config(4)).eval()(**batch)
    logp = torch.log_softmax(out.logits, -1).numpy()
    live = tags >= 0
    want = -logp[live, tags[live]].mean()
    assert float(out.loss) == pytest.approx(want, rel=1e-5)
    starts, ends = np.array([[3], [0], [5], [7]]), np.array([[4], [0], [5], [9]])
    batch = {k: torch.from_numpy(v) for k, v in hf_inputs(_task({"start_positions": starts, "end_positions": ends})).items()}
    with torch.no_grad():
        out = transformers.BertForQuestionAnswering(config(2)).eval()(**batch)
    rows = np.arange(4)
    ce_start = -torch.log_softmax(out.start_logits, -1).numpy()[rows, starts[:, 0]]
    ce_end = -torch.log_softmax(out.end_logits, -1).numpy()[rows, ends[:, 0]]
    assert float(out.loss) == pytest.approx(float((0.5 * (ce_start + ce_end)).mean()), rel=1e-5)
