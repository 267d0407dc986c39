"""JAX hosts (`contract/loading/jax_hosts.py`): two JAX processes on CPU, joined by
jax.distributed on localhost, each read their share, and the global arrays they make are the
global batches, bitwise; a process resumes from the state at any step."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.source import open_source
from tests.support.synthetic import write_synthetic_dataset

B, BS, SEED, STEPS = 8, 4, 3, 4

HOST = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    data, out, port, pid = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    from jax.experimental import multihost_utils
    from bert_datagen.contract.loading.jax_hosts import JaxBatches
    from bert_datagen.contract.loading.source import open_source

    source = open_source(data)
    seen = {}
    batches = JaxBatches(source, seed=%(seed)d, batch_size=%(b)d, block_size=%(bs)d, stop=%(steps)d)
    for step, batch in enumerate(batches):
        if step == 1:
            state = batches.state_dict()  # after batch 1: the next is 2
        for name, arr in batch.items():
            assert arr.shape[0] == %(b)d and len(arr.addressable_shards) == 1
            seen[f"{step}/{name}/local"] = np.asarray(arr.addressable_shards[0].data).tolist()
            seen[f"{step}/{name}/global"] = np.asarray(multihost_utils.process_allgather(arr, tiled=True)).tolist()
    resumed = JaxBatches(source, seed=%(seed)d, batch_size=%(b)d, block_size=%(bs)d, stop=%(steps)d)
    resumed.load_state_dict(state)
    first = next(resumed)
    seen["resumed"] = np.asarray(first["input_ids"].addressable_shards[0].data).tolist()
    seen["sum"] = int(jax.jit(lambda a: a.sum())(first["input_ids"]))
    json.dump(seen, open(out, "w"))
    jax.distributed.shutdown()
""") % {"seed": SEED, "b": B, "bs": BS, "steps": STEPS}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(120)
def test_two_jax_processes_make_the_global_batches(tmp_path) -> None:
    pytest.importorskip("jax")
    data = write_synthetic_dataset(str(tmp_path / "data"), train_shards=2, records_per_shard=40, eval_records=0)
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    port = str(_free_port())
    outs = [str(tmp_path / f"host{p}.json") for p in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", HOST, data, outs[p], port, str(p)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for p in range(2)]
    for p in procs:
        out, _ = p.communicate(timeout=100)
        assert p.returncode == 0, out[-3000:]
    source = open_source(data)
    whole = NumpyBatches(source, seed=SEED, batch_size=B, block_size=BS)
    hosts = [json.load(open(o)) for o in outs]
    for step in range(STEPS):
        want = whole.batch_at(step)
        for p, seen in enumerate(hosts):
            share = NumpyBatches(source, seed=SEED, batch_size=B, block_size=BS, world_size=2, rank=p).batch_at(step)
            for name in want:
                assert np.array_equal(np.asarray(seen[f"{step}/{name}/global"], want[name].dtype), want[name])
                assert np.array_equal(np.asarray(seen[f"{step}/{name}/local"], want[name].dtype), share[name])
    for p, seen in enumerate(hosts):
        assert seen["resumed"] == whole.batch_at(2)["input_ids"][p * B // 2:(p + 1) * B // 2].tolist()
        assert seen["sum"] == int(whole.batch_at(2)["input_ids"].sum())


ONE_HOST = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    x64, data, out = sys.argv[1] == "x64", sys.argv[2], sys.argv[3]
    jax.config.update("jax_enable_x64", x64)
    from bert_datagen.contract.loading.jax_hosts import JaxBatches, join_words
    from bert_datagen.contract.loading.source import open_source

    batches = JaxBatches(open_source(data), seed=%(seed)d, batch_size=%(b)d, block_size=%(bs)d, stop=2)
    seen = {}
    for step, batch in enumerate(batches):
        key = batch["instance_key"]
        seen[f"{step}/dtype"], seen[f"{step}/shape"] = str(key.dtype), list(key.shape)
        host = np.asarray(key)
        seen[f"{step}/key"] = (host if x64 else join_words(host)).tolist()
    # A packed row's slots: several keys a row, the same layout.
    slots = np.array([[1138304306401794618, -1, 0], [-(2**63), 2**63 - 1, 7]] * (%(b)d // 2), np.int64)
    placed = np.asarray(batches.global_batch({"instance_key": slots})["instance_key"])
    seen["slots"] = (placed if x64 else join_words(placed)).tolist()
    seen["slots_shape"] = list(placed.shape)
    try:
        batches.global_batch({"weights": np.zeros((%(b)d, 1), np.float64)})
        seen["float64"] = "accepted"
    except TypeError as e:
        seen["float64"] = str(e)
    json.dump(seen, open(out, "w"))
""") % {"seed": SEED, "b": B, "bs": BS}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("x64", [False, True])
def test_64_bit_instance_keys_are_never_narrowed(tmp_path, x64: bool) -> None:
    """Issue #43 point 4: without x64, JAX cast the int64 instance_key to int32 silently
    (1138304306401794618 -> 1432377914). Without x64 it comes as uint32 words [low, high] that
    join_words makes the int64 again, every bit; with x64 as int64; a float64 is refused by name."""
    pytest.importorskip("jax")
    data = write_synthetic_dataset(str(tmp_path / "data"), train_shards=2, records_per_shard=40, eval_records=0,
                                   masking="dynamic")
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    out = str(tmp_path / "seen.json")
    done = subprocess.run([sys.executable, "-c", ONE_HOST, "x64" if x64 else "x32", data, out], env=env,
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.load(open(out))
    whole = NumpyBatches(open_source(data), seed=SEED, batch_size=B, block_size=BS)
    for step in range(2):
        want = whole.batch_at(step)["instance_key"]
        assert (np.abs(want) >= 2**31).any()  # keys that int32 cannot hold: the test can tell
        assert seen[f"{step}/key"] == want.tolist()
        assert seen[f"{step}/dtype"] == ("int64" if x64 else "uint32")
        assert seen[f"{step}/shape"] == ([B, 1] if x64 else [B, 1, 2])
    assert seen["slots"] == [[1138304306401794618, -1, 0], [-(2**63), 2**63 - 1, 7]] * (B // 2)
    assert seen["slots_shape"] == ([B, 3] if x64 else [B, 3, 2])
    if x64:
        assert seen["float64"] == "accepted"
    else:
        assert "'weights'" in seen["float64"] and "float64" in seen["float64"] and "x64" in seen["float64"]



BAD_ARGUMENTS = textwrap.dedent("""
    import sys
    from bert_datagen.contract.loading.jax_hosts import JaxBatches
    from bert_datagen.contract.loading.source import open_source

    source = open_source(sys.argv[1])
    for kw in ({"batch_size": 0}, {"batch_size": 8, "prefetch": "no"}, {"batch_size": 8, "prefetch": True},
               {"batch_size": 8, "seed": -1}):
        kw.setdefault("seed", 1)
        try:
            JaxBatches(source, **kw)
            print("accepted", kw)
        except ValueError as e:
            print(getattr(e, "argument", None), "|", e)
""")


@pytest.mark.timeout(120)
def test_bad_arguments_are_named_before_any_work(tmp_path) -> None:
    """Issue #43 point 8: JaxBatches(batch_size=0) failed with "min() arg is an empty sequence"."""
    pytest.importorskip("jax")
    data = write_synthetic_dataset(str(tmp_path / "data"), train_shards=1, records_per_shard=20, eval_records=0)
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    done = subprocess.run([sys.executable, "-c", BAD_ARGUMENTS, data], env=env, capture_output=True, text=True,
                          timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["batch_size", "prefetch", "prefetch", "seed"], lines
    assert "batch_size 0 is not in [1, " in lines[0] and "must be an integer, got 'no'" in lines[1], lines
