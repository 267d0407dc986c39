"""TensorFlow's checkpoint format without TensorFlow (`trainer/interop/tf_bundle.py`): our writer gives
SaveV2's bytes, TensorFlow reads ours, we read TensorFlow's (V1 Saver, object-based, sharded), corruption
is named, the TF1 interop runs with TensorFlow's import blocked, and checkpoints and exports work on
data in buckets without contacting anything but the configured endpoint."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from click.testing import CliRunner  # noqa: E402

from bert_datagen.trainer.errors import CheckpointError, CheckpointFormatError  # noqa: E402
from bert_datagen.trainer.interop import tf_bundle  # noqa: E402
from bert_datagen.trainer.interop.tf1 import (  # noqa: E402
    checkpoint_step,
    read_bert_config,
    read_tf1_checkpoint,
    resolve_tf1_prefix,
    write_tf1_checkpoint,
)
from bert_datagen.trainer.interop.tf_bundle import (  # noqa: E402
    DTYPES,
    BundleError,
    BundleReader,
    read_bundle,
    write_bundle,
)
from bert_datagen.trainer.model.weights import expected_tf1_shapes  # noqa: E402
from tests.support.interop_names import write_with_v1_saver  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TINY = {"hidden_size": 8, "intermediate_size": 12, "max_position_embeddings": 16, "num_attention_heads": 2,
        "num_hidden_layers": 2, "type_vocab_size": 2, "vocab_size": 14}
DATA = ".data-00000-of-00001"


def savev2(prefix, arrays: dict[str, np.ndarray]) -> str:
    names = list(arrays)
    tensors = [tf.cast(arrays[n].astype(np.float32), tf.bfloat16) if arrays[n].dtype == ml_dtypes.bfloat16
               else tf.constant(arrays[n]) for n in names]
    tf.raw_ops.SaveV2(prefix=str(prefix), tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors)
    return str(prefix)


def files(prefix) -> tuple[bytes, bytes]:
    return Path(f"{prefix}.index").read_bytes(), Path(f"{prefix}{DATA}").read_bytes()


def bert_like(seed: int = 0) -> dict[str, np.ndarray]:
    """A release's kinds of tensor, not in name order: weights and Adam slots in float32, a float16 and
    a bfloat16 copy, int32 and int64 scalars and vectors, an empty tensor, a bool."""
    gen = np.random.default_rng(seed)
    weights = {n: gen.standard_normal(s).astype(np.float32) for n, s in expected_tf1_shapes(TINY).items()}
    arrays = dict(reversed(list(weights.items())))
    arrays["bert/pooler/dense/kernel/adam_m"] = gen.standard_normal((8, 8)).astype(np.float32)
    arrays["bert/pooler/dense/kernel/adam_v"] = gen.random((8, 8)).astype(np.float32)
    arrays["global_step"] = np.array(1_000_000, np.int64)
    arrays["fp16/bert/embeddings/word_embeddings"] = weights["bert/embeddings/word_embeddings"].astype(np.float16)
    arrays["bf16/bert/embeddings/word_embeddings"] = weights["bert/embeddings/word_embeddings"].astype(ml_dtypes.bfloat16)
    arrays["loss_scale/good_steps"] = np.array(-3, np.int32)
    arrays["input_ids_sample"] = gen.integers(-2**40, 2**40, (3, 5)).astype(np.int64)
    arrays["counts"] = np.arange(7, dtype=np.int32)
    arrays["empty"] = np.zeros((0, 4), np.float32)
    arrays["is_finite"] = np.array(True)
    return arrays


# --- the writer gives SaveV2's bytes ------------------------------------------------------------


def test_writer_gives_the_bytes_savev2_gives(tmp_path):
    arrays = bert_like()
    ours = write_bundle(tmp_path / "ours" / "model.ckpt", arrays)  # (its directory made, as SaveV2 does)
    assert files(ours) == files(savev2(tmp_path / "tf" / "model.ckpt", arrays))


@pytest.mark.parametrize("code", sorted(DTYPES))
def test_every_numeric_dtype_is_written_as_savev2_writes_it(tmp_path, code):
    dtype = DTYPES[code]
    values = np.random.default_rng(code).standard_normal((3, 5)) * 50
    array = (values + 1j * values).astype(dtype) if dtype.kind == "c" else values.astype(dtype)
    arrays = {"x": array, "scalar": array[0, 0], "row": array[1]}
    assert files(write_bundle(tmp_path / "ours", arrays)) == files(savev2(tmp_path / "tf", arrays))
    back = read_bundle(tmp_path / "tf")
    assert all(back[n].dtype == dtype and back[n].tobytes() == np.asarray(a).tobytes() for n, a in arrays.items())


def test_an_index_of_several_blocks_and_an_outsized_name_are_written_as_savev2_writes_them(tmp_path):
    """7,000 names fill three 256 KiB index blocks (shortened separators between them); a name of
    600 KB gets a block of its own, as TensorFlow's table builder does."""
    many = {f"{i:06d}/" + "x" * 80: np.array(i, np.int32) for i in range(7000)}
    assert files(write_bundle(tmp_path / "many", many)) == files(savev2(tmp_path / "many_tf", many))
    assert read_bundle(tmp_path / "many_tf")["006999/" + "x" * 80] == 6999
    huge = {"a": np.zeros(2, np.float32), "b" * 600_000: np.ones(1, np.float32), "c": np.ones(3, np.float32)}
    assert files(write_bundle(tmp_path / "huge", huge)) == files(savev2(tmp_path / "huge_tf", huge))


