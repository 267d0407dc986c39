"""The pre-training loop (separate from the model): strategy, steps, checkpoints, logs, eval.

One optimizer step = one global batch of `batch_size` sequences, split over replicas and then over
`accumulation_steps` micro-batches. Every part's loss is normalised by the WHOLE batch's MLM weight
sum and example count, so the summed gradient equals the gradient of the original loss on the whole
batch: distribution and accumulation change the arithmetic order, not what is computed.

Reproducibility: weights start from seeds derived per weight name, dropout masks are a pure function
of (seed, step, micro-step, replica), the input pipeline is seeded and its position is checkpointed.
With op determinism on, the same data + config + seed give bitwise-identical weights, and a run
stopped at any checkpoint and resumed ends bitwise identical to the uninterrupted run.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from trainer import checkpoint as ckpt_lib
from trainer.config import BertConfig, ConfigError, TrainConfig
from trainer.data import (
    DataError,
    DatasetInfo,
    check_fits,
    eval_dataset,
    find_bad_record,
    open_dataset,
    train_dataset,
)
from trainer.model import BertPretrainer, build_model, tf1_variable_map
from trainer.objective import MLM_DENOMINATOR_EPSILON, batch_sums, losses_from_sums
from trainer.optimizer import AdamWeightDecay, DynamicLossScale, clip_by_global_norm, learning_rate

SUM = tf.distribute.ReduceOp.SUM
TRAIN_CONFIG_FILE = "train_config.json"
BERT_CONFIG_FILE = "bert_config.json"


class TrainingError(RuntimeError):
    """A run that cannot continue (non-finite loss, a run dir of another config, ...)."""


def enable_determinism(seed: int) -> None:
    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()


# ------------------------------------------------------------------ devices


def make_strategy(name: str, tpu: str | None = None) -> tf.distribute.Strategy:
    """`auto`: all GPUs mirrored if more than one, else one device (GPU if any, else CPU)."""
    gpus = tf.config.list_logical_devices("GPU")
    cpus = tf.config.list_logical_devices("CPU")
    if name == "auto":
        name = "mirrored" if len(gpus) > 1 else "one-device"
    if name == "one-device":
        return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else cpus[0].name)
    if name == "mirrored":
        # Without GPUs, mirror over the logical CPU devices (tests split the CPU in two).
        devices = [d.name for d in gpus] or [d.name for d in cpus]
        return tf.distribute.MirroredStrategy(devices)
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or "")
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    if name == "multi-worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    raise ConfigError(f"unknown strategy {name!r}")


def dtype_policy(precision: str) -> str | None:
    return None if precision == "float32" else precision


# ------------------------------------------------------------------ the step


@dataclass
class StepFunctions:
    train_step: Callable
    eval_step: Callable


def make_step_functions(model: BertPretrainer, optimizer: AdamWeightDecay, strategy: tf.distribute.Strategy,
                        cfg: TrainConfig, loss_scale: DynamicLossScale | None) -> StepFunctions:
    variables = optimizer.variables
    accum = cfg.accumulation_steps
    replicas = strategy.num_replicas_in_sync
    global_examples = float(cfg.batch_size)
    base_seed = tf.constant([cfg.seed & 0x7FFFFFFF, 0x5EED], dtype=tf.int64)

    def micro_grads(batch, weight_total, seed, scale):
        with tf.GradientTape() as tape:
            out = model(batch, training=True, dropout_seed=seed)
            sums = batch_sums(out, batch)
            # This part's share of the whole batch's loss (see module docstring).
            loss = sums["mlm_ce"] / (weight_total + MLM_DENOMINATOR_EPSILON) + sums["nsp_ce"] / global_examples
            scaled = loss * scale if scale is not None else loss
        grads = tape.gradient(scaled, [v.value for v in variables])
        # Embedding lookups give IndexedSlices; dense sums keep accumulation and all-reduce simple.
        return [tf.convert_to_tensor(g) for g in grads], sums

    micro_grads_fn = tf.function(micro_grads, jit_compile=True) if cfg.jit else micro_grads

    def replica_step(batch, lr, step):
        ctx = tf.distribute.get_replica_context()
        weight_total = ctx.all_reduce(SUM, tf.reduce_sum(batch["masked_lm_weights"]))
        scale = loss_scale.scale if loss_scale is not None else None
        seed = tf.random.experimental.stateless_fold_in(base_seed, step, alg="philox")
        seed = tf.random.experimental.stateless_fold_in(seed, ctx.replica_id_in_sync_group, alg="philox")
        local = tf.shape(batch["input_ids"])[0]
        micro = local // accum
        grads, totals = None, None
        for k in range(accum):  # unrolled: accumulation counts are small
            part = {name: value[k * micro:(k + 1) * micro] for name, value in batch.items()}
            part_seed = tf.random.experimental.stateless_fold_in(seed, k, alg="philox")
            g, sums = micro_grads_fn(part, weight_total, part_seed, scale)
            grads = g if grads is None else [a + b for a, b in zip(grads, g, strict=True)]
            totals = sums if totals is None else {n: totals[n] + sums[n] for n in totals}
        if replicas > 1:
            grads = ctx.all_reduce(SUM, grads)
        if scale is not None:
            grads = [g / scale for g in grads]
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
        clipped, norm = clip_by_global_norm(grads, cfg.clip_norm)
        optimizer.apply(clipped, lr, ok=finite if loss_scale is not None else None)
        if loss_scale is not None:
            loss_scale.update(finite)
        totals["grad_norm"] = norm / replicas  # summed over replicas below
        totals["finite"] = tf.cast(finite, tf.float32) / replicas
        return totals

    def train_step(batch, lr, step):
        per_replica = strategy.run(replica_step, args=(batch, lr, step))
        return {k: strategy.reduce(SUM, v, axis=None) for k, v in per_replica.items()}

    def replica_eval(batch):
        return batch_sums(model(batch, training=False), batch)

    def eval_step(batch):
        per_replica = strategy.run(replica_eval, args=(batch,))
        return {k: strategy.reduce(SUM, v, axis=None) for k, v in per_replica.items()}

    return StepFunctions(train_step=tf.function(train_step), eval_step=tf.function(eval_step))


# ------------------------------------------------------------------ run directory


def _check_run_config(run: Path, cfg: TrainConfig) -> None:
    path = run / TRAIN_CONFIG_FILE
    if not path.is_file():
        return
    previous = json.loads(path.read_text())
    current = cfg.to_dict()
    differing = sorted(k for k in set(previous) | set(current)
                       if k not in TrainConfig.RESUMABLE_CHANGES and previous.get(k) != current.get(k))
    if differing:
        detail = ", ".join(f"{k}: {previous.get(k)!r} -> {current.get(k)!r}" for k in differing)
        raise TrainingError(f"{path}: the run was started with other settings ({detail}); "
                            "use a new --out to start another run")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def load_bert_config_for(cfg: TrainConfig, info: DatasetInfo) -> BertConfig:
    if cfg.bert_config is not None:
        return BertConfig.from_dict(cfg.bert_config)
    vocab_size = info.vocab_size or cfg.vocab_size
    if not vocab_size:
        raise ConfigError(f"{info.source}: the vocab size is unknown (no manifest): pass --bert-config "
                          "or --vocab-size")
    return BertConfig.from_name(cfg.model, int(vocab_size))


# ------------------------------------------------------------------ loading weights


def restore_model(path: str | Path, precision: str = "float32") -> tuple[BertPretrainer, BertConfig, Path]:
    """A model with the weights of a run's latest checkpoint (or of a checkpoint directory)."""
    ckpt = ckpt_lib.resolve_checkpoint(path)
    state = ckpt_lib.load_state(ckpt)
    bert = BertConfig.from_dict(state["bert_config"])
    model = build_model(bert, seed=0, dtype=dtype_policy(precision))
    ckpt_lib.assign_named_weights(tf1_variable_map(model), ckpt_lib.load_arrays(ckpt, ckpt_lib.MODEL_FILE),
                                  str(ckpt / ckpt_lib.MODEL_FILE))
    return model, bert, ckpt


