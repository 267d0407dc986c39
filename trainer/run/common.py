"""Kept only for trainer/finetune/run.py's imports until they name the modules these now live in
(issue #34): devices (strategy, replica slices), optimizer (loss scale), checkpoint (checkpoint
arrays), stopping (non-finite loss, lost worker, SIGINT), tensorboard."""

from bert_datagen.trainer.run.checkpoint import checkpoint_arrays, restore_checkpoint_arrays  # noqa: F401
from bert_datagen.trainer.run.devices import make_run_strategy, replica_slices  # noqa: F401
from bert_datagen.trainer.run.optimizer import loss_scale_for  # noqa: F401
from bert_datagen.trainer.run.stopping import (  # noqa: F401
    LOST_WORKER_ERRORS,
    interrupts_between_steps,
    lost_worker_error,
    stop_interrupted,
    stop_on_non_finite_loss,
)
from bert_datagen.trainer.run.tensorboard import tensorboard_writers, write_scalar  # noqa: F401
