"""No command deletes or replaces a path it did not create; `run --overwrite`
replaces a dataset only once the new one is complete. Each destructive case compares a snapshot of
the whole tree (paths + sha256) before and after."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from bert_datagen.pipelines.beam import fsio, outputs
from bert_datagen.pipelines.cli import main
from tests.support.pipeline_corpus import make_documents, tree_snapshot, write_text_files, write_vocab


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.fixture
def corpus(tmp_path) -> dict[str, Path]:
    write_text_files(tmp_path / "in", make_documents(30, seed=3), n_files=2)
    return {"root": tmp_path, "inputs": tmp_path / "in", "vocab": write_vocab(tmp_path / "vocab.txt")}


def run_args(corpus, out: Path, *extra: str, vocab: Path | None = None) -> list[str]:
    return ["run", "--input", str(corpus["inputs"] / "*.txt"), "--vocab", str(vocab or corpus["vocab"]),
            "--output", str(out), "--dupe-factor", "2", "--max-seq-length", "32", "--max-predictions-per-seq", "5",
            "--notnext-pool-size", "20", "--quiet", *extra]


def make_dataset(corpus, out: Path, *extra: str) -> dict[str, str]:
    code, output = cli(*run_args(corpus, out, *extra))
    assert code == 0, output
    return tree_snapshot(out)


def verify_ok(out: Path) -> None:
    code, output = cli("verify", str(out))
    assert code == 0 and output.startswith("OK"), output


# ---------------------------------------------------------------- file outputs


def test_vocab_output_on_an_existing_directory_is_refused(corpus) -> None:
    keep = corpus["root"] / "keep"
    keep.mkdir()
    (keep / "precious.txt").write_text("mine\n")
    before = tree_snapshot(corpus["root"])
    code, output = cli("vocab", "--input", str(corpus["inputs"] / "*.txt"), "--output", str(keep),
                       "--vocab-size", "200")
    assert code == 1 and "is a directory" in output and str(keep) in output, output
    assert tree_snapshot(corpus["root"]) == before


def test_vocab_output_that_is_one_of_its_inputs_is_refused(corpus) -> None:
    target = corpus["inputs"] / "part-000.txt"
    before = tree_snapshot(corpus["root"])
    code, output = cli("vocab", "--input", str(corpus["inputs"] / "*.txt"), "--output", str(target),
                       "--vocab-size", "200")
    assert code == 1 and "is also an input" in output, output
    assert tree_snapshot(corpus["root"]) == before


def _one_error_line(output: str) -> str:
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in output, output
    return lines[0]


@pytest.mark.parametrize("link", [False, True])
def test_vocab_output_never_replaces_an_existing_file_without_overwrite(corpus, link) -> None:
    """A user's thesis became `[PAD]...`: an existing file (or a symlink to one) is replaced only
    with --overwrite (a symlink by a file: what it points to stays as it was)."""
    thesis = corpus["root"] / "thesis.txt"
    thesis.write_text("four years of work\n")
    target = thesis
    if link:
        target = corpus["root"] / "link.txt"
        target.symlink_to(thesis)
    before = tree_snapshot(corpus["root"])
    args = ["vocab", "--input", str(corpus["inputs"] / "*.txt"), "--output", str(target), "--vocab-size", "200"]
    code, output = cli(*args)
    line = _one_error_line(output)
    assert code == 1 and f"--output {target}: already exists; pass --overwrite" in line
    assert tree_snapshot(corpus["root"]) == before and thesis.read_text() == "four years of work\n"
    code, output = cli(*args, "--overwrite")
    assert code == 0, output
    assert target.read_text().startswith("[PAD]\n") and not target.is_symlink()
    assert link == (thesis.read_text() == "four years of work\n")


def test_vocab_output_that_appears_during_training_is_not_replaced(corpus, monkeypatch) -> None:
    import bert_datagen.pipelines.vocab_cli as vocab_cli

    target = corpus["root"] / "v.txt"
    train = vocab_cli.train_vocab

    def train_while_a_user_saves_the_file(*args, **kwargs):
        target.write_text("mine\n")
        return train(*args, **kwargs)

    monkeypatch.setattr(vocab_cli, "train_vocab", train_while_a_user_saves_the_file)
    code, output = cli("vocab", "--input", str(corpus["inputs"] / "*.txt"), "--output", str(target),
                       "--vocab-size", "200")
    assert code == 1 and "already exists; pass --overwrite" in _one_error_line(output)
    assert target.read_text() == "mine\n"


def test_stats_plot_never_replaces_an_existing_file_without_overwrite(corpus) -> None:
    pytest.importorskip("matplotlib")
    out = corpus["root"] / "ds"
    make_dataset(corpus, out)
    plot = corpus["root"] / "figure.png"
    plot.write_bytes(b"my figure")
    before = tree_snapshot(corpus["root"])
    code, output = cli("stats", str(out), "--plot", str(plot))
    assert code == 1 and f"--plot {plot}: already exists; pass --overwrite" in _one_error_line(output)
    assert tree_snapshot(corpus["root"]) == before
    code, output = cli("stats", str(out), "--plot", str(plot), "--overwrite")
    assert code == 0 and plot.read_bytes().startswith(b"\x89PNG"), output
    code, output = cli("stats", str(out), "--overwrite")  # nothing to overwrite: not accepted and ignored
    assert code == 2 and "--overwrite applies to the --plot file" in output, output


@pytest.mark.parametrize("where", ["", "manifest.json", "train/hist.png", "train"])
def test_stats_plot_into_a_dataset_is_refused(corpus, where: str) -> None:
    out = corpus["root"] / "ds"
    make_dataset(corpus, out)
    before = tree_snapshot(corpus["root"])
    plot = out / where if where else out
    code, output = cli("stats", str(out), "--plot", str(plot))
    assert code == 1 and ("is a directory" in output or "is inside the dataset" in output), output
    assert "Traceback" not in output
    assert tree_snapshot(corpus["root"]) == before
    verify_ok(out)


def test_write_atomic_never_replaces_a_directory(tmp_path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_text("x")
    with pytest.raises(IsADirectoryError):
        fsio.write_atomic(str(tmp_path / "d"), b"data")
    assert (tmp_path / "d" / "x").read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["d"]


# ---------------------------------------------------------------- dataset outputs


def test_overwrite_keeps_other_files_and_the_runs_own_vocab_input(corpus) -> None:
    out = corpus["root"] / "ds"
    make_dataset(corpus, out, "--num-shards", "3")
    (out / "notes.txt").write_text("my notes\n")
    (out / "train" / "README-mine.md").write_text("mine\n")
    (out / "corpus").mkdir()
    for path in corpus["inputs"].glob("*.txt"):
        (out / "corpus" / path.name).write_bytes(path.read_bytes())
    before = tree_snapshot(out)
    # The inputs live inside DIR, and --vocab is the old dataset's own vocab copy, which --overwrite
    # replaces: both must survive.
    args = run_args(corpus, out, "--num-shards", "2", "--overwrite", vocab=out / "vocab.txt")
    args[args.index("--input") + 1] = str(out / "corpus" / "*.txt")
    code, output = cli(*args)
    assert code == 0, output
    after = tree_snapshot(out)
    ours = (".tfrecord", ".tfrecord.index", ".tfrecord.index.blocks")
    old_shards = {p for p in before if p.endswith(ours)}
    changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
    new_shards = {p for p in after if p.endswith(ours)}
    assert changed <= old_shards | new_shards | {"manifest.json", "README.md"}
    for kept in ("notes.txt", "train/README-mine.md", "vocab.txt", "corpus/part-000.txt", "corpus/part-001.txt"):
        assert after[kept] == before[kept], kept
    assert sorted(p for p in after if p.endswith(".tfrecord")) == [f"train/part-{i:05d}-of-00002.tfrecord"
                                                                   for i in range(2)]
    assert not [p for p in after if outputs.MARK in p or ".tmp-" in p]


def test_overwrite_refuses_files_that_no_manifest_lists(corpus) -> None:
    out = corpus["root"] / "mine"
    out.mkdir()
    (out / "README.md").write_text("# my project\n")
    (out / "vocab.txt").write_bytes(corpus["vocab"].read_bytes())
    before = tree_snapshot(corpus["root"])
    code, output = cli(*run_args(corpus, out, "--overwrite", vocab=out / "vocab.txt"))
    assert code == 1 and "README.md: exists and is not part of a bert-datagen dataset" in output, output
    assert tree_snapshot(corpus["root"]) == before


def test_existing_dataset_without_overwrite_is_untouched(corpus) -> None:
    out = corpus["root"] / "ds"
    before = make_dataset(corpus, out)
    code, output = cli(*run_args(corpus, out, "--num-shards", "2"))
    assert code == 1 and "--overwrite" in output
    assert tree_snapshot(out) == before


def test_output_that_is_a_file_is_a_clean_error(corpus) -> None:
    target = corpus["root"] / "afile"
    target.write_text("x")
    code, output = cli(*run_args(corpus, target))
    assert code == 1 and "exists and is not a directory" in output and "Traceback" not in output
    assert target.read_text() == "x"


def test_output_on_an_unwritable_place_is_a_clean_error(corpus) -> None:
    code, output = cli(*run_args(corpus, Path("/proc/bert-datagen-test/ds")))
    assert code == 1 and output.startswith("Error: /proc/bert-datagen-test") and "Traceback" not in output, output
    code, output = cli("vocab", "--input", str(corpus["inputs"] / "*.txt"), "--output", "/proc/nope/vocab.txt",
                       "--vocab-size", "200")
    assert code == 1 and "Error: /proc/nope" in output and "Traceback" not in output, output


# ---------------------------------------------------------------- replace on success


def test_failed_overwrite_leaves_the_old_dataset_exactly_as_it_was(corpus) -> None:
    out = corpus["root"] / "ds"
    before = make_dataset(corpus, out, "--eval-fraction", "0.2")
    (corpus["inputs"] / "zz-blob.txt").write_bytes(bytes(range(256)) * 64)  # binary: fails mid-run
    code, output = cli(*run_args(corpus, out, "--overwrite", "--num-shards", "2"))
    assert code == 1 and "zz-blob.txt" in output and "binary" in output, output
    assert tree_snapshot(out) == before
    verify_ok(out)


def test_every_step_of_an_interrupted_swap_rolls_back_to_the_old_dataset(corpus, monkeypatch) -> None:
    """A kill between any two renames of the swap: the next run's recovery gives back the old
    dataset byte for byte (or, past the commit point, keeps the new one) and leaves no mark."""
    out = corpus["root"] / "ds"
    old = make_dataset(corpus, out, "--num-shards", "3", "--eval-fraction", "0.2")
    new_out = corpus["root"] / "new"
    new = make_dataset(corpus, new_out, "--num-shards", "2")
    real_move = outputs._move
    steps = 0
    def dying_after(allowed: int):
        calls = {"n": 0}

        def dying_move(src: str, dst: str) -> None:
            if calls["n"] == allowed:
                raise KeyboardInterrupt  # stands for a SIGKILL between two renames
            calls["n"] += 1
            real_move(src, dst)

        return dying_move

    while True:
        monkeypatch.setattr(outputs, "_move", dying_after(steps))
        ds = outputs.prepare_dataset_output(str(out), overwrite=True)
        outputs.create_staging(ds)
        for path in new_out.rglob("*"):  # a complete new dataset in staging, as the pipeline leaves it
            if path.is_file():
                target = Path(ds.staging) / path.relative_to(new_out)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(path.read_bytes())
        try:
            outputs.commit(ds)
            finished = True
        except KeyboardInterrupt:
            finished = False
        monkeypatch.setattr(outputs, "_move", real_move)
        outputs.recover(str(out))  # what the next run does first
        state = tree_snapshot(out)
        committed = finished or (out / "manifest.json").read_bytes() == (new_out / "manifest.json").read_bytes()
        if committed:
            assert {k: v for k, v in state.items() if k != "eval/"} == new, steps
        else:
            assert state == old, steps
        verify_ok(out)
        if finished:
            break
        if committed:  # past the commit point: put the old one back for the next step
            for path in list(out.rglob("*.tfrecord")):
                path.unlink()
            make_dataset(corpus, out, "--num-shards", "3", "--eval-fraction", "0.2", "--overwrite")
            assert tree_snapshot(out) == old
        steps += 1
    assert steps >= 5


def test_recover_deletes_only_names_carrying_our_marks(tmp_path) -> None:
    out = tmp_path / "ds"
    (out / "train").mkdir(parents=True)
    mine = {".tmp-notours.txt", ".staging-notes", ".bert-datagen-staging-x", "train/.tmp-123-a", "keep.txt"}
    for name in mine:
        (out / name).write_text("user file\n")
    run_id = "0123456789abcdef0123456789abcdef"
    ours = [f".tmp-{run_id}-manifest.json", f".run-summary-{run_id}.json", f"train/.tmp-{run_id}-part.tfrecord"]
    for name in ours:
        (out / name).write_text("ours\n")
    (out / f".bert-datagen-staging-{run_id}" / "train").mkdir(parents=True)
    (out / f".bert-datagen-staging-{run_id}" / "train" / "part-00000-of-00001.tfrecord").write_bytes(b"x")
    (out / f".staging-{run_id}" / "pools").mkdir(parents=True)
    outputs.recover(str(out))
    assert tree_snapshot(out) == {"train/": "", **{n: tree_snapshot(out)[n] for n in mine}}
