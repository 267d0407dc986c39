"""TensorFlow's native start-up lines, kept from a user: one setup for every entry point that imports
TensorFlow (`bert-train`, and the `make pretrain` / `make finetune` demos run with `python -m`).

The lines (oneDNN notices, CUDA and TPU probing, CPU instruction sets, TFRecord buffer defaults)
carry no information for a user. TensorFlow's own C++ log lines obey TF_CPP_MIN_LOG_LEVEL, which
must be set before TensorFlow is imported; the absl ones ignore it (absl writes everything to fd 2
until InitializeLog, which TensorFlow never calls) and are dropped by a filter of the process's
stderr. A user who set TF_CPP_MIN_LOG_LEVEL sees what it lets through. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, MutableMapping

from bert_datagen.cli.plumbing import debug_requested, filter_process_stderr

# absl INFO lines ("I0000 00:00:1796114780.736876  1234 port.cc:153] ..."), absl's own notice, and
# the CUDA probing and registration complaints that every CPU-only or pip-installed TensorFlow prints,
# and the op-attribute skew a Python-fed tf.data pipeline (a dataset in a bucket) logs once, and
# oneDNN's note that it leaves integer and bool ops (the model's keras.ops masks) to Eigen on this CPU.
# Also the aborts a multi-worker step's collectives log when a worker is lost, with their
# continuation lines (gRPC's, and the note an aborted collective executor appends to its status on
# a line of its own): the command's one line says which worker and where to resume (run/stopping.py).
# The same for JAX's distributed runtime (its coordination service's errors and warnings when a
# process of the cluster is gone); its fatal lines stay, as they come before an abort.
TF_NATIVE_NOISE = re.compile(
    rb"^(I\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] "
    rb"|WARNING: All log messages before absl::InitializeLog\(\) is called"
    rb"|[EW]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] .*(failed call to cuInit|Unable to register cu(DNN|FFT|BLAS) factory"
    rb"|TF-TRT Warning|computation placer already"
    rb"|NodeDef mentions attribute \w+ which is not in the op definition"
    rb"|oneDNN supports DT_\w+ only on platforms with AVX-512)"
    rb"|[EW]\d{4} [\d:.]+ +\d+ (ring_alg|base_collective_executor|collective_[a-z_]+)\.cc:\d+\] "
    rb"|[EW]\d{4} [\d:.]+ +\d+ (coordination_service_agent|coordination_service|client|preemption_sync_manager)"
    rb"\.(cc|h):\d+\] "
    rb"|Additional GRPC error information from remote target (/job:|coordination_service)"
    rb"|:UNKNOWN:Error received from peer "
    rb"|\s*The error could be from a previous operation\. Restart your program to reset\.)"
)


def quiet_tensorflow_logs(environ: MutableMapping[str, str]) -> re.Pattern[bytes] | None:
    """Set TF_CPP_MIN_LOG_LEVEL in ``environ`` (the process's, before TensorFlow is imported) unless
    the user did; returns the stderr lines to drop, None when the user chose their own level."""
    if "TF_CPP_MIN_LOG_LEVEL" in environ:
        return None
    environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return TF_NATIVE_NOISE


def run_quietly(main: Callable[[], int]) -> int:
    """Run a `python -m` entry point that imports TensorFlow with the start-up lines kept from its
    stderr and its child processes'; with BERT_DATAGEN_DEBUG=1 everything is shown."""
    noise = quiet_tensorflow_logs(os.environ)
    debug = debug_requested(sys.argv[1:])
    restore = filter_process_stderr(noise) if noise is not None and not debug else None
    try:
        return main()
    finally:
        if restore is not None:
            restore()