def test_write_tf1_checkpoint_gives_savev2_bytes_in_name_order_and_tensorflow_reads_it(tmp_path):
    arrays = {n: a for n, a in bert_like().items() if a.dtype == np.float32}
    prefix = write_tf1_checkpoint(tmp_path / "ours" / "bert_model.ckpt", arrays)
    assert files(prefix) == files(savev2(tmp_path / "tf", {n: arrays[n] for n in sorted(arrays)}))
    assert tf.train.latest_checkpoint(str(tmp_path / "ours")) == prefix
    reader = tf.train.load_checkpoint(prefix)
    for name, array in arrays.items():
        got = reader.get_tensor(name)
        assert got.dtype == array.dtype and got.shape == array.shape and got.tobytes() == array.tobytes(), name


def test_tensorflow_reads_every_dtype_we_write(tmp_path):
    arrays = bert_like(seed=3)
    reader = tf.train.load_checkpoint(write_bundle(tmp_path / "ckpt", arrays))
    for name, array in arrays.items():
        got = np.asarray(reader.get_tensor(name))
        assert got.dtype == array.dtype and got.shape == array.shape and got.tobytes() == array.tobytes(), name


def test_a_tensor_that_cannot_be_written_is_refused_before_any_file(tmp_path):
    for bad in ({"s": np.array(["text"])}, {"o": np.array([object()])}, {"": np.zeros(1, np.float32)}):
        with pytest.raises(BundleError, match="ckpt: tensor"):
            write_bundle(tmp_path / "ckpt", {"ok": np.zeros(2, np.float32), **bad})
    assert list(tmp_path.iterdir()) == []


# --- the reader reads TensorFlow's --------------------------------------------------------------


def test_reads_a_v1_saver_checkpoint_and_its_global_step(tmp_path):
    weights = {n: a for n, a in bert_like(seed=1).items() if n in expected_tf1_shapes(TINY)}
    write_with_v1_saver(tmp_path / "model.ckpt-7", weights, {"global_step": np.array(7, np.int64),
                                                              "bert/pooler/dense/kernel/adam_m": np.ones((8, 8), np.float32)})
    arrays, report = read_tf1_checkpoint(tmp_path, expected_tf1_shapes(TINY))
    assert report.source == str(tmp_path / "model.ckpt-7")  # found through TensorFlow's `checkpoint` file
    assert all(arrays[n].tobytes() == a.tobytes() for n, a in weights.items())
    assert checkpoint_step(report) == 7
    assert read_bundle(tmp_path / "model.ckpt-7", ["bert/pooler/dense/kernel/adam_m"])[
        "bert/pooler/dense/kernel/adam_m"].tobytes() == np.ones((8, 8), np.float32).tobytes()


def test_reads_a_bfloat16_release_as_float32_weights(tmp_path):
    weights = {n: a.astype(ml_dtypes.bfloat16) for n, a in bert_like(seed=2).items() if n in expected_tf1_shapes(TINY)}
    savev2(tmp_path / "bert_model.ckpt", weights)
    arrays, _ = read_tf1_checkpoint(tmp_path / "bert_model.ckpt", expected_tf1_shapes(TINY))
    assert all(arrays[n].dtype == np.float32 and np.array_equal(arrays[n], a.astype(np.float32))
               for n, a in weights.items())


