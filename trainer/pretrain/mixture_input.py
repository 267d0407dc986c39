"""`bert-train pretrain --data A --mix B --weights 0.7,0.3`: a run over a weighted mixture of
datasets (`contract/loading/mixture.py`), each dataset checked against the model as the first is,
and the mixture recorded with every checkpoint, so a resume reads the same stream or is refused."""

from __future__ import annotations

from bert_datagen.contract.loading.mixture import MIXTURE_FEATURE, MixedBatches, MixtureError
from bert_datagen.trainer.errors import DataError, TrainingError
from bert_datagen.trainer.model.config import BertConfig
from bert_datagen.trainer.pretrain.config import TrainConfig
from bert_datagen.trainer.pretrain.data import (
    check_first_records,
    check_fits,
    check_split_size,
    check_token_ids,
    open_pretraining_data,
    training_source,
)
from bert_datagen.trainer.pretrain.dataset_info import DatasetInfo

__all__ = ["MIXTURE_FEATURE", "check_resumed_mixture", "mixed_batches"]


def mixed_batches(cfg: TrainConfig, first: DatasetInfo, bert: BertConfig, world: int, rank: int) -> MixedBatches:
    """The run's mixture of ``cfg.data`` and ``cfg.mix`` by ``cfg.mix_weights``: every dataset held
    to the checks of the first; DataError names a dataset that cannot join."""
    infos = [first]
    for path in cfg.mix:
        info = open_pretraining_data(path)
        if info.manifest is None:
            raise DataError(f"{path}: --mix needs a dataset directory with a manifest, not TFRecord globs")
        check_fits(info, bert)
        check_split_size(info, "train", cfg.batch_size)
        check_first_records(info)
        check_token_ids(info, bert.vocab_size, cfg.batch_size)
        infos.append(info)
    try:
        return MixedBatches([training_source(i) for i in infos], cfg.mix_weights, seed=cfg.seed,
                            batch_size=cfg.batch_size, world_size=world, rank=rank, window=cfg.mix_window)
    except MixtureError as exc:
        raise DataError(f"--mix: {exc}") from exc


def check_resumed_mixture(recorded: dict | None, batches: object, where: str) -> None:
    """A run resumes on the mixture (or single dataset) its checkpoint recorded."""
    now = batches.record() if isinstance(batches, MixedBatches) else None
    then = (recorded or {}).get("mixture")
    if (then or {}).get("mixture") != (now or {}).get("mixture"):
        def name(r: dict | None) -> str:
            return "one dataset" if r is None else "the mixture " + ", ".join(
                f"{d['path']} ({d['weight']:g})" for d in r["datasets"])
        raise TrainingError(f"{where}: the run was trained on {name(then)}, not {name(now)} (a dataset of it "
                            "changed, or other datasets or weights): use a new --out to start another run")