def init_weights_from(model: BertPretrainer, path: str) -> Path:
    """Phase 2: start from the weights (not the optimizer or step) of another run or checkpoint."""
    ckpt = ckpt_lib.resolve_checkpoint(path)
    ckpt_lib.assign_named_weights(tf1_variable_map(model), ckpt_lib.load_arrays(ckpt, ckpt_lib.MODEL_FILE),
                                  str(ckpt / ckpt_lib.MODEL_FILE))
    return ckpt


def init_weights_from_external(model: BertPretrainer, path: str) -> str:
    """Weights of an original TF1 checkpoint or a Hugging Face directory (trainer.convert)."""
    try:
        from trainer import convert
    except ImportError as exc:
        raise ConfigError(f"--init-checkpoint needs trainer.convert, which is not available: {exc}") from exc
    loader = getattr(convert, "load_init_checkpoint", None) or convert.load_tf1_checkpoint
    loader(model, path)
    return path


# ------------------------------------------------------------------ the run


class Run:
    """Everything one `bert-train pretrain` invocation holds; `pretrain()` drives it."""

    def __init__(self, cfg: TrainConfig, log: Callable[[str], None] = print):
        self.cfg, self.log = cfg, log
        self.run_dir = Path(cfg.out)
        _check_run_config(self.run_dir, cfg)
        enable_determinism(cfg.seed)
        self.info = open_dataset(cfg.data, cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.eval_data)
        self.bert = load_bert_config_for(cfg, self.info)
        check_fits(self.info, self.bert)
        self.strategy = make_strategy(cfg.strategy, cfg.tpu)
        replicas = self.strategy.num_replicas_in_sync
        if cfg.batch_size % (replicas * cfg.accumulation_steps):
            raise ConfigError(f"batch size {cfg.batch_size} is not a multiple of replicas ({replicas}) x "
                              f"accumulation steps ({cfg.accumulation_steps})")
        with self.strategy.scope():
            self.model = build_model(self.bert, seed=cfg.seed, dtype=dtype_policy(cfg.precision))
            self.named = tf1_variable_map(self.model)
            self.optimizer = AdamWeightDecay(self.named, weight_decay=cfg.weight_decay)
            self.loss_scale = DynamicLossScale() if cfg.precision == "mixed_float16" else None
        self.steps = make_step_functions(self.model, self.optimizer, self.strategy, cfg, self.loss_scale)
        self.step = 0
        # One host pipeline whose iterator state can be checkpointed (a tf.distribute iterator
        # cannot be); each step's global batch is then cut into per-replica slices.
        self.iterator = iter(train_dataset(self.info, cfg.batch_size, cfg.seed, cfg.shuffle_buffer))
        self.iterator_ckpt = tf.train.Checkpoint(iterator=self.iterator)

    # -- state

    def restore_or_initialise(self) -> str:
        ckpt_lib.cleanup_partial(self.run_dir)
        found = ckpt_lib.list_checkpoints(self.run_dir)
        if found:
            step, path = found[-1]
            ckpt_lib.assign_named_weights(self.named, ckpt_lib.load_arrays(path, ckpt_lib.MODEL_FILE),
                                          str(path / ckpt_lib.MODEL_FILE))
            opt = ckpt_lib.load_arrays(path, ckpt_lib.OPTIMIZER_FILE)
            self.optimizer.load_slot_arrays(opt, str(path / ckpt_lib.OPTIMIZER_FILE))
            if self.loss_scale is not None:
                self.loss_scale.load_state(opt)
            self.iterator_ckpt.read(str(path / ckpt_lib.INPUT_PREFIX)).assert_consumed()
            self.step = step
            return f"resumed from {path} (step {step})"
        if self.cfg.init_from:
            return f"initialised from {init_weights_from(self.model, self.cfg.init_from)}"
        if self.cfg.init_checkpoint:
            return f"initialised from {init_weights_from_external(self.model, self.cfg.init_checkpoint)}"
        return f"new run (seed {self.cfg.seed})"

    def save(self, metrics: dict | None = None) -> Path:
        model_arrays = {name: var.numpy() for name, var in self.named.items()}
        opt_arrays = self.optimizer.slot_arrays()
        opt_arrays["global_step"] = np.asarray(self.step, dtype=np.int64)
        if self.loss_scale is not None:
            opt_arrays.update(self.loss_scale.state())
        state = {"step": self.step, "bert_config": self.bert.to_dict(), "metrics": metrics or {},
                 "data": self.info.source, "max_seq_length": self.info.max_seq_length,
                 "max_predictions_per_seq": self.info.max_predictions_per_seq}
        return ckpt_lib.save_checkpoint(self.run_dir, self.step, model_arrays, opt_arrays, state,
                                        iterator_saver=self.iterator_ckpt.write, keep=self.cfg.keep_checkpoints)

    # -- loop

    def next_batch(self):
        try:
            batch = next(self.iterator)
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as exc:
            raise self._data_error(exc) from exc
        replicas = self.strategy.num_replicas_in_sync
        if replicas == 1:
            return batch
        local = self.cfg.batch_size // replicas

        def replica_slice(ctx):
            start = ctx.replica_id_in_sync_group * local
            return {name: value[start:start + local] for name, value in batch.items()}

        return self.strategy.experimental_distribute_values_from_function(replica_slice)

    def _data_error(self, exc: Exception) -> DataError:
        where = find_bad_record(self.info.train_files, self.info.max_seq_length,
                                self.info.max_predictions_per_seq)
        detail = where or f"{self.info.source}: {type(exc).__name__}: {exc.message if hasattr(exc, 'message') else exc}"
        return DataError(f"corrupt input: {detail}")

    def evaluate(self, max_batches: int) -> dict[str, float] | None:
        if not self.info.eval_files:
            return None
        return evaluate_model(self.steps.eval_step, self.strategy, self.info, self.cfg.batch_size, max_batches)

    def pretrain(self, stop_at: int | None = None) -> dict:
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        _check_run_config(self.run_dir, cfg)
        _write_atomic(self.run_dir / TRAIN_CONFIG_FILE, cfg.to_json())
        _write_atomic(self.run_dir / BERT_CONFIG_FILE, self.bert.to_json())
        self.log(f"{self.restore_or_initialise()}; {self.info.source}: seq {self.info.max_seq_length}, "
                 f"{self.strategy.num_replicas_in_sync} replica(s), {cfg.precision}")
        writer = tf.summary.create_file_writer(str(self.run_dir / "tensorboard" / "train"))
        eval_writer = tf.summary.create_file_writer(str(self.run_dir / "tensorboard" / "eval"))
        end = cfg.steps if stop_at is None else min(stop_at, cfg.steps)
        window: dict[str, float] = {}
        window_start, window_steps = time.perf_counter(), 0
        last: dict = {}
        while self.step < end:
            lr = learning_rate(self.step, cfg.learning_rate, cfg.warmup_steps, cfg.steps)
            batch = self.next_batch()
            try:
                sums = self.steps.train_step(batch, tf.constant(lr), tf.constant(self.step, tf.int64))
            except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as exc:
                raise self._data_error(exc) from exc
            sums = {k: float(v) for k, v in sums.items()}
            step_loss = losses_from_sums(sums)["loss"]
            if not math.isfinite(step_loss) and self.loss_scale is None:
                good = ckpt_lib.list_checkpoints(self.run_dir)
                kept = f"last good checkpoint: {good[-1][1]}" if good else "no checkpoint was written"
                raise TrainingError(f"step {self.step}: loss is {step_loss}; stopped ({kept})")
            self.step += 1
            window_steps += 1
            for k, v in sums.items():
                window[k] = window.get(k, 0.0) + v
            if self.step % cfg.log_every == 0 or self.step == end:
                elapsed = time.perf_counter() - window_start
                last = losses_from_sums(window)
                last.update(learning_rate=float(lr), sequences_per_second=window_steps * cfg.batch_size / elapsed,
                            grad_norm=window["grad_norm"] / window_steps)
                self._report(writer, last)
                window, window_start, window_steps = {}, time.perf_counter(), 0
            if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < cfg.steps:
                self._report_eval(eval_writer, self.evaluate(cfg.eval_batches))
            if self.step % cfg.checkpoint_every == 0 or self.step == end:
                self.save(last)
        result = {"step": self.step, "train": last, "run_dir": str(self.run_dir)}
        if self.step >= cfg.steps:
            ev = self.evaluate(cfg.eval_batches)
            self._report_eval(eval_writer, ev)
            result["eval"] = ev
            _write_atomic(self.run_dir / "final_metrics.json", json.dumps(result, indent=2, sort_keys=True) + "\n")
        writer.flush()
        eval_writer.flush()
        return result

    def _report(self, writer, m: dict) -> None:
        self.log(f"step {self.step:>7}/{self.cfg.steps}  loss {m['loss']:.4f}  mlm_acc {m['mlm_accuracy']:.4f}  "
                 f"nsp_acc {m['nsp_accuracy']:.4f}  lr {m['learning_rate']:.3e}  "
                 f"{m['sequences_per_second']:.1f} seq/s")
        with writer.as_default(step=self.step):
            for name in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "learning_rate",
                         "sequences_per_second", "grad_norm"):
                write_scalar(name, m[name])

    def _report_eval(self, writer, m: dict | None) -> None:
        if m is None:
            self.log("eval: the dataset has no eval split; skipped")
            return
        self.log(f"eval at step {self.step}: loss {m['loss']:.4f}  mlm_acc {m['mlm_accuracy']:.4f}  "
                 f"nsp_acc {m['nsp_accuracy']:.4f}  ({int(m['examples'])} sequences)")
        with writer.as_default(step=self.step):
            for name in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"):
                write_scalar(name, m[name])


