"""verify / inspect / stats / diff on task datasets: the task record rules catch each broken invariant."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bert_datagen.contract.fs import LOCAL_FS
from bert_datagen.contract.manifest import manifest_bytes
from bert_datagen.datagen.records import frame_columns
from bert_datagen.datagen.tasks.config import TaskConfig
from bert_datagen.pipelines.cli import main
from bert_datagen.pipelines.tasks.run import generate_task_dataset
from bert_datagen.pipelines.tools.task_datasets import read_split
from tests.support.pipeline_corpus import write_vocab
from tests.support.synthetic import write_index
from tests.support.taskdata_corpus import write_conll, write_pair_tsv, write_squad


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tasktools")
    vocab = str(write_vocab(root / "vocab.txt"))
    made = {}
    for name, config, splits in (
        ("squad", TaskConfig(kind="squad", max_seq_length=48, doc_stride=16, max_query_length=12),
         [f"train={write_squad(root / 'tr.json', 12, 6)}", f"dev={write_squad(root / 'dv.json', 6, 7)}"]),
        ("ner", TaskConfig(kind="conll", max_seq_length=12),
         [f"train={write_conll(root / 'tr.conll', 20, 8)}", f"dev={write_conll(root / 'dv.conll', 8, 9)}"]),
        ("pairs", TaskConfig(kind="tsv", text_a="sentence1", text_b="sentence2", label="label", max_seq_length=24),
         [f"train={write_pair_tsv(root / 'tr.tsv', 30, 3)}", f"dev={write_pair_tsv(root / 'dv.tsv', 10, 4)}"]),
    ):
        generate_task_dataset(config, splits=splits, vocab_path=vocab, output_dir=str(root / name))
        made[name] = root / name
    return made


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _rewrite(out: Path, split: str, edit) -> None:
    """Change the split's records and re-sign them in the manifest: only the record rules can object."""
    from bert_datagen.contract.dataset import open_dataset

    ds = open_dataset(str(out), LOCAL_FS)
    columns, problems = read_split(ds, split)
    assert not problems
    edit(columns)
    blob, _ = frame_columns(columns)
    manifest = json.loads((out / "manifest.json").read_text())
    [shard] = manifest["splits"][split]["shards"] if len(manifest["splits"][split]["shards"]) == 1 else [None]
    assert shard is not None
    (out / shard["path"]).write_bytes(blob)
    shard.update(bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest(),
                 index=write_index(str(out), shard["path"], blob, shard["records"]))
    manifest["splits"][split]["bytes"] = len(blob)
    (out / "manifest.json").write_bytes(manifest_bytes(manifest))


def _resign_side(out: Path, rel: str, text: str) -> None:
    (out / rel).write_text(text, encoding="utf-8")
    manifest = json.loads((out / "manifest.json").read_text())
    for info in manifest["splits"].values():
        for s in info.get("side", []):
            if s["path"] == rel:
                data = (out / rel).read_bytes()
                s.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (out / "manifest.json").write_bytes(manifest_bytes(manifest))


def verify(path: Path) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["verify", str(path)])
    return r.exit_code, r.output


def test_fresh_task_datasets_verify(datasets):
    for path in datasets.values():
        code, out = verify(path)
        assert code == 0, out
        assert out.startswith("OK:")


def _set(name: str, row: int, col: int, value: int):
    def edit(c):
        c[name][row, col] = value
    return edit


@pytest.mark.parametrize("dataset, split, edit, message", [
    ("pairs", "train", _set("label_ids", 3, 0, 7), r"train/part-00000-of-00001\.tfrecord: record 3: label id outside"),
    ("pairs", "dev", _set("input_mask", 2, 0, 0), r"dev/.*record 2: input_mask is not 1s then 0s"),
    ("pairs", "dev", _set("segment_ids", 1, 1, 1), r"record 1: segment_ids are not 0s then 1s"),
    ("squad", "train", _set("start_positions", 4, 0, 1), r"record 4: answer span is neither 0/0 nor inside"),
    ("squad", "train", _set("unique_ids", 0, 0, 5), r"record 0: unique_ids are not 1000000000"),
    ("squad", "dev", _set("input_ids", 2, 0, 3), r"record 2: does not start with \[CLS\]"),
    ("ner", "train", _set("label_ids", 0, 0, 1), r"record 0: a label on \[CLS\], \[SEP\] or padding"),
])
def test_verify_names_the_broken_record(datasets, tmp_path, dataset, split, edit, message):
    out = _copy(datasets[dataset], tmp_path / "d")
    _rewrite(out, split, edit)
    code, text = verify(out)
    assert code == 1
    assert pytest.importorskip("re").search(message, text), text


def test_tags_must_match_the_owned_words(datasets, tmp_path):
    out = _copy(datasets["ner"], tmp_path / "d")

    def move_tag(c):
        row = c["label_ids"][5]
        first = int(np.flatnonzero(row >= 0)[0])
        row[first + 1], row[first] = row[first], -1  # the tag on a position no owned word starts at

    _rewrite(out, "dev", move_tag)
    code, text = verify(out)
    assert code == 1 and "record 5: label_ids are not -1 exactly where no owned word starts" in text


