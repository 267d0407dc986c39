"""Our Keras model against TF1 checkpoints and Hugging Face `BertForPreTraining` (PyTorch)."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from bert_datagen.trainer.errors import CheckpointMismatchError  # noqa: E402
from bert_datagen.trainer.interop.export import export_hf, export_tf1  # noqa: E402
from bert_datagen.trainer.interop.restore import init_checkpoint_config, load_init_checkpoint  # noqa: E402
from bert_datagen.trainer.interop.tf1 import write_tf1_checkpoint  # noqa: E402
from bert_datagen.trainer.model.bert import build_model  # noqa: E402
from bert_datagen.trainer.model.config import BertConfig  # noqa: E402
from bert_datagen.trainer.model.weights import (  # noqa: E402
    assign_tf1_arrays,
    expected_tf1_shapes,
    model_expected_shapes,
    model_tf1_arrays,
)
from tests.support.interop_names import VOCAB, assert_bitwise_equal, write_with_v1_saver  # noqa: E402

CONFIG = BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=24, max_position_embeddings=12)


def spread_weights(model, seed: int) -> dict[str, np.ndarray]:
    """Give every weight distinct, non-trivial values (the default init leaves biases at zero and
    LayerNorm at identity, which would hide a swapped bias or gamma)."""
    gen = np.random.default_rng(seed)
    arrays = {}
    for name, shape in model_expected_shapes(model).items():
        value = 0.1 * gen.standard_normal(shape)
        if name.endswith("/gamma"):
            value += 1.0
        arrays[name] = value.astype(np.float32)
    assign_tf1_arrays(model, arrays)
    return arrays


def batch() -> dict[str, np.ndarray]:
    # Three sequences of 10 with 0, 3 and 6 padding positions; masked positions padded with 0 as
    # the original data generator does.
    gen = np.random.default_rng(7)
    lengths = [10, 7, 4]
    ids = np.zeros((3, 10), np.int64)
    mask = np.zeros((3, 10), np.int64)
    segments = np.zeros((3, 10), np.int64)
    for row, n in enumerate(lengths):
        ids[row, :n] = gen.integers(5, len(VOCAB), n)
        ids[row, 0], ids[row, n - 1] = 2, 3
        mask[row, :n] = 1
        segments[row, n // 2:n] = 1
    positions = np.array([[1, 4, 8], [2, 5, 0], [1, 2, 0]], np.int64)
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segments, "masked_lm_positions": positions}


def our_logits(model, inputs) -> tuple[np.ndarray, np.ndarray]:
    out = model({k: tf.constant(v) for k, v in inputs.items()}, training=False)
    return out["mlm_logits"].numpy(), out["nsp_logits"].numpy()


@pytest.fixture(scope="module")
def model_and_weights():
    model = build_model(CONFIG, seed=1)
    return model, spread_weights(model, seed=11)


@pytest.fixture()
def vocab_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    return path


def test_model_map_matches_expected_original_layout():
    assert model_expected_shapes(build_model(CONFIG, seed=2)) == expected_tf1_shapes(CONFIG)


def test_round_trip_through_tf1_is_bitwise(model_and_weights, tmp_path, vocab_file):
    model, arrays = model_and_weights
    out = export_tf1(tmp_path / "tf1", model_tf1_arrays(model), CONFIG.to_dict(), vocab_file.read_bytes())
    fresh = build_model(BertConfig.from_dict(init_checkpoint_config(out / "bert_model.ckpt")), seed=3)
    report = load_init_checkpoint(fresh, out / "bert_model.ckpt")
    assert report.format == "tf1" and report.loaded == len(arrays)
    assert_bitwise_equal(arrays, model_tf1_arrays(fresh))


def test_round_trip_through_hf_is_bitwise(model_and_weights, tmp_path, vocab_file):
    model, arrays = model_and_weights
    out = export_hf(tmp_path / "hf", model_tf1_arrays(model), CONFIG.to_dict(), vocab_file.read_bytes())
    fresh = build_model(BertConfig.from_dict(init_checkpoint_config(out)), seed=4)
    report = load_init_checkpoint(fresh, out)
    assert report.format == "hf" and report.loaded == len(arrays)
    assert_bitwise_equal(arrays, model_tf1_arrays(fresh))


def test_logits_match_transformers_bert_for_pretraining(model_and_weights, tmp_path, vocab_file, monkeypatch):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, _ = model_and_weights
    inputs = batch()
    mlm, nsp = our_logits(model, inputs)
    out = export_hf(tmp_path / "hf", model_tf1_arrays(model), CONFIG.to_dict(), vocab_file.read_bytes())

    for attention in ("eager", "sdpa"):
        hf = transformers.BertForPreTraining.from_pretrained(str(out), attn_implementation=attention).eval()
        with torch.no_grad():
            result = hf(input_ids=torch.from_numpy(inputs["input_ids"]),
                        attention_mask=torch.from_numpy(inputs["input_mask"]),
                        token_type_ids=torch.from_numpy(inputs["segment_ids"]))
        prediction = result.prediction_logits.numpy()
        hf_mlm = np.take_along_axis(prediction, inputs["masked_lm_positions"][:, :, None], axis=1)
        hf_nsp = result.seq_relationship_logits.numpy()
        assert hf_mlm.shape == mlm.shape == (3, 3, len(VOCAB))
        assert np.abs(hf_mlm - mlm).max() < 1e-4, attention
        assert np.abs(hf_nsp - nsp).max() < 1e-4, attention
    # The comparison must be able to fail: the logits are far from trivial.
    assert np.abs(mlm).max() > 0.1 and np.abs(nsp[0] - nsp[1]).max() > 1e-3


def test_v1_saver_checkpoint_loads_and_gives_the_same_logits(model_and_weights, tmp_path):
    model, arrays = model_and_weights
    slots = {f"{name}/adam_{s}": np.full(a.shape, 0.5, np.float32)
             for name, a in list(arrays.items())[:3] for s in "mv"}
    write_with_v1_saver(tmp_path / "model.ckpt-100", model_tf1_arrays(model),
                        {**slots, "global_step": np.array(100, np.int64)})
    fresh = build_model(CONFIG, seed=5)
    before = our_logits(fresh, batch())
    report = load_init_checkpoint(fresh, tmp_path)  # a directory: its latest checkpoint
    assert len(report.ignored) == len(slots) + 1 and not report.unexpected
    expected, got = our_logits(model, batch()), our_logits(fresh, batch())
    assert not np.allclose(before[0], expected[0])
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])


def test_wrong_config_lists_every_bad_variable(model_and_weights, tmp_path):
    model, _ = model_and_weights
    write_tf1_checkpoint(tmp_path / "bert_model.ckpt", model_tf1_arrays(model))
    bigger = BertConfig.from_dict({**CONFIG.to_dict(), "num_hidden_layers": 3, "intermediate_size": 20})
    with pytest.raises(CheckpointMismatchError) as err:
        load_init_checkpoint(build_model(bigger, seed=6), tmp_path / "bert_model.ckpt")
    text = str(err.value)
    assert "16 missing" in text and "6 mis-shaped" in text  # layer_2 entirely; 3 FFN weights in each of 2 layers
    assert "missing: bert/encoder/layer_2/output/LayerNorm/beta" in text
    assert "mis-shaped: bert/encoder/layer_0/intermediate/dense/kernel: checkpoint has [16, 24], model needs [16, 20]" in text
