"""`bert-train finetune`: one fine-tuning run (or one sub-run per seed) on a task dataset.

Like pre-training (trainer/pretrain/train.py), with the same loop (trainer/runtime/loop.py), step (each
backend's, given the task's `finetuning_objective`: trainer/finetune/step.py), optimizer, clipping and schedule: one optimizer step = one
global batch, split over replicas and `accumulation_steps` micro-batches, each part's loss divided
by the WHOLE batch's denominator (examples; labelled positions for tagging) so the summed gradient
is the whole batch's. Dropout masks are a pure function of (seed, step, position in the global batch) and
batch b of epoch e a pure function of (seed, e): with op determinism the same data + init + config
+ seed give bitwise-identical weights and metrics on CPU, and a run resumed from any checkpoint
ends bitwise identical to the uninterrupted one.

RUN/ holds finetune_config.json, bert_config.json, task.json, dataset.json, ckpt-NNNNNNNN/ (the last ones;
weights under TF1 names incl. the head's), tensorboard/{train,eval}, final_metrics.json (metric
history per epoch, the best epoch named; the LAST checkpoint is the model) and eval/ (the last
epoch's prediction files). `--seeds` writes RUN/finetune_seeds.json, RUN/seed-N/ per seed and
RUN/summary.json.

Where a run may be written, and when a rerun resumes, restarts or is refused, is pre-training's
(`bert_datagen.trainer.runtime.rundir`): the same checks of --out, of the settings and of the dataset, in that order,
before any work; SIGINT (and SIGTERM) stop between steps with a checkpoint of the last one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bert_datagen.contract.loading.order import INPUT_ORDER
from bert_datagen.trainer.errors import DataError, TrainConfigError, TrainingError
from bert_datagen.trainer.finetune.checks import check_data_fits, check_vocab, task_summary
from bert_datagen.trainer.finetune.config import FinetuneConfig
from bert_datagen.trainer.finetune.data import check_split_files, open_task_dataset
from bert_datagen.trainer.finetune.evaluate import evaluate_split, primary_metric, write_outputs
from bert_datagen.trainer.finetune.init import (
    init_checkpoint_config,
    init_from_run_config,
    initialise_encoder,
)
from bert_datagen.trainer.finetune.ordered import BLOCK_SIZE, FinetuneBatches
from bert_datagen.trainer.finetune.step import finetuning_spec
from bert_datagen.trainer.model.config import BertConfig
from bert_datagen.trainer.pretrain.data import find_bad_record
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib
from bert_datagen.trainer.runtime import cluster, rundir
from bert_datagen.trainer.runtime.loop import TrainingLoop
from bert_datagen.trainer.runtime.ordered_input import OrderedInput
from bert_datagen.trainer.runtime.rundir import cleanup_temp, write_atomic
from bert_datagen.trainer.runtime.tensorboard import tensorboard_writers
from bert_datagen.trainer.runtime.training import enable_determinism, refuse_unported_on_jax, start_training
from bert_datagen.trainer.runtime.updates import learning_rate

CONFIG_FILE = rundir.FINETUNE_CONFIG_FILE
TASK_FILE = "task.json"
BERT_CONFIG_FILE = "bert_config.json"

def model_config_for(cfg: FinetuneConfig, bert_config_file: str | None = None) -> BertConfig:
    if cfg.bert_config is not None:
        return BertConfig.from_dict(cfg.bert_config)
    if cfg.init_from:
        return init_from_run_config(cfg.init_from)
    return init_checkpoint_config(cfg.init_checkpoint, bert_config_file)


class FinetuneRun(TrainingLoop):
    """Everything one fine-tuning run holds; `run()` drives it."""

    def __init__(self, cfg: FinetuneConfig, log: Callable[[str], None] = print, bert_config_file: str | None = None):
        self.cfg, self.log = cfg, log
        self.run_dir = Path(cfg.out)
        # Only the chief writes the run; the others read it (to resume) and write nothing.
        self.chief = cluster.is_chief()
        if self.chief:  # the others checked it before joining: now the chief may be writing in it
            rundir.check_out_dir(cfg.out, rundir.FINETUNING)
        rundir.check_settings(self.run_dir, cfg, CONFIG_FILE)
        refuse_unported_on_jax(cfg)
        enable_determinism(cfg.seed, cfg.backend)
        self.data = open_task_dataset(cfg.data)
        rundir.check_dataset(self.run_dir, cfg.data, self.data.identity)
        self.train_split = self.data.split(cfg.train_split)
        if not self.train_split.labelled or self.train_split.mode != "train":
            why = ("has no labels" if not self.train_split.labelled else
                   f"was written to predict on (mode {self.train_split.mode!r}: in input order, without "
                   "training labels); rebuild the dataset with bert-datagen task --train-splits "
                   f"{cfg.train_split}")
            raise DataError(f"{cfg.data}: split {cfg.train_split!r} cannot be trained on: it {why}")
        self.eval_split = None
        if cfg.eval_split:
            self.eval_split = self.data.split(cfg.eval_split)
            if not self.eval_split.labelled:
                raise DataError(f"{cfg.data}: split {cfg.eval_split!r} is unlabelled and cannot be evaluated; "
                                "pass --eval-split with a labelled split (or --eval-split none)")
        check_split_files(self.data, [self.train_split, self.eval_split])
        self.bert = model_config_for(cfg, bert_config_file)
        check_data_fits(self.data, self.bert, cfg.init_from or cfg.init_checkpoint)
        vocab_note = check_vocab(self.data, cfg.init_from, cfg.init_checkpoint, cfg.allow_vocab_mismatch)
        if vocab_note:
            log(vocab_note)
        self.steps_per_epoch = self.train_split.records // cfg.batch_size
        if self.steps_per_epoch == 0:
            raise DataError(f"{cfg.data}: split {cfg.train_split!r} has {self.train_split.records} records, "
                            f"fewer than one batch of {cfg.batch_size}")
        self.total_steps = cfg.total_steps(self.train_split.records)
        self.warmup_steps = int(self.total_steps * cfg.warmup_proportion)
        self.training = start_training(finetuning_spec(cfg, self.bert, self.data.task_type, self.data.num_labels,
                                                       self._bad_record))
        self.model, self.named = self.training.model, self.training.named
        self.step = 0
        self.saved_step: int | None = None
        self.history: list[dict] = []
        self.tf_data_input = False  # set on resume: a run of an earlier version reads through tf.data
        self.world, self.rank = cluster.worker_share()
        self.input: OrderedInput | None = None
        self._next_batch: Callable[[], dict] | None = None
        # Before the chief writes anything: all workers run the same configuration, or none runs.
        cluster.agree_to_start(self.training, cfg.to_dict(), cfg.out, self.data.identity["fingerprint"],
                               self.bert.to_dict())

    # -- state

    def task_record(self) -> dict:
        return {"kind": self.data.task_kind, "type": self.data.task_type, "labels": self.data.labels,
                "max_seq_length": self.data.max_seq_length, "vocab_size": self.data.vocab_size,
                "do_lower_case": self.data.do_lower_case, "task": self.data.task,
                "primary_metric": primary_metric(self.data), "vocab_sha256": self.data.vocab_sha256}

    def restore_or_initialise(self) -> str:
        if self.chief:
            cleanup_temp(self.run_dir)  # what interrupted writes of ours left (checkpoints, marked files)
        found = ckpt_lib.list_checkpoints(self.run_dir)
        if not found:
            source = initialise_encoder(self.model, self.cfg.init_from, self.cfg.init_checkpoint)
            self.training.reload_from_model()
            return source
        step, path = found[-1]
        state = ckpt_lib.load_state(path)
        saved = state.get("task", {})
        if saved.get("labels") != self.data.labels or saved.get("type") != self.data.task_type:
            raise TrainingError(
                f"{path}: the run's head was fine-tuned for a {saved.get('type')} task with "
                f"{len(saved.get('labels', []))} labels {saved.get('labels')}, the dataset has a "
                f"{self.data.task_type} task with {self.data.num_labels} labels {self.data.labels}")
        # Checkpoints of earlier versions record no input: their runs go on reading through tf.data.
        self.tf_data_input = "input" not in state
        if self.tf_data_input and self.cfg.backend == "jax":
            raise TrainConfigError(f"{path}: a run of an earlier version, which reads through tf.data: resume it with "
                                   "--backend tensorflow")
        self.training.restore(path)
        self.step = self.saved_step = step
        self.history = list(state.get("history", []))
        return f"resumed from {path} (step {step})"

    def save(self, figures: dict | None = None) -> Path | None:
        if not self.chief:
            self.saved_step = self.step
            return None
        model_arrays, opt_arrays = self.training.checkpoint_arrays(self.step)
        state = {"step": self.step, "backend": self.cfg.backend, "bert_config": self.bert.to_dict(), "task": self.task_record(),
                 "history": self.history, "data": self.data.source, "total_steps": self.total_steps,
                 "steps_per_epoch": self.steps_per_epoch}
        if not self.tf_data_input:
            state["input"] = {"order": INPUT_ORDER, "block_size": BLOCK_SIZE}
        path = ckpt_lib.save_checkpoint(self.run_dir, self.step, model_arrays, opt_arrays, state,
                                        keep=self.cfg.keep_checkpoints)
        self.saved_step = self.step
        return path

    # -- loop

    def _train_input(self) -> Callable[[], dict]:
        """The next training batch, from the current step on (this worker's share of it)."""
        if self.tf_data_input:
            from bert_datagen.trainer.finetune.earlier_runs_input import earlier_run_batches

            return earlier_run_batches(self.train_split, self.cfg, self.steps_per_epoch, self.step)
        cfg = self.cfg
        ordered = FinetuneBatches(cfg.data, cfg.train_split, cfg.seed, cfg.batch_size, self.steps_per_epoch,
                                  self.world, self.rank, cfg.group_by_length,
                                  version=self.train_split.manifest_version)
        self.workers = self.world
        self.input = OrderedInput(ordered.batch, self.step)
        return self.input.next

    def _bad_record(self) -> str | None:
        return find_bad_record(self.train_split.files, 0, 0, self.train_split.features)

    def evaluate(self) -> dict | None:
        if self.eval_split is None:
            return None
        self.training.sync_model()
        result = evaluate_split(self.model, self.data, self.eval_split.name, self.cfg.eval_batch_size,
                                need_labels=True, null_score_diff_threshold=self.cfg.null_score_diff_threshold,
                                span_metric=self.cfg.span_metric, backend=self.cfg.backend)
        return {"metrics": result.metrics, "result": result}

    def run(self, stop_at: int | None = None) -> dict:
        cfg = self.cfg
        if self.chief:
            rundir.start(self.run_dir, {CONFIG_FILE: cfg.to_json(), BERT_CONFIG_FILE: self.bert.to_json(),
                                        TASK_FILE: json.dumps(self.task_record(), indent=2, sort_keys=True) + "\n"},
                         cfg.data, self.data.identity)
        self.log(f"{self.restore_or_initialise()}; {self.data.source}: {task_summary(self.data)}, "
                 f"{self.train_split.records} train records, "
                 f"{self.total_steps} steps ({self.steps_per_epoch} per epoch), warmup {self.warmup_steps}, "
                 f"{self.training.replicas} replica(s), {cfg.precision}, Keras on {cfg.backend}")
        self.writer, self.eval_writer = tensorboard_writers(self.run_dir, self.chief)
        end = self.total_steps if stop_at is None else min(stop_at, self.total_steps)
        if self.step >= self.total_steps and (self.run_dir / "final_metrics.json").is_file():
            self.log(f"{self.run_dir}: the run is complete (step {self.step})")
            return {**json.loads((self.run_dir / "final_metrics.json").read_text()), "step": self.step,
                    "total_steps": self.total_steps, "run_dir": str(self.run_dir)}
        self._next_batch = self._train_input()
        self.last_eval = None
        self.train_steps(end)
        result = {"step": self.step, "total_steps": self.total_steps, "run_dir": str(self.run_dir),
                  "history": self.history}
        if self.step >= self.total_steps:
            result.update(self._final(self.last_eval))
        return result

    # -- the loop's hooks (runtime/loop.py)

    def learning_rate(self, step: int) -> float:
        return learning_rate(step, self.cfg.learning_rate, self.warmup_steps, self.total_steps)

    def next_batch(self) -> dict:
        return self._next_batch()

    def loss_of(self, sums: dict[str, float]) -> float:
        return sums["loss_sum"] / max(sums["loss_count"], 1.0)

    def window_figures(self, sums: dict[str, float], steps: int, seconds: float, lr: float) -> dict[str, float]:
        return {"loss": self.loss_of(sums), "accuracy": sums["correct"] / max(sums["count"], 1.0),
                "learning_rate": lr, "seconds_per_step": seconds / steps}

    def report(self, figures: dict[str, float]) -> None:
        self.log(f"step {self.step:>6}/{self.total_steps}  loss {figures['loss']:.4f}  "
                 f"lr {figures['learning_rate']:.3e}  {figures['seconds_per_step']:.3f} s/step")
        self.writer.scalars(self.step, figures)

    def after_step(self, end: int, figures: dict[str, float]) -> None:
        epoch_done = self.step % self.steps_per_epoch == 0 or self.step == self.total_steps
        if epoch_done:
            self.last_eval = self.evaluate()
            self._record_epoch(self.eval_writer, self.last_eval)
        every = self.cfg.checkpoint_every
        if epoch_done or (every and self.step % every == 0) or self.step == end:
            self.save()

    def _record_epoch(self, writer, evaluation: dict | None) -> None:
        epoch = self.step / self.steps_per_epoch
        entry = {"epoch": round(epoch, 4), "step": self.step}
        if evaluation is not None:
            entry["metrics"] = evaluation["metrics"]
            shown = "  ".join(f"{k} {v:.4f}" for k, v in evaluation["metrics"].items())
            self.log(f"eval ({self.eval_split.name}) after epoch {entry['epoch']:g}: {shown}")
            writer.scalars(self.step, evaluation["metrics"])
        self.history.append(entry)

    def _final(self, last_eval: dict | None) -> dict:
        primary = primary_metric(self.data)
        final: dict[str, Any] = {"primary_metric": primary, "task": self.data.task_kind, "seed": self.cfg.seed}
        scored = [h for h in self.history if "metrics" in h]
        if scored:
            best = max(scored, key=lambda h: h["metrics"][primary])
            final["best_epoch"] = {"epoch": best["epoch"], "step": best["step"], primary: best["metrics"][primary]}
            final["final"] = scored[-1]["metrics"]
            if last_eval is not None:
                final["details"] = last_eval["result"].details
                if self.chief:
                    write_outputs(self.run_dir / "eval", self.data, last_eval["result"])
        final["history"] = self.history
        if self.chief:
            write_atomic(self.run_dir / "final_metrics.json", json.dumps(final, indent=2, sort_keys=True) + "\n")
        if scored:
            self.log(f"best epoch {final['best_epoch']['epoch']:g} ({primary} {final['best_epoch'][primary]:.4f}); "
                     f"the run keeps the last checkpoint (epoch {scored[-1]['epoch']:g}, "
                     f"{primary} {final['final'][primary]:.4f})")
        return final


def finetune(cfg: FinetuneConfig, log: Callable[[str], None] = print, stop_at: int | None = None,
             bert_config_file: str | None = None) -> dict:
    """Fine-tune (or resume) `cfg` in its run directory, which it holds locked until the end (the
    chief only, in a cluster: the others write nothing there)."""
    if not cluster.is_chief():
        result = FinetuneRun(cfg, log, bert_config_file).run(stop_at=stop_at)
    else:
        rundir.check_out_dir(cfg.out, rundir.FINETUNING)
        with rundir.output_lock(cfg.out):
            result = FinetuneRun(cfg, log, bert_config_file).run(stop_at=stop_at)
    cluster.run_ended()
    return result


def finetune_seeds(cfg: FinetuneConfig, seeds: list[int], log: Callable[[str], None] = print,
                   bert_config_file: str | None = None) -> dict:
    """One sub-run per seed in RUN/seed-N, then the spread of the primary metric in RUN/summary.json.
    RUN and every sub-run are locked throughout; every sub-run's --out and settings are checked
    before the first one starts."""
    rundir.check_out_dir(cfg.out, rundir.FINETUNING_SEEDS)
    with contextlib.ExitStack() as locks:
        locks.enter_context(rundir.output_lock(cfg.out))
        for seed in seeds:
            sub = _seed_config(cfg, seed)
            rundir.check_out_dir(sub.out, rundir.FINETUNING)
            rundir.check_settings(Path(sub.out), sub, CONFIG_FILE)
            locks.enter_context(rundir.output_lock(sub.out))
        return _finetune_seeds(cfg, seeds, log, bert_config_file)


def _seed_config(cfg: FinetuneConfig, seed: int) -> FinetuneConfig:
    return dataclasses.replace(cfg, seed=seed, out=str(Path(cfg.out) / f"seed-{seed}"))


def _finetune_seeds(cfg: FinetuneConfig, seeds: list[int], log: Callable[[str], None],
                    bert_config_file: str | None) -> dict:
    parent = Path(cfg.out)
    rundir.make_run_dir(parent)
    # Written first: it marks RUN as a multi-seed run (`rundir.run_kind`) before any seed-N/ exists.
    # A rerun with more seeds adds to the run: the record keeps every seed it holds.
    earlier = rundir.recorded_seeds(parent)
    every = earlier + [seed for seed in seeds if seed not in earlier]
    rundir.write_atomic(parent / rundir.SEEDS_FILE, json.dumps({"seeds": every}, indent=2) + "\n")
    rows = []
    for seed in seeds:
        sub = _seed_config(cfg, seed)
        log(f"== seed {seed}: {sub.out}")
        result = FinetuneRun(sub, log, bert_config_file).run()  # locked by finetune_seeds
        if "final" not in result:
            raise TrainingError(f"seed {seed}: no eval split, nothing to summarise")
        rows.append({"seed": seed, "run_dir": sub.out, "metrics": result["final"]})
    primary = result["primary_metric"]
    summary = {"primary_metric": primary, "seeds": rows, "metrics": {}}
    for name in rows[0]["metrics"]:
        values = [r["metrics"][name] for r in rows]
        summary["metrics"][name] = {"mean": statistics.fmean(values),
                                    "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                                    "min": min(values), "max": max(values)}
    write_atomic(parent / "summary.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")
    log(format_summary(summary))
    return summary


def format_summary(summary: dict) -> str:
    names = list(summary["metrics"])
    lines = ["seed    " + "  ".join(f"{n:>10}" for n in names)]
    for row in summary["seeds"]:
        lines.append(f"{row['seed']:<8}" + "  ".join(f"{row['metrics'][n]:>10.4f}" for n in names))
    for stat in ("mean", "std", "min", "max"):
        lines.append(f"{stat:<8}" + "  ".join(f"{summary['metrics'][n][stat]:>10.4f}" for n in names))
    return "\n".join(lines)
