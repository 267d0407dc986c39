"""Two real ranks (spawned processes, gloo on localhost): Hugging Face Trainer and accelerate, fed
by `share_loader`/`trainer_loader`, train each rank on exactly its share, and the two shares make
the global batch (`contract/loading/torch_shares.py`): pre-training (Trainer with a DataLoader
worker, accelerate without) on the global order's batches, and fine-tuning a task split (Trainer,
2 persistent workers, length grouping, into a second epoch) on exactly fine-tuning's batches
(`TaskBatches`, what `bert-train finetune` reads)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.hf import hf_inputs
from bert_datagen.contract.loading.source import open_source
from bert_datagen.contract.loading.task_batches import TaskBatches
from tests.support.cluster import free_ports
from tests.support.synthetic import write_synthetic_dataset

B, BS, SEED, STEPS, WORLD = 8, 4, 5, 3, 2
FINETUNE_B = 32  # 2 batches an epoch of the 90-record task split: a few steps cross into epoch 1


def _config(transformers, vocab_size: int = 200, num_labels: int = 2):  # noqa: ANN001, ANN202
    return transformers.BertConfig(vocab_size=vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32, max_position_embeddings=64, num_labels=num_labels)


def _rank(rank: int, data: str, task: str, out: str, port: int, finetune_steps: int) -> None:
    """One rank: a pre-training Trainer run (1 worker), an accelerate loop, then a fine-tuning Trainer
    run (2 persistent workers, which each epoch's iteration resets), each recording every batch it
    trained on."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD))
    import torch
    import transformers
    from accelerate import Accelerator

    from bert_datagen.contract.loading.torch_shares import share_loader, trainer_loader

    torch.set_num_threads(1)
    seen: dict[str, list[dict[str, np.ndarray]]] = {"trainer": [], "accelerate": [], "finetune": []}

    class Recording(transformers.Trainer):
        def __init__(self, what: str, loader_options: dict, **kwargs) -> None:
            super().__init__(**kwargs)
            self.what, self.loader_options = what, loader_options

        def get_train_dataloader(self):  # noqa: ANN202
            return trainer_loader(self.args, **self.loader_options)

        def compute_loss(self, model, inputs, *args, **kwargs):  # noqa: ANN001, ANN202
            seen[self.what].append({k: v.numpy().copy() for k, v in inputs.items()})
            return super().compute_loss(model, inputs, *args, **kwargs)

    def args(name: str, batch_size: int, steps: int, workers: int, persistent: bool):  # noqa: ANN202
        # Workers forked, as under torchrun: this rank was spawned, so spawn would be the default here,
        # and each spawned worker imports torch and transformers again (seconds each).
        made = transformers.TrainingArguments(output_dir=os.path.join(out, name),
                                              per_device_train_batch_size=batch_size // WORLD, max_steps=steps,
                                              dataloader_num_workers=workers, dataloader_multiprocessing_context="fork",
                                              dataloader_persistent_workers=persistent,
                                              ddp_find_unused_parameters=False, report_to=[], use_cpu=True,
                                              save_strategy="no", logging_strategy="no", disable_tqdm=True)
        assert made.world_size == WORLD and made.process_index == rank
        return made

    source = open_source(data)
    Recording("trainer", {"source": source, "seed": SEED, "block_size": BS},
              model=transformers.BertForPreTraining(_config(transformers)), args=args("trainer", B, STEPS, 1, False)
              ).train()

    accelerator = Accelerator(cpu=True)
    model = transformers.BertForPreTraining(_config(transformers))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = share_loader(source, seed=SEED, batch_size=B, block_size=BS, stop=STEPS, device=accelerator.device)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    assert prepared is loader
    for batch in prepared:
        seen["accelerate"].append({k: v.numpy().copy() for k, v in batch.items()})
        accelerator.backward(model(**batch).loss)
        optimizer.step()
        optimizer.zero_grad()

    manifest = json.loads((Path(task) / "manifest.json").read_text())
    config = _config(transformers, manifest["vocab"]["size"], len(manifest["task"]["labels"]))
    Recording("finetune", {"source": open_source(task), "seed": SEED, "group_by_length": True},
              model=transformers.BertForSequenceClassification(config),
              args=args("finetune", FINETUNE_B, finetune_steps, 2, True)).train()
    np.savez(os.path.join(out, f"rank{rank}.npz"), **{f"{what}/{step}/{k}": v for what, batches in seen.items()
                                                      for step, batch in enumerate(batches) for k, v in batch.items()})
    torch.distributed.destroy_process_group()


def _step(saved, what: str, step: int) -> dict[str, np.ndarray]:
    prefix = f"{what}/{step}/"
    return {k[len(prefix):]: saved[k] for k in saved.files if k.startswith(prefix)}


def _same(got: dict, want: dict, where: object) -> None:
    assert sorted(got) == sorted(want), where
    for k, v in want.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape and got[k].tobytes() == v.tobytes(), (where, k)


@pytest.mark.timeout(240)
def test_trainer_and_accelerate_on_two_ranks_take_exact_shares(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from tests.support.loader_kinds import build_kind  # the generators (Beam): not in the spawned ranks

    data = write_synthetic_dataset(str(tmp_path / "data"), train_shards=2, records_per_shard=40, eval_records=0)
    task = build_kind(tmp_path / "kinds", "classification")
    task_source = open_source(task)
    whole_task = TaskBatches(task_source, seed=SEED, batch_size=FINETUNE_B, group_by_length=True)
    finetune_steps = whole_task.per_epoch + 2  # into the second epoch
    torch.multiprocessing.spawn(_rank, args=(data, task, str(tmp_path), free_ports(1)[0], finetune_steps),
                                nprocs=WORLD, join=True)
    saved = [np.load(tmp_path / f"rank{r}.npz") for r in range(WORLD)]

    source = open_source(data)
    whole = NumpyBatches(source, seed=SEED, batch_size=B, block_size=BS)
    shares = [NumpyBatches(source, seed=SEED, batch_size=B, block_size=BS, world_size=WORLD, rank=r)
              for r in range(WORLD)]
    task_shares = [TaskBatches(task_source, seed=SEED, batch_size=FINETUNE_B, world_size=WORLD, rank=r,
                               group_by_length=True) for r in range(WORLD)]
    for what, global_batches, rank_batches, steps in (
            ("trainer", whole, shares, STEPS), ("accelerate", whole, shares, STEPS),
            ("finetune", whole_task, task_shares, finetune_steps)):
        for step in range(steps):
            got = [_step(saved[r], what, step) for r in range(WORLD)]
            for r in range(WORLD):
                _same(got[r], hf_inputs(rank_batches[r].batch_at(step)), (what, r, step))
            union = {k: np.concatenate([g[k] for g in got]) for k in got[0]}
            _same(union, hf_inputs(global_batches.batch_at(step)), (what, step))
        assert all(not _step(s, what, steps) for s in saved), what  # and no more steps than that
