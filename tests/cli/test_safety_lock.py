"""Two commands never write the same output at once (`bert_datagen.cli.lock`): the second is refused with one
line naming the path and the holder, before it changes anything; a holder that dies (kill -9)
blocks nobody; a file at the lock path that is not ours is never touched; object stores take no
lock. The holder is a real second process (flock locks belong to an open file description)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bert_datagen.cli import lock
from bert_datagen.pipelines.cli import main
from tests.support.lock_holder import Holder
from tests.support.pipeline_corpus import make_documents, tree_snapshot, write_text_files, write_vocab
from tests.support.taskdata_corpus import write_pair_tsv

REPO = Path(__file__).resolve().parent.parent.parent


@pytest.fixture
def holders():
    started: list[Holder] = []

    def start(output, with_children: bool = False) -> Holder:
        started.append(Holder(output, with_children))
        return started[-1]

    yield start
    for holder in started:
        holder.stop()


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, result.output


@pytest.fixture
def corpus(tmp_path) -> dict[str, Path]:
    write_text_files(tmp_path / "in", make_documents(20, seed=4), n_files=2)
    return {"root": tmp_path, "inputs": tmp_path / "in", "vocab": write_vocab(tmp_path / "vocab.txt")}


def run_args(corpus, out: Path | str, *extra: str) -> list[str]:
    return ["run", "--input", str(corpus["inputs"] / "*.txt"), "--vocab", str(corpus["vocab"]), "--output", str(out),
            "--dupe-factor", "1", "--max-seq-length", "32", "--max-predictions-per-seq", "5", "--quiet", *extra]


def open_files(pid: int) -> list[str]:
    found: list[str] = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:  # the process has ended
        return found
    for fd in fds:
        try:
            found.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            pass
    return found


def lock_files(root: Path) -> list[str]:
    return sorted(p for p in tree_snapshot(root) if Path(p).name.startswith(lock.INSIDE_LOCK_NAME))


# ---------------------------------------------------------------- the lock itself


def test_a_second_lock_on_the_same_output_is_refused_however_the_path_is_spelled(tmp_path) -> None:
    out = tmp_path / "data" / "ds"
    (tmp_path / "alias").symlink_to(tmp_path / "data")
    with lock.lock_output(str(out)) as held:
        assert held.held and held.path == str(tmp_path / "data" / f"{lock.LOCK_PREFIX}ds")
        assert not out.exists()  # the lock exists before its output
        for spelling in (str(out), f"{out}/", str(tmp_path / "data" / "." / "ds"), str(tmp_path / "alias" / "ds")):
            with pytest.raises(lock.OutputLockError) as refused:
                lock.lock_output(spelling, "--out")
            message = str(refused.value)
            assert message.startswith(f"{spelling}: is being written by another command: pid {os.getpid()}")
            assert held.path in message and "choose another --out" in message
    assert not os.path.lexists(held.path)  # released and removed: outputs collect no lock files
    lock.lock_output(str(out)).release()


def test_directories_made_for_the_lock_are_removed_again_while_empty(tmp_path) -> None:
    with lock.lock_output(str(tmp_path / "a" / "b" / "ds")):
        assert (tmp_path / "a" / "b").is_dir()
    assert not (tmp_path / "a").exists()
    with lock.lock_output(str(tmp_path / "a" / "b" / "ds")):
        (tmp_path / "a" / "b" / "ds").mkdir()  # the command wrote its output there: they stay
    assert (tmp_path / "a" / "b" / "ds").is_dir() and sorted(os.listdir(tmp_path / "a" / "b")) == ["ds"]


def test_the_holder_is_named_and_a_stale_lock_file_is_taken_over(tmp_path, holders) -> None:
    out = tmp_path / "ds"
    holder = holders(out)
    with pytest.raises(lock.OutputLockError, match=rf"pid {holder.proc.pid} on .*: python -c"):
        lock.lock_output(str(out))
    holder.kill()  # kill -9: the lock file stays, the kernel released the lock
    path = lock.lock_path_for(str(out))
    assert os.path.exists(path)
    with lock.lock_output(str(out)) as again:
        assert f'"pid": {os.getpid()}' in Path(path).read_text()
    assert not again.held and not os.path.exists(path)
    Path(path).write_bytes(b"")  # killed between creating and filling it: ours, taken over
    lock.lock_output(str(out)).release()
    assert not os.path.exists(path)


def test_worker_processes_do_not_keep_the_lock(tmp_path, holders) -> None:
    """An exec'd child (as Beam's multi-process workers are) never gets the descriptor; a plain fork
    child closes its copy: once the holder dies, the lock is free while its children live on."""
    out = tmp_path / "ds"
    holder = holders(out, with_children=True)
    path = lock.lock_path_for(str(out))
    for child in holder.children:  # a fork child closes it right after the fork, maybe after "held"
        deadline = time.monotonic() + 10
        while path in open_files(child) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert path not in open_files(child), child
    holder.kill()
    assert all(os.path.exists(f"/proc/{child}") for child in holder.children)
    lock.lock_output(str(out)).release()


@pytest.mark.parametrize("kind", ["file", "directory", "symlink"])
def test_something_not_ours_at_the_lock_path_is_refused_and_left_alone(tmp_path, kind: str) -> None:
    out = tmp_path / "ds"
    path = Path(lock.lock_path_for(str(out)))
    if kind == "file":
        path.write_text("someone's notes\n")
    elif kind == "directory":
        path.mkdir()
        (path / "x").write_text("x")
    else:
        (tmp_path / "target").write_text("target\n")
        path.symlink_to(tmp_path / "target")
    before = tree_snapshot(tmp_path)
    stat_before = os.lstat(path)
    with pytest.raises(lock.OutputLockError, match="is not a bert-datagen lock file"):
        lock.lock_output(str(out))
    assert tree_snapshot(tmp_path) == before and os.lstat(path).st_mtime_ns == stat_before.st_mtime_ns


def test_an_unwritable_parent_puts_the_lock_inside_an_existing_directory(tmp_path, monkeypatch) -> None:
    parent, out = tmp_path / "mount", tmp_path / "mount" / "ds"
    out.mkdir(parents=True)
    real_open = os.open

    def read_only_parent(path, flags, *args, **kwargs):  # as a read-only mount (root ignores chmod)
        if os.path.dirname(path) == str(parent) and flags & os.O_CREAT:
            raise PermissionError(errno.EROFS, os.strerror(errno.EROFS), path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(lock.os, "open", read_only_parent)
    with lock.lock_output(str(out), inside_ok=True) as held:
        assert held.path == str(out / lock.INSIDE_LOCK_NAME)
        with pytest.raises(lock.OutputLockError, match="is being written"):
            lock.lock_output(str(out), inside_ok=True)
    assert not (out / lock.INSIDE_LOCK_NAME).exists()
    with pytest.raises(lock.OutputLockError, match="cannot create its lock file .*Read-only"):
        lock.lock_output(str(out), inside_ok=False)  # an output replaced whole: never inside
    assert sorted(p.name for p in parent.iterdir()) == ["ds"] and not list(out.iterdir())


def test_object_store_paths_take_no_lock(monkeypatch) -> None:
    def no_lock(*args):
        raise AssertionError("an object-store path must take no lock")

    monkeypatch.setattr(lock, "_acquire", no_lock)
    assert lock.lock_path_for("gs://bucket/ds") is None
    with lock.lock_output("gs://bucket/ds") as held:
        assert not held.held


def test_an_object_store_run_takes_no_lock(corpus, monkeypatch) -> None:
    from tests.support.deleting_store import PREFIX, ROOT, DeletingObjectStore  # noqa: F401 - registers the store

    ROOT["dir"] = str(corpus["root"] / "objects")
    os.makedirs(ROOT["dir"])
    monkeypatch.chdir(corpus["root"])

    def no_lock(*args):
        raise AssertionError("an object-store path must take no lock")

    monkeypatch.setattr(lock, "_acquire", no_lock)
    code, output = cli(*run_args(corpus, f"{PREFIX}bucket/ds", "--num-shards", "1"))
    assert code == 0, output
    assert (corpus["root"] / "objects" / "bucket" / "ds" / "manifest.json").is_file()
    assert not lock_files(corpus["root"])


# ---------------------------------------------------------------- commands


def test_a_second_run_into_the_same_dir_is_refused_and_the_first_ones_work_is_intact(corpus, holders) -> None:
    out = corpus["root"] / "ds"
    assert cli(*run_args(corpus, out))[0] == 0
    # What a run in progress has in DIR: its staging directory, which a second run's recovery
    # would delete as a killed run's leftovers.
    staging = out / ".bert-datagen-staging-0123456789abcdef0123456789abcdef" / "work"
    staging.mkdir(parents=True)
    (staging / "summary.json").write_text("{}")
    holder = holders(out)
    before = tree_snapshot(corpus["root"])
    result = subprocess.run([sys.executable, "-m", "bert_datagen.pipelines.cli", *run_args(corpus, out, "--overwrite")],
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"Error: {out}: is being written by another command: pid {holder.proc.pid}")
    assert "Traceback" not in result.stderr
    assert tree_snapshot(corpus["root"]) == before
    holder.kill()  # the holder dies: the next run recovers DIR and replaces the dataset
    code, output = cli(*run_args(corpus, out, "--overwrite", "--num-shards", "2"))
    assert code == 0, output
    assert not staging.exists() and sorted(p.name for p in (out / "train").iterdir()) == [
        "part-00000-of-00002.tfrecord", "part-00000-of-00002.tfrecord.index",
        "part-00000-of-00002.tfrecord.index.blocks",
        "part-00001-of-00002.tfrecord", "part-00001-of-00002.tfrecord.index",
        "part-00001-of-00002.tfrecord.index.blocks"]
    assert not lock_files(corpus["root"])
    assert cli("verify", str(out))[0] == 0


def test_a_foreign_file_at_the_lock_path_stops_the_run_before_any_work(corpus) -> None:
    out = corpus["root"] / "ds"
    foreign = corpus["root"] / f"{lock.LOCK_PREFIX}ds"
    foreign.write_text("not ours\n")
    before = tree_snapshot(corpus["root"])
    code, output = cli(*run_args(corpus, out))
    assert code == 1 and str(foreign) in output and "is not a bert-datagen lock file" in output, output
    assert tree_snapshot(corpus["root"]) == before and not out.exists()


def test_task_vocab_and_stats_plot_outputs_are_locked(corpus, holders) -> None:
    vocab_out = corpus["root"] / "new-vocab.txt"
    vocab_out.write_text("an earlier vocab\n")
    task_out = corpus["root"] / "task"
    plot = corpus["root"] / "hist.png"
    train = write_pair_tsv(corpus["root"] / "train.tsv", 20, 3)
    for target in (vocab_out, task_out, plot):
        holders(target)
    before = tree_snapshot(corpus["root"])
    commands = {
        vocab_out: ["vocab", "--input", str(corpus["inputs"] / "*.txt"), "--output", str(vocab_out),
                    "--vocab-size", "200", "--overwrite"],
        task_out: ["task", "--task", "glue/rte", "--split", f"train={train}", "--vocab", str(corpus["vocab"]),
                   "--output", str(task_out), "--quiet"],
        plot: ["stats", str(corpus["root"]), "--plot", str(plot)],
    }
    for target, args in commands.items():
        code, output = cli(*args)
        assert code == 1 and f"{target}: is being written by another command" in output, (args[0], output)
    assert tree_snapshot(corpus["root"]) == before


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            children = [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except OSError:
            continue
        for child in children:
            found += [child, *_descendants(child)]
    return found


@pytest.mark.integration
def test_two_real_runs_contend_and_beam_workers_never_hold_the_lock(tmp_path) -> None:
    """A real run with two Beam worker processes holds DIR's lock; a second run started while its
    workers are busy is refused; the workers do not have the lock file open; the first run's dataset
    is complete and the lock file is gone when it ends."""
    write_text_files(tmp_path / "in", make_documents(300, seed=9), n_files=3)
    corpus = {"root": tmp_path, "inputs": tmp_path / "in", "vocab": write_vocab(tmp_path / "vocab.txt")}
    out = tmp_path / "ds"
    first = subprocess.Popen([sys.executable, "-m", "bert_datagen.pipelines.cli", *run_args(corpus, out, "--dupe-factor", "20"),
                              "--direct_num_workers=2", "--direct_running_mode=multi_processing"],
                             env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not list(out.glob(".bert-datagen-staging-*/work/parts/*")) and time.monotonic() < deadline:
            assert first.poll() is None, first.communicate()
            time.sleep(0.01)
        workers = _descendants(first.pid)
        path = lock.lock_path_for(str(out))
        assert workers and path in open_files(first.pid)
        assert not [w for w in workers if path in open_files(w)]
        # The first run's driver is paused while the second one tries, so that the contention does
        # not depend on how fast this machine is; its workers wait for it meanwhile.
        os.kill(first.pid, signal.SIGSTOP)
        try:
            assert first.poll() is None
            code, output = cli(*run_args(corpus, out, "--overwrite"))
        finally:
            os.kill(first.pid, signal.SIGCONT)
        assert code == 1 and f"{out}: is being written by another command: pid {first.pid}" in output, output
        _, stderr = first.communicate(timeout=120)
        assert first.returncode == 0, stderr
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert cli("verify", str(out))[0] == 0
    assert not lock_files(tmp_path)