def write_scalar(name: str, value: float) -> None:
    """A TensorBoard scalar event without needing the tensorboard package (tf.summary.scalar does):
    the low-level summary op with the metadata of TensorBoard's scalars plugin."""
    from tensorflow.core.framework import summary_pb2

    metadata = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    tf.summary.write(name, tf.constant(value, tf.float32), metadata=metadata)


def evaluate_model(eval_step, strategy, info: DatasetInfo, batch_size: int, max_batches: int | None,
                   files: list[str] | None = None) -> dict[str, float]:
    """MLM/NSP loss and accuracy over the first `max_batches` full batches (all when None)."""
    dataset = eval_dataset(info, batch_size, files)
    if max_batches:
        dataset = dataset.take(max_batches)
    if strategy.num_replicas_in_sync > 1:
        dataset = strategy.experimental_distribute_dataset(dataset)
    totals: dict[str, float] = {}
    for batch in dataset:
        for k, v in eval_step(batch).items():
            totals[k] = totals.get(k, 0.0) + float(v)
    if not totals:
        raise DataError(f"{info.source}: fewer eval records than one batch of {batch_size}")
    result = losses_from_sums(totals)
    result["examples"] = totals["examples"]
    return result


def pretrain(cfg: TrainConfig, log: Callable[[str], None] = print, stop_at: int | None = None) -> dict:
    """Run (or resume) `cfg`; with `stop_at`, stop after that step as if interrupted."""
    return Run(cfg, log).pretrain(stop_at=stop_at)