def test_side_files_are_checked(datasets, tmp_path):
    out = _copy(datasets["squad"], tmp_path / "d")
    rel = "dev/windows.jsonl"
    lines = (out / rel).read_text().splitlines()
    w = json.loads(lines[1])
    w["unique_id"] += 1
    lines[1] = json.dumps(w, separators=(",", ":"))
    (out / rel).write_text("\n".join(lines) + "\n")
    code, text = verify(out)
    assert code == 1 and "dev/windows.jsonl: size or sha256 differs from the manifest" in text
    _resign_side(out, rel, "\n".join(lines) + "\n")
    code, text = verify(out)
    assert code == 1 and "record 1: windows.jsonl unique_id" in text
    (out / "dev" / "extra.txt").write_text("x")
    assert "dev/extra.txt: stray file not listed in the manifest" in verify(out)[1]


def test_inspect_stats_and_diff(datasets, tmp_path):
    r = CliRunner().invoke(main, ["inspect", str(datasets["squad"]), "-n", "2"])
    assert r.exit_code == 0 and "question:" in r.output and "answer:" in r.output
    r = CliRunner().invoke(main, ["inspect", str(datasets["ner"]), "--split", "dev", "--json", "-n", "1"])
    view = json.loads(r.output.splitlines()[0])
    assert view["tags"] and all(t[1] in ("B-LOC", "B-PER", "I-LOC", "I-PER", "O") for t in view["tags"])
    r = CliRunner().invoke(main, ["inspect", str(datasets["pairs"]), "--split", "dev", "-n", "1"])
    assert "label" in r.output and "  B: " in r.output
    r = CliRunner().invoke(main, ["stats", str(datasets["pairs"]), "--json"])
    st = json.loads(r.output)
    assert sum(st["splits"]["train"]["labels"].values()) == 30
    assert st["splits"]["dev"]["length"]["max"] <= 24
    r = CliRunner().invoke(main, ["stats", str(datasets["squad"])])
    assert "windows per example" in r.output
    other = _copy(datasets["pairs"], tmp_path / "other")
    _rewrite(other, "dev", _set("label_ids", 4, 0, 0 if _label(datasets["pairs"], 4) else 1))
    r = CliRunner().invoke(main, ["diff", str(datasets["pairs"]), str(other)])
    assert r.exit_code == 1 and "first differing record: split dev, record 4" in r.output and "label" in r.output
    assert CliRunner().invoke(main, ["diff", str(datasets["pairs"]), str(datasets["pairs"])]).exit_code == 0


def test_inspect_and_stats_show_a_regression_target_as_written(tmp_path):
    # Stored as float32: 3.4 reads back as 3.4000000953674316 unless printed as the float32 it is.
    vocab = str(write_vocab(tmp_path / "vocab.txt"))
    tsv = tmp_path / "train.tsv"
    tsv.write_text("sentence\tscore\nthe cat sat .\t3.4\na dog ran .\t0.1\n", encoding="utf-8")
    out = tmp_path / "reg"
    generate_task_dataset(TaskConfig(kind="tsv", text_a="sentence", label="score", regression=True,
                                     max_seq_length=16),
                          splits=[f"train={tsv}"], vocab_path=vocab, output_dir=str(out))
    r = CliRunner().invoke(main, ["inspect", str(out), "-n", "2"])
    assert r.exit_code == 0, r.output
    assert "label 3.4\n" in r.output and "label 0.1\n" in r.output and "0000000" not in r.output
    r = CliRunner().invoke(main, ["inspect", str(out), "-n", "1", "--json"])
    assert json.loads(r.output.splitlines()[0])["label"] == 3.4
    st = json.loads(CliRunner().invoke(main, ["stats", str(out), "--json"]).output)
    assert (st["splits"]["train"]["labels"]["min"], st["splits"]["train"]["labels"]["max"]) == (0.1, 3.4)


def test_diff_of_task_datasets_fills_in_only_task_config_defaults(datasets, tmp_path):
    other = _copy(datasets["pairs"], tmp_path / "other")
    manifest = json.loads((other / "manifest.json").read_text())
    assert "dupe_factor" not in manifest["config"]
    manifest["config"]["dupe_factor"] = 2  # a field of pre-training configs only
    del manifest["config"]["scheme"]  # as a manifest written before the field existed: its default
    (other / "manifest.json").write_bytes(manifest_bytes(manifest))
    r = CliRunner().invoke(main, ["diff", str(datasets["pairs"]), str(other)])
    assert r.exit_code == 1, r.output
    # Not "10 -> 2": the pre-training default of a field that task datasets do not have.
    assert "config.dupe_factor: None -> 2" in r.output
    assert "1 manifest field(s) differ" in r.output and "scheme" not in r.output


def test_stats_of_task_records_that_do_not_parse_exits_1(datasets, tmp_path):
    out = _copy(datasets["pairs"], tmp_path / "d")

    def shorten(c):
        c["segment_ids"] = c["segment_ids"][:, :-1]

    _rewrite(out, "dev", shorten)
    r = CliRunner().invoke(main, ["stats", str(out)])
    assert r.exit_code == 1, r.output
    assert "does not parse as the split's features" in r.output
    assert "problem(s) while reading the records" in r.output


