"""Runs and model outputs on one Keras backend, in a process of its own (Keras picks its backend once
per process): `python -m tests.support.backend_runs SPEC.json`. SPEC holds a list of `runs`
(TrainConfig fields plus `stop_at`, `copy_from`), of `finetune_runs` (FinetuneConfig fields, the
same two), of `predictions` (a fine-tuned `run`, `data`, `split` and the `.npz` to write its
predicted arrays into) and optionally `outputs` (a file to write the model's logits, loss and
gradients on a fixed batch into)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np


def fixed_batch(vocab: int = 120, seq: int = 32, pred: int = 5, rows: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    mask = np.ones((rows, seq), np.int32)
    mask[:, seq - 6:] = 0
    return {"input_ids": rng.integers(5, vocab, (rows, seq)).astype(np.int32) * mask, "input_mask": mask,
            "segment_ids": (np.arange(seq)[None, :] >= seq // 2).astype(np.int32) * mask,
            "masked_lm_positions": rng.integers(1, seq - 6, (rows, pred)).astype(np.int32),
            "masked_lm_ids": rng.integers(5, vocab, (rows, pred)).astype(np.int32),
            "masked_lm_weights": np.ones((rows, pred), np.float32),
            "next_sentence_labels": rng.integers(0, 2, (rows, 1)).astype(np.int32)}


def model_outputs(path: str) -> None:
    """Logits, loss and gradients (dropout off) of the tiny model at seed 3 on `fixed_batch`."""
    import keras

    from bert_datagen.trainer.model.bert import build_model, tf1_variable_map
    from bert_datagen.trainer.model.config import BertConfig
    from bert_datagen.trainer.pretrain.objective import batch_sums, losses_from_sums

    model = build_model(BertConfig.from_name("tiny", 120), seed=3)
    named = tf1_variable_map(model)
    names = sorted(named)
    batch = fixed_batch()

    def loss_of(batch):
        out = model(batch, training=False)
        sums = batch_sums(out, batch)
        return sums["mlm_ce"] / (sums["mlm_weight"] + 1e-5) + sums["nsp_ce"] / sums["examples"], out

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        variables = [named[n] for n in names]

        def f(params):
            with keras.StatelessScope(state_mapping=list(zip(variables, params, strict=True))):
                loss, out = loss_of(batch)
            return loss, out

        (loss, out), grads = jax.value_and_grad(f, has_aux=True)([v.value for v in variables])
    else:
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss, out = loss_of(batch)
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, [named[n].value for n in names])]
    result = {"mlm_logits": np.asarray(out["mlm_logits"]), "nsp_logits": np.asarray(out["nsp_logits"]),
              "loss": np.asarray(loss)}
    result.update({"grad/" + n: np.asarray(g) for n, g in zip(names, grads, strict=True)})
    sums = batch_sums(out, batch)
    result["mlm_loss"] = np.asarray(losses_from_sums(sums)["mlm_loss"])
    np.savez(path, **result)


def run(spec: dict, finetuning: bool = False) -> None:
    """One pre-training (or fine-tuning) run of `spec`'s config fields, stopped at `stop_at` and
    started from a copy of `copy_from` where given."""
    if finetuning:
        from bert_datagen.trainer.finetune.config import FinetuneConfig as Config
        from bert_datagen.trainer.finetune.train import finetune as train
    else:
        from bert_datagen.trainer.pretrain.config import TrainConfig as Config
        from bert_datagen.trainer.pretrain.train import pretrain as train

    spec = dict(spec)
    stop_at = spec.pop("stop_at", None)
    copy_from = spec.pop("copy_from", None)
    if copy_from:
        shutil.copytree(copy_from, spec["out"])
    train(Config(**spec), log=lambda line: print(line, flush=True), stop_at=stop_at)


def predictions(spec: dict) -> None:
    import keras

    from bert_datagen.trainer.finetune.data import open_task_dataset
    from bert_datagen.trainer.finetune.evaluate import predict_arrays
    from bert_datagen.trainer.interop.finetune_export import restore_finetuned

    model = restore_finetuned(spec["run"])[0]
    dataset = open_task_dataset(spec["data"])
    arrays = predict_arrays(model, dataset.split(spec["split"]), 16,
                            backend=keras.backend.backend())
    np.savez(spec["out"], **arrays)


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    if spec.get("outputs"):
        model_outputs(spec["outputs"])
    for one in spec.get("runs", []):
        run(one)
    for one in spec.get("finetune_runs", []):
        run(one, finetuning=True)
    for one in spec.get("predictions", []):
        predictions(one)
    # A JAX process leaves TensorFlow unloaded even where it is installed (it would take a GPU's memory).
    print("TENSORFLOW_LOADED", "tensorflow" in sys.modules, flush=True)


if __name__ == "__main__":
    main()
