"""Checkpoint names and files: TF1 and Hugging Face layouts, without our Keras model."""

from __future__ import annotations

import json

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from bert_datagen.trainer.errors import CheckpointFormatError, CheckpointMismatchError  # noqa: E402
from bert_datagen.trainer.interop.export import export_hf, export_tf1  # noqa: E402
from bert_datagen.trainer.interop.hf_checkpoint import (  # noqa: E402
    bert_config_from_hf_config,
    hf_config_from_bert_config,
    hf_name_table,
    hf_to_tf1,
    read_safetensors,
    tf1_to_hf,
)
from bert_datagen.trainer.interop.restore import init_checkpoint_config, read_checkpoint_arrays  # noqa: E402
from bert_datagen.trainer.interop.tf1 import read_tf1_checkpoint, write_tf1_checkpoint  # noqa: E402
from bert_datagen.trainer.model.weights import expected_tf1_shapes  # noqa: E402
from tests.support.interop_names import VOCAB, assert_bitwise_equal, write_with_v1_saver  # noqa: E402

TINY = {
    "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "hidden_size": 8, "initializer_range": 0.02, "intermediate_size": 12,
    "max_position_embeddings": 16, "num_attention_heads": 2, "num_hidden_layers": 2,
    "type_vocab_size": 2, "vocab_size": 14,
}


def random_arrays(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    # Distinct values everywhere, so that a swapped or untransposed tensor cannot go unnoticed.
    gen = np.random.default_rng(seed)
    return {name: gen.standard_normal(shape).astype(np.float32)
            for name, shape in expected_tf1_shapes(config).items()}


@pytest.fixture()
def vocab_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    return path


def test_expected_names_cover_every_original_weight():
    shapes = expected_tf1_shapes(TINY)
    # 5 embedding weights + 16 per layer + pooler 2 + MLM transform 4 + output bias + NSP 2.
    assert len(shapes) == 5 + 16 * 2 + 2 + 4 + 1 + 2
    assert shapes["bert/encoder/layer_1/intermediate/dense/kernel"] == (8, 12)
    assert shapes["bert/encoder/layer_1/output/dense/kernel"] == (12, 8)
    assert shapes["cls/seq_relationship/output_weights"] == (2, 8)
    assert shapes["cls/predictions/output_bias"] == (14,)


def test_hf_names_follow_recipe_table():
    table = hf_name_table(expected_tf1_shapes(TINY))
    assert table["bert/embeddings/word_embeddings"] == ("bert.embeddings.word_embeddings.weight", False)
    assert table["bert/embeddings/LayerNorm/gamma"] == ("bert.embeddings.LayerNorm.weight", False)
    assert table["bert/encoder/layer_1/attention/self/query/kernel"] == (
        "bert.encoder.layer.1.attention.self.query.weight", True)
    assert table["bert/encoder/layer_0/output/LayerNorm/beta"] == ("bert.encoder.layer.0.output.LayerNorm.bias", False)
    assert table["bert/pooler/dense/kernel"] == ("bert.pooler.dense.weight", True)
    assert table["cls/predictions/transform/dense/kernel"] == ("cls.predictions.transform.dense.weight", True)
    assert table["cls/predictions/output_bias"] == ("cls.predictions.bias", False)
    assert table["cls/seq_relationship/output_weights"] == ("cls.seq_relationship.weight", False)


def test_tf1_checkpoint_has_exact_original_names_and_round_trips(tmp_path):
    arrays = random_arrays(TINY)
    prefix = write_tf1_checkpoint(tmp_path / "bert_model.ckpt", arrays)
    listed = dict(tf.train.list_variables(prefix))
    assert listed == {name: list(a.shape) for name, a in arrays.items()}
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "bert_model.ckpt")
    back, report = read_tf1_checkpoint(tmp_path, expected_tf1_shapes(TINY))
    assert_bitwise_equal(arrays, back)
    assert report.loaded == len(arrays) and not report.ignored and not report.unexpected


