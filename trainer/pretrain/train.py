"""The pre-training loop (the model is `bert_datagen.trainer.model.bert`, one step `bert_datagen.trainer.pretrain.step`): start or resume a
run, feed batches, log, evaluate, checkpoint.

Reproducibility: weights start from seeds derived per weight name, dropout masks are a pure function
of (seed, step, position in the global batch), the input position is the step.
With op determinism on, the same data + config + seed give bitwise-identical weights, and a run
stopped at any checkpoint (or interrupted, or killed) and resumed ends bitwise identical to the
uninterrupted run.

Every check on the data that can fail runs before the first step (`PretrainRun.__init__`): the dataset's
kind, shards and sizes, its identity against the run's record, that each split holds a batch, that
its first records parse with the model's lengths, that data and model fit.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.mixture import MixedBatches
from bert_datagen.contract.loading.order import INPUT_ORDER
from bert_datagen.contract.loading.skips import SkipError, add_ranges, batch_of_step
from bert_datagen.datagen.packed import compact_predictions
from bert_datagen.datagen.record_layout import INSTANCE_KEY, WORD_BITS
from bert_datagen.trainer.errors import DataError, TrainConfigError
from bert_datagen.trainer.interop.restore import init_weights_from, load_init_checkpoint
from bert_datagen.trainer.model.config import BertConfig
from bert_datagen.trainer.pretrain.config import TrainConfig
from bert_datagen.trainer.pretrain.data import (
    check_first_records,
    check_fits,
    check_split_size,
    check_token_ids,
    dataset_identity,
    find_bad_record,
    open_pretraining_data,
    training_source,
    with_sequence_weights,
)
from bert_datagen.trainer.pretrain.dataset_info import DatasetInfo
from bert_datagen.trainer.pretrain.evaluate import evaluate_model
from bert_datagen.trainer.pretrain.mixture_input import MIXTURE_FEATURE, check_resumed_mixture, mixed_batches
from bert_datagen.trainer.pretrain.objective import losses_from_sums
from bert_datagen.trainer.pretrain.options import as_run, model_vocab_size
from bert_datagen.trainer.pretrain.step import pretraining_spec
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib
from bert_datagen.trainer.runtime import cluster, rundir
from bert_datagen.trainer.runtime.loop import TrainingLoop
from bert_datagen.trainer.runtime.ordered_input import OrderedInput
from bert_datagen.trainer.runtime.tensorboard import tensorboard_writers
from bert_datagen.trainer.runtime.training import enable_determinism, refuse_unported_on_jax, start_training
from bert_datagen.trainer.runtime.updates import learning_rate


def load_bert_config_for(cfg: TrainConfig, info: DatasetInfo) -> BertConfig:
    if cfg.bert_config is not None:
        return BertConfig.from_dict(cfg.bert_config)
    vocab_size = model_vocab_size(info, cfg.vocab_size)
    if not vocab_size:
        raise TrainConfigError(f"{info.source}: the vocab size is unknown (no manifest): pass --bert-config "
                               "or --vocab-size")
    return BertConfig.from_name(cfg.model, int(vocab_size))


class PretrainRun(TrainingLoop):
    """Everything one `bert-train pretrain` invocation holds; `pretrain()` drives it."""

    def __init__(self, cfg: TrainConfig, log: Callable[[str], None] = print):
        self.cfg, self.log = cfg, log
        self.run_dir = Path(cfg.out)
        # Only the chief writes the run; the others read it (to resume) and write nothing.
        self.chief = cluster.is_chief()
        if self.chief:  # the others checked it before joining: now the chief may be writing in it
            rundir.check_out_dir(cfg.out)
        rundir.check_settings(self.run_dir, cfg)
        if cfg.init_from:
            ckpt_lib.resolve_checkpoint(cfg.init_from)  # a bad --init-from fails before any work
        self.on_jax = cfg.backend == "jax"
        if self.on_jax:
            refuse_unported_on_jax(cfg)
            if ckpt_lib.reads_through_tf_data(self.run_dir):
                raise TrainConfigError(f"{self.run_dir}: a run of an earlier version, which reads through tf.data: "
                                       "resume it with --backend tensorflow")
        enable_determinism(cfg.seed, cfg.backend)
        self.info = open_pretraining_data(cfg.data, cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.eval_data)
        rundir.check_dataset(self.run_dir, cfg.data, self.info.identity)
        self.bert = load_bert_config_for(cfg, self.info)
        check_fits(self.info, self.bert)
        check_split_size(self.info, "train", cfg.batch_size)
        if self.info.eval_files:
            check_split_size(self.info, "eval", cfg.batch_size)
        check_first_records(self.info)
        check_token_ids(self.info, self.bert.vocab_size, cfg.batch_size)
        self.training = start_training(pretraining_spec(cfg, self.bert, self.info.packed, self._bad_record))
        self.model, self.named = self.training.model, self.training.named
        self.step = 0
        self.saved_step: int | None = None
        self.skipped: list[tuple[int, int]] = []
        self.input: OrderedInput | None = None
        # Runs started before the global order read through tf.data to the end, from the iterator
        # state their checkpoints hold, so that they resume on the batches they would have read.
        self.tf_data_input = ckpt_lib.reads_through_tf_data(self.run_dir)
        self.cfg = cfg = as_run(cfg, self.tf_data_input, log)
        self.world, self.rank = (1, 0) if self.tf_data_input else cluster.worker_share()
        self.workers = self.world
        if self.tf_data_input:
            from bert_datagen.trainer.pretrain import earlier_runs_input  # TensorFlow's: for those runs alone

            self.iterator, self.iterator_ckpt = earlier_runs_input.earlier_run_input(self.info, cfg, self.run_dir)
        elif cfg.mix:
            self.batches = mixed_batches(cfg, self.info, self.bert, self.world, self.rank)
        else:
            self.batches = NumpyBatches(training_source(self.info), seed=cfg.seed, batch_size=cfg.batch_size,
                                        world_size=self.world, rank=self.rank)
        # Before the chief writes anything: all workers run the same configuration, or none runs.
        cluster.agree_to_start(self.training, cfg.to_dict(), cfg.out, self.info.identity["fingerprint"],
                               self.bert.to_dict())

    # -- state

    def restore_or_initialise(self) -> str:
        if self.chief:
            rundir.cleanup_temp(self.run_dir)
        found = ckpt_lib.list_checkpoints(self.run_dir)
        self._set_skipped(ckpt_lib.load_state(found[-1][1]) if found else {}, found[-1][0] if found else 0)
        if found:
            step, path = found[-1]
            if not self.tf_data_input:
                check_resumed_mixture(ckpt_lib.load_state(path).get("input"), self.batches, str(path))
            self.training.restore(path)
            if self.tf_data_input:
                from bert_datagen.trainer.pretrain.earlier_runs_input import restore_input_position

                restore_input_position(self.iterator_ckpt, path)
            self.step = self.saved_step = step
            return f"resumed from {path} (step {step})"
        if self.cfg.init_from:
            source = init_weights_from(self.model, self.cfg.init_from)
            self.training.reload_from_model()
            return f"initialised from {source}"
        if self.cfg.init_checkpoint:
            load_init_checkpoint(self.model, self.cfg.init_checkpoint)
            self.training.reload_from_model()
            return f"initialised from {self.cfg.init_checkpoint}"
        return f"new run (seed {self.cfg.seed})"

    def _set_skipped(self, state: dict, step: int) -> None:
        """The skipped ranges: those the checkpoint recorded plus --skip-batches (checked: only
        batches the run has not trained on)."""
        recorded = state.get("input", {}).get("skip_batches", [])
        try:
            self.skipped = add_ranges(recorded, self.cfg.skip_batches, step)
        except SkipError as exc:
            raise TrainConfigError(f"--skip-batches {exc}") from exc
        if self.skipped != recorded:
            shown = ", ".join(f"{a}-{b}" for a, b in self.skipped)
            self.log(f"skipping global batches {shown} (recorded with each checkpoint of the run)")

    def input_record(self) -> dict:
        """How the run reads, as its checkpoints record it."""
        record = {"order": INPUT_ORDER, "block_size": self._block_size(),
                  "skip_batches": [list(r) for r in self.skipped]}
        if isinstance(self.batches, MixedBatches):
            record["mixture"] = self.batches.record()
        return record

    def _block_size(self) -> int:
        return self.batches.block_size if isinstance(self.batches, MixedBatches) else self.batches.order.block_size

    def _batch_for_step(self, step: int) -> dict[str, np.ndarray]:
        batch = self.batches.batch_at(batch_of_step(step, self.skipped))
        if self.info.packed:  # the MLM head then computes only the slots some row of the batch uses
            batch = compact_predictions(batch, self.info.max_predictions_per_seq)
        if self.info.masking == "dynamic":  # the masks are made; the model reads neither
            batch.pop(INSTANCE_KEY)
            batch.pop(WORD_BITS, None)
        batch.pop(MIXTURE_FEATURE, None)  # which dataset: for the record and `batches`, not the model
        return with_sequence_weights(batch)

    def save(self, metrics: dict | None = None) -> Path | None:
        if not self.chief:
            self.saved_step = self.step
            return None
        model_arrays, opt_arrays = self.training.checkpoint_arrays(self.step)
        state = {"step": self.step, "backend": self.cfg.backend, "bert_config": self.bert.to_dict(), "metrics": metrics or {},
                 "data": self.info.source, "data_fingerprint": self.info.identity["fingerprint"],
                 "max_seq_length": self.info.max_seq_length,
                 "max_predictions_per_seq": self.info.max_predictions_per_seq}
        if not self.tf_data_input:
            state["input"] = self.input_record()
        path = ckpt_lib.save_checkpoint(self.run_dir, self.step, model_arrays, opt_arrays, state,
                                        iterator_saver=self.iterator_ckpt.write if self.tf_data_input else None,
                                        keep=self.cfg.keep_checkpoints)
        self.saved_step = self.step
        return path

    # -- loop

    def next_batch(self) -> dict:
        if self.tf_data_input:
            from bert_datagen.trainer.pretrain.earlier_runs_input import next_tf_data_batch

            return next_tf_data_batch(self.iterator, self._data_error)
        if self.input is None:
            self.input = OrderedInput(self._batch_for_step, self.step)
        return self.input.next()

    def _bad_record(self) -> str | None:
        return find_bad_record(self.info.train_files, self.info.max_seq_length,
                               self.info.max_predictions_per_seq, self.info.features(), self.bert.vocab_size)

    def _data_error(self, exc: Exception) -> DataError:
        detail = self._bad_record() or f"{self.info.source}: {type(exc).__name__}: {getattr(exc, 'message', exc)}"
        return DataError(f"corrupt input: {detail}")

    def evaluate(self, max_batches: int) -> dict[str, float] | None:
        if not self.info.eval_files:
            return None
        self._check_data_unchanged()
        return evaluate_model(self.training.eval_step, self.info, self.cfg.batch_size, max_batches)

    def _check_data_unchanged(self) -> None:
        now = open_pretraining_data(self.cfg.data, self.cfg.max_seq_length, self.cfg.max_predictions_per_seq,
                           self.cfg.eval_data)
        recorded = {"data": self.cfg.data, **self.info.identity}
        rundir.check_same_dataset(recorded, self.cfg.data, dataset_identity(now), "the start of this run")

    def pretrain(self, stop_at: int | None = None) -> dict:
        cfg = self.cfg
        if self.chief:
            rundir.start(self.run_dir, {rundir.TRAIN_CONFIG_FILE: cfg.to_json(), rundir.BERT_CONFIG_FILE: self.bert.to_json()},
                         cfg.data, self.info.identity)
        self.log(f"{self.restore_or_initialise()}; {self.info.source}: seq {self.info.max_seq_length}, "
                 f"{self.training.replicas} replica(s), {cfg.precision}, Keras on {cfg.backend}")
        if self.world > 1:
            self.log(f"worker {self.rank} of {self.world} reads its share of each global batch "
                     f"({cfg.batch_size // self.world} of {cfg.batch_size} sequences)")
        self.writer, self.eval_writer = tensorboard_writers(self.run_dir, self.chief)
        end = cfg.steps if stop_at is None else min(stop_at, cfg.steps)
        last = self.train_steps(end)
        result = {"step": self.step, "train": last, "run_dir": str(self.run_dir)}
        if self.step >= cfg.steps:
            ev = self.evaluate(cfg.eval_batches)
            self._report_eval(self.eval_writer, ev)
            result["eval"] = ev
            if self.chief:
                rundir.write_atomic(self.run_dir / "final_metrics.json",
                                    json.dumps(result, indent=2, sort_keys=True) + "\n")
        return result

    # -- the loop's hooks (runtime/loop.py)

    def learning_rate(self, step: int) -> float:
        return learning_rate(step, self.cfg.learning_rate, self.cfg.warmup_steps, self.cfg.steps)

    def loss_of(self, sums: dict[str, float]) -> float:
        return losses_from_sums(sums)["loss"]

    def window_figures(self, sums: dict[str, float], steps: int, seconds: float, lr: float) -> dict[str, float]:
        figures = losses_from_sums(sums)
        figures.update(learning_rate=lr, grad_norm=sums["grad_norm"] / steps,
                       sequences_per_second=steps * self.cfg.batch_size / seconds)
        return figures

    def report(self, figures: dict[str, float]) -> None:
        self._report(self.writer, figures)

    def after_step(self, end: int, figures: dict[str, float]) -> None:
        cfg = self.cfg
        if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < cfg.steps:
            self._report_eval(self.eval_writer, self.evaluate(cfg.eval_batches))
        if self.step % cfg.checkpoint_every == 0 or self.step == end:
            self.save(figures)

    def _report(self, writer, m: dict) -> None:
        nsp = f"nsp_acc {m['nsp_accuracy']:.4f}  " if "nsp_accuracy" in m else ""
        self.log(f"step {self.step:>7}/{self.cfg.steps}  loss {m['loss']:.4f}  mlm_acc {m['mlm_accuracy']:.4f}  "
                 f"{nsp}lr {m['learning_rate']:.3e}  {m['sequences_per_second']:.1f} seq/s")
        names = ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "learning_rate",
                 "sequences_per_second", "grad_norm")
        writer.scalars(self.step, {name: m[name] for name in names if name in m})

    def _report_eval(self, writer, m: dict | None) -> None:
        if m is None:
            self.log("eval: the dataset has no eval split; skipped")
            return
        nsp = f"nsp_acc {m['nsp_accuracy']:.4f}  " if "nsp_accuracy" in m else ""
        self.log(f"eval at step {self.step}: loss {m['loss']:.4f}  mlm_acc {m['mlm_accuracy']:.4f}  "
                 f"{nsp}({int(m['examples'])} sequences)")
        names = ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy")
        writer.scalars(self.step, {name: m[name] for name in names if name in m})


def pretrain(cfg: TrainConfig, log: Callable[[str], None] = print, stop_at: int | None = None) -> dict:
    """Run (or resume) `cfg`; with `stop_at`, stop after that step as if interrupted. The run
    directory is locked from its check until the end (`rundir.output_lock`), by the chief only in
    a cluster (the others write nothing there)."""
    if not cluster.is_chief():
        result = PretrainRun(cfg, log).pretrain(stop_at=stop_at)
    else:
        rundir.check_out_dir(cfg.out)
        with rundir.output_lock(cfg.out):
            result = PretrainRun(cfg, log).pretrain(stop_at=stop_at)
    cluster.run_ended()
    return result
