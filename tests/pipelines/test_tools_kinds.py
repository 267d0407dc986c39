"""One dispatch on dataset kind: every tool command, on a pre-training and a task dataset, goes through
`bert_datagen.pipelines.tools.kinds.TOOLS`; an unknown kind is one clear error; the run fingerprint is one formula
that gives what the two trainer formulas it replaced gave (recorded runs keep resuming)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))  # benchmarks/ holds the fixture writer

from benchmarks.bench_verify import make_dataset  # noqa: E402
from bert_datagen.contract.dataset import DatasetError, manifest_identity, open_dataset  # noqa: E402
from bert_datagen.contract.features import PRETRAINING, TASK  # noqa: E402
from bert_datagen.contract.fs import LOCAL_FS  # noqa: E402
from bert_datagen.datagen.tasks.config import TaskConfig  # noqa: E402
from bert_datagen.pipelines.cli import main  # noqa: E402
from bert_datagen.pipelines.tasks.run import generate_task_dataset  # noqa: E402
from bert_datagen.pipelines.tools import kinds  # noqa: E402
from bert_datagen.pipelines.tools.card import render_card  # noqa: E402
from tests.support.pipeline_corpus import write_vocab  # noqa: E402
from tests.support.taskdata_corpus import write_pair_tsv  # noqa: E402


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kinds")
    make_dataset(str(root / "pre"), records=40, shards=2, eval_records=8, max_seq_length=32, max_predictions=5)
    config = TaskConfig(kind="tsv", text_a="sentence1", text_b="sentence2", label="label", max_seq_length=24)
    generate_task_dataset(config, splits=[f"train={write_pair_tsv(root / 'tr.tsv', 12, 3)}"],
                          vocab_path=str(write_vocab(root / "vocab.txt")), output_dir=str(root / "task"))
    return {PRETRAINING: root / "pre", TASK: root / "task"}


def test_the_contract_gives_the_kind(datasets) -> None:
    for kind, d in datasets.items():
        assert open_dataset(str(d), LOCAL_FS).kind == kind
        assert open_dataset(str(d), LOCAL_FS, need_vocab=False).kind == kind


@pytest.fixture
def spy(monkeypatch) -> list[tuple[str, str]]:
    """Every table entry wrapped to record (kind, what) when a command calls it."""
    calls: list[tuple[str, str]] = []
    table = {}
    for kind, tools in kinds.TOOLS.items():
        def wrap(name, fn, kind=kind):
            def called(*args, **kwargs):
                calls.append((kind, name))
                return fn(*args, **kwargs)
            return called
        table[kind] = dataclasses.replace(tools, **{f.name: wrap(f.name, getattr(tools, f.name))
                                                    for f in dataclasses.fields(tools)})
    monkeypatch.setattr(kinds, "TOOLS", table)
    return calls


@pytest.mark.parametrize("kind", [PRETRAINING, TASK])
def test_every_command_goes_through_the_table(datasets, spy, kind, tmp_path) -> None:
    d = str(datasets[kind])
    runner = CliRunner()
    for args in (["verify", d], ["inspect", d, "-n", "1"], ["stats", d], ["diff", d, d]):
        result = runner.invoke(main, args)
        assert result.exit_code == 0, (args, result.output)
    render_card(d, json.loads((datasets[kind] / "manifest.json").read_text()))
    assert {name for k, name in spy if k == kind} >= {"verify", "inspect", "format_record", "stats",
                                                      "format_stats", "config_defaults", "card"}
    assert all(k == kind for k, _ in spy)


def test_unknown_kind_is_one_clear_error(datasets, monkeypatch) -> None:
    with pytest.raises(DatasetError, match=r"dataset kind 'mystery': no tools for it \(known: pretraining, task\)"):
        kinds.tools_for("mystery")
    # A kind the contract knows but the tools do not: the command names it, exit 1, no traceback.
    monkeypatch.setattr(kinds, "TOOLS", {PRETRAINING: kinds.TOOLS[PRETRAINING]})
    result = CliRunner().invoke(main, ["stats", str(datasets[TASK])])
    assert result.exit_code == 1 and result.exception is not None and isinstance(result.exception, SystemExit)
    assert "dataset kind 'task': no tools for it (known: pretraining)" in result.output


def _frozen_pretraining_fingerprint(m: dict) -> str:
    """trainer/pretrain/data.py's dataset_identity before issue 21 (what recorded runs hold)."""
    shards = [{"split": split, "path": s["path"], "records": int(s["records"]), "sha256": s["sha256"]}
              for split in sorted(m["splits"]) for s in m["splits"][split]["shards"]]
    content = {"features": m["features"], "vocab_sha256": m["vocab"]["sha256"], "shards": shards}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def _frozen_task_fingerprint(m: dict) -> str:
    """trainer/finetune/data.py's task_identity before issue 21."""
    shards = [{"split": name, "path": s["path"], "records": int(s.get("records", 0)), "sha256": s.get("sha256")}
              for name in sorted(m["splits"]) for key in ("shards", "side") for s in m["splits"][name].get(key, [])]
    content = {"task": m.get("task"), "vocab_sha256": m["vocab"].get("sha256"), "shards": shards}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def test_one_identity_keeps_the_recorded_fingerprints(datasets) -> None:
    pre = json.loads((datasets[PRETRAINING] / "manifest.json").read_text())
    task = json.loads((datasets[TASK] / "manifest.json").read_text())
    assert manifest_identity(pre)["fingerprint"] == _frozen_pretraining_fingerprint(pre)
    assert manifest_identity(task)["fingerprint"] == _frozen_task_fingerprint(task)
    assert manifest_identity(pre)["fingerprint"] != manifest_identity({**pre, "features": {}})["fingerprint"]