def test_reads_v1_saver_checkpoint_ignoring_optimizer_slots(tmp_path):
    arrays = random_arrays(TINY, seed=1)
    extra = {"global_step": np.array(7, np.int64),
             "bert/pooler/dense/kernel/adam_m": np.zeros((8, 8), np.float32),
             "bert/pooler/dense/kernel/adam_v": np.zeros((8, 8), np.float32),
             "output_weights": np.zeros((3, 8), np.float32)}  # a fine-tuning head: unused, reported
    write_with_v1_saver(tmp_path / "model.ckpt-7", arrays, extra)
    back, report = read_tf1_checkpoint(tmp_path / "model.ckpt-7", expected_tf1_shapes(TINY))
    assert_bitwise_equal(arrays, back)
    assert sorted(report.ignored) == ["bert/pooler/dense/kernel/adam_m", "bert/pooler/dense/kernel/adam_v",
                                      "global_step"]
    assert report.unexpected == ["output_weights"]


def test_missing_and_misshaped_variables_are_all_listed(tmp_path):
    arrays = random_arrays(TINY)
    del arrays["cls/seq_relationship/output_weights"]
    del arrays["bert/encoder/layer_1/attention/self/key/bias"]
    arrays["bert/pooler/dense/kernel"] = np.zeros((8, 9), np.float32)
    arrays["cls/predictions/output_bias"] = np.zeros((15,), np.float32)
    write_tf1_checkpoint(tmp_path / "bert_model.ckpt", arrays)
    with pytest.raises(CheckpointMismatchError) as err:
        read_tf1_checkpoint(tmp_path / "bert_model.ckpt", expected_tf1_shapes(TINY))
    text = str(err.value)
    assert "bert_model.ckpt" in text and "2 missing, 2 mis-shaped" in text
    assert "missing: cls/seq_relationship/output_weights" in text
    assert "missing: bert/encoder/layer_1/attention/self/key/bias" in text
    assert "mis-shaped: bert/pooler/dense/kernel: checkpoint has [8, 9], model needs [8, 8]" in text
    assert "mis-shaped: cls/predictions/output_bias: checkpoint has [15], model needs [14]" in text