def evaluate_restored(model: BertPretrainer, bert: BertConfig, data: str, batch_size: int = 32, max_batches: int | None = None,
                      split: str = "eval", max_seq_length: int | None = None,
                      max_predictions_per_seq: int | None = None) -> dict[str, float]:
    """MLM/NSP loss and accuracy of an already restored model on a dataset's eval (or train) split."""
    info = open_dataset(data, max_seq_length, max_predictions_per_seq)
    check_fits(info, bert)
    files = info.eval_files if split == "eval" else info.train_files
    if not files:
        raise DataError(f"{data}: the {split} split has no shards")

    @tf.function
    def eval_step(batch):
        return batch_sums(model(batch, training=False), batch)

    return evaluate_model(eval_step, tf.distribute.get_strategy(), info, batch_size, max_batches, files)


def evaluate_run(run: str, data: str, batch_size: int = 32, max_batches: int | None = None,
                 split: str = "eval", max_seq_length: int | None = None,
                 max_predictions_per_seq: int | None = None, precision: str = "float32") -> dict[str, float]:
    """`bert-train eval`: the latest checkpoint of RUN on a dataset's eval (or train) split."""
    model, bert, ckpt = restore_model(run, precision)
    result = evaluate_restored(model, bert, data, batch_size, max_batches, split, max_seq_length,
                               max_predictions_per_seq)
    result["checkpoint"] = str(ckpt)
    result["step"] = ckpt_lib.load_state(ckpt)["step"]
    return result