def test_reads_object_based_and_sharded_checkpoints_and_refuses_what_it_cannot_read_by_name(tmp_path):
    a = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3))
    b = tf.Variable(np.array([5, -6, 7], np.int64))
    policy = tf.train.experimental.MaxShardSizePolicy(max_shard_size=30)  # one tensor per data file
    prefix = tf.train.Checkpoint(a=a, b=b).write(str(tmp_path / "obj" / "ckpt"), options=tf.train.CheckpointOptions(
        experimental_sharding_callback=policy))
    reader = BundleReader(prefix)
    shards = {reader.entries[f"{v}/.ATTRIBUTES/VARIABLE_VALUE"].shard for v in "ab"}
    assert reader.num_shards > 1 and len(shards) == 2
    back = read_bundle(prefix, ["a/.ATTRIBUTES/VARIABLE_VALUE", "b/.ATTRIBUTES/VARIABLE_VALUE"])
    assert back["a/.ATTRIBUTES/VARIABLE_VALUE"].tobytes() == a.numpy().tobytes()
    assert back["b/.ATTRIBUTES/VARIABLE_VALUE"].tobytes() == b.numpy().tobytes()
    with pytest.raises(BundleError, match="_CHECKPOINTABLE_OBJECT_GRAPH is a string tensor"):
        reader.tensor("_CHECKPOINTABLE_OBJECT_GRAPH")
    tf.raw_ops.SaveV2(prefix=str(tmp_path / "part"), tensor_names=["part", "whole"],
                      shape_and_slices=["4 3 0,2:-", ""], tensors=[np.ones((2, 3), np.float32), np.zeros(2, np.float32)])
    reader = BundleReader(tmp_path / "part")
    assert reader.shapes() == {"part": (4, 3), "whole": (2,)}  # as tf.train.list_variables lists them
    with pytest.raises(BundleError, match="part is a partitioned .sliced. variable"):
        reader.tensor("part")
    assert reader.tensor("whole").tolist() == [0.0, 0.0]


# --- corruption is named ------------------------------------------------------------------------


