"""The backbone / task split: one head class per task type, each the one source of its outputs, its
TF1 names and its Hugging Face architecture; the pre-trainer is the encoder plus its own heads."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from bert_datagen.datagen.tasks import config as task_config  # noqa: E402
from bert_datagen.trainer.interop.finetune_export import hf_task_config, hf_task_state  # noqa: E402
from bert_datagen.trainer.model import heads  # noqa: E402
from bert_datagen.trainer.model.bert import BertEncoder, BertPretrainer, build_model, tf1_variable_map  # noqa: E402
from bert_datagen.trainer.model.config import BertConfig  # noqa: E402

TINY = BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=24, max_position_embeddings=32)
LABELS = {"classification": ["a", "b", "c"], "regression": [], "span": [], "tagging": ["O", "B-X", "I-X"]}


def _model(task_type: str, seed: int = 1) -> heads.FineTuneModel:
    return heads.build_finetune_model(TINY, task_type, len(LABELS[task_type]), seed=seed)


def test_the_registry_covers_every_task_type_the_data_side_makes():
    made = {task_config.CLASSIFICATION, task_config.REGRESSION, task_config.SPAN, task_config.TAGGING}
    assert set(heads.HEADS) == made == set(heads.TASK_TYPES)
    for task_type, head in heads.HEADS.items():
        assert issubclass(head, heads.TaskHead) and head.task_type == task_type
        assert heads.head_class(task_type) is head
    with pytest.raises(ValueError, match="unknown task type 'ranking'; choose one of classification"):
        heads.head_class("ranking")


@pytest.mark.parametrize("task_type", sorted(heads.HEADS))
def test_each_head_owns_its_outputs_and_tf1_names(task_type):
    model = _model(task_type)
    head = heads.HEADS[task_type]
    assert type(model.head) is head
    rng = np.random.default_rng(0)
    batch = {"input_ids": rng.integers(5, 30, (2, 8)).astype(np.int32), "input_mask": np.ones((2, 8), np.int32),
             "segment_ids": np.zeros((2, 8), np.int32)}
    assert tuple(model(batch)) == head.output_names
    names = heads.finetune_variable_map(model)
    weights, bias = head.tf1_names
    assert heads.head_class(task_type).tf1_names == head.tf1_names
    assert names[weights] is model.head.output_weights and names[bias] is model.head.output_bias
    trained = heads.trained_variable_map(model)
    assert ("bert/pooler/dense/kernel" in trained) == head.reads_pooler


def test_tf1_names_and_hf_architecture_are_read_from_the_head_class(monkeypatch):
    monkeypatch.setattr(heads.TaggingHead, "tf1_names", ("tagger/w", "tagger/b"))
    monkeypatch.setattr(heads.TaggingHead, "hf_architecture", "SomeTagger")
    monkeypatch.setattr(heads.TaggingHead, "hf_head", "tagger")
    model = _model("tagging")
    assert {"tagger/w", "tagger/b"} <= set(heads.finetune_variable_map(model))
    assert "output_weights" not in heads.finetune_variable_map(model)
    config = hf_task_config(TINY, {"type": "tagging", "labels": LABELS["tagging"]}, pad_token_id=0)
    assert config["architectures"] == ["SomeTagger"]
    state = hf_task_state(model)
    assert state["tagger.weight"].shape == (3, 16) and "classifier.weight" not in state


@pytest.mark.parametrize("task_type", sorted(heads.HEADS))
def test_hf_export_takes_architecture_head_and_labels_from_the_head(task_type):
    head = heads.HEADS[task_type]
    config = hf_task_config(TINY, {"type": task_type, "labels": LABELS[task_type]}, pad_token_id=0)
    assert config["architectures"] == [head.hf_architecture]
    assert config.get("problem_type") == head.hf_problem_type
    assert config["num_labels"] == head.num_outputs(len(LABELS[task_type]))
    state = hf_task_state(_model(task_type))
    assert f"{head.hf_head}.weight" in state and f"{head.hf_head}.bias" in state
    assert ("bert.pooler.dense.weight" in state) == head.reads_pooler


def test_the_pretrainer_is_the_encoder_plus_its_heads():
    pre = build_model(TINY, seed=4)
    assert isinstance(pre, BertPretrainer) and isinstance(pre.encoder, BertEncoder)
    alone = tf1_variable_map(BertEncoder(TINY, seed=4))
    both = tf1_variable_map(pre)
    assert set(both) - set(alone) == {"cls/predictions/transform/dense/kernel", "cls/predictions/transform/dense/bias",
                                      "cls/predictions/transform/LayerNorm/gamma",
                                      "cls/predictions/transform/LayerNorm/beta", "cls/predictions/output_bias",
                                      "cls/seq_relationship/output_weights", "cls/seq_relationship/output_bias"}
    for name, var in alone.items():  # seeded by name: the same encoder alone or under the heads
        assert np.array_equal(var.numpy(), both[name].numpy()), name
