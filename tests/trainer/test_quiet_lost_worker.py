"""Issue #43 point 9: when a worker dies, the chief's stderr holds our one `Error:` line only. An
aborted collective executor appends TensorFlow's note to its status on a line of its own, after the
log line the filter already drops; that line is dropped too, and nothing of ours is."""

from __future__ import annotations

import os
import subprocess
import sys

from bert_datagen.trainer.quiet import TF_NATIVE_NOISE

NOTE = b"The error could be from a previous operation. Restart your program to reset."


def test_the_previous_operation_note_is_native_noise():
    for line in (NOTE, b"\t" + NOTE, b"  " + NOTE):
        assert TF_NATIVE_NOISE.match(line), line
    for ours in (b"Error: training step 4: lost worker 1 of the cluster; the run can be resumed from ...",
                 b"Error: " + NOTE, b"note: " + NOTE):
        assert not TF_NATIVE_NOISE.match(ours), ours


def test_a_lost_workers_native_lines_leave_only_our_line_on_stderr():
    """The lines as a chief writes them to fd 2 (native code, not Python's sys.stderr), through the
    filter `bert-train` installs."""
    native = (b"E0000 00:00:1796186559.001391    1212 base_collective_executor.cc:252] "
              b"BaseCollectiveExecutor::StartAbort UNAVAILABLE: recvmsg:Connection reset by peer\n" + NOTE + b"\n"
              b"Additional GRPC error information from remote target /job:worker/replica:0/task:1 while calling\n")
    child = ("import os, sys\n"
             "from bert_datagen.trainer.quiet import run_quietly\n"
             "def main():\n"
             f"    os.write(2, {native!r})\n"
             "    os.write(2, b'Error: training step 4: lost worker 1 of the cluster\\n')\n"
             "    return 1\n"
             "sys.exit(run_quietly(main))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "BERT_DATAGEN_DEBUG")}
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, env=env, timeout=120)
    assert done.returncode == 1
    assert done.stderr.decode().splitlines() == ["Error: training step 4: lost worker 1 of the cluster"], done.stderr


def test_jax_coordination_services_errors_are_native_noise_and_its_fatal_lines_stay():
    """JAX's distributed runtime logs a lost process of the cluster from its coordination service;
    the command's one line says which and where to resume. A fatal line comes before an abort (no
    line of ours follows it), so it stays."""
    for line in (b"E1206 07:59:01.123456    1234 coordination_service_agent.cc:332] Polled an error: UNAVAILABLE",
                 b"W1206 07:59:01.123456    1234 client.cc:90] heartbeat failed",
                 b"E1206 07:59:01.123456    1234 preemption_sync_manager.cc:12] x",
                 b"Additional GRPC error information from remote target coordination_service while calling"):
        assert TF_NATIVE_NOISE.match(line), line
    for kept in (b"F1206 07:59:01.123456    1234 client.cc:112] Terminating process because the JAX "
                 b"distributed service detected fatal errors",
                 b"E1206 07:59:01.123456    1234 other.cc:1] an error of another part"):
        assert not TF_NATIVE_NOISE.match(kept), kept