def _damaged(tmp_path, name: str, damage) -> str:
    prefix = savev2(tmp_path / name / "bert_model.ckpt", {n: a for n, a in bert_like().items() if a.dtype == np.float32})
    damage(Path(prefix))
    return prefix


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def _cut(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


@pytest.mark.parametrize("case, file, reason", [
    ("data_bit", DATA, "CRC32C mismatch"),
    ("data_cut", DATA, "truncated"),
    ("data_gone", DATA, "data file missing"),
    ("index_bit", ".index", "CRC mismatch"),
    ("index_cut", ".index", "truncated"),
    ("index_short", ".index", "truncated"),
    ("index_gone", ".index", "no such checkpoint index"),
])
def test_corruption_is_an_error_naming_the_file(tmp_path, case, file, reason):
    damage = {
        "data_bit": lambda p: _flip(Path(f"{p}{DATA}"), 3),  # (the first tensor's bytes: a weight)
        "data_cut": lambda p: _cut(Path(f"{p}{DATA}"), os.path.getsize(f"{p}{DATA}") // 2),
        "data_gone": lambda p: os.remove(f"{p}{DATA}"),
        "index_bit": lambda p: _flip(Path(f"{p}.index"), 20),
        "index_cut": lambda p: _cut(Path(f"{p}.index"), os.path.getsize(f"{p}.index") - 1),
        "index_short": lambda p: _cut(Path(f"{p}.index"), 30),
        "index_gone": lambda p: os.remove(f"{p}.index"),
    }[case]
    prefix = _damaged(tmp_path, case, damage)
    with pytest.raises(BundleError, match=reason) as err:
        read_bundle(prefix)
    assert str(err.value).startswith(prefix + (file if case != "index_gone" else ".index"))
    assert isinstance(err.value, CheckpointError) and isinstance(err.value, CheckpointFormatError)
    if case != "index_gone":  # (then there is no checkpoint at all: resolve says so)
        with pytest.raises(BundleError, match=reason):
            read_tf1_checkpoint(prefix, expected_tf1_shapes(TINY))


# --- a failed write names the file of the export ------------------------------------------------


def test_no_space_while_writing_the_data_names_the_file_and_leaves_nothing(tmp_path, monkeypatch):
    """The injected twin of the real full-disk test (tests/trainer/test_interop_cli.py): a write that
    fails with ENOSPC, as a full disk fails it, is one OSError naming the data file, no temp left."""
    class FullDisk:
        def __init__(self, path, mode):
            self.f = open(path, mode)  # noqa: SIM115 - closed in __exit__

        def write(self, data):
            raise OSError(28, os.strerror(28))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(tf_bundle, "open", FullDisk, raising=False)
    with pytest.raises(OSError) as err:
        write_tf1_checkpoint(tmp_path / "bert_model.ckpt", {"w": np.ones(3, np.float32)})
    assert err.value.errno == 28 and err.value.filename == str(tmp_path / "bert_model.ckpt") + DATA
    assert list(tmp_path.iterdir()) == []


# --- no TensorFlow ------------------------------------------------------------------------------

NO_TF = """
import sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tensorflow":
            raise ImportError(f"blocked for this test: {name}")
        return None
sys.meta_path.insert(0, Blocked())
import json
from bert_datagen.trainer.interop.tf1 import (checkpoint_step, read_bert_config, read_tf1_checkpoint,
                                              resolve_tf1_prefix, write_tf1_checkpoint)
from bert_datagen.trainer.interop.tf_bundle import read_bundle
from bert_datagen.trainer.model.weights import expected_tf1_shapes
from bert_datagen.trainer.interop.export import export_tf1
saver_dir, savev2_prefix, out, vocab = sys.argv[1:5]
config = read_bert_config(saver_dir + "/bert_config.json")
arrays, report = read_tf1_checkpoint(saver_dir, expected_tf1_shapes(config))
write_tf1_checkpoint(out + "/bert_model.ckpt", read_bundle(savev2_prefix))
export_tf1(out + "/export", arrays, config, open(vocab, "rb").read())
print(json.dumps({"step": checkpoint_step(report), "prefix": resolve_tf1_prefix(out), "loaded": report.loaded,
                  "sum": float(sum(float(a.astype("float64").sum()) for a in arrays.values())),
                  "tensorflow": sorted(m for m in sys.modules if m.split(".")[0] == "tensorflow")}))
"""


def test_tf1_interop_and_export_read_and_write_with_tensorflow_blocked(tmp_path):
    """In a process where importing TensorFlow fails: a V1 Saver release and its bert_config.json are
    read, a checkpoint written with SaveV2's bytes, and `export_tf1` writes the files, byte for byte,
    that it writes here with TensorFlow loaded."""
    from bert_datagen.trainer.interop.export import export_tf1
    from tests.support.interop_names import VOCAB

    weights = {n: a for n, a in bert_like(seed=4).items() if n in expected_tf1_shapes(TINY)}
    write_with_v1_saver(tmp_path / "release" / "model.ckpt-12", weights, {"global_step": np.array(12, np.int64)})
    (tmp_path / "release" / "bert_config.json").write_text(json.dumps(TINY))
    savev2(tmp_path / "tf" / "bert_model.ckpt", {n: weights[n] for n in sorted(weights)})
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n")
    env = {**os.environ, "KERAS_BACKEND": "jax",
           "PYTHONPATH": str(REPO.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", NO_TF, str(tmp_path / "release"), str(tmp_path / "tf" / "bert_model.ckpt"),
                           str(tmp_path / "out"), str(vocab)], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["tensorflow"] == [] and result["step"] == 12 and result["loaded"] == len(weights)
    assert result["prefix"] == str(tmp_path / "out" / "bert_model.ckpt")
    assert result["sum"] == pytest.approx(sum(float(a.astype(np.float64).sum()) for a in weights.values()), rel=1e-12)
    assert files(tmp_path / "out" / "bert_model.ckpt") == files(tmp_path / "tf" / "bert_model.ckpt")
    export_tf1(tmp_path / "export", weights, read_bert_config(str(tmp_path / "release" / "bert_config.json")),
               vocab.read_bytes())
    exported = {p.name: p.read_bytes() for p in (tmp_path / "export").iterdir()}
    assert {p.name: p.read_bytes() for p in (tmp_path / "out" / "export").iterdir()} == exported
    assert "bert_model.ckpt.index" in exported and "vocab.txt" in exported


# --- buckets ------------------------------------------------------------------------------------


@pytest.fixture
def local_only(monkeypatch):
    """Every address this process looks up or connects to; anything but the local servers refused."""
    seen: list[str] = []
    lookup, connect = socket.getaddrinfo, socket.socket.connect

    def guarded_lookup(host, *args, **kwargs):
        seen.append(str(host))
        if str(host) not in ("127.0.0.1", "localhost", "::1"):
            raise OSError(f"test: no lookups of {host}")
        return lookup(host, *args, **kwargs)

    def guarded_connect(self, address):
        seen.append(str(address[0]) if isinstance(address, tuple) else str(address))
        if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "::1"):
            raise OSError(f"test: no connections to {address}")
        return connect(self, address)

    monkeypatch.setattr(socket, "getaddrinfo", guarded_lookup)
    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    return seen


def test_tf1_checkpoints_and_configs_in_a_bucket(bucket, local_only):
    arrays = {n: a for n, a in bert_like(seed=5).items() if n in expected_tf1_shapes(TINY)}
    prefix = write_tf1_checkpoint(f"{bucket}/release/bert_model.ckpt", arrays)
    from bert_datagen.contract.buckets import BUCKETS

    BUCKETS.write(f"{bucket}/release/bert_config.json", json.dumps(TINY).encode())
    assert resolve_tf1_prefix(f"{bucket}/release") == prefix
    back, report = read_tf1_checkpoint(f"{bucket}/release", expected_tf1_shapes(TINY))
    assert report.source == prefix and all(back[n].tobytes() == a.tobytes() for n, a in arrays.items())
    assert read_bert_config(f"{bucket}/release/bert_config.json")["vocab_size"] == TINY["vocab_size"]
    with pytest.raises(CheckpointFormatError, match=f"{bucket}/nothing: no TF checkpoint here"):
        resolve_tf1_prefix(f"{bucket}/nothing")
    assert set(local_only) <= {"127.0.0.1", "localhost", "::1"}


def test_export_of_a_run_trained_on_bucket_data(bucket, tmp_path, local_only):
    """The vocab comes from the run's dataset in the bucket (no --vocab), through our storage seam
    with the configured endpoint; nothing but the local server is looked up or contacted."""
    from bert_datagen.trainer.cli import main
    from bert_datagen.trainer.pretrain.config import TrainConfig
    from bert_datagen.trainer.pretrain.train import pretrain
    from tests.support.servers import upload_tree
    from tests.support.synthetic import write_synthetic_dataset

    local = write_synthetic_dataset(str(tmp_path / "ds"), seq_len=16, max_pred=3, vocab_size=40, train_shards=1,
                                    records_per_shard=16, eval_records=8, seed=0, masking="dynamic")
    remote = f"{bucket}/ds"  # (dynamic masking: its vocab has the special tokens an export needs)
    upload_tree(Path(local), remote)
    bert = {"vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 32, "max_position_embeddings": 16}
    pretrain(TrainConfig(data=remote, out=str(tmp_path / "run"), bert_config=bert, batch_size=8, steps=1,
                         learning_rate=1e-3, warmup_steps=1, seed=5, log_every=1, eval_batches=1,
                         checkpoint_every=1), log=lambda _: None)
    for fmt, extra in (("tf1", []), ("hf", ["--do-lower-case"])):
        result = CliRunner().invoke(main, ["export", "--run", str(tmp_path / "run"), "--format", fmt,
                                           "--out", str(tmp_path / fmt), *extra])
        assert result.exit_code == 0, result.output
        assert (tmp_path / fmt / "vocab.txt").read_bytes() == (tmp_path / "ds" / "vocab.txt").read_bytes()
    names = dict(tf.train.list_variables(str(tmp_path / "tf1" / "bert_model.ckpt")))
    assert names["bert/embeddings/word_embeddings"] == [40, 16]
    assert local_only and set(local_only) <= {"127.0.0.1", "localhost", "::1"}


@pytest.mark.parametrize("header, entry, reason", [
    (None, {"size": 20}, r"w: 20 bytes for float32\[2, 3\] \(24 expected\)"),
    (None, {"shard": 1}, "w: shard 1 of 1"),
    (b"\x08\x01\x10\x01\x1a\x02\x08\x01", {}, "big-endian"),
    (b"\x08\x01\x1a\x04\x08\x02\x10\x02", {}, "needs a newer reader"),
])
def test_an_index_that_cannot_describe_its_data_is_refused(tmp_path, header, entry, reason):
    """Well-formed tables (their CRCs right) whose entries are wrong: each refused, naming the index."""
    from bert_datagen.trainer.interop.sstable import table_bytes

    fields = {"offset": 0, "size": 24, "shard": 0, **entry}
    described = tf_bundle.TensorEntry("w", 1, (2, 3), crc32c=1, **fields)
    (tmp_path / "c.index").write_bytes(table_bytes([(b"", header or tf_bundle.header_bytes()),
                                                    (b"w", tf_bundle.entry_bytes(described))]))
    (tmp_path / f"c{DATA}").write_bytes(bytes(24))
    with pytest.raises(BundleError, match=reason) as err:
        BundleReader(tmp_path / "c")
    assert str(err.value).startswith(f"{tmp_path / 'c'}.index: ")
