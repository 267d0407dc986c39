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
