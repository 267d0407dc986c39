"""Two real ranks (spawned processes, gloo on localhost): Hugging Face Trainer and accelerate, fed
by `share_loader`, train each rank on exactly its share, and the two shares make the global batch
(`contract/loading/torch_shares.py`)."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest

from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.hf import hf_inputs
from bert_datagen.contract.loading.source import open_source
from tests.support.synthetic import write_synthetic_dataset

B, BS, SEED, STEPS, WORLD = 8, 4, 5, 3, 2


def _tiny_model():  # noqa: ANN202
    import transformers

    config = transformers.BertConfig(vocab_size=200, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=32)
    return transformers.BertForPreTraining(config)


def _rank(rank: int, data: str, out: str, port: int) -> None:
    """One rank: a Trainer run, then an accelerate loop, each writing the input_ids and labels it trained on."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD))
    import torch
    import transformers
    from accelerate import Accelerator

    from bert_datagen.contract.loading.torch_shares import share_loader, trainer_loader

    torch.set_num_threads(1)
    source = open_source(data)
    seen: dict[str, list] = {"trainer": [], "accelerate": []}

    class ShareTrainer(transformers.Trainer):
        def get_train_dataloader(self):  # noqa: ANN202
            return trainer_loader(self.args, source, seed=SEED, block_size=BS)

        def compute_loss(self, model, inputs, *args, **kwargs):  # noqa: ANN001, ANN202
            seen["trainer"].append((inputs["input_ids"].numpy().copy(), inputs["labels"].numpy().copy()))
            return super().compute_loss(model, inputs, *args, **kwargs)

    args = transformers.TrainingArguments(output_dir=os.path.join(out, "trainer"), per_device_train_batch_size=B // WORLD,
                                          max_steps=STEPS, report_to=[], use_cpu=True, save_strategy="no",
                                          logging_strategy="no", disable_tqdm=True)
    assert args.world_size == WORLD and args.process_index == rank
    ShareTrainer(model=_tiny_model(), args=args).train()

    accelerator = Accelerator(cpu=True)
    model = _tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = share_loader(source, seed=SEED, batch_size=B, block_size=BS, stop=STEPS, device=accelerator.device)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    assert prepared is loader
    for batch in prepared:
        seen["accelerate"].append((batch["input_ids"].numpy().copy(), batch["labels"].numpy().copy()))
        accelerator.backward(model(**batch).loss)
        optimizer.step()
        optimizer.zero_grad()
    np.savez(os.path.join(out, f"rank{rank}.npz"),
             **{f"{who}_{what}_{i}": pair[j] for who, pairs in seen.items() for i, pair in enumerate(pairs)
                for j, what in enumerate(("ids", "labels"))})
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(180)
def test_trainer_and_accelerate_on_two_ranks_take_exact_shares(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    data = write_synthetic_dataset(str(tmp_path / "data"), train_shards=2, records_per_shard=40, eval_records=0)
    torch.multiprocessing.spawn(_rank, args=(data, str(tmp_path), _free_port()), nprocs=WORLD, join=True)
    source = open_source(data)
    whole = NumpyBatches(source, seed=SEED, batch_size=B, block_size=BS)
    for rank in range(WORLD):
        got = np.load(tmp_path / f"rank{rank}.npz")
        mine = NumpyBatches(source, seed=SEED, batch_size=B, block_size=BS, world_size=WORLD, rank=rank)
        for step in range(STEPS):
            want = hf_inputs(mine.batch_at(step))
            glob = hf_inputs(whole.batch_at(step))
            share = slice(rank * B // WORLD, (rank + 1) * B // WORLD)
            for who in ("trainer", "accelerate"):
                assert (got[f"{who}_ids_{step}"] == want["input_ids"]).all(), (who, rank, step)
                assert (got[f"{who}_labels_{step}"] == want["labels"]).all(), (who, rank, step)
                assert (got[f"{who}_ids_{step}"] == glob["input_ids"][share]).all(), (who, rank, step)
        assert len([k for k in got.files if k.startswith("trainer_ids")]) == STEPS
