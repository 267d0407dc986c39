"""Worker processes of `bert-train --strategy multi-worker` on localhost, for the multi-worker tests
and benchmarks/bench_multiworker.py: free ports, TF_CONFIG, a command started (on TensorFlow, or on
JAX: `bert_train_jax`) and finished, the train loss a run logged."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
# The JAX tests' cluster address: JAX's coordinator is reached there (gloo's own connections use the
# address the host name resolves to, 127.0.0.1 on the project's machines).
LOOPBACK = "127.0.0.1"


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def tf_config(ports: list[int], index: int, host: str = "localhost") -> str:
    return json.dumps({"cluster": {"worker": [f"{host}:{p}" for p in ports]},
                       "task": {"type": "worker", "index": index}})


def bert_train(args: list[str], tf_config_value: str | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    if tf_config_value is not None:
        env["TF_CONFIG"] = tf_config_value
    return subprocess.Popen([sys.executable, "-m", "bert_datagen.trainer.cli", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def bert_train_jax(args: list[str], tf_config_value: str | None = None, counts: Path | None = None,
                   without_tensorflow: bool = False, devices: int = 1) -> subprocess.Popen:
    """`bert-train ARGS` on the JAX backend (KERAS_BACKEND=jax), `devices` CPU devices a process; `counts`: the
    record bytes its loaders fetch written there as JSON (`tests/support/counting_reads.py`);
    `without_tensorflow`: as an install without TensorFlow runs it (`tests/support/without_tensorflow.py`,
    whose last stderr line names the TensorFlow modules loaded)."""
    # As a user starts it (TF_CPP_MIN_LOG_LEVEL unset: the command quiets what it loads itself).
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "XLA_FLAGS", "TF_CPP_MIN_LOG_LEVEL")}
    env.update(CUDA_VISIBLE_DEVICES="", KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    if devices > 1:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    if tf_config_value is not None:
        env["TF_CONFIG"] = tf_config_value
    if counts is not None:
        entry = ["tests.support.counting_reads", str(counts), *(["--without-tensorflow"] if without_tensorflow else [])]
    else:
        entry = ["tests.support.without_tensorflow" if without_tensorflow else "bert_datagen.trainer.cli"]
    return subprocess.Popen([sys.executable, "-m", *entry, *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a started command; past ``timeout`` it is killed, not left running."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate(timeout=30)  # a killed process closes its pipes at once
        raise
    return proc.returncode, out, err


def finish_all(procs: list[subprocess.Popen], timeout: float = 240) -> list[tuple[int, str, str]]:
    """`finish` of each started command; any still running when one fails or times out is killed."""
    try:
        return [finish(p, timeout) for p in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


def train_scalars(run: Path, name: str) -> dict[int, float]:
    import tensorflow as tf

    found = {}
    for path in sorted((run / "tensorboard" / "train").iterdir()):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag == name:
                    found[event.step] = float(value.simple_value)
    return found