def test_no_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointFormatError, match="no TF checkpoint"):
        read_tf1_checkpoint(tmp_path / "nothing.ckpt", expected_tf1_shapes(TINY))
    with pytest.raises(CheckpointFormatError, match=r"no \*\.index"):
        read_checkpoint_arrays(tmp_path, expected_tf1_shapes(TINY))
    write_tf1_checkpoint(tmp_path / "bert_model.ckpt", random_arrays(TINY))
    with pytest.raises(CheckpointFormatError, match="no --bert-config given and no bert_config.json"):
        init_checkpoint_config(tmp_path / "bert_model.ckpt")
    (tmp_path / "bert_config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointFormatError, match="bert_config.json: cannot read"):
        init_checkpoint_config(tmp_path)


def test_hf_export_loads_in_transformers_and_round_trips(tmp_path, vocab_file, monkeypatch):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    arrays = random_arrays(TINY, seed=2)
    out = export_hf(tmp_path / "hf", arrays, TINY, vocab_file.read_bytes(), do_lower_case=True)

    model, info = transformers.BertForPreTraining.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    # transformers re-ties the decoder to the word embeddings and its bias to cls.predictions.bias.
    assert np.array_equal(state["cls.predictions.decoder.weight"], arrays["bert/embeddings/word_embeddings"])
    assert np.array_equal(state["cls.predictions.decoder.bias"], arrays["cls/predictions/output_bias"])
    assert np.array_equal(state["bert.encoder.layer.1.intermediate.dense.weight"],
                          arrays["bert/encoder/layer_1/intermediate/dense/kernel"].T)
    assert model.config.hidden_act == "gelu_new" and model.config.layer_norm_eps == 1e-12

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tokenizer.convert_ids_to_tokens(tokenizer("The CATS sat")["input_ids"]) == [
        "[CLS]", "the", "cat", "##s", "sat", "[SEP]"]

    # Our reader takes both our file and one written by transformers itself (which, depending on the
    # version, may carry the tied decoder copies): bitwise the same weights either way.
    back, _ = read_checkpoint_arrays(out, expected_tf1_shapes(TINY))
    assert_bitwise_equal(arrays, back)
    with torch.no_grad():
        model.save_pretrained(str(tmp_path / "resaved"))
    again, _ = read_checkpoint_arrays(tmp_path / "resaved", expected_tf1_shapes(TINY))
    assert_bitwise_equal(arrays, again)
    assert init_checkpoint_config(tmp_path / "resaved") == TINY


def test_reads_half_precision_safetensors(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    values = torch.randn(4, 3)
    save_file({"bf": values.to(torch.bfloat16), "f16": values.to(torch.float16), "f32": values},
              str(tmp_path / "x.safetensors"), metadata={"format": "pt"})
    state = read_safetensors(tmp_path / "x.safetensors")
    assert np.array_equal(state["bf"], values.to(torch.bfloat16).float().numpy())
    assert np.array_equal(state["f16"], values.to(torch.float16).numpy())
    assert np.array_equal(state["f32"], values.numpy())
    (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ValueError, match="bad.safetensors: cannot read safetensors"):
        read_safetensors(tmp_path / "bad.safetensors")


def test_hf_tied_copies_and_legacy_names(tmp_path):
    arrays = random_arrays(TINY, seed=3)
    state = tf1_to_hf(arrays)
    state["bert.embeddings.LayerNorm.gamma"] = state.pop("bert.embeddings.LayerNorm.weight")
    state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"].copy()
    state["bert.embeddings.position_ids"] = np.arange(16, dtype=np.int64)[None]
    back, report = hf_to_tf1(state, expected_tf1_shapes(TINY), "legacy")
    assert_bitwise_equal(arrays, back)
    assert "bert.embeddings.position_ids" in report.ignored and not report.unexpected

    state["cls.predictions.decoder.weight"] = state["cls.predictions.decoder.weight"] + 1
    with pytest.raises(CheckpointMismatchError, match="differs from bert.embeddings.word_embeddings"):
        hf_to_tf1(state, expected_tf1_shapes(TINY), "untied")


def test_hf_missing_and_misshaped_use_hf_names(tmp_path):
    state = tf1_to_hf(random_arrays(TINY))
    del state["cls.seq_relationship.bias"]
    state["bert.pooler.dense.weight"] = np.zeros((9, 8), np.float32)
    with pytest.raises(CheckpointMismatchError) as err:
        hf_to_tf1(state, expected_tf1_shapes(TINY), "somewhere")
    text = str(err.value)
    assert "missing: cls.seq_relationship.bias" in text
    assert "mis-shaped: bert.pooler.dense.weight: checkpoint has [9, 8], model needs [8, 8]" in text


def test_tf1_export_directory_like_googles_release(tmp_path, vocab_file):
    arrays = random_arrays(TINY, seed=4)
    out = export_tf1(tmp_path / "tf1", arrays, TINY, vocab_file.read_bytes())
    assert sorted(p.name for p in out.iterdir()) == [
        "bert_config.json", "bert_model.ckpt.data-00000-of-00001", "bert_model.ckpt.index",
        "bert_train_export.json", "checkpoint", "vocab.txt"]
    assert json.loads((out / "bert_config.json").read_text()) == TINY
    assert init_checkpoint_config(out / "bert_model.ckpt") == TINY
    back, _ = read_checkpoint_arrays(out / "bert_model.ckpt", expected_tf1_shapes(TINY))
    assert_bitwise_equal(arrays, back)
    with pytest.raises(CheckpointFormatError, match="not empty"):
        export_tf1(out, arrays, TINY, vocab_file.read_bytes())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_hf_config_conversion():
    hf = hf_config_from_bert_config(TINY)
    assert hf["hidden_act"] == "gelu_new" and hf["architectures"] == ["BertForPreTraining"]
    assert bert_config_from_hf_config(hf, "x") == TINY
    # The activation keeps its meaning both ways: the original's tanh "gelu" <-> HF's tanh names,
    # HF's erf "gelu" <-> "gelu_exact".
    assert bert_config_from_hf_config({**hf, "hidden_act": "gelu_pytorch_tanh"}, "x") == TINY
    erf = {**TINY, "hidden_act": "gelu_exact"}
    assert hf_config_from_bert_config(erf)["hidden_act"] == "gelu"
    assert bert_config_from_hf_config({**hf, "hidden_act": "gelu"}, "x") == erf
    with pytest.raises(ValueError, match="relative_key"):
        bert_config_from_hf_config({**hf, "position_embedding_type": "relative_key"}, "x")
    with pytest.raises(ValueError, match="layer_norm_eps"):
        bert_config_from_hf_config({**hf, "layer_norm_eps": 1e-5}, "x")