def _label(path: Path, row: int) -> int:
    from bert_datagen.contract.dataset import open_dataset

    columns, _ = read_split(open_dataset(str(path), LOCAL_FS), "dev")
    return int(columns["label_ids"][row, 0])


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_shape(path: Path) -> tuple[int, ...]:
    """The image's shape as matplotlib reads it back (so the file is a whole, valid PNG)."""
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    return matplotlib.image.imread(str(path)).shape


@pytest.mark.parametrize("name, panels", [("pairs", 2), ("squad", 3)])
def test_stats_plot_of_a_task_dataset(datasets, tmp_path, name, panels):
    png = tmp_path / "plots" / f"{name}.png"
    png.parent.mkdir()
    r = CliRunner().invoke(main, ["stats", str(datasets[name]), "--plot", str(png)])
    assert r.exit_code == 0, r.output
    assert f"histograms written to {png}" in r.output
    # A row of panels per split (train, dev) at the plot's 100 dpi: 3.2 in high each, 5 in wide a panel.
    assert _png_shape(png)[:2] == (640, 500 * panels)
    assert sorted(p.name for p in png.parent.iterdir()) == [png.name]  # the temp file was renamed, not left
    st = json.loads(CliRunner().invoke(main, ["stats", str(datasets[name]), "--json"]).output)
    for split, s in st["splits"].items():
        h = s["histograms"]
        assert sum(h["length"]) == s["records"] and len(h["length"]) == (24 if name == "pairs" else 48) + 1
        assert max(i for i, c in enumerate(h["length"]) if c) == s["length"]["max"]
        if name == "pairs":
            assert h["labels"] == s["labels"] and sum(h["labels"].values()) == s["records"]
        elif split == "train":
            assert sum(h["answers"].values()) == s["records"]
            assert h["answers"]["answer in window"] == round(s["windows_with_answer_share"] * s["records"])
            assert sum(h["answer_length"]) == h["answers"]["answer in window"] and h["answer_length"][0] == 0
        else:  # prediction mode: the records hold no answers
            assert set(h) == {"length"}


def test_stats_plot_of_a_task_dataset_is_safe(datasets, tmp_path, monkeypatch):
    ds = datasets["pairs"]
    before = {p: p.read_bytes() for p in ds.rglob("*") if p.is_file()}
    r = CliRunner().invoke(main, ["stats", str(ds), "--plot", str(ds / "dev" / "h.png")])
    assert r.exit_code == 1 and "is inside the dataset" in r.output and "Traceback" not in r.output
    assert {p: p.read_bytes() for p in ds.rglob("*") if p.is_file()} == before
    # An existing file is replaced only with --overwrite, as with the pre-training plot.
    png = tmp_path / "mine.png"
    png.write_bytes(b"old")
    r = CliRunner().invoke(main, ["stats", str(ds), "--plot", str(png)])
    assert r.exit_code == 1 and "pass --overwrite" in r.output and png.read_bytes() == b"old"
    assert CliRunner().invoke(main, ["stats", str(ds), "--plot", str(png), "--overwrite"]).exit_code == 0
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    # Without matplotlib: one line naming the extra, nothing written.
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    r = CliRunner().invoke(main, ["stats", str(ds), "--plot", str(tmp_path / "none.png")])
    assert r.exit_code == 1 and "--plot needs matplotlib" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "none.png").exists()


def test_plot_draws_tags_and_regression_targets(datasets, tmp_path):
    from bert_datagen.contract.dataset import open_dataset
    from bert_datagen.pipelines.tools.task_datasets import plot_task_stats, task_stats

    st = task_stats(open_dataset(str(datasets["ner"]), LOCAL_FS))
    for s in st["splits"].values():
        tags = s["histograms"]["labels"]
        assert tags == s["labels"] and set(tags) <= {"B-LOC", "B-PER", "I-LOC", "I-PER", "O"}
    assert _png_shape(Path(plot_task_stats(st, str(tmp_path / "ner.png"))))[:2] == (640, 1000)
    # Regression: the target's histogram (a dataset of its own would cost a pipeline run; the plot
    # only reads the figures).
    st = {"task": "tsv", "type": "regression", "splits": {"train": {
        "length": {"mean": 3.0}, "histograms": {"length": [0, 1, 2, 3], "target": {
            "counts": [1, 0, 4], "edges": [0.0, 1.5, 3.0, 4.5]}}}}}
    assert _png_shape(Path(plot_task_stats(st, str(tmp_path / "reg.png"))))[:2] == (320, 1000)


def test_options_task_datasets_do_not_read_are_refused(datasets):
    for args, option in ((["inspect", "--words"], "--words"), (["stats", "--top", "5"], "--top"),
                         (["stats", "--workers", "2"], "--workers")):
        r = CliRunner().invoke(main, [args[0], str(datasets["pairs"]), *args[1:]])
        assert r.exit_code == 2 and f"{option} does not apply here: a task dataset" in r.output, r.output
