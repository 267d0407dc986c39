"""Reading needs neither Beam nor TensorFlow (nor the tokenizer's Rust library, nor the sentence
splitter): `verify`, `inspect`, `stats`, `diff`, `batches` and the NumPy loader run in a process where
importing any of them fails, on a local dataset and on one in a bucket (docs/buckets.md's reader
install is exactly what these commands import)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.servers import upload_tree

REPO = Path(__file__).resolve().parents[2]
GENERATION_ONLY = ("apache_beam", "tensorflow", "keras", "tokenizers", "nupunkt", "torch", "jax", "dask")

SCRIPT = f"""
import sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {GENERATION_ONLY!r}:
            raise ImportError(f"blocked for this test: {{name}}")
        return None
sys.meta_path.insert(0, Blocked())
from bert_datagen.pipelines.cli import main
from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.source import open_source
target, other = sys.argv[1], sys.argv[2]
batch = NumpyBatches(open_source(target), seed=1, batch_size=4).batch_at(0)
print("loader", sorted(batch))
for args in (["verify", target, "--workers", "1"], ["inspect", target, "-n", "1"], ["stats", target],
             ["diff", target, other], ["batches", target, "--batch-size", "2", "--seed", "1", "--step", "0"]):
    try:
        main(args, standalone_mode=False)
    except SystemExit as e:
        if e.code:
            raise
    print("ran", args[0])
print("loaded:", sorted(m for m in sys.modules if m.split(".")[0] in {GENERATION_ONLY!r}))
"""


def read_without_generation(target: str, other: str) -> str:
    done = subprocess.run([sys.executable, "-c", SCRIPT, target, other], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO.parent) + os.pathsep +
                                            os.environ.get("PYTHONPATH", "")})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_reading_commands_and_the_loader_run_without_beam_or_tensorflow(tmp_path, bucket) -> None:
    from benchmarks.bench_verify import make_dataset

    local = str(tmp_path / "ds")
    make_dataset(local, seed=1, records=40, shards=2, eval_records=8, max_seq_length=32, max_predictions=5)
    remote = f"{bucket}/ds"
    upload_tree(Path(local), remote)
    for target, other in ((local, remote), (remote, local)):
        out = read_without_generation(target, other)
        assert "loader ['input_ids'" in out and out.count("ran ") == 5 and "loaded: []" in out, out
