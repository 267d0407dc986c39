"""Task splits through the PyTorch share loader (`contract/loading/torch_shares.py`): each rank's
batches are its share of exactly what `bert-train finetune` reads at each step (`TaskBatches`, which
trainer/finetune/ordered.py reads through), as Hugging Face inputs, across epochs, with length
grouping and DataLoader workers; resumable from the loader's state and by Trainer's skip."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from bert_datagen.contract.bounds import ArgumentError
from bert_datagen.contract.loading.hf import hf_inputs
from bert_datagen.contract.loading.source import LoadError, open_source
from bert_datagen.contract.loading.task_batches import TaskBatches
from tests.support.loader_kinds import build_kind

torch = pytest.importorskip("torch")
from bert_datagen.contract.loading.torch_shares import share_loader, trainer_loader  # noqa: E402

B, SEED, WORLD = 8, 3, 2


@pytest.fixture(scope="module")
def kinds(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("task-shares")
    return {kind: build_kind(root, kind) for kind in ("classification", "span", "static")}


def _bitwise(got: dict, want: dict, where: object) -> None:
    assert sorted(got) == sorted(want), where
    for k, v in want.items():
        g = got[k].numpy() if hasattr(got[k], "numpy") else np.asarray(got[k])
        assert g.dtype == v.dtype and g.shape == v.shape and g.tobytes() == v.tobytes(), (where, k)


@pytest.mark.parametrize("kind", ["classification", "span"])
@pytest.mark.parametrize("grouped", [False, True])
def test_rank_shares_are_finetunings_batches_as_hf_inputs(kinds, kind, grouped) -> None:
    source = open_source(kinds[kind])
    whole = TaskBatches(source, seed=SEED, batch_size=B, group_by_length=grouped)
    per_epoch, epochs = whole.per_epoch, 2
    got: list[list[dict]] = []
    for rank in range(WORLD):
        loader = share_loader(source, seed=SEED, batch_size=B, world_size=WORLD, rank=rank, group_by_length=grouped)
        batches = []
        for _ in range(epochs):  # an iteration is an epoch: Trainer's epochs are fine-tuning's
            assert len(loader) == per_epoch
            batches += list(loader)
        assert loader.state_dict()["step"] == epochs * per_epoch
        got.append(batches)
    assert all(len(b) == epochs * per_epoch for b in got)
    widths = set()
    for step in range(epochs * per_epoch):
        raw = whole.batch_at(step)
        want = hf_inputs(raw)
        for rank in range(WORLD):
            mine = TaskBatches(source, seed=SEED, batch_size=B, world_size=WORLD, rank=rank, group_by_length=grouped)
            _bitwise(got[rank][step], hf_inputs(mine.batch_at(step)), (rank, step))
        union = {k: np.concatenate([got[r][step][k].numpy() for r in range(WORLD)]) for k in want}
        _bitwise(union, want, step)  # the two shares are fine-tuning's global batch, rows in order
        if kind == "span":
            assert (union["start_positions"] == raw["start_positions"][:, 0]).all()
            assert (union["end_positions"] == raw["end_positions"][:, 0]).all()
        else:
            assert union["labels"].dtype == np.int64 and (union["labels"] == raw["label_ids"][:, 0]).all()
        widths.add(union["input_ids"].shape[1])
    assert (whole.positions_at(per_epoch) // sum(source.counts) == 1).all()  # the steps crossed into epoch 1
    if grouped and kind == "span":
        assert len(widths) > 1  # length grouping cut batches to several bucket lengths


def test_workers_state_and_epochs(kinds) -> None:
    source = open_source(kinds["span"])
    ref = TaskBatches(source, seed=SEED, batch_size=B, world_size=WORLD, rank=1, group_by_length=True)
    per_epoch = ref.per_epoch
    loader = share_loader(source, seed=SEED, batch_size=B, world_size=WORLD, rank=1, group_by_length=True,
                          num_workers=2)
    for step, batch in enumerate(loader):
        _bitwise(batch, hf_inputs(ref.batch_at(step)), step)
        if step == 4:
            break  # the workers have read ahead; the position is what was handed out
    state = loader.state_dict()
    assert state["step"] == 5 and state["group_by_length"] is True
    again = share_loader(source, seed=SEED, batch_size=B, world_size=WORLD, rank=1, group_by_length=True, hf=False)
    again.load_state_dict(state)
    assert len(again) == per_epoch - 5
    rest = list(again)  # the rest of epoch 0
    assert len(rest) == per_epoch - 5
    for i, batch in enumerate(rest):
        _bitwise(batch, ref.batch_at(5 + i), 5 + i)
    again.set_epoch(3)
    _bitwise(next(iter(again)), ref.batch_at(3 * per_epoch), "epoch 3")
    ungrouped = share_loader(source, seed=SEED, batch_size=B, world_size=WORLD, rank=0)
    with pytest.raises(LoadError, match="group_by_length"):
        ungrouped.load_state_dict(state)
    pretraining = share_loader(open_source(kinds["static"]), seed=SEED, batch_size=B, world_size=WORLD, rank=0)
    with pytest.raises(LoadError, match="fine-tuning's"):
        ungrouped.load_state_dict(pretraining.state_dict())


def test_trainers_skip_on_resume_lands_on_finetunings_next_batch(kinds) -> None:
    """What Trainer does on resume in epoch 1 (transformers' _run_epoch): accelerate's
    skip_first_batches over the loader, then set_epoch on the sampler under the skip."""
    accelerate = pytest.importorskip("accelerate")
    source = open_source(kinds["classification"])
    ref = TaskBatches(source, seed=SEED, batch_size=B, world_size=WORLD, rank=0)
    loader = share_loader(source, seed=SEED, batch_size=B, world_size=WORLD, rank=0, hf=False)
    skipped = accelerate.skip_first_batches(loader, 3)
    skipped.batch_sampler.batch_sampler.set_epoch(1)
    got = list(skipped)
    assert len(got) == ref.per_epoch - 3
    for i, batch in enumerate(got):
        _bitwise(batch, ref.batch_at(ref.per_epoch + 3 + i), i)


def test_what_cannot_be_trained_on_faithfully_is_refused(kinds, tmp_path) -> None:
    source = open_source(kinds["classification"])
    with pytest.raises(ArgumentError, match="block_size 64: fine-tuning's order"):
        share_loader(source, seed=SEED, batch_size=B, block_size=64, world_size=1, rank=0)
    with pytest.raises(ArgumentError, match="group_by_length is fine-tuning's"):
        share_loader(open_source(kinds["static"]), seed=SEED, batch_size=B, group_by_length=True, world_size=1, rank=0)
    with pytest.raises(ArgumentError, match="rank 1 of 2 in the loader of rank 0 of 2"):
        share_loader(TaskBatches(source, seed=SEED, batch_size=B, world_size=2, rank=1), world_size=2, rank=0)
    transformers = pytest.importorskip("transformers")
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "t"), per_device_train_batch_size=4,
                                          gradient_accumulation_steps=2, use_cpu=True, report_to=[])
    with pytest.raises(ArgumentError, match="gradient_accumulation_steps 2: .*no bert-train finetune run reads"):
        trainer_loader(args, source, seed=SEED)
    # a split without its training labels (an unlabelled test split's label_ids are zeros)
    copy = tmp_path / "unlabelled"
    shutil.copytree(kinds["classification"], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["splits"]["train"]["labelled"] = False
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(LoadError, match="split 'train' of this classification task is not labelled"):
        share_loader(open_source(str(copy)), seed=SEED, batch_size=B, world_size=1, rank=0)
    # a span split written to predict on: no answer positions to train on
    copy = tmp_path / "predict"
    shutil.copytree(kinds["span"], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    for name in ("start_positions", "end_positions", "is_impossible"):
        del manifest["splits"]["train"]["features"][name]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(LoadError, match="span task has no start_positions or end_positions .it was written to predict"):
        share_loader(open_source(str(copy)), seed=SEED, batch_size=B, world_size=1, rank=0)
    with pytest.raises(ArgumentError, match="batch_size 16 for a reader made with a global batch of 8"):
        share_loader(TaskBatches(source, seed=SEED, batch_size=B), batch_size=16, world_size=1, rank=0)


def test_trainer_resumed_in_epoch_one_trains_on_finetunings_next_batches(kinds, tmp_path) -> None:
    """A real `transformers.Trainer` (one process): its epochs are fine-tuning's, and a run resumed
    from a checkpoint in epoch 1 trains on the batches the whole run would have."""
    transformers = pytest.importorskip("transformers")
    source = open_source(kinds["classification"])
    ref = TaskBatches(source, seed=SEED, batch_size=B, group_by_length=True)
    per_epoch = ref.per_epoch
    steps, saved = per_epoch + 3, per_epoch + 1
    labels = len(json.loads((Path(kinds["classification"]) / "manifest.json").read_text())["task"]["labels"])

    def run(resume: str | None) -> tuple[list[np.ndarray], dict]:
        seen = []

        class TaskTrainer(transformers.Trainer):
            def get_train_dataloader(self):  # noqa: ANN202
                return trainer_loader(self.args, source, seed=SEED, group_by_length=True)

            def compute_loss(self, model, inputs, *args, **kwargs):  # noqa: ANN001, ANN202
                seen.append({k: v.numpy().copy() for k, v in inputs.items()})
                return super().compute_loss(model, inputs, *args, **kwargs)

        config = transformers.BertConfig(vocab_size=int(ref.batch_at(0)["input_ids"].max()) + 100, hidden_size=16,
                                         num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                         max_position_embeddings=64, num_labels=labels)
        args = transformers.TrainingArguments(output_dir=str(tmp_path / "run"), per_device_train_batch_size=B,
                                              max_steps=steps, save_strategy="steps", save_steps=saved,
                                              report_to=[], use_cpu=True, logging_strategy="no", disable_tqdm=True)
        trainer = TaskTrainer(model=transformers.BertForSequenceClassification(config), args=args)
        trainer.train(resume_from_checkpoint=resume)
        return seen, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}

    whole, whole_weights = run(None)
    assert len(whole) == steps
    for step, batch in enumerate(whole):
        _bitwise(batch, hf_inputs(ref.batch_at(step)), step)
    resumed, resumed_weights = run(str(tmp_path / "run" / f"checkpoint-{saved}"))
    assert len(resumed) == steps - saved
    for i, batch in enumerate(resumed):
        _bitwise(batch, hf_inputs(ref.batch_at(saved + i)), saved + i)
    # Dropout is on (BertConfig's 0.1), and the resumed run's weights are the whole run's, bit for bit
    # (Trainer restores torch's RNG state after it has started the loader's iterator).
    assert sorted(resumed_weights) == sorted(whole_weights)
    assert all(torch.equal(resumed_weights[k], whole_weights[k]) for k in whole_weights)
