"""What fine-tuning trains: the task head's loss as the `Objective` each backend's step minimises
(`runtime/objective.py`), and the run's `TrainingSpec` (`runtime/training.py`)."""

from __future__ import annotations

from collections.abc import Callable

from keras import ops

from bert_datagen.trainer.interop.restore import dtype_policy
from bert_datagen.trainer.model.config import BertConfig
from bert_datagen.trainer.model.heads import (
    FineTuneModel,
    build_finetune_model,
    finetune_variable_map,
    head_class,
    trained_variable_map,
)
from bert_datagen.trainer.runtime.objective import Objective
from bert_datagen.trainer.runtime.training import TrainingSpec

FINETUNING_DROPOUT_SALT = 0xF17E  # other dropout masks than pre-training's at the same seed and step


def finetuning_objective(model: FineTuneModel, task_type: str) -> Objective:
    """The task's mean loss over the whole batch: its examples, or for tagging its labelled positions."""
    head = head_class(task_type)

    def whole_batch_total(batch, reduce):
        # At least 1: a tagging batch may hold no labelled position (its loss sum is then 0).
        return ops.maximum(reduce(head.denominator(batch)), 1.0)

    def micro_loss(part, denominator, seed):
        out = model(part, training=True, dropout_seed=seed)
        sums = head.sums(out, part)
        return sums["loss_sum"] / denominator, sums

    return Objective(whole_batch_total, micro_loss, FINETUNING_DROPOUT_SALT)


def finetuning_spec(cfg, bert: BertConfig, task_type: str, num_labels: int,
                    bad_record: Callable[[], str | None] | None = None) -> TrainingSpec:
    """The model (encoder + the task's head), loss and optimizer (the original AdamW) of a fine-tuning
    run (`cfg` a FinetuneConfig), for `runtime.training.start_training`."""
    return TrainingSpec(
        backend=cfg.backend, settings=cfg, optimizer="adamw",
        build_model=lambda: build_finetune_model(bert, task_type, num_labels, seed=cfg.seed,
                                                 dtype=dtype_policy(cfg.precision)),
        variable_map=finetune_variable_map, trained_map=trained_variable_map,
        objective=lambda model: finetuning_objective(model, task_type), bad_record=bad_record)

